"""The ``com.microsoft`` operators onnxruntime's transformer optimizer writes (and SimplifiedLayerNormalization, which
it registers in the default domain), imported and run by inferd's CPU engine, against onnxruntime: no other peer
reads them."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper as h

from inferd.errors import UnsupportedOpError
from inferd.frontend import import_model
from inferd.runtime.cpu import CpuExecutor

RNG = np.random.default_rng(0)


def _run_both(tmp_path: Path, op: str, ins: dict[str, np.ndarray], attrs: dict, n_out: int = 1,
              domain: str = "com.microsoft", inits: dict[str, np.ndarray] | None = None, tol: float = 1e-4) -> None:
    inits = inits or {}
    names = list(ins) + list(inits)
    node = h.make_node(op, names, [f"y{i}" for i in range(n_out)], domain=domain, **attrs)
    g = h.make_graph([node], "g",
                     [h.make_tensor_value_info(k, h.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)) for k, v in ins.items()],
                     [h.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)],
                     [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    opsets = [h.make_opsetid("", 17)] + ([h.make_opsetid(domain, 1)] if domain else [])
    m = h.make_model(g, opset_imports=opsets)
    m.ir_version = 8
    p = tmp_path / f"{op}.onnx"
    onnx.save(m, p)
    want = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, ins)
    ex = CpuExecutor(import_model(str(p)))
    got = ex.run(ins)
    for i, w in enumerate(want):
        np.testing.assert_allclose(got[f"y{i}"], w, rtol=tol, atol=tol, err_msg=f"{op} output {i}")


def _r(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("mask", ["none", "2d", "1d"])
@pytest.mark.parametrize("causal", [0, 1])
def test_ms_attention(tmp_path: Path, mask: str, causal: int) -> None:
    b, s, d, heads = 2, 5, 16, 4
    ins = {"x": _r(b, s, d)}
    inits = {"w": _r(d, 3 * d) * 0.3, "bias": _r(3 * d)}
    if mask == "2d":
        inits["mask"] = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
    elif mask == "1d":
        inits["mask"] = np.array([3, 5], np.int32)
    _run_both(tmp_path, "Attention", ins, {"num_heads": heads, "unidirectional": causal}, inits=inits)


def test_ms_multi_head_attention(tmp_path: Path) -> None:
    ins = {"q": _r(2, 4, 16), "k": _r(2, 6, 16), "v": _r(2, 6, 8)}
    _run_both(tmp_path, "MultiHeadAttention", ins, {"num_heads": 2})
    _run_both(tmp_path, "MultiHeadAttention", ins, {"num_heads": 4, "scale": 0.3}, inits={"bias": _r(40)})


def test_ms_skip_layer_norms(tmp_path: Path) -> None:
    ins = {"x": _r(2, 3, 8), "skip": _r(2, 3, 8)}
    _run_both(tmp_path, "SkipLayerNormalization", ins, {"epsilon": 1e-5},
              inits={"gamma": _r(8), "beta": _r(8), "bias": _r(8)})
    _run_both(tmp_path, "SkipLayerNormalization", ins, {"epsilon": 1e-5}, n_out=4,
              inits={"gamma": _r(8), "beta": _r(8), "bias": _r(8)})
    _run_both(tmp_path, "SkipSimplifiedLayerNormalization", ins, {"epsilon": 1e-5}, inits={"gamma": _r(8)})
    _run_both(tmp_path, "SimplifiedLayerNormalization", {"x": _r(2, 3, 8)}, {"epsilon": 1e-5, "axis": -1},
              domain="", inits={"scale": _r(8)})


def test_ms_gelus(tmp_path: Path) -> None:
    x = {"x": _r(3, 16) * 3}
    _run_both(tmp_path, "BiasGelu", x, {}, inits={"b": _r(16)})
    _run_both(tmp_path, "FastGelu", x, {}, inits={"b": _r(16)})
    _run_both(tmp_path, "FastGelu", x, {})
    _run_both(tmp_path, "QuickGelu", x, {"alpha": 1.5})


@pytest.mark.parametrize("interleaved", [0, 1])
def test_ms_rotary_embedding(tmp_path: Path, interleaved: int) -> None:
    b, s, heads, hd = 2, 5, 3, 8
    cos = np.cos(np.outer(np.arange(16), 1.0 / 10000 ** (np.arange(hd // 2) * 2 / hd))).astype(np.float32)
    sin = np.sin(np.outer(np.arange(16), 1.0 / 10000 ** (np.arange(hd // 2) * 2 / hd))).astype(np.float32)
    ins = {"x": _r(b, s, heads * hd), "pos": RNG.integers(0, 11, (b, s)).astype(np.int64)}
    _run_both(tmp_path, "RotaryEmbedding", ins, {"interleaved": interleaved, "num_heads": heads},
              inits={"cos": cos, "sin": sin})


def test_unknown_custom_domain_op_is_refused_naming_it(tmp_path: Path) -> None:
    node = h.make_node("NoSuchOp", ["x"], ["y"], domain="com.example", name="weird")
    g = h.make_graph([node], "g", [h.make_tensor_value_info("x", 1, [2])], [h.make_empty_tensor_value_info("y")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedOpError, match="NoSuchOp.*weird.*com.example"):
        import_model(m)


def _gqa_model(inputs: list[tuple[str, np.ndarray | None]], consts: dict[str, np.ndarray], attrs: dict,
               n_out: int = 3) -> onnx.ModelProto:
    """One GroupQueryAttention node; ``inputs`` in the op's order (None: an absent optional input), the names in
    ``consts`` become initializers (total_sequence_length sizes the present outputs, so it is a constant)."""
    names = [n if a is not None or n in consts else "" for n, a in inputs]
    while names and not names[-1]:
        names.pop()
    node = h.make_node("GroupQueryAttention", names, [f"y{i}" for i in range(n_out)], domain="com.microsoft", **attrs)
    graph_in = [h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
                for n, a in inputs if a is not None and n not in consts]
    g = h.make_graph([node], "g", graph_in, [h.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)],
                     [onnx.numpy_helper.from_array(v, k) for k, v in consts.items()])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


def _gqa_check(tmp_path: Path, m: onnx.ModelProto, feeds: dict[str, np.ndarray], tol: float = 1e-4) -> None:
    p = tmp_path / "gqa.onnx"
    onnx.save(m, p)
    want = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = CpuExecutor(import_model(str(p))).run(feeds)
    for i, w in enumerate(want):
        assert got[f"y{i}"].shape == w.shape, (i, got[f"y{i}"].shape, w.shape)
        np.testing.assert_allclose(got[f"y{i}"], w, rtol=tol, atol=tol, err_msg=f"GroupQueryAttention output {i}")


@pytest.mark.parametrize("variant", ["plain", "packed", "rotary", "rotary_interleaved", "window", "softcap",
                                     "smooth", "mqa", "bias", "sink"])
def test_ms_group_query_attention_prompt(tmp_path: Path, variant: str) -> None:
    """The first prompt (no past): what a non-LLM causal decoder (speech, captioning) runs every call."""
    b, s, n, kvn, hd = 2, 6, 4, (1 if variant == "mqa" else 2), 16  # onnxruntime's rotary wants head_size % 16 == 0
    attrs: dict = {"num_heads": n, "kv_num_heads": kvn}
    q, k, v = _r(b, s, n * hd), _r(b, s, kvn * hd), _r(b, s, kvn * hd)
    consts = {"total": np.array(s, np.int32)}
    cos = sin = None
    if variant.startswith("rotary"):
        ang = RNG.random((16, hd // 2)) * 3
        cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        consts.update(cos=cos, sin=sin)
        attrs.update(do_rotary=1, rotary_interleaved=int(variant.endswith("interleaved")))
    if variant == "window":
        attrs["local_window_size"] = 2
    if variant == "softcap":
        attrs["softcap"] = 1.5
        q *= 3
    if variant == "smooth":
        attrs["smooth_softmax"] = 1
    seqlens = np.full(b, s - 1, np.int32)
    if variant == "packed":
        qkv = np.concatenate([q, k, v], axis=-1)
        inputs = [("q", qkv), ("k", None), ("v", None)]
        feeds = {"q": qkv, "seqlens": seqlens}
    else:
        inputs = [("q", q), ("k", k), ("v", v)]
        feeds = {"q": q, "k": k, "v": v, "seqlens": seqlens}
    inputs += [("pk", None), ("pv", None), ("seqlens", seqlens), ("total", consts["total"]), ("cos", cos),
               ("sin", sin)]
    if variant == "bias":  # an additive attention bias (B, 1, S, T)
        bias = _r(b, 1, s, s)
        inputs += [("pos", None), ("bias", bias)]
        feeds["bias"] = bias
    if variant == "sink":  # a per-head sink logit in every softmax's denominator
        sink = _r(n)
        inputs += [("pos", None), ("bias", None), ("sink", sink)]
        feeds["sink"] = sink
    _gqa_check(tmp_path, _gqa_model(inputs, consts, attrs), feeds)


def test_ms_group_query_attention_with_past(tmp_path: Path) -> None:
    """A later call: 1 new token per batch after 3 and 5 past tokens in a present buffer of 8."""
    b, n, kvn, hd, t = 2, 4, 2, 8, 8
    q, k, v = _r(b, 1, n * hd), _r(b, 1, kvn * hd), _r(b, 1, kvn * hd)
    pk, pv = _r(b, kvn, t, hd), _r(b, kvn, t, hd)
    seqlens = np.array([3, 5], np.int32)  # total - 1: 4 and 6 tokens after this one
    consts = {"total": np.array(t, np.int32)}
    inputs = [("q", q), ("k", k), ("v", v), ("pk", pk), ("pv", pv), ("seqlens", seqlens), ("total", consts["total"])]
    feeds = {"q": q, "k": k, "v": v, "pk": pk, "pv": pv, "seqlens": seqlens}
    _gqa_check(tmp_path, _gqa_model(inputs, consts, {"num_heads": n, "kv_num_heads": kvn}), feeds)


def test_ms_group_query_attention_needs_constant_total(tmp_path: Path) -> None:
    q = _r(1, 3, 16)
    m = _gqa_model([("q", q), ("k", _r(1, 3, 8)), ("v", _r(1, 3, 8)), ("pk", None), ("pv", None),
                    ("seqlens", np.array([2], np.int32)), ("total", np.array(3, np.int32))], {},
                   {"num_heads": 2, "kv_num_heads": 1})
    p = tmp_path / "gqa.onnx"
    onnx.save(m, p)
    with pytest.raises(Exception, match="total_sequence_length must be a constant"):
        import_model(str(p))
