"""Operator coverage (issue 18): the ``inferd ops`` table against the registry, an unsupported operator's
refusal at import, and the semantics of the new operators that the official node tests leave out (older
opsets' attribute definitions, integer types, errors)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import inferd
import inferd.ops
from inferd import cli
from inferd.errors import KernelError, ShapeError, UnsupportedOpError
from inferd.frontend import import_model
from inferd.ops.base import kernels_for, op_spec, run_layer, single_node_layer
from inferd.ops.control import OPTIONAL_OPS
from inferd.ops.coverage import LOWERED, NO_VULKAN


# ------------------------------------------------------------------------------------------ inferd ops

def test_ops_json_lists_every_registered_op_with_its_kernels(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ops", "--json"]) == 0
    cov = json.loads(capsys.readouterr().out)
    rows = {r["op"]: r for r in cov["ops"]}
    assert set(rows) == set(inferd.ops.registered_ops())
    for op, r in rows.items():
        assert r["cpu"] == [k.name for k in kernels_for(op, "cpu")], op
        assert r["cpu"], f"{op} has no CPU kernel"
        assert r["opsets"] == [op_spec(op).min_opset, cov["max_opset"]]  # type: ignore[union-attr]
    assert "gemm_packed" in rows["Gemm"]["cpu"] and any("constant" in n for n in rows["TopK"]["notes"])
    assert rows["Reshape"]["notes"] == ["a view of its input (no copy)"]
    assert rows["Einsum"]["opsets"][0] == 12 and rows["GroupNormalization"]["opsets"][0] == 18


def test_ops_marks_vulkan_kernels(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("vulkan", reason="no Vulkan bindings: the table says the Vulkan column is unknown")
    assert cli.main(["ops", "--json"]) == 0
    cov = json.loads(capsys.readouterr().out)
    assert cov["vulkan_error"] is None  # the kernels' host bindings load without a device
    rows = {r["op"]: r for r in cov["ops"]}
    for op, r in rows.items():
        assert r["vulkan"] == [k.name for k in kernels_for(op, "vulkan")], op
        assert (NO_VULKAN in r["notes"]) == (not r["vulkan"] and not op_spec(op).alias  # type: ignore[union-attr]
                                              and op not in ("If", "Loop", "Scan")
                                              and op not in OPTIONAL_OPS), op
    # spot checks that would catch a column mix-up
    assert "vk_winograd43" in rows["Conv"]["vulkan"] and rows["TopK"]["vulkan"] == []
    assert rows["Sin"]["vulkan"] == ["vk_unary"] and NO_VULKAN in rows["TopK"]["notes"]
    assert LOWERED in rows["OptionalGetElement"]["notes"]


def test_ops_text_table_has_a_row_per_op(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ops"]) == 0
    lines = capsys.readouterr().out.splitlines()
    ops = inferd.ops.registered_ops()
    first = {ln.split()[0] for ln in lines[2:-2]}
    assert first == set(ops)
    topk = next(ln for ln in lines if ln.startswith("TopK "))
    assert "numpy" in topk
    default = [o for o in ops if "." not in o]
    assert lines[-2].startswith(f"{len(default)} operators of the default domain")
    assert lines[-1].startswith(f"{len(ops) - len(default)} operators of other domains: com.microsoft.")


# ------------------------------------------------------------------------------------------ refusals

def _model(nodes: list, inputs: list, outputs: list, opset: int = 17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "t", inputs, outputs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


# TfIdfVectorizer: string processing, out of issue 18's scope, so it stays unregistered
_UNSUPPORTED = "TfIdfVectorizer"


def test_unsupported_op_fails_at_import_naming_op_and_node() -> None:
    assert op_spec(_UNSUPPORTED) is None
    m = _model([helper.make_node("Relu", ["x"], ["r"], name="ok"),
                helper.make_node(_UNSUPPORTED, ["r"], ["y"], name="the_tfidf", mode="TF", min_gram_length=1,
                                 max_gram_length=1, max_skip_count=0, ngram_counts=[0], ngram_indexes=[0],
                                 pool_int64s=[1])],
               [helper.make_tensor_value_info("x", TensorProto.INT64, [1, 4])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(UnsupportedOpError) as ei:
        inferd.load(m)
    assert ei.value.op_type == _UNSUPPORTED and ei.value.node == "the_tfidf"
    assert _UNSUPPORTED in str(ei.value) and "the_tfidf" in str(ei.value)


def test_unsupported_op_inside_a_branch_names_its_path() -> None:
    def branch(op: str, name: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, ["x"], ["b"], name=name)], name,
                                 [], [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])

    node = helper.make_node("If", ["c"], ["y"], name="the_if", then_branch=branch("Relu", "then"),
                            else_branch=branch(_UNSUPPORTED, "inner"))
    m = _model([node], [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    with pytest.raises(UnsupportedOpError) as ei:
        import_model(m)
    assert ei.value.op_type == _UNSUPPORTED and ei.value.node == "the_if.else_branch/inner"


def test_topk_with_a_runtime_k_is_data_dependent() -> None:
    """A run-time k is no longer refused: its outputs are sized at run time within the whole axis (the planned
    bound); tests/test_datadep.py runs it against onnxruntime."""
    m = _model([helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk_rt")],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5]),
                helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
               [helper.make_tensor_value_info("v", TensorProto.FLOAT, None),
                helper.make_tensor_value_info("i", TensorProto.INT64, None)])
    g = import_model(m)
    assert g.infos["v"].shape == (3, 5) and {"v", "i"} <= g.runtime_shaped


# ------------------------------------------------------------------------------------------ semantics

def _run(op: str, inputs: list, attrs: dict | None = None, n_out: int = 1, const: list | None = None) -> list:
    """The op's CPU kernels and its oracle on ``inputs``; asserts they agree (exactly, except a native kernel's
    float results, which sum in another order: to float32 rounding) and returns the last kernel's outputs."""
    layer = single_node_layer(op, inputs, attrs, const, n_out)
    ref = op_spec(op).reference(layer.node, inputs)  # type: ignore[union-attr]
    kernels = [k for k in kernels_for(op, "cpu") if k.applies(layer)]
    assert kernels
    for kernel in kernels:  # every kernel that applies (TopK, GroupNormalization ... have native ones)
        got = run_layer(kernel, layer, inputs)
        for g, r in zip(got, ref):
            assert g.dtype == r.dtype, kernel.name
            if kernel.name != "numpy" and g.dtype.kind == "f":
                np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=kernel.name)
            else:
                assert np.array_equal(g, r, equal_nan=True), kernel.name
    return got


def test_hardmax_before_opset_13_coerces_to_2d() -> None:
    x = np.array([[[1, 9], [3, 4]], [[5, 5], [0, 7]]], np.float32)
    (old,) = _run("Hardmax", [x], {"axis": 1, "_opset": 11})  # one row per batch over (2, 2)
    assert old.tolist() == [[[0, 1], [0, 0]], [[0, 0], [0, 1]]]
    (new,) = _run("Hardmax", [x], {"axis": 1, "_opset": 13})  # along axis 1 only; ties take the first
    assert new.tolist() == [[[0, 1], [1, 0]], [[1, 0], [0, 1]]]


def test_group_normalization_opset18_scale_is_per_group() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 3, 3)).astype(np.float32)
    s, b = np.array([2.0, -1.0], np.float32), np.array([0.5, 0.0], np.float32)
    (y18,) = _run("GroupNormalization", [x, s, b], {"num_groups": 2, "_opset": 18})
    (y21,) = _run("GroupNormalization", [x, np.repeat(s, 3), np.repeat(b, 3)], {"num_groups": 2, "_opset": 21})
    np.testing.assert_allclose(y18, y21, rtol=1e-6)
    g = x.reshape(2, 2, -1)
    want = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    np.testing.assert_allclose(y21, want * np.repeat(s, 3)[:, None, None] + np.repeat(b, 3)[:, None, None],
                               rtol=1e-5, atol=1e-6)


def test_topk_integers_ties_and_smallest() -> None:
    x = np.array([[3, 1, 3, -2**31, 2**31 - 1]], np.int32)  # extremes: negating would overflow
    v, i = _run("TopK", [x, np.array([3], np.int64)], {"_opset": 11}, n_out=2)
    assert v.tolist() == [[2**31 - 1, 3, 3]] and i.tolist() == [[4, 0, 2]]
    v, i = _run("TopK", [x, np.array([2], np.int64)], {"largest": 0, "_opset": 11}, n_out=2)
    assert v.tolist() == [[-2**31, 1]] and i.tolist() == [[3, 1]]
    v, i = _run("TopK", [x.astype(np.float32)], {"k": 2, "_opset": 9}, n_out=2)  # k as an attribute
    assert i.tolist() == [[4, 0]]


def test_mod_and_bitshift_integer_semantics() -> None:
    a, b = np.array([-7, 7, -7, 7], np.int32), np.array([3, -3, -3, 3], np.int32)
    assert _run("Mod", [a, b])[0].tolist() == [2, -2, -1, 1]  # sign of the divisor
    assert _run("Mod", [a, b], {"fmod": 1})[0].tolist() == [-1, 1, -1, 1]  # sign of the dividend
    u = np.array([1, 16, 255], np.uint8)
    assert _run("BitShift", [u, np.array([2], np.uint8)], {"direction": "LEFT"})[0].tolist() == [4, 64, 252]
    assert _run("BitShift", [u, np.array([2], np.uint8)], {"direction": "RIGHT"})[0].tolist() == [0, 4, 63]


def test_bitshift_without_a_direction_is_refused() -> None:
    m = _model([helper.make_node("BitShift", ["x", "x"], ["y"], name="bs")],
               [helper.make_tensor_value_info("x", TensorProto.UINT8, [2])],
               [helper.make_tensor_value_info("y", TensorProto.UINT8, [2])])
    with pytest.raises(UnsupportedOpError, match="direction"):
        import_model(m)


def test_scatter_nd_out_of_range_index_names_the_node() -> None:
    data = np.zeros((4, 2), np.float32)
    layer = single_node_layer("ScatterND", [data, np.array([[5]], np.int64), np.ones((1, 2), np.float32)],
                              const=[False, False, False])
    with pytest.raises(KernelError, match="n0.*out of range"):
        run_layer(kernels_for("ScatterND", "cpu")[0], layer,
                  [data, np.array([[5]], np.int64), np.ones((1, 2), np.float32)])
    (y,) = _run("ScatterND", [data, np.array([[-1], [0], [-1]], np.int64), np.arange(6, dtype=np.float32).reshape(3, 2)],
                {"reduction": "add"}, const=[False, False, False])
    assert y.tolist() == [[2, 3], [0, 0], [0, 0], [4, 6]]  # negative indices wrap; duplicates accumulate


def test_einsum_implicit_output_and_ellipsis_shapes() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    (y,) = _run("Einsum", [a, b], {"equation": "...ij,jk"}, const=[False, False])  # implicit: ...ik
    assert y.shape == (2, 3, 5)
    np.testing.assert_allclose(y, a @ b, rtol=1e-5, atol=1e-5)
    (t,) = _run("Einsum", [a[0, :3, :3]], {"equation": "ii"})  # trace: scalar
    assert t.shape == ()
    with pytest.raises(ShapeError, match="label 'j' is 4 and 3"):
        single_node_layer("Einsum", [a, b[:3]], {"equation": "bij,jk->bik"}, const=[False, False])


def test_unfused_activations_keep_float16_and_integer_shrink() -> None:
    x = np.array([-3, -1, 0, 1, 3], np.float16)
    for op in ("Elu", "Selu", "Mish", "Softsign", "ThresholdedRelu"):
        (y,) = _run(op, [x])
        assert y.dtype == np.float16
    (s,) = _run("Shrink", [np.array([-5, -1, 0, 1, 5], np.int32)], {"lambd": 1.5, "bias": 1.0})
    assert s.dtype == np.int32 and s.tolist() == [-4, 0, 0, 0, 4]


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_topk_selection_path_keeps_the_tie_rule(largest: bool, dtype: type) -> None:
    """Rows long enough for the partition-then-sort path, with many ties at the k-th value: the same indices
    as sorting the whole row by (value, index)."""
    from inferd.ops.indexing import _TOPK_SELECT_MIN, topk_rows

    rng = np.random.default_rng(3)
    n, k = _TOPK_SELECT_MIN + 5, 97
    x2 = rng.integers(-20, 20, (4, n)).astype(dtype)  # ~100 copies of each value
    x2[1] = 7  # one row of a single value: every candidate ties
    got = topk_rows(x2, k, largest)
    for row, g in zip(x2, got):
        want = sorted(range(n), key=lambda j: (-row[j] if largest else row[j], j))[:k]
        assert g.tolist() == want
