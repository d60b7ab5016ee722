"""Elementwise, tensor and reduce ops against onnxruntime: numpy reference, CPU kernel and shape inference.

Each case is a one-node ONNX model; shape-like inputs are initializers in the model and marked
constant for ``single_node_layer``, data inputs are fed at run time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import pytest

from inferd.errors import ShapeError, UnsupportedOpError
from inferd.ir import Node
from inferd.ops import base
from inferd.ops.activation import apply_act
from inferd.ops.tensor import numpy_to_onnx, onnx_dtype

from ortutil import feeds_for, make_single_node_model, run_ort

RNG = np.random.default_rng(1234)
I64_MAX, I64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min


def f32(*shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return RNG.uniform(lo, hi, shape).astype(np.float32)


def away0(*shape: int) -> np.ndarray:
    """Values with |v| in [0.5, 2]: safe divisors."""
    return (RNG.uniform(0.5, 2.0, shape) * RNG.choice([-1.0, 1.0], shape)).astype(np.float32)


def i64(*vals: int) -> np.ndarray:
    return np.array(vals, dtype=np.int64)


@dataclass
class Case:
    op: str
    inputs: list[np.ndarray | None]
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 17
    const: list[bool] | None = None  # default: every input is fed at run time
    n_out: int = 1

    def mask(self) -> list[bool]:
        return list(self.const) if self.const is not None else [False] * len(self.inputs)


def P(id_: str, op: str, inputs: list, attrs: dict | None = None, opset: int = 17,
      const: list[bool] | None = None, n_out: int = 1) -> Any:
    return pytest.param(Case(op, inputs, dict(attrs or {}), opset, const, n_out), id=id_)


def assert_close(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    ours, ref = np.asarray(ours), np.asarray(ref)
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != {ref.shape}"
    assert ours.dtype == ref.dtype, f"{what}: dtype {ours.dtype} != {ref.dtype}"
    if np.issubdtype(ref.dtype, np.floating):
        assert np.array_equal(np.isnan(ours), np.isnan(ref)), f"{what}: NaN positions differ"
        fin = np.isfinite(ref)
        assert np.array_equal(ours[~fin & ~np.isnan(ref)], ref[~fin & ~np.isnan(ref)]), f"{what}: infinities differ"
        if fin.any():
            a, b = ours[fin].astype(np.float64), ref[fin].astype(np.float64)
            scale = max(float(np.abs(b).max()), 1e-30)
            tol = 1e-3 if ref.dtype == np.float16 else 1e-4
            err = float(np.abs(a - b).max()) / scale
            assert err <= tol, f"{what}: relative error {err:.3g} > {tol}"
    else:
        assert np.array_equal(ours, ref), f"{what}: values differ\nours={ours}\nref={ref}"


# ------------------------------------------------------------------------------------------ cases

ELEMENTWISE = [
    P("add_same", "Add", [f32(2, 3, 4, 5), f32(2, 3, 4, 5)]),
    P("add_bias_const", "Add", [f32(1, 3, 224, 224), f32(3, 1, 1)], const=[False, True]),
    P("add_bidir", "Add", [f32(4, 1, 5), f32(1, 3, 1)]),
    P("add_scalar_first", "Add", [np.array(1.5, np.float32), f32(7, 13)], const=[True, False]),
    P("add_opset7", "Add", [f32(2, 3), f32(3)], opset=7),
    P("sub_bcast", "Sub", [f32(2, 3, 5), f32(5)], const=[False, True]),
    P("sub_rev_bcast", "Sub", [f32(1, 5), f32(3, 1)]),
    P("mul_bcast", "Mul", [f32(2, 3, 7, 9), f32(1, 3, 1, 1)], const=[False, True]),
    P("div_bcast", "Div", [f32(2, 3, 7), away0(7)]),
    P("div_scalar", "Div", [f32(5, 11), np.array(3.0, np.float32)], const=[False, True]),
    P("add_int64", "Add", [i64(1, -2, 3), i64(10, 20, 30)]),
    P("sub_int32", "Sub", [np.array([[1, 2], [3, 4]], np.int32), np.array([5, -6], np.int32)]),
    P("mul_int64_const", "Mul", [i64(2, 3, 4), i64(-1)], const=[False, True]),
    P("div_int64_trunc", "Div", [i64(-7, 7, -7, 7, 0, -1, 9, -9), i64(2, 2, -2, -2, 3, 5, 3, -4)]),
    P("div_int32_trunc", "Div", [np.array([-7, 7, -8, 13], np.int32), np.array([3, -3, 3, 4], np.int32)]),
    P("pow_sq", "Pow", [f32(3, 4), np.array(2.0, np.float32)], const=[False, True]),
    P("pow_sqrt", "Pow", [f32(3, 4, lo=0.1), np.array(0.5, np.float32)], const=[False, True]),
    P("pow_cube_int_exp", "Pow", [f32(3, 4), np.array(3, np.int64)], opset=13, const=[False, True]),
    P("pow_int", "Pow", [i64(2, 3, -2, 5), i64(3, 2, 3, 0)], opset=13),
    P("pow_array", "Pow", [f32(2, 5, lo=0.1), f32(5)]),
    P("pow_one_elem_bcast", "Pow", [f32(4, lo=0.1), np.array([[2.0]], np.float32)], const=[False, True]),
    P("min2", "Min", [f32(3, 4), f32(4)]),
    P("max2", "Max", [f32(2, 1, 4), f32(3, 1)]),
    P("min3", "Min", [f32(2, 3), f32(3), f32(1, 1)], opset=13),
    P("max3_widen", "Max", [f32(3), f32(2, 3), f32(4, 1, 1)], opset=13),
    P("max1", "Max", [f32(3, 4)], opset=13),
    P("max_int", "Max", [i64(1, 5, -3), i64(2, 2, 2)], opset=13),
    P("sum3", "Sum", [f32(2, 3), f32(3), f32(2, 1)]),
    P("sum1", "Sum", [f32(5)]),
    P("mean3", "Mean", [f32(2, 3), f32(3), f32(2, 1)]),
    P("sqrt", "Sqrt", [f32(3, 5, lo=0.0, hi=4.0)]),
    P("exp", "Exp", [f32(3, 5)]),
    P("log", "Log", [f32(3, 5, lo=0.01, hi=5.0)]),
    P("neg", "Neg", [f32(3, 5)]),
    P("neg_int", "Neg", [np.array([1, -2, 3], np.int32)]),
    P("abs", "Abs", [f32(3, 5)]),
    P("abs_int64", "Abs", [i64(-4, 0, 9)]),
    P("reciprocal", "Reciprocal", [away0(4, 6)]),
    P("erf", "Erf", [f32(4, 33, lo=-3, hi=3)]),
    P("floor", "Floor", [f32(3, 7, lo=-5, hi=5)]),
    P("ceil", "Ceil", [f32(3, 7, lo=-5, hi=5)]),
    P("equal_int", "Equal", [i64(1, 2, 3, 4), i64(1, 0, 3, 0)]),
    # Clip on integers: absent bounds must not become float +-inf (those do not cast back to int8)
    P("clip_int8_no_bounds", "Clip", [np.array([-128, -3, 0, 5, 127], np.int8)], opset=13),
    P("clip_int8_min_dyn", "Clip", [np.array([-128, -3, 0, 5, 127], np.int8), np.array(-2, np.int8)], opset=13),
    P("clip_int8_max_only_const", "Clip", [np.array([-128, -3, 0, 5, 127], np.int8), None, np.array(4, np.int8)],
      opset=13, const=[False, False, True]),
    P("clip_int64_both_dyn", "Clip", [i64(-9, -1, 0, 3, 12), np.array(-1, np.int64), np.array(3, np.int64)],
      opset=13),
    P("clip_uint8_min_gt_max", "Clip", [np.array([0, 4, 200, 255], np.uint8), np.array(100, np.uint8),
                                        np.array(50, np.uint8)], opset=13),
    P("clip_f32_dyn_max", "Clip", [f32(3, 4), None, np.array(0.25, np.float32)], opset=13),
    P("equal_f_bcast", "Equal", [np.array([[1, 2], [3, 4]], np.float32), np.array([1, 4], np.float32)]),
    P("less", "Less", [f32(3, 4), f32(4)]),
    P("greater", "Greater", [f32(3, 4), f32(3, 1)]),
    P("less_equal", "LessOrEqual", [np.array([1, 2, 3], np.float32), np.array([2, 2, 2], np.float32)]),
    P("greater_equal", "GreaterOrEqual", [i64(1, 2, 3), i64(2)]),
    P("where", "Where", [RNG.random((3, 4)) > 0.5, f32(3, 4), f32(4)]),
    P("where_bcast", "Where", [RNG.random((1, 4)) > 0.5, f32(3, 1), np.array(0.0, np.float32)],
      const=[False, False, True]),
]

X4 = f32(2, 3, 4, 5)
TENSOR = [
    P("concat_ax1", "Concat", [f32(2, 3, 4), f32(2, 1, 4), f32(2, 5, 4)], {"axis": 1}),
    P("concat_neg_const", "Concat", [f32(2, 3), f32(2, 4)], {"axis": -1}, const=[False, True]),
    P("concat_int64", "Concat", [i64(1, 2), i64(3)], {"axis": 0}),
    P("split_attr_op11", "Split", [f32(2, 5, 3)], {"axis": 1, "split": [2, 3]}, opset=11, n_out=2),
    P("split_equal_op11", "Split", [f32(6, 4)], {}, opset=11, n_out=3),
    P("split_input_op13", "Split", [f32(2, 7), i64(3, 1, 3)], {"axis": -1}, opset=13, const=[False, True], n_out=3),
    P("split_equal_op13", "Split", [f32(3, 8)], {"axis": 1}, opset=13, n_out=4),
    P("split_num_outputs_uneven", "Split", [f32(7, 2)], {"axis": 0, "num_outputs": 3}, opset=18, n_out=3),
    P("slice_basic", "Slice", [X4, i64(1, 0), i64(3, 2), i64(2, 3)], opset=13, const=[False, True, True, True]),
    P("slice_neg_idx", "Slice", [X4, i64(-3), i64(-1), i64(-1)], opset=13, const=[False, True, True, True]),
    P("slice_clamped", "Slice", [X4, i64(-100, 1), i64(I64_MAX, 1000), i64(1, 3)], opset=13,
      const=[False, True, True, True]),
    P("slice_steps", "Slice", [X4, i64(0, 1), i64(5, 4), i64(3, 2), i64(2, 2)], opset=13,
      const=[False, True, True, True, True]),
    P("slice_neg_step_full", "Slice", [X4, i64(-1), i64(I64_MIN), i64(3), i64(-1)], opset=13,
      const=[False, True, True, True, True]),
    P("slice_neg_step2", "Slice", [f32(11), i64(9), i64(1), i64(0), i64(-3)], opset=13,
      const=[False, True, True, True, True]),
    P("slice_no_axes", "Slice", [X4, i64(1, 1), i64(2, 3)], opset=10, const=[False, True, True]),
    P("slice_empty", "Slice", [X4, i64(3), i64(1)], opset=13, const=[False, True, True]),
    P("slice_opset1", "Slice", [X4], {"starts": [1, -2], "ends": [2, 100], "axes": [0, 3]}, opset=1),
    P("slice_opset9_noaxes", "Slice", [X4], {"starts": [0, 1], "ends": [1, 3]}, opset=9),
    P("reshape_zero_neg1", "Reshape", [X4, i64(0, -1)], opset=13, const=[False, True]),
    P("reshape_flat", "Reshape", [X4, i64(-1)], opset=13, const=[False, True]),
    P("reshape_4to3", "Reshape", [X4, i64(2, 0, 20)], opset=5, const=[False, True]),
    P("reshape_allowzero", "Reshape", [np.zeros((0, 3), np.float32), i64(3, 0)], {"allowzero": 1}, opset=14,
      const=[False, True]),
    P("flatten_default", "Flatten", [X4], opset=13),
    P("flatten_0", "Flatten", [X4], {"axis": 0}, opset=13),
    P("flatten_neg", "Flatten", [X4], {"axis": -1}, opset=13),
    P("flatten_rank", "Flatten", [X4], {"axis": 4}, opset=13),
    P("transpose_default", "Transpose", [X4]),
    P("transpose_nhwc", "Transpose", [f32(1, 3, 224, 224)], {"perm": [0, 2, 3, 1]}),
    P("transpose_channel_shuffle", "Transpose", [f32(1, 2, 29, 7, 7)], {"perm": [0, 2, 1, 3, 4]}),
    P("squeeze_attr_op11", "Squeeze", [f32(2, 1, 3, 1)], {"axes": [1]}, opset=11),
    P("squeeze_input_op13", "Squeeze", [f32(2, 1, 3, 1), i64(-1, 1)], opset=13, const=[False, True]),
    P("squeeze_all", "Squeeze", [f32(1, 2, 1, 3, 1)], opset=13),
    P("squeeze_empty_axes", "Squeeze", [f32(1, 2, 1), np.zeros(0, np.int64)], opset=13, const=[False, True]),
    P("unsqueeze_attr_op11", "Unsqueeze", [f32(2, 3)], {"axes": [0, 3]}, opset=11),
    P("unsqueeze_input_op13", "Unsqueeze", [f32(2, 3), i64(-1, 0)], opset=13, const=[False, True]),
    P("unsqueeze_scalar", "Unsqueeze", [np.array(5, np.int64), i64(0)], opset=13, const=[False, True]),
    P("gather_neg_const_idx", "Gather", [f32(5, 4), i64(-1, 0, 2)], {"axis": 0}, const=[False, True]),
    P("gather_ax1_2d_dyn", "Gather", [f32(3, 6, 2), np.array([[0, 5], [-2, 1]], np.int64)], {"axis": 1}),
    P("gather_ax_neg_int32", "Gather", [f32(3, 4), np.array([3, -4], np.int32)], {"axis": -1},
      const=[False, True]),
    P("gather_scalar_idx", "Gather", [i64(2, 3, 224, 224), np.array(1, np.int64)], {"axis": 0}, const=[False, True]),
    P("gather_scalar_neg_ax2", "Gather", [f32(1, 1, 5, 3, 7), np.array(-2, np.int64)], {"axis": 2},
      const=[False, True]),
    P("gather_one_elem_ax1", "Gather", [f32(2, 4, 3), i64(3)], {"axis": 1}, const=[False, True]),
    P("gather_embedding", "Gather", [f32(10, 8), np.array([[1, 9, 0]], np.int64)], const=[True, False]),
    P("expand", "Expand", [f32(3, 1), i64(2, 3, 4)], opset=13, const=[False, True]),
    P("expand_smaller_rank", "Expand", [f32(2, 3), i64(1)], opset=13, const=[False, True]),
    P("expand_ones", "Expand", [f32(1, 3, 1), i64(2, 1, 5)], opset=13, const=[False, True]),
    P("shape", "Shape", [X4], opset=13),
    P("size", "Size", [X4], opset=13),
    P("size_scalar_int", "Size", [np.array(3, np.int32)], opset=13),
    P("size_empty", "Size", [np.zeros((2, 0, 3), np.float32)], opset=19),
    P("shape_start", "Shape", [X4], {"start": 1}, opset=15),
    P("shape_end_neg", "Shape", [X4], {"end": -1}, opset=15),
    P("shape_start_neg_clamp", "Shape", [X4], {"start": -2, "end": 100}, opset=15),
    P("cast_f2i", "Cast", [np.array([-2.7, -0.5, 0.5, 2.7, 100.2], np.float32)], {"to": 6}, opset=13),
    P("cast_i2f", "Cast", [i64(-3, 0, 7)], {"to": 1}, opset=13),
    P("cast_f2bool", "Cast", [np.array([0.0, 1.5, -2.0, 0.0], np.float32)], {"to": 9}, opset=13),
    P("cast_bool2f", "Cast", [np.array([True, False], np.bool_)], {"to": 1}, opset=13),
    P("cast_f2h", "Cast", [f32(3, 4)], {"to": 10}, opset=13),
    P("cast_i64_i32", "Cast", [i64(5, -6)], {"to": 6}, opset=13),
    P("castlike", "CastLike", [f32(2, 3, lo=-9, hi=9), np.zeros(1, np.int64)], opset=15, const=[False, True]),
    P("constant_tensor", "Constant", [], {"value": f32(2, 3)}, opset=13),
    P("constant_int_tensor", "Constant", [], {"value": i64(4, 5, 6)}, opset=13),
    P("constant_value_float", "Constant", [], {"value_float": 2.5}, opset=13),
    P("constant_value_floats", "Constant", [], {"value_floats": [1.0, 2.0]}, opset=13),
    P("constant_value_int", "Constant", [], {"value_int": 7}, opset=13),
    P("constant_value_ints", "Constant", [], {"value_ints": [1, -1, 3]}, opset=13),
    P("cos_default", "ConstantOfShape", [i64(2, 3)], opset=13, const=[True]),
    P("cos_int_value", "ConstantOfShape", [i64(4)], {"value": i64(7)}, opset=13, const=[True]),
    P("cos_float_value", "ConstantOfShape", [i64(1, 2, 3)], {"value": np.array([0.25], np.float32)}, opset=13,
      const=[True]),
    P("identity", "Identity", [f32(3, 4)]),
    P("identity_int", "Identity", [i64(1, 2)]),
    P("dropout_op13", "Dropout", [f32(3, 4)], opset=13),
    P("dropout_mask", "Dropout", [f32(3, 4)], opset=13, n_out=2),
    P("dropout_ratio", "Dropout", [f32(3, 4), np.array(0.3, np.float32)], opset=12, const=[False, True]),
    P("pad_op2_const", "Pad", [f32(1, 2, 3, 3)], {"pads": [0, 0, 1, 2, 0, 0, 2, 1], "value": 1.5}, opset=2),
    P("pad_op2_reflect", "Pad", [f32(1, 2, 4, 4)], {"pads": [0, 0, 1, 2, 0, 0, 2, 1], "mode": "reflect"}, opset=2),
    P("pad_op11_const", "Pad", [f32(1, 3, 5, 5), i64(0, 0, 1, 1, 0, 0, 1, 1)], opset=11, const=[False, True]),
    P("pad_op11_value", "Pad", [f32(2, 3), i64(1, 0, 2, 3), np.array(-1.0, np.float32)], opset=13,
      const=[False, True, True]),
    P("pad_reflect", "Pad", [f32(1, 2, 5, 6), i64(0, 0, 2, 1, 0, 0, 1, 3)], {"mode": "reflect"}, opset=13,
      const=[False, True]),
    P("pad_edge", "Pad", [f32(2, 5, 6), i64(0, 2, 1, 0, 1, 3)], {"mode": "edge"}, opset=13, const=[False, True]),
    P("pad_negative", "Pad", [f32(3, 6), i64(-1, 2, 1, -3)], opset=13, const=[False, True]),
    # swin's window pad (NHWC, the ends of H and W), and crops and pads on every side of a 4-D tensor
    P("pad_nhwc_window", "Pad", [f32(1, 9, 9, 24), i64(0, 0, 0, 0, 0, 5, 5, 0)], opset=13, const=[False, True]),
    P("pad_every_side", "Pad", [f32(2, 5, 6, 7), i64(1, -1, 2, 0, 0, 2, -2, 3), np.array(2.5, np.float32)],
      opset=13, const=[False, True, True]),
    P("pad_int", "Pad", [i64(1, 2, 3), i64(2, 1), np.array(9, np.int64)], opset=13, const=[False, True, True]),
    P("pad_axes_op18", "Pad", [f32(2, 3, 4), i64(1, 2, 0, 1), np.array(0.5, np.float32), i64(-1, 0)], opset=18,
      const=[False, True, True, True]),
    P("pad_wrap_op19", "Pad", [f32(3, 4), i64(1, 2, 2, 3)], {"mode": "wrap"}, opset=19, const=[False, True]),
    P("tile", "Tile", [f32(2, 3, 1), i64(2, 1, 3)], opset=13, const=[False, True]),
    P("range_int", "Range", [np.array(1, np.int64), np.array(10, np.int64), np.array(3, np.int64)], opset=11,
      const=[True, True, True]),
    P("range_neg", "Range", [np.array(10, np.int32), np.array(2, np.int32), np.array(-3, np.int32)], opset=11,
      const=[True, True, True]),
    P("range_float", "Range", [np.array(0.5, np.float32), np.array(2.0, np.float32), np.array(0.25, np.float32)],
      opset=11, const=[True, True, True]),
    P("range_float_accum", "Range", [np.array(0.1, np.float32), np.array(1.0, np.float32), np.array(0.1, np.float32)],
      opset=11, const=[True, True, True]),
]

R4 = f32(2, 3, 5, 7)
REDUCE = [
    P("mean_hw", "ReduceMean", [f32(1, 3, 224, 224)], {"axes": [2, 3]}, opset=13),
    P("mean_hw_nokeep_odd", "ReduceMean", [f32(2, 37, 7, 7)], {"axes": [-1, 2], "keepdims": 0}, opset=13),
    P("mean_1x1_map", "ReduceMean", [f32(1, 19, 1, 1)], {"axes": [2, 3]}, opset=13),
    P("max_hw", "ReduceMax", [f32(1, 5, 3, 3)], {"axes": [2, 3]}, opset=13),
    P("max_last_op18", "ReduceMax", [f32(3, 4, 9), i64(-1)], {"keepdims": 0}, opset=18, const=[False, True]),
    P("mean_nokeep_neg", "ReduceMean", [R4], {"axes": [-1, 1], "keepdims": 0}, opset=13),
    P("mean_all", "ReduceMean", [R4], opset=13),
    P("mean_all_nokeep", "ReduceMean", [R4], {"keepdims": 0}, opset=13),
    P("mean_op18_input", "ReduceMean", [R4, i64(1)], opset=18, const=[False, True]),
    P("mean_op18_noop", "ReduceMean", [R4], {"noop_with_empty_axes": 1}, opset=18),
    P("sum_op11_attr", "ReduceSum", [R4], {"axes": [0, 2]}, opset=11),
    P("sum_op13_input", "ReduceSum", [R4, i64(-2)], {"keepdims": 0}, opset=13, const=[False, True]),
    P("sum_op13_noaxes", "ReduceSum", [R4], opset=13),
    P("sum_op13_noop", "ReduceSum", [R4], {"noop_with_empty_axes": 1}, opset=13),
    P("sum_op13_empty_axes", "ReduceSum", [R4, np.zeros(0, np.int64)], opset=13, const=[False, True]),
    P("sum_int64", "ReduceSum", [np.arange(24, dtype=np.int64).reshape(2, 3, 4), i64(1)], opset=13,
      const=[False, True]),
    P("max", "ReduceMax", [R4], {"axes": [1]}, opset=13),
    P("max_int", "ReduceMax", [np.array([[3, 9], [-1, 4]], np.int64)], {"axes": [0], "keepdims": 0}, opset=13),
    P("min_op18", "ReduceMin", [R4, i64(3, 0)], opset=18, const=[False, True]),
    P("prod", "ReduceProd", [f32(3, 4, lo=0.5, hi=1.5)], {"axes": [1]}, opset=13),
    P("l1", "ReduceL1", [R4], {"axes": [2]}, opset=13),
    P("l2", "ReduceL2", [R4], {"axes": [-1], "keepdims": 0}, opset=13),
    P("sumsquare", "ReduceSumSquare", [R4], {"axes": [1, 2]}, opset=13),
    # over trailing axes (an L2 normalisation's norm): one einsum over contiguous rows, bound
    P("l2_trailing2_keep", "ReduceL2", [R4], {"axes": [2, 3]}, opset=13),
    P("l2_tokens", "ReduceL2", [f32(1, 4, 22, 64)], {"axes": [-1]}, opset=13),
    P("l2_op18_input", "ReduceL2", [f32(2, 3, 17), i64(-1)], opset=18, const=[False, True]),
    P("sumsquare_last", "ReduceSumSquare", [R4], {"axes": [3], "keepdims": 0}, opset=13),
    P("logsum", "ReduceLogSum", [f32(3, 4, lo=0.1)], {"axes": [1]}, opset=13),
    P("logsumexp", "ReduceLogSumExp", [f32(3, 40, lo=-50, hi=50)], {"axes": [1]}, opset=13),
    # reductions over an empty axis give the op's identity (onnxruntime: -inf / +inf / dtype min / max)
    P("max_empty_f32", "ReduceMax", [np.zeros((2, 0, 4), np.float32), i64(1)], opset=18, const=[False, True]),
    P("max_empty_all", "ReduceMax", [np.zeros((0, 3), np.float32)], {"keepdims": 0}, opset=18),
    P("min_empty_f32", "ReduceMin", [np.zeros((2, 0, 4), np.float32), i64(1)], opset=18, const=[False, True]),
    P("max_empty_int32", "ReduceMax", [np.zeros((0, 3), np.int32), i64(0)], opset=18, const=[False, True]),
    P("min_empty_int64", "ReduceMin", [np.zeros((0, 3), np.int64), i64(0)], opset=18, const=[False, True]),
    P("max_empty_int8", "ReduceMax", [np.zeros((3, 0), np.int8), i64(1)], opset=18, const=[False, True]),
    P("min_empty_uint8", "ReduceMin", [np.zeros((3, 0), np.uint8), i64(1)], opset=18, const=[False, True]),
    P("max_empty_f16", "ReduceMax", [np.zeros((2, 0), np.float16), i64(1)], opset=18, const=[False, True]),
    P("logsumexp_empty", "ReduceLogSumExp", [np.zeros((2, 0, 4), np.float32), i64(1)], opset=18,
      const=[False, True]),
    P("max_int_neg_values", "ReduceMax", [np.array([[-7, -9], [-8, -100]], np.int32)], {"axes": [1]}, opset=13),
    P("min_f32_inf_values", "ReduceMin", [np.array([[np.inf, 3.0], [np.inf, np.inf]], np.float32)], {"axes": [1]},
      opset=13),
    P("softmax_op11_default", "Softmax", [f32(2, 3, 4)], opset=11),
    P("softmax_op11_axis2", "Softmax", [f32(2, 3, 4)], {"axis": 2}, opset=11),
    P("softmax_op11_axis0", "Softmax", [f32(2, 3, 4)], {"axis": 0}, opset=11),
    P("softmax_op11_neg", "Softmax", [f32(2, 3, 4, 5)], {"axis": -2}, opset=11),
    P("softmax_op13_default", "Softmax", [f32(2, 3, 4, lo=-20, hi=20)], opset=13),
    P("softmax_op13_axis1", "Softmax", [f32(1, 1000, 3, 2)], {"axis": 1}, opset=13),
    P("softmax_op13_1x1000", "Softmax", [f32(1, 1000, lo=-30, hi=30)], opset=13),
    P("logsoftmax_op11", "LogSoftmax", [f32(2, 3, 4)], opset=11),
    P("logsoftmax_op13", "LogSoftmax", [f32(2, 3, 4, lo=-20, hi=20)], {"axis": 1}, opset=13),
    P("argmax", "ArgMax", [R4], {"axis": 1, "keepdims": 0}, opset=13),
    P("argmax_default", "ArgMax", [R4], opset=13),
    P("argmin_last", "ArgMin", [np.array([[1, 0, 0, 3], [2, 2, 5, 2]], np.int64)],
      {"axis": 1, "select_last_index": 1}, opset=13),
    P("argmax_last_neg", "ArgMax", [np.array([[1, 3, 3], [4, 4, 0]], np.float32)],
      {"axis": -1, "select_last_index": 1, "keepdims": 1}, opset=13),
]


# ------------------------------------------------------------------------------------------ tests

def _ours_attrs(c: Case) -> dict[str, Any]:
    return {**c.attrs, "_opset": c.opset}


@pytest.mark.parametrize("case", ELEMENTWISE + TENSOR + REDUCE)
def test_op_against_ort(case: Case) -> None:
    mask = case.mask()
    model = make_single_node_model(case.op, case.inputs, case.attrs, case.opset, mask, case.n_out)
    expected = run_ort(model, feeds_for(case.inputs, mask))
    saved = [None if a is None else np.array(a, copy=True) for a in case.inputs]

    # (a) the numpy reference
    spec = base.op_spec(case.op)
    assert spec is not None
    names = [f"x{i}" if a is not None else "" for i, a in enumerate(case.inputs)]
    node = Node("n0", case.op, names, [f"y{i}" for i in range(case.n_out)], _ours_attrs(case))
    if spec.check is not None:
        spec.check(node, case.opset)
    ref = spec.reference(node, list(case.inputs))
    assert len(ref) >= len(expected)
    for k, (r, e) in enumerate(zip(ref, expected)):
        assert_close(r, e, f"reference output {k}")

    # (b) static shape inference and the CPU kernel
    layer = base.single_node_layer(case.op, case.inputs, _ours_attrs(case), const=mask, n_outputs=case.n_out)
    assert [o.shape for o in layer.outputs] == [e.shape for e in expected]
    assert [np.dtype(o.dtype) for o in layer.outputs] == [e.dtype for e in expected]
    kernel = base.choose_kernel(layer)
    for bound in (False, True):  # run() and the call bind() pre-binds, which the CPU executor uses
        outs = base.run_layer(kernel, layer, case.inputs, bound=bound)
        for k, (o, e) in enumerate(zip(outs, expected)):
            assert_close(o, e, f"{kernel.name} kernel output {k} (bound={bound})")
    for a, s in zip(case.inputs, saved):  # kernels and references must not write into their inputs
        if a is not None:
            assert np.array_equal(a, s, equal_nan=a.dtype.kind == "f")


@pytest.mark.parametrize("op,act", [("Add", ("Relu", ())), ("Mul", ("Sigmoid", ())), ("Sub", ("Clip", (-0.5, 0.5))),
                                    ("Div", ("LeakyRelu", (0.1,))), ("Mul", ("SiLU", ())), ("Add", ("HardSwish", ()))])
@pytest.mark.parametrize("channels", [3, 184], ids=["small", "native-act"])  # 184@8x8: the act's one native pass
def test_binary_fused_act(op: str, act: tuple, channels: int) -> None:
    a, b = f32(2, channels, 8, 8), away0(channels, 1, 1)
    expected = run_ort(make_single_node_model(op, [a, b], {}, 13, [False, True]), {"x0": a})[0]
    expected = apply_act(expected.copy(), act)
    attrs = {"act": act, "_opset": 13}
    layer = base.single_node_layer(op, [a, b], attrs, const=[False, True])
    for bound in (False, True):
        out = base.run_layer(base.choose_kernel(layer), layer, [a, b], bound=bound)[0]
        assert_close(out, expected, f"kernel (bound={bound})")
    node = Node("n0", op, ["x0", "x1"], ["y0"], attrs)
    assert_close(base.op_spec(op).reference(node, [a, b])[0], expected, "reference")


@pytest.mark.parametrize("shapes", [((1, 24, 9, 11), (1, 24, 1, 1)), ((2, 40, 56), (2, 40, 1)), ((24, 9, 11), (24, 1, 1)),
                                    ((7, 33), (7, 1)), ((1, 144, 56, 56), (1, 144, 1, 1)), ((1, 6, 5, 4), (6, 1, 1))],
                         ids=["se", "1d-batch2", "no-batch", "2d", "threads", "rank-lower"])
@pytest.mark.parametrize("scale_first", [False, True])
def test_mul_by_row_scale_native(shapes: tuple, scale_first: bool) -> None:
    """Mul of a tensor by one value per row of its trailing dims (squeeze-and-excitation's scale) runs bound as the
    native per-row scale over the pool, either operand order, with numpy's products exactly."""
    from inferd import native

    x, sc = f32(*shapes[0]), f32(*shapes[1])
    ins = [sc, x] if scale_first else [x, sc]
    layer = base.single_node_layer("Mul", ins, {"_opset": 13}, const=[False, False])
    kernel = base.choose_kernel(layer)
    out = np.full(shapes[0], np.nan, np.float32)
    call = kernel.bind(layer, ins, {}, [out])
    assert call is not None
    if native.AVAILABLE:
        assert "scale" in getattr(call, "__qualname__", "")  # the native row scale, not the ufunc
    call()
    np.testing.assert_array_equal(out, x * sc)


def test_add_residual_attr_ignored() -> None:
    a, b = f32(4, 5), f32(4, 5)
    layer = base.single_node_layer("Add", [a, b], {"residual": True, "_opset": 13}, const=[False, False])
    out = base.run_layer(base.choose_kernel(layer), layer, [a, b])[0]
    assert_close(out, a + b, "Add with residual flag")


@pytest.mark.parametrize("op,inputs,what", [
    ("Reshape", [f32(2, 6), i64(3, 4)], "shape"),
    ("Slice", [f32(4, 4), i64(1), i64(3)], "starts"),
    ("Expand", [f32(3, 1), i64(3, 4)], "shape"),
    ("Unsqueeze", [f32(3), i64(0)], "axes"),
    ("Pad", [f32(3), i64(1, 1)], "pads"),
    ("ConstantOfShape", [i64(2, 2)], "shape"),
    ("ReduceSum", [f32(3, 4), i64(1)], "axes"),
])
def test_dynamic_shape_input_rejected(op: str, inputs: list, what: str) -> None:
    with pytest.raises(ShapeError, match=rf"'n0'.*{what}.*'x\d'"):
        base.single_node_layer(op, inputs, {"_opset": 13}, const=[False] * len(inputs))


def test_dynamic_indices_ok() -> None:
    # Gather's indices are data, not shape: they may be computed at run time
    layer = base.single_node_layer("Gather", [f32(5, 2), i64(4, 0)], {"axis": 0}, const=[False, False])
    assert layer.outputs[0].shape == (2, 2)


@pytest.mark.parametrize("op,inputs,attrs", [
    ("Reshape", [f32(2, 6), i64(5, -1)], {}),
    ("Add", [f32(2, 3), f32(4)], {}),
    ("Concat", [f32(2, 3), f32(3, 3)], {"axis": 1}),
    ("Squeeze", [f32(2, 3), i64(0)], {}),
    ("Split", [f32(5, 2)], {"axis": 0}),
])
def test_bad_shapes_raise(op: str, inputs: list, attrs: dict) -> None:
    n_out = 2 if op == "Split" else 1
    with pytest.raises(ShapeError, match="n0"):
        base.single_node_layer(op, inputs, {**attrs, "_opset": 13}, const=[False] + [True] * (len(inputs) - 1),
                               n_outputs=n_out)


@pytest.mark.parametrize("op,identity", [("ReduceMax", False), ("ReduceMin", True)])
def test_reduce_empty_set_bool(op: str, identity: bool) -> None:
    # onnxruntime refuses bool over an empty set; ONNX's node test (and the identity) say False for max
    x = np.zeros((2, 0, 4), np.bool_)
    node = Node("n0", op, ["x0", "x1"], ["y0"], {"_opset": 20})
    want = np.full((2, 1, 4), identity)
    assert_close(base.op_spec(op).reference(node, [x, i64(1)])[0], want, "reference")
    layer = base.single_node_layer(op, [x, i64(1)], {"_opset": 20}, const=[False, True])
    assert_close(base.run_layer(base.choose_kernel(layer), layer, [x, i64(1)])[0], want, "kernel")
    # non-empty bool rows still reduce normally
    xb = np.array([[True, False], [False, False]])
    layer = base.single_node_layer(op, [xb, i64(1)], {"_opset": 20}, const=[False, True])
    got = base.run_layer(base.choose_kernel(layer), layer, [xb, i64(1)])[0]
    assert_close(got, np.array([[True], [False]]) if op == "ReduceMax" else np.array([[False], [False]]), "kernel")


@pytest.mark.parametrize("act,want", [
    (("Clip", (-np.inf, np.inf)), [-128, -3, 0, 5, 127]),
    (("Clip", (-4.0, np.inf)), [-4, -3, 0, 5, 127]),
    (("Clip", (-np.inf, 4.0)), [-128, -3, 0, 4, 4]),
    (("Clip", (-1000.0, 1000.0)), [-128, -3, 0, 5, 127]),  # bounds beyond int8's range clamp, not wrap
])
def test_apply_act_clip_int8(act: tuple, want: list[int]) -> None:
    x = np.array([-128, -3, 0, 5, 127], np.int8)
    out = apply_act(x, act)
    assert out is x and out.dtype == np.int8
    np.testing.assert_array_equal(out, np.array(want, np.int8))


def test_castlike_lowbit_target_rejected_like_cast() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = f32(2, 3)
    for dt in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.int4):
        like = np.zeros(1, dt)
        with pytest.raises(UnsupportedOpError, match="CastLike"):
            base.single_node_layer("CastLike", [x, like], {"_opset": 15}, const=[False, True])
        with pytest.raises(UnsupportedOpError, match="CastLike"):
            base.op_spec("CastLike").reference(Node("n0", "CastLike", ["x0", "x1"], ["y0"], {}), [x, like])


def test_dropout_mask_written_by_executor() -> None:
    # the step was skipped as an alias op, leaving the mask to whatever the arena held
    from onnx import TensorProto, helper

    from inferd.frontend import import_model
    from inferd.runtime.cpu import CpuExecutor

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Dropout", ["r"], ["y", "mask"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4]),
                           helper.make_tensor_value_info("mask", TensorProto.BOOL, [3, 4])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    ex = CpuExecutor(import_model(model))
    x = f32(3, 4)
    ex.arena.fill(0)  # a stale arena: all False
    res = ex.run({"x": x})
    np.testing.assert_array_equal(res["mask"], np.ones((3, 4), np.bool_))
    np.testing.assert_array_equal(res["y"], np.maximum(x, 0))
    # a Dropout without a mask output stays a pure view (no copy step)
    nodes[1] = helper.make_node("Dropout", ["r"], ["y"])
    g = helper.make_graph(nodes, "g", [g.input[0]], [g.output[0]])
    ex = CpuExecutor(import_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])))
    assert [s.alias for s in ex.steps] == [False, True]
    np.testing.assert_array_equal(ex.run({"x": x})["y"], np.maximum(x, 0))


def test_checks_reject_unsupported() -> None:
    with pytest.raises(UnsupportedOpError, match="17"):
        base.op_spec("Cast").check(Node("c", "Cast", ["x"], ["y"], {"to": 17}), 13)  # float8e4m3fn
    with pytest.raises(UnsupportedOpError, match="mode"):
        base.op_spec("Pad").check(Node("p", "Pad", ["x"], ["y"], {"mode": "mirror"}), 13)
    with pytest.raises(UnsupportedOpError):
        base.op_spec("Constant").check(Node("k", "Constant", [], ["y"], {"value_string": "a"}), 13)


def test_dtype_mapping_matches_onnx() -> None:
    for code in (1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13):
        dt = onnx_dtype(code)
        assert dt == onnx.helper.tensor_dtype_to_np_dtype(code)
        assert numpy_to_onnx(dt) == code
    assert numpy_to_onnx(np.float32) == onnx.TensorProto.FLOAT
    with pytest.raises(UnsupportedOpError):
        numpy_to_onnx(np.dtype("datetime64[s]"))


def test_alias_flags() -> None:
    for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"):
        assert base.op_spec(op).alias, op
    for op in ("Transpose", "Slice", "Concat", "Add", "Softmax"):
        assert not base.op_spec(op).alias, op


def test_kernel_writes_into_strided_output_view() -> None:
    # the arena hands out views; make sure the kernels fill them rather than rebinding
    x = f32(2, 3, 4)
    for op, attrs in [("Softmax", {"_opset": 11}), ("Transpose", {"perm": [0, 2, 1]}), ("ReduceMean", {"axes": [1]})]:
        layer = base.single_node_layer(op, [x], attrs)
        arena = np.zeros(layer.outputs[0].size + 7, np.float32)
        out = arena[7:].reshape(layer.outputs[0].shape)
        base.choose_kernel(layer).run(layer, [x], {}, [out])
        node = Node("n0", op, ["x0"], ["y0"], attrs)
        assert_close(out, base.op_spec(op).reference(node, [x])[0], op)


def test_bfloat16_casts_and_arithmetic_match_the_onnx_reference() -> None:
    """Cast and CastLike to bfloat16 round to nearest even (ties included) and the arithmetic between them rounds
    every step in bfloat16, as ONNX's reference does: a bfloat16 Add of 256 and 1 stays 256."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    from inferd.frontend import import_model
    from inferd.runtime.cpu import CpuExecutor

    nodes = [helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
             helper.make_node("CastLike", ["one", "xb"], ["ob"]),
             helper.make_node("Add", ["xb", "ob"], ["s"]),
             helper.make_node("Mul", ["s", "s"], ["p"]),
             helper.make_node("Cast", ["p"], ["y"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["xb"], ["xr"], to=TensorProto.FLOAT)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6]),
                           helper.make_tensor_value_info("xr", TensorProto.FLOAT, [6])],
                          [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    # 1 + 2^-8 and 1 + 3 * 2^-8 are ties between bfloat16 neighbours (even: down, then up); 256 + 1 rounds to 256
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 256.0, -3.14159, 1e-3, 65504.0], np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = CpuExecutor(import_model(model)).run({"x": x})
    np.testing.assert_array_equal(got["xr"], want[1])
    np.testing.assert_array_equal(got["y"], want[0])
    assert got["xr"][0] == 1.0 and got["xr"][1] == 1 + 2 ** -6 and got["y"][2] == 256.0 ** 2
