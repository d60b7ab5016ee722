"""A package's stored plan says what a cold load reads, so the reading starts before the backend's set-up
(``WeightSource.start_stream_early``): the entries it streams are the plan's, the reads are under way while the
backend is made, and a set-up that fails stops them and loses nothing."""
from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
import pytest

import inferd
import inferd.package as pkgmod
import inferd.vulkan
from inferd.backends.base import WeightSource
from inferd.errors import BackendError
from inferd.package import compile_model, open_package
from inferd.store import StoreStream
from zoo_fixture import check_against_reference, zoo_reference

TOL = 1e-4


def _devices() -> list[str]:
    return ["cpu"] + (["vulkan"] if inferd.vulkan.available() else [])


@pytest.mark.parametrize("transformed", [True, False], ids=["transformed", "raw"])
@pytest.mark.parametrize("device", _devices())
def test_the_early_stream_holds_what_the_backend_layers_say_the_plan_reads(device: str, transformed: bool,
                                                                           tmp_path: Path) -> None:
    """Entries found by node name in the graph the backend runs (the CPU's with its layout plan applied) are the
    ones ``planned_entries`` finds from the backend's layers, in the same order."""
    src = zoo_reference("squeezenet1_1")[0]
    pkg = compile_model(src, tmp_path / "pkg", device=device, profile=False, transformed=transformed)
    op = open_package(pkg, device=device)
    try:
        assert {lp.source for lp in op.plan.layers} >= {"transformed" if transformed else "raw"}
        ws = WeightSource(op.graph.constants, op.store, device)
        early = ws.entries_by_name(op.run_graph, op.plan)
        planned = {lp.name: tuple(k for k in (lp.kernel, lp.warm_kernel) if k) for lp in op.plan.layers}
        extra = {"run_graph": op.run_graph, "memory": op.memory} if device == "cpu" else {"planned": planned}
        backend = pkgmod.make_backend(op.graph, device, None, **extra)
        try:
            late = ws.planned_entries(backend.layers(), op.plan)
        finally:
            close = getattr(backend, "close", None)
            if close is not None:
                close()
        assert early is not None and len(late) > 0
        assert [e.key for e in early] == [e.key for e in late]
    finally:
        op.store.close()


def test_a_plan_naming_a_layer_the_graph_lacks_starts_no_early_stream(tmp_path: Path) -> None:
    src = zoo_reference("squeezenet1_1")[0]
    pkg = compile_model(src, tmp_path / "pkg", profile=False, transformed=False)
    op = open_package(pkg, device="cpu")
    try:
        ws = WeightSource(op.graph.constants, op.store, "cpu")
        lp = next(lp for lp in op.plan.layers if lp.source == "raw")
        renamed = dataclasses.replace(op.plan, layers=tuple(
            dataclasses.replace(x, name="no such node") if x is lp else x for x in op.plan.layers))
        assert ws.entries_by_name(op.run_graph, renamed) is None
        assert ws.start_stream_early(op.run_graph, renamed) is False and ws.stream is None
    finally:
        op.store.close()


@pytest.mark.parametrize("device", _devices())
def test_reads_are_under_way_while_the_backend_is_set_up(device: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend's set-up is held until the first streaming read has finished: a load that started its
    reads only after the set-up (as before) would wait here until the timeout and fail the assertion."""
    name = "mobilenetv2"
    src = zoo_reference(name)[0]
    pkg = compile_model(src, tmp_path / "pkg", device=device, profile=False)
    read_done = threading.Event()
    orig_run = StoreStream._run

    def run(self: StoreStream) -> None:
        orig = self._on_read

        def on_read(*a: object, **k: object) -> None:
            read_done.set()
            if orig is not None:
                orig(*a, **k)
        self._on_read = on_read
        orig_run(self)

    orig_make = pkgmod.make_backend
    waited: list[bool] = []

    def make_backend(*a: object, **k: object) -> object:
        waited.append(read_done.wait(10))
        return orig_make(*a, **k)

    monkeypatch.setattr(StoreStream, "_run", run)
    monkeypatch.setattr(pkgmod, "make_backend", make_backend)
    with inferd.load(pkg, device=device) as model:
        check_against_reference(model, name, f"cold on {device}, reads started early", TOL)
        reads = [e for e in model._cold.run.timeline() if e["kind"] == "read"]
        # the reads made before the run existed are on its timeline, under the threads that made them
        assert reads and all(e["thread"].startswith("inferd-io") for e in reads)
        assert min(e["t0"] for e in reads) < 0 <= min(e["t0"] for e in model._cold.run.timeline()
                                                         if e["kind"] == "prepare")
    assert waited == [True]


def test_a_failing_set_up_stops_the_early_stream_and_the_next_load_is_whole(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    name = "squeezenet1_1"
    src = zoo_reference(name)[0]
    pkg = compile_model(src, tmp_path / "pkg", profile=False)
    released: list[StoreStream] = []
    orig_release = StoreStream.release

    def release(self: StoreStream) -> None:
        released.append(self)
        orig_release(self)

    def failing(*a: object, **k: object) -> object:
        raise BackendError("injected: the backend could not be set up")

    monkeypatch.setattr(StoreStream, "release", release)
    with monkeypatch.context() as m:
        m.setattr(pkgmod, "make_backend", failing)
        with pytest.raises(BackendError, match="injected"):
            inferd.load(pkg)
    assert len(released) == 1
    assert released[0]._claim() is None  # stopped: no reader takes another piece
    with inferd.load(pkg) as model:
        check_against_reference(model, name, "cold after a failed load", TOL)
        out = model.run(zoo_reference(name)[1])
        assert all(np.isfinite(o).all() for o in out.values())


def test_a_reopen_still_asks_the_kernel_for_the_recorded_binds_first(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """An open whose plan and index this process has parsed reads neither again, but every load reads the package's
    recorded binds: the reopen asks for those (and only those) ahead, as a first open asks for all of them."""
    import os

    from inferd.runtime import bindrec
    from inferd.vulkan import binds as vkbinds

    src = zoo_reference("squeezenet1_1")[0]
    pkg = compile_model(src, tmp_path / "pkg", profile=False)
    for name in (bindrec.FILE, vkbinds.FILE):
        (pkg / name).write_bytes(b"x")  # present: a prefetch opens only what exists
    asked: list[list[str]] = []
    real = pkgmod.prefetch_metadata

    def spy(p: Path, parsed: bool = False, device: str | None = None) -> None:
        opened: list[str] = []
        real_open = os.open
        me = threading.get_ident()

        def rec_open(path: os.PathLike[str] | str, *a: object, **k: object) -> int:
            if threading.get_ident() == me:  # (the open's head read opens the store on an io worker meanwhile)
                opened.append(Path(path).name)
            return real_open(path, *a, **k)  # type: ignore[arg-type]

        monkeypatch.setattr(pkgmod.os, "open", rec_open)
        try:
            real(p, parsed, device)
        finally:
            monkeypatch.setattr(pkgmod.os, "open", real_open)
        asked.append(opened)

    monkeypatch.setattr(pkgmod, "prefetch_metadata", spy)
    for _ in range(2):
        op = open_package(pkg, device="cpu", cold=True)
        op.store.close()
        if op.stream is not None:
            op.stream.release()
    # a CPU open asks for the CPU's binds only: the Vulkan backend's file is not this load's
    assert sorted(asked[0]) == sorted(["plan.bin", "weights.store", bindrec.FILE])
    assert sorted(asked[1]) == sorted([bindrec.FILE])
