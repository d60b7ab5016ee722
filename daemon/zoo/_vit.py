"""timm ``vit_tiny_patch16_224`` as torch.onnx.export (opset 17) emits it, batch fixed to 1; and the same
graph at other sizes (:class:`Vit`: the latency predictor's ``vit`` variants)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._graph import GraphBuilder

LN_EPS = 1e-6


@dataclass(frozen=True)
class Vit:
    """A ViT's sizes; the defaults are vit_tiny_patch16_224's."""

    embed: int = 192
    depth: int = 12
    heads: int = 3
    mlp_ratio: int = 4
    patch: int = 16
    resolution: int = 224

    @property
    def head_dim(self) -> int:
        return self.embed // self.heads

    @property
    def mlp(self) -> int:
        return self.mlp_ratio * self.embed

    @property
    def tokens(self) -> int:
        return ((self.resolution - self.patch) // self.patch + 1) ** 2 + 1


TINY = Vit()


def _layer_norm(g: GraphBuilder, x: str, name: str, c: Vit = TINY) -> str:
    scale = g.add_init(f"{name}.weight", g.uniform((c.embed,), 0.5, 1.5))
    bias = g.add_init(f"{name}.bias", g.normal((c.embed,), 0.1))
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


def _attention(g: GraphBuilder, x: str, name: str, c: Vit = TINY) -> str:
    qkv = g.linear_matmul(x, f"{name}.qkv", c.embed, 3 * c.embed)
    shape = g.constant_node(np.array([1, c.tokens, 3, c.heads, c.head_dim], dtype=np.int64), name)
    qkv = g.op("Reshape", [qkv, shape], name)
    qkv = g.op("Transpose", [qkv], name, perm=[2, 0, 3, 1, 4])  # (3, B, H, N, hd)
    q, k, v = (g.op("Gather", [qkv, g.constant_node(np.array(i, dtype=np.int64), name)], name, axis=0)
               for i in range(3))
    kt = g.op("Transpose", [k], name, perm=[0, 1, 3, 2])
    att = g.op("MatMul", [q, kt], name)
    att = g.op("Mul", [att, _scalar(g, c.head_dim ** -0.5, name)], name)
    att = g.op("Softmax", [att], name, axis=-1)
    y = g.op("MatMul", [att, v], name)  # (B, H, N, hd)
    y = g.op("Transpose", [y], name, perm=[0, 2, 1, 3])
    y = g.op("Reshape", [y, g.constant_node(np.array([1, c.tokens, c.embed], dtype=np.int64), name)], name)
    # Residual-branch projections are scaled down so the residual stream grows slowly over 12 blocks.
    return g.linear_matmul(y, f"{name}.proj", c.embed, c.embed, gain=0.5)


def vit(g: GraphBuilder, x: str, c: Vit = TINY, classes: int = 1000) -> str:
    y = g.conv(x, "patch_embed.proj", 3, c.embed, c.patch, c.patch, bias=True, gain=1.0)
    y = g.op("Reshape", [y, g.const(np.array([1, c.embed, -1], dtype=np.int64), "Reshape")], "patch_embed")
    y = g.op("Transpose", [y], "patch_embed", perm=[0, 2, 1])
    cls = g.add_init("cls_token", g.normal((1, 1, c.embed), 0.5))
    y = g.op("Concat", [cls, y], "", axis=1)
    pos = g.add_init("pos_embed", g.normal((1, c.tokens, c.embed), 0.2))
    y = g.op("Add", [y, pos], "")
    for i in range(c.depth):
        name = f"blocks.{i}"
        a = _attention(g, _layer_norm(g, y, f"{name}.norm1", c), f"{name}.attn", c)
        y = g.op("Add", [y, a], name)
        h = g.linear_matmul(_layer_norm(g, y, f"{name}.norm2", c), f"{name}.mlp.fc1", c.embed, c.mlp)
        h = _gelu_erf(g, h, f"{name}.mlp.act")
        h = g.linear_matmul(h, f"{name}.mlp.fc2", c.mlp, c.embed, gain=0.5)
        y = g.op("Add", [y, h], name)
    y = _layer_norm(g, y, "norm", c)
    # x[:, 0]: the class token.
    y = g.op("Gather", [y, g.constant_node(np.array(0, dtype=np.int64), "")], "", axis=1)
    return g.gemm(y, "head", c.embed, classes, gain=1.0)


def vit_tiny(g: GraphBuilder, x: str) -> str:
    return vit(g, x, TINY)
