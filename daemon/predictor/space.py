"""The configurations the trainer samples: units taken from real (variant) models, and their neighbours.

A :class:`Unit` is one fused layer run by one kernel at one thread count, with the values of its small
constants (Clip bounds, axes) kept; weights are drawn at random when it is measured. :func:`perturb`
makes a neighbour as nn-Meter does: channels scaled by 0.4-1.2x, and here also the spatial size by
0.5-1.5x in each direction independently (inferd's kernels take non-square maps; nn-Meter's did not).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from ..ir import Graph, Node, TensorInfo
from ..ops.base import Kernel, Layer, op_spec, raw_key
from .features import signature

#: constants up to this size keep their values in a unit (they may set shapes or behaviour)
SMALL_CONST = 1 << 12

#: ops a neighbour can be made of by scaling channels and the map (their constants are per-channel or scalars)
_CHANNEL_OPS = {"Relu", "Clip", "Sigmoid", "LeakyRelu", "HardSigmoid", "HardSwish", "Tanh", "SiLU", "Gelu",
                "Add", "Mul", "Sub", "Div", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
                "BatchNormalization", "Concat"}


@dataclass(frozen=True)
class Unit:
    layer: Layer
    kernel: str
    threads: int
    small: tuple[tuple[int, np.ndarray], ...] = ()  # (input position, value) of the small constants
    origin: str = ""  # the model it came from, or "perturbed"

    @property
    def key(self) -> str:
        return f"{self.layer.op}/{self.kernel}"

    def signature(self) -> str:
        return f"{self.threads}|{self.kernel}|{signature(self.layer, _Named(self.kernel))}"

    def raw(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """The layer's constants: the small ones' kept values, random weights of the right shapes otherwise."""
        small = dict(self.small)
        out: dict[str, np.ndarray] = {}
        for i in self.layer.const_inputs:
            info = self.layer.inputs[i]
            if info is None:
                continue
            if i in small:
                out[raw_key(i)] = small[i]
            elif np.issubdtype(info.dtype, np.floating):
                out[raw_key(i)] = (rng.standard_normal(info.shape) * 0.1).astype(info.dtype)
            else:
                out[raw_key(i)] = np.zeros(info.shape, info.dtype)
        return out

    def inputs(self, rng: np.random.Generator) -> list[np.ndarray | None]:
        ins: list[np.ndarray | None] = []
        for k, info in enumerate(self.layer.inputs):
            if info is None or k in self.layer.const_inputs:
                ins.append(None)
            elif np.issubdtype(info.dtype, np.floating):
                ins.append(rng.standard_normal(info.shape).astype(info.dtype))
            else:
                ins.append(np.zeros(info.shape, info.dtype))
        return ins

    def graph(self, rng: np.random.Generator) -> Graph:
        """A graph of this one layer (its dynamic inputs the graph's inputs): what a Vulkan backend measures."""
        node = self.layer.node
        raw = self.raw(rng)
        consts = {node.inputs[i]: raw[raw_key(i)] for i in self.layer.const_inputs if raw_key(i) in raw}
        infos: dict[str, TensorInfo] = {}
        for name, info in zip(node.inputs, self.layer.inputs):
            if name and info is not None:
                infos[name] = TensorInfo(name, info.shape, info.dtype)
        for name, info in zip([o for o in node.outputs if o], self.layer.outputs):
            infos[name] = TensorInfo(name, info.shape, info.dtype)
        ins = [infos[n] for n in dict.fromkeys(n for n in node.inputs if n and n not in consts)]
        outs = [infos[o] for o in node.outputs if o]
        return Graph(f"unit:{node.name}", [node], ins, outs, consts, infos)


class _Named(Kernel):
    """A kernel stand-in that only carries a name (for signatures)."""

    def __init__(self, name: str) -> None:
        self.name = name  # type: ignore[misc]


def units_of(entries: Iterable[tuple[Layer, list[Kernel], Kernel]], constants: Mapping[str, Any], threads: int,
             origin: str, skip: Any = None) -> list[Unit]:
    """One unit per (layer, candidate kernel); ``skip(layer, kernel)`` drops the units that run nothing
    (aliases, folded nodes)."""
    out = []
    for layer, kernels, _default in entries:
        small = []
        for i in layer.const_inputs:
            info = layer.inputs[i]
            if info is not None and info.nbytes <= SMALL_CONST:
                v = constants.get(layer.node.inputs[i])
                if v is not None:
                    small.append((i, np.array(v)))
        for k in kernels:
            if skip is not None and skip(layer, k):
                continue
            out.append(Unit(layer, k.name, threads, tuple(small), origin))
    return out


def _scaled(v: int, f: float, lo: int = 1) -> int:
    return max(lo, int(round(v * f)))


def _infer(node: Node, infos: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list[TensorInfo]:
    spec = op_spec(node.op)
    if spec is None:
        raise KeyError(node.op)
    outs = spec.infer(node, infos, consts)
    return [TensorInfo(o, tuple(int(d) for d in s), np.dtype(dt)) for o, (s, dt) in zip([o for o in node.outputs if o],
                                                                                          outs)]


def _rebuild(unit: Unit, node: Node, shapes: list[tuple[int, ...] | None], residual: bool) -> Unit | None:
    """``unit`` with its inputs at ``shapes`` (the residual, if any, at the inferred output's shape)."""
    layer = unit.layer
    small = dict(unit.small)
    infos: list[TensorInfo | None] = []
    consts: dict[str, np.ndarray] = {}
    for i, (info, shp) in enumerate(zip(layer.inputs, shapes)):
        if info is None or shp is None:
            infos.append(None)
            continue
        infos.append(TensorInfo(info.name, tuple(int(d) for d in shp), info.dtype))
        if i in layer.const_inputs:
            v = small.get(i)
            consts[node.inputs[i]] = v if v is not None and tuple(v.shape) == tuple(shp) else np.zeros(shp, info.dtype)
    core = node
    if residual:
        attrs = {k: v for k, v in node.attrs.items() if k != "residual"}
        core = dataclasses.replace(node, inputs=list(node.inputs[:-1]), attrs=attrs)
    outs = _infer(core, infos[:len(core.inputs)], consts)
    if residual:
        infos[-1] = TensorInfo(layer.inputs[-1].name, outs[0].shape, outs[0].dtype)  # type: ignore[union-attr]
        outs = _infer(node, infos, consts)
    if any(d <= 0 for o in outs for d in o.shape):
        return None
    new_small = tuple((i, v) for i, v in unit.small if tuple(v.shape) == tuple(infos[i].shape))  # type: ignore[union-attr]
    return Unit(Layer(node, tuple(infos), tuple(outs), layer.const_inputs), unit.kernel, unit.threads, new_small,
                "perturbed")


def perturb(unit: Unit, rng: np.random.Generator) -> Unit | None:
    """A neighbour of ``unit`` (None when its op has no neighbours this way, or the draw makes no valid
    layer, or its kernel does not apply to it)."""
    from ..ops.base import kernels_for

    layer = unit.layer
    fc_in, fc_out = rng.uniform(0.4, 1.2), rng.uniform(0.4, 1.2)
    fh, fw = rng.uniform(0.5, 1.5), rng.uniform(0.5, 1.5)
    try:
        new = _perturb(unit, fc_in, fc_out, fh, fw)
    except Exception:
        return None
    if new is None:
        return None
    ks = [k for k in kernels_for(layer.op, _backend_of(unit)) if k.name == unit.kernel]
    if not ks:
        return None
    try:
        if not ks[0].applies(new.layer):
            return None
    except Exception:
        return None
    return new


def _backend_of(unit: Unit) -> str:
    return "vulkan" if unit.kernel.startswith("vk_") else "cpu"


def _perturb(unit: Unit, fc_in: float, fc_out: float, fh: float, fw: float) -> Unit | None:
    layer = unit.layer
    node = layer.node
    op = layer.op
    ins = layer.inputs
    residual = bool(node.attrs.get("residual"))
    if op == "Conv" and len(ins) > 1 and ins[0] is not None and ins[1] is not None and len(ins[0].shape) == 4:
        n, c, h, w = ins[0].shape
        co, cig, kh, kw = ins[1].shape
        g = int(layer.attr("group", 1) or 1)
        if g == 1:
            c2, co2, g2 = _scaled(c, fc_in), _scaled(co, fc_out), 1
        elif g == c:
            c2 = _scaled(c, fc_in, 2)
            co2, g2 = c2 * (co // c), c2
        else:
            cg2 = _scaled(c // g, fc_in)
            c2, co2, g2 = cg2 * g, _scaled(co // g, fc_out) * g, g
        h2, w2 = _scaled(h, fh, kh), _scaled(w, fw, kw)
        node2 = dataclasses.replace(node, attrs={**node.attrs, "group": g2})
        shapes: list[tuple[int, ...] | None] = [(n, c2, h2, w2), (co2, c2 // g2, kh, kw)]
        for i in range(2, len(ins)):
            info = ins[i]
            if info is None:
                shapes.append(None)
            elif residual and i == len(ins) - 1:
                shapes.append(info.shape)  # replaced by the output's shape
            elif info.shape == (co,):
                shapes.append((co2,))
            else:
                return None
        return _rebuild(unit, node2, shapes, residual)
    if op in ("Gemm", "MatMul") and len(ins) > 1 and 1 in layer.const_inputs and ins[0] is not None \
            and len(ins[0].shape) >= 2 and len(ins[1].shape) == 2:
        a, b = ins[0].shape, ins[1].shape
        if op == "Gemm" and layer.attr("transA", 0):
            return None
        k2 = _scaled(a[-1], fc_in)
        trans_b = op == "Gemm" and bool(layer.attr("transB", 0))
        m = b[0] if trans_b else b[1]
        m2 = _scaled(m, fc_out)
        shapes = [tuple(a[:-1]) + (k2,), (m2, k2) if trans_b else (k2, m2)]
        for i in range(2, len(ins)):
            info = ins[i]
            if info is None:
                shapes.append(None)
            elif residual and i == len(ins) - 1:
                shapes.append(info.shape)
            elif info.shape in ((m,), (1, m)):
                shapes.append(info.shape[:-1] + (m2,))
            else:
                return None
        return _rebuild(unit, node, shapes, residual)
    if op in _CHANNEL_OPS:
        x = ins[0]
        if x is None or len(x.shape) not in (2, 4):
            return None
        cmap: dict[int, int] = {}
        smap: dict[tuple[int, int], int] = {}

        def ch(v: int) -> int:
            if v == 1:
                return 1
            return cmap.setdefault(v, _scaled(v, fc_in, 2))

        def sp(axis: int, v: int) -> int:
            if v == 1:
                return 1
            return smap.setdefault((axis, v), _scaled(v, fh if axis == 2 else fw, 2))

        shapes = []
        for i, info in enumerate(ins):
            if info is None:
                shapes.append(None)
                continue
            s = info.shape
            if i in layer.const_inputs and len(s) <= 1:
                shapes.append(tuple(ch(d) for d in s))
            elif len(s) == 4:
                shapes.append((s[0], ch(s[1]), sp(2, s[2]), sp(3, s[3])))
            elif len(s) == 2:
                shapes.append((s[0], ch(s[1])))
            elif len(s) == 0:
                shapes.append(s)
            else:
                return None
        return _rebuild(unit, node, shapes, residual)
    return None
