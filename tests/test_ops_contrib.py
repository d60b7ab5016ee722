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
