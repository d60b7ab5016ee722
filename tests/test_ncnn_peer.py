"""The ncnn peer of the recurrent bench: graphs specialised to fixed inputs must compute what the original does."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from inferd import zoo
from inferd.bench.ncnn_peer import inline_ifs, toposort_param
from inferd.bench.recurrent_bench import _feeds

from ortutil import run_ort

ort = pytest.importorskip("onnxruntime")


def test_inline_ifs_keeps_outputs_and_drops_control_flow() -> None:
    model = zoo.build("vad_lstm")
    feeds = _feeds("vad_lstm")
    assert any(n.op_type == "If" for n in model.graph.node)
    spec = inline_ifs(model, feeds, freeze=["sr"])
    assert not any(n.op_type in ("If", "Loop", "Scan") for n in spec.graph.node)
    assert [i.name for i in spec.graph.input] == ["input", "state"]
    want = run_ort(model, feeds)
    got = run_ort(spec, {k: feeds[k] for k in ("input", "state")})
    for w, g in zip(want, got):
        np.testing.assert_array_equal(w, g)


def test_inline_ifs_follows_the_value() -> None:
    """8 kHz takes the other branch: the specialised graph must agree with the original at that rate too."""
    model = zoo.build("vad_lstm")
    feeds = dict(_feeds("vad_lstm"), sr=np.array(8000, np.int64))
    spec = inline_ifs(model, feeds, freeze=["sr"])
    want = run_ort(model, feeds)
    got = run_ort(spec, {k: feeds[k] for k in ("input", "state")})
    for w, g in zip(want, got):
        np.testing.assert_array_equal(w, g)
    at16k = inline_ifs(model, _feeds("vad_lstm"), freeze=["sr"])
    assert {n.name for n in at16k.graph.node} != {n.name for n in spec.graph.node}


def test_toposort_param_orders_producers_first(tmp_path: Path) -> None:
    p = tmp_path / "m.param"
    p.write_text("7767517\n4 5\nInput in0 0 1 in0\nConcat cat 2 1 a b out0 0=0\nLSTM lstm 1 2 x a b 0=4\n"
                 "ReLU relu 1 1 in0 x\n")
    assert toposort_param(p)
    names = [ln.split()[1] for ln in p.read_text().splitlines()[2:]]
    assert names == ["in0", "relu", "lstm", "cat"]
    assert not toposort_param(p)  # already sorted: untouched
    p.write_text("7767517\n1 1\nReLU relu 1 1 ghost x\n")
    with pytest.raises(ValueError, match="no layer makes"):
        toposort_param(p)


def test_gru_model_converts_and_matches_onnxruntime(tmp_path: Path) -> None:
    """End to end on the GRU model (pnnx leaves its GRU without weights; the fix gives them): ncnn's outputs
    are checked against onnxruntime inside the bench's own timing call."""
    pytest.importorskip("ncnn")
    from inferd.bench.recurrent_bench import _ncnn
    from inferd.bench.ncnn_peer import pnnx_exe

    if pnnx_exe() is None:
        pytest.skip("pnnx not installed")
    path = tmp_path / "kws_gru.onnx"
    onnx.save(zoo.build("kws_gru"), str(path))
    r = _ncnn("kws_gru", path, _feeds("kws_gru"), 5, [1], tmp_path)
    assert "ncnn_error" not in r, r
    assert r["ncnn_1t_ms"] > 0 and r["ncnn_max_rel_err"] < 1e-3
