"""Gemm and MatMul: the fully connected layers and the matrix products of attention.

Both honour the fusions recorded by import: ``attrs["residual"]`` (the node's LAST input is added
to the product, after Gemm's bias) and then ``attrs["act"]``.

CPU kernels (all write the product straight into the arena buffer):
  * ``gemm_packed`` (default for float32 with a constant 2-D weight): inferd's native GEMM, the weight
    prepacked at load, bias / residual / native activation applied in its store;
  * ``matmul_native`` (default for float32 MatMul of two activations, e.g. attention): the native GEMM with
    both operands packed per call;
  * ``gemm``: numpy's ``matmul(..., out=)`` with constant B stored as C-contiguous (K, N), ``alpha`` folded in
    (any dtype; the fallback where the native kernels do not apply);
  * ``gemm_nt`` (Gemm with transB=1 only, cold-start friendly): B kept as exported, no transpose in
    ``transform``;
  * ``reference``: the OpSpec's numpy reference.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, ClassVar, Sequence

import numpy as np

from .. import native
from ..errors import ShapeError
from ..ir import Node, TensorInfo
from .activation import apply_act
from .base import (BoundOrOracle, ContiguousOut, Kernel, Layer, OpSpec, full_inputs, raw_key, register_kernel,
                   register_op, weights_key)

__all__ = ["gemm_reference", "matmul_reference", "matmul_shape", "transpose_blocked"]


# --------------------------------------------------------------------------- input layout

def _residual_index(node: Node) -> int | None:
    """Position of the fused residual input (always the last one), or None."""
    return len(node.inputs) - 1 if node.attr("residual", False) else None


def _gemm_c_index(node: Node) -> int | None:
    """Position of Gemm's optional C input (or of the per-column bias fused into a MatMul at import), or None.

    With a fused residual the inputs are [A, B, (C), R], so C exists only if there are 4 inputs
    (or 3 without a residual) and its name is not empty.
    """
    n_core = len(node.inputs) - (1 if node.attr("residual", False) else 0)
    if n_core >= 3 and node.inputs[2]:
        return 2
    return None


def _unidirectional_ok(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    """Whether ``src`` broadcasts to ``dst`` without changing ``dst`` (numpy rules)."""
    if len(src) > len(dst):
        return False
    return all(s in (1, d) for s, d in zip(reversed(src), reversed(dst)))


# --------------------------------------------------------------------------- shape inference

def matmul_shape(a: tuple[int, ...], b: tuple[int, ...], node_name: str = "?") -> tuple[int, ...]:
    """Output shape of numpy/ONNX MatMul for operand shapes ``a`` and ``b``; ShapeError if they do not fit."""
    if len(a) == 0 or len(b) == 0:
        raise ShapeError(f"MatMul {node_name!r}: scalar operand (shapes {a} and {b})")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeError(f"MatMul {node_name!r}: inner dimensions differ: {a} @ {b}")
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        raise ShapeError(f"MatMul {node_name!r}: batch dimensions do not broadcast: {a} @ {b}") from None
    out = tuple(batch) + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return tuple(int(d) for d in out)


def _check_residual(node: Node, ins: list[TensorInfo | None], out: tuple[int, ...]) -> None:
    r = _residual_index(node)
    if r is not None and ins[r] is not None and not _unidirectional_ok(tuple(ins[r].shape), out):
        raise ShapeError(f"{node.op} {node.name!r}: fused residual of shape {ins[r].shape} does not broadcast to "
                         f"the output shape {out}")


def _infer_gemm(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    a, b = ins[0], ins[1]
    if a is None or b is None:
        raise ShapeError(f"Gemm {node.name!r}: inputs A and B are required")
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ShapeError(f"Gemm {node.name!r}: A and B must be 2-D, got {a.shape} and {b.shape}")
    m, k = a.shape[::-1] if node.attr("transA", 0) else a.shape
    k2, n = b.shape[::-1] if node.attr("transB", 0) else b.shape
    if k != k2:
        raise ShapeError(f"Gemm {node.name!r}: inner dimensions differ: A {a.shape} (transA={node.attr('transA', 0)}) "
                         f"and B {b.shape} (transB={node.attr('transB', 0)})")
    out = (int(m), int(n))
    c = _gemm_c_index(node)
    if c is not None and ins[c] is not None and not _unidirectional_ok(tuple(ins[c].shape), out):
        raise ShapeError(f"Gemm {node.name!r}: C of shape {ins[c].shape} does not broadcast to {out}")
    _check_residual(node, ins, out)
    return [(out, a.dtype)]


def _infer_matmul(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    a, b = ins[0], ins[1]
    if a is None or b is None:
        raise ShapeError(f"MatMul {node.name!r}: both inputs are required")
    out = matmul_shape(tuple(a.shape), tuple(b.shape), node.name)
    _check_residual(node, ins, out)
    return [(out, a.dtype)]


# --------------------------------------------------------------------------- numpy references

def _epilogue(node: Node, y: np.ndarray, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    """Fused residual then activation, in place on ``y``."""
    r = _residual_index(node)
    if r is not None:
        np.add(y, inputs[r], out=y, casting="unsafe")
    act = node.attr("act")
    if act is not None:
        apply_act(y, act)
    return y


def gemm_reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """Y = alpha * op(A) @ op(B) + beta * C (+ residual, then act)."""
    a, b = np.asarray(inputs[0]), np.asarray(inputs[1])
    if node.attr("transA", 0):
        a = a.T
    if node.attr("transB", 0):
        b = b.T
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))

    def scaled(v: np.ndarray, f: float) -> np.ndarray:
        # float tensors stay in their precision; integer Gemm scales then casts back
        if f == 1.0:
            return v
        return v * np.asarray(f, v.dtype) if np.issubdtype(v.dtype, np.floating) else (v * f).astype(v.dtype)

    y = scaled(np.matmul(a, b), alpha)
    c = _gemm_c_index(node)
    if c is not None and inputs[c] is not None:
        y = y + scaled(np.asarray(inputs[c]), beta)
    y = np.array(y, dtype=a.dtype, copy=True)
    return [_epilogue(node, y, inputs)]


def matmul_reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """numpy matmul semantics (1-D operands promoted and squeezed, batch dims broadcast), + residual, act."""
    a, b = np.asarray(inputs[0]), np.asarray(inputs[1])
    y = np.array(np.matmul(a, b), dtype=a.dtype, copy=True)
    c = _gemm_c_index(node)
    if c is not None:  # a bias fused at import (MatMul + Add of a per-column constant)
        np.add(y, inputs[c], out=y, casting="unsafe")
    return [_epilogue(node, y, inputs)]


register_op(OpSpec("Gemm", _infer_gemm, gemm_reference))
register_op(OpSpec("MatMul", _infer_matmul, matmul_reference))


# --------------------------------------------------------------------------- MatMul through transposed views

#: inferd's own op: a MatMul of two activations that reads its operands and writes its output through transposed
#: views (attrs ``perm_a``, ``perm_b``: the Transposes of its operands it absorbed; ``perm_y``: the Transpose of its
#: output). The CPU's layout plan inserts it (planner/layout.py, ``absorb_transposes``): attention's k^T and its
#: heads' merge (q k^T reads k as stored; P v writes each head's columns in place) then cost no copy.
MATMUL_T = "inferd.MatMulT"


def _perm(node: Node, key: str, rank: int) -> tuple[int, ...]:
    p = node.attr(key)
    perm = tuple(range(rank)) if p is None else tuple(int(i) for i in p)
    if sorted(perm) != list(range(rank)):
        raise ShapeError(f"{node.op} {node.name!r}: {key} {p} is not a permutation of {rank} axes")
    return perm


def inverse_perm(perm: Sequence[int]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def _infer_matmul_t(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    a, b = ins[0], ins[1]
    if a is None or b is None:
        raise ShapeError(f"{node.op} {node.name!r}: both inputs are required")
    pa, pb = _perm(node, "perm_a", len(a.shape)), _perm(node, "perm_b", len(b.shape))
    prod = matmul_shape(tuple(a.shape[i] for i in pa), tuple(b.shape[i] for i in pb), node.name)
    py = _perm(node, "perm_y", len(prod))
    return [(tuple(prod[i] for i in py), a.dtype)]


def _transposed_operands(node: Node, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return a.transpose(_perm(node, "perm_a", a.ndim)), b.transpose(_perm(node, "perm_b", b.ndim))


def matmul_t_reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    a, b = _transposed_operands(node, np.asarray(inputs[0]), np.asarray(inputs[1]))
    y = np.matmul(a, b)
    return [np.array(y.transpose(_perm(node, "perm_y", y.ndim)), dtype=a.dtype, copy=True)]


register_op(OpSpec(MATMUL_T, _infer_matmul_t, matmul_t_reference,
                   notes="inferd's own: MatMul reading and writing through transposed views (the CPU's layout plan "
                         "absorbs the Transposes around attention's products into it)"))


# --------------------------------------------------------------------------- kernels

def _is_float(layer: Layer) -> bool:
    return layer.inputs[0] is not None and np.issubdtype(np.dtype(layer.inputs[0].dtype), np.floating)


def transpose_blocked(a: np.ndarray, scale: float = 1.0, tile: int = 256) -> np.ndarray:
    """``scale * a.T`` as a new C-contiguous 2-D array, copied tile by tile.

    Both the reads and the writes of a tile stay in cache: for vgg16's 4096 x 25088 fc6 weights
    this takes about 0.3 s against 0.7-1.5 s for ``np.ascontiguousarray(a.T)``.
    """
    r, c = a.shape
    out = np.empty((c, r), a.dtype)
    s = np.asarray(scale, dtype=a.dtype)
    for i in range(0, r, tile):
        for j in range(0, c, tile):
            src = a[i:i + tile, j:j + tile].T
            if scale == 1.0:
                out[j:j + tile, i:i + tile] = src
            else:
                np.multiply(src, s, out=out[j:j + tile, i:i + tile])
    return out


#: Up to this many rows, M matrix-vector products beat one small-M OpenBLAS sgemm (measured at 1 and 2 threads).
_GEMV_MAX_ROWS = 3


class _BlasKernel(Kernel):
    """BLAS through ``np.matmul(..., out=)`` with the epilogue (alpha, bias, residual, act) in place.

    Params: ``w`` (constant B with alpha folded in, laid out by ``_weight``), ``bias`` (constant C
    times beta), ``a`` (constant A as (M, K), rare), plus the raw constants of any other input
    (a constant residual).
    """

    ops: ClassVar[tuple[str, ...]] = ("Gemm", "MatMul")

    def applies(self, layer: Layer) -> bool:
        return _is_float(layer)

    def transform_key(self, layer: Layer) -> tuple[Any, ...]:
        return weights_key(layer)

    def _weight(self, layer: Layer, b: np.ndarray, alpha: float) -> np.ndarray:
        """The stored form of constant B, alpha folded in: (K, N), or (N, K) when ``_keeps_nk``."""
        raise NotImplementedError

    def _keeps_nk(self, layer: Layer) -> bool:
        return False

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        node = layer.node
        out: dict[str, np.ndarray] = {}
        gemm = layer.op == "Gemm"
        dt = np.dtype(layer.outputs[0].dtype)
        alpha = float(node.attr("alpha", 1.0)) if gemm else 1.0
        beta = float(node.attr("beta", 1.0)) if gemm else 1.0
        c = _gemm_c_index(node)
        for key, arr in raw.items():
            k = int(key[2:])
            if k == 1:
                out["w"] = self._weight(layer, arr, alpha)
            elif k == 0:
                a = arr.T if gemm and node.attr("transA", 0) else arr
                out["a"] = np.ascontiguousarray(a)
            elif k == c:
                out["bias"] = (arr * np.asarray(beta, dtype=arr.dtype)).astype(dt, copy=False) if beta != 1.0 \
                    else arr.astype(dt, copy=False)
            else:
                out[key] = arr
        return out

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        node = layer.node
        y = outputs[0]
        gemm = layer.op == "Gemm"
        a = params["a"] if inputs[0] is None else (inputs[0].T if gemm and node.attr("transA", 0) else inputs[0])
        if inputs[1] is None:
            b, alpha_done = params["w"], True
            if self._keeps_nk(layer):
                b = b.T  # BLAS takes the transposed view without a copy
        else:
            b, alpha_done = (inputs[1].T if gemm and node.attr("transB", 0) else inputs[1]), False
        flat_ok = a.ndim == 2 or a.flags.c_contiguous
        if b.ndim == 2 and a.ndim >= 2 and y.ndim >= 2 and y.flags.c_contiguous and flat_ok:
            # all rows in one BLAS call (numpy would loop one gemm per batch entry of a 3-D A) ...
            a2 = a if a.ndim == 2 else a.reshape(-1, a.shape[-1])
            y2 = y if y.ndim == 2 else y.reshape(-1, y.shape[-1])
            if 2 <= a2.shape[0] <= _GEMV_MAX_ROWS:
                # ... except for 2-3 rows, where OpenBLAS's sgemm runs far below memory bandwidth
                # (4096x4096: 2 gemv 4.5 ms vs one gemm 8.7 ms, single thread)
                for i in range(a2.shape[0]):
                    np.matmul(a2[i], b, out=y2[i])
            else:
                np.matmul(a2, b, out=y2)
        else:
            np.matmul(a, b, out=y)
        if gemm:
            alpha = node.attr("alpha", 1.0)
            if not alpha_done and alpha != 1.0:
                np.multiply(y, np.asarray(alpha, dtype=y.dtype), out=y)
        c = _gemm_c_index(node)
        if c is not None:
            if inputs[c] is None:
                np.add(y, params["bias"], out=y)
            else:
                beta = node.attr("beta", 1.0) if gemm else 1.0
                np.add(y, inputs[c] if beta == 1.0 else inputs[c] * np.asarray(beta, dtype=y.dtype), out=y)
        r = _residual_index(node)
        if r is not None:
            np.add(y, params[raw_key(r)] if inputs[r] is None else inputs[r], out=y)
        act = node.attr("act")
        if act is not None:
            apply_act(y, act)


@register_kernel
class GemmKernel(_BlasKernel):
    """Warm-fastest: constant B stored as C-contiguous (K, N) with alpha folded in.

    Measured with numpy's OpenBLAS, ``x @ W[K,N]`` beats ``x @ W[N,K].T`` by up to 40 % for batched
    FC layers and by ~5-10 % at batch 1. The price is a transpose in ``transform`` for Gemm with
    transB=1 (PyTorch exports): ~0.3 s for vgg16 fc6; ``gemm_nt`` skips it.
    """

    name = "gemm"
    priority = 10

    def _weight(self, layer: Layer, b: np.ndarray, alpha: float) -> np.ndarray:
        if layer.op == "Gemm" and layer.attr("transB", 0):
            return transpose_blocked(b, alpha)
        w = b * np.asarray(alpha, dtype=b.dtype) if alpha != 1.0 else b  # new array: raw stays untouched
        # MatMul batch weights (3-D and up) stay as given: numpy loops over them anyway
        return np.ascontiguousarray(w) if w.ndim <= 2 else w


@register_kernel
class GemmNTKernel(_BlasKernel):
    """Cold-start variant for Gemm with transB=1: B kept as stored (N, K), read through a
    transposed view, so ``transform`` copies nothing (unless alpha != 1). Slower warm than ``gemm``
    for batches > 1; about the same at batch 1 (gemv is memory-bound either way)."""

    name = "gemm_nt"
    ops = ("Gemm",)
    priority = 20

    def applies(self, layer: Layer) -> bool:
        return _is_float(layer) and bool(layer.attr("transB", 0)) and 1 in layer.const_inputs

    def _keeps_nk(self, layer: Layer) -> bool:
        return True

    def _weight(self, layer: Layer, b: np.ndarray, alpha: float) -> np.ndarray:
        return b * np.asarray(alpha, dtype=b.dtype) if alpha != 1.0 else b


@register_kernel
class GemmPackedKernel(Kernel):
    """Float32 with a constant 2-D weight: inferd's native GEMM with the weight prepacked at load.

    Y (rows x N) = X (rows x K) @ W (K x N): W is laid out in the GEMM's 96-column panels once, X's rows are
    packed per call, Y is stored row by row with the bias (Gemm's C when it is one row, or a MatMul bias fused
    at import), the residual and native activations applied in the store; alpha and beta are folded at load.
    A few rows (a batch-1 classifier) stream each weight panel once.
    """

    name = "gemm_packed"
    ops: ClassVar[tuple[str, ...]] = ("Gemm", "MatMul")
    priority = 5

    def transform_key(self, layer: Layer) -> tuple[Any, ...]:
        return weights_key(layer)  # the panels depend on (K, N) only, never on the rows

    def applies(self, layer: Layer) -> bool:
        x, w, y = layer.inputs[0], layer.inputs[1] if len(layer.inputs) > 1 else None, layer.outputs[0]
        if x is None or w is None or 1 not in layer.const_inputs or 0 in layer.const_inputs:
            return False
        # (x of shape (): shaped at run time, a detector's box head over its proposals; the CPU executor runs
        # this kernel at the run's shapes with the weights packed at load, runtime.cpu.at_run_shapes)
        if any(np.dtype(t.dtype) != np.float32 for t in (x, w, y)) or len(w.shape) != 2:
            return False
        if layer.op == "Gemm" and layer.attr("transA", 0):
            return False
        c = _gemm_c_index(layer.node)
        if c is not None:
            ct = layer.inputs[c]
            n = w.shape[0] if layer.op == "Gemm" and layer.attr("transB", 0) else w.shape[1]
            # C must be one value per output column (or a scalar): it becomes the GEMM's bias
            if ct is None or c not in layer.const_inputs or int(np.prod(ct.shape)) not in (1, n) \
                    or (len(ct.shape) == 2 and ct.shape[0] != 1):
                return False
        return True

    @staticmethod
    def _kn(layer: Layer) -> tuple[int, int]:
        w = layer.inputs[1]
        assert w is not None
        if layer.op == "Gemm" and layer.attr("transB", 0):
            return w.shape[1], w.shape[0]
        return w.shape[0], w.shape[1]

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        node = layer.node
        gemm = layer.op == "Gemm"
        alpha = float(node.attr("alpha", 1.0)) if gemm else 1.0
        beta = float(node.attr("beta", 1.0)) if gemm else 1.0
        w = np.asarray(raw[raw_key(1)], dtype=np.float32)
        wkn = w.T if gemm and node.attr("transB", 0) else w  # (K, N): a view, gemm_pack_b reads any strides
        if alpha != 1.0:
            wkn = wkn * np.float32(alpha)
        out: dict[str, np.ndarray] = {"w": native.gemm_pack_b(wkn)}
        c = _gemm_c_index(node)
        for key, arr in raw.items():
            k = int(key[2:])
            if k == c:
                out["bias"] = np.ascontiguousarray(
                    np.broadcast_to(np.asarray(arr, np.float32).reshape(-1) * np.float32(beta), (wkn.shape[1],)))
            elif k != 1:
                out[key] = arr
        return out

    def transformed_nbytes(self, layer: Layer) -> int:
        k, n = self._kn(layer)
        p, kk, nbp = native.gemm_packed_b_shape(k, n)
        c = _gemm_c_index(layer.node)
        extra = sum(layer.inputs[i].nbytes for i in layer.const_inputs  # type: ignore[union-attr]
                    if i not in (1, c) and layer.inputs[i] is not None)
        return p * kk * nbp * 4 + (n * 4 if c is not None else 0) + extra

    def _res(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray]
             ) -> np.ndarray | None:
        r = _residual_index(layer.node)
        if r is None:
            return None
        return params[raw_key(r)] if inputs[r] is None else inputs[r]

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        x, y = inputs[0], outputs[0]
        ac = native.native_act(layer.attr("act"))
        if x is None or ac is None or not x.flags.c_contiguous or not y.flags.c_contiguous or y.ndim == 0:
            return None
        k, n = self._kn(layer)
        res = self._res(layer, inputs, params)
        if res is not None:
            if tuple(res.shape) != tuple(y.shape) or res.dtype != np.float32 or not res.flags.c_contiguous:
                return None
            res = res.reshape(-1, n)
        return native.linear_bound(x.reshape(-1, k), params["w"], n, y.reshape(-1, n), params.get("bias"), res, *ac)

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        y, x = outputs[0], inputs[0]
        assert x is not None
        k, n = self._kn(layer)
        x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, k)
        o = ContiguousOut(y)
        yc = o.y
        y2 = yc.reshape(-1, n)
        res = self._res(layer, inputs, params)
        act = layer.attr("act")
        fused = native.native_act(act) is not None and (
            res is None or (tuple(res.shape) == tuple(y.shape) and res.dtype == np.float32))
        native.linear(x2, params["w"], n, y2, params.get("bias"),
                      np.asarray(res).reshape(-1, n) if fused and res is not None else None, act if fused else None)
        if not fused:
            if res is not None:
                np.add(yc, res, out=yc)
            if act is not None:
                apply_act(yc, act)
        o.close()


def _batched_views(a: np.ndarray, b: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``a @ b -> y`` as (Q, M, K) @ (Q, K, N) -> (Q, M, N) views of the same memory (the native GEMM takes one
    batch stride per operand), or None where a batch axis does not collapse without a copy (a reshape's copy is
    new memory, so overlap tells a view from it)."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    try:
        a3, b3, y3 = a.reshape(-1, m, k), b.reshape(-1, k, n), y.reshape(-1, m, n)
    except ValueError:
        return None
    if not (np.may_share_memory(y3, y) and np.may_share_memory(a3, a) and np.may_share_memory(b3, b)):
        return None
    return a3, b3, y3


@register_kernel
class MatMulNativeKernel(Kernel):
    """Float32 MatMul of two activations (attention's Q K^T and P V): inferd's GEMM with both operands packed
    per call, batched over the leading axes when they agree (otherwise numpy's matmul)."""

    name = "matmul_native"
    ops: ClassVar[tuple[str, ...]] = ("MatMul",)
    priority = 6

    def applies(self, layer: Layer) -> bool:
        a, b, y = layer.inputs[0], layer.inputs[1] if len(layer.inputs) > 1 else None, layer.outputs[0]
        if a is None or b is None or layer.const_inputs:
            return False
        if any(np.dtype(t.dtype) != np.float32 for t in (a, b, y)):
            return False
        return len(a.shape) >= 2 and len(b.shape) >= 2 and tuple(a.shape[:-2]) == tuple(b.shape[:-2])

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        """The batched views and the GEMM's arguments resolved now, for a product without a fused residual or
        activation: run() spent 65-77 us a call outside the native job on reshapes, overlap checks and argument
        plumbing (vit_tiny's 24 attention products: ~1.2 ms of its ~20)."""
        a, b, y = inputs[0], inputs[1], outputs[0]
        if a is None or b is None or layer.attr("act") is not None or _residual_index(layer.node) is not None:
            return None
        v = _batched_views(a, b, y)
        return None if v is None else native.matmul_bound(*v)

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        a, b, y = inputs[0], inputs[1], outputs[0]
        assert a is not None and b is not None
        v = _batched_views(a, b, y)
        if v is not None:
            native.matmul(*v)
        else:
            np.matmul(a, b, out=y)
        _epilogue(layer.node, y, [*inputs[:2]] + [params.get(raw_key(i)) if inputs[i] is None else inputs[i]
                                                   for i in range(2, len(inputs))])


@register_kernel
class MatMulTransposedKernel(BoundOrOracle):
    """:data:`MATMUL_T` on the native GEMM, which packs both operands per call and so reads them, and writes its
    output, at any strides: the transposed views cost nothing. Named as MatMul's native kernel, so a package that
    recorded ``matmul_native`` for the MatMul this node replaced still finds it. Where the batch axes of a view do
    not collapse into one (the layout plan absorbs no such Transpose), the oracle."""

    name = "matmul_native"
    ops: ClassVar[tuple[str, ...]] = (MATMUL_T,)
    priority = 6

    def applies(self, layer: Layer) -> bool:
        return all(t is not None and np.dtype(t.dtype) == np.float32
                   for t in (layer.inputs[0], layer.inputs[1], layer.outputs[0]))

    @staticmethod
    def _views(layer: Layer, inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        at, bt = _transposed_operands(layer.node, a, b)
        y = outputs[0]
        return at, bt, y.transpose(inverse_perm(_perm(layer.node, "perm_y", y.ndim)))

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        at, bt, yt = self._views(layer, inputs, outputs)
        if at.ndim < 2 or bt.ndim < 2 or at.shape[:-2] != bt.shape[:-2]:
            return None
        v = _batched_views(at, bt, yt)
        return None if v is None else native.matmul_bound(*v)

    def oracle(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray]) -> np.ndarray:
        return matmul_t_reference(layer.node, list(inputs[:2]))[0]


@register_kernel
class GemmReferenceKernel(Kernel):
    """The OpSpec's numpy reference (any dtype): the oracle kernels are tested against."""

    name = "reference"
    ops = ("Gemm", "MatMul")
    priority = 100


# --------------------------------------------------------------------------- Einsum
# numpy.einsum is the oracle and the CPU kernel for every equation (``optimize=True`` contracts through BLAS where
# it can); EinsumGemmKernel lowers the matmul-shaped two-operand equations (attention's) to the packed GEMM.

def _einsum_equation(node: Node) -> str:
    eq = node.attr("equation", "")
    eq = eq.decode() if isinstance(eq, bytes) else str(eq)
    return eq.replace(" ", "")


def einsum_shape(node: Node, shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """The output shape of ``node``'s equation over inputs of ``shapes`` (numpy's rules: labels must agree,
    ellipsis dimensions broadcast; an implicit output is the ellipsis then the labels used once, sorted)."""
    eq = _einsum_equation(node)
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")

    def bad(why: str) -> ShapeError:
        return ShapeError(f"node {node.name!r} (Einsum): equation {eq!r} on inputs {[list(s) for s in shapes]}: {why}")

    if len(terms) != len(shapes):
        raise bad(f"{len(terms)} operands in the equation")
    dims: dict[str, int] = {}
    ell: tuple[int, ...] = ()
    count: dict[str, int] = {}
    for t, s in zip(terms, shapes):
        if "..." in t:
            pre, post = t.split("...", 1)
            n_ell = len(s) - len(pre) - len(post)
            if n_ell < 0:
                raise bad(f"term {t!r} has more labels than dimensions")
            try:
                ell = tuple(int(d) for d in np.broadcast_shapes(ell, tuple(s[len(pre):len(pre) + n_ell])))
            except ValueError:
                raise bad("ellipsis dimensions do not broadcast") from None
            labelled = list(zip(pre, s[:len(pre)])) + list(zip(post, s[len(s) - len(post):]))
        else:
            if len(t) != len(s):
                raise bad(f"term {t!r} has {len(t)} labels for {len(s)} dimensions")
            labelled = list(zip(t, s))
        for ch, d in labelled:
            if not ch.isalpha():
                raise bad(f"label {ch!r} is not a letter")
            count[ch] = count.get(ch, 0) + 1
            if ch in dims and dims[ch] != d:
                # numpy broadcasts a label of size 1 against another size
                if 1 not in (dims[ch], d):
                    raise bad(f"label {ch!r} is {dims[ch]} and {d}")
                d = max(d, dims[ch])
            dims[ch] = int(d)
    if not arrow:
        rhs = ("..." if any("..." in t for t in terms) else "") + "".join(sorted(c for c, n in count.items() if n == 1))
    out: list[int] = []
    pre, sep, post = rhs.partition("...")
    for ch in pre:
        if ch not in dims:
            raise bad(f"output label {ch!r} is not an input label")
        out.append(dims[ch])
    if sep:
        out.extend(ell)
        for ch in post:
            if ch not in dims:
                raise bad(f"output label {ch!r} is not an input label")
            out.append(dims[ch])
    return tuple(out)


def _infer_einsum(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    present = [i for i in ins if i is not None]
    return [(einsum_shape(node, [tuple(i.shape) for i in present]), np.dtype(present[0].dtype))]


def einsum_reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    xs = [np.asarray(x) for x in inputs if x is not None]
    dt = xs[0].dtype
    if dt.kind == "V" or (dt.kind == "f" and dt.itemsize == 2 and dt != np.float16):
        xs = [x.astype(np.float32) for x in xs]  # bfloat16 (opset 28; an ml_dtypes type einsum refuses): in float32
    r = np.einsum(_einsum_equation(node), *xs, optimize=len(xs) > 2)
    # asarray keeps a 0-d result (a trace, a full contraction) 0-d, which ascontiguousarray would not
    return [np.asarray(np.asarray(r).astype(dt, copy=False), order="C")]


register_op(OpSpec("Einsum", _infer_einsum, einsum_reference, min_opset=12,
                   notes="two-operand batched matrix products lowered to the packed GEMM; numpy.einsum otherwise"))


@functools.lru_cache(maxsize=256)
def einsum_labels(eq: str, sa: tuple[int, ...], sb: tuple[int, ...], implicit: bool = False) -> tuple | None:
    """The labels of a two-operand Einsum ``eq`` over shapes ``sa``, ``sb`` that is one batched matrix product:
    (A's term, B's term, the output's labels, batch, free-A, free-B and contracted labels, each label's size), or
    None for an ellipsis, a repeated label (diagonal), a label summed within one operand, sizes that broadcast, or
    (unless ``implicit``) an equation without ``->`` (its output then: the labels used once, sorted, numpy's rule).
    The CPU's ``einsum_plan`` and the Vulkan lowering (``gemm_vulkan.einsum_as_gemm``) both start from it."""
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if (not arrow and not implicit) or "..." in eq or len(terms) != 2:
        return None
    if not arrow:
        rhs = "".join(sorted(c for c in set(lhs) - {","} if lhs.count(c) == 1))
    ta, tb = terms
    if len(ta) != len(sa) or len(tb) != len(sb) or any(len(set(t)) != len(t) for t in (ta, tb, rhs)):
        return None
    size = dict(zip(ta, sa))
    for ch, d in zip(tb, sb):
        if size.setdefault(ch, d) != d:
            return None
    if any(ch not in size for ch in rhs):
        return None
    for t, other in ((ta, tb), (tb, ta)):
        if any(ch not in rhs and ch not in other for ch in t):
            return None  # summed within one operand
    batch = [c for c in rhs if c in ta and c in tb]
    fa = [c for c in rhs if c in ta and c not in tb]
    fb = [c for c in rhs if c in tb and c not in ta]
    contr = [c for c in ta if c in tb and c not in rhs]
    return ta, tb, rhs, batch, fa, fb, contr, size


def einsum_plan(eq: str, sa: tuple[int, ...], sb: tuple[int, ...]) -> tuple | None:
    """How ``eq`` over shapes ``sa``, ``sb`` runs as one batched GEMM: the permutations that bring A to (batch,
    free-A, contracted) and B to (batch, contracted, free-B), the (Q, M, K, N) sizes, the natural (batch, free-A,
    free-B) result shape and the permutation from it to the equation's output order. None where it is not one
    batched matrix product (``einsum_labels``)."""
    labels = einsum_labels(eq, sa, sb)
    if labels is None:
        return None
    ta, tb, rhs, batch, fa, fb, contr, size = labels
    pa = tuple(ta.index(c) for c in batch + fa + contr)
    pb = tuple(tb.index(c) for c in batch + contr + fb)
    nat = batch + fa + fb
    prod = lambda ls: math.prod(size[c] for c in ls)  # noqa: E731
    return (pa, pb, (prod(batch), prod(fa), prod(contr), prod(fb)), tuple(size[c] for c in nat),
            tuple(nat.index(c) for c in rhs))


@register_kernel
class EinsumKernel(Kernel):
    """numpy.einsum into the arena output."""

    name = "numpy"
    ops = ("Einsum",)


@register_kernel
class EinsumGemmKernel(Kernel):
    """Float32 two-operand Einsum that is one batched matrix product ("bhqd,bhkd->bhqk", "bhqk,bhkd->bhqd",
    "bij,bjk->bik", "bnd,dk->bnk" ...): the operands as (Q, M, K) and (Q, K, N) strided views (a copy only where
    the labels do not merge), inferd's GEMM with both packed per call (:func:`native.matmul`), the result written
    straight into the output when its labels are in (batch, free-A, free-B) order."""

    name = "einsum_gemm"
    ops = ("Einsum",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        ts = [t for t in layer.inputs if t is not None]
        if not native.AVAILABLE or len(ts) != 2 or any(np.dtype(t.dtype) != np.float32 for t in ts):
            return False
        return einsum_plan(_einsum_equation(layer.node), tuple(ts[0].shape), tuple(ts[1].shape)) is not None

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        a, b = (np.asarray(x) for x in full_inputs(layer, inputs, params) if x is not None)
        y = outputs[0]
        plan = einsum_plan(_einsum_equation(layer.node), a.shape, b.shape)
        if plan is None or a.dtype != np.float32 or b.dtype != np.float32 or 0 in a.shape or 0 in b.shape:
            np.copyto(y, einsum_reference(layer.node, [a, b])[0])  # run-time shapes the plan does not cover
            return
        pa, pb, (q, m, k, n), nat, out_perm = plan
        a3 = a.transpose(pa).reshape(q, m, k)
        b3 = b.transpose(pb).reshape(q, k, n)
        direct = out_perm == tuple(range(len(out_perm))) and y.flags.c_contiguous
        y3 = y.reshape(q, m, n) if direct else np.empty((q, m, n), np.float32)
        native.matmul(a3, b3, y3)
        if not direct:
            np.copyto(y, y3.reshape(nat).transpose(out_perm))
