"""Indexing ops: element and slice gathers/scatters (GatherElements, GatherND, ScatterElements, ScatterND),
OneHot, ReverseSequence and TopK with a constant k.

Each op has one numpy function computing its outputs from full input arrays, shared by the oracle (constant
folding, tests) and the CPU kernel, which copies the result into its arena buffers. Indices follow ONNX:
negative values count from the end of their axis; an index outside ``[-dim, dim)`` is an error naming the node
(numpy would wrap or raise an anonymous IndexError), except in OneHot, whose spec gives such indices an all-off
row. OneHot's depth must be a constant; TopK with a run-time k is data-dependent (``OpSpec.bounded``).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .. import native
from ..errors import KernelError, ShapeError, UnsupportedOpError
from ..ir import Node, TensorInfo
from .base import ContiguousOut, Kernel, Layer, OpSpec, full_inputs, register_kernel, register_op
from .tensor import const_getter

Infos = list["TensorInfo | None"]


def _opset(node: Node) -> int:
    return int(node.attr("_opset", 17))


def _axis(node: Node, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"node {node.name!r} ({node.op}): axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _norm_indices(node: Node, idx: np.ndarray, dim: int | np.ndarray) -> np.ndarray:
    """``idx`` as int64 with negative values wrapped once; KernelError when one is outside [-dim, dim)."""
    i = np.asarray(idx).astype(np.int64)
    if i.size and (np.any(i < -np.asarray(dim)) or np.any(i >= dim)):
        raise KernelError(f"node {node.name!r} ({node.op}): index out of range (indices {i.min()}..{i.max()}, "
                          f"axis size {dim})")
    return np.where(i < 0, i + dim, i)


def _reduction(node: Node) -> str:
    r = node.attr("reduction", "none")
    return r.decode() if isinstance(r, bytes) else str(r)


_AT: dict[str, np.ufunc] = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _check_reduction(node: Node, opset: int) -> None:
    r = _reduction(node)
    if r != "none" and r not in _AT:
        raise UnsupportedOpError(node.op, node.name, opset, f"reduction {r!r}")


# ------------------------------------------------------------------------------------- GatherElements

def _infer_gather_elements(node: Node, ins: Infos, consts: dict[str, np.ndarray]) -> list:
    data, idx = ins[0], ins[1]
    assert data is not None and idx is not None
    if len(data.shape) != len(idx.shape):
        raise ShapeError(f"node {node.name!r} (GatherElements): data rank {len(data.shape)} != indices rank "
                         f"{len(idx.shape)}")
    _axis(node, int(node.attr("axis", 0)), len(data.shape))
    return [(idx.shape, np.dtype(data.dtype))]


def gather_elements(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    data, idx = np.asarray(ins[0]), np.asarray(ins[1])
    a = _axis(node, int(node.attr("axis", 0)), data.ndim)
    return [np.take_along_axis(data, _norm_indices(node, idx, data.shape[a]), axis=a)]


# ------------------------------------------------------------------------------------- ScatterElements

def _infer_same0(node: Node, ins: Infos, consts: dict[str, np.ndarray]) -> list:
    assert ins[0] is not None
    return [(ins[0].shape, np.dtype(ins[0].dtype))]


def scatter_elements(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    data, idx, upd = np.asarray(ins[0]), np.asarray(ins[1]), np.asarray(ins[2])
    a = _axis(node, int(node.attr("axis", 0)), data.ndim)
    if idx.shape != upd.shape:
        raise ShapeError(f"node {node.name!r} (ScatterElements): indices {idx.shape} and updates {upd.shape} differ")
    out = np.array(data, copy=True)
    norm = _norm_indices(node, idx, data.shape[a])
    red = _reduction(node)
    if red == "none" and a == 0 and idx.size and idx.ndim > 1 and idx.shape[1:] == data.shape[1:]:
        # Whole slices: the index the same all along each slice of the other axes (torchvision's multi-scale
        # RoIAlign merges its levels so, an index per roi expanded over (256, 7, 7)): one slice copy per index,
        # not a gather of every element (fasterrcnn_mobilenet_320's 150 x 256 x 7 x 7: 39 ms element-wise)
        first = norm[(slice(None),) + (slice(0, 1),) * (idx.ndim - 1)]
        if np.array_equal(norm, np.broadcast_to(first, norm.shape)):
            out[first.reshape(-1)] = upd  # (duplicates: the last wins, as below)
            return [out]
    # full coordinates of every update: its own position, with the axis coordinate taken from ``indices``
    coords = list(np.indices(idx.shape, sparse=True))
    coords[a] = norm
    if red == "none":
        out[tuple(coords)] = upd  # ONNX leaves duplicate indices undefined; numpy keeps the last, as onnxruntime
    else:
        _AT[red].at(out, tuple(np.broadcast_arrays(*coords)), upd)
    return [out]


# ------------------------------------------------------------------------------------- GatherND / ScatterND

def _infer_gather_nd(node: Node, ins: Infos, consts: dict[str, np.ndarray]) -> list:
    data, idx = ins[0], ins[1]
    assert data is not None and idx is not None
    b = int(node.attr("batch_dims", 0))
    m = idx.shape[-1] if idx.shape else 0
    if not idx.shape or b + m > len(data.shape) or tuple(idx.shape[:b]) != tuple(data.shape[:b]):
        raise ShapeError(f"node {node.name!r} (GatherND): data {list(data.shape)}, indices {list(idx.shape)} and "
                         f"batch_dims {b} do not fit")
    return [(tuple(idx.shape[:-1]) + tuple(data.shape[b + m:]), np.dtype(data.dtype))]


def gather_nd(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    data, idx = np.asarray(ins[0]), np.asarray(ins[1])
    b = int(node.attr("batch_dims", 0))
    m = idx.shape[-1]
    nb = int(np.prod(data.shape[:b], dtype=np.int64))
    d = data.reshape((nb,) + data.shape[b:])
    ix = idx.reshape(nb, -1, m)
    dims = np.asarray(data.shape[b:b + m], np.int64)
    ix = _norm_indices(node, ix, dims)
    sel = (np.arange(nb)[:, None],) + tuple(ix[..., j] for j in range(m))
    r = d[sel]  # (nb, tuples per batch, *data.shape[b+m:])
    return [r.reshape(tuple(idx.shape[:-1]) + tuple(data.shape[b + m:]))]


def scatter_nd(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    data, idx, upd = np.asarray(ins[0]), np.asarray(ins[1]), np.asarray(ins[2])
    k = idx.shape[-1]
    want = tuple(idx.shape[:-1]) + tuple(data.shape[k:])
    if k > data.ndim or tuple(upd.shape) != want:
        raise ShapeError(f"node {node.name!r} (ScatterND): data {list(data.shape)}, indices {list(idx.shape)}, "
                         f"updates {list(upd.shape)} do not fit (updates must be {list(want)})")
    out = np.array(data, copy=True)
    ix = _norm_indices(node, idx.reshape(-1, k), np.asarray(data.shape[:k], np.int64))
    u = upd.reshape((ix.shape[0],) + tuple(data.shape[k:]))
    sel = tuple(ix[:, j] for j in range(k))
    red = _reduction(node)
    if red == "none":
        out[sel] = u
    else:
        _AT[red].at(out, sel, u)
    return [out]


# ------------------------------------------------------------------------------------- OneHot

def _onehot_depth(node: Node, depth: np.ndarray | None) -> int:
    if depth is None or np.asarray(depth).size != 1:
        raise ShapeError(f"node {node.name!r} (OneHot): depth must be a one-element tensor")
    d = int(np.asarray(depth).reshape(-1)[0])
    if d < 1:
        raise ShapeError(f"node {node.name!r} (OneHot): depth {d} < 1")
    return d


def _infer_onehot(node: Node, ins: Infos, consts: dict[str, np.ndarray]) -> list:
    get = const_getter(node, consts, {1: "depth"})
    depth = _onehot_depth(node, get(1))
    idx, vals = ins[0], ins[2]
    assert idx is not None and vals is not None
    rank = len(idx.shape) + 1
    a = _axis(node, int(node.attr("axis", -1)), rank)
    shape = tuple(idx.shape[:a]) + (depth,) + tuple(idx.shape[a:])
    return [(shape, np.dtype(vals.dtype))]


def onehot(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    idx, vals = np.asarray(ins[0]), np.asarray(ins[2]).reshape(-1)
    depth = _onehot_depth(node, ins[1])
    a = _axis(node, int(node.attr("axis", -1)), idx.ndim + 1)
    # indices may be float: ONNX casts them to integers; negative ones count from depth, others stay off
    i = np.asarray(idx).astype(np.int64)
    i = np.where(i < 0, i + depth, i)
    hot = np.expand_dims(i, a) == np.arange(depth).reshape((depth,) + (1,) * (idx.ndim - a))
    return [np.where(hot, vals[1], vals[0]).astype(vals.dtype)]


# ------------------------------------------------------------------------------------- ReverseSequence

def reverse_sequence(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, lens = np.asarray(ins[0]), np.asarray(ins[1]).astype(np.int64).reshape(-1)
    ba, ta = int(node.attr("batch_axis", 1)), int(node.attr("time_axis", 0))
    if {ba, ta} != {0, 1}:
        raise ShapeError(f"node {node.name!r} (ReverseSequence): batch_axis {ba} and time_axis {ta} must be 0 and 1")
    if lens.shape[0] != x.shape[ba] or np.any(lens < 0) or np.any(lens > x.shape[ta]):
        raise KernelError(f"node {node.name!r} (ReverseSequence): sequence_lens {lens.tolist()} do not fit the "
                          f"batch of {x.shape[ba]} and time length {x.shape[ta]}")
    out = np.array(x, copy=True)
    t = ta - 1 if ta > ba else ta  # the time axis once the batch axis is indexed away
    for b, n in enumerate(lens.tolist()):
        sl: list[int | slice] = [slice(None)] * x.ndim
        sl[ba], sl[ta] = b, slice(0, n)
        out[tuple(sl)] = np.flip(x[tuple(sl)], axis=t)
    return [out]


# ------------------------------------------------------------------------------------- TopK

def _topk_k(node: Node, k_in: np.ndarray | None) -> int:
    if _opset(node) < 10:
        return int(node.attr("k", 0))
    if k_in is None or np.asarray(k_in).size != 1:
        raise ShapeError(f"node {node.name!r} (TopK): K must be a one-element tensor")
    return int(np.asarray(k_in).reshape(-1)[0])


def _topk_runtime_k(node: Node, consts: Mapping[str, np.ndarray]) -> bool:
    return _opset(node) >= 10 and len(node.inputs) > 1 and bool(node.inputs[1]) and node.inputs[1] not in consts


def _infer_topk(node: Node, ins: Infos, consts: dict[str, np.ndarray]) -> list:
    x = ins[0]
    assert x is not None
    a = _axis(node, int(node.attr("axis", -1)), len(x.shape))
    if _topk_runtime_k(node, consts):  # a data-dependent shape: the bound is the whole axis
        shape = tuple(x.shape[:a]) + (x.shape[a],) + tuple(x.shape[a + 1:])
        return [(shape, np.dtype(x.dtype)), (shape, np.dtype(np.int64))]
    k_in = None
    if _opset(node) >= 10:
        k_in = const_getter(node, consts, {1: "K"})(1)
    k = _topk_k(node, k_in)
    if not 0 <= k <= x.shape[a]:
        raise ShapeError(f"node {node.name!r} (TopK): k {k} outside 0..{x.shape[a]} (axis {a} of {list(x.shape)})")
    shape = tuple(x.shape[:a]) + (k,) + tuple(x.shape[a + 1:])
    return [(shape, np.dtype(x.dtype)), (shape, np.dtype(np.int64))]


def _sorted_order(v: np.ndarray, largest: bool) -> np.ndarray:
    """Per row of ``v`` (R, m), the order that sorts it descending (``largest``) or ascending, equal values
    keeping their column order (ONNX: ties go to the lower index). Descending is a stable ascending sort of
    the reversed row, reversed back: no negation, which would overflow for the most negative integer."""
    if not largest:
        return np.argsort(v, axis=1, kind="stable")
    m = v.shape[1]
    return (m - 1) - np.argsort(v[:, ::-1], axis=1, kind="stable")[:, ::-1]


#: rows at least this long (and k at most a quarter of them) select before sorting (measured: below, numpy's
#: per-call overhead of the selection outweighs the sort it saves)
_TOPK_SELECT_MIN = 2048


def topk_rows(x2: np.ndarray, k: int, largest: bool) -> np.ndarray:
    """Indices (R, k) of the top ``k`` of each row of ``x2`` (R, n), in ONNX's order.

    With k < n and no NaN, an O(n) selection first: the k-th value by ``np.partition``, every element strictly
    beyond it, and as many elements equal to it as are missing, lowest columns first (the tie rule); only those k
    candidates are sorted. NaN makes the comparisons of the selection inconsistent, so such rows sort whole."""
    r, n = x2.shape
    if k == 0:
        return np.empty((r, 0), np.int64)
    # short rows: the handful of numpy calls of the selection cost more than sorting the row
    if k * 4 <= n and n >= _TOPK_SELECT_MIN and not (x2.dtype.kind == "f" and bool(np.isnan(x2).any())):
        kth = n - k if largest else k - 1
        t = np.partition(x2, kth, axis=1)[:, kth:kth + 1]
        beyond = x2 > t if largest else x2 < t
        eq = x2 == t
        need = k - beyond.sum(axis=1, keepdims=True)
        if np.array_equal(eq.sum(axis=1, keepdims=True), need):  # no tie straddles the k-th value (the usual case)
            sel = beyond | eq
        else:
            sel = beyond | (eq & (np.cumsum(eq, axis=1) <= need))
        cand = np.nonzero(sel)[1].reshape(r, k)  # row-major: ascending columns within each row
    else:
        cand = np.broadcast_to(np.arange(n, dtype=np.int64), (r, n))
    order = _sorted_order(np.take_along_axis(x2, cand, axis=1), largest)
    return np.take_along_axis(cand, order[:, :k], axis=1).astype(np.int64, copy=False)


def topk(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    k = _topk_k(node, ins[1] if len(ins) > 1 else None)
    a = _axis(node, int(node.attr("axis", -1)), x.ndim)
    if not 0 <= k <= x.shape[a]:
        raise KernelError(f"node {node.name!r} (TopK): k {k} outside 0..{x.shape[a]} (axis {a} of {list(x.shape)})")
    # rows along the axis; sorted=0 leaves the order unspecified, so the sorted order is a valid answer
    xm = np.moveaxis(x, a, -1)
    idx = topk_rows(np.ascontiguousarray(xm).reshape(-1, x.shape[a]), k, bool(node.attr("largest", 1)))
    idx = np.moveaxis(idx.reshape(xm.shape[:-1] + (k,)), -1, a)
    return [np.take_along_axis(x, idx, axis=a), np.ascontiguousarray(idx)]


# ------------------------------------------------------------------------------------- registration

def _infer_reverse(node: Node, ins: Infos, consts: dict[str, np.ndarray]) -> list:
    return _infer_same0(node, ins, consts)


def _tensor_scatter_axis(node: Node, rank: int) -> int:
    a = int(node.attr("axis", -2))
    if not -rank <= a < rank or (a % rank) == 0:
        raise ShapeError(f"node {node.name!r} (TensorScatter): axis {a} must name a non-batch axis of the rank-{rank} "
                         "cache")
    return a % rank


def _check_tensor_scatter(node: Node, opset: int) -> None:
    mode = node.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise UnsupportedOpError("TensorScatter", node.name, opset, f"mode {mode!r} (linear or circular)")


def _infer_tensor_scatter(node: Node, ins: Infos, consts: dict[str, np.ndarray]) -> list:
    cache, upd = ins[0], ins[1]
    assert cache is not None and upd is not None
    a = _tensor_scatter_axis(node, len(cache.shape))
    if len(upd.shape) != len(cache.shape) or any(u != c for k, (u, c) in enumerate(zip(upd.shape, cache.shape))
                                                 if k != a) or upd.shape[a] > cache.shape[a]:
        raise ShapeError(f"node {node.name!r} (TensorScatter): update {list(upd.shape)} does not fit cache "
                         f"{list(cache.shape)} along axis {a}")
    return [(tuple(cache.shape), np.dtype(cache.dtype))]


def tensor_scatter(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """ONNX TensorScatter (opset 24): the cache with ``update`` written along ``axis`` from each batch row's
    ``write_indices`` (0 without them); ``circular`` wraps the positions, ``linear`` must fit."""
    cache, upd = np.asarray(ins[0]), np.asarray(ins[1])
    a = _tensor_scatter_axis(node, cache.ndim)
    idx = np.zeros(cache.shape[0], np.int64) if len(ins) < 3 or ins[2] is None else np.asarray(ins[2], np.int64)
    n, length = upd.shape[a], cache.shape[a]
    out = np.array(cache, copy=True)
    circular = node.attr("mode", "linear") == "circular"
    for b in range(cache.shape[0]):
        pos = idx.reshape(-1)[b] + np.arange(n)
        if circular:
            pos = pos % length
        elif n and (pos[0] < 0 or pos[-1] >= length):
            raise ShapeError(f"node {node.name!r} (TensorScatter): batch {b} writes positions {int(pos[0])}.."
                             f"{int(pos[-1])} of a cache of length {length} (mode linear)")
        dst = np.moveaxis(out[b], a - 1, 0)
        dst[pos] = np.moveaxis(upd[b], a - 1, 0)
    return [out]


_COMPUTE: dict[str, Callable[[Node, Sequence[np.ndarray | None]], list[np.ndarray]]] = {
    "GatherElements": gather_elements, "ScatterElements": scatter_elements, "GatherND": gather_nd,
    "ScatterND": scatter_nd, "OneHot": onehot, "ReverseSequence": reverse_sequence, "TopK": topk,
    "TensorScatter": tensor_scatter,
}
_INFER = {"GatherElements": _infer_gather_elements, "ScatterElements": _infer_same0, "GatherND": _infer_gather_nd,
          "ScatterND": _infer_same0, "OneHot": _infer_onehot, "ReverseSequence": _infer_reverse, "TopK": _infer_topk,
          "TensorScatter": _infer_tensor_scatter}
_MIN_OPSET = {"GatherElements": 11, "ScatterElements": 11, "GatherND": 11, "ScatterND": 11, "OneHot": 9,
              "ReverseSequence": 10, "TopK": 1, "TensorScatter": 24}
INDEXING_OPS = tuple(_COMPUTE)


def _reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    # fresh C-ordered copies of the input's rank (ascontiguousarray would make a 0-d result 1-d): folded
    # constants must not be views of other constants
    return [np.array(r, order="C", copy=True) for r in _COMPUTE[node.op](node, inputs)]


_NOTES = {
    "TopK": "a run-time k: outputs sized at run time within the whole axis (the planned bound)",
    "OneHot": "depth must be a constant",
    "ScatterElements": "duplicate indices without a reduction: the last update wins (onnxruntime's behaviour)",
    "ScatterND": "duplicate indices without a reduction: the last update wins (onnxruntime's behaviour)",
}
for _op in INDEXING_OPS:
    register_op(OpSpec(_op, _INFER[_op], _reference, min_opset=_MIN_OPSET[_op],
                       check=_check_reduction if _op in ("ScatterElements", "ScatterND") else
                       _check_tensor_scatter if _op == "TensorScatter" else None,
                       notes=_NOTES.get(_op, ""), bounded=_topk_runtime_k if _op == "TopK" else None))


@register_kernel
class IndexingKernel(Kernel):
    """numpy fancy indexing (``ufunc.at`` for scatter reductions), copied into the arena."""

    name = "numpy"
    ops = INDEXING_OPS

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        res = _COMPUTE[layer.op](layer.node, full_inputs(layer, inputs, params))
        for o, r in zip(outputs, res):
            np.copyto(o, r)


_NATIVE_REDUCTIONS = {"none": 0, "add": 1, "mul": 2, "max": 3, "min": 4}


@register_kernel
class GatherScatterNDNative(Kernel):
    """native/gather.c: GatherND (any element size, batch_dims) and float32 ScatterND (every reduction): one C
    loop over the index tuples, a slice copy or combine each, in order (so duplicates resolve as onnxruntime
    does: the last update wins); numpy's fancy indexing costs more to set up than these small slices take. An
    index out of range sends the run to the numpy oracle, which names it."""

    name = "gathernd_native"
    ops = ("GatherND", "ScatterND")
    priority = 10

    def applies(self, layer: Layer) -> bool:
        d, i = layer.inputs[0], layer.inputs[1] if len(layer.inputs) > 1 else None
        if not native.has("inferd_gather_nd") or d is None or i is None or not i.shape or i.shape[-1] < 1:
            return False
        if np.dtype(i.dtype) != np.int64:
            return False
        if layer.op == "GatherND":
            return np.dtype(d.dtype).kind in "fiub"
        return np.dtype(d.dtype) == np.float32 and _reduction(layer.node) in _NATIVE_REDUCTIONS

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]):  # type: ignore[no-untyped-def]
        """The arena's fixed buffers: one C call a run, its arguments built here (a GatherND of a few hundred
        rows takes about as long as building them per run)."""
        ins = full_inputs(layer, inputs, params)
        y = outputs[0]
        arrs = [a for a in ins if a is not None] + [y]
        if len(ins) < 2 or any(not a.flags.c_contiguous for a in arrs) or ins[1].dtype != np.int64 or \
                ins[0].dtype != y.dtype or any(np.shares_memory(y, a) for a in ins[1:] if a is not None):
            return None
        data, idx = ins[0], ins[1]
        ffi, lib, node = native.ffi, native.lib, layer.node
        q = idx.shape[-1]
        pd, pi, py = (ffi.cast("const void*", data.ctypes.data), ffi.cast("const long long*", idx.ctypes.data),
                      ffi.cast("void*", y.ctypes.data))
        if layer.op == "GatherND":
            b = int(layer.attr("batch_dims", 0))
            nb = math.prod(data.shape[:b])
            dims = np.asarray(data.shape[b:b + q], np.int64)
            args = (pd, ffi.cast("const long long*", dims.ctypes.data), q, nb, math.prod(data.shape[b:]) * data.itemsize,
                    pi, idx.size // max(q, 1) // max(nb, 1), math.prod(data.shape[b + q:]) * data.itemsize, py)
            fn = lib.inferd_gather_nd
        else:
            upd = ins[2] if len(ins) > 2 else None
            if upd is None or upd.dtype != np.float32 or q > data.ndim or \
                    tuple(upd.shape) != tuple(idx.shape[:-1]) + tuple(data.shape[q:]):
                return None
            inplace = y.ctypes.data == data.ctypes.data
            if not inplace and np.shares_memory(y, data):
                return None
            dims = np.asarray(data.shape[:q], np.int64)
            args = (ffi.cast("float*", y.ctypes.data), ffi.NULL if inplace else ffi.cast("const float*", data.ctypes.data),
                    data.size, ffi.cast("const long long*", dims.ctypes.data), q, pi, idx.size // max(q, 1),
                    ffi.cast("const float*", upd.ctypes.data), math.prod(data.shape[q:]),
                    _NATIVE_REDUCTIONS[_reduction(node)])
            fn = lib.inferd_scatter_nd
        keep = (ins, y, dims)

        def call(_keep: Any = keep) -> None:
            if fn(*args) >= 0:
                _COMPUTE[node.op](node, list(ins))  # raises the oracle's error for the index out of range
                raise KernelError(f"node {layer.name!r} ({node.op}): an index tuple is out of range")
        return call

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        ins = full_inputs(layer, inputs, params)
        data, idx = np.ascontiguousarray(ins[0]), np.ascontiguousarray(ins[1], np.int64)
        y = outputs[0]
        ffi, lib = native.ffi, native.lib
        q = idx.shape[-1]
        if layer.op == "GatherND":
            b = int(layer.attr("batch_dims", 0))
            nb = math.prod(data.shape[:b])
            dims = np.asarray(data.shape[b:b + q], np.int64)
            slice_bytes = math.prod(data.shape[b + q:]) * data.itemsize
            o = ContiguousOut(y, data.dtype)
            bad = lib.inferd_gather_nd(ffi.cast("const void*", data.ctypes.data), ffi.cast("const long long*", dims.ctypes.data),
                                       q, nb, math.prod(data.shape[b:]) * data.itemsize,
                                       ffi.cast("const long long*", idx.ctypes.data), idx.size // max(q, 1) // max(nb, 1),
                                       slice_bytes, ffi.cast("void*", o.y.ctypes.data))
        else:
            upd = np.ascontiguousarray(ins[2], np.float32)
            want = tuple(idx.shape[:-1]) + tuple(data.shape[q:])
            if q > data.ndim or tuple(upd.shape) != want:
                np.copyto(y, scatter_nd(layer.node, ins)[0])  # the oracle names the mismatch
                return
            o = ContiguousOut(y, avoid=upd)
            inplace = o.y.ctypes.data == data.ctypes.data
            if not inplace and np.shares_memory(o.y, data):  # a partial overlap: the copy goes through numpy
                np.copyto(o.y, data.copy())
                inplace = True
            dims = np.asarray(data.shape[:q], np.int64)
            bad = lib.inferd_scatter_nd(ffi.cast("float*", o.y.ctypes.data),
                                        ffi.NULL if inplace else ffi.cast("const float*", data.ctypes.data), data.size,
                                        ffi.cast("const long long*", dims.ctypes.data),
                                        q, ffi.cast("const long long*", idx.ctypes.data), idx.size // max(q, 1),
                                        ffi.cast("const float*", upd.ctypes.data), math.prod(data.shape[q:]),
                                        _NATIVE_REDUCTIONS[_reduction(layer.node)])
        if bad >= 0:
            _COMPUTE[layer.op](layer.node, ins)  # raises the oracle's error for the index out of range
            raise KernelError(f"node {layer.name!r} ({layer.op}): index tuple {bad} out of range")
        o.close()
