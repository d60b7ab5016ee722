"""LpPool, GlobalLpPool, MaxUnpool, Det and the random generators (RandomNormal, RandomUniform, their *Like forms,
Bernoulli, Multinomial).

The pools reuse ``pool``'s window geometry. The random generators draw from numpy's PCG64 (seeded by the ``seed``
attribute, else from the OS): the values are valid samples of the distribution, never those onnxruntime draws,
which no two engines share; a generator is never constant-folded (each run draws anew unless seeded).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..errors import ShapeError
from ..ir import Node, TensorInfo
from .base import Kernel, Layer, OpSpec, full_inputs, register_kernel, register_op
from .pool import _padded, pool_geometry
from .tensor import const_getter

Infos = list["TensorInfo | None"]

_ONNX_TYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
               9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


# ------------------------------------------------------------------------------------- LpPool

def _infer_lppool(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x = ins[0]
    if x is None or len(x.shape) < 3:
        raise ShapeError(f"{node.op} {node.name!r}: input must be (N, C, spatial...)")
    if node.op == "GlobalLpPool":
        return [(tuple(x.shape[:2]) + (1,) * (len(x.shape) - 2), np.dtype(x.dtype))]
    g = pool_geometry(node, x.shape)
    return [(tuple(x.shape[:2]) + g.out, np.dtype(x.dtype))]


def lppool(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    p = float(node.attr("p", 2))
    ap = np.abs(x.astype(np.float64)) ** p
    nsp = x.ndim - 2
    if node.op == "GlobalLpPool":
        s = ap.sum(axis=tuple(range(2, x.ndim)), keepdims=True)
    else:
        g = pool_geometry(node, x.shape)
        xp = _padded(ap, g, 0.0)
        ext = tuple((k - 1) * d + 1 for k, d in zip(g.kernel, g.dilations))
        win = np.lib.stride_tricks.sliding_window_view(xp, ext, axis=tuple(range(2, 2 + nsp)))
        win = win[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in g.strides)
                  + tuple(slice(None, None, d) for d in g.dilations)]
        s = win.sum(axis=tuple(range(2 + nsp, 2 + 2 * nsp)))
    return [(s ** (1.0 / p)).astype(x.dtype)]


# ------------------------------------------------------------------------------------- MaxUnpool

def _unpool_shape(node: Node, xs: Sequence[int], out: np.ndarray | None) -> tuple[int, ...]:
    if out is not None:
        return tuple(int(v) for v in np.asarray(out).reshape(-1))
    nsp = len(xs) - 2
    k = [int(v) for v in node.attr("kernel_shape")]
    s = [int(v) for v in node.attr("strides", [1] * nsp)]
    p = [int(v) for v in node.attr("pads", [0] * (2 * nsp))]
    return tuple(xs[:2]) + tuple((xs[2 + i] - 1) * s[i] + k[i] - p[i] - p[i + nsp] for i in range(nsp))


def _infer_maxunpool(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x = ins[0]
    assert x is not None
    out = const_getter(node, consts, {2: "output_shape"})(2)
    return [(_unpool_shape(node, x.shape, out), np.dtype(x.dtype))]


def maxunpool(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, idx = np.asarray(ins[0]), np.asarray(ins[1]).astype(np.int64)
    # indices address the unpooled shape the pool attributes give; an output_shape (the pool's input, which may
    # have been cropped by the pool's floor) gets that block at its start, zeros around
    shape = _unpool_shape(node, x.shape, None)
    want = _unpool_shape(node, x.shape, ins[2] if len(ins) > 2 else None)
    y = np.zeros(int(np.prod(shape)), x.dtype)
    flat = idx.reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= y.size):
        from ..errors import KernelError

        raise KernelError(f"node {node.name!r} (MaxUnpool): index out of range for output {list(shape)}")
    y[flat] = x.reshape(-1)
    y = y.reshape(shape)
    if want == shape:
        return [y]
    out = np.zeros(want, x.dtype)
    common = tuple(slice(0, min(a, b)) for a, b in zip(shape, want))
    out[common] = y[common]
    return [out]


# ------------------------------------------------------------------------------------- Det

def _infer_det(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x = ins[0]
    assert x is not None
    if len(x.shape) < 2 or x.shape[-1] != x.shape[-2]:
        raise ShapeError(f"node {node.name!r} (Det): input {list(x.shape)} is not a batch of square matrices")
    return [(tuple(x.shape[:-2]), np.dtype(x.dtype))]


def det(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    return [np.asarray(np.linalg.det(x.astype(np.float64))).astype(x.dtype)]


# ------------------------------------------------------------------------------------- random generators

def _dtype(node: Node, default: np.dtype) -> np.dtype:
    t = node.attr("dtype")
    if t is None:
        return np.dtype(default)
    if int(t) not in _ONNX_TYPES:
        raise ShapeError(f"node {node.name!r} ({node.op}): dtype {t} is not supported")
    return np.dtype(_ONNX_TYPES[int(t)])


def _rng(node: Node) -> np.random.Generator:
    seed = node.attr("seed")
    return np.random.default_rng(None if seed is None else int(np.float32(seed).view(np.uint32)))


def _infer_random(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    if node.op in ("RandomNormal", "RandomUniform"):
        return [(tuple(int(v) for v in node.attr("shape")), _dtype(node, np.dtype(np.float32)))]
    x = ins[0]
    assert x is not None
    if node.op == "Multinomial":
        if len(x.shape) != 2:
            raise ShapeError(f"node {node.name!r} (Multinomial): input must be [batch, classes]")
        return [((x.shape[0], int(node.attr("sample_size", 1))), _dtype(node, np.dtype(np.int32)))]
    return [(tuple(x.shape), _dtype(node, np.dtype(x.dtype)))]


def random_op(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    rng = _rng(node)
    op = node.op
    if op in ("RandomNormal", "RandomUniform"):
        shape, dt = tuple(int(v) for v in node.attr("shape")), _dtype(node, np.dtype(np.float32))
    else:
        x = np.asarray(ins[0])
        shape, dt = x.shape, _dtype(node, np.dtype(np.int32) if op == "Multinomial" else x.dtype)
    if op in ("RandomNormal", "RandomNormalLike"):
        v = rng.normal(float(node.attr("mean", 0.0)), float(node.attr("scale", 1.0)), shape)
    elif op in ("RandomUniform", "RandomUniformLike"):
        v = rng.uniform(float(node.attr("low", 0.0)), float(node.attr("high", 1.0)), shape)
    elif op == "Bernoulli":
        v = rng.random(shape) < np.asarray(ins[0], np.float64)
    else:  # Multinomial: input holds unnormalised log-probabilities per class
        logits = np.asarray(ins[0], np.float64)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        k = int(node.attr("sample_size", 1))
        cdf = np.cumsum(p, axis=1)
        u = rng.random((logits.shape[0], k))
        v = np.minimum((u[:, :, None] > cdf[:, None, :]).sum(axis=2), logits.shape[1] - 1)
        shape = (logits.shape[0], k)
    return [np.asarray(v).astype(dt).reshape(shape)]


# ------------------------------------------------------------------------------------- Scatter (deprecated)

def scatter(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Scatter (opsets 9-10, deprecated in 11): ScatterElements without a reduction."""
    from .indexing import scatter_elements

    return scatter_elements(node, ins)


def _infer_scatter(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x = ins[0]
    assert x is not None
    return [(tuple(x.shape), np.dtype(x.dtype))]


# ------------------------------------------------------------------------------------- registration

_COMPUTE = {"LpPool": lppool, "GlobalLpPool": lppool, "MaxUnpool": maxunpool, "Det": det,
            "RandomNormal": random_op, "RandomNormalLike": random_op, "RandomUniform": random_op,
            "RandomUniformLike": random_op, "Bernoulli": random_op, "Multinomial": random_op, "Scatter": scatter}
_INFER = {"LpPool": _infer_lppool, "GlobalLpPool": _infer_lppool, "MaxUnpool": _infer_maxunpool, "Det": _infer_det,
          "Scatter": _infer_scatter}
_MIN = {"LpPool": 1, "GlobalLpPool": 1, "MaxUnpool": 9, "Det": 11, "Bernoulli": 15, "Multinomial": 7, "Scatter": 9}
RANDOM_OPS = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial")
MISC_OPS = tuple(_COMPUTE)


def _reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    return [np.array(r, order="C", copy=True) for r in _COMPUTE[node.op](node, inputs)]


_RANDOM_NOTE = ("numpy PCG64 samples (seeded by `seed`): the distribution, not onnxruntime's values; an unseeded "
                "generator reading only constants is folded once at import")
for _op in MISC_OPS:
    register_op(OpSpec(_op, _INFER.get(_op, _infer_random), _reference, min_opset=_MIN.get(_op, 1),
                       notes=_RANDOM_NOTE if _op in RANDOM_OPS else ""))


@register_kernel
class MiscKernel(Kernel):
    name = "numpy"
    ops = MISC_OPS

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        for o, r in zip(outputs, _COMPUTE[layer.op](layer.node, full_inputs(layer, inputs, params))):
            np.copyto(o, r)
