"""Vulkan kernel for scaled dot-product attention, lowered to the existing shaders instead of a new one: ONNX
Attention (opsets 23-25; nonpad_kv_seqlen runs on the CPU) and onnxruntime's com.microsoft MultiHeadAttention as

    scores = scale * Q @ K^T (+ causal / sliding window: a load-time (Sq, Skv) 0/-inf bias)   matmul[_reg].comp
    scores += attn_mask (float, broadcast) | scores = where(attn_mask, scores, -inf)  binary.comp | where.comp
    P = softmax(scores) over the keys (a fully masked row gives 0s)                    softmax.comp (MASKED)
    Y = P @ V, then (B, H, Sq, Dv) -> (B, Sq, H * Dv) for 3-D inputs                   matmul[_reg].comp, copy.comp

Q, K and V are read in place through strides (3-D (B, S, H * D) or 4-D (B, H, S, D)), and grouped-query attention
(fewer key/value heads) through a broadcast batch dimension. Scores and probabilities live in the workspace
(2 * 4 * B * Hq * Sq * Skv bytes): this is the unfused form, not flash attention. Not covered (the node runs on the CPU
in a Vulkan model): past key/value and the present / qk outputs, softcap, a mask shorter than the keys,
MultiHeadAttention's packed forms, its bias and key_padding_mask inputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..vulkan.kernel import Caps, Dispatch, In, Out, Param, VulkanKernel, Ws, broadcast_strides, collapse, \
    contiguous_strides, grid
from .attention import visible_keys
from .base import MS, Layer, register_kernel
from .eltwise_vulkan import binary_dispatch
from .gemm_vulkan import batched_gemm_dispatch
from .tensor_vulkan import copy_dispatch


@dataclass(frozen=True)
class _Geom:
    b: int
    hq: int
    hkv: int
    sq: int
    skv: int
    dk: int
    dv: int
    three: bool  # 3-D (B, S, H * D) inputs and output
    mask: int | None  # input position of the additive / bool mask, or None
    causal: bool  # a (Sq, Skv) table of visible keys applies: is_causal or a sliding window
    scale: float

    def strides(self, h: int, s: int, d: int) -> tuple[int, int, int]:
        """(batch, head, row) element strides of a (B, H, S, D) tensor stored 3-D or 4-D."""
        return (s * h * d, d, h * d) if self.three else (h * s * d, s * d, d)


def _geom(layer: Layer) -> _Geom:
    q, k, v = layer.in_shape(0), layer.in_shape(1), layer.in_shape(2)
    node = layer.node
    if layer.op == MS + "MultiHeadAttention":
        n = int(node.attr("num_heads"))
        scale = float(node.attr("scale", 0.0) or 0.0) or 1.0 / math.sqrt(q[2] // n)
        return _Geom(q[0], n, n, q[1], k[1], q[2] // n, v[2] // n, True, 5 if layer.has_input(5) else None,
                     bool(node.attr("unidirectional", 0)), scale)
    if len(q) == 3:
        hq, hkv = int(node.attr("q_num_heads")), int(node.attr("kv_num_heads"))
        g = (q[0], hq, hkv, q[1], k[1], q[2] // hq, v[2] // hkv, True)
    else:
        g = (q[0], q[1], k[1], q[2], k[2], q[3], v[3], False)
    sc = node.attr("scale")
    scale = 1.0 / math.sqrt(g[5]) if sc is None else float(sc)
    # a static (Sq, Skv) table of visible keys: is_causal and opset 25's sliding window (no past, no
    # nonpad_kv_seqlen here, so queries sit at offset 0)
    band = bool(int(node.attr("is_causal", 0))) or int(node.attr("left_window_size", -1)) >= 0 \
        or int(node.attr("right_window_size", -1)) >= 0
    return _Geom(*g, 3 if layer.has_input(3) else None, band, scale)  # type: ignore[misc]


def _why_not(layer: Layer) -> str | None:
    """Why this kernel does not run the node (None: it does)."""
    node = layer.node
    if layer.attr("act") is not None:
        return "a fused activation"
    if [o for o in node.outputs[1:] if o]:
        return "outputs beyond Y (present key/value, qk)"
    if layer.op == MS + "MultiHeadAttention":
        if any(layer.has_input(i) for i in (3, 4, 6, 7, 8)) or len(layer.in_shape(0)) != 3 \
                or not layer.has_input(1) or not layer.has_input(2) or len(layer.in_shape(1)) != 3:
            return "packed, biased, masked-by-padding or past forms"
    else:
        if any(layer.has_input(i) for i in (4, 5, 6)):
            return "past key/value or nonpad_kv_seqlen"
        if float(node.attr("softcap", 0.0) or 0.0) > 0:
            return "softcap"
    g = _geom(layer)
    if g.hq % g.hkv:
        return "query heads not a multiple of key/value heads"
    if g.mask is not None:
        m = layer.in_shape(g.mask)
        full = (g.b, g.hq, g.sq, g.skv)
        if len(m) > 4 or m[-1] != g.skv or any(a not in (1, c) for a, c in zip(reversed(m), reversed(full))):
            return "a mask that does not broadcast to (B, H, Sq, Skv)"
        dt = layer.inputs[g.mask].dtype  # type: ignore[union-attr]
        if np.dtype(dt) not in (np.dtype(np.float32), np.dtype(np.bool_)):
            return "an integer mask"
    return None


@register_kernel
class VkAttention(VulkanKernel):
    name = "vk_attention"
    ops = ("Attention", MS + "MultiHeadAttention")
    io_dtypes = ("float32", "bool")

    def applies(self, layer: Layer) -> bool:
        return _why_not(layer) is None and layer.outputs[0].size > 0

    def workspace_parts(self, layer: Layer) -> dict[str, int]:
        g = _geom(layer)
        s = 4 * g.b * g.hq * g.sq * g.skv
        parts = {"s": s, "p": s}
        if g.three:
            parts["o"] = 4 * g.b * g.hq * g.sq * g.dv
        return parts

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = _geom(layer)
        out = {}
        if g.causal:  # keys by position (causal, sliding window), the oracle's table at offset 0
            if layer.op == MS + "MultiHeadAttention":  # ``unidirectional``: key j is visible to query i when j <= i
                allowed = np.arange(g.skv)[None, :] <= np.arange(g.sq)[:, None]
            else:
                allowed = visible_keys(layer.node, g.sq, g.skv, 0, None)
                assert allowed is not None
            out["causal"] = np.ascontiguousarray(np.where(allowed, 0.0, -np.inf).astype(np.float32))
        if g.mask is not None:
            out["ninf"] = np.full(1, -np.inf, np.float32)
            if g.mask in layer.const_inputs:
                m = np.asarray(raw[f"in{g.mask}"])
                out[f"in{g.mask}"] = np.ascontiguousarray(m.view(np.uint8) if m.dtype == np.bool_ else
                                                          m.astype(np.float32))
        return out

    def transformed_nbytes(self, layer: Layer) -> int:
        g = _geom(layer)
        n = 4 * g.sq * g.skv if g.causal else 0
        if g.mask is not None:
            n += 4 + (4 * layer.inputs[g.mask].size if g.mask in layer.const_inputs else 0)  # type: ignore[union-attr]
        return n

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        g = _geom(layer)
        rep = g.hq // g.hkv
        qb, qh, qs = g.strides(g.hq, g.sq, g.dk)
        kb, kh, ks = g.strides(g.hkv, g.skv, g.dk)
        vb, vh, vs = g.strides(g.hkv, g.skv, g.dv)
        # batch (B, Hkv, rep): query head hk * rep + r reads key/value head hk
        batch = (g.b, g.hkv, rep)
        sshape = (g.b, g.hq, g.sq, g.skv)
        d = [batched_gemm_dispatch(In(0), In(1), Ws("s"), g.sq, g.skv, g.dk, (qs, 1), (1, ks), batch,
                                   (qb, rep * qh, qh), (kb, kh, 0), caps, g.scale,
                                   Param("causal") if g.causal else None)]
        if g.mask is not None:
            mshape = layer.in_shape(g.mask)
            if np.dtype(layer.inputs[g.mask].dtype) == np.bool_:  # type: ignore[union-attr]
                sts = [broadcast_strides(mshape, sshape), contiguous_strides(sshape), [0] * 4]
                dims, (sc, sa, sb, _) = collapse(sshape, *sts, contiguous_strides(sshape))
                n = int(np.prod(sshape))
                d.append(Dispatch("where", (In(g.mask), Ws("s"), Param("ninf"), Ws("s")), grid(n, 256, caps),
                                  push={"n": n, "rank": len(dims), "dims": dims, "sc": sc, "sa": sa, "sb": sb}))
            else:
                d.append(binary_dispatch(sshape, mshape, sshape, Ws("s"), In(g.mask), Ws("s"), caps, 0))
        rows = g.b * g.hq * g.sq
        d.append(Dispatch("softmax", (Ws("s"), Ws("p")), grid(rows, 1, caps), {"LOG": 0, "ROWS": 1, "MASKED": 1},
                          push={"outer": rows, "L": g.skv, "inner": 1}))
        y = Ws("o") if g.three else Out(0)
        ps = g.sq * g.skv
        d.append(batched_gemm_dispatch(Ws("p"), In(2), y, g.sq, g.dv, g.skv, (g.skv, 1), (vs, 1), batch,
                                       (g.hq * ps, rep * ps, ps), (vb, vh, 0), caps))
        if g.three:  # (B, Hq, Sq, Dv) -> (B, Sq, Hq * Dv)
            src = contiguous_strides((g.b, g.hq, g.sq, g.dv))
            shape = (g.b, g.sq, g.hq, g.dv)
            cd = copy_dispatch(shape, [src[0], src[2], src[1], src[3]], contiguous_strides(shape), 0, 0, Ws("o"),
                               Out(0), caps)
            assert cd is not None
            d.append(cd)
        return d



def _rotary_inputs(layer: Layer) -> tuple[int, int, int | None]:
    """Input positions of (cos_cache, sin_cache, position_ids or None): ONNX (X, cos, sin, ids?), com.microsoft
    (input, ids, cos, sin)."""
    if layer.op.startswith(MS):
        return 2, 3, 1
    return 1, 2, 3 if layer.has_input(3) else None


@register_kernel
class VkRotary(VulkanKernel):
    """RotaryEmbedding (ONNX 23, com.microsoft): ``rotary.comp``, one invocation per element; the caches and the
    position ids are bound as they are (computed or constant, int64 or int32 ids)."""

    name = "vk_rotary"
    ops = ("RotaryEmbedding", MS + "RotaryEmbedding")
    io_dtypes = ("float32", "int64")

    def _geom(self, layer: Layer) -> tuple[int, int, int, int, bool] | None:
        """(S, N, H, rdim, three) or None where the heads do not split."""
        x = layer.in_shape(0)
        if len(x) == 4:
            return x[2], x[1], x[3], int(layer.attr("rotary_embedding_dim", 0) or 0) or x[3], False
        heads = int(layer.attr("num_heads", 0) or 0)
        if len(x) != 3 or heads <= 0 or x[2] % heads:
            return None
        h = x[2] // heads
        return x[1], heads, h, int(layer.attr("rotary_embedding_dim", 0) or 0) or h, True

    def applies(self, layer: Layer) -> bool:
        g = self._geom(layer)
        if g is None or layer.outputs[0].size == 0 or g[3] % 2 or g[3] > g[2]:
            return False
        c, _, pos = _rotary_inputs(layer)
        cw = layer.in_shape(c)[-1]
        if cw < g[3] // 2:
            return False
        if pos is None:
            return len(layer.in_shape(c)) in (2, 3)
        return layer.inputs[pos] is not None and np.dtype(layer.inputs[pos].dtype) in (np.dtype(np.int64),  # type: ignore[union-attr]
                                                                                        np.dtype(np.int32))

    # the default transform: constant ids become int32 (one word each: pos_stride 1), constant caches float32

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        g = self._geom(layer)
        assert g is not None
        s, nh, h, rdim, three = g
        c, sn, pos = _rotary_inputs(layer)
        cshape = layer.in_shape(c)
        mode, stride = 0, 1
        if pos is not None:
            mode = 2 if layer.op.startswith(MS) and layer.inputs[pos].size == 1 else 1  # type: ignore[union-attr]
            ids64 = pos not in layer.const_inputs and np.dtype(layer.inputs[pos].dtype) == np.int64  # type: ignore[union-attr]
            stride = 2 if ids64 else 1
        rows_b = cshape[1] if pos is None and len(cshape) == 3 and cshape[0] > 1 else 0
        n = layer.outputs[0].size
        binds = (In(0), In(c), In(sn)) + ((In(pos),) if pos is not None else ()) + (Out(0),)
        return [Dispatch("rotary", binds, grid(n, 256, caps),
                         {"INTERLEAVED": int(bool(layer.attr("interleaved", 0))), "POS": mode, "THREE": int(three)},
                         push={"n": n, "S": s, "N": nh, "H": h, "rdim": rdim, "cw": cshape[-1], "cos_rows_b": rows_b,
                               "pos_stride": stride})]
