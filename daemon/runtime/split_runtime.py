"""A Vulkan model whose tail is shaped at run time (a detector's post-processing: NonMaxSuppression, TopK with a
run-time k, and everything computed from their outputs): the static head runs on the GPU, the tail on the CPU.

The Vulkan backend plans static shapes, so it cannot hold a tensor whose size a run decides. Every node whose
outputs are run-time shaped (``Graph.runtime_shaped``, which the importer closes downstream: a node reading such a
tensor is one too) goes to the tail; everything else, the backbone and heads that do the work, stays on the GPU.
The head never reads a tail tensor (that would make it run-time shaped), so one GPU run and then one CPU run
compute the model, and only the head's tensors the tail reads cross (the ``crossing`` outputs of the head).

``split_at_runtime_shapes`` is a pure function of the graph; ``SplitExecutor`` runs the two parts in order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir import Graph


@dataclass(frozen=True)
class RuntimeSplit:
    """The static head (GPU), the run-time shaped tail (CPU), and the head's tensors the tail reads."""
    head: Graph
    tail: Graph
    crossing: tuple[str, ...]


def split_at_runtime_shapes(graph: Graph) -> RuntimeSplit | None:
    """The split of ``graph`` at its run-time shaped tensors; None when it has none, or when no node stays
    static (nothing for a GPU to run)."""
    rs = graph.runtime_shaped
    if not rs:
        return None
    head_nodes = [n for n in graph.nodes if not any(o in rs for o in n.outputs if o)]
    tail_nodes = [n for n in graph.nodes if any(o in rs for o in n.outputs if o)]
    if not head_nodes or not tail_nodes:
        return None
    produced = {o for n in head_nodes for o in n.outputs if o}
    out_names = [t.name for t in graph.outputs]
    crossing: list[str] = []
    for n in tail_nodes:
        for i in n.inputs:
            if i and i in produced and i not in crossing:
                crossing.append(i)
    head_outs = crossing + [o for o in out_names if o in produced and o not in crossing]

    def used(nodes: list) -> set[str]:  # type: ignore[type-arg]
        return {i for n in nodes for i in n.inputs if i}

    head_used, tail_used = used(head_nodes), used(tail_nodes)
    head = Graph(f"{graph.name}#gpu", head_nodes, [t for t in graph.inputs if t.name in head_used],
                 [graph.infos[o] for o in head_outs],
                 {k: v for k, v in graph.constants.items() if k in head_used},
                 {k: v for k, v in graph.infos.items() if k in head_used or k in produced}, graph.opset)
    tail_inputs = [graph.infos[c] for c in crossing] + [t for t in graph.inputs if t.name in tail_used]
    tail_produced = {o for n in tail_nodes for o in n.outputs if o}
    tail = Graph(f"{graph.name}#cpu", tail_nodes, tail_inputs, [graph.infos[o] for o in out_names if o in tail_produced],
                 {k: v for k, v in graph.constants.items() if k in tail_used},
                 {k: v for k, v in graph.infos.items() if k in tail_used or k in tail_produced}, graph.opset)
    tail.runtime_shaped = set(rs)
    return RuntimeSplit(head, tail, tuple(crossing))


class SplitExecutor:
    """Runs a ``RuntimeSplit``: the head (a loaded Vulkan ``Model``), then the tail (a ``CpuExecutor``) on the
    head's crossing tensors; the outputs in the whole graph's order."""

    def __init__(self, split: RuntimeSplit, head: Any, tail: Any, outputs: list[str]) -> None:
        self.split = split
        self.head = head
        self.tail = tail
        self.outputs = outputs
        self._head_in = [t.name for t in split.head.inputs]
        self._tail_graph_in = [t.name for t in split.tail.inputs if t.name not in split.crossing]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        got = self.head.run({n: feeds[n] for n in self._head_in})
        tail_feeds = {c: got[c] for c in self.split.crossing}
        tail_feeds.update({n: feeds[n] for n in self._tail_graph_in})
        got.update(self.tail.run(tail_feeds))
        return {o: got[o] for o in self.outputs}

    @property
    def kernel_names(self) -> dict[str, str]:
        """node name -> kernel; the tail's nodes are marked as run on the CPU."""
        names = dict(self.head.kernels)
        names.update({layer.name: f"cpu:{k.name}" for layer, k in getattr(self.tail, "choice", [])})
        return names

    @property
    def memory_bytes(self) -> int:
        return int(self.head.memory_bytes) + int(self.tail.memory_bytes)

    @property
    def memory_breakdown(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for part in (self.head.memory_breakdown, getattr(self.tail, "memory_breakdown", {})):
            for k, v in part.items():
                out[k] = out.get(k, 0) + int(v)
        return out

    def adopt(self, other: Any) -> dict[str, int]:
        """A variant of a dynamic model at another shape: its head is a Vulkan model of its own, so nothing is
        shared with ``other`` (counts as ``Model`` reports them)."""
        return {"shared": 0, "own": len(self.split.head.nodes) + len(self.split.tail.nodes)}

    def close(self) -> None:
        self.head.close()
        close = getattr(self.tail, "close", None)
        if close is not None:
            close()
