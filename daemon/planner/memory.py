"""Lifetime-based activation memory planning: a pure function from tensor lifetimes to arena offsets.

Used by the CPU executor and the Vulkan arena. The memory-budget planner (preload-aware 2-D
packing of weights and activations) will supersede it; it consumes and produces the same
frozen types, so the runtimes do not change when it does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..ir import Graph
from ..ops.base import op_spec


@dataclass(frozen=True)
class Buffer:
    """A tensor needing ``size`` bytes, live from step ``first`` to step ``last`` inclusive."""

    name: str
    size: int
    first: int
    last: int


@dataclass(frozen=True)
class MemoryPlan:
    offsets: Mapping[str, int]
    sizes: Mapping[str, int]
    total: int
    alignment: int
    #: alias tensor name -> (root tensor name): views of another tensor's buffer (Reshape, Flatten, ...)
    aliases: Mapping[str, str]

    def offset(self, name: str) -> int:
        return self.offsets[self.aliases.get(name, name)]


def align_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def pack(buffers: Sequence[Buffer], alignment: int = 64) -> tuple[dict[str, int], int]:
    """Greedy-by-size placement (as TFLite's arena planner): largest first, lowest gap that fits.

    Two buffers may share addresses only if their lifetimes do not overlap.
    """
    placed: list[tuple[int, int, Buffer]] = []  # (offset, end, buffer)
    offsets: dict[str, int] = {}
    total = 0
    for b in sorted(buffers, key=lambda b: (-b.size, b.first, b.name)):
        size = align_up(max(b.size, 1), alignment)
        live = sorted((o, e) for o, e, p in placed if not (p.last < b.first or b.last < p.first))
        cur = 0
        best: int | None = None
        for o, e in live:
            if o - cur >= size:
                best = cur
                break
            cur = max(cur, e)
        if best is None:
            best = cur
        offsets[b.name] = best
        placed.append((best, best + size, b))
        total = max(total, best + size)
    return offsets, total


def graph_buffers(graph: Graph, keep_inputs_live: bool = True) -> tuple[list[Buffer], dict[str, str]]:
    """Activation buffers of ``graph`` (constants excluded) with lifetimes in node-index steps.

    Graph inputs are live from step -1; graph outputs until the end (they are copied out last).
    Outputs of alias ops share their root's buffer, which then lives as long as any alias does.
    """
    aliases: dict[str, str] = {}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    size: dict[str, int] = {}
    end = len(graph.nodes)

    def root(n: str) -> str:
        while n in aliases:
            n = aliases[n]
        return n

    for t in graph.inputs:
        first[t.name] = -1
        last[t.name] = end if keep_inputs_live else -1
        size[t.name] = t.nbytes
    for step, node in enumerate(graph.nodes):
        for i in node.inputs:
            if i and i not in graph.constants:
                r = root(i)
                last[r] = max(last.get(r, step), step)
        spec = op_spec(node.op)
        for k, o in enumerate(node.outputs):
            if not o:
                continue
            src = node.inputs[0] if node.inputs else ""
            if spec is not None and spec.alias and k == 0 and src and src not in graph.constants:
                aliases[o] = root(src)
                continue
            first[o] = step
            last[o] = max(last.get(o, step), step)
            size[o] = graph.infos[o].nbytes
    for t in graph.outputs:
        if t.name in graph.constants:
            continue
        last[root(t.name)] = end
    bufs = [Buffer(n, size[n], first[n], last[n]) for n in size]
    return bufs, aliases


def plan_graph_memory(graph: Graph, alignment: int = 64) -> MemoryPlan:
    bufs, aliases = graph_buffers(graph)
    offsets, total = pack(bufs, alignment)
    return MemoryPlan(offsets, {b.name: b.size for b in bufs}, total, alignment, aliases)
