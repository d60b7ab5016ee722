"""Vulkan kernels for Gemm and MatMul (batched, broadcast), with bias, fused residual and activation.

``vk_matmul`` (priority 10): ``matmul.comp`` (64x64 shared-memory tiles, operands read through
strides so transposes cost nothing; split-K over workgroups plus ``splitk_reduce.comp`` when there
are few output tiles), or ``gemv.comp`` when there are at most 4 rows and no batch (fully connected
layers at batch 1: one invocation per output column, B read row-contiguously).
``vk_matmul_reg`` (15): the same with 4x4 register blocks and no shared memory (default on CPU-type
devices). ``vk_gemv_nk`` (4): Gemm transB=1 with at most 4 rows, weights used as stored ([N, K]).

Constant B (the weights) is stored (K, N) row-major. Weights larger than MAX_BINDING_BYTES (2^27,
the smallest maxStorageBufferRange a device may have; vgg16's fc6 is 411 MB) are stored in column
chunks, (chunks, K, Nc), and each chunk is its own dispatch writing its slice of the output.
Gemm's constant C becomes a bias times beta: per column, per row or a full matrix.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from ..vulkan.kernel import (MAX_BINDING_BYTES, UNUSABLE_PRIORITY, Caps, Dispatch, In, Out, Param, Ref, VulkanKernel,
                             Ws, act_of, act_supported, collapse, contiguous_strides, grid, harith, split_k)
from .base import Layer, register_kernel, weights_key
from .gemm import _gemm_c_index, _residual_index

F32 = np.float32
GEMV_MAX_ROWS = 4


def _chunk_cols(k: int, n: int) -> int:
    """Columns per weight chunk: all of them if they fit one binding, else the largest multiple of 64 that does."""
    if k * n * 4 <= MAX_BINDING_BYTES:
        return n
    return max(64, (MAX_BINDING_BYTES // (4 * k)) // 64 * 64)


class _Plan:
    """Resolved GEMM geometry of a Gemm/MatMul layer."""

    def __init__(self, layer: Layer) -> None:
        node = layer.node
        self.gemm = gemm = layer.op == "Gemm"
        a_shape, b_shape = tuple(layer.in_shape(0)), tuple(layer.in_shape(1))
        self.b_const = 1 in layer.const_inputs
        self.a_const = 0 in layer.const_inputs
        if gemm:
            ta, tb = int(node.attr("transA", 0)), int(node.attr("transB", 0))
            self.M, self.K = (a_shape[1], a_shape[0]) if ta else a_shape
            self.N = b_shape[0] if tb else b_shape[1]
            self.sa_m, self.sa_k = (1, a_shape[1]) if ta else (a_shape[1], 1)
            self.sb_k, self.sb_n = (1, b_shape[1]) if tb else (b_shape[1], 1)
            self.batch: list[int] = [1]
            self.sa_b: list[int] = [0]
            self.sb_b: list[int] = [0]
            self.alpha = float(node.attr("alpha", 1.0))
        else:
            a2 = (1,) + a_shape if len(a_shape) == 1 else a_shape
            b2 = b_shape + (1,) if len(b_shape) == 1 else b_shape
            self.M, self.K = a2[-2], a2[-1]
            self.N = b2[-1]
            self.sa_m, self.sa_k = self.K, 1
            self.sb_k, self.sb_n = self.N, 1
            self.alpha = 1.0
            ab, bb = a2[:-2], b2[:-2]
            r = max(len(ab), len(bb))
            ab, bb = (1,) * (r - len(ab)) + ab, (1,) * (r - len(bb)) + bb
            ob = tuple(max(x, y) for x, y in zip(ab, bb))
            if len(bb) == 0 or all(d == 1 for d in bb):
                # B has no batch: fold A's (contiguous) batch into the rows, one big GEMM
                self.M *= math.prod(ob) if ob else 1
                ob = ()
            sa = contiguous_strides(ab)
            sb = contiguous_strides(bb)
            a_bs = [0 if ab[d] == 1 else sa[d] * self.M * self.K for d in range(len(ob))]
            b_bs = [0 if bb[d] == 1 else sb[d] * self.K * self.N for d in range(len(ob))]
            o_bs = contiguous_strides(ob)
            dims, (a_bs, b_bs, _) = collapse(ob, a_bs, b_bs, o_bs) if ob else ([1], [[0], [0], [1]])
            self.batch, self.sa_b, self.sb_b = dims, a_bs, b_bs
        self.nbatch = math.prod(self.batch)
        self.nc = _chunk_cols(self.K, self.N) if self.b_const and self.nbatch == 1 else self.N
        self.chunks = -(-self.N // self.nc)
        self.c_index = _gemm_c_index(node)  # Gemm's C, or a bias fused into a MatMul at import
        self.r_index = _residual_index(node)
        self.gemv = self.nbatch == 1 and self.M <= GEMV_MAX_ROWS


#: the last layers' plans, by the layer object (held here, so its id is not reused while cached): a planner asks
#: one layer's kernel for its transformed size, workspace, split and dispatches in turn, each of which needs the
#: plan (~11 us; five of them made most of a Vulkan whole-model prediction's time per MatMul). A layer's node is
#: fused before its layer is made, so a layer's plan does not change.
_PLANS: dict[int, tuple[Layer, _Plan]] = {}
_PLANS_MAX = 256


def _plan(layer: Layer) -> _Plan:
    hit = _PLANS.get(id(layer))
    if hit is not None and hit[0] is layer:
        return hit[1]
    p = _Plan(layer)
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[id(layer)] = (layer, p)
    return p


@register_kernel
class VkMatMul(VulkanKernel):
    name = "vk_matmul"
    ops = ("Gemm", "MatMul")
    priority = 10
    shader = "matmul"
    registers = False
    half_params = ("B",)

    def wfp(self, layer: Layer) -> int:
        mode = super().wfp(layer)
        if not mode:
            return 0
        p = _plan(layer)
        # only constant weights are stored in fp16, and chunk offsets must stay binding-aligned
        if not p.b_const or (p.chunks > 1 and (2 * p.K * p.nc) % 256):
            return 0
        return mode

    def applies(self, layer: Layer) -> bool:
        if not act_supported(layer):
            return False
        try:
            p = _plan(layer)
        except Exception:
            return False
        if len(p.batch) > 3:
            return False
        if p.r_index is not None and tuple(layer.in_shape(p.r_index)) != tuple(layer.out_shape()):
            return False
        if p.c_index is not None and p.c_index not in layer.const_inputs:
            if tuple(layer.in_shape(p.c_index)) != (p.M, p.N):
                return False
        return True

    def _split(self, layer: Layer) -> tuple[int, int]:
        """(splits, K per split) for a tiled GEMM with few output tiles (GPU variant, unchunked B)."""
        p = _plan(layer)
        if self.registers or p.gemv or p.chunks > 1:
            return 1, p.K
        return split_k(-(-p.N // 64) * -(-p.M // 64) * p.nbatch, p.K)

    def workspace_parts(self, layer: Layer) -> dict[str, int]:
        s, _ = self._split(layer)
        return {"part": 4 * s * layer.outputs[0].size} if s > 1 else {}

    def transform_key(self, layer: Layer) -> tuple[Any, ...]:
        # B's chunking and a bias broadcast to whole rows depend on more than the weights
        p = _plan(layer)
        rows = p.M if p.c_index is not None and p.c_index in layer.const_inputs and \
            self._bias_mode(tuple(layer.in_shape(p.c_index)), p) != 1 else None
        return weights_key(layer) + (p.nbatch, p.nc, p.chunks, rows)

    def transformed_nbytes(self, layer: Layer) -> int:
        p = _plan(layer)
        n = sum((self.wbytes(layer) if k == 1 else 4) * layer.inputs[k].size  # type: ignore[union-attr]
                for k in layer.const_inputs if layer.inputs[k] is not None)
        if p.c_index is not None and p.c_index in layer.const_inputs:
            n += 4 * p.M * p.N  # at most a full bias matrix
        return n

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        p = _plan(layer)
        node = layer.node
        out: dict[str, np.ndarray] = {}
        for key, arr in raw.items():
            k = int(key[2:])
            if k == 1:
                b = np.asarray(arr, dtype=F32)
                if p.gemm and node.attr("transB", 0):
                    b = b.T
                if p.nbatch == 1:
                    b = b.reshape(p.K, p.N)
                    if p.chunks > 1:
                        parts = [b[:, c * p.nc:(c + 1) * p.nc].reshape(-1) for c in range(p.chunks)]
                        out["B"] = np.ascontiguousarray(np.concatenate(parts))
                        continue
                out["B"] = np.ascontiguousarray(b)
            elif k == p.c_index:
                beta = float(node.attr("beta", 1.0))
                c = np.asarray(arr, dtype=np.float64) * beta
                out["bias"] = self._bias_array(c, p)
            else:
                out[key] = np.ascontiguousarray(arr, dtype=F32)
        return self.stored(layer, out)

    @staticmethod
    def _bias_mode(shape: tuple[int, ...], p: _Plan) -> int:
        s = (1,) * (2 - len(shape)) + tuple(shape)
        if s[0] == 1:
            return 1          # per column (or scalar, broadcast to a row)
        if s[1] == 1:
            return 2          # per row
        return 3              # full (M, N)

    def _bias_array(self, c: np.ndarray, p: _Plan) -> np.ndarray:
        mode = self._bias_mode(c.shape, p)
        s = c.reshape((1,) * (2 - c.ndim) + c.shape)
        if mode == 1:
            return np.ascontiguousarray(np.broadcast_to(s, (1, p.N)).reshape(p.N), dtype=F32)
        if mode == 2:
            return np.ascontiguousarray(np.broadcast_to(s, (p.M, 1)).reshape(p.M), dtype=F32)
        return np.ascontiguousarray(np.broadcast_to(s, (p.M, p.N)), dtype=F32)

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        p = _plan(layer)
        act = act_of(layer)
        if p.c_index is None:
            bias_mode, bias_ref = 0, None
        elif p.c_index in layer.const_inputs:  # transform made "bias" of it (asking params would transform)
            bias_mode, bias_ref = self._bias_mode(tuple(layer.in_shape(p.c_index)), p), Param("bias")
            if p.gemm and float(layer.attr("beta", 1.0)) == 0.0:
                bias_mode, bias_ref = 0, None
        else:
            bias_mode, bias_ref = 3, In(p.c_index)
            if float(layer.attr("beta", 1.0)) != 1.0:
                raise ValueError("a dynamic Gemm C needs beta == 1")
        res = (In(p.r_index),) if p.r_index is not None else ()
        defs = {"BIAS_MODE": bias_mode, "RESIDUAL": int(bool(res)), "ACT": act[0]}
        esize = self.wbytes(layer)
        if self.wfp(layer):
            defs["BFP"] = self.wfp(layer)
        a_ref: Ref = In(0)
        out = []
        for c in range(p.chunks):
            n0 = c * p.nc
            nc = min(p.nc, p.N - n0)
            if p.b_const:
                b_ref: Ref = Param("B", offset=esize * p.K * n0, size=esize * p.K * nc) if p.chunks > 1 else Param("B")
                sb_k, sb_n = (nc, 1) if p.nbatch == 1 else (p.sb_k, p.sb_n)
            else:
                b_ref, sb_k, sb_n = In(1), p.sb_k, p.sb_n
            binds = (a_ref, b_ref) + ((bias_ref,) if bias_ref is not None else ()) + res + (Out(0),)
            push = {"M": p.M, "N": nc, "K": p.K, "sa_m": p.sa_m, "sa_k": p.sa_k, "sb_k": sb_k, "sb_n": sb_n,
                    "ldc": p.N, "c_off": n0, "alpha": p.alpha, "act_a": act[1], "act_b": act[2]}
            if p.gemv:
                out.append(Dispatch("gemv", binds, grid(nc, 64, caps), dict(defs, MAXM=GEMV_MAX_ROWS), push=push,
                                    independent=True))
            else:
                bd = [1] * (3 - len(p.batch)) + list(p.batch)
                sa = [0] * (3 - len(p.sa_b)) + list(p.sa_b)
                sb = [0] * (3 - len(p.sb_b)) + list(p.sb_b)
                push.update(bd1=bd[1], bd2=bd[2], sa0=sa[0], sa1=sa[1], sa2=sa[2], sb0=sb[0], sb1=sb[1], sb2=sb[2])
                if self.registers:
                    groups = (-(-(-(-nc // 4) * -(-p.M // 4)) // 64), 1, p.nbatch)
                    out.append(Dispatch(self.shader, binds, groups, defs, push=push, independent=True))
                    continue
                s, kc = self._split(layer)
                total = p.nbatch * p.M * p.N
                push.update(S=s, Kc=kc, total=total)
                defs = dict(defs, **harith(layer, caps))
                groups = (-(-nc // 64), -(-p.M // 64), p.nbatch * s)
                if s == 1:
                    out.append(Dispatch(self.shader, binds, groups, defs, push=push, independent=True))
                    continue
                # split-K: partial sums into the workspace, then one reduction with the epilogue
                out.append(Dispatch(self.shader, (a_ref, b_ref, Ws("part")), groups,
                                    dict(defs, SPLITK=1, BIAS_MODE=0, RESIDUAL=0, ACT=0), push=push))
                div, mod = {0: (1, 1), 1: (1, p.N), 2: (p.N, p.M), 3: (1, p.M * p.N)}[bias_mode]
                out.append(Dispatch("splitk_reduce", (Ws("part"),) + ((bias_ref,) if bias_ref is not None else ())
                                    + res + (Out(0),), grid(total, 256, caps),
                                    {"HAS_BIAS": int(bias_ref is not None), "RESIDUAL": int(bool(res)), "ACT": act[0]},
                                    push={"total": total, "S": s, "DIV": div, "MOD": mod, "act_a": act[1],
                                          "act_b": act[2]}))
        return out


@register_kernel
class VkMatMulReg(VkMatMul):
    """``vk_matmul`` with 4x4 register blocks instead of shared-memory tiles: the default on CPU-type
    devices (lavapipe), where workgroup barriers are coroutine switches."""

    name = "vk_matmul_reg"
    priority = 15
    shader = "matmul_reg"
    registers = True

    def device_priority(self, caps: Caps, layer: Layer | None = None) -> int:
        return 5 if caps.device_type == "cpu" else self.priority


@register_kernel
class VkGemvNK(VkMatMul):
    """Fully connected layers with at most 4 rows whose weights come as [N, K] (Gemm transB=1, as
    PyTorch exports Linear): ``gemv_nk.comp``, one workgroup per output column reading its weight row
    contiguously. The weights are used as stored (row chunks are plain sub-ranges), so the load-time
    transform is a no-op instead of a 400 MB transpose on vgg16."""

    name = "vk_gemv_nk"
    priority = 4

    def applies(self, layer: Layer) -> bool:
        if layer.op != "Gemm" or not int(layer.attr("transB", 0)) or 1 not in layer.const_inputs:
            return False
        if not super().applies(layer):
            return False
        p = _plan(layer)
        return p.gemv

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = super().transform(layer, {k: v for k, v in raw.items() if k != "in1"})
        out["B"] = np.ascontiguousarray(raw["in1"], dtype=F32)  # [N, K] as given
        return self.stored(layer, out)

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        p = _plan(layer)
        base = super().dispatches(layer, params, caps)  # bias/residual bindings and defines
        out = []
        for c, d in enumerate(base):
            n0 = c * p.nc
            nc = min(p.nc, p.N - n0)
            esize = self.wbytes(layer)
            b_ref = Param("B", offset=esize * p.K * n0, size=esize * p.K * nc) if p.chunks > 1 else Param("B")
            binds = (d.bindings[0], b_ref) + d.bindings[2:]
            push = dict(d.push, sb_k=1, sb_n=p.K)
            # vector loads need K % 4 == 0 and A's rows starting on 16 bytes (B's chunk offsets then do too)
            vec = int(p.K % 4 == 0 and p.sa_k == 1 and (p.M == 1 or p.sa_m % 4 == 0))
            out.append(Dispatch("gemv_nk", binds, grid(nc, 1, caps), dict(d.defines, VEC4=vec), push=push,
                                independent=True))
        return out


@register_kernel
class VkGemvNKTex(VkGemvNK):
    """``vk_gemv_nk`` for CPU-type devices: ``gemv_tex.comp`` reads the weights and the input rows
    through RGBA32F texel views (on lavapipe a gather, where a storage-buffer load is a per-lane loop
    and a barrier a coroutine switch: resnet50's fc 22 -> ~1 ms). K must be a multiple of 4, A
    contiguous, B in one binding."""

    name = "vk_gemv_nk_tex"
    priority = 200

    def device_priority(self, caps: Caps, layer: Layer | None = None) -> int:
        return 3 if caps.device_type == "cpu" else UNUSABLE_PRIORITY

    def applies(self, layer: Layer) -> bool:
        if not super().applies(layer):
            return False
        p = _plan(layer)
        return (p.K % 4 == 0 and p.chunks == 1 and p.sa_k == 1 and (p.M == 1 or p.sa_m % 4 == 0)
                and 0 not in layer.const_inputs)

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        p = _plan(layer)
        out = []
        for d in super().dispatches(layer, params, caps):
            out.append(Dispatch("gemv_tex", d.bindings, grid(p.N, 16, caps), d.defines, push=d.push,
                                independent=d.independent))
        return out


def batched_gemm_dispatch(a_ref: Ref, b_ref: Ref, y_ref: Ref, m: int, n: int, k: int, sa: tuple[int, int],
                          sb: tuple[int, int], batch: tuple[int, int, int], sa_b: tuple[int, int, int],
                          sb_b: tuple[int, int, int], caps: Caps, alpha: float = 1.0, bias_ref: Ref | None = None,
                          ) -> Dispatch:
    """One strided batched GEMM y[z] = alpha * a[z] @ b[z] (+ a full (m, n) bias shared by every z) on
    ``matmul.comp`` (``matmul_reg.comp`` on CPU-type devices, as vk_matmul_reg is their default), for kernels that
    lower an op to matrix products (attention). ``sa``/``sb``: (row, column) element strides of a and b; ``batch``:
    up to 3 batch dims with a's and b's element strides per dim (0: broadcast); y is contiguous (z, m, n)."""
    regs = caps.device_type == "cpu"
    defs = {"BIAS_MODE": 3 if bias_ref is not None else 0, "RESIDUAL": 0, "ACT": 0}
    push: dict[str, Any] = {"M": m, "N": n, "K": k, "sa_m": sa[0], "sa_k": sa[1], "sb_k": sb[0], "sb_n": sb[1],
                            "ldc": n, "c_off": 0, "alpha": alpha, "act_a": 0.0, "act_b": 0.0,
                            "bd1": batch[1], "bd2": batch[2], "sa0": sa_b[0], "sa1": sa_b[1], "sa2": sa_b[2],
                            "sb0": sb_b[0], "sb1": sb_b[1], "sb2": sb_b[2]}
    nbatch = batch[0] * batch[1] * batch[2]
    binds = (a_ref, b_ref) + ((bias_ref,) if bias_ref is not None else ()) + (y_ref,)
    if regs:
        return Dispatch("matmul_reg", binds, (-(-(-(-n // 4) * -(-m // 4)) // 64), 1, nbatch), defs, push=push)
    push.update(S=1, Kc=k, total=nbatch * m * n)
    return Dispatch("matmul", binds, (-(-n // 64), -(-m // 64), nbatch), defs, push=push)


def einsum_as_gemm(layer: Layer) -> tuple | None:
    """An Einsum of two operands that is one strided batched GEMM, as its (first operand, second operand, M, N, K,
    (first's m, k strides), (second's k, n strides), batch dims, first's and second's batch strides), or None.

    It is one when the output is the batch labels (those of both operands and the output; at most 3) followed by
    the first operand's free labels then the second's (or the other way round: the operands then swap roles), every
    other label is contracted, and each group of labels (free ones, contracted ones) sits adjacent and in one order in
    each operand, so that it reads as one dimension with one stride: MaxViT's 'bhid,bhjd->bhij' and the plain
    'bij,bjk->bik' are; a trace, a diagonal, a sum over one operand's own label, or an ellipsis are not."""
    from .gemm import _einsum_equation, einsum_labels

    if len(layer.node.inputs) != 2:
        return None
    shapes = [tuple(layer.in_shape(0)), tuple(layer.in_shape(1))]
    labels = einsum_labels(_einsum_equation(layer.node), shapes[0], shapes[1], implicit=True)
    if labels is None or len(labels[3]) > 3:
        return None
    a, b, rhs, batch, m, n, k, size = labels
    terms = [a, b]
    nb = len(batch)
    if rhs[:nb] != "".join(batch):
        return None
    rest = rhs[nb:]
    if rest == "".join(m + n):
        first, second, mg, ng = 0, 1, m, n
    elif rest == "".join(n + m):
        first, second, mg, ng = 1, 0, n, m
    else:
        return None
    st = [dict(zip(terms[i], contiguous_strides(shapes[i]))) for i in (0, 1)]

    def gstride(i: int, group: list[str]) -> int | None:
        """The stride of ``group`` read as one dimension of operand i (0 for an empty group: size 1)."""
        if not group:
            return 0
        pos = [terms[i].index(c) for c in group]
        return st[i][group[-1]] if pos == list(range(pos[0], pos[0] + len(pos))) else None

    sm, sk1, sk2, sn = gstride(first, mg), gstride(first, k), gstride(second, k), gstride(second, ng)
    if None in (sm, sk1, sk2, sn):
        return None

    def prod(group: list[str]) -> int:
        return int(np.prod([size[c] for c in group], dtype=np.int64)) if group else 1

    pad = 3 - nb
    dims = (1,) * pad + tuple(size[c] for c in batch)
    sa_b = (0,) * pad + tuple(st[first][c] for c in batch)
    sb_b = (0,) * pad + tuple(st[second][c] for c in batch)
    return first, second, prod(mg), prod(ng), prod(k), (sm, sk1), (sk2, sn), dims, sa_b, sb_b


@register_kernel
class VkEinsum(VulkanKernel):
    """Einsum equations that are one batched matrix product (``einsum_as_gemm``: attention written with Einsum, as
    MaxViT's) on the GEMM shaders, operands read in place through strides; other equations have no Vulkan kernel
    (a Vulkan model runs them on the CPU)."""

    name = "vk_einsum"
    ops = ("Einsum",)

    def applies(self, layer: Layer) -> bool:
        return layer.outputs[0].size > 0 and einsum_as_gemm(layer) is not None

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        g = einsum_as_gemm(layer)
        assert g is not None
        first, second, m, n, k, sa, sb, dims, sa_b, sb_b = g
        return [batched_gemm_dispatch(In(first), In(second), Out(0), m, n, k, sa, sb, dims, sa_b, sb_b, caps)]
