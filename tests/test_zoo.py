"""Tests of the model zoo (inferd.zoo): validity, reference parameter counts, numerics under
onnxruntime, architecture-specific structure, determinism, caching and the CLI."""

from __future__ import annotations

import collections
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from inferd import zoo

# Reference trainable-parameter counts (torch: sum(p.numel() for p in model.parameters())),
# written out here independently of zoo.MODELS so a wrong table entry cannot hide a wrong model.
REFERENCE_PARAMS = {
    "resnet18": 11689512,
    "resnet50": 25557032,
    "mobilenetv2": 3504872,
    "squeezenet1_1": 1235496,
    "shufflenetv2_x1_0": 2278604,
    "vgg16": 138357544,
    "efficientnet_b0": 5288548,
    "googlenet": 6624904,
    "vit_tiny": 5717416,
    # No external reference: counted by hand from the layer lists.
    "tiny": 3 * 9 * 8 + 8 + 8 * 10 + 10,
    "mlp_small": 64 * 128 + 128 + 128 * 10 + 10,
    # recurrent models: ONNX's W + R + B of an LSTM/GRU direction are torch's weight_ih, weight_hh, bias_ih + bias_hh
    "vad_lstm": (129 * 64 * 3 + 64) + (65 * 64 * 3 + 64) + 4 * (64 * 64 * 3 + 64)   # two STFT front ends' encoders
                + (4 * 64 * 64 + 4 * 64 * 64 + 8 * 64) + (64 + 1),                     # shared LSTM decoder, output conv
    "crnn_lstm": (9 * 32 + 9 * 32 * 64 + 9 * 64 * 128 + 4 * 128 * 128) + 2 * (32 + 64 + 128 + 128)  # convs, BN
                 + 2 * (4 * 96 * 128 + 4 * 96 * 96 + 8 * 96) + (192 * 37 + 37),            # biLSTM, classifier
    "kws_gru": (3 * 64 * 40 + 3 * 64 * 64 + 6 * 64) + (64 * 12 + 12),
}
ZOO_PROPER = [
    "resnet18", "resnet50", "mobilenetv2", "squeezenet1_1", "shufflenetv2_x1_0", "vgg16",
    "efficientnet_b0", "googlenet", "unet_small", "vit_tiny", "detnet_dyn", "recnet_dyn",
    "vad_lstm", "crnn_lstm", "kws_gru",
]
ALL = list(zoo.MODELS)
BN_MODELS = {"resnet18", "resnet50", "mobilenetv2", "shufflenetv2_x1_0", "efficientnet_b0", "googlenet",
             "unet_small", "detnet_dyn", "recnet_dyn", "crnn_lstm"}


def _all_nodes(g: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes of ``g`` and of every control-flow body nested in it."""
    out = []
    for n in g.node:
        out.append(n)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                out += _all_nodes(a.g)
    return out


def _feeds(info: zoo.ModelInfo, seed: int = 123) -> dict[str, np.ndarray]:
    """Every input of a zoo model: random float data, the sample rate 16000 for int64 scalars."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in info.inputs:
        if info.dtype(name) == "int64":
            out[name] = np.array(16000, np.int64)
        else:
            dims = tuple((1 if k == 0 else 224) if isinstance(d, str) else d for k, d in enumerate(shape))
            out[name] = (rng.standard_normal(dims) * (0.5 if info.state else 1.0)).astype(np.float32)
    return out


@pytest.fixture(scope="session")
def zoo_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    # A fresh directory (not the shared cache) so these tests judge freshly generated files.
    return zoo.write_zoo(tmp_path_factory.mktemp("zoo"))


def _load(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path))


def _session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _random_input(info: zoo.ModelInfo, batch: int = 1, seed: int = 123) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(info.concrete_input_shape(batch)).astype(np.float32)


def _dims(vi: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in vi.type.tensor_type.shape.dim]


# --------------------------------------------------------------------------- the table


def test_model_table() -> None:
    assert set(ZOO_PROPER) | {"tiny", "mlp_small"} == set(zoo.MODELS)
    assert zoo.ZOO == [n for n in zoo.MODELS if n in ZOO_PROPER]
    assert not zoo.MODELS["tiny"].zoo and not zoo.MODELS["mlp_small"].zoo
    for name, ref in REFERENCE_PARAMS.items():
        assert zoo.MODELS[name].params == ref, name
    for name, info in zoo.MODELS.items():
        assert info.name == name and info.description
    assert zoo.MODELS["resnet18"].input_shape == ("N", 3, 224, 224)
    assert zoo.MODELS["mobilenetv2"].dynamic_batch
    assert zoo.MODELS["resnet50"].input_shape == (1, 3, 224, 224)
    assert zoo.MODELS["tiny"].input_shape == (1, 3, 8, 8)
    assert zoo.MODELS["mlp_small"].input_shape == (1, 64)
    with pytest.raises(KeyError, match="unknown zoo model"):
        zoo.build("resnet1000")


# --------------------------------------------------------------------------- per-model checks


@pytest.mark.parametrize("name", ALL)
def test_checker_and_params(name: str, zoo_files: dict[str, Path]) -> None:
    path = zoo_files[name]
    # The path form works for any size (the in-memory form is limited to 2 GB protos).
    onnx.checker.check_model(str(path), full_check=True)
    model = _load(path)
    info = zoo.MODELS[name]
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert zoo.count_params(model) == info.params
    if name in REFERENCE_PARAMS:
        assert zoo.count_params(model) == REFERENCE_PARAMS[name]
    assert [(i.name, tuple(_dims(i))) for i in model.graph.input] == list(info.inputs)
    assert [(o.name, tuple(_dims(o))) for o in model.graph.output] == list(info.outputs)
    assert all(i.data_type == onnx.TensorProto.FLOAT or i.name.startswith("onnx::")
               for i in model.graph.initializer)
    # Every initializer is used, and names are unique.
    used = {x for n in _all_nodes(model.graph) for x in n.input}
    names = [i.name for i in model.graph.initializer]
    assert len(names) == len(set(names))
    assert set(names) <= used


@pytest.mark.parametrize("name", ALL)
def test_onnxruntime_output_well_scaled(name: str, zoo_files: dict[str, Path]) -> None:
    info = zoo.MODELS[name]
    sess = _session(zoo_files[name])
    outs = sess.run(None, _feeds(info))
    y = outs[0]
    assert y.ndim == len(info.output_shape) and (y.shape[0] == 1 or name == "crnn_lstm")
    assert all(s == d for s, d in zip(y.shape, info.output_shape) if isinstance(d, int)), (y.shape, info.output_shape)
    assert y.dtype == np.float32
    assert np.isfinite(y).all()
    for o in outs:  # a single probability (the VAD's) has no spread: its state does
        assert o.size == 1 or o.std() > 1e-3, "output (nearly) constant: weights scaled into oblivion"
    assert np.abs(y).max() < 1e4, "activations blow up with depth"
    if name == "mlp_small":
        np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)
    if name == "squeezenet1_1":
        assert (y >= 0).all()  # torchvision's head ends in ReLU + average pool


@pytest.mark.parametrize("name", ["resnet18", "mobilenetv2"])
def test_symbolic_batch(name: str, zoo_files: dict[str, Path]) -> None:
    info = zoo.MODELS[name]
    assert info.input_shape[0] == "N"
    sess = _session(zoo_files[name])
    a, b = _random_input(info, seed=1), _random_input(info, seed=2)
    (y2,) = sess.run(None, {"input": np.concatenate([a, b])})
    (ya,) = sess.run(None, {"input": a})
    (yb,) = sess.run(None, {"input": b})
    assert y2.shape == (2, 1000)
    np.testing.assert_allclose(y2, np.concatenate([ya, yb]), rtol=1e-4, atol=1e-4 * np.abs(ya).max())
    assert not np.allclose(ya, yb)


# Exact op histograms that follow from the reference architectures.
EXPECTED_OPS: dict[str, dict[str, int]] = {
    "tiny": {"Conv": 1, "Relu": 1, "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1},
    "mlp_small": {"Gemm": 2, "Relu": 1, "Softmax": 1},
    "resnet18": {"Conv": 20, "BatchNormalization": 20, "Relu": 17, "Add": 8, "MaxPool": 1, "Gemm": 1},
    "resnet50": {"Conv": 53, "BatchNormalization": 53, "Relu": 49, "Add": 16, "Gemm": 1},
    "mobilenetv2": {"Conv": 52, "BatchNormalization": 52, "Clip": 35, "Add": 10, "Gemm": 1},
    "squeezenet1_1": {"Conv": 26, "Relu": 26, "Concat": 8, "MaxPool": 3},
    "shufflenetv2_x1_0": {"Conv": 56, "BatchNormalization": 56, "Split": 13, "Transpose": 16, "Reshape": 32,
                          "Concat": 16, "ReduceMean": 1},
    "vgg16": {"Conv": 13, "Relu": 15, "MaxPool": 5, "Gemm": 3},
    "efficientnet_b0": {"Conv": 81, "BatchNormalization": 49, "GlobalAveragePool": 17, "Add": 9},
    "googlenet": {"Conv": 57, "BatchNormalization": 57, "Relu": 57, "Concat": 9, "MaxPool": 13},
    "unet_small": {"Resize": 1, "ConvTranspose": 2, "Concat": 3, "MaxPool": 3, "BatchNormalization": 14},
    "vit_tiny": {"LayerNormalization": 25, "Softmax": 12, "Erf": 12, "MatMul": 72, "Conv": 1, "Gemm": 1},
    # sizes that follow the input come from Shape chains, as torch exports them
    "detnet_dyn": {"Conv": 10, "BatchNormalization": 8, "Add": 3, "Shape": 3, "Concat": 2, "Resize": 1, "Reshape": 1},
    "recnet_dyn": {"Conv": 4, "BatchNormalization": 4, "MaxPool": 3, "MatMul": 6, "Softmax": 2, "Shape": 1,
                   "Reshape": 2},
    # the VAD's graph is two Ifs (shape-dependent unsqueeze, sample-rate branch) around everything else
    "vad_lstm": {"If": 2, "Equal": 2, "Shape": 1, "Size": 1, "LSTM": 0, "Conv": 0},
    "crnn_lstm": {"Conv": 4, "BatchNormalization": 4, "MaxPool": 3, "LSTM": 1, "Shape": 1, "Reshape": 1,
                  "LogSoftmax": 1},
    "kws_gru": {"GRU": 1, "Gemm": 1, "Softmax": 1, "Transpose": 1},
}


@pytest.mark.parametrize("name", ALL)
def test_structure(name: str, zoo_files: dict[str, Path]) -> None:
    model = onnx.load(str(zoo_files[name]), load_external_data=False)
    g = model.graph
    ops = collections.Counter(n.op_type for n in g.node)
    for op, count in EXPECTED_OPS[name].items():
        assert ops[op] == count, (op, ops[op], count)
    inits = {i.name: i for i in g.initializer}
    producers = {o: n for n in g.node for o in n.output}

    # BN stays a separate node with non-trivial running statistics.
    bns = [n for n in g.node if n.op_type == "BatchNormalization"]
    assert bool(bns) == (name in BN_MODELS)
    for bn in bns[:5]:
        mean = numpy_helper.to_array(inits[bn.input[3]])
        var = numpy_helper.to_array(inits[bn.input[4]])
        gamma = numpy_helper.to_array(inits[bn.input[1]])
        assert bn.input[3].endswith("running_mean") and bn.input[4].endswith("running_var")
        assert 0.01 < mean.std() < 1.0 and (var >= 0.5).all() and (var <= 2.0).all() and var.std() > 0.1
        assert 0.05 < gamma.mean() < 2.0

    if name == "mobilenetv2":
        for clip in (n for n in g.node if n.op_type == "Clip"):
            assert len(clip.input) == 3
            assert float(numpy_helper.to_array(inits[clip.input[1]])) == 0.0
            assert float(numpy_helper.to_array(inits[clip.input[2]])) == 6.0
    if name == "efficientnet_b0":
        # SiLU as x * Sigmoid(x): every Sigmoid feeds a Mul whose other operand is its own input.
        silu = 0
        for mul in (n for n in g.node if n.op_type == "Mul"):
            src = [producers.get(i) for i in mul.input]
            if any(p is not None and p.op_type == "Sigmoid" and p.input[0] in mul.input for p in src):
                silu += 1
        assert silu == 49  # stem + 16*(expand or not) + 16 dw + 16 SE fc1 + head
        assert ops["Sigmoid"] == 49 + 16
    if name == "squeezenet1_1":
        assert all(any(a.name == "ceil_mode" and a.i == 1 for a in n.attribute)
                   for n in g.node if n.op_type == "MaxPool")
    if name == "googlenet":
        assert sum(1 for n in g.node if n.op_type == "Concat" and len(n.input) == 4) == 9
    if name == "unet_small":
        (resize,) = (n for n in g.node if n.op_type == "Resize")
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in resize.attribute}
        assert attrs["mode"] == b"nearest" and resize.input[1] == ""
        np.testing.assert_array_equal(numpy_helper.to_array(inits[resize.input[2]]), [1, 1, 2, 2])
    if name == "vad_lstm":
        every = collections.Counter(n.op_type for n in _all_nodes(g))
        # per sample-rate branch: a nested crop If, the Conv1d STFT, three encoder convs, the decoder's LSTM
        assert every["If"] == 4 and every["LSTM"] == 2 and every["Conv"] == 2 * (1 + 3 + 1)
        (sr_if,) = (n for n in g.node if n.op_type == "If" and "sr" in producers[n.input[0]].input)
        assert {a.name for a in sr_if.attribute} == {"then_branch", "else_branch"}
        assert [i.type.tensor_type.elem_type for i in g.input] == [1, 7, 1]  # float input, int64 sr, float state
    if name in ("crnn_lstm", "kws_gru"):
        rnn = next(n for n in g.node if n.op_type in ("LSTM", "GRU"))
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in rnn.attribute}
        assert attrs.get("direction", b"forward") == (b"bidirectional" if name == "crnn_lstm" else b"forward")
        assert attrs.get("linear_before_reset", 0) == (1 if name == "kws_gru" else 0)
    if name == "vit_tiny":
        for ln in (n for n in g.node if n.op_type == "LayerNormalization"):
            assert any(a.name == "epsilon" and abs(a.f - 1e-6) < 1e-9 for a in ln.attribute)
        assert inits["cls_token"].dims == [1, 1, 192] and inits["pos_embed"].dims == [1, 197, 192]


# --------------------------------------------------------------------------- determinism & caching


def test_deterministic_bytes() -> None:
    a = zoo.build("tiny", seed=0).SerializeToString()
    assert a == zoo.build("tiny", seed=0).SerializeToString()
    assert a != zoo.build("tiny", seed=1).SerializeToString()
    # Building another model in between must not change a model's weights.
    zoo.build("mlp_small", seed=0)
    b = zoo.build("mobilenetv2", seed=5).SerializeToString()
    zoo.build("tiny", seed=5)
    assert b == zoo.build("mobilenetv2", seed=5).SerializeToString()


def test_written_file_equals_build(zoo_files: dict[str, Path]) -> None:
    assert zoo_files["tiny"].read_bytes() == zoo.build("tiny", 0).SerializeToString()
    assert zoo_files["tiny"].name == "tiny.onnx" and zoo_files["tiny"].parent == zoo_files["vgg16"].parent


def test_write_zoo_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["tiny", "mlp_small"]
    paths = zoo.write_zoo(tmp_path / "z", names)
    assert sorted(paths) == sorted(names)
    assert sorted(p.name for p in (tmp_path / "z").glob("*.onnx")) == ["mlp_small.onnx", "tiny.onnx"]
    stamp = {n: p.stat().st_mtime_ns for n, p in paths.items()}
    umask = os.umask(0)
    os.umask(umask)
    assert paths["tiny"].stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600

    # Fast path: an untouched file from the same generator/seed is not even rebuilt.
    real_build = zoo.build
    calls: list[str] = []

    def counting_build(name: str, seed: int = 0) -> onnx.ModelProto:
        calls.append(name)
        return real_build(name, seed)

    monkeypatch.setattr(zoo, "build", counting_build)
    assert zoo.write_zoo(tmp_path / "z", names) == paths
    assert calls == []
    assert {n: p.stat().st_mtime_ns for n, p in paths.items()} == stamp

    # Without the metadata the model is rebuilt, but identical content is not rewritten.
    for meta in (tmp_path / "z").glob("*.zoo.json"):
        meta.unlink()
    zoo.write_zoo(tmp_path / "z", names)
    assert sorted(calls) == sorted(names)
    assert {n: p.stat().st_mtime_ns for n, p in paths.items()} == stamp

    # Corrupted content is replaced.
    good = paths["tiny"].read_bytes()
    paths["tiny"].write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))
    calls.clear()
    zoo.write_zoo(tmp_path / "z", ["tiny"])
    assert calls == ["tiny"]
    assert paths["tiny"].read_bytes() == good

    # A different seed produces different bytes in place.
    zoo.write_zoo(tmp_path / "z", ["tiny"], seed=1)
    assert paths["tiny"].read_bytes() == real_build("tiny", 1).SerializeToString() != good
    assert not list((tmp_path / "z").glob(".*.tmp"))


# --------------------------------------------------------------------------- CLI & shared fixture


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert zoo.main(["--list"]) == 0
    listing = capsys.readouterr().out
    for name, info in zoo.MODELS.items():
        assert name in listing and f"{info.params:,d}" in listing
    out = tmp_path / "cli"
    assert zoo.main(["--out", str(out), "tiny", "--seed", "3"]) == 0
    assert [p.name for p in out.glob("*.onnx")] == ["tiny.onnx"]
    assert (out / "tiny.onnx").read_bytes() == zoo.build("tiny", 3).SerializeToString()
    assert "wrote" in capsys.readouterr().out
    assert zoo.main(["--out", str(out), "tiny", "--seed", "3"]) == 0
    assert "up to date" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        zoo.main(["--out", str(out), "nosuchnet"])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        zoo.main([])  # --out is required without --list


def test_zoo_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import zoo_fixture

    monkeypatch.setenv(zoo_fixture.ENV_VAR, str(tmp_path / "cache"))
    d = zoo_fixture.zoo_dir(["tiny"])
    assert d == (tmp_path / "cache").resolve()
    assert (d / "tiny.onnx").read_bytes() == zoo.build("tiny", 0).SerializeToString()
    assert zoo_fixture.zoo_path("mlp_small") == d / "mlp_small.onnx"
    assert (d / "mlp_small.onnx").is_file()
    # Memoised per process: a second call does no work even if a file vanished meanwhile.
    os.unlink(d / "tiny.onnx")
    zoo_fixture.zoo_dir(["tiny"])
    assert not (d / "tiny.onnx").exists()
