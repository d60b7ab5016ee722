"""Elementwise ops: broadcasting binaries (with fused activations), variadic reductions over inputs
(Sum/Mean/Min/Max), unary math (trigonometric and hyperbolic included), comparisons, the integer bitwise
family, Mod, the IsNaN/IsInf tests and Where.

Every op has one numpy implementation (``_compute``) shared by the reference and the CPU kernel, so
the oracle used for constant folding and the kernel cannot drift; the kernel only differs in writing
into its preallocated output with ``out=``.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy as np

from .. import native
from ..errors import ShapeError, UnsupportedOpError
from ..ir import Node, TensorInfo
from .activation import _NATIVE_STANDALONE, _act_into, _native_rows, apply_act
from .base import Kernel, Layer, OpSpec, full_inputs, register_kernel, register_op

BINARY = ("Add", "Sub", "Mul", "Div", "Pow")
VARIADIC = ("Sum", "Mean", "Min", "Max")  # Min/Max with two inputs are the common binary case
COMPARE = ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")
UNARY = ("Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Erf", "Floor", "Ceil")
#: unary math added for coverage (issue 18): same type in, same type out
UNARY_MATH = ("Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
              "Round", "Sign", "BitwiseNot")
#: numeric in, bool out
UNARY_BOOL = ("IsNaN", "IsInf")
#: broadcasting integer binaries (BitShift and the bitwise family) and Mod: the result has the inputs' type
BINARY_INT = ("BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Mod")
#: bool tensors (masks) in, bool out; Not is unary
LOGICAL = ("And", "Or", "Xor")

_UFUNC: dict[str, np.ufunc] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Sum": np.add, "Mean": np.add,
    "Min": np.minimum, "Max": np.maximum,
    "Equal": np.equal, "Less": np.less, "Greater": np.greater,
    "LessOrEqual": np.less_equal, "GreaterOrEqual": np.greater_equal,
    "Sqrt": np.sqrt, "Exp": np.exp, "Log": np.log, "Neg": np.negative, "Abs": np.absolute,
    "Reciprocal": np.reciprocal, "Floor": np.floor, "Ceil": np.ceil,
    "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor, "Not": np.logical_not,
    "Sin": np.sin, "Cos": np.cos, "Tan": np.tan, "Asin": np.arcsin, "Acos": np.arccos, "Atan": np.arctan,
    "Sinh": np.sinh, "Cosh": np.cosh, "Asinh": np.arcsinh, "Acosh": np.arccosh, "Atanh": np.arctanh,
    # ONNX Round rounds halves to even, as rint does (np.round is not a ufunc)
    "Round": np.rint, "Sign": np.sign, "BitwiseNot": np.invert, "IsNaN": np.isnan,
    "BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or, "BitwiseXor": np.bitwise_xor,
}
#: ops whose output is bool whatever their input type
BOOL_OUT = COMPARE + LOGICAL + UNARY_BOOL + ("Not",)


def _is_int(dt: np.dtype) -> bool:
    return np.issubdtype(dt, np.integer)


def broadcast_shape(node: Node, shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """Numpy (= ONNX multidirectional) broadcast of ``shapes``; ShapeError naming the node if they clash."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"node {node.name!r} ({node.op}): input shapes {list(shapes)} do not broadcast") from None


def _present(ins: Sequence[Any]) -> list[Any]:
    return [x for x in ins if x is not None]


# ----------------------------------------------------------------------------------------------- infer

def _infer_broadcast(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    infos = _present(ins)
    if not infos:
        raise ShapeError(f"node {node.name!r} ({node.op}): no inputs")
    shape = broadcast_shape(node, [i.shape for i in infos])
    dtype = np.dtype(np.bool_) if node.op in BOOL_OUT else np.dtype(infos[0].dtype)
    return [(shape, dtype)]


def _infer_where(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    if len(ins) != 3 or any(i is None for i in ins):
        raise ShapeError(f"node {node.name!r} (Where): needs 3 inputs, got {node.inputs}")
    return [(broadcast_shape(node, [i.shape for i in ins]), np.dtype(ins[1].dtype))]


def _infer_same(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    return [(ins[0].shape, np.dtype(np.bool_) if node.op in UNARY_BOOL else np.dtype(ins[0].dtype))]


# ----------------------------------------------------------------------------------------------- compute

def _int_div(a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """Integer division truncating toward zero (C / onnxruntime), not numpy's floor division."""
    with np.errstate(divide="ignore", invalid="ignore"):
        # a - fmod(a, b) is an exact multiple of b, so the floor division below is exact
        num = np.subtract(a, np.fmod(a, b))
        return np.floor_divide(num, b, out=out)


def _copy_into(out: np.ndarray | None, x: np.ndarray) -> np.ndarray:
    if out is None:
        return np.array(x, copy=True)
    np.copyto(out, x)
    return out


def _pow(a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """ONNX Pow: the result has the base's type; the exponent may be of another type."""
    b = np.asarray(b)
    if b.size == 1 and np.issubdtype(a.dtype, np.floating):
        e = float(b.reshape(-1)[0])
        # common exponents in exported models (x^2 in LayerNorm variance, x^3 in Gelu-tanh): cheap paths
        if e == 2.0 and b.ndim <= a.ndim:
            return np.multiply(a, a, out=out) if out is not None else np.multiply(a, a)
        if e == 1.0 and b.ndim <= a.ndim:
            return _copy_into(out, a)
        if e == 0.5 and b.ndim <= a.ndim:
            return np.sqrt(a, out=out) if out is not None else np.sqrt(a)
    if _is_int(a.dtype):
        if _is_int(b.dtype) and not (b < 0).any():
            r = np.power(a, b.astype(a.dtype))
        else:
            r = np.power(a.astype(np.float64), b.astype(np.float64))
            r = np.trunc(r)
        if out is None:
            return r.astype(a.dtype)
        np.copyto(out, r, casting="unsafe")
        return out
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if out is None:
            return np.power(a, b.astype(a.dtype))
        return np.power(a, b.astype(a.dtype), out=out)


def _erf(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if x.dtype == np.float32 and x.flags.c_contiguous and (
            out is None or (out.dtype == np.float32 and out.flags.c_contiguous and out.shape == x.shape)):
        return native.erf(x, out)  # vectorised C (max abs error ~1e-7), numpy fallback inside
    return native.numpy_erf(x, out)


def _binary(op: str, a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if op == "Div":
        if _is_int(a.dtype) and _is_int(b.dtype):
            return _int_div(a, b, out)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.divide(a, b, out=out) if out is not None else np.divide(a, b)
    if op == "Pow":
        return _pow(a, b, out)
    f = _UFUNC[op]
    return f(a, b, out=out) if out is not None else f(a, b)


def _binary_int(node: Node, a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    op = node.op
    if op == "BitShift":
        direction = node.attr("direction", "")
        direction = direction.decode() if isinstance(direction, bytes) else direction
        f = np.left_shift if direction == "LEFT" else np.right_shift
    elif op == "Mod":
        # fmod=1: C fmod, sign of the dividend; fmod=0: integer modulo with the sign of the divisor (numpy's
        # mod). Integer division by zero gives 0 in numpy; ONNX leaves it undefined, so only silence the warning.
        f = np.fmod if node.attr("fmod", 0) else np.mod
    else:
        f = _UFUNC[op]
    with np.errstate(divide="ignore", invalid="ignore"):
        if out is None:
            return np.asarray(f(a, b.astype(a.dtype, copy=False)))
        return f(a, b.astype(a.dtype, copy=False), out=out, casting="unsafe")


def _isinf(node: Node, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    pos, neg = bool(node.attr("detect_positive", 1)), bool(node.attr("detect_negative", 1))
    if not np.issubdtype(x.dtype, np.floating):
        r = np.zeros(x.shape, np.bool_)
    elif pos and neg:
        r = np.isinf(x)
    elif pos:
        r = np.isposinf(x)
    elif neg:
        r = np.isneginf(x)
    else:
        r = np.zeros(x.shape, np.bool_)
    return _copy_into(out, r) if out is not None else r


def _check_bitshift(node: Node, opset: int) -> None:
    d = node.attr("direction", "")
    d = d.decode() if isinstance(d, bytes) else d
    if d not in ("LEFT", "RIGHT"):
        raise UnsupportedOpError("BitShift", node.name, opset, f"direction {d!r} (must be LEFT or RIGHT)")


def _compute(node: Node, ins: Sequence[np.ndarray | None], out: np.ndarray | None) -> np.ndarray:
    """Result of ``node`` on ``ins``; written into ``out`` when given (which must have the output shape)."""
    op = node.op
    xs = _present(ins)
    if op in BINARY:
        return _binary(op, xs[0], xs[1], out)
    if op in COMPARE or op in LOGICAL:
        f = _UFUNC[op]
        return f(xs[0], xs[1], out=out) if out is not None else f(xs[0], xs[1])
    if op in VARIADIC:
        f = _UFUNC[op]
        if len(xs) == 1:
            res = _copy_into(out, xs[0])
        else:
            res = f(xs[0], xs[1], out=out) if out is not None else f(xs[0], xs[1])
            for x in xs[2:]:
                if res.shape == broadcast_shape(node, [res.shape, x.shape]):
                    f(res, x, out=res)
                else:  # only without ``out``: a later input widens the shape
                    res = f(res, x)
        if op == "Mean":
            np.divide(res, res.dtype.type(len(xs)), out=res, casting="unsafe")
        return res
    if op == "Where":
        r = np.where(ins[0], ins[1], ins[2])  # faster than a masked copyto into out
        if out is None:
            return r
        np.copyto(out, r)
        return out
    if op == "Erf":
        return _erf(xs[0], out)
    if op in BINARY_INT:
        return _binary_int(node, xs[0], xs[1], out)
    if op == "IsInf":
        return _isinf(node, xs[0], out)
    f = _UFUNC[op]
    with np.errstate(divide="ignore", invalid="ignore"):
        return f(xs[0], out=out) if out is not None else f(xs[0])


def _reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    ins = [None if x is None else np.asarray(x) for x in inputs]
    r = np.asarray(_compute(node, ins, None))
    if node.op not in BOOL_OUT and node.op != "Where":
        dt = _present(ins)[0].dtype
        if r.dtype != dt:
            r = r.astype(dt)
    act = node.attr("act")
    if act is not None and node.op in BINARY:
        r = apply_act(np.array(r, copy=True), act)
    return [r]


_MIN_OPSET = {"Erf": 9, "Where": 9, "Less": 1, "Greater": 1, "LessOrEqual": 12, "GreaterOrEqual": 12,
              "Mean": 1, "Sum": 1, "Sin": 7, "Cos": 7, "Tan": 7, "Asin": 7, "Acos": 7, "Atan": 7,
              "Sinh": 9, "Cosh": 9, "Asinh": 9, "Acosh": 9, "Atanh": 9, "Round": 11, "Sign": 9, "IsNaN": 9,
              "IsInf": 10, "BitShift": 11, "Mod": 10, "BitwiseNot": 18, "BitwiseAnd": 18, "BitwiseOr": 18,
              "BitwiseXor": 18}

for _op in BINARY + VARIADIC + COMPARE + LOGICAL + BINARY_INT:
    register_op(OpSpec(_op, _infer_broadcast, _reference, min_opset=_MIN_OPSET.get(_op, 1),
                       check=_check_bitshift if _op == "BitShift" else None))
for _op in UNARY + ("Not",) + UNARY_MATH + UNARY_BOOL:
    register_op(OpSpec(_op, _infer_same, _reference, min_opset=_MIN_OPSET.get(_op, 1)))
register_op(OpSpec("Where", _infer_where, _reference, min_opset=9))


@register_kernel
class ElementwiseKernel(Kernel):
    """numpy ufuncs writing straight into the arena; binaries take a fused activation as epilogue."""

    name = "numpy"
    ops = BINARY + VARIADIC + COMPARE + UNARY + LOGICAL + ("Not", "Where") + UNARY_MATH + UNARY_BOOL + BINARY_INT

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        ins = full_inputs(layer, inputs, params)
        out = outputs[0]
        _compute(layer.node, ins, out)
        act = layer.attr("act")
        # residual is meaningless for a binary (it already is the add); only the activation applies
        if act is not None and layer.op in BINARY:
            _act_into(out, act, _native_rows(out, act))  # as bind() does: the same bits bound or not


    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        """The ops whose ``_compute`` is one ufunc call with no error state of its own (Add, Sub, Mul, Min/Max of
        two, the comparisons and logicals) as that very call on these arrays: ~0.5 us where ``run``'s dispatch
        costs 2-3 us, a cost small models pay on most of their nodes; likewise the unary ufuncs. None for the
        others (run() is used)."""
        op = layer.op
        f = _UFUNC.get(op)
        xs = _present(full_inputs(layer, inputs, params))
        if f is not None and len(xs) == 1 and op in _UNARY_BOUND:
            # the same ufunc under the same error state as _compute's, the state set by a prepared decorator
            # (half the cost of entering ``np.errstate`` per run)
            return np.errstate(divide="ignore", invalid="ignore")(functools.partial(f, xs[0], out=outputs[0]))
        if op == "Div" and len(xs) == 2 and layer.attr("act") is None:
            a, b = (np.asarray(x) for x in xs)
            if a.dtype.kind == "f" and a.dtype == b.dtype == outputs[0].dtype:
                # _binary's float division under the same error state, set by a prepared decorator (EdgeNeXt's
                # six q/k normalisations: ~4.5 us each through run())
                return np.errstate(divide="ignore", invalid="ignore")(functools.partial(np.divide, a, b,
                                                                                        out=outputs[0]))
        if f is None or len(xs) != 2 or not (op in ("Add", "Sub", "Mul", "Min", "Max") or op in COMPARE
                                             or op in LOGICAL):
            return None
        a, b = (np.asarray(x) for x in xs)
        out = outputs[0]
        if op in ("Min", "Max") and (a.dtype != b.dtype or a.dtype != out.dtype):
            return None  # run() widens mixed types first
        act = layer.attr("act") if op in BINARY else None
        if op == "Mul" and act is None:
            rows = _row_scale(a, b, out) or _row_scale(b, a, out)
            if rows is not None:
                return rows
        call = functools.partial(f, a, b, out=out)
        if act is None:
            return call
        # the activation in one native pass over the output where it has one (SiLU was four numpy passes: NF-Nets'
        # x * gain then SiLU, 16 of them, ~20 us each on 184@8x8), bound now whatever the size (resolving the call
        # per run cost ~3 us, as much as the pass on a 736@2x2 map)
        bound = native.act_bound(out, act) if act[0] in _NATIVE_STANDALONE else None
        if bound is not None:
            def with_bound_act() -> None:
                call()
                bound()
            return with_bound_act

        def with_act() -> None:  # (act_bound applies exactly where run()'s _native_rows would)
            call()
            apply_act(out, act)
        return with_act


def _row_scale(x: np.ndarray, s: np.ndarray, out: np.ndarray) -> Callable[[], None] | None:
    """``x * s`` where s holds one value per row of x's trailing dims (squeeze-and-excitation's (N, C, H, W) by
    (N, C, 1, 1)) as the native per-row scale over the pool, or None. numpy's broadcast multiply ran on one thread:
    efficientnet_b0's 16 such Muls took 0.61 ms against onnxruntime's 0.34 on 2 cores."""
    if not native.AVAILABLE or any(v.dtype != np.float32 for v in (x, s, out)) or x.shape != out.shape:
        return None
    if not (x.flags.c_contiguous and out.flags.c_contiguous) or x.ndim < 2 or s.ndim > x.ndim:
        return None
    sh = (1,) * (x.ndim - s.ndim) + tuple(s.shape)
    k = x.ndim
    while k > 0 and sh[k - 1] == 1:
        k -= 1
    if k == 0 or k == x.ndim or tuple(sh[:k]) != tuple(x.shape[:k]) or not s.flags.c_contiguous:
        return None
    rows, inner = int(np.prod(x.shape[:k])), int(np.prod(x.shape[k:]))
    if inner < 16:
        return None
    fn, keep = native.lib.inferd_scale_rows, (x, s, out)
    args = (native._ptr(x), native._ptr(s), native._ptr(out), rows, inner)

    def call() -> None:
        _ = keep
        fn(*args)
    return call


#: unary ops ``_compute`` runs as one ufunc call (under ``errstate(divide, invalid = ignore)``): bound as such
_UNARY_BOUND = tuple(op for op in UNARY + UNARY_MATH + ("Not", "IsNaN") if op != "Erf")
