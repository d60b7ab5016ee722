"""The co-execution planner (pure): balanced splits, no split where sync or the predictor's margin eats the
gain, no sync between layers on one side, small layers following their neighbours; and on a real graph."""
from __future__ import annotations

import numpy as np
import pytest

from inferd.planner.split import LayerCosts, plan_split


def linear(name: str, c: int, t_cpu: float, t_gpu: float, fixed: float = 0.0) -> LayerCosts:
    """A layer whose part times grow linearly with channels (plus a fixed cost per non-empty part)."""
    pts = tuple(range(c + 1))
    cs = tuple((t_cpu * (c - g) / c + fixed) if g < c else 0.0 for g in pts)
    gs = tuple((t_gpu * g / c + fixed) if g > 0 else 0.0 for g in pts)
    return LayerCosts(name, "Conv", c, pts, cs, gs)


def test_split_balances_the_two_sides() -> None:
    # CPU 2x slower than the GPU: the GPU should take about 2/3 of the channels
    p = plan_split([linear("a", 60, 3e-3, 1.5e-3)], sync_s=5e-6)
    lay = p.layers[0]
    assert lay.side == "split" and abs(lay.gpu_channels - 40) <= 1
    assert p.predicted_s == pytest.approx(1e-3 + 5e-6, rel=0.03)
    assert p.bound_s == pytest.approx(3e-3 * 1.5e-3 / 4.5e-3)
    assert p.sides() == {"a": 60 - lay.gpu_channels}


def test_no_split_when_sync_or_margin_eats_the_gain() -> None:
    # a 50x faster GPU: the split would gain < 3%; and a huge sync cost forbids any split
    assert plan_split([linear("a", 64, 50e-3, 1e-3)], sync_s=5e-6).layers[0].side == "gpu"
    assert plan_split([linear("a", 64, 2e-3, 2e-3)], sync_s=5e-3).layers[0].side in ("cpu", "gpu")
    assert plan_split([linear("a", 64, 2e-3, 2e-3)], sync_s=5e-6, allow_split=False).splits == 0


def test_consecutive_layers_stay_on_one_side_without_sync() -> None:
    # b alone is slightly faster on the CPU, but moving there and back costs two syncs
    layers = [LayerCosts.single("a", "Relu", 5e-3, 1e-3), LayerCosts.single("b", "Softmax", 0.95e-3, 1e-3),
              LayerCosts.single("c", "Relu", 5e-3, 1e-3)]
    p = plan_split(layers, sync_s=50e-6)
    assert [lay.side for lay in p.layers] == ["gpu", "gpu", "gpu"]
    assert p.predicted_s == pytest.approx(3e-3)
    # with a big enough CPU advantage the move pays, and costs exactly two syncs
    layers[1] = LayerCosts.single("b", "Softmax", 0.5e-3, 1e-3)
    p = plan_split(layers, sync_s=50e-6)
    assert [lay.side for lay in p.layers] == ["gpu", "cpu", "gpu"]
    assert p.predicted_s == pytest.approx(2.5e-3 + 100e-6)


def test_small_layers_follow_their_neighbour() -> None:
    # the ReLU alone would be cheaper on the GPU, but it is small: it stays with the CPU conv before it
    layers = [LayerCosts.single("conv", "Conv", 1e-3, 5e-3),
              LayerCosts.single("relu", "Relu", 20e-6, 5e-6, small=True),
              LayerCosts.single("conv2", "Conv", 1e-3, 5e-3)]
    p = plan_split(layers, sync_s=1e-9)
    assert [lay.side for lay in p.layers] == ["cpu", "cpu", "cpu"]


def test_plan_never_predicts_worse_than_a_single_side() -> None:
    r = np.random.default_rng(0)
    for _ in range(50):
        layers = []
        for i in range(int(r.integers(1, 8))):
            c = int(r.integers(1, 40))
            layers.append(linear(f"l{i}", c, float(r.uniform(1e-5, 1e-2)), float(r.uniform(1e-5, 1e-2)),
                                 float(r.uniform(0, 1e-4))))
        p = plan_split(layers, sync_s=float(r.uniform(0, 1e-4)))
        assert p.predicted_s <= min(p.cpu_only_s, p.gpu_only_s) + 1e-12
        assert len(p.layers) == len(layers)


def test_plan_graph_on_a_model_with_roofline_costs() -> None:
    pytest.importorskip("onnx")
    from inferd.coexec.costs import format_plan, plan_graph
    from inferd.frontend import import_model
    from inferd.zoo import build

    g = import_model(build("tiny"))
    plan, src = plan_graph(g)
    assert src == "roofline"
    assert plan.layers and all(lay.side in ("cpu", "gpu", "split") for lay in plan.layers)
    text = format_plan(plan, src)
    assert plan.layers[0].name in text
