"""Sampling and patch ops: GridSample (N-D; nearest, linear, cubic; zeros, border, reflection padding), AffineGrid,
DeformConv (2-D, bilinear taps at offset positions, optional modulation mask), Col2Im and CenterCropPad.

Vectorised numpy: the oracle and the CPU kernel. A GridSample or DeformConv gathers every tap of every output
position at once (K^d tap combinations for a d-dimensional input: 4 for bilinear, 16 for bicubic), so memory is
that many times the output; these ops sit in flow and alignment heads (RAFT, deformable detectors), where the
output is modest.
"""
from __future__ import annotations

import itertools
from typing import Mapping, Sequence

import numpy as np

from .. import native
from ..errors import KernelError, ShapeError
from ..ir import Node, TensorInfo
from .base import ContiguousOut, Kernel, Layer, OpSpec, full_inputs, register_kernel, register_op
from .tensor import const_getter

Infos = list["TensorInfo | None"]


def _opset(node: Node) -> int:
    return int(node.attr("_opset", 17))


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# ------------------------------------------------------------------------------------- GridSample

_MODES = {"bilinear": "linear", "bicubic": "cubic", "linear": "linear", "cubic": "cubic", "nearest": "nearest"}


def _gs_mode(node: Node) -> tuple[str, str, bool]:
    mode = _s(node.attr("mode", "bilinear" if _opset(node) < 20 else "linear"))
    pad = _s(node.attr("padding_mode", "zeros"))
    if mode not in _MODES or pad not in ("zeros", "border", "reflection"):
        raise ShapeError(f"node {node.name!r} (GridSample): mode {mode!r} / padding_mode {pad!r} not in ONNX")
    return _MODES[mode], pad, bool(node.attr("align_corners", 0))


def _infer_grid_sample(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x, g = ins[0], ins[1]
    assert x is not None and g is not None
    nd = len(x.shape) - 2
    if nd < 1 or len(g.shape) != nd + 2 or g.shape[-1] != nd or g.shape[0] != x.shape[0]:
        raise ShapeError(f"node {node.name!r} (GridSample): X {list(x.shape)} and grid {list(g.shape)} do not agree "
                         f"(grid must be [N, *out, {nd}])")
    _gs_mode(node)
    return [((x.shape[0], x.shape[1]) + tuple(g.shape[1:-1]), np.dtype(x.dtype))]


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    rng = hi - lo
    if rng <= 0:
        return np.full_like(x, lo)
    below, above = x < lo, x > hi
    dx = np.where(below, lo - x, np.where(above, x - hi, 0.0))
    n = np.floor(dx / rng)
    r = dx - n * rng
    even = (n % 2) == 0
    return np.where(below, np.where(even, lo + r, hi - r), np.where(above, np.where(even, hi - r, lo + r), x))


def _cubic_coeffs(t: np.ndarray) -> list[np.ndarray]:
    a = -0.75
    t = np.abs(t)
    return [((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
            ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a]


def sample(x: np.ndarray, coords: Sequence[np.ndarray], mode: str, pad: str, align: bool) -> np.ndarray:
    """``x`` (N, C, *dims) at pixel coordinates ``coords[i]`` (N, *out) along dimension i: (N, C, *out), as ONNX's
    GridSample samples after denormalising (taps outside the image by ``pad``)."""
    dims = x.shape[2:]
    nd = len(dims)
    n = x.shape[0]
    lo = [0.0 if align else -0.5 for _ in dims]
    hi = [d - 1.0 if align else d - 0.5 for d in dims]
    cs = []
    for i, c in enumerate(coords):
        c = np.asarray(c, np.float64)
        if mode == "nearest":
            c = np.rint(c)
        out = (c < lo[i]) | (c > hi[i])
        if pad == "border" and mode != "cubic":  # onnxruntime clamps bicubic's taps, not its coordinate
            c = np.where(out, np.clip(c, 0, dims[i] - 1), c)
        elif pad == "reflection":
            c = np.where(out, _reflect(c, lo[i], hi[i]), c)
        cs.append(c)
    taps: list[list[tuple[np.ndarray, np.ndarray]]] = []  # per dim: (index, weight) per tap
    for i, c in enumerate(cs):
        if mode == "nearest":
            taps.append([(c.astype(np.int64), np.ones_like(c))])
            continue
        f = np.floor(c)
        t = c - f
        base = f.astype(np.int64)
        if mode == "linear":
            taps.append([(base, 1 - t), (base + 1, t)])
        else:
            taps.append([(base + k - 1, w) for k, w in enumerate(_cubic_coeffs(t))])
    out_shape = coords[0].shape
    y = np.zeros((n, x.shape[1]) + tuple(out_shape[1:]), np.float64)
    bidx = np.arange(n).reshape((n,) + (1,) * (len(out_shape) - 1))
    xm = np.moveaxis(x.astype(np.float64), 1, -1)  # (N, *dims, C): one gather brings every channel
    for combo in itertools.product(*taps):
        idx, w, ok = [], np.ones(out_shape), np.ones(out_shape, bool)
        for i, (ix, wt) in enumerate(combo):
            d = dims[i]
            if pad == "zeros":
                ok &= (ix >= 0) & (ix < d)
                ix = np.clip(ix, 0, d - 1)
            elif pad == "border":
                ix = np.clip(ix, 0, d - 1)
            else:
                ix = np.trunc(_reflect(ix.astype(np.float64), lo[i], hi[i])).astype(np.int64)
                ix = np.clip(ix, 0, d - 1)
            idx.append(ix)
            w = w * wt
        v = xm[(bidx,) + tuple(idx)]  # (N, *out, C)
        y += np.moveaxis(v * (w * ok)[..., None], -1, 1)
    return y


def _denorm(g: np.ndarray, d: int, align: bool) -> np.ndarray:
    g = g.astype(np.float64)
    return (g + 1) / 2 * (d - 1) if align else ((g + 1) * d - 1) / 2


def grid_sample(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, g = np.asarray(ins[0]), np.asarray(ins[1])
    mode, pad, align = _gs_mode(node)
    dims = x.shape[2:]
    nd = len(dims)
    if x.size == 0 or g.size == 0:
        return [np.zeros((x.shape[0], x.shape[1]) + g.shape[1:-1], x.dtype)]
    coords = [_denorm(g[..., nd - 1 - i], dims[i], align) for i in range(nd)]  # the grid's last axis is (x, y, ...)
    return [sample(x, coords, mode, pad, align).astype(x.dtype)]


# ------------------------------------------------------------------------------------- AffineGrid

def _infer_affine_grid(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    t = ins[0]
    assert t is not None
    size = [int(v) for v in const_getter(node, consts, {1: "size"})(1).reshape(-1)]  # type: ignore[union-attr]
    nd = len(size) - 2
    if nd not in (2, 3) or tuple(t.shape) != (size[0], nd, nd + 1):
        raise ShapeError(f"node {node.name!r} (AffineGrid): theta {list(t.shape)} does not fit size {size}")
    return [((size[0],) + tuple(size[2:]) + (nd,), np.dtype(t.dtype))]


def affine_grid(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    theta = np.asarray(ins[0])
    size = [int(v) for v in np.asarray(ins[1]).reshape(-1)]
    align = bool(node.attr("align_corners", 0))
    sp = size[2:]
    nd = len(sp)

    def lin(d: int) -> np.ndarray:
        if align:
            return np.linspace(-1.0, 1.0, d) if d > 1 else np.zeros(1)
        return (np.arange(d, dtype=np.float64) * 2 + 1) / d - 1

    axes = np.meshgrid(*[lin(d) for d in sp], indexing="ij")  # per spatial dim (D, H, W order)
    base = np.stack(list(axes[::-1]) + [np.ones(sp)], axis=-1)  # (..., x, y[, z], 1)
    out = np.einsum("...k,njk->n...j", base, theta.astype(np.float64))
    return [out.astype(theta.dtype).reshape((size[0],) + tuple(sp) + (nd,))]


# ------------------------------------------------------------------------------------- DeformConv

def _conv_attrs(node: Node, nd: int, kshape: Sequence[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    k = [int(v) for v in node.attr("kernel_shape", list(kshape))]
    s = [int(v) for v in node.attr("strides", [1] * nd)]
    d = [int(v) for v in node.attr("dilations", [1] * nd)]
    p = [int(v) for v in node.attr("pads", [0] * (2 * nd))]
    return k, s, d, p


def _infer_deform_conv(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x, w, off = ins[0], ins[1], ins[2]
    assert x is not None and w is not None and off is not None
    if len(x.shape) != 4:
        raise ShapeError(f"node {node.name!r} (DeformConv): only 2-D inputs [N, C, H, W] (got {list(x.shape)})")
    k, s, d, p = _conv_attrs(node, 2, w.shape[2:])
    oh = (x.shape[2] + p[0] + p[2] - ((k[0] - 1) * d[0] + 1)) // s[0] + 1
    ow = (x.shape[3] + p[1] + p[3] - ((k[1] - 1) * d[1] + 1)) // s[1] + 1
    og = int(node.attr("offset_group", 1))
    if tuple(off.shape) != (x.shape[0], og * k[0] * k[1] * 2, oh, ow):
        raise ShapeError(f"node {node.name!r} (DeformConv): offset {list(off.shape)} must be "
                         f"{[x.shape[0], og * k[0] * k[1] * 2, oh, ow]}")
    return [((x.shape[0], w.shape[0], oh, ow), np.dtype(x.dtype))]


def deform_conv(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, w, off = (np.asarray(ins[i]) for i in range(3))
    b = ins[3] if len(ins) > 3 else None
    mask = ins[4] if len(ins) > 4 else None
    n, c, h, wd = x.shape
    k, s, d, p = _conv_attrs(node, 2, w.shape[2:])
    g, og = int(node.attr("group", 1)), int(node.attr("offset_group", 1))
    oh, ow = off.shape[2:]
    kk = k[0] * k[1]
    off = off.astype(np.float64).reshape(n, og, k[0], k[1], 2, oh, ow)
    m = np.ones((n, og, k[0], k[1], oh, ow)) if mask is None else np.asarray(mask, np.float64).reshape(
        n, og, k[0], k[1], oh, ow)
    ki = (np.arange(k[0]) * d[0])[:, None, None, None]
    kj = (np.arange(k[1]) * d[1])[None, :, None, None]
    oi = (np.arange(oh) * s[0] - p[0])[None, None, :, None]
    oj = (np.arange(ow) * s[1] - p[1])[None, None, None, :]
    cpg = c // og
    cols = np.empty((n, c, k[0], k[1], oh, ow))
    for gi in range(og):
        hh = ki + oi + off[:, gi, :, :, 0]  # (n, kh, kw, oh, ow)
        ww = kj + oj + off[:, gi, :, :, 1]
        v = sample(x[:, gi * cpg:(gi + 1) * cpg], [hh, ww], "linear", "zeros", True)  # (n, cpg, kh, kw, oh, ow)
        cols[:, gi * cpg:(gi + 1) * cpg] = v * m[:, gi][:, None]
    cin = c // g
    cout = w.shape[0] // g
    y = np.empty((n, w.shape[0], oh, ow))
    for gi in range(g):
        colg = cols[:, gi * cin:(gi + 1) * cin].reshape(n, cin * kk, oh * ow)
        wg = w[gi * cout:(gi + 1) * cout].reshape(cout, cin * kk).astype(np.float64)
        y[:, gi * cout:(gi + 1) * cout] = np.einsum("ok,nkp->nop", wg, colg).reshape(n, cout, oh, ow)
    if b is not None:
        y += np.asarray(b, np.float64).reshape(1, -1, 1, 1)
    return [y.astype(x.dtype)]


# ------------------------------------------------------------------------------------- Col2Im

def _col2im_geometry(node: Node, image: Sequence[int], block: Sequence[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    nd = len(image)
    dl = [int(v) for v in node.attr("dilations", [1] * nd)]
    st = [int(v) for v in node.attr("strides", [1] * nd)]
    pd = [int(v) for v in node.attr("pads", [0] * (2 * nd))]
    blocks = [(image[i] + pd[i] + pd[i + nd] - dl[i] * (block[i] - 1) - 1) // st[i] + 1 for i in range(nd)]
    return dl, st, pd, blocks


def _infer_col2im(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x = ins[0]
    assert x is not None
    get = const_getter(node, consts, {1: "image_shape", 2: "block_shape"})
    image = [int(v) for v in get(1).reshape(-1)]  # type: ignore[union-attr]
    block = [int(v) for v in get(2).reshape(-1)]  # type: ignore[union-attr]
    kk = int(np.prod(block))
    _dl, _st, _pd, blocks = _col2im_geometry(node, image, block)
    if len(x.shape) != 3 or x.shape[1] % kk or x.shape[2] != int(np.prod(blocks)):
        raise ShapeError(f"node {node.name!r} (Col2Im): input {list(x.shape)} does not fit image {image}, "
                         f"block {block} ({int(np.prod(blocks))} blocks)")
    return [((x.shape[0], x.shape[1] // kk) + tuple(image), np.dtype(x.dtype))]


def col2im(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    image = [int(v) for v in np.asarray(ins[1]).reshape(-1)]
    block = [int(v) for v in np.asarray(ins[2]).reshape(-1)]
    nd = len(image)
    dl, st, pd, blocks = _col2im_geometry(node, image, block)
    kk = int(np.prod(block))
    n, c = x.shape[0], x.shape[1] // kk
    padded = [image[i] + pd[i] + pd[i + nd] for i in range(nd)]
    y = np.zeros((n, c) + tuple(padded), np.float64)
    cols = x.reshape((n, c) + tuple(block) + tuple(blocks)).astype(np.float64)
    for kpos in itertools.product(*[range(b) for b in block]):
        sl = tuple(slice(kpos[i] * dl[i], kpos[i] * dl[i] + st[i] * (blocks[i] - 1) + 1, st[i]) for i in range(nd))
        y[(slice(None), slice(None)) + sl] += cols[(slice(None), slice(None)) + tuple(kpos)]
    crop = tuple(slice(pd[i], pd[i] + image[i]) for i in range(nd))
    return [np.ascontiguousarray(y[(slice(None), slice(None)) + crop]).astype(x.dtype)]


# ------------------------------------------------------------------------------------- CenterCropPad

def _ccp_axes(node: Node, rank: int, n: int) -> list[int]:
    axes = node.attr("axes")
    axes = list(range(rank - n, rank)) if axes is None else [int(a) for a in axes]
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise ShapeError(f"node {node.name!r} (CenterCropPad): axis {a} out of range for rank {rank}")
        out.append(a + rank if a < 0 else a)
    if len(out) != n:
        raise ShapeError(f"node {node.name!r} (CenterCropPad): {n} sizes for {len(out)} axes")
    return out


def _infer_ccp(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x = ins[0]
    assert x is not None
    shape = [int(v) for v in const_getter(node, consts, {1: "shape"})(1).reshape(-1)]  # type: ignore[union-attr]
    out = list(x.shape)
    for a, s in zip(_ccp_axes(node, len(x.shape), len(shape)), shape):
        out[a] = s
    return [(tuple(out), np.dtype(x.dtype))]


def center_crop_pad(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    shape = [int(v) for v in np.asarray(ins[1]).reshape(-1)]
    out_shape = list(x.shape)
    src, dst = [slice(None)] * x.ndim, [slice(None)] * x.ndim
    for a, s in zip(_ccp_axes(node, x.ndim, len(shape)), shape):
        d = x.shape[a]
        out_shape[a] = s
        if s <= d:  # crop: the window starts at (d - s) // 2
            st = (d - s) // 2
            src[a] = slice(st, st + s)
        else:  # pad: the data starts at (s - d) // 2
            st = (s - d) // 2
            dst[a] = slice(st, st + d)
    y = np.zeros(out_shape, x.dtype)
    y[tuple(dst)] = x[tuple(src)]
    return [y]


# ------------------------------------------------------------------------------------- registration

_COMPUTE = {"GridSample": grid_sample, "AffineGrid": affine_grid, "DeformConv": deform_conv, "Col2Im": col2im,
            "CenterCropPad": center_crop_pad}
_INFER = {"GridSample": _infer_grid_sample, "AffineGrid": _infer_affine_grid, "DeformConv": _infer_deform_conv,
          "Col2Im": _infer_col2im, "CenterCropPad": _infer_ccp}
_MIN = {"GridSample": 16, "AffineGrid": 20, "DeformConv": 19, "Col2Im": 18, "CenterCropPad": 18}
_NOTES = {"GridSample": "2-D bilinear/nearest native (every padding); bicubic and N-D: numpy gather of every tap "
                         "(float64)",
          "DeformConv": "2-D only; numpy bilinear taps + einsum (float64)"}
SAMPLING_OPS = tuple(_COMPUTE)


def _reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    return [np.array(r, order="C", copy=True) for r in _COMPUTE[node.op](node, inputs)]


for _op in SAMPLING_OPS:
    register_op(OpSpec(_op, _INFER[_op], _reference, min_opset=_MIN[_op], notes=_NOTES.get(_op, "")))


@register_kernel
class SamplingKernel(Kernel):
    name = "numpy"
    ops = SAMPLING_OPS

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        for o, r in zip(outputs, _COMPUTE[layer.op](layer.node, full_inputs(layer, inputs, params))):
            np.copyto(o, r)


_PADS = {"zeros": 0, "border": 1, "reflection": 2}


@register_kernel
class GridSampleNative(Kernel):
    """native/sampling.c: 2-D float32 GridSample, bilinear or nearest, every padding mode, both align_corners:
    each output pixel's four taps computed once per image and applied to every channel (channel blocks split
    over the native pool). Bicubic and N-D grids stay on the numpy oracle."""

    name = "gridsample_native"
    ops = ("GridSample",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        x, g = layer.inputs[0], layer.inputs[1] if len(layer.inputs) > 1 else None
        if not native.has("inferd_grid_sample") or x is None or g is None or len(x.shape) != 4:
            return False
        if np.dtype(x.dtype) != np.float32 or np.dtype(g.dtype) != np.float32:
            return False
        return _gs_mode(layer.node)[0] in ("linear", "nearest")

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        ins = full_inputs(layer, inputs, params)
        x = np.ascontiguousarray(ins[0], np.float32)
        g = np.ascontiguousarray(ins[1], np.float32)
        y = outputs[0]
        mode, pad, align = _gs_mode(layer.node)
        n, c, h, w = x.shape
        if x.size == 0 or g.size == 0 or h * w >= 2 ** 31:
            np.copyto(y, grid_sample(layer.node, ins)[0])  # empty, or past 32-bit offsets: the oracle
            return
        o = ContiguousOut(y)
        rc = native.lib.inferd_grid_sample(native._ptr(x), n, c, h, w, native._ptr(g), g.shape[1] * g.shape[2],
                                           native._ptr(o.y), int(mode == "nearest"), _PADS[pad], int(align))
        if rc == -1:
            raise MemoryError("inferd_grid_sample: out of memory")
        if rc:
            raise KernelError(f"node {layer.name!r} (GridSample): native kernel refused X {list(x.shape)} ({rc})")
        o.close()
