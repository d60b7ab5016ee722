"""Operators whose output shape depends on input *values*: NonZero, Compress (a run-time condition) and Unique.
TopK with a run-time k is in ``indexing``, NonMaxSuppression in ``detection``; they share the bounds here.

Each op's ``infer`` gives the *upper bound* of every output (``OpSpec.bounded``): the memory plan reserves it and a
run fills a prefix of it (``Kernel.run_bounded``). A bound is the op's worst case, capped at
``max_bound_elems()`` elements per output so that a large input does not reserve a huge arena; a run whose
output would exceed its bound fails that request with a ``KernelError`` naming the node, never writing past it.
"""
from __future__ import annotations

import os
from typing import Mapping, Sequence

import numpy as np

from ..errors import ShapeError
from ..ir import Node, TensorInfo
from .base import Kernel, Layer, OpSpec, register_kernel, register_op

Infos = list["TensorInfo | None"]

#: Default cap on one data-dependent output's planned bound, in elements (``INFERD_MAX_BOUND_ELEMS`` overrides it at
#: import): 16 Mi elements is 128 MiB of int64 indices, more than any detector's post-processing keeps.
DEFAULT_MAX_BOUND_ELEMS = 1 << 24


def max_bound_elems() -> int:
    v = os.environ.get("INFERD_MAX_BOUND_ELEMS", "").strip()
    return max(1, int(v)) if v else DEFAULT_MAX_BOUND_ELEMS


def capped(n: int, per: int = 1) -> int:
    """``n`` rows of ``per`` elements, capped so that the rows hold at most ``max_bound_elems()`` elements."""
    return max(0, min(int(n), max_bound_elems() // max(per, 1)))


def _opset(node: Node) -> int:
    return int(node.attr("_opset", 17))


def _always(node: Node, consts: Mapping[str, np.ndarray]) -> bool:
    return True


# ------------------------------------------------------------------------------------- NonZero

def _infer_nonzero(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x = ins[0]
    assert x is not None
    r = len(x.shape)
    return [((r, capped(x.size, r)), np.dtype(np.int64))]


def nonzero(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    if x.ndim == 0:  # numpy deprecates nonzero of a 0-d array; ONNX gives (0, 1) for a true scalar
        return [np.zeros((0, int(bool(x))), np.int64)]
    return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


# ------------------------------------------------------------------------------------- Compress

def _compress_axis(node: Node, rank: int) -> int | None:
    a = node.attr("axis")
    if a is None:
        return None
    a = int(a)
    if not -rank <= a < rank:
        raise ShapeError(f"node {node.name!r} (Compress): axis {a} out of range for rank {rank}")
    return a + rank if a < 0 else a


def _compress_bounded(node: Node, consts: Mapping[str, np.ndarray]) -> bool:
    return node.inputs[1] not in consts


def _infer_compress(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x, c = ins[0], ins[1]
    assert x is not None and c is not None
    a = _compress_axis(node, len(x.shape))
    dim = x.size if a is None else x.shape[a]
    if node.inputs[1] in consts:
        n = int(np.count_nonzero(np.asarray(consts[node.inputs[1]]).reshape(-1)[:dim]))
    else:
        rest = 1 if a is None else x.size // max(dim, 1)
        n = capped(min(dim, c.size), rest)
    shape = (n,) if a is None else tuple(x.shape[:a]) + (n,) + tuple(x.shape[a + 1:])
    return [(shape, np.dtype(x.dtype))]


def compress(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, c = np.asarray(ins[0]), np.asarray(ins[1]).astype(bool).reshape(-1)
    a = _compress_axis(node, x.ndim)
    dim = x.size if a is None else x.shape[a]
    if c.size > dim:
        raise ShapeError(f"node {node.name!r} (Compress): condition has {c.size} elements, more than the {dim} "
                         f"it selects from")
    return [np.compress(c, x, axis=a)]


# ------------------------------------------------------------------------------------- Unique

def _unique_axis(node: Node, rank: int) -> int | None:
    a = node.attr("axis")
    if a is None:
        return None
    a = int(a)
    if not -rank <= a < rank:
        raise ShapeError(f"node {node.name!r} (Unique): axis {a} out of range for rank {rank}")
    return a + rank if a < 0 else a


def _infer_unique(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x = ins[0]
    assert x is not None
    a = _unique_axis(node, len(x.shape))
    dim = x.size if a is None else x.shape[a]
    rest = 1 if a is None else x.size // max(dim, 1)
    n = capped(dim, rest)
    y = (n,) if a is None else tuple(x.shape[:a]) + (n,) + tuple(x.shape[a + 1:])
    i64 = np.dtype(np.int64)
    return [(y, np.dtype(x.dtype)), ((n,), i64), ((dim,), i64), ((n,), i64)]


def unique(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    a = _unique_axis(node, x.ndim)
    flat = x.reshape(-1) if a is None else x
    y, idx, inv, cnt = np.unique(flat, return_index=True, return_inverse=True, return_counts=True, axis=a)
    inv = inv.reshape(-1)
    if not int(node.attr("sorted", 1)):
        # order of first occurrence: sort the unique values by where they first appear
        order = np.argsort(idx, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y = y[order] if a is None else np.take(y, order, axis=a)
        idx, cnt, inv = idx[order], cnt[order], rank[inv]
    return [np.ascontiguousarray(y), idx.astype(np.int64), inv.astype(np.int64), cnt.astype(np.int64)]


# ------------------------------------------------------------------------------------- registration

_COMPUTE = {"NonZero": nonzero, "Compress": compress, "Unique": unique}


def _reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    return [np.array(r, order="C", copy=True) for r in _COMPUTE[node.op](node, inputs)]


_CAP_NOTE = ("output sized at run time within a planned bound (the worst case, at most INFERD_MAX_BOUND_ELEMS "
             "elements); a run exceeding it fails that request")
register_op(OpSpec("NonZero", _infer_nonzero, _reference, min_opset=9, bounded=_always, notes=_CAP_NOTE))
register_op(OpSpec("Compress", _infer_compress, _reference, min_opset=9, bounded=_compress_bounded,
                   notes="a run-time condition: " + _CAP_NOTE))
register_op(OpSpec("Unique", _infer_unique, _reference, min_opset=11, bounded=_always, notes=_CAP_NOTE))


@register_kernel
class DataDependentKernel(Kernel):
    """numpy (``np.nonzero``, ``np.compress``, ``np.unique``) written into the planned bound."""

    name = "numpy"
    ops = tuple(_COMPUTE)

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        # a static Compress (constant condition): shapes known at import, outputs exactly their buffers
        from .base import full_inputs

        for o, r in zip(outputs, _COMPUTE[layer.op](layer.node, full_inputs(layer, inputs, params))):
            np.copyto(o, r)
