"""Vulkan kernels for BatchNormalization (standalone: a per-channel affine, ``affine.comp``) and the row
normalizations (``norm.comp``: a workgroup per normalized row): LayerNormalization, InstanceNormalization,
GroupNormalization, RMSNormalization and onnxruntime's (Skip)(Simplified)LayerNormalization."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..vulkan.kernel import Caps, Dispatch, In, Out, Param, VulkanKernel, act_of, act_supported, grid
from .base import MS, Layer, register_kernel
from .norm import _ln_axis, bn_scale_shift, bn_training

F32 = np.float32


@register_kernel
class VkBatchNorm(VulkanKernel):
    name = "vk_affine"
    ops = ("BatchNormalization",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        # (training_mode normalises with the batch's statistics: the CPU computes them)
        return all(k in layer.const_inputs for k in range(1, 5)) and act_supported(layer) \
            and len([o for o in layer.node.outputs if o]) == 1 and not bn_training(layer.node)

    def _geom(self, layer: Layer) -> tuple[int, int]:
        shape = layer.in_shape(0)
        p = layer.in_shape(1)
        if len(p) > 1:  # spatial=0 form: parameters per element of x.shape[1:]
            return int(np.prod(shape[1:], dtype=np.int64)), 1
        return shape[1], int(np.prod(shape[2:], dtype=np.int64))

    def transformed_nbytes(self, layer: Layer) -> int:
        return 8 * self._geom(layer)[0]

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        c, _ = self._geom(layer)
        shape = layer.in_shape(0)
        s, t = bn_scale_shift(raw["in1"], raw["in2"], raw["in3"], raw["in4"], float(layer.attr("epsilon", 1e-5)))
        if s.ndim > 1:
            s = np.broadcast_to(s, shape[1:])
            t = np.broadcast_to(t, shape[1:])
        return {"s": np.ascontiguousarray(s.reshape(c), F32), "t": np.ascontiguousarray(t.reshape(c), F32)}

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        c, inner = self._geom(layer)
        n = layer.outputs[0].size
        a = act_of(layer)
        return [Dispatch("affine", (In(0), Param("s"), Param("t"), Out(0)), grid(n, 256, caps), {"ACT": a[0]},
                         push={"n": n, "C": c, "inner": inner, "act_a": a[1], "act_b": a[2]})]


@dataclass(frozen=True)
class _NormGeom:
    """How one node maps onto norm.comp: ``rows`` rows of ``d`` elements; ``c`` (channels for MODE 1, groups for
    MODE 2) and ``inner`` (elements per channel, MODE 2); the input positions of scale, bias, skip and skip bias
    (None: absent) and the output positions of mean, inv_std and the skip sum (None: not asked for)."""

    mode: int
    rms: bool
    rows: int
    d: int
    c: int
    inner: int
    eps: float
    scale: int
    bias: int | None = None
    skip: int | None = None
    skip_bias: int | None = None
    mean_out: int | None = None
    inv_out: int | None = None
    sum_out: int | None = None


def _out(layer: Layer, k: int) -> int | None:
    return k if k < len(layer.node.outputs) and layer.node.outputs[k] else None


def _inp(layer: Layer, k: int) -> int | None:
    return k if layer.has_input(k) else None


def _norm_geom(layer: Layer) -> _NormGeom:
    shape = layer.in_shape(0)
    op = layer.op
    eps = float(layer.attr("epsilon", 1e-12 if op.startswith(MS) else 1e-5))
    if op == "InstanceNormalization":
        return _NormGeom(1, False, shape[0] * shape[1], int(np.prod(shape[2:], dtype=np.int64)), shape[1], 1, eps, 1,
                         _inp(layer, 2))
    if op == "GroupNormalization":
        g = int(layer.attr("num_groups"))
        inner = int(np.prod(shape[2:], dtype=np.int64))
        return _NormGeom(2, False, shape[0] * g, shape[1] // g * inner, g, inner, eps, 1, _inp(layer, 2))
    if op in (MS + "SkipLayerNormalization", MS + "SkipSimplifiedLayerNormalization"):
        simple = op == MS + "SkipSimplifiedLayerNormalization"
        d = shape[-1]
        return _NormGeom(0, simple, int(np.prod(shape, dtype=np.int64)) // max(d, 1), d, 1, 1, eps, 2,
                         None if simple else _inp(layer, 3), 1, _inp(layer, 3 if simple else 4),
                         _out(layer, 1), _out(layer, 2), _out(layer, 3))
    ax = _ln_axis(layer.node, len(shape))  # LayerNormalization, RMSNormalization, SimplifiedLayerNormalization
    rows, d = int(np.prod(shape[:ax], dtype=np.int64)), int(np.prod(shape[ax:], dtype=np.int64))
    if op == "LayerNormalization":
        return _NormGeom(0, False, rows, d, 1, 1, eps, 1, _inp(layer, 2), mean_out=_out(layer, 1),
                         inv_out=_out(layer, 2))
    return _NormGeom(0, True, rows, d, 1, 1, eps, 1,
                     inv_out=_out(layer, 1) if op == "SimplifiedLayerNormalization" else None)


def _norm_shape(layer: Layer) -> tuple[int, ...]:
    """The normalized shape a per-element scale/bias broadcasts to (onnxruntime's ops: the last axis)."""
    shape = layer.in_shape(0)
    ax = len(shape) - 1 if layer.op.startswith(MS) else _ln_axis(layer.node, len(shape))
    return tuple(shape[ax:])


def _broadcasts(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    try:
        return np.broadcast_shapes(tuple(shape), to) == to
    except ValueError:
        return False


def _param_len(layer: Layer, g: _NormGeom) -> int:
    """Elements a scale/bias binding holds: one per row element (MODE 0) or per channel."""
    if g.mode == 0:
        return g.d
    return layer.in_shape(0)[1]


def _skip_rows(layer: Layer, g: _NormGeom) -> int | None:
    """Rows of the skip input, repeated over the input's rows (numpy broadcasting of a trailing-dims skip), or None
    when the skip broadcasts otherwise."""
    assert g.skip is not None
    xs, ss = list(layer.in_shape(0)), list(layer.in_shape(g.skip))
    while ss and ss[0] == 1 and len(ss) > 1:
        ss.pop(0)
    if len(ss) > len(xs) or ss != xs[len(xs) - len(ss):] or int(np.prod(ss, dtype=np.int64)) % max(g.d, 1):
        return None
    return int(np.prod(ss, dtype=np.int64)) // g.d


@register_kernel
class VkNorm(VulkanKernel):
    """The normalizations of one row at a time (``norm.comp``): LayerNormalization (with its Mean/InvStdDev
    outputs), InstanceNormalization, GroupNormalization, RMSNormalization and onnxruntime's
    SimplifiedLayerNormalization, SkipLayerNormalization and SkipSimplifiedLayerNormalization (the skip sum and
    the statistics outputs included). A constant scale/bias is broadcast at load to one value per row element
    (per channel for Instance/GroupNormalization, per-group ones repeated); one fed at run time must already have
    that many elements."""

    name = "vk_norm"
    ops = ("LayerNormalization", "InstanceNormalization", "GroupNormalization", "RMSNormalization",
           "SimplifiedLayerNormalization", MS + "SkipLayerNormalization", MS + "SkipSimplifiedLayerNormalization")
    priority = 10

    def applies(self, layer: Layer) -> bool:
        if not act_supported(layer) or not layer.outputs or layer.outputs[0].size == 0:
            return False
        g = _norm_geom(layer)
        if g.d == 0 or (g.skip is not None and _skip_rows(layer, g) is None):
            return False
        n = _param_len(layer, g)
        for k in (g.scale, g.bias, g.skip_bias):
            if k is None:
                continue
            if k in layer.const_inputs:
                if (g.mode == 0 or k == g.skip_bias) and not _broadcasts(layer.in_shape(k), _norm_shape(layer)):
                    return False  # transform broadcasts it to the normalized shape
                continue
            if int(np.prod(layer.in_shape(k), dtype=np.int64)) != (g.d if k == g.skip_bias else n):
                return False  # a run-time scale/bias must be bound as it is: one value per element it scales
        return True

    def _const_len(self, layer: Layer, g: _NormGeom, k: int) -> int:
        """Elements the transformed constant input ``k`` holds."""
        if k == g.skip:
            return layer.inputs[k].size  # type: ignore[union-attr]
        return g.d if k == g.skip_bias else _param_len(layer, g)

    def transformed_nbytes(self, layer: Layer) -> int:
        g = _norm_geom(layer)
        return sum(4 * self._const_len(layer, g, k) for k in layer.const_inputs if k)

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = _norm_geom(layer)
        shape = layer.in_shape(0)
        norm = _norm_shape(layer)
        out = {}
        for key, v in raw.items():
            k = int(key[2:])
            v = np.asarray(v, F32)
            if k == 0:
                continue  # the kernel needs a run-time x (applies() is not asked for a constant one: it folds)
            if k == g.skip:
                v = v.reshape(-1)
            elif g.mode == 0 or k == g.skip_bias:
                v = np.broadcast_to(v, norm).reshape(-1)
            else:
                v = v.reshape(-1)
                if v.size != shape[1]:  # GroupNormalization opset 18: one value per group
                    v = np.repeat(v, shape[1] // v.size)
            out[key] = np.ascontiguousarray(v)
        return out

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        g = _norm_geom(layer)
        a = act_of(layer)
        ins = [k for k in (g.skip, g.skip_bias, g.scale, g.bias) if k is not None]
        outs = [k for k in (0, g.mean_out, g.inv_out, g.sum_out) if k is not None]
        stats = int(g.mean_out is not None) | 2 * int(g.inv_out is not None)
        defines = {"MODE": g.mode, "HAS_BIAS": int(g.bias is not None), "ACT": a[0], "RMS": int(g.rms),
                   "SKIP": int(g.skip is not None), "SKIP_BIAS": int(g.skip_bias is not None),
                   "SUM_OUT": int(g.sum_out is not None), "STATS": stats}
        return [Dispatch("norm", (In(0),) + tuple(In(k) for k in ins) + tuple(Out(k) for k in outs),
                         grid(g.rows, 1, caps), defines,
                         push={"rows": g.rows, "D": g.d, "C": g.c, "inner": g.inner, "eps": g.eps,
                               "skip_rows": _skip_rows(layer, g) if g.skip is not None else 1,
                               "act_a": a[1], "act_b": a[2]})]
