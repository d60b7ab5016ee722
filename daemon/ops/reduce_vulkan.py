"""Vulkan kernels for Reduce* and Softmax/LogSoftmax.

Both view the input as [outer, R, inner]; with inner == 1 each output row gets a 256-invocation
workgroup and a shared-memory tree (``ROWS=1``), otherwise one invocation walks each column. A reduction
whose axes form two runs once size-1 dims are dropped (Keras' GroupNormalization on NHWC reshapes to
[N, H, W, G, C/G] and reduces axes 1, 2 and 4) views it as [outer, Ra, mid, Rb, inner] instead (``GAP=1``);
more runs than two have no Vulkan kernel (a Vulkan model runs such a node on the CPU).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..vulkan.kernel import Caps, Dispatch, In, Out, VulkanKernel, act_of, act_supported, grid
from .base import Layer, register_kernel
from .reduce import REDUCE_OPS, _cumsum_axis, _softmax_axis, reduce_axes

OPS = {"ReduceSum": 0, "ReduceMean": 1, "ReduceMax": 2, "ReduceMin": 3, "ReduceProd": 4, "ReduceL1": 5,
       "ReduceL2": 6, "ReduceSumSquare": 7, "ReduceLogSum": 8, "ReduceLogSumExp": 9}


def _five(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, int, int, int, int] | None:
    """(outer, Ra, mid, Rb, inner): the input viewed as [outer, Ra, mid, Rb, inner] and reduced over Ra and Rb,
    when the reduced axes form at most two runs once size-1 dims are dropped (one run: mid == Rb == 1);
    None for more runs."""
    groups: list[list[Any]] = []  # [size, reduced] of maximal runs of reduced or kept dims
    for d, n in enumerate(shape):
        if n == 1:
            continue
        if groups and groups[-1][1] == (d in axes):
            groups[-1][0] *= n
        else:
            groups.append([n, d in axes])
    if not any(red for _, red in groups):
        return int(np.prod(shape, dtype=np.int64)), 1, 1, 1, 1
    outer = groups.pop(0)[0] if not groups[0][1] else 1
    inner = groups.pop()[0] if not groups[-1][1] else 1
    if len(groups) == 1:
        return outer, groups[0][0], 1, 1, inner
    if len(groups) == 3:
        return outer, groups[0][0], groups[1][0], groups[2][0], inner
    return None


def _axes(layer: Layer, params: Mapping[str, np.ndarray] | None) -> tuple[int, ...] | None:
    axes_in = None
    if len(layer.node.inputs) > 1 and layer.node.inputs[1]:
        if params is None or "axes" not in params:
            raise ValueError("the axes input must be a constant")
        axes_in = params["axes"]
    return reduce_axes(layer.node, len(layer.in_shape(0)), axes_in)


@register_kernel
class VkReduce(VulkanKernel):
    name = "vk_reduce"
    ops = REDUCE_OPS
    priority = 10

    def applies(self, layer: Layer) -> bool:
        if not act_supported(layer):
            return False
        if len(layer.node.inputs) > 1 and layer.node.inputs[1]:
            # axes given as an input: its values reach ``refuses``, which checks the runs
            return 1 in layer.const_inputs
        axes = reduce_axes(layer.node, len(layer.in_shape(0)), None)
        return axes is None or _five(tuple(layer.in_shape(0)), axes) is not None

    def refuses(self, layer: Layer, consts: Mapping[str, Any]) -> str | None:
        name = layer.node.inputs[1] if len(layer.node.inputs) > 1 else ""
        if not name or name not in consts:
            return None
        shape = tuple(layer.in_shape(0))
        try:
            axes = _axes(layer, self.transform(layer, {"in1": consts[name]}))
        except Exception as e:  # axes out of range and such: the CPU kernel reports them
            return str(e)
        if axes is not None and _five(shape, axes) is None:
            return f"reduced axes {list(axes)} of shape {list(shape)} form more than two runs"
        return None

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        if "in1" in raw:
            out["axes"] = np.asarray(raw["in1"], dtype=np.int64).reshape(-1)
        return out

    def transformed_nbytes(self, layer: Layer) -> int:
        return 8 * layer.inputs[1].size if 1 in layer.const_inputs else 0  # type: ignore[union-attr]

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        shape = tuple(layer.in_shape(0))
        axes = _axes(layer, params)
        a = act_of(layer)
        if axes is None:  # noop_with_empty_axes: a copy
            n = layer.outputs[0].size
            return [Dispatch("unary", (In(0), Out(0)), grid(n, 256, caps), {"UOP": 0, "ACT": a[0]},
                             push={"n": n, "alpha": 0.0, "beta": 0.0, "act_a": a[1], "act_b": a[2]})]
        five = _five(shape, axes)
        if five is None:
            raise ValueError(f"{layer.op} {layer.name!r}: reduced axes {axes} of shape {shape} form more than two "
                             "runs; the Vulkan kernel reduces one run or two with kept axes between")
        outer, ra, mid, rb, inner = five
        rows = inner == 1
        n = outer * mid
        push: dict[str, Any] = {"outer": outer, "R": ra * rb, "inner": inner, "act_a": a[1], "act_b": a[2]}
        defines = {"OP": OPS[layer.op], "ROWS": int(rows), "ACT": a[0]}
        if mid > 1:
            defines["GAP"] = 1
            push.update(mid=mid, rb=rb)
        return [Dispatch("reduce", (In(0), Out(0)), grid(n, 1, caps) if rows else grid(n * inner, 256, caps),
                         defines, push=push)]


@register_kernel
class VkSoftmax(VulkanKernel):
    name = "vk_softmax"
    ops = ("Softmax", "LogSoftmax")
    priority = 10

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        shape = tuple(layer.in_shape(0))
        node = layer.node
        axis = _softmax_axis(node, len(shape))
        opset = int(node.attr("_opset", 17))
        outer = int(np.prod(shape[:axis], dtype=np.int64))
        if opset < 13:  # normalised over the flattened tail
            length, inner = int(np.prod(shape[axis:], dtype=np.int64)), 1
        else:
            length, inner = shape[axis], int(np.prod(shape[axis + 1:], dtype=np.int64))
        rows = inner == 1
        return [Dispatch("softmax", (In(0), Out(0)), grid(outer, 1, caps) if rows else grid(outer * inner, 256, caps),
                         {"LOG": int(layer.op == "LogSoftmax"), "ROWS": int(rows)},
                         push={"outer": outer, "L": length, "inner": inner})]


@register_kernel
class VkArgMax(VulkanKernel):
    """ArgMax/ArgMin of a float tensor along one axis, to int64 (``argmax.comp``)."""

    name = "vk_argmax"
    ops = ("ArgMax", "ArgMin")
    priority = 10
    io_dtypes = ("float32", "int64")

    def applies(self, layer: Layer) -> bool:
        return layer.inputs[0] is not None and np.dtype(layer.inputs[0].dtype) == np.float32

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        shape = tuple(layer.in_shape(0))
        axis = int(layer.attr("axis", 0))
        axis = axis + len(shape) if axis < 0 else axis
        outer = int(np.prod(shape[:axis], dtype=np.int64))
        inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
        return [Dispatch("argmax", (In(0), Out(0)), grid(outer * inner, 256, caps),
                         {"MINIMUM": int(layer.op == "ArgMin"), "LAST": int(layer.attr("select_last_index", 0))},
                         push={"outer": outer, "R": shape[axis], "inner": inner})]


@register_kernel
class VkCumSum(VulkanKernel):
    """CumSum of a float tensor along a constant axis (``cumsum.comp``: a sequential walk per line, in float32 as
    the CPU kernel sums a float32 input); integer CumSum has no Vulkan kernel (a Vulkan model runs it on the CPU)."""

    name = "vk_cumsum"
    ops = ("CumSum",)

    def applies(self, layer: Layer) -> bool:
        return 1 in layer.const_inputs and len(layer.in_shape(0)) > 0 and layer.outputs[0].size > 0

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"axis": np.asarray(raw["in1"])}  # host-side: it sets push constants, nothing is uploaded

    def transformed_nbytes(self, layer: Layer) -> int:
        return 0

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        shape = layer.in_shape(0)
        a = _cumsum_axis(layer.node, params["axis"], len(shape))
        outer = int(np.prod(shape[:a], dtype=np.int64))
        inner = int(np.prod(shape[a + 1:], dtype=np.int64))
        lines = outer * inner
        return [Dispatch("cumsum", (In(0), Out(0)), grid(lines, 64, caps),
                         {"EXCLUSIVE": int(bool(layer.attr("exclusive", 0))), "REVERSE": int(bool(layer.attr("reverse", 0)))},
                         push={"lines": lines, "L": shape[a], "inner": inner})]
