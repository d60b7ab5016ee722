"""Conv / ConvTranspose: every CPU kernel against onnxruntime one-node models and against ``direct``;
kernel applicability, transform purity and sizes, fused bias/residual/activation, native helpers vs
their numpy fallbacks."""
from __future__ import annotations

import importlib.util
import logging
import math
import os
import shutil
import sys
import types
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from inferd import native  # noqa: E402
from inferd.errors import ShapeError, UnsupportedOpError  # noqa: E402
from inferd.ir import Node  # noqa: E402
from inferd.ops import applicable_kernels, choose_kernel, kernels_for, op_spec, run_layer, single_node_layer  # noqa: E402
from inferd.ops.activation import apply_act  # noqa: E402
from inferd.ops.base import raw_key  # noqa: E402
from inferd.ops.conv import (ConvWinograd23, ConvWinograd43, conv_nd, layer_geom,  # noqa: E402
                             winograd_matrices)
from native_harness import AARCH64_CC, AARCH64_FLAGS, FULL_OPT, QEMU, build_and_run, needs_aarch64  # noqa: E402

F32 = np.float32
TOL = 1e-4


def rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    assert a.shape == ref.shape, (a.shape, ref.shape)
    return float(np.abs(a.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


def ort_run(op: str, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict[str, Any]) -> np.ndarray:
    """Run one Conv/ConvTranspose node in onnxruntime (weights and bias as initializers)."""
    inits = [numpy_helper.from_array(w, "W")]
    ins = ["X", "W"]
    if b is not None:
        inits.append(numpy_helper.from_array(b, "B"))
        ins.append("B")
    node = helper.make_node(op, ins, ["Y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"X": x})[0]


def make_inputs(seed: int, xshape: tuple[int, ...], wshape: tuple[int, ...], bias: bool
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xshape, dtype=F32)
    w = (rng.standard_normal(wshape) / math.sqrt(max(1, math.prod(wshape[1:])))).astype(F32)
    b = rng.standard_normal(wshape[0] if len(wshape) else 1).astype(F32) if bias else None
    return x, w, b


def kernel(op: str, name: str):
    return next(k for k in kernels_for(op) if k.name == name)


# --------------------------------------------------------------------------- Conv vs onnxruntime

# id, input shape, Cout, kernel shape, attrs, bias
CONV_CASES: list[tuple[str, tuple[int, ...], int, tuple[int, ...], dict[str, Any], bool]] = [
    ("3x3_p1_odd", (1, 8, 7, 9), 16, (3, 3), dict(pads=[1, 1, 1, 1]), True),
    ("3x3_asym_pads_b2", (2, 5, 7, 9), 6, (3, 3), dict(pads=[0, 1, 2, 0]), True),
    ("3x3_nopad_nobias", (1, 4, 9, 7), 8, (3, 3), {}, False),
    ("3x3_big_pad", (1, 3, 6, 5), 4, (3, 3), dict(pads=[3, 2, 4, 1]), True),
    ("3x3_s2", (1, 6, 9, 7), 8, (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1]), True),
    ("3x3_s21_d21", (1, 3, 11, 10), 4, (3, 3), dict(strides=[2, 1], dilations=[2, 1], pads=[2, 1, 1, 2]), True),
    ("5x3_d12", (2, 3, 12, 11), 5, (5, 3), dict(dilations=[1, 2], pads=[2, 2, 2, 2]), True),
    ("3x3_d2", (1, 4, 12, 13), 4, (3, 3), dict(dilations=[2, 2], pads=[2, 2, 2, 2]), False),
    ("7x7_s2", (1, 3, 17, 15), 8, (7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3]), True),
    ("wino_tiles", (1, 16, 20, 23), 24, (3, 3), dict(pads=[1, 1, 1, 1]), True),
    # enough output channels for the direct kernel's tasks to take whole groups of the 24-row AVX-512 tiles
    # (the C harness builds without the ISA clones), with 8-row panels left over
    ("tall_tiles", (1, 16, 12, 14), 104, (3, 3), dict(pads=[1, 1, 1, 1]), True),
    ("tall_tiles_s2", (1, 12, 15, 13), 80, (3, 3), dict(strides=[2, 2], pads=[1, 0, 1, 1]), True),
    ("wino_b2_asym", (2, 6, 10, 13), 5, (3, 3), dict(pads=[2, 0, 1, 1]), True),
    ("1x1", (2, 16, 7, 9), 8, (1, 1), {}, True),
    ("1x1_s2", (1, 16, 7, 9), 8, (1, 1), dict(strides=[2, 2]), False),
    ("1x1_s3_b2", (2, 6, 10, 8), 4, (1, 1), dict(strides=[3, 2]), True),
    ("1x1_pad", (1, 4, 5, 5), 4, (1, 1), dict(pads=[1, 0, 0, 1]), True),
    ("1x1_group2", (1, 8, 5, 6), 6, (1, 1), dict(group=2), True),
    ("group2", (1, 8, 7, 9), 12, (3, 3), dict(group=2, pads=[1, 1, 1, 1]), True),
    ("group4_s2_b2", (2, 8, 9, 9), 8, (3, 3), dict(group=4, strides=[2, 2]), True),
    ("dw3x3", (1, 8, 7, 9), 8, (3, 3), dict(group=8, pads=[1, 1, 1, 1]), True),
    ("dw3x3_s2_b2", (2, 6, 9, 8), 6, (3, 3), dict(group=6, strides=[2, 2], pads=[1, 1, 1, 1]), True),
    ("dw3x3_s2_asym", (1, 5, 10, 7), 5, (3, 3), dict(group=5, strides=[2, 2], pads=[0, 1, 1, 0]), True),
    ("dw5x5_s2", (1, 4, 11, 12), 4, (5, 5), dict(group=4, strides=[2, 2], pads=[2, 2, 2, 2]), False),
    ("dw5x5_s1", (1, 3, 6, 9), 3, (5, 5), dict(group=3, pads=[2, 2, 2, 2]), True),
    ("dw7x7", (1, 3, 13, 14), 3, (7, 7), dict(group=3, pads=[3, 3, 3, 3]), True),
    ("dw3x5_s3", (1, 4, 13, 11), 4, (3, 5), dict(group=4, strides=[3, 3], pads=[1, 2, 0, 1]), True),
    ("dw_s12", (1, 4, 9, 10), 4, (3, 3), dict(group=4, strides=[1, 2], pads=[1, 1, 1, 1]), True),
    ("dw_mult2", (1, 4, 8, 7), 8, (3, 3), dict(group=4, pads=[1, 1, 1, 1]), True),
    ("dw_dil2", (1, 4, 10, 10), 4, (3, 3), dict(group=4, dilations=[2, 2], pads=[2, 2, 2, 2]), True),
    ("dw_tiny_plane", (1, 6, 2, 3), 6, (3, 3), dict(group=6, pads=[1, 1, 1, 1]), True),
    ("same_upper_s2", (1, 3, 7, 9), 4, (3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2]), True),
    ("same_lower_k4", (1, 3, 8, 9), 4, (4, 4), dict(auto_pad="SAME_LOWER", strides=[2, 2]), True),
    ("same_upper_k2", (1, 3, 8, 9), 4, (2, 2), dict(auto_pad="SAME_UPPER"), False),
    ("same_upper_s1_wino", (1, 4, 9, 10), 4, (3, 3), dict(auto_pad="SAME_UPPER"), True),
    ("same_lower_dil", (1, 3, 9, 8), 2, (2, 2), dict(auto_pad="SAME_LOWER", dilations=[3, 3]), True),
    ("valid", (1, 3, 7, 9), 4, (3, 3), dict(auto_pad="VALID", strides=[2, 1]), True),
    ("1d", (2, 4, 19), 6, (3,), dict(pads=[1, 2], strides=[2]), True),
    ("1d_dw", (1, 4, 15), 4, (5,), dict(group=4, pads=[2, 2]), True),
    ("1d_1x1", (1, 4, 15), 6, (1,), {}, True),
    ("1d_same_dil", (1, 3, 16), 4, (2,), dict(auto_pad="SAME_UPPER", dilations=[3]), False),
    ("3d", (1, 2, 5, 6, 7), 3, (3, 3, 3), dict(pads=[1, 0, 1, 1, 1, 0], strides=[1, 2, 1]), True),
    # Cin >= 8: the implicit-im2col GEMM applies too (channels off the vector width, odd maps, every pad side)
    ("impl_s21_d21", (1, 9, 11, 10), 7, (3, 3), dict(strides=[2, 1], dilations=[2, 1], pads=[2, 1, 1, 2]), True),
    ("impl_5x3_b2", (2, 10, 12, 11), 5, (5, 3), dict(dilations=[1, 2], pads=[2, 0, 1, 2]), True),
    ("impl_1x1_pad", (1, 12, 5, 5), 17, (1, 1), dict(pads=[1, 0, 0, 1]), True),
    ("impl_1d", (2, 9, 19), 6, (3,), dict(pads=[1, 2], strides=[2]), True),
    ("impl_valid_s32", (1, 33, 13, 9), 19, (2, 2), dict(strides=[3, 2]), False),
    ("impl_same_upper", (1, 8, 7, 9), 40, (3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2]), True),
    ("impl_1x1_map", (1, 20, 1, 1), 9, (3, 3), dict(pads=[1, 1, 1, 1]), True),
]

# onnxruntime refuses dilation with SAME_*: it gets the explicit pads the ONNX spec gives (odd totals, so the
# extra pad goes to the begin for SAME_LOWER and to the end for SAME_UPPER)
ORT_ATTRS = {
    "same_lower_dil": dict(dilations=[3, 3], pads=[2, 2, 1, 1]),
    "1d_same_dil": dict(dilations=[3], pads=[1, 2]),
}


def expected_conv_kernels(xshape: tuple[int, ...], cout: int, k: tuple[int, ...], attrs: dict[str, Any]) -> set[str]:
    """Which kernels should apply, written from the kernels' documented conditions."""
    nsp = len(k)
    cin, g = xshape[1], attrs.get("group", 1)
    s = attrs.get("strides", [1] * nsp)
    d = attrs.get("dilations", [1] * nsp)
    pads = attrs.get("pads", [0] * 2 * nsp)
    out = {"direct"}
    if nsp > 2:
        return out
    out.add("im2col")
    if g == 1:
        out.add("im2col_tiled")
    if all(v == 1 for v in k) and not any(pads) and attrs.get("auto_pad", "NOTSET") in ("NOTSET", "VALID"):
        out.add("conv1x1")
    if g == 1 and cin >= 8 and "conv1x1" not in out:
        out.add("implicit")
    if nsp == 2 and k == (3, 3) and list(s) == [1, 1] and list(d) == [1, 1] and g == 1:
        out |= {"winograd23", "winograd43"}
    if g == 1 and math.prod(k) <= 49 and all(v <= 4 for v in s):
        out.add("direct_gemm")
    if g == cin > 1 and cout % cin == 0:
        out.add("depthwise")
        if (cout == cin and nsp == 2 and k in ((3, 3), (5, 5)) and s[0] == s[1] and s[0] in (1, 2)
                and list(d) == [1, 1]):
            out.add("depthwise_direct")
    return out


@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_kernels_vs_onnxruntime(case) -> None:
    cid, xshape, cout, k, attrs, bias = case
    g = attrs.get("group", 1)
    x, w, b = make_inputs(len(cid), xshape, (cout, xshape[1] // g) + k, bias)
    ref = ort_run("Conv", x, w, b, ORT_ATTRS.get(cid, attrs))
    ins = [x, w] + ([b] if b is not None else [])
    layer = single_node_layer("Conv", ins, attrs)
    assert layer.out_shape() == ref.shape  # static shape inference agrees with onnxruntime
    names = {kk.name for kk in applicable_kernels(layer)}
    assert names == expected_conv_kernels(xshape, cout, k, attrs)
    direct = run_layer(kernel("Conv", "direct"), layer, ins)[0]
    assert rel_err(direct, ref) <= TOL
    for kern in applicable_kernels(layer):
        y = run_layer(kern, layer, ins)[0]
        assert y.dtype == F32
        assert rel_err(y, ref) <= TOL, f"{kern.name} vs onnxruntime"
        assert rel_err(y, direct) <= TOL, f"{kern.name} vs direct"


def test_default_kernel_choice() -> None:
    def pick(xshape, cout, k, attrs):
        g = attrs.get("group", 1)
        x, w, b = make_inputs(0, xshape, (cout, xshape[1] // g) + k, True)
        return choose_kernel(single_node_layer("Conv", [x, w, b], attrs)).name

    want_dw = "depthwise_direct" if native.AVAILABLE else "depthwise"  # same columns: rows read in place
    assert pick((1, 8, 14, 14), 8, (3, 3), dict(group=8, pads=[1, 1, 1, 1])) == want_dw
    assert pick((1, 8, 14, 14), 8, (3, 3), dict(group=8, pads=[1, 1, 1, 1], strides=[2, 2])) == "depthwise"
    assert pick((1, 8, 14, 14), 16, (1, 1), {}) == "conv1x1"
    # small C*kh*kw (stems): the banded im2col; from TILED_MAX_K on the plain one
    assert pick((1, 8, 14, 14), 16, (3, 3), dict(strides=[2, 2])) == "im2col_tiled"
    assert pick((1, 3, 32, 32), 16, (7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3])) == "im2col_tiled"
    assert pick((1, 64, 14, 14), 16, (3, 3), dict(strides=[2, 2])) == "im2col"
    assert pick((1, 8, 14, 14), 16, (3, 3), dict(strides=[2, 2], group=2)) == "im2col"
    # im2col stays the default GEMM conv beyond the stems (the implicit one is a measured alternative after it)
    # the measured rule (preferred_3x3_kernel): few input channels -> im2col(_tiled), else Winograd by size
    assert pick((1, 4, 14, 14), 16, (3, 3), dict(pads=[1, 1, 1, 1])) == "im2col_tiled"
    # 8-48 channels: the direct kernel, unless F(4,3) applies with more than 16 output channels
    assert pick((1, 16, 55, 55), 64, (3, 3), dict(pads=[1, 1, 1, 1])) == "direct_gemm"
    assert pick((1, 8, 14, 14), 16, (3, 3), dict(pads=[1, 1, 1, 1])) == "direct_gemm"
    assert pick((1, 48, 13, 13), 192, (3, 3), dict(pads=[1, 1, 1, 1])) == "direct_gemm"
    assert pick((1, 32, 56, 56), 32, (3, 3), dict(pads=[1, 1, 1, 1])) == "direct_gemm"
    assert pick((1, 32, 128, 128), 16, (3, 3), dict(pads=[1, 1, 1, 1])) == "direct_gemm"
    assert pick((1, 32, 128, 128), 32, (3, 3), dict(pads=[1, 1, 1, 1])) == "winograd43"
    # other shapes it applies to (5x5, 1-D) keep the banded im2col
    assert pick((1, 8, 14, 14), 16, (5, 5), dict(pads=[2, 2, 2, 2])) == "im2col_tiled"
    assert pick((1, 64, 14, 14), 64, (3, 3), dict(pads=[1, 1, 1, 1])) == "direct_gemm"
    assert pick((1, 96, 14, 14), 64, (3, 3), dict(pads=[1, 1, 1, 1])) == "winograd23"
    assert pick((1, 64, 56, 56), 64, (3, 3), dict(pads=[1, 1, 1, 1])) == "winograd43"


def test_preferred_3x3_kernel() -> None:
    """Exactly one of im2col_tiled / direct_gemm / winograd23 / winograd43 is preferred for a 3x3 stride-1 layer, by
    channels and map size."""
    def prefs(c, hw):
        x, w, b = make_inputs(0, (1, c, hw, hw), (c, c, 3, 3), True)
        layer = single_node_layer("Conv", [x, w, b], dict(pads=[1, 1, 1, 1]))
        ks = [kernel("Conv", n) for n in ("winograd23", "winograd43", "direct_gemm", "im2col_tiled")]
        return {k.name for k in ks if k.preferred(layer)}

    assert prefs(64, 56) == {"winograd43"}
    assert prefs(128, 28) == {"winograd43"}
    assert prefs(64, 28) == {"winograd23"}
    assert prefs(64, 14) == {"direct_gemm"}  # 64 channels on small maps: F(2,3)'s transforms cost more
    assert prefs(64, 16) == {"winograd23"}
    assert prefs(512, 7) == {"winograd23"}
    assert prefs(8, 56) == {"direct_gemm"}  # too few channels for the transforms to pay off
    assert prefs(16, 55) == {"direct_gemm"}
    assert prefs(4, 14) == {"im2col_tiled"}  # the 3-channel stems
    assert prefs(16, 28) == {"direct_gemm"}
    assert prefs(32, 14) == {"direct_gemm"}
    assert prefs(48, 7) == {"direct_gemm"}
    assert prefs(64, 13) == {"direct_gemm"}
    assert prefs(128, 13) == {"winograd23"}
    assert prefs(24, 56) == {"direct_gemm"}
    assert prefs(24, 96) == {"winograd43"}  # U-Net-sized maps: F(4,3) with few channels too
    assert prefs(32, 128) == {"winograd43"}
    assert prefs(32, 88) == {"direct_gemm"}  # 484 tiles of 4x4: not enough for F(4,3)
    assert prefs(64, 88) == {"winograd43"}
    assert prefs(96, 14) == {"winograd23"}
    x, w, b = make_inputs(0, (1, 64, 56, 56), (64, 64, 3, 3), True)
    layer = single_node_layer("Conv", [x, w, b], dict(strides=[2, 2]))
    assert not kernel("Conv", "winograd43").preferred(layer)  # not applicable -> not preferred


# --------------------------------------------------------------------------- fused epilogue

ACTS = [None, ("Relu", ()), ("Clip", (0.0, 6.0)), ("LeakyRelu", (0.1,)), ("HardSwish", ()), ("Sigmoid", ()),
        ("SiLU", ()), ("HardSigmoid", (0.2, 0.5)), ("Tanh", ()), ("Gelu", (0.0,)), ("Gelu", (1.0,))]

# (input shape, Cout, kernel, attrs) chosen so that together they cover every conv kernel
FUSE_SHAPES = [
    ((2, 6, 7, 9), 8, (3, 3), dict(pads=[1, 1, 1, 1])),
    ((1, 6, 7, 9), 8, (1, 1), dict(strides=[2, 2])),
    ((2, 6, 7, 9), 6, (3, 3), dict(group=6, pads=[1, 1, 1, 1], strides=[2, 2])),
    ((1, 4, 11), 6, (3,), dict(pads=[1, 1])),
]


@pytest.mark.parametrize("act", ACTS, ids=[a[0] if a else "none" for a in ACTS])
@pytest.mark.parametrize("mode", ["bias+res", "nobias+res", "placeholder+res", "bias"])
def test_conv_fused_epilogue(act, mode: str) -> None:
    for si, (xshape, cout, k, attrs) in enumerate(FUSE_SHAPES):
        g = attrs.get("group", 1)
        x, w, b = make_inputs(si, xshape, (cout, xshape[1] // g) + k, True)
        geo_layer = single_node_layer("Conv", [x, w], attrs)
        res = np.random.default_rng(si + 7).standard_normal(geo_layer.out_shape(), dtype=F32)
        fused = dict(attrs)
        if act is not None:
            fused["act"] = act
        if mode == "bias+res":
            ins, const = [x, w, b, res], [False, True, True, False]
        elif mode == "nobias+res":
            ins, const = [x, w, res], [False, True, False]
        elif mode == "placeholder+res":  # what import writes: an empty bias slot before the residual
            ins, const = [x, w, None, res], [False, True, False, False]
        else:
            ins, const = [x, w, b], [False, True, True]
        if "res" in mode:
            fused["residual"] = True
        layer = single_node_layer("Conv", ins, fused, const=const)
        expect = conv_nd(x, w, layer_geom(layer)).astype(F32)
        if mode in ("bias+res", "bias"):
            expect += b.reshape((1, -1) + (1,) * len(k))
        if "res" in mode:
            expect += res
        apply_act(expect, act)
        assert rel_err(op_spec("Conv").reference(layer.node, list(ins))[0], expect) <= TOL
        for kern in applicable_kernels(layer):
            y = run_layer(kern, layer, ins)[0]
            assert rel_err(y, expect) <= TOL, f"{kern.name} {xshape} {mode} {act}"


# one image, 1x1 stride 1 and depthwise stride 1/2: the shapes that take the kernels' single-thread fast paths
FAST_SHAPES = [
    ((1, 6, 7, 9), 8, (1, 1), {}),
    ((1, 6, 7, 9), 6, (3, 3), dict(group=6, pads=[1, 1, 1, 1])),
    ((1, 6, 9, 8), 6, (3, 3), dict(group=6, pads=[1, 1, 1, 1], strides=[2, 2])),
]


@pytest.mark.parametrize("act", ACTS, ids=[a[0] if a else "none" for a in ACTS])
@pytest.mark.parametrize("mode", ["bias+res", "nobias+res", "placeholder+res", "bias", "dynbias"])
def test_conv_fast_path_matches_general_path(act, mode: str, monkeypatch) -> None:
    """conv1x1/depthwise bind one contiguous image to a single native call: same results as the general path and
    the numpy oracle, and depthwise takes that call exactly when it applies."""
    calls: list[str] = []
    for fname in ("dwconv2d_bound",):
        real = getattr(native, fname)
        monkeypatch.setattr(native, fname,
                            lambda *a, _real=real, _name=fname: (calls.append(_name), _real(*a))[1])
    force_slow = [False]
    real_fast = native.fast_path
    monkeypatch.setattr(native, "fast_path", lambda: not force_slow[0] and real_fast())
    for si, (xshape, cout, k, attrs) in enumerate(FAST_SHAPES):
        x, w, b = make_inputs(si + 20, xshape, (cout, xshape[1] // attrs.get("group", 1)) + k, True)
        res = np.random.default_rng(si + 30).standard_normal(
            single_node_layer("Conv", [x, w], attrs).out_shape(), dtype=F32)
        fused = dict(attrs, **({"act": act} if act is not None else {}))
        if mode == "bias+res":
            ins, const = [x, w, b, res], [False, True, True, False]
        elif mode == "nobias+res":
            ins, const = [x, w, res], [False, True, False]
        elif mode == "placeholder+res":
            ins, const = [x, w, None, res], [False, True, False, False]
        elif mode == "bias":
            ins, const = [x, w, b], [False, True, True]
        else:  # a bias computed at run time is not in params: the general path handles it
            ins, const = [x, w, b], [False, True, False]
        if "res" in mode:
            fused["residual"] = True
        layer = single_node_layer("Conv", ins, fused, const=const)
        expect = op_spec("Conv").reference(layer.node, list(ins))[0]
        name = "conv1x1" if k == (1, 1) else "depthwise"
        kern = kernel("Conv", name)
        assert kern.applies(layer)
        force_slow[0] = False
        calls.clear()
        fast = run_layer(kern, layer, ins)[0]
        # conv1x1 has one path (the native GEMM with the epilogue in its store); depthwise has two
        want_fast = (native.AVAILABLE and (act is None or act[0] in native.NATIVE_ACTS) and mode != "dynbias"
                     and name == "depthwise")
        assert bool(calls) == want_fast, (name, mode, act, calls)
        assert rel_err(fast, expect) <= TOL, f"{name} {mode} {act}"
        force_slow[0] = True
        calls.clear()
        slow = run_layer(kern, layer, ins)[0]
        assert not calls
        np.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-6)


def test_conv_fused_residual_against_onnxruntime_composition() -> None:
    """A Conv + Add + Relu graph in onnxruntime equals our fused node for every kernel."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 8, 10, 11), dtype=F32)
    w = (rng.standard_normal((8, 8, 3, 3)) / 8).astype(F32)
    b = rng.standard_normal(8).astype(F32)
    r = rng.standard_normal((1, 8, 10, 11), dtype=F32)
    nodes = [helper.make_node("Conv", ["X", "W", "B"], ["C"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["C", "R"], ["A"]), helper.make_node("Relu", ["A"], ["Y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x.shape)),
                                           helper.make_tensor_value_info("R", TensorProto.FLOAT, list(r.shape))],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"X": x, "R": r})[0]
    layer = single_node_layer("Conv", [x, w, b, r], dict(pads=[1, 1, 1, 1], residual=True, act=("Relu", ())),
                              const=[False, True, True, False])
    kinds = applicable_kernels(layer)
    assert {k.name for k in kinds} >= {"im2col", "winograd23", "winograd43", "direct"}
    for kern in kinds:
        assert rel_err(run_layer(kern, layer, [x, w, b, r])[0], ref) <= TOL, kern.name


# --------------------------------------------------------------------------- applies / transform contract


def _layer(xshape, cout, k, attrs, dtype=F32, const=None):
    g = attrs.get("group", 1)
    x, w, b = make_inputs(1, xshape, (cout, xshape[1] // g) + k, True)
    x = x.astype(dtype)
    w = w.astype(dtype)
    b = b.astype(dtype)
    return single_node_layer("Conv", [x, w, b], attrs, const=const), [x, w, b]


def test_applies_refusals() -> None:
    names = lambda layer: {k.name for k in applicable_kernels(layer)}  # noqa: E731
    wino = {"winograd23", "winograd43"}
    assert not names(_layer((1, 4, 8, 8), 4, (3, 3), dict(strides=[2, 2]))[0]) & wino
    assert not names(_layer((1, 4, 8, 8), 4, (3, 3), dict(strides=[1, 2]))[0]) & wino
    assert not names(_layer((1, 4, 8, 8), 4, (3, 3), dict(dilations=[2, 2]))[0]) & wino
    assert not names(_layer((1, 4, 8, 8), 4, (3, 3), dict(group=2))[0]) & wino
    assert not names(_layer((1, 4, 8, 8), 4, (5, 5), {})[0]) & wino
    assert not names(_layer((1, 4, 8), 4, (3,), {})[0]) & wino
    assert "conv1x1" not in names(_layer((1, 4, 8, 8), 4, (3, 3), {})[0])
    assert "conv1x1" not in names(_layer((1, 4, 8, 8), 4, (1, 1), dict(pads=[0, 1, 0, 0]))[0])
    assert "depthwise" not in names(_layer((1, 4, 8, 8), 4, (3, 3), dict(group=2))[0])
    assert "depthwise" not in names(_layer((1, 1, 8, 8), 4, (3, 3), {})[0])
    assert "depthwise" not in names(_layer((1, 4, 8, 8), 6, (3, 3), dict(group=2))[0])
    # not float32, or weights not constant: only the reference
    assert names(_layer((1, 4, 8, 8), 4, (3, 3), {}, dtype=np.float64)[0]) == {"direct"}
    assert names(_layer((1, 4, 8, 8), 4, (1, 1), {}, const=[False, False, True])[0]) == {"direct"}
    assert names(_layer((1, 4, 4, 4, 4), 4, (1, 1, 1), {})[0]) == {"direct"}


def test_direct_handles_float64_and_dynamic_weights() -> None:
    layer, ins = _layer((1, 4, 8, 8), 4, (3, 3), dict(pads=[1, 1, 1, 1]), dtype=np.float64)
    y = run_layer(kernel("Conv", "direct"), layer, ins)[0]
    assert y.dtype == np.float64
    ref = ort_run("Conv", ins[0].astype(F32), ins[1].astype(F32), ins[2].astype(F32), dict(pads=[1, 1, 1, 1]))
    assert rel_err(y, ref) <= TOL
    layer, ins = _layer((1, 4, 8, 8), 4, (3, 3), {}, const=[False, False, False])
    k = kernel("Conv", "direct")
    out = [np.empty(layer.out_shape(), F32)]
    k.run(layer, ins, k.transform(layer, {}), out)
    assert rel_err(out[0], ort_run("Conv", *ins, {})) <= TOL


TRANSFORM_SHAPES = [
    ((1, 8, 9, 7), 6, (3, 3), dict(pads=[1, 1, 1, 1])),
    ((1, 8, 9, 7), 6, (1, 1), dict(strides=[2, 2])),
    ((1, 8, 9, 7), 8, (3, 3), dict(group=8)),
    ((1, 8, 9, 7), 6, (3, 3), dict(group=2, strides=[2, 1])),
    ((1, 8, 15), 6, (3,), {}),
]


@pytest.mark.parametrize("shape", TRANSFORM_SHAPES, ids=[str(i) for i in range(len(TRANSFORM_SHAPES))])
def test_transform_pure_and_sizes(shape) -> None:
    layer, ins = _layer(*shape)
    for kern in applicable_kernels(layer):
        raw = {raw_key(i): ins[i] for i in layer.const_inputs}
        before = {k: v.copy() for k, v in raw.items()}
        for v in raw.values():
            v.flags.writeable = False  # a transform that writes into its input fails loudly
        params = kern.transform(layer, raw)
        for v in raw.values():
            v.flags.writeable = True
        for key, v in raw.items():
            assert np.array_equal(v, before[key]), f"{kern.name} mutated {key}"
        assert set(raw) == set(before)
        assert kern.transformed_nbytes(layer) == sum(a.nbytes for a in params.values()), kern.name
        assert isinstance(kern.workspace_nbytes(layer), int) and kern.workspace_nbytes(layer) >= 0
        # the params alone are enough to run (no reference back to the raw dict)
        out = [np.empty(layer.out_shape(), F32)]
        kern.run(layer, [ins[0], None, None], params, out)
        assert rel_err(out[0], run_layer(kernel("Conv", "direct"), layer, ins)[0]) <= TOL


def test_float16_weights_are_cast_by_transform() -> None:
    x, w, b = make_inputs(3, (1, 4, 6, 7), (6, 4, 3, 3), True)
    w16, b16 = w.astype(np.float16), b.astype(np.float16)
    layer = single_node_layer("Conv", [x, w16, b16], dict(pads=[1, 1, 1, 1]))
    ref = ort_run("Conv", x, w16.astype(F32), b16.astype(F32), dict(pads=[1, 1, 1, 1]))
    for kern in applicable_kernels(layer):
        params = kern.transform(layer, {raw_key(1): w16, raw_key(2): b16})
        assert kern.transformed_nbytes(layer) == sum(a.nbytes for a in params.values()), kern.name
        assert rel_err(run_layer(kern, layer, [x, w16, b16])[0], ref) <= TOL, kern.name


def test_workspace_sizes() -> None:
    layer, _ = _layer((1, 8, 9, 7), 6, (3, 3), dict(pads=[1, 1, 1, 1]))
    assert kernel("Conv", "im2col").workspace_nbytes(layer) == 8 * 9 * 9 * 7 * 4
    # packed for the native GEMM; F(2,3)'s 20 tiles take the A form (6 output channels in one 8-row panel x 8
    # inputs per position), F(4,3)'s 6 tiles (fewer than GEMM_BFORM_MAX_COLS) the B form: per position 8 inputs x
    # 96 columns (6 output channels padded to a panel)
    assert kernel("Conv", "winograd23").transformed_nbytes(layer) == 16 * 8 * 8 * 4 + 6 * 4
    assert kernel("Conv", "winograd43").transformed_nbytes(layer) == 36 * 8 * 96 * 4 + 6 * 4
    big, _ = _layer((1, 8, 40, 40), 6, (3, 3), dict(pads=[1, 1, 1, 1]))  # 400 tiles: the A form, 8-row panels
    assert kernel("Conv", "winograd23").transformed_nbytes(big) == 16 * 8 * 8 * 4 + 6 * 4
    layer, _ = _layer((1, 8, 9, 7), 6, (1, 1), {})
    assert kernel("Conv", "conv1x1").workspace_nbytes(layer) == 0


def test_output_into_strided_arena_view_and_batches() -> None:
    layer, ins = _layer((2, 6, 9, 8), 6, (3, 3), dict(pads=[1, 1, 1, 1]))
    ref = run_layer(kernel("Conv", "direct"), layer, ins)[0]
    for kern in applicable_kernels(layer):
        params = kern.transform(layer, {raw_key(i): ins[i] for i in layer.const_inputs})
        big = np.full((2, 12, 9, 8), np.nan, F32)
        view = big[:, ::2]  # not contiguous: the kernel must still fill it in place
        kern.run(layer, [ins[0], None, None], params, [view])
        assert rel_err(view, ref) <= TOL, kern.name
        assert np.isnan(big[:, 1::2]).all()


def test_winograd_banded_equals_whole() -> None:
    layer, ins = _layer((1, 8, 23, 19), 8, (3, 3), dict(pads=[1, 1, 1, 1]))
    for cls in (ConvWinograd23, ConvWinograd43):
        whole = run_layer(cls(), layer, ins)[0]
        k = cls()
        k.band_bytes = 1  # one tile row at a time
        assert k.workspace_nbytes(layer) < cls().workspace_nbytes(layer)
        assert np.allclose(run_layer(k, layer, ins)[0], whole, rtol=0, atol=1e-5)


def test_winograd_matrices_and_accuracy() -> None:
    rng = np.random.default_rng(0)
    for m, pts in ((2, (0, 1, -1)), (4, (0, 1, -1, 2, -2)), (4, ConvWinograd43.points)):
        at, g, bt = winograd_matrices(m, 3, pts)
        d, w = rng.standard_normal(m + 2), rng.standard_normal(3)
        assert np.allclose(at @ ((g @ w) * (bt @ d)), np.correlate(d, w, "valid"), atol=1e-12)
    # the Lavin/ncnn F(4,3) input transform is reproduced for points 0, +-1, +-2
    _, _, bt = winograd_matrices(4, 3, (0, 1, -1, 2, -2))
    assert np.allclose(bt[0], [4, 0, -5, 0, 1, 0]) and np.allclose(bt[5], [0, 4, 0, -5, 0, 1])
    # float32 F(4,3) on a realistic layer (ReLU inputs, 128 channels) against a float64 reference
    x = np.maximum(rng.standard_normal((1, 128, 20, 20)), 0).astype(F32)
    w = (rng.standard_normal((64, 128, 3, 3)) / math.sqrt(9 * 128)).astype(F32)
    layer = single_node_layer("Conv", [x, w], dict(pads=[1, 1, 1, 1]))
    ref = conv_nd(x.astype(np.float64), w.astype(np.float64), layer_geom(layer))
    assert rel_err(run_layer(ConvWinograd43(), layer, [x, w])[0], ref) <= 1e-5
    assert rel_err(run_layer(ConvWinograd23(), layer, [x, w])[0], ref) <= 2e-6


def test_shape_errors_and_check() -> None:
    spec = op_spec("Conv")
    x, w, _ = make_inputs(0, (1, 6, 8, 8), (4, 4, 3, 3), False)  # 6 channels vs 4 in the weights
    with pytest.raises(ShapeError):
        single_node_layer("Conv", [x, w], {})
    _, w5, _ = make_inputs(0, (1, 6, 8, 8), (5, 3, 3, 3), False)
    with pytest.raises(ShapeError):
        single_node_layer("Conv", [x, w5], dict(group=2))  # 5 output channels do not split into 2 groups
    x, w, _ = make_inputs(0, (1, 4, 2, 2), (4, 4, 3, 3), False)
    with pytest.raises(ShapeError):
        single_node_layer("Conv", [x, w], {})  # output would be empty
    with pytest.raises(UnsupportedOpError):
        assert spec.check is not None
        spec.check(Node("n", "Conv", ["x", "w"], ["y"], {"auto_pad": "SAME_MIDDLE"}), 17)
    spec.check(Node("n", "Conv", ["x", "w"], ["y"], {"auto_pad": "SAME_LOWER"}), 17)


# --------------------------------------------------------------------------- ConvTranspose

# id, input shape, Cout, kernel shape, attrs, bias
CT_CASES: list[tuple[str, tuple[int, ...], int, tuple[int, ...], dict[str, Any], bool]] = [
    ("k3s1", (1, 4, 5, 6), 6, (3, 3), {}, True),
    ("k3s2p1op1_b2", (2, 4, 5, 6), 3, (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]), True),
    ("k2s2", (1, 8, 4, 5), 4, (2, 2), dict(strides=[2, 2]), False),
    ("k4s2p1", (1, 3, 5, 5), 2, (4, 4), dict(strides=[2, 2], pads=[1, 1, 1, 1]), True),
    ("asym", (1, 3, 5, 6), 4, (3, 3), dict(strides=[2, 3], pads=[0, 1, 2, 0]), True),
    ("dilated", (1, 3, 5, 6), 2, (3, 3), dict(dilations=[2, 2], strides=[2, 1], pads=[1, 0, 0, 1]), True),
    ("group2", (1, 4, 5, 6), 6, (3, 3), dict(group=2, strides=[2, 2]), True),
    ("dw", (1, 4, 5, 6), 4, (3, 3), dict(group=4, strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]), True),
    ("output_shape", (1, 3, 5, 6), 2, (3, 3), dict(strides=[2, 2], output_shape=[10, 12]), True),
    ("output_shape_odd", (1, 3, 5, 6), 2, (3, 3), dict(strides=[2, 2], output_shape=[11, 12]), True),
    # total padding 1 (odd): the extra pad goes to the end for SAME_UPPER, to the begin for SAME_LOWER
    ("same_upper_odd", (1, 3, 5, 6), 2, (3, 3), dict(strides=[2, 2], auto_pad="SAME_UPPER"), True),
    ("same_lower_odd", (1, 3, 5, 6), 2, (3, 3), dict(strides=[2, 2], auto_pad="SAME_LOWER"), True),
    ("same_lower_even", (1, 3, 5, 6), 2, (4, 4), dict(strides=[2, 2], auto_pad="SAME_LOWER"), True),
    ("valid", (1, 3, 5, 6), 2, (3, 3), dict(strides=[2, 2], auto_pad="VALID"), True),
    # enough channels and pixels for the GEMM and the scatter-add to split over threads (unet's up-convs)
    ("k3s2_threads", (1, 32, 24, 24), 16, (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
     True),
    ("k2s2_group2_threads", (1, 32, 20, 20), 24, (2, 2), dict(strides=[2, 2], group=2), True),
    ("1d", (1, 3, 7), 2, (3,), dict(strides=[2], pads=[1, 0], output_padding=[1]), True),
    ("3d", (1, 2, 3, 4, 3), 2, (2, 2, 2), dict(strides=[2, 2, 1]), True),
]


@pytest.mark.parametrize("case", CT_CASES, ids=[c[0] for c in CT_CASES])
def test_conv_transpose_vs_onnxruntime(case) -> None:
    cid, xshape, cout, k, attrs, bias = case
    g = attrs.get("group", 1)
    x, w, _ = make_inputs(len(cid), xshape, (xshape[1], cout // g) + k, False)
    b = np.random.default_rng(1).standard_normal(cout).astype(F32) if bias else None
    ref = ort_run("ConvTranspose", x, w, b, attrs)
    ins = [x, w] + ([b] if b is not None else [])
    layer = single_node_layer("ConvTranspose", ins, attrs)
    assert layer.out_shape() == ref.shape
    names = {kk.name for kk in applicable_kernels(layer)}
    assert names == ({"direct"} if len(k) > 2 else {"direct", "col2im"})
    for kern in applicable_kernels(layer):
        assert rel_err(run_layer(kern, layer, ins)[0], ref) <= TOL, kern.name
    assert rel_err(op_spec("ConvTranspose").reference(layer.node, list(ins))[0], ref) <= TOL


@pytest.mark.parametrize("act", [("Relu", ()), ("Sigmoid", ())], ids=["relu", "sigmoid"])
def test_conv_transpose_fused(act) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 4, 5, 6), dtype=F32)
    w = (rng.standard_normal((4, 3, 3, 3)) / 6).astype(F32)
    b = rng.standard_normal(3).astype(F32)
    attrs = dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])
    ref = ort_run("ConvTranspose", x, w, b, attrs)
    res = rng.standard_normal(ref.shape, dtype=F32)
    layer = single_node_layer("ConvTranspose", [x, w, b, res], {**attrs, "act": act, "residual": True},
                              const=[False, True, True, False])
    expect = apply_act(ref + res, act)
    for kern in applicable_kernels(layer):
        assert rel_err(run_layer(kern, layer, [x, w, b, res])[0], expect) <= TOL, kern.name
    # transform contract for col2im too
    k = kernel("ConvTranspose", "col2im")
    params = k.transform(layer, {raw_key(1): w, raw_key(2): b})
    assert k.transformed_nbytes(layer) == sum(a.nbytes for a in params.values())
    assert k.workspace_nbytes(layer) == 3 * 9 * 5 * 6 * 4


CT_2D = [c for c in CT_CASES if len(c[3]) == 2]


@pytest.mark.skipif(not native.AVAILABLE, reason="native kernels not built")
@pytest.mark.parametrize("case", CT_2D, ids=[c[0] for c in CT_2D])
def test_conv_transpose_col2im_bound_call(case) -> None:
    """col2im's pre-bound call (the GEMM on the packed weights, then the scatter-add into planes it first sets to
    the bias) against onnxruntime, twice (the planes are set again, not accumulated into), on 1-3 threads, and
    after its input changed; a batch of two is left to run()."""
    cid, xshape, cout, k, attrs, bias = case
    g = attrs.get("group", 1)
    x, w, _ = make_inputs(len(cid) + 30, xshape, (xshape[1], cout // g) + k, False)
    b = np.random.default_rng(3).standard_normal(cout).astype(F32) if bias else None
    ins = [x, w] + ([b] if b is not None else [])
    layer = single_node_layer("ConvTranspose", ins, attrs)
    kern = kernel("ConvTranspose", "col2im")
    params = kern.transform(layer, {raw_key(1): w, **({raw_key(2): b} if b is not None else {})})
    assert kern.transformed_nbytes(layer) == sum(a.nbytes for a in params.values())
    out = np.full(layer.out_shape(), np.nan, F32)
    call = kern.bind(layer, [x] + [None] * (len(ins) - 1), params, [out])
    assert (call is not None) == (xshape[0] == 1), cid
    if call is None:
        return
    old = native.num_threads()
    try:
        for threads in (1, 2, 3):
            native.set_num_threads(threads)
            call()
            assert rel_err(out, ort_run("ConvTranspose", x, w, b, attrs)) <= TOL, (cid, threads)
        x[...] = -x
        call()
        assert rel_err(out, ort_run("ConvTranspose", x, w, b, attrs)) <= TOL, (cid, "new input")
    finally:
        native.set_num_threads(old)


# --------------------------------------------------------------------------- native helpers vs numpy

needs_native = pytest.mark.skipif(not native.AVAILABLE, reason="inferd._native not built")

GEOMS = [  # C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr
    (3, 7, 9, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
    (4, 10, 11, 3, 2, 2, 3, 2, 1, 0, 2, 1, 0),
    (2, 5, 5, 5, 5, 1, 1, 1, 1, 2, 2, 2, 2),
    (2, 6, 8, 1, 1, 2, 2, 1, 1, 0, 0, 0, 0),
    (5, 9, 4, 3, 3, 2, 1, 1, 2, 3, 0, 0, 2),
    (40, 30, 31, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),  # big enough to be split over threads
    (3, 70, 67, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1),  # 3x3 stride 2 on a wide map: the row-wise depthwise path
    (4, 20, 40, 5, 5, 2, 2, 1, 1, 2, 2, 2, 2),  # 5x5 stride 2: the phase-split depthwise path
]


def _out(h: int, w: int, g) -> tuple[int, int]:
    _, _, _, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr = g
    return (h + pt + pb - ((kh - 1) * dh + 1)) // sh + 1, (w + pl + pr - ((kw - 1) * dw + 1)) // sw + 1


@pytest.fixture(params=["blocked", "per-channel"])
def dw_form(request):
    """Both depthwise forms: channel-blocked (small maps by default) and per-channel, on every geometry."""
    if native.AVAILABLE:
        native.lib.inferd_dw_blocked_max_pixels(1 << 30 if request.param == "blocked" else 0)
    yield request.param
    if native.AVAILABLE:
        native.lib.inferd_dw_blocked_max_pixels(1024)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("geom", GEOMS, ids=[str(i) for i in range(len(GEOMS))])
def test_native_im2col_col2im_dw(geom, threads: int, dw_form: str) -> None:
    c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, _, _ = geom
    oh, ow = _out(h, w, geom)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((c, h, w), dtype=F32)
    old = native.num_threads()
    native.set_num_threads(threads)
    try:
        a = np.full((c * kh * kw, oh * ow), np.nan, F32)
        native.im2col(x, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, a)
        assert np.array_equal(a, native.numpy_im2col(x, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, np.empty_like(a)))
        col = rng.standard_normal(a.shape, dtype=F32)
        y1 = np.ones((c, h, w), F32)  # accumulates into what is there
        native.col2im(col, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, y1)
        y2 = native.numpy_col2im(col, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, np.ones((c, h, w), F32))
        assert np.allclose(y1, y2, atol=1e-5)
        # adjoint identity <im2col(x), col> == <x, col2im(col)>
        y0 = native.col2im(col, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, np.zeros((c, h, w), F32))
        assert np.isclose(np.vdot(a.astype(np.float64), col), np.vdot(x.astype(np.float64), y0), rtol=1e-5)
        for mult in (1, 2):
            wt = rng.standard_normal((c * mult, kh, kw), dtype=F32)
            bias = rng.standard_normal(c * mult).astype(F32)
            o1 = np.full((c * mult, oh, ow), np.nan, F32)
            native.dwconv2d(x, wt, bias, o1, sh, sw, dh, dw, pt, pl)
            o2 = native.numpy_dwconv2d(x, wt, bias, np.empty_like(o1), sh, sw, dh, dw, pt, pl)
            assert rel_err(o1, o2) <= 1e-5
            native.dwconv2d(x, wt, None, o1, sh, sw, dh, dw, pt, pl)
            assert rel_err(o1, native.numpy_dwconv2d(x, wt, None, o2, sh, sw, dh, dw, pt, pl)) <= 1e-5
            for act in (("Relu", ()), ("Clip", (-0.5, 1.0)), ("LeakyRelu", (0.3,)), ("SiLU", ()), ("HardSwish", ())):
                native.dwconv2d(x, wt, bias, o1, sh, sw, dh, dw, pt, pl, act)
                o2 = native.numpy_dwconv2d(x, wt, bias, o2, sh, sw, dh, dw, pt, pl)
                apply_act(o2, act)
                assert rel_err(o1, o2) <= 1e-5
    finally:
        native.set_num_threads(old)


@needs_native
@pytest.mark.parametrize("cls", [ConvWinograd23, ConvWinograd43], ids=["f23", "f43"])
def test_native_winograd_transforms(cls) -> None:
    k = cls()
    rng = np.random.default_rng(2)
    a2 = k.alpha ** 2
    for c, h, w, pt, pl, th, tw in ((3, 7, 9, 1, 1, 3, 3), (2, 8, 8, 0, 0, 2, 2), (2, 5, 11, 2, -1, 3, 4),
                                    (1, 4, 4, 1, 2, 2, 2), (33, 30, 29, 1, 1, 8, 8)):
        x = rng.standard_normal((c, h, w), dtype=F32)
        p = th * tw + 3
        v1 = np.full((a2, c, p), 7.0, F32)
        v2 = v1.copy()
        native.winograd_input(x, pt, pl, th, tw, k.m, k.bt, v1, 2)
        native.numpy_winograd_input(x, pt, pl, th, tw, k.m, k.bt, v2, 2)
        assert np.allclose(v1, v2, atol=1e-5)
        assert (v1[:, :, :2] == 7.0).all() and (v1[:, :, 2 + th * tw:] == 7.0).all()  # only its tiles written
        mw = rng.standard_normal((a2, c, p), dtype=F32)
        bias = rng.standard_normal(c).astype(F32)
        oh, ow = th * k.m - 1, tw * k.m - 2
        y1 = np.full((c, oh, ow), np.nan, F32)
        native.winograd_output(mw, th, tw, k.m, k.at, bias, y1, 1)
        y2 = native.numpy_winograd_output(mw, th, tw, k.m, k.at, bias, np.empty_like(y1), 1)
        assert np.allclose(y1, y2, atol=1e-4)
        # the fused epilogue: + residual, then the activation, per channel
        res = rng.standard_normal(y1.shape, dtype=F32)
        for act in (("Relu", ()), ("Clip", (-0.5, 0.7)), ("HardSwish", ())):
            y3 = np.full_like(y1, np.nan)
            native.winograd_output(mw, th, tw, k.m, k.at, bias, y3, 1, res, act)
            want = y2 + res
            apply_act(want, act)
            assert np.allclose(y3, want, atol=1e-4), act
            y4 = native.numpy_winograd_output(mw, th, tw, k.m, k.at, bias, np.empty_like(y1), 1, res, act)
            assert np.allclose(y4, want, atol=1e-4), act
        y5 = np.full_like(y1, np.nan)
        native.winograd_output(mw, th, tw, k.m, k.at, None, y5, 1, None, ("Relu", ()))
        assert np.allclose(y5, np.maximum(y2 - bias[:, None, None], 0), atol=1e-4)


@needs_native
def test_native_bias_act() -> None:
    rng = np.random.default_rng(4)
    acts = [None, ("Relu", ()), ("Clip", (0.0, 6.0)), ("Clip", (-np.inf, 1.0)), ("LeakyRelu", (0.2,)), ("Sigmoid", ()),
            ("SiLU", ()), ("HardSwish", ()), ("HardSigmoid", (0.2, 0.5)), ("Gelu", (0.0,)), ("Gelu", (1.0,))]
    assert {a[0] for a in acts if a} == set(native.NATIVE_ACTS)
    for act in acts:
        for with_bias in (True, False):
            for with_res in (True, False):
                y = rng.standard_normal((70, 33, 31), dtype=F32) * 4
                y[0, 0, :6] = [0.0, 1e-30, 80.0, -80.0, 300.0, -300.0]  # exp's clamps and tiny values
                bias = rng.standard_normal(70).astype(F32) if with_bias else None
                res = rng.standard_normal(y.shape, dtype=F32) if with_res else None
                expect = y + (0 if bias is None else bias[:, None, None]) + (0 if res is None else res)
                apply_act(expect, act)  # the activation module's definition is the reference
                assert rel_err(native.numpy_bias_act(y.copy(), bias, res, act), expect) <= 1e-6
                got = native.bias_act(y, bias, res, act)
                assert rel_err(got, expect) <= 1e-6 and np.abs(got - expect).max() <= 2e-6, act
        # a column block of a bigger matrix (strided rows)
        big = rng.standard_normal((6, 40), dtype=F32)
        expect = big.copy()
        apply_act(expect[:, 5:25], act)
        native.bias_act(big[:, 5:25], None, None, act)
        assert rel_err(big, expect) <= 1e-6
    with pytest.raises(ValueError):
        native.bias_act(np.zeros((2, 3), F32), None, None, ("Tanh", ()))


def test_missing_extension_falls_back_with_warning(monkeypatch, caplog) -> None:
    """A stale or missing extension: the wrapper logs a warning and every kernel still runs (numpy paths)."""
    import inferd

    fake = types.SimpleNamespace(lib=types.SimpleNamespace(inferd_native_abi=lambda: -1), ffi=None)
    monkeypatch.setattr(inferd, "_native", fake, raising=False)
    monkeypatch.setitem(sys.modules, "inferd._native", fake)
    spec = importlib.util.spec_from_file_location("inferd._native_probe", native.__file__)
    assert spec is not None and spec.loader is not None
    probe = importlib.util.module_from_spec(spec)
    with caplog.at_level(logging.WARNING):
        spec.loader.exec_module(probe)
    assert probe.AVAILABLE is False
    assert "numpy fallbacks" in caplog.text and "ABI -1" in caplog.text

    monkeypatch.setattr(native, "AVAILABLE", False)
    for xshape, cout, k, attrs in FUSE_SHAPES + [((1, 4, 9, 8), 4, (3, 3), dict(pads=[1, 0, 1, 2]))]:
        g = attrs.get("group", 1)
        x, w, b = make_inputs(2, xshape, (cout, xshape[1] // g) + k, True)
        ref = ort_run("Conv", x, w, b, attrs)
        layer = single_node_layer("Conv", [x, w, b], {**attrs, "act": ("Relu", ())})
        for kern in applicable_kernels(layer):
            assert rel_err(run_layer(kern, layer, [x, w, b])[0], np.maximum(ref, 0)) <= TOL, kern.name
    x, w, _ = make_inputs(4, (1, 4, 5, 6), (4, 3, 3, 3), False)
    attrs = dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])
    layer = single_node_layer("ConvTranspose", [x, w], attrs)
    assert rel_err(run_layer(kernel("ConvTranspose", "col2im"), layer, [x, w])[0],
                   ort_run("ConvTranspose", x, w, None, attrs)) <= TOL


def test_native_abi_and_fallback_flag() -> None:
    assert native.ABI == 22
    if native.AVAILABLE:
        assert native.lib.inferd_native_abi() == native.ABI


# --------------------------------------------------------------------------- native C on other ISAs

# A C harness that checks every native function against naive loops on random geometries. The extension
# itself runs the clone for this CPU (AVX-512 here); these builds cover the baseline x86-64 path and,
# where a cross compiler and qemu-aarch64 are installed, aarch64 (NEON).
C_HARNESS = r"""
/* Cross-architecture check of native/*.c against naive reference loops. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "inferd_native.h"
static unsigned long long rs = 88172645463325252ULL;
static float rnd(void){ rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (float)((rs >> 11) % 2000000) / 1000000.0f - 1.0f; }
static int irand(int a, int b){ rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return a + (int)((rs >> 11) % (unsigned)(b - a + 1)); }
static float* buf(size_t n){ float* p = malloc(sizeof(float) * (n ? n : 1)); for (size_t i = 0; i < n; ++i) p[i] = rnd(); return p; }
static double maxdiff(const float* a, const float* b, size_t n){ double m = 0; for (size_t i = 0; i < n; ++i){ double d = fabs((double)a[i] - b[i]); if (d > m || d != d) m = d != d ? 1e30 : d; } return m; }
static int fails = 0;
static void check(const char* what, double d, double tol, int it){ if (!(d <= tol)) { printf("FAIL %s iter %d diff %g\n", what, it, d); fails++; } }
static float clamp01(float t){ return t < 0 ? 0 : (t > 1 ? 1 : t); }
static float actf(float v, int act, float p0, float p1){ if (act == 1) return v < 0 ? 0 : v; if (act == 2) return v < p0 ? p0 : (v > p1 ? p1 : v); if (act == 3) return v < 0 ? v * p0 : v;
  if (act == 4) return 1.0f / (1.0f + expf(-v)); if (act == 5) return v / (1.0f + expf(-v)); if (act == 6) return v * clamp01(v / 6.0f + 0.5f); if (act == 7) return clamp01(v * p0 + p1); return v; }
int main(void){
  for (int it = 0; it < 400; ++it) {
    int C = irand(1, 5), H = irand(1, 17), W = irand(1, 19), kh = irand(1, 7), kw = irand(1, 7);
    int sh = irand(1, 3), sw = irand(1, 3), dh = irand(1, 2), dw = irand(1, 2);
    if (it % 3 == 0) { kh = kw = (it % 2) ? 3 : 5; sh = sw = irand(1, 2); dh = dw = 1; }
    int pt = irand(0, 3), pl = irand(0, 3), pb = irand(0, 3), pr = irand(0, 3);
    if (it % 5 == 1) { /* dwconv.c's in-place form: stride 1, same columns, rows from one vector + pl (4 floats on
                          aarch64, 8 on x86-64, where the narrower rows take the padded-row form) to past 4 vectors */
      kh = kw = (it % 2) ? 3 : 5; sh = sw = 1; dh = dw = 1; pl = pr = kw / 2; W = irand(4 + pl, 40);
    }
    int OH = (H + pt + pb - ((kh - 1) * dh + 1)) / sh + 1, OW = (W + pl + pr - ((kw - 1) * dw + 1)) / sw + 1;
    if (H + pt + pb < (kh - 1) * dh + 1 || W + pl + pr < (kw - 1) * dw + 1 || OH < 1 || OW < 1) continue;
    size_t K = (size_t)C * kh * kw, P = (size_t)OH * OW;
    float* x = buf((size_t)C * H * W);
    float* col = buf(K * P); float* ref = buf(K * P);
    inferd_im2col(x, C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, col);
    for (int c = 0; c < C; ++c) for (int i = 0; i < kh; ++i) for (int j = 0; j < kw; ++j) for (int oh = 0; oh < OH; ++oh) for (int ow = 0; ow < OW; ++ow) {
      int ih = oh * sh - pt + i * dh, iw = ow * sw - pl + j * dw;
      ref[((size_t)(c * kh + i) * kw + j) * P + oh * OW + ow] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? x[((size_t)c * H + ih) * W + iw] : 0.0f; }
    check("im2col", maxdiff(col, ref, K * P), 0, it);
    { /* convtile.c: banded im2col + GEMM against the column matrix times W; any band, 0-2 workspace slices */
      int M = irand(1, 20), act2 = irand(0, 7), band = it % 2 ? inferd_conv_tiled_band(C, kh, kw, OH, OW) : irand(1, OH), slots = irand(0, 2);
      float q0 = act2 == 3 ? 0.1f : (act2 == 7 ? 0.2f : -0.3f), q1 = 0.4f;
      float* wt = buf((size_t)M * K); float* bt = buf((size_t)M); float* rt = buf((size_t)M * P);
      float* apk = malloc(sizeof(float) * (size_t)(inferd_gemm_packed_size(M, (int)K) + 1));
      inferd_gemm_pack_a(wt, (long long)K, 1, M, (int)K, apk);
      float* ws = malloc(sizeof(float) * (size_t)(inferd_conv_tiled_workspace(C, kh, kw, OW, band, slots) + 1));
      float* yt = buf((size_t)M * P); float* ytr = malloc(sizeof(float) * (size_t)M * P);
      if (inferd_conv_tiled(x, C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, apk, M, it % 2 ? bt : NULL, it % 3 ? rt : NULL, yt, act2, q0, q1, ws, band, slots)) { printf("oom\n"); return 1; }
      for (int m = 0; m < M; ++m) for (size_t q = 0; q < P; ++q) { double sacc = it % 2 ? bt[m] : 0.0;
        for (size_t k = 0; k < K; ++k) sacc += (double)wt[(size_t)m * K + k] * ref[k * P + q];
        if (it % 3) sacc += rt[(size_t)m * P + q];
        ytr[(size_t)m * P + q] = actf((float)sacc, act2, q0, q1); }
      check("conv_tiled", maxdiff(yt, ytr, (size_t)M * P), 1e-3, it);
      free(wt); free(bt); free(rt); free(apk); free(ws); free(yt); free(ytr);
    }
    float* y = buf((size_t)C * H * W); float* yr = malloc(sizeof(float) * C * H * W); memcpy(yr, y, sizeof(float) * C * H * W);
    inferd_col2im(col, C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, y);
    for (int c = 0; c < C; ++c) for (int i = 0; i < kh; ++i) for (int j = 0; j < kw; ++j) for (int oh = 0; oh < OH; ++oh) for (int ow = 0; ow < OW; ++ow) {
      int ih = oh * sh - pt + i * dh, iw = ow * sw - pl + j * dw;
      if (ih >= 0 && ih < H && iw >= 0 && iw < W) yr[((size_t)c * H + ih) * W + iw] += col[((size_t)(c * kh + i) * kw + j) * P + oh * OW + ow]; }
    check("col2im", maxdiff(y, yr, (size_t)C * H * W), 1e-5, it);
    int mult = irand(1, 2), act = irand(0, 7); float p0 = act == 3 ? 0.1f : (act == 7 ? 0.2f : -0.3f), p1 = 0.4f;
    float* w = buf((size_t)C * mult * kh * kw); float* b = buf((size_t)C * mult);
    float* o = buf((size_t)C * mult * P); float* orf = buf((size_t)C * mult * P);
    inferd_dw_blocked_max_pixels(it % 4 < 2 ? 1 << 30 : 0); /* the channel-blocked and the per-channel forms */
    if (inferd_dwconv2d(x, w, it % 2 ? b : NULL, o, C, mult, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, act, p0, p1)) { printf("oom\n"); return 1; }
    for (int co = 0; co < C * mult; ++co) for (int oh = 0; oh < OH; ++oh) for (int ow = 0; ow < OW; ++ow) {
      float acc = it % 2 ? b[co] : 0.0f;
      for (int i = 0; i < kh; ++i) for (int j = 0; j < kw; ++j) { int ih = oh * sh - pt + i * dh, iw = ow * sw - pl + j * dw;
        if (ih >= 0 && ih < H && iw >= 0 && iw < W) acc += w[(size_t)co * kh * kw + i * kw + j] * x[((size_t)(co / mult) * H + ih) * W + iw]; }
      orf[(size_t)co * P + oh * OW + ow] = actf(acc, act, p0, p1); }
    check("dwconv2d", maxdiff(o, orf, (size_t)C * mult * P), 1e-4, it);
    if (inferd_dwconv2d_direct_applies(mult, kh, kw, sh, sw, dh, dw)) { /* dwconv.c: the padded-row form */
      float* od = buf((size_t)C * P);
      if (inferd_dwconv2d_direct(x, w, it % 2 ? b : NULL, od, C, H, W, kh, sh, pt, pl, OH, OW, act, p0, p1)) { printf("oom\n"); return 1; }
      check("dwconv2d_direct", maxdiff(od, orf, (size_t)C * P), 1e-4, it);
      free(od);
    }
    /* winograd: transform then inverse-free check via the direct definition of BT d B^T per tile */
    for (int mm = 2; mm <= 4; mm += 2) {
      int alpha = mm + 2; const float* BT = mm == 2 ? BT2 : BT4; const float* AT = mm == 2 ? AT2 : AT4;
      int tH = irand(1, 4), tW = irand(1, 5), wpt = irand(-2, 2), wpl = irand(-1, 2); size_t PT = (size_t)tH * tW + 2;
      float* V = buf((size_t)alpha * alpha * C * PT); float* Vr = malloc(sizeof(float) * alpha * alpha * C * PT); memcpy(Vr, V, sizeof(float) * alpha * alpha * C * PT);
      inferd_winograd_input(x, C, H, W, wpt, wpl, tH, tW, mm, alpha, BT, V, (long long)C * PT, (long long)PT, 1);
      for (int c = 0; c < C; ++c) for (int ti = 0; ti < tH; ++ti) for (int tj = 0; tj < tW; ++tj) for (int a = 0; a < alpha; ++a) for (int bb = 0; bb < alpha; ++bb) {
        double s = 0; for (int r = 0; r < alpha; ++r) for (int q = 0; q < alpha; ++q) { int ih = ti * mm - wpt + r, iw = tj * mm - wpl + q;
          float v = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? x[((size_t)c * H + ih) * W + iw] : 0.0f; s += (double)BT[a * alpha + r] * v * BT[bb * alpha + q]; }
        Vr[((size_t)(a * alpha + bb) * C + c) * PT + 1 + ti * tW + tj] = (float)s; }
      check("winograd_input", maxdiff(V, Vr, (size_t)alpha * alpha * C * PT), 1e-4, it);
      int OH2 = tH * mm - irand(0, mm - 1), OW2 = tW * mm - irand(0, mm - 1);
      float* yo = buf((size_t)C * OH2 * OW2); float* yor = buf((size_t)C * OH2 * OW2);
      inferd_winograd_output(V, C, OH2, OW2, tH, tW, mm, alpha, AT, it % 2 ? b : NULL, yo, (long long)C * PT, (long long)PT, 1);
      for (int c = 0; c < C; ++c) for (int ti = 0; ti < tH; ++ti) for (int tj = 0; tj < tW; ++tj) for (int i = 0; i < mm; ++i) for (int j = 0; j < mm; ++j) {
        int oh = ti * mm + i, ow = tj * mm + j; if (oh >= OH2 || ow >= OW2) continue;
        double s = it % 2 ? b[c] : 0; for (int a = 0; a < alpha; ++a) for (int bb = 0; bb < alpha; ++bb) s += (double)AT[i * alpha + a] * V[((size_t)(a * alpha + bb) * C + c) * PT + 1 + ti * tW + tj] * AT[j * alpha + bb];
        yor[((size_t)c * OH2 + oh) * OW2 + ow] = (float)s; }
      check("winograd_output", maxdiff(yo, yor, (size_t)C * OH2 * OW2), 1e-3, it);
      { /* the fused form: + residual, then a ReLU */
        /* filled without rnd(): the later checks keep their inputs */
        float* rz = malloc(sizeof(float) * ((size_t)C * OH2 * OW2 + 1)); float* yx = malloc(sizeof(float) * ((size_t)C * OH2 * OW2 + 1));
        for (size_t q = 0; q < (size_t)C * OH2 * OW2; ++q) rz[q] = 0.3f * (float)((int)(q % 7) - 3);
        inferd_winograd_output_ex(V, C, OH2, OW2, tH, tW, mm, alpha, AT, it % 2 ? b : NULL, yx, (long long)C * PT, (long long)PT, 1, rz, 1, 0.0f, 0.0f);
        for (size_t q = 0; q < (size_t)C * OH2 * OW2; ++q) { float v = yor[q] + rz[q]; yor[q] = v < 0 ? 0 : v; }
        check("winograd_output_ex", maxdiff(yx, yor, (size_t)C * OH2 * OW2), 1e-3, it);
        free(rz); free(yx);
      }
      free(V); free(Vr); free(yo); free(yor);
    }
    float* e = buf((size_t)C * P); float* er = malloc(sizeof(float) * C * P); float* res = buf((size_t)C * P); memcpy(er, e, sizeof(float) * C * P);
    inferd_bias_act(e, (long long)P, b, it % 2 ? res : NULL, (long long)P, C, (long long)P, act, p0, p1);
    for (int c = 0; c < C; ++c) for (size_t k = 0; k < P; ++k) er[c * P + k] = actf(er[c * P + k] + b[c] + (it % 2 ? res[c * P + k] : 0), act, p0, p1);
    check("bias_act", maxdiff(e, er, (size_t)C * P), 2e-6, it);
    free(x); free(col); free(ref); free(y); free(yr); free(w); free(b); free(o); free(orf); free(e); free(er); free(res);
  }
  inferd_pool_set_threads(2);
  for (int it = 0; it < 300; ++it) { /* packed GEMM, both store layouts, every epilogue, against naive loops */
    int M = irand(1, 40), K = irand(0, 300), N = irand(1, 70), tr = irand(0, 1), act = irand(0, 7), hasb = irand(0, 1), hasr = irand(0, 1);
    if (it % 5 == 0) N = irand(1, 8); /* the few-column path (N <= 8) */
    /* several K blocks under a ragged last panel (drawn without irand: the later checks keep their inputs) */
    if (it % 15 == 1) { K = 600 + (it * 37) % 900; N = 130 + (it * 53) % 170; }
    /* more rows than the few-rows path takes: a linear layer's rows a 16-column slice at a time (gemm_slices) */
    if (it % 15 == 7) M = 33 + (it * 29) % 70;
    float p0 = act == 3 ? 0.1f : (act == 7 ? 0.2f : -0.3f), p1 = 0.4f;
    float* A = buf((size_t)M * K + 1); float* B = buf((size_t)K * N + 1); float* bias = buf((size_t)M); float* R = buf((size_t)M * N);
    float* ap = malloc(sizeof(float) * (size_t)(inferd_gemm_packed_size(M, K) + 1));
    inferd_gemm_pack_a(A, K, 1, M, K, ap);
    float* Cc = buf((size_t)M * N); float* Cr = malloc(sizeof(float) * (size_t)M * N);
    /* tr: B is stored N x K and C (and R) N x M (the linear-layer layout) */
    long long bsk = tr ? 1 : N, bsn = tr ? K : 1, csm = tr ? 1 : N, csn = tr ? M : 1;
    if (inferd_gemm(ap, 0, M, K, N, 1, B, bsk, bsn, 0, Cc, csm, csn, 0, hasb ? bias : NULL, 0, hasr ? R : NULL, 0, act, p0, p1, 0)) { printf("oom\n"); return 1; }
    for (int m = 0; m < M; ++m) for (int n = 0; n < N; ++n) { double s = hasb ? bias[m] : 0.0;
      for (int k = 0; k < K; ++k) s += (double)A[(size_t)m * K + k] * B[(size_t)k * bsk + (size_t)n * bsn];
      if (hasr) s += R[(size_t)m * csm + (size_t)n * csn];
      Cr[(size_t)m * csm + (size_t)n * csn] = actf((float)s, act, p0, p1); }
    check("gemm", maxdiff(Cc, Cr, (size_t)M * N), 1e-3, it);
    { /* two activations (attention's products): A read in place, B unpacked at its strides; the small ones
         (M N K <= 128k) take gemm_small */
      float* Ca = buf((size_t)M * N);
      if (inferd_gemm_ex(M, K, N, 1, A, K, 1, 0, 0, B, bsk, bsn, 0, 0, Ca, csm, csn, 0, hasb ? bias : NULL, 0, 0, hasr ? R : NULL, 0, act, p0, p1, 0)) { printf("oom\n"); return 1; }
      check("gemm_ex two activations", maxdiff(Ca, Cr, (size_t)M * N), 1e-3, it);
      free(Ca);
    }
    { /* the linear-layer form: A rows packed per call, B prepacked in 96-column panels, bias per column */
      float* bp = malloc(sizeof(float) * (size_t)(inferd_gemm_packed_b_size(K, N) + 1));
      inferd_gemm_pack_b(B, N, 1, K, N, bp);
      float* Cl = buf((size_t)M * N); float* Cl2 = malloc(sizeof(float) * (size_t)M * N); float* bc = buf((size_t)N);
      if (inferd_gemm_ex(M, K, N, 1, A, K, 1, 0, 0, bp, 0, 0, 0, 1, Cl, N, 1, 0, hasb ? bc : NULL, 0, 1, hasr ? R : NULL, 0, act, p0, p1, 0)) { printf("oom\n"); return 1; }
      for (int m = 0; m < M; ++m) for (int n = 0; n < N; ++n) { double s = hasb ? bc[n] : 0.0;
        for (int k = 0; k < K; ++k) s += (double)A[(size_t)m * K + k] * B[(size_t)k * N + n];
        if (hasr) s += R[(size_t)m * N + n];
        Cl2[(size_t)m * N + n] = actf((float)s, act, p0, p1); }
      check("gemm_ex linear", maxdiff(Cl, Cl2, (size_t)M * N), 1e-3, it);
      free(bp); free(Cl); free(Cl2); free(bc);
    }
    free(A); free(B); free(bias); free(R); free(ap); free(Cc); free(Cr);
  }
  for (int it = 0; it < 60; ++it) { /* the implicit-im2col GEMM: B(k, n) = xp[boff[k] + coff[n]] (ragged, K blocks) */
    int C = 1 + (it * 7) % 40, kh = 1 + it % 3, kw = 1 + (it / 3) % 3, sh = 1 + it % 2, sw = 1 + (it / 2) % 3, dh = 1 + (it / 5) % 2, dw = 1;
    int OH = 1 + (it * 5) % 9, OW = 1 + (it * 11) % 23, M = 1 + (it * 13) % 37, act = it % 8, hasr = it % 3 == 0;
    int Hp = (OH - 1) * sh + (kh - 1) * dh + 1 + it % 2, Wp = (OW - 1) * sw + (kw - 1) * dw + 1, K = C * kh * kw, N = OH * OW;
    float p0 = act == 3 ? 0.1f : (act == 7 ? 0.2f : -0.3f), p1 = 0.4f;
    float* xp = buf((size_t)C * Hp * Wp); float* A = buf((size_t)M * K); float* bias = buf((size_t)M); float* R = buf((size_t)M * N);
    long long* boff = malloc(sizeof(long long) * (size_t)K); long long* coff = malloc(sizeof(long long) * (size_t)N);
    for (int c = 0; c < C; ++c) for (int i = 0; i < kh; ++i) for (int j = 0; j < kw; ++j) boff[(c * kh + i) * kw + j] = (long long)c * Hp * Wp + (long long)i * dh * Wp + j * dw;
    for (int oh = 0; oh < OH; ++oh) for (int ow = 0; ow < OW; ++ow) coff[oh * OW + ow] = (long long)oh * sh * Wp + (long long)ow * sw;
    float* ap = malloc(sizeof(float) * (size_t)(inferd_gemm_packed_size(M, K) + 1));
    inferd_gemm_pack_a(A, K, 1, M, K, ap);
    float* Cc = buf((size_t)M * N); float* Cr = malloc(sizeof(float) * (size_t)M * N);
    if (inferd_gemm_koff(ap, M, K, N, xp, boff, coff, Cc, N, bias, hasr ? R : NULL, act, p0, p1, 0)) { printf("oom\n"); return 1; }
    for (int m = 0; m < M; ++m) for (int n = 0; n < N; ++n) { double acc = bias[m];
      for (int k = 0; k < K; ++k) acc += (double)A[(size_t)m * K + k] * xp[boff[k] + coff[n]];
      if (hasr) acc += R[(size_t)m * N + n];
      Cr[(size_t)m * N + n] = actf((float)acc, act, p0, p1); }
    check("gemm_koff", maxdiff(Cc, Cr, (size_t)M * N), 1e-3, it);
    check("gemm_koff null", inferd_gemm_koff(ap, M, K, N, xp, NULL, coff, Cc, N, NULL, NULL, 0, 0, 0, 0) == -1 ? 0 : 1, 0, it);
    free(xp); free(A); free(bias); free(R); free(boff); free(coff); free(ap); free(Cc); free(Cr);
  }
  for (int it = 0; it < 160; ++it) { /* the direct conv: the GEMM micro-kernel over the padded / phase planes */
    /* maps from 1x1 to wider than a tile (rows crossing tiles), strides 1-3 (half the cases 1: the shared-padding
       layout), dilations 1-2, pads 0..extent on each side (more than the kernel: the phase layout at stride 1 too),
       M past one 8-row panel, every activation, residual or not; the workspace exactly the size asked for (ASan
       sees any over-read) */
    int C = irand(1, 19), H = irand(1, 14), W = it % 4 ? irand(1, 14) : irand(30, 70), kh = irand(1, 5), kw = irand(1, 5);
    if (it % 16 == 5) C = irand(40, 48), H = irand(20, 40), W = irand(120, 140); /* several bands of rows, a short last one */
    int sh = it % 2 ? 1 : irand(1, 3), sw = it % 2 ? 1 : irand(1, 3), dh = irand(1, 2), dw = it % 5 ? 1 : 2;
    int ekh = (kh - 1) * dh, ekw = (kw - 1) * dw;
    int pt = irand(0, ekh), pl = irand(0, ekw), pb = irand(0, ekh), pr = irand(0, ekw + (it % 7 == 0));
    if (H + pt + pb <= ekh || W + pl + pr <= ekw) continue;
    /* M of 22-60 as well: several 8-row panels per task (built without the ISA clones, the harness does not reach the 24-row AVX-512 tiles: test_conv_kernels_vs_onnxruntime["tall_tiles*"] does) */
    int OH = (H + pt + pb - ekh - 1) / sh + 1, OW = (W + pl + pr - ekw - 1) / sw + 1, M = it % 6 == 1 ? irand(22, 60) : irand(1, 21), act = it % 8, hasr = it % 3 == 0;
    float p0 = act == 3 ? 0.1f : (act == 7 ? 0.2f : -0.3f), p1 = 0.4f;
    int K = C * kh * kw;
    float* x = buf((size_t)C * H * W); float* A = buf((size_t)M * K); float* bias = buf((size_t)M); float* R = buf((size_t)M * OH * OW);
    float* ap = malloc(sizeof(float) * (size_t)inferd_gemm_packed_size(M, K));
    inferd_gemm_pack_a(A, K, 1, M, K, ap);
    int slots = it % 4; /* fewer band buffers than threads (0: every task allocates its own) */
    float* ws = malloc(sizeof(float) * (size_t)inferd_conv_direct_workspace(C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, slots));
    float* y = buf((size_t)M * OH * OW); float* yr = malloc(sizeof(float) * (size_t)M * OH * OW);
    inferd_pool_set_threads(1 + it % 3);
    check("conv_direct applies", inferd_conv_direct_applies(kh, kw, sh, sw, dh, dw, pt, pl, pb, pr) ? 0 : 1, 0, it);
    check("conv_direct rc", inferd_conv_direct(x, C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, ap, M, it % 5 ? bias : NULL, hasr ? R : NULL, y, act, p0, p1, ws, slots), 0, it);
    for (int m = 0; m < M; ++m) for (int oh = 0; oh < OH; ++oh) for (int ow = 0; ow < OW; ++ow) {
      double acc = it % 5 ? bias[m] : 0.0;
      for (int c = 0; c < C; ++c) for (int i = 0; i < kh; ++i) for (int j = 0; j < kw; ++j) { int ih = oh * sh - pt + i * dh, iw = ow * sw - pl + j * dw;
        if (ih >= 0 && ih < H && iw >= 0 && iw < W) acc += (double)A[(size_t)m * K + (c * kh + i) * kw + j] * x[((size_t)c * H + ih) * W + iw]; }
      if (hasr) acc += R[((size_t)m * OH + oh) * OW + ow];
      yr[((size_t)m * OH + oh) * OW + ow] = actf((float)acc, act, p0, p1); }
    check("conv_direct", maxdiff(y, yr, (size_t)M * OH * OW), 1e-3, it);
    free(x); free(A); free(bias); free(R); free(ap); free(ws); free(y); free(yr);
  }
  inferd_pool_set_threads(1);
  /* what it refuses: stride 5, more than 49 taps, a negative pad */
  check("conv_direct refuses", inferd_conv_direct_applies(3, 3, 5, 1, 1, 1, 1, 1, 1, 1) || inferd_conv_direct_applies(9, 7, 1, 1, 1, 1, 1, 1, 1, 1)
        || inferd_conv_direct_applies(3, 3, 1, 1, 1, 1, -1, 1, 1, 1), 0, 0);
  for (int it = 0; it < 300; ++it) { /* 2-D max / average pooling against a naive window loop */
    /* widths up to 70: the row passes' 16-float blocks, their overlap with the next row and the last row */
    int P = irand(1, 6), H = irand(1, 15), W = it % 3 ? irand(1, 15) : irand(14, 70), kh = irand(1, 4), kw = irand(1, 5), sh = irand(1, 3), sw = irand(1, 3);
    int dh = irand(1, 2), dw = irand(1, 2), pt = irand(0, kh - 1), pl = irand(0, kw - 1), ismax = it % 2;
    int OH = (H + 2 * pt - ((kh - 1) * dh + 1)) / sh + 1, OW = (W + 2 * pl - ((kw - 1) * dw + 1)) / sw + 1;
    if (OH < 1 || OW < 1) continue;
    /* ceil_mode: one more window where it still starts inside the input or the left padding */
    if (irand(0, 1) && OH * sh < H + pt) ++OH;
    if (irand(0, 1) && OW * sw < W + pl) ++OW;
    float* x = buf((size_t)P * H * W);
    if (ismax && irand(0, 3) == 0) x[irand(0, P * H * W - 1)] = NAN; /* a NaN wins every window it is in */ float* y = buf((size_t)P * OH * OW); float* yr = buf((size_t)P * OH * OW); float* inv = buf((size_t)OH * OW);
    for (int q = 0; q < OH * OW; ++q) inv[q] = 1.0f / (float)(kh * kw);
    inferd_pool2d(x, y, P, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, ismax, inv);
    for (int p = 0; p < P; ++p) for (int oh = 0; oh < OH; ++oh) for (int ow = 0; ow < OW; ++ow) {
      float acc = ismax ? -INFINITY : 0.0f;
      for (int i = 0; i < kh; ++i) for (int j = 0; j < kw; ++j) { int ih = oh * sh - pt + i * dh, iw = ow * sw - pl + j * dw;
        if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue; float v = x[((size_t)p * H + ih) * W + iw]; acc = ismax ? ((v > acc || v != v || acc != acc) ? (acc != acc ? acc : v) : acc) : acc + v; }
      yr[((size_t)p * OH + oh) * OW + ow] = ismax ? acc : acc * inv[oh * OW + ow]; }
    { size_t nn = (size_t)P * OH * OW, bad = 0; /* NaN where the naive loop has NaN, and nowhere else */
      for (size_t q = 0; q < nn; ++q) if ((y[q] != y[q]) != (yr[q] != yr[q])) ++bad; else if (y[q] != y[q] || y[q] == yr[q]) y[q] = yr[q] = 0.0f; /* NaN or the same infinity */
      check(ismax ? "maxpool nan" : "avgpool nan", (double)bad, 0, it); }
    check(ismax ? "maxpool" : "avgpool", maxdiff(y, yr, (size_t)P * OH * OW), 1e-5, it);
    free(x); free(y); free(yr); free(inv);
  }
  for (int it = 0; it < 50; ++it) { /* row-wise softmax / log-softmax / layer norm */
    int rows = irand(1, 40), n = irand(1, 300);
    float* x = buf((size_t)rows * n); float* y = buf((size_t)rows * n); float* g = buf((size_t)n); float* bb = buf((size_t)n);
    for (int lg = 0; lg < 2; ++lg) {
      inferd_softmax(x, y, rows, n, lg);
      double d = 0; for (int r = 0; r < rows; ++r) { double m = -1e30, s = 0; for (int k = 0; k < n; ++k) m = x[r * n + k] > m ? x[r * n + k] : m;
        for (int k = 0; k < n; ++k) s += exp((double)x[r * n + k] - m);
        for (int k = 0; k < n; ++k) { double want = lg ? (x[r * n + k] - m) - log(s) : exp((double)x[r * n + k] - m) / s; double e = fabs(want - y[r * n + k]); if (e > d) d = e; } }
      check(lg ? "log_softmax" : "softmax", d, 1e-5, it);
    }
    inferd_layernorm(x, y, rows, n, g, bb, 1e-5f);
    double d = 0; for (int r = 0; r < rows; ++r) { double m = 0, v = 0; for (int k = 0; k < n; ++k) m += x[r * n + k]; m /= n;
      for (int k = 0; k < n; ++k) v += (x[r * n + k] - m) * (x[r * n + k] - m); v /= n;
      for (int k = 0; k < n; ++k) { double want = (x[r * n + k] - m) / sqrt(v + 1e-5) * g[k] + bb[k]; double e = fabs(want - y[r * n + k]); if (e > d) d = e; } }
    check("layernorm", d, 1e-3, it);
    for (int mx = 0; mx < 2; ++mx) { /* global pooling: row means and maxima */
      inferd_reduce_rows(x, y, rows, n, mx);
      double e = 0; for (int r = 0; r < rows; ++r) { double a = mx ? -1e30 : 0; for (int k = 0; k < n; ++k) a = mx ? (x[r * n + k] > a ? x[r * n + k] : a) : a + x[r * n + k];
        if (!mx) a /= n; double dd = fabs(a - y[r]); if (dd > e) e = dd; }
      check(mx ? "reduce max" : "reduce mean", e, 1e-5, it);
    }
    free(x); free(y); free(g); free(bb);
  }
  for (int it = 0; it < 40; ++it) { /* a simple RNN's recurrence (rnn.c: h R^T in 64-column blocks, vectors, a tail) */
    int H = irand(1, 150), seq = irand(1, 4), batch = irand(1, 2), code = it % 2 ? 3 : 2; /* Affine (1, 0), Relu */
    int acts[3] = {code, code, code}; float al[3] = {1, 1, 1}, be[3] = {0, 0, 0};
    float* xw = buf((size_t)seq * batch * H); float* rt = buf((size_t)H * H); float* h = buf((size_t)batch * H);
    float* y = buf((size_t)seq * batch * H); float* ws = buf((size_t)4 * H + 64);
    for (size_t q = 0; q < (size_t)H * H; ++q) rt[q] *= 1.0f / sqrtf((float)H); /* h stays of order 1 over the steps */
    double* hr = malloc(sizeof(double) * batch * H); double* hn = malloc(sizeof(double) * H);
    for (int q = 0; q < batch * H; ++q) hr[q] = h[q];
    inferd_rnn_dir(0, seq, batch, H, xw, (long long)batch * H, H, rt, NULL, NULL, NULL, 0, h, NULL, y, (long long)batch * H, H,
                   acts, al, be, 0.0f, 0, 0, ws);
    double e = 0;
    for (int t = 0; t < seq; ++t) for (int b = 0; b < batch; ++b) {
      for (int j = 0; j < H; ++j) { double a = xw[((size_t)t * batch + b) * H + j];
        for (int k = 0; k < H; ++k) a += hr[b * H + k] * rt[(size_t)k * H + j];
        hn[j] = code == 2 && a < 0 ? 0 : a; }
      for (int j = 0; j < H; ++j) { hr[b * H + j] = hn[j]; double dd = fabs(hn[j] - y[((size_t)t * batch + b) * H + j]) / (1.0 + fabs(hn[j])); if (dd > e) e = dd; }
    }
    check("rnn recurrence", e, 1e-4, it);
    free(xw); free(rt); free(h); free(y); free(ws); free(hr); free(hn);
  }
  inferd_pool_set_threads(1);
  { /* erf and GELU on a dense grid plus specials, against libm in double */
    enum { NG = 40013 }; float* g = malloc(sizeof(float) * (NG + 8)); float* ge = malloc(sizeof(float) * (NG + 8));
    for (int i = 0; i < NG; ++i) g[i] = -12.0f + 24.0f * (float)i / (NG - 1);
    g[NG] = 0.0f; g[NG + 1] = -0.0f; g[NG + 2] = 1e-30f; g[NG + 3] = -1e-38f; g[NG + 4] = INFINITY; g[NG + 5] = -INFINITY; g[NG + 6] = NAN; g[NG + 7] = 3e38f;
    inferd_erf(g, ge, NG + 8);
    double de = 0; for (int i = 0; i < NG + 6; ++i) { double d = fabs((double)ge[i] - erf((double)g[i])); if (!(d <= de)) de = d != d ? 1e30 : d; }
    check("erf", de, 2e-7, 0);
    check("erf specials", (ge[NG + 6] != ge[NG + 6] && signbit(ge[NG + 1]) && ge[NG + 4] == 1.0f && ge[NG + 5] == -1.0f && ge[NG + 7] == 1.0f) ? 0 : 1, 0, 0);
    memcpy(ge, g, sizeof(float) * (NG + 8)); inferd_erf(ge, ge, NG + 8); /* in place */
    double di = 0; for (int i = 0; i < NG + 6; ++i) { double d = fabs((double)ge[i] - erf((double)g[i])); if (!(d <= di)) di = d != d ? 1e30 : d; }
    check("erf in place", di, 2e-7, 0);
    for (int ap = 0; ap < 2; ++ap) {
      memcpy(ge, g, sizeof(float) * (NG + 8)); inferd_gelu(ge, NG + 8, ap);
      double dg = 0; for (int i = 0; i < NG + 4; ++i) { double x = g[i];
        double r = ap ? 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))) : 0.5 * x * (1.0 + erf(x * 0.7071067811865476));
        double d = fabs((double)ge[i] - r) / (fabs(r) > 1 ? fabs(r) : 1); if (!(d <= dg)) dg = d != d ? 1e30 : d; }
      check(ap ? "gelu tanh" : "gelu", dg, ap ? 5e-7 : 1.5e-6, ap); /* the erf form: see gelu_erf_ps */
      check("gelu specials", (ge[NG + 4] == INFINITY && ge[NG + 5] == 0.0f && ge[NG + 6] != ge[NG + 6]) ? 0 : 1, 0, ap);
    }
    free(g); free(ge);
  }
  /* the channel-blocked depthwise on whole 16-channel blocks (the loop above has C <= 5): every row width, from
     rows shorter than one 4-column transpose to ragged ones (the last transpose overlaps), padding 0..k/2 */
  for (int it = 0; it < 40; ++it) {
    int C = irand(16, 37), H = irand(1, 12), W = irand(1, 23), k = irand(0, 1) ? 3 : 5, s = irand(1, 2);
    int pt = irand(0, k / 2), pl = irand(0, k / 2), pb = irand(0, k / 2), pr = irand(0, k / 2);
    int OH = (H + pt + pb - k) / s + 1, OW = (W + pl + pr - k) / s + 1;
    if (H + pt + pb < k || W + pl + pr < k) continue;
    float* x = buf((size_t)C * H * W); float* w = buf((size_t)C * k * k); float* b = buf((size_t)C);
    float* o = buf((size_t)C * OH * OW); float* orf = buf((size_t)C * OH * OW);
    inferd_dw_blocked_max_pixels(1 << 30);
    if (inferd_dwconv2d(x, w, b, o, C, 1, H, W, k, k, s, s, 1, 1, pt, pl, OH, OW, 1, 0.0f, 0.0f)) { printf("oom\n"); return 1; }
    for (int c = 0; c < C; ++c) for (int oh = 0; oh < OH; ++oh) for (int ow = 0; ow < OW; ++ow) {
      float acc = b[c];
      for (int i = 0; i < k; ++i) for (int j = 0; j < k; ++j) { int ih = oh * s - pt + i, iw = ow * s - pl + j;
        if (ih >= 0 && ih < H && iw >= 0 && iw < W) acc += w[((size_t)c * k + i) * k + j] * x[((size_t)c * H + ih) * W + iw]; }
      orf[((size_t)c * OH + oh) * OW + ow] = actf(acc, 1, 0.0f, 0.0f); }
    check("dwconv2d blocked x16", maxdiff(o, orf, (size_t)C * OH * OW), 1e-4, it);
    free(x); free(w); free(b); free(o); free(orf);
  }
  inferd_dw_blocked_max_pixels(1024);
  for (int it = 0; it < 6; ++it) { /* linear resize of the last two axes: the blend of two rows, then two columns */
    int P = irand(1, 3), H = irand(1, 9), W = irand(1, 1500), OH = irand(1, 12), OW = irand(1, 40);
    float* x = buf((size_t)P * H * W); float* o = malloc(sizeof(float) * (size_t)P * OH * OW);
    float* orf = malloc(sizeof(float) * (size_t)P * OH * OW);
    int *yl = malloc(sizeof(int) * OH), *yh = malloc(sizeof(int) * OH), *xl = malloc(sizeof(int) * OW), *xh = malloc(sizeof(int) * OW);
    float *wyl = buf(OH), *wyh = buf(OH), *wxl = buf(OW), *wxh = buf(OW);
    for (int i = 0; i < OH; ++i) { yl[i] = irand(0, H - 1); yh[i] = irand(0, H - 1); }
    for (int i = 0; i < OW; ++i) { xl[i] = irand(0, W - 1); xh[i] = irand(0, W - 1); }
    if (inferd_resize_linear2d(x, o, P, H, W, OH, OW, yl, yh, wyl, wyh, xl, xh, wxl, wxh)) { printf("FAIL resize rc\n"); fails++; }
    for (int p = 0; p < P; ++p) for (int i = 0; i < OH; ++i) for (int j = 0; j < OW; ++j) {
      const float* a = x + ((size_t)p * H + yl[i]) * W; const float* b = x + ((size_t)p * H + yh[i]) * W;
      orf[((size_t)p * OH + i) * OW + j] = (a[xl[j]] * wyl[i] + b[xl[j]] * wyh[i]) * wxl[j] + (a[xh[j]] * wyl[i] + b[xh[j]] * wyh[i]) * wxh[j]; }
    check("resize linear2d", maxdiff(o, orf, (size_t)P * OH * OW), 1e-5, it);
    yl[0] = H; /* an index past the plane is refused */
    if (inferd_resize_linear2d(x, o, P, H, W, OH, OW, yl, yh, wyl, wyh, xl, xh, wxl, wxh) != -2) { printf("FAIL resize bounds\n"); fails++; }
    free(x); free(o); free(orf); free(yl); free(yh); free(xl); free(xh); free(wyl); free(wyh); free(wxl); free(wxh);
  }
  /* a rate, not a speed check: under qemu on a busy machine it can fall below 1e8 FLOP/s */
  { double pk = inferd_fma_peak(20000, 2); check("fma peak", (pk > 0 && pk < 1e14) ? 0 : 1, 0, 0); }
  printf("abi %d: %s (%d failures)\n", inferd_native_abi(), fails ? "FAILED" : "ok", fails);
  return fails != 0;
}
"""



def _harness_source(tmp: Path) -> Path:
    lines = []
    for k in (ConvWinograd23(), ConvWinograd43()):
        for name, mat in (("BT", k.bt), ("AT", k.at)):
            lines.append(f"static const float {name}{k.m}[] = {{{', '.join(repr(float(v)) + 'f' for v in mat.ravel())}}};")
    src = tmp / "ctest.c"
    src.write_text(C_HARNESS.replace("#include \"inferd_native.h\"\n", "#include \"inferd_native.h\"\n" + "\n".join(lines) + "\n"))
    return src


def _build_and_run(cc: str, flags: list[str], tmp: Path, runner: list[str]) -> None:
    build_and_run(_harness_source(tmp), None, cc, flags, tmp, runner, FULL_OPT, 180)


@pytest.mark.skipif(shutil.which("cc") is None or os.uname().machine != "x86_64", reason="needs cc on x86-64")
def test_native_c_baseline_x86_64(tmp_path: Path) -> None:
    _build_and_run("cc", ["-march=x86-64"], tmp_path, [])


@needs_aarch64
def test_native_c_aarch64(tmp_path: Path) -> None:
    _build_and_run(AARCH64_CC, AARCH64_FLAGS, tmp_path, QEMU)


def _sanitizers_work() -> bool:
    if shutil.which("cc") is None:
        return False
    try:
        r = subprocess.run(["cc", "-fsanitize=address,undefined", "-x", "c", "-", "-o", "/dev/null"],
                           input="int main(void){return 0;}", capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


@pytest.mark.skipif(not _sanitizers_work(), reason="needs a C compiler with AddressSanitizer/UBSan")
def test_native_c_under_sanitizers(tmp_path: Path) -> None:
    """The same harness with AddressSanitizer, UndefinedBehaviorSanitizer and LeakSanitizer: no read past a
    buffer, no undefined arithmetic (NaN into int, negative shifts), no leaked thread scratch. The pool runs
    2 threads in parts of the harness, so the hand-off is exercised too."""
    build_and_run(_harness_source(tmp_path), None, "cc", ["-g", "-fsanitize=address,undefined",
                  "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"], tmp_path, [],
                  ("-O1", "-ffp-contract=fast"), 600)


# --------------------------------------------------------------------------- banded im2col (native/convtile.c)

TILED_SHAPES = [
    ((1, 3, 23, 21), 10, (7, 7), dict(strides=[2, 2], pads=[3, 2, 1, 3])),  # pads differ on every side
    ((1, 3, 37, 35), 17, (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1])),  # many bands, M not a multiple of 8
    ((1, 5, 9, 8), 4, (3, 3), dict(dilations=[2, 2], pads=[2, 1, 0, 3])),
    ((1, 2, 1, 1), 3, (3, 3), dict(pads=[1, 1, 1, 1])),  # a 1x1 map
    ((1, 4, 11, 13), 6, (2, 3), dict(strides=[3, 1], pads=[0, 1, 1, 0])),
]


def _fused_conv_case(seed: int, xshape: tuple[int, ...], cout: int, k: tuple[int, ...], attrs: dict[str, Any],
                     act: Any) -> tuple:
    """A conv with bias, a residual input and ``act`` fused: (x, w, b, res, inputs, layer, the oracle's output)."""
    x, w, b = make_inputs(seed, xshape, (cout, xshape[1]) + k, True)
    res = np.random.default_rng(seed + 10).standard_normal(
        single_node_layer("Conv", [x, w], attrs).out_shape(), dtype=F32)
    fused = dict(attrs, residual=True, **({"act": act} if act is not None else {}))
    ins, const = [x, w, b, res], [False, True, True, False]
    layer = single_node_layer("Conv", ins, fused, const=const)
    return x, w, b, res, ins, layer, op_spec("Conv").reference(layer.node, list(ins))[0]


@pytest.mark.skipif(not native.AVAILABLE, reason="native kernels not built")
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("act", [None, ("Relu", ()), ("Clip", (0.0, 0.5)), ("Tanh", ())],
                         ids=["none", "relu", "clip", "tanh"])
def test_conv_tiled_bound_and_run_match_oracle(act, threads: int) -> None:
    """im2col_tiled's pre-bound call (its own workspace, one band per pool thread) and its run() (shared scratch)
    against the numpy oracle, with a residual; threads changed after binding leave fewer slices than threads
    (a task then takes a private one). A non-native activation (Tanh) takes the general path."""
    kern = kernel("Conv", "im2col_tiled")
    old = native.num_threads()
    try:
        for si, (xshape, cout, k, attrs) in enumerate(TILED_SHAPES):
            x, w, b, res, ins, layer, expect = _fused_conv_case(si + 50, xshape, cout, k, attrs, act)
            assert kern.applies(layer)
            native.set_num_threads(threads)
            assert rel_err(run_layer(kern, layer, ins)[0], expect) <= TOL, (xshape, act)
            native.set_num_threads(1)
            params = kern.transform(layer, {raw_key(1): w, raw_key(2): b})
            out = np.full(expect.shape, np.nan, F32)
            call = kern.bind(layer, [x, None, None, res], params, [out])
            assert (call is not None) == (act is None or act[0] in native.NATIVE_ACTS)
            if call is not None:
                native.set_num_threads(threads)  # more threads than the workspace has slices for
                call()
                assert rel_err(out, expect) <= TOL, (xshape, act, "bound")
    finally:
        native.set_num_threads(old)


WINOGRAD_BIND_SHAPES = [
    ((1, 16, 13, 13), 24, dict(pads=[1, 1, 1, 1])),  # ragged tiles at the right and bottom
    ((1, 8, 9, 14), 5, dict(pads=[0, 1, 2, 2])),     # pads differ on every side, Cout < 8
    ((1, 24, 28, 28), 40, dict(pads=[1, 1, 1, 1])),
]


@pytest.mark.skipif(not native.AVAILABLE, reason="native kernels not built")
@pytest.mark.parametrize("name", ["winograd23", "winograd43"])
@pytest.mark.parametrize("act", [None, ("Relu", ()), ("Clip", (0.0, 0.5)), ("Tanh", ())],
                         ids=["none", "relu", "clip", "tanh"])
def test_winograd_bound_call_matches_run_and_oracle(name: str, act: Any) -> None:
    """The Winograd kernels' pre-bound call (three C calls over this thread's scratch) against their run() and
    the numpy oracle, with a residual, on 1-3 threads; it reads its input anew each call and survives its
    scratch being reallocated between calls (another layer growing the slot). A batch of two, a non-native
    activation (Tanh) or a map processed in bands is left to run()."""
    from inferd.ops.conv import scratch

    kern = kernel("Conv", name)
    old = native.num_threads()
    try:
        for si, (xshape, cout, attrs) in enumerate(WINOGRAD_BIND_SHAPES):
            native.set_num_threads(1 + si % 3)
            for n in (1, 2):
                xs = (n,) + xshape[1:]
                x, w, b, res, ins, layer, expect = _fused_conv_case(si + 90, xs, cout, (3, 3), attrs, act)
                assert kern.applies(layer)
                params = kern.transform(layer, {raw_key(1): w, raw_key(2): b})
                ran = np.full(expect.shape, np.nan, F32)
                kern.run(layer, [x, None, None, res], params, [ran])
                assert rel_err(ran, expect) <= TOL, (name, xs, act)
                out = np.full(expect.shape, np.nan, F32)
                call = kern.bind(layer, [x, None, None, res], params, [out])
                assert (call is not None) == (n == 1 and (act is None or act[0] in native.NATIVE_ACTS))
                if call is None:
                    continue
                call()
                np.testing.assert_array_equal(out, ran)
                x[...] = -x
                scratch(0, 1 << 20)  # the thread's V buffer grows, so it moves: the call re-resolves it
                scratch(1, 1 << 20)
                call()
                assert rel_err(out, op_spec("Conv").reference(layer.node, list(ins))[0]) <= TOL, (name, xs, act)
        big = single_node_layer("Conv", [np.zeros((1, 8, 6, 6), F32), np.zeros((8, 8, 3, 3), F32)],
                                dict(pads=[1, 1, 1, 1]), const=[False, True])
        try:
            kern.band_bytes = 1
            assert kern.bind(big, [np.zeros((1, 8, 6, 6), F32), None],
                             kern.transform(big, {raw_key(1): np.zeros((8, 8, 3, 3), F32)}),
                             [np.zeros((1, 8, 6, 6), F32)]) is None
        finally:
            del kern.band_bytes
    finally:
        native.set_num_threads(old)


DIRECT_GEMM_SHAPES = [
    ((1, 16, 13, 13), 24, (3, 3), dict(pads=[1, 1, 1, 1])),   # tiles across row ends, M = 3 panels
    ((1, 3, 9, 40), 5, (3, 3), dict(pads=[0, 1, 2, 2])),       # pads differ (right > left), M < 8
    ((1, 7, 6, 5), 9, (5, 3), dict(pads=[4, 0, 0, 2])),        # top pad k-1, no left pad
    ((1, 2, 1, 1), 3, (3, 3), dict(pads=[1, 1, 1, 1])),        # a 1x1 map
    ((1, 5, 8, 9), 17, (7, 7), dict(pads=[3, 3, 3, 3])),       # 49 taps
    ((1, 6, 30), 11, (3,), dict(pads=[1, 1])),                  # 1-D
    ((1, 4, 5, 33), 8, (1, 1), dict(pads=[0, 0, 0, 0])),       # 1x1 with nothing to pad
    ((1, 8, 28, 27), 16, (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1])),  # phase planes
    ((1, 3, 23, 24), 10, (3, 3), dict(strides=[2, 2])),         # a stem: no pad, the last column unread
    ((1, 3, 21, 19), 12, (7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3])),  # resnet's stem
    ((1, 5, 11, 17), 7, (3, 2), dict(strides=[3, 1], dilations=[1, 2], pads=[2, 1, 0, 3])),
    ((1, 4, 12, 10), 9, (3, 3), dict(dilations=[2, 2], pads=[2, 2, 2, 2])),  # dilated, shared padding
    ((1, 4, 6, 7), 5, (3, 3), dict(pads=[3, 4, 3, 4])),        # pads past the kernel: phase layout at stride 1
    ((1, 64, 40, 100), 12, (3, 3), dict(pads=[1, 1, 1, 1])),   # bands of 13 output rows, the last of 1
    ((1, 32, 61, 90), 9, (3, 3), dict(strides=[2, 2], pads=[1, 0, 1, 2])),  # phase planes in bands of 15 rows
]


@pytest.mark.skipif(not native.AVAILABLE, reason="native kernels not built")
@pytest.mark.parametrize("isa", [lv for lv in range(3) if lv <= max(native.gemm_isa(), 0)])
@pytest.mark.parametrize("act", [None, ("Relu", ()), ("HardSwish", ()), ("SiLU", ()), ("Tanh", ())],
                         ids=["none", "relu", "hardswish", "silu", "tanh"])
def test_conv_direct_gemm_bound_and_run_match_oracle(act, isa: int) -> None:
    """direct_gemm's pre-bound call (its own workspace) and its run() (shared scratch; a batch of two) against the
    numpy oracle, with a residual, on 1-3 threads and every GEMM ISA level (each has its own micro-kernel tile:
    32, 24 or 8 positions). A non-native activation (Tanh) takes the general path."""
    kern = kernel("Conv", "direct_gemm")
    old = native.num_threads()
    try:
        native.gemm_set_isa(isa)
        for si, (xshape, cout, k, attrs) in enumerate(DIRECT_GEMM_SHAPES):
            threads = 1 + si % 3
            for n in (1, 2):
                xs = (n,) + xshape[1:]
                x, w, b, res, ins, layer, expect = _fused_conv_case(si + 70, xs, cout, k, attrs, act)
                assert kern.applies(layer)
                native.set_num_threads(threads)
                assert rel_err(run_layer(kern, layer, ins)[0], expect) <= TOL, (xs, act)
                params = kern.transform(layer, {raw_key(1): w, raw_key(2): b})
                out = np.full(expect.shape, np.nan, F32)
                call = kern.bind(layer, [x, None, None, res], params, [out])
                assert (call is not None) == (n == 1 and (act is None or act[0] in native.NATIVE_ACTS))
                if call is not None:
                    native.set_num_threads(3)  # more threads than band buffers: tasks allocate their own
                    call()
                    native.set_num_threads(threads)
                    assert rel_err(out, expect) <= TOL, (xs, act, "bound")
                    x[...] = -x  # the bound call reads the input buffer anew each time
                    call()
                    flipped = op_spec("Conv").reference(layer.node, list(ins))[0]
                    assert rel_err(out, flipped) <= TOL, (xs, act, "bound, new input")
    finally:
        native.set_num_threads(old)
        native.gemm_set_isa(-1)


def test_conv_direct_gemm_refuses_what_it_cannot_run() -> None:
    """Groups, strides over 4, more than 49 taps, 3-D: not applicable (the other kernels take those)."""
    kern = kernel("Conv", "direct_gemm")
    for xshape, cout, k, attrs in [((1, 4, 19, 19), 8, (3, 3), dict(strides=[5, 1], pads=[1, 1, 1, 1])),
                                   ((1, 4, 9, 9), 8, (3, 3), dict(group=2, pads=[1, 1, 1, 1])),
                                   ((1, 4, 12, 12), 8, (9, 7), dict(pads=[4, 3, 4, 3])),
                                   ((1, 2, 5, 5, 5), 3, (3, 3, 3), dict(pads=[1] * 6))]:
        g = attrs.get("group", 1)
        x, w, b = make_inputs(1, xshape, (cout, xshape[1] // g) + k, True)
        assert not kern.applies(single_node_layer("Conv", [x, w, b], attrs)), attrs


# --------------------------------------------------------------------------- depthwise from padded rows (native/dwconv.c)

DW_DIRECT_SHAPES = [
    ((1, 5, 13, 11), (3, 3), dict(strides=[1, 1], pads=[1, 0, 2, 1])),   # pads differ on every side
    ((1, 7, 12, 17), (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 3, 20, 37), (3, 3), dict(strides=[2, 2], pads=[0, 1, 1, 0])),   # widths past one 16-float vector
    ((1, 17, 9, 33), (5, 5), dict(strides=[1, 1], pads=[2, 2, 2, 2])),   # channels not a multiple of 16
    ((1, 4, 11, 10), (5, 5), dict(strides=[2, 2], pads=[2, 1, 0, 2])),
    ((1, 2, 1, 1), (3, 3), dict(pads=[1, 1, 1, 1])),                     # a 1x1 map
    ((1, 3, 3, 2), (5, 5), dict(pads=[2, 2, 2, 2])),                     # a plane smaller than the kernel
    ((1, 3, 7, 56), (3, 3), dict(strides=[1, 1], pads=[1, 1, 1, 1])),   # 56 = 3 vectors + 8: a costly act's tail
    ((1, 2, 9, 112), (3, 3), dict(strides=[2, 2], pads=[0, 1, 1, 0])),  # the same at stride 2
    # in place, 5x5 on 2 vectors + 1 columns (x86-64: 17; aarch64: 9): the middle vector, shifted back, had read
    # column -1
    ((1, 2, 6, 17), (5, 5), dict(pads=[2, 2, 2, 2])),
    ((1, 2, 6, 9), (5, 5), dict(pads=[2, 2, 2, 2])),
]


@pytest.mark.skipif(not native.AVAILABLE, reason="native kernels not built")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("act", [None, ("Relu", ()), ("Clip", (0.0, 0.5)), ("HardSwish", ()), ("Tanh", ()),
                                 ("SiLU", ()), ("Gelu", (0.0,))],
                         ids=["none", "relu", "clip", "hswish", "tanh", "silu", "gelu"])
def test_depthwise_direct_matches_oracle_and_ort(act, threads: int) -> None:
    """depthwise_direct, bound and through run() (with a residual: the general path), against the numpy oracle and
    onnxruntime on odd shapes; it does not apply to a channel multiplier, dilation or other kernel sizes."""
    kern = kernel("Conv", "depthwise_direct")
    old = native.num_threads()
    native.set_num_threads(threads)
    try:
        for si, (xshape, k, attrs) in enumerate(DW_DIRECT_SHAPES):
            c = xshape[1]
            attrs = dict(attrs, group=c)
            x, w, b = make_inputs(si + 70, xshape, (c, 1) + k, True)
            fused = dict(attrs, **({"act": act} if act is not None else {}))
            layer = single_node_layer("Conv", [x, w, b], fused)
            expect = op_spec("Conv").reference(layer.node, [x, w, b])[0]
            if act is None:
                assert rel_err(expect, ort_run("Conv", x, w, b, attrs)) <= TOL
            assert kern.applies(layer)
            assert rel_err(run_layer(kern, layer, [x, w, b])[0], expect) <= TOL, (xshape, act)
            params = kern.transform(layer, {raw_key(1): w, raw_key(2): b})
            out = np.full(expect.shape, np.nan, F32)
            call = kern.bind(layer, [x, None, None], params, [out])
            assert (call is not None) == (act is None or act[0] in native.NATIVE_ACTS)
            if call is not None:
                call()
                assert rel_err(out, expect) <= TOL, (xshape, act, "bound")
            res = np.random.default_rng(si).standard_normal(expect.shape, dtype=F32)
            rl = single_node_layer("Conv", [x, w, b, res], dict(fused, residual=True),
                                   const=[False, True, True, False])
            rexp = op_spec("Conv").reference(rl.node, [x, w, b, res])[0]
            assert rel_err(run_layer(kern, rl, [x, w, b, res])[0], rexp) <= TOL, (xshape, act, "residual")
    finally:
        native.set_num_threads(old)
    for xshape, cout, k, attrs in [((1, 4, 9, 9), 8, (3, 3), dict(group=4)), ((1, 4, 9, 9), 4, (3, 3),
                                   dict(group=4, dilations=[2, 2])), ((1, 4, 9, 9), 4, (7, 7), dict(group=4)),
                                   ((1, 4, 9, 9), 4, (3, 3), dict(group=4, strides=[1, 2]))]:
        x, w, b = make_inputs(0, xshape, (cout, 1) + k, True)
        assert not kern.applies(single_node_layer("Conv", [x, w, b], attrs))


def test_depthwise_direct_is_preferred_in_place_and_on_wide_maps_only() -> None:
    def pick(c, hw, s, pads=(1, 1, 1, 1), k=3):
        x, w, b = make_inputs(0, (1, c, hw, hw), (c, 1, k, k), True)
        return choose_kernel(single_node_layer("Conv", [x, w, b], dict(group=c, strides=[s, s],
                                                                        pads=list(pads)))).name
    want = "depthwise_direct" if native.AVAILABLE else "depthwise"
    assert pick(8, 112, 1) == want
    assert pick(8, 56, 1) == want                       # stride 1, same columns: rows read in place
    assert pick(8, 9, 1) == want
    assert pick(8, 8, 1) == "depthwise"                 # under a vector plus the padding
    assert pick(8, 56, 1, (1, 0, 1, 2)) == "depthwise"  # not same columns: row copies, too narrow for those
    assert pick(8, 112, 1, (1, 0, 1, 2)) == want
    assert pick(8, 56, 1, (2, 2, 2, 2), k=5) == "depthwise"
    assert pick(8, 112, 2) == want
    assert pick(8, 56, 2) == "depthwise"


@pytest.mark.skipif(not native.AVAILABLE, reason="native kernels not built")
@pytest.mark.parametrize("act", [None, ("Relu", ()), ("HardSwish", ()), ("Tanh", ())], ids=["none", "relu", "hswish", "tanh"])
def test_im2col_bound_matches_oracle(act) -> None:
    """im2col's pre-bound call (its column buffer looked up per call, the GEMM re-bound when the scratch grew in
    between) against the numpy oracle, grouped and not, with a residual; a non-native activation is not bound."""
    from inferd.ops.conv import release_scratch, scratch

    kern = kernel("Conv", "im2col")
    shapes = TILED_SHAPES + [((1, 6, 9, 11), 4, (3, 3), dict(group=2, strides=[2, 1], pads=[1, 0, 1, 2]))]
    for si, (xshape, cout, k, attrs) in enumerate(shapes):
        g = attrs.get("group", 1)
        x, w, b = make_inputs(si + 90, xshape, (cout, xshape[1] // g) + k, True)
        res = np.random.default_rng(si + 91).standard_normal(
            single_node_layer("Conv", [x, w], attrs).out_shape(), dtype=F32)
        fused = dict(attrs, residual=True, **({"act": act} if act is not None else {}))
        layer = single_node_layer("Conv", [x, w, b, res], fused, const=[False, True, True, False])
        expect = op_spec("Conv").reference(layer.node, [x, w, b, res])[0]
        params = kern.transform(layer, {raw_key(1): w, raw_key(2): b})
        out = np.full(expect.shape, np.nan, F32)
        call = kern.bind(layer, [x, None, None, res], params, [out])
        assert (call is not None) == (act is None or act[0] in native.NATIVE_ACTS)
        if call is None:
            continue
        call()
        assert rel_err(out, expect) <= TOL, (xshape, act)
        release_scratch()
        scratch(0, 1 << 16)  # another buffer: the call must follow it
        out[...] = np.nan
        call()
        assert rel_err(out, expect) <= TOL, (xshape, act, "after the scratch changed")
