"""Opsets 24..28 (the importer reads up to 28): a model declaring a new opset imports as it is and gives
onnxruntime's outputs; the operators new in those opsets against onnxruntime where it runs them (else the ONNX
reference evaluator); element types those opsets added that the engine does not compute are refused at import,
naming the op, the node and the type."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import inferd.runtime.cpu
from inferd.errors import UnsupportedOpError
from inferd.frontend import import_model
from inferd.frontend.onnx_import import MAX_OPSET
from ortutil import run_ort

RNG = np.random.default_rng(24)


def _vi(name: str, t: int, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, t, shape)


def _model(nodes: list, inputs: list, outputs: list, inits: list | None = None, opset: int = 26) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "t", inputs, outputs, initializer=inits or [])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 11
    return m


def _run(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    g = import_model(m)
    out = inferd.runtime.cpu.CpuExecutor(g).run(feeds)
    return [out[o.name] for o in m.graph.output]


def test_max_opset_is_onnx_newest() -> None:
    """The importer covers every opset the installed onnx defines (a newer onnx brings new versions to check)."""
    assert MAX_OPSET == 28
    assert onnx.defs.onnx_opset_version() <= MAX_OPSET


def test_opset24_model_matches_onnxruntime() -> None:
    """A small decoder-like graph at opset 24: TensorScatter writing a KV cache, Attention 24 reading it causally
    with nonpad_kv_seqlen, Swish both as SiLU (alpha 1, rewritten to the fusable SiLU) and with its own alpha,
    Transpose/Reshape/Pad/TopK at their opset-24 versions. (The later opsets' ops are checked one by one below:
    onnxruntime 1.32 runs Swish, a function, only in an opset-24 model.)"""
    b, h, s, d, cache = 2, 2, 4, 8, 6
    q = RNG.standard_normal((b, h, s, d)).astype(np.float32)
    kc = RNG.standard_normal((b, h, cache, d)).astype(np.float32)
    upd = RNG.standard_normal((b, h, s, d)).astype(np.float32)
    nodes = [
        helper.make_node("TensorScatter", ["kc", "upd", "widx"], ["k"], axis=2, name="scatter"),
        helper.make_node("Attention", ["q", "k", "k", "", "", "", "nonpad"], ["a"], is_causal=1, name="attn24"),
        helper.make_node("Swish", ["a"], ["sw1"], name="silu"),
        helper.make_node("Swish", ["sw1"], ["sw"], alpha=0.7, name="swish"),
        helper.make_node("Transpose", ["sw"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["t", "shape"], ["r"]),
        helper.make_node("Pad", ["r", "pads"], ["p"], mode="reflect"),
        helper.make_node("TopK", ["p", "k2"], ["tv", "ti"]),
    ]
    inits = [numpy_helper.from_array(np.array([b, s, h * d], np.int64), "shape"),
             numpy_helper.from_array(np.array([0, 0, 1, 0, 0, 2], np.int64), "pads"),
             numpy_helper.from_array(np.array([3], np.int64), "k2"),
             numpy_helper.from_array(np.array([1, 2], np.int64), "widx"),
             numpy_helper.from_array(np.array([5, 6], np.int64), "nonpad")]
    m = _model(nodes, [_vi("q", TensorProto.FLOAT, [b, h, s, d]), _vi("kc", TensorProto.FLOAT, [b, h, cache, d]),
                       _vi("upd", TensorProto.FLOAT, [b, h, s, d])],
               [_vi("tv", TensorProto.FLOAT, None), _vi("ti", TensorProto.INT64, None)], inits, opset=24)
    feeds = {"q": q, "kc": kc, "upd": upd}
    want = run_ort(m, feeds)
    got = _run(m, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(got[1], want[1])
    g = import_model(m)
    ops = [n.op for n in g.nodes]
    assert "SiLU" in ops and ops.count("Swish") == 1  # alpha 1 took the SiLU path, alpha 0.7 its own


def _one(op: str, ins: dict[str, np.ndarray], attrs: dict, opset: int, n_out: int = 1,
         consts: dict[str, np.ndarray] | None = None, names: list[str] | None = None) -> onnx.ModelProto:
    consts = consts or {}
    order = names or list(ins) + list(consts)
    node = helper.make_node(op, order, [f"y{i}" for i in range(n_out)], **attrs)
    return _model([node], [_vi(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)) for k, v in ins.items()],
                  [helper.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)],
                  [numpy_helper.from_array(v, k) for k, v in consts.items()], opset)


def _f(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


_ORT = [
    ("swish_alpha", "Swish", {"x": _f(3, 5)}, {"alpha": 0.3}, 24, {}),
    ("swish_f64", "Swish", {"x": RNG.standard_normal((4,))}, {"alpha": 2.0}, 24, {}),
    ("cumprod_excl_rev", "CumProd", {"x": _f(2, 5)}, {"exclusive": 1, "reverse": 1}, 26,
     {"ax": np.array(1, np.int64)}),
    ("cumprod_int32", "CumProd", {"x": np.arange(1, 7, dtype=np.int32).reshape(2, 3)}, {}, 26,
     {"ax": np.array(0, np.int64)}),
    ("bitcast_f32_i32", "BitCast", {"x": _f(2, 3)}, {"to": TensorProto.INT32}, 26, {}),
    ("bitcast_u16_f16", "BitCast", {"x": np.arange(6, dtype=np.uint16) * 4099}, {"to": TensorProto.FLOAT16}, 26, {}),
    ("tensorscatter_linear", "TensorScatter", {"c": _f(2, 3, 6, 4), "u": _f(2, 3, 2, 4)}, {}, 24,
     {"w": np.array([0, 4], np.int64)}),
    ("tensorscatter_circular_axis1", "TensorScatter", {"c": _f(2, 5, 3), "u": _f(2, 3, 3)},
     {"axis": 1, "mode": "circular"}, 24, {"w": np.array([3, 4], np.int64)}),
    ("attention_nonpad_causal_gqa", "Attention", {"q": _f(2, 4, 3, 8), "k": _f(2, 2, 7, 8), "v": _f(2, 2, 7, 8)},
     {"is_causal": 1}, 24, {"n": np.array([7, 4], np.int64)}),
    ("attention_window_3d_mask", "Attention", {"q": _f(2, 5, 12), "k": _f(2, 6, 12), "v": _f(2, 6, 12),
                                                "m": _f(5, 6)},
     {"q_num_heads": 3, "kv_num_heads": 3, "left_window_size": 1, "right_window_size": 2}, 25, {}),
]


@pytest.mark.parametrize("op,ins,attrs,opset,consts", [c[1:] for c in _ORT], ids=[c[0] for c in _ORT])
def test_new_op_matches_onnxruntime(op: str, ins: dict, attrs: dict, opset: int, consts: dict) -> None:
    names = None
    if op == "Attention" and consts:  # nonpad_kv_seqlen is input 6
        names = ["q", "k", "v", "", "", "", "n"]
    m = _one(op, ins, attrs, opset, consts=consts, names=names)
    want = run_ort(m, ins)
    got = _run(m, ins)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if np.issubdtype(w.dtype, np.floating):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(g, w)


_REF = [  # onnxruntime 1.32 has no kernel for these (SwiGLU's body calls Swish 24, which it lacks too)
    ("swiglu", "SwiGLU", {"a": _f(3, 8), "b": _f(3, 8)}, {"alpha": 1.5}, 28, 1),
    ("causal_conv_silu_past", "CausalConvWithState", {"x": _f(2, 3, 5), "w": _f(3, 1, 4), "bias": _f(3),
                                                      "past": _f(2, 3, 3)}, {"activation": "silu"}, 27, 2),
    ("linear_attention_gated_delta_gqa", "LinearAttention",
     {"q": _f(2, 5, 4 * 3), "k": _f(2, 5, 2 * 3), "v": _f(2, 5, 2 * 4), "past": _f(2, 2, 3, 4),
      "decay": -np.abs(_f(2, 5, 2)), "beta": np.abs(_f(2, 5, 2)) / 3},
     {"q_num_heads": 4, "kv_num_heads": 2, "update_rule": "gated_delta"}, 27, 2),
    ("linear_attention_linear_scale", "LinearAttention", {"q": _f(1, 4, 6), "k": _f(1, 4, 6), "v": _f(1, 4, 4)},
     {"q_num_heads": 2, "kv_num_heads": 2, "update_rule": "linear", "scale": 0.5}, 27, 2),
]


@pytest.mark.parametrize("op,ins,attrs,opset,n_out", [c[1:] for c in _REF], ids=[c[0] for c in _REF])
def test_new_op_matches_onnx_reference(op: str, ins: dict, attrs: dict, opset: int, n_out: int) -> None:
    m = _one(op, ins, attrs, opset, n_out=n_out)
    want = ReferenceEvaluator(m).run(None, ins)
    got = _run(m, ins)
    assert len(got) == n_out
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op,attrs,tname", [
    ("Cast", {"to": TensorProto.INT2}, "INT2"),
    ("Cast", {"to": TensorProto.UINT2}, "UINT2"),
    ("Cast", {"to": TensorProto.FLOAT8E8M0}, "FLOAT8E8M0"),
    ("BitCast", {"to": TensorProto.FLOAT8E8M0}, "FLOAT8E8M0"),
])
def test_new_element_types_are_refused_at_import(op: str, attrs: dict, tname: str) -> None:
    """Casting to the element types opsets 24-25 added is refused at import with the op, node and type named,
    not computed wrongly."""
    x = np.zeros((2, 2), np.uint8)
    m = _one(op, {"x": x}, attrs, 26)
    m.graph.node[0].name = "to_lowbit"
    with pytest.raises(UnsupportedOpError, match=rf"{op}.*to_lowbit.*{tname}"):
        import_model(m)


def test_bitcast_of_unequal_widths_is_refused() -> None:
    m = _one("BitCast", {"x": _f(2, 2)}, {"to": TensorProto.INT64}, 26)
    with pytest.raises(Exception, match=r"BitCast.*32 bits.*64 bits"):
        import_model(m)


def test_linear_attention_rule_inputs_are_checked() -> None:
    """update_rule 'gated' needs the decay input; leaving it out fails at import, naming the node."""
    m = _one("LinearAttention", {"q": _f(1, 2, 4), "k": _f(1, 2, 4), "v": _f(1, 2, 4)},
             {"q_num_heads": 1, "kv_num_heads": 1, "update_rule": "gated"}, 27, n_out=2)
    m.graph.node[0].name = "la"
    with pytest.raises(UnsupportedOpError, match=r"LinearAttention.*la.*decay"):
        import_model(m)


def test_bitcast_of_a_sub_byte_type_is_refused() -> None:
    """int4 is packed two to a byte in ONNX and one to a byte in memory here: reading its byte as int8 would be
    wrong, so the import refuses it."""
    x = helper.make_tensor("x", TensorProto.INT4, [4], [1, -2, 3, -4])
    m = _model([helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.INT8, name="bc")], [],
               [helper.make_empty_tensor_value_info("y")], [x], 26)
    with pytest.raises(UnsupportedOpError, match=r"BitCast.*bc.*int4.*sub-byte"):
        import_model(m)


@pytest.mark.parametrize("stash", [1, 11])
@pytest.mark.parametrize("tt", [TensorProto.FLOAT16, TensorProto.BFLOAT16])
def test_range_16bit_uses_stash_type(tt: int, stash: int) -> None:
    """Range 27 on float16/bfloat16 computes start + i * delta in stash_type and rounds once: from 1000 by 1,
    repeated bfloat16 addition would stall there (x + 1 == x); the ONNX reference gives the same values."""
    inits = [helper.make_tensor(n, tt, [], [v]) for n, v in (("s", 1000.0), ("l", 1300.0), ("d", 1.0))]
    m = _model([helper.make_node("Range", ["s", "l", "d"], ["y"], stash_type=stash)], [],
               [helper.make_empty_tensor_value_info("y")], inits, 27)
    want = ReferenceEvaluator(m).run(None, {})[0]
    got = import_model(m).constants["y"]  # constant inputs: the oracle folds it at import
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
