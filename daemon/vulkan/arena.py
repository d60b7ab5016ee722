"""Layout of a model's device memory (pure: no Vulkan), from the same lifetime planner as the CPU.

Two kinds of region:
  * activations: one allocation holding every activation tensor and every per-layer workspace,
    placed by ``inferd.planner.memory`` (greedy-by-size packing of lifetimes; a workspace is a buffer
    live for its layer's one step; alias ops share their source's buffer; a Concat's or Split's aligned
    parts and a one-index Gather's output sit inside the whole tensor's buffer) at offsets aligned to the
    device's minStorageBufferOffsetAlignment (at least 64). Laid out before any layer is prepared,
    so a layer's workspace is the largest any of its candidate kernels needs;
  * weights: per layer one range, its transformed constants bump-placed at 256-byte offsets, taken
    from a few large slabs (``slabs.WeightSlabs``) as layers are prepared, concurrently and in any
    order, with a kernel chosen only then; a warm kernel switch gives the old kernel's range back.

Nothing is allocated on the inference path: the executor allocates these regions while loading.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..ir import Graph
from ..planner.memory import Buffer, MemoryPlan, align_up, plan_graph_memory
from .kernel import ALIGN


def workspace_name(layer_name: str) -> str:
    return f"{layer_name}#ws"


#: the ops whose parts the Vulkan arena places in their holder: their kernels are strided copies
#: (``tensor_vulkan.VkConcat``, ``VkSplit``, ``VkGather`` of one index), which the executor leaves out where a part
#: is already in place (``executor.copy_in_place``); squeezenet's eight fire-module Concats were a fifth of its
#: warm time on lavapipe
SLICE_OPS = ("Split", "Concat", "Gather")


def plan_activations(graph: Graph, workspaces: Sequence[tuple[int, str, int]], alignment: int) -> MemoryPlan:
    """Activation layout of ``graph`` (constants already folded in, nodes in execution order).

    ``workspaces``: (step, layer name, bytes) per layer needing scratch. A channel Concat's parts are
    written by their producers straight into its output, a Split's parts and a one-index Gather's output read
    where they lie (``planner.memory.slice_placements``), where they are float32 and start and end on ``alignment``
    (a descriptor's offset must be aligned; a kernel may write whole vec4 at its output's end)."""
    ws = [Buffer(workspace_name(name), nbytes, step, step) for step, name, nbytes in workspaces if nbytes]
    return plan_graph_memory(graph, alignment, True, ws, SLICE_OPS, alignment, (np.float32,))


def place_weights(params: Sequence[tuple[str, int]]) -> tuple[dict[str, int], int]:
    """Byte offset of each (key, bytes) array in one layer's weights allocation, and its size."""
    place: dict[str, int] = {}
    end = 0
    for key, nbytes in params:
        place[key] = end
        end += align_up(max(nbytes, 4), ALIGN)
    return place, end
