"""Measures the cost model's entries on this device: per layer and candidate kernel, the transform
and the warm and first execution; for the device, the rates of the disk, the checksum and memory.

Runs at ``inferd compile`` and when the daemon first registers a model; what it measures is stored
in the package as a :class:`~inferd.planner.cost.Profile` with this device's fingerprint.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .. import __version__
from ..ops.base import Kernel, Layer, raw_params
from ..ops.control import CONTROL_OPS
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


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


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


#: a layer's candidates are timed in rounds (each round runs every kernel once) while their transformed weights
#: together stay under this; a layer whose candidates hold more is timed one kernel after the other
INTERLEAVE_BYTES = 64 << 20


def _measure_layer(layer: Layer, kernels: Sequence[Kernel], raw: dict[str, np.ndarray],
                   ins: list[np.ndarray | None], outs: list[np.ndarray], reps: int,
                   times: dict[tuple[str, str, str], float], idle: bool, stop: Callable[[], bool] | None) -> None:
    """Time ``layer``'s candidate ``kernels`` into ``times``: per kernel its transform (where it has one), its first
    execution after the bind, and the median of ``reps`` warm ones. The warm runs of the kernels go in rounds, one
    run of each kernel per round: a burst of other work on the machine (seconds on a shared VM) then slows every
    candidate's runs alike instead of the one kernel timed during it. One after the other, resnet18's
    /layer4/1/conv2 measured Winograd F(2,3) at 2.11 ms beside 1.38 ms for the same kernel on /layer4/1/conv1, the
    same shape (2-core VM), and ran im2col (1.79 ms profiled, 1.99 ms warm) where Winograd ran in 1.36 ms.
    A kernel that fails is left out: no entry of it, as of a kernel the planner should not trust."""
    kept: list[tuple[Kernel, Callable[[], object], dict[tuple[str, str, str], float]]] = []
    held = 0
    for k in kernels:
        if idle and not foreground.wait_quiet(timeout=IDLE_WAIT_S):
            raise IdleBusy(f"no quiet moment in {IDLE_WAIT_S} s")
        if stop is not None and stop():
            raise IdleBusy("stopped")
        got: dict[tuple[str, str, str], float] = {}
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
                got[(layer.name, k.name, "transform")] = time.perf_counter() - t0
            fn = bound if bound is not None else (lambda k=k, p=params: k.run(layer, ins, p, outs))
            t0 = time.perf_counter()
            fn()
            first = time.perf_counter() - t0
            got[(layer.name, k.name, "exec_first")] = first
            if k.prepares_at_first_run:  # (an If builds its taken branch then)
                got[(layer.name, k.name, "exec_cold")] = first
            nbytes = int(k.transformed_nbytes(layer))
            if held + nbytes > INTERLEAVE_BYTES:
                # too much to hold beside the others (or alone: vgg16's classifier, 400 MB a kernel): this one
                # alone, now, its weights dropped after it, as one after the other held one kernel's at a time
                got[(layer.name, k.name, "exec")] = float(np.median([_timed(fn) for _ in range(reps)])) \
                    if reps > 0 else first
                times.update(got)
                continue
            held += nbytes
            kept.append((k, fn, got))
        except Exception as e:  # a kernel that fails here is not a candidate the planner should trust
            log.warning("profiling %s with %s failed: %s", layer.name, k.name, e)
    samples: list[list[float]] = [[] for _ in kept]
    failed: set[int] = set()
    for _ in range(reps):
        if idle and not foreground.wait_quiet(timeout=IDLE_WAIT_S):
            raise IdleBusy(f"no quiet moment in {IDLE_WAIT_S} s")
        if stop is not None and stop():
            raise IdleBusy("stopped")
        for i, (k, fn, _got) in enumerate(kept):
            if i in failed:
                continue
            try:
                t0 = time.perf_counter()
                fn()
                samples[i].append(time.perf_counter() - t0)
            except Exception as e:
                log.warning("profiling %s with %s failed: %s", layer.name, k.name, e)
                failed.add(i)
    for i, (k, _fn, got) in enumerate(kept):
        if i in failed:
            continue
        first = got[(layer.name, k.name, "exec_first")]
        got[(layer.name, k.name, "exec")] = float(np.median(samples[i])) if samples[i] else first
        times.update(got)


def _frozen(v: Any) -> Any:
    """``v`` as a hashable value (an attribute of a node), or raise TypeError for one that has no such form."""
    if isinstance(v, np.ndarray):
        return ("array", v.dtype.str, v.shape, hashlib.sha1(np.ascontiguousarray(v).tobytes()).hexdigest())
    if isinstance(v, (list, tuple)):
        return tuple(_frozen(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((str(k), _frozen(x)) for k, x in v.items()))
    if isinstance(v, (int, float, str, bytes, bool, type(None), np.generic)):
        return v
    raise TypeError(f"no hashable form of {type(v).__name__}")


#: node attributes that name tensors and change nothing a kernel computes (the outputs a fusion absorbed)
_NAMES_ONLY = frozenset({"_absorbed"})


def layer_signature(layer: Layer) -> tuple[Any, ...] | None:
    """What a kernel's time on ``layer`` depends on when it runs alone on inputs of its shapes, as the profiler runs
    it: the op, its attributes (fused activations and residuals included), every input's and output's shape and
    type, which inputs are constants. Two layers of one signature cost the same; None for a layer whose cost
    depends on more (control flow: its bodies) or an attribute with no plain value."""
    if layer.op in CONTROL_OPS:
        return None

    def info(t: Any) -> Any:
        return None if t is None else (tuple(t.shape), np.dtype(t.dtype).str)
    try:
        sig = (layer.op, tuple((k, _frozen(v)) for k, v in sorted(layer.node.attrs.items()) if k not in _NAMES_ONLY),
               tuple(info(t) for t in layer.inputs), tuple(info(t) for t in layer.outputs),
               tuple(layer.const_inputs))
        hash(sig)
    except TypeError:  # a subgraph, an object of its own
        return None
    return sig


def pool_signatures(entries: Sequence[tuple[Layer, Sequence[Kernel], Kernel]],
                    times: dict[tuple[str, str, str], float]) -> int:
    """Give the layers of one signature (``layer_signature``: resnet's repeated blocks, a transformer's layers) one
    time per kernel and phase (warm, first run, transform): the lower median of what the group's layers measured
    (``_lower_median``), to each layer of the group that has the kernel as a candidate, measured or not (one the
    time budget stopped before). A layer's runs alone cost the same whichever of them runs, and the group's layers
    no longer choose different kernels from which of them a burst of other work hit. A pair takes its lesser time
    (a machine's noise only adds time); a larger group its middle one, not its least: the least of twelve blocks
    had vit_tiny's schedule predicted at 26 ms where it ran 61 (2026-12-07ze), every kernel's cost taken from the
    luckiest of its runs. Returns the entries changed or added."""
    groups: dict[tuple[Any, ...], list[tuple[str, set[str]]]] = {}
    for layer, kernels, _default in entries:
        sig = layer_signature(layer)
        if sig is not None:
            groups.setdefault(sig, []).append((layer.name, {k.name for k in kernels}))
    changed = 0
    for members in groups.values():
        if len(members) < 2:
            continue
        names = {n for n, _ in members}
        seen: dict[tuple[str, str], list[float]] = {}
        for (n, k, phase), v in times.items():
            if n in names and phase in _POOLED:
                seen.setdefault((k, phase), []).append(v)
        pooled = {kp: _lower_median(vs) for kp, vs in seen.items()}
        for n, cands in members:
            for (k, phase), v in pooled.items():
                if k in cands and times.get((n, k, phase)) != v:
                    times[(n, k, phase)] = v
                    changed += 1
    return changed


def _lower_median(values: Sequence[float]) -> float:
    """The middle of ``values``, the lesser of the two middle ones for an even count (a pair's least)."""
    return sorted(values)[(len(values) - 1) // 2]


#: the phases ``pool_signatures`` shares: what the profiler measures of a layer alone
_POOLED = ("exec", "exec_first", "transform")


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
        _measure_layer(layer, kernels, raw, ins, outs, reps, times, idle, stop)
    pool_signatures(entries, times)
    return Profile(backend, fingerprint, rates, times)
