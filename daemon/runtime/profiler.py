"""Measures the cost model's entries on this device: per layer and candidate kernel, the transform
and the warm and first execution; for the device, the rates of the disk, the checksum and memory.

Runs at ``inferd compile`` and when the daemon first registers a model; what it measures is stored
in the package as a :class:`~inferd.planner.cost.Profile` with this device's fingerprint.
"""
from __future__ import annotations

import functools
import logging
import os
import platform
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .. import __version__
from ..ops.base import Kernel, Layer, raw_params
from ..planner.cost import DeviceRates, Profile, kernel_transforms
from ..store import checksum
from .scheduler import foreground

log = logging.getLogger("inferd.runtime.profiler")


@functools.lru_cache(maxsize=1)
def _cpu_model() -> str:
    """The CPU's model line of /proc/cpuinfo (read once: every package opening asks, 0.3-0.6 ms a read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "cpu part", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_fingerprint() -> dict[str, str]:
    """What makes CPU measurements and CPU-transformed layouts valid elsewhere: the same engine, the
    same architecture, the same CPU model, core count and GEMM instruction set."""
    from .. import native

    model = _cpu_model()
    # native_abi: the C kernels' packed weight layouts change with it (int8 conv rows, ABI 16); int8_isa: the
    # int8 convs' packing follows it (AMX tiles' where the kernel grants them, which the same CPU may not)
    return {"backend": "cpu", "engine": __version__, "native_abi": str(native.ABI), "machine": platform.machine(),
            "cpu": model, "threads": str(native.num_threads()), "gemm_isa": str(native.gemm_isa()),
            "int8_isa": str(native.int8_isa())}


def ramp(fn: Callable[[], object], seconds: float = 1.0) -> None:
    """Call ``fn`` for ``seconds``: a discrete GPU idles at low clocks and needs a burst of work to reach its
    running clock (on the H100 the same warm model measured up to 2.2x slower straight after a pause), so a
    timing taken cold-clocked and one taken after other GPU work do not agree."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        fn()


def _median_time(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    """(first call, median of the next ``reps``) in seconds."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return first, float(np.median(ts)) if ts else first


def measure_rates(sample_file: str | os.PathLike | None = None) -> DeviceRates:
    """The device's disk read rate (on ``sample_file`` with its pages dropped first), checksum and
    memory rates, and an achieved GEMM rate for the roofline fallback."""
    base = DeviceRates()
    buf = np.ones(8 << 20, np.uint8)
    t0 = time.perf_counter()
    for _ in range(3):
        checksum(memoryview(buf))
    crc_bw = 3 * buf.nbytes / max(time.perf_counter() - t0, 1e-9)
    dst = np.empty_like(buf)
    t0 = time.perf_counter()
    for _ in range(3):
        np.copyto(dst, buf)
    mem_bw = 3 * buf.nbytes / max(time.perf_counter() - t0, 1e-9)
    a = np.ones((256, 256), np.float32)
    t0 = time.perf_counter()
    for _ in range(4):
        a @ a
    flops = 4 * 2 * 256 ** 3 / max(time.perf_counter() - t0, 1e-9)
    disk_bw = base.disk_bw
    if sample_file is not None:
        got = disk_read_rate(sample_file)
        if got is not None:
            disk_bw = got
    return DeviceRates(flops=flops, mem_bw=mem_bw, disk_bw=disk_bw, crc_bw=crc_bw)


def disk_read_rate(path: str | os.PathLike, limit: int = 64 << 20) -> float | None:
    """Bytes/s reading ``path`` from disk (its cached pages dropped first); None if the file is too
    small to say or its pages could not be dropped (then the measurement would be the page cache's)."""
    from .pagecache import drop_file, resident_fraction

    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError:
        return None
    if size < (4 << 20):
        return None
    drop_file(p)
    if resident_fraction(p) > 0.05:
        return None
    n = min(size, limit)
    buf = bytearray(1 << 20)
    mv = memoryview(buf)
    fd = os.open(p, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        off = 0
        while off < n:
            got = os.preadv(fd, [mv], off)
            if got <= 0:
                break
            off += got
        dt = time.perf_counter() - t0
    finally:
        os.close(fd)
    drop_file(p)
    return off / dt if dt > 0 and off else None


#: idle-time profiling waits this long for a quiet moment before it gives the idle worker back (``IdleBusy``):
#: the worker is one queue, and a warm switch or another model's finishing must not wait behind a profile
#: that a steady stream of requests starves
IDLE_WAIT_S = 1.0


class IdleBusy(Exception):
    """Idle-time profiling gave up: the foreground stayed busy, or its model was closed (``stop``)."""


def profile_layers(entries: Sequence[tuple[Layer, Sequence[Kernel], Kernel]], constants: object,
                   rates: DeviceRates, fingerprint: dict[str, str], backend: str = "cpu",
                   reps: int = 3, budget_s: float = 30.0, stop: Callable[[], bool] | None = None,
                   between_requests: bool = False) -> Profile:
    """Transform and execute every candidate kernel of every layer that has a choice or weights.

    Layers are run alone on random inputs of their shapes. Stops measuring (leaving the rest to the
    roofline) after ``budget_s`` so that a huge model does not hold compilation for minutes.
    ``between_requests`` (idle-time profiling): measure only while no request runs, and raise ``IdleBusy``
    when none leaves it ``IDLE_WAIT_S`` of quiet or ``stop()`` says so. Not for a profile that a request
    waits on, wherever it runs: a control-flow body's kernels measured while its cold load is finished on the
    idle worker waited for the quiet of the very request that waited on them, and failed it after 1 s."""
    rng = np.random.default_rng(0)
    times: dict[tuple[str, str, str], float] = {}
    t_start = time.perf_counter()
    idle = between_requests
    for layer, kernels, _default in entries:
        if not layer.const_inputs and len(kernels) < 2:
            continue  # nothing to choose and nothing to prepare: the roofline does
        if time.perf_counter() - t_start > budget_s:
            log.info("profiling stopped after %.1f s; remaining layers use the roofline", budget_s)
            break
        raw = raw_params(layer, constants)  # type: ignore[arg-type]
        ins: list[np.ndarray | None] = []
        for k, info in enumerate(layer.inputs):
            if info is None or k in layer.const_inputs:
                ins.append(None)
            elif np.issubdtype(info.dtype, np.floating):
                ins.append(rng.standard_normal(info.shape).astype(info.dtype))
            else:
                ins.append(np.zeros(info.shape, info.dtype))
        outs = [np.empty(o.shape, o.dtype) for o in layer.outputs]
        for k in kernels:
            if idle and not foreground.wait_quiet(timeout=IDLE_WAIT_S):
                raise IdleBusy(f"no quiet moment in {IDLE_WAIT_S} s")
            if stop is not None and stop():
                raise IdleBusy("stopped")
            try:
                t0 = time.perf_counter()
                params = k.transform(layer, raw)
                bound = k.bind(layer, ins, params, outs)
                if kernel_transforms(k):
                    # preparing a layer is its transform and its bind, as the cold runtime's prepare does both
                    # (``CpuExecutor.prepare``): a Loop's or Scan's bind builds its bodies' executors (an If builds
                    # its taken branch at its first run: in exec_first). Their kernels are measured before any
                    # profile (``package.compile_model``; a loaded model has picked them), as a package's load
                    # brings them (``body_choices``): the bind times the build alone
                    times[(layer.name, k.name, "transform")] = time.perf_counter() - t0
                fn = bound if bound is not None else (lambda k=k, p=params: k.run(layer, ins, p, outs))
                first, warm = _median_time(fn, reps)
                times[(layer.name, k.name, "exec_first")] = first
                if k.prepares_at_first_run:  # (an If builds its taken branch then)
                    times[(layer.name, k.name, "exec_cold")] = first
                times[(layer.name, k.name, "exec")] = warm
            except Exception as e:  # a kernel that fails here is not a candidate the planner should trust
                log.warning("profiling %s with %s failed: %s", layer.name, k.name, e)
    return Profile(backend, fingerprint, rates, times)
