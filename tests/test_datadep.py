"""Data-dependent output shapes (NonZero, NonMaxSuppression, TopK with a run-time k, Unique, Compress) and the
detection kernels (native NMS, RoiAlign, TopK) against their numpy oracles and onnxruntime; outputs sized at run
time inside the bound the plan reserved, and a run whose output would pass that bound fails without writing past
it."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T, helper as h

from inferd import native
from inferd.errors import KernelError
from inferd.frontend import import_model
from inferd.ir import Node
from inferd.ops import kernels_for, run_layer, single_node_layer
from inferd.ops.detection import NmsNative, nms, roi_align
from inferd.runtime.cpu import CpuExecutor
from native_harness import AARCH64_CC, AARCH64_FLAGS, QEMU, build_and_run, needs_aarch64, with_sanitizers
from ortutil import ort_session

NATIVE = native.AVAILABLE and hasattr(native.lib, "inferd_nms")


def _model(nodes, inputs, outputs, opset: int = 17) -> onnx.ModelProto:
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                     [h.make_empty_tensor_value_info(o) for o in outputs])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _both(tmp_path: Path, m: onnx.ModelProto, feeds_list) -> CpuExecutor:  # type: ignore[no-untyped-def]
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    ex = CpuExecutor(import_model(str(p)))
    sess = ort_session(p)
    names = [o.name for o in m.graph.output]
    for feeds in feeds_list:
        got = ex.run(feeds)
        want = sess.run(None, feeds)
        for n, w in zip(names, want):
            assert got[n].shape == w.shape, (n, got[n].shape, w.shape)
            np.testing.assert_allclose(got[n], w, rtol=1e-6, atol=1e-6, err_msg=n)
    return ex


def _boxes(rng: np.random.Generator, b: int, n: int) -> np.ndarray:
    xy = rng.random((b, n, 2), dtype=np.float32) * 100
    return np.concatenate([xy, xy + rng.random((b, n, 2), dtype=np.float32) * 30], -1)


def test_data_dependent_graph_matches_onnxruntime(tmp_path: Path) -> None:
    """NonZero -> Transpose -> GatherND, Shape of a data-dependent tensor (computed per run, never folded at the
    bound), a run-time-k TopK, Unique and Compress, over inputs whose output sizes differ run to run."""
    m = _model([h.make_node("NonZero", ["x"], ["nz"]), h.make_node("Transpose", ["nz"], ["nzt"]),
                h.make_node("GatherND", ["x", "nzt"], ["vals"]), h.make_node("Shape", ["nz"], ["nzshape"]),
                h.make_node("TopK", ["s", "k"], ["tv", "ti"], axis=-1),
                h.make_node("Unique", ["x"], ["u", "ui", "uinv", "uc"], sorted=0),
                h.make_node("Compress", ["s", "c"], ["cs"], axis=1)],
               [("x", T.FLOAT, [3, 5]), ("s", T.FLOAT, [2, 40]), ("k", T.INT64, [1]), ("c", T.BOOL, [40])],
               ["nz", "vals", "nzshape", "tv", "ti", "u", "ui", "uinv", "uc", "cs"])
    rng = np.random.default_rng(0)
    feeds = []
    for t in range(5):
        x = (rng.random((3, 5)) < t / 4).astype(np.float32) * rng.integers(1, 4, (3, 5)).astype(np.float32)
        feeds.append({"x": x, "s": rng.random((2, 40), dtype=np.float32), "k": np.array([t * 9], np.int64),
                      "c": rng.random(40) < 0.5})
    ex = _both(tmp_path, m, feeds)
    # the bounds are in the plan: NonZero's is every element of x, TopK's the whole axis
    assert ex.graph.infos["nz"].shape == (2, 15)
    assert ex.graph.infos["tv"].shape == (2, 40)


def test_branch_reading_a_data_dependent_tensor(tmp_path: Path) -> None:
    """An If whose branch reads an outer tensor sized at run time (torchvision's batched_nms: offsets from the
    kept labels, sliced, into NonMaxSuppression): the branch's nodes are run-time shaped too, not shaped at the
    outer tensor's placeholder (a Slice of it failed), and a node whose inference fails there keeps its op's
    element type (TopK's indices are int64 in both branches)."""
    k1 = h.make_tensor("k1", T.INT64, [1], [1])
    then_b = h.make_graph([h.make_node("Constant", [], ["ti"], value=h.make_tensor("z", T.INT64, [1, 1], [0]))],
                          "then", [], [h.make_empty_tensor_value_info("ti")])
    else_b = h.make_graph([h.make_node("Constant", [], ["st"], value=h.make_tensor("st_", T.INT64, [1], [0])),
                           h.make_node("Constant", [], ["en"], value=h.make_tensor("en_", T.INT64, [1], [2])),
                           h.make_node("Constant", [], ["ax"], value=h.make_tensor("ax_", T.INT64, [1], [1])),
                           h.make_node("Constant", [], ["k"], value=k1),
                           h.make_node("Slice", ["lab", "st", "en", "ax"], ["sl"]),
                           h.make_node("TopK", ["sl", "k"], ["tv", "ei"], axis=1)],
                          "else", [], [h.make_empty_tensor_value_info("ei")])
    # labels as torchvision makes them: full_like(kept scores, label), a ConstantOfShape of a run-time Shape
    m = _model([h.make_node("NonZero", ["x"], ["nz"]), h.make_node("Shape", ["nz"], ["nzs"]),
                h.make_node("ConstantOfShape", ["nzs"], ["ones"], value=h.make_tensor("one", T.FLOAT, [1], [1.0])),
                h.make_node("Concat", ["ones", "ones"], ["lab"], axis=1),
                h.make_node("If", ["cond"], ["y"], then_branch=then_b, else_branch=else_b)],
               [("x", T.FLOAT, [6]), ("cond", T.BOOL, [])], ["y"])
    x = np.array([0, 3, 0, 5, 2, 0], np.float32)
    _both(tmp_path, m, [{"x": x, "cond": np.array(c)} for c in (False, True)]
          + [{"x": np.array([1, 0, 2, 0, 0, 4], np.float32), "cond": np.array(False)}])


def test_topk_runtime_k_past_the_axis_fails_cleanly(tmp_path: Path) -> None:
    m = _model([h.make_node("TopK", ["s", "k"], ["tv", "ti"])], [("s", T.FLOAT, [2, 8]), ("k", T.INT64, [1])],
               ["tv", "ti"])
    onnx.save(m, tmp_path / "m.onnx")
    ex = CpuExecutor(import_model(str(tmp_path / "m.onnx")))
    with pytest.raises(KernelError, match=r"k 9 outside 0\.\.8"):
        ex.run({"s": np.zeros((2, 8), np.float32), "k": np.array([9], np.int64)})


def _canary_run(ex: CpuExecutor, name: str, feeds: dict[str, np.ndarray]) -> None:
    """Run ``ex`` with every arena byte outside ``name``'s buffer set to a canary, and check they survive."""
    written = np.zeros(ex.arena.size, bool)  # the bound buffer and the inputs (copied in before the failure)
    for t in [name] + [i.name for i in ex.graph.inputs]:
        off = ex.plan.offset(t)
        written[off:off + ex.graph.infos[t].nbytes] = True
    assert ex.graph.nodes[0].outputs[0] == name  # it runs first: nothing else may write before it fails
    ex.arena.fill(0xA5)
    with pytest.raises(KernelError, match="planned bound") as e:
        ex.run(feeds)
    assert np.all(ex.arena[~written] == 0xA5)
    assert name in str(e.value) or "NonZero" in str(e.value) or "NonMaxSuppression" in str(e.value)


def test_output_past_its_bound_fails_the_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bound capped below the worst case (INFERD_MAX_BOUND_ELEMS): a run that fits gives the right answer, one
    that would not fit fails with a clear error and leaves the arena past the buffer untouched; the executor keeps
    serving afterwards."""
    monkeypatch.setenv("INFERD_MAX_BOUND_ELEMS", "20")  # NonZero of a (4, 8) input: at most 10 of 32 positions
    m = _model([h.make_node("NonZero", ["x"], ["nz"]), h.make_node("Relu", ["x"], ["r"])],
               [("x", T.FLOAT, [4, 8])], ["nz", "r"])
    onnx.save(m, tmp_path / "m.onnx")
    ex = CpuExecutor(import_model(str(tmp_path / "m.onnx")))
    assert ex.graph.infos["nz"].shape == (2, 10)
    few = np.zeros((4, 8), np.float32)
    few[1, 2] = few[3, 7] = 1
    np.testing.assert_array_equal(ex.run({"x": few})["nz"], np.array(np.nonzero(few)))
    _canary_run(ex, "nz", {"x": np.ones((4, 8), np.float32)})
    np.testing.assert_array_equal(ex.run({"x": few})["nz"], np.array(np.nonzero(few)))


@pytest.mark.skipif(not NATIVE, reason="native extension without detect.c")
def test_nms_past_its_bound_fails_the_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERD_MAX_BOUND_ELEMS", str(3 * 7))  # 7 boxes at most
    m = _model([h.make_node("NonMaxSuppression", ["b", "s", "mo", "iou"], ["sel"])],
               [("b", T.FLOAT, [1, 50, 4]), ("s", T.FLOAT, [1, 2, 50]), ("mo", T.INT64, [1]), ("iou", T.FLOAT, [1])],
               ["sel"])
    onnx.save(m, tmp_path / "m.onnx")
    ex = CpuExecutor(import_model(str(tmp_path / "m.onnx")))
    assert [k.name for _l, k in ex.choice] == ["nms_native"]
    assert ex.graph.infos["sel"].shape == (7, 3)
    rng = np.random.default_rng(3)
    feeds = {"b": _boxes(rng, 1, 50), "s": rng.random((1, 2, 50), dtype=np.float32), "mo": np.array([3], np.int64),
             "iou": np.array([0.5], np.float32)}
    want = nms(Node("n", "NonMaxSuppression", ["a"] * 4, ["y"]), list(feeds.values()))[0]
    np.testing.assert_array_equal(ex.run(feeds)["sel"], want)
    feeds["mo"] = np.array([10], np.int64)
    _canary_run(ex, "sel", feeds)


def test_nms_iou_threshold_outside_0_1_fails_clearly_and_the_executor_keeps_serving(tmp_path: Path) -> None:
    from inferd.errors import InputError
    from ortutil import ort_session

    m = _model([h.make_node("NonMaxSuppression", ["b", "s", "mo", "iou"], ["sel"])],
               [("b", T.FLOAT, [1, 20, 4]), ("s", T.FLOAT, [1, 1, 20]), ("mo", T.INT64, [1]), ("iou", T.FLOAT, [1])],
               ["sel"])
    onnx.save(m, tmp_path / "m.onnx")
    ex = CpuExecutor(import_model(str(tmp_path / "m.onnx")))
    rng = np.random.default_rng(5)
    feeds = {"b": _boxes(rng, 1, 20), "s": rng.random((1, 1, 20), dtype=np.float32), "mo": np.array([5], np.int64)}
    sess = ort_session(str(tmp_path / "m.onnx"))
    for bad in (-0.1, 1.5):
        with pytest.raises(InputError, match=r"iou_threshold .* must be in \[0, 1\]"):
            ex.run({**feeds, "iou": np.array([bad], np.float32)})
        with pytest.raises(Exception):  # onnxruntime refuses it too
            sess.run(None, {**feeds, "iou": np.array([bad], np.float32)})
    good = {**feeds, "iou": np.array([0.5], np.float32)}
    np.testing.assert_array_equal(ex.run(good)["sel"], sess.run(None, good)[0])
    node = Node("n", "NonMaxSuppression", ["a"] * 4, ["y"])
    with pytest.raises(InputError):  # the oracle checks it as well
        nms(node, [feeds["b"], feeds["s"], feeds["mo"], np.array([-1.0], np.float32)])


@pytest.mark.skipif(not NATIVE, reason="needs the native extension")
def test_nms_on_run_time_shaped_boxes_runs_natively(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchvision's detectors as the TorchScript exporter writes them: the boxes that pass the score threshold
    (NonZero, Gather: shaped at run time) into NonMaxSuppression with max_output_boxes_per_class = INT64_MAX ("no
    limit"), at the top level and inside batched_nms's If, whose branches give different shapes. Those nodes
    run the native kernel at the run's shapes, not the oracle (a numpy pass per kept box: Mask R-CNN's 91,000
    boxes took 5 minutes), and INT64_MAX reaches it as an integer (through float it was 2**63, past a long long)."""
    from inferd.ops import detection

    i64max = h.make_tensor("mo_", T.INT64, [1], [np.iinfo(np.int64).max])
    nms_in = ["kb3", "ks3", "mo", "iou"]
    then_b = h.make_graph([h.make_node("Constant", [], ["none"], value=h.make_tensor("z", T.INT64, [0, 3], []))],
                          "then", [], [h.make_empty_tensor_value_info("none")])
    else_b = h.make_graph([h.make_node("NonMaxSuppression", nms_in, ["sel_in"])], "else", [],
                          [h.make_empty_tensor_value_info("sel_in")])
    m = _model([h.make_node("Constant", [], ["mo"], value=i64max),
                h.make_node("Constant", [], ["iou"], value=h.make_tensor("iou_", T.FLOAT, [1], [0.5])),
                h.make_node("Constant", [], ["thr"], value=h.make_tensor("thr_", T.FLOAT, [], [0.2])),
                h.make_node("Constant", [], ["ax0"], value=h.make_tensor("ax0_", T.INT64, [1], [0])),
                h.make_node("Constant", [], ["ax01"], value=h.make_tensor("ax01_", T.INT64, [2], [0, 1])),
                h.make_node("Greater", ["s", "thr"], ["keep"]), h.make_node("NonZero", ["keep"], ["nz"]),
                h.make_node("Squeeze", ["nz", "ax0"], ["idx"]),
                h.make_node("Gather", ["b", "idx"], ["kb"], axis=0), h.make_node("Gather", ["s", "idx"], ["ks"]),
                h.make_node("Unsqueeze", ["kb", "ax0"], ["kb3"]), h.make_node("Unsqueeze", ["ks", "ax01"], ["ks3"]),
                h.make_node("NonMaxSuppression", nms_in, ["sel"]),
                h.make_node("If", ["cond"], ["sel_if"], then_branch=then_b, else_branch=else_b)],
               [("b", T.FLOAT, [3000, 4]), ("s", T.FLOAT, [3000]), ("cond", T.BOOL, [])], ["sel", "sel_if"])

    def oracle(node: Node, ins: list) -> list:  # type: ignore[type-arg]
        raise AssertionError(f"{node.name}: NonMaxSuppression ran its numpy oracle")

    rng = np.random.default_rng(5)
    feeds = [{"b": _boxes(rng, 1, 3000)[0], "s": rng.random(3000, dtype=np.float32), "cond": np.array(c)}
             for c in (False, True)]
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    ex = CpuExecutor(import_model(str(p)))
    assert {"sel", "sel_if"} <= set(ex.graph.runtime_shaped)
    monkeypatch.setitem(detection._COMPUTE, "NonMaxSuppression", oracle)
    sess = ort_session(p)
    for f in feeds:
        got, want = ex.run(f), sess.run(None, f)
        assert want[0].shape[0] > 100  # (many boxes kept: the oracle's cost grows with them)
        for name, w in zip(("sel", "sel_if"), want):
            np.testing.assert_array_equal(got[name], w, err_msg=name)


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("n", [1, 37, 600])
def test_nms_native_matches_oracle_and_onnxruntime(tmp_path: Path, center: int, n: int) -> None:
    rng = np.random.default_rng(n + center)
    boxes = _boxes(rng, 2, n)
    if center:
        boxes[..., 2:] -= boxes[..., :2]
        boxes[..., :2] += boxes[..., 2:] / 2
    else:
        boxes[0] = boxes[0][:, [2, 3, 0, 1]]  # flipped corners
    scores = rng.random((2, 3, n), dtype=np.float32)
    scores[1, 2, : min(n, 9)] = 0.75  # ties: lower index first
    m = _model([h.make_node("NonMaxSuppression", ["b", "s", "mo", "iou", "st"], ["sel"], center_point_box=center)],
               [("b", T.FLOAT, [2, n, 4]), ("s", T.FLOAT, [2, 3, n]), ("mo", T.INT64, [1]), ("iou", T.FLOAT, [1]),
                ("st", T.FLOAT, [1])], ["sel"])
    feeds = [{"b": boxes, "s": scores, "mo": np.array([mo], np.int64), "iou": np.array([iou], np.float32),
              "st": np.array([st], np.float32)} for mo, iou, st in ((5, 0.5, 0.2), (n, 0.3, 0.0), (0, 0.5, 0.1),
                                                                   (n, 0.0, 0.9))]
    ex = _both(tmp_path, m, feeds)
    want = kernels_for("NonMaxSuppression")[0].name
    assert [k.name for _l, k in ex.choice] == [want]
    node = Node("n", "NonMaxSuppression", ["a"] * 5, ["y"], {"center_point_box": center})
    for f in feeds:
        ins = list(f.values())
        ref = nms(node, ins)[0]
        if NATIVE:
            layer = single_node_layer("NonMaxSuppression", ins, {"center_point_box": center}, const=[False] * 5)
            out = np.empty((2 * 3 * n, 3), np.int64)
            (got_shape,) = NmsNative().run_bounded(layer, ins, {}, [out])
            np.testing.assert_array_equal(out[:got_shape[0]], ref)


@pytest.mark.parametrize("opset,ctm", [(10, None), (16, "half_pixel"), (16, "output_half_pixel")])
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_kernels_match_onnxruntime(opset: int, ctm: str | None, mode: str) -> None:
    from ortutil import feeds_for, make_single_node_model

    rng = np.random.default_rng(opset + len(mode))
    x = rng.random((2, 4, 13, 11), dtype=np.float32)
    rois = rng.random((7, 4), dtype=np.float32) * 9
    rois[:, 2:] += rng.random((7, 2), dtype=np.float32) * 6
    rois[0] = [-3, -2, 20, 30]  # partly outside the image
    rois[1] = [4, 4, 4.2, 4.3]  # smaller than a pixel
    bi = rng.integers(0, 2, 7).astype(np.int64)
    for sr in (0, 2):
        attrs = {"output_height": 3, "output_width": 4, "sampling_ratio": sr, "spatial_scale": 0.75, "mode": mode}
        if ctm:
            attrs["coordinate_transformation_mode"] = ctm
        ins = [x, rois, bi]
        model = make_single_node_model("RoiAlign", ins, attrs, opset=opset)
        want = ort_session(model).run(
            None, feeds_for(ins))[0]
        layer = single_node_layer("RoiAlign", ins, dict(attrs, _opset=opset), const=[False] * 3)
        for k in kernels_for("RoiAlign"):
            if k.applies(layer):
                np.testing.assert_allclose(run_layer(k, layer, ins)[0], want, rtol=1e-5, atol=1e-6, err_msg=k.name)
        np.testing.assert_allclose(roi_align(layer.node, ins)[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("iou", [0.5, 0.0, 1.0])
def test_nms_native_chunked_selection_matches_onnxruntime(tmp_path: Path, iou: float) -> None:
    """Clusters of near-duplicate boxes, so most candidates are suppressed and the native kernel selects and
    sorts the next chunk of candidates again and again; negative scores, -0.0 against 0.0 and runs of equal
    scores (the lower box index first)."""
    rng = np.random.default_rng(int(iou * 10) + 3)
    n = 900
    centres = rng.random((30, 2), dtype=np.float32) * 500
    xy = centres[rng.integers(0, 30, n)] + rng.random((n, 2), dtype=np.float32) * 4
    boxes = np.concatenate([xy, xy + 40 + rng.random((n, 2), dtype=np.float32) * 3], -1)[None].astype(np.float32)
    scores = (rng.random((1, 2, n), dtype=np.float32) - 0.5).astype(np.float32)
    scores[0, 0, :300] = np.round(scores[0, 0, :300] * 8) / 8  # many ties
    scores[0, 1, :50] = 0.0
    scores[0, 1, 50:100] = -0.0
    m = _model([h.make_node("NonMaxSuppression", ["b", "s", "mo", "iou"], ["sel"])],
               [("b", T.FLOAT, [1, n, 4]), ("s", T.FLOAT, [1, 2, n]), ("mo", T.INT64, [1]), ("iou", T.FLOAT, [1])],
               ["sel"])
    feeds = [{"b": boxes, "s": scores, "mo": np.array([mo], np.int64), "iou": np.array([iou], np.float32)}
             for mo in (25, 200, n)]
    _both(tmp_path, m, feeds)
    node = Node("n", "NonMaxSuppression", ["a"] * 4, ["y"], {})
    for f in feeds:
        ins = list(f.values())
        ref = nms(node, ins)[0]
        if NATIVE:
            layer = single_node_layer("NonMaxSuppression", ins, {}, const=[False] * 4)
            out = np.empty((2 * n, 3), np.int64)
            (got_shape,) = NmsNative().run_bounded(layer, ins, {}, [out])
            np.testing.assert_array_equal(out[:got_shape[0]], ref)


@pytest.mark.parametrize("sr", [0, 1, 2, 5])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
def test_roi_align_avg_separable_and_sparse_grids_match_onnxruntime(sr: int, ctm: str) -> None:
    """Detector-sized avg RoiAlign: the native kernel's separable path (dense grids) and its per-sample taps
    (sparse grids: sampling_ratio 1 over large rois) against onnxruntime and the oracle, rois of every size
    from sub-pixel to larger than the map, some past its edges, and channel blocks split over the pool."""
    from ortutil import feeds_for, make_single_node_model

    rng = np.random.default_rng(sr + len(ctm))
    x = rng.standard_normal((2, 19, 23, 29), dtype=np.float32)
    r = 48
    rois = rng.random((r, 4), dtype=np.float32) * 200 - 20
    rois[:, 2:] = rois[:, :2] + rng.random((r, 2), dtype=np.float32) * np.array([300, 260], np.float32)
    rois[:4] = [[0, 0, 231, 183], [-40, -30, 300, 260], [50, 50, 50.5, 50.2], [100, 20, 90, 10]]  # whole, past, tiny, inverted
    bi = rng.integers(0, 2, r).astype(np.int64)
    attrs = {"output_height": 7, "output_width": 6, "sampling_ratio": sr, "spatial_scale": 0.125,
             "coordinate_transformation_mode": ctm}
    ins = [x, rois, bi]
    want = ort_session(make_single_node_model("RoiAlign", ins, attrs, opset=16)).run(None, feeds_for(ins))[0]
    layer = single_node_layer("RoiAlign", ins, dict(attrs, _opset=16), const=[False] * 3)
    np.testing.assert_allclose(roi_align(layer.node, ins)[0], want, rtol=1e-5, atol=1e-5)
    for k in kernels_for("RoiAlign"):
        if k.applies(layer):
            np.testing.assert_allclose(run_layer(k, layer, ins)[0], want, rtol=1e-5, atol=1e-5, err_msg=k.name)


def test_roi_align_refuses_a_bad_batch_index() -> None:
    x = np.zeros((2, 1, 4, 4), np.float32)
    ins = [x, np.zeros((1, 4), np.float32), np.array([2], np.int64)]
    layer = single_node_layer("RoiAlign", ins, {}, const=[False] * 3)
    for k in kernels_for("RoiAlign"):
        with pytest.raises(KernelError, match="batch index out of range"):
            run_layer(k, layer, ins)


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_native_matches_numpy_with_ties_and_nan(largest: int) -> None:
    rng = np.random.default_rng(largest)
    x = rng.integers(0, 20, (5, 300)).astype(np.float32)  # many ties
    x[2, ::7] = np.nan
    for k in (0, 1, 17, 300):
        layer = single_node_layer("TopK", [x, np.array([k], np.int64)], {"largest": largest, "_opset": 17},
                                  n_outputs=2)
        ks = {kk.name: kk for kk in kernels_for("TopK")}
        ref = run_layer(ks["numpy"], layer, [x, np.array([k], np.int64)])
        if "topk_native" in ks and ks["topk_native"].applies(layer):
            got = run_layer(ks["topk_native"], layer, [x, np.array([k], np.int64)])
            np.testing.assert_array_equal(got[1], ref[1])
            np.testing.assert_array_equal(got[0], ref[0])


# ------------------------------------------------------------------------------ native C on other ISAs

_HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include "inferd_native.h"
static unsigned long long rs = 88172645463325252ULL;
static float rnd(void){ rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (float)((rs >> 11) % 1000000) / 10000.0f; }
static int fails = 0;
int main(void){
  for (int it = 0; it < 60; ++it) { /* NMS: every kept pair has IoU <= thr, every dropped box overlaps a kept one */
    int N = 1 + it * 7, C = 1 + it % 3; float thr = 0.1f * (it % 7);
    float* b = malloc(sizeof(float) * N * 4); float* s = malloc(sizeof(float) * C * N);
    for (int i = 0; i < N; ++i) { b[i*4] = rnd(); b[i*4+1] = rnd(); b[i*4+2] = b[i*4] + rnd() / 3; b[i*4+3] = b[i*4+1] + rnd() / 3; }
    for (int i = 0; i < C * N; ++i) s[i] = rnd();
    long long* out = malloc(sizeof(long long) * 3 * C * N);
    long long n = inferd_nms(b, s, 1, C, N, 0, N, thr, 0, 0, out, (long long)C * N);
    if (n < 0 || (it % 7 == 0 && thr == 0.0f && n < C)) { printf("FAIL nms count %lld\n", n); fails++; }
    for (long long p = 0; p < n; ++p) for (long long q = p + 1; q < n; ++q) {
      if (out[p*3+1] != out[q*3+1]) continue;
      const float* u = b + out[p*3+2] * 4; const float* v = b + out[q*3+2] * 4;
      float ix = fminf(u[3], v[3]) - fmaxf(u[1], v[1]), iy = fminf(u[2], v[2]) - fmaxf(u[0], v[0]);
      if (ix > 0 && iy > 0) { float in = ix * iy, un = (u[2]-u[0])*(u[3]-u[1]) + (v[2]-v[0])*(v[3]-v[1]) - in;
        if (in / un > thr + 1e-6f) { printf("FAIL nms overlap it %d\n", it); fails++; } }
      if (s[out[p*3+1] * N + out[p*3+2]] < s[out[q*3+1] * N + out[q*3+2]]) { printf("FAIL nms order\n"); fails++; }
    }
    if (n > 1 && inferd_nms(b, s, 1, C, N, 0, N, thr, 0, 0, out, n - 1) != -1) { printf("FAIL nms cap\n"); fails++; }
    free(b); free(s); free(out);
  }
  for (int it = 0; it < 40; ++it) { /* RoiAlign of a constant image is that constant (avg), a whole-image roi */
    int C = 1 + it % 3, H = 3 + it % 5, W = 4 + it % 6, OH = 1 + it % 3, OW = 1 + it % 4;
    float* x = malloc(sizeof(float) * 2 * C * H * W); for (int i = 0; i < 2 * C * H * W; ++i) x[i] = 2.5f;
    float rois[8] = {0.5f, 0.5f, W - 1.5f, H - 1.5f, 1, 1, 2, 2}; long long bi[2] = {1, 0};
    float* y = malloc(sizeof(float) * 2 * C * OH * OW);
    inferd_roi_align(x, 2, C, H, W, rois, bi, 2, OH, OW, it % 3, 1.0f, it % 2, 0, y);
    for (int i = 0; i < 2 * C * OH * OW; ++i) if (fabsf(y[i] - 2.5f) > 1e-5f) { printf("FAIL roialign %d %g\n", it, y[i]); fails++; break; }
    free(x); free(y);
  }
  for (int it = 0; it < 50; ++it) { /* TopK: sorted, the k best, lower index on ties */
    int n = 1 + it * 13, k = it % 2 ? n : 1 + (it * 5) % n, lg = it % 2;
    float* x = malloc(sizeof(float) * n); for (int i = 0; i < n; ++i) x[i] = (float)((int)rnd() % 17);
    float* v = malloc(sizeof(float) * k); long long* ix = malloc(sizeof(long long) * k);
    inferd_topk(x, 1, n, k, lg, v, ix);
    for (int i = 0; i < k; ++i) { if (x[ix[i]] != v[i]) { printf("FAIL topk value\n"); fails++; break; }
      if (i && (lg ? v[i] > v[i-1] : v[i] < v[i-1])) { printf("FAIL topk order\n"); fails++; break; }
      if (i && v[i] == v[i-1] && ix[i] < ix[i-1]) { printf("FAIL topk ties\n"); fails++; break; } }
    int better = 0; for (int i = 0; i < n; ++i) if (lg ? x[i] > v[k-1] : x[i] < v[k-1]) better++;
    if (better > k - 1) { printf("FAIL topk not best\n"); fails++; }
    free(x); free(v); free(ix);
  }
  printf("detect: %s (%d failures)\n", fails ? "FAILED" : "ok", fails);
  return fails != 0;
}
"""
def _build_and_run(cc: str, flags: list[str], tmp: Path, runner: list[str]) -> None:
    src = tmp / "detect_test.c"
    src.write_text(_HARNESS)
    # detect.c and the thread pool it splits RoiAlign over (tests/test_conv.py builds every file)
    build_and_run(src, ("detect.c", "pool.c"), cc, flags, tmp, runner)


@pytest.mark.slow
@needs_aarch64
def test_detect_c_aarch64(tmp_path: Path) -> None:
    _build_and_run(AARCH64_CC, AARCH64_FLAGS, tmp_path, QEMU)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs cc")
def test_detect_c_host_with_sanitizers(tmp_path: Path) -> None:
    with_sanitizers(lambda flags: _build_and_run("cc", flags, tmp_path, []))


def test_detection_post_processing_through_a_package(tmp_path: Path) -> None:
    """SSD-style post-processing (TopK of the scores at a run-time k, NMS, Gather of the kept boxes by the
    selected indices) through the compiled package and the cold loader, twice (compile, then read the
    package): outputs equal onnxruntime's and are not empty."""
    from inferd.runtime.model import load

    n = 800
    m = _model([h.make_node("ReduceMax", ["s"], ["best"], axes=[1], keepdims=0),
                h.make_node("TopK", ["best", "k"], ["tv", "ti"]),
                h.make_node("NonMaxSuppression", ["b", "s", "mo", "iou", "st"], ["sel"]),
                h.make_node("Gather", ["sel", "two"], ["boxidx"], axis=1),
                h.make_node("Gather", ["bb", "boxidx"], ["kept"], axis=0)],
               [("b", T.FLOAT, [1, n, 4]), ("bb", T.FLOAT, [n, 4]), ("s", T.FLOAT, [1, 4, n]), ("k", T.INT64, [1]),
                ("mo", T.INT64, [1]), ("iou", T.FLOAT, [1]), ("st", T.FLOAT, [1]), ("two", T.INT64, [])],
               ["tv", "ti", "sel", "kept"])
    p = tmp_path / "det.onnx"
    onnx.save(m, p)
    rng = np.random.default_rng(7)
    boxes = _boxes(rng, 1, n)
    feeds = {"b": boxes, "bb": boxes[0], "s": rng.random((1, 4, n), dtype=np.float32), "k": np.array([50], np.int64),
             "mo": np.array([20], np.int64), "iou": np.array([0.45], np.float32), "st": np.array([0.3], np.float32),
             "two": np.array(2, np.int64)}
    want = ort_session(p).run(None, feeds)
    for _ in range(2):
        model = load(str(p), cache_dir=tmp_path / "cache")
        got = model.run(feeds)
        for name, w in zip(["tv", "ti", "sel", "kept"], want):
            assert got[name].shape == w.shape and w.size > 0, name
            np.testing.assert_array_equal(got[name], w, err_msg=name)
        model.close()


def test_max_roi_pool_matches_onnxruntime() -> None:
    from ortutil import feeds_for, make_single_node_model

    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 10, 12)).astype(np.float32)
    rois = np.concatenate([rng.integers(0, 2, (6, 1)), rng.random((6, 4)) * 10], 1).astype(np.float32)
    rois[:, 3:] += rois[:, 1:3]  # x2 >= x1, y2 >= y1
    rois[0] = [1, 20, 20, 30, 30]  # outside the image: empty bins give 0
    attrs = {"pooled_shape": [2, 3], "spatial_scale": 0.8}
    want = ort.InferenceSession(make_single_node_model("MaxRoiPool", [x, rois], attrs).SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds_for([x, rois]))[0]
    layer = single_node_layer("MaxRoiPool", [x, rois], attrs, const=[False, False])
    for k in kernels_for("MaxRoiPool"):
        np.testing.assert_array_equal(run_layer(k, layer, [x, rois])[0], want)


def test_past_bound_request_fails_and_the_model_keeps_serving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the loaded Model (what the daemon serves): the request whose output passes its bound gets a
    KernelError naming the node; the next request is answered."""
    from inferd.runtime.model import load

    monkeypatch.setenv("INFERD_MAX_BOUND_ELEMS", "12")
    m = _model([h.make_node("NonZero", ["x"], ["nz"], name="nz_node")], [("x", T.FLOAT, [3, 8])], ["nz"])
    onnx.save(m, tmp_path / "m.onnx")
    model = load(str(tmp_path / "m.onnx"))
    try:
        with pytest.raises(KernelError, match="nz_node.*planned bound"):
            model.run({"x": np.ones((3, 8), np.float32)})
        x = np.zeros((3, 8), np.float32)
        x[2, 5] = 1
        np.testing.assert_array_equal(model.run({"x": x})["nz"], [[2], [5]])
    finally:
        model.close()


def test_a_gemm_over_run_time_shaped_rows_runs_its_packed_kernel(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A detector's box head: the rows that pass a threshold (NonZero, Gather: shaped at run time) through Gemms of
    constant weights. They run the native packed GEMM at each run's row count with the weights packed at load,
    not the oracle (numpy's BLAS, held to one thread: fasterrcnn_mobilenet_320's box head 52 ms against 33), and
    equal onnxruntime at every row count, an empty one too."""
    from inferd.ops import base

    rng = np.random.default_rng(6)
    w1 = h.make_tensor("w1", T.FLOAT, [64, 40], rng.standard_normal((64, 40)).astype(np.float32).ravel())
    b1 = h.make_tensor("b1", T.FLOAT, [64], rng.standard_normal(64).astype(np.float32))
    w2 = h.make_tensor("w2", T.FLOAT, [64, 10], rng.standard_normal((64, 10)).astype(np.float32).ravel())
    m = _model([h.make_node("Constant", [], ["thr"], value=h.make_tensor("thr_", T.FLOAT, [], [0.3])),
                h.make_node("Constant", [], ["ax0"], value=h.make_tensor("ax0_", T.INT64, [1], [0])),
                h.make_node("Constant", [], ["W1"], value=w1), h.make_node("Constant", [], ["B1"], value=b1),
                h.make_node("Constant", [], ["W2"], value=w2),
                h.make_node("Greater", ["s", "thr"], ["keep"]), h.make_node("NonZero", ["keep"], ["nz"]),
                h.make_node("Squeeze", ["nz", "ax0"], ["idx"]), h.make_node("Gather", ["x", "idx"], ["rows"], axis=0),
                h.make_node("Gemm", ["rows", "W1", "B1"], ["hid"], transB=1), h.make_node("Relu", ["hid"], ["r"]),
                h.make_node("MatMul", ["r", "W2"], ["y"])],
               [("x", T.FLOAT, [500, 40]), ("s", T.FLOAT, [500])], ["y"])
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    ex = CpuExecutor(import_model(str(p)))
    assert "y" in ex.graph.runtime_shaped
    assert {s.kernel.name for s in ex.steps if s is not None and s.layer.op in ("Gemm", "MatMul")} == {"gemm_packed"}
    real = base.run_at_run_shapes

    def no_oracle(node: Node, vals: list) -> list:  # type: ignore[type-arg]
        assert node.op not in ("Gemm", "MatMul"), f"{node.name}: {node.op} ran its oracle"
        return real(node, vals)

    monkeypatch.setattr("inferd.runtime.cpu.run_at_run_shapes", no_oracle)
    sess = ort_session(p)
    x = rng.standard_normal((500, 40)).astype(np.float32)
    for thr_s in (rng.random(500, dtype=np.float32), np.linspace(0, 0.6, 500, dtype=np.float32),
                  np.zeros(500, np.float32), rng.random(500, dtype=np.float32)):
        f = {"x": x, "s": thr_s}
        got, want = ex.run(f)["y"], sess.run(None, f)[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_roialign_over_run_time_shaped_rois_runs_its_native_kernel(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A detector's box pooling: the proposals that pass a threshold (shaped at run time) through RoiAlign. Its
    native kernel keeps its (no) constants as they are, so it runs at each run's roi count, not the oracle
    (fasterrcnn_mobilenet_320's 150 rois x 256 channels: 102 ms in the oracle, ~5 natively), and equals
    onnxruntime at every count, an empty one too."""
    from inferd.ops import base

    rng = np.random.default_rng(8)
    m = _model([h.make_node("Constant", [], ["thr"], value=h.make_tensor("thr_", T.FLOAT, [], [0.5])),
                h.make_node("Constant", [], ["ax0"], value=h.make_tensor("ax0_", T.INT64, [1], [0])),
                h.make_node("Greater", ["s", "thr"], ["keep"]), h.make_node("NonZero", ["keep"], ["nz"]),
                h.make_node("Squeeze", ["nz", "ax0"], ["idx"]),
                h.make_node("Gather", ["boxes", "idx"], ["rois"], axis=0),
                h.make_node("Gather", ["batch", "idx"], ["bi"], axis=0),
                h.make_node("RoiAlign", ["feat", "rois", "bi"], ["y"], output_height=7, output_width=7,
                            sampling_ratio=2, spatial_scale=0.25, coordinate_transformation_mode="half_pixel")],
               [("feat", T.FLOAT, [2, 24, 20, 20]), ("boxes", T.FLOAT, [60, 4]), ("batch", T.INT64, [60]),
                ("s", T.FLOAT, [60])], ["y"], opset=16)
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    ex = CpuExecutor(import_model(str(p)))
    assert "y" in ex.graph.runtime_shaped
    assert {s.kernel.name for s in ex.steps if s is not None and s.layer.op == "RoiAlign"} == {"roialign_native"}
    real = base.run_at_run_shapes

    def no_oracle(node: Node, vals: list) -> list:  # type: ignore[type-arg]
        assert node.op != "RoiAlign", f"{node.name}: RoiAlign ran its oracle"
        return real(node, vals)

    monkeypatch.setattr("inferd.runtime.cpu.run_at_run_shapes", no_oracle)
    sess = ort_session(p)
    xy = rng.random((60, 2), dtype=np.float32) * 60
    boxes = np.concatenate([xy, xy + 4 + rng.random((60, 2), dtype=np.float32) * 30], axis=1).astype(np.float32)
    f0 = {"feat": rng.standard_normal((2, 24, 20, 20)).astype(np.float32), "boxes": boxes,
          "batch": rng.integers(0, 2, 60).astype(np.int64)}
    for s in (rng.random(60, dtype=np.float32), np.zeros(60, np.float32), np.ones(60, np.float32)):
        f = {**f0, "s": s}
        got, want = ex.run(f)["y"], sess.run(None, f)[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
