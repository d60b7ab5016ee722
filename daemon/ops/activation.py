"""Activations: standalone unary ops, and the fused form that Conv/Gemm/MatMul/binary kernels apply.

A fused activation is stored on the producer as ``attrs["act"] = (name, params)``; ``apply_act``
is the single CPU implementation of all of them, so fused and unfused paths cannot drift.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import numpy as np

from .. import native
from ..errors import ShapeError
from ..ir import Node, TensorInfo
from .base import Kernel, Layer, OpSpec, full_inputs, register_kernel, register_op

Act = tuple[str, tuple[float, ...]]

#: Activations a producer kernel can take as a fused epilogue (the Vulkan shaders implement the same set).
FUSABLE = ("Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "SiLU", "Gelu", "Softplus")


def apply_act(x: np.ndarray, act: Act | None) -> np.ndarray:
    """Apply ``act`` to ``x`` in place (x must be writable float) and return it."""
    if act is None:
        return x
    name, p = act
    if name == "Relu":
        np.maximum(x, 0, out=x)
    elif name == "LeakyRelu":
        np.multiply(x, np.where(x < 0, np.float32(p[0]), np.float32(1)).astype(x.dtype), out=x)
    elif name == "Clip":
        clip_into(x, p[0], p[1])
    elif name == "Sigmoid":
        _sigmoid(x, out=x)
    elif name == "HardSigmoid":
        np.multiply(x, p[0], out=x)
        np.add(x, p[1], out=x)
        np.clip(x, 0, 1, out=x)
    elif name == "HardSwish":
        t = np.clip(x * np.float32(1 / 6) + np.float32(0.5), 0, 1)
        np.multiply(x, t, out=x)
    elif name == "Tanh":
        np.tanh(x, out=x)
    elif name == "SiLU":
        t = x.copy()
        np.multiply(x, _sigmoid(t, out=t), out=x)
    elif name == "Gelu":
        if x.dtype == np.float32 and x.flags.c_contiguous and x.flags.writeable:
            # one branch-free C pass (threaded) instead of ~6 numpy passes and scipy's erf
            native.gelu_(x, bool(p and p[0] == 1.0))
        elif p and p[0] == 1.0:  # tanh approximation
            t = np.tanh(np.float32(math.sqrt(2 / math.pi)) * (x + np.float32(0.044715) * x * x * x))
            np.multiply(x, np.float32(0.5) * (1 + t), out=x)
        else:
            t = native.numpy_erf(x * np.float32(1 / math.sqrt(2)))  # scipy imported here, if at all
            np.multiply(x, np.float32(0.5) * (1 + t), out=x)
    elif name == "Softplus":
        # log(1+exp(x)) computed stably
        y = np.logaddexp(np.float32(0), x)
        x[...] = y
    else:
        raise ValueError(f"unknown fused activation {name!r}")
    return x


def clip_into(x: np.ndarray, lo: float | np.ndarray | None, hi: float | np.ndarray | None) -> np.ndarray:
    """Clip ``x`` in place to the scalar bounds that are present (None or an infinite bound = no bound).

    Integer outputs cannot take np.clip's float +-inf bounds (they do not cast back), so there each
    finite bound is clamped into the dtype's range, cast to it and applied on its own."""
    if not np.issubdtype(x.dtype, np.integer):
        np.clip(x, -np.inf if lo is None else lo, np.inf if hi is None else hi, out=x)
        return x
    info = np.iinfo(x.dtype)
    for bound, f in ((lo, np.maximum), (hi, np.minimum)):
        if bound is None:
            continue
        b = np.asarray(bound).reshape(-1)[0]
        if b.dtype.kind == "f":
            if not np.isfinite(b):
                continue  # +-inf: no bound for integers (NaN bounds are not meaningful either)
            b = min(max(b, info.min), info.max)
        f(x, np.asarray(b).astype(x.dtype), out=x)
    return x


def _sigmoid(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    # 1/(1+exp(-x)) overflows harmlessly to 0 for very negative x; silence the warning only
    with np.errstate(over="ignore"):
        np.negative(x, out=out)
        np.exp(out, out=out)
        np.add(out, 1, out=out)
        np.reciprocal(out, out=out)
    return out


def act_from_node(node: Node) -> Act | None:
    """The fused-activation form of a standalone activation node (None if it cannot be fused)."""
    op = node.op
    if op == "Relu":
        return ("Relu", ())
    if op == "LeakyRelu":
        return ("LeakyRelu", (float(node.attr("alpha", 0.01)),))
    if op == "Clip":
        lo, hi = node.attr("min", -np.inf), node.attr("max", np.inf)
        return ("Clip", (float(lo), float(hi)))
    if op == "HardSigmoid":
        return ("HardSigmoid", (float(node.attr("alpha", 0.2)), float(node.attr("beta", 0.5))))
    if op == "Gelu":
        return ("Gelu", (1.0 if node.attr("approximate", "none") == "tanh" else 0.0,))
    if op in ("Sigmoid", "HardSwish", "Tanh", "Softplus", "SiLU"):
        return (op, ())
    return None


def _same(node: Node, ins: list[TensorInfo | None], consts: dict) -> list:
    return [(ins[0].shape, ins[0].dtype)]


def _ref_unary(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    x = np.array(inputs[0], dtype=inputs[0].dtype, copy=True)
    if node.op == "PRelu":
        slope = inputs[1]
        return [np.where(x < 0, x * slope, x).astype(x.dtype)]
    if node.op == "Clip" and len(inputs) > 1:
        # opset >= 11 passes min/max as inputs; import folds constant ones into attrs
        lo = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
        hi = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
        return [clip_into(x, lo, hi)]
    act = act_from_node(node)
    assert act is not None
    if not np.issubdtype(x.dtype, np.floating):
        if node.op in ("Relu", "Clip"):
            return [apply_act(x, act)]
        x = x.astype(np.float32)
    return [apply_act(x, act)]


for _op in ("Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Gelu", "Softplus", "PRelu", "SiLU"):
    register_op(OpSpec(_op, _same, _ref_unary, min_opset=20 if _op == "Gelu" else 1))


#: Standalone activations the C pass applies (inferd_bias_act, split over the pool) where numpy needs several
#: passes: a detector head's Sigmoid after its Transpose, 115k values: 0.18 ms in numpy, ~0.03 ms in C.
_NATIVE_STANDALONE = ("Sigmoid", "SiLU", "HardSwish", "HardSigmoid")


def _native_rows(out: np.ndarray, act: Act | None) -> int | None:
    """Rows to view ``out`` as for the C pass (rows are what the pool splits), or None where it does not apply
    (another activation, not float32, not contiguous). Whatever the size: through its checked wrapper the pass
    is still faster than numpy's several on 256 values (4.2 vs 5.7 us for SiLU), and run() and a bound call
    then give the same bits."""
    if (act is None or act[0] not in _NATIVE_STANDALONE or not native.AVAILABLE or out.dtype != np.float32
            or not out.flags.c_contiguous or not out.flags.writeable or out.size == 0):
        return None
    return next(r for r in (64, 16, 4, 1) if out.size % r == 0)


def _act_into(out: np.ndarray, act: Act | None, rows: int | None) -> None:
    if rows is None:
        apply_act(out, act)
    else:
        native.bias_act(out.reshape(rows, -1), None, None, act)


@register_kernel
class ActivationKernel(Kernel):
    name = "eltwise"
    ops = ("Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Gelu", "Softplus", "PRelu", "SiLU")

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        ins = full_inputs(layer, inputs, params)
        out = outputs[0]
        if layer.op == "PRelu":
            np.copyto(out, np.where(ins[0] < 0, ins[0] * ins[1], ins[0]))
            return
        np.copyto(out, ins[0])
        if layer.op == "Clip" and len(ins) > 1:
            clip_into(out, ins[1], ins[2] if len(ins) > 2 else None)
        else:
            act = act_from_node(layer.node)
            _act_into(out, act, _native_rows(out, act))

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        """Relu on these arrays as the one ufunc call ``run`` ends in (``max(x, 0)``; ``run`` copies x first and
        spends ~2 us resolving what to apply); a float Clip as its one ufunc; the C pass's activations as one bound
        C call after the copy; the others as ``run`` minus that resolution. None for PRelu and a Clip whose bounds
        are computed at run time (run() reads them)."""
        x, out = inputs[0] if inputs else None, outputs[0]
        if x is None or layer.op == "PRelu":
            return None
        if layer.op == "Clip" and len(layer.node.inputs) > 1:
            return _bind_clip(layer, x, full_inputs(layer, inputs, params), out)
        if layer.op == "Relu" and x.dtype.kind == "f":
            return functools.partial(np.maximum, x, x.dtype.type(0), out=out)
        act = act_from_node(layer.node)
        if act is not None and act[0] == "Clip":
            lo, hi = act[1]  # floats, +-inf where absent (act_from_node)
            clip = _clip_call(x, lo, hi, out)
            if clip is not None:
                return clip
        # (act_bound applies exactly where run()'s _native_rows would: the C pass bound, or numpy's passes)
        bound = native.act_bound(out, act) if act is not None and act[0] in _NATIVE_STANDALONE and \
            x.dtype == out.dtype else None
        if bound is not None:
            if x.__array_interface__["data"][0] == out.__array_interface__["data"][0] and x.strides == out.strides:
                return bound  # in place

            def bound_call() -> None:
                out[...] = x
                bound()
            return bound_call

        def call() -> None:
            out[...] = x
            apply_act(out, act)
        return call


def _clip_call(x: np.ndarray, lo: float, hi: float, out: np.ndarray) -> Callable[[], None] | None:
    """run()'s copy and clip_into's np.clip of a float tensor as one call, a bound on one side only as that one
    ufunc (np.clip is maximum then minimum for floats, NaN kept: the same values): ~0.6 us where run() took ~4.5.
    None for other dtypes (integer bounds are clamped into the type by run())."""
    if x.dtype.kind != "f" or out.dtype != x.dtype or x.shape != out.shape:
        return None
    if hi == np.inf:
        return functools.partial(np.maximum, x, lo, out=out)
    if lo == -np.inf:
        return functools.partial(np.minimum, x, hi, out=out)
    return functools.partial(np.clip, x, lo, hi, out=out)


def _bind_clip(layer: Layer, x: np.ndarray, ins: Sequence[np.ndarray | None], out: np.ndarray
               ) -> Callable[[], None] | None:
    """A Clip whose bounds are inputs that are constants (EdgeNeXt's F.normalize: a norm clipped from below at
    eps) with the bounds read now (``_clip_call``). None where a bound is computed at run time."""
    lo_i, hi_i = (layer.node.inputs[i] if len(layer.node.inputs) > i else "" for i in (1, 2))
    bounds = []
    for i, name in ((1, lo_i), (2, hi_i)):
        if not name:
            bounds.append(None)
            continue
        if i not in layer.const_inputs or ins[i] is None or np.size(ins[i]) != 1:
            return None
        bounds.append(np.asarray(ins[i]).reshape(-1)[0])
    return _clip_call(x, -np.inf if bounds[0] is None else bounds[0], np.inf if bounds[1] is None else bounds[1], out)


# ---------------------------------------------------------------------------------- unfused activations
# Activations exported models carry less often (ELU family, Mish, Softsign, ThresholdedRelu, Shrink): one
# numpy implementation shared by the oracle and the CPU kernel; no producer fuses them (not in FUSABLE).

#: op -> the opset that introduced it (the coverage table's lower bound)
UNFUSED = {"Elu": 1, "Selu": 1, "Celu": 12, "Mish": 18, "Softsign": 1, "ThresholdedRelu": 10, "Shrink": 9,
           "Swish": 24}

_SELU_ALPHA = 1.67326319217681884765625  # ONNX's defaults, written as the float32 values the spec gives
_SELU_GAMMA = 1.05070102214813232421875


def unfused_act(node: Node, x: np.ndarray) -> np.ndarray:
    """``node``'s activation of ``x`` (a new array of x's dtype). Floats compute in at least float32, so that
    float16 inputs round once, as onnxruntime does."""
    op = node.op
    if op == "Shrink":
        # the one op of the set defined on integers too: compare and shift in the input's own type
        lambd, bias = float(node.attr("lambd", 0.5)), float(node.attr("bias", 0.0))
        xf = x.astype(np.float64) if not np.issubdtype(x.dtype, np.floating) else x
        y = np.where(xf < -lambd, xf + bias, np.where(xf > lambd, xf - bias, 0))
        return y.astype(x.dtype)
    xf = x.astype(np.float32) if x.dtype == np.float16 else x
    with np.errstate(over="ignore"):
        if op == "Elu":
            alpha = xf.dtype.type(node.attr("alpha", 1.0))
            y = np.where(xf < 0, alpha * np.expm1(np.minimum(xf, 0)), xf)
        elif op == "Selu":
            alpha = xf.dtype.type(node.attr("alpha", _SELU_ALPHA))
            gamma = xf.dtype.type(node.attr("gamma", _SELU_GAMMA))
            y = gamma * np.where(xf > 0, xf, alpha * np.expm1(np.minimum(xf, 0)))
        elif op == "Celu":
            alpha = xf.dtype.type(node.attr("alpha", 1.0))
            y = np.maximum(xf, 0) + np.minimum(0, alpha * np.expm1(np.minimum(xf, 0) / alpha))
        elif op == "Mish":
            y = xf * np.tanh(np.logaddexp(xf.dtype.type(0), xf))
        elif op == "Swish":  # x * sigmoid(alpha x); alpha = 1 is SiLU, which the importer rewrites it to
            y = swish(xf, float(node.attr("alpha", 1.0)))
        elif op == "Softsign":
            y = xf / (1 + np.abs(xf))
        elif op == "ThresholdedRelu":
            alpha = xf.dtype.type(node.attr("alpha", 1.0))
            y = np.where(xf > alpha, xf, xf.dtype.type(0))
        else:
            raise ValueError(f"unknown activation {op!r}")
    return np.asarray(y).astype(x.dtype, copy=False)


def swish(x: np.ndarray, alpha: float) -> np.ndarray:
    """x * sigmoid(alpha * x) in x's (float) type; the tanh form does not overflow for large |x|."""
    half = x.dtype.type(0.5)
    return x * (half + half * np.tanh(half * x.dtype.type(alpha) * x))


def _ref_unfused(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    return [np.array(unfused_act(node, np.asarray(inputs[0])), order="C", copy=True)]


_UNFUSED_NOTES = {"Swish": "alpha 1 is imported as SiLU (fused into its producer; Vulkan kernels); other alphas numpy"}
for _op, _since in UNFUSED.items():
    register_op(OpSpec(_op, _same, _ref_unfused, min_opset=_since, notes=_UNFUSED_NOTES.get(_op, "")))


@register_kernel
class UnfusedActivationKernel(Kernel):
    """numpy, one pass per step of the formula: these ops are rare enough not to need a native loop."""

    name = "numpy"
    ops = tuple(UNFUSED)

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        np.copyto(outputs[0], unfused_act(layer.node, np.asarray(full_inputs(layer, inputs, params)[0])))


# ---------------------------------------------------------------------------------- SwiGLU (opset 28)

def _infer_swiglu(node: Node, ins: list[TensorInfo | None], consts: dict) -> list:
    a, b = ins[0], ins[1]
    assert a is not None and b is not None
    if tuple(a.shape) != tuple(b.shape) or np.dtype(a.dtype) != np.dtype(b.dtype):
        raise ShapeError(f"node {node.name!r} (SwiGLU): gate A {list(a.shape)} {np.dtype(a.dtype)} and value B "
                         f"{list(b.shape)} {np.dtype(b.dtype)} must have one shape and type (no broadcasting)")
    return [(tuple(a.shape), np.dtype(a.dtype))]


def swiglu(node: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Swish_alpha(A) * B, float16 computed in float32 and rounded once."""
    af = a.astype(np.float32) if a.dtype == np.float16 else a
    bf = b.astype(af.dtype, copy=False)
    return np.asarray(swish(af, float(node.attr("alpha", 1.0))) * bf).astype(a.dtype, copy=False)


def _ref_swiglu(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    return [np.array(swiglu(node, np.asarray(inputs[0]), np.asarray(inputs[1])), order="C", copy=True)]


register_op(OpSpec("SwiGLU", _infer_swiglu, _ref_swiglu, min_opset=28))


@register_kernel
class SwiGLUKernel(Kernel):
    name = "numpy"
    ops = ("SwiGLU",)
