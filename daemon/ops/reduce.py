"""Reductions (Reduce*, ArgMax/ArgMin) and Softmax/LogSoftmax.

Reduce axes come from the ``axes`` input when there is one (ReduceSum from opset 13, every Reduce*
from opset 18) and otherwise from the ``axes`` attribute, so one code path serves every opset.
Softmax semantics do change with the opset: before 13 the input is coerced to 2-D at ``axis``
(default 1) and normalised over the flattened tail; from 13 it is normalised along ``axis`` (default -1).
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import numpy as np

from .. import native
from ..errors import ShapeError
from ..ir import Node, TensorInfo
from .base import ContiguousOut, Kernel, Layer, OpSpec, full_inputs, register_kernel, register_op

REDUCE_OPS = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")
SOFTMAX_OPS = ("Softmax", "LogSoftmax")
ARG_OPS = ("ArgMax", "ArgMin")


def _opset(node: Node) -> int:
    return int(node.attr("_opset", 17))


def _norm_axis(node: Node, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"node {node.name!r} ({node.op}): axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _axes_value(node: Node, axes_in: np.ndarray | None) -> list[int] | None:
    if axes_in is not None:
        return [int(a) for a in np.asarray(axes_in).reshape(-1)]
    a = node.attr("axes")
    return None if a is None else [int(v) for v in np.asarray(a).reshape(-1)]


def reduce_axes(node: Node, rank: int, axes_in: np.ndarray | None) -> tuple[int, ...] | None:
    """Normalised, sorted axes to reduce; None means "no reduction" (noop_with_empty_axes on empty axes)."""
    axes = _axes_value(node, axes_in)
    if not axes:
        if int(node.attr("noop_with_empty_axes", 0)):
            return None
        return tuple(range(rank))
    norm = sorted(_norm_axis(node, a, rank) for a in axes)
    if len(set(norm)) != len(norm):
        raise ShapeError(f"node {node.name!r} ({node.op}): repeated axes {axes}")
    return tuple(norm)


def _axes_const(node: Node, consts: dict[str, np.ndarray]) -> np.ndarray | None:
    if len(node.inputs) > 1 and node.inputs[1]:
        name = node.inputs[1]
        if name not in consts:
            raise ShapeError(f"node {node.name!r} ({node.op}): axes input {name!r} must be a constant "
                             f"(dynamic shapes are not supported)")
        return np.asarray(consts[name])
    return None


def _reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...] | None, keepdims: bool) -> tuple[int, ...]:
    if axes is None:
        return tuple(shape)
    if keepdims:
        return tuple(1 if k in axes else d for k, d in enumerate(shape))
    return tuple(d for k, d in enumerate(shape) if k not in axes)


# ------------------------------------------------------------------------------------------ infer

def _infer_reduce(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    x = ins[0]
    axes = reduce_axes(node, len(x.shape), _axes_const(node, consts))
    return [(_reduced_shape(tuple(x.shape), axes, bool(node.attr("keepdims", 1))), np.dtype(x.dtype))]


def _infer_softmax(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    x = ins[0]
    _softmax_axis(node, len(x.shape))
    return [(tuple(x.shape), np.dtype(x.dtype))]


def _infer_arg(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    x = ins[0]
    axis = _norm_axis(node, int(node.attr("axis", 0)), len(x.shape))
    return [(_reduced_shape(tuple(x.shape), (axis,), bool(node.attr("keepdims", 1))), np.dtype(np.int64))]


# ------------------------------------------------------------------------------------------ compute

def _lowest(dt: np.dtype) -> float | int | bool:
    """Identity of max: what a reduction over an empty set of values yields (the ONNX rule; onnxruntime
    gives the same for numbers and rejects bool, where False is the only sensible identity)."""
    if dt == np.bool_:
        return False
    if np.issubdtype(dt, np.integer):
        return int(np.iinfo(dt).min)
    return -np.inf


def _highest(dt: np.dtype) -> float | int | bool:
    """Identity of min (see ``_lowest``)."""
    if dt == np.bool_:
        return True
    if np.issubdtype(dt, np.integer):
        return int(np.iinfo(dt).max)
    return np.inf


def _reduce(node: Node, x: np.ndarray, axes_in: np.ndarray | None, out: np.ndarray | None) -> np.ndarray:
    op = node.op
    keep = bool(node.attr("keepdims", 1))
    axes = reduce_axes(node, x.ndim, axes_in)
    if axes is None:
        if out is None:
            return np.array(x, copy=True)
        np.copyto(out, x)
        return out
    kw = dict(axis=axes, keepdims=keep)
    if op == "ReduceMean":
        r = np.mean(x, **kw, out=out) if np.issubdtype(x.dtype, np.floating) else np.mean(x, **kw)
    elif op == "ReduceSum":
        r = np.sum(x, **kw, out=out)
    elif op == "ReduceMax":
        r = np.max(x, **kw, out=out, initial=_lowest(x.dtype))
    elif op == "ReduceMin":
        r = np.min(x, **kw, out=out, initial=_highest(x.dtype))
    elif op == "ReduceProd":
        r = np.prod(x, **kw, out=out)
    elif op == "ReduceL1":
        r = np.sum(np.abs(x), **kw, out=out)
    elif op == "ReduceSumSquare":
        r = np.sum(np.square(x), **kw, out=out)
    elif op == "ReduceL2":
        r = np.sum(np.square(x), **kw, out=out)
        r = np.sqrt(r, out=out) if out is not None else np.sqrt(r)
    elif op == "ReduceLogSum":
        r = np.sum(x, **kw, out=out)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.log(r, out=out) if out is not None else np.log(r)
    elif op == "ReduceLogSumExp":
        m = np.max(x, axis=axes, keepdims=True, initial=_lowest(x.dtype))
        m = np.where(np.isfinite(m), m, 0).astype(x.dtype)  # all -inf (or empty) rows: avoid inf - inf
        r = np.sum(np.exp(x - m), **kw, out=out)
        with np.errstate(divide="ignore"):  # an empty set sums to 0: log gives -inf, as onnxruntime does
            r = np.log(r, out=out) if out is not None else np.log(r)
        np.add(r, m if keep else m.reshape(r.shape), out=r)
    else:  # pragma: no cover - the op tuple and this chain are kept in step
        raise AssertionError(op)
    if out is not None:
        if r is not out:
            np.copyto(out, r, casting="unsafe")
        return out
    return np.asarray(r).astype(x.dtype, copy=False)


def _softmax_axis(node: Node, rank: int) -> int:
    default = 1 if _opset(node) < 13 else -1
    return _norm_axis(node, int(node.attr("axis", default)), rank)


def _softmax(node: Node, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    axis = _softmax_axis(node, x.ndim)
    if out is None:
        out = np.empty(x.shape, x.dtype)
    if _opset(node) < 13:
        # the old definition normalises over everything from axis on: one 2-D row per prefix index
        rows = int(np.prod(x.shape[:axis], dtype=np.int64))
        x2 = x.reshape(rows, -1)
        o2 = out.reshape(rows, -1)
        if not np.shares_memory(o2, out):  # out not contiguous: compute aside, then copy
            tmp = np.empty(x2.shape, x.dtype)
            _softmax_along(node.op, x2, tmp, 1)
            np.copyto(out, tmp.reshape(out.shape))
            return out
        _softmax_along(node.op, x2, o2, 1)
        return out
    _softmax_along(node.op, x, out, axis)
    return out


def _softmax_along(op: str, x: np.ndarray, out: np.ndarray, axis: int) -> None:
    if op == "Hardmax":
        # 1 at the first maximum along the axis (argmax's tie rule, as ONNX specifies), 0 elsewhere
        out[...] = 0
        if x.shape[axis] > 0:
            np.put_along_axis(out, np.argmax(x, axis=axis, keepdims=True), 1, axis=axis)
        return
    m = np.max(x, axis=axis, keepdims=True)
    np.subtract(x, m, out=out)
    if op == "Softmax":
        np.exp(out, out=out)
        s = np.sum(out, axis=axis, keepdims=True)
        np.divide(out, s, out=out)
    else:
        s = np.sum(np.exp(out), axis=axis, keepdims=True)
        np.subtract(out, np.log(s), out=out)


def _arg(node: Node, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    axis = _norm_axis(node, int(node.attr("axis", 0)), x.ndim)
    keep = bool(node.attr("keepdims", 1))
    f = np.argmax if node.op == "ArgMax" else np.argmin
    if int(node.attr("select_last_index", 0)):
        # first match on the reversed axis is the last match on the original
        r = x.shape[axis] - 1 - f(np.flip(x, axis), axis=axis, keepdims=keep)
    else:
        r = f(x, axis=axis, keepdims=keep)
    r = np.asarray(r, dtype=np.int64)
    if out is None:
        return r
    np.copyto(out, r)
    return out


def _compute(node: Node, ins: Sequence[np.ndarray | None], out: np.ndarray | None) -> np.ndarray:
    x = np.asarray(ins[0])
    if node.op in REDUCE_OPS:
        axes_in = ins[1] if len(ins) > 1 else None
        return _reduce(node, x, axes_in, out)
    if node.op in SOFTMAX_OPS or node.op == "Hardmax":
        return _softmax(node, x, out)
    return _arg(node, x, out)


def _reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    return [np.asarray(_compute(node, inputs, None))]


for _op in REDUCE_OPS:
    register_op(OpSpec(_op, _infer_reduce, _reference))
for _op in SOFTMAX_OPS:
    register_op(OpSpec(_op, _infer_softmax, _reference))
for _op in ARG_OPS:
    register_op(OpSpec(_op, _infer_arg, _reference))
# Softmax's axis semantics (2-D coercion before opset 13) with a one-hot of the first maximum
register_op(OpSpec("Hardmax", _infer_softmax, _reference))


@register_kernel
class ReduceKernel(Kernel):
    """numpy reductions writing into the arena output."""

    name = "numpy"
    ops = REDUCE_OPS + SOFTMAX_OPS + ARG_OPS + ("Hardmax",)

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        _compute(layer.node, full_inputs(layer, inputs, params), outputs[0])

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        """Pre-bound reductions. ReduceMean/ReduceMax of float32 over trailing axes (a classifier's spatial mean,
        as shufflenetv2's over H, W): one native call over contiguous rows (numpy's mean over (2, 3) took ~0.15
        ms for 1024x7x7 where onnxruntime takes ~0.02 ms). Otherwise ReduceSum / ReduceMean / ReduceMax /
        ReduceMin of a float tensor over constant axes as the ufunc reduction ``np.mean`` and friends end in
        (ReduceMean: the sum, then a true divide by the count, which is what ``np.mean`` does: same bits),
        resolved now: ~1-2 us where ``run`` spends ~10 us in ``np.mean``'s Python layers. None for the others,
        or axes given at run time."""
        return self._bind_rows(layer, inputs, params, outputs) or self._bind_squares(layer, inputs, params, outputs) \
            or self._bind_ufunc(layer, inputs, params, outputs)

    def _bind_squares(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
                      outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        """ReduceL2 / ReduceSumSquare of a float tensor over trailing axes (an L2 normalisation's norm: EdgeNeXt's
        cross-covariance attention normalises q and k over the tokens) as one einsum over contiguous rows and the
        root in place: no squared temporary (~47 us a call in the model through run, 0.28 ms of edgenext_xx_small's
        1.7; onnxruntime 13 us)."""
        if layer.op not in ("ReduceL2", "ReduceSumSquare"):
            return None
        ins = full_inputs(layer, inputs, params)
        x, y = ins[0], outputs[0]
        if x is None or x.dtype.kind != "f" or y.dtype != x.dtype or not x.size or not x.flags.c_contiguous \
                or not y.flags.c_contiguous or (len(inputs) > 1 and inputs[1] is not None):
            return None
        axes = reduce_axes(layer.node, x.ndim, ins[1] if len(ins) > 1 else None)
        if axes is None or axes != tuple(range(x.ndim - len(axes), x.ndim)):
            return None
        n = int(np.prod(x.shape[x.ndim - len(axes):]))
        rows = x.size // n
        if y.size != rows:
            return None
        x2, y1 = x.reshape(rows, n), y.reshape(rows)
        root = layer.op == "ReduceL2"

        def call() -> None:
            np.einsum("ij,ij->i", x2, x2, out=y1)
            if root:
                np.sqrt(y1, out=y1)
        return call

    def _bind_rows(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
                   outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        if layer.op not in ("ReduceMean", "ReduceMax") or not native.AVAILABLE:
            return None
        ins = full_inputs(layer, inputs, params)
        x, y = ins[0], outputs[0]
        axes_in = ins[1] if len(ins) > 1 else None
        if x is None or x.dtype != np.float32 or y.dtype != np.float32 or not x.size \
                or not x.flags.c_contiguous or not y.flags.c_contiguous or (len(inputs) > 1 and inputs[1] is not None):
            return None
        axes = reduce_axes(layer.node, x.ndim, axes_in)
        if axes is None or axes != tuple(range(x.ndim - len(axes), x.ndim)):
            return None  # not a trailing run of axes: the rows are not contiguous
        n = int(np.prod(x.shape[x.ndim - len(axes):]))
        rows = x.size // n
        if y.size != rows or (layer.op == "ReduceMean" and x.size < NATIVE_MEAN_MIN):
            return None
        fn = native.lib.inferd_reduce_rows
        args = (native._ptr(x), native._ptr(y), rows, n, int(layer.op == "ReduceMax"))

        def call(_keep=(x, y)) -> None:
            fn(*args)
        return call

    def _bind_ufunc(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
                    outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        op, node = layer.op, layer.node
        full = full_inputs(layer, inputs, params)
        x, out = full[0], outputs[0]
        if op not in _UFUNC_REDUCE or x is None or x.dtype.kind != "f" or out.dtype != x.dtype or (
                len(inputs) > 1 and inputs[1] is not None):
            return None
        axes = reduce_axes(node, x.ndim, full[1] if len(full) > 1 else None)
        if axes is None or any(x.shape[a] == 0 for a in axes):
            return None  # a copy, or an empty reduction: run() handles those
        keep = bool(node.attr("keepdims", 1))
        f = functools.partial(_UFUNC_REDUCE[op].reduce, x, axis=axes, keepdims=keep, out=out)
        if op != "ReduceMean":
            return f
        count = np.intp(math.prod(x.shape[a] for a in axes))  # np.mean divides by an intp: the same rounding

        def mean() -> None:
            f()
            np.true_divide(out, count, out=out, casting="unsafe")
        return mean


#: elements from which a ReduceMean over trailing axes takes the native row kernel (1024x7x7: 3.6 us against the
#: ufunc's 29); below, the ufunc reduction, whose sums are np.mean's to the bit (the native sums in another order)
NATIVE_MEAN_MIN = 16384

#: the reductions ``ReduceKernel.bind`` runs as a bare ufunc reduction (ReduceMean: the sum, then the divide)
_UFUNC_REDUCE = {"ReduceSum": np.add, "ReduceMean": np.add, "ReduceMax": np.maximum, "ReduceMin": np.minimum}


def _rows_n(layer: Layer) -> tuple[int, int] | None:
    """(rows, n) when the softmax runs over contiguous rows of n: the last axis from opset 13, or everything
    from the axis on before it (the old coerce-to-2-D definition)."""
    shape = tuple(layer.in_shape(0))
    if not shape:
        return None
    axis = _softmax_axis(layer.node, len(shape))
    if _opset(layer.node) >= 13 and axis != len(shape) - 1:
        return None
    n = int(np.prod(shape[axis:], dtype=np.int64))
    rows = int(np.prod(shape, dtype=np.int64)) // max(n, 1)
    return (rows, n) if n > 0 else None


@register_kernel
class SoftmaxNativeKernel(Kernel):
    """Float32 Softmax/LogSoftmax over contiguous rows in native code (one pass for the max, one for exp and the
    sum, one to scale), rows split over the native pool."""

    name = "softmax_native"
    ops = SOFTMAX_OPS
    priority = 5

    def applies(self, layer: Layer) -> bool:
        x = layer.inputs[0]
        return (native.AVAILABLE and x is not None and np.dtype(x.dtype) == np.float32
                and np.dtype(layer.outputs[0].dtype) == np.float32 and _rows_n(layer) is not None)

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        self.bind(layer, inputs, params, outputs)()  # type: ignore[misc]

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]):
        x = full_inputs(layer, inputs, params)[0]
        y = outputs[0]
        rn = _rows_n(layer)
        assert rn is not None
        xc = np.ascontiguousarray(x, dtype=np.float32)
        if not y.flags.c_contiguous:
            def general() -> None:
                tmp = np.empty(y.shape, np.float32)
                native.lib.inferd_softmax(native._ptr(np.ascontiguousarray(x)), native._ptr(tmp), rn[0], rn[1],
                                          int(layer.op == "LogSoftmax"))
                np.copyto(y, tmp)
            return general
        fn, args = native.lib.inferd_softmax, (native._ptr(xc), native._ptr(y), rn[0], rn[1],
                                               int(layer.op == "LogSoftmax"))
        keep = (xc, y)
        if xc is not x:  # a non-contiguous input: copy it each run
            def copying(_keep=keep) -> None:
                np.copyto(xc, x)
                fn(*args)
            return copying

        def call(_keep=keep) -> None:
            fn(*args)
        return native.with_steps(call, [("inferd_softmax", args)])


# ------------------------------------------------------------------------------------------------ CumSum

def _cumsum_axis(node: Node, axis: np.ndarray | None, rank: int) -> int:
    if axis is None:
        raise ShapeError(f"node {node.name!r} ({node.op}): no axis input")
    a = int(np.asarray(axis).reshape(-1)[0])
    if not -rank <= a < max(rank, 1):
        raise ShapeError(f"node {node.name!r} ({node.op}): axis {a} out of range for rank {rank}")
    return a + rank if a < 0 else a


def _infer_cumsum(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    return [(ins[0].shape, np.dtype(ins[0].dtype))]  # type: ignore[union-attr]


def cumsum(node: Node, x: np.ndarray, axis: np.ndarray | None) -> np.ndarray:
    """ONNX CumSum and CumProd (opset 26): ``exclusive`` shifts by one (starting from the identity, 0 or 1),
    ``reverse`` accumulates from the end; in the input's type."""
    a = _cumsum_axis(node, axis, x.ndim)
    if x.ndim == 0:
        return np.array(x, copy=True)
    prod = node.op == "CumProd"
    v = np.flip(x, a) if node.attr("reverse", 0) else x
    r = (np.cumprod if prod else np.cumsum)(v, axis=a, dtype=x.dtype)
    if node.attr("exclusive", 0):
        first = (np.ones_like if prod else np.zeros_like)(np.take(r, [0], axis=a))
        r = np.concatenate([first, np.take(r, range(r.shape[a] - 1), axis=a)], axis=a)
    return np.flip(r, a) if node.attr("reverse", 0) else r


def _reference_cumsum(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    return [np.ascontiguousarray(cumsum(node, np.asarray(inputs[0]), inputs[1]))]


register_op(OpSpec("CumSum", _infer_cumsum, _reference_cumsum, min_opset=11))
register_op(OpSpec("CumProd", _infer_cumsum, _reference_cumsum, min_opset=26))


@register_kernel
class CumSumKernel(Kernel):
    """numpy's cumsum / cumprod along the axis (any dtype: masks summed into positions, lengths)."""

    name = "numpy"
    ops = ("CumSum", "CumProd")

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        ins = full_inputs(layer, inputs, params)
        np.copyto(outputs[0], cumsum(layer.node, np.asarray(ins[0]), ins[1]))


@register_kernel
class CumSumNative(Kernel):
    """native/gather.c: float32 CumSum as (outer, n, inner) with the inner axis contiguous, the running sum
    vectorised over it and outer slices / column ranges split over the native pool (np.cumsum along a middle
    axis walks the inner axis one element at a time)."""

    name = "cumsum_native"
    ops = ("CumSum",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        x = layer.inputs[0]
        return native.has("inferd_cumsum") and x is not None and len(x.shape) >= 1 and \
            np.dtype(x.dtype) == np.float32

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]):  # type: ignore[no-untyped-def]
        ins = full_inputs(layer, inputs, params)
        x, y = ins[0], outputs[0]
        if x is None or any(a.dtype != np.float32 or not a.flags.c_contiguous for a in (x, y)) or \
                np.shares_memory(x, y) or len(ins) < 2 or ins[1] is None or ins[1].size != 1:
            return None
        node, ax, fn = layer.node, ins[1].reshape(-1), native.lib.inferd_cumsum
        px, py = native._ptr(x), native._ptr(y)
        ex, rv = int(layer.attr("exclusive", 0)), int(layer.attr("reverse", 0))
        by_axis: dict[int, tuple] = {}  # the axis may be an input computed at run time: its value read per run

        def call(_keep: object = (x, y)) -> None:
            key = int(ax[0])
            args = by_axis.get(key)
            if args is None:
                a = _cumsum_axis(node, ax, x.ndim)
                args = by_axis[key] = (px, py, math.prod(x.shape[:a]), x.shape[a], math.prod(x.shape[a + 1:]), ex, rv)
            fn(*args)
        return call

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        ins = full_inputs(layer, inputs, params)
        x = np.ascontiguousarray(ins[0], np.float32)
        a = _cumsum_axis(layer.node, ins[1], x.ndim)
        o = ContiguousOut(outputs[0], avoid=x)  # the scan reads rows it already wrote: the output gets its own memory
        outer, inner = math.prod(x.shape[:a]), math.prod(x.shape[a + 1:])
        native.lib.inferd_cumsum(native._ptr(x), native._ptr(o.y), outer, x.shape[a], inner,
                                 int(layer.attr("exclusive", 0)), int(layer.attr("reverse", 0)))
        o.close()
