"""Gemm/MatMul, pooling, normalisation and Resize: every CPU kernel and the OpSpec reference vs onnxruntime.

Each case builds a one-node ONNX model, runs it in onnxruntime, and checks that
  * ``OpSpec.infer`` gives onnxruntime's output shape,
  * every registered CPU kernel of the op (the fast one and ``reference``) matches within 1e-4
    (max |ours - ort| / max |ort|), integer outputs exactly.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from inferd.errors import ShapeError, UnsupportedOpError
from inferd.ir import Node, TensorInfo
from inferd.ops import kernels_for, op_spec, run_layer, single_node_layer
from inferd import native
from inferd.ops.base import choose_kernel, raw_key
from inferd.ops.norm import fold_bn_into

TOL = 1e-4
RNG = np.random.default_rng(1234)


def rnd(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


# --------------------------------------------------------------------------- onnxruntime harness

def _ir(opset: int) -> int:
    return 10 if opset >= 21 else 9 if opset >= 19 else 8 if opset >= 15 else 7


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _model(nodes: list[onnx.NodeProto], inputs: Sequence[tuple[str, np.ndarray, bool]], outputs: Sequence[str],
           out_elem: int, opset: int) -> onnx.ModelProto:
    vis, inits = [], []
    for name, a, const in inputs:
        if const:
            inits.append(numpy_helper.from_array(a, name))
        else:
            vis.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)))
    g = helper.make_graph(nodes, "g", vis, [helper.make_tensor_value_info(o, out_elem, None) for o in outputs],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = _ir(opset)
    return m


def ort_single(op: str, inputs: Sequence[np.ndarray | None], attrs: dict[str, Any] | None, opset: int,
               const: Sequence[bool]) -> np.ndarray:
    names = [f"x{i}" if a is not None else "" for i, a in enumerate(inputs)]
    node = helper.make_node(op, names, ["y0"], name="n0", **(attrs or {}))
    ins = [(n, a, c) for n, a, c in zip(names, inputs, const) if a is not None]
    m = _model([node], ins, ["y0"], helper.np_dtype_to_tensor_dtype(inputs[0].dtype), opset)
    feeds = {n: a for n, a, c in ins if not c}
    return _session(m).run(None, feeds)[0]


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a64 - b64)) / max(float(np.max(np.abs(b64))), 1e-30)) if b64.size else 0.0


def assert_close(ours: np.ndarray, want: np.ndarray, what: str, tol: float = TOL) -> None:
    assert ours.shape == want.shape, f"{what}: shape {ours.shape} != {want.shape}"
    assert ours.dtype == want.dtype, f"{what}: dtype {ours.dtype} != {want.dtype}"
    if np.issubdtype(want.dtype, np.integer):
        np.testing.assert_array_equal(ours, want, err_msg=what)
    else:
        e = rel_err(ours, want)
        assert e <= tol, f"{what}: relative error {e:.3g} > {tol}"


def check_vs_ort(op: str, inputs: Sequence[np.ndarray | None], attrs: dict[str, Any] | None = None, *,
                 opset: int = 17, const: Sequence[bool] | None = None, tol: float = TOL,
                 ours_attrs: dict[str, Any] | None = None) -> np.ndarray:
    """Run ``op`` in onnxruntime and with every CPU kernel; assert infer shape and values agree."""
    if const is None:
        const = [i > 0 for i in range(len(inputs))]
    want = ort_single(op, inputs, attrs, opset, const)
    a = dict(attrs or {})
    a.update(ours_attrs or {})
    layer = single_node_layer(op, inputs, a, const=const)
    assert layer.out_shape() == want.shape, f"{op} infer: {layer.out_shape()} != onnxruntime {want.shape}"
    ks = kernels_for(op)
    assert {"reference"} < {k.name for k in ks}, f"{op}: expected a fast kernel besides reference, got {ks}"
    for k in ks:
        if not k.applies(layer):
            continue
        raw = {raw_key(i): np.asarray(inputs[i]).copy() for i in layer.const_inputs}
        got = run_layer(k, layer, inputs)[0]
        assert_close(got, want, f"{op} kernel {k.name} attrs={attrs}", tol)
        for i in layer.const_inputs:  # transform() must not have touched the caller's constants
            np.testing.assert_array_equal(np.asarray(inputs[i]), raw[raw_key(i)])
    return want


def run_all_kernels(op: str, inputs: Sequence[np.ndarray | None], attrs: dict[str, Any],
                    const: Sequence[bool] | None = None) -> dict[str, np.ndarray]:
    layer = single_node_layer(op, inputs, attrs, const=const)
    return {k.name: run_layer(k, layer, inputs)[0] for k in kernels_for(op) if k.applies(layer)}


# =========================================================================== Gemm / MatMul

@pytest.mark.parametrize("transA", [0, 1])
@pytest.mark.parametrize("transB", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (), (7,), (1, 7), (5, 1), (5, 7)])
def test_gemm_trans_and_c_broadcast(transA: int, transB: int, c_shape: tuple[int, ...] | None) -> None:
    m, k, n = 5, 6, 7
    a = rnd(k, m) if transA else rnd(m, k)
    b = rnd(n, k) if transB else rnd(k, n)
    c = None if c_shape is None else rnd(*c_shape)
    attrs = dict(transA=transA, transB=transB, alpha=0.75, beta=1.5)
    check_vs_ort("Gemm", [a, b] + ([] if c is None else [c]), attrs, opset=13)


@pytest.mark.parametrize("const", [(False, True, True), (False, False, False), (True, False, True), (False, True, False)])
def test_gemm_const_and_dynamic_operands(const: tuple[bool, ...]) -> None:
    a, b, c = rnd(4, 9), rnd(3, 9), rnd(3)
    check_vs_ort("Gemm", [a, b, c], dict(transB=1, alpha=2.0, beta=0.5), opset=13, const=list(const))
    check_vs_ort("Gemm", [a, b.T.copy(), c], {}, opset=13, const=list(const))


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("transA", [0, 1])
def test_gemm_few_rows(m: int, transA: int) -> None:
    """1-3 rows take the matrix-vector path of the gemm kernel, more rows one sgemm."""
    a = rnd(40, m) if transA else rnd(m, 40)
    check_vs_ort("Gemm", [a, rnd(30, 40), rnd(30)], dict(transA=transA, transB=1, alpha=1.5), opset=13)
    check_vs_ort("MatMul", [rnd(1, m, 40), rnd(40, 30)], opset=13)


def test_gemm_fc_layer_transB_like_pytorch() -> None:
    check_vs_ort("Gemm", [rnd(2, 2048), rnd(1000, 2048) * 0.02, rnd(1000)], dict(transB=1), opset=13)


MATMUL_SHAPES = [
    ((6,), (6, 4)),
    ((3, 6), (6,)),
    ((6,), (6,)),
    ((3, 6), (6, 4)),
    ((2, 3, 6), (6, 4)),
    ((2, 5, 3, 6), (6, 4)),
    ((2, 3, 6), (2, 6, 4)),
    ((2, 1, 3, 6), (5, 6, 4)),
    ((6,), (2, 6, 4)),
    ((2, 3, 6), (6, 1)),
    ((1, 3, 6), (4, 6, 2)),
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
@pytest.mark.parametrize("b_const", [True, False])
def test_matmul_shapes(sa: tuple[int, ...], sb: tuple[int, ...], b_const: bool) -> None:
    check_vs_ort("MatMul", [rnd(*sa), rnd(*sb)], opset=13, const=[False, b_const])


def test_matmul_shape_errors() -> None:
    spec = op_spec("MatMul")
    node = Node("mm", "MatMul", ["a", "b"], ["y"], {})
    f32 = np.dtype(np.float32)
    with pytest.raises(ShapeError, match="mm"):
        spec.infer(node, [TensorInfo("a", (3, 5), f32), TensorInfo("b", (4, 2), f32)], {})
    with pytest.raises(ShapeError, match="batch"):
        spec.infer(node, [TensorInfo("a", (2, 3, 5), f32), TensorInfo("b", (3, 5, 2), f32)], {})
    g = op_spec("Gemm")
    gnode = Node("g", "Gemm", ["a", "b", "c"], ["y"], {"transB": 1})
    with pytest.raises(ShapeError, match="C"):
        g.infer(gnode, [TensorInfo("a", (3, 5), f32), TensorInfo("b", (4, 5), f32), TensorInfo("c", (3, 3), f32)], {})


def _np_act(y: np.ndarray, act: tuple[str, tuple[float, ...]]) -> np.ndarray:
    """Activations written out independently of apply_act."""
    name, p = act
    y = y.astype(np.float64)
    if name == "Relu":
        return np.maximum(y, 0)
    if name == "LeakyRelu":
        return np.where(y < 0, p[0] * y, y)
    if name == "Clip":
        return np.clip(y, p[0], p[1])
    if name == "Sigmoid":
        return 1 / (1 + np.exp(-y))
    if name == "HardSwish":
        return y * np.clip(y / 6 + 0.5, 0, 1)
    if name == "Gelu":
        return 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))
    if name == "Tanh":
        return np.tanh(y)
    raise AssertionError(name)


ACTS = [("Relu", ()), ("LeakyRelu", (0.1,)), ("Clip", (-0.5, 0.7)), ("Sigmoid", ()), ("HardSwish", ()),
        ("Gelu", (1.0,)), ("Tanh", ())]


@pytest.mark.parametrize("act", ACTS + [None])
@pytest.mark.parametrize("with_c", [True, False])
def test_gemm_fused_residual_and_act(act: tuple[str, tuple[float, ...]] | None, with_c: bool) -> None:
    a, b, c, r = rnd(4, 8), rnd(6, 8), rnd(6), rnd(4, 6)
    alpha, beta = 0.5, 2.0
    want = alpha * (a.astype(np.float64) @ b.T.astype(np.float64)) + r
    if with_c:
        want = want + beta * c
    if act is not None:
        want = _np_act(want, act)
    ins = [a, b, c, r] if with_c else [a, b, None, r]
    attrs: dict[str, Any] = dict(transB=1, alpha=alpha, beta=beta, residual=True)
    if act is not None:
        attrs["act"] = act
    const = [False, True, True, False]
    outs = run_all_kernels("Gemm", ins, attrs, const)
    outs["OpSpec.reference"] = op_spec("Gemm").reference(Node("g", "Gemm", ["a", "b", "c" if with_c else "", "r"],
                                                              ["y"], attrs), ins)[0]
    assert {"gemm", "reference"} <= set(outs)
    for k, y in outs.items():
        assert_close(y, want.astype(np.float32), f"Gemm fused {act} ({k})")


@pytest.mark.parametrize("act", [("Relu", ()), ("Gelu", (1.0,)), None])
@pytest.mark.parametrize("sa,sb,b_const", [((2, 3, 8), (8, 5), True), ((2, 3, 8), (2, 8, 5), False),
                                           ((3, 8), (8, 5), True)])
def test_matmul_fused_residual_and_act(act: Any, sa: tuple[int, ...], sb: tuple[int, ...], b_const: bool) -> None:
    a, b = rnd(*sa), rnd(*sb)
    out_shape = np.matmul(a, b).shape
    r = rnd(*out_shape)
    want = a.astype(np.float64) @ b.astype(np.float64) + r
    if act is not None:
        want = _np_act(want, act)
    attrs: dict[str, Any] = {"residual": True}
    if act is not None:
        attrs["act"] = act
    outs = run_all_kernels("MatMul", [a, b, r], attrs, [False, b_const, False])
    assert {"gemm", "reference"} <= set(outs)
    for k, y in outs.items():
        assert_close(y, want.astype(np.float32), f"MatMul fused {act} ({k})")


def test_gemm_act_without_residual_and_broadcast_residual() -> None:
    a, b, r = rnd(3, 4), rnd(4, 5), rnd(5)
    want = np.maximum(a.astype(np.float64) @ b + r, 0).astype(np.float32)
    for k, y in run_all_kernels("MatMul", [a, b, r], {"residual": True, "act": ("Relu", ())},
                                [False, True, False]).items():
        assert_close(y, want, f"MatMul broadcast residual ({k})")
    want2 = _np_act(a.astype(np.float64) @ b, ("Sigmoid", ())).astype(np.float32)
    for k, y in run_all_kernels("Gemm", [a, b], {"act": ("Sigmoid", ())}).items():
        assert_close(y, want2, f"Gemm act only ({k})")


def test_gemm_kernel_weight_layout() -> None:
    """The default kernel stores B as contiguous (K, N) with alpha folded in, and leaves the raw B alone."""
    b, c = rnd(7, 5), np.ones(7, np.float32)  # transB=1: N=7, K=5
    layer = single_node_layer("Gemm", [rnd(2, 5), b, c], dict(transB=1, alpha=3.0, beta=2.0))
    k = next(k for k in kernels_for("Gemm") if k.name == "gemm")
    p = k.transform(layer, {raw_key(1): b, raw_key(2): c})
    assert p["w"].shape == (5, 7) and p["w"].flags.c_contiguous
    np.testing.assert_allclose(p["w"], 3.0 * b.T, rtol=1e-6)
    np.testing.assert_allclose(p["bias"], 2.0 * np.ones(7), rtol=1e-6)
    assert k.transformed_nbytes(layer) == (b.nbytes + 7 * 4)
    # the cold-start variant keeps B as exported: no copy at all when alpha == 1
    layer1 = single_node_layer("Gemm", [rnd(2, 5), b, c], dict(transB=1))
    nt = next(k for k in kernels_for("Gemm") if k.name == "gemm_nt")
    assert nt.applies(layer1) and not nt.applies(single_node_layer("Gemm", [rnd(2, 5), b.T.copy(), c], {}))
    assert nt.transform(layer1, {raw_key(1): b, raw_key(2): c})["w"] is b


@pytest.mark.parametrize("op,attrs", [("Sigmoid", {}), ("HardSwish", {}), ("HardSigmoid", dict(alpha=0.3, beta=0.4)),
                                      ("Sigmoid", {})], ids=["sigmoid", "hswish", "hsigmoid", "sigmoid-odd"])
def test_standalone_activation_native_pass(op: str, attrs: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A big unfused activation (a detector head's Sigmoid after its Transpose) goes through the C pass, bound and
    run alike: onnxruntime's and the numpy oracle's values, infinities and NaN included."""
    x = rnd(1, 3, 6400, 6) * 8 if attrs or op != "Sigmoid" else rnd(3, 6401) * 8  # 6401 columns: rows of 1
    x.flat[:4] = [np.inf, -np.inf, np.nan, 0.0]
    ort = ort_single(op, [x], attrs, 17, [False])  # its Sigmoid is a rational fit: ~1e-7 off near 0
    layer = single_node_layer(op, [x], attrs)
    want = op_spec(op).reference(layer.node, [x])[0]
    np.testing.assert_allclose(want, ort, rtol=1e-5, atol=1e-6)
    eltwise = next(k for k in kernels_for(op) if k.name == "eltwise")
    calls = []
    real, real_bound = native.bias_act, native.act_bound

    def counted_bound(y: np.ndarray, act: Any) -> Any:
        f = real_bound(y, act)
        return None if f is None else (lambda: calls.append(1) or f())

    monkeypatch.setattr(native, "bias_act", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(native, "act_bound", counted_bound)
    for bound in (False, True):
        got = run_layer(eltwise, layer, [x], bound=bound)[0]
        assert len(calls) == (1 + bound if native.AVAILABLE else 0)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)  # fused multiply-adds: ulps of 0.5
        np.testing.assert_allclose(got, ort, rtol=1e-5, atol=1e-6)
        assert np.isnan(got.flat[2]) and got.flat[0] == (1.0 if op != "HardSwish" else np.inf)


# =========================================================================== pooling

POOL_CASES = [
    ("MaxPool", (1, 3, 7, 7), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
    ("MaxPool", (2, 3, 8, 9), dict(kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 2, 1], ceil_mode=1, dilations=[2, 1])),
    ("MaxPool", (1, 4, 112, 112), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", (1, 2, 7, 6), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_LOWER", dilations=[2, 2])),
    ("MaxPool", (1, 2, 7, 6), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    ("MaxPool", (1, 2, 7, 6), dict(kernel_shape=[2, 2], strides=[3, 3], auto_pad="VALID")),
    ("MaxPool", (1, 2, 13, 13), dict(kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2])),  # YOLO SPPF
    ("MaxPool", (1, 2, 10), dict(kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1)),
    ("MaxPool", (1, 2, 5, 6, 7), dict(kernel_shape=[2, 3, 2], strides=[2, 2, 2], pads=[0, 1, 0, 1, 1, 1])),
    # the last-window rule: without it ceil_mode would give 4 outputs along each axis
    ("MaxPool", (1, 1, 5, 5), dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
    ("AveragePool", (1, 1, 5, 5), dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
                                       count_include_pad=1)),
    ("AveragePool", (1, 2, 6, 6), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
                                       count_include_pad=1)),
    ("AveragePool", (1, 2, 7, 6), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
    ("AveragePool", (1, 2, 8, 8), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 0, 0], ceil_mode=1,
                                       count_include_pad=1)),
    ("AveragePool", (1, 2, 7, 6), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    ("AveragePool", (1, 2, 7, 6), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_LOWER", count_include_pad=1)),
    ("AveragePool", (2, 8, 7, 7), dict(kernel_shape=[7, 7])),
    ("AveragePool", (1, 2, 9, 9), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], dilations=[2, 2],
                                       ceil_mode=1, count_include_pad=1)),
    ("AveragePool", (1, 2, 9, 9), dict(kernel_shape=[3, 2], strides=[1, 2], pads=[2, 1, 1, 0], dilations=[1, 3])),
    ("AveragePool", (1, 2, 11), dict(kernel_shape=[4], strides=[3], pads=[2, 1], ceil_mode=1)),
    ("AveragePool", (1, 2, 5, 6, 7), dict(kernel_shape=[2, 3, 2], strides=[2, 2, 2], pads=[1, 1, 0, 1, 0, 1],
                                          ceil_mode=1, count_include_pad=1)),
    ("GlobalAveragePool", (2, 3, 5, 6), {}),
    ("GlobalAveragePool", (2, 3, 5), {}),
    ("GlobalAveragePool", (1, 2, 3, 4, 5), {}),
    ("GlobalMaxPool", (2, 3, 5, 6), {}),
    ("GlobalMaxPool", (2, 3, 7), {}),
]


@pytest.mark.parametrize("op,shape,attrs", POOL_CASES)
def test_pool_vs_ort(op: str, shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    check_vs_ort(op, [rnd(*shape)], attrs, opset=19)


@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("hw", [(1, 1), (2, 7), (7, 7), (14, 14), (13, 20), (64, 64), (3, 65)], ids=str)
def test_same_size_max_pool_on_small_planes(k: int, hw: tuple[int, int]) -> None:
    """KxK stride-1 'same' max pools (inception's branch pools, YOLO's SPPF) take native/pooling.c's flat passes on
    planes up to 4096 values with rows up to 64 (65 wide: the row passes): numpy's answer, NaN and infinities
    included, on planes with and without a NaN."""
    h, w = hw
    x = rnd(1, 4, h, w)
    x[0, 1].flat[(h * w) // 2] = np.nan
    x[0, 2].flat[0] = np.inf
    x[0, 3].flat[-1] = -np.inf
    layer = single_node_layer("MaxPool", [x], dict(kernel_shape=[k, k], strides=[1, 1], pads=[k // 2] * 4))
    ks = {kn.name: kn for kn in kernels_for("MaxPool")}
    want = run_layer(ks["pool"], layer, [x])[0]
    assert np.isnan(want[0, 1]).any() and not np.isnan(want[0, 0]).any()
    if native.AVAILABLE:
        got = run_layer(ks["pool_native"], layer, [x])[0]
        np.testing.assert_array_equal(got, want)


def test_ceil_mode_last_window_rule_shapes() -> None:
    layer = single_node_layer("MaxPool", [rnd(1, 1, 5, 5)],
                              dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1))
    assert layer.out_shape() == (1, 1, 3, 3)  # ceil((5+2-2)/2)+1 = 4, minus the window starting in the pad


@pytest.mark.parametrize("attrs", [dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
                                   dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
                                   dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
                                   dict(kernel_shape=[2, 3], strides=[2, 1], pads=[0, 1, 1, 2], dilations=[2, 1]),
                                   dict(kernel_shape=[5, 5], strides=[3, 3], pads=[2, 2, 2, 2])],
                         ids=["3x3s2p1-ceil", "3x3s2-ceil", "3x3s1p1", "asym-dilated", "5x5s3"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("cap", [-1, 1], ids=["best", "no-avx512"])
@pytest.mark.parametrize("hw", [(13, 11), (9, 70)], ids=["short-rows", "rows-over-64"])
def test_maxpool_int8(dtype: Any, attrs: dict, cap: int, hw: tuple) -> None:
    """The native 8-bit MaxPool (the one quantised models run) against onnxruntime, extremes of the type included;
    ``no-avx512`` runs the portable row and flat-plane paths on a CPU that has AVX-512."""
    x = RNG.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, (2, 3, *hw), endpoint=True).astype(dtype)
    x.reshape(-1)[:4] = [np.iinfo(dtype).min, np.iinfo(dtype).max, np.iinfo(dtype).min, 0]
    layer = single_node_layer("MaxPool", [x], attrs)
    assert choose_kernel(layer).name == ("pool_int8_native" if native.AVAILABLE else "pool")
    if native.AVAILABLE:
        native.lib.inferd_q8_cap_avx512(cap)
    try:
        check_vs_ort("MaxPool", [x], attrs, opset=12)
    finally:
        if native.AVAILABLE:
            native.lib.inferd_q8_cap_avx512(-1)


@pytest.mark.parametrize("attrs", [dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                                   dict(kernel_shape=[2, 2], pads=[0, 0, 1, 1]),
                                   dict(kernel_shape=[5, 5], pads=[1, 3, 3, 1]),
                                   dict(kernel_shape=[1, 3], pads=[0, 2, 0, 0])],
                         ids=["3x3p1", "2x2-pad-end", "5x5-asym", "1x3-pad-start"])
@pytest.mark.parametrize("shape", [(1, 40, 7, 7), (2, 3, 1, 9), (1, 5, 2, 2), (1, 3, 13, 1), (1, 64, 28, 28)],
                         ids=["7x7-many-planes", "one-row", "2x2", "one-column", "28x28-split"])
def test_maxpool_int8_same_size_flat(attrs: dict, shape: tuple) -> None:
    """Stride-1 same-size pooling runs flat over whole planes with the taps that cross a row or plane edge
    masked out: edges of rows, planes and of the array (its first and last bytes), mask blocks spanning several
    planes, several tasks, against onnxruntime for both types."""
    for dtype in (np.int8, np.uint8):
        x = RNG.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, shape, endpoint=True).astype(dtype)
        x.reshape(-1)[-3:] = [np.iinfo(dtype).max, np.iinfo(dtype).min, np.iinfo(dtype).max]
        layer = single_node_layer("MaxPool", [x], attrs)
        assert layer.out_shape() == shape
        check_vs_ort("MaxPool", [x], attrs, opset=12)


def test_maxpool_indices_output_runs_on_the_reference_kernel() -> None:
    """The Indices output is supported (the onnx node tests and tests/test_ops_misc.py check its values against
    onnxruntime); only the reference kernel computes it, the fast ones keep single-output nodes."""
    x = rnd(1, 2, 6, 6)
    layer = single_node_layer("MaxPool", [x], {"kernel_shape": [2, 2], "strides": [2, 2]}, n_outputs=2)
    assert [k.name for k in kernels_for("MaxPool") if k.applies(layer)] == ["reference"]
    y, idx = run_layer(kernels_for("MaxPool")[-1], layer, [x])
    np.testing.assert_array_equal(x.reshape(-1)[idx.reshape(-1)], y.reshape(-1))


# =========================================================================== normalisation

def _bn_params(c: int) -> list[np.ndarray]:
    return [rnd(c), rnd(c), rnd(c), (RNG.random(c) + 0.3).astype(np.float32)]


@pytest.mark.parametrize("shape", [(2, 4, 5, 6), (3, 4), (2, 4, 7), (1, 4, 2, 3, 3)])
@pytest.mark.parametrize("params_const", [True, False])
def test_batchnorm(shape: tuple[int, ...], params_const: bool) -> None:
    ins = [rnd(*shape)] + _bn_params(shape[1])
    check_vs_ort("BatchNormalization", ins, dict(epsilon=1e-3), opset=15, const=[False] + [params_const] * 4)


def test_batchnorm_transform_precomputes_affine() -> None:
    p = _bn_params(4)
    layer = single_node_layer("BatchNormalization", [rnd(1, 4, 3, 3)] + p, {"epsilon": 1e-5})
    k = next(k for k in kernels_for("BatchNormalization") if k.name == "norm")
    t = k.transform(layer, {raw_key(i): p[i - 1] for i in range(1, 5)})
    assert set(t) == {"scale", "shift"} and t["scale"].shape == (4, 1, 1)
    np.testing.assert_allclose(t["scale"].ravel(), p[0] / np.sqrt(p[3] + 1e-5), rtol=1e-6)
    assert k.transformed_nbytes(layer) == 2 * 4 * 4


@pytest.mark.parametrize("shape", [(2, 4, 5, 6), (1, 4, 27), (3, 4)])
@pytest.mark.parametrize("x_const", [False, True])
def test_batchnorm_training_mode(shape: tuple[int, ...], x_const: bool) -> None:
    """training_mode=1 normalises with the batch's own mean and (population) variance and writes the running
    statistics; timm's NF-Nets standardise their weights so (``F.batch_norm(w.reshape(1, out, -1), None, None,
    training=True)``: x a constant of shape (1, C, K)), which import folds."""
    c = shape[1]
    x = rnd(*shape) * 2 + 0.5
    p = _bn_params(c)
    attrs = dict(training_mode=1, momentum=0.7, epsilon=1e-3)
    names = ["x", "s", "b", "m", "v"]
    node = helper.make_node("BatchNormalization", names, ["y", "rm", "rv"], **attrs)
    # onnxruntime insists on the three outputs in training mode
    want = _session(_model([node], [(n, a, n != "x" or x_const) for n, a in zip(names, [x] + p)], ["y", "rm", "rv"],
                           TensorProto.FLOAT, 15)).run(None, {} if x_const else {"x": x})
    layer = single_node_layer("BatchNormalization", [x] + p, attrs, const=[x_const] + [True] * 4, n_outputs=3)
    assert [o.shape for o in layer.outputs] == [w.shape for w in want]
    ks = [k for k in kernels_for("BatchNormalization") if k.applies(layer)]
    assert {k.name for k in ks} == {"norm", "reference"}
    for k in ks:
        for got, w, what in zip(run_layer(k, layer, [x] + p), want, ("Y", "running_mean", "running_var")):
            assert_close(got, w, f"{k.name} {what}")
    # a node declaring Y alone (valid ONNX, which onnxruntime refuses) gives the same Y
    y_only = single_node_layer("BatchNormalization", [x] + p, attrs, const=[x_const] + [True] * 4)
    assert_close(run_layer(next(k for k in ks if k.name == "norm"), y_only, [x] + p)[0], want[0], "Y alone")


def test_batchnorm_training_outputs_rejected() -> None:
    """The opset < 14 training form (statistics outputs without training_mode) and training_mode before opset 14
    are refused by name."""
    spec = op_spec("BatchNormalization")
    with pytest.raises(UnsupportedOpError, match="bn_stats"):
        spec.check(Node("bn_stats", "BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], {}), 15)
    with pytest.raises(UnsupportedOpError, match="bn_old"):
        spec.check(Node("bn_old", "BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], {"training_mode": 1}), 9)
    spec.check(Node("bn_train", "BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"],
                    {"training_mode": 1}), 15)


@pytest.mark.parametrize("shape", [(2, 3, 10), (2, 3, 5, 6), (1, 2, 3, 4, 5)])
def test_instancenorm(shape: tuple[int, ...]) -> None:
    x = rnd(*shape) * 3 + 1
    check_vs_ort("InstanceNormalization", [x, rnd(shape[1]), rnd(shape[1])], dict(epsilon=1e-4), opset=17)


@pytest.mark.parametrize("shape,axis,sshape,bias", [
    ((2, 5, 16), -1, (16,), True),
    ((2, 5, 16), -1, (16,), False),
    ((2, 5, 4, 6), 2, (4, 6), True),
    ((2, 5, 4, 6), 1, (5, 4, 6), False),
    ((2, 5, 4, 6), -2, (1, 6), True),  # scale broadcast over the normalised shape
    ((7, 12), 0, (7, 12), True),
])
def test_layernorm(shape: tuple[int, ...], axis: int, sshape: tuple[int, ...], bias: bool) -> None:
    x = rnd(*shape) * 2 + 0.5
    ins = [x, rnd(*sshape)] + ([rnd(*sshape)] if bias else [])
    check_vs_ort("LayerNormalization", ins, dict(axis=axis, epsilon=1e-3), opset=17)


@pytest.mark.parametrize("shape,axis,outs,dtype", [
    ((2, 5, 16), -1, ("y0", "y1", "y2"), np.float32),
    ((2, 3, 4, 6), 1, ("y0", "y1", "y2"), np.float32),
    ((7, 12), 0, ("y0", "y1", "y2"), np.float32),
    ((2, 3, 8), -2, ("y0", "", "y2"), np.float32),  # InvStdDev alone: the outputs list has a gap
    ((2, 3, 8), 2, ("y0", "y1"), np.float32),
    ((2, 5, 16), -1, ("y0", "y1", "y2"), np.float16),  # statistics stay float32 (stash_type=1)
])
def test_layernorm_stats_outputs(shape: tuple[int, ...], axis: int, outs: tuple[str, ...], dtype: Any) -> None:
    x = (rnd(*shape) * 2 + 0.5).astype(dtype)
    sshape = shape[axis % len(shape):]
    scale, bias = rnd(*sshape).astype(dtype), rnd(*sshape).astype(dtype)
    node = helper.make_node("LayerNormalization", ["x0", "x1", "x2"], list(outs), name="n0", axis=axis, epsilon=1e-3)
    present = [o for o in outs if o]
    m = _model([node], [("x0", x, False), ("x1", scale, True), ("x2", bias, True)], ["y0"], 1, 17)
    del m.graph.output[:]  # each output with its own element type, left to onnxruntime
    m.graph.output.extend(onnx.ValueInfoProto(name=o) for o in present)
    want = _session(m).run(None, {"x0": x})
    stat_shape = shape[:axis % len(shape)] + (1,) * len(sshape)
    assert [w.shape for w in want[1:]] == [stat_shape] * (len(present) - 1)

    ours_node = Node("n0", "LayerNormalization", ["x0", "x1", "x2"], list(outs), {"axis": axis, "epsilon": 1e-3})
    op_spec("LayerNormalization").check(ours_node, 17)
    ref = op_spec("LayerNormalization").reference(ours_node, [x, scale, bias])
    assert len(ref) == len(outs)
    ref_present = [r for r, o in zip(ref, outs) if o]
    layer = single_node_layer("LayerNormalization", [x, scale, bias], {"axis": axis, "epsilon": 1e-3})
    layer = type(layer)(ours_node, layer.inputs,
                        tuple(TensorInfo(o, tuple(r.shape), r.dtype) for o, r in zip(present, ref_present)),
                        layer.const_inputs)
    infer = op_spec("LayerNormalization").infer(ours_node, list(layer.inputs), {"x1": scale, "x2": bias})
    assert [(tuple(s), np.dtype(d)) for (s, d), o in zip(infer, outs) if o] == \
        [(w.shape, w.dtype) for w in want]
    tol = 2e-3 if dtype == np.float16 else TOL
    for k, w in enumerate(want):
        assert_close(ref_present[k], w, f"reference output {present[k]}", tol)
    for kern in kernels_for("LayerNormalization"):
        if not kern.applies(layer):
            continue
        got = run_layer(kern, layer, [x, scale, bias])
        for k, w in enumerate(want):
            assert_close(got[k], w, f"kernel {kern.name} output {present[k]}", tol)


def test_layernorm_stats_outputs_need_float32_stash() -> None:
    node = Node("ln_stats", "LayerNormalization", ["x", "s"], ["y", "mean", ""], {"stash_type": 11})
    with pytest.raises(UnsupportedOpError, match="ln_stats"):
        op_spec("LayerNormalization").check(node, 17)
    op_spec("LayerNormalization").check(Node("ln", "LayerNormalization", ["x", "s"], ["y", "mean", "inv"], {}), 17)
    op_spec("LayerNormalization").check(Node("ln", "LayerNormalization", ["x", "s"], ["y", "", ""],
                                             {"stash_type": 11}), 17)


# --------------------------------------------------------------------------- fold_bn_into, checked in onnxruntime

def _bn_node(inp: str, out: str) -> onnx.NodeProto:
    return helper.make_node("BatchNormalization", [inp, "bn_s", "bn_b", "bn_m", "bn_v"], [out], epsilon=1e-3)


def _run_pair(prod: str, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict[str, Any],
              bn: list[np.ndarray], folded: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(producer + BN) and (folded producer), both in onnxruntime."""
    ins = ["x", "w"] + (["b"] if b is not None else [])
    consts = [("w", w, True)] + ([("b", b, True)] if b is not None else [])
    bn_c = [(n, a, True) for n, a in zip(("bn_s", "bn_b", "bn_m", "bn_v"), bn)]
    m1 = _model([helper.make_node(prod, ins, ["t"], **attrs), _bn_node("t", "y")],
                [("x", x, False)] + consts + bn_c, ["y"], TensorProto.FLOAT, 15)
    m2 = _model([helper.make_node(prod, ["x", "w2", "b2"], ["y"], **attrs)],
                [("x", x, False), ("w2", folded[0], True), ("b2", folded[1], True)], ["y"], TensorProto.FLOAT, 15)
    return _session(m1).run(None, {"x": x})[0], _session(m2).run(None, {"x": x})[0]


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("group", [1, 2])
def test_fold_bn_into_conv(with_bias: bool, group: int) -> None:
    x, w = rnd(1, 4, 8, 8), rnd(6, 4 // group, 3, 3)
    b = rnd(6) if with_bias else None
    bn = _bn_params(6)
    w_before = w.copy()
    folded = fold_bn_into(w, b, *bn, eps=1e-3, axis=0)
    np.testing.assert_array_equal(w, w_before)
    assert folded[0].dtype == np.float32 and folded[1].shape == (6,)
    want, got = _run_pair("Conv", x, w, b, dict(pads=[1, 1, 1, 1], group=group), bn, folded)
    assert rel_err(got, want) < TOL


@pytest.mark.parametrize("group", [1, 2, 4])
def test_fold_bn_into_conv_transpose_groups(group: int) -> None:
    cin, per = 8, 3
    x, w, b = rnd(1, cin, 5, 5), rnd(cin, per, 3, 3), rnd(per * group)
    bn = _bn_params(per * group)
    folded = fold_bn_into(w, b, *bn, eps=1e-3, axis=1, groups=group)
    assert folded[0].shape == w.shape
    want, got = _run_pair("ConvTranspose", x, w, b, dict(strides=[2, 2], group=group), bn, folded)
    assert rel_err(got, want) < TOL
    if group > 1:  # ignoring groups must give a different (wrong) answer, i.e. the test can fail
        with pytest.raises(ShapeError):
            fold_bn_into(w, b, *bn, eps=1e-3, axis=1)


@pytest.mark.parametrize("transB", [0, 1])
@pytest.mark.parametrize("c_shape", [(6,), None])
def test_fold_bn_into_gemm(transB: int, c_shape: tuple[int, ...] | None) -> None:
    x = rnd(3, 5)
    w = rnd(6, 5) if transB else rnd(5, 6)
    c = None if c_shape is None else rnd(*c_shape)
    bn = _bn_params(6)
    folded = fold_bn_into(w, c, *bn, eps=1e-3, axis=0 if transB else 1)
    want, got = _run_pair("Gemm", x, w, c, dict(transB=transB), bn, folded)
    assert rel_err(got, want) < TOL


def test_fold_bn_into_rejects_channel_mismatch() -> None:
    with pytest.raises(ShapeError, match="channels"):
        fold_bn_into(rnd(5, 3), None, *_bn_params(6), eps=1e-5, axis=0)


# =========================================================================== float16

def _h(*shape: int) -> np.ndarray:
    return rnd(*shape).astype(np.float16)


@pytest.mark.parametrize("op,ins,attrs,opset", [
    ("Gemm", lambda: [_h(3, 4), _h(5, 4), _h(5)], dict(transB=1), 13),
    ("MatMul", lambda: [_h(2, 3, 4), _h(4, 5)], {}, 13),
    ("MaxPool", lambda: [_h(1, 2, 7, 7)], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]), 17),
    ("AveragePool", lambda: [_h(1, 2, 7, 7)], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]), 17),
    ("GlobalAveragePool", lambda: [_h(1, 2, 7, 7)], {}, 17),
    ("BatchNormalization", lambda: [_h(1, 3, 4, 4), _h(3), _h(3), _h(3), np.abs(_h(3)) + 1], {}, 15),
    ("InstanceNormalization", lambda: [_h(1, 3, 8, 8), _h(3), _h(3)], {}, 17),
    ("LayerNormalization", lambda: [_h(2, 5, 16), _h(16), _h(16)], {}, 17),
    ("Resize", lambda: [_h(1, 2, 4, 4), None, np.array([1, 1, 2, 1.5], np.float32)], dict(mode="linear"), 13),
])
def test_float16(op: str, ins: Any, attrs: dict[str, Any], opset: int) -> None:
    """float16 tensors keep their dtype; statistics and sums are accumulated in float32."""
    check_vs_ort(op, ins(), attrs, opset=opset, tol=2e-3)


# =========================================================================== Resize / Upsample

_CTMS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn",
         "half_pixel_symmetric"]
_NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
_SCALES = [[1, 1, 2, 2], [1, 1, 0.5, 0.5], [1, 1, 1.7, 0.6], [1, 1, 3, 1], [1, 1, 1.25, 2.5]]


def _resize(x: np.ndarray, scales: Sequence[float] | None = None, sizes: Sequence[int] | None = None,
            opset: int = 13, **attrs: Any) -> None:
    ins: list[np.ndarray | None] = [x, None, np.array(scales, np.float32) if scales is not None else None,
                                    np.array(sizes, np.int64) if sizes is not None else None]
    if ins[3] is None:
        ins = ins[:3]
    check_vs_ort("Resize", ins, attrs, opset=opset)


@pytest.mark.parametrize("ctm", _CTMS)
@pytest.mark.parametrize("nearest_mode", _NEAREST)
def test_resize_nearest(ctm: str, nearest_mode: str) -> None:
    x = rnd(2, 3, 5, 8)
    opset = 19 if ctm == "half_pixel_symmetric" else 13
    for sc in _SCALES:
        _resize(x, sc, opset=opset, mode="nearest", coordinate_transformation_mode=ctm, nearest_mode=nearest_mode)
    _resize(x, sizes=[2, 3, 9, 3], opset=opset, mode="nearest", coordinate_transformation_mode=ctm,
            nearest_mode=nearest_mode)


@pytest.mark.parametrize("scales", [[1, 1, 2, 2], [1, 1, 3, 1], [1, 1, 1, 4], [1, 1, 2, 3], [1, 2, 2, 2]],
                         ids=["2x2", "3x1", "1x4", "2x3", "planes-too"])
@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int8])
@pytest.mark.parametrize("shape", [(1, 3, 5, 7), (1, 32, 64, 64)], ids=["small", "threads"])
def test_resize_nearest_integer_factors(scales: list, dtype: Any, shape: tuple) -> None:
    """Integer-factor nearest upsampling of the last two axes (the native row repeat; a factor on another axis
    keeps the numpy path), float and 8-bit, small and split over threads, against onnxruntime."""
    x = rnd(*shape) if dtype == np.float32 else RNG.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, shape,
                                                            endpoint=True).astype(dtype)
    _resize(x, scales, mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")


@pytest.mark.parametrize("ctm", _CTMS)
def test_resize_linear(ctm: str) -> None:
    x = rnd(2, 3, 5, 7)
    opset = 19 if ctm == "half_pixel_symmetric" else 13
    for sc in _SCALES:
        _resize(x, sc, opset=opset, mode="linear", coordinate_transformation_mode=ctm)
    _resize(x, sizes=[2, 3, 9, 4], opset=opset, mode="linear", coordinate_transformation_mode=ctm)
    _resize(x, sizes=[2, 3, 1, 1], opset=opset, mode="linear", coordinate_transformation_mode=ctm)


@pytest.mark.parametrize("shape,sizes", [
    ((1, 21, 4, 4), [1, 21, 64, 64]),     # DeepLabV3's last upsampling
    ((1, 256, 1, 1), [1, 256, 4, 4]),     # its pooled branch: one pixel to a map
    ((2, 3, 9, 13), [2, 3, 4, 5]),        # down
    ((1, 4, 8, 2000), [1, 4, 3, 1500]),   # rows wider than the C side's stack row
    ((3, 7, 10), [3, 7, 25]),             # one axis (a 1-D signal's)
    ((1, 2, 3, 4, 5), [1, 2, 3, 7, 9]),   # 5-D, the last two resized
    ((1, 2, 3, 4, 5), [1, 2, 6, 7, 9]),   # 5-D, three resized: the numpy path
], ids=["deeplab", "pixel", "down", "wide", "1d", "5d-last2", "5d-three"])
@pytest.mark.parametrize("ctm", ["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel"])
def test_resize_linear_native_bound_and_unbound(shape: tuple, sizes: list, ctm: str) -> None:
    """The linear resize of the last two axes in C (the kernel's run and its bound call, as the executor makes
    it once) against onnxruntime; three resized axes keep numpy's per-axis gathers."""
    x = rnd(*shape)
    ins = [x, None, None, np.array(sizes, np.int64)]
    attrs = dict(mode="linear", coordinate_transformation_mode=ctm)
    want = ort_single("Resize", ins, attrs, 13, [False, True, True, True])
    layer = single_node_layer("Resize", ins, attrs, const=[False, True, True, True])
    k = next(k for k in kernels_for("Resize") if k.name == "resize")
    for bound in (False, True):
        assert_close(run_layer(k, layer, ins, bound=bound)[0], want, f"resize {shape}->{sizes} bound={bound}", TOL)
    if native.AVAILABLE:
        outs = [np.empty(want.shape, np.float32)]
        params = k.transform(layer, {raw_key(i): np.asarray(ins[i]) for i in layer.const_inputs})
        call = k.bind(layer, [x, None, None, None], params, outs)
        assert (call is None) == (sizes[2] != shape[2] and len(shape) == 5)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_layouts_and_opsets(mode: str) -> None:
    _resize(rnd(1, 5, 6, 3), [1, 2, 1.5, 1], mode=mode)                          # NHWC
    _resize(rnd(5, 6), [2, 0.7], mode=mode)                                     # 2-D
    _resize(rnd(1, 2, 3, 4, 5), [1, 1, 2, 1.5, 0.5], mode=mode)                 # 5-D (trilinear)
    _resize(rnd(2, 3, 5, 7), [1.5, 2.0], opset=18, mode=mode, axes=[2, 3])
    _resize(rnd(2, 3, 5, 7), sizes=[3, 11], opset=18, mode=mode, axes=[-1, 2])
    x = rnd(2, 3, 5, 7)
    # opset 11: roi and scales are required inputs (empty tensors when unused)
    check_vs_ort("Resize", [x, np.array([], np.float32), np.array([1, 1, 2, 0.5], np.float32)],
                 dict(mode=mode), opset=11)
    check_vs_ort("Resize", [x, np.array([], np.float32), np.array([], np.float32), np.array([2, 3, 8, 3], np.int64)],
                 dict(mode=mode), opset=11)
    for sc in ([1, 1, 2, 2], [1, 1, 0.5, 0.6], [1, 1, 1.7, 0.4]):
        check_vs_ort("Resize", [x, np.array(sc, np.float32)], dict(mode=mode), opset=10)
        check_vs_ort("Resize", [x, np.array(sc, np.float32)], dict(mode=mode), opset=10, ours_attrs={"_opset": 10})


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("sc", [[1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 2.5, 1.5], [1.0, 1.0, 3.0, 1.0]])
def test_upsample(mode: str, sc: list[float]) -> None:
    x = rnd(2, 3, 5, 7)
    check_vs_ort("Upsample", [x], dict(mode=mode, scales=sc), opset=7)
    check_vs_ort("Upsample", [x, np.array(sc, np.float32)], dict(mode=mode), opset=9)


def test_resize_integer_tensors() -> None:
    xi = RNG.integers(-100, 100, (1, 2, 4, 5)).astype(np.int8)
    _resize(xi, [1, 1, 2, 3], mode="nearest")
    xu = RNG.integers(0, 255, (1, 2, 4, 5)).astype(np.uint8)
    _resize(xu, [1, 1, 1.5, 0.5], mode="nearest")
    _resize(xu, [1, 1, 1.5, 0.5], mode="linear")


def test_resize_infer_needs_constant_scales() -> None:
    spec = op_spec("Resize")
    f32 = np.dtype(np.float32)
    x = TensorInfo("x", (1, 3, 4, 4), f32)
    node = Node("rs", "Resize", ["x", "", "scales"], ["y"], {"mode": "nearest"})
    with pytest.raises(ShapeError, match="scales"):
        spec.infer(node, [x, None, TensorInfo("scales", (4,), f32)], {})
    out = spec.infer(node, [x, None, TensorInfo("scales", (4,), f32)],
                     {"scales": np.array([1, 1, 1.5, 0.7], np.float32)})
    assert out[0][0] == (1, 3, 6, 2)  # floor(4 * 1.5), floor(4 * 0.7)
    node_sz = Node("rs2", "Resize", ["x", "", "", "sizes"], ["y"], {})
    with pytest.raises(ShapeError, match="rs2"):
        spec.infer(node_sz, [x, None, None, TensorInfo("sizes", (4,), np.dtype(np.int64))], {})


@pytest.mark.parametrize("attrs,needle", [  # cubic, antialias and tf_crop_and_resize run (ops/resize.py, resize_general)
    (dict(mode="lanczos"), "lanczos"),
    (dict(mode="linear", coordinate_transformation_mode="nonsense"), "nonsense"),
    (dict(mode="nearest", keep_aspect_ratio_policy="fill"), "fill"),
])
def test_resize_check_rejects(attrs: dict[str, Any], needle: str) -> None:
    node = Node("my_resize_7", "Resize", ["x", "roi", "scales"], ["y"], attrs)
    with pytest.raises(UnsupportedOpError, match=needle) as ei:
        op_spec("Resize").check(node, 18)
    assert "my_resize_7" in str(ei.value)


def test_resize_check_accepts_supported() -> None:
    spec = op_spec("Resize")
    for ctm in _CTMS:
        spec.check(Node("r", "Resize", ["x", "", "s"], ["y"], dict(mode="linear", coordinate_transformation_mode=ctm)), 19)
    for policy in ("stretch", "not_larger", "not_smaller"):
        spec.check(Node("r", "Resize", ["x", "", "", "sz"], ["y"], dict(keep_aspect_ratio_policy=policy)), 18)
    with pytest.raises(UnsupportedOpError, match="cubic"):
        op_spec("Upsample").check(Node("u", "Upsample", ["x", "s"], ["y"], dict(mode="cubic")), 9)


@pytest.mark.parametrize("case", ["whole_slices", "duplicates", "varying", "axis1"])
def test_scatter_elements_of_whole_slices_and_of_elements(case: str) -> None:
    """ScatterElements where each index is the same along its slice (torchvision's multi-scale RoIAlign merging its
    levels: one index per roi expanded over (C, 7, 7)) takes a slice copy per index; an index that varies along the
    slice, or another axis, each element. Both against onnxruntime."""
    rng = np.random.default_rng(5)
    data = rng.standard_normal((9, 6, 3, 3)).astype(np.float32)
    rows = np.array([4, 0, 7, 2, 8], np.int64) if case != "duplicates" else np.array([4, 0, 4, 2, 0], np.int64)
    upd = rng.standard_normal((5, 6, 3, 3)).astype(np.float32)
    idx = np.broadcast_to(rows.reshape(-1, 1, 1, 1), upd.shape).copy()
    attrs: dict[str, Any] = {}
    if case == "varying":
        idx[1, 2, 0, 1] = 5
    if case == "axis1":
        idx = rng.integers(0, 6, upd.shape).astype(np.int64)
        attrs = {"axis": 1}
    ins = [data, idx, upd]
    want = ort_single("ScatterElements", ins, attrs, 16, [False, True, False])
    spec = op_spec("ScatterElements")
    got = spec.reference(Node("s", "ScatterElements", ["d", "i", "u"], ["y"], attrs), ins)[0]
    if case == "duplicates":  # ONNX leaves them undefined; onnxruntime, numpy and the slice copy keep the last
        np.testing.assert_array_equal(got[[4, 0]], upd[[2, 4]])
    np.testing.assert_array_equal(got, want)
