"""Recorded binds on Vulkan: a cold load prepares a layer from a record of its dispatches instead of working them out.

Preparing a layer on Vulkan (``VulkanColdBackend.prepare``) asks its kernel for its dispatches (the geometry worked
out from the node, push constants, row splits, copies in place dropped), resolves every binding to a range of the
activation arena or of the layer's weights and packs the push constants: ~0.2 ms of Python a layer on the 2-vCPU
VM, on a loader thread under the GIL that the executor and the other loaders wait for. A cold load on a GPU is
bound by that Python (squeezenet1_1 on an H200: 26 ms for 0.5 ms of warm run and 6 ms of reading). What it makes is
a function of the package (graph, kernels, precision, the device) and of two base addresses, the arena's and the
layer's weights': recorded once as offsets from those after a cold load has answered (idle time, as the CPU's
``runtime.bindrec``), the next cold load of the package rebuilds each layer's dispatches from the record. The
pipelines, descriptor sets and uploads are made as before.

A record is checked at use: the layer's kernel, its weight arrays' sizes, each dispatch's binding count and push
size against its shader's manifest, each range inside the arena or the layer's weights; one that does not fit is
not used (the layer is prepared the usual way). The file (``FILE`` in the package, ``runtime.bindrec``'s format
under its own magic) carries the package's key plus the arena's size and alignment: a bad or stale one is a miss
with a warning, never used, and the next load records it anew.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

FILE = "vkbinds.bin"
MAGIC = b"IFDVKBND"

#: where a recorded range lies: the activation arena (offsets absolute in it), the layer's own weights (offsets from
#: the layer's base in its slab)
ACT, WEIGHTS = 0, 1

#: One layer's record as msgpack reads it back: [kernel, weight bytes, [[key, bytes, offset], ...], dispatches],
#: each dispatch [shader, defines pairs, spec pairs, groups, independent, push bytes, [[space, offset, size], ...]].
Record = list


def record_layer(kernel: str, wsize: int, place: Mapping[str, int], meta: Mapping[str, Any], bound: Sequence[Any],
                 act: Any, weights: Any, base: int) -> Record | None:
    """The record of one prepared layer (``bound``: its ``executor.Bound`` dispatches), or None where a range lies
    outside the arena region ``act`` and the layer's weights (``weights`` from ``base``, ``wsize`` bytes)."""
    ws = []
    for key, off in place.items():
        a = meta.get(key)
        if not isinstance(a, np.ndarray):
            return None
        ws.append([key, int(a.nbytes), int(off)])
    ds = []
    for b in bound:
        ranges = []
        for r, off, size in b.ranges:
            if r is act:
                ranges.append([ACT, int(off), int(size)])
            elif weights is not None and r is weights and base <= off and off + size <= base + wsize:
                ranges.append([WEIGHTS, int(off - base), int(size)])
            else:
                return None  # another region (scratch, a shape's shared weights): not this record's to rebuild
        d, m = b.dispatch, b.pipeline.module
        ds.append([m.name, [list(p) for p in m.defines], [list(p) for p in b.pipeline.spec], [int(g) for g in d.groups],
                   bool(d.independent), bytes(b.push), ranges])
    return [kernel, int(wsize), ws, ds]


class Parsed:
    """A record read back for one layer: what ``VulkanColdBackend`` needs to rebuild its dispatches."""

    __slots__ = ("wsize", "arrays", "variants", "specs", "entries")

    def __init__(self, wsize: int, arrays: list[tuple[str, np.ndarray, int]], variants: list[tuple[str, Any]],
                 specs: list[dict[str, Any]], entries: list[tuple[tuple[int, ...], bool, bytes, list[Any]]]) -> None:
        self.wsize, self.arrays, self.variants, self.specs, self.entries = wsize, arrays, variants, specs, entries


def parse(rec: Any, kernel: str, params: Mapping[str, Any]) -> Parsed | None:
    """``rec`` for a layer prepared with ``kernel`` from ``params``, or None where it does not fit them (another
    kernel, other array sizes, a record that does not parse)."""
    try:
        rkernel, wsize, rws, rds = rec
        if rkernel != kernel:
            return None
        arrays = []
        for key, nbytes, off in rws:
            a = params.get(key)
            if not isinstance(a, np.ndarray) or a.nbytes != nbytes or not 0 <= off <= off + nbytes <= wsize:
                return None
            arrays.append((key, a, int(off)))
        variants, specs, entries = [], [], []
        for shader, defines, spec, groups, independent, push, ranges in rds:
            variants.append((str(shader), tuple((str(k), str(v)) for k, v in defines)))
            specs.append({str(k): v for k, v in spec})
            if len(groups) != 3 or not isinstance(push, bytes):
                return None
            entries.append((tuple(int(g) for g in groups), bool(independent), push,
                            [(int(s), int(o), int(n)) for s, o, n in ranges]))
        return Parsed(int(wsize), arrays, variants, specs, entries)
    except (TypeError, ValueError):
        return None
