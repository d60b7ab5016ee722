"""Tensor-manipulation ops: data movement, shapes, casts and constants.

Shape-like inputs (Reshape's shape, Slice's starts/ends, Pad's pads, ...) must be constants: shapes
are static in inferd, so ``infer`` reads them from ``consts`` and raises ShapeError when one is
computed at run time. Each op's parameters are resolved by one function taking a getter
``get(i) -> array | None`` so that infer (constants), the reference and the kernel (arrays) share it.
"""
from __future__ import annotations

import functools
import math
import sys
from typing import Any, Callable, Sequence

import numpy as np

from .. import native
from ..errors import ShapeError, UnsupportedOpError
from ..ir import Node, TensorInfo
from .base import Kernel, Layer, OpSpec, full_inputs, register_kernel, register_op

Getter = Callable[[int], "np.ndarray | None"]
Shape = tuple[int, ...]

# ------------------------------------------------------------------------------------------ dtypes

# ONNX TensorProto.DataType -> numpy. bfloat16 is ml_dtypes' (a numpy dtype whose ufuncs round each step, as
# ONNX's bfloat16 arithmetic does), imported for the first model that has one: ml_dtypes 0.7 took 0.7-1.4 s to
# import (half of the daemon's start on the 2-core VM; 0.01-0.06 s for 0.6, which pyproject now pins). float8, int4
# and string are absent: Cast to them is refused
_ONNX_TO_NP: dict[int, np.dtype] = {
    1: np.dtype(np.float32), 2: np.dtype(np.uint8), 3: np.dtype(np.int8), 4: np.dtype(np.uint16),
    5: np.dtype(np.int16), 6: np.dtype(np.int32), 7: np.dtype(np.int64), 9: np.dtype(np.bool_),
    10: np.dtype(np.float16), 11: np.dtype(np.float64), 12: np.dtype(np.uint32), 13: np.dtype(np.uint64),
    14: np.dtype(np.complex64), 15: np.dtype(np.complex128),
}
_NP_TO_ONNX: dict[np.dtype, int] = {v: k for k, v in _ONNX_TO_NP.items()}
_BFLOAT16 = 16
_ONNX_NAMES = {8: "STRING", 16: "BFLOAT16", 17: "FLOAT8E4M3FN", 18: "FLOAT8E4M3FNUZ", 19: "FLOAT8E5M2",
               20: "FLOAT8E5M2FNUZ", 21: "UINT4", 22: "INT4", 23: "FLOAT4E2M1", 24: "FLOAT8E8M0", 25: "UINT2",
               26: "INT2", 27: "FLOAT6E2M3", 28: "FLOAT6E3M2"}


def onnx_dtype(code: int, op: str = "Cast", node: str = "") -> np.dtype:
    """numpy dtype of ONNX ``TensorProto`` element type ``code``; UnsupportedOpError if numpy has none."""
    try:
        return _ONNX_TO_NP[int(code)]
    except KeyError:
        if int(code) == _BFLOAT16:
            import ml_dtypes

            dt = _ONNX_TO_NP[_BFLOAT16] = np.dtype(ml_dtypes.bfloat16)
            _NP_TO_ONNX[dt] = _BFLOAT16
            return dt
        name = _ONNX_NAMES.get(int(code), "unknown")
        raise UnsupportedOpError(op, node, detail=f"ONNX element type {int(code)} ({name}) is not supported") from None


def numpy_to_onnx(dtype: Any, op: str = "Cast", node: str = "") -> int:
    """ONNX ``TensorProto`` element type of a numpy dtype; UnsupportedOpError if ONNX has none."""
    dt = np.dtype(dtype)
    try:
        return _NP_TO_ONNX[dt]
    except KeyError:
        # a bfloat16 array exists only once ml_dtypes is imported (by whoever made it): then the map knows it
        if dt.kind == "V" and "ml_dtypes" in sys.modules and dt == onnx_dtype(_BFLOAT16):
            return _BFLOAT16
        raise UnsupportedOpError(op, node, detail=f"numpy dtype {dt} has no ONNX element type") from None


# ------------------------------------------------------------------------------------------ helpers

def const_getter(node: Node, consts: dict[str, np.ndarray], what: dict[int, str] | None = None) -> Getter:
    """Getter over the constant inputs of ``node`` for ``infer``: None for an absent optional input,
    ShapeError naming the node and input when the input exists but is computed at run time."""
    def get(i: int) -> np.ndarray | None:
        if i >= len(node.inputs) or not node.inputs[i]:
            return None
        name = node.inputs[i]
        if name not in consts:
            label = (what or {}).get(i, f"input {i}")
            raise ShapeError(f"node {node.name!r} ({node.op}): {label} {name!r} must be a constant "
                             f"(dynamic shapes are not supported)")
        return np.asarray(consts[name])
    return get


def array_getter(inputs: Sequence[np.ndarray | None]) -> Getter:
    def get(i: int) -> np.ndarray | None:
        if i >= len(inputs) or inputs[i] is None:
            return None
        return np.asarray(inputs[i])
    return get


def _ints(a: np.ndarray | Sequence[int] | None) -> list[int] | None:
    if a is None:
        return None
    return [int(v) for v in np.asarray(a).reshape(-1)]


def _axis(node: Node, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"node {node.name!r} ({node.op}): axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _axes(node: Node, axes: Sequence[int], rank: int) -> list[int]:
    out = [_axis(node, a, rank) for a in axes]
    if len(set(out)) != len(out):
        raise ShapeError(f"node {node.name!r} ({node.op}): repeated axes {list(axes)}")
    return out


def _opset(node: Node) -> int:
    return int(node.attr("_opset", 17))


def _axes_input_or_attr(node: Node, get: Getter, idx: int) -> list[int] | None:
    """Axes from input ``idx`` (opset >= 13 style) or else the ``axes`` attribute (older opsets)."""
    v = get(idx)
    if v is not None:
        return _ints(v)
    a = node.attr("axes")
    return None if a is None else _ints(a)


# ------------------------------------------------------------------------------------------ per-op shapes/params

def _concat_shape(node: Node, shapes: list[Shape]) -> tuple[Shape, int]:
    rank = len(shapes[0])
    axis = node.attr("axis")
    if axis is None:  # optional (default 1) only before opset 4
        axis = 1 if _opset(node) < 4 else _missing(node, "axis")
    axis = _axis(node, int(axis), rank)
    for s in shapes[1:]:
        if len(s) != rank or any(a != b for k, (a, b) in enumerate(zip(s, shapes[0])) if k != axis):
            raise ShapeError(f"node {node.name!r} (Concat): shapes {shapes} differ outside axis {axis}")
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return tuple(out), axis


def _missing(node: Node, attr: str) -> Any:
    raise ShapeError(f"node {node.name!r} ({node.op}): required attribute {attr!r} is missing")


def _split_sizes(node: Node, dim: int, get: Getter) -> list[int]:
    n = sum(1 for o in node.outputs)
    split = get(1)
    sizes = _ints(split) if split is not None else _ints(node.attr("split"))
    if sizes is not None and len(sizes) > 0:
        if len(sizes) != n or sum(sizes) != dim or any(s < 0 for s in sizes):
            raise ShapeError(f"node {node.name!r} (Split): split {sizes} does not divide dim {dim} into {n} outputs")
        return sizes
    num = node.attr("num_outputs")
    if num is not None:
        num = int(num)
        if num != n:
            raise ShapeError(f"node {node.name!r} (Split): num_outputs={num} but {n} outputs")
        chunk = -(-dim // num)
        sizes = [chunk] * (num - 1) + [dim - chunk * (num - 1)]
        if sizes[-1] < 0:
            raise ShapeError(f"node {node.name!r} (Split): cannot split dim {dim} into {num} chunks")
        return sizes
    if dim % n:
        raise ShapeError(f"node {node.name!r} (Split): dim {dim} does not split evenly into {n} outputs")
    return [dim // n] * n


def _slices(node: Node, shape: Shape, get: Getter) -> tuple[slice, ...]:
    rank = len(shape)
    if _opset(node) < 10 or (get(1) is None and node.attr("starts") is not None):
        starts, ends = _ints(node.attr("starts")), _ints(node.attr("ends"))
        axes, steps = _ints(node.attr("axes")), None
    else:
        starts, ends, axes, steps = _ints(get(1)), _ints(get(2)), _ints(get(3)), _ints(get(4))
    if starts is None or ends is None or len(starts) != len(ends):
        raise ShapeError(f"node {node.name!r} (Slice): starts {starts} / ends {ends} missing or of different lengths")
    axes = _axes(node, axes if axes is not None else list(range(len(starts))), rank)
    steps = steps if steps is not None else [1] * len(starts)
    if len(axes) != len(starts) or len(steps) != len(starts):
        raise ShapeError(f"node {node.name!r} (Slice): starts/ends/axes/steps lengths differ")
    sl = [slice(None)] * rank
    for a, s, e, st in zip(axes, starts, ends, steps):
        if st == 0:
            raise ShapeError(f"node {node.name!r} (Slice): step 0 on axis {a}")
        # Python slice semantics (negative = from end, clamped, INT64_MIN/MAX as open ends) are ONNX's
        sl[a] = slice(s, e, st)
    return tuple(sl)


def _slice_shape(shape: Shape, sl: tuple[slice, ...]) -> Shape:
    return tuple(len(range(*s.indices(d))) for s, d in zip(sl, shape))


def _reshape_shape(node: Node, in_shape: Shape, get: Getter) -> Shape:
    target = get(1)
    spec = _ints(target) if target is not None else _ints(node.attr("shape"))
    if spec is None:
        raise ShapeError(f"node {node.name!r} (Reshape): no shape input or attribute")
    allowzero = int(node.attr("allowzero", 0))
    out: list[int] = []
    for k, d in enumerate(spec):
        if d == 0 and not allowzero:
            if k >= len(in_shape):
                raise ShapeError(f"node {node.name!r} (Reshape): 0 at position {k} but input rank {len(in_shape)}")
            out.append(in_shape[k])
        else:
            out.append(d)
    total = int(np.prod(in_shape, dtype=np.int64))
    if out.count(-1) > 1:
        raise ShapeError(f"node {node.name!r} (Reshape): more than one -1 in {spec}")
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        if known == 0 or total % known:
            raise ShapeError(f"node {node.name!r} (Reshape): cannot reshape {in_shape} to {spec}")
        out[out.index(-1)] = total // known
    if any(d < 0 for d in out) or int(np.prod(out, dtype=np.int64)) != total:
        raise ShapeError(f"node {node.name!r} (Reshape): cannot reshape {in_shape} to {spec}")
    return tuple(out)


def _flatten_shape(node: Node, shape: Shape) -> Shape:
    rank = len(shape)
    axis = int(node.attr("axis", 1))
    if not -rank <= axis <= rank:
        raise ShapeError(f"node {node.name!r} (Flatten): axis {axis} out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    return (int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64)))


def _perm(node: Node, rank: int) -> list[int]:
    perm = node.attr("perm")
    if perm is None:
        return list(range(rank))[::-1]
    p = _ints(perm)
    if sorted(p) != list(range(rank)):
        raise ShapeError(f"node {node.name!r} (Transpose): perm {p} is not a permutation of rank {rank}")
    return p


def _squeeze_shape(node: Node, shape: Shape, get: Getter) -> Shape:
    axes = _axes_input_or_attr(node, get, 1)
    if not axes:  # absent or empty (onnxruntime treats an empty axes input as absent)
        return tuple(d for d in shape if d != 1)
    ax = _axes(node, axes, len(shape))
    for a in ax:
        if shape[a] != 1:
            raise ShapeError(f"node {node.name!r} (Squeeze): axis {a} of shape {shape} is not 1")
    return tuple(d for k, d in enumerate(shape) if k not in ax)


def _unsqueeze_shape(node: Node, shape: Shape, get: Getter) -> Shape:
    axes = _axes_input_or_attr(node, get, 1)
    if axes is None:
        raise ShapeError(f"node {node.name!r} (Unsqueeze): no axes")
    rank = len(shape) + len(axes)
    ax = sorted(_axes(node, axes, rank))
    out = list(shape)
    for a in ax:
        out.insert(a, 1)
    return tuple(out)


def _gather_shape(node: Node, shape: Shape, idx_shape: Shape) -> tuple[Shape, int]:
    axis = _axis(node, int(node.attr("axis", 0)), len(shape))
    return shape[:axis] + tuple(idx_shape) + shape[axis + 1:], axis


def _expand_shape(node: Node, shape: Shape, get: Getter) -> Shape:
    target = _ints(get(1))
    if target is None:
        raise ShapeError(f"node {node.name!r} (Expand): no shape input")
    try:
        return tuple(int(d) for d in np.broadcast_shapes(shape, tuple(target)))
    except ValueError:
        raise ShapeError(f"node {node.name!r} (Expand): {shape} does not broadcast to {target}") from None


def _shape_range(node: Node, rank: int) -> tuple[int, int]:
    start, end = int(node.attr("start", 0)), node.attr("end")
    end = rank if end is None else int(end)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return start, max(end, start)


def _constant_value(node: Node) -> np.ndarray:
    a = node.attrs
    if "value" in a:
        return np.asarray(a["value"])
    if "value_float" in a:
        return np.asarray(a["value_float"], dtype=np.float32)
    if "value_floats" in a:
        return np.asarray(list(a["value_floats"]), dtype=np.float32).reshape(-1)
    if "value_int" in a:
        return np.asarray(a["value_int"], dtype=np.int64)
    if "value_ints" in a:
        return np.asarray(list(a["value_ints"]), dtype=np.int64).reshape(-1)
    raise UnsupportedOpError("Constant", node.name, _opset(node),
                             f"only value/value_float(s)/value_int(s) are supported, got {sorted(a)}")


def _cos_value(node: Node) -> np.ndarray:
    v = node.attr("value")
    if v is None:
        return np.zeros((), np.float32)
    v = np.asarray(v)
    if v.size != 1:
        raise ShapeError(f"node {node.name!r} (ConstantOfShape): value must have one element, has {v.size}")
    return v.reshape(())


def _pad_params(node: Node, rank: int, get: Getter, dtype: np.dtype) -> tuple[list[tuple[int, int]], str, Any]:
    mode = node.attr("mode", "constant")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if _opset(node) < 11 or (get(1) is None and node.attr("pads") is not None):
        pads, value, axes = _ints(node.attr("pads")), float(node.attr("value", 0.0)), None
    else:
        pads, axes = _ints(get(1)), _ints(get(3))
        cv = get(2)
        value = cv.reshape(-1)[0] if cv is not None and cv.size else 0
    if pads is None:
        raise ShapeError(f"node {node.name!r} (Pad): no pads")
    axes = _axes(node, axes, rank) if axes is not None else list(range(rank))
    if len(pads) != 2 * len(axes):
        raise ShapeError(f"node {node.name!r} (Pad): {len(pads)} pads for {len(axes)} axes")
    widths = [(0, 0)] * rank
    for k, a in enumerate(axes):
        widths[a] = (pads[k], pads[k + len(axes)])
    return widths, mode, np.asarray(value).astype(dtype)


def _pad_shape(node: Node, shape: Shape, widths: list[tuple[int, int]]) -> Shape:
    out = tuple(d + b + e for d, (b, e) in zip(shape, widths))
    if any(d < 0 for d in out):
        raise ShapeError(f"node {node.name!r} (Pad): pads {widths} crop more than shape {shape}")
    return out


def _range_params(node: Node, get: Getter) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    start, limit, delta = get(0), get(1), get(2)
    if start is None or limit is None or delta is None:
        raise ShapeError(f"node {node.name!r} (Range): needs start, limit and delta")
    start, limit, delta = (np.asarray(v).reshape(()) for v in (start, limit, delta))
    if delta == 0:
        raise ShapeError(f"node {node.name!r} (Range): delta is 0")
    # as onnxruntime: the difference in the input type, the division in double
    n = max(int(math.ceil(float(np.subtract(limit, start)) / float(delta))), 0)
    return start, limit, delta, n


# ------------------------------------------------------------------------------------------ infer

def _infer(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    op = node.op
    get = const_getter(node, consts, _INPUT_NAMES.get(op))
    x = ins[0] if ins else None
    shape = tuple(x.shape) if x is not None else ()
    dt = np.dtype(x.dtype) if x is not None else None
    if op == "Concat":
        return [(_concat_shape(node, [i.shape for i in ins if i is not None])[0], dt)]
    if op == "Split":
        axis = _axis(node, int(node.attr("axis", 0)), len(shape))
        out = []
        for s in _split_sizes(node, shape[axis], get):
            o = list(shape)
            o[axis] = s
            out.append((tuple(o), dt))
        return out
    if op == "Slice":
        return [(_slice_shape(shape, _slices(node, shape, get)), dt)]
    if op == "Reshape":
        return [(_reshape_shape(node, shape, get), dt)]
    if op == "Flatten":
        return [(_flatten_shape(node, shape), dt)]
    if op == "Transpose":
        return [(tuple(shape[p] for p in _perm(node, len(shape))), dt)]
    if op == "Squeeze":
        return [(_squeeze_shape(node, shape, get), dt)]
    if op == "Unsqueeze":
        return [(_unsqueeze_shape(node, shape, get), dt)]
    if op == "Gather":
        return [(_gather_shape(node, shape, ins[1].shape)[0], dt)]
    if op == "Expand":
        return [(_expand_shape(node, shape, get), dt)]
    if op == "Shape":
        s, e = _shape_range(node, len(shape))
        return [((e - s,), np.dtype(np.int64))]
    if op == "Size":
        return [((), np.dtype(np.int64))]
    if op == "Cast":
        return [(shape, onnx_dtype(node.attr("to"), "Cast", node.name))]
    if op == "CastLike":
        return [(shape, _castlike_dtype(node, ins[1].dtype))]
    if op == "Constant":
        v = _constant_value(node)
        return [(tuple(v.shape), v.dtype)]
    if op == "ConstantOfShape":
        target = _ints(get(0))
        if target is None or any(d < 0 for d in target):
            raise ShapeError(f"node {node.name!r} (ConstantOfShape): bad shape {target}")
        return [(tuple(target), _cos_value(node).dtype)]
    if op in ("Identity",):
        return [(shape, dt)]
    if op == "Dropout":
        tm = get(2) if len(node.inputs) > 2 and node.inputs[2] and node.inputs[2] in consts else None
        if tm is not None and bool(tm.reshape(-1)[0]):
            raise UnsupportedOpError("Dropout", node.name, _opset(node), "training_mode=True is not supported")
        out = [(shape, dt)]
        if len(node.outputs) > 1:
            out.append((shape, np.dtype(np.bool_)))
        return out
    if op == "Pad":
        widths, _, _ = _pad_params(node, len(shape), get, dt)
        return [(_pad_shape(node, shape, widths), dt)]
    if op == "Tile":
        reps = _ints(get(1))
        if reps is None or len(reps) != len(shape) or any(r < 0 for r in reps):
            raise ShapeError(f"node {node.name!r} (Tile): repeats {reps} do not fit shape {shape}")
        return [(tuple(d * r for d, r in zip(shape, reps)), dt)]
    if op == "Range":
        n = _range_params(node, get)[3]
        return [((n,), np.dtype(ins[0].dtype))]
    raise AssertionError(op)


_INPUT_NAMES: dict[str, dict[int, str]] = {
    "Split": {1: "split"}, "Slice": {1: "starts", 2: "ends", 3: "axes", 4: "steps"}, "Reshape": {1: "shape"},
    "Squeeze": {1: "axes"}, "Unsqueeze": {1: "axes"}, "Expand": {1: "shape"}, "ConstantOfShape": {0: "shape"},
    "Pad": {1: "pads", 2: "constant_value", 3: "axes"}, "Tile": {1: "repeats"},
    "Range": {0: "start", 1: "limit", 2: "delta"},
}


# ------------------------------------------------------------------------------------------ compute

def _compute(node: Node, ins: Sequence[np.ndarray | None], outs: Sequence[np.ndarray] | None) -> list[np.ndarray]:
    """Results of ``node``. With ``outs`` they are written into it (and returned); without, the
    returned arrays may be views of the inputs (the reference copies them)."""
    op = node.op
    get = array_getter(ins)
    x = np.asarray(ins[0]) if ins and ins[0] is not None else None
    out0 = outs[0] if outs else None
    if op == "Concat":
        xs = [np.asarray(a) for a in ins if a is not None]
        _, axis = _concat_shape(node, [a.shape for a in xs])
        return [np.concatenate(xs, axis=axis, out=out0)]
    if op == "Split":
        axis = _axis(node, int(node.attr("axis", 0)), x.ndim)
        bounds = np.cumsum([0] + _split_sizes(node, x.shape[axis], get))
        idx = [slice(None)] * x.ndim
        res = []
        for k in range(len(bounds) - 1):
            idx[axis] = slice(int(bounds[k]), int(bounds[k + 1]))
            res.append(x[tuple(idx)])
        return _fill(res, outs)
    if op == "Slice":
        return _fill([x[_slices(node, x.shape, get)]], outs)
    if op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
        if out0 is not None:
            shape = out0.shape
        elif op == "Reshape":
            shape = _reshape_shape(node, x.shape, get)
        elif op == "Flatten":
            shape = _flatten_shape(node, x.shape)
        elif op == "Squeeze":
            shape = _squeeze_shape(node, x.shape, get)
        else:
            shape = _unsqueeze_shape(node, x.shape, get)
        return _fill([x.reshape(shape)], outs)
    if op == "Transpose":
        return _fill([x.transpose(_perm(node, x.ndim))], outs)
    if op == "Gather":
        idx = np.asarray(ins[1])
        _, axis = _gather_shape(node, x.shape, idx.shape)
        if idx.dtype.kind not in "iu":
            raise ShapeError(f"node {node.name!r} (Gather): indices of type {idx.dtype}")
        dim = x.shape[axis]
        if idx.size and (int(idx.min()) < -dim or int(idx.max()) >= dim):
            raise ShapeError(f"node {node.name!r} (Gather): indices out of range [-{dim}, {dim})")
        # after the bounds check, 'wrap' maps negatives like Python indexing and skips numpy's buffered 'raise'
        return [np.take(x, idx, axis=axis, out=out0, mode="wrap")]
    if op == "Expand":
        return _fill([np.broadcast_to(x, _expand_shape(node, x.shape, get))], outs)
    if op == "Shape":
        s, e = _shape_range(node, x.ndim)
        return _fill([np.asarray(x.shape[s:e], dtype=np.int64).reshape(-1)], outs)
    if op == "Size":
        return _fill([np.asarray(x.size, dtype=np.int64)], outs)
    if op in ("Cast", "CastLike"):
        dt = onnx_dtype(node.attr("to"), "Cast", node.name) if op == "Cast" else _castlike_dtype(node, ins[1].dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            if out0 is not None:
                np.copyto(out0, x, casting="unsafe")
                return [out0]
            return [x.astype(dt)]
    if op == "Constant":
        return _fill([_constant_value(node)], outs)
    if op == "ConstantOfShape":
        v = _cos_value(node)
        shape = tuple(_ints(ins[0]))
        if out0 is not None:
            out0.fill(v)
            return [out0]
        return [np.full(shape, v, dtype=v.dtype)]
    if op in ("Identity",):
        return _fill([x], outs)
    if op == "Dropout":
        res = [x]
        if len(node.outputs) > 1 and (outs is None or len(outs) > 1):
            res.append(np.ones(x.shape, np.bool_))
        return _fill(res, outs)
    if op == "Pad":
        return [_pad(node, x, get, out0)]
    if op == "Tile":
        return _fill([np.tile(x, _ints(ins[1]))], outs)
    if op == "Range":
        start, _, delta, n = _range_params(node, get)
        dt = start.dtype
        if np.issubdtype(dt, np.integer):
            r = (start + np.arange(n, dtype=np.int64) * delta).astype(dt)
        elif dt.itemsize == 2:  # float16/bfloat16 (opset 27): start + i * delta in stash_type (FLOAT or DOUBLE)
            st = int(node.attr("stash_type", 1))
            if st not in (1, 11):
                raise UnsupportedOpError("Range", node.name, _opset(node), f"stash_type {st} (1: FLOAT, 11: DOUBLE)")
            ct = np.float32 if st == 1 else np.float64
            r = (ct(start) + np.arange(n, dtype=ct) * ct(delta)).astype(dt)
        else:  # repeated addition in the input type, as onnxruntime does, so rounding matches
            steps = np.full(n, delta, dtype=dt)
            if n:
                steps[0] = start
            r = np.cumsum(steps, dtype=dt)
        return _fill([r], outs)
    raise AssertionError(op)


def _fill(results: list[np.ndarray], outs: Sequence[np.ndarray] | None) -> list[np.ndarray]:
    if outs is None:
        return results
    for o, r in zip(outs, results):
        np.copyto(o, r)
    return list(outs[:len(results)])


def _pad_crop(x: np.ndarray, widths: list[tuple[int, int]]) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Negative pads crop: ``x`` cropped by them (a view), and the non-negative widths that pad what is left."""
    crop = tuple(slice(max(-b, 0), d - max(-e, 0)) for d, (b, e) in zip(x.shape, widths))
    return x[crop], [(max(b, 0), max(e, 0)) for b, e in widths]


def _pad(node: Node, x: np.ndarray, get: Getter, out: np.ndarray | None) -> np.ndarray:
    widths, mode, value = _pad_params(node, x.ndim, get, x.dtype)
    out_shape = _pad_shape(node, x.shape, widths)
    xc, pos = _pad_crop(x, widths)
    if out is None:
        out = np.empty(out_shape, x.dtype)
    if mode == "constant":
        out.fill(value)
        out[tuple(slice(b, b + d) for (b, _), d in zip(pos, xc.shape))] = xc
        return out
    np_mode = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}.get(mode)
    if np_mode is None:
        raise UnsupportedOpError("Pad", node.name, _opset(node), f"mode {mode!r}")
    if xc.size == 0 and any(p != (0, 0) for p in pos):
        raise ShapeError(f"node {node.name!r} (Pad): mode {mode!r} on an empty tensor")
    np.copyto(out, np.pad(xc, pos, mode=np_mode))
    return out


def _reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    # copies: folded constants must not alias (or be views of) other constants
    return [np.array(r, copy=True) for r in _compute(node, inputs, None)]


# ------------------------------------------------------------------------------------------ checks

def _check_cast(node: Node, opset: int) -> None:
    onnx_dtype(node.attr("to", -1), "Cast", node.name)


def _castlike_dtype(node: Node, dtype: Any) -> np.dtype:
    """CastLike's target type (that of its second input), held to the same element types as Cast's
    ``to``: a float8/int4 target (an ml_dtypes array) raises UnsupportedOpError as Cast does."""
    return onnx_dtype(numpy_to_onnx(dtype, "CastLike", node.name), "CastLike", node.name)


def _check_constant(node: Node, opset: int) -> None:
    _constant_value(node)


def _check_pad(node: Node, opset: int) -> None:
    mode = node.attr("mode", "constant")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise UnsupportedOpError("Pad", node.name, opset, f"mode {mode!r}")


ALIAS_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout")
_MIN_OPSET = {"Expand": 8, "ConstantOfShape": 9, "Range": 11, "CastLike": 15}
_CHECKS: dict[str, Callable[[Node, int], None]] = {"Cast": _check_cast, "Constant": _check_constant, "Pad": _check_pad}
TENSOR_OPS = ("Concat", "Split", "Slice", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Gather",
              "Expand", "Shape", "Size", "Cast", "CastLike", "Constant", "ConstantOfShape", "Identity", "Dropout",
              "Pad", "Tile", "Range")

for _op in TENSOR_OPS:
    register_op(OpSpec(_op, _infer, _reference, alias=_op in ALIAS_OPS, min_opset=_MIN_OPSET.get(_op, 1),
                       check=_CHECKS.get(_op)))


@register_kernel
class TensorKernel(Kernel):
    """Data movement with numpy, one copy straight into the arena (alias ops copy only when called)."""

    name = "numpy"
    ops = TENSOR_OPS

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        _compute(layer.node, full_inputs(layer, inputs, params), outputs)

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        """Data movement over fixed buffers (the CPU arena) with constant parameters is a fixed copy: the source
        views (a slice, a transpose, a row picked by a constant Gather, Concat's parts) are resolved now and the
        run is ``out[...] = view`` per output, ~0.3 us where ``run`` re-parses the parameters (5-10 us: as much as
        a small model's conv). None where a parameter is computed at run time or the op is not pure movement."""
        node, op = layer.node, layer.op
        if not outputs or any(o.size == 0 for o in outputs):
            return None
        if op == "Concat":
            full = full_inputs(layer, inputs, params)
            xs = [np.asarray(a) for a in full if a is not None]
            _, axis = _concat_shape(node, [a.shape for a in xs])
            out, pos, pairs = outputs[0], 0, []
            for a in xs:
                n = a.shape[axis]
                pairs.append((out[(slice(None),) * axis + (slice(pos, pos + n),)], a))
                pos += n
            return copies_call(pairs)
        x = inputs[0] if inputs else None
        # only the data input may come from the graph: any other (starts, perm, indices, ...) must be constant
        if x is None or any(v is not None for v in inputs[1:]):
            return None
        full = full_inputs(layer, inputs, params)
        if op == "Gather":
            view = _gather_view(node, x, np.asarray(full[1]))
            if view is None:
                return None
            if isinstance(view, np.ndarray):
                return copies_call([(outputs[0], view)])
            idx, axis = view
            return lambda: np.take(x, idx, axis=axis, out=outputs[0], mode="wrap")  # noqa: E731
        if op in ("Cast", "CastLike"):
            # integer and bool sources cast without floating-point warnings (run() silences those for floats)
            return copies_call([(outputs[0], x)]) if x.dtype.kind in "biu" else None
        if op == "Pad":
            return _pad_bound(node, x, array_getter(full), outputs[0])
        if op not in VIEW_OPS:
            return None
        res = _compute(node, full, None)
        if len(res) != len(outputs) or not all(np.may_share_memory(r, x) for r in res):
            return None  # a result that is not a view of x (Dropout's mask): run() computes it
        return copies_call(list(zip(outputs, res)))


def _pad_bound(node: Node, x: np.ndarray, get: Getter, out: np.ndarray) -> Callable[[], None] | None:
    """A constant Pad over fixed buffers: the border slabs filled and the (cropped) input copied into the
    interior, each region written once. ``run`` filled the whole output and then overwrote its interior, after
    parsing the parameters again (swin_t's window pads, 16x16 -> 21x21 by 96 channels: 38 us a call)."""
    widths, mode, value = _pad_params(node, x.ndim, get, x.dtype)
    if mode != "constant" or out.shape != _pad_shape(node, x.shape, widths):
        return None
    xc, pos = _pad_crop(x, widths)
    # the border as disjoint slabs: along each axis in turn its two ends, within the interior of the axes before
    slabs: list[np.ndarray] = []
    inner: list[slice] = []
    for a, ((b, e), d) in enumerate(zip(pos, xc.shape)):
        rest = (slice(None),) * (x.ndim - a - 1)
        for lo, hi in ((0, b), (b + d, b + d + e)):
            if hi > lo:
                slabs.append(out[(*inner, slice(lo, hi), *rest)])
        inner.append(slice(b, b + d))
    copy = copies_call([(out[tuple(inner)], xc)])
    fill = value[()]

    def call() -> None:
        for slab in slabs:
            slab.fill(fill)
        copy()
    return call


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` are the very same elements (so copying one onto the other is a no-op)."""
    return a.shape == b.shape and a.dtype == b.dtype and \
        (a.strides == b.strides or (a.flags.c_contiguous and b.flags.c_contiguous)) and \
        a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


def _nothing() -> None:
    """A step whose data the memory plan already put where it belongs."""


_nothing.steps = []  # type: ignore[attr-defined]  # (no native work: it joins a run of native steps, native.fuse_calls)


#: ops whose results, given constant parameters, are views of their data input (``TensorKernel.bind``)
VIEW_OPS = ("Slice", "Transpose", "Split", "Expand", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity",
            "Dropout")


def copies_call(pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> Callable[[], None]:
    """One call doing ``dst[...] = src`` for each pair (item assignment: a third of ``np.copyto``'s cost on the
    small arrays these are). A pair the memory plan already put in place (``planner.memory.slice_placements``:
    a Split into views, a Concat whose producers wrote into it, a Gather of one index) is left out."""
    calls: list[Callable[[], None]] = []
    for dst, src in pairs:
        if _same_memory(src, dst):
            continue
        # a big permuted or stepped view: numpy walks it one element at a time on one core (copy.c)
        fast = native.strided_copy_bound(dst, src) if (src.size >= native.STRIDED_COPY_MIN
                                                        and not src.flags.c_contiguous) else None
        calls.append(fast if fast is not None else functools.partial(dst.__setitem__, Ellipsis, src))
    if not calls:
        return _nothing
    if len(calls) == 1:
        return calls[0]

    def call() -> None:
        for c in calls:
            c()
    return call


def _gather_view(node: Node, x: np.ndarray, idx: np.ndarray) -> np.ndarray | tuple[np.ndarray, int] | None:
    """A Gather by constant indices as a view of ``x`` (a scalar index, or a run of indices with a constant positive
    step: basic indexing), else (indices made non-negative, axis) for ``np.take``; None for bad indices (run()
    raises)."""
    if idx.dtype.kind not in "iu":
        return None
    _, axis = _gather_shape(node, x.shape, idx.shape)
    dim = x.shape[axis]
    if idx.size and (int(idx.min()) < -dim or int(idx.max()) >= dim):
        return None
    flat = np.where(idx < 0, idx + dim, idx).astype(np.int64).reshape(-1)
    lead = (slice(None),) * axis
    if idx.ndim == 0:  # a slice squeezed, not x[i]: that is a scalar copy where x is 1-D, a view here always
        i = int(flat[0])
        return x[lead + (slice(i, i + 1),)].squeeze(axis=axis)
    if idx.ndim == 1 and flat.size:
        step = int(flat[1] - flat[0]) if flat.size > 1 else 1
        if step > 0 and (np.diff(flat) == step).all():
            return x[lead + (slice(int(flat[0]), int(flat[-1]) + 1, step),)]
    return flat.reshape(idx.shape), axis


# ------------------------------------------------------------------------------------------ BitCast (opset 26)

def _check_bitcast(node: Node, opset: int) -> None:
    onnx_dtype(node.attr("to", -1), "BitCast", node.name)


def _infer_bitcast(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    x = ins[0]
    assert x is not None
    return [(tuple(x.shape), _bitcast_to(node, np.dtype(x.dtype)))]


def _bitcast_to(node: Node, src: np.dtype) -> np.dtype:
    """BitCast's target type for a ``src`` input; UnsupportedOpError / ShapeError where the bits do not map."""
    to = onnx_dtype(node.attr("to", -1), "BitCast", node.name)
    if _bits(src) != 8 * src.itemsize:  # int4/int2/float4/float6: packed in ONNX, a byte each in ml_dtypes
        raise UnsupportedOpError("BitCast", node.name, _opset(node), f"input element type {src} ({_bits(src)} bits, "
                                 "sub-byte): not supported")
    if src.itemsize != to.itemsize:
        raise ShapeError(f"node {node.name!r} (BitCast): {src} ({8 * src.itemsize} bits) cannot be reinterpreted as "
                         f"{to} ({8 * to.itemsize} bits); the widths must be equal")
    return to


def _bits(dt: np.dtype) -> int:
    """Bits of one element: an ml_dtypes type (kind 'V') may hold fewer than its storage byte."""
    if dt.kind != "V":
        return 8 * dt.itemsize
    import ml_dtypes  # imported already: whatever made this dtype did

    try:
        return int(ml_dtypes.finfo(dt).bits)
    except ValueError:
        return int(ml_dtypes.iinfo(dt).bits)


def bitcast(node: Node, x: np.ndarray) -> np.ndarray:
    """The bits of ``x`` read as ``to`` (little-endian, as ONNX says: numpy's native order on x86-64 and aarch64)."""
    src = np.ascontiguousarray(x)
    to = _bitcast_to(node, src.dtype)
    return src.astype(src.dtype.newbyteorder("<"), copy=False).view(to.newbyteorder("<")).astype(to, copy=False)


def _reference_bitcast(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    return [np.array(bitcast(node, np.asarray(inputs[0])), copy=True)]


register_op(OpSpec("BitCast", _infer_bitcast, _reference_bitcast, min_opset=26, check=_check_bitcast))


@register_kernel
class BitCastKernel(Kernel):
    """A copy of the input's bytes under the target type."""

    name = "numpy"
    ops = ("BitCast",)
