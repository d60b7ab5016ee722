"""Lifetime-based activation memory planning: a pure function from tensor lifetimes to arena offsets.

Used by the CPU executor and the Vulkan arena. The memory-budget planner (preload-aware 2-D
packing of weights and activations) will supersede it; it consumes and produces the same
frozen types, so the runtimes do not change when it does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..ir import Graph, Node
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


def _leading_ones(shape: Sequence[int], axis: int) -> bool:
    """Whether every axis before ``axis`` has size 1: then a slice along ``axis`` is one contiguous run."""
    return all(int(d) == 1 for d in shape[:axis])


def _norm_axis(axis: int, rank: int) -> int | None:
    a = axis + rank if axis < 0 else axis
    return a if 0 <= a < rank else None


#: the ops whose slices ``slice_placements`` may place (all of them by default)
SLICE_OPS = ("Split", "Gather", "Concat")


def slice_placements(graph: Graph, aliases: Mapping[str, str], ops: Sequence[str] = SLICE_OPS, granule: int = 1,
                     dtypes: Sequence[Any] | None = None) -> dict[str, tuple[str, int]]:
    """Tensors that can live inside another tensor's buffer, as ``name -> (holder, byte offset in holder)``.

    Why: a channel Split copies every channel and a channel Concat copies them back (shufflenet's blocks,
    squeezenet's fire modules); when the slices are contiguous (every axis before the split/concat axis has
    size 1), a Split's outputs can be views of its input and a Concat's inputs can be written by their
    producers straight into the Concat's output, so both copies go (the kernels skip a part already in place).
    A Gather of one constant index on such an axis is a view the same way.

    A tensor is placed at most once (the first Split or Concat claiming it); graph inputs, outputs, constants
    and view aliases are never placed, and neither is a tensor that two Concats (or one Concat twice) read.

    A backend narrows it: ``ops`` (those whose kernels skip a part in place), ``granule`` (a placed tensor's
    offset in its holder and its size are multiples of it: a GPU binds buffers at aligned offsets only, and a
    part that ends mid-granule would share it with the next part's first elements), ``dtypes`` (of the
    tensors placed; None: any)."""
    if graph.runtime_shaped:
        return {}
    allowed = None if dtypes is None else {np.dtype(d) for d in dtypes}

    def fits(info: Any, off: int) -> bool:
        return off % granule == 0 and info.nbytes % granule == 0 and (allowed is None or info.dtype in allowed)
    outs = {t.name for t in graph.outputs}
    ins = {t.name for t in graph.inputs}
    concat_uses: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "Concat":
            for i in node.inputs:
                if i:
                    concat_uses[i] = concat_uses.get(i, 0) + 1
    place: dict[str, tuple[str, int]] = {}

    def free(t: str) -> bool:
        return bool(t) and t not in graph.constants and t not in ins and t not in outs and t not in aliases \
            and t not in place and t in graph.infos

    for node in graph.nodes:
        if node.op not in ops:
            continue
        if node.op == "Split" and node.inputs and node.inputs[0] and node.inputs[0] not in graph.constants:
            src = graph.infos.get(node.inputs[0])
            axis = None if src is None else _norm_axis(int(node.attr("axis", 0)), len(src.shape))
            if axis is None or not _leading_ones(src.shape, axis):
                continue
            off = 0
            for o in node.outputs:
                if not o:
                    break  # an unnamed output: the later offsets are unknown here
                if free(o) and graph.infos[o].dtype == src.dtype and fits(graph.infos[o], off):
                    place[o] = (node.inputs[0], off)
                off += graph.infos[o].nbytes
        elif node.op == "Gather" and len(node.inputs) > 1 and node.inputs[0] and node.outputs and \
                node.inputs[0] not in graph.constants and free(node.outputs[0]):
            # one constant index on an axis led by size-1 axes: a contiguous slice (vit's q, k, v of one qkv)
            off = _gather_slice_offset(graph, node)
            if off is not None and fits(graph.infos[node.outputs[0]], off):
                place[node.outputs[0]] = (node.inputs[0], off)
        elif node.op == "Concat" and node.outputs and node.outputs[0] in graph.infos:
            dst = graph.infos[node.outputs[0]]
            axis = _norm_axis(int(node.attr("axis", 0)), len(dst.shape))
            if axis is None or not _leading_ones(dst.shape, axis) or node.outputs[0] in outs:
                continue
            off = 0
            for i in node.inputs:
                if not i:
                    continue
                info = graph.infos.get(i)
                if info is None:
                    break
                if free(i) and concat_uses.get(i) == 1 and info.dtype == dst.dtype and fits(info, off):
                    place[i] = (node.outputs[0], off)
                off += info.nbytes
    return place


def _gather_slice_offset(graph: Graph, node: Node) -> int | None:
    """The byte offset of a Gather's output in its input when one constant index picks a contiguous slice."""
    src, out = graph.infos.get(node.inputs[0]), graph.infos.get(node.outputs[0])
    idx = graph.constants.get(node.inputs[1])
    if src is None or out is None or idx is None or idx.size != 1 or idx.dtype.kind not in "iu" \
            or out.dtype != src.dtype:
        return None
    axis = _norm_axis(int(node.attr("axis", 0)), len(src.shape))
    if axis is None or not _leading_ones(src.shape, axis):
        return None
    dim = int(src.shape[axis])
    i = int(idx.reshape(-1)[0])
    i = i + dim if i < 0 else i
    if not 0 <= i < dim:
        return None  # out of range: the kernel reports it
    return i * (src.nbytes // dim)


def plan_graph_memory(graph: Graph, alignment: int = 64, slices: bool = True, extra: Sequence[Buffer] = (),
                      ops: Sequence[str] = SLICE_OPS, granule: int = 1, dtypes: Sequence[Any] | None = None
                      ) -> MemoryPlan:
    """Arena offsets for ``graph``'s activations and the ``extra`` buffers (a backend's per-layer workspaces).
    With ``slices``, the tensors ``slice_placements`` finds (narrowed by ``ops``, ``granule`` and ``dtypes``) get
    no buffer of their own: they sit inside their holder's, whose lifetime grows to cover theirs."""
    bufs, aliases = graph_buffers(graph)
    bufs = [*bufs, *extra]
    place = slice_placements(graph, aliases, ops, granule, dtypes) if slices else {}

    def home(t: str) -> tuple[str, int]:
        """The buffer that holds ``t`` and ``t``'s byte offset in it."""
        if t in aliases:
            return home(aliases[t])
        if t in place:
            holder, off = place[t]
            b, d = home(holder)
            return b, d + off
        return t, 0

    if place:
        span = {b.name: (b.first, b.last) for b in bufs}
        for t in place:
            root, _ = home(t)
            f, l = span.pop(t)
            rf, rl = span[root]
            span[root] = (min(f, rf), max(l, rl))
        sizes = {b.name: b.size for b in bufs}
        bufs = [Buffer(n, sizes[n], f, l) for n, (f, l) in span.items()]
    offsets, total = pack(bufs, alignment)
    for t in place:
        root, off = home(t)
        offsets[t] = offsets[root] + off
    return MemoryPlan(offsets, {b.name: b.size for b in bufs}, total, alignment, aliases)


def tensor_order(graph: Graph) -> list[str]:
    """The activation tensors a memory plan can name, in a fixed order: the inputs, then each node's outputs."""
    seen: dict[str, None] = {t.name: None for t in graph.inputs}
    for node in graph.nodes:
        for o in node.outputs:
            if o:
                seen[o] = None
    return list(seen)


def memory_record(plan: MemoryPlan, graph: Graph) -> dict[str, Any] | None:
    """``plan`` (of ``graph``) as a package stores it: per tensor of ``tensor_order`` its offset, size and alias
    root's position (-1: none), no names (a load parses three lists of integers). None when the plan names a
    tensor outside that order (a load then plans again)."""
    names = tensor_order(graph)
    pos = {n: i for i, n in enumerate(names)}
    if any(n not in pos for n in (*plan.offsets, *plan.sizes, *plan.aliases, *plan.aliases.values())):
        return None
    return {"total": int(plan.total), "alignment": int(plan.alignment),
            "offsets": [int(plan.offsets.get(n, -1)) for n in names],
            "sizes": [int(plan.sizes.get(n, -1)) for n in names],
            "aliases": [pos[plan.aliases[n]] if n in plan.aliases else -1 for n in names]}


def memory_from_record(rec: Mapping[str, Any], graph: Graph) -> MemoryPlan:
    """The plan ``memory_record`` stored for ``graph``; ``ValueError`` when it does not fit ``graph`` (another
    tensor count, an offset whose tensor would end past the arena, an alias out of range)."""
    names = tensor_order(graph)
    offs, sizes, al = rec["offsets"], rec["sizes"], rec["aliases"]
    total, alignment = int(rec["total"]), int(rec["alignment"])
    if not len(offs) == len(sizes) == len(al) == len(names):
        raise ValueError(f"it holds {len(offs)} tensors, the graph {len(names)}")
    infos = graph.infos
    offsets: dict[str, int] = {}
    own: dict[str, int] = {}
    aliases: dict[str, str] = {}
    for n, o, sz, a in zip(names, offs, sizes, al):
        if a >= 0:
            if a >= len(names):
                raise ValueError(f"{n!r} aliases tensor #{a} of {len(names)}")
            aliases[n] = names[a]
        if o >= 0:
            if n not in infos or o + infos[n].nbytes > total:
                raise ValueError(f"{n!r} at offset {o} does not fit the {total}-byte arena")
            offsets[n] = int(o)
        if sz >= 0:
            own[n] = int(sz)
    return MemoryPlan(offsets, own, total, alignment, aliases)
