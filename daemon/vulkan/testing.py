"""Helpers for tests and microbenchmarks of Vulkan kernels: one-node graphs checked against the numpy oracle."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..ir import Graph
from ..ops.base import Layer, op_spec, single_node_layer


def graph_of_layer(layer: Layer, inputs: Sequence[np.ndarray | None]) -> Graph:
    """A one-node Graph: constant inputs of ``layer`` become graph constants, the others graph inputs."""
    node = layer.node
    consts = {node.inputs[k]: np.asarray(inputs[k]) for k in layer.const_inputs}
    infos = {t.name: t for t in layer.inputs if t is not None}
    infos.update({t.name: t for t in layer.outputs})
    gins = [t for k, t in enumerate(layer.inputs) if t is not None and k not in layer.const_inputs]
    return Graph(f"single_{node.op}", [node], gins, list(layer.outputs), consts, infos,
                 int(node.attrs.get("_opset", 17)))


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| / max |ref| (absolute when ref is all zeros)."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        raise AssertionError(f"shape {got.shape} != reference shape {ref.shape}")
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    diff = float(np.max(np.abs(got - ref))) if ref.size else 0.0
    return diff / scale if scale > 0 else diff


def run_single(device: Any, op: str, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any] | None = None,
               const: Sequence[bool] | None = None, kernel: str | None = None, n_outputs: int = 1,
               cache: Any = None) -> tuple[list[np.ndarray], list[np.ndarray], Any]:
    """Run one op on ``device`` (forcing ``kernel`` if given); returns (vulkan outputs, reference outputs, model stats)."""
    from .model import VulkanModel
    layer = single_node_layer(op, inputs, dict(attrs or {}), const, n_outputs)
    g = graph_of_layer(layer, inputs)
    forced = {layer.node.name: kernel} if kernel else None
    with VulkanModel(g, device, kernels=forced, cache=cache) as m:
        feeds = {layer.node.inputs[k]: np.asarray(inputs[k]) for k, t in enumerate(layer.inputs)
                 if t is not None and k not in layer.const_inputs}
        out = m.run(feeds)
        stats = dict(m.load_stats, kernels=m.kernel_names)
    spec = op_spec(op)
    assert spec is not None
    ref = spec.reference(layer.node, [None if a is None else np.asarray(a) for a in inputs])
    names = [o for o in layer.node.outputs]
    return [out[n] for n in names], [np.asarray(r) for r in ref], stats


def coexec_skip_reason() -> str | None:
    """Why CPU-GPU co-execution cannot be tested here (None: it can): no Vulkan device, or one whose memory the
    CPU cannot share in place (a discrete GPU: cpu+vulkan falls back to the GPU there, tested on its own)."""
    from . import available

    if not available():
        return "no Vulkan device"
    from ..coexec.engine import unsupported_reason
    from .device import get_device

    why = unsupported_reason(get_device())
    return f"no co-execution on this device: {why}" if why else None
