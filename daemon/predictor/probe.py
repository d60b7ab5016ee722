"""How fast this machine runs *now*: short reference runs that scale the predictor's warm and read times.

The predictor learns unit times on the machine it serves, but that machine's speed is not a constant: a
Jetson changes its clocks with its power mode and its temperature, and a shared board (the 2-core VM this
was measured on) runs at another speed when its neighbours are busy. Measured here: a predictor trained in
a slow spell over-predicted every kernel by 5-40% an hour later (whole models +14% on average, held-out
variants), and by +6% ten minutes later; the units moved together, the model's shape did not matter.

So training records, beside every model it measures, the time of a fixed reference run (:func:`probe_s`: a
small MobileNetV2-like and a small ResNet-like network, every kernel family the zoo's models use, on the same
executor and threads), and fits the unit models on times rescaled to the training's median reference. A
prediction multiplies by ``speed = probe now / reference at training`` (:class:`SpeedProbe` keeps the median of
its last probes, one ~40 ms; ``inferd info --predict`` uses it, the bench probes beside each model). Without a
probe (a file trained before, or no time to run one) the speed is 1.0: the training's level, as before.

The disk moves as well: cold 4-64 KB reads took 50 us in one bench run and 73 us in the next (the
training's table said 48 us). :func:`read_probe` reads a few sizes cold the way the training's read table was
measured (``measure.measure_reads``), and :func:`read_factors` turns it into a factor per size against that
table; a prediction of a read interpolates the factor over the size (``Predictor.read_seconds``).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import numpy as np

#: the reference networks (zoo variants, fixed: their weights are seeded by name); together ~7 ms a run on the
#: 2-core VM at two threads: conv1x1, depthwise, direct/im2col/Winograd 3x3, pooling, the classifier GEMM. Why
#: this size: timed beside held-out models for 150 s, a pair ~1 ms a run followed their times no better than
#: no probe at all (81% vs 80% within 10% of each model's median; this pair 88%): at 1 ms the probe's own noise
#: (a preemption, a wake-up) is as large as the machine's drift
REFERENCE = (("mobilenetv2", 0.75, 128, 0.75, 3), ("resnet", 0.5, 128, 0.75, 3))
#: runs per probe: the median of these after one untimed run (WARMUP_RUNS after the networks are built: their
#: first runs fault in the arena and fill the caches, 20% slower on the 2-core VM)
PROBE_RUNS = 5
WARMUP_RUNS = 3

_lock = threading.Lock()
_executors: dict[int, list[tuple[Any, dict[str, np.ndarray]]]] = {}


def _reference(threads: int) -> list[tuple[Any, dict[str, np.ndarray]]]:
    """The reference executors (built once per process and thread count: building transforms weights)."""
    ex = _executors.get(threads)
    if ex is None:
        from ..frontend import import_template, specialize
        from ..runtime.cpu import CpuExecutor
        from ..zoo._variants import VariantSpec, build_variant

        ex = []
        for fam, w, r, d, k in REFERENCE:
            spec = VariantSpec(fam, w, r, d, k)
            g = specialize(import_template(build_variant(spec)))
            feeds = {t.name: np.random.default_rng(0).standard_normal(t.shape).astype(t.dtype) for t in g.inputs}
            ex.append((CpuExecutor(g), feeds))
        _executors[threads] = ex
    return ex


def probe_s(threads: int, runs: int = PROBE_RUNS) -> float:
    """Seconds of one pass over the reference networks at ``threads`` (median of ``runs``), on the CPU executor.
    The caller's thread count is restored; while it runs, the process's native pool has ``threads`` threads, so
    a server calls it between requests (in idle time), not beside them."""
    from .. import native

    with _lock:
        before = native.num_threads()
        if before != threads:
            native.set_num_threads(threads)
        try:
            fresh = threads not in _executors
            ex = _reference(threads)
            for _ in range(WARMUP_RUNS if fresh else 1):
                for e, f in ex:
                    e.run(f)
            ts = []
            pc = time.perf_counter
            for _ in range(max(1, runs)):
                t0 = pc()
                for e, f in ex:
                    e.run(f)
                ts.append(pc() - t0)
            return float(np.median(ts))
        finally:
            if before != threads:
                native.set_num_threads(before)


class SpeedProbe:
    """The machine's current speed against a predictor's training (``inferd info --predict``; the planners plan
    from relative costs and do not ask yet): ``speed()`` is
    ``probe / reference``, the probe the median of the last ``keep`` taken, a new one taken when the last is over
    ``max_age_s`` old (one costs ~40 ms: one probe per prediction request at most, refreshed in idle time).
    Why a median of several: the drift is slow (minutes), one probe's noise is not; in the bench, scaling each
    model by its own few probes cost more than it gained on a run without drift (76% -> 67% within 10%)."""

    def __init__(self, reference_s: float | None, threads: int, max_age_s: float = 30.0, keep: int = 5) -> None:
        self.reference_s = reference_s
        self.threads = threads
        self.max_age_s = max_age_s
        self._values: deque[float] = deque(maxlen=max(1, keep))
        self._at = -1e18

    def speed(self) -> float:
        if not self.reference_s or self.reference_s <= 0:
            return 1.0
        now = time.monotonic()
        if not self._values or now - self._at > self.max_age_s:
            self._values.append(probe_s(self.threads))
            self._at = now
        return speed_factor(float(np.median(self._values)), self.reference_s)


#: a probe this far from the training's reference is not a slower machine but a broken measurement (a
#: preempted probe): the factor is clamped
SPEED_RANGE = (0.25, 4.0)


def speed_factor(probe: float | None, reference: float | None) -> float:
    if not probe or not reference or probe <= 0 or reference <= 0:
        return 1.0
    return float(min(max(probe / reference, SPEED_RANGE[0]), SPEED_RANGE[1]))


#: sizes :func:`read_probe` reads (each one of the training table's sizes: the factor is probe / table)
READ_PROBE_SIZES = (1 << 12, 1 << 16, 1 << 20)
READ_PROBE_REPEATS = 5


def read_probe(directory: Any = None) -> dict[int, float]:
    """Median seconds of cold reads of ``READ_PROBE_SIZES`` on the disk that holds ``directory`` (a scratch
    file written, read with its pages dropped before every read, removed): ~10-20 ms."""
    from .measure import measure_reads

    rm = measure_reads(directory, sizes=READ_PROBE_SIZES, repeats=READ_PROBE_REPEATS)
    return {int(n): float(t) for n, t in rm.samples}


def read_factors(probe: dict[int, float] | None, table: Any) -> dict[int, float]:
    """Per probed size, probe / the training table's time at that size (clamped like the speed); {} when
    either is missing."""
    if not probe or not table:
        return {}
    ref = {int(n): float(t) for n, t in table}
    return {n: speed_factor(t, ref.get(n)) for n, t in sorted(probe.items()) if ref.get(n)}
