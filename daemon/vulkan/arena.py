"""Layout of a model's static device arena (pure: no Vulkan), from the same lifetime planner as the CPU.

Two kinds of region:
  * activations: one allocation holding every activation tensor and every per-layer workspace,
    placed by ``inferd.planner.memory`` (greedy-by-size packing of lifetimes; a workspace is a buffer
    live for its layer's one step; alias ops share their source's buffer) at offsets aligned to the
    device's minStorageBufferOffsetAlignment (at least 64);
  * weights: the kernels' transformed constants, bump-placed at 256-byte offsets into as few
    allocations as fit ``chunk`` bytes each (weights are live for the model's whole life).

Nothing is allocated on the inference path: the executor allocates these regions once at load.
The memory-budget planner can replace ``plan_arena`` as long as it returns the same ``ArenaPlan``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..ir import Graph
from ..planner.memory import Buffer, MemoryPlan, align_up, graph_buffers, pack
from .kernel import ALIGN

#: Largest single weights allocation (Vulkan guarantees maxMemoryAllocationSize >= 1 GiB).
WEIGHT_CHUNK = 1 << 30


def workspace_name(layer_name: str) -> str:
    return f"{layer_name}#ws"


@dataclass(frozen=True)
class ArenaPlan:
    activations: MemoryPlan
    #: (step index, param key) -> (weights chunk, byte offset)
    weights: Mapping[tuple[int, str], tuple[int, int]]
    #: bytes of each weights allocation
    weight_chunks: tuple[int, ...]

    @property
    def total(self) -> int:
        return self.activations.total + sum(self.weight_chunks)


def plan_arena(graph: Graph, workspaces: Sequence[tuple[int, str, int]], params: Sequence[tuple[int, str, int]],
               alignment: int, chunk: int = WEIGHT_CHUNK) -> ArenaPlan:
    """Arena layout of ``graph`` (constants already folded in, nodes in execution order).

    ``workspaces``: (step, layer name, bytes) per layer needing scratch; ``params``: (step, key,
    bytes) per transformed constant that a dispatch binds.
    """
    bufs, aliases = graph_buffers(graph)
    for step, name, nbytes in workspaces:
        if nbytes:
            bufs.append(Buffer(workspace_name(name), nbytes, step, step))
    offsets, total = pack(bufs, alignment)
    act = MemoryPlan(offsets, {b.name: b.size for b in bufs}, total, alignment, aliases)
    place: dict[tuple[int, str], tuple[int, int]] = {}
    sizes: list[int] = [0]
    for step, key, nbytes in params:
        n = align_up(max(nbytes, 4), ALIGN)
        if sizes[-1] and sizes[-1] + n > chunk:
            sizes.append(0)
        place[(step, key)] = (len(sizes) - 1, sizes[-1])
        sizes[-1] += n
    return ArenaPlan(act, place, tuple(s for s in sizes if s))
