"""The official ONNX backend node tests (``onnx.backend.test``) against inferd's CPU engine.

Selection. ``SUPPORTED_OPS`` is the explicit list of operators inferd claims (issue 2, item 3, plus
the extra ops the importer registers). A node test (``onnx/backend/test/case/node``, device CPU) is
included when every operator in its graph is in that list: the plain variants of each supported op,
and the ``_expanded`` variants whose function body stays within the list. An op in the list that
the engine does not implement is therefore *run* and fails, never skipped silently;
``test_supported_ops_are_registered`` says so by name as well. Real/simple/pytorch model tests are
not used.

Exclusions. ``EXCLUDE`` maps a regex (searched in the test name) to the reason the variant cannot
pass; entries are grouped by reason. A reason starting with "BUG:" marks a real defect of an op:
those tests run as strict xfail, so fixing the op turns them into failures until the entry goes.
"""
from __future__ import annotations

import re
import unittest
import warnings
from collections import Counter

import onnx
import pytest

with warnings.catch_warnings():
    # generating the node test cases runs numpy reference code that divides by zero on purpose
    warnings.simplefilter("ignore")
    import onnx.backend.test
    from onnx.backend.test.loader import load_model_tests

    _NODE_CASES = load_model_tests(kind="node")

from onnx_backend import InferdBackend

import inferd.ops

SUPPORTED_OPS: frozenset[str] = frozenset({
    # issue 2, item 3
    "Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization", "InstanceNormalization", "LayerNormalization",
    "Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Gelu", "Softplus",
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Min", "Max",
    "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
    "Concat", "Split", "Slice", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Gather", "Expand",
    "Shape", "Cast", "Constant", "ConstantOfShape", "Identity", "Dropout", "Softmax", "LogSoftmax",
    "ReduceMean", "ReduceSum", "ReduceMax", "Resize", "Upsample", "Pad",
    # registered beyond the list (shape-computation and comparison ops models carry along)
    "ArgMax", "ArgMin", "CastLike", "Ceil", "Floor", "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual",
    "Mean", "Sum", "Range", "Tile", "Where",
    "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
})

# --- exclusions: {regex searched in the test name: reason}, grouped by reason -------------------------
R_F16 = "float16/bfloat16 tensors: not supported (float32 engine)"

EXCLUDE: dict[str, str] = {
}

# -----------------------------------------------------------------------------------------------------


def _ops(case: object) -> set[str]:
    return {n.op_type for n in case.model.graph.node}  # type: ignore[attr-defined]


#: node test name (with the "_cpu" suffix the runner adds) -> operators in its graph
SELECTED: dict[str, frozenset[str]] = {
    f"{c.name}_cpu": frozenset(_ops(c)) for c in _NODE_CASES if _ops(c) and _ops(c) <= SUPPORTED_OPS
}


def _exclusion(name: str) -> tuple[str, str] | None:
    for pattern, reason in EXCLUDE.items():
        if re.search(pattern, name):
            return pattern, reason
    return None


backend_test = onnx.backend.test.BackendTest(InferdBackend, __name__)
backend_test.include("^(" + "|".join(re.escape(n) for n in sorted(SELECTED)) + ")$")

_node_case = backend_test.test_cases["OnnxBackendNodeModelTest"]
for _attr in [a for a in vars(_node_case) if a.startswith("test_")]:
    _func = getattr(_node_case, _attr)
    if _attr not in SELECTED:
        delattr(_node_case, _attr)  # skipped by the runner anyway; keep the report to what we run
        continue
    _ex = _exclusion(_attr)
    if _ex is None:
        continue
    if _ex[1].startswith("BUG:"):
        setattr(_node_case, _attr, pytest.mark.xfail(reason=f"{_ex[1]} [{_ex[0]}]", strict=True)(_func))
    else:
        setattr(_node_case, _attr, unittest.skip(f"{_ex[1]} [{_ex[0]}]")(_func))
OnnxBackendNodeModelTest = _node_case
del _attr, _func, _ex, _node_case


def test_selection_is_not_empty() -> None:
    assert len(SELECTED) > 300, f"only {len(SELECTED)} node tests selected"


def test_supported_ops_are_registered() -> None:
    """Every op the include list claims must exist in the engine (otherwise its node tests fail too)."""
    missing = sorted(SUPPORTED_OPS - set(inferd.ops.registered_ops()))
    assert not missing, f"ops claimed as supported but not registered: {missing}"


def test_every_supported_op_runs_somewhere() -> None:
    """No supported op may have all of its node tests excluded (that would be a silent pass)."""
    running: Counter[str] = Counter()
    for name, ops in SELECTED.items():
        if _exclusion(name) is None:
            running.update(ops)
    idle = sorted(op for op in SUPPORTED_OPS if running[op] == 0)
    assert not idle, f"supported ops with no running node test: {idle}"


def test_exclusions_are_live_and_reasoned() -> None:
    """Each exclusion has a reason and matches at least one selected test (no stale entries)."""
    for pattern, reason in EXCLUDE.items():
        assert reason.strip(), f"exclusion {pattern!r} has no reason"
        assert any(re.search(pattern, n) for n in SELECTED), f"exclusion {pattern!r} matches no selected node test"
