"""Vulkan kernel for GridSample of 4-D inputs (``gridsample.comp``): nearest and bilinear sampling with zeros,
border or reflection padding, align_corners either way. Bicubic and volumetric (5-D) GridSample have no Vulkan
kernel: a Vulkan model runs those nodes on the CPU."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..vulkan.kernel import Caps, Dispatch, In, Out, VulkanKernel, grid
from .base import Layer, register_kernel
from .sampling import _gs_mode

_PADS = {"zeros": 0, "border": 1, "reflection": 2}


@register_kernel
class VkGridSample(VulkanKernel):
    name = "vk_grid_sample"
    ops = ("GridSample",)

    def applies(self, layer: Layer) -> bool:
        mode, _, _ = _gs_mode(layer.node)
        return (len(layer.in_shape(0)) == 4 and mode in ("nearest", "linear") and 0 not in layer.const_inputs
                and layer.outputs[0].size > 0 and layer.inputs[0].size > 0)  # type: ignore[union-attr]

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        mode, pad, align = _gs_mode(layer.node)
        n, c, h, w = layer.in_shape(0)
        _, ho, wo, _ = layer.in_shape(1)
        pixels = n * ho * wo
        return [Dispatch("gridsample", (In(0), In(1), Out(0)), grid(pixels, 64, caps),
                         {"MODE": int(mode == "linear"), "PAD": _PADS[pad], "ALIGN": int(align)},
                         push={"n": pixels, "C": c, "H": h, "W": w, "HWo": ho * wo})]
