"""Vulkan kernels for BatchNormalization (standalone: a per-channel affine, ``affine.comp``),
LayerNormalization and InstanceNormalization (``norm.comp``: a workgroup per normalized row)."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..vulkan.kernel import Caps, Dispatch, In, Out, Param, VulkanKernel, act_of, act_supported, grid
from .base import Layer, register_kernel
from .norm import _ln_axis, bn_scale_shift

F32 = np.float32


@register_kernel
class VkBatchNorm(VulkanKernel):
    name = "vk_affine"
    ops = ("BatchNormalization",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        return all(k in layer.const_inputs for k in range(1, 5)) and act_supported(layer) \
            and len([o for o in layer.node.outputs if o]) == 1

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


@register_kernel
class VkNorm(VulkanKernel):
    name = "vk_norm"
    ops = ("LayerNormalization", "InstanceNormalization")
    priority = 10

    def applies(self, layer: Layer) -> bool:
        if not act_supported(layer) or len([o for o in layer.node.outputs if o]) != 1:
            return False
        return all(k in layer.const_inputs for k in (1, 2) if layer.has_input(k))

    def _geom(self, layer: Layer) -> tuple[int, int, int]:
        """(rows, D, C)."""
        shape = layer.in_shape(0)
        if layer.op == "LayerNormalization":
            ax = _ln_axis(layer.node, len(shape))
            d = int(np.prod(shape[ax:], dtype=np.int64))
            return int(np.prod(shape[:ax], dtype=np.int64)), d, 1
        return shape[0] * shape[1], int(np.prod(shape[2:], dtype=np.int64)), shape[1]

    def transformed_nbytes(self, layer: Layer) -> int:
        _, d, c = self._geom(layer)
        return 8 * (d if layer.op == "LayerNormalization" else c)

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        shape = layer.in_shape(0)
        out = {}
        if layer.op == "LayerNormalization":
            norm = tuple(shape[_ln_axis(layer.node, len(shape)):])
            for key, name in (("in1", "s"), ("in2", "b")):
                if key in raw:
                    out[name] = np.ascontiguousarray(np.broadcast_to(np.asarray(raw[key], F32), norm).reshape(-1))
        else:
            out["s"] = np.ascontiguousarray(raw["in1"], F32).reshape(-1)
            out["b"] = np.ascontiguousarray(raw["in2"], F32).reshape(-1)
        return out

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        rows, d, c = self._geom(layer)
        a = act_of(layer)
        has_b = "b" in params
        binds = (In(0), Param("s")) + ((Param("b"),) if has_b else ()) + (Out(0),)
        return [Dispatch("norm", binds, grid(rows, 1, caps),
                         {"MODE": int(layer.op == "InstanceNormalization"), "HAS_BIAS": int(has_b), "ACT": a[0]},
                         push={"rows": rows, "D": d, "C": c, "eps": float(layer.attr("epsilon", 1e-5)),
                               "act_a": a[1], "act_b": a[2]})]
