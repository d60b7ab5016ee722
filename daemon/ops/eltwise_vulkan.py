"""Vulkan kernels for element-wise ops: activations, unary math, broadcasting binary ops, n-ary Sum/Mean/Min/Max.

Shaders: ``unary.comp`` (op selected by the UOP define, activation by ACT) and ``binary.comp``
(BOP define; numpy broadcasting through per-input strides over at most 6 collapsed dims; optional
fused residual). Fused activations (attrs["act"]) and the residual (attrs["residual"]) of Add/Sub/
Mul/Div are honoured.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..vulkan.kernel import (ACT_IDS, Caps, Dispatch, In, Out, Param, VulkanKernel, act_of, act_supported,
                             broadcast_strides, collapse, contiguous_strides, grid)
from .activation import act_from_node
from .base import MS, Layer, register_kernel

#: Unary op -> UOP id in unary.comp (0 = identity: standalone activations use ACT instead).
UOPS = {"Erf": 1, "Sqrt": 2, "Exp": 3, "Log": 4, "Neg": 5, "Abs": 6, "Reciprocal": 7, "Floor": 8, "Ceil": 9,
        "Sin": 10, "Cos": 11, "Sign": 12, "Round": 13, "Elu": 14, "Selu": 15, "Mish": 16, "Softsign": 17,
        "ThresholdedRelu": 18, "Tan": 19, "Atan": 20, "Celu": 21, "Sinh": 22, "Cosh": 23, "Asin": 24, "Acos": 25}
ACT_OPS = ("Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Gelu", "Softplus", "SiLU")
#: Binary op -> BOP id in binary.comp.
BOPS = {"Add": 0, "Sub": 1, "Mul": 2, "Div": 3, "Pow": 4, "Min": 5, "Max": 6, "PRelu": 7}
NARY = {"Sum": 0, "Mean": 0, "Min": 5, "Max": 6}
MAX_RANK = 6
LOCAL = 256


def _unary_params(layer: Layer) -> tuple[float, float]:
    op = layer.op
    if op == "Elu":
        return float(layer.attr("alpha", 1.0)), 0.0
    if op == "Selu":
        return float(layer.attr("alpha", 1.67326319217681884765625)), float(layer.attr("gamma", 1.05070102214813232421875))
    if op == "ThresholdedRelu":
        return float(layer.attr("alpha", 1.0)), 0.0
    if op == "Celu":
        return float(layer.attr("alpha", 1.0)), 0.0
    return 0.0, 0.0


def unary_dispatch(layer: Layer, x_ref, y_ref, n: int, caps: Caps, uop: int = 0, act: tuple[int, float, float] = (0, 0.0, 0.0),
                   alpha: float = 0.0, beta: float = 0.0) -> Dispatch:
    return Dispatch("unary", (x_ref, y_ref), grid(n, LOCAL, caps), defines={"UOP": uop, "ACT": act[0]},
                    push={"n": n, "alpha": alpha, "beta": beta, "act_a": act[1], "act_b": act[2]})


@register_kernel
class VkUnary(VulkanKernel):
    name = "vk_unary"
    ops = ACT_OPS + tuple(UOPS)

    def applies(self, layer: Layer) -> bool:
        if layer.op == "Clip" and len(layer.node.inputs) > 1:
            # min/max given as inputs must be constants (they become push constants)
            return all(k in layer.const_inputs for k in range(1, len(layer.node.inputs)) if layer.has_input(k))
        return layer.op != "Gelu" or act_from_node(layer.node) is not None

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if layer.op == "Clip" and raw:
            lo = raw.get("in1")
            hi = raw.get("in2")
            return {"clip": np.array([-np.inf if lo is None else float(lo), np.inf if hi is None else float(hi)], np.float32)}
        return {}

    def transformed_nbytes(self, layer: Layer) -> int:
        return 8 if layer.op == "Clip" and layer.const_inputs else 0

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        n = layer.outputs[0].size
        if layer.op in ACT_OPS:
            node = layer.node
            a = act_from_node(node)
            if layer.op == "Clip" and "clip" in params:
                a = ("Clip", (float(params["clip"][0]), float(params["clip"][1])))
            tmp = Layer(node.__class__(node.name, node.op, node.inputs, node.outputs, {"act": a}), layer.inputs,
                        layer.outputs, layer.const_inputs)
            return [unary_dispatch(layer, In(0), Out(0), n, caps, 0, act_of(tmp))]
        alpha, beta = _unary_params(layer)
        return [unary_dispatch(layer, In(0), Out(0), n, caps, UOPS[layer.op], act_of(layer), alpha, beta)]


def binary_dispatch(a_shape, b_shape, out_shape, a_ref, b_ref, y_ref, caps: Caps, bop: int,
                    act: tuple[int, float, float] = (0, 0.0, 0.0), r_ref=None) -> Dispatch:
    sa = broadcast_strides(a_shape, out_shape)
    sb = broadcast_strides(b_shape, out_shape)
    dims, (sa, sb, _) = collapse(out_shape, sa, sb, contiguous_strides(out_shape))
    assert len(dims) <= MAX_RANK
    n = int(np.prod(out_shape, dtype=np.int64)) if len(out_shape) else 1
    binds = (a_ref, b_ref) + ((r_ref,) if r_ref is not None else ()) + (y_ref,)
    return Dispatch("binary", binds, grid(n, LOCAL, caps),
                    defines={"BOP": bop, "ACT": act[0], "RESIDUAL": int(r_ref is not None)},
                    push={"n": n, "rank": len(dims), "dims": dims, "sa": sa, "sb": sb, "act_a": act[1], "act_b": act[2]})


def _rank_ok(shapes, out_shape) -> bool:
    sts = [broadcast_strides(s, out_shape) for s in shapes]
    dims, _ = collapse(out_shape, *sts, contiguous_strides(out_shape))
    return len(dims) <= MAX_RANK


@register_kernel
class VkBinary(VulkanKernel):
    """Broadcasting binary ops, Mod of float tensors included (binary.comp's BOP 8: fmod's sign of the dividend,
    9: the divisor's; integer Mod has no Vulkan kernel, so the node runs on the CPU)."""

    name = "vk_binary"
    ops = tuple(BOPS) + ("Mod",)

    def applies(self, layer: Layer) -> bool:
        if layer.op in ("Min", "Max") and len(layer.node.inputs) != 2:
            return False
        if not act_supported(layer):
            return False
        out = layer.out_shape()
        if layer.attr("residual"):
            if len(layer.node.inputs) != 3 or layer.in_shape(2) != out:
                return False
        return _rank_ok([layer.in_shape(0), layer.in_shape(1)], out)

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        r = In(2) if layer.attr("residual") else None
        bop = (8 if int(layer.attr("fmod", 0)) else 9) if layer.op == "Mod" else BOPS[layer.op]
        return [binary_dispatch(layer.in_shape(0), layer.in_shape(1), layer.out_shape(), In(0), In(1), Out(0), caps,
                                bop, act_of(layer), r)]


@register_kernel
class VkNary(VulkanKernel):
    """Sum/Mean/Min/Max over n inputs: a chain of binary dispatches accumulating in the output."""

    name = "vk_nary"
    ops = tuple(NARY)
    priority = 110  # the 2-input Min/Max binary kernel is preferred where it applies

    def applies(self, layer: Layer) -> bool:
        ins = [layer.in_shape(k) for k in range(len(layer.node.inputs)) if layer.has_input(k)]
        return len(ins) >= 1 and _rank_ok(ins, layer.out_shape())

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        out = layer.out_shape()
        ks = [k for k in range(len(layer.node.inputs)) if layer.has_input(k)]
        n = layer.outputs[0].size
        bop = NARY[layer.op]
        if len(ks) == 1:
            d = [unary_dispatch(layer, In(ks[0]), Out(0), n, caps) if layer.in_shape(ks[0]) == out else
                 binary_dispatch(layer.in_shape(ks[0]), layer.in_shape(ks[0]), out, In(ks[0]), In(ks[0]), Out(0), caps, 5)]
        else:
            d = [binary_dispatch(layer.in_shape(ks[0]), layer.in_shape(ks[1]), out, In(ks[0]), In(ks[1]), Out(0), caps, bop)]
            for k in ks[2:]:
                # out = out (op) in_k, element-wise in place (each invocation reads then writes its own element)
                d.append(binary_dispatch(out, layer.in_shape(k), out, Out(0), In(k), Out(0), caps, bop))
        if layer.op == "Mean" and len(ks) > 1:
            d.append(unary_dispatch(layer, Out(0), Out(0), n, caps, 26, alpha=1.0 / len(ks)))
        return d


CMPS = {"Equal": 0, "Less": 1, "Greater": 2, "LessOrEqual": 3, "GreaterOrEqual": 4}
#: logical ops of bool tensors -> CMP id in compare.comp (its byte-wise bool variant)
LOGIC = {"And": 5, "Or": 6, "Xor": 7, "Not": 8}


def _floats(layer: Layer, ks: tuple[int, ...]) -> bool:
    return all(layer.inputs[k] is not None and np.dtype(layer.inputs[k].dtype) == np.float32 for k in ks)  # type: ignore[union-attr]


@register_kernel
class VkCompare(VulkanKernel):
    """Comparisons of float tensors to a bool tensor (``compare.comp``, four outputs per invocation)."""

    name = "vk_compare"
    ops = tuple(CMPS)
    io_dtypes = ("float32", "bool")

    def applies(self, layer: Layer) -> bool:
        return _floats(layer, (0, 1)) and _rank_ok([layer.in_shape(0), layer.in_shape(1)], layer.out_shape())

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        return [compare_dispatch(layer, CMPS[layer.op], caps)]


def compare_dispatch(layer: Layer, cmp: int, caps: Caps) -> Dispatch:
    """compare.comp over the layer's inputs 0 and 1 (input 0 twice for a unary op) into its bool output."""
    b = 1 if len(layer.node.inputs) > 1 else 0
    out = layer.out_shape()
    sa = broadcast_strides(layer.in_shape(0), out)
    sb = broadcast_strides(layer.in_shape(b), out)
    dims, (sa, sb, _) = collapse(out, sa, sb, contiguous_strides(out))
    n = layer.outputs[0].size
    return Dispatch("compare", (In(0), In(b), Out(0)), grid(-(-n // 4), LOCAL, caps), {"CMP": cmp},
                    push={"n": n, "rank": len(dims), "dims": dims, "sa": sa, "sb": sb})


def _bools(layer: Layer) -> bool:
    return all(t is not None and np.dtype(t.dtype) == np.bool_ for t in (*layer.inputs, *layer.outputs))


@register_kernel
class VkLogic(VulkanKernel):
    """And / Or / Xor / Not of bool tensors with broadcasting (compare.comp's byte-wise variant: four outputs per
    invocation, so no two invocations write one word)."""

    name = "vk_logic"
    ops = tuple(LOGIC)
    io_dtypes = ("bool",)

    def applies(self, layer: Layer) -> bool:
        ins = [layer.in_shape(k) for k in range(len(layer.node.inputs))]
        return _bools(layer) and _rank_ok(ins, layer.out_shape())

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: np.ascontiguousarray(v, np.bool_).view(np.uint8) for k, v in raw.items()}

    def transformed_nbytes(self, layer: Layer) -> int:
        return sum(layer.inputs[k].size for k in layer.const_inputs)  # type: ignore[union-attr]

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        return [compare_dispatch(layer, LOGIC[layer.op], caps)]


#: onnxruntime's fused GELUs -> (fused activation of binary/unary.comp, its parameter's attribute and default)
GELUS = {MS + "BiasGelu": ("Gelu", None, 0.0), MS + "FastGelu": ("GeluTanh", None, 0.0),
         MS + "QuickGelu": ("QuickGelu", "alpha", 1.702)}


@register_kernel
class VkGelus(VulkanKernel):
    """onnxruntime's BiasGelu / FastGelu / QuickGelu: the optional bias Add (binary.comp, broadcasting) or a copy
    (unary.comp) with the GELU as its fused activation."""

    name = "vk_gelus"
    ops = tuple(GELUS)

    def applies(self, layer: Layer) -> bool:
        if layer.attr("act") is not None:
            return False
        return not layer.has_input(1) or _rank_ok([layer.in_shape(0), layer.in_shape(1)], layer.out_shape())

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        name, key, default = GELUS[layer.op]
        act = (ACT_IDS[name], float(layer.attr(key, default)) if key else 0.0, 0.0)
        out = layer.out_shape()
        if layer.has_input(1):
            return [binary_dispatch(layer.in_shape(0), layer.in_shape(1), out, In(0), In(1), Out(0), caps, 0, act)]
        return [unary_dispatch(layer, In(0), Out(0), layer.outputs[0].size, caps, 0, act)]


@register_kernel
class VkWhere(VulkanKernel):
    """Where(cond, a, b) for float a/b with broadcasting; cond a bool tensor (computed or constant)."""

    name = "vk_where"
    ops = ("Where",)
    io_dtypes = ("float32", "bool")

    def applies(self, layer: Layer) -> bool:
        c = layer.inputs[0]
        return (c is not None and np.dtype(c.dtype) == np.bool_ and _floats(layer, (1, 2))
                and _rank_ok([layer.in_shape(k) for k in range(3)], layer.out_shape()))

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        out = layer.out_shape()
        sts = [broadcast_strides(layer.in_shape(k), out) for k in range(3)]
        dims, (sc, sa, sb, _) = collapse(out, *sts, contiguous_strides(out))
        n = layer.outputs[0].size
        return [Dispatch("where", (In(0), In(1), In(2), Out(0)), grid(n, LOCAL, caps),
                         push={"n": n, "rank": len(dims), "dims": dims, "sc": sc, "sa": sa, "sb": sb})]


@register_kernel
class VkTrilu(VulkanKernel):
    """Trilu of a float tensor as a Where over a load-time mask (``where.comp``): the kept triangle of the last two
    dims is a constant of the node (k must be a constant), broadcast over the leading ones; the rest reads 0."""

    name = "vk_trilu"
    ops = ("Trilu",)

    def applies(self, layer: Layer) -> bool:
        return 0 not in layer.const_inputs and (not layer.has_input(1) or 1 in layer.const_inputs) \
            and _rank_ok([layer.in_shape(0)[-2:], layer.in_shape(0), ()], layer.out_shape())

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n, m = layer.in_shape(0)[-2:]
        k = int(np.asarray(raw["in1"]).reshape(-1)[0]) if "in1" in raw else 0
        keep = np.triu(np.ones((n, m), np.bool_), k) if int(layer.attr("upper", 1)) else \
            np.tril(np.ones((n, m), np.bool_), k)
        return {"mask": np.ascontiguousarray(keep).view(np.uint8), "zero": np.zeros(1, np.float32)}

    def transformed_nbytes(self, layer: Layer) -> int:
        n, m = layer.in_shape(0)[-2:]
        return n * m + 4

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        out = layer.out_shape()
        sts = [broadcast_strides(out[-2:], out), contiguous_strides(out), [0] * len(out)]
        dims, (sc, sa, sb, _) = collapse(out, *sts, contiguous_strides(out))
        n = layer.outputs[0].size
        return [Dispatch("where", (Param("mask"), In(0), Param("zero"), Out(0)), grid(n, LOCAL, caps),
                         push={"n": n, "rank": len(dims), "dims": dims, "sc": sc, "sa": sa, "sb": sb})]
