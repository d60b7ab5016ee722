"""Host steps of a Vulkan model: the nodes it runs on the host between recorded command-buffer segments.

* Control flow (If, Loop, Scan) whose decision depends on values: the segment before it is submitted and
  waited for, the node reads its condition (and inputs) from the mapped activations (the readback deciding
  costs), and runs the body it takes as a nested Vulkan model, planned once at load with its own arena,
  kernels and recorded command buffer, then writes its outputs back into the activations.
* The integer and bool plumbing around such decisions (an int64 sample rate compared with a constant, a loop's
  iteration counter cast to float) that no Vulkan kernel handles: at most 4096 elements per tensor, computed by
  the op's numpy oracle.

* Mixed placement: a node no Vulkan kernel runs (its op has none, or none applies to its attributes, shapes or
  dtypes) runs on the CPU between GPU segments, with the CPU backend's kernel for it (native where there is one),
  its weights transformed once at load; only the tensors it reads and writes cross, through the mapped
  activations (no copy beyond that on a device whose memory the host shares).

All need host-visible activations (lavapipe, and a discrete GPU's resizable BAR); other devices refuse such a
model at load naming the node.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import BackendError
from ..ir import Graph, Node
from ..ops.base import Kernel, Layer, choose_kernel, kernels_for, op_spec, raw_key
from ..ops.control import CONTROL_OPS, DecideStats, run_control
from ..ops.quant import INT8_TYPES

#: at most this many elements in any tensor of an integer/bool host node (plumbing, not data)
HOST_PLUMBING_MAX = 4096


def _layer(node: Node, graph: Graph, consts: Mapping[str, Any]) -> Layer:
    ins = tuple(graph.infos.get(i) if i else None for i in node.inputs)
    outs = tuple(graph.infos[o] for o in node.outputs if o)
    return Layer(node, ins, outs, tuple(k for k, i in enumerate(node.inputs) if i and i in consts))


def on_cpu(node: Node, graph: Graph, consts: Mapping[str, Any], prefer: Sequence[str] = (), caps: Any = None) -> bool:
    """Whether ``node`` is placed on the CPU in a Vulkan model: no Vulkan kernel applies to it (none for its op,
    none for its attributes or shapes, none for its dtypes, none usable on this kind of device: ``caps``), or a
    tensor it reads or writes at run time is larger than a storage binding may be on every conformant device
    (kernels split weights that large, not activations), while a CPU kernel does. ``prefer``: kernel names to
    ask first (a stored plan's for this node, or one forced by the caller: the node runs on them even where the
    device's priority calls them unusable)."""
    from ..vulkan.executor import _misfit
    from ..vulkan.kernel import MAX_BINDING_BYTES, UNUSABLE_PRIORITY, VulkanKernel

    spec = op_spec(node.op)
    if spec is None or spec.alias or node.op in CONTROL_OPS or not kernels_for(node.op, "cpu"):
        return False
    if any(graph.infos[n].nbytes > MAX_BINDING_BYTES for n in (*node.inputs, *node.outputs) if n and n not in consts):
        return True
    layer = _layer(node, graph, consts)
    ks = kernels_for(node.op, "vulkan")
    if prefer:
        ks = sorted(ks, key=lambda k: prefer.index(k.name) if k.name in prefer else len(prefer))
    for k in ks:
        try:
            if (isinstance(k, VulkanKernel) and k.applies(layer) and _misfit(layer, k, consts) is None
                    and (caps is None or k.name in prefer or k.device_priority(caps, layer) < UNUSABLE_PRIORITY)):
                return False
        except Exception:  # a kernel that cannot even judge the layer does not run it
            continue
    return True


def is_host_node(node: Node, graph: Graph, consts: Mapping[str, Any], prefer: Sequence[str] = (),
                 caps: Any = None) -> bool:
    """Whether the Vulkan backend runs ``node`` on the host: control flow, integer/bool plumbing that no
    Vulkan kernel handles (every tensor it reads or writes at run time integer or bool, and small), or a node
    no Vulkan kernel runs (``on_cpu``)."""
    if node.op in CONTROL_OPS:
        return True
    names = [n for n in list(node.inputs) + list(node.outputs) if n and n not in consts]
    if not names:
        return False
    if on_cpu(node, graph, consts, prefer, caps):
        return True
    spec = op_spec(node.op)
    if spec is not None and spec.alias and all(np.dtype(graph.infos[n].dtype) in INT8_TYPES for n in names):
        return False  # a view of a quantised activation (resnet18's Flatten before its classifier): data, not plumbing
    # small tensors only, at least one of them integer or bool (an iteration counter cast to float qualifies)
    if any(graph.infos[n].size > HOST_PLUMBING_MAX for n in names):
        return False
    if not any(np.dtype(graph.infos[n].dtype).kind in "iub" for n in names):
        return False
    from ..vulkan.kernel import VulkanKernel

    # a Vulkan kernel that reads and writes these dtypes keeps the node on the device
    return not any(isinstance(k, VulkanKernel) and all(np.dtype(graph.infos[n].dtype).name in k.io_dtypes
                                                        for n in names) for k in kernels_for(node.op, "vulkan"))


class HostStep:
    """One host node of a Vulkan model: control flow with its bodies as nested models, or numpy plumbing."""

    def __init__(self, node: Node, graph: Graph, consts: Mapping[str, Any], make_body: Callable[[Graph], Any],
                 caps: Any = None, prefer: Sequence[str] = ()) -> None:
        """``make_body(graph)``: a body brought up whole on the device (with ``run`` and ``close``); the
        backend that owns this step passes it, so that this module needs none of its own. ``caps`` and
        ``prefer`` as the placement was asked with (``is_host_node``)."""
        self.node = node
        self.graph = graph
        self.consts = consts
        self.models: dict[str, Any] = {}
        self.stats = DecideStats()
        node.notes["stats"] = self.stats
        node.notes["backend"] = "vulkan"
        #: where the node runs, for ``kernel_names`` and ``inferd info``: "host" (control flow, plumbing through
        #: the oracle) or "cpu:<kernel>" (mixed placement)
        self.placement = "host"
        self._cpu: tuple[Layer, Kernel, dict[str, np.ndarray]] | None = None
        if node.op not in CONTROL_OPS and on_cpu(node, graph, consts, prefer, caps):
            layer = _layer(node, graph, consts)
            k = choose_kernel(layer, "cpu")
            self._cpu = (layer, k, k.transform(layer, {raw_key(i): np.asarray(consts[node.inputs[i]])
                                                       for i in layer.const_inputs}))
            self.placement = f"cpu:{k.name}"
        if node.op in CONTROL_OPS:
            for key, body in node.bodies.items():
                if body.runtime_shaped:
                    raise BackendError(f"node {node.name} ({node.op}): body {key!r} has tensors shaped at run time "
                                       f"({sorted(body.runtime_shaped)[:3]}); the Vulkan backend plans static shapes")
                try:
                    self.models[key] = make_body(body)
                except BaseException:
                    self.close()
                    raise

    def run(self, read: Any, write: Any) -> None:
        """``read(name) -> array`` (an activation or constant), ``write(name, array)``."""
        t0 = time.perf_counter()
        node = self.node
        ins = [None if not n else (np.asarray(self.consts[n]) if n in self.consts else read(n)) for n in node.inputs]
        t1 = time.perf_counter()
        if node.op in CONTROL_OPS:
            def run_body(key: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
                self.stats.taken[key] = self.stats.taken.get(key, 0) + 1
                m = self.models[key]
                out = m.run({t.name: feeds[t.name] for t in m.input_infos})
                return [out[t.name] for t in m.graph.outputs]

            res = run_control(node, ins, run_body)
        elif self._cpu is not None:
            layer, k, params = self._cpu
            dyn = [None if i in layer.const_inputs else x for i, x in enumerate(ins)]
            outs = [np.empty(o.shape, o.dtype) for o in layer.outputs]
            k.run(layer, dyn, params, outs)
            it = iter(outs)
            res = [next(it) if o else None for o in node.outputs]
        else:
            spec = op_spec(node.op)
            assert spec is not None
            res = spec.reference(node, ins)
        for o, r in zip(node.outputs, res):
            if o and r is not None:
                write(o, np.asarray(r))
        self.stats.runs += 1
        self.stats.decide_s += t1 - t0  # reading the inputs back: what deciding costs beyond the bodies
        self.stats.body_s = getattr(self.stats, "body_s", 0.0) + time.perf_counter() - t1

    def close(self) -> None:
        for m in self.models.values():
            m.close()
        self.models = {}
