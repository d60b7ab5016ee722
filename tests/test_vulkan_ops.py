"""Every Vulkan kernel against the numpy reference (OpSpec.reference), one-node graphs on lavapipe.

Shapes include odd sizes, padding, groups, strides and dilation; each case forces one Vulkan kernel
and checks that it is the one that ran. The whole module runs with the validation layers on and
fails if they report any error. Tolerance: max|vk - ref| / max|ref| <= 1e-3 (fp32 storage).
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import inferd.ops  # noqa: F401  (registers ops and CPU kernels)
import inferd.vulkan

pytestmark = [pytest.mark.vulkan,
              pytest.mark.skipif(not inferd.vulkan.available(), reason="no Vulkan device")]

TOL = 1e-3
MS = "com.microsoft."  # onnxruntime's contrib ops are registered under this prefix
RNG = np.random.default_rng(1234)


def r(*shape: int, lo: float | None = None) -> np.ndarray:
    a = RNG.standard_normal(shape).astype(np.float32)
    if lo is not None:
        a = np.abs(a) + np.float32(lo)
    return a


def conv(n: int, c: int, h: int, w: int, k: int, kh: int, kw: int, bias: bool = True, **attrs: Any) -> tuple:
    g = attrs.get("group", 1)
    ins = [r(n, c, h, w), r(k, c // g, kh, kw)] + ([r(k)] if bias else [])
    return ins, attrs


def deconv(n: int, c: int, h: int, w: int, k: int, kh: int, kw: int, **attrs: Any) -> tuple:
    g = attrs.get("group", 1)
    return [r(n, c, h, w), r(c, k // g, kh, kw), r(k)], attrs


# (id, op, inputs, attrs, const mask or None, forced kernel or None)
CASES: list[tuple] = []


_N_OUT: dict[str, int] = {}


def case(cid: str, op: str, ins: list, attrs: dict | None = None, const: list | None = None,
         kernel: str | None = None, n_out: int = 1) -> None:
    CASES.append((cid, op, ins, attrs or {}, const, kernel))
    _N_OUT[cid] = n_out


# --- Conv: every kernel over odd sizes, pads, groups, strides, dilation, fused residual/activation
_conv_general = {
    "pad": conv(1, 3, 9, 11, 5, 3, 3, pads=[1, 1, 1, 1]),
    "stride_dil_group": conv(2, 4, 10, 7, 6, 3, 2, strides=[2, 1], dilations=[1, 2], pads=[0, 1, 2, 0], group=2),
    "1x1_nobias": conv(1, 70, 5, 13, 67, 1, 1, bias=False),
    "7x7s2": conv(1, 3, 15, 13, 8, 7, 7, strides=[2, 2], pads=[3, 3, 3, 3]),
    "samepad": conv(1, 5, 8, 9, 4, 3, 3, auto_pad="SAME_UPPER", strides=[2, 2]),
    "conv1d": ([r(1, 4, 17), r(6, 4, 3), r(6)], {"pads": [1, 1], "strides": [2]}),
}
for name, (ins, attrs) in _conv_general.items():
    for kern in ("vk_direct", "vk_gemm"):
        case(f"conv_{name}_{kern}", "Conv", ins, attrs, kernel=kern)
case("conv_1x1_vk_conv1x1", "Conv", *_conv_general["1x1_nobias"], kernel="vk_conv1x1")
case("conv_1x1_batch2", "Conv", *conv(2, 5, 3, 5, 3, 1, 1), kernel="vk_conv1x1")
case("conv_dw3x3", "Conv", *conv(1, 8, 9, 11, 8, 3, 3, pads=[1, 1, 1, 1], group=8), kernel="vk_depthwise")
case("conv_dw5x5s2_mult2", "Conv", *conv(2, 4, 9, 11, 8, 5, 5, pads=[2, 2, 2, 2], strides=[2, 2], group=4),
     kernel="vk_depthwise")
case("conv_dw_dil", "Conv", *conv(1, 6, 10, 9, 6, 3, 3, pads=[2, 2, 2, 2], dilations=[2, 2], group=6),
     kernel="vk_depthwise")
for kern in ("vk_winograd23", "vk_winograd43"):
    case(f"conv_wino_pad_{kern}", "Conv", *conv(1, 3, 9, 11, 5, 3, 3, pads=[1, 1, 1, 1]), kernel=kern)
    case(f"conv_wino_odd_{kern}", "Conv", *conv(2, 17, 7, 6, 9, 3, 3, pads=[0, 1, 1, 0]), kernel=kern)
# fused residual + activation through every conv kernel family
_x, _w, _b = r(1, 8, 7, 9), r(8, 8, 3, 3), r(8)
_res = r(1, 8, 7, 9)
for kern in ("vk_direct", "vk_gemm", "vk_winograd23", "vk_winograd43"):
    case(f"conv_residual_relu_{kern}", "Conv", [_x, _w, _b, _res],
         {"pads": [1, 1, 1, 1], "residual": True, "act": ("Relu", ())}, const=[False, True, True, False], kernel=kern)
case("conv_residual_silu_gemm", "Conv", [_x, _w, _b, _res], {"pads": [1, 1, 1, 1], "residual": True, "act": ("SiLU", ())},
     const=[False, True, True, False], kernel="vk_gemm_reg")
case("conv_residual_dw_clip", "Conv", [_x, r(8, 1, 3, 3), _b, _res],
     {"pads": [1, 1, 1, 1], "group": 8, "residual": True, "act": ("Clip", (0.0, 6.0))},
     const=[False, True, True, False], kernel="vk_depthwise")
case("conv_1x1_residual_noBias_hswish", "Conv", [_x, r(8, 8, 1, 1), None, _res],
     {"residual": True, "act": ("HardSwish", ())}, const=[False, True, False, False], kernel="vk_conv1x1")
# split-K (few output tiles, long K: the GPU variants split K over workgroups and reduce after)
case("conv_splitk_res_relu_vk_gemm", "Conv", [r(1, 64, 7, 7), r(32, 64, 3, 3), r(32), r(1, 32, 7, 7)],
     {"pads": [1, 1, 1, 1], "residual": True, "act": ("Relu", ())}, const=[False, True, True, False], kernel="vk_gemm")
case("conv_splitk_1x1_vk_conv1x1", "Conv", *conv(2, 300, 3, 3, 20, 1, 1), kernel="vk_conv1x1")
# CPU-type device kernels (texel-buffer operands; lavapipe only): GEMM conv through im2col, 1x1 GEMM on
# the input itself, Winograd F(4x4,3x3): odd sizes, rows past the 16-row blocks, unaligned pixel counts
for name, (ins, attrs) in _conv_general.items():
    case(f"conv_{name}_vk_gemm_tex", "Conv", ins, attrs, kernel="vk_gemm_tex")
case("conv_1x1_tex_batch2_group2", "Conv", *conv(2, 6, 4, 6, 38, 1, 1, group=2), kernel="vk_conv1x1_tex")
case("conv_1x1_tex_wide", "Conv", *conv(1, 70, 8, 9, 67, 1, 1, bias=False), kernel="vk_conv1x1_tex")
case("conv_1x1s2_tex_odd", "Conv", *conv(1, 21, 9, 13, 17, 1, 1, strides=[2, 2]), kernel="vk_gemm_tex")
case("conv_dil_tex", "Conv", *conv(1, 5, 12, 11, 33, 3, 3, dilations=[2, 2], pads=[2, 1, 2, 1]), kernel="vk_gemm_tex")
case("conv_wino_pad_vk_winograd43_tex", "Conv", *conv(1, 3, 9, 11, 5, 3, 3, pads=[1, 1, 1, 1]),
     kernel="vk_winograd43_tex")
case("conv_wino_odd_vk_winograd43_tex", "Conv", *conv(2, 17, 7, 6, 9, 3, 3, pads=[0, 1, 1, 0]), kernel="vk_winograd43_tex")
case("conv_wino_wide_vk_winograd43_tex", "Conv", *conv(1, 24, 10, 10, 40, 3, 3, pads=[1, 1, 1, 1], bias=False),
     kernel="vk_winograd43_tex")
case("conv_wino_vout_residual_vk_winograd43_tex", "Conv", [r(2, 6, 10, 12), r(7, 6, 3, 3), r(7), r(2, 7, 10, 12)],
     {"pads": [1, 1, 1, 1], "residual": True, "act": ("LeakyRelu", (0.1,))}, const=[False, True, True, False],
     kernel="vk_winograd43_tex")
for kern in ("vk_gemm_tex", "vk_winograd43_tex"):
    case(f"conv_residual_relu_{kern}", "Conv", [_x, _w, _b, _res],
         {"pads": [1, 1, 1, 1], "residual": True, "act": ("Relu", ())}, const=[False, True, True, False], kernel=kern)
_x4, _res4 = r(1, 8, 6, 10), r(1, 20, 6, 10)
case("conv_1x1_tex_residual_hswish", "Conv", [_x4, r(20, 8, 1, 1), None, _res4], {"residual": True, "act": ("HardSwish", ())},
     const=[False, True, False, False], kernel="vk_conv1x1_tex")
case("conv_gemm_tex_residual_odd_clip", "Conv", [r(1, 8, 7, 9), r(20, 8, 3, 3), r(20), r(1, 20, 7, 9)],
     {"pads": [1, 1, 1, 1], "residual": True, "act": ("Clip", (0.0, 6.0))}, const=[False, True, True, False],
     kernel="vk_gemm_tex")
for _dc in [c for c in CASES if c[5] == "vk_depthwise"]:
    case(_dc[0] + "_tex", _dc[1], _dc[2], _dc[3], _dc[4], kernel="vk_depthwise_tex")
case("conv_dw_tex_row_multiple_of_4", "Conv", *conv(1, 6, 8, 12, 6, 3, 3, pads=[1, 1, 1, 1], group=6), kernel="vk_depthwise_tex")
# ConvTranspose
case("deconv_s2", "ConvTranspose", *deconv(1, 4, 5, 6, 3, 3, 3, strides=[2, 2], pads=[1, 1, 1, 1],
                                             output_padding=[1, 1]), kernel="vk_direct")
case("deconv_group_dil", "ConvTranspose", *deconv(2, 4, 4, 5, 6, 2, 3, strides=[2, 1], dilations=[1, 2], group=2),
     kernel="vk_direct")
case("deconv_k2s2_relu", "ConvTranspose", *deconv(1, 6, 5, 5, 4, 2, 2, strides=[2, 2], act=("Relu", ())),
     kernel="vk_direct")

# --- Gemm / MatMul
case("gemm_bias_vec", "Gemm", [r(3, 70), r(70, 33), r(33)], kernel="vk_matmul")
case("gemm_trans_alpha_beta", "Gemm", [r(70, 3), r(33, 70), r(33)], {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0})
case("gemm_tiled_relu", "Gemm", [r(67, 70), r(70, 65), r(67, 65)], {"act": ("Relu", ())})
case("gemm_bias_col", "Gemm", [r(67, 70), r(70, 65), r(67, 1)])
case("gemm_residual_gelu", "Gemm", [r(2, 20), r(30, 20), r(30), r(2, 30)],
     {"transB": 1, "residual": True, "act": ("Gelu", (1.0,))}, const=[False, True, True, False])
case("gemm_splitk_bias_col", "Gemm", [r(20, 600), r(600, 30), r(20, 1)], {"alpha": 0.5}, kernel="vk_matmul")
case("gemm_splitk_residual", "Gemm", [r(9, 300), r(40, 300), r(40), r(9, 40)], {"transB": 1, "residual": True,
     "act": ("Sigmoid", ())}, const=[False, True, True, False], kernel="vk_matmul")
case("matmul_splitk_batched", "MatMul", [r(2, 5, 300), r(2, 300, 7)], const=[False, False], kernel="vk_matmul")
case("gemm_gemv_nk_residual", "Gemm", [r(2, 20), r(300, 20), r(300), r(2, 300)],
     {"transB": 1, "residual": True, "act": ("Relu", ())}, const=[False, True, True, False], kernel="vk_gemv_nk")
# vector path: unrolled loop plus its tail (K/4 = 257 > 4 * 64), 3 rows; K % 4 != 0 keeps the scalar loop
case("gemm_gemv_nk_vec_rows", "Gemm", [r(3, 1028), r(70, 1028), r(70)], {"transB": 1, "act": ("Relu", ())},
     kernel="vk_gemv_nk")
case("gemm_gemv_nk_scalar_k", "Gemm", [r(1, 1030), r(66, 1030), r(66)], {"transB": 1}, kernel="vk_gemv_nk")
case("gemm_gemv_nk_tex_residual", "Gemm", [r(2, 20), r(300, 20), r(300), r(2, 300)],
     {"transB": 1, "residual": True, "act": ("Relu", ())}, const=[False, True, True, False], kernel="vk_gemv_nk_tex")
case("gemm_gemv_nk_tex_row", "Gemm", [r(1, 36), r(37, 36), r(37)], {"transB": 1, "alpha": 0.5, "beta": 2.0},
     kernel="vk_gemv_nk_tex")
case("matmul_batch_fold", "MatMul", [r(2, 3, 37, 19), r(19, 23)])
case("matmul_batched_dyn", "MatMul", [r(2, 3, 37, 19), r(3, 19, 23)], const=[False, False])
case("matmul_broadcast", "MatMul", [r(2, 1, 37, 19), r(1, 3, 19, 23)], const=[False, False])
case("matmul_vec_a", "MatMul", [r(19), r(19, 23)])
case("matmul_vec_b", "MatMul", [r(4, 19), r(19)])
case("matmul_residual", "MatMul", [r(1, 19), r(19, 23), r(1, 23)], {"residual": True, "act": ("Tanh", ())},
     const=[False, True, False])

# --- element-wise
_ACTS = [("Relu", {}), ("LeakyRelu", {"alpha": 0.2}), ("Sigmoid", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
         ("HardSwish", {}), ("Tanh", {}), ("Softplus", {}), ("Gelu", {}), ("Gelu", {"approximate": "tanh"}),
         ("Clip", {"min": -0.5, "max": 0.7}), ("SiLU", {})]
for op, attrs in _ACTS:
    case(f"act_{op}_{len(attrs)}", op, [r(3, 5, 7) * 4], attrs, kernel="vk_unary")
case("act_clip_inputs", "Clip", [r(3, 5, 7), np.float32(-0.25), np.float32(0.5)], kernel="vk_unary")
case("prelu", "PRelu", [r(2, 5, 3, 4), r(5, 1, 1)], kernel="vk_binary")
for op in ("Sqrt", "Log", "Reciprocal"):
    case(f"unary_{op}", op, [r(4, 9, lo=0.1)], kernel="vk_unary")
for op in ("Exp", "Neg", "Abs", "Floor", "Ceil", "Erf"):
    case(f"unary_{op}", op, [r(4, 9) * 2], kernel="vk_unary")
# unary ops the shader had before the registry did (issue 18 registered them): now Vulkan models use them
_halves = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.0, 3.5, -3.5], np.float32)  # Round: halves to even
for op in ("Sin", "Cos", "Atan", "Sinh", "Cosh", "Sign", "Mish", "Softsign"):
    case(f"unary_{op}", op, [r(4, 9) * 2], kernel="vk_unary")
for op in ("Tan", "Asin", "Acos"):
    case(f"unary_{op}", op, [np.tanh(r(4, 9)) * np.float32(0.95)], kernel="vk_unary")  # inside (-1, 1)
case("unary_Round", "Round", [np.concatenate([_halves, r(27) * 4]).reshape(4, 9)], kernel="vk_unary")
for op, attrs in [("Elu", {"alpha": 0.7}), ("Selu", {}), ("Selu", {"alpha": 2.0, "gamma": 3.0}),
                  ("Celu", {"alpha": 2.0}), ("ThresholdedRelu", {"alpha": 0.5})]:
    case(f"unary_{op}_{len(attrs)}", op, [r(3, 5, 7) * 4], attrs, kernel="vk_unary")
for op in ("Add", "Sub", "Mul", "Div"):
    case(f"binary_{op}_bcast", op, [r(2, 3, 5, 7), r(3, 1, 7, lo=0.5)], const=[False, False], kernel="vk_binary")
case("binary_add_const_scalar_act", "Add", [r(5, 7), np.float32(0.3)], {"act": ("Sigmoid", ())}, kernel="vk_binary")
case("binary_mul_both_bcast", "Mul", [r(4, 1, 6), r(1, 5, 1)], const=[False, False], kernel="vk_binary")
case("binary_pow_int", "Pow", [r(3, 8), np.float32(2.0)], kernel="vk_binary")
case("binary_pow_frac", "Pow", [r(3, 8, lo=0.1), np.float32(0.7)], kernel="vk_binary")
case("binary_max2", "Max", [r(3, 8), r(8)], const=[False, False], kernel="vk_binary")
case("nary_sum3", "Sum", [r(3, 8), r(8), r(3, 1)], const=[False, False, False], kernel="vk_nary")
case("nary_mean3", "Mean", [r(3, 8), r(3, 8), r(8)], const=[False, False, True], kernel="vk_nary")
case("nary_min3", "Min", [r(3, 8), r(3, 8), r(3, 8)], const=[False, False, False], kernel="vk_nary")

# onnxruntime's fused GELUs (bias Add + activation), float Mod (both sign conventions), bool logic, Trilu (issue 18)
case("ms_biasgelu", MS + "BiasGelu", [r(2, 5, 16) * 2, r(16)], kernel="vk_gelus")
case("ms_fastgelu_bias", MS + "FastGelu", [r(2, 5, 16) * 2, r(16)], kernel="vk_gelus")
case("ms_fastgelu_nobias", MS + "FastGelu", [r(3, 17) * 3], kernel="vk_gelus")
case("ms_quickgelu_alpha", MS + "QuickGelu", [r(3, 17) * 3], {"alpha": 1.5}, kernel="vk_gelus")
case("ms_quickgelu_default", MS + "QuickGelu", [r(4, 9) * 3], kernel="vk_gelus")
_mod_b = (np.abs(r(3, 1, 7)) + 0.5) * np.sign(r(3, 1, 7))
case("mod_fmod1_bcast", "Mod", [r(3, 5, 7) * 5, _mod_b], {"fmod": 1}, const=[False, False], kernel="vk_binary")
case("mod_fmod0_float", "Mod", [r(3, 5, 7) * 5, _mod_b], {"fmod": 0}, const=[False, False], kernel="vk_binary")
for op in ("And", "Or", "Xor"):
    case(f"logic_{op}_bcast", op, [r(3, 1, 7) > 0, r(5, 1) > 0.3], const=[False, False], kernel="vk_logic")
case("logic_not_odd", "Not", [r(3, 11) > 0], kernel="vk_logic")
case("logic_and_const", "And", [r(4, 6) > 0, r(6) > 0], kernel="vk_logic")
for upper in (0, 1):
    case(f"trilu_upper{upper}", "Trilu", [r(2, 5, 7)], {"upper": upper}, kernel="vk_trilu")
    case(f"trilu_upper{upper}_k", "Trilu", [r(3, 6, 4), np.array(-1 if upper else 2, np.int64)], {"upper": upper},
         kernel="vk_trilu")
case("trilu_square_k_out_of_range", "Trilu", [r(6, 6), np.array(9, np.int64)], kernel="vk_trilu")

# comparisons (bool outputs), Where (bool condition), ArgMax/ArgMin (int64 outputs)
_cmp_a = np.round(r(3, 1, 7) * 2) / 2
_cmp_b = np.round(r(5, 1) * 2) / 2  # ties on purpose (values on a 0.5 grid)
for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
    case(f"compare_{op}", op, [_cmp_a, _cmp_b], const=[False, False], kernel="vk_compare")
case("where_dyn_cond", "Where", [r(3, 1, 5) > 0, r(1, 4, 5), r(3, 4, 1)], const=[False, False, False], kernel="vk_where")
case("where_const_cond", "Where", [r(4, 5) > 0.3, r(4, 5), np.float32(-1.0)], const=[True, False, True], kernel="vk_where")
case("argmax_axis1", "ArgMax", [r(2, 9, 5)], {"axis": 1, "keepdims": 1}, kernel="vk_argmax")
case("argmin_last_nokeep", "ArgMin", [np.round(r(3, 8)) ], {"axis": -1, "keepdims": 0, "select_last_index": 1},
     kernel="vk_argmax")

# --- normalisation, pooling, reductions, softmax
case("bn", "BatchNormalization", [r(2, 5, 3, 4), r(5), r(5), r(5), r(5, lo=0.1)], {"epsilon": 1e-3}, kernel="vk_affine")
case("layernorm", "LayerNormalization", [r(2, 7, 33), r(33), r(33)], {"axis": -1, "epsilon": 1e-5}, kernel="vk_norm")
case("layernorm_axis1_nobias", "LayerNormalization", [r(3, 4, 5), r(4, 5)], {"axis": 1}, kernel="vk_norm")
case("instancenorm", "InstanceNormalization", [r(2, 3, 5, 7), r(3), r(3)], kernel="vk_norm")
# the other row normalizations through norm.comp's variants (issue 18): GroupNormalization (per-channel and opset-18
# per-group scales), RMSNormalization, onnxruntime's Simplified/Skip/SkipSimplified LayerNormalization with their
# statistics and skip-sum outputs, a 2-D skip broadcast over the batch, LayerNormalization's Mean/InvStdDev outputs
case("groupnorm_per_channel", "GroupNormalization", [r(2, 6, 5, 7), r(6), r(6)], {"num_groups": 3, "epsilon": 1e-3},
     kernel="vk_norm")
case("groupnorm_per_group_opset18", "GroupNormalization", [r(2, 8, 3, 3), r(2), r(2)], {"num_groups": 2},
     kernel="vk_norm")
case("groupnorm_wide_rows", "GroupNormalization", [r(1, 32, 9, 11) * 3 + 1, r(32), r(32)], {"num_groups": 4},
     kernel="vk_norm")
case("groupnorm_dyn_scale", "GroupNormalization", [r(1, 4, 5), r(4), r(4)], {"num_groups": 4}, const=[False] * 3,
     kernel="vk_norm")
case("rmsnorm_last", "RMSNormalization", [r(2, 7, 300), r(300)], {"epsilon": 1e-6, "_opset": 23}, kernel="vk_norm")
case("rmsnorm_axis1_bcast_scale", "RMSNormalization", [r(3, 4, 5), r(1, 5)], {"axis": 1, "_opset": 23},
     kernel="vk_norm")
case("simplified_ln_inv_out", "SimplifiedLayerNormalization", [r(2, 5, 33), r(33)], {"epsilon": 1e-5},
     kernel="vk_norm", n_out=2)
case("skip_ln_all_outputs", MS + "SkipLayerNormalization", [r(2, 5, 40), r(2, 5, 40), r(40), r(40), r(40)],
     {"epsilon": 1e-5}, const=[False, False, True, True, True], kernel="vk_norm", n_out=4)
case("skip_ln_2d_skip_no_beta", MS + "SkipLayerNormalization", [r(3, 4, 20), r(4, 20), r(20)], {},
     const=[False, False, True], kernel="vk_norm")
case("skip_simplified_ln_bias_sum", MS + "SkipSimplifiedLayerNormalization", [r(2, 3, 260), r(2, 3, 260), r(260),
     r(260)], {"epsilon": 1e-6}, const=[False, False, True, True], kernel="vk_norm", n_out=4)
case("layernorm_stats_outputs", "LayerNormalization", [r(3, 4, 18), r(4, 18), r(18)], {"axis": 1}, kernel="vk_norm",
     n_out=3)
case("maxpool_ceil", "MaxPool", [r(1, 3, 11, 10)], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
     kernel="vk_pool")
case("maxpool_pad_dil", "MaxPool", [r(2, 2, 9, 8)], {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "dilations": [2, 1]},
     kernel="vk_pool")
case("avgpool_pad_excl", "AveragePool", [r(1, 3, 7, 8)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
     kernel="vk_pool")
case("avgpool_pad_incl_ceil", "AveragePool", [r(1, 3, 7, 8)],
     {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2], "count_include_pad": 1, "ceil_mode": 1},
     kernel="vk_pool")
case("avgpool_1d", "AveragePool", [r(2, 3, 13)], {"kernel_shape": [4], "strides": [3]}, kernel="vk_pool")
for _pc in [c for c in CASES if c[5] == "vk_pool"]:
    case(_pc[0] + "_tex", _pc[1], _pc[2], _pc[3], _pc[4], kernel="vk_pool_tex")
case("gap_tex", "GlobalAveragePool", [r(2, 5, 13, 11)], kernel="vk_global_pool_tex")
case("gap_tex_aligned", "GlobalAveragePool", [r(1, 6, 4, 8)], {"act": ("Relu", ())}, kernel="vk_global_pool_tex")
case("gmp_tex", "GlobalMaxPool", [r(1, 3, 30, 31)], kernel="vk_global_pool_tex")
case("gmp_tex_short", "GlobalMaxPool", [r(2, 3, 1, 3)], kernel="vk_global_pool_tex")
case("gap", "GlobalAveragePool", [r(2, 5, 13, 11)], kernel="vk_global_pool")
case("gmp", "GlobalMaxPool", [r(1, 3, 30, 31)], kernel="vk_global_pool")
for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare"):
    case(f"{op}_last", op, [r(3, 4, 300)], {"axes": [-1], "keepdims": 1, "_opset": 13}, kernel="vk_reduce")
_neg_inf_rows = r(3, 4, 300)
_neg_inf_rows[1, 2, :] = -np.inf  # a fully masked row reduces to -inf, not to the largest finite float
_neg_inf_rows[2, :, 7] = -np.inf
case("ReduceMax_last_all_neg_inf_row", "ReduceMax", [_neg_inf_rows], {"axes": [-1], "_opset": 13}, kernel="vk_reduce")
case("ReduceMax_middle_all_neg_inf", "ReduceMax", [_neg_inf_rows], {"axes": [1], "_opset": 13}, kernel="vk_reduce")
case("ReduceMin_last_all_pos_inf_row", "ReduceMin", [-_neg_inf_rows], {"axes": [-1], "_opset": 13}, kernel="vk_reduce")
case("ReduceMean_middle", "ReduceMean", [r(3, 4, 5, 6)], {"axes": [1, 2], "keepdims": 0, "_opset": 13}, kernel="vk_reduce")
case("ReduceProd_first", "ReduceProd", [r(3, 4, 5) * 0.5 + 1], {"axes": [0], "_opset": 13}, kernel="vk_reduce")
case("ReduceSum_axes_input", "ReduceSum", [r(3, 4, 5), np.array([1], np.int64)], {"_opset": 13}, kernel="vk_reduce")
# two runs of reduced axes with kept ones between: Keras' GroupNormalization on NHWC (tf2onnx) reshapes to
# [N, H, W, G, C/G] and takes moments over axes 1, 2, 4 (GAP=1, rows of 36 * 2); with a kept inner axis too
case("ReduceMean_groupnorm_nhwc", "ReduceMean", [r(2, 6, 6, 4, 2)], {"axes": [1, 2, 4], "keepdims": 1, "_opset": 13},
     kernel="vk_reduce")
case("ReduceLogSumExp_two_runs_inner", "ReduceLogSumExp", [r(2, 3, 5, 4, 3) * 4], {"axes": [1, 3], "keepdims": 0,
                                                                                   "_opset": 13}, kernel="vk_reduce")
case("ReduceMax_two_runs_size1_between", "ReduceMax", [r(3, 1, 5, 2, 1, 6)], {"axes": [0, 5], "_opset": 13},
     kernel="vk_reduce")
case("ReduceSum_two_runs_axes_input", "ReduceSum", [r(4, 3, 7), np.array([0, 2], np.int64)], {"keepdims": 0, "_opset": 13},
     kernel="vk_reduce")
for _ex in (0, 1):
    for _rev in (0, 1):
        case(f"cumsum_mid_ex{_ex}_rev{_rev}", "CumSum", [r(3, 9, 4), np.array(1, np.int64)],
             {"exclusive": _ex, "reverse": _rev}, kernel="vk_cumsum")
case("cumsum_last_neg_axis_long", "CumSum", [r(2, 700), np.array([-1], np.int64)], kernel="vk_cumsum")
case("cumsum_first_1d", "CumSum", [r(13), np.array(0, np.int32)], {"reverse": 1}, kernel="vk_cumsum")
case("softmax_last", "Softmax", [r(2, 3, 197) * 3], {"axis": -1, "_opset": 13}, kernel="vk_softmax")
case("softmax_mid", "Softmax", [r(2, 5, 7) * 3], {"axis": 1, "_opset": 13}, kernel="vk_softmax")
case("softmax_opset11", "Softmax", [r(2, 5, 7)], {"axis": 1, "_opset": 11}, kernel="vk_softmax")
case("logsoftmax", "LogSoftmax", [r(4, 9)], {"axis": -1, "_opset": 13}, kernel="vk_softmax")

# attention lowered to matmul + softmax (issue 18): ONNX Attention 4-D and 3-D (grouped-query), causal, float and
# bool masks (a fully masked row gives 0s), explicit scale; com.microsoft MultiHeadAttention with attention_bias
_fullmask = np.ones((1, 1, 5, 9), bool)
_fullmask[..., 2, :] = False
_fullmask[..., 3, 4:] = False
case("attention_4d", "Attention", [r(2, 3, 5, 8), r(2, 3, 9, 8), r(2, 3, 9, 6)], {"_opset": 23},
     const=[False] * 3, kernel="vk_attention")
case("attention_4d_gqa_causal_scale", "Attention", [r(1, 4, 7, 8), r(1, 2, 7, 8), r(1, 2, 7, 8)],
     {"is_causal": 1, "scale": 0.2, "_opset": 23}, const=[False] * 3, kernel="vk_attention")
case("attention_3d_float_mask", "Attention", [r(2, 5, 12), r(2, 9, 12), r(2, 9, 15), r(2, 1, 5, 9)],
     {"q_num_heads": 3, "kv_num_heads": 3, "_opset": 23}, const=[False] * 4, kernel="vk_attention")
case("attention_3d_gqa_bool_mask_fully_masked_row", "Attention", [r(1, 5, 16), r(1, 9, 8), r(1, 9, 8), _fullmask],
     {"q_num_heads": 4, "kv_num_heads": 2, "_opset": 23}, const=[False, False, False, True], kernel="vk_attention")
case("attention_4d_causal_float_mask_2d", "Attention", [r(1, 2, 6, 4), r(1, 2, 6, 4), r(1, 2, 6, 4), r(6, 6)],
     {"is_causal": 1, "_opset": 23}, const=[False, False, False, True], kernel="vk_attention")
# opset 25's sliding window, alone and with is_causal and a mask: the same load-time (Sq, Skv) table as causal
case("attention_4d_window_opset25", "Attention", [r(1, 2, 6, 4), r(1, 2, 8, 4), r(1, 2, 8, 4)],
     {"left_window_size": 2, "right_window_size": 1, "_opset": 25}, const=[False] * 3, kernel="vk_attention")
case("attention_3d_causal_left_window_mask_opset25", "Attention", [r(2, 5, 12), r(2, 5, 12), r(2, 5, 12), r(5, 5)],
     {"q_num_heads": 3, "kv_num_heads": 3, "is_causal": 1, "left_window_size": 1, "_opset": 25},
     const=[False, False, False, True], kernel="vk_attention")
case("ms_mha_bias_unidirectional", MS + "MultiHeadAttention", [r(2, 6, 12), r(2, 6, 12), r(2, 6, 9), None, None,
     r(1, 3, 6, 6)], {"num_heads": 3, "unidirectional": 1}, const=[False, False, False, False, False, True],
     kernel="vk_attention")
case("ms_mha_cross_scale", MS + "MultiHeadAttention", [r(1, 4, 16), r(1, 7, 16), r(1, 7, 16)],
     {"num_heads": 2, "scale": 0.3}, const=[False] * 3, kernel="vk_attention")

# RotaryEmbedding (issue 18): ONNX 4-D and 3-D, interleaved or halves, partial rotary dim, position ids computed
# (int64) or constant, caches per (batch, position); com.microsoft with one offset or per-token ids
_cos, _sin = np.cos(r(10, 4)), np.sin(r(10, 4))
_ids = np.array([[0, 3, 5, 9, 1, 2], [4, 4, 0, 1, 7, 8]], np.int64)
for _il in (0, 1):
    case(f"rotary_4d_ids_il{_il}", "RotaryEmbedding", [r(2, 3, 6, 8), _cos, _sin, _ids], {"interleaved": _il, "_opset": 23},
         const=[False, True, True, False], kernel="vk_rotary")
    case(f"rotary_3d_partial_il{_il}", "RotaryEmbedding", [r(2, 6, 24), _cos[:, :2], _sin[:, :2], _ids],
         {"interleaved": _il, "num_heads": 2, "rotary_embedding_dim": 4, "_opset": 23}, const=[False, True, True, True],
         kernel="vk_rotary")
case("rotary_no_ids_batch_caches", "RotaryEmbedding", [r(2, 6, 16), np.cos(r(2, 6, 4)), np.sin(r(2, 6, 4))],
     {"num_heads": 2, "_opset": 23}, const=[False, False, False], kernel="vk_rotary")
case("rotary_no_ids_2d_caches", "RotaryEmbedding", [r(1, 2, 6, 8), _cos[:6], _sin[:6]], {"_opset": 23},
     const=[False, True, True], kernel="vk_rotary")
case("ms_rotary_offset", MS + "RotaryEmbedding", [r(2, 5, 16), np.array([3], np.int64), _cos, _sin], {"num_heads": 2},
     const=[False, True, True, True], kernel="vk_rotary")
case("ms_rotary_ids_interleaved", MS + "RotaryEmbedding", [r(2, 6, 16), _ids, _cos, _sin],
     {"num_heads": 2, "interleaved": 1}, const=[False, False, True, True], kernel="vk_rotary")

# Einsum of matmul shape on the GEMM shaders (issue 18): MaxViT's attention, plain and transposed operands, the
# operands swapping roles (output n before m), a dot product, an outer product, a constant operand
for _eq, _shapes in (("bhid,bhjd->bhij", [(2, 3, 5, 8), (2, 3, 7, 8)]), ("bhij,bhjd->bhid", [(2, 3, 5, 7), (2, 3, 7, 8)]),
                     ("ij,kj->ik", [(5, 9), (6, 9)]), ("bid,bjd->bji", [(2, 5, 4), (2, 6, 4)]), ("i,i->", [(11,), (11,)]),
                     ("i,j->ij", [(4,), (5,)]), ("bnij,bnjk->bnik", [(1, 2, 3, 4), (1, 2, 4, 5)]),
                     ("ij,jk", [(3, 5), (5, 4)])):  # implicit output: 'ik'

    case(f"einsum_{_eq.replace(',', '_').replace('->', '_to_') or 'dot'}", "Einsum", [r(*s) for s in _shapes],
         {"equation": _eq}, const=[False, _eq == "ij,kj->ik"], kernel="vk_einsum")
# --- data movement
# GridSample (issue 18): both modes, every padding, align_corners either way; the grid reaches past [-1, 1]
_gs_x = r(2, 3, 5, 7)
_gs_grid = (RNG.random((2, 4, 6, 2)) * 2.6 - 1.3).astype(np.float32)
for _mode in ("bilinear", "nearest"):
    for _pad in ("zeros", "border", "reflection"):
        for _align in (0, 1):
            case(f"gridsample_{_mode}_{_pad}_{_align}", "GridSample", [_gs_x, _gs_grid],
                 {"mode": _mode, "padding_mode": _pad, "align_corners": _align, "_opset": 16}, const=[False, False],
                 kernel="vk_grid_sample")
case("gridsample_linear_opset20_1x1", "GridSample", [r(1, 2, 1, 1), _gs_grid[:1]], {"mode": "linear", "_opset": 20},
     const=[False, False], kernel="vk_grid_sample")
case("gather_elements_axis1_dyn_neg", "GatherElements", [r(3, 5, 4), RNG.integers(-5, 5, (3, 7, 4)).astype(np.int64)],
     {"axis": 1}, const=[False, False], kernel="vk_gather_elements")
case("gather_elements_axis0_const", "GatherElements", [r(4, 6), RNG.integers(0, 4, (2, 6)).astype(np.int64)],
     {"axis": 0}, kernel="vk_gather_elements")
case("gather_elements_last_axis_int32", "GatherElements", [r(2, 3, 9), RNG.integers(-9, 9, (2, 3, 2)).astype(np.int32)],
     {"axis": -1}, kernel="vk_gather_elements")
case("depth_to_space_dcr", "DepthToSpace", [r(2, 12, 3, 5)], {"blocksize": 2}, kernel="vk_pixel_shuffle")
case("depth_to_space_crd", "DepthToSpace", [r(1, 18, 4, 3)], {"blocksize": 3, "mode": "CRD"}, kernel="vk_pixel_shuffle")
case("space_to_depth", "SpaceToDepth", [r(2, 3, 6, 4)], {"blocksize": 2}, kernel="vk_pixel_shuffle")

case("concat_axis1", "Concat", [r(2, 3, 5), r(2, 4, 5), r(2, 1, 5)], {"axis": 1}, const=[False, False, False],
     kernel="vk_concat")
case("concat_const_part", "Concat", [r(1, 3, 4), r(1, 2, 4)], {"axis": 1}, const=[False, True], kernel="vk_concat")
case("split_uneven", "Split", [r(2, 7, 3), np.array([2, 5], np.int64)], {"axis": 1, "_opset": 13}, kernel="vk_split",
     n_out=2)
case("slice_steps", "Slice", [r(5, 9, 7), np.array([1, -1], np.int64), np.array([4, 0], np.int64),
                              np.array([0, 1], np.int64), np.array([2, -2], np.int64)], {"_opset": 13}, kernel="vk_slice")
case("transpose_4d", "Transpose", [r(2, 3, 4, 5)], {"perm": [0, 2, 3, 1]}, kernel="vk_transpose")
case("transpose_default", "Transpose", [r(3, 4, 5)], kernel="vk_transpose")
case("expand", "Expand", [r(3, 1, 5), np.array([2, 3, 4, 5], np.int64)], kernel="vk_expand")
case("tile", "Tile", [r(2, 3, 4), np.array([2, 1, 3], np.int64)], kernel="vk_tile")
case("gather_axis1_neg", "Gather", [r(3, 7, 4), np.array([[0, -1], [3, 2]], np.int64)], {"axis": 1}, kernel="vk_gather")
case("gather_scalar", "Gather", [r(1, 5, 8), np.array(0, np.int64)], {"axis": 1}, kernel="vk_gather")
for mode in ("constant", "reflect", "edge", "wrap"):
    case(f"pad_{mode}", "Pad", [r(1, 2, 5, 6), np.array([0, 0, 2, 1, 0, 0, 1, 3], np.int64), np.float32(0.5)],
         {"mode": mode, "_opset": 13}, kernel="vk_pad")
case("pad_negative", "Pad", [r(2, 3, 5, 6), np.array([0, 1, -1, 2, 0, -1, 2, -2], np.int64)],
     {"mode": "constant", "_opset": 13}, kernel="vk_pad")
case("identity_alias", "Identity", [r(3, 4)])  # an alias: no buffer, no dispatch
case("reshape_alias", "Reshape", [r(3, 4), np.array([2, -1], np.int64)])
case("cast_copy", "Cast", [r(3, 4)], {"to": 1}, kernel="vk_copy")
case("resize_nearest_x2", "Resize", [r(1, 2, 5, 6), np.zeros(0, np.float32), np.array([1, 1, 2, 2], np.float32)],
     {"mode": "nearest", "_opset": 13}, kernel="vk_resize")
case("resize_linear_halfpixel", "Resize", [r(1, 2, 5, 6), np.zeros(0, np.float32), np.array([1, 1, 1.6, 0.7], np.float32)],
     {"mode": "linear", "coordinate_transformation_mode": "half_pixel", "_opset": 13}, kernel="vk_resize")
case("resize_linear_align_sizes", "Resize", [r(2, 3, 4, 5), np.zeros(0, np.float32), np.zeros(0, np.float32),
                                              np.array([2, 3, 7, 9], np.int64)],
     {"mode": "linear", "coordinate_transformation_mode": "align_corners", "_opset": 13}, kernel="vk_resize")
case("upsample_nearest", "Upsample", [r(1, 2, 3, 4), np.array([1, 1, 2, 3], np.float32)], {"mode": "nearest"},
     kernel="vk_resize")


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory):
    from inferd.vulkan.device import VulkanConfig, VulkanDevice
    tmp = tmp_path_factory.mktemp("vk")
    os.environ["MESA_SHADER_CACHE_DIR"] = str(tmp / "mesa")
    dev = VulkanDevice(VulkanConfig(debug=True, cache_dir=str(tmp / "cache")))
    _precompile(dev)
    yield dev
    errors = dev.validation_errors
    dev.close()
    assert not errors, f"validation layer errors: {errors[:5]}"


def _precompile(dev: Any) -> None:
    """Compile every shader variant the cases need in one parallel batch (the install step does the same)."""
    from inferd.ops.base import choose_kernel, raw_key, single_node_layer
    from inferd.vulkan.executor import _import_kernels
    from inferd.vulkan.kernel import Caps
    from inferd.vulkan.shaders import norm_defines
    _import_kernels()
    variants = []
    for cid, op, ins, attrs, const, kernel in CASES:
        try:
            layer = single_node_layer(op, ins, dict(attrs), const, _N_OUT.get(cid, 1))
            k = choose_kernel(layer, "vulkan", kernel)
            raw = {raw_key(i): np.asarray(ins[i]) for i in layer.const_inputs}
            params = k.transform(layer, raw)
            variants += [(d.shader, norm_defines(d.defines)) for d in k.dispatches(layer, params, Caps())]
        except Exception:
            pass  # the test itself reports it
    dev.shader_cache.get_many(list(dict.fromkeys(variants)))


@pytest.mark.parametrize("cid,op,ins,attrs,const,kernel", CASES, ids=[c[0] for c in CASES])
def test_kernel_matches_reference(device: Any, cid: str, op: str, ins: list, attrs: dict, const: list | None,
                                  kernel: str | None) -> None:
    from inferd.vulkan.testing import rel_err, run_single
    if kernel is not None and kernel.endswith("_tex") and not device.texel_buffers:
        pytest.skip("texel-buffer kernels run on CPU-type devices only")
    got, ref, stats = run_single(device, op, ins, attrs, const, kernel, n_outputs=_N_OUT.get(cid, 1))
    if kernel is not None:
        assert stats["kernels"] == {"n0": kernel}
    elif op in ("Identity", "Reshape"):
        assert stats["kernels"] == {"n0": "alias"} and stats["dispatches"] == 0
    assert len(got) == len(ref)
    for g, rf in zip(got, ref):
        assert g.shape == rf.shape and g.dtype == rf.dtype, (g.shape, g.dtype, rf.shape, rf.dtype)
        if rf.dtype != np.float32:  # bool / int64 outputs must be exact
            assert np.array_equal(g, rf), f"{cid}: {g} != {rf}"
            continue
        inf = ~np.isfinite(rf)
        if inf.any():  # infinities where the reference has them, exactly; the rest within the tolerance
            assert np.array_equal(g[inf], rf[inf], equal_nan=True), f"{cid}: {g[inf]} != {rf[inf]}"
            g, rf = g[~inf], rf[~inf]
        err = rel_err(g, rf)
        assert err <= TOL, f"{cid}: relative error {err:.3g} > {TOL}"


def test_winograd_weights_fit_one_binding() -> None:
    """A Winograd kernel whose transformed weights (one binding) would pass the smallest maxStorageBufferRange
    does not apply: FCN-ResNet50's 2048->512 3x3 head (151 MB at F(4x4) in float32) failed at recording on
    lavapipe. A layer of a quarter the channels still gets it. (applies() is pure: no device needed.)"""
    import inferd.ops.conv_vulkan  # noqa: F401  (registers the Vulkan Conv kernels)
    from inferd.ops import kernels_for, single_node_layer
    from inferd.vulkan.kernel import MAX_BINDING_BYTES

    wino = [k for k in kernels_for("Conv", "vulkan") if k.name.startswith("vk_winograd")]
    assert {k.name for k in wino} >= {"vk_winograd43", "vk_winograd43_tex", "vk_winograd23"}
    for cin, cout, fits in ((2048, 512, False), (512, 512, True)):
        layer = single_node_layer("Conv", [np.zeros((1, cin, 8, 8), np.float32), np.zeros((cout, cin, 3, 3), np.float32)],
                                  {"pads": [1, 1, 1, 1]})
        for k in wino:
            if k.name == "vk_winograd23" and fits:
                continue  # F(2x2)'s 16 points: a smaller transform
            assert k.applies(layer) == (k.transformed_nbytes(layer) <= MAX_BINDING_BYTES), k.name
            if "43" in k.name:
                assert k.applies(layer) == fits, (k.name, cin, cout)


#: the issue-18 kernels are checked against onnxruntime too: case id -> (opset, domain) of the one-node model
_ORT_CASES: dict[str, tuple[int, str]] = {
    "groupnorm_per_channel": (21, ""), "groupnorm_per_group_opset18": (18, ""), "groupnorm_wide_rows": (21, ""),
    "groupnorm_dyn_scale": (21, ""), "rmsnorm_last": (23, ""), "rmsnorm_axis1_bcast_scale": (23, ""),
    "simplified_ln_inv_out": (17, ""), "layernorm_stats_outputs": (17, ""),
    **{c: (1, "com.microsoft") for c in ("skip_ln_all_outputs", "skip_ln_2d_skip_no_beta", "skip_simplified_ln_bias_sum",
                                         "ms_biasgelu", "ms_fastgelu_bias", "ms_fastgelu_nobias", "ms_quickgelu_alpha",
                                         "ms_quickgelu_default")},
    "mod_fmod1_bcast": (13, ""), "logic_And_bcast": (7, ""), "logic_Or_bcast": (7, ""), "logic_Xor_bcast": (7, ""),
    "logic_not_odd": (7, ""), "logic_and_const": (7, ""),
    **{c: (14, "") for c in ("trilu_upper0", "trilu_upper1", "trilu_upper0_k", "trilu_upper1_k",
                             "trilu_square_k_out_of_range")},
    **{c[0]: (13, "") for c in CASES if c[1] == "GatherElements"},
    "depth_to_space_dcr": (13, ""), "depth_to_space_crd": (13, ""), "space_to_depth": (13, ""),
    **{c[0]: (int(c[3]["_opset"]), "") for c in CASES if c[1] == "GridSample"},
    **{c[0]: (14, "") for c in CASES if c[1] == "CumSum"},
    **{c[0]: (int(c[3].get("_opset", 23)), "") for c in CASES if c[1] == "Attention"},
    **{c[0]: (12, "") for c in CASES if c[1] == "Einsum"},
    # (2-D caches without position ids are inferd's leniency: onnxruntime, as the spec, wants them 3-D)
    **{c[0]: (23, "") for c in CASES if c[1] == "RotaryEmbedding" and c[0] != "rotary_no_ids_2d_caches"},
    "ms_rotary_offset": (1, "com.microsoft"), "ms_rotary_ids_interleaved": (1, "com.microsoft"),
    "ms_mha_bias_unidirectional": (1, "com.microsoft"), "ms_mha_cross_scale": (1, "com.microsoft"),
    "ReduceMean_groupnorm_nhwc": (13, ""), "ReduceLogSumExp_two_runs_inner": (13, ""),
    "ReduceMax_two_runs_size1_between": (13, ""), "ReduceSum_two_runs_axes_input": (13, ""),
}
_BY_ID = {c[0]: c for c in CASES}


@pytest.mark.parametrize("cid", list(_ORT_CASES))
def test_kernel_matches_onnxruntime(device: Any, cid: str) -> None:
    """The same one-node graph through onnxruntime's CPU kernels: the Vulkan kernel must agree with it as with the
    numpy oracle (same tolerance; bool outputs exactly). float Mod with fmod=0 is left out: ONNX allows it only from
    opset 28, which onnxruntime does not run."""
    from onnx import helper
    from ortutil import feeds_for, make_single_node_model, run_ort

    from inferd.vulkan.testing import rel_err, run_single
    _, op, ins, attrs, const, kernel = _BY_ID[cid]
    opset, domain = _ORT_CASES[cid]
    mask = const if const is not None else [i > 0 for i in range(len(ins))]
    n_out = _N_OUT.get(cid, 1)
    model = make_single_node_model(op[len(MS):] if domain else op, ins, attrs, opset, mask, n_out, domain)
    if domain:
        model.opset_import.append(helper.make_opsetid("", 17))
    try:
        want = run_ort(model, feeds_for(ins, mask))
    except Exception as e:  # an onnxruntime older than the opset (the GPU machine's 1.30 has no Attention 25)
        if opset <= 23 or "Unrecognized attribute" not in str(e):
            raise
        import onnxruntime

        pytest.skip(f"onnxruntime {onnxruntime.__version__} does not run {op} at opset {opset}: {str(e)[:160]}")
    got, _, stats = run_single(device, op, ins, {**attrs, "_opset": opset if not domain else 17}, const, kernel,
                               n_outputs=n_out)
    assert stats["kernels"] == {"n0": kernel}
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        w = np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (k, g.shape, g.dtype, w.shape, w.dtype)
        if w.dtype != np.float32:
            assert np.array_equal(g, w), f"{cid} output {k}"
            continue
        err = rel_err(g, w)
        assert err <= TOL, f"{cid} output {k}: relative error {err:.3g} vs onnxruntime > {TOL}"


def test_einsum_gemm_lowering_refuses_other_equations() -> None:
    """Equations that are not one batched GEMM with contiguous (batch, m, n) output get no Vulkan Einsum kernel (the
    node runs on the CPU); applies() is pure, no device needed."""
    import inferd.ops.gemm_vulkan  # noqa: F401  (registers the Vulkan GEMM kernels)
    from inferd.ops.base import single_node_layer
    from inferd.ops.gemm_vulkan import einsum_as_gemm

    def lowered(eq: str, *shapes: tuple[int, ...]) -> bool:
        return einsum_as_gemm(single_node_layer("Einsum", [np.zeros(s, np.float32) for s in shapes],
                                                {"equation": eq}, [False] * len(shapes))) is not None

    assert lowered("bhid,bhjd->bhij", (1, 2, 3, 4), (1, 2, 5, 4)) and lowered("ij,jk->ik", (2, 3), (3, 4))
    assert not lowered("bkd,ked->bke", (3, 4, 6), (4, 5, 6))  # the batch label is not leading in the output
    assert not lowered("ii->i", (3, 3)) and not lowered("ij->ji", (2, 3))  # one operand: diagonal, transpose
    assert not lowered("ij,jk->i", (2, 3), (3, 4))  # k summed over the second operand alone
    assert not lowered("...ij,...jk->...ik", (2, 3, 4), (2, 4, 5))  # ellipsis
    assert not lowered("ijk,kj->i", (2, 3, 4), (4, 3))  # the contracted labels in two orders: no one stride


def _transformer_block() -> Any:
    """An encoder block as onnxruntime's transformer optimizer leaves it, plus the ONNX-23 forms: SkipLayerNorm (its
    sum output feeding the residual), Q/K/V MatMuls, MultiHeadAttention, FastGelu with bias, RotaryEmbedding on the
    query of a second (ONNX) Attention with a causal mask, RMSNormalization, GroupNormalization over the channels."""
    import onnx
    from onnx import helper as h, numpy_helper

    rng = np.random.default_rng(7)

    def w(*s: int, k: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(s) * k).astype(np.float32)

    inits = {"skip": w(1, 8, 32, k=1.0), "gamma": w(32, k=1.0), "beta": w(32), "bias": w(32), "wq": w(32, 32),
             "wk": w(32, 32), "wv": w(32, 32), "gb": w(32), "rms_s": w(32, k=1.0), "gn_s": w(8, k=1.0), "gn_b": w(8),
             "cos": np.cos(w(8, 4, k=2.0)), "sin": np.sin(w(8, 4, k=2.0)),
             "pos": np.arange(8, dtype=np.int64).reshape(1, 8)}
    ms = "com.microsoft"
    nodes = [h.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"], ["ln", "", "", "res"],
                         domain=ms, epsilon=1e-5, name="skipln"),
             h.make_node("MatMul", ["ln", "wq"], ["q"], name="mq"), h.make_node("MatMul", ["ln", "wk"], ["k"], name="mk"),
             h.make_node("MatMul", ["ln", "wv"], ["v"], name="mv"),
             h.make_node("MultiHeadAttention", ["q", "k", "v"], ["a"], domain=ms, num_heads=4, name="mha"),
             h.make_node("FastGelu", ["a", "gb"], ["g"], domain=ms, name="gelu"),
             h.make_node("RotaryEmbedding", ["q", "cos", "sin", "pos"], ["qr"], num_heads=4, name="rope"),
             h.make_node("Attention", ["qr", "k", "v"], ["a2"], q_num_heads=4, kv_num_heads=4, is_causal=1,
                         name="attn"),
             h.make_node("Add", ["g", "a2"], ["ga"], name="add1"),
             h.make_node("RMSNormalization", ["ga", "rms_s"], ["r"], epsilon=1e-6, name="rms"),
             h.make_node("Add", ["r", "res"], ["y0"], name="add2"),
             h.make_node("GroupNormalization", ["y0", "gn_s", "gn_b"], ["y"], num_groups=2, name="gn")]
    g = h.make_graph(nodes, "block", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 32])],
                     [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 32])],
                     [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 23), h.make_opsetid(ms, 1)])
    m.ir_version = 10
    return m


def test_transformer_block_runs_whole_on_vulkan(tmp_path: Any) -> None:
    """The issue-18 kernels composed in one graph: every node runs on a Vulkan kernel (none CPU-placed, so the block
    stays on the GPU between its MatMuls) and the output equals onnxruntime's."""
    import onnx
    from ortutil import ort_session

    import inferd
    m = _transformer_block()
    p = tmp_path / "block.onnx"
    onnx.save(m, p)
    x = RNG.standard_normal((1, 8, 32)).astype(np.float32)
    want = ort_session(p).run(None, {"x": x})[0]
    model = inferd.load(str(p), device="vulkan")
    try:
        got = model.run({"x": x})["y"]
        on_cpu = {n: k for n, k in model.kernels.items() if k.startswith("cpu")}
        assert not on_cpu, f"nodes placed on the CPU: {on_cpu}"
        assert {"skipln", "mha", "gelu", "rope", "attn", "rms", "gn"} <= set(model.kernels)
    finally:
        model.close()
    from inferd.vulkan.testing import rel_err
    assert rel_err(got, want) <= TOL, rel_err(got, want)


_TILED = [c[0] for c in CASES if c[5] in ("vk_attention", "vk_einsum")]


@pytest.mark.parametrize("cid", _TILED)
def test_lowered_gemm_on_gpu_path(device: Any, cid: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the attention and Einsum lowerings take matmul.comp's shared-memory tiles (a CPU-type device, as
    lavapipe, gets matmul_reg.comp): the same cases through the tiled shader, the device taken for a discrete GPU."""
    from dataclasses import replace

    from inferd.vulkan.testing import rel_err, run_single
    monkeypatch.setattr(device, "caps", replace(device.caps, device_type="discrete"))
    _, op, ins, attrs, const, kernel = _BY_ID[cid]
    got, ref, stats = run_single(device, op, ins, attrs, const, kernel)
    assert stats["kernels"] == {"n0": kernel}
    for g, rf in zip(got, ref):
        assert rel_err(g, rf) <= TOL, f"{cid}: relative error {rel_err(g, rf):.3g} > {TOL}"
