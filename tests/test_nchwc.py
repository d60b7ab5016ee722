"""Channel-blocked (NCHW16c) convs, pools and conversions (native/nchwc.c, ops/conv_nchwc.py) and the CPU
backend's layout plan (planner/layout.py): each native kernel against its numpy oracle (Conv's and MaxPool's,
through the layout conversions) on 1 and 2 threads; the plan's rewrite of zoo models against onnxruntime; the
C itself on aarch64 under qemu and with sanitizers."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import inferd
from inferd import native
from inferd.ir import Node
from inferd.ops.base import run_layer, single_node_layer
from inferd.ops.conv_nchwc import (CONV, FROM, GAP, MAXPOOL, SCALE, TO, ConvNchwcKernel, MaxPoolNchwcKernel,
                                   ReorderNchwc, SqueezeExciteNchwc, _group_dense, _group_sparse, _unpack_weights,
                                   block_groups, from_blocked, pack_weights, padded_nbytes, to_blocked)
from inferd.planner.layout import SUFFIX, apply_layout, blocked_graph, plan_layout

from native_harness import AARCH64_CC, AARCH64_FLAGS, FULL_OPT, QEMU, build_and_run, needs_aarch64

needs_native = pytest.mark.skipif(not native.has("inferd_nchwc_conv"), reason="needs the native extension")


@pytest.fixture(params=[1, 2, 3], ids=["1thread", "2threads", "3threads"])
def threads(request: pytest.FixtureRequest) -> Any:
    before = native.num_threads()
    native.set_num_threads(request.param)
    yield request.param
    native.set_num_threads(before)


def _conv_case(seed: int, n: int, cin: int, cout: int, hw: tuple[int, int], k: tuple[int, int], s: int,
               pads: list[int], group: int, act: Any, residual: bool,
               nchw_input: bool = False, dilations: tuple[int, int] = (1, 1)
               ) -> tuple[Node, list[np.ndarray | None], np.ndarray]:
    """A blocked conv layer's inputs (``nchw_input``: x left NCHW, as a stem reads it) and the plain Conv
    oracle's output (bias, residual, act fused)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, cin) + hw).astype(np.float32)
    w = (rng.standard_normal((cout, cin // group) + k) * 0.2).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    attrs: dict[str, Any] = {"kernel_shape": list(k), "strides": [s, s], "pads": pads, "group": group}
    if dilations != (1, 1):
        attrs["dilations"] = list(dilations)
    if act is not None:
        attrs["act"] = act
    plain = single_node_layer("Conv", [x, w, b], attrs)
    y = plain.outputs[0].shape
    res = rng.standard_normal(y).astype(np.float32) if residual else None
    if residual:
        attrs["residual"] = True
    from inferd.ops.base import op_spec

    conv = op_spec("Conv")
    assert conv is not None
    node = Node("c", "Conv", ["x", "w", "b"] + (["r"] if residual else []), ["y"], attrs)
    ref = conv.reference(node, [x, w, b] + ([res] if residual else []))[0]
    blocked = [x if nchw_input else to_blocked(x), w, b] + ([to_blocked(res)] if res is not None else [])
    return node, blocked, ref


CONV_CASES = [
    # (n, cin, cout, hw, k, stride, pads, group, act, residual)
    (1, 16, 16, (5, 7), (3, 3), 1, [1, 1, 1, 1], 1, None, False),
    (1, 32, 80, (9, 13), (3, 3), 2, [1, 1, 1, 1], 1, ("Relu", ()), True),  # 5 output blocks: a group of 1
    (1, 64, 48, (11, 11), (1, 1), 1, [0, 0, 0, 0], 1, ("Relu", ()), False),  # pointwise: one row of all pixels
    (2, 16, 64, (13, 6), (5, 5), 1, [2, 2, 2, 2], 1, ("Clip", (0.0, 6.0)), True),  # two images
    (1, 48, 32, (7, 7), (7, 7), 2, [3, 3, 3, 3], 1, ("Sigmoid", ()), False),  # an activation applied after
    (1, 16, 16, (3, 3), (3, 3), 1, [0, 0, 0, 0], 1, None, True),  # no padding: every column inside
    (1, 32, 32, (30, 29), (3, 3), 1, [1, 2, 1, 0], 1, ("LeakyRelu", (0.1,)), False),  # uneven pads, 12-wide tiles
    # a narrow map (edge columns 1/32 of the row or more), or a wide one strided with enough output channels x taps,
    # is copied with its padding and runs across its rows; the other wide ones run row by row, their edge columns
    # clipped one pixel at a time
    (1, 16, 128, (5, 40), (3, 3), 2, [1, 1, 1, 1], 1, ("Relu", ()), True),
    (1, 16, 16, (3, 40), (3, 3), 1, [1, 1, 1, 1], 1, ("Relu", ()), True),
    (1, 16, 16, (4, 70), (5, 5), 2, [2, 2, 2, 1], 1, None, False),
    (1, 16, 32, (3, 80), (3, 3), 1, [1, 1, 1, 1], 1, ("Relu", ()), True),  # edge columns under 1/32: clipped in place
    # a strided 1x1 runs as a copy of its pixels and the pointwise tiles; with end padding, its last output row and
    # column read past the map (zeros)
    (1, 32, 48, (9, 11), (1, 1), 2, [0, 0, 0, 0], 1, ("Relu", ()), True),
    (1, 16, 32, (10, 10), (1, 1), 2, [0, 0, 1, 1], 1, None, False),
    (1, 32, 32, (12, 12), (3, 3), 1, [1, 1, 1, 1], 32, ("Relu", ()), True),  # depthwise
    (1, 48, 48, (15, 14), (5, 5), 2, [2, 2, 2, 2], 48, None, False),  # depthwise, stride 2
    (1, 16, 16, (1, 1), (3, 3), 1, [1, 1, 1, 1], 16, None, False),  # depthwise on a 1x1 map
    # pointwise, through the ISA's pointwise tiles where it has them: input channels in two passes (10 blocks), a
    # group of 4 output blocks and one of 1, no activation, residual
    (1, 160, 80, (7, 9), (1, 1), 1, [0, 0, 0, 0], 1, None, True),
    # weights outweigh the input, groups that do not divide among the threads (3 and 5 groups of 4 blocks): the
    # pointwise map is split in column bands too, each band reading its groups' weights again
    (1, 320, 144, (7, 7), (1, 1), 1, [0, 0, 0, 0], 1, ("Clip", (0.0, 6.0)), True),
    (1, 96, 320, (5, 5), (1, 1), 1, [0, 0, 0, 0], 1, None, False),
    # ... split by the tiles' blocks, not the weights' groups: 12 blocks in 3 groups, a 3x3; 5 blocks, pointwise
    (1, 48, 192, (6, 6), (3, 3), 1, [1, 1, 1, 1], 1, ("Relu", ()), True),
    (1, 256, 80, (3, 3), (1, 1), 1, [0, 0, 0, 0], 1, None, False),
    # ... and the map in column bands whose input (1.2 MB of it) stays within half a core's L2 (up to 2 MB of L2)
    (1, 1536, 208, (14, 14), (1, 1), 1, [0, 0, 0, 0], 1, ("Relu", ()), True),
    (1, 32, 32, (5, 5), (1, 1), 1, [0, 0, 0, 0], 1, ("Clip", (0.0, 6.0)), True),  # 2 blocks: 12-wide tiles and 1 left
    (1, 48, 48, (13, 13), (1, 1), 1, [0, 0, 0, 0], 1, ("LeakyRelu", (0.1,)), False),  # 3 blocks, act after the store
    (1, 256, 16, (4, 5), (1, 1), 1, [0, 0, 0, 0], 1, ("Sigmoid", ()), True),  # a costly act after two passes
    # channels not a multiple of 16: the last block padded (mobilenetv2's 24, efficientnet_b0's 40)
    (1, 24, 144, (6, 21), (1, 1), 1, [0, 0, 0, 0], 1, ("Clip", (0.0, 6.0)), False),  # padded input lanes
    (1, 144, 24, (7, 9), (1, 1), 1, [0, 0, 0, 0], 1, None, True),  # padded output lanes, a padded residual
    # a last output block of 8 or fewer channels: its half-block tiles (AVX2) over 12 pixels and the others at
    # the row's end; with a costly activation, and with the input channels in two passes
    (1, 96, 24, (6, 20), (1, 1), 1, [0, 0, 0, 0], 1, ("Sigmoid", ()), False),
    (1, 1024, 40, (5, 7), (1, 1), 1, [0, 0, 0, 0], 1, ("Clip", (0.0, 6.0)), True),
    (1, 64, 4, (9, 9), (1, 1), 1, [0, 0, 0, 0], 1, ("Relu", ()), False),
    (1, 40, 24, (9, 9), (3, 3), 2, [1, 1, 1, 1], 1, ("Sigmoid", ()), False),  # both, an act not zero at zero
    (1, 24, 24, (7, 37), (3, 3), 1, [1, 1, 1, 1], 24, ("Relu", ()), True),  # depthwise, padded
    (1, 40, 40, (9, 8), (5, 5), 2, [2, 2, 2, 2], 40, None, False),
    # depthwise 5x5 stride 1 (efficientnet's): its own unrolled taps inside the row, the general ones at its ends
    (1, 48, 48, (11, 13), (5, 5), 1, [2, 2, 2, 2], 48, ("Sigmoid", ()), True),
    # ... on a narrow map each task first copies its block's map with the padding (uneven here); a map too large
    # for that copy keeps its edge columns clipped
    (1, 32, 32, (7, 7), (5, 5), 1, [2, 1, 2, 2], 32, ("Relu", ()), True),
    (1, 32, 32, (24, 30), (5, 5), 1, [2, 2, 2, 2], 32, None, False),
]


def _check_blocked_conv(node: Node, vals: list[np.ndarray | None], ref: np.ndarray) -> None:
    layer = single_node_layer(CONV, vals, dict(node.attrs), const=[False, True, True] + [False] * (len(vals) - 3))
    k = ConvNchwcKernel()
    assert k.applies(layer)
    bound = run_layer(k, layer, vals, bound=True)[0]
    assert bound.shape[1] == -(-ref.shape[1] // 16)
    np.testing.assert_allclose(from_blocked(bound, ref.shape[1]), ref, rtol=1e-4, atol=1e-4)
    # the op's own oracle (unblock, Conv's oracle, block) agrees, and the kernel's fallback path is that oracle
    from inferd.ops.base import op_spec

    spec = op_spec(CONV)
    assert spec is not None
    np.testing.assert_allclose(spec.reference(layer.node, vals)[0], to_blocked(ref), rtol=1e-5, atol=1e-5)


@needs_native
@pytest.mark.parametrize("case", CONV_CASES, ids=[f"c{i}" for i in range(len(CONV_CASES))])
def test_blocked_conv_matches_the_conv_oracle(case: tuple, threads: int) -> None:
    _check_blocked_conv(*_conv_case(7, *case))


STEM_CASES = [
    # (n, cin, cout, hw, k, stride, pads, group, act, residual): an NCHW input of few channels, a blocked output
    (1, 3, 64, (23, 29), (7, 7), 2, [3, 3, 3, 3], 1, ("Relu", ()), False),  # resnet's stem
    (2, 3, 32, (15, 16), (3, 3), 2, [1, 1, 1, 1], 1, ("Clip", (0.0, 6.0)), True),  # mobilenet's, two images
    (1, 1, 16, (9, 7), (5, 5), 1, [2, 2, 2, 2], 1, None, False),
    (1, 4, 80, (17, 19), (3, 3), 1, [0, 1, 0, 1], 1, ("LeakyRelu", (0.1,)), True),  # 4 + 1 blocks, uneven pads
    (1, 3, 24, (15, 16), (3, 3), 2, [1, 1, 1, 1], 1, ("Clip", (0.0, 6.0)), False),  # a padded output block
    # 12 columns inside each row: the widest tiles, which for 3x3 stems are their own (NCHWC_STEM), with the top and
    # bottom rows' taps clipped
    (1, 3, 48, (11, 26), (3, 3), 2, [1, 1, 1, 1], 1, ("Gelu", (0.0,)), True),
    (1, 2, 16, (5, 14), (3, 3), 1, [1, 1, 1, 1], 1, None, False),
    # AVX-512's 12-pixel stem tiles for one and two output blocks (12 columns inside the row), and its 7 to 11
    # pixel tiles for an NCHW input (20 columns inside: two tiles of 10)
    (1, 3, 16, (6, 14), (3, 3), 1, [1, 1, 1, 1], 1, ("Relu", ()), False),
    (1, 3, 32, (9, 27), (3, 3), 2, [1, 1, 1, 1], 1, ("Clip", (0.0, 6.0)), True),
    (1, 3, 24, (7, 22), (3, 3), 1, [1, 1, 1, 1], 1, None, False),
]


@needs_native
@pytest.mark.parametrize("case", STEM_CASES, ids=[f"s{i}" for i in range(len(STEM_CASES))])
def test_a_stem_reads_nchw_and_writes_blocked(case: tuple, threads: int) -> None:
    _check_blocked_conv(*_conv_case(11, *case, nchw_input=True))


GROUPED_CASES = [
    # (n, cin, cout, hw, k, stride, pads, group, act, residual), the groups (per, gi, go) they run as
    ((1, 104, 104, (8, 8), (3, 3), 1, [1, 1, 1, 1], 13, ("Relu", ()), False), (2, 1, 1)),  # RegNet's 8-channel
    # groups two to a block, the last block holding one
    ((1, 48, 48, (16, 16), (3, 3), 2, [1, 1, 1, 1], 6, None, True), (2, 1, 1)),
    ((1, 440, 440, (2, 2), (3, 3), 1, [1, 1, 1, 1], 55, ("Relu", ()), False), (2, 1, 1)),  # a map of 4 pixels
    ((1, 56, 56, (9, 9), (3, 3), 2, [1, 1, 1, 1], 7, ("Sigmoid", ()), False), (2, 1, 1)),  # 3.5 blocks
    ((1, 64, 128, (9, 9), (3, 3), 1, [1, 1, 1, 1], 2, ("Relu", ()), False), (1, 2, 4)),  # 2 in, 4 out per group
    ((1, 96, 96, (5, 5), (3, 3), 1, [1, 1, 1, 1], 3, None, True), (1, 2, 2)),
    ((1, 64, 64, (10, 10), (1, 1), 1, [0, 0, 0, 0], 16, ("Clip", (0.0, 6.0)), False), (4, 1, 1)),  # pointwise
    ((1, 128, 64, (6, 7), (1, 1), 2, [0, 0, 0, 0], 4, None, True), (1, 2, 1)),  # strided 1x1, 32 -> 16 per group
    ((2, 32, 32, (7, 6), (5, 5), 1, [2, 2, 2, 2], 8, ("LeakyRelu", (0.1,)), False), (4, 1, 1)),  # 4 channels
]


@needs_native
@pytest.mark.parametrize("case,expect", GROUPED_CASES, ids=[f"g{i}" for i in range(len(GROUPED_CASES))])
def test_a_grouped_conv_runs_blocked_as_sets_of_groups_that_fill_blocks(case: tuple, expect: tuple,
                                                                        threads: int) -> None:
    node, vals, ref = _conv_case(13, *case)
    assert block_groups(node, vals[1].shape) == expect
    layer = single_node_layer(CONV, vals, dict(node.attrs), const=[False, True, True] + [False] * (len(vals) - 3))
    k = ConvNchwcKernel()
    params = k.transform(layer, {"in1": vals[1], "in2": vals[2]})
    assert params["w"].size * 4 == padded_nbytes(vals[1].shape, False, False, expect)
    out = [np.empty(layer.outputs[0].shape, np.float32)]
    assert k.bind(layer, [vals[0], None, None] + vals[3:], params, out) is not None  # the native kernel, no oracle
    _check_blocked_conv(node, vals, ref)


def test_grouped_weights_spread_and_gather_back() -> None:
    rng = np.random.default_rng(3)
    for cout, cin_g, g, per in ((104, 8, 13, 2), (128, 32, 2, 1), (64, 4, 16, 4), (56, 8, 7, 2)):
        w = rng.standard_normal((cout, cin_g, 3, 3)).astype(np.float32)
        dense = _group_dense(w, g, per)
        assert dense.shape[1] == per * cin_g and dense.shape[0] >= cout
        np.testing.assert_array_equal(_group_sparse(dense, g, per, cout), w)
        # a group's output channels read its own input channels of the set, zeros elsewhere
        assert np.count_nonzero(dense) == np.count_nonzero(w)
    # groups that fill no whole blocks within MAX_GROUP_WASTE stay off the blocked kernel
    for cout, cin_g, g in ((48, 8, 3), (60, 12, 5), (96, 3, 32), (32, 32, 1), (32, 1, 32)):
        assert block_groups(Node("c", "Conv", [], [], {"group": g}), (cout, cin_g, 3, 3)) is None


def test_weights_pack_and_unpack_round_trip() -> None:
    rng = np.random.default_rng(0)
    for shape, dw, nchw in (((80, 32, 3, 3), False, False), ((16, 48, 1, 1), False, False),
                            ((48, 1, 5, 5), True, False), ((80, 3, 7, 7), False, True),
                            ((24, 40, 3, 3), False, False), ((40, 1, 3, 3), True, False), ((24, 3, 3, 3), False, True)):
        w = rng.standard_normal(shape).astype(np.float32)
        p = pack_weights(w, dw, nchw)
        assert p.size * 4 == padded_nbytes(shape, dw, nchw) >= w.size * 4 and p.ctypes.data % 64 == 0
        np.testing.assert_array_equal(_unpack_weights(p, shape, dw, nchw), w)
        # the padding lanes' weights are zero: all of the packed weights' sum is the raw ones'
        assert np.isclose(p.sum(dtype=np.float64), w.sum(dtype=np.float64))


@needs_native
@pytest.mark.parametrize("shape", [(1, 32, 9, 7), (2, 16, 4, 4), (1, 64, 56, 56), (1, 16, 1, 1), (1, 24, 9, 7),
                                   (2, 40, 5, 7), (1, 3, 4, 4), (2, 100, 17, 3)])
def test_layout_conversions_round_trip(shape: tuple[int, ...], threads: int) -> None:
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    k = ReorderNchwc()
    to = single_node_layer(TO, [x], {}, const=[False])
    b = run_layer(k, to, [x], bound=True)[0]
    np.testing.assert_array_equal(b, to_blocked(x))  # (the padding lanes of a last partial block zero)
    back = single_node_layer(FROM, [b], {"channels": shape[1]}, const=[False])
    assert back.outputs[0].shape == shape
    np.testing.assert_array_equal(run_layer(k, back, [b], bound=True)[0], x)


@needs_native
@pytest.mark.parametrize("n,c,hw,s_batch", [(1, 32, (7, 9), 1), (2, 40, (5, 5), 2), (2, 24, (13, 3), 1),
                                            (1, 16, (1, 2), 1)])
def test_squeeze_excitation_passes_match_the_oracle(n: int, c: int, hw: tuple[int, int], s_batch: int,
                                                    threads: int) -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((n, c) + hw).astype(np.float32)
    sc = rng.standard_normal((s_batch, c, 1, 1)).astype(np.float32)
    k = SqueezeExciteNchwc()
    gap = single_node_layer(GAP, [to_blocked(x)], {"channels": c}, const=[False])
    assert k.applies(gap) and gap.outputs[0].shape == (n, c, 1, 1)
    np.testing.assert_allclose(run_layer(k, gap, [to_blocked(x)], bound=True)[0],
                               x.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)
    scale = single_node_layer(SCALE, [to_blocked(x), sc], {}, const=[False, False])
    got = run_layer(k, scale, [to_blocked(x), sc], bound=True)[0]
    np.testing.assert_array_equal(from_blocked(got, c), x * sc)
    assert not got[:, -1, :, :, c % 16 or 16:].any()  # (the padding lanes zero)


def test_a_scale_of_the_wrong_shape_is_refused() -> None:
    x = np.ones((1, 2, 4, 4, 16), np.float32)
    with pytest.raises(Exception, match="scale per channel"):
        single_node_layer(SCALE, [x, np.ones((1, 40, 2, 1), np.float32)], {}, const=[False, False])
    with pytest.raises(Exception, match="scale per channel"):
        single_node_layer(SCALE, [x, np.ones((1, 48, 1, 1), np.float32)], {}, const=[False, False])


def _se_model(tmp_path: Path, scale_first: bool, channels: int = 88) -> Path:
    """conv -> depthwise conv -> squeeze-excitation (pool, 1x1 convs, sigmoid, Mul) -> conv, as torchvision's
    efficientnet writes it; ``scale_first``: the Mul's scale is its first input."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    c = channels
    rng = np.random.default_rng(8)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32), n) for n, s in (
        ("w0", (c, 32, 1, 1)), ("wd", (c, 1, 3, 3)), ("f1", (8, c, 1, 1)), ("f2", (c, 8, 1, 1)),
        ("w3", (32, c, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("Conv", ["ar", "wd"], ["d"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=c),
             helper.make_node("Relu", ["d"], ["dr"]),
             helper.make_node("GlobalAveragePool", ["dr"], ["g"]),
             helper.make_node("Conv", ["g", "f1"], ["g1"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["g1"], ["g1r"]),
             helper.make_node("Conv", ["g1r", "f2"], ["g2"], kernel_shape=[1, 1]),
             helper.make_node("Sigmoid", ["g2"], ["s"]),
             helper.make_node("Mul", ["s", "dr"] if scale_first else ["dr", "s"], ["m"]),
             helper.make_node("Conv", ["m", "w3"], ["y"], kernel_shape=[1, 1])]
    g = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 28, 28])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 28, 28])], inits)
    path = tmp_path / "se.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@needs_native
@pytest.mark.parametrize("scale_first", [True, False])
def test_a_squeeze_excitation_runs_blocked_between_its_convs(scale_first: bool, tmp_path: Path) -> None:
    # efficientnet's blocks: the depthwise conv's output goes to the pool and to the Mul; both blocked, the
    # depthwise conv and the convs around it are blocked too, with no conversion between them (88 channels: the
    # last block padded)
    ort = pytest.importorskip("onnxruntime")
    from inferd.frontend import import_template, specialize

    path = _se_model(tmp_path, scale_first)
    graph = specialize(import_template(str(path)))
    plan = plan_layout(graph)
    assert sorted(plan.kinds) == ["conv", "conv", "conv", "gap", "scale"], plan
    g2 = apply_layout(graph, plan)
    assert {GAP, SCALE} <= {n.op for n in g2.nodes}
    assert sum(n.op == TO for n in g2.nodes) == 1 and sum(n.op == FROM for n in g2.nodes) == 1
    x = np.random.default_rng(9).standard_normal((1, 32, 28, 28)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with inferd.load(str(path), device="cpu") as m:
        assert {"nchwc_se", "nchwc"} <= set(m.kernels.values())
        np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)

@needs_native
def test_padding_lanes_of_no_meaning_do_not_reach_the_next_conv(threads: int) -> None:
    # a conv whose activation is not zero at zero (sigmoid) leaves 0.5 in its padding lanes; the next conv reads
    # them with zero weights, so what comes out is the plain convs' result
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 40, 9, 9)).astype(np.float32)
    w1 = (rng.standard_normal((24, 40, 3, 3)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((32, 24, 1, 1)) * 0.2).astype(np.float32)
    a1 = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "act": ("Sigmoid", ())}
    k = ConvNchwcKernel()
    l1 = single_node_layer(CONV, [to_blocked(x), w1], a1, const=[False, True])
    y1 = run_layer(k, l1, [to_blocked(x), w1], bound=True)[0]
    assert y1.shape == (1, 2, 9, 9, 16) and np.allclose(y1[:, 1, :, :, 8:], 0.5)
    l2 = single_node_layer(CONV, [y1, w2], {"kernel_shape": [1, 1]}, const=[False, True])
    y2 = from_blocked(run_layer(k, l2, [y1, w2], bound=True)[0])
    from inferd.ops.base import op_spec

    conv = op_spec("Conv")
    assert conv is not None
    p1 = conv.reference(Node("a", "Conv", ["x", "w"], ["y"], a1), [x, w1])[0]
    want = conv.reference(Node("b", "Conv", ["x", "w"], ["y"], {"kernel_shape": [1, 1]}), [p1, w2])[0]
    np.testing.assert_allclose(y2, want, rtol=1e-4, atol=1e-5)


@needs_native
@pytest.mark.parametrize("cin,cout,hw", [(24, 144, (7, 9)), (40, 24, (5, 5)), (8, 16, (3, 40)), (17, 32, (6, 6))])
def test_a_pointwise_conv_reads_only_the_real_channels_of_a_partial_last_block(cin: int, cout: int,
                                                                                hw: tuple[int, int],
                                                                                threads: int) -> None:
    # the pointwise tiles skip the padding lanes of the input's last block (MobileNetV2's 24 channels: a quarter of
    # the FMAs): what those lanes hold, even NaN, does not reach the output
    rng = np.random.default_rng(cin)
    x = rng.standard_normal((1, cin) + hw).astype(np.float32)
    w = (rng.standard_normal((cout, cin, 1, 1)) * 0.2).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    xb = to_blocked(x)
    xb[:, -1, :, :, cin % 16:] = np.nan
    layer = single_node_layer(CONV, [xb, w, b], {"kernel_shape": [1, 1], "act": ("Relu", ())},
                              const=[False, True, True])
    y = from_blocked(run_layer(ConvNchwcKernel(), layer, [xb, w, b], bound=True)[0], cout)
    want = np.maximum(np.einsum("oc,nchw->nohw", w[:, :, 0, 0], x) + b[None, :, None, None], 0)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


@needs_native
@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2]},  # squeezenet's ceil-less pools
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [1, 0, 0, 2]},
])
def test_blocked_maxpool_matches_the_oracle(attrs: dict[str, Any], threads: int) -> None:
    x = np.random.default_rng(2).standard_normal((1, 32, 13, 11)).astype(np.float32)
    xb = to_blocked(x)
    layer = single_node_layer(MAXPOOL, [xb], attrs, const=[False])
    got = run_layer(MaxPoolNchwcKernel(), layer, [xb], bound=True)[0]
    plain = single_node_layer("MaxPool", [x], attrs, const=[False])
    from inferd.ops.base import op_spec

    spec = op_spec("MaxPool")
    assert spec is not None and plain.outputs[0].shape == from_blocked(got).shape
    np.testing.assert_array_equal(from_blocked(got), spec.reference(plain.node, [x])[0])


@needs_native
@pytest.mark.parametrize("where", ["first_row", "last_row", "left_edge", "inside", "lane_15", "everywhere"])
def test_blocked_maxpool_lets_a_nan_win_its_windows(where: str, threads: int) -> None:
    """Rows without NaN take the plain max instruction, rows with one the NaN-keeping max: a NaN anywhere in a
    window must reach that window's output (and nothing else), whichever task reads it. (ONNX leaves NaN in
    MaxPool open: onnxruntime's max keeps one NaN and drops another by its position in the window, the numpy
    oracle ignores them; the blocked kernel lets a NaN win, as np.max and PyTorch's max pool do.)"""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 48, 23, 19)).astype(np.float32)
    if where == "first_row":
        x[0, 3, 0, 7] = np.nan
    elif where == "last_row":
        x[0, 20, 22, 18] = np.nan
    elif where == "left_edge":
        x[0, 33, 11, 0] = np.nan
    elif where == "inside":
        x[0, 16, 9, 9] = np.nan
        x[0, 40, 15, 4] = -np.inf
        x[0, 41, 15, 4] = np.inf
    elif where == "lane_15":
        x[0, 47, 5, 12] = np.nan
    else:
        x[rng.random(x.shape) < 0.02] = np.nan
    for stride, pad in ((2, 0), (1, 1)):
        attrs = {"kernel_shape": [3, 3], "strides": [stride, stride], "pads": [pad] * 4}
        xb = to_blocked(x)
        got = from_blocked(run_layer(MaxPoolNchwcKernel(), single_node_layer(MAXPOOL, [xb], attrs, const=[False]),
                                     [xb], bound=True)[0])
        xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf)
        win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))[:, :, ::stride, ::stride]
        want = win.max(axis=(4, 5))  # np.max: a NaN wins
        assert got.shape == want.shape and np.isnan(want).any()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(got, want)


DILATED_CASES = [
    # (n, cin, cout, hw, k, stride, pads, group, act, residual), dilations: atrous convs at stride 1 whose pads are
    # whole multiples of the dilation (DeepLab's and FCN's 3x3s with pads equal to the dilation)
    ((1, 32, 32, (8, 8), (3, 3), 1, [2, 2, 2, 2], 1, ("Relu", ()), True), (2, 2)),
    ((1, 16, 48, (8, 8), (3, 3), 1, [4, 4, 4, 4], 1, None, False), (4, 4)),  # every tap row mostly padding
    ((2, 40, 24, (9, 11), (3, 3), 1, [2, 2, 2, 2], 1, ("Sigmoid", ()), True), (2, 2)),  # partial blocks, 2 images
    ((1, 16, 16, (13, 7), (3, 3), 1, [3, 6, 3, 6], 1, ("Clip", (0.0, 6.0)), False), (3, 6)),  # unequal dilations
    ((1, 32, 16, (10, 9), (3, 3), 1, [2, 0, 4, 2], 1, None, True), (2, 2)),  # uneven pads, none on one side
    ((1, 16, 32, (5, 6), (5, 5), 1, [4, 4, 4, 4], 1, ("Relu", ()), False), (2, 2)),  # 5x5, a map smaller than a tap
    ((1, 16, 16, (33, 17), (3, 3), 1, [3, 3, 3, 3], 1, None, False), (3, 3)),  # wider runs: several tiles a row
]


@needs_native
@pytest.mark.parametrize("case,dil", DILATED_CASES, ids=[f"d{i}" for i in range(len(DILATED_CASES))])
def test_a_dilated_conv_runs_blocked_over_its_phases(case: tuple, dil: tuple[int, int], threads: int) -> None:
    node, vals, ref = _conv_case(17, *case, dilations=dil)
    layer = single_node_layer(CONV, vals, dict(node.attrs), const=[False, True, True] + [False] * (len(vals) - 3))
    k = ConvNchwcKernel()
    params = k.transform(layer, {"in1": vals[1], "in2": vals[2]})
    out = [np.empty(layer.outputs[0].shape, np.float32)]
    assert k.bind(layer, [vals[0], None, None] + vals[3:], params, out) is not None  # the native kernel, no oracle
    _check_blocked_conv(node, vals, ref)


@needs_native
def test_a_dilated_1x1_runs_as_the_plain_1x1_it_is() -> None:
    """A 1x1's dilation reads nothing else (exporters write dilations on every conv of a dilated stage): strided or
    not, it takes the blocked 1x1 tiles, not the oracle."""
    for s in (1, 2):
        node, vals, ref = _conv_case(23, 1, 16, 32, (9, 9), (1, 1), s, [0, 0, 0, 0], 1, None, False, dilations=(2, 2))
        layer = single_node_layer(CONV, vals, dict(node.attrs), const=[False, True, True])
        k = ConvNchwcKernel()
        params = k.transform(layer, {"in1": vals[1], "in2": vals[2]})
        assert k.bind(layer, [vals[0], None, None], params, [np.empty(layer.outputs[0].shape, np.float32)]) is not None
        _check_blocked_conv(node, vals, ref)


@needs_native
def test_a_dilated_conv_the_native_kernel_does_not_take_is_refused() -> None:
    """Strided, or pads that are not a multiple of the dilation: no bound call (the oracle runs it), and the C
    entry refuses such arguments rather than read out of bounds."""
    for s, pads, dil in ((2, [2, 2, 2, 2], (2, 2)), (1, [1, 1, 1, 1], (2, 2)), (1, [6, 6, 6, 6], (2, 2))):
        node, vals, _ref = _conv_case(19, 1, 16, 16, (8, 8), (3, 3), s, pads, 1, None, False, dilations=dil)
        layer = single_node_layer(CONV, vals, dict(node.attrs), const=[False, True, True])
        k = ConvNchwcKernel()
        params = k.transform(layer, {"in1": vals[1], "in2": vals[2]})
        assert k.bind(layer, [vals[0], None, None], params, [np.empty(layer.outputs[0].shape, np.float32)]) is None
    null = native.ffi.NULL
    assert native.lib.inferd_nchwc_conv_dilated(null, 16, 8, 8, null, 16, 3, 3, 2, 2, 1, 1, 6, 6, null, null, null, 0,
                                                0.0, 0.0) == -1  # a pad of 1 at dilation 2


@needs_native
def test_bad_geometry_is_refused_not_read_out_of_bounds() -> None:
    # a pad as large as the kernel would read before the row: the bound call is refused, the run takes the oracle
    x = np.ones((1, 16, 4, 4), np.float32)
    w = np.ones((16, 16, 1, 1), np.float32)
    attrs = {"kernel_shape": [1, 1], "pads": [1, 1, 1, 1]}
    layer = single_node_layer(CONV, [to_blocked(x), w], attrs, const=[False, True])
    k = ConvNchwcKernel()
    params = k.transform(layer, {"in1": w})
    out = [np.empty(layer.outputs[0].shape, np.float32)]
    assert k.bind(layer, [to_blocked(x), None], params, out) is None
    k.run(layer, [to_blocked(x), None], params, out)
    assert from_blocked(out[0])[0, 0, 0, 0] == 0.0 and from_blocked(out[0])[0, 0, 1, 1] == 16.0
    assert native.lib.inferd_nchwc_conv(native.ffi.NULL, 1, 4, 4, native.ffi.NULL, 1, 1, 1, 1, 1, 1, 1, 6, 6,
                                        native.ffi.NULL, native.ffi.NULL, native.ffi.NULL, 0, 0.0, 0.0) == -1


def test_blocked_kernels_do_not_apply_to_plain_ops() -> None:
    # another input shape's executor asks whether a donor's kernel applies to its own layer of the same name
    x = np.ones((1, 16, 4, 4), np.float32)
    plain = single_node_layer("Conv", [x, np.ones((16, 16, 1, 1), np.float32)], {"kernel_shape": [1, 1]})
    assert not ConvNchwcKernel().applies(plain)
    assert not MaxPoolNchwcKernel().applies(single_node_layer("MaxPool", [x], {"kernel_shape": [2, 2]},
                                                              const=[False]))


# --------------------------------------------------------------------------- the layout plan on models


def _zoo(name: str, tmp: Path) -> str:
    from inferd import zoo

    return str(zoo.write_zoo(tmp, [name])[name])


@needs_native
@pytest.mark.parametrize("name", ["squeezenet1_1", "mobilenetv2", "resnet18", "efficientnet_b0"])
def test_zoo_models_run_blocked_and_match_onnxruntime(name: str, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    path = _zoo(name, tmp_path)
    from inferd.frontend import import_template, specialize

    graph = specialize(import_template(path))
    plan = plan_layout(graph)
    g2 = apply_layout(graph, plan)
    ops = {n.op for n in g2.nodes}
    if name == "squeezenet1_1":
        # the fire modules, the concats and the pools between them; the classifier (1000 channels: a padded block)
        # and its global pool, which writes NCHW: no conversion anywhere
        assert CONV in ops and MAXPOOL in ops and GAP in ops and len(plan.blocked) >= 30
        assert sum(n.op == TO for n in g2.nodes) == 0 and sum(n.op == FROM for n in g2.nodes) == 0
    if name in ("squeezenet1_1", "resnet18", "mobilenetv2"):
        # the stem reads the image as it comes and writes blocked: no conversion into the first region
        stem = next(n.name for n in graph.nodes if n.op == "Conv")
        assert dict(zip(plan.blocked, plan.kinds)).get(stem) == "stem", plan.kinds[:3]
    if name == "mobilenetv2":
        # the 24-channel stage runs blocked in padded blocks, so the first region reaches the 28x28 stage, and the
        # 7x7 maps' 1x1s run blocked too: one region from the stem to the global pool (which writes NCHW), no
        # conversion anywhere
        for conv in ("/features/2/conv/2/Conv", "/features/3/conv/0/0/Conv", "/features/3/conv/2/Conv",
                     "/features/17/conv/2/Conv", "/features/18/0/Conv"):
            assert conv in plan.blocked, conv
        assert sum(n.op == TO for n in g2.nodes) == 0 and sum(n.op == FROM for n in g2.nodes) == 0
    if name == "resnet18":
        # each stage's first block: the strided 3x3 and the strided 1x1 downsampling beside it, one region reading
        # the input converted once (the 1x1 reads its pixels in place where the NCHW path copies them out), down
        # to stage 4's 7x7 maps
        for stage in (2, 3, 4):
            assert {f"/layer{stage}/0/conv1/Conv", f"/layer{stage}/0/downsample/0/Conv"} <= set(plan.blocked), stage
    # every blocked tensor is read only by blocked nodes; the graph's outputs stay NCHW
    for n in g2.nodes:
        for i, t in enumerate(n.inputs):
            if t.endswith(SUFFIX):
                assert n.op in (CONV, MAXPOOL, FROM, GAP, SCALE, "Concat"), (n.name, n.op)
    assert not any(t.name.endswith(SUFFIX) for t in g2.outputs)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    x = np.random.default_rng(3).standard_normal([d if isinstance(d, int) else 1 for d in inp.shape]).astype(np.float32)
    want = sess.run(None, {inp.name: x})[0]
    m = inferd.load(path, device="cpu")
    got = list(m.run({inp.name: x}).values())[0]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    kernels = set(m.kernels.values())
    assert ("nchwc" in kernels) == bool(plan.blocked)
    m.close()


def test_forced_conv_kernels_keep_the_nchw_layout(tmp_path: Path) -> None:
    path = _zoo("squeezenet1_1", tmp_path)
    from inferd.frontend import import_template, specialize

    graph = specialize(import_template(path))
    assert plan_layout(graph).blocked
    assert "conv" not in plan_layout(graph, {"Conv": "im2col"}).kinds
    first = next(n.name for n in graph.nodes if n.op == "Conv" and n.name in plan_layout(graph).blocked)
    assert first not in plan_layout(graph, {first: "im2col"}).blocked
    # the original graph is left as it was
    before = [(n.op, list(n.inputs)) for n in graph.nodes]
    blocked_graph(graph)
    assert [(n.op, list(n.inputs)) for n in graph.nodes] == before


# --------------------------------------------------------------------------- the C on other targets

C_HARNESS = r"""
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "inferd_native.h"

static int fails = 0;
static float frand(unsigned* s) { *s = *s * 1664525u + 1013904223u; return ((*s >> 8) & 0xffff) / 32768.0f - 1.0f; }

/* x NCHW [C][H][W]; reference conv (group 1 or depthwise, dilation D) with bias, relu */
static void ref_conv(const float* x, int C, int H, int W, const float* w, int CO, int K, int S, int P, int dw,
                     const float* b, float* y, int OH, int OW, int D)
{
    for (int o = 0; o < CO; ++o)
        for (int oh = 0; oh < OH; ++oh)
            for (int ow = 0; ow < OW; ++ow) {
                double acc = b[o];
                for (int c = dw ? o : 0; c < (dw ? o + 1 : C); ++c)
                    for (int kh = 0; kh < K; ++kh)
                        for (int kw = 0; kw < K; ++kw) {
                            int ih = oh * S - P + kh * D, iw = ow * S - P + kw * D;
                            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                            acc += x[(c * H + ih) * W + iw] * w[((o * (dw ? 1 : C) + (dw ? 0 : c)) * K + kh) * K + kw];
                        }
                y[(o * OH + oh) * OW + ow] = acc > 0 ? (float)acc : 0.0f;
            }
}

/* n floats of frand() * scale */
static float* rbuf(size_t n, float scale, unsigned* s)
{
    float* p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; ++i) p[i] = frand(s) * scale;
    return p;
}

static void block(const float* x, int C, int HW, float* xb)
{
    for (int c = 0; c < C; ++c)
        for (int p = 0; p < HW; ++p) xb[((c / 16) * HW + p) * 16 + c % 16] = x[c * HW + p];
}

static void check(const char* what, const float* got_b, const float* ref, int C, int HW, float tol)
{
    for (int c = 0; c < C; ++c)
        for (int p = 0; p < HW; ++p) {
            float g = got_b[((c / 16) * HW + p) * 16 + c % 16], r = ref[c * HW + p];
            if (fabsf(g - r) > tol * (1.0f + fabsf(r))) {
                printf("FAIL %s c=%d p=%d got %g want %g\n", what, c, p, g, r);
                fails++;
                return;
            }
        }
}

/* weights in groups of the ISA's tile blocks, [cin block][kh][kw][16 ci][nbg * 16 co], for COp output and CL input
   channels (multiples of 16): wt(oc, ic, tap) gives each (zero where the conv has none) */
typedef float (*wt_fn)(const void* ctx, int oc, int ic, int tap);
static void pack_tiles(float* wp, int COp, int CL, int K, wt_fn wt, const void* ctx)
{
    int at = 0, G = inferd_nchwc_group_blocks();
    for (int b0 = 0; b0 < COp / 16; b0 += G) {
        int nbg = COp / 16 - b0 < G ? COp / 16 - b0 : G;
        for (int cb = 0; cb < CL / 16; ++cb)
            for (int k = 0; k < K * K; ++k)
                for (int ci = 0; ci < 16; ++ci)
                    for (int o = 0; o < nbg * 16; ++o) wp[at++] = wt(ctx, b0 * 16 + o, cb * 16 + ci, k);
    }
}

typedef struct { const float* w; int CO, C, K; } dense_w;
static float dense_wt(const void* p, int oc, int ic, int k)
{
    const dense_w* d = p;
    return oc < d->CO && ic < d->C ? d->w[(oc * d->C + ic) * d->K * d->K + k] : 0.0f;
}

/* C and CO need not be multiples of 16: the last blocks padded (zero input lanes, zero weights and bias) */
static void conv_case(int C, int CO, int H, int W, int K, int S, int P, int dw)
{
    unsigned s = 12345u + C * 7 + K;
    int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    int Cp = (C + 15) / 16 * 16, COp = (CO + 15) / 16 * 16;
    int wn = dw ? CO * K * K : CO * C * K * K;
    float* x = rbuf((size_t)C * H * W, 1.0f, &s);
    float* w = rbuf((size_t)wn, 0.2f, &s);
    float* b = calloc((size_t)COp, sizeof(float)); /* (zero on the padding lanes) */
    for (int i = 0; i < CO; ++i) b[i] = frand(&s);
    float* xb = calloc((size_t)Cp * H * W, sizeof(float));
    float* wp = calloc((size_t)(dw ? COp * K * K : COp * Cp * K * K), sizeof(float));
    float* ref = malloc(sizeof(float) * CO * OH * OW);
    float* y = malloc(sizeof(float) * COp * OH * OW);
    block(x, C, H * W, xb);
    if (dw) {
        for (int o = 0; o < CO; ++o)
            for (int k = 0; k < K * K; ++k) wp[((o / 16) * K * K + k) * 16 + o % 16] = w[o * K * K + k];
    } else {
        dense_w d = {w, CO, C, K};
        pack_tiles(wp, COp, Cp, K, dense_wt, &d);
    }
    ref_conv(x, C, H, W, w, CO, K, S, P, dw, b, ref, OH, OW, 1);
    int rc = dw ? inferd_nchwc_dwconv(xb, Cp / 16, H, W, wp, K, K, S, S, P, P, OH, OW, b, NULL, y, 1, 0, 0)
                : inferd_nchwc_conv(xb, Cp / 16, H, W, wp, COp / 16, K, K, S, S, P, P, OH, OW, b, NULL, y, 1, 0, 0);
    if (rc != 0) { printf("FAIL rc\n"); fails++; }
    check(dw ? "dwconv" : "conv", y, ref, CO, OH * OW, 1e-4f);
    /* the conversions round trip, the padding lanes zero */
    float* back = malloc(sizeof(float) * C * H * W);
    float* xb2 = malloc(sizeof(float) * Cp * H * W);
    inferd_nchwc_reorder(x, 1, C, H * W, xb2, 1);
    inferd_nchwc_reorder(xb2, 1, C, H * W, back, 0);
    for (int i = 0; i < Cp * H * W; ++i)
        if (xb2[i] != xb[i] || (i < C * H * W && back[i] != x[i])) { printf("FAIL reorder %d\n", i); fails++; break; }
    free(x); free(xb); free(w); free(wp); free(b); free(ref); free(y); free(back); free(xb2);
}

/* a dilated conv (stride 1, pads P a multiple of D) through its phase-split copy, against the plain loops */
static void dilated_case(int C, int CO, int H, int W, int K, int D, int P)
{
    unsigned s = 777u + C * 3 + D;
    int OH = H + 2 * P - D * (K - 1), OW = W + 2 * P - D * (K - 1);
    int Cp = (C + 15) / 16 * 16, COp = (CO + 15) / 16 * 16;
    float* x = rbuf((size_t)C * H * W, 1.0f, &s);
    float* w = rbuf((size_t)CO * C * K * K, 0.2f, &s);
    float* b = calloc((size_t)COp, sizeof(float));
    for (int i = 0; i < CO; ++i) b[i] = frand(&s);
    float* xb = calloc((size_t)Cp * H * W, sizeof(float));
    float* wp = calloc((size_t)COp * Cp * K * K, sizeof(float));
    float* ref = malloc(sizeof(float) * CO * OH * OW);
    float* y = malloc(sizeof(float) * COp * OH * OW);
    block(x, C, H * W, xb);
    dense_w d = {w, CO, C, K};
    pack_tiles(wp, COp, Cp, K, dense_wt, &d);
    ref_conv(x, C, H, W, w, CO, K, 1, P, 0, b, ref, OH, OW, D);
    if (inferd_nchwc_conv_dilated(xb, C, H, W, wp, CO, K, K, D, D, P, P, OH, OW, b, NULL, y, 1, 0, 0) != 0) {
        printf("FAIL dilated rc\n");
        fails++;
    }
    check("dilated", y, ref, CO, OH * OW, 1e-4f);
    free(x); free(w); free(b); free(xb); free(wp); free(ref); free(y);
}

/* a squeeze-excitation's pool and scale on n images of C channels (padded blocks), a per-image scale */
static void se_case(int N, int C, int HW)
{
    unsigned s = 99u + C;
    int Cp = (C + 15) / 16 * 16;
    float* x = malloc(sizeof(float) * N * C * HW);
    float* xb = calloc((size_t)N * Cp * HW, sizeof(float));
    float* yb = malloc(sizeof(float) * N * Cp * HW);
    float* m = malloc(sizeof(float) * N * C);
    float* sc = malloc(sizeof(float) * N * C);
    for (int i = 0; i < N * C * HW; ++i) x[i] = frand(&s);
    for (int i = 0; i < N * C; ++i) sc[i] = frand(&s);
    for (int n = 0; n < N; ++n) block(x + n * C * HW, C, HW, xb + n * Cp * HW);
    if (inferd_nchwc_gap(xb, N, C, HW, m) != 0 || inferd_nchwc_scale(xb, N, C, HW, sc, C, yb) != 0) {
        printf("FAIL se rc\n");
        fails++;
    }
    for (int n = 0; n < N; ++n)
        for (int c = 0; c < C; ++c) {
            double acc = 0;
            for (int p = 0; p < HW; ++p) acc += x[(n * C + c) * HW + p];
            if (fabs(m[n * C + c] - acc / HW) > 1e-5 * (1 + fabs(acc / HW))) { printf("FAIL gap\n"); fails++; }
            for (int p = 0; p < HW; ++p) {
                float got = yb[((size_t)n * Cp * HW) + ((c / 16) * HW + p) * 16 + c % 16];
                if (got != x[(n * C + c) * HW + p] * sc[n * C + c]) { printf("FAIL scale\n"); fails++; c = C; break; }
            }
        }
    free(x); free(xb); free(yb); free(m); free(sc);
}

/* a 3x3 max pool (C a multiple of 16) with NaNs at every nan_every-th input (0: none): a NaN in a window wins it,
   whether its rows take the max instruction (no NaN) or the NaN-keeping max, on every ISA */
static void maxpool_case(int C, int H, int W, int S, int P, int nan_every)
{
    unsigned s = 99u + C + H;
    int OH = (H + 2 * P - 3) / S + 1, OW = (W + 2 * P - 3) / S + 1;
    float* x = rbuf((size_t)C * H * W, 1.0f, &s);
    for (int i = nan_every; nan_every && i < C * H * W; i += nan_every) x[i] = NAN;
    float* xb = malloc(sizeof(float) * C * H * W);
    float* y = malloc(sizeof(float) * C * OH * OW);
    block(x, C, H * W, xb);
    if (inferd_nchwc_maxpool(xb, C / 16, H, W, 3, 3, S, S, P, P, OH, OW, y) != 0) {
        printf("FAIL maxpool rc\n");
        fails++;
    }
    for (int c = 0; c < C; ++c)
        for (int oh = 0; oh < OH; ++oh)
            for (int ow = 0; ow < OW; ++ow) {
                float m = -INFINITY;
                int nan = 0;
                for (int kh = 0; kh < 3; ++kh)
                    for (int kw = 0; kw < 3; ++kw) {
                        int ih = oh * S - P + kh, iw = ow * S - P + kw;
                        if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                        float v = x[(c * H + ih) * W + iw];
                        nan |= v != v;
                        m = v > m ? v : m;
                    }
                float g = y[((c / 16) * OH * OW + oh * OW + ow) * 16 + c % 16];
                if (nan ? g == g : g != m) {
                    printf("FAIL maxpool c=%d oh=%d ow=%d got %g want %g\n", c, oh, ow, g, nan ? NAN : m);
                    fails++;
                    oh = OH, c = C;
                    break;
                }
            }
    free(x); free(xb); free(y);
}

/* a stem: NCHW input of C < 16 channels, blocked output; w packed [group][ci][kh][kw][nbg * 16] */
static void stem_case(int C, int CO, int H, int W, int K, int S, int P)
{
    unsigned s = 777u + C * 13 + K;
    int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    float* x = rbuf((size_t)C * H * W, 1.0f, &s);
    float* w = rbuf((size_t)CO * C * K * K, 0.2f, &s);
    float* b = rbuf((size_t)CO, 1.0f, &s);
    float* wp = malloc(sizeof(float) * CO * C * K * K);
    float* ref = malloc(sizeof(float) * CO * OH * OW);
    float* y = malloc(sizeof(float) * CO * OH * OW);
    int at = 0, G = inferd_nchwc_group_blocks();
    for (int b0 = 0; b0 < CO / 16; b0 += G) {
        int nbg = CO / 16 - b0 < G ? CO / 16 - b0 : G;
        for (int ci = 0; ci < C; ++ci)
            for (int k = 0; k < K * K; ++k)
                for (int o = 0; o < nbg * 16; ++o) wp[at++] = w[((b0 * 16 + o) * C + ci) * K * K + k];
    }
    ref_conv(x, C, H, W, w, CO, K, S, P, 0, b, ref, OH, OW, 1);
    if (inferd_nchwc_conv_nchw(x, C, H, W, wp, CO / 16, K, K, S, S, P, P, OH, OW, b, NULL, y, 1, 0, 0) != 0) {
        printf("FAIL rc\n");
        fails++;
    }
    check("stem", y, ref, CO, OH * OW, 1e-4f);
    free(x); free(w); free(wp); free(b); free(ref); free(y);
}

typedef struct { const float* w; int og, cg, per, K; } grouped_w;
/* a set's local input channel lc of output channel oc: its group's own channels, zero between the groups */
static float grouped_wt(const void* p, int oc, int lc, int k)
{
    const grouped_w* g = p;
    const int first = (oc / g->og % g->per) * g->cg;
    return lc >= first && lc < first + g->cg ? g->w[(oc * g->cg + lc - first) * g->K * g->K + k] : 0.0f;
}

/* a grouped conv of G groups run as sets of `per` groups, gi input and go output blocks each (C, CO multiples of
   16): weights dense over a set's gi * 16 input channels, zeros between its groups */
static void grouped_case(int C, int CO, int G, int per, int H, int W, int K, int S, int P)
{
    unsigned s = 4242u + C * 3 + G;
    int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    int cg = C / G, og = CO / G, gi = per * cg / 16, go = per * og / 16, CL = gi * 16;
    float* x = rbuf((size_t)C * H * W, 1.0f, &s);
    float* w = rbuf((size_t)CO * cg * K * K, 0.2f, &s);
    float* b = rbuf((size_t)CO, 1.0f, &s);
    float* xb = malloc(sizeof(float) * C * H * W);
    float* wp = calloc((size_t)CO * CL * K * K, sizeof(float));
    float* ref = malloc(sizeof(float) * CO * OH * OW);
    float* y = malloc(sizeof(float) * CO * OH * OW);
    block(x, C, H * W, xb);
    grouped_w gw = {w, og, cg, per, K};
    pack_tiles(wp, CO, CL, K, grouped_wt, &gw);
    for (int o = 0; o < CO; ++o)
        for (int oh = 0; oh < OH; ++oh)
            for (int ow = 0; ow < OW; ++ow) {
                double acc = b[o];
                for (int c = 0; c < cg; ++c)
                    for (int kh = 0; kh < K; ++kh)
                        for (int kw = 0; kw < K; ++kw) {
                            int ih = oh * S - P + kh, iw = ow * S - P + kw;
                            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                            acc += x[((o / og * cg + c) * H + ih) * W + iw] * w[((o * cg + c) * K + kh) * K + kw];
                        }
                ref[(o * OH + oh) * OW + ow] = acc > 0 ? (float)acc : 0.0f;
            }
    if (inferd_nchwc_conv_grouped(xb, C, H, W, wp, CO, K, K, S, S, P, P, OH, OW, gi, go, b, NULL, y, 1, 0, 0) != 0) {
        printf("FAIL grouped rc\n");
        fails++;
    }
    check("grouped", y, ref, CO, OH * OW, 1e-4f);
    /* blocks that do not split into the sets are refused */
    if (inferd_nchwc_conv_grouped(xb, C, H, W, wp, CO, K, K, S, S, P, P, OH, OW, gi + 1, go, b, NULL, y, 1, 0, 0) !=
        -1) {
        printf("FAIL grouped accepted a bad split\n");
        fails++;
    }
    free(x); free(xb); free(w); free(wp); free(b); free(ref); free(y);
}

int main(void)
{
    for (int t = 1; t <= 2; ++t) {
        inferd_pool_set_threads(t);
        conv_case(16, 16, 5, 7, 3, 1, 1, 0);
        conv_case(32, 80, 9, 13, 3, 2, 1, 0);
        conv_case(64, 48, 11, 11, 1, 1, 0, 0);
        conv_case(160, 80, 7, 9, 1, 1, 0, 0); /* pointwise: two passes over the input channels, 4 + 1 blocks */
        conv_case(16, 32, 30, 29, 3, 1, 1, 0);
        conv_case(16, 16, 3, 40, 3, 1, 1, 0); /* a wide row, few outputs x taps: the edge columns clipped */
        conv_case(16, 128, 5, 40, 3, 2, 1, 0); /* a wide row, strided, more: padded, in runs */
        conv_case(32, 48, 9, 11, 1, 2, 0, 0); /* a strided 1x1: its pixels copied, then the pointwise tiles */
        conv_case(48, 64, 7, 7, 7, 2, 3, 0);
        conv_case(32, 32, 12, 12, 3, 1, 1, 1);
        conv_case(48, 48, 15, 14, 5, 2, 2, 1);
        conv_case(48, 48, 9, 17, 5, 1, 2, 1); /* depthwise 5x5 stride 1: the unrolled taps */
        conv_case(24, 144, 6, 21, 1, 1, 0, 0); /* padded blocks: mobilenetv2's 24-channel stage */
        conv_case(40, 24, 9, 9, 3, 2, 1, 0);
        conv_case(24, 24, 7, 37, 3, 1, 1, 1);  /* a padded depthwise conv; a reorder of 37 x 7 pixels */
        dilated_case(32, 48, 8, 8, 3, 2, 2);   /* FCN's and DeepLab's atrous 3x3s */
        dilated_case(40, 24, 9, 11, 3, 4, 4);  /* partial blocks; most taps in the padding */
        dilated_case(16, 16, 5, 6, 5, 2, 4);
        se_case(2, 40, 37);
        se_case(1, 32, 3);
        stem_case(3, 64, 29, 31, 7, 2, 3); /* resnet's stem on a small image: 4 blocks, a row's end pixel by pixel */
        stem_case(3, 80, 13, 12, 3, 1, 1); /* 4 + 1 blocks */
        grouped_case(96, 96, 12, 2, 8, 9, 3, 1, 1);   /* RegNet's 8-channel groups, two to a block */
        grouped_case(64, 128, 2, 1, 7, 7, 3, 2, 1);   /* 2 input and 4 output blocks a group */
        grouped_case(64, 64, 16, 4, 10, 10, 1, 1, 0); /* pointwise, 4 channels a group */
        maxpool_case(64, 23, 19, 2, 0, 0);
        maxpool_case(64, 23, 19, 2, 0, 997);
        maxpool_case(32, 13, 11, 1, 1, 131);
    }
    printf("ok (%d failures)\n", fails);
    return fails != 0;
}
"""


def _harness(tmp: Path) -> Path:
    src = tmp / "nchwc_test.c"
    src.write_text(C_HARNESS)
    return src


@needs_aarch64
def test_native_nchwc_aarch64(tmp_path: Path) -> None:
    build_and_run(_harness(tmp_path), ["nchwc.c", "pool.c"], AARCH64_CC, AARCH64_FLAGS, tmp_path, QEMU, FULL_OPT,
                  300)


def test_native_nchwc_under_sanitizers(tmp_path: Path) -> None:
    from native_harness import with_sanitizers

    # as the machine runs it, and held to the AVX2 tiles (an AVX-512 machine checks those too)
    for cap in ([], ["-DINFERD_NCHWC_ISA_CAP=1"]):
        with_sanitizers(lambda flags: build_and_run(_harness(tmp_path), ["nchwc.c", "pool.c"], "cc",
                                                    ["-g", *flags, *cap], tmp_path, [], ("-O1", "-ffp-contract=fast"),
                                                    300))


@needs_native
@pytest.mark.parametrize("axis", [1, -3])
def test_a_channel_concat_runs_blocked_whichever_way_its_axis_is_written(axis: int, tmp_path: Path) -> None:
    # two 1x1 convs into a Concat into a third: the concat takes the blocked twins as they are; its axis counted
    # from the end (-3 of NCHW) must still name the blocks' axis, not the rows of the 5-D twins
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.05).astype(np.float32), n)
             for n, s in (("wa", (256, 256, 1, 1)), ("wb", (256, 256, 1, 1)), ("wc", (256, 512, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["x", "wb"], ["b"], kernel_shape=[1, 1]),
             helper.make_node("Concat", ["a", "b"], ["ab"], axis=axis),
             helper.make_node("Conv", ["ab", "wc"], ["y"], kernel_shape=[1, 1])]
    g = helper.make_graph(nodes, "cat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256, 32, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256, 32, 32])], inits)
    path = tmp_path / "cat.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    from inferd.frontend import import_template, specialize

    plan = plan_layout(specialize(import_template(str(path))))
    assert "concat" in plan.kinds and plan.kinds.count("conv") == 3
    _assert_matches_onnxruntime(path, {"x": rng.standard_normal((1, 256, 32, 32)).astype(np.float32)})


def _assert_matches_onnxruntime(path: Path, feeds: dict[str, np.ndarray], atol: float = 1e-4) -> None:
    """inferd's CPU answer for output ``y`` of the model at ``path`` against onnxruntime's."""
    ort = pytest.importorskip("onnxruntime")
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y"], feeds)[0]
    with inferd.load(str(path), device="cpu") as m:
        np.testing.assert_allclose(m.run(feeds)["y"], want, rtol=1e-4, atol=atol)


def _mixed_concat_model(tmp_path: Path, nchw_channels: int, blocked_reader: bool) -> Path:
    """x -> 1x1 conv ``a`` (blocked, beside a second conv on x), z -> Sigmoid ``b`` (NCHW), Concat(a, b), then a
    1x1 conv (``blocked_reader``) or a Sigmoid reading the concat."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    cat = 64 + nchw_channels
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.05).astype(np.float32), n)
             for n, s in (("wa", (64, 64, 1, 1)), ("wd", (64, 64, 1, 1)), ("wc", (64, cat, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["x", "wd"], ["d"], kernel_shape=[1, 1]),
             helper.make_node("Sigmoid", ["z"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["ab"], axis=1),
             helper.make_node("Conv", ["ab", "wc"], ["y"], kernel_shape=[1, 1]) if blocked_reader
             else helper.make_node("Sigmoid", ["ab"], ["y"])]
    g = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 32, 32]),
                                           helper.make_tensor_value_info("z", TensorProto.FLOAT,
                                                                         [1, nchw_channels, 32, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("d", TensorProto.FLOAT, None)], inits)
    path = tmp_path / f"mixed{nchw_channels}{int(blocked_reader)}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@needs_native
def test_a_concat_of_blocked_and_nchw_parts_runs_blocked_where_that_converts_less(tmp_path: Path) -> None:
    # unet's skip connections: a blocked part beside a small NCHW one, read by a blocked conv: converting the NCHW
    # part in (16 channels) beats converting the blocked part out and the whole concat back in (64 + 80)
    from inferd.frontend import import_template, specialize

    path = _mixed_concat_model(tmp_path, 16, True)
    plan = plan_layout(specialize(import_template(str(path))))
    assert "concat" in plan.kinds
    rng = np.random.default_rng(6)
    feeds = {"x": rng.standard_normal((1, 64, 32, 32)).astype(np.float32),
             "z": rng.standard_normal((1, 16, 32, 32)).astype(np.float32)}
    _assert_matches_onnxruntime(path, feeds)
    # a large NCHW part and an NCHW reader: converting the blocked part out is less, the concat stays NCHW
    big = _mixed_concat_model(tmp_path, 256, False)
    assert "concat" not in plan_layout(specialize(import_template(str(big)))).kinds


def _pointwise_chain(tmp_path: Path, channels: int, hw: int, n: int = 3, k: int = 1, cin: int | None = None) -> Path:
    """``n`` k x k convs of ``channels`` each way on a hw x hw map (the first from ``cin`` channels where given)."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(7)
    c0 = cin or channels
    inits = [numpy_helper.from_array((rng.standard_normal((channels, c0 if i == 0 else channels, k, k)) * 0.05)
                                     .astype(np.float32), f"w{i}") for i in range(n)]
    names = ["x"] + [f"t{i}" for i in range(n - 1)] + ["y"]
    nodes = [helper.make_node("Conv", [names[i], f"w{i}"], [names[i + 1]], kernel_shape=[k, k],
                              pads=[k // 2] * 4) for i in range(n)]
    return _save_xy_model(tmp_path / f"pw{c0}_{channels}_{hw}_{k}.onnx", nodes, [1, c0, hw, hw], inits)


def _save_xy_model(path: Path, nodes: list, x_shape: list[int], inits: list) -> Path:  # type: ignore[type-arg]
    """``nodes`` as a model from input x (float, ``x_shape``) to output y, saved at ``path``."""
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@needs_native
def test_pointwise_convs_on_small_maps_run_blocked_where_their_saving_pays_for_the_conversions(tmp_path: Path) -> None:
    # 1x1s on small maps run blocked when their work is worth the two conversions (each costs a node's fixed time
    # besides its bytes): 256 channels on 7x7 and 6x6 (the chain in 0.81x the NCHW time, Zen 3), 512 on 2x2
    # (0.74x); too little work stays NCHW (256 on 4x4: as fast either way)
    from inferd.frontend import import_template, specialize

    def kinds(channels: int, hw: int) -> tuple[str, ...]:
        return plan_layout(specialize(import_template(str(_pointwise_chain(tmp_path, channels, hw))))).kinds

    assert kinds(256, 7) == ("conv",) * 3
    assert kinds(256, 6) == ("conv",) * 3 and kinds(512, 2) == ("conv",) * 3
    assert kinds(256, 4) == ()
    # 128 -> 128: ~2 us saved per conv; the conversions' bytes alone (~1.7 us each) would have let them block
    assert kinds(128, 7) == ()
    # a million weights a conv (resnet50's last stage has 2048<->512) blocked too: that stage took 0.98x the time
    assert kinds(1024, 7) == ("conv",) * 3
    x = np.random.default_rng(8).standard_normal((1, 256, 7, 7)).astype(np.float32)
    _assert_matches_onnxruntime(_pointwise_chain(tmp_path, 256, 7), {"x": x})
    x = np.random.default_rng(8).standard_normal((1, 512, 2, 2)).astype(np.float32)
    _assert_matches_onnxruntime(_pointwise_chain(tmp_path, 512, 2), {"x": x})
    x = np.random.default_rng(8).standard_normal((1, 1024, 7, 7)).astype(np.float32)
    _assert_matches_onnxruntime(_pointwise_chain(tmp_path, 1024, 7), {"x": x})


@needs_native
def test_3x3_convs_on_maps_too_small_for_winograd_run_blocked(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # resnets' last stages at a 64x64 input: 2x2 to 8x8 maps, where Winograd's tiles cost more than they save
    from inferd.frontend import import_template, specialize
    from inferd.planner import layout

    def kinds(channels: int, hw: int, n: int = 2, cin: int | None = None) -> tuple[str, ...]:
        path = _pointwise_chain(tmp_path, channels, hw, n=n, k=3, cin=cin)
        return plan_layout(specialize(import_template(str(path)))).kinds

    for wide in (False, True):  # the blocked kernel's tiles: AVX2 / NEON, AVX-512
        monkeypatch.setattr(layout, "_wide_tiles", lambda wide=wide: wide)
        assert kinds(512, 2) == ("conv",) * 2 and kinds(256, 4) == ("conv",) * 2 and kinds(256, 7) == ("conv",) * 2
        assert kinds(256, 4, n=1) == ("conv",)  # alone too (between NCHW 1x1s in a bottleneck): both conversions
        # Winograd's with narrow tiles; with the wide ones mid-sized maps and weights go blocked, and odd maps of
        # up to 7x7 whatever their weights
        blocked = ("conv",) * 2 if wide else ()
        assert kinds(512, 7) == blocked and kinds(256, 8) == blocked and kinds(128, 14) == blocked
        assert kinds(128, 28) == blocked and kinds(256, 14) == blocked
        # ... but not beyond: vgg16's 512@14x14 and 256->512@28x28 stay on Winograd (1.25x, 1.8x its time blocked)
        assert kinds(512, 14) == () and kinds(512, 28, cin=256) == ()
    x = np.random.default_rng(9).standard_normal((1, 256, 4, 4)).astype(np.float32)
    _assert_matches_onnxruntime(_pointwise_chain(tmp_path, 256, 4, n=2, k=3), {"x": x})


@needs_native
@pytest.mark.parametrize("dil,pad,blocked", [(2, 2, True), (4, 4, True), (2, 1, False)])
def test_an_atrous_conv_between_pointwise_convs_runs_blocked(dil: int, pad: int, blocked: bool,
                                                            tmp_path: Path) -> None:
    """FCN's and DeepLab's 3x3s of dilation 2 and 4 (pads equal to the dilation) plan blocked with their
    neighbours; pads that are not a multiple of the dilation stay on the NCHW path. Outputs equal onnxruntime's."""
    from onnx import helper, numpy_helper

    from inferd.frontend import import_template, specialize

    rng = np.random.default_rng(dil + pad)
    ws = [(rng.standard_normal(s) * 0.1).astype(np.float32) for s in ((64, 64, 1, 1), (64, 64, 3, 3), (64, 64, 1, 1))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Conv", ["b", "w1"], ["c"], kernel_shape=[3, 3], dilations=[dil, dil], pads=[pad] * 4),
             helper.make_node("Relu", ["c"], ["d"]),
             helper.make_node("Conv", ["d", "w2"], ["y"], kernel_shape=[1, 1])]
    hw = 16 + 2 * (pad - dil)  # the same output size as the input for pad == dil
    path = _save_xy_model(tmp_path / f"atrous{dil}_{pad}.onnx", nodes, [1, 64, hw, hw],
                          [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(ws)])
    kinds = plan_layout(specialize(import_template(str(path)))).kinds
    assert (kinds == ("conv",) * 3) if blocked else ("conv",) * 3 != kinds, kinds
    x = rng.standard_normal((1, 64, hw, hw)).astype(np.float32)
    _assert_matches_onnxruntime(path, {"x": x})


def _regnet_block(tmp_path: Path, channels: int, hw: int, group_width: int = 8) -> Path:
    """RegNet's body: 1x1 -> ReLU -> grouped 3x3 (``group_width`` channels a group) -> ReLU -> 1x1, and the
    block's input added."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(6)
    c, g = channels, channels // group_width
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.1).astype(np.float32), n)
             for n, s in (("wa", (c, c, 1, 1)), ("wb", (c, group_width, 3, 3)), ("wc", (c, c, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("Conv", ["ar", "wb"], ["b"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=g),
             helper.make_node("Relu", ["b"], ["br"]),
             helper.make_node("Conv", ["br", "wc"], ["cc"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["cc", "x"], ["y"])]
    return _save_xy_model(tmp_path / f"rg{c}_{hw}_{group_width}.onnx", nodes, [1, c, hw, hw], inits)


@needs_native
@pytest.mark.parametrize("channels,hw", [(104, 8), (208, 4), (48, 16)])
def test_a_regnet_block_runs_its_grouped_conv_blocked(channels: int, hw: int, tmp_path: Path) -> None:
    # im2col's GEMM per group paid ~1.5 us a group whatever its size: the grouped 3x3 runs blocked, on any map,
    # between NCHW 1x1s too
    from inferd.frontend import import_template, specialize

    path = _regnet_block(tmp_path, channels, hw)
    plan = plan_layout(specialize(import_template(str(path))))
    g = specialize(import_template(str(path)))
    grouped = [n.name for n in g.nodes if n.op == "Conv" and int(n.attrs.get("group", 1)) > 1]
    assert grouped and set(grouped) <= set(plan.blocked)
    x = np.random.default_rng(10).standard_normal((1, channels, hw, hw)).astype(np.float32)
    _assert_matches_onnxruntime(path, {"x": x})


# --------------------------------------------------------------------------- graph inputs read in place


def _stem_and_relu_model(tmp_path: Path) -> Path:
    """x -> a stem conv (reads x as NCHW, writes blocked) -> y; x -> Relu -> r: a reader that cannot be pointed
    elsewhere, so x must stay a copy in the arena."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    w = numpy_helper.from_array((rng.standard_normal((32, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    w2 = numpy_helper.from_array((rng.standard_normal((32, 32, 3, 3)) * 0.1).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Conv", ["a", "w2"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["x"], ["r"])]
    g = helper.make_graph(nodes, "sr", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 112, 112])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 56, 56]),
                           helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 3, 112, 112])], [w, w2])
    path = tmp_path / "sr.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@needs_native
@pytest.mark.parametrize("which", ["stem", "reorder"])
def test_a_graph_input_is_read_where_the_caller_has_it(which: str, tmp_path: Path) -> None:
    # a stem conv (SqueezeNet's) or a reorder into the blocked layout (the squeeze-excitation model's first
    # node) reads the caller's array instead of a copy in the arena; every run reads the array it is given
    ort = pytest.importorskip("onnxruntime")
    path = _zoo("squeezenet1_1", tmp_path) if which == "stem" else str(_se_model(tmp_path, True))
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    shape = [d if isinstance(d, int) else 1 for d in sess.get_inputs()[0].shape]
    rng = np.random.default_rng(11)

    def check(x: np.ndarray) -> None:
        want = sess.run(None, {name: np.ascontiguousarray(x)})[0]
        np.testing.assert_allclose(list(m.run({name: x}).values())[0], want, rtol=1e-3, atol=1e-4)

    with inferd.load(path, device="cpu") as m:
        m.run({name: np.zeros(shape, np.float32)})  # the cold load's run: from the arena, then the layers bound
        m.wait_warm(60)
        ex = m._exec
        assert [d[0] for d in ex._direct] == [name], ex._direct
        view = ex.views[name]
        x1 = rng.standard_normal(shape).astype(np.float32)
        check(x1)
        view[...] = np.nan  # the arena's copy is not what the readers read now
        check(x1)
        x2 = rng.standard_normal(shape).astype(np.float32)
        check(x2)  # another array: read, not the last one
        x2 *= -1.5
        check(x2)  # the same array changed in place: read as it is now
        xf = np.asfortranarray(rng.standard_normal(shape).astype(np.float32))
        check(xf)  # not C-contiguous: copied into the arena and read from there
        ro = np.frombuffer(x1.tobytes(), np.float32).reshape(shape)  # read-only, as a request's tensor arrives
        assert not ro.flags.writeable
        check(ro)
        # a caller that fills the arena itself (a control-flow body, a co-executed region) is read from there
        out_name = ex.outputs[0].name
        dst = np.empty(ex.outputs[0].shape, np.float32)
        src = rng.standard_normal(shape).astype(np.float32)
        run = ex.bind_run({name: src}, [(out_name, dst)])
        assert run is not None
        run()
        np.testing.assert_allclose(dst, sess.run(None, {name: src})[0], rtol=1e-3, atol=1e-4)
        check(x1)  # and the next run reads its feed again


@needs_native
def test_a_graph_input_with_a_reader_that_cannot_be_pointed_elsewhere_is_copied(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    path = str(_stem_and_relu_model(tmp_path))
    x = np.random.default_rng(12).standard_normal((1, 3, 112, 112)).astype(np.float32)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with inferd.load(path, device="cpu") as m:
        m.run({"x": x})
        m.wait_warm(60)
        assert "nchwc" in set(m.kernels.values())
        assert m._exec._direct == [] and m._exec.steps[0] is not None
        for _ in range(2):
            got = m.run({"x": x})
            np.testing.assert_allclose(got["y"], want[0], rtol=1e-4, atol=1e-5)
            np.testing.assert_array_equal(got["r"], want[1])


@needs_native
@pytest.mark.parametrize("act,blocked", [("Relu", True), ("HardSwish", True), ("Sigmoid", False)])
def test_a_scalar_gain_between_blocked_convs_runs_blocked(act: str, blocked: bool, tmp_path: Path) -> None:
    """NF-Nets' act(x * gain) between convs, x also a residual branch's input (so the gain cannot fold into the
    conv before): on the blocked tensor as it is where the activation (fused into the Mul) keeps zero at zero (the
    blocks' padding lanes stay zero), else converted around it. Outputs equal onnxruntime's, the channels short of
    a whole block (120) so that padding lanes exist."""
    from onnx import helper, numpy_helper

    from inferd.frontend import import_template, specialize

    rng = np.random.default_rng(3)
    c = 120
    inits = [numpy_helper.from_array((rng.standard_normal((c, c, 1, 1)) * 0.1).astype(np.float32), f"w{i}")
             for i in range(2)] + [numpy_helper.from_array(np.array(1.7, np.float32), "gain")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Mul", ["a", "gain"], ["g"]),
             helper.make_node(act, ["g"], ["h"]),
             helper.make_node("Conv", ["h", "w1"], ["b"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["b", "a"], ["y"])]
    path = _save_xy_model(tmp_path / f"gain_{act}.onnx", nodes, [1, c, 56, 56], inits)
    plan = plan_layout(specialize(import_template(str(path))))
    assert ("scalar" in plan.kinds) == blocked, plan
    assert plan.kinds.count("conv") == (2 if blocked else plan.kinds.count("conv"))
    x = rng.standard_normal((1, c, 56, 56)).astype(np.float32)
    _assert_matches_onnxruntime(path, {"x": x})


@needs_native
@pytest.mark.parametrize("act,blocked", [("Relu", True), ("Tanh", True), ("Sigmoid", False)])
def test_a_standalone_activation_between_blocked_convs_runs_blocked(act: str, blocked: bool, tmp_path: Path) -> None:
    """A pre-activation residual block: act(x + skip) read by the next conv while the skip reads the sum too (so the
    activation cannot fuse into the conv that made it). It runs on the blocked tensor as it is where it keeps zero
    at zero (no conversion out of the blocked layout and back around it), else it is converted around. Outputs
    equal onnxruntime's, 120 channels so that padding lanes exist."""
    from onnx import helper, numpy_helper

    from inferd.frontend import import_template, specialize
    from inferd.planner.layout import apply_layout

    rng = np.random.default_rng(4)
    c = 120
    inits = [numpy_helper.from_array((rng.standard_normal((c, c, 1, 1)) * 0.1).astype(np.float32), f"w{i}")
             for i in range(3)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["a", "w1"], ["b0"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["b0", "a"], ["s"]),
             helper.make_node(act, ["s"], ["h"]),
             helper.make_node("Conv", ["h", "w2"], ["b"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["b", "s"], ["y"])]
    path = _save_xy_model(tmp_path / f"preact_{act}.onnx", nodes, [1, c, 28, 28], inits)
    g = specialize(import_template(str(path)))
    plan = plan_layout(g)
    assert ("unary" in plan.kinds) == blocked, plan
    if blocked:
        ops = [n.op for n in apply_layout(g, plan).nodes]
        assert ops.count("inferd.FromNchwc") == 1 and ops.count("inferd.ToNchwc") == 1, ops  # the graph's edges only
    x = rng.standard_normal((1, c, 28, 28)).astype(np.float32)
    _assert_matches_onnxruntime(path, {"x": x})


def _se_block(rng: np.random.Generator, c: int, r: int, x: str) -> tuple[list, list]:
    """Initializers (1x1 weights w0 and w1 of c channels beside the SE's f1, f2) and nodes of a squeeze-excitation
    of ``x``: pool, 1x1 conv to ``r`` channels, ReLU, 1x1 conv back, Sigmoid gate, ``s`` = x times the gate."""
    from onnx import helper, numpy_helper

    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.1).astype(np.float32), n)
             for n, s in (("w0", (c, c, 1, 1)), ("f1", (r, c, 1, 1)), ("f2", (c, r, 1, 1)), ("w1", (c, c, 1, 1)))]
    nodes = [helper.make_node("GlobalAveragePool", [x], ["p"]),
             helper.make_node("Conv", ["p", "f1"], ["q"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["q"], ["q1"]),
             helper.make_node("Conv", ["q1", "f2"], ["q2"], kernel_shape=[1, 1]),
             helper.make_node("Sigmoid", ["q2"], ["gate"]),
             helper.make_node("Mul", [x, "gate"], ["s"])]
    return inits, nodes


@needs_native
@pytest.mark.parametrize("act", [None, "Relu", "HardSwish"])
def test_a_gain_after_a_blocked_squeeze_excitation_fuses_into_its_scale(act: str | None, tmp_path: Path) -> None:
    """NF-Nets' act(gain * se(x)) before the next conv: the blocked SE scale takes the gain and the activation
    (one pass, ``layout.fuse_scale_gain``), the Mul is gone; outputs equal onnxruntime's, with padding lanes
    (120 channels). The oracle of the fused scale agrees with the native pass."""
    from onnx import helper, numpy_helper

    from inferd.frontend import import_template, specialize
    from inferd.ops.base import op_spec
    from inferd.ops.conv_nchwc import SCALE
    from inferd.package import cpu_graph

    rng = np.random.default_rng(5)
    c = 120
    inits, nodes = _se_block(rng, c, 16, "a")
    inits.append(numpy_helper.from_array(np.array(1.7, np.float32), "gain"))
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], kernel_shape=[1, 1]), *nodes,
             helper.make_node("Mul", ["s", "gain"], ["g" if act else "h"])]
    if act:
        nodes.append(helper.make_node(act, ["g"], ["h"]))
    nodes.append(helper.make_node("Conv", ["h", "w1"], ["y"], kernel_shape=[1, 1]))
    path = _save_xy_model(tmp_path / f"segain_{act}.onnx", nodes, [1, c, 20, 20], inits)
    g = cpu_graph(specialize(import_template(str(path))))
    scales = [n for n in g.nodes if n.op == SCALE]
    assert len(scales) == 1 and not [n for n in g.nodes if n.op == "Mul"], [(n.op, n.inputs) for n in g.nodes]
    if act is not None:  # (without one, the import already folds the gain into the next conv's weights)
        assert scales[0].attrs.get("mult") == pytest.approx(1.7) and scales[0].attrs["act"][0] == act
    x = rng.standard_normal((1, c, 20, 20)).astype(np.float32)
    _assert_matches_onnxruntime(path, {"x": x})
    # the oracle and the native pass on the same blocked operands
    from inferd.ir import Node

    node = Node("s", SCALE, ["x", "s"], ["y"], {"mult": 1.7, **({"act": (act, ())} if act else {})})
    xb = rng.standard_normal((1, 8, 20, 20, 16)).astype(np.float32)
    xb[:, -1, :, :, c % 16:] = 0.0
    sc = rng.random((1, c, 1, 1)).astype(np.float32)
    want = op_spec(SCALE).reference(node, [xb, sc])[0]
    got = np.empty_like(xb)
    call = inferd.native.nchwc_scale_bound(xb, sc, got, 1.7, node.attrs.get("act"))
    assert call is not None
    call()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not got[:, -1, :, :, c % 16:].any()  # padding lanes stay zero


@needs_native
def test_an_atrous_conv_runs_blocked_even_alone(tmp_path: Path) -> None:
    """A 3x3 conv at dilation 4 between layers that stay NCHW (FCN-ResNet50's layer4: its 1x1 convs' weights are
    too large for the pointwise tiles): the blocked dilated kernel saves more than the two conversions cost, so it
    is kept where before it needed a blocked neighbour; the answer equals onnxruntime's."""
    from onnx import helper, numpy_helper

    from inferd.frontend import import_template, specialize

    rng = np.random.default_rng(6)
    c = 48
    inits = [numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) * 0.1).astype(np.float32), "w")]
    nodes = [helper.make_node("Sigmoid", ["x"], ["a"]),
             helper.make_node("Conv", ["a", "w"], ["b"], kernel_shape=[3, 3], dilations=[4, 4], pads=[4, 4, 4, 4]),
             helper.make_node("Sigmoid", ["b"], ["y"])]
    path = _save_xy_model(tmp_path / "atrous.onnx", nodes, [1, c, 8, 8], inits)
    plan = plan_layout(specialize(import_template(str(path))))
    assert plan.kinds == ("conv",), plan
    _assert_matches_onnxruntime(path, {"x": rng.standard_normal((1, c, 8, 8)).astype(np.float32)})


@needs_native
def test_a_squeeze_excitations_small_convs_pay_their_own_conversions(tmp_path: Path) -> None:
    """The SE's pool writes one value per channel in NCHW: its 1x1-map convs, blocked, would convert the pooled
    vector in and the gate out (a fixed ~3 us each) for a tenth of a microsecond saved. The plan counts those
    conversions (the pool is not a blocked producer), so the small convs stay NCHW and nothing is converted around
    them, while the trunk's convs stay blocked; the answer equals onnxruntime's."""
    from onnx import helper

    from inferd.frontend import import_template, specialize
    from inferd.planner.layout import apply_layout

    rng = np.random.default_rng(7)
    c = 128
    inits, nodes = _se_block(rng, c, 32, "a")
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a0"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["a0"], ["a"]), *nodes,
             helper.make_node("Conv", ["s", "w1"], ["y"], kernel_shape=[1, 1])]
    path = _save_xy_model(tmp_path / "se_small.onnx", nodes, [1, c, 28, 28], inits)
    g = specialize(import_template(str(path)))
    plan = plan_layout(g)
    kinds = dict(zip(plan.blocked, plan.kinds))
    assert sorted(kinds.values()) == ["conv", "conv", "gap", "scale"], kinds
    bg = apply_layout(g, plan)
    convert = [n for n in bg.nodes if n.op in ("inferd.ToNchwc", "inferd.FromNchwc")]
    assert [n.inputs[0] for n in convert] == ["x", "y::nchwc"], [(n.op, n.inputs) for n in convert]
    _assert_matches_onnxruntime(path, {"x": rng.standard_normal((1, c, 28, 28)).astype(np.float32)})
