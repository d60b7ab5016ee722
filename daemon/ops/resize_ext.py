"""Resize beyond nearest/linear: cubic (``cubic_coeff_a``, ``exclude_outside``), antialiasing (linear and cubic
filters stretched by 1/scale when downsampling) and ``tf_crop_and_resize`` (roi, ``extrapolation_value``).

Separable: per resized axis, a weight matrix (out x in) built as the ONNX reference builds each output's taps (the
pixel left of x_original is the reference, ratio in (0, 1], taps past the edge read the edge pixel unless
``exclude_outside``); the tensor is multiplied by each matrix in turn (float64), so one kernel serves every rank and
every mode. The output shape and per-axis scales come from ``resize.resize_plan`` (``keep_aspect_ratio_policy``
included), shared with the fast kernels.
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np

from ..ir import Node
from .base import Kernel, Layer, full_inputs, register_kernel

_F32 = np.float32


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def extended(node: Node) -> bool:
    """Whether a Resize node needs this module's kernel (cubic, antialias or tf_crop_and_resize)."""
    from .resize import _legacy, _mode

    if _legacy(node):
        return False
    return _mode(node) == "cubic" or bool(node.attr("antialias", 0)) or \
        _s(node.attr("coordinate_transformation_mode", "half_pixel")) == "tf_crop_and_resize"


def _x_original(ctm: str, x: int, scale: float, n_in: int, n_out: int, roi: tuple[float, float]) -> float | None:
    """x_original of output coordinate ``x`` (None: tf_crop_and_resize outside the image, extrapolated)."""
    if ctm == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if ctm == "half_pixel_symmetric":
        adj = n_out / (scale * n_in)
        return n_in / 2 * (1 - adj) + (x + 0.5) / scale - 0.5
    if ctm == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if n_out > 1 else 0.0
    if ctm == "align_corners":
        return 0.0 if n_out == 1 else x * (n_in - 1) / (n_out - 1)
    if ctm == "asymmetric":
        return x / scale
    if ctm == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    # tf_crop_and_resize
    start, end = roi
    v = start * (n_in - 1) + x * (end - start) * (n_in - 1) / (n_out - 1) if n_out > 1 else \
        0.5 * (start + end) * (n_in - 1)
    return None if v < 0 or v > n_in - 1 else v


def _cubic(ratio: float, scale: float, a: float, antialias: bool) -> np.ndarray:
    s = min(scale, 1.0) if antialias else 1.0
    i0 = int(math.floor(-2 / s) + 1)
    xs = np.abs(s * (np.arange(i0, 2 - i0) - ratio))
    c = np.where(xs <= 1, (a + 2) * xs ** 3 - (a + 3) * xs ** 2 + 1,
                 np.where(xs < 2, a * xs ** 3 - 5 * a * xs ** 2 + 8 * a * xs - 4 * a, 0.0))
    return c / c.sum() if antialias else c


def _linear(ratio: float, scale: float, antialias: bool) -> np.ndarray:
    s = min(scale, 1.0) if antialias else 1.0
    i0 = int(math.floor(-1 / s) + 1)
    c = np.clip(1 - np.abs((np.arange(i0, 2 - i0) - ratio) * s), 0, 1)
    return c / c.sum()


def _nearest_idx(x: float, mode: str, scale: float) -> int:
    if mode == "floor":
        return math.floor(x)
    if mode == "ceil":
        return math.ceil(x)
    fl = math.floor(x)
    frac = x - fl
    if frac == 0.5:
        return fl if mode == "round_prefer_floor" else fl + 1
    return round(x) if frac != 0.5 else fl


@functools.lru_cache(maxsize=256)
def axis_matrix(mode: str, ctm: str, nearest_mode: str, n_in: int, n_out: int, scale: float, a: float,
                exclude: bool, antialias: bool, roi: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """(W (n_out, n_in), extrapolated (n_out,) bool) of one axis."""
    w = np.zeros((n_out, n_in))
    extra = np.zeros(n_out, bool)
    for x in range(n_out):
        xo = _x_original(ctm, x, scale, n_in, n_out, roi)
        if xo is None:
            extra[x] = True
            continue
        if mode == "nearest":
            w[x, min(max(_nearest_idx(xo, nearest_mode, scale), 0), n_in - 1)] = 1
            continue
        left = math.ceil(xo) - 1 if float(xo).is_integer() else math.floor(xo)
        ratio = xo - left  # (0, 1]: the reference prefers the pixel left of x_original
        c = _cubic(ratio, scale, a, antialias) if mode == "cubic" else _linear(ratio, scale, antialias)
        n = c.size
        idx = np.arange(left - n // 2 + 1, left + n // 2 + 1)
        if exclude:
            c = np.where((idx >= 0) & (idx < n_in), c, 0.0)
            tot = c.sum()
            c = c / tot if tot else c
        np.add.at(w[x], np.clip(idx, 0, n_in - 1), c)
    w.setflags(write=False)
    extra.setflags(write=False)
    return w, extra


def resize_ext(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    from .resize import _input_positions, _mode, resize_plan

    x = np.asarray(inputs[0])
    si, zi = _input_positions(node)
    get = lambda i: None if i is None or i >= len(inputs) else inputs[i]  # noqa: E731
    p = resize_plan(node, x.shape, get(si), get(zi))
    mode = _mode(node)
    ctm = _s(node.attr("coordinate_transformation_mode", "half_pixel"))
    rank = x.ndim
    roi = get(1)
    axes = node.attr("axes")
    axes = [int(a) % rank for a in axes] if axes is not None else list(range(rank))
    full_roi = [(0.0, 1.0)] * rank
    if roi is not None and np.asarray(roi).size:
        r = np.asarray(roi, np.float64).reshape(-1)
        for i, a in enumerate(axes if r.size == 2 * len(axes) else range(rank)):
            full_roi[a] = (float(r[i]), float(r[r.size // 2 + i]))
    extrap = float(node.attr("extrapolation_value", 0.0))
    y = x.astype(np.float64)
    ext_mask = np.zeros((), bool)
    for ax in range(rank):
        n_in, n_out, sc = p.in_shape[ax], p.out_shape[ax], p.scales[ax]
        if n_in == n_out and sc == 1.0 and ctm != "tf_crop_and_resize":
            continue
        w, extra = axis_matrix(mode, ctm, _s(node.attr("nearest_mode", "round_prefer_floor")), n_in, n_out,
                               float(sc), float(node.attr("cubic_coeff_a", -0.75)),
                               bool(node.attr("exclude_outside", 0)), bool(node.attr("antialias", 0)), full_roi[ax])
        y = np.moveaxis(np.tensordot(w, np.moveaxis(y, ax, 0), axes=(1, 0)), 0, ax)
        if extra.any():
            shape = [1] * rank
            shape[ax] = n_out
            ext_mask = ext_mask | extra.reshape(shape)
    if np.any(ext_mask):
        y = np.where(np.broadcast_to(ext_mask, y.shape), extrap, y)
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        y = np.clip(np.trunc(y), info.min, info.max)
    return [y.astype(x.dtype)]


@register_kernel
class ResizeGeneralKernel(Kernel):
    """Separable weight matrices (numpy tensordot, float64): the only kernel for cubic, antialias and
    tf_crop_and_resize nodes."""

    name = "resize_general"
    ops = ("Resize",)
    priority = 50

    def applies(self, layer: Layer) -> bool:
        return extended(layer.node)

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        np.copyto(outputs[0], resize_ext(layer.node, full_inputs(layer, inputs, params))[0])
