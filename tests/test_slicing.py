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
        assert k in ("winograd23", "im2col")
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
