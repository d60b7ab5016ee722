"""The predictor behind the planners' :class:`~inferd.planner.cost.CostModel`: ``PredictedCost``.

``cost(layer, kernel, phase)`` answers from the unit model of (op, kernel), else the kernel's coarser
model, else the roofline at the measured rates: flagged ``roofline``, never zero. Reads come from the
device's measured read model (per read + bytes / bandwidth, checksum included). Pure: no I/O, no timing
(features of a unit are cached per shape signature).

:func:`predict_model` predicts a whole model at once (vectorised per unit model): warm = scale * sum of
the units' warm times + per-step and per-run overhead, as fitted on measured models at training.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..ops.base import Kernel, Layer, op_spec
from ..planner.cost import Cost, DeviceRates, RooflineCost, kernel_transforms, raw_nbytes
from .features import features, kernel_key, signature, unit_key, vulkan_dispatches
from .model import Predictor

#: what a unit that runs nothing costs (an alias view, a node folded at load): not zero, never more
NOTHING_S = 1e-7
EXEC_PHASES = ("exec", "exec_first", "exec_cold")


def runs_nothing(layer: Layer, kernel: Kernel, gpu: bool) -> bool:
    """A node the executor never runs: the placeholders of folded and alias nodes (Vulkan), and on the
    CPU an alias op whose output is a view of a dynamic input."""
    if kernel.name in ("fold", "alias"):
        return True
    if gpu:
        return False
    spec = op_spec(layer.op)
    return bool(spec is not None and spec.alias and 0 not in layer.const_inputs
                and len([o for o in layer.node.outputs if o]) == 1)


def _caps(d: Mapping[str, Any]) -> Any:
    from ..vulkan.kernel import Caps

    if not d:
        return Caps()
    return Caps(int(d.get("subgroup_size", 32)), int(d.get("max_shared_bytes", 16384)),
                int(d.get("max_workgroup_invocations", 128)),
                tuple(int(x) for x in d.get("max_workgroup_count", (65535, 65535, 65535))),  # type: ignore[arg-type]
                int(d.get("vendor_id", 0)), str(d.get("device_type", "discrete")))


@dataclass
class PredictedCost:
    """Costs from a trained predictor (``source="predicted"``); the roofline where it has no model."""

    predictor: Predictor
    threads: int = 1
    #: a graph's constants: small ones (axes, pads) make the dispatches of Vulkan units exact
    constants: Mapping[str, Any] | None = None
    rates: DeviceRates | None = None
    _feat: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    _memo: dict[tuple[str, str], Cost] = field(default_factory=dict, repr=False)

    @property
    def gpu(self) -> bool:
        return self.predictor.device != "cpu"

    @property
    def fallback(self) -> RooflineCost:
        r = self.rates
        if r is None:
            r = DeviceRates.from_dict(self.predictor.rates) if self.predictor.rates else DeviceRates()
        return RooflineCost(r, gpu=self.gpu)

    def features(self, layer: Layer, kernel: Kernel) -> np.ndarray:
        sig = signature(layer, kernel)
        f = self._feat.get(sig)
        if f is None:
            ds = None
            if self.gpu:
                ds = vulkan_dispatches(layer, kernel, _caps(self.predictor.caps), self.constants)
            f = features(layer, kernel, self.threads, ds)
            self._feat[sig] = f
        return f

    def model_for(self, layer: Layer, kernel: Kernel, phase: str) -> Any:
        p = self.predictor
        return p.get(unit_key(layer, kernel), phase) or p.get(kernel_key(kernel), phase)

    def cost(self, layer: Layer, kernel: Kernel, phase: str) -> Cost:
        key = (signature(layer, kernel), phase)
        c = self._memo.get(key)
        if c is None:
            c = self._cost(layer, kernel, phase)
            self._memo[key] = c
        return c

    def _cost(self, layer: Layer, kernel: Kernel, phase: str) -> Cost:
        p = self.predictor
        if phase in ("read_raw", "read_transformed"):
            n = raw_nbytes(layer) if phase == "read_raw" else (kernel.transformed_nbytes(layer) if layer.const_inputs
                                                               else 0)
            if not n:
                return Cost(0.0, "predicted")
            return Cost(p.reads["per_read_s"] + n / p.reads["disk_bw"], "predicted")
        if phase == "transform" and not (kernel_transforms(kernel) and layer.const_inputs):
            return Cost(0.0, "predicted")  # no work exists
        if phase in ("pipeline_empty", "pipeline_filled") and not self.gpu:
            return Cost(0.0, "predicted")
        if runs_nothing(layer, kernel, self.gpu):
            return Cost(NOTHING_S if phase in EXEC_PHASES else 0.0, "predicted")
        m = self.model_for(layer, kernel, "exec_first" if phase == "exec_cold" else phase)
        if m is None and phase == "exec_cold":
            m = self.model_for(layer, kernel, "exec")
        if m is None:
            return self.fallback.cost(layer, kernel, phase)
        return Cost(max(float(m.predict(self.features(layer, kernel)[None, :])[0]), NOTHING_S), "predicted")


@dataclass
class LayerPrediction:
    name: str
    op: str
    kernel: str
    source: str
    phases: dict[str, float]


def predict_layers(layers: Sequence[tuple[Layer, Kernel]], cost: PredictedCost,
                   phases: Sequence[str] = ("exec",)) -> list[LayerPrediction]:
    """Every phase of every (layer, kernel), one vectorised call per unit model and phase."""
    p = cost.predictor
    out = [LayerPrediction(layer.name, layer.op, k.name, "predicted", {}) for layer, k in layers]
    for phase in phases:
        groups: dict[int, tuple[Any, list[int]]] = {}
        for i, (layer, k) in enumerate(layers):
            simple = phase in ("read_raw", "read_transformed") or runs_nothing(layer, k, cost.gpu) or \
                (phase == "transform" and not (kernel_transforms(k) and layer.const_inputs)) or \
                (phase.startswith("pipeline") and not cost.gpu)
            m = None if simple else cost.model_for(layer, k, "exec_first" if phase == "exec_cold" else phase)
            if m is None and phase == "exec_cold" and not simple:
                m = cost.model_for(layer, k, "exec")
            if m is None:
                c = cost.cost(layer, k, phase)
                out[i].phases[phase] = c.seconds
                if c.source == "roofline" and phase in EXEC_PHASES:
                    out[i].source = "roofline"
                continue
            groups.setdefault(id(m), (m, []))[1].append(i)
        for m, idx in groups.values():
            X = np.stack([cost.features(*layers[i]) for i in idx])
            ys = np.maximum(m.predict(X), NOTHING_S)
            for i, y in zip(idx, ys):
                out[i].phases[phase] = float(y)
    return out


def whole_model_warm(pred: Predictor, layers: Sequence[LayerPrediction], steps: int) -> float:
    """Warm latency of a model: its units' sum through the fitted overhead model."""
    o = pred.overhead
    s = sum(lp.phases.get("exec", 0.0) for lp in layers)
    return max(o.get("scale", 1.0) * s + o.get("per_step_s", 0.0) * steps + o.get("per_run_s", 0.0), s * 0.5)
