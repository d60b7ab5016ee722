"""Measuring units, reads and whole models on this machine: what the predictor learns from and is judged by.

Units are timed *inside the models they belong to*, each layer's call timed in the executor's own loop
(GPU timestamps per dispatch on Vulkan). Measured on the 2-core board, the same layer timed alone on
random inputs ran 0.45-0.95x as long as inside its model (its weights stay in cache when it repeats;
inside a model the other layers evict them), and even interleaving random units (a synthetic context)
left errors of +-40%: a model-level latency is a sum of in-context times, so that is what is measured.
Every time is a median over repeated runs, as a board shared with other work disturbs single runs.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..ops.base import Kernel, Layer
from ..planner.cost import kernel_transforms
from ..runtime.profiler import ramp

#: warm runs of a whole model: at least MIN_REPS, more while they fit in the budget, at most MAX_REPS
MIN_REPS = 7
MAX_REPS = 25
MODEL_BUDGET_S = 0.6
#: GPU work before a Vulkan model's timed runs (runtime.profiler.ramp)
RAMP_S = 0.25
#: pipeline creations timed per unit (median), through an empty and through the filled cache: a filled-cache
#: creation takes 10-40 us, and the median of 3 repeated within 20% only 58% of the time on the H200 host
#: (2026-11-29); an empty-cache one compiles (milliseconds), 3 are enough
PIPELINE_REPS = (3, 9)


@dataclass
class LayerSample:
    layer: Layer
    kernel: Kernel
    phases: dict[str, float]
    #: Vulkan: the layer's dispatches as recorded (their features are derived from these)
    dispatches: Any = None


@dataclass
class ModelSample:
    warm_s: float
    layers: list[LayerSample] = field(default_factory=list)
    kernels: dict[str, str] = field(default_factory=dict)


def set_threads(n: int) -> None:
    from .. import native

    if native.num_threads() != n:
        native.set_num_threads(n)


def _feeds(graph: Any) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {t.name: rng.standard_normal(t.shape).astype(t.dtype) if np.issubdtype(t.dtype, np.floating)
            else np.zeros(t.shape, t.dtype) for t in graph.inputs}


def measure_model_cpu(graph: Any, threads: int, kernels: Mapping[str, str] | None = None,
                      transforms: bool = True, budget_s: float = MODEL_BUDGET_S) -> ModelSample:
    """Warm whole-model median and, per executed layer, its in-context warm median, its first run (inside the
    model's first run) and its transform (median of 3 for small weights, one timing for large ones)."""
    from ..ops.base import raw_params
    from ..runtime.cpu import CpuExecutor

    set_threads(threads)
    ex = CpuExecutor(graph, kernels=dict(kernels) if kernels else None)
    feeds = _feeds(graph)
    steps = [s for s in ex.steps if s is not None and not s.alias]
    calls = [s.call() for s in steps]
    pc = time.perf_counter
    first = np.zeros(len(steps))
    ex.begin(feeds)
    for i, c in enumerate(calls):
        t0 = pc()
        c()
        first[i] = pc() - t0
    ex.end()
    ex.run(feeds)
    per: list[np.ndarray] = []
    whole: list[float] = []
    end = pc() + budget_s
    while len(whole) < MIN_REPS or (len(whole) < MAX_REPS and pc() < end):
        row = np.empty(len(steps))
        t_run = pc()
        ex.begin(feeds)
        for i, c in enumerate(calls):
            t0 = pc()
            c()
            row[i] = pc() - t0
        ex.end()
        whole.append(pc() - t_run)
        per.append(row)
    warm = np.median(np.stack(per), axis=0)
    out = ModelSample(float(np.median(whole)), kernels={s.layer.name: s.kernel.name for s in steps})
    for i, s in enumerate(steps):
        ph = {"exec": float(warm[i]), "exec_first": float(first[i])}
        if transforms and kernel_transforms(s.kernel) and s.layer.const_inputs:
            raw = raw_params(s.layer, graph.constants)
            ph["transform"] = time_transform(s.kernel, s.layer, raw)
        out.layers.append(LayerSample(s.layer, s.kernel, ph))
    return out


#: a transform is timed repeatedly until this much time is spent (most take 2-200 us: one timing of those is
#: mostly the timer and the scheduler), between TRANSFORM_REPS[0] and TRANSFORM_REPS[1] times; the median
TRANSFORM_BUDGET_S = 4e-3
TRANSFORM_REPS = (3, 15)


def time_transform(kernel: Kernel, layer: Layer, raw: Mapping[str, Any]) -> float:
    """Median seconds of ``kernel.transform(layer, raw)`` over repeated calls (more for short ones)."""
    pc = time.perf_counter
    ts: list[float] = []
    t_end = pc() + TRANSFORM_BUDGET_S
    while len(ts) < TRANSFORM_REPS[1]:
        t0 = pc()
        kernel.transform(layer, dict(raw))
        ts.append(pc() - t0)
        if len(ts) >= TRANSFORM_REPS[0] and pc() >= t_end:
            break
        if ts[0] > 0.05:  # a large transform: one timing more says little and costs much
            break
    return float(np.median(ts))


def measure_model_vulkan(graph: Any, kernels: Mapping[str, str] | None = None, reps: int = 9,
                         cold: bool = True) -> ModelSample:
    """Warm whole-model median by wall clock; per layer the GPU time of its dispatches in the warm run (median
    over runs); with ``cold`` per layer also its transform and its pipelines' creation through an empty and
    through the filled cache (medians of 3)."""
    from ..vulkan.cold import VulkanColdBackend
    from ..vulkan.kernel import split_rows

    be = VulkanColdBackend(graph, kernels=dict(kernels) if kernels else None, profile=True)
    try:
        be.prepare_all()
        be.finalize()
        feeds = _feeds(graph)
        be.run(feeds)
        # at the GPU's running clock, whatever ran before (training measures back to back, the bench between
        # cold phases and other models: unit times differed by 30% between the two without this)
        ramp(lambda: be.run(feeds), RAMP_S)
        whole: list[float] = []
        per_layer: dict[str, list[float]] = {}
        for _ in range(reps):
            t0 = time.perf_counter()
            be.run(feeds)
            whole.append(time.perf_counter() - t0)
            acc: dict[str, float] = {}
            for d in be.last_profile():
                acc[d["node"]] = acc.get(d["node"], 0.0) + d["ms"] / 1e3
            for k, v in acc.items():
                per_layer.setdefault(k, []).append(v)
        out = ModelSample(float(np.median(whole)))
        dev = be.device
        for slot, prep in zip(be._slots, be._prepared):
            if slot.kind != "kernel" or prep is None or slot.layer.name not in per_layer:
                continue
            k = prep.kernel
            out.kernels[slot.layer.name] = k.name
            ph = {"exec": float(np.median(per_layer[slot.layer.name]))}
            ds = [b.dispatch for b in prep.bound]
            if cold:
                raw = be._raw(slot, {})
                if kernel_transforms(k) and slot.layer.const_inputs:
                    # timed as on the CPU (repeated to a budget, the median): one timing repeated within 20%
                    # only 77% of the time on the H200 host (2026-11-29)
                    ph["transform"] = time_transform(k, slot.layer, raw)
                params = k.transform(slot.layer, raw)
                ds = split_rows(k.dispatches(slot.layer, params, be.caps), be.caps)
                pipes = be._pipelines(ds)
                reqs = [(p.module, dict(d.spec)) for d, p in zip(ds, pipes)]
                ph["pipeline_empty"] = float(np.median([dev.time_pipelines(reqs, empty=True)
                                                        for _ in range(PIPELINE_REPS[0])]))
                ph["pipeline_filled"] = float(np.median([dev.time_pipelines(reqs, empty=False)
                                                         for _ in range(PIPELINE_REPS[1])]))
            out.layers.append(LayerSample(slot.layer, k, ph, ds))
        return out
    finally:
        be.close()


@dataclass
class ReadModel:
    per_read_s: float
    disk_bw: float
    samples: list[tuple[int, float]]
    #: every timing per size (what :func:`pool_reads` combines across measuring windows)
    timings: dict[int, list[float]] = field(default_factory=dict)


def pool_reads(models: Sequence[ReadModel]) -> ReadModel:
    """One read model from several measured at different times: per size the median of all their timings.

    The disk is shared too: another helper's large reads queued ours for 2-4 ms at times (a table measured in
    one such second said 2.7 ms for 4 KB, 50x its quiet time); timings from windows minutes apart, pooled, have
    a median that one disturbed window does not move."""
    pooled: dict[int, list[float]] = {}
    for m in models:
        for n, ts in m.timings.items():
            pooled.setdefault(n, []).extend(ts)
    return _fit_reads({n: pooled[n] for n in sorted(pooled)})


def read_once(fd: int, path: str, n: int, off: int) -> float:
    """Seconds to read ``n`` bytes at ``off`` and checksum them, as the weights store does, pages dropped first."""
    from ..runtime.pagecache import drop_file
    from ..store import checksum

    drop_file(path)
    buf = bytearray(n)
    t0 = time.perf_counter()
    got = os.preadv(fd, [memoryview(buf)], off)
    checksum(memoryview(buf)[:got])
    return time.perf_counter() - t0


def measure_reads(directory: str | os.PathLike | None = None, sizes: Sequence[int] = (),
                  repeats: int = 11) -> ReadModel:
    """Fit ``seconds = per_read + bytes / bw`` (relative least squares, both positive) for reading a
    tensor of ``bytes`` cold from the disk that holds ``directory``; the medians per size are the read table."""
    # the time of a cold read is far from linear in its size between 16 KB and a few MB (readahead): a table
    # of sizes a factor of two apart, each the median of ``repeats`` reads at different offsets
    sizes = list(sizes) or [1 << k for k in range(12, 25)]
    d = tempfile.mkdtemp(prefix="inferd-reads.", dir=str(directory) if directory else None)
    path = os.path.join(d, "sample.bin")
    timings: dict[int, list[float]] = {}
    try:
        total = max(sizes) * 2
        with open(path, "wb") as f:
            f.write(np.random.default_rng(0).integers(0, 255, total, dtype=np.uint8).tobytes())
            f.flush()
            os.fsync(f.fileno())
        fd = os.open(path, os.O_RDONLY)
        try:
            # one size's repeats back to back, as the bench and a cold start read (sizes interleaved, a small
            # read right after a 16 MB one waited 3-4 ms behind its readahead: 50x its time alone)
            # one untimed read first: the first read of a new file paid ~100 us more (its metadata, the
            # device waking), which the table put on its smallest size as 160 us against a quiet 60 us
            read_once(fd, path, min(sizes), 0)
            for n in sorted(sizes):
                timings[n] = [read_once(fd, path, n, (r * 4096 * 7) % max(total - n, 1) // 4096 * 4096)
                              for r in range(repeats)]
        finally:
            os.close(fd)
    finally:
        try:
            os.unlink(path)
            os.rmdir(d)
        except OSError:
            pass
    return _fit_reads(timings)


def _fit_reads(timings: Mapping[int, Sequence[float]]) -> ReadModel:
    samples = [(int(n), float(np.median(ts))) for n, ts in sorted(timings.items())]
    from scipy.optimize import nnls

    x = np.array([s[0] for s in samples], dtype=np.float64)
    y = np.array([s[1] for s in samples])
    A = np.stack([np.ones_like(x), x], axis=1) / y[:, None]
    c, _ = nnls(A, np.ones(len(y)))
    per_read = max(float(c[0]), 1e-6)
    bw = 1.0 / float(c[1]) if c[1] > 0 else float(x.max() / y.max())
    return ReadModel(per_read, bw, samples, {int(n): list(ts) for n, ts in timings.items()})
