"""Mixed placement on Vulkan (lavapipe here): a node no Vulkan kernel runs is placed on the CPU between GPU
segments instead of the model being refused; outputs equal onnxruntime's, and ``kernel_names`` / ``inferd info``
say where each node runs."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper as h, numpy_helper

import inferd
import inferd.vulkan
from inferd import cli
from ortutil import ort_session

pytestmark = pytest.mark.skipif(not inferd.vulkan.available(), reason="needs a Vulkan device (lavapipe)")


def _mixed_model() -> onnx.ModelProto:
    """Conv (GPU) -> bicubic GridSample (no Vulkan kernel: CPU; bilinear/nearest have one) -> Conv (GPU) -> RoiAlign (CPU, native) -> Relu (GPU),
    plus LpNormalization (CPU) on a side branch that a GPU Add joins."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2
    rois = np.array([[0, 0, 10, 10], [2, 3, 14, 9], [5, 5, 15, 15]], np.float32)
    nodes = [h.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             h.make_node("GridSample", ["c1", "grid"], ["gs"], mode="bicubic", name="warp"),
             h.make_node("Conv", ["gs", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             h.make_node("RoiAlign", ["c2", "rois", "bi"], ["ra"], output_height=4, output_width=4, name="roi"),
             h.make_node("Relu", ["ra"], ["r"], name="relu"),
             h.make_node("LpNormalization", ["r"], ["ln"], axis=1, p=2, name="lpn"),
             h.make_node("Add", ["r", "ln"], ["y"], name="add")]
    g = h.make_graph(nodes, "mixed", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 16, 16]),
                                      h.make_tensor_value_info("grid", T.FLOAT, [1, 16, 16, 2])],
                     [h.make_tensor_value_info("y", T.FLOAT, [3, 8, 4, 4])],
                     [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
                      numpy_helper.from_array(rois, "rois"), numpy_helper.from_array(np.zeros(3, np.int64), "bi")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_mixed_model_on_vulkan_matches_onnxruntime(tmp_path: Path) -> None:
    m = _mixed_model()
    p = tmp_path / "mixed.onnx"
    onnx.save(m, p)
    rng = np.random.default_rng(1)
    sess = ort_session(p)
    model = inferd.load(str(p), device="vulkan")
    try:
        for _ in range(2):
            feeds = {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32),
                     "grid": (rng.random((1, 16, 16, 2)) * 2 - 1).astype(np.float32)}
            got = model.run(feeds)["y"]
            want = sess.run(None, feeds)[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        k = model.kernels
        assert k["warp"].startswith("cpu:") and k["roi"] == "cpu:roialign_native" and k["lpn"].startswith("cpu:")
        assert not k["conv1"].startswith("cpu") and not k["relu"].startswith("cpu") and k["add"].startswith("vk_")
    finally:
        model.close()


def test_run_time_shaped_tail_of_a_dynamic_batch_model_splits_at_every_shape(tmp_path: Path) -> None:
    """The same split with a dynamic batch (as tf2onnx and paddle2onnx export): each batch size it runs at is a
    variant with its own Vulkan head and CPU tail, and all of them equal onnxruntime."""
    rng = np.random.default_rng(1)
    p = _tail_model(tmp_path, rng, batch="N")
    sess = ort_session(p)
    model = inferd.load(str(p), device="vulkan")
    for n in (1, 3, 2, 3):
        feeds = {"x": rng.standard_normal((n, 3, 8, 8)).astype(np.float32)}
        got = model.run(feeds)
        for name, want in zip(("y", "r"), sess.run(None, feeds)):
            assert got[name].shape == want.shape
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4)
    assert model.kernels["conv"].startswith("vk_") and model.kernels["nonzero"].startswith("cpu:")
    model.close()


def test_info_shows_where_nodes_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "mixed.onnx"
    onnx.save(_mixed_model(), p)
    assert cli.main(["info", str(p), "--device", "vulkan", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["placement"]["cpu"] == ["warp", "roi", "lpn"]
    assert "conv1" in info["placement"]["gpu"]


def _tail_model(tmp_path: Path, rng: np.random.Generator, batch: int | str = 1) -> Path:
    """NonZero of a conv's activations, then GatherND: a static head and a tail shaped at run time (``batch`` a
    name: a dynamic batch)."""
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             h.make_node("Relu", ["c"], ["r"], name="relu"),
             h.make_node("Greater", ["r", "t"], ["m"], name="gt"),
             h.make_node("NonZero", ["m"], ["nz"], name="nonzero"),
             h.make_node("Transpose", ["nz"], ["nzt"], name="tr"),
             h.make_node("GatherND", ["r", "nzt"], ["y"], name="gather")]
    g = h.make_graph(nodes, "tail", [h.make_tensor_value_info("x", T.FLOAT, [batch, 3, 8, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, None), h.make_tensor_value_info("r", T.FLOAT, None)],
                     [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(0.5, np.float32), "t")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    p = tmp_path / "tail.onnx"
    onnx.save(m, p)
    return p


@pytest.mark.parametrize("cached", [False, True])
def test_run_time_shaped_tail_runs_on_the_cpu_after_the_gpu(tmp_path: Path, cached: bool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A Vulkan model whose tail is shaped at run time (NonZero of a conv's activations, then GatherND): the conv
    runs on Vulkan, the data-dependent tail on the CPU engine; outputs equal onnxruntime's for runs whose output
    sizes differ. Through the package cache too (as the daemon loads): the package format plans static shapes, so
    such a model is split in memory, not refused, and no package is left in the cache."""
    rng = np.random.default_rng(0)
    p = _tail_model(tmp_path, rng)
    sess = ort_session(p)
    cache = tmp_path / "cache"
    import inferd.frontend

    imports: list[object] = []
    real = inferd.frontend.import_template
    monkeypatch.setattr(inferd.frontend, "import_template", lambda *a, **k: imports.append(a) or real(*a, **k))
    model = inferd.load(str(p), device="vulkan", cache_dir=str(cache) if cached else None)
    assert len(imports) == 1  # the cache's compile imported it: the in-memory split takes that import
    if cached:
        assert model.package is None and not [d for d in cache.glob("tail-*") if (d / "plan.bin").exists()]
    sizes = set()
    for scale in (0.5, 1.0, 2.0):
        feeds = {"x": (rng.standard_normal((1, 3, 8, 8)) * scale).astype(np.float32)}
        got = model.run(feeds)
        for name, want in zip(("y", "r"), sess.run(None, feeds)):
            assert got[name].shape == want.shape
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4)
        sizes.add(got["y"].shape)
    assert len(sizes) > 1, "the runs should keep different numbers of elements"
    k = model.kernels
    assert k["conv"].startswith("vk_") and k["gather"].startswith("cpu:") and k["nonzero"].startswith("cpu:")


@pytest.mark.parametrize("rows", [4160, 8256])
def test_weights_left_to_run_time_by_import_load_on_vulkan(tmp_path: Path, rows: int) -> None:
    """ONNX's "light" zoo models (alexnet, vgg19, zfnet512) make their weights with ConstantOfShape. Import
    leaves an output over ``ir.FOLD_MAX_BYTES`` (64 MiB) to run time; the Vulkan backend used to fold it
    anyway, so its Gemm took the weight for a constant that neither the cold loader nor the package had
    (KeyError at load). At 8256 rows (132 MiB) the weight is also larger than a storage binding may be on every
    device (lavapipe's limit, 128 MiB): that Gemm runs on the CPU between the GPU's nodes."""
    cols = 4096
    nodes = [h.make_node("ConstantOfShape", ["wshape"], ["w"], value=numpy_helper.from_array(
                 np.array([0.25], np.float32)), name="make_w"),
             h.make_node("Relu", ["x"], ["r"], name="relu"),
             h.make_node("Gemm", ["r", "w", "b"], ["g"], transB=1, name="fc"),
             h.make_node("Sigmoid", ["g"], ["y"], name="sig")]
    g = h.make_graph(nodes, "light_like", [h.make_tensor_value_info("x", T.FLOAT, [1, cols])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, rows])],
                     [numpy_helper.from_array(np.array([rows, cols], np.int64), "wshape"),
                      numpy_helper.from_array(np.linspace(-1, 1, rows, dtype=np.float32), "b")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 11)])
    m.ir_version = 7
    p = tmp_path / "light_like.onnx"
    onnx.save(m, p)
    x = np.random.default_rng(2).standard_normal((1, cols)).astype(np.float32) * 1e-3
    want = ort_session(p).run(None, {"x": x})[0]
    model = inferd.load(str(p), device="vulkan", cache_dir=str(tmp_path / "cache"))
    try:
        np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)
        assert model.kernels["make_w"].startswith("cpu:") or model.kernels["make_w"] == "host"
        assert model.kernels["fc"].startswith("cpu:") == (rows * cols * 4 > 1 << 27)
    finally:
        model.close()


def test_integer_graph_inputs_and_outputs_cross_to_the_nodes_that_read_them(tmp_path: Path) -> None:
    """Keras text models take int32 token ids (tf2onnx keeps TensorFlow's dtype), which Keras 3's Embedding
    wraps (ids < 0 plus the vocabulary size) before its Gather; an image may come as uint8 and an argmax leave as
    int32. No Vulkan kernel reads those dtypes: the nodes that do run on the CPU, the rest on the device, and the
    model loads instead of being refused for its inputs' dtypes."""
    rng = np.random.default_rng(0)
    vocab, d = 50, 8
    table = rng.standard_normal((vocab, d)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.05
    nodes = [h.make_node("Less", ["ids", "zero"], ["neg"], name="less"),
             h.make_node("Add", ["ids", "vocab"], ["wrapped"], name="wrap"),
             h.make_node("Where", ["neg", "wrapped", "ids"], ["idx"], name="where"),
             h.make_node("Gather", ["table", "idx"], ["emb"], axis=0, name="embed"),
             h.make_node("Relu", ["emb"], ["y"], name="relu"),
             h.make_node("Cast", ["img"], ["imgf"], to=T.FLOAT, name="cast"),
             h.make_node("Conv", ["imgf", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             h.make_node("ArgMax", ["c"], ["am"], axis=1, keepdims=0, name="argmax"),
             h.make_node("Cast", ["am"], ["cls"], to=T.INT32, name="cls_i32")]
    # 4 x 1100 ids: more than a host node's integer plumbing takes, so the Add/Less/Where are CPU-placed nodes
    g = h.make_graph(nodes, "int_io", [h.make_tensor_value_info("ids", T.INT32, [4, 1100]),
                                       h.make_tensor_value_info("img", T.UINT8, [1, 3, 8, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, None), h.make_tensor_value_info("c", T.FLOAT, None),
                      h.make_tensor_value_info("cls", T.INT32, None)],
                     [numpy_helper.from_array(table, "table"), numpy_helper.from_array(w, "w"),
                      numpy_helper.from_array(np.array(0, np.int32), "zero"),
                      numpy_helper.from_array(np.array(vocab, np.int32), "vocab")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    p = tmp_path / "int_io.onnx"
    onnx.save(m, p)
    sess = ort_session(p)
    model = inferd.load(str(p), device="vulkan")
    try:
        for _ in range(2):
            feeds = {"ids": rng.integers(-vocab, vocab, (4, 1100)).astype(np.int32),
                     "img": rng.integers(0, 256, (1, 3, 8, 8)).astype(np.uint8)}
            got = model.run(feeds)
            for name, want in zip(("y", "c", "cls"), sess.run(None, feeds)):
                assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
                # relative to the output's magnitude: the conv sums 27 products of 0..255 pixels, so an output
                # near zero carries the rounding of terms ~40x larger (3.6e-5 at -1.64 failed a fixed 1e-5)
                tol = 1e-5 * max(1.0, float(np.abs(want).max()))
                np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=tol, err_msg=name)
        k = model.kernels
        assert k["wrap"].startswith("cpu:") and k["conv"].startswith("vk_") and k["relu"].startswith("vk_")
    finally:
        model.close()


def _three_run_reductions(path: Path, red3: onnx.NodeProto, red2: onnx.NodeProto, inits: list, opset: int,
                          seed: int, atol: float) -> dict[str, str]:
    """relu -> red3 (axes in three runs: m), red2 (two runs: g), y = m * m on Vulkan, checked against onnxruntime;
    returns the model's kernel per node."""
    nodes = [h.make_node("Relu", ["x"], ["r"], name="relu"), red3, red2, h.make_node("Mul", ["m", "m"], ["y"], name="sq")]
    g = h.make_graph(nodes, "runs", [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 4, 5, 6])],
                     [h.make_tensor_value_info("y", T.FLOAT, None), h.make_tensor_value_info("g", T.FLOAT, None)], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.save(m, path)
    feeds = {"x": np.random.default_rng(seed).standard_normal((2, 3, 4, 5, 6)).astype(np.float32)}
    model = inferd.load(str(path), device="vulkan")
    try:
        got = model.run(feeds)
        for name, want in zip(("y", "g"), ort_session(path).run(None, feeds)):
            np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=atol, err_msg=f"{red3.op_type} {name}")
        return dict(model.kernels)
    finally:
        model.close()


def test_reduction_over_three_runs_of_axes_runs_on_the_cpu(tmp_path: Path) -> None:
    """vk_reduce reduces one run of axes or two with kept axes between; a ReduceMean whose axes form three runs
    (attribute axes, known at placement) is placed on the CPU instead of failing when its layer is prepared."""
    k = _three_run_reductions(tmp_path / "runs.onnx",
                              h.make_node("ReduceMean", ["r"], ["m"], axes=[0, 2, 4], keepdims=1, name="mean3"),
                              h.make_node("ReduceMean", ["r"], ["g"], axes=[1, 2, 4], keepdims=0, name="mean2"),
                              [], 17, 0, 1e-6)
    assert k["mean3"].startswith("cpu:") and k["mean2"] == "vk_reduce" and k["relu"].startswith("vk_")


def test_reduction_over_three_runs_of_axes_given_as_an_input_runs_on_the_cpu(tmp_path: Path) -> None:
    """The same with the axes as a constant input (opset 13 ReduceSum, opset 18 ReduceMean): their values reach
    the placement through ``VulkanKernel.refuses``; the layer failed at preparation before."""
    inits = [numpy_helper.from_array(np.array([0, 2, 4], np.int64), "ax3"),
             numpy_helper.from_array(np.array([1, 2, 4], np.int64), "ax2")]
    for opset, op in ((13, "ReduceSum"), (18, "ReduceMean")):
        k = _three_run_reductions(tmp_path / f"runs_in{opset}.onnx",
                                  h.make_node(op, ["r", "ax3"], ["m"], keepdims=1, name="red3"),
                                  h.make_node(op, ["r", "ax2"], ["g"], keepdims=0, name="red2"), inits, opset, 1, 1e-5)
        assert k["red3"].startswith("cpu:") and k["red2"] == "vk_reduce", k
