"""The lifetime planner: live tensors never share bytes, dead ones are reused, views share their root."""
from __future__ import annotations

import numpy as np
import pytest

from inferd.frontend import import_model
from inferd.planner.memory import Buffer, graph_buffers, pack, plan_graph_memory
from zoo_fixture import zoo_path


def _assert_no_live_overlap(bufs: list[Buffer], offsets: dict[str, int]) -> None:
    for i, a in enumerate(bufs):
        for b in bufs[i + 1:]:
            if a.last < b.first or b.last < a.first:
                continue  # not live at the same time: may share
            a0, b0 = offsets[a.name], offsets[b.name]
            assert a0 + a.size <= b0 or b0 + b.size <= a0, f"{a} and {b} overlap while both live"


@pytest.mark.parametrize("seed", range(20))
def test_random_lifetimes_never_overlap_and_align(seed):
    rng = np.random.default_rng(seed)
    bufs = []
    for k in range(int(rng.integers(1, 60))):
        first = int(rng.integers(-1, 50))
        bufs.append(Buffer(f"t{k}", int(rng.integers(0, 5000)), first, first + int(rng.integers(0, 15))))
    offsets, total = pack(bufs, alignment=64)
    _assert_no_live_overlap(bufs, offsets)
    assert all(o % 64 == 0 for o in offsets.values())
    assert total <= sum((b.size + 63) // 64 * 64 or 64 for b in bufs)
    # a lower bound: at every step the live buffers must fit
    for step in range(-1, 70):
        live = sum(b.size for b in bufs if b.first <= step <= b.last)
        assert total >= live


def test_zoo_arena_reuses_memory_and_views_share_roots():
    g = import_model(zoo_path("resnet50"))
    bufs, aliases = graph_buffers(g)
    plan = plan_graph_memory(g)
    _assert_no_live_overlap(bufs, dict(plan.offsets))
    total_naive = sum(b.size for b in bufs)
    assert plan.total < total_naive / 4, (plan.total, total_naive)  # lifetimes let most activations share
    # the Flatten before the classifier is a view: no buffer of its own, same offset as its input
    flat = next(n for n in g.nodes if n.op in ("Flatten", "Reshape"))
    assert flat.outputs[0] in aliases
    assert plan.offset(flat.outputs[0]) == plan.offset(flat.inputs[0])
    # graph inputs and outputs are live for the whole run
    inp = g.inputs[0].name
    b = next(x for x in bufs if x.name == inp)
    assert b.first == -1 and b.last == len(g.nodes)
