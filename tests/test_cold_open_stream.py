"""plan.bin lists the store entries its cold plan reads (``stream``, written before the plan, first in the map), so
a cold open starts reading as soon as those two keys are parsed, before the graph, its layout and the store's
checks (``open_package(stream=...)``); the load takes that stream on where it reads what the load computes, and
otherwise reads right anyway. Written by the compile, the refinement and the idle-time profiling."""
from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import msgpack
import pytest

import inferd
import inferd.package as pkgmod
import inferd.vulkan
from inferd.backends.base import WeightSource
from inferd.package import compile_model, open_package, read_plan, refine_package, write_plan
from inferd.planner.cost import Profile
from inferd.planner.plan import PlanOptions
from inferd.store import StoreStream
from zoo_fixture import check_against_reference, zoo_reference

TOL = 1e-4
NAME = "squeezenet1_1"


@pytest.fixture(autouse=True)
def cold_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store counts as out of the page cache (the open starts no stream for a cached one: see the last test),
    whatever the test machine's cache holds."""
    import inferd.runtime.pagecache as pc

    monkeypatch.setattr(pc, "resident_fraction", lambda _path: 0.0)


def _devices() -> list[str]:
    return ["cpu"] + (["vulkan"] if inferd.vulkan.available() else [])


def _computed(op: pkgmod.OpenPackage, device: str) -> list[list[str]]:
    """What the load computes from the opened graph and plan (``WeightSource.entries_by_name``)."""
    ws = WeightSource(op.graph.constants, op.store, device)
    return [list(k) for k in StoreStream.order(ws.entries_by_name(op.run_graph, op.plan) or [])]


@pytest.mark.parametrize("device", _devices())
def test_the_compiled_plan_lists_what_its_cold_load_reads_first(device: str, tmp_path: Path) -> None:
    pkg = compile_model(zoo_reference(NAME)[0], tmp_path / "pkg", device=device, profile=False)
    body = (pkg / "plan.bin").read_bytes()[pkgmod._PLAN_HEAD.size:]
    u = msgpack.Unpacker(raw=False, strict_map_key=False, ext_hook=pkgmod._ext_hook)
    u.feed(body)
    u.read_map_header()
    assert [u.unpack(), u.skip(), u.unpack()][::2] == ["stream", "plan"]
    op = open_package(pkg, device=device)
    try:
        assert op.stream is None  # not asked for: nothing read ahead
        listed = read_plan(pkg / "plan.bin")["stream"]
        assert listed and listed == _computed(op, device)
    finally:
        op.store.close()


@pytest.mark.parametrize("device", _devices())
def test_reads_start_before_the_rest_of_the_plan_is_parsed(device: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The first array plan.bin holds after its plan (the inline constants, parsed after the plan's first keys) is
    held until a streaming read has finished: an open that started its reads after parsing plan.bin (as before)
    would wait here until the timeout. The profile is not parsed by the open at all (``ProfileRef``)."""
    pkg = compile_model(zoo_reference(NAME)[0], tmp_path / "pkg", device=device)
    assert read_plan(pkg / "plan.bin")["profile"] is not None
    read_done = threading.Event()
    streams: list[StoreStream] = []
    orig_init, orig_plan, orig_hook = StoreStream.__init__, pkgmod.ColdPlan.from_dict, pkgmod._ext_hook
    profiled: list[object] = []

    def init(self: StoreStream, *a: object, **k: object) -> None:
        streams.append(self)
        orig_init(self, *a, **k)
        orig = self._on_read

        def on_read(*r: object, **kw: object) -> None:
            read_done.set()
            orig(*r, **kw)
        self._on_read = on_read

    waited: list[bool] = []
    plan_parsed = threading.Event()

    def plan_from_dict(d: object) -> object:
        out = orig_plan(d)  # type: ignore[arg-type]
        plan_parsed.set()
        return out

    def ext_hook(code: int, data: bytes, found: object = None) -> object:
        if plan_parsed.is_set() and not waited:  # the first ext after the plan: an inline constant
            waited.append(read_done.wait(10))
        return orig_hook(code, data, found)  # type: ignore[arg-type]

    monkeypatch.setattr(StoreStream, "__init__", init)
    monkeypatch.setattr(pkgmod.ColdPlan, "from_dict", staticmethod(plan_from_dict))
    monkeypatch.setattr(pkgmod, "_ext_hook", ext_hook)
    orig_profile = Profile.from_dict
    monkeypatch.setattr(Profile, "from_dict", staticmethod(lambda d: profiled.append(d) or orig_profile(d)))
    pkgmod._parsed.clear()
    with inferd.load(pkg, device=device) as model:
        assert not profiled  # the open followed the stored plan: its profile waits for the refinement
        check_against_reference(model, NAME, f"cold on {device}, reads started at the open", TOL)
        # the open's stream is the one the load read from: no second one
        assert len(streams) == 1 and model.cold_stats["stream_bytes"] == streams[0].bytes > 0
        assert model.cold_stats["stream_from"] == "open"
        reads = [e for e in model._cold.run.timeline() if e["kind"] == "read"]
        assert reads and min(e["t0"] for e in reads) < 0
    assert waited and waited[0]


def _record_opens(monkeypatch: pytest.MonkeyPatch) -> list[pkgmod.OpenPackage]:
    """The packages the loads open from now on, as opened."""
    opened: list[pkgmod.OpenPackage] = []
    orig = pkgmod.open_package

    def open_(*a: object, **k: object) -> pkgmod.OpenPackage:
        op = orig(*a, **k)  # type: ignore[arg-type]
        opened.append(op)
        return op

    monkeypatch.setattr(pkgmod, "open_package", open_)
    return opened


def _rewrite(pkg: Path, **changes: object) -> None:
    d = read_plan(pkg / "plan.bin")
    for k, v in changes.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    write_plan(pkg / "plan.bin", d)


@pytest.mark.parametrize("listed", ["other order", "unknown entry", "none"])
def test_a_stream_list_that_is_not_the_plans_loses_nothing(listed: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A list in another order (a plan.bin edited by hand, or by a tool that kept the list of another plan), one
    naming an entry the store lacks, or none (a package of an engine before this list): the load reads what its
    plan reads, in its order, and answers right."""
    pkg = compile_model(zoo_reference(NAME)[0], tmp_path / "pkg", profile=False)
    keys = read_plan(pkg / "plan.bin")["stream"]
    assert len(keys) > 2
    new = {"other order": keys[::-1], "unknown entry": [["no such layer", "w", "cpu/x", "transformed"]] + keys,
           "none": None}[listed]
    _rewrite(pkg, stream=new)
    made: list[StoreStream] = []
    released: list[StoreStream] = []
    orig_init, orig_release = StoreStream.__init__, StoreStream.release

    def init(self: StoreStream, *a: object, **k: object) -> None:
        made.append(self)
        orig_init(self, *a, **k)

    def release(self: StoreStream) -> None:
        released.append(self)
        orig_release(self)

    monkeypatch.setattr(StoreStream, "__init__", init)
    monkeypatch.setattr(StoreStream, "release", release)
    with inferd.load(pkg) as model:
        check_against_reference(model, NAME, f"cold with a stream list: {listed}", TOL)
        # the stream the load read from holds what its plan reads, in its order
        assert [list(k) for k in made[-1].keys()] == keys
        assert model.cold_stats["stream_bytes"] == made[-1].bytes
        # a list in another order was started at the open and stopped: its reads are lost, never wrong
        assert len(made) == (2 if listed == "other order" else 1)
        assert model.cold_stats["stream_from"] == "set-up"  # the load's own, made before the backend
        assert [s for s in released if s is not made[-1]] == made[:-1]


def test_a_load_that_replans_starts_no_stream_at_the_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = compile_model(zoo_reference(NAME)[0], tmp_path / "pkg")
    opened = _record_opens(monkeypatch)
    with inferd.load(pkg, cold=PlanOptions(select=False)) as model:  # other planning switches: re-planned
        check_against_reference(model, NAME, "cold, re-planned at load", TOL)
        assert model.plan.options.select is False
    assert opened and opened[0].stream is None
    with inferd.load(pkg) as model:  # the stored plan followed: its reads started at the open
        check_against_reference(model, NAME, "cold, stored plan", TOL)
    assert opened[1].stream is not None


def test_refinement_lists_the_refined_plans_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from inferd.runtime.cpu import CpuExecutor

    monkeypatch.setenv("INFERD_CPU_LAYOUT", "nchw")  # squeezenet's 3x3 layers in NCHW: a cold and a warm kernel
    pkg = compile_model(zoo_reference(NAME)[0], tmp_path / "pkg")
    op = open_package(pkg)
    try:
        backend = CpuExecutor(op.graph, lazy=True)
        ws = WeightSource(op.graph.constants, op.store, "cpu")
        plan = op.plan
        entries = backend.candidates()
        lp = next(lp for lp, (_l, ks, _d) in zip(plan.layers, entries) if len({k.name for k in ks}) > 1)
        observed = {(lp.name, lp.kernel, "exec_cold"): 1.0}
        new = refine_package(pkg, backend, plan, op.profile, observed, ws.has_transformed,
                             reads=lambda p: ws.planned_entries(backend.layers(), p))
        assert new is not None and new.by_name()[lp.name].kernel != lp.kernel
        want = [list(k) for k in StoreStream.order(ws.planned_entries(backend.layers(), new))]
    finally:
        op.store.close()
    d = read_plan(pkg / "plan.bin")
    assert d["stream"] == want and want != [list(k) for k in StoreStream.order(
        ws.planned_entries(backend.layers(), dataclasses.replace(plan)))]
    with inferd.load(pkg) as model:
        check_against_reference(model, NAME, "cold after a refinement", TOL)
        assert model.plan.by_name()[lp.name].kernel == new.by_name()[lp.name].kernel


def test_a_store_in_the_page_cache_is_read_after_the_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It has no disk latency to hide, and reads beside the open's parsing slow it (mobilenetv2's open took 8-9 ms
    instead of 4-5 with its reads under way on the 2-core VM): the load starts them after the open."""
    import inferd.runtime.pagecache as pc

    monkeypatch.setattr(pc, "resident_fraction", lambda _path: 1.0)
    pkg = compile_model(zoo_reference(NAME)[0], tmp_path / "pkg", profile=False)
    opened = _record_opens(monkeypatch)
    with inferd.load(pkg) as model:
        check_against_reference(model, NAME, "cold from a cached store", TOL)
        assert model.cold_stats["stream_bytes"] > 0  # streamed all the same, from after the open
        assert model.cold_stats["stream_from"] == "set-up"
    assert opened and opened[0].stream is None


def test_the_opens_profile_is_parsed_when_asked_for(tmp_path: Path) -> None:
    """An open keeps plan.bin's profile as bytes (``ProfileRef``): asked for, it is the profile ``read_plan`` parses;
    a package compiled without measuring has none; a profile that does not parse (written so, its checksum right)
    is a damaged package when asked for, not a wrong profile."""
    pkg = compile_model(zoo_reference(NAME)[0], tmp_path / "pkg", device="cpu")
    pkgmod._parsed.clear()
    op = open_package(pkg, device="cpu")
    try:
        assert isinstance(op.profile_ref, pkgmod.ProfileRef) and "profile" not in op.meta
        want = Profile.from_dict(read_plan(pkg / "plan.bin")["profile"])
        assert op.profile == want and op.profile is op.profile  # parsed once
    finally:
        op.store.close()
    # threads asking at once (a refinement on the idle worker, a re-plan) get the one parse
    raw = msgpack.packb(read_plan(pkg / "plan.bin")["profile"], default=pkgmod._default, use_bin_type=True)
    ref = pkgmod.ProfileRef(raw, pkg / "plan.bin")
    got: list[Profile] = []
    threads = [threading.Thread(target=lambda: got.append(ref.get())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and all(g is got[0] for g in got) and got[0] == want
    bare = compile_model(zoo_reference(NAME)[0], tmp_path / "bare", device="cpu", profile=False)
    op = open_package(bare, device="cpu")
    try:
        assert op.profile_ref is None and op.profile is None
    finally:
        op.store.close()
    _rewrite(pkg, profile={"backend": "cpu"})  # no fingerprint, rates nor times
    pkgmod._parsed.clear()
    op = open_package(pkg, device="cpu")
    try:
        with pytest.raises(pkgmod.WeightsStoreError, match="profile"):
            op.profile
    finally:
        op.store.close()
