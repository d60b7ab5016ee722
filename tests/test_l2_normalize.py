"""torch's F.normalize as exported (ReduceL2, Clip, Expand, Div) fused by the CPU graph into one row pass
(``inferd.L2Normalize``), and the patterns that only look like it left alone."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import inferd
from inferd.frontend import import_model
from inferd.ops.base import kernels_for, run_layer, single_node_layer
from inferd.ops.norm import L2NORM, l2norm_reference
from inferd.package import cpu_graph
from ortutil import run_ort

RNG = np.random.default_rng(5)
EPS = 1e-12


def _io(name: str, shape: list | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def normalize_model(shape: list[int], *, expand: bool = True, opset: int = 17, axes: list[int] | None = None,
                    clip_max: float | None = None, other_reader: bool = False,
                    eps: float = EPS) -> onnx.ModelProto:
    """y = x / Expand(Clip(ReduceL2(x), eps)) (+ Relu(norm) as a second output where ``other_reader``)."""
    axes = [-1] if axes is None else axes
    inits = [numpy_helper.from_array(np.array(shape, np.int64), "shape")]
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        red = helper.make_node("ReduceL2", ["x", "axes"], ["n"], keepdims=1, name="l2")
    else:
        red = helper.make_node("ReduceL2", ["x"], ["n"], axes=axes, keepdims=1, name="l2")
    inits.append(numpy_helper.from_array(np.array(eps, np.float32), "lo"))
    clip_in = ["n", "lo"]
    if clip_max is not None:
        inits.append(numpy_helper.from_array(np.array(clip_max, np.float32), "hi"))
        clip_in.append("hi")
    nodes = [red, helper.make_node("Clip", clip_in, ["c"], name="clip")]
    if expand:
        nodes.append(helper.make_node("Expand", ["c", "shape"], ["e"], name="expand"))
    nodes.append(helper.make_node("Div", ["x", "e" if expand else "c"], ["y"], name="div"))
    outs = [_io("y", shape)]
    if other_reader:
        nodes.append(helper.make_node("Relu", ["c"], ["r"], name="other"))
        outs.append(_io("r", None))
    g = helper.make_graph(nodes, "t", [_io("x", shape)], outs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("expand,opset", [(True, 17), (False, 17), (True, 18), (False, 13)])
def test_f_normalize_runs_as_one_row_pass(expand: bool, opset: int) -> None:
    shape = [1, 4, 12, 64]
    m = normalize_model(shape, expand=expand, opset=opset)
    run = cpu_graph(import_model(m))
    assert [n.op for n in run.nodes] == [L2NORM], [n.op for n in run.nodes]
    assert run.nodes[0].attrs["eps"] == pytest.approx(EPS) and run.nodes[0].outputs == ["y"]
    x = RNG.standard_normal(shape).astype(np.float32)
    x[0, 1, 3] = 0.0  # a zero row: divided by eps, as Clip makes it
    model = inferd.load(m, device="cpu")
    got = model.run({"x": x})["y"]
    np.testing.assert_allclose(got, run_ort(m, {"x": x})[0], rtol=1e-6, atol=1e-7)
    model.wait_warm(60)
    assert [s.kernel.name for s in model._exec.steps if s is not None] == ["l2norm_native"]
    np.testing.assert_allclose(model.run({"x": x})["y"], run_ort(m, {"x": x})[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", ["axis_not_last", "clip_max", "norm_read_elsewhere"])
def test_look_alikes_are_left_as_they_are(case: str) -> None:
    shape = [2, 6, 8]
    kw = {"axis_not_last": {"axes": [1]}, "clip_max": {"clip_max": 10.0},
          "norm_read_elsewhere": {"other_reader": True}}[case]
    m = normalize_model(shape, **kw)
    run = cpu_graph(import_model(m))
    assert L2NORM not in [n.op for n in run.nodes]
    x = RNG.standard_normal(shape).astype(np.float32)
    got = inferd.load(m, device="cpu").run({"x": x})
    for name, r in zip(["y", "r"], run_ort(m, {"x": x})):
        np.testing.assert_allclose(got[name], r, rtol=1e-6, atol=1e-7, err_msg=name)


def test_a_forced_kernel_on_the_div_keeps_the_pattern() -> None:
    m = normalize_model([3, 16])
    assert L2NORM not in [n.op for n in cpu_graph(import_model(m), {"div": "numpy"}).nodes]


@pytest.mark.parametrize("bound", [False, True])
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 33), (64, 1)])
def test_kernel_equals_the_oracle(shape: tuple[int, ...], bound: bool) -> None:
    x = (RNG.standard_normal(shape) * 3).astype(np.float32)
    x.reshape(-1, shape[-1])[0] = 0.0
    if x.size > 4:
        x.reshape(-1)[3] = np.nan  # its row comes out NaN
    layer = single_node_layer(L2NORM, [x], {"eps": 1e-6}, const=[False])
    ref = l2norm_reference(layer.node, [x])[0]
    with np.errstate(invalid="ignore"):
        want = x / np.maximum(np.sqrt((x.astype(np.float64) ** 2).sum(-1, keepdims=True)), 1e-6)
    np.testing.assert_allclose(ref, want, rtol=1e-6, atol=1e-7)
    kernel = next(k for k in kernels_for(L2NORM, "cpu") if k.name == "l2norm_native")
    got = run_layer(kernel, layer, [x], bound=bound)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
    assert np.array_equal(np.isnan(got), np.isnan(ref))
