"""Vulkan kernels for pooling: MaxPool/AveragePool (``pool.comp``, 1-D and 2-D) and
GlobalAveragePool/GlobalMaxPool (``reduce.comp``, one workgroup per (n, c) row)."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..vulkan.kernel import UNUSABLE_PRIORITY, Caps, Dispatch, In, Out, VulkanKernel, act_of, act_supported, grid
from .base import Layer, register_kernel
from .pool import pool_geometry


@register_kernel
class VkPool(VulkanKernel):
    name = "vk_pool"
    ops = ("MaxPool", "AveragePool")
    priority = 10

    def applies(self, layer: Layer) -> bool:
        # float pooling: an 8-bit MaxPool (a QDQ model's) is quant_vulkan's vk_qmaxpool
        if np.dtype(layer.inputs[0].dtype) != np.float32 or len(layer.in_shape(0)) not in (3, 4) \
                or not act_supported(layer):  # type: ignore[union-attr]
            return False
        if len([o for o in layer.node.outputs if o]) != 1:
            return False
        try:
            pool_geometry(layer.node, layer.in_shape(0))
        except Exception:
            return False
        return True

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        shape = layer.in_shape(0)
        g = pool_geometry(layer.node, shape)
        if len(shape) == 3:  # 1-D: H = 1
            h, w = 1, shape[2]
            kh, kw, sh, sw, dh, dw = 1, g.kernel[0], 1, g.strides[0], 1, g.dilations[0]
            pt, pl, pb, pr, oh, ow = 0, g.pads_head[0], 0, g.pads_tail[0], 1, g.out[0]
        else:
            h, w = shape[2], shape[3]
            kh, kw = g.kernel
            sh, sw = g.strides
            dh, dw = g.dilations
            pt, pl = g.pads_head
            pb, pr = g.pads_tail
            oh, ow = g.out
        include = bool(layer.attr("count_include_pad", 0))
        lo_h, hi_h = (-pt, h + pb) if include else (0, h)
        lo_w, hi_w = (-pl, w + pr) if include else (0, w)
        total = shape[0] * shape[1] * oh * ow
        a = act_of(layer)
        return [Dispatch("pool", (In(0), Out(0)), grid(total, 256, caps),
                         {"MAXPOOL": int(layer.op == "MaxPool"), "ACT": a[0]},
                         push={"total": total, "H": h, "W": w, "OH": oh, "OW": ow, "KH": kh, "KW": kw, "SH": sh,
                               "SW": sw, "DH": dh, "DW": dw, "PT": pt, "PL": pl, "LOH": lo_h, "HIH": hi_h,
                               "LOW": lo_w, "HIW": hi_w, "act_a": a[1], "act_b": a[2]})]


@register_kernel
class VkGlobalPool(VulkanKernel):
    name = "vk_global_pool"
    ops = ("GlobalAveragePool", "GlobalMaxPool")
    priority = 10

    def applies(self, layer: Layer) -> bool:
        return len(layer.in_shape(0)) >= 3 and act_supported(layer)

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        shape = layer.in_shape(0)
        rows = shape[0] * shape[1]
        r = int(np.prod(shape[2:], dtype=np.int64))
        a = act_of(layer)
        return [Dispatch("reduce", (In(0), Out(0)), grid(rows, 1, caps),
                         {"OP": 1 if layer.op == "GlobalAveragePool" else 2, "ROWS": 1, "ACT": a[0]},
                         push={"outer": rows, "R": r, "inner": 1, "act_a": a[1], "act_b": a[2]})]


@register_kernel
class VkPoolTex(VkPool):
    """``vk_pool`` for CPU-type devices: ``pool_tex.comp`` reads the input through an RGBA32F texel view
    (on lavapipe a gather, where a storage-buffer load is a per-lane loop)."""

    name = "vk_pool_tex"
    priority = 200

    def device_priority(self, caps: Caps, layer: Layer | None = None) -> int:
        return 3 if caps.device_type == "cpu" else UNUSABLE_PRIORITY

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        return [Dispatch("pool_tex", d.bindings, d.groups, d.defines, d.spec, d.push)
                for d in super().dispatches(layer, params, caps)]


@register_kernel
class VkGlobalPoolTex(VkGlobalPool):
    """``vk_global_pool`` for CPU-type devices: one invocation per row reading it through an RGBA32F
    texel view (``gpool_tex.comp``; reduce.comp's shared-memory tree costs a coroutine switch per
    barrier on lavapipe: resnet50's 17 ms -> well under 1 ms)."""

    name = "vk_global_pool_tex"
    priority = 200

    def device_priority(self, caps: Caps, layer: Layer | None = None) -> int:
        return 3 if caps.device_type == "cpu" else UNUSABLE_PRIORITY

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        shape = layer.in_shape(0)
        rows = shape[0] * shape[1]
        r = int(np.prod(shape[2:], dtype=np.int64))
        a = act_of(layer)
        return [Dispatch("gpool_tex", (In(0), Out(0)), grid(rows, 64, caps),
                         {"OP": 1 if layer.op == "GlobalAveragePool" else 2, "ACT": a[0]},
                         push={"rows": rows, "R": r, "act_a": a[1], "act_b": a[2]})]
