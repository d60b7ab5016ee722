"""The daemon's host pool (``inferd.runtime.hostpool``): memory faulted in once that cold loads write into. Blocks go
back when the last array viewing them is gone (never earlier), free neighbours merge, a full pool falls back to
numpy, concurrent use never hands out overlapping memory, and a cold load served from it answers as before and
gives it all back when the model is closed."""
from __future__ import annotations

import gc
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

import inferd
from inferd import fileio
from inferd.runtime import hostpool
from inferd.ops import conv
from inferd.runtime.hostpool import PAGE, HostPool

pytestmark = pytest.mark.skipif(inferd.native.ffi is None, reason="the host pool needs the native extension")


@pytest.fixture(autouse=True)
def _no_workspace_kept_from_a_test_pool() -> Iterator[None]:
    # a cold load's thread adopts kernel workspaces from the pool it loaded from and keeps them across models: a
    # test's pool (192 MiB faulted in) would stay mapped for the rest of the worker's tests through them
    yield
    conv.release_scratch()


def _pool(pages: int) -> HostPool:
    p = HostPool(pages * PAGE)
    p.prefault(background=False)
    return p


def test_blocks_come_back_when_the_last_view_is_gone_and_free_neighbours_merge() -> None:
    p = _pool(16)
    a, b, c = p.alloc(3 * PAGE), p.alloc(PAGE + 1), p.alloc(4 * PAGE)
    assert a is not None and b is not None and c is not None
    assert [x.nbytes for x in (a, b, c)] == [3 * PAGE, PAGE + 1, 4 * PAGE]
    assert p.stats()["in_use_bytes"] == 9 * PAGE  # whole pages
    starts = [x.ctypes.data - p.base for x in (a, b, c)]
    assert starts == [0, 3 * PAGE, 5 * PAGE] and all(x.flags.writeable for x in (a, b, c))
    a[:] = 1
    b[:] = 2
    view = b[10:20]  # a view keeps its block
    del b
    gc.collect()
    assert p.stats()["in_use_bytes"] == 9 * PAGE and (view == 2).all()
    del view, a
    gc.collect()
    st = p.stats()
    assert st["in_use_bytes"] == 4 * PAGE and st["free_extents"] == 2  # a's and b's pages merged before c
    d = p.alloc(5 * PAGE)  # fits exactly where a and b were
    assert d is not None and d.ctypes.data == p.base
    del c, d
    gc.collect()
    st = p.stats()
    assert st["in_use_bytes"] == 0 and st["free_extents"] == 1 and st["largest_free_bytes"] == 16 * PAGE


def test_a_full_pool_falls_back_to_numpy_and_counts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    p = _pool(32)
    monkeypatch.setattr(fileio, "pool_alloc", lambda n: p.alloc(n) if n >= hostpool.MIN_BYTES else None)
    held = fileio.aligned_empty(24 * PAGE)
    assert p.base <= held.ctypes.data < p.base + p.capacity
    other = fileio.empty_aligned((20 * PAGE // 4,), np.float32)  # does not fit in what is left
    assert not p.base <= other.ctypes.data < p.base + p.capacity and other.ctypes.data % fileio.VECTOR_ALIGN == 0
    small = fileio.aligned_bytes(100, 64)  # below MIN_BYTES: numpy's
    assert not p.base <= small.ctypes.data < p.base + p.capacity
    assert p.alloc(9 * PAGE) is None and p.stats()["fallbacks"] == 2


def test_concurrent_use_never_hands_out_memory_in_use() -> None:
    p = _pool(256)
    errors: list[str] = []

    def worker(k: int) -> None:
        rng = np.random.default_rng(k)
        live: list[tuple[np.ndarray, int]] = []
        for i in range(400):
            if live and (len(live) > 6 or rng.random() < 0.4):
                arr, tag = live.pop(int(rng.integers(len(live))))
                if not (arr == tag).all():
                    errors.append(f"thread {k}: a block changed under its owner")
                continue
            a = p.alloc(int(rng.integers(1, 8 * PAGE)))
            if a is not None:
                tag = (k * 31 + i) % 251
                a[:] = tag
                live.append((a, tag))
        for arr, tag in live:
            if not (arr == tag).all():
                errors.append(f"thread {k}: a block changed under its owner")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    assert not errors, errors[:3]
    st = p.stats()
    assert st["in_use_bytes"] == 0 and st["free_extents"] == 1 and st["high_water_bytes"] > 0


@pytest.mark.parametrize("name", ["mobilenetv2", "resnet18"])
def test_a_cold_load_from_the_pool_answers_as_before_and_gives_it_back(tmp_path: Path, name: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from inferd.package import compile_model
    from zoo_fixture import check_against_reference, zoo_reference

    pkg = compile_model(zoo_reference(name)[0], tmp_path / "pkg", profile=False)
    p = _pool(192 << 20 >> 12)
    monkeypatch.setattr(fileio, "pool_alloc", lambda n: p.alloc(n) if n >= hostpool.MIN_BYTES else None)
    model = inferd.load(pkg)
    check_against_reference(model, name, "cold, from the host pool", 1e-4)
    assert model.wait_warm(60)
    check_against_reference(model, name, "warm, from the host pool", 1e-4)
    used = p.stats()["in_use_bytes"]
    # the streamed weights and the activation arena live there
    assert used >= model._exec.arena.nbytes + 1_000_000
    assert p.base <= model._exec.arena.ctypes.data < p.base + p.capacity
    # given back by close() itself, the model still referenced and no collection run: a closed model sits in
    # reference cycles (its cold load's callbacks) that only a full collection breaks, which a daemon seldom runs
    gc.disable()
    try:
        model.close()
        # (the running thread's kernel workspaces are its own, kept across models by design: let them go here)
        conv.release_scratch()
        assert p.stats()["in_use_bytes"] == 0
    finally:
        gc.enable()
    with pytest.raises(inferd.BackendError, match="closed"):
        model.run({t.name: np.zeros(t.shape, t.dtype) for t in model.inputs})
    del model
    gc.collect()
    assert p.stats()["in_use_bytes"] == 0


def test_a_model_closed_during_its_cold_load_gives_the_pool_back(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Closed before its first run, its loader threads still preparing layers: close() waits for the layers under
    way and gives every byte back, no collection run; the pool serves the next load."""
    from inferd.package import compile_model
    from zoo_fixture import check_against_reference, zoo_reference

    pkg = compile_model(zoo_reference("resnet18")[0], tmp_path / "pkg", profile=False)
    p = _pool(192 << 20 >> 12)
    monkeypatch.setattr(fileio, "pool_alloc", lambda n: p.alloc(n) if n >= hostpool.MIN_BYTES else None)
    for _ in range(3):
        gc.disable()
        try:
            model = inferd.load(pkg)
            model.close()
            assert p.stats()["in_use_bytes"] == 0
        finally:
            gc.enable()
    model = inferd.load(pkg)
    check_against_reference(model, "resnet18", "after loads closed half way", 1e-4)
    model.close()


def test_the_daemon_faults_its_pool_in_at_start_and_reports_it(tmp_path: Path) -> None:
    import os

    from inferd.server.testing import write_fake_model

    d = tmp_path / "models"
    d.mkdir()
    write_fake_model(d / "m.onnx")
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    env.update(INFERD_HOST_POOL="32M", INFERD_MEMORY_PRESSURE="off")
    sock = Path(tempfile.mkdtemp(prefix="ifhp", dir="/tmp"))  # (an ipc path must be short)
    try:
        _serve_and_check(d, sock, env, tmp_path)
    finally:
        shutil.rmtree(sock, ignore_errors=True)


def _serve_and_check(d: Path, sock: Path, env: dict[str, str], tmp_path: Path) -> None:
    from inferd.server.testing import DaemonProcess, wait_until
    from inferd_client import Client

    with DaemonProcess(f"ipc://{sock}/d.sock", d, env=env, log_path=tmp_path / "d.log") as dp, \
            Client(dp.endpoint, timeout=30) as c:
        wait_until(lambda: (c.status()["memory"]["host_pool"] or {}).get("prefaulted_bytes") == 32 << 20, 30)
        mem = c.status()["memory"]
        assert mem["host_pool"]["capacity_bytes"] == 32 << 20
        # the pool's free part is the daemon's, not interpreter overhead: RSS holds it
        assert mem["rss_bytes"] >= mem["host_pool"]["prefaulted_bytes"]
        assert dp.rss() >= 32 << 20


def test_a_failing_background_prefault_never_writes_into_memory_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    from inferd.runtime import pagecache

    if not pagecache.can_populate():
        pytest.skip("no MADV_POPULATE_WRITE here: the pool faults in before anything is handed out")
    p = HostPool(64 * PAGE)
    a = p.alloc(8 * PAGE)
    assert a is not None
    a[:] = 7
    monkeypatch.setattr(pagecache, "populate", lambda _a: False)
    p.prefault(background=True)
    assert p.wait_prefaulted(10)
    assert (a == 7).all() and p.stats()["prefaulted_bytes"] == 0


def test_memory_from_the_faulted_pool_is_not_faulted_in_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from inferd.ops.conv import prefault_scratch
    from inferd.runtime import pagecache
    from inferd.frontend import import_model
    from inferd.runtime.cpu import CpuExecutor
    from zoo_fixture import zoo_reference

    p = _pool(16 << 20 >> 12)
    monkeypatch.setattr(hostpool, "_pool", p)
    monkeypatch.setattr(fileio, "pool_alloc", lambda n: p.alloc(n) if n >= hostpool.MIN_BYTES else None)
    inside, heap = fileio.aligned_bytes(20 * PAGE, 64), np.empty(20 * PAGE, np.uint8)
    assert hostpool.faulted_in(inside) and not hostpool.faulted_in(heap)
    p.prefaulted = 8 * PAGE  # (a pool still being faulted in: only its first pages are)
    assert not hostpool.faulted_in(inside) and hostpool.faulted_in(inside[:4 * PAGE])
    p.prefaulted = p.capacity
    # kernel workspaces come from the pool
    ws = prefault_scratch({0: 5 * PAGE})
    assert p.base <= ws[0].ctypes.data < p.base + p.capacity
    # an arena in the faulted pool is not walked again; one outside it is
    populated: list[int] = []
    monkeypatch.setattr(pagecache, "populate", lambda a: populated.append(a.nbytes) or True)
    monkeypatch.setattr(pagecache, "can_populate", lambda: True)
    ex = CpuExecutor(import_model(zoo_reference("squeezenet1_1")[0]), lazy=True)
    ex.prefault([])
    assert hostpool.faulted_in(ex.arena) and populated == []
    monkeypatch.setattr(hostpool, "_pool", None)
    ex.prefault([])
    assert populated == [ex.arena.nbytes]


_OUTLIVE = r"""
import gc, sys
import numpy as np
from inferd.runtime.hostpool import HostPool, PAGE


def mapped(addr):
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
            if lo <= addr < hi:
                return True
    return False


p = HostPool(64 * PAGE)
a = p.alloc(8 * PAGE)
addr = p.base
del p
gc.collect()
a[:] = 5  # the pool is gone; its array is not: this write must land in memory still mapped
assert int(a.sum()) == 5 * 8 * PAGE and mapped(addr)
del a
gc.collect()
assert not mapped(addr), "the pool's mapping outlived its last array"
print("ok")
"""


def test_an_array_outlives_its_pool_and_the_mapping_goes_with_the_last_one() -> None:
    """A pool dropped while one of its arrays lives (a test's pool; a kernel workspace a thread keeps across models)
    must not be unmapped under the array: the suite's rare worker crash was a conv's first run using the main
    thread's workspace from such a pool, gone with the test that made it. Once the last array is gone, the
    mapping goes too. In a child: the failure is a segfault."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _OUTLIVE], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout[-500:], r.stderr[-2000:])


def test_a_thread_workspace_from_a_dropped_pool_serves_the_next_model() -> None:
    """The crash's own sequence, in a child: a cold load's kernel workspaces come from a pool and the running thread
    adopts them (``CpuExecutor.prefault`` / ``begin``); the pool is then dropped (a test's pool) while the thread
    keeps them; a batch-3 model's convs then run unbound on that thread's workspace."""
    import subprocess
    import sys

    code = r"""
import gc, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import inferd
from inferd import fileio
from inferd.ops import conv
from inferd.runtime import hostpool
from inferd.runtime.hostpool import HostPool
from test_import import conv_bn_relu_add_model
from ortutil import run_ort

p = HostPool(64 << 20)
p.prefault(background=False)
fileio.pool_alloc = lambda n: p.alloc(n) if n >= hostpool.MIN_BYTES else None
conv.adopt_scratch(conv.prefault_scratch({0: 1 << 20}))
assert p.base <= conv.scratch(0, 16).ctypes.data < p.base + p.capacity
fileio.pool_alloc = None
del p
gc.collect()
onnx_model = conv_bn_relu_add_model()
x = np.random.default_rng(0).standard_normal((3, 3, 9, 11)).astype(np.float32)
ref = run_ort(onnx_model, {"x": x})[0]
got = inferd.load(onnx_model.SerializeToString(), batch=3).run({"x": x})["y"]
assert np.abs(got - ref).max() / np.abs(ref).max() <= 1e-5
print("ok")
"""
    tests = str(Path(__file__).resolve().parent)
    r = subprocess.run([sys.executable, "-c", code, tests], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stdout[-500:], r.stderr[-3000:])
