"""The pre-bound calls of the small numpy kernels (``Kernel.bind``: data movement as fixed views, ufuncs,
reductions, Relu) against the same kernel's ``run`` and onnxruntime, and the run-to-run contract they rely on:
a bound call reads its input buffers when called, not when bound; what cannot be bound (a parameter computed at
run time, a result that is not a view) is left to ``run``."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from inferd.ops.base import Layer, choose_kernel, raw_key, single_node_layer
from ortutil import make_single_node_model, run_ort

rng = np.random.default_rng(13)


def _f(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


#: (op, inputs, attrs, which inputs are constants, bound expected)
CASES: list[tuple[str, list[Any], dict[str, Any], list[bool], bool]] = [
    ("Slice", [_f(1, 6, 5), _i64(3), _i64(6), _i64(1)], {}, [False, True, True, True], True),
    ("Slice", [_f(4, 6), _i64(-1, 5), _i64(0, 0), _i64(0, 1), _i64(-1, -2)], {}, [False, True, True, True, True], True),
    ("Transpose", [_f(2, 3, 4)], {"perm": [2, 0, 1]}, [False], True),
    ("Gather", [_f(2, 1, 8), np.array(1, np.int64)], {"axis": 0}, [False, True], True),
    ("Gather", [_f(5, 3), _i64(1, 2, 3)], {"axis": 0}, [False, True], True),
    ("Gather", [_f(5, 3), _i64(-1, 0, 4, 0)], {"axis": 0}, [False, True], True),  # no run of indices: np.take
    ("Gather", [_f(3, 6), _i64(4, 2, 0)], {"axis": 1}, [False, True], True),  # a negative step: np.take
    ("Concat", [_f(1, 2, 4), _f(1, 3, 4), _f(1, 1, 4)], {"axis": 1}, [False, True, False], True),
    ("Split", [_f(6, 4), _i64(2, 4)], {"axis": 0}, [False, True], True),
    ("Expand", [_f(3, 1), _i64(2, 3, 4)], {}, [False, True], True),
    ("Cast", [np.array([[0, 3], [-2, 7]], np.int64)], {"to": 1}, [False], True),
    ("Cast", [_f(2, 3)], {"to": 7}, [False], False),  # float to int: run() silences the casting warnings
    ("Gather", [_f(5, 3), _i64(1, 2)], {"axis": 0}, [False, False], False),  # indices at run time: checked per run
    ("Add", [_f(2, 3, 4), _f(3, 1)], {}, [False, True], True),
    ("Mul", [_f(2, 3), _f(2, 3)], {}, [False, False], True),
    ("Sub", [_f(2, 3), _f(2, 3)], {"act": ("Relu", ())}, [False, False], True),
    ("Greater", [_f(3, 4), np.array(0.1, np.float32)], {}, [False, True], True),
    ("Max", [_f(3, 4), _f(3, 4)], {}, [False, False], True),
    ("Sqrt", [np.abs(_f(3, 5))], {}, [False], True),
    ("Log", [_f(3, 5)], {}, [False], True),  # negatives: NaN, and no warning (the error state run() sets)
    ("Div", [_f(2, 3), _f(2, 3)], {}, [False, False], True),  # float: np.divide under run()'s error state
    ("Div", [_f(2, 3), np.zeros((2, 3), np.float32)], {}, [False, False], True),  # +-inf and NaN, no warning
    ("Div", [np.array([[7, -7]], np.int64), np.array([[2, 2]], np.int64)], {}, [False, True], False),  # truncates
    # F.normalize's clip of a norm at eps; both bounds; a bound computed at run time is left to run()
    ("Clip", [np.abs(_f(1, 4, 42, 1)), np.array(1e-12, np.float32)], {}, [False, True], True),
    ("Clip", [_f(3, 4), np.array(-0.5, np.float32), np.array(0.7, np.float32)], {}, [False, True, True], True),
    ("Clip", [_f(3, 4), np.array(-0.5, np.float32)], {}, [False, False], False),
    ("Clip", [_f(3, 4)], {"min": 1e-12, "_opset": 6}, [False], True),  # bounds as attributes (opset < 11)
    ("Clip", [np.array([[np.nan, -0.0, 0.0, -1.0, 2.0]], np.float32)], {"max": 0.5, "_opset": 6}, [False], True),
    ("Clip", [_f(3, 4)], {"min": -0.2, "max": 0.5, "_opset": 6}, [False], True),
    ("ReduceMean", [_f(1, 7, 3), _i64(1, 2)], {"keepdims": 0}, [False, True], True),
    ("ReduceMean", [_f(256, 37), _i64(1)], {}, [False, True], True),  # many rows, a count of 37: np.mean's bits
    ("ReduceSum", [_f(2, 3, 4), _i64(-1)], {}, [False, True], True),
    ("ReduceMax", [_f(2, 3, 4)], {"axes": [0, 2], "keepdims": 1, "_opset": 13}, [False], True),
    ("MatMul", [_f(3, 5, 4), _f(3, 4, 6)], {}, [False, False], True),  # attention-shaped: both operands at run time
    ("MatMul", [_f(1, 3, 17, 8), _f(1, 3, 8, 19)], {}, [False, False], True),
    ("MatMul", [_f(2, 5, 4), _f(2, 4, 6)], {"act": ("Relu", ())}, [False, False], False),  # a fused activation: run()
    # NF-Nets' gain then SiLU on a small map, a standalone Sigmoid: the C pass bound and run alike (same bits)
    ("Mul", [_f(1, 736, 2, 2), np.array(1.7, np.float32)], {"act": ("SiLU", ())}, [False, True], True),
    ("Sigmoid", [_f(3, 5)], {}, [False], True),
    ("Relu", [_f(4, 5)], {}, [False], True),
    ("Tanh", [_f(4, 5)], {}, [False], True),
]


def _layer(op: str, ins: list[Any], attrs: dict[str, Any], const: list[bool]) -> tuple[Layer, Any, dict, list]:
    n_out = 2 if op == "Split" else 1
    layer = single_node_layer(op, ins, {"_opset": 18, **attrs}, const=const, n_outputs=n_out)
    k = choose_kernel(layer, "cpu")
    params = k.transform(layer, {raw_key(i): np.asarray(ins[i]) for i in layer.const_inputs})
    dyn = [None if i in layer.const_inputs else np.array(x, copy=True) for i, x in enumerate(ins)]
    return layer, k, params, dyn


@pytest.mark.parametrize("case", range(len(CASES)))
def test_bound_call_equals_run_and_onnxruntime(case: int) -> None:
    op, ins, attrs, const, bound_expected = CASES[case]
    layer, k, params, dyn = _layer(op, ins, attrs, const)
    outs = [np.full(o.shape, 7, o.dtype) for o in layer.outputs]
    call = k.bind(layer, dyn, params, outs)
    assert (call is not None) == bound_expected, (op, k.name)
    ref = [np.empty(o.shape, o.dtype) for o in layer.outputs]
    k.run(layer, dyn, params, ref)
    if call is None:
        return
    with np.errstate(all="raise"):  # a bound call keeps run()'s error state: no floating-point error escapes
        call()
    for got, want in zip(outs, ref):
        np.testing.assert_array_equal(got, want)
    if "act" not in attrs and not attrs.get("_opset"):
        ort_attrs = {a: v for a, v in attrs.items() if not a.startswith("_")}
        model = make_single_node_model(op, ins, ort_attrs, opset=18, const_mask=const, n_outputs=len(outs))
        want = run_ort(model, {f"x{i}": x for i, x in enumerate(ins) if x is not None and not const[i]})
        for got, w in zip(outs, want):
            np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("op", ["Slice", "Gather", "Concat", "Add", "ReduceMean", "Relu", "MatMul"])
def test_bound_call_reads_its_inputs_when_called(op: str) -> None:
    """The buffers of a CPU arena never move but their values change every run: a call bound once gives each
    run's result for that run's values."""
    case = next(c for c in CASES if c[0] == op)
    _, ins, attrs, const, _ = case
    layer, k, params, dyn = _layer(op, ins, attrs, const)
    outs = [np.empty(o.shape, o.dtype) for o in layer.outputs]
    call = k.bind(layer, dyn, params, outs)
    assert call is not None
    for _ in range(3):
        for x in dyn:
            if x is not None:
                x[...] = rng.standard_normal(x.shape).astype(x.dtype)
        call()
        ref = [np.empty(o.shape, o.dtype) for o in layer.outputs]
        k.run(layer, dyn, params, ref)
        for got, want in zip(outs, ref):
            np.testing.assert_array_equal(got, want)
