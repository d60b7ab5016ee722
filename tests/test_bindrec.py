"""Recorded binds (``inferd.runtime.bindrec``): a CPU cold load of a package whose binds were recorded rebuilds its
layers' native steps from the record, and answers exactly as the load that bound them; a record that is damaged,
stale, or does not fit a layer is not used for it; a native step that refuses a recorded argument falls back to
the kernel's own bind."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import inferd
from inferd import native
from inferd.package import compile_model
from inferd.runtime import bindrec
from inferd.zoo import ZOO
from zoo_fixture import check_against_reference, zoo_reference

TOL = 1e-4


def _key(pkg: Path) -> dict[str, Any]:
    from inferd.package import read_plan

    return bindrec.key_of(read_plan(pkg / "plan.bin"))


def _first_load(pkg: Path, name: str) -> dict[str, np.ndarray]:
    """Load ``pkg`` cold, check it, and wait for its binds to be recorded; the first run's outputs."""
    _path, feeds, _ref, _names = zoo_reference(name)
    with inferd.load(pkg) as m:
        out = m.run(feeds)
        check_against_reference(m, name, "first load", TOL)
        assert m.binds_done is not None and m.binds_done.wait(60)
        assert m.cold_stats.get("binds_replayed", 0) == 0
    return out


@pytest.mark.parametrize("name", ZOO)
def test_a_second_cold_load_rebuilds_recorded_layers_and_answers_the_same(name: str, tmp_path: Path) -> None:
    _path, feeds, _ref, _names = zoo_reference(name)
    pkg = compile_model(zoo_reference(name)[0], tmp_path / "pkg", profile=False)
    first = _first_load(pkg, name)
    recs = bindrec.load(pkg, _key(pkg)) or {}
    with inferd.load(pkg) as m:
        out = m.run(feeds)
        replayed = sum(1 for s in m._exec.steps if s is not None and s.replayed)
        assert m.cold_stats.get("binds_replayed", replayed) == replayed  # (a first run that finished the load first)
        # every recorded layer whose kernel the plan still names is rebuilt, none is bound
        planned = {lp.name: lp.kernel for lp in m.plan.layers}
        assert replayed == sum(1 for n, r in recs.items() if planned.get(n) == r[0])
        for k in first:  # the same steps on the same inputs: the same bits
            np.testing.assert_array_equal(out[k], first[k], err_msg=f"{name}: output {k}")
        check_against_reference(m, name, "second load, binds replayed", TOL)
        assert m.wait_warm(60)
        check_against_reference(m, name, "warm run after a replayed cold load", TOL)


def test_records_are_kept_for_the_models_that_have_native_layers(tmp_path: Path) -> None:
    """The layers a mobile net spends its preparation on (blocked convolutions) are the ones recorded; a layer that
    reads the graph's input keeps its own bind (it is pointed at the caller's array)."""
    name = "mobilenetv2"
    pkg = compile_model(zoo_reference(name)[0], tmp_path / "pkg", profile=False)
    _first_load(pkg, name)
    with inferd.load(pkg) as m:
        m.wait_loaded()
        be = m._exec
        replayed = [s for s in be.steps if s is not None and s.replayed]
        assert len(replayed) >= 0.8 * len(be.steps)
        feeds = {t.name for t in be.inputs}
        assert not any(n in feeds for s in replayed for n in s.layer.node.inputs)
        assert be._direct, "the input's reader lost its retarget"


def test_a_replayed_layer_has_the_arguments_its_bind_makes(tmp_path: Path) -> None:
    """Recording and replaying against the same arena and weights gives each native step the bytes the kernel's
    own bind gave it, slot for slot (a strided copy's shape and strides: the same values, in arrays of its own)."""
    for name in ("mobilenetv2", "shufflenetv2_x1_0", "squeezenet1_1"):
        recorded_transposes = 0
        pkg = compile_model(zoo_reference(name)[0], tmp_path / name, profile=False)
        with inferd.load(pkg) as m:
            m.wait_loaded()
            be = m._exec
            recs = bindrec.record(be)
            assert recs
            for (layer, k), step in zip(be.choice, be.steps):
                rec = recs.get(layer.name)
                if rec is None:
                    continue
                got = bindrec.replay(rec, k.name, be.arena, bindrec.address(be.arena), step.params, lambda: None)
                assert got is not None, layer.name
                want = step.bound.steps
                assert [(s.kind, s.sig) for s in got.steps] == [(s.kind, s.sig) for s in want]
                for (entry, _sig, _slots), a, b in zip(rec[2], got.steps, want):
                    inline = bindrec._INLINE.get(entry, {})
                    for j in range(len(a.sig)):
                        if j in inline:  # a small array the bind made: the same values, in the replay's own copy
                            n = int(a.args[inline[j]].i)
                            va = list(native.ffi.cast("long long *", a.args[j].p)[0:n])
                            vb = list(native.ffi.cast("long long *", b.args[j].p)[0:n])
                            assert va == vb, (layer.name, j)
                        else:
                            assert bytes(native.ffi.buffer(a.args + j, 8)) == bytes(native.ffi.buffer(b.args + j, 8)), \
                                (layer.name, j)
                    recorded_transposes += entry in bindrec._INLINE
        assert recorded_transposes > 0 or name != "shufflenetv2_x1_0"


def _pkg_with_records(tmp_path: Path, name: str = "squeezenet1_1") -> tuple[Path, dict[str, np.ndarray]]:
    pkg = compile_model(zoo_reference(name)[0], tmp_path / "pkg", profile=False)
    first = _first_load(pkg, name)
    assert (pkg / bindrec.FILE).exists()
    return pkg, first


def test_a_damaged_binds_file_is_not_used_and_is_recorded_again(tmp_path: Path, caplog: Any) -> None:
    name = "squeezenet1_1"
    pkg, first = _pkg_with_records(tmp_path, name)
    f = pkg / bindrec.FILE
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x5A
    f.write_bytes(bytes(data))
    _path, feeds, _ref, _names = zoo_reference(name)
    with caplog.at_level(logging.WARNING, logger="inferd.runtime.bindrec"):
        with inferd.load(pkg) as m:
            out = m.run(feeds)
            assert m.cold_stats["binds_replayed"] == 0
            for k in first:
                np.testing.assert_array_equal(out[k], first[k])
            assert m.binds_done is not None and m.binds_done.wait(60)
    assert "checksum" in caplog.text
    assert bindrec.load(pkg, _key(pkg))  # written again, whole


@pytest.mark.parametrize("damage", ["truncated", "magic", "version", "stale"])
def test_a_bad_or_stale_binds_file_is_a_miss(tmp_path: Path, damage: str, monkeypatch: Any) -> None:
    pkg, _first = _pkg_with_records(tmp_path)
    f = pkg / bindrec.FILE
    data = f.read_bytes()
    if damage == "truncated":
        f.write_bytes(data[:20])
    elif damage == "magic":
        f.write_bytes(b"NOTBINDS" + data[8:])
    elif damage == "version":
        f.write_bytes(data[:8] + (99).to_bytes(4, "little") + data[12:])
    else:  # made by another engine version: the key differs
        monkeypatch.setattr(bindrec, "__version__", "0.0.0-other")
    assert bindrec.load(pkg, _key(pkg)) is None


def test_a_record_that_does_not_fit_its_layer_is_not_used_for_it(tmp_path: Path) -> None:
    """Another kernel than the plan's, weights of another size, or a record that does not parse: that layer binds;
    the others are rebuilt."""
    name = "squeezenet1_1"
    pkg, first = _pkg_with_records(tmp_path, name)
    key = _key(pkg)
    recs = dict(bindrec.load(pkg, key) or {})
    assert len(recs) >= 3
    a, b = list(recs)[:2]
    recs[a] = ["some_other_kernel", recs[a][1], recs[a][2]]
    pa = recs[b][1]
    recs[b] = [recs[b][0], [[pa[0][0], pa[0][1] + 4, pa[0][2]]] + pa[1:], recs[b][2]]
    c = list(recs)[2]
    recs[c] = [recs[c][0], recs[c][1], [["inferd_no_such_entry", "p", [[1, 0]]]]]
    assert bindrec.save(pkg, key, recs)
    _path, feeds, _ref, _names = zoo_reference(name)
    with inferd.load(pkg) as m:
        out = m.run(feeds)
        assert m.cold_stats["binds_replayed"] == len(recs) - 3
        steps = {s.layer.name: s for s in m._exec.steps if s is not None}
        assert not steps[a].replayed and not steps[b].replayed and not steps[c].replayed
        for k in first:
            np.testing.assert_array_equal(out[k], first[k])


def test_a_refused_argument_falls_back_to_the_kernels_bind(tmp_path: Path) -> None:
    """A native step that refuses a recorded argument (it checks before it writes) leaves the layer to its kernel's
    own bind, for this run and the next."""
    name = "squeezenet1_1"
    pkg, first = _pkg_with_records(tmp_path, name)
    key = _key(pkg)
    recs = dict(bindrec.load(pkg, key) or {})
    target = next(n for n, r in recs.items() if r[2][0][0].startswith("inferd_nchwc_conv"))
    entry, sig, slots = recs[target][2][0]
    bad = list(slots)
    bad[sig.index("i")] = -3  # a channel count no kernel takes
    recs[target] = [recs[target][0], recs[target][1], [[entry, sig, bad]] + recs[target][2][1:]]
    assert bindrec.save(pkg, key, recs)
    _path, feeds, _ref, _names = zoo_reference(name)
    with inferd.load(pkg) as m:
        out = m.run(feeds)
        for k in first:
            np.testing.assert_array_equal(out[k], first[k])
        out2 = m.run(feeds)
        for k in first:
            np.testing.assert_allclose(out2[k], first[k], rtol=1e-5, atol=1e-6)


def test_an_unwritable_package_loads_without_records(tmp_path: Path, monkeypatch: Any) -> None:
    name = "squeezenet1_1"
    pkg = compile_model(zoo_reference(name)[0], tmp_path / "pkg", profile=False)

    def refuse(*_a: Any, **_k: Any) -> None:
        raise PermissionError("read-only file system")

    monkeypatch.setattr(bindrec, "atomic_write", refuse)
    _first_load(pkg, name)
    assert not (pkg / bindrec.FILE).exists()
    with inferd.load(pkg) as m:
        check_against_reference(m, name, "no records", TOL)
        assert m.cold_stats["binds_replayed"] == 0


def test_run_timed_runs_native_steps_in_one_call_and_times_each() -> None:
    """``native.run_timed``: the calls' work in order, each one's end time from the clock after its last step (the
    same clock as ``time.perf_counter``); a call without native steps runs from Python between them."""
    import time

    if not native.has("inferd_steps_run_timed"):
        pytest.skip("native extension not built")
    n = 1 << 16
    xs = [np.full(n, float(i + 1), np.float32) for i in range(4)]
    ys = [np.zeros(n, np.float32) for _ in range(4)]
    calls = [native.strided_copy_bound(y, x[::-1][::-1]) for x, y in zip(xs, ys)]
    assert all(c is not None and c.steps for c in calls)
    order: list[str] = []
    calls.insert(2, lambda: order.append("python"))
    t0 = time.perf_counter()
    ends = native.run_timed(calls)
    t1 = time.perf_counter()
    assert order == ["python"] and len(ends) == 5
    assert t0 <= ends[0] <= ends[1] <= ends[2] <= ends[3] <= ends[4] <= t1
    for i, y in enumerate(ys):
        np.testing.assert_array_equal(y, float(i + 1))


def test_run_timed_leaves_a_failing_step_to_its_call() -> None:
    """A step that refuses its arguments: its call runs from Python (its own fallback or error), and so does every
    call after it in the run; the ones before it ran once."""
    if not native.has("inferd_steps_run_timed"):
        pytest.skip("native extension not built")
    runs: list[int] = []

    def counted(i: int, steps: list[Any]) -> Any:
        def call() -> None:
            runs.append(i)
        call.steps = steps  # type: ignore[attr-defined]
        return call

    n = 1 << 14
    x, y = np.ones(n, np.float32), np.zeros(n, np.float32)
    good = native.strided_copy_bound(y, x)
    assert good is not None
    kind, sig = good.steps[0].kind, good.steps[0].sig
    bad = native.NativeStep(kind, sig, [0] * len(sig))  # null pointers: the copy refuses them
    ends = native.run_timed([counted(0, good.steps), counted(1, [bad]), counted(2, good.steps)])
    assert runs == [1, 2] and len(ends) == 3 and ends[0] <= ends[1] <= ends[2]
    np.testing.assert_array_equal(y, 1.0)


def test_a_layer_whose_bind_does_nothing_is_recorded_as_such(tmp_path: Path) -> None:
    """squeezenet's Concats: the activation plan has their producers write into place, so their bind is a call with
    no work; the next load takes that from the record, and the model answers the same."""
    name = "squeezenet1_1"
    pkg, first = _pkg_with_records(tmp_path, name)
    recs = bindrec.load(pkg, _key(pkg)) or {}
    empty = [n for n, r in recs.items() if r[2] == []]
    assert empty
    _path, feeds, _ref, _names = zoo_reference(name)
    with inferd.load(pkg) as m:
        out = m.run(feeds)
        steps = {s.layer.name: s for s in m._exec.steps if s is not None}
        assert all(steps[n].replayed and steps[n].layer.op == "Concat" and steps[n].bound.steps == [] for n in empty)
        for k in first:
            np.testing.assert_array_equal(out[k], first[k])


def test_info_says_how_many_layers_were_rebuilt(tmp_path: Path, capsys: Any) -> None:
    from inferd.cli import main

    name = "squeezenet1_1"
    pkg, _first = _pkg_with_records(tmp_path, name)
    recs = bindrec.load(pkg, _key(pkg)) or {}
    assert main(["info", str(pkg)]) == 0
    out = capsys.readouterr().out
    assert f"layers rebuilt from the package's recorded binds: {len(recs)} of " in out
    assert main(["info", str(pkg), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["binds_replayed"] == len(recs)
