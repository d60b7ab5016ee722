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
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from ..ops.base import Kernel, Layer, op_spec
from ..planner.cost import (CONTROL_OPS, Cost, DeviceRates, RooflineCost, control_seconds, kernel_transforms,
                            raw_nbytes)
from .features import FEATURES, feature_matrix, kernel_key, unit_identity, unit_key, unit_row, vulkan_dispatches
from .model import Predictor, log_features

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
    #: the machine's speed now against the predictor's training (``probe.SpeedProbe``): warm times (the exec
    #: phases of trained unit models) are multiplied by it; 1.0 predicts at the training's level
    speed: float = 1.0
    #: the disk now against the training's read table, per size (``probe.read_factors``); {}: as trained
    read_factors: Mapping[int, float] = field(default_factory=dict)
    _rows: dict[Hashable, list[float]] = field(default_factory=dict, repr=False)
    _fallback: RooflineCost | None = field(default=None, repr=False)
    _memo: dict[tuple[Hashable, str], Cost] = field(default_factory=dict, repr=False)
    _caps_obj: Any = field(default=None, repr=False)
    _sigs: dict[int, tuple[Layer, Kernel, Hashable]] = field(default_factory=dict, repr=False)

    @property
    def gpu(self) -> bool:
        return self.predictor.device != "cpu"

    @property
    def fallback(self) -> RooflineCost:
        if self._fallback is None:  # once: a unit without a model asks for it per phase
            r = self.rates
            if r is None:
                r = DeviceRates.from_dict(self.predictor.rates) if self.predictor.rates else DeviceRates()
            self._fallback = RooflineCost(r, gpu=self.gpu)
        return self._fallback

    def _identity(self, layer: Layer, kernel: Kernel) -> Hashable:
        """``unit_identity`` per layer object (held here, so its id is not reused): a planner asks a layer's
        features and then its costs per phase."""
        hit = self._sigs.get(id(layer))
        if hit is not None and hit[0] is layer and hit[1] is kernel:
            return hit[2]
        sig = unit_identity(layer, kernel)
        if len(self._sigs) >= 4096:  # one model's layers, a few times over: bounded for a long-lived cost model
            self._sigs.clear()
        self._sigs[id(layer)] = (layer, kernel, sig)
        return sig

    def row(self, layer: Layer, kernel: Kernel) -> list[float]:
        """The unit's features as a list, per shape signature (a whole model's rows become one array)."""
        sig = self._identity(layer, kernel)
        r = self._rows.get(sig)
        if r is None:
            ds = None
            if self.gpu:
                ds = vulkan_dispatches(layer, kernel, self._vk_caps(), self.constants, sig)
            r = self._rows[sig] = unit_row(layer, kernel, self.threads, ds)
        return r

    def features(self, layer: Layer, kernel: Kernel) -> np.ndarray:
        return np.array(self.row(layer, kernel), dtype=np.float64)

    def _vk_caps(self) -> Any:
        if self._caps_obj is None:
            self._caps_obj = _caps(self.predictor.caps)
        return self._caps_obj

    def model_for(self, layer: Layer, kernel: Kernel, phase: str) -> tuple[Any, str]:
        """The unit model for ``phase`` and the source its predictions carry: "predicted" from the model of this
        op and kernel, "extrapolated" from the kernel's model over the other ops it ran in training."""
        p = self.predictor
        m = p.get(unit_key(layer, kernel), phase)
        if m is not None:
            return m, "predicted"
        return p.get(kernel_key(kernel), phase), "extrapolated"

    def cost(self, layer: Layer, kernel: Kernel, phase: str) -> Cost:
        key = (self._identity(layer, kernel), phase)
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
            return Cost(p.read_seconds(n, self.read_factors), "predicted")
        if phase == "transform" and not (kernel_transforms(kernel) and layer.const_inputs):
            return Cost(0.0, "predicted")  # no work exists
        if phase in ("pipeline_empty", "pipeline_filled") and not self.gpu:
            return Cost(0.0, "predicted")
        if runs_nothing(layer, kernel, self.gpu):
            return Cost(NOTHING_S if phase in EXEC_PHASES else 0.0, "predicted")
        if layer.op in CONTROL_OPS:  # its bodies' layers, each from its own unit model
            body = control_seconds(layer, phase, lambda bl, k, ph: self.cost(bl, k, ph).seconds, self.gpu,
                                   self.constants)
            if body is not None:
                return Cost(max(body, NOTHING_S), "predicted")
        m, source = self.model_for(layer, kernel, "exec_first" if phase == "exec_cold" else phase)
        if m is None and phase == "exec_cold":
            m, source = self.model_for(layer, kernel, "exec")
        if m is None:
            return self.fallback.cost(layer, kernel, phase)
        v = float(m.predict(self.features(layer, kernel)[None, :])[0])
        if phase in EXEC_PHASES:
            v *= self.speed
        return Cost(max(v, NOTHING_S), source)


@dataclass
class LayerPrediction:
    name: str
    op: str
    kernel: str
    source: str
    phases: dict[str, float]


def predict_arrays(layers: Sequence[tuple[Layer, Kernel]], cost: PredictedCost, phases: Sequence[str] = ("exec",)
                   ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Seconds of every phase of every (layer, kernel), as one array per phase, and which units fell back to
    the roofline. One vectorised call per unit model and phase; the features of all units built once (CPU: one
    array from Python lists: no numpy call or result object per layer). Units with one signature are one unit:
    a model's repeated blocks are predicted once (a ViT variant's 199 units are 19), then spread back."""
    if len(layers) > 1:
        ident = cost._identity
        index: dict[Hashable, int] = {}
        uniq: list[tuple[Layer, Kernel]] = []
        inv = []
        for unit in layers:
            key = ident(*unit)
            j = index.get(key)
            if j is None:
                j = index[key] = len(uniq)
                uniq.append(unit)
            inv.append(j)
        if len(uniq) < len(layers):
            vals, roof = _predict_units(uniq, cost, phases)
            at = np.asarray(inv, dtype=np.intp)
            return {ph: v[at] for ph, v in vals.items()}, roof[at]
    return _predict_units(layers, cost, phases)


def _predict_units(layers: Sequence[tuple[Layer, Kernel]], cost: PredictedCost, phases: Sequence[str]
                   ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    p = cost.predictor
    n = len(layers)
    L: np.ndarray | None = None
    nothing = [runs_nothing(layer, k, cost.gpu) for layer, k in layers]
    if not cost.gpu:
        F = feature_matrix(layers, cost.threads)
    else:  # with each unit's dispatches (per shape signature, cached in the cost model); none for no-ops
        none = [-1.0] * len(FEATURES)
        F = np.array([cost.row(layer, k) if not nothing[i] else none for i, (layer, k) in enumerate(layers)],
                     dtype=np.float64) if layers else np.zeros((0, len(FEATURES)))
    keys = [(unit_key(layer, k), kernel_key(k)) for layer, k in layers]
    roof = np.zeros(n, dtype=bool)
    out: dict[str, np.ndarray] = {}
    for phase in phases:
        vals = np.zeros(n)
        scale = cost.speed if phase in EXEC_PHASES else 1.0
        groups: dict[int, tuple[Any, list[int]]] = {}
        mphase = "exec_first" if phase == "exec_cold" else phase
        for i, (layer, k) in enumerate(layers):
            simple = phase in ("read_raw", "read_transformed") or nothing[i] or \
                (phase == "transform" and not (kernel_transforms(k) and layer.const_inputs)) or \
                (phase.startswith("pipeline") and not cost.gpu)
            m = None
            if not simple:
                m = p.models.get((keys[i][0], mphase)) or p.models.get((keys[i][1], mphase))
                if m is None and phase == "exec_cold":
                    m = p.models.get((keys[i][0], "exec")) or p.models.get((keys[i][1], "exec"))
            if m is None:
                # no unit model of this op or kernel: the roofline, straight (``cost.cost`` would look the models
                # up again to get there); the phases with no work and control flow through ``cost.cost``
                c = cost.fallback.cost(layer, k, phase) if not simple and layer.op not in CONTROL_OPS \
                    else cost.cost(layer, k, phase)
                vals[i] = c.seconds
                if c.source == "roofline" and phase in EXEC_PHASES:
                    roof[i] = True
                continue
            groups.setdefault(id(m), (m, []))[1].append(i)
        bank = p.bank(mphase) if groups else None
        if bank is not None and all(id(m) in bank.index for m, _ in groups.values()):
            # every unit model of the phase at once (one numpy pass, not one per model)
            rows = [i for _m, idx in groups.values() for i in idx]
            mi = np.array([bank.index[id(m)] for m, idx in groups.values() for _ in idx], dtype=np.intp)
            if L is None:
                L = log_features(F)
            vals[rows] = np.maximum(bank.predict(F[rows], L[rows], mi) * scale, NOTHING_S)
            groups = {}
        for m, idx in groups.values():
            if L is None:
                L = log_features(F)  # once for every model and phase
            vals[idx] = np.maximum(m.predict(F[idx], L[idx]) * scale, NOTHING_S)
        out[phase] = vals
    return out, roof


def predict_layers(layers: Sequence[tuple[Layer, Kernel]], cost: PredictedCost,
                   phases: Sequence[str] = ("exec",)) -> list[LayerPrediction]:
    """Every phase of every (layer, kernel), one :class:`LayerPrediction` per layer (for reports)."""
    vals, roof = predict_arrays(layers, cost, phases)
    cols = {ph: v.tolist() for ph, v in vals.items()}

    def source(i: int, layer: Layer, k: Kernel) -> str:  # the warm time's, as PredictedCost.cost flags it
        if roof[i]:
            return "roofline"
        return "predicted" if runs_nothing(layer, k, cost.gpu) else cost.model_for(layer, k, "exec")[1]

    return [LayerPrediction(layer.name, layer.op, k.name, source(i, layer, k),
                            {ph: cols[ph][i] for ph in phases}) for i, (layer, k) in enumerate(layers)]


def whole_model_warm_s(pred: Predictor, unit_sum_s: float, steps: int) -> float:
    """Warm latency of a model from its units' summed warm seconds through the fitted overhead model."""
    o = pred.overhead
    s = float(unit_sum_s)
    return max(o.get("scale", 1.0) * s + o.get("per_step_s", 0.0) * steps + o.get("per_run_s", 0.0), s * 0.5)


def predict_warm(layers: Sequence[tuple[Layer, Kernel]], cost: PredictedCost) -> float:
    """A whole model's warm latency (what the planners and the bench ask for most): no per-layer objects."""
    vals, _ = predict_arrays(layers, cost, ("exec",))
    return whole_model_warm_s(cost.predictor, float(vals["exec"].sum()), len(layers))


def whole_model_warm(pred: Predictor, layers: Sequence[LayerPrediction], steps: int) -> float:
    """Warm latency of a model: its units' sum through the fitted overhead model."""
    return whole_model_warm_s(pred, sum(lp.phases.get("exec", 0.0) for lp in layers), steps)
