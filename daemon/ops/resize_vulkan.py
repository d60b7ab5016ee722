"""Vulkan kernel for Resize/Upsample (nearest and linear) over the last two dims.

The per-axis gather tables (source indices and weights, exactly those of the CPU oracle's
``axis_table``: coordinate transformation, nearest rounding, clamping) are computed once on the host
as the kernel's weight transform; the shader (``resize.comp``) is a separable 1- or 2-tap gather.
Axes other than the last two must be left unchanged.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..vulkan.kernel import Caps, Dispatch, In, Out, Param, VulkanKernel, grid
from .base import Layer, register_kernel
from .resize import extended
from .resize import _input_positions, axis_table, resize_plan


def _plan(layer: Layer, raw: Mapping[str, np.ndarray]):
    si, zi = _input_positions(layer.node)
    return resize_plan(layer.node, layer.in_shape(0), raw.get(f"in{si}") if si is not None else None,
                       raw.get(f"in{zi}") if zi is not None else None)


@register_kernel
class VkResize(VulkanKernel):
    name = "vk_resize"
    ops = ("Resize", "Upsample")
    priority = 10

    def applies(self, layer: Layer) -> bool:
        shape = tuple(layer.in_shape(0))
        out = tuple(layer.out_shape())
        if 0 in layer.const_inputs or len(shape) < 2 or layer.attr("act") is not None or extended(layer.node):
            return False  # cubic, antialias, tf_crop_and_resize: the CPU's resize_general only
        si, zi = _input_positions(layer.node)
        if any(k is not None and k not in layer.const_inputs for k in (si, zi)):
            return False
        return shape[:-2] == out[:-2]

    def transformed_nbytes(self, layer: Layer) -> int:
        oh, ow = layer.out_shape()[-2:]
        return 4 * 4 * (oh + ow) * 2

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        p = _plan(layer, raw)
        rank = len(p.in_shape)
        for a in range(rank - 2):
            t = axis_table(p.mode, p.ctm, p.nearest_mode, p.in_shape[a], p.out_shape[a], p.scales[a])
            ident = np.array_equal(t[0], np.arange(p.out_shape[a])) and (p.mode == "nearest" or not t[3].any())
            if p.in_shape[a] != p.out_shape[a] or not ident:
                raise ValueError(f"Resize {layer.name!r}: only the last two axes may be resized")
        taps = 1 if p.mode == "nearest" else 2
        parts = []
        for a in (rank - 2, rank - 1):
            t = axis_table(p.mode, p.ctm, p.nearest_mode, p.in_shape[a], p.out_shape[a], p.scales[a])
            if taps == 1:
                idx, w = t[0][:, None], np.ones((len(t[0]), 1))
            else:
                idx = np.stack([t[0], t[1]], 1)
                w = np.stack([t[2], t[3]], 1)
            parts.append((idx.astype(np.float32).reshape(-1), w.astype(np.float32).reshape(-1)))
        tab = np.concatenate([parts[0][0], parts[0][1], parts[1][0], parts[1][1]])
        return {"tab": np.ascontiguousarray(tab, np.float32), "taps": np.array([taps], np.int32)}

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        shape = tuple(layer.in_shape(0))
        out = tuple(layer.out_shape())
        n = layer.outputs[0].size
        return [Dispatch("resize", (In(0), Param("tab"), Out(0)), grid(n, 256, caps), {"TAPS": int(params["taps"][0])},
                         push={"n": n, "IH": shape[-2], "IW": shape[-1], "OH": out[-2], "OW": out[-1]})]
