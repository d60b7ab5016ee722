"""Attention's Transposes absorbed into its products (the CPU's ``inferd.MatMulT``), and the two scalar Muls torch
writes before q k^T merged into one (import, every device)."""
from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import inferd
from inferd.frontend import import_model
from inferd.ops.base import kernels_for, run_layer, single_node_layer
from inferd.ops.gemm import MATMUL_T, matmul_t_reference
from inferd.package import cpu_graph
from inferd.planner.cost import layer_flops
from inferd.planner.layout import absorb_transposes
from ortutil import run_ort

RNG = np.random.default_rng(11)


def _model(nodes: list, inputs: list, outputs: list, inits: list) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "t", inputs, outputs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _io(name: str, shape: list | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def sdpa_model(t: int = 17, heads: int = 3, dh: int = 16, scale: float | None = None) -> onnx.ModelProto:
    """Self-attention as torch exports scaled_dot_product_attention after a fused qkv projection: the heads split
    out of one tensor by a Transpose and a Split, q and k^T each scaled by sqrt(1/sqrt(dh)), the heads merged back
    by a Transpose and a Reshape."""
    s = float(np.sqrt(1 / np.sqrt(dh))) if scale is None else scale
    d = heads * dh
    nodes = [
        helper.make_node("Reshape", ["qkv", "shape5"], ["r5"], name="split_heads"),
        helper.make_node("Transpose", ["r5"], ["t5"], perm=[2, 0, 3, 1, 4], name="heads_first"),
        helper.make_node("Split", ["t5", "ones"], ["q5", "k5", "v5"], axis=0, name="split"),
        helper.make_node("Squeeze", ["q5", "zero"], ["q"], name="sq_q"),
        helper.make_node("Squeeze", ["k5", "zero"], ["k"], name="sq_k"),
        helper.make_node("Squeeze", ["v5", "zero"], ["v"], name="sq_v"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2], name="k_t"),
        helper.make_node("Mul", ["q", "s"], ["qs"], name="scale_q"),
        helper.make_node("Mul", ["kt", "s"], ["kts"], name="scale_k"),
        helper.make_node("MatMul", ["qs", "kts"], ["scores"], name="qk"),
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["p", "v"], ["o"], name="pv"),
        helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3], name="merge"),
        helper.make_node("Reshape", ["ot", "shape3"], ["y"], name="merged"),
    ]
    inits = [numpy_helper.from_array(np.array([1, t, 3, heads, dh], np.int64), "shape5"),
             numpy_helper.from_array(np.array([1, t, d], np.int64), "shape3"),
             numpy_helper.from_array(np.array([1, 1, 1], np.int64), "ones"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array(s, np.float32), "s")]
    return _model(nodes, [_io("qkv", [1, t, 3 * d])], [_io("y", [1, t, d])], inits)


def test_attention_runs_without_its_k_and_merge_transposes_and_with_one_scale() -> None:
    m = sdpa_model()
    g = import_model(m)
    muls = [n for n in g.nodes if n.op == "Mul"]
    assert len(muls) == 1, [n.name for n in muls]  # k^T's scale merged into q's (q is as small as k^T)
    merged = float(g.constants[muls[0].inputs[1]])
    assert merged == pytest.approx(1 / 4, rel=1e-6)  # sqrt(1/sqrt(16)) squared
    run = cpu_graph(g)
    ops = [n.op for n in run.nodes]
    assert ops.count(MATMUL_T) == 2 and "MatMul" not in ops
    # the split of the heads stays a Transpose (its Split's outputs are views); k^T and the merge are absorbed
    assert [n.name for n in run.nodes if n.op == "Transpose"] == ["heads_first"]
    qk = next(n for n in run.nodes if n.name == "qk")
    pv = next(n for n in run.nodes if n.name == "pv")
    assert qk.attrs["perm_b"] == [0, 1, 3, 2] and "perm_a" not in qk.attrs
    assert pv.attrs["perm_y"] == [0, 2, 1, 3] and pv.outputs == ["ot"]
    assert "kt" in qk.attrs["_absorbed"] and "o" in pv.attrs["_absorbed"]
    qkv = RNG.standard_normal((1, 17, 144)).astype(np.float32)
    ref = run_ort(m, {"qkv": qkv})[0]
    model = inferd.load(m, device="cpu")
    model.run({"qkv": qkv})
    model.wait_warm(60)
    assert sum(1 for s in model._exec.steps if s is not None and s.layer.op == MATMUL_T and s.bound is not None) == 2
    got = model.run({"qkv": qkv})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_attention_with_the_merged_scale_matches_onnxruntime_on_vulkan() -> None:
    import inferd.vulkan

    if not inferd.vulkan.available():
        pytest.skip("needs a Vulkan device (lavapipe)")
    m = sdpa_model(t=9, heads=2, dh=8, scale=0.7)
    qkv = RNG.standard_normal((1, 9, 48)).astype(np.float32)
    got = inferd.load(m, device="vulkan").run({"qkv": qkv})["y"]
    np.testing.assert_allclose(got, run_ort(m, {"qkv": qkv})[0], rtol=1e-4, atol=1e-5)


def test_transposes_that_are_not_the_products_own_stay() -> None:
    """A Transpose another node also reads, one whose batch axes would not merge into one stride, a MatMul
    forced to another kernel, and one with a constant operand keep their Transposes; each model's answer holds."""
    w = RNG.standard_normal((8, 5)).astype(np.float32)
    nodes = [
        helper.make_node("Transpose", ["a"], ["at"], perm=[0, 1, 3, 2], name="shared_t"),
        helper.make_node("MatMul", ["at", "b"], ["y1"], name="mm_shared"),
        helper.make_node("Relu", ["at"], ["y2"], name="other_reader"),
        helper.make_node("Transpose", ["c"], ["ct"], perm=[1, 0, 2, 3], name="mixing_t"),
        helper.make_node("MatMul", ["ct", "d"], ["y3"], name="mm_mixing"),
        helper.make_node("Transpose", ["e"], ["et"], perm=[0, 1, 3, 2], name="forced_t"),
        helper.make_node("MatMul", ["et", "f"], ["y4"], name="mm_forced"),
        helper.make_node("Transpose", ["g"], ["gt"], perm=[0, 1, 3, 2], name="const_t"),
        helper.make_node("MatMul", ["gt", "w"], ["y5"], name="mm_const"),
    ]
    shapes = {"a": [2, 3, 6, 4], "b": [2, 3, 6, 5], "c": [2, 3, 4, 6], "d": [3, 2, 6, 5], "e": [2, 3, 6, 4],
              "f": [2, 3, 6, 5], "g": [2, 3, 8, 4]}
    m = _model(nodes, [_io(k, v) for k, v in shapes.items()], [_io(f"y{i}", None) for i in range(1, 6)],
               [numpy_helper.from_array(w, "w")])
    g = import_model(m)
    run = absorb_transposes(g, {"mm_forced": "reference"})
    assert [n.name for n in run.nodes if n.op == "Transpose"] == ["shared_t", "mixing_t", "forced_t", "const_t"]
    assert absorb_transposes(g) is not g  # forced_t is absorbed when nothing forces its MatMul
    feeds = {k: RNG.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
    ref = run_ort(m, feeds)
    got = inferd.load(m, device="cpu").run(feeds)
    for i, r in enumerate(ref, 1):
        np.testing.assert_allclose(got[f"y{i}"], r, rtol=1e-5, atol=1e-5, err_msg=f"y{i}")


PERMS = [(None, [0, 2, 1, 3], None), ([0, 1, 3, 2], [0, 1, 3, 2], [0, 2, 1, 3]), (None, None, [2, 1, 0, 3]),
         ([1, 0, 2, 3], None, None), ([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3])]


@pytest.mark.parametrize("perms", PERMS, ids=[str(i) for i in range(len(PERMS))])
@pytest.mark.parametrize("bound", [False, True])
def test_the_kernel_reads_and_writes_through_the_views_as_the_oracle_says(perms: tuple, bound: bool) -> None:
    """Product (2, 3, 5, 7) @ (2, 3, 7, 4) under every perm: collapsible ones go to the native GEMM, the others
    (perm_a [1, 0, 2, 3], perm_y [2, 1, 0, 3]) to numpy's matmul on the views; all equal the oracle."""
    pa, pb, py = perms
    logical_a, logical_b = (2, 3, 5, 7), (2, 3, 7, 4)

    def stored(shape: tuple[int, ...], perm: list[int] | None) -> np.ndarray:
        # the tensor whose transpose(perm) has the logical shape
        inv = np.argsort(perm) if perm is not None else range(len(shape))
        return RNG.standard_normal(tuple(shape[i] for i in inv)).astype(np.float32)

    a, b = stored(logical_a, pa), stored(logical_b, pb)
    attrs = {k: v for k, v in (("perm_a", pa), ("perm_b", pb), ("perm_y", py)) if v is not None}
    layer = single_node_layer(MATMUL_T, [a, b], attrs, const=[False, False])
    ref = matmul_t_reference(layer.node, [a, b])[0]
    want = np.matmul(a.transpose(pa) if pa else a, b.transpose(pb) if pb else b)
    np.testing.assert_array_equal(ref, want.transpose(py) if py else want)
    assert ref.shape == layer.outputs[0].shape
    assert layer_flops(layer) == 2 * ref.size * logical_a[-1]  # what the planners' roofline counts
    kernel = next(k for k in kernels_for(MATMUL_T, "cpu") if k.name == "matmul_native")
    assert kernel.applies(layer)
    got = run_layer(kernel, layer, [a, b], bound=bound)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_bad_perms_are_refused_by_shape_inference() -> None:
    a = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(Exception, match="not a permutation"):
        single_node_layer(MATMUL_T, [a, a], {"perm_b": [0, 0, 1]}, const=[False, False])


def test_collapsibility_matches_numpy() -> None:
    """The pass's stride arithmetic against what numpy's reshape does with the same views, over every perm of a
    rank-4 shape with a size-1 axis and of one without."""
    from inferd.planner.layout import _collapsible

    for shape in ((2, 3, 4, 5), (1, 3, 4, 5), (2, 1, 4, 5)):
        x = np.zeros(shape, np.float32)
        for perm in itertools.permutations(range(4)):
            v = x.transpose(perm)
            r = v.reshape(-1, v.shape[-2], v.shape[-1])
            assert _collapsible(shape, perm) == np.shares_memory(r, x), (shape, perm)


@pytest.mark.parametrize("gamma_shape,folds", [((64, 1, 1), True), ((1, 64, 1, 1), True), ((), True),
                                               ((1, 1, 1, 5), False), ((64, 1, 5), False)])
def test_a_layer_scale_after_the_transpose_back_folds_into_the_linear(gamma_shape: tuple, folds: bool) -> None:
    """ConvNeXt's block end: Linear (MatMul + bias) on NHWC tokens, Transpose back to NCHW, Mul by gamma per
    channel. Where gamma varies only along the axis the product's columns went to (or is a scalar), it folds into
    the weights' columns and the bias and the Mul is gone; a gamma varying along another axis stays a Mul. The
    answer equals onnxruntime's either way."""
    c, hw = 64, 5
    w = (RNG.standard_normal((4 * c, c)) * 0.1).astype(np.float32)
    b = RNG.standard_normal(c).astype(np.float32)
    gamma = (RNG.random(gamma_shape) + 0.5).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t0"]),
             helper.make_node("Add", ["t0", "b"], ["t1"]),
             helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 3, 1, 2]),
             helper.make_node("Mul", ["t2", "gamma"], ["y"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(gamma, "gamma")]
    m = _model(nodes, [_io("x", [1, hw, hw, 4 * c])], [_io("y", None)], inits)
    g = import_model(m)
    assert ("Mul" in [n.op for n in g.nodes]) != folds, [(n.op, n.inputs) for n in g.nodes]
    if folds:
        mm = next(n for n in g.nodes if n.op == "MatMul")
        assert mm.inputs[1] != "w"  # a scaled copy under a name of its own: the original may be shared
    x = RNG.standard_normal((1, hw, hw, 4 * c)).astype(np.float32)
    ref = run_ort(m, {"x": x})[0]
    got = inferd.load(m, device="cpu").run({"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
