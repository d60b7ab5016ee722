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

import numpy as np
import onnx
import pytest
from onnx.backend.test.runner import Runner

with warnings.catch_warnings():
    # generating the node test cases runs numpy reference code that divides by zero on purpose
    warnings.simplefilter("ignore")
    import onnx.backend.test
    from onnx.backend.test.loader import load_model_tests

    _NODE_CASES = load_model_tests(kind="node")

from onnx_backend import InferdBackend

import inferd.ops
from inferd.ops.base import kernels_for

SUPPORTED_OPS: frozenset[str] = frozenset({
    # issue 2, item 3
    "Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization", "InstanceNormalization", "LayerNormalization",
    "Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Gelu", "Softplus",
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Min", "Max",
    "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
    "Concat", "Split", "Slice", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Gather", "Expand",
    "Shape", "Size", "Cast", "Constant", "ConstantOfShape", "Identity", "Dropout", "Softmax", "LogSoftmax",
    "ReduceMean", "ReduceSum", "ReduceMax", "Resize", "Upsample", "Pad",
    # registered beyond the list (shape-computation and comparison ops models carry along)
    "ArgMax", "ArgMin", "CastLike", "Ceil", "Floor", "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual",
    "Mean", "Sum", "Range", "Tile", "Where",
    "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
    # issue 13: recurrent ops, control flow and the plumbing exporters emit around them
    "LSTM", "GRU", "RNN", "If", "Loop", "Scan", "Not", "And", "Or", "Xor", "CumSum",
    # issue 18: operator coverage
    "Round", "Sign", "IsNaN", "IsInf", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh",
    "Atanh", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "Mod",
    "Elu", "Selu", "Celu", "Mish", "Softsign", "ThresholdedRelu", "Shrink",
    "GatherElements", "GatherND", "ScatterElements", "ScatterND", "OneHot", "ReverseSequence", "TopK",
    "DepthToSpace", "SpaceToDepth", "Trilu", "EyeLike",
    "LpNormalization", "LRN", "MeanVarianceNormalization", "GroupNormalization", "Hardmax", "Einsum",
    # issue 18: data-dependent shapes and detection post-processing
    "NonZero", "Compress", "Unique", "NonMaxSuppression", "RoiAlign", "MaxRoiPool",
    "DFT", "STFT", "HannWindow", "HammingWindow", "BlackmanWindow", "MelWeightMatrix",
    "GridSample", "AffineGrid", "DeformConv", "Col2Im", "CenterCropPad",
    "LpPool", "GlobalLpPool", "MaxUnpool", "Det", "RandomNormal", "RandomNormalLike", "RandomUniform",
    "RandomUniformLike", "Bernoulli", "Multinomial", "Attention", "RMSNormalization", "RotaryEmbedding",
    "Scatter",
    # issue 18: the operators new in opsets 24..28 (the importer reads up to 28)
    "Swish", "TensorScatter", "BitCast", "CumProd", "CausalConvWithState", "LinearAttention", "SwiGLU",
    # issue 18: optionals of tensors, known present or empty at import (inferd.ops.control.lower_optionals)
    "Optional", "OptionalHasElement", "OptionalGetElement",
})

# --- exclusions: {regex searched in the test name: reason}, grouped by reason -------------------------
R_LOWBIT = ("Cast to float8/float4/int4: element types the engine rejects by design (UnsupportedOpError; "
            "bfloat16 is an engine type through ml_dtypes); casts *from* them work through ml_dtypes and run")
R_INT2 = ("Cast to INT2/UINT2/FLOAT8E8M0 (opset 24/25 types): element types the engine rejects by design "
          "(UnsupportedOpError naming the node and type), as R_LOWBIT; casts *from* them run")
R_TRAIN_DROPOUT = "training-mode Dropout (random mask): inference only, by design"
R_NOT_TENSOR = "optional/sequence-typed graph inputs: only tensors are supported"
R_SEQUENCE = ("sequence values (an optional of a sequence, or a sequence where an optional goes): inferd's graphs "
              "carry tensors only; the sequence operators belong to the recurrent-models issue")
R_ABSENT_FEED = ("feeds an empty optional as a graph input: inferd's clients feed tensors only, so an optional graph "
                 "input is taken as present (tests/test_optional_ops.py checks the refusals where absence matters)")
R_STRING = "string tensors: not supported (numeric engine)"
R_ORT_DIFFERS = ("ONNX reference and onnxruntime disagree (align_corners with a non-integer output length from "
                 "scales: the reference uses scale*length, onnxruntime the floored length); inferd matches "
                 "onnxruntime ([1, 4]), which is the project's numerical reference")
R_F16_ROUNDING = ("float16 model through Conv+SiLU: inferd computes in float32 and rounds once, the reference rounds "
                  "every float16 step; differences reach 1.6e-3 relative, above the test's rtol 1e-3")

R_OPSET1 = "opset 1 models (Not's node tests): below the importer's supported range (7..28), by design"
R_SCAN8 = "Scan at opset 8 (batch axis and sequence_lens inputs, replaced in opset 9): not supported by design"

R_RANDOM = ("Bernoulli draws: the expected values are one generator's samples (onnxruntime's / numpy's legacy "
            "RandomState); inferd draws valid samples from its own (tests/test_ops_misc.py checks the distribution)")

EXCLUDE: dict[str, str] = {
    r"^test_bernoulli\w*_cpu$": R_RANDOM,
    r"^test_not_\dd_cpu$": R_OPSET1,
    r"^test_scan_sum_cpu$": R_SCAN8,
    # types
    r"^test_cast_(no_saturate_)?FLOAT(16)?_to_(FLOAT8|FLOAT4E2M1|U?INT4)": R_LOWBIT,
    r"^test_castlike_(no_saturate_)?FLOAT(16)?_to_(FLOAT8\w*|FLOAT4E2M1|U?INT4)(_expanded)?_cpu$": R_LOWBIT,
    r"^test_cast(like)?_FLOAT(16)?_to_U?INT2_": R_INT2,
    r"^test_cast_e8m0_FLOAT(16)?_to_FLOAT8E8M0_": R_INT2,
    r"^test_equal_string": R_STRING,
    r"^test_identity_(opt|sequence)_": R_NOT_TENSOR,
    r"^test_optional_get_element_(optional_)?sequence_cpu$": R_SEQUENCE,
    r"^test_optional_has_element_empty_optional_input_cpu$": R_ABSENT_FEED,
    # training-only behaviour
    r"^test_training_dropout": R_TRAIN_DROPOUT,
    # Resize variants outside the supported set
    r"^test_resize_downsample_scales_(linear|cubic)_align_corners_": R_ORT_DIFFERS,
    r"^test_causal_conv_with_state_silu_fp16_expanded_": R_F16_ROUNDING,
}

#: supported ops with no running official node test, and why that is acceptable
_RANDOM_GAP = ("a random generator: ONNX has no node test whose values another engine can reproduce; "
               "tests/test_ops_misc.py checks its distribution")
NO_RUNNING_NODE_TEST: dict[str, str] = {
    "Not": "its only node tests are opset-1 models (R_OPSET1); tests/test_control_flow.py runs it against onnxruntime",
    "GlobalLpPool": "ONNX ships no GlobalLpPool node test; tests/test_ops_misc.py runs it against onnxruntime",
    "MaxRoiPool": "ONNX ships no MaxRoiPool node test; tests/test_datadep.py runs it against onnxruntime",
    "Optional": "its only node test (test_if_opt) wraps a sequence (R_SEQUENCE); tests/test_optional_ops.py runs it "
                "against onnxruntime",
    "Bernoulli": _RANDOM_GAP, "Multinomial": _RANDOM_GAP, "RandomNormal": _RANDOM_GAP, "RandomNormalLike": _RANDOM_GAP,
    "RandomUniform": _RANDOM_GAP, "RandomUniformLike": _RANDOM_GAP,
}

# -----------------------------------------------------------------------------------------------------


def _graph_ops(g: onnx.GraphProto) -> set[str]:
    """Operators of ``g`` and of every body nested in it (If branches, Loop and Scan bodies)."""
    ops = set()
    for n in g.node:
        ops.add(n.op_type)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                ops |= _graph_ops(a.g)
            for sub in a.graphs:
                ops |= _graph_ops(sub)
    return ops


def _ops(case: object) -> set[str]:
    return _graph_ops(case.model.graph)  # type: ignore[attr-defined]


#: node test name (with the "_cpu" suffix the runner adds) -> operators in its graph
SELECTED: dict[str, frozenset[str]] = {
    f"{c.name}_cpu": frozenset(_ops(c)) for c in _NODE_CASES if _ops(c) and _ops(c) <= SUPPORTED_OPS
}


_CASE_BY_NAME = {f"{c.name}_cpu": c for c in _NODE_CASES}


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
    """Each supported op has a running, non-expanded node test of its own: excluding all of an op's
    variants would otherwise pass silently. Known gaps are listed, with their reason, in
    ``NO_RUNNING_NODE_TEST`` (and an entry there must still be a gap)."""
    running: Counter[str] = Counter()
    for name, ops in SELECTED.items():
        if _exclusion(name) is None and "_expanded" not in name:
            running.update(ops)
    idle = {op for op in SUPPORTED_OPS if running[op] == 0}
    assert sorted(idle - set(NO_RUNNING_NODE_TEST)) == [], "supported ops with no running node test"
    assert sorted(set(NO_RUNNING_NODE_TEST) - idle) == [], "NO_RUNNING_NODE_TEST lists ops that do run now"


def test_exclusions_are_live_and_reasoned() -> None:
    """Each exclusion has a reason and matches at least one selected test (no stale entries)."""
    for pattern, reason in EXCLUDE.items():
        assert reason.strip(), f"exclusion {pattern!r} has no reason"
        assert any(re.search(pattern, n) for n in SELECTED), f"exclusion {pattern!r} matches no selected node test"


#: (op, kernel) for every op with a choice of CPU kernels: the node tests are re-run with each one forced
_FORCED = [(op, k.name) for op in sorted(SUPPORTED_OPS & set(inferd.ops.registered_ops()))
           for k in kernels_for(op, "cpu") if len(kernels_for(op, "cpu")) > 1]


def _array(t: np.ndarray | onnx.TensorProto) -> np.ndarray:
    return onnx.numpy_helper.to_array(t) if isinstance(t, onnx.TensorProto) else t


@pytest.mark.parametrize("op,kernel", _FORCED, ids=[f"{o}-{k}" for o, k in _FORCED])
def test_node_tests_with_forced_kernel(op: str, kernel: str) -> None:
    """The default run above exercises only the kernel chosen for weights fed at run time; with the
    weights frozen into initializers (as exported models have them) every kernel of the op must pass
    the same non-excluded node tests wherever it applies."""
    used = 0
    for name, ops in sorted(SELECTED.items()):
        if op not in ops or _exclusion(name) is not None:
            continue
        case = _CASE_BY_NAME[name]
        rep = InferdBackend.prepare(case.model, "CPU", kernels={op: kernel}, freeze_weights=True)
        for inputs, expected in case.data_sets:
            got = rep.run([_array(a) for a in inputs])
            chosen = {k.name for layer, k in rep._exec.choice if layer.op == op}  # type: ignore[union-attr]
            if kernel not in chosen:
                break  # the kernel does not apply to this test's node
            used += 1
            try:
                Runner.assert_similar_outputs([_array(e) for e in expected], got, rtol=case.rtol, atol=case.atol)
            except AssertionError as e:
                raise AssertionError(f"{name} with {op} kernel {kernel!r} forced: {e}") from None
    if used == 0:
        pytest.skip(f"no official {op} node test fits kernel {kernel!r}")


# --- the node tests on lavapipe (issue 18: "for operators with a Vulkan kernel, on lavapipe") --------------------
#: ops whose official node tests also run on a Vulkan device (every non-excluded one whose graph holds the op), each
#: checked against the test's expected outputs and required to run its node on a Vulkan kernel at least once
VULKAN_NODE_TEST_OPS: tuple[str, ...] = (
    "GroupNormalization", "RMSNormalization", "LayerNormalization", "InstanceNormalization", "Mod", "And", "Or", "Xor",
    "Trilu", "DepthToSpace", "SpaceToDepth", "GridSample", "CumSum", "Attention", "Einsum",
    "RotaryEmbedding", "GatherElements",
)  # Not: its only node tests are opset 1 (R_OPSET1); tests/test_vulkan_ops.py checks it against onnxruntime
#: ops of that list none of whose node tests can reach the Vulkan kernel, and why (they still run, CPU-placed)
VULKAN_NODE_TEST_ON_CPU: dict[str, str] = {
    "Trilu": "every Trilu node test feeds int64 data (the Vulkan kernel is for float32; tests/test_vulkan_ops.py "
             "checks it against numpy and onnxruntime)",
}
#: graph input/output element types a Vulkan model takes (others are refused at load: float16, int8/16/32, ...)
_VK_IO = {np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.bool_)}


def _vulkan_io(model: onnx.ModelProto) -> bool:
    """Whether a Vulkan model takes the graph's inputs and outputs (inputs frozen into constants aside)."""
    from onnx_backend import WEIGHT_INPUTS, shape_defining_inputs

    g = model.graph
    frozen = shape_defining_inputs(model) | shape_defining_inputs(model, WEIGHT_INPUTS)
    return all(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type) in _VK_IO
               for vi in [i for i in g.input if i.name not in frozen] + list(g.output))


def _float32_twin(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A float64 node test as float32 (graph inputs, outputs and value infos retyped; None where anything else in
    the graph names float64: initializers, Cast targets, tensor attributes). A Vulkan model takes no float64 tensor,
    and CumSum's and float Mod's node tests are all float64: their float32 twin checks the kernels against the
    test's expected values (cast to float32, at the test's tolerance)."""
    D, F = onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT
    g = model.graph
    if g.initializer or any(a.type in (onnx.AttributeProto.TENSOR, onnx.AttributeProto.INT) and
                            (a.t.data_type == D if a.type == onnx.AttributeProto.TENSOR else a.name == "to" and a.i == D)
                            for n in g.node for a in n.attribute):
        return None
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        if vi.type.tensor_type.elem_type == D:
            vi.type.tensor_type.elem_type = F
    return m if _vulkan_io(m) else None


def _as_f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32) if a.dtype == np.float64 else a


@pytest.fixture(scope="module")
def vk_device():  # type: ignore[no-untyped-def]
    import os
    import tempfile

    import inferd.vulkan
    if not inferd.vulkan.available():
        pytest.skip("no Vulkan device")
    from inferd.vulkan.device import VulkanConfig, VulkanDevice
    from inferd.vulkan.executor import _import_kernels
    _import_kernels()  # the Vulkan host bindings register their kernels on import
    tmp = tempfile.mkdtemp(prefix="inferd-node-vk-")
    os.environ.setdefault("MESA_SHADER_CACHE_DIR", os.path.join(tmp, "mesa"))
    dev = VulkanDevice(VulkanConfig(cache_dir=os.path.join(tmp, "cache")))
    yield dev
    dev.close()


@pytest.mark.vulkan
@pytest.mark.parametrize("op", VULKAN_NODE_TEST_OPS)
def test_node_tests_on_vulkan(vk_device, op: str) -> None:  # type: ignore[no-untyped-def]
    """Every selected, non-excluded node test of ``op`` (its plain variants: an expanded one is a graph of other ops)
    whose graph inputs and outputs a Vulkan model takes (float32, int64, bool; a float64 test as its float32 twin;
    an int16 Mod test is refused at load, by design) on the Vulkan device. A node no Vulkan kernel handles (an int64 Mod, a dynamic k of
    Trilu) runs on the CPU (mixed placement) and must pass all the same; at least one test must run on the op's
    Vulkan kernel unless ``VULKAN_NODE_TEST_ON_CPU`` says why none can."""
    vk_names = {k.name for k in kernels_for(op, "vulkan")}
    assert vk_names, f"{op} has no Vulkan kernel"
    on_gpu, names = 0, []
    for name, ops in sorted(SELECTED.items()):
        if op not in ops or _exclusion(name) is not None or "_expanded" in name:
            continue
        case = _CASE_BY_NAME[name]
        model, conv = case.model, (lambda a: a)
        if not _vulkan_io(model):
            model, conv = _float32_twin(model), _as_f32  # type: ignore[assignment]
            if model is None:
                continue
            name += " (float32 twin)"
        names.append(name)
        rep = InferdBackend.prepare(model, "CPU", vulkan=vk_device, freeze_weights=True)
        try:
            for inputs, expected in case.data_sets:
                got = rep.run([conv(_array(a)) for a in inputs])
                try:
                    Runner.assert_similar_outputs([conv(_array(e)) for e in expected], got, rtol=case.rtol,
                                                  atol=case.atol)
                except AssertionError as e:
                    raise AssertionError(f"{name} on Vulkan ({rep.vulkan_kernels}): {e}") from None
                on_gpu += any(k in vk_names for k in rep.vulkan_kernels.values())
        finally:
            rep.close()
    assert names, f"no node test of {op} selected"
    print(f"{op}: {len(names)} node tests on Vulkan, {on_gpu} data sets on its Vulkan kernel")
    if op in VULKAN_NODE_TEST_ON_CPU:
        assert not on_gpu, f"{op}'s node tests now reach its Vulkan kernel: drop it from VULKAN_NODE_TEST_ON_CPU"
        return
    assert on_gpu, f"none of {op}'s node tests {names} ran on its Vulkan kernels {sorted(vk_names)}"
