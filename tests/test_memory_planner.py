"""The lifetime planner: live tensors never share bytes, dead ones are reused, views share their root."""
from __future__ import annotations

import numpy as np
import pytest

from inferd.frontend import import_model
from inferd.planner.memory import Buffer, graph_buffers, pack, plan_graph_memory, slice_placements
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


# ------------------------------------------------------------------ Split views and Concat parts in place

def _ancestors(t: str, plan, place: dict) -> set[str]:
    """The tensors whose bytes hold ``t`` (through view aliases and slice placements)."""
    out = set()
    while True:
        if t in plan.aliases:
            t = plan.aliases[t]
        elif t in place:
            t = place[t][0]
        else:
            return out
        out.add(t)


def _assert_only_nested_overlap(g, plan) -> None:
    """Tensors live at the same time share bytes only when one holds the other (a view or a placed slice)."""
    bufs, aliases = graph_buffers(g)
    place = slice_placements(g, aliases)
    span = {b.name: (b.first, b.last) for b in bufs}
    names = [n for n in span if n not in aliases]
    for i, a in enumerate(names):
        oa, sa = plan.offsets[a], g.infos[a].nbytes
        for b in names[i + 1:]:
            (fa, la), (fb, lb) = span[a], span[b]
            if la < fb or lb < fa:
                continue
            ob, sb = plan.offsets[b], g.infos[b].nbytes
            if oa + sa <= ob or ob + sb <= oa:
                continue
            assert a in _ancestors(b, plan, place) or b in _ancestors(a, plan, place), \
                f"{a} [{oa}, {oa + sa}) and {b} [{ob}, {ob + sb}) overlap while both live"


@pytest.mark.parametrize("name", ["shufflenetv2_x1_0", "squeezenet1_1"])
def test_zoo_split_outputs_and_concat_parts_sit_in_their_holder(name):
    g = import_model(zoo_path(name))
    plan = plan_graph_memory(g)
    _bufs, aliases = graph_buffers(g)
    place = slice_placements(g, aliases)
    assert place, "the channel Splits/Concats of this model should be placed"
    in_concat = 0
    for node in g.nodes:
        if node.op == "Concat":
            off = plan.offset(node.outputs[0])
            for i in node.inputs:
                if place.get(i, ("",))[0] == node.outputs[0]:
                    assert plan.offset(i) == off  # the producer writes its part of the Concat's output
                    in_concat += 1
                off += g.infos[i].nbytes
    assert in_concat > 0
    _assert_only_nested_overlap(g, plan)
    # the arena does not grow: placed tensors take no bytes of their own
    assert plan.total <= plan_graph_memory(g, slices=False).total


def _graph_model(nodes, inputs, outputs, inits=()):
    import onnx
    from onnx import helper, numpy_helper
    vi = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in inputs]
    vo = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in outputs]
    g = helper.make_graph(nodes, "g", vi, vo, [numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_split_and_concat_in_place_match_onnxruntime():
    """Odd cases for the placements: a split output that is a graph output, a tensor read by the Concat twice,
    a Concat part that is also a graph output, a nested Concat, a Concat on an axis with a leading size > 1
    (channels > 1: not placed), a Split output feeding a Concat (copied), a Transpose of the result, a constant part,
    a Gather of one constant index (a view) and one that is a graph output (copied)."""
    import inferd
    from onnx import helper

    from ortutil import run_ort

    rng = np.random.default_rng(5)
    w = rng.standard_normal((6, 5, 3, 3)).astype(np.float32)
    c = rng.standard_normal((1, 2, 7, 9)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1]),                     # (1, 6, 7, 9)
        helper.make_node("Split", ["a", "sizes"], ["s0", "s1", "s2"], axis=1),                # 1 + 3 + 2
        helper.make_node("Relu", ["s1"], ["r1"]),
        helper.make_node("Sigmoid", ["s2"], ["r2"]),
        helper.make_node("Concat", ["r1", "s0", "r2", "c"], ["cat1"], axis=1),              # (1, 8, 7, 9)
        helper.make_node("Neg", ["a"], ["n"]),
        helper.make_node("Concat", ["cat1", "n", "n"], ["cat2"], axis=-3),                  # nested, n twice
        helper.make_node("Reshape", ["cat2", "shp"], ["cat2r"]),                            # (1, 4, 5, 63)
        helper.make_node("Transpose", ["cat2r"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Abs", ["s0"], ["g0"]),
        helper.make_node("Concat", ["g0", "g0"], ["wide"], axis=2),                        # twice, axis 2: copies
        helper.make_node("Gather", ["cat2r", "gi"], ["g1"], axis=1),                         # a view: (1, 5, 63)
        helper.make_node("Relu", ["g1"], ["g1r"]),
        helper.make_node("Gather", ["t", "gj"], ["g2"], axis=0),                            # a graph output: copied
        helper.make_node("Exp", ["r1"], ["out_r1"]),
        helper.make_node("Concat", ["out_r1", "s2"], ["tail"], axis=1),
    ]
    shp = np.array([1, 4, 5, 63], np.int64)
    model = _graph_model(nodes, [("x", [1, 5, 7, 9])], ["t", "wide", "tail", "s1", "out_r1", "g1r", "g2"],
                         [("w", w), ("c", c), ("shp", shp), ("sizes", np.array([1, 3, 2], np.int64)),
                          ("gi", np.array(-2, np.int64)), ("gj", np.array([0], np.int64))])
    feeds = {"x": rng.standard_normal((1, 5, 7, 9)).astype(np.float32)}
    ref = run_ort(model, feeds)
    m = inferd.load(model)
    g = import_model(model)
    placed = slice_placements(g, graph_buffers(g)[1])
    assert {"s0", "s1", "s2"} & set(placed) == {"s0", "s2"}, placed  # s1 is a graph output: its own buffer
    assert "g1" in placed and "g2" not in placed, placed
    for _ in range(2):  # twice: a placed part must not be clobbered by the first run's leftovers
        got = m.run(feeds)
        for name, r in zip(m.output_names, ref):
            np.testing.assert_allclose(got[name], r, rtol=1e-5, atol=1e-5, err_msg=name)


def test_a_backend_narrows_the_placements_by_op_granule_and_dtype():
    """The Vulkan arena places only parts that start and end on its alignment (a descriptor binds aligned
    offsets only), of float32, of the ops its kernels skip in place; the CPU keeps every placement."""
    from onnx import helper

    nodes = [
        helper.make_node("Split", ["x", "sizes"], ["s0", "s1", "s2"], axis=1),      # 16, 1, 15 channels
        helper.make_node("Relu", ["s0"], ["a"]),
        helper.make_node("Relu", ["s1"], ["b"]),
        helper.make_node("Relu", ["s2"], ["c"]),
        helper.make_node("Concat", ["a", "b", "c"], ["cat"], axis=1),
        helper.make_node("Gather", ["cat", "gi"], ["g"], axis=1),
        helper.make_node("Sigmoid", ["g"], ["y"]),
    ]
    model = _graph_model(nodes, [("x", [1, 32, 4, 4])], ["y"],
                         [("sizes", np.array([16, 1, 15], np.int64)), ("gi", np.array(16, np.int64))])
    g = import_model(model)
    aliases = graph_buffers(g)[1]
    every = slice_placements(g, aliases)
    assert {"s0", "s1", "s2", "a", "b", "c", "g"} <= set(every)
    # 64 bytes a channel: s0 / a (1024 bytes at 0) fit a 256-byte granule; s1 / b (64 bytes) end mid-granule,
    # and s2 / c start off it; the Gather's channel 16 is at 1024 but 64 bytes long
    narrow = slice_placements(g, aliases, granule=256)
    assert set(narrow) == {"s0", "a"}
    assert set(slice_placements(g, aliases, ops=("Concat",), granule=64)) == {"a", "b", "c"}
    assert slice_placements(g, aliases, dtypes=(np.float16,)) == {}
    plan = plan_graph_memory(g, 256, ops=("Split", "Concat"), granule=256)
    assert plan.offset("s0") == plan.offset("x") and plan.offset("a") == plan.offset("cat")
    assert plan.offset("b") not in range(plan.offset("cat"), plan.offset("cat") + g.infos["cat"].nbytes)
    assert all(o % 256 == 0 for o in plan.offsets.values())
