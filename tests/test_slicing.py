"""Bottleneck-aware slicing and kernel fallback (planner/slicing.py) and the streaming runtime over them:
a sliced model gives the unsliced model's outputs; the search lowers the smallest feasible budget."""
from __future__ import annotations

import numpy as np
import pytest

import inferd
from inferd.planner.flex import BudgetTooSmall, min_budget
from inferd.planner.slicing import (MemConfig, fit_config, slice_graph, sliceable, step_memory)
from inferd.runtime.cpu import CpuExecutor
from inferd.runtime.stream import stream_for_budget
from zoo_fixture import zoo_dir


@pytest.fixture(scope="module")
def resnet18():
    g = inferd.frontend.import_model(str(zoo_dir(["resnet18"]) / "resnet18.onnx"))
    feeds = {t.name: np.random.default_rng(5).standard_normal(t.shape).astype(t.dtype) for t in g.inputs}
    return g, feeds, CpuExecutor(g).run(feeds)


def _close(got, ref, what):
    for k, r in ref.items():
        err = float(np.abs(got[k] - r).max() / np.abs(r).max())
        assert err <= 1e-5, f"{what}: {k} relative error {err:.3g}"


def test_sliced_graph_matches_unsliced(resnet18):
    g, feeds, ref = resnet18
    fc = next(n for n in g.nodes if n.op == "Gemm")
    convs = [n for n in g.nodes if n.op == "Conv" and sliceable(g, n) >= 64]
    slices = {fc.name: 3, convs[-1].name: 4, convs[-2].name: 2}
    s = slice_graph(g, slices)
    assert len(s.nodes) == len(g.nodes) + 3 + 4 + 2 - 3 + 3  # slices replace nodes, one Concat each
    assert sum(1 for n in s.nodes if n.name.startswith(fc.name + "#slice")) == 3
    _close(CpuExecutor(s).run(feeds), ref, "sliced on the warm executor")
    # no weight copied: the slices are views of the original constants
    w = g.constants[fc.inputs[1]]
    assert any(np.shares_memory(w, a) for n, a in s.constants.items() if n.startswith(fc.inputs[1] + "#slice"))


def test_fallback_and_slicing_lower_the_minimum_and_stay_exact(resnet18, tmp_path):
    g, feeds, ref = resnet18
    layers, acts, _k = step_memory(g)
    plain = min_budget(layers, acts)
    cfg = fit_config(g, int(plain * 0.8))
    assert cfg.kernels or cfg.slices  # something had to change
    for node, k in cfg.kernels.items():
        assert k in ("winograd23", "im2col", "im2col_cs")
    ex = stream_for_budget(g, int(plain * 0.8) + (64 << 10), tmp_path, track=True)
    try:
        assert ex.memory_bytes <= ex.budget
        got = ex.run(feeds)
        _close(got, ref, f"streamed with {ex.config}")
        assert not ex.tracker.violations and ex.tracker.high_water <= ex.arena.nbytes
        assert ex.outside_scratch == 0
    finally:
        ex.close()
    # the configuration is kept when a later budget still fits it (live re-plans re-use the slicing)
    assert fit_config(g, int(plain * 0.8), base=cfg) == cfg


def test_too_small_even_sliced_names_the_size(resnet18):
    g, _feeds, _ref = resnet18
    with pytest.raises(BudgetTooSmall) as ei:
        fit_config(g, 1 << 20)  # the stem's activations alone need more
    assert ei.value.need > 1 << 20 and "at least" in str(ei.value)
    assert sliceable(g, next(n for n in g.nodes if n.attrs.get("residual"))) == 0
    assert MemConfig().key() == ""


def test_input_channel_slicing_shrinks_the_column_buffer_and_stays_exact(resnet18, tmp_path):
    """An im2col conv sliced by input channel: its workspace shrinks about S-fold (plus one output image for
    the running sum), and the model's outputs stay the unsliced ones, on the warm executor and streamed
    inside a budget; the search picks input slicing where a column buffer sets the peak."""
    from inferd.ops.base import Layer, choose_kernel
    from inferd.ops.conv import in_slice_bounds

    g, feeds, ref = resnet18
    convs = [n for n in g.nodes if n.op == "Conv" and int(n.attrs.get("group", 1)) == 1
             and g.constants[n.inputs[1]].shape[2:] == (3, 3) and not n.attrs.get("residual")]
    a, b = convs[1], convs[-1]
    s = slice_graph(g, {}, {a.name: 4, b.name: 3})
    na = next(n for n in s.nodes if n.name == a.name)
    assert na.attrs["_in_slices"] == 4 and "_in_slices" not in next(n for n in g.nodes if n.name == a.name).attrs
    la, la0 = Layer.of(na, s), Layer.of(a, g)
    ka, k0 = choose_kernel(la, "cpu", "im2col_cs"), choose_kernel(la0, "cpu", "im2col")
    cin = g.constants[a.inputs[1]].shape[1]
    assert ka.workspace_nbytes(la) < k0.workspace_nbytes(la0) / 4 + 4 * la.outputs[0].size + 4096  # type: ignore
    assert in_slice_bounds(cin, 4) == [(i * cin // 4, (i + 1) * cin // 4) for i in range(4)]
    kernels = {a.name: "im2col_cs", b.name: "im2col_cs"}
    _close(CpuExecutor(s, kernels).run(feeds), ref, "input-sliced on the warm executor")
    # the search: one conv whose column buffer is the model's peak (64 channels, 3x3, 56x56: 7 MiB of columns
    # against 0.8 MiB in and out), inside half what im2col needs: input slicing is the way
    from inferd.ir import Graph, Node, TensorInfo

    rng = np.random.default_rng(9)
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32) * 0.05
    bias = rng.standard_normal(64).astype(np.float32)
    infos = {"x": TensorInfo("x", (1, 64, 56, 56), np.float32), "w": TensorInfo("w", w.shape, np.float32),
             "b": TensorInfo("b", bias.shape, np.float32), "y": TensorInfo("y", (1, 64, 56, 56), np.float32)}
    one = Graph("oneconv", [Node("c", "Conv", ["x", "w", "b"], ["y"], {"kernel_shape": [3, 3], "pads": [1] * 4,
                                                                      "activation": "Relu"})],
                [infos["x"]], [infos["y"]], {"w": w, "b": bias}, infos, 17)
    base = MemConfig({"c": "im2col"})
    layers, acts, _k = step_memory(one, dict(base.kernels))
    need = min_budget(layers, acts)
    assert layers[0].workspace > 4 * layers[0].weights
    cfg = fit_config(one, need // 2, base=base)
    assert cfg.in_slices.get("c", 1) >= 2 and cfg.kernels["c"] == "im2col_cs", cfg
    feeds1 = {"x": rng.standard_normal((1, 64, 56, 56)).astype(np.float32)}
    ref1 = CpuExecutor(one, {"c": "im2col"}).run(feeds1)
    ex = stream_for_budget(one, need // 2 + (96 << 10), tmp_path, config=cfg, track=True)
    try:
        assert ex.memory_bytes <= need // 2 + (96 << 10) < need
        got = ex.run(feeds1)
        _close(got, ref1, f"streamed with {ex.config}")
        assert not ex.tracker.violations and ex.tracker.high_water <= ex.arena.nbytes <= ex.budget
        assert ex.outside_scratch == 0
    finally:
        ex.close()


def test_faster_config_slices_the_layers_whose_reads_stall_and_stays_exact(resnet18, tmp_path):
    """Under a budget that holds part of the weights, ``faster_config`` slices the heaviest layers further where
    the memory plan then runs faster (some slices resident, the rest read ahead in pieces): simulated faster by
    at least its minimum gain, every slice still a view, and the streamed model's outputs the unsliced ones.
    No read rate, no times, or a budget that holds everything: the configuration it was given."""
    from inferd.planner.slicing import FASTER_MIN_GAIN, faster_config, simulated_run_s
    from inferd.runtime.stream import small_bytes

    g, feeds, ref = resnet18
    layers, _acts, _k = step_memory(g)
    weights = sum(lm.weights for lm in layers)
    comp = {n.name: 0.5e-3 for n in g.nodes}  # (synthetic: 0.5 ms a node, a 2 GB/s disk)
    budget = int(weights * 0.6)
    base = fit_config(g, budget)
    fast = faster_config(g, budget, base, comp, 2e9)
    assert fast != base and fast.kernels == base.kernels and fast.in_slices == base.in_slices
    assert all(fast.slices.get(n, 1) >= s for n, s in base.slices.items())
    assert simulated_run_s(g, fast, budget, comp, 2e9) < (1 - FASTER_MIN_GAIN) * simulated_run_s(g, base, budget,
                                                                                                  comp, 2e9)
    assert faster_config(g, budget, base, comp, 0.0) == base
    assert faster_config(g, budget, base, {n: 0.0 for n in comp}, 2e9) == base
    assert faster_config(g, 2 * weights, MemConfig(), comp, 2e9) == MemConfig()  # nothing streamed: no gain
    ex = stream_for_budget(g, budget + small_bytes(g) + (256 << 10), tmp_path, config=fast, track=True)
    try:
        assert ex.memory_bytes <= ex.budget and ex.config == fast
        _close(ex.run(feeds), ref, f"streamed with {fast}")
        assert not ex.tracker.violations
    finally:
        ex.close()


def test_faster_config_simulates_the_layout_the_compile_writes_and_slices_every_heavy_layer(resnet18, monkeypatch):
    """The slicing is judged on the graph the compile writes for it (``stream_compile.sliced_layout``: the CPU's
    blocked convs, whose weights are read at their own size where the NCHW Winograd kernels' are 1.8-4x): the
    simulated run reads fewer bytes than the NCHW graph's, and a layout that gives nothing leaves the NCHW one.
    Under a budget a fraction of the weights, every layer heavier than a share of it is cut (more than the three
    heaviest the greedy pass looks at), and the run is simulated faster than the budget's fitting slicing."""
    from inferd.planner import layout
    from inferd.planner.slicing import FASTER_MIN_GAIN, faster_config, simulated_run_s
    from inferd.runtime.stream_compile import sliced_layout

    # the layout of a CPU with AVX-512 tiles, on every machine: where the blocked kernel runs AVX2 tiles the layout
    # keeps most 3x3 convs on Winograd (resnet18's blocked weights 79.7 MB against 81.5 NCHW, not a third less),
    # and what this test's budget leaves to slice is another model
    monkeypatch.setattr(layout, "_wide_tiles", lambda: True)
    g, _feeds, _ref = resnet18
    comp = {n.name: 0.5e-3 for n in g.nodes}  # (synthetic: 0.5 ms a node, a 4 GB/s disk)
    bw = 4e9
    blocked_weights = sum(lm.weights for lm in step_memory(sliced_layout(slice_graph(g, {}), {}))[0])
    nchw_weights = sum(lm.weights for lm in step_memory(g)[0])
    assert blocked_weights < nchw_weights
    budget = int(blocked_weights * 0.45)
    base = fit_config(g, budget)
    nchw = simulated_run_s(g, base, budget, comp, bw)
    assert simulated_run_s(g, base, budget, comp, bw, layout=lambda _g, _k: None) == nchw
    blocked = simulated_run_s(g, base, budget, comp, bw, layout=sliced_layout)
    assert blocked < nchw
    fast = faster_config(g, budget, base, comp, bw, layout=sliced_layout)
    assert len(set(fast.slices) - set(base.slices)) > 3
    assert simulated_run_s(g, fast, budget, comp, bw, layout=sliced_layout) < (1 - FASTER_MIN_GAIN) * blocked
    assert all(sliceable(g, n) // fast.slices[n.name] >= 32 for n in g.nodes if n.name in fast.slices
               and n.name not in base.slices)


def test_compiling_for_a_budget_takes_the_faster_slicing(tmp_path, monkeypatch):
    """A daemon's streamed model is compiled for its budget (``stream_compile.compile_streamed``): fit_config's
    slicing, then ``faster_config`` from the model's measured times per node (a slice's time counts for its node)
    and the store's read rate; what it returns is what the skeleton records, its store holds and the model runs."""
    from inferd.planner import slicing
    from inferd.runtime.stream_compile import compile_streamed, open_streamed, read_skeleton

    src = zoo_dir(["mlp_small"]) / "mlp_small.onnx"
    g = inferd.frontend.import_model(str(src))
    fc = max((n for n in g.nodes if sliceable(g, n)), key=lambda n: g.constants[n.inputs[1]].nbytes)
    seen = {}

    def fake(graph, budget, base, compute_s, read_bw, **kw):
        seen.update(base=base, compute_s=dict(compute_s), read_bw=read_bw)
        return MemConfig(dict(base.kernels), {**base.slices, fc.name: 2}, dict(base.in_slices))

    monkeypatch.setattr(slicing, "faster_config", fake)
    skel = compile_streamed(src, 1 << 30, tmp_path, in_child=False)
    assert seen["read_bw"] > 0 and set(seen["compute_s"]) == {n.name for n in g.nodes}
    assert all(t >= 0 for t in seen["compute_s"].values()) and sum(seen["compute_s"].values()) > 0
    sg, meta = read_skeleton(skel)
    assert meta["config"]["slices"].get(fc.name) == 2
    assert sum(1 for n in sg.nodes if n.name.startswith(fc.name + "#slice")) == 2
    feeds = {t.name: np.random.default_rng(2).standard_normal(t.shape).astype(t.dtype) for t in g.inputs}
    ex = open_streamed(skel, 1 << 30)
    try:
        _close(ex.run(feeds), CpuExecutor(g).run(feeds), "compiled for a budget, faster slicing")
    finally:
        ex.close()
