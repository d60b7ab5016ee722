"""Attention-family operators: the default domain's Attention (opsets 23-25), RMSNormalization and RotaryEmbedding
(opset 23) and LinearAttention (opset 27), and
the ``com.microsoft`` operators onnxruntime's transformer optimizer writes into shipped models: Attention,
MultiHeadAttention, SkipLayerNormalization, SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization (which
onnxruntime registers in the default domain), BiasGelu, FastGelu, QuickGelu, RotaryEmbedding, and
GroupQueryAttention (causal attention with shared key/value heads, as in speech and vision decoders too).

A ``com.microsoft`` op is registered as ``com.microsoft.<Op>`` (the importer maps a node of that domain to that
name). numpy oracles, float64 inside where a reduction or a softmax is, cast back once; the CPU kernel runs them:
the matrix products go through numpy's BLAS.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from .. import native
from ..errors import ShapeError, UnsupportedOpError
from ..ir import Node, TensorInfo
from .base import MS, ContiguousOut, Kernel, Layer, OpSpec, full_inputs, register_kernel, register_op

Infos = list["TensorInfo | None"]


def _get(ins: Sequence[np.ndarray | None], i: int) -> np.ndarray | None:
    return ins[i] if len(ins) > i and ins[i] is not None else None


def _has(node: Node, i: int) -> bool:
    return len(node.inputs) > i and bool(node.inputs[i])


def _softmax(s: np.ndarray) -> np.ndarray:
    m = np.max(s, axis=-1, keepdims=True)
    masked = np.isneginf(m)
    e = np.exp(s - np.where(masked, 0, m))
    t = e.sum(axis=-1, keepdims=True)
    return np.where(masked, 0, e / np.where(t == 0, 1, t))


def _erf_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + native.numpy_erf(x / math.sqrt(2)))


# ------------------------------------------------------------------------------------- ONNX Attention (23)

def _split_heads(x: np.ndarray, heads: int) -> np.ndarray:
    b, s, h = x.shape
    return x.reshape(b, s, heads, h // heads).transpose(0, 2, 1, 3)


def _attn_shapes(node: Node, q, k, v, past):  # type: ignore[no-untyped-def]
    """(Y shape, present shape k, present shape v, qk shape) for Attention-23's Q/K/V infos."""
    if len(q.shape) == 3:
        qh, kvh = node.attr("q_num_heads"), node.attr("kv_num_heads")
        if not qh or not kvh:
            raise ShapeError(f"node {node.name!r} (Attention): 3-D inputs need q_num_heads and kv_num_heads")
        b, sq = q.shape[0], q.shape[1]
        hk, hv = k.shape[2] // int(kvh), v.shape[2] // int(kvh)
        skv = k.shape[1]
        qn, kn = int(qh), int(kvh)
        y = (b, sq, qn * hv)
    else:
        b, qn, sq = q.shape[:3]
        kn, skv, hk = k.shape[1:]
        hv = v.shape[3]
        y = (b, qn, sq, hv)
    total = skv + (past.shape[2] if past is not None else 0)
    return y, (b, kn, total, hk), (b, kn, total, hv), (b, qn, sq, total)


def _infer_attention(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    q, k, v = ins[0], ins[1], ins[2]
    assert q is not None and k is not None and v is not None
    y, pk, pv, qk = _attn_shapes(node, q, k, v, ins[4] if len(ins) > 4 else None)
    dt = np.dtype(q.dtype)
    return [(y, dt), (pk, dt), (pv, dt), (qk, dt)][:len(node.outputs)]


def visible_keys(node: Node, sq: int, skv: int, past: int, nonpad: np.ndarray | None) -> np.ndarray | None:
    """Which keys each query of Attention may see by position (None: all): a (Sq, Skv) table, or (B, 1, Sq, Skv)
    with ``nonpad_kv_seqlen`` (opset 24). Query ``i`` sits at ``offset + i``: the past length with an internal
    cache, ``nonpad_kv_seqlen[b] - Sq`` with an external one (opset 24; a negative offset masks whole rows, which
    give zeros), else 0. ``is_causal`` keeps keys at or before it; opset 25's ``left_window_size`` /
    ``right_window_size`` (-1: unbounded) keep keys within that many positions before / after it; keys at or past
    ``nonpad_kv_seqlen[b]`` are padding."""
    causal = bool(int(node.attr("is_causal", 0)))
    lw, rw = int(node.attr("left_window_size", -1)), int(node.attr("right_window_size", -1))
    if lw < -1 or rw < -1:
        raise ShapeError(f"node {node.name!r} (Attention): left_window_size {lw} / right_window_size {rw} must be -1 "
                         "(unbounded) or a size")
    if not causal and lw < 0 and rw < 0 and nonpad is None:
        return None
    if nonpad is not None and past:
        raise ShapeError(f"node {node.name!r} (Attention): nonpad_kv_seqlen cannot be combined with past_key/value")
    kpos = np.arange(skv)[None, :]
    qpos = np.arange(sq)[:, None] + past
    if nonpad is not None:
        lens = np.asarray(nonpad, np.int64).reshape(-1, 1, 1, 1)
        qpos = qpos + (lens - sq)
    allowed = np.ones(np.broadcast_shapes(qpos.shape, kpos.shape), np.bool_)
    if causal:
        allowed &= kpos <= qpos
    if lw >= 0:
        allowed &= qpos - kpos <= lw
    if rw >= 0:
        allowed &= kpos - qpos <= rw
    if nonpad is not None:
        allowed &= kpos < lens
    return allowed


def attention(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    q, k, v = (np.asarray(ins[i]) for i in range(3))
    mask, pk, pv = _get(ins, 3), _get(ins, 4), _get(ins, 5)
    dt = q.dtype
    three = q.ndim == 3
    if three:
        q = _split_heads(q, int(node.attr("q_num_heads")))
        k = _split_heads(k, int(node.attr("kv_num_heads")))
        v = _split_heads(v, int(node.attr("kv_num_heads")))
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    if pk is not None:
        k = np.concatenate([np.asarray(pk, np.float64), k], axis=2)
        v = np.concatenate([np.asarray(pv, np.float64), v], axis=2)
    present_k, present_v = k, v
    sq, skv = q.shape[2], k.shape[2]
    scale = node.attr("scale")
    scale = 1 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    bias = np.zeros((sq, skv))
    if mask is not None:
        m = np.asarray(mask)
        if m.shape[-1] < skv:  # a mask shorter than the keys: the rest masked
            pad = [(0, 0)] * (m.ndim - 1) + [(0, skv - m.shape[-1])]
            m = np.pad(m, pad, constant_values=False if m.dtype == np.bool_ else -np.inf)
        bias = bias + (np.where(m, 0.0, -np.inf) if m.dtype == np.bool_ else m.astype(np.float64))
    allowed = visible_keys(node, sq, skv, pk.shape[2] if pk is not None else 0, _get(ins, 6))
    if allowed is not None:
        bias = bias + np.where(allowed, 0.0, -np.inf)
    if q.shape[1] != k.shape[1]:  # grouped-query attention: each kv head serves q_heads / kv_heads query heads
        rep = q.shape[1] // k.shape[1]
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    qk = (q @ k.transpose(0, 1, 3, 2)) * scale
    softcap = float(node.attr("softcap", 0.0) or 0.0)
    if softcap > 0:
        qk = softcap * np.tanh(qk / softcap)
    mode = int(node.attr("qk_matmul_output_mode", 0))
    withb = qk + bias
    p = _softmax(withb)
    p = np.where(np.isneginf(np.max(np.broadcast_to(bias, withb.shape), axis=-1, keepdims=True)), 0, p)
    out_qk = {0: qk, 1: qk, 2: withb, 3: p}.get(mode, qk)
    y = p @ v
    if three:
        y = y.transpose(0, 2, 1, 3).reshape(y.shape[0], y.shape[2], -1)
    res = [y.astype(dt), present_k.astype(dt), present_v.astype(dt), out_qk.astype(dt)]
    return res[:len(node.outputs)]


# ------------------------------------------------------------------------------------- RMSNormalization

def _infer_same(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x = ins[0]
    assert x is not None
    return [(tuple(x.shape), np.dtype(x.dtype))]


def rms_norm(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, w = np.asarray(ins[0]), np.asarray(ins[1])
    a = int(node.attr("axis", -1))
    a = a + x.ndim if a < 0 else a
    xf = x.astype(np.float64)
    ms = np.mean(xf * xf, axis=tuple(range(a, x.ndim)), keepdims=True)
    return [(xf / np.sqrt(ms + float(node.attr("epsilon", 1e-5))) * w.astype(np.float64)).astype(x.dtype)]


# ------------------------------------------------------------------------------------- RotaryEmbedding

def _rotate(x4: np.ndarray, cos: np.ndarray, sin: np.ndarray, rdim: int, interleaved: bool) -> np.ndarray:
    """x4 (B, S, N, H); cos/sin (B or 1, S, rdim/2)."""
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    xr, rest = x4[..., :rdim], x4[..., rdim:]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    else:
        x1, x2 = xr[..., : rdim // 2], xr[..., rdim // 2:]
    re, im = c * x1 - s * x2, s * x1 + c * x2
    rot = np.stack([re, im], axis=-1).reshape(xr.shape) if interleaved else np.concatenate([re, im], axis=-1)
    return np.concatenate([rot, rest], axis=-1)


def rotary(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    ms = node.op.startswith(MS)
    if ms:  # com.microsoft: (input, position_ids, cos_cache, sin_cache)
        x, pos, cos, sin = (np.asarray(ins[i]) for i in range(4))
    else:  # ONNX: (X, cos_cache, sin_cache, position_ids?)
        x, cos, sin = (np.asarray(ins[i]) for i in range(3))
        pos = _get(ins, 3)
    dt = x.dtype
    xf = x.astype(np.float64)
    heads = int(node.attr("num_heads", 0) or 0)
    if x.ndim == 4:
        x4 = xf.transpose(0, 2, 1, 3)  # (B, S, N, H)
    else:
        if not heads:
            raise ShapeError(f"node {node.name!r} ({node.op}): a 3-D input needs num_heads")
        x4 = xf.reshape(x.shape[0], x.shape[1], heads, x.shape[2] // heads)
    b, s = x4.shape[:2]
    rdim = int(node.attr("rotary_embedding_dim", 0) or 0) or x4.shape[3]
    if ms and pos is not None and np.asarray(pos).size == 1:
        pos = int(np.asarray(pos).reshape(-1)[0]) + np.arange(s)[None, :]  # one offset for every batch
    if pos is not None:
        cos, sin = np.asarray(cos)[np.asarray(pos)], np.asarray(sin)[np.asarray(pos)]
    elif cos.ndim == 2:  # ONNX without position_ids: caches already (B, S, rdim/2) or (S, rdim/2)
        cos, sin = cos[None, :s], sin[None, :s]
    y = _rotate(x4, cos.astype(np.float64), sin.astype(np.float64), rdim, bool(node.attr("interleaved", 0)))
    y = y.transpose(0, 2, 1, 3) if x.ndim == 4 else y.reshape(x.shape)
    return [y.astype(dt)]


# ------------------------------------------------------------------------------------- com.microsoft

def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None, eps: float, simplified: bool
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if simplified:
        mean = np.zeros(x.shape[:-1] + (1,))
        var = np.mean(x * x, axis=-1, keepdims=True)
    else:
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    inv = 1 / np.sqrt(var + eps)
    y = (x - mean) * inv * gamma
    if beta is not None:
        y = y + beta
    return y, mean, inv


def skip_layer_norm(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    simplified = node.op == MS + "SkipSimplifiedLayerNormalization"
    x, skip, gamma = (np.asarray(ins[i]) for i in range(3))
    beta = None if simplified else _get(ins, 3)
    bias = _get(ins, 3 if simplified else 4)
    s = x.astype(np.float64) + skip.astype(np.float64)
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    y, mean, inv = _layer_norm(s, gamma.astype(np.float64), None if beta is None else np.asarray(beta, np.float64),
                               float(node.attr("epsilon", 1e-12)), simplified)
    dt = x.dtype
    return [y.astype(dt), mean.astype(np.float32), inv.astype(np.float32), s.astype(dt)][:len(node.outputs)]


def simplified_ln(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, g = np.asarray(ins[0]), np.asarray(ins[1])
    a = int(node.attr("axis", -1))
    a = a + x.ndim if a < 0 else a
    xf = x.astype(np.float64)
    ms = np.mean(xf * xf, axis=tuple(range(a, x.ndim)), keepdims=True)
    inv = 1 / np.sqrt(ms + float(node.attr("epsilon", 1e-5)))
    out = [(xf * inv * g).astype(x.dtype), inv.astype(np.float32)]
    return out[:len(node.outputs)]


def gelus(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    v = x.astype(np.float64)
    b = _get(ins, 1)
    if b is not None:
        v = v + np.asarray(b, np.float64)
    op = node.op[len(MS):]
    if op == "BiasGelu":
        y = _erf_gelu(v)
    elif op == "FastGelu":
        y = 0.5 * v * (1 + np.tanh(0.7978845608028654 * (v + 0.044715 * v ** 3)))
    else:  # QuickGelu
        y = v / (1 + np.exp(-float(node.attr("alpha", 1.702)) * v))
    return [y.astype(x.dtype)]


def _mask_bias(mask: np.ndarray | None, b: int, sq: int, skv: int, fill: float) -> np.ndarray:
    """onnxruntime's mask_index forms as an additive bias broadcastable to (B, N, Sq, Skv)."""
    if mask is None:
        return np.zeros((1, 1, 1, 1))
    m = np.asarray(mask)
    if m.ndim == 1 and m.shape[0] == b:  # right padding: valid lengths
        keep = np.arange(skv)[None, :] < m[:, None]
        return np.where(keep, 0.0, fill)[:, None, None, :]
    if m.ndim == 2:  # (B, total) raw 1/0
        return np.where(m > 0, 0.0, fill)[:, None, None, :]
    if m.ndim == 3:  # (B, Sq, total)
        return np.where(m > 0, 0.0, fill)[:, None, :, :]
    raise ShapeError(f"mask_index of shape {list(m.shape)} is not supported")


def _mha_core(q: np.ndarray, k: np.ndarray, v: np.ndarray, heads: int, scale: float | None, bias: np.ndarray,
              causal: bool, past_len: int = 0) -> np.ndarray:
    """q (B, Sq, D), k (B, Skv, D), v (B, Skv, Dv) float64: (B, Sq, Dv)."""
    qh, kh, vh = _split_heads(q, heads), _split_heads(k, heads), _split_heads(v, heads)
    sc = (1 / math.sqrt(qh.shape[3])) if not scale else scale
    s = (qh @ kh.transpose(0, 1, 3, 2)) * sc + bias
    if causal:
        sq, skv = s.shape[2:]
        s = np.where(np.arange(skv)[None, :] <= np.arange(sq)[:, None] + past_len, s, -np.inf)
    p = _softmax(s)
    y = p @ vh
    return y.transpose(0, 2, 1, 3).reshape(q.shape[0], q.shape[1], -1)


def ms_attention(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, w = np.asarray(ins[0]), np.asarray(ins[1])
    bias, mask, past, rel = _get(ins, 2), _get(ins, 3), _get(ins, 4), _get(ins, 5)
    if past is not None:
        raise ShapeError(f"node {node.name!r} (com.microsoft Attention): the past state input is not supported")
    heads = int(node.attr("num_heads"))
    sizes = node.attr("qkv_hidden_sizes")
    d = w.shape[1] // 3 if not sizes else None
    dq, dk, dv = (d, d, d) if d is not None else (int(sizes[0]), int(sizes[1]), int(sizes[2]))
    qkv = x.astype(np.float64) @ w.astype(np.float64)
    if bias is not None:
        qkv = qkv + np.asarray(bias, np.float64)
    q, k, v = qkv[..., :dq], qkv[..., dq:dq + dk], qkv[..., dq + dk:dq + dk + dv]
    b, s = x.shape[:2]
    add = _mask_bias(mask, b, s, s, float(node.attr("mask_filter_value", -10000.0)))
    if rel is not None:
        add = add + np.asarray(rel, np.float64)
    y = _mha_core(q, k, v, heads, node.attr("scale"), add, bool(node.attr("unidirectional", 0)))
    return [y.astype(x.dtype)][:1]


def ms_mha(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    q, k, v = (np.asarray(ins[i]) if _get(ins, i) is not None else None for i in range(3))
    assert q is not None
    if k is None or v is None or q.ndim != 3 or k.ndim != 3:
        raise ShapeError(f"node {node.name!r} (com.microsoft MultiHeadAttention): only separate 3-D query, key "
                         f"and value inputs are supported")
    bias, kpm, rel = _get(ins, 3), _get(ins, 4), _get(ins, 5)
    qf, kf, vf = (a.astype(np.float64) for a in (q, k, v))
    if bias is not None:
        bb = np.asarray(bias, np.float64)
        dq, dk = qf.shape[-1], kf.shape[-1]
        qf, kf, vf = qf + bb[:dq], kf + bb[dq:dq + dk], vf + bb[dq + dk:]
    add = _mask_bias(kpm, q.shape[0], q.shape[1], k.shape[1], float(node.attr("mask_filter_value", -10000.0)))
    if rel is not None:
        add = add + np.asarray(rel, np.float64)
    y = _mha_core(qf, kf, vf, int(node.attr("num_heads")), node.attr("scale"), add,
                  bool(node.attr("unidirectional", 0)))
    return [y.astype(q.dtype)]


def _infer_ms_attention(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x, w = ins[0], ins[1]
    assert x is not None and w is not None
    if _has(node, 4):
        raise ShapeError(f"node {node.name!r} (com.microsoft Attention): the past state input is not supported")
    sizes = node.attr("qkv_hidden_sizes")
    dv = w.shape[1] // 3 if not sizes else int(sizes[2])
    return [((x.shape[0], x.shape[1], dv), np.dtype(x.dtype))]


def _infer_mha(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    q, v = ins[0], ins[2] if len(ins) > 2 else None
    assert q is not None
    if v is None or len(q.shape) != 3 or len(v.shape) != 3:
        raise ShapeError(f"node {node.name!r} (com.microsoft MultiHeadAttention): only separate 3-D query, key and "
                         f"value inputs are supported")
    return [((q.shape[0], q.shape[1], v.shape[2]), np.dtype(q.dtype))]


def _infer_skip_ln(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x = ins[0]
    assert x is not None
    stat = tuple(x.shape[:-1]) + (1,)
    outs = [(tuple(x.shape), np.dtype(x.dtype)), (stat, np.dtype(np.float32)), (stat, np.dtype(np.float32)),
            (tuple(x.shape), np.dtype(x.dtype))]
    return outs[:len(node.outputs)]


def _infer_simplified_ln(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x = ins[0]
    assert x is not None
    a = int(node.attr("axis", -1))
    a = a + len(x.shape) if a < 0 else a
    return [(tuple(x.shape), np.dtype(x.dtype)), (tuple(x.shape[:a]) + (1,) * (len(x.shape) - a),
                                                   np.dtype(np.float32))][:len(node.outputs)]


def _gqa_dims(node: Node, q_shape: Sequence[int], packed: bool) -> tuple[int, int, int]:
    """(num_heads, kv_num_heads, head_size) of a GroupQueryAttention node."""
    n, kvn = int(node.attr("num_heads", 0) or 0), int(node.attr("kv_num_heads", 0) or 0)
    if n <= 0 or kvn <= 0 or n % kvn:
        raise ShapeError(f"node {node.name!r} (com.microsoft GroupQueryAttention): num_heads {n} must be a positive "
                         f"multiple of kv_num_heads {kvn}")
    d = int(q_shape[-1])
    h = d // (n + 2 * kvn) if packed else d // n
    return n, kvn, h


def _gqa_total(node: Node, total: np.ndarray | None) -> int:
    if total is None:
        raise ShapeError(f"node {node.name!r} (com.microsoft GroupQueryAttention): total_sequence_length must be a "
                         f"constant (it sizes present_key/present_value)")
    return int(np.asarray(total).reshape(-1)[0])


def _infer_gqa(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    q = ins[0]
    assert q is not None
    if len(q.shape) != 3:
        raise ShapeError(f"node {node.name!r} (com.microsoft GroupQueryAttention): query must be 3-D (B, S, D), "
                         f"got {list(q.shape)}")
    packed = not _has(node, 1)
    n, kvn, h = _gqa_dims(node, q.shape, packed)
    total = _gqa_total(node, consts[node.inputs[6]] if _has(node, 6) and node.inputs[6] in consts else None)
    past = ins[3] if len(ins) > 3 else None
    t = max(total, int(past.shape[2]) if past is not None else 0)
    b, sq = q.shape[0], q.shape[1]
    outs = [((b, sq, n * h), np.dtype(q.dtype)), ((b, kvn, t, h), np.dtype(q.dtype)),
            ((b, kvn, t, h), np.dtype(q.dtype))]
    if len(node.outputs) > 3 and node.outputs[3]:
        raise ShapeError(f"node {node.name!r} (com.microsoft GroupQueryAttention): the output_qk output is not "
                         f"supported")
    return outs[:len(node.outputs)]


def gqa(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """onnxruntime's GroupQueryAttention (CPU kernel semantics): causal attention of S new tokens over the
    past (``past_key``/``past_value``, B x KVN x P x H) and themselves, query heads sharing key/value heads in
    groups of num_heads / kv_num_heads; per batch, ``seqlens_k`` + 1 tokens are valid. The first prompt
    (S == total_sequence_length) has no past; later calls append after ``seqlens_k + 1 - S`` past tokens.
    Optional: rotary embedding of q and k (do_rotary, cos/sin caches, position_ids), a sliding window
    (local_window_size), softcap, smooth softmax or per-head sinks (head_sink), an additive attention_bias."""
    q = np.asarray(ins[0])
    dt = q.dtype
    packed = _get(ins, 1) is None
    n, kvn, h = _gqa_dims(node, q.shape, packed)
    b, s = q.shape[0], q.shape[1]
    qf = q.astype(np.float64)
    if packed:
        k = qf[..., n * h:(n + kvn) * h]
        v = qf[..., (n + kvn) * h:]
        qf = qf[..., :n * h]
    else:
        k, v = np.asarray(ins[1], np.float64), np.asarray(ins[2], np.float64)
    past_k, past_v = _get(ins, 3), _get(ins, 4)
    seqlens = np.asarray(ins[5]).reshape(-1).astype(np.int64)
    total = _gqa_total(node, _get(ins, 6))
    cos, sin, pos_ids, bias, sink = (_get(ins, i) for i in range(7, 12))
    first = s == total
    t = max(total, past_k.shape[2] if past_k is not None else 0)
    q4, k4, v4 = qf.reshape(b, s, n, h), k.reshape(b, s, kvn, h), v.reshape(b, s, kvn, h)
    if bool(node.attr("do_rotary", 0)):
        if cos is None or sin is None:
            raise ShapeError(f"node {node.name!r} (com.microsoft GroupQueryAttention): do_rotary needs cos_cache "
                             f"and sin_cache")
        if pos_ids is not None:
            pos = np.asarray(pos_ids, np.int64).reshape(b, s)
        else:
            start = np.zeros(b, np.int64) if first else seqlens + 1 - s
            pos = start[:, None] + np.arange(s)[None, :]
        c, sn = np.asarray(cos, np.float64)[pos], np.asarray(sin, np.float64)[pos]
        rdim, inter = 2 * c.shape[-1], bool(node.attr("rotary_interleaved", 0))
        q4, k4 = _rotate(q4, c, sn, rdim, inter), _rotate(k4, c, sn, rdim, inter)
    scale = float(node.attr("scale", 0.0) or 0.0) or 1.0 / math.sqrt(h)
    softcap = float(node.attr("softcap", 0.0) or 0.0)
    window = int(node.attr("local_window_size", -1))
    smooth = bool(node.attr("smooth_softmax", 0))
    present_k = np.zeros((b, kvn, t, h))
    present_v = np.zeros((b, kvn, t, h))
    out = np.zeros((b, s, n, h))
    group = n // kvn
    for bi in range(b):
        tot = int(seqlens[bi]) + 1
        past = 0 if first else tot - s
        if past < 0 or past + s > t:
            raise ShapeError(f"node {node.name!r} (com.microsoft GroupQueryAttention): seqlens_k {int(seqlens[bi])} "
                             f"does not fit {s} new tokens in a present length of {t}")
        if past:
            if past_k is None or past_v is None or past_k.shape[2] < past:
                raise ShapeError(f"node {node.name!r} (com.microsoft GroupQueryAttention): {past} past tokens but "
                                 f"no past_key/past_value holding them")
            present_k[bi, :, :past] = np.asarray(past_k[bi, :, :past], np.float64)
            present_v[bi, :, :past] = np.asarray(past_v[bi, :, :past], np.float64)
        present_k[bi, :, past:past + s] = k4[bi].transpose(1, 0, 2)
        present_v[bi, :, past:past + s] = v4[bi].transpose(1, 0, 2)
        keys = present_k[bi, :, :past + s]  # (KVN, L, H)
        vals = present_v[bi, :, :past + s]
        kh = np.repeat(keys, group, axis=0)  # query head j reads kv head j // group
        vh = np.repeat(vals, group, axis=0)
        sc = np.einsum("snh,nlh->nsl", q4[bi], kh) * scale  # (N, S, L)
        if softcap > 0:
            sc = softcap * np.tanh(sc / softcap)
        if bias is not None:
            bb = np.asarray(bias, np.float64)
            sc = sc + bb[bi if bb.shape[0] > 1 else 0][..., :s, :past + s]
        qpos = past + np.arange(s)[:, None]
        kpos = np.arange(past + s)[None, :]
        allowed = kpos <= qpos
        if window > 0:
            allowed &= kpos > qpos - window  # the window holds local_window_size tokens, this one included
        sc = np.where(allowed[None], sc, -np.inf)
        m = sc.max(axis=-1, keepdims=True)
        extra = None
        if sink is not None:
            extra = np.asarray(sink, np.float64).reshape(n, 1, 1)
        elif smooth:
            extra = np.zeros((n, 1, 1))
        if extra is not None:
            m = np.maximum(m, extra)
        e = np.exp(sc - m)
        den = e.sum(axis=-1, keepdims=True) + (np.exp(extra - m) if extra is not None else 0.0)
        p = e / den
        out[bi] = np.einsum("nsl,nlh->snh", p, vh)
    return [out.reshape(b, s, n * h).astype(dt), present_k.astype(dt), present_v.astype(dt)]


# ------------------------------------------------------------------------------------- registration

# ------------------------------------------------------------------------------ LinearAttention (opset 27)

_LINEAR_RULES = ("linear", "gated", "delta", "gated_delta")


def _linear_dims(node: Node, q: Sequence[int], v: Sequence[int]) -> tuple[int, int, int, int]:
    """(q heads, kv heads, d_k, d_v) of LinearAttention's packed (B, T, H * D) inputs."""
    hq, hkv = int(node.attr("q_num_heads", 0) or 0), int(node.attr("kv_num_heads", 0) or 0)
    if hq <= 0 or hkv <= 0 or hq % hkv or len(q) != 3 or len(v) != 3 or q[2] % hq or v[2] % hkv:
        raise ShapeError(f"node {node.name!r} (LinearAttention): q_num_heads {hq} must be a positive multiple of "
                         f"kv_num_heads {hkv}, dividing query {list(q)} and value {list(v)} (B, T, H * D)")
    return hq, hkv, q[2] // hq, v[2] // hkv


def _check_linear(node: Node, opset: int) -> None:
    rule = node.attr("update_rule", "gated_delta")
    if rule not in _LINEAR_RULES:
        raise UnsupportedOpError("LinearAttention", node.name, opset, f"update_rule {rule!r} ({', '.join(_LINEAR_RULES)})")
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    has = [i < len(node.inputs) and bool(node.inputs[i]) for i in range(6)]
    if has[4] != gated or has[5] != delta:
        raise UnsupportedOpError("LinearAttention", node.name, opset,
                                 f"update_rule {rule!r} takes {'a' if gated else 'no'} decay and {'a' if delta else 'no'} "
                                 "beta input")


def _infer_linear(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    q, v = ins[0], ins[2]
    assert q is not None and v is not None
    hq, hkv, dk, dv = _linear_dims(node, q.shape, v.shape)
    past = ins[3] if len(ins) > 3 else None
    b = q.shape[0]
    if past is not None and tuple(past.shape) != (b, hkv, dk, dv):
        raise ShapeError(f"node {node.name!r} (LinearAttention): past_state {list(past.shape)} must be "
                         f"{[b, hkv, dk, dv]}")
    sdt = np.dtype(past.dtype) if past is not None else np.dtype(q.dtype)
    return [((b, q.shape[1], hq * dv), np.dtype(q.dtype)), ((b, hkv, dk, dv), sdt)][:len(node.outputs)]


def linear_attention(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """The recurrence token by token, in float32 (the state S is (B, Hkv, d_k, d_v)): gated rules decay S by
    exp(decay) (per head, or per key dimension), delta rules write beta * (v - S^T k) instead of v, then
    S += k v^T and o = scale * q^T S, each kv head's state read by its group of query heads."""
    q, k, v = (np.asarray(ins[i]) for i in range(3))
    past, decay, beta = _get(ins, 3), _get(ins, 4), _get(ins, 5)
    hq, hkv, dk, dv = _linear_dims(node, q.shape, v.shape)
    b, t = q.shape[:2]
    f = np.float32

    def heads(x: np.ndarray, h: int) -> np.ndarray:  # (B, T, H * D) -> (B, H, T, D)
        return x.reshape(b, t, h, -1).transpose(0, 2, 1, 3).astype(f)

    q4, k4, v4 = heads(q, hq), heads(k, hkv), heads(v, hkv)
    g4 = None
    if decay is not None:
        d = np.asarray(decay)
        if d.shape[-1] not in (hkv, hkv * dk):
            raise ShapeError(f"node {node.name!r} (LinearAttention): decay {list(d.shape)} must end in kv_num_heads "
                             f"{hkv} or kv_num_heads * d_k {hkv * dk}")
        g4 = np.exp(heads(d, hkv))  # (B, Hkv, T, 1 or d_k)
    b4 = None
    if beta is not None:
        be = np.asarray(beta)
        if be.shape[-1] not in (hkv, 1):
            raise ShapeError(f"node {node.name!r} (LinearAttention): beta {list(be.shape)} must end in kv_num_heads "
                             f"{hkv} or 1")
        b4 = heads(be, be.shape[-1])  # (B, Hkv or 1, T, 1)
    state = np.zeros((b, hkv, dk, dv), f) if past is None else np.asarray(past).astype(f)
    sc = node.attr("scale")
    scale = 1.0 / math.sqrt(dk) if not sc else float(sc)
    group = hq // hkv
    out = np.empty((b, hq, t, dv), f)
    for i in range(t):
        kt, vt = k4[:, :, i], v4[:, :, i]
        if g4 is not None:
            state = state * g4[:, :, i][..., None]
        if b4 is not None:
            vt = b4[:, :, i] * (vt - np.einsum("bhdm,bhd->bhm", state, kt))
        state = state + kt[..., :, None] * vt[..., None, :]
        read = state if group == 1 else np.repeat(state, group, axis=1)
        out[:, :, i] = f(scale) * np.einsum("bhd,bhdm->bhm", q4[:, :, i], read)
    y = out.transpose(0, 2, 1, 3).reshape(b, t, hq * dv).astype(q.dtype)
    return [y, state.astype(past.dtype if past is not None else q.dtype)][:max(len(node.outputs), 1)]


_COMPUTE = {
    "LinearAttention": linear_attention,
    "Attention": attention, "RMSNormalization": rms_norm, "RotaryEmbedding": rotary,
    "SimplifiedLayerNormalization": simplified_ln,
    MS + "Attention": ms_attention, MS + "MultiHeadAttention": ms_mha, MS + "SkipLayerNormalization": skip_layer_norm,
    MS + "SkipSimplifiedLayerNormalization": skip_layer_norm, MS + "BiasGelu": gelus, MS + "FastGelu": gelus,
    MS + "QuickGelu": gelus, MS + "RotaryEmbedding": rotary, MS + "GroupQueryAttention": gqa,
}
_INFER = {"Attention": _infer_attention, "LinearAttention": _infer_linear, "SimplifiedLayerNormalization": _infer_simplified_ln,
          MS + "Attention": _infer_ms_attention, MS + "MultiHeadAttention": _infer_mha,
          MS + "SkipLayerNormalization": _infer_skip_ln, MS + "SkipSimplifiedLayerNormalization": _infer_skip_ln,
          MS + "GroupQueryAttention": _infer_gqa}
_MIN = {"Attention": 23, "RMSNormalization": 23, "RotaryEmbedding": 23, "LinearAttention": 27}
_NOTES = {
    "Attention": "opsets 23-25 (nonpad_kv_seqlen, sliding window); numpy, float64 softmax",
    "LinearAttention": "numpy, the recurrence token by token in float32 (chunk_size is a tuning hint: ignored)",
    "SimplifiedLayerNormalization": "onnxruntime's contrib op in the default domain (what its optimizer writes)",
    MS + "Attention": "com.microsoft: packed QKV weights, mask_index 1-D/2-D/3-D, attention bias, unidirectional; "
                      "no past state",
    MS + "MultiHeadAttention": "com.microsoft: separate 3-D query/key/value only (no packed or past forms)",
    MS + "GroupQueryAttention": "com.microsoft: onnxruntime's CPU semantics (causal; past KV, packed QKV, rotary, "
                                "local window, softcap, smooth softmax/head sink, attention_bias); "
                                "total_sequence_length must be a constant; no output_qk",
}
ATTENTION_OPS = tuple(_COMPUTE)


def _reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    return [np.array(r, order="C", copy=True) for r in _COMPUTE[node.op](node, inputs)]


for _op in ATTENTION_OPS:
    register_op(OpSpec(_op, _INFER.get(_op, _infer_same), _reference, min_opset=_MIN.get(_op, 1),
                       notes=_NOTES.get(_op, ""), check=_check_linear if _op == "LinearAttention" else None))


@register_kernel
class AttentionKernel(Kernel):
    """The numpy functions (BLAS matrix products), copied into the arena."""

    name = "numpy"
    ops = ATTENTION_OPS

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        res = _COMPUTE[layer.op](layer.node, full_inputs(layer, inputs, params))
        buffers = iter(outputs)  # one per named output; the results follow node.outputs, absent ones included
        for name, r in zip(layer.node.outputs, res):
            if name:
                np.copyto(next(buffers), r)


@register_kernel
class RMSNormNative(Kernel):
    """native/rows.c: float32 RMSNormalization over the trailing axes, one scale per normalised element, rows
    split over the native pool (the mean of squares in 16 partial lanes, in float32 like onnxruntime's default
    stash_type)."""

    name = "rmsnorm_native"
    ops = ("RMSNormalization",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        x, s = layer.inputs[0], layer.inputs[1] if len(layer.inputs) > 1 else None
        if not native.has("inferd_rmsnorm") or x is None or s is None or not x.shape:
            return False
        if np.dtype(x.dtype) != np.float32 or np.dtype(s.dtype) != np.float32:
            return False
        a = int(layer.attr("axis", -1))
        a = a + len(x.shape) if a < 0 else a
        d = math.prod(x.shape[a:])
        return 0 <= a < len(x.shape) and d > 0 and math.prod(s.shape) == d

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]):  # type: ignore[no-untyped-def]
        ins = full_inputs(layer, inputs, params)
        x, s, y = ins[0], ins[1], outputs[0]
        if x is None or s is None or any(a.dtype != np.float32 or not a.flags.c_contiguous for a in (x, s, y)):
            return None
        d = s.size
        fn, args = native.lib.inferd_rmsnorm, (native._ptr(x), native._ptr(y), x.size // d, d, native._ptr(s),
                                               float(layer.attr("epsilon", 1e-5)))
        keep = (x, s, y)

        def call(_keep: object = keep) -> None:
            fn(*args)
        return call

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        ins = full_inputs(layer, inputs, params)
        x = np.ascontiguousarray(ins[0], np.float32)
        s = np.ascontiguousarray(ins[1], np.float32).reshape(-1)
        o = ContiguousOut(outputs[0])
        d = s.size
        native.lib.inferd_rmsnorm(native._ptr(x), native._ptr(o.y), x.size // d, d, native._ptr(s),
                                  float(layer.attr("epsilon", 1e-5)))
        o.close()
