"""Costs of a layer's cold-start and warm phases, per (layer, kernel), behind one interface.

The planners ask a :class:`CostModel` for the seconds one phase of one layer takes with one kernel
on this device. Three sources stand behind it, in order of trust:

* ``profiled``: measured on this device by :mod:`inferd.runtime.profiler` (at ``inferd compile`` and
  at a model's first registration in the daemon), stored in the compiled package;
* ``predicted``: a latency predictor (the predictor work plugs in here through the same protocol);
* ``roofline``: FLOPs and bytes at the device's rates: never zero, always flagged, so a model with no
  profile still gets a plan.

Everything here is data and arithmetic: no I/O, no timing.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from ..ops.base import Kernel, Layer
from ..ops.control import CONTROL_OPS, axis_index, scan_counts  # CONTROL_OPS: work in ``Node.bodies``
from ..ops.conv_nchwc import CONV as BLOCKED_CONV
from ..ops.gemm import MATMUL_T

#: The phases the cold-start planner schedules. ``read_raw``/``read_transformed``: bytes from the
#: weights store into memory (checksum included); ``transform``: raw -> the kernel's layout;
#: ``pipeline_empty``/``pipeline_filled``: GPU pipeline creation with an empty / a filled
#: ``VkPipelineCache``; ``exec``: one warm execution; ``exec_first``: the first one (page faults,
#: first dispatch); ``exec_cold``: one execution inside a cold load, beside the loaders (what
#: cold runs observe and refine).
PHASES = ("read_raw", "read_transformed", "transform", "pipeline_empty", "pipeline_filled", "exec", "exec_first",
          "exec_cold")
#: "extrapolated": the latency predictor's model of the kernel, trained on other ops than this one (a MatMul
#: priced by the Gemm classifiers' gemm_packed model): a time for schedules, not a ranking of kernels
SOURCES = ("profiled", "predicted", "extrapolated", "roofline")
#: the sources that may choose a layer's warm kernel over the engine's default
RANKING_SOURCES = ("profiled", "predicted")


@dataclass(frozen=True)
class Cost:
    seconds: float
    source: str  # one of SOURCES


@dataclass(frozen=True)
class DeviceRates:
    """Rates the roofline estimate uses; defaults are deliberately modest (a small ARM board), the
    profiler replaces them with measured ones."""

    flops: float = 20e9           # sustained FLOP/s of the whole executor (all its threads)
    mem_bw: float = 4e9           # bytes/s for memory-bound layers and weight transforms
    disk_bw: float = 200e6        # bytes/s reading a file that is not in the page cache
    crc_bw: float = 8e9           # bytes/s of the store's checksum
    per_read_s: float = 50e-6     # fixed cost of one read request
    per_step_s: float = 5e-6      # fixed cost of one layer (dispatch, Python)
    pipeline_empty_s: float = 5e-3   # one GPU pipeline from an empty cache
    pipeline_filled_s: float = 2e-4  # ... from a filled one
    #: a layer's execution inside a cold load over its profiled warm one, as observed cold runs found it (the median
    #: over a run's layers, averaged over runs; ``Profile.merged``); 0: no cold run observed
    cold_exec: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in self.__dataclass_fields__}

    @staticmethod
    def from_dict(d: Mapping[str, float]) -> "DeviceRates":
        known = DeviceRates.__dataclass_fields__
        return DeviceRates(**{k: float(v) for k, v in d.items() if k in known})


def kernel_transforms(k: Kernel) -> bool:
    """Whether ``k`` changes its weights' layout (else raw and transformed are the same bytes)."""
    return type(k).transform is not Kernel.transform


def raw_nbytes(layer: Layer) -> int:
    """Bytes a raw read of the layer's constants takes: float32 ones count half on a layer whose precision plan
    stores them fp16 (the Vulkan backend marks it with ``_wfp``, ``inferd.vulkan.kernel.WFP_ATTR``)."""
    half = bool(layer.attr("_wfp", 0))
    return int(sum(layer.inputs[i].nbytes // (2 if half and layer.inputs[i].dtype == np.float32 else 1)
                   for i in layer.const_inputs if layer.inputs[i] is not None))


def layer_flops(layer: Layer) -> float:
    """Multiply-adds x 2 for the layers that compute; output elements for the rest."""
    outs = layer.outputs
    out = outs[0] if outs else None
    n_out = float(math.prod(out.shape)) if out is not None and out.shape else 1.0
    op = layer.op  # (a property: read once, a whole-model prediction asks this per unit twice)
    ins = layer.inputs
    if op in ("Conv", "ConvTranspose", BLOCKED_CONV) and 1 in layer.const_inputs and ins[1] is not None:
        w = ins[1].shape
        per = float(math.prod(w[1:])) if len(w) > 1 else 1.0
        if op == "ConvTranspose":
            x = ins[0].shape if ins[0] is not None else (1,)
            return 2.0 * float(math.prod(x)) * float(math.prod(w[1:]))
        return 2.0 * n_out * per
    if op in ("Gemm", "MatMul") and len(ins) > 1 and ins[0] is not None and ins[1] is not None:
        a, b = ins[0].shape, ins[1].shape
        if len(a) < (1 if op == "MatMul" else 2):
            # an input shaped at run time (downstream of a data-dependent op) has a placeholder shape ():
            # the reduction length still follows from the weights
            a = (1, b[0] if len(b) == 2 and not layer.attr("transB", 0) else (b[-1] if b else 1))
        k = a[-1] if op == "MatMul" or not layer.attr("transA", 0) else a[0]
        return 2.0 * n_out * float(k if b else 1)
    if op == MATMUL_T and ins[0] is not None and ins[0].shape:
        a = layer.inputs[0].shape  # as stored: its last axis read is perm_a's last
        perm = layer.attr("perm_a") or range(len(a))
        return 2.0 * n_out * float(a[list(perm)[-1]])
    return n_out


_BODY_PHASES = ("transform", "pipeline_empty", "pipeline_filled", "exec", "exec_first", "exec_cold")


def body_units(layer: Layer, gpu: bool) -> list[list[tuple[Layer, Kernel]]]:
    """Per body of a control-flow layer, its layers with the kernel each would run by default ([] for any other
    layer, or one whose bodies are shaped at run time)."""
    from ..ops.base import choose_kernel

    bodies = getattr(layer.node, "bodies", None) if layer.op in CONTROL_OPS else None
    out: list[list[tuple[Layer, Kernel]]] = []
    for g in (bodies or {}).values():
        if getattr(g, "runtime_shaped", False):
            return []
        units = []
        for n in g.nodes:
            bl = Layer.of(n, g)
            try:
                units.append((bl, choose_kernel(bl, "vulkan" if gpu else "cpu")))
            except Exception:  # noqa: BLE001 - a layer no kernel takes here is priced as nothing
                continue
        out.append(units)
    return out


def body_trips(layer: Layer, constants: Mapping[str, Any] | None = None) -> float:
    """How many times a control-flow layer runs its body per run: an ``If`` one branch; a ``Scan`` the length of
    its first scanned input; a ``Loop`` its trip count where a constant gives it (else once: what it runs is
    data-dependent, and the planners price one pass)."""
    node = layer.node
    if layer.op == "Scan":
        ns, ms = scan_counts(node)
        x = layer.inputs[ns] if ms and ns < len(layer.inputs) else None
        if x is None or not x.shape:
            return 1.0
        axes = node.attrs.get("scan_input_axes") or [0]
        return float(max(1, x.shape[axis_index(int(axes[0]), len(x.shape))]))
    if layer.op == "Loop" and constants is not None and node.inputs and node.inputs[0] in constants:
        m = np.asarray(constants[node.inputs[0]]).reshape(-1)
        if m.size:
            return float(min(max(int(m[0]), 1), 1 << 20))
    return 1.0


def control_seconds(layer: Layer, phase: str, unit: Any, gpu: bool,
                    constants: Mapping[str, Any] | None = None) -> float | None:
    """Seconds of ``phase`` of a control-flow layer from its bodies' layers (``unit(layer, kernel, phase)``: their
    seconds): an execution runs the dearer ``If`` branch, or the body as many times as it loops; preparing it
    (transform, pipelines) prepares every body once. None for any other layer or phase: its own price stands (a
    vad's If had been priced as a copy of its output, 0.1 ms for a cold load of 10-25 ms)."""
    if phase not in _BODY_PHASES:
        return None
    parts = body_units(layer, gpu)
    if not parts:
        return None
    sums = [sum(float(unit(bl, k, phase)) for bl, k in units) for units in parts]
    if phase.startswith("exec"):
        return max(sums) if layer.op == "If" else sums[0] * body_trips(layer, constants)
    return sum(sums)


def io_nbytes(layer: Layer) -> int:
    n = sum(i.nbytes for k, i in enumerate(layer.inputs) if i is not None and k not in layer.const_inputs)
    return int(n + sum(o.nbytes for o in layer.outputs))


class CostModel(Protocol):
    """Seconds of ``phase`` for ``layer`` run by ``kernel``; never zero for work that exists."""

    def cost(self, layer: Layer, kernel: Kernel, phase: str) -> Cost: ...


@dataclass(frozen=True)
class RooflineCost:
    """FLOPs and bytes at the device's rates: the estimate every other source falls back to. ``exec_scale``:
    measured / roofline execution time by kernel name ("": any other kernel), from :func:`calibrated_roofline`."""

    rates: DeviceRates = field(default_factory=DeviceRates)
    gpu: bool = False
    exec_scale: Mapping[str, float] = field(default_factory=dict, compare=False, hash=False)

    def cost(self, layer: Layer, kernel: Kernel, phase: str) -> Cost:
        r = self.rates
        if layer.op in CONTROL_OPS:
            body = control_seconds(layer, phase, lambda bl, k, ph: self.cost(bl, k, ph).seconds, self.gpu)
            if body is not None:
                return Cost(float(body) + r.per_step_s, "roofline")
        if phase == "read_raw":
            n = raw_nbytes(layer)
            s = n / r.disk_bw + n / r.crc_bw + r.per_read_s * len(layer.const_inputs) if n else 0.0
        elif phase == "read_transformed":
            n = kernel.transformed_nbytes(layer)
            s = n / r.disk_bw + n / r.crc_bw + r.per_read_s * max(1, len(layer.const_inputs)) if n else 0.0
        elif phase == "transform":
            # a layout change reads the raw bytes and writes the transformed ones, several passes for Winograd
            n = raw_nbytes(layer) + kernel.transformed_nbytes(layer)
            passes = 4.0 if "winograd" in kernel.name else 1.0
            s = passes * n / r.mem_bw + r.per_step_s if kernel_transforms(kernel) and n else 0.0
        elif phase == "pipeline_empty":
            s = r.pipeline_empty_s if self.gpu else 0.0
        elif phase == "pipeline_filled":
            s = r.pipeline_filled_s if self.gpu else 0.0
        elif phase in ("exec", "exec_first", "exec_cold"):
            s = max(layer_flops(layer) / r.flops, (io_nbytes(layer) + kernel.workspace_nbytes(layer)) / r.mem_bw)
            s += r.per_step_s
            if self.exec_scale:
                s *= self.exec_scale.get(kernel.name, self.exec_scale.get("", 1.0))
            if phase != "exec":
                s *= 1.5  # first touch of outputs and workspaces
        else:
            raise KeyError(f"unknown cost phase {phase!r}; known: {PHASES}")
        return Cost(float(s), "roofline")


#: ``Profile.merged`` takes a cold run's factor from layers of at least this profiled warm time (a shorter one's
#: ratio is a timer's and a wake-up's), and only from a run that observed at least this many of them
COLD_FACTOR_MIN_S = 20e-6
COLD_FACTOR_MIN_LAYERS = 5


@dataclass(frozen=True)
class Profile:
    """Measured costs of one model on one device: ``(layer, kernel, phase) -> seconds``.

    Stored in the compiled package beside the plan with the device fingerprint it was measured on;
    a profile whose fingerprint is not this device's is stale and never used."""

    backend: str
    fingerprint: Mapping[str, str]
    rates: DeviceRates
    times: Mapping[tuple[str, str, str], float]

    def to_dict(self) -> dict[str, object]:
        return {"backend": self.backend, "fingerprint": dict(self.fingerprint), "rates": self.rates.to_dict(),
                "times": [[a, b, c, float(v)] for (a, b, c), v in sorted(self.times.items())]}

    @staticmethod
    def from_dict(d: Mapping[str, object]) -> "Profile":
        times = {(str(r[0]), str(r[1]), str(r[2])): float(r[3]) for r in d["times"]}  # type: ignore[union-attr]
        return Profile(str(d["backend"]), dict(d["fingerprint"]), DeviceRates.from_dict(d["rates"]),  # type: ignore[arg-type]
                       times)

    def merged(self, observed: Mapping[tuple[str, str, str], float], weight: float = 0.5) -> "Profile":
        """A profile refined by what a cold run observed (exponential average per entry), and the run's cold factor
        (``DeviceRates.cold_exec``: the median over its layers of the observed execution over the profiled warm
        one) averaged into the rates, where the run observed enough layers to say. The factor prices the kernels
        the run did not use (``ProfiledCost``): a run observes only the kernels its plan ran, and the others,
        priced at their warm times, looked faster than any observed one by what a cold load costs every layer
        (loaders beside it, caches cold) and a refinement chose them for it."""
        t = dict(self.times)
        for k, v in observed.items():
            t[k] = v if k not in t else (1 - weight) * t[k] + weight * v
        rates = self.rates
        ratios = [v / w for (n, k, phase), v in observed.items() if phase == "exec_cold" and v > 0
                  for w in (self.times.get((n, k, "exec"), 0.0),) if w >= COLD_FACTOR_MIN_S]
        if len(ratios) >= COLD_FACTOR_MIN_LAYERS:
            f = float(np.median(ratios))
            old = rates.cold_exec
            rates = replace(rates, cold_exec=f if old <= 0 else (1 - weight) * old + weight * f)
        return Profile(self.backend, self.fingerprint, rates, t)


def calibrated_roofline(profile: Profile, entries: Sequence[tuple[Any, ...]], gpu: bool = False) -> RooflineCost:
    """The roofline at ``profile``'s rates, its execution times scaled to what the profile measured: per kernel
    the median of measured / roofline over the layers ``entries`` ((layer, kernels, ...) per layer) measured with
    it, the median over every kernel for kernels measured nowhere. Why: a profile measures each layer's default
    kernel and the other candidates only while its time budget lasts, and the bare roofline prices the rest
    far from the measured ones beside them: on lavapipe (a dispatch costs ~0.1-1 ms however small the layer)
    squeezenet1_1's cold plan took unmeasured 1x1 kernels priced at 0.05-0.1 ms against measured ones at
    0.7-1.8 ms, and its first run took 2-3x the warm one."""
    base = RooflineCost(profile.rates, gpu=gpu)
    ratios: dict[str, list[float]] = {}
    for entry in entries:
        layer, kernels = entry[0], entry[1]
        for k in kernels:
            v = profile.times.get((layer.name, k.name, "exec"))
            if v is None or v <= 0:
                continue
            ratios.setdefault(k.name, []).append(float(v) / base.cost(layer, k, "exec").seconds)
    if not ratios:
        return base
    scale = {name: float(np.median(r)) for name, r in ratios.items()}
    scale[""] = float(np.median([x for r in ratios.values() for x in r]))
    return RooflineCost(profile.rates, gpu=gpu, exec_scale=scale)


@dataclass(frozen=True)
class ProfiledCost:
    """Measured costs where the profile has them; ``fallback`` (predictor or roofline) elsewhere.

    Read phases are derived from bytes at the measured disk rate unless measured directly, since a
    profile measured with a warm page cache would otherwise plan for a disk that never exists."""

    profile: Profile
    fallback: CostModel

    def cost(self, layer: Layer, kernel: Kernel, phase: str) -> Cost:
        times = self.profile.times
        v = times.get((layer.name, kernel.name, phase))
        if v is not None:
            return Cost(max(float(v), 1e-7), "profiled")
        if phase == "exec_cold" and self.profile.rates.cold_exec > 0:
            # a kernel no cold run used: its warm time as cold runs slowed the kernels they used
            w = times.get((layer.name, kernel.name, "exec"))
            if w is not None:
                return Cost(max(float(w) * self.profile.rates.cold_exec, 1e-7), "profiled")
        return self.fallback.cost(layer, kernel, phase)
