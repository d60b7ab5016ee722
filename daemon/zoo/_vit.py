"""timm ``vit_tiny_patch16_224`` as torch.onnx.export (opset 17) emits it, batch fixed to 1."""

from __future__ import annotations

import math

import numpy as np

from ._graph import GraphBuilder

EMBED = 192
DEPTH = 12
HEADS = 3
HEAD_DIM = EMBED // HEADS
MLP = 4 * EMBED
PATCH = 16
TOKENS = (224 // PATCH) ** 2 + 1
LN_EPS = 1e-6


def _layer_norm(g: GraphBuilder, x: str, name: str) -> str:
    scale = g.add_init(f"{name}.weight", g.uniform((EMBED,), 0.5, 1.5))
    bias = g.add_init(f"{name}.bias", g.normal((EMBED,), 0.1))
    return g.op("LayerNormalization", [x, scale, bias], name, axis=-1, epsilon=LN_EPS)


def _scalar(g: GraphBuilder, value: float, scope: str) -> str:
    # The exporter emits Python scalars in arithmetic as Constant nodes.
    return g.constant_node(np.array(value, dtype=np.float32), scope)


def _gelu_erf(g: GraphBuilder, x: str, scope: str) -> str:
    """nn.GELU() (exact) decomposed as torch exports it before opset 20."""
    d = g.op("Div", [x, _scalar(g, math.sqrt(2.0), scope)], scope)
    e = g.op("Erf", [d], scope)
    a = g.op("Add", [e, _scalar(g, 1.0, scope)], scope)
    m = g.op("Mul", [x, a], scope)
    return g.op("Mul", [m, _scalar(g, 0.5, scope)], scope)


def _attention(g: GraphBuilder, x: str, name: str) -> str:
    qkv = g.linear_matmul(x, f"{name}.qkv", EMBED, 3 * EMBED)
    shape = g.constant_node(np.array([1, TOKENS, 3, HEADS, HEAD_DIM], dtype=np.int64), name)
    qkv = g.op("Reshape", [qkv, shape], name)
    qkv = g.op("Transpose", [qkv], name, perm=[2, 0, 3, 1, 4])  # (3, B, H, N, hd)
    q, k, v = (g.op("Gather", [qkv, g.constant_node(np.array(i, dtype=np.int64), name)], name, axis=0)
               for i in range(3))
    kt = g.op("Transpose", [k], name, perm=[0, 1, 3, 2])
    att = g.op("MatMul", [q, kt], name)
    att = g.op("Mul", [att, _scalar(g, HEAD_DIM ** -0.5, name)], name)
    att = g.op("Softmax", [att], name, axis=-1)
    y = g.op("MatMul", [att, v], name)  # (B, H, N, hd)
    y = g.op("Transpose", [y], name, perm=[0, 2, 1, 3])
    y = g.op("Reshape", [y, g.constant_node(np.array([1, TOKENS, EMBED], dtype=np.int64), name)], name)
    # Residual-branch projections are scaled down so the residual stream grows slowly over 12 blocks.
    return g.linear_matmul(y, f"{name}.proj", EMBED, EMBED, gain=0.5)


def vit_tiny(g: GraphBuilder, x: str) -> str:
    y = g.conv(x, "patch_embed.proj", 3, EMBED, PATCH, PATCH, bias=True, gain=1.0)
    y = g.op("Reshape", [y, g.const(np.array([1, EMBED, -1], dtype=np.int64), "Reshape")], "patch_embed")
    y = g.op("Transpose", [y], "patch_embed", perm=[0, 2, 1])
    cls = g.add_init("cls_token", g.normal((1, 1, EMBED), 0.5))
    y = g.op("Concat", [cls, y], "", axis=1)
    pos = g.add_init("pos_embed", g.normal((1, TOKENS, EMBED), 0.2))
    y = g.op("Add", [y, pos], "")
    for i in range(DEPTH):
        name = f"blocks.{i}"
        a = _attention(g, _layer_norm(g, y, f"{name}.norm1"), f"{name}.attn")
        y = g.op("Add", [y, a], name)
        h = g.linear_matmul(_layer_norm(g, y, f"{name}.norm2"), f"{name}.mlp.fc1", EMBED, MLP)
        h = _gelu_erf(g, h, f"{name}.mlp.act")
        h = g.linear_matmul(h, f"{name}.mlp.fc2", MLP, EMBED, gain=0.5)
        y = g.op("Add", [y, h], name)
    y = _layer_norm(g, y, "norm")
    # x[:, 0]: the class token.
    y = g.op("Gather", [y, g.constant_node(np.array(0, dtype=np.int64), "")], "", axis=1)
    return g.gemm(y, "head", EMBED, 1000, gain=1.0)
