"""The profiler's measurements resist a noisy machine: a layer's candidates timed in alternating rounds, and the
layers of one signature (repeated blocks) given one time: a pair its lesser, a larger group its lower median."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from inferd.frontend import import_model
from inferd.ir import Graph
from inferd.ops.base import Kernel, Layer
from inferd.runtime.cpu import CpuExecutor
from inferd.runtime import profiler


def _chain() -> onnx.ModelProto:
    """conv a and conv b: one shape, one signature; conv c: other output channels; conv d: conv b's shape with a
    fused activation of its own (a Relu after it, which import fuses)."""
    rng = np.random.default_rng(3)

    def w(name: str, cout: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal((cout, 8, 3, 3)) * 0.2).astype(np.float32), name)
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], pads=[1, 1, 1, 1], name="conv_a"),
             helper.make_node("Conv", ["a", "wb"], ["b"], pads=[1, 1, 1, 1], name="conv_b"),
             helper.make_node("Conv", ["b", "wd"], ["d0"], pads=[1, 1, 1, 1], name="conv_d"),
             helper.make_node("Relu", ["d0"], ["d"], name="relu_d"),
             helper.make_node("Conv", ["d", "wc"], ["y"], pads=[1, 1, 1, 1], name="conv_c")]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 12, 12])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 12, 12])],
                          [w("wa", 8), w("wb", 8), w("wd", 8), w("wc", 4)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _layers(g: Graph) -> list[tuple[Layer, list[Kernel], Kernel]]:
    """Each layer of ``g`` with its candidate CPU kernels and default, as the profiler is given them."""
    return CpuExecutor(g, lazy=True).candidates()


def _convs(entries: list[tuple[Layer, list[Kernel], Kernel]]) -> dict[str, tuple[Layer, list[Kernel], Kernel]]:
    return {e[0].name: e for e in entries if e[0].op == "Conv"}


def test_a_pair_of_one_signature_shares_the_lesser_time_each_measured() -> None:
    g = import_model(_chain())
    entries = _layers(g)
    convs = _convs(entries)
    assert {"conv_a", "conv_b", "conv_c", "conv_d"} <= set(convs)
    sig = {n: profiler.layer_signature(convs[n][0]) for n in convs}
    assert sig["conv_a"] == sig["conv_b"]
    assert sig["conv_c"] != sig["conv_a"] and sig["conv_d"] != sig["conv_a"]  # other channels; a fused Relu
    # the names of the tensors a fusion absorbed are no part of it (every block of a resnet has its own)
    a = convs["conv_a"][0]
    renamed = replace(a, node=replace(a.node, attrs={**a.node.attrs, "_absorbed": ["conv_a/bn_out"]}))
    assert profiler.layer_signature(renamed) == sig["conv_b"]
    assert profiler.layer_signature(replace(a, node=replace(a.node, attrs={**a.node.attrs, "act": 1}))) != sig["conv_b"]
    k1, k2 = convs["conv_a"][1][0].name, convs["conv_a"][1][1].name
    times = {("conv_a", k1, "exec"): 2.0e-3, ("conv_b", k1, "exec"): 1.0e-3,  # a burst hit conv_a's k1
             ("conv_a", k2, "exec"): 1.2e-3, ("conv_b", k2, "exec"): 1.6e-3,  # and conv_b's k2
             ("conv_a", k1, "transform"): 4.0e-4,  # conv_b's transform was not measured (a time budget)
             ("conv_c", k1, "exec"): 9.0e-3, ("conv_d", k1, "exec"): 8.0e-3}
    before = dict(times)
    changed = profiler.pool_signatures(entries, times)
    assert times[("conv_a", k1, "exec")] == times[("conv_b", k1, "exec")] == 1.0e-3
    assert times[("conv_a", k2, "exec")] == times[("conv_b", k2, "exec")] == 1.2e-3
    assert times[("conv_b", k1, "transform")] == 4.0e-4
    # other signatures keep what they measured, and nothing is invented for them
    assert times[("conv_c", k1, "exec")] == before[("conv_c", k1, "exec")]
    assert times[("conv_d", k1, "exec")] == before[("conv_d", k1, "exec")]
    assert not any(n in ("conv_c", "conv_d") and k not in (k1,) for n, k, _p in times)
    assert changed == 3
    # both layers now choose the same kernel: k1 (before, conv_a's own times said k2)
    assert min((k1, k2), key=lambda k: times[("conv_a", k, "exec")]) == k1


def test_a_larger_group_takes_its_middle_time_not_its_luckiest() -> None:
    """Twelve blocks of one shape each measured: every block's cost inside the model is closer to the middle of
    what they measured than to the least (which had vit_tiny's schedule predicted at less than half its time)."""
    g = import_model(_chain())
    a, kernels, default = _convs(_layers(g))["conv_a"]
    members = [replace(a, node=replace(a.node, name=f"block{i}")) for i in range(5)]
    assert len({profiler.layer_signature(m) for m in members}) == 1
    k1, k2 = kernels[0].name, kernels[1].name
    times = {(f"block{i}", k1, "exec"): t for i, t in enumerate([1.0e-3, 3.0e-3, 1.4e-3, 1.2e-3, 9.0e-3])}
    times[("block0", k2, "exec")] = 5.0e-4
    times[("block1", k2, "exec")] = 7.0e-4
    times[("block2", k2, "exec")] = 6.0e-4
    times[("block3", k2, "exec")] = 2.0e-3  # four values: the lesser middle one
    profiler.pool_signatures([(m, kernels, default) for m in members], times)
    assert {times[(f"block{i}", k1, "exec")] for i in range(5)} == {1.4e-3}
    assert {times[(f"block{i}", k2, "exec")] for i in range(5)} == {6.0e-4}


class _Fake(Kernel):
    """A kernel that records its runs in ``log`` (as its name) and costs nothing."""

    def __init__(self, name: str, log: list[str], nbytes: int = 64) -> None:
        self.name = name
        self._log = log
        self._nbytes = nbytes

    def applies(self, layer: Layer) -> bool:
        return True

    def transformed_nbytes(self, layer: Layer) -> int:
        return self._nbytes

    def run(self, layer: Layer, inputs: Any, params: Any, outputs: Any) -> None:
        self._log.append(self.name)


def _one_layer() -> tuple[Graph, Layer]:
    g = import_model(_chain())
    return g, next(e[0] for e in _layers(g) if e[0].name == "conv_c")


def test_a_layers_candidates_are_timed_in_alternating_rounds() -> None:
    g, lay = _one_layer()
    log: list[str] = []
    ks = [_Fake("k1", log), _Fake("k2", log), _Fake("k3", log)]
    prof = profiler.profile_layers([(lay, ks, ks[0])], g.constants, profiler.DeviceRates(), {}, reps=3)
    # each kernel's first run right after its bind, then rounds of one run of each: a burst of other work on the
    # machine slows every candidate alike, not the one timed during it
    assert log == ["k1", "k2", "k3"] + ["k1", "k2", "k3"] * 3
    for k in ("k1", "k2", "k3"):
        assert {(lay.name, k, p) for p in ("exec", "exec_first")} <= set(prof.times)


def test_candidates_too_large_to_hold_together_are_timed_one_after_the_other(monkeypatch: pytest.MonkeyPatch) -> None:
    g, lay = _one_layer()
    log: list[str] = []
    monkeypatch.setattr(profiler, "INTERLEAVE_BYTES", 1000)
    ks = [_Fake("k1", log, 600), _Fake("k2", log, 600), _Fake("k3", log, 300)]
    prof = profiler.profile_layers([(lay, ks, ks[0])], g.constants, profiler.DeviceRates(), {}, reps=2)
    # k1 is kept for the rounds; k2 would pass the bound beside it: timed alone at once; k3 fits beside k1
    assert log == ["k1", "k2", "k2", "k2", "k3", "k1", "k3", "k1", "k3"]
    assert all((lay.name, k, "exec") in prof.times for k in ("k1", "k2", "k3"))
    # a kernel past the bound alone is timed alone too: the next ones never run beside its weights
    log.clear()
    ks = [_Fake("k1", log, 1200), _Fake("k2", log, 300), _Fake("k3", log, 300)]
    profiler.profile_layers([(lay, ks, ks[0])], g.constants, profiler.DeviceRates(), {}, reps=2)
    assert log == ["k1", "k1", "k1", "k2", "k3", "k2", "k3", "k2", "k3"]


def test_a_kernel_that_fails_in_the_rounds_leaves_no_entry() -> None:
    g, lay = _one_layer()
    log: list[str] = []

    class Flaky(_Fake):
        def run(self, layer: Layer, inputs: Any, params: Any, outputs: Any) -> None:
            super().run(layer, inputs, params, outputs)
            if log.count(self.name) > 1:
                raise RuntimeError("fails at its second run")
    ks = [_Fake("k1", log), Flaky("k2", log)]
    prof = profiler.profile_layers([(lay, ks, ks[0])], g.constants, profiler.DeviceRates(), {}, reps=3)
    assert (lay.name, "k1", "exec") in prof.times
    assert not any(k == "k2" for _n, k, _p in prof.times)
    assert log.count("k2") == 2  # not run again after it failed
