"""Zoo models with dynamic input dimensions, written the way torch.onnx.export writes such models:
sizes that follow the input come from ``Shape`` -> ``Slice``/``Gather`` -> ``Concat`` chains, not constants.
* ``detnet_dyn``: a fully convolutional detector (batch, height and width dynamic): strided conv/BN/ReLU
  stages with residual blocks, an FPN-style top-down path whose ``Resize`` takes its ``sizes`` from the
  skip connection's shape (``F.interpolate(x, size=skip.shape[-2:])``), a 1x1 head reshaped to
  (N, anchors, cells, 6) by a shape computed from the input.
* ``recnet_dyn``: a text-line recogniser (batch and width dynamic, height 32): a conv stem that pools the
  height to 1, then the width as a sequence: Squeeze/Transpose, one self-attention block (MatMul, Softmax,
  no LSTM), a per-step classifier and Softmax over 37 symbols (CTC-style output).
"""
from __future__ import annotations


import numpy as np

from ._graph import GraphBuilder

ANCHORS, BOX = 3, 6
SYMBOLS, EMBED = 37, 96


def _i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def _dims(g: GraphBuilder, x: str, start: int, end: int, scope: str) -> str:
    """``x.shape[start:end]`` as torch exports it (Shape with start/end, opset 15+)."""
    return g.op("Shape", [x], scope, start=start, end=end)


def _cbr(g: GraphBuilder, x: str, name: str, cin: int, cout: int, k: int | tuple[int, int], stride: int = 1,
         pad: int = 0, gain: float = 2.0) -> str:
    y = g.conv(x, f"{name}.conv", cin, cout, k, stride, pad, gain=gain)
    return g.relu(g.bn(y, f"{name}.bn", cout), f"{name}.relu")


def _res(g: GraphBuilder, x: str, name: str, c: int) -> str:
    y = _cbr(g, x, f"{name}.0", c, c, 3, 1, 1)
    y = g.bn(g.conv(y, f"{name}.1.conv", c, c, 3, 1, 1), f"{name}.1.bn", c, gamma=(0.2, 0.6))
    return g.relu(g.op("Add", [y, x], name), f"{name}.relu")


def detnet_dyn(g: GraphBuilder, x: str) -> str:
    c2 = _cbr(g, x, "stem", 3, 16, 3, 2, 1, gain=1.0)                  # H/2
    c4 = _res(g, _cbr(g, c2, "stage1", 16, 32, 3, 2, 1), "stage1.res", 32)   # H/4
    c8 = _res(g, _cbr(g, c4, "stage2", 32, 64, 3, 2, 1), "stage2.res", 64)   # H/8
    # top-down: upsample to the skip's exact size (odd sizes round differently than x2)
    lat = g.conv(c8, "fpn.lateral", 64, 32, 1, bias=True, gain=1.0)
    sizes = g.op("Concat", [_dims(g, lat, 0, 2, "fpn"), _dims(g, c4, 2, 4, "fpn")], "fpn", axis=0)
    up = g.op("Resize", [lat, "", "", sizes], "fpn", coordinate_transformation_mode="asymmetric", mode="nearest",
              nearest_mode="floor")
    p4 = _cbr(g, g.op("Add", [up, c4], "fpn"), "fpn.smooth", 32, 32, 3, 1, 1)
    head = g.conv(p4, "head", 32, ANCHORS * BOX, 1, bias=True, gain=1.0)
    # (N, A*6, h, w) -> (N, A, 6, h*w) -> (N, A, h*w, 6)
    shape = g.op("Concat", [_dims(g, head, 0, 1, "head"), g.constant_node(_i64(ANCHORS, BOX, -1), "head")],
                 "head", axis=0)
    y = g.op("Reshape", [head, shape], "head")
    y = g.op("Transpose", [y], "head", perm=[0, 1, 3, 2])
    return g.op("Sigmoid", [y], "head")


def _linear(g: GraphBuilder, x: str, name: str, fin: int, fout: int, gain: float = 1.0) -> str:
    return g.linear_matmul(x, name, fin, fout, gain)


def recnet_dyn(g: GraphBuilder, x: str) -> str:
    y = g.maxpool(_cbr(g, x, "cnn.0", 3, 32, 3, 1, 1, gain=1.0), 2, 2, scope="cnn.pool0")   # 16 x W/2
    y = g.maxpool(_cbr(g, y, "cnn.1", 32, 64, 3, 1, 1), 2, 2, scope="cnn.pool1")            # 8 x W/4
    y = _cbr(g, y, "cnn.2", 64, EMBED, 3, 1, 1)
    y = g.op("MaxPool", [y], "cnn.pool2", kernel_shape=[2, 1], strides=[2, 1], pads=[0, 0, 0, 0])  # 4 x W/4
    y = _cbr(g, y, "cnn.3", EMBED, EMBED, (4, 1))                                            # 1 x W/4
    seq = g.op("Squeeze", [y, g.constant_node(_i64(2), "seq")], "seq")                     # (N, C, T)
    seq = g.op("Transpose", [seq], "seq", perm=[0, 2, 1])                                   # (N, T, C)
    q = _linear(g, seq, "attn.q", EMBED, EMBED)
    k = _linear(g, seq, "attn.k", EMBED, EMBED)
    v = _linear(g, seq, "attn.v", EMBED, EMBED)
    att = g.op("MatMul", [q, g.op("Transpose", [k], "attn", perm=[0, 2, 1])], "attn")      # (N, T, T)
    att = g.op("Mul", [att, g.constant_node(np.array(EMBED ** -0.5, np.float32), "attn")], "attn")
    att = g.op("Softmax", [att], "attn", axis=-1)
    ctx = _linear(g, g.op("MatMul", [att, v], "attn"), "attn.proj", EMBED, EMBED, gain=0.5)
    seq = g.op("Add", [seq, ctx], "attn")
    # flatten the steps for the classifier and back, with the sizes taken from the tensor (as exported)
    nt = g.op("Shape", [seq], "cls", start=0, end=2)
    flat = g.op("Reshape", [seq, g.constant_node(_i64(-1, EMBED), "cls")], "cls")
    logits = g.gemm(flat, "cls.fc", EMBED, SYMBOLS, gain=1.0)
    back = g.op("Concat", [nt, g.constant_node(_i64(SYMBOLS), "cls")], "cls", axis=0)
    logits = g.op("Reshape", [logits, back], "cls")
    return g.op("Softmax", [logits], "cls", axis=-1)


