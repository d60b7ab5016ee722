"""Import: folding, BN folding, fusion, batch fixing, and clear errors for bad models."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import inferd
import inferd.runtime.cpu
from inferd.errors import InputError, ModelFormatError, ShapeError, UnsupportedOpError
from inferd.frontend import check_dims, import_model, import_template, specialize
from ortutil import run_ort

RNG = np.random.default_rng(7)


def _init(name: str, a: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(a), name)


def _model(nodes, inputs, outputs, inits, opset=17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "t", inputs, outputs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def conv_bn_relu_add_model(batch="N") -> onnx.ModelProto:
    c = 8
    w1 = (RNG.standard_normal((c, 3, 3, 3)) * 0.3).astype(np.float32)
    w2 = (RNG.standard_normal((c, c, 3, 3)) * 0.2).astype(np.float32)
    wskip = (RNG.standard_normal((c, 3, 1, 1)) * 0.5).astype(np.float32)
    bn = [RNG.uniform(0.5, 1.5, c), RNG.standard_normal(c) * 0.1, RNG.standard_normal(c) * 0.1, RNG.uniform(0.5, 2, c)]
    inits = [_init("w1", w1), _init("w2", w2), _init("wskip", wskip)] + [
        _init(n, np.asarray(v, np.float32)) for n, v in zip(["g", "b", "m", "v"], bn)]
    inits += [_init("shape_idx", np.array(0, np.int64)), _init("minus1", np.array([-1], np.int64))]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "g", "b", "m", "v"], ["bn1"], epsilon=1e-5, name="bn1"),
        helper.make_node("Relu", ["bn1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Conv", ["x", "wskip"], ["skip"], name="convskip"),
        helper.make_node("Add", ["c2", "skip"], ["sum"], name="add"),
        helper.make_node("Relu", ["sum"], ["r2"], name="relu2"),
        # Shape -> Gather -> Unsqueeze -> Concat -> Reshape: folded to a constant shape at import
        helper.make_node("Shape", ["r2"], ["shp"], name="shape"),
        helper.make_node("Gather", ["shp", "shape_idx"], ["n"], axis=0, name="gather"),
        helper.make_node("Unsqueeze", ["n", "zero_axes"], ["n1"], name="unsq"),
        helper.make_node("Concat", ["n1", "minus1"], ["newshape"], axis=0, name="concat"),
        helper.make_node("Reshape", ["r2", "newshape"], ["y"], name="reshape"),
    ]
    inits.append(_init("zero_axes", np.array([0], np.int64)))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 9, 11])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return _model(nodes, [x], [y], inits)


def test_folding_and_fusion_rewrite_the_graph():
    g = import_model(conv_bn_relu_add_model())
    ops = [n.op for n in g.nodes]
    # BN folded, Relus fused, residual Add fused into conv2, shape chain folded; Reshape stays (a view)
    assert "BatchNormalization" not in ops and "Relu" not in ops and "Add" not in ops
    assert "Shape" not in ops and "Gather" not in ops and "Concat" not in ops
    assert ops.count("Conv") == 3 and ops[-1] == "Reshape"
    conv2 = next(n for n in g.nodes if n.name == "conv2")
    assert conv2.attr("residual") is True and conv2.attr("act") == ("Relu", ())
    assert next(n for n in g.nodes if n.name == "conv1").attr("act") == ("Relu", ())
    assert g.outputs[0].shape == (1, 8 * 9 * 11)


@pytest.mark.parametrize("batch", [1, 3])
def test_fused_model_matches_onnxruntime(batch):
    m = conv_bn_relu_add_model()
    x = RNG.standard_normal((batch, 3, 9, 11)).astype(np.float32)
    ref = run_ort(m, {"x": x})[0]
    model = inferd.load(m.SerializeToString(), batch=batch)
    assert model.inputs[0].shape == (batch, 3, 9, 11)
    got = model.run({"x": x})["y"]
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() / np.abs(ref).max() <= 1e-5


def _tf_style_model(scale_shape: tuple[int, ...], pad_value: float = 0.0, mode: str = "constant",
                    pad_channels: bool = False) -> onnx.ModelProto:
    """As tf2onnx writes a Keras depthwise block: Pad(0, 0, 1, 1) of the spatial dims, a stride-2 depthwise Conv
    without padding or bias, its BatchNorm as Mul and Add of per-channel constants, ReLU6 (Clip); then a 1x1
    Conv whose output gets an Add of a constant too."""
    c = 8
    if pad_channels:  # the Pad adds a channel: the conv and its scale have 9
        scale_shape = (c + 1, 1, 1)
    wd = (RNG.standard_normal((c, 1, 3, 3)) * 0.5).astype(np.float32)
    w2 = (RNG.standard_normal((4, c, 1, 1)) * 0.5).astype(np.float32)
    pads = [0, 1, 0, 0, 0, 0, 1, 1] if pad_channels else [0, 0, 0, 0, 0, 0, 1, 1]
    inits = [_init("wd", wd), _init("w2", w2), _init("pads", np.array(pads, np.int64)),
             _init("pv", np.array(pad_value, np.float32)),
             _init("s", RNG.uniform(0.5, 1.5, scale_shape).astype(np.float32)),
             _init("t", (RNG.standard_normal(scale_shape) * 0.1).astype(np.float32)),
             _init("t2", (RNG.standard_normal((1, 4, 1, 1)) * 0.1).astype(np.float32)),
             _init("lo", np.array(0.0, np.float32)), _init("hi", np.array(6.0, np.float32))]
    cin = c + (1 if pad_channels else 0)
    if pad_channels:
        inits[0] = _init("wd", (RNG.standard_normal((cin, 1, 3, 3)) * 0.5).astype(np.float32))
        c = cin
    nodes = [helper.make_node("Pad", ["x", "pads", "pv"], ["xp"], mode=mode, name="pad"),
             helper.make_node("Conv", ["xp", "wd"], ["d"], kernel_shape=[3, 3], strides=[2, 2], group=c, name="dw"),
             helper.make_node("Mul", ["d", "s"], ["dm"], name="bn_mul"),
             helper.make_node("Add", ["dm", "t"], ["da"], name="bn_add"),
             helper.make_node("Clip", ["da", "lo", "hi"], ["r"], name="relu6")]
    if not pad_channels:
        nodes += [helper.make_node("Conv", ["r", "w2"], ["p"], kernel_shape=[1, 1], name="pw"),
                  helper.make_node("Add", ["t2", "p"], ["y"], name="shift")]
    else:
        nodes += [helper.make_node("Identity", ["r"], ["y"], name="id")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return _model(nodes, [x], [y], inits, opset=13)


@pytest.mark.parametrize("scale_shape", [(8, 1, 1), (1, 8, 1, 1), (1,)])
def test_a_tf_style_pad_and_batchnorm_fold_into_the_convs(scale_shape: tuple[int, ...]) -> None:
    m = _tf_style_model(scale_shape)
    g = import_model(m)
    ops = [n.op for n in g.nodes]
    assert ops == ["Conv", "Conv"], ops  # the Pad into the padding, Mul/Add into weights and bias, Clip fused
    dw = g.nodes[0]
    assert dw.attr("pads") == [0, 0, 1, 1] and dw.attr("act") == ("Clip", (0.0, 6.0)) and len(dw.inputs) == 3
    assert len(g.nodes[1].inputs) == 3  # the Add after the 1x1 conv is its bias
    x = RNG.standard_normal((1, 8, 16, 16)).astype(np.float32)
    ref = run_ort(m, {"x": x})[0]
    got = inferd.load(m.SerializeToString()).run({"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["nonzero_value", "reflect", "channel_pads", "bcast_scale"])
def test_pads_and_scales_that_are_not_a_convs_own_stay_nodes(case: str) -> None:
    m = (_tf_style_model((8, 1, 1), pad_value=1.0) if case == "nonzero_value" else
         _tf_style_model((8, 1, 1), mode="reflect") if case == "reflect" else
         _tf_style_model((8, 1, 1), pad_channels=True) if case == "channel_pads" else
         _tf_style_model((8, 8, 1)))  # a scale that varies along H too: not per channel
    g = import_model(m)
    ops = [n.op for n in g.nodes]
    if case == "bcast_scale":
        assert "Mul" in ops and "Pad" not in ops
    else:
        assert "Pad" in ops and "Mul" not in ops and "Add" not in ops
    x = RNG.standard_normal((1, 8, 16, 16)).astype(np.float32)
    ref = run_ort(m, {"x": x})[0]
    got = inferd.load(m.SerializeToString()).run({"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def _dilated_model(k: int, d: int, pads: list[int], hw: tuple[int, int], group: int = 1, stride: int = 1,
                   dynamic: bool = False) -> onnx.ModelProto:
    cin, cout = 8, 8 if group > 1 else 6
    w = (RNG.standard_normal((cout, cin // group, k, k)) * 0.3).astype(np.float32)
    b = (RNG.standard_normal(cout) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[k, k], dilations=[d, d], pads=pads,
                              strides=[stride, stride], group=group, name="aspp")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", cin, "H", "W"] if dynamic else [1, cin, *hw])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return _model(nodes, [x], [y], [_init("w", w), _init("b", b)])


@pytest.mark.parametrize("k,d,pads,hw,group,kept,dil", [
    (3, 12, [12, 12, 12, 12], (4, 4), 1, [1, 1], [1, 1]),   # DeepLabV3's ASPP on a 4x4 map: the centre tap alone
    (3, 36, [36, 36, 36, 36], (8, 5), 1, [1, 1], [1, 1]),
    (5, 2, [4, 4, 4, 4], (4, 4), 8, [3, 3], [2, 2]),        # its dilated 5x5 depthwise convs: 3x3 of them live
    (3, 6, [6, 6, 6, 6], (4, 9), 1, [1, 3], [1, 6]),        # wide enough for every column's taps, not the rows'
    (3, 4, [8, 4, 0, 4], (6, 6), 1, [2, 3], [4, 4]),        # uneven padding: only the top row dies
])
def test_taps_that_only_read_padding_are_cut_from_a_conv(k, d, pads, hw, group, kept, dil) -> None:
    m = _dilated_model(k, d, pads, hw, group)
    g = import_model(m)
    conv = g.nodes[0]
    assert list(g.constants[conv.inputs[1]].shape[2:]) == kept and list(conv.attr("dilations")) == dil
    x = RNG.standard_normal((1, 8, *hw)).astype(np.float32)
    ref = run_ort(m, {"x": x})[0]
    got = inferd.load(m.SerializeToString()).run({"x": x})["y"]
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_dead_taps_are_cut_from_a_1d_conv_too() -> None:
    # a dilated 1-D conv over a sequence shorter than its dilation: only the centre tap reads it
    w = (RNG.standard_normal((6, 4, 3)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3], dilations=[6], pads=[6, 6], name="c1")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 5])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [_init("w", w)])
    g = import_model(m)
    assert g.constants[g.nodes[0].inputs[1]].shape == (6, 4, 1) and list(g.nodes[0].attr("pads")) == [0, 0]
    x = RNG.standard_normal((2, 4, 5)).astype(np.float32)
    np.testing.assert_allclose(inferd.load(m.SerializeToString()).run({"x": x})["y"], run_ort(m, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)


def test_a_conv_whose_taps_all_read_the_map_or_whose_map_may_grow_keeps_its_kernel() -> None:
    g = import_model(_dilated_model(3, 2, [2, 2, 2, 2], (8, 8)))
    assert g.constants[g.nodes[0].inputs[1]].shape[2:] == (3, 3)
    # a dynamic map: at a larger size the outer taps read it, so nothing is cut
    m = _dilated_model(3, 12, [12, 12, 12, 12], (4, 4), dynamic=True)
    g = import_model(m)
    assert g.constants[g.nodes[0].inputs[1]].shape[2:] == (3, 3)
    x = RNG.standard_normal((1, 8, 20, 20)).astype(np.float32)
    np.testing.assert_allclose(inferd.load(m.SerializeToString()).run({"x": x})["y"], run_ort(m, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)


def test_looking_for_dead_taps_reads_no_weights_it_keeps() -> None:
    """A conv kept whole is judged from shapes alone: a package's weights are read from its store on first use,
    and a control-flow body is looked at on every open (vad's open read its bodies' weights to keep them)."""
    from collections.abc import Mapping

    from inferd.frontend.rewrite import _drop_dead_taps

    class Counted(Mapping):  # type: ignore[type-arg]
        def __init__(self, d: dict) -> None:  # type: ignore[type-arg]
            self.d, self.reads = d, []

        def __getitem__(self, k: str) -> np.ndarray:
            self.reads.append(k)
            return self.d[k]

        def __contains__(self, k: object) -> bool:  # (Mapping's own reads the value)
            return k in self.d

        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(self.d)

        def __len__(self) -> int:
            return len(self.d)

    for pads in ([2, 2, 2, 2], [0, 0, 0, 0]):
        g = import_model(_dilated_model(3, 2, pads, (8, 8)))
        w = g.nodes[0].inputs[1]
        g.constants = Counted(dict(g.constants))  # type: ignore[assignment]
        _drop_dead_taps(g, {"y"})
        assert g.constants.reads == [] and g.nodes[0].inputs[1] == w, pads  # type: ignore[attr-defined]
    g = import_model(_dilated_model(3, 12, [12, 12, 12, 12], (4, 4)))  # cut at import: the centre tap
    assert g.constants[g.nodes[0].inputs[1]].shape[2:] == (1, 1)


def _nf_block_model(beta_shape: tuple[int, ...] = (), mean_axes: list[int] | None = None,
                    keepdims: int = 1, pads: list[int] | None = None) -> onnx.ModelProto:
    """As timm exports an NF-Net block: SiLU(x) * beta (a constant) into a conv (padded or not), then a
    squeeze-excitation whose pooling is a ReduceMean over the spatial axes."""
    c = 8
    w1 = (RNG.standard_normal((c, c, 3, 3)) * 0.2).astype(np.float32)
    w2 = (RNG.standard_normal((c, c, 1, 1)) * 0.3).astype(np.float32)
    inits = [_init("w1", w1), _init("w2", w2), _init("beta", np.full(beta_shape, 0.7, np.float32)),
             _init("axes", np.array(mean_axes if mean_axes is not None else [2, 3], np.int64)),
             _init("shp", np.array([1, c, 1, 1], np.int64))]
    nodes = [helper.make_node("Sigmoid", ["x"], ["sg"]), helper.make_node("Mul", ["x", "sg"], ["act"]),
             helper.make_node("Mul", ["act", "beta"], ["scaled"], name="beta_mul"),
             helper.make_node("Conv", ["scaled", "w1"], ["h"], kernel_shape=[3, 3],
                              pads=pads if pads is not None else [1, 1, 1, 1], name="conv1"),
             helper.make_node("ReduceMean", ["h", "axes"], ["m"], keepdims=keepdims, name="se_mean"),
             helper.make_node("Conv", ["m", "w2"], ["g"], kernel_shape=[1, 1]) if keepdims else
             helper.make_node("Reshape", ["m", "shp"], ["g"]),
             helper.make_node("Sigmoid", ["g"], ["gs"]), helper.make_node("Mul", ["h", "gs"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 9, 9])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return _model(nodes, [x], [y], inits, opset=18)


@pytest.mark.parametrize("pads", [[1, 1, 1, 1], [0, 0, 0, 0]])
def test_a_constant_input_scale_folds_into_the_conv_and_a_spatial_mean_is_a_pool(pads: list[int]) -> None:
    m = _nf_block_model(pads=pads)
    g = import_model(m)
    ops = [n.op for n in g.nodes]
    assert "ReduceMean" not in ops and "GlobalAveragePool" in ops
    assert not any(n.op == "Mul" and any(i in g.constants for i in n.inputs) for n in g.nodes), ops
    conv1 = next(n for n in g.nodes if n.op == "Conv" and g.constants[n.inputs[1]].shape[2:] == (3, 3))
    assert "beta_mul" not in [n.name for n in g.nodes] and conv1.inputs[0] != "scaled"
    x = RNG.standard_normal((1, 8, 9, 9)).astype(np.float32)
    ref = run_ort(m, {"x": x})[0]
    got = inferd.load(m.SerializeToString()).run({"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["per_channel_beta", "mean_over_w", "mean_without_keepdims"])
def test_scales_and_means_that_are_not_those_stay_as_they_are(case: str) -> None:
    m = (_nf_block_model(beta_shape=(1, 8, 1, 1)) if case == "per_channel_beta" else
         _nf_block_model(mean_axes=[3]) if case == "mean_over_w" else
         _nf_block_model(keepdims=0))
    g = import_model(m)
    ops = [n.op for n in g.nodes]
    if case == "per_channel_beta":
        assert "beta_mul" in [n.name for n in g.nodes]
    else:
        assert "ReduceMean" in ops and "GlobalAveragePool" not in ops
    x = RNG.standard_normal((1, 8, 9, 9)).astype(np.float32)
    ref = run_ort(m, {"x": x})[0]
    got = inferd.load(m.SerializeToString()).run({"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_identities_are_dropped_so_activations_fuse_but_graph_outputs_and_body_reads_keep_theirs() -> None:
    """paddle2onnx writes an Identity after every conv and activation: Conv -> Identity -> Relu fuses as Conv with
    ReLU; an Identity that gives a graph output, or whose output a control-flow body reads, stays."""
    c = 8
    w = (RNG.standard_normal((c, c, 3, 3)) * 0.2).astype(np.float32)
    then_g = helper.make_graph([helper.make_node("Relu", ["idb"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["idb"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Identity", ["h"], ["hid"], name="id_a"),
             helper.make_node("Relu", ["hid"], ["r"], name="relu"),
             helper.make_node("Identity", ["r"], ["y"], name="id_out"),
             helper.make_node("Identity", ["r"], ["idb"], name="id_body"),
             helper.make_node("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g, name="branch")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 6, 6]),
                       helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], [_init("w", w)])
    g = import_model(m)
    names = [n.name for n in g.nodes]
    assert "id_a" not in names and "relu" not in names and "id_out" in names and "id_body" in names
    conv = next(n for n in g.nodes if n.op == "Conv")
    assert conv.attr("act") == ("Relu", ())
    x = RNG.standard_normal((1, c, 6, 6)).astype(np.float32)
    model = inferd.load(m.SerializeToString())
    for cond in (True, False):
        feeds = {"x": x, "cond": np.array(cond)}
        ref = run_ort(m, feeds)
        got = model.run(feeds)
        np.testing.assert_allclose(got["y"], ref[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["z"], ref[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", ["cpu", "vulkan"])
def test_training_mode_batchnorm_is_not_folded(device):
    """A BatchNormalization with training_mode=1 after a Conv normalises with the batch's statistics: folding
    its running statistics into the Conv's weights would compute something else. (NF-Nets export it on their
    weights, where it folds as a constant; here it follows a Conv on a graph input, so it runs.)"""
    if device == "vulkan":
        from inferd import vulkan

        if not vulkan.available():
            pytest.skip("needs a Vulkan device (lavapipe)")
    c = 4
    inits = [_init("w", (RNG.standard_normal((c, 3, 3, 3)) * 0.3).astype(np.float32))] + [
        _init(n, np.asarray(v, np.float32)) for n, v in
        zip(["g", "b", "m", "v"], [RNG.uniform(0.5, 1.5, c), RNG.standard_normal(c), RNG.standard_normal(c),
                                   RNG.uniform(0.5, 2, c)])]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["bn", "rm", "rv"], epsilon=1e-5,
                              momentum=0.5, training_mode=1, name="bn"),
             helper.make_node("Relu", ["bn"], ["y"], name="relu")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 7])],
               [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "rm", "rv")], inits)
    x = RNG.standard_normal((2, 3, 6, 7)).astype(np.float32) + 1
    ref = run_ort(m, {"x": x})
    got = inferd.load(m, device=device).run({"x": x})
    for name, r in zip(("y", "rm", "rv"), ref):
        np.testing.assert_allclose(got[name], r, rtol=1e-4, atol=1e-5 * np.abs(r).max(), err_msg=name)


def test_silu_and_gelu_patterns_are_recognised():
    w = (RNG.standard_normal((4, 4, 1, 1)) * 0.5).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
        helper.make_node("Mul", ["c", "s"], ["silu"], name="mul"),
        helper.make_node("Div", ["silu", "sqrt2"], ["d"], name="div"),
        helper.make_node("Erf", ["d"], ["e"], name="erf"),
        helper.make_node("Add", ["e", "one"], ["e1"], name="add1"),
        helper.make_node("Mul", ["silu", "e1"], ["m1"], name="mulx"),
        helper.make_node("Mul", ["m1", "half"], ["y"], name="mulhalf"),
    ]
    inits = [_init("w", w), _init("sqrt2", np.array(2 ** 0.5, np.float32)), _init("one", np.array(1, np.float32)),
             _init("half", np.array(0.5, np.float32))]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    g = import_model(m)
    assert [n.op for n in g.nodes] == ["Conv", "Gelu"]
    assert g.nodes[0].attr("act") == ("SiLU", ())
    x = RNG.standard_normal((1, 4, 5, 5)).astype(np.float32)
    ref = run_ort(m, {"x": x})[0]
    got = inferd.load(m).run({"x": x})["y"]
    assert np.abs(got - ref).max() / np.abs(ref).max() <= 1e-5


def _gelu_nodes(x: str, y: str, tag: str) -> list:
    return [helper.make_node("Div", [x, "sqrt2"], [f"{tag}d"], name=f"{tag}div"),
            helper.make_node("Erf", [f"{tag}d"], [f"{tag}e"], name=f"{tag}erf"),
            helper.make_node("Add", [f"{tag}e", "one"], [f"{tag}e1"], name=f"{tag}add1"),
            helper.make_node("Mul", [x, f"{tag}e1"], [f"{tag}m"], name=f"{tag}mulx"),
            helper.make_node("Mul", [f"{tag}m", "half"], [y], name=f"{tag}mulhalf")]


@pytest.mark.parametrize("device", ["cpu", "vulkan"])
def test_activation_and_residual_after_a_reshaped_gemm_fuse_into_it(device: str) -> None:
    """A transformer MLP as ONNX Runtime's optimiser writes it: Reshape -> Gemm -> Reshape around each Linear,
    the GELU and the residual Add (then a Relu here) after the second Reshape. They move before that Reshape
    and fuse into the Gemms; a Reshape whose output has a second consumer keeps what follows it."""
    t, d, h = 6, 8, 16
    inits = [_init("w1", (RNG.standard_normal((d, h)) * 0.4).astype(np.float32)),
             _init("b1", RNG.standard_normal(h).astype(np.float32)),
             _init("w2", (RNG.standard_normal((h, d)) * 0.4).astype(np.float32)),
             _init("b2", RNG.standard_normal(d).astype(np.float32)),
             _init("s2d", np.array([t, d], np.int64)), _init("s3d", np.array([1, t, d], np.int64)),
             _init("s2h", np.array([t, h], np.int64)), _init("s3h", np.array([1, t, h], np.int64)),
             _init("sqrt2", np.array(2 ** 0.5, np.float32)), _init("one", np.array(1, np.float32)),
             _init("half", np.array(0.5, np.float32))]
    nodes = [helper.make_node("Reshape", ["x", "s2d"], ["x2"], name="in1"),
             helper.make_node("Gemm", ["x2", "w1", "b1"], ["g1"], name="fc1"),
             helper.make_node("Reshape", ["g1", "s3h"], ["g13"], name="out1"),
             *_gelu_nodes("g13", "act", "gelu"),
             helper.make_node("Reshape", ["act", "s2h"], ["a2"], name="in2"),
             helper.make_node("Gemm", ["a2", "w2", "b2"], ["g2"], name="fc2"),
             helper.make_node("Reshape", ["g2", "s3d"], ["g23"], name="out2"),
             helper.make_node("Add", ["g23", "x"], ["res"], name="residual"),
             helper.make_node("Relu", ["res"], ["y"], name="relu"),
             # the same Linear again, its reshaped output read twice: the Relu stays a node of its own
             helper.make_node("Gemm", ["x2", "w1", "b1"], ["g3"], name="fc3"),
             helper.make_node("Reshape", ["g3", "s3h"], ["g33"], name="out3"),
             helper.make_node("Relu", ["g33"], ["z"], name="relu3"),
             helper.make_node("Neg", ["g33"], ["zn"], name="neg3")]
    io = lambda n, shp: helper.make_tensor_value_info(n, TensorProto.FLOAT, shp)  # noqa: E731
    m = _model(nodes, [io("x", [1, t, d])], [io("y", None), io("z", None), io("zn", None)], inits)
    g = import_model(m)
    ops = [n.op for n in g.nodes]
    assert "Gelu" not in ops and "Add" not in ops and ops.count("Relu") == 1, ops
    fc1, fc2 = (next(n for n in g.nodes if n.name == k) for k in ("fc1", "fc2"))
    assert fc1.attr("act") == ("Gelu", (0.0,))
    assert fc2.attr("residual") is True and fc2.attr("act") == ("Relu", ())
    assert next(n for n in g.nodes if n.name == "fc3").attr("act") is None
    if device == "vulkan":
        from inferd import vulkan

        if not vulkan.available():
            pytest.skip("needs a Vulkan device (lavapipe)")
    x = RNG.standard_normal((1, t, d)).astype(np.float32)
    ref = run_ort(m, {"x": x})
    got = inferd.load(m, device=device).run({"x": x})
    for name, r in zip(("y", "z", "zn"), ref):
        assert got[name].shape == r.shape
        np.testing.assert_allclose(got[name], r, rtol=1e-5, atol=1e-5 * np.abs(r).max(), err_msg=name)


@pytest.mark.parametrize("scale", [0.125, 0.3])
def test_attention_scale_moves_onto_the_smaller_matmul_operand(scale: float) -> None:
    """(q @ k^T) * s -> (q * s) @ k^T when q is the smaller operand: same numbers (exactly for a power of two),
    fewer multiplies; a Mul whose MatMul has another consumer, or has a constant operand, stays put."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="kt"),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
             helper.make_node("Mul", ["s", "scale"], ["y"], name="mul"),
             helper.make_node("MatMul", ["q", "w"], ["p"], name="proj"),
             helper.make_node("Mul", ["p", "scale"], ["z"], name="mul_const"),
             helper.make_node("MatMul", ["q", "kt"], ["s2"], name="qk2"),
             helper.make_node("Mul", ["s2", "scale"], ["u"], name="mul_shared")]
    inits = [_init("scale", np.array(scale, np.float32)), _init("w", RNG.standard_normal((16, 8)).astype(np.float32))]
    io = lambda n, shp: helper.make_tensor_value_info(n, TensorProto.FLOAT, shp)  # noqa: E731
    m = _model(nodes, [io("q", [2, 40, 16]), io("k", [2, 40, 16])],
               [io("y", None), io("z", None), io("u", None), io("s2", None)], inits)
    g = import_model(m)
    mul = next(n for n in g.nodes if n.name == "mul")
    qk = next(n for n in g.nodes if n.name == "qk")
    assert mul.inputs[0] == "q" and qk.inputs == [mul.outputs[0], "kt"] and qk.outputs == ["y"]
    assert g.nodes.index(mul) < g.nodes.index(qk)
    for name in ("mul_const", "mul_shared"):  # MatMul with a constant operand / output also a graph output
        node = next(n for n in g.nodes if n.name == name)
        assert node.inputs[1] == "scale" and node.inputs[0] in ("p", "s2"), name
    q = RNG.standard_normal((2, 40, 16)).astype(np.float32)
    k = RNG.standard_normal((2, 40, 16)).astype(np.float32)
    ref = run_ort(m, {"q": q, "k": k})
    got = inferd.load(m).run({"q": q, "k": k})
    for name, r in zip(("y", "z", "u", "s2"), ref):
        np.testing.assert_allclose(got[name], r, rtol=1e-5, atol=1e-5, err_msg=name)
    if scale == 0.125:  # "u" is the same product scaled after the MatMul, by the same kernels
        np.testing.assert_array_equal(got["y"], got["u"])


def test_truncated_and_random_onnx_files_raise_model_format_error(tmp_path):
    good = conv_bn_relu_add_model().SerializeToString()
    trunc = tmp_path / "trunc.onnx"
    trunc.write_bytes(good[: len(good) // 2])
    rnd = tmp_path / "random.onnx"
    rnd.write_bytes(np.random.default_rng(1).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    for p in (trunc, rnd, empty):
        with pytest.raises(ModelFormatError) as ei:
            inferd.load(p)
        assert str(p) in str(ei.value) or "ONNX" in str(ei.value)
    with pytest.raises(ModelFormatError, match="does not exist"):
        inferd.load(tmp_path / "nope.onnx")


def test_unsupported_op_names_op_node_and_opset():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="ok"),
             helper.make_node("TfIdfVectorizer", ["r"], ["y"], name="the_nms_node")]  # string processing: out of scope
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
               [helper.make_tensor_value_info("y", TensorProto.INT64, None)], [], opset=13)
    with pytest.raises(UnsupportedOpError) as ei:
        import_model(m)
    msg = str(ei.value)
    assert "TfIdfVectorizer" in msg and "the_nms_node" in msg and "13" in msg


@pytest.mark.parametrize("op, opset, since, inputs", [
    ("Gelu", 17, 20, ["x"]),  # a newer op in a model that declares an older opset
    ("CenterCropPad", 17, 18, ["x", "shape"]),
])
def test_an_op_newer_than_the_declared_opset_is_refused_by_name(op: str, opset: int, since: int, inputs: list) -> None:
    inits = [numpy_helper.from_array(np.array([2], np.int64), "shape")] if "shape" in inputs else []
    m = _model([helper.make_node(op, inputs, ["y"], name="late")],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits, opset=opset)
    with pytest.raises(ModelFormatError) as ei:
        import_model(m)
    msg = str(ei.value)
    assert op in msg and "'late'" in msg and f"opset {opset}" in msg and f"opset {since}" in msg
    # the same node at the opset that has it imports (and runs)
    m.opset_import[0].version = since
    x = np.array([1.0, -1.0], np.float32)
    got = inferd.load(m.SerializeToString(), device="cpu").run({"x": x})["y"]
    np.testing.assert_allclose(got, run_ort(m, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_custom_domain_is_unsupported():
    node = helper.make_node("Foo", ["x"], ["y"], name="foo", domain="com.example")
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedOpError, match="com.example"):
        import_model(m)


def test_dynamic_dims_are_kept_and_specialised_per_shape():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "C"])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [])
    t = import_template(m)
    assert t.dynamic and t.dims == {"x": ("N", "C")}
    assert t.inputs[0].shape == (1, 224)  # batch at ``batch``, the other dimension at the probe
    g = import_model(m, shapes={"x": (2, 5)})
    assert g.outputs[0].shape == (2, 5) and g.dims == {"x": ("N", "C")}
    assert specialize(t, {"x": (3, 7)}).outputs[0].shape == (3, 7)
    with pytest.raises(ShapeError, match=r"expects shape \[N, C\], got \[3\]: rank 1"):
        specialize(t, {"x": (3,)})
    assert specialize(t, {"x": (3, 0)}).outputs[0].shape == (3, 0)  # the engine runs empty tensors asked for
    with pytest.raises(ShapeError, match="dimension 1 is 0"):
        check_dims("x", t.dims["x"], (3, 0))  # a request is refused them
    with pytest.raises(ShapeError, match="has rank 1"):
        import_model(m, shapes={"x": (2,)})


def test_shape_computations_stay_nodes_in_the_template_and_fold_per_shape():
    """torch's ``x.reshape(x.shape[0], -1)``: Shape -> Gather -> Concat -> Reshape. At each shape the chain
    folds to that shape's constant; the template keeps it as nodes, never a constant of the probe."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
             helper.make_node("Concat", ["n1", "m1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "i0"), numpy_helper.from_array(np.array([0], np.int64), "ax"),
             numpy_helper.from_array(np.array([-1], np.int64), "m1")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    t = import_template(m)
    assert [n.op for n in t.nodes] == ["Shape", "Gather", "Unsqueeze", "Concat", "Reshape"]
    assert "shape" not in t.constants
    for shape in [(1, 3, 4, 5), (2, 3, 8, 1)]:
        g = specialize(t, {"x": shape})
        assert [n.op for n in g.nodes] == ["Reshape"]
        assert g.outputs[0].shape == (shape[0], 3 * shape[2] * shape[3])
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        y = inferd.runtime.cpu.CpuExecutor(g).run({"x": x})["y"]
        np.testing.assert_array_equal(y, x.reshape(shape[0], -1))
    # a model without dynamic dimensions folds the chain at import and is its own specialisation
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    for k in (2, 3):
        m.graph.input[0].type.tensor_type.shape.dim[k].dim_value = 4
    st = import_template(m)
    assert not st.dynamic and [n.op for n in st.nodes] == ["Reshape"] and specialize(st) is st


def test_wrong_input_name_shape_dtype_raise_input_error():
    model = inferd.load(conv_bn_relu_add_model())
    x = np.zeros((1, 3, 9, 11), np.float32)
    with pytest.raises(InputError, match=r"unknown input name.*'z'.*expected \['x'\]"):
        model.run({"z": x})
    with pytest.raises(InputError, match=r"missing input"):
        model.run({})
    with pytest.raises(InputError, match=r"expects shape \[N, 3, 9, 11\], got \[1, 3, 9, 12\]: dimension 3 must be 11"):
        model.run({"x": np.zeros((1, 3, 9, 12), np.float32)})
    with pytest.raises(InputError, match=r"expects dtype float32, got float64"):
        model.run({"x": x.astype(np.float64)})
    # the model still works after rejected inputs: nothing was lost
    assert model.run({"x": x})["y"].shape == (1, 792)


def test_forcing_an_inapplicable_kernel_by_node_name_fails_clearly():
    from inferd.errors import KernelError

    with pytest.raises(KernelError, match="convskip"):
        inferd.load(conv_bn_relu_add_model(), kernels={"convskip": "winograd23"})
    with pytest.raises(KernelError, match="no cpu kernel named 'nosuch'"):
        inferd.load(conv_bn_relu_add_model(), kernels={"Conv": "nosuch"})
