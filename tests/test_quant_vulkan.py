"""int8 models on the Vulkan backend (issue 20's plain int32 path): every quantised Vulkan kernel against the numpy
oracle, one node at a time with the kernel forced (so a CPU fallback cannot pass for it), on odd shapes; and zoo
models quantised by onnxruntime running whole on the GPU with the CPU's integers and onnxruntime's outputs.

Tolerance (issue 20): integer outputs equal or one step apart. The kernels sum in int32 and requantise in float32
without fused multiply-adds, so they give the oracle's integers exactly; only QuantizeLinear divides, and a GPU's
division may differ from numpy's in the last bit, so it is held to one step.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import inferd
import inferd.ops  # noqa: F401  (registers ops and CPU kernels)
import inferd.vulkan
from inferd.ops.quant_vulkan import INT8_KERNELS
from vkutil import validated_device

pytestmark = [pytest.mark.vulkan,
              pytest.mark.skipif(not inferd.vulkan.available(), reason="no Vulkan device")]

RNG = np.random.default_rng(20)
I8, U8, I32, F32 = np.int8, np.uint8, np.int32, np.float32


def q8(dt: Any, *shape: int) -> np.ndarray:
    info = np.iinfo(dt)
    return RNG.integers(info.min, info.max + 1, shape).astype(dt)


def s(v: float) -> np.ndarray:
    return np.array(v, F32)


def z(dt: Any, v: int) -> np.ndarray:
    return np.array(v, dt)


def qconv(xt: Any, wt: Any, n: int, c: int, h: int, w: int, k: int, kh: int, kw: int, per_channel: bool = False,
          bias: bool = True, yt: Any = None, **attrs: Any) -> tuple[list, dict]:
    g = attrs.get("group", 1)
    yt = yt or xt
    ws = (np.abs(RNG.standard_normal(k)).astype(F32) * 0.02 + 0.001) if per_channel else s(0.013)
    if per_channel:
        wz = (RNG.integers(-3, 4, k) if wt == I8 else RNG.integers(120, 136, k)).astype(wt)
    else:
        wz = z(wt, 0 if wt == I8 else 128)
    ins = [q8(xt, n, c, h, w), s(0.05), z(xt, 3 if xt == I8 else 131), q8(wt, k, c // g, kh, kw), ws, wz, s(0.9),
           z(yt, -2 if yt == I8 else 125)]
    if bias:
        ins.append(RNG.integers(-2000, 2000, k).astype(I32))
    return ins, attrs


# (id, op, inputs, attrs, kernel, steps): every input after the first is a constant unless the op takes several
# activations (QLinearAdd/Mul's B, QLinearConcat's parts: see CONST)
CASES: list[tuple[str, str, list, dict, str, int]] = []


def case(cid: str, op: str, ins: list, attrs: dict | None = None, kernel: str = "", steps: int = 0) -> None:
    CASES.append((cid, op, ins, attrs or {}, kernel, steps))


case("quantize_tensor_int8", "QuantizeLinear", [RNG.standard_normal((3, 5, 7)).astype(F32) * 4, s(0.031), z(I8, -5)],
     kernel="vk_quant", steps=1)
case("quantize_tensor_uint8_saturates", "QuantizeLinear", [RNG.standard_normal((2, 9)).astype(F32) * 40, s(0.05),
                                                            z(U8, 128)], kernel="vk_quant", steps=1)
case("quantize_axis_int8", "QuantizeLinear", [RNG.standard_normal((2, 3, 5)).astype(F32),
                                              np.array([0.01, 0.02, 0.05], F32), np.array([0, 3, -7], I8)],
     {"axis": 1}, kernel="vk_quant", steps=1)
case("dequantize_tensor_uint8", "DequantizeLinear", [q8(U8, 3, 7, 5), s(0.07), z(U8, 131)], kernel="vk_quant")
case("dequantize_axis_int8", "DequantizeLinear", [q8(I8, 2, 5, 3), np.linspace(0.01, 0.2, 3).astype(F32),
                                                  np.array([1, 0, -4], I8)], {"axis": -1}, kernel="vk_quant")
def conv_cases(k: int) -> list[tuple[str, list, dict]]:
    """QLinearConv geometries with ``k`` output channels per group (the GEMM kernels take 8 or more)."""
    out = [(f"3x3_{tag}", *qconv(xt, wt, 1, 5, 9, 11, k, 3, 3, pads=[1, 1, 1, 1]))
           for xt, wt, tag in ((I8, I8, "s8s8"), (U8, I8, "u8s8"), (U8, U8, "u8u8"), (I8, U8, "s8u8"))]
    out.append(("per_channel_strided_dilated_asym_pads", *qconv(U8, I8, 2, 6, 13, 10, k, 3, 2, per_channel=True,
                                                               strides=[2, 1], dilations=[1, 2], pads=[0, 2, 1, 1])))
    out.append(("grouped_1x1_no_bias", *qconv(U8, I8, 1, 8, 5, 6, 2 * k, 1, 1, group=2, bias=False)))
    out.append(("int8_in_uint8_out", *qconv(I8, I8, 1, 3, 1, 17, k, 1, 4, yt=U8, pads=[0, 1, 0, 2])))
    ins, at = qconv(U8, I8, 1, 4, 6, 6, k, 3, 3, pads=[1, 1, 1, 1])
    out.append(("fused_relu_clamp", ins, {**at, "qclamp": (125, 255)}))
    ins, _ = qconv(I8, I8, 2, 3, 1, 19, k, 1, 5)
    out.append(("1d", [ins[0][:, :, 0]] + ins[1:3] + [ins[3][:, :, 0]] + ins[4:], {"pads": [2, 1]}))
    return out


for tag, ins, at in conv_cases(5):  # few output channels: the direct kernel
    case(f"qconv_{tag}", "QLinearConv", ins, at, "vk_qconv")
for tag, ins, at in conv_cases(10):  # the GEMM kernels, plain and on the packed dot product
    for kern in ("vk_qconv_gemm", "vk_qconv_dot"):
        case(f"{kern[3:]}_{tag}", "QLinearConv", ins, at, kern)
ins, at = qconv(I8, I8, 1, 12, 7, 7, 12, 3, 3, per_channel=True, group=12, pads=[1, 1, 1, 1], strides=[2, 2])
case("qconv_depthwise", "QLinearConv", ins, at, "vk_qconv")
ins, at = qconv(U8, I8, 2, 37, 9, 11, 70, 3, 3, per_channel=True, pads=[1, 1, 1, 1])
for kern in ("vk_qconv_gemm", "vk_qconv_dot"):  # M 70, K 333, P 99: partial tiles, and split-K in two
    case(f"{kern[3:]}_tiles_with_tails", "QLinearConv", ins, at, kern)
ins, at = qconv(U8, U8, 1, 7, 6, 5, 16, 3, 3, per_channel=True, pads=[2, 0, 1, 2])
case("qconv_dot_u8u8_zero_points_in_the_pads", "QLinearConv", ins, at, "vk_qconv_dot")  # pads read as x's zero point
case("qmaxpool_int8", "MaxPool", [q8(I8, 2, 3, 9, 7)],
     {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, "vk_qmaxpool")
case("qmaxpool_uint8_ceil", "MaxPool", [q8(U8, 1, 5, 13, 13)], {"kernel_shape": [3, 3], "strides": [2, 2],
                                                                 "ceil_mode": 1}, "vk_qmaxpool")
case("qgap_int8", "QLinearGlobalAveragePool", [q8(I8, 1, 7, 5, 5), s(0.05), z(I8, 4), s(0.02), z(I8, -3)],
     kernel="vk_qgap")
case("qgap_uint8", "QLinearGlobalAveragePool", [q8(U8, 2, 5, 3, 7), s(0.1), z(U8, 120), s(0.03), z(U8, 128)],
     kernel="vk_qgap")
case("qconcat_identity", "QLinearConcat", [s(0.1), z(I8, 2), q8(I8, 1, 3, 5, 5), s(0.1), z(I8, 2),
                                           q8(I8, 1, 6, 5, 5), s(0.1), z(I8, 2)], {"axis": 1}, "vk_qconcat")
case("qconcat_requantised_three_parts", "QLinearConcat",
     [s(0.08), z(U8, 128), q8(U8, 2, 3, 5), s(0.1), z(U8, 120), q8(U8, 2, 3, 1), s(0.08), z(U8, 128),
      q8(U8, 2, 3, 7), s(0.05), z(U8, 131)], {"axis": 2}, "vk_qconcat")
case("qconcat_four_parts_mixed_types", "QLinearConcat",
     [s(0.1), z(I8, 0)] + sum(([q8(dt, 1, c, 3, 3), s(sc), z(dt, zp)] for dt, c, sc, zp in
                               ((I8, 2, 0.1, 0), (U8, 3, 0.07, 128), (I8, 1, 0.2, -5), (I8, 5, 0.1, 0))), []),
     {"axis": 1}, "vk_qconcat")
case("qadd_broadcast", "QLinearAdd", [q8(I8, 2, 3, 5), s(0.05), z(I8, 1), q8(I8, 3, 1), s(0.11), z(I8, -4), s(0.09),
                                      z(I8, 2)], kernel="vk_qbinary")
case("qadd_uint8_relu", "QLinearAdd", [q8(U8, 1, 4, 3, 3), s(0.05), z(U8, 128), q8(U8, 1, 4, 3, 3), s(0.04),
                                       z(U8, 130), s(0.07), z(U8, 127)], {"qclamp": (127, 255)}, "vk_qbinary")
case("qadd_constant_b", "QLinearAdd", [q8(I8, 1, 5, 6), s(0.05), z(I8, 1), q8(I8, 1, 5, 6), s(0.02), z(I8, -3),
                                       s(0.07), z(I8, 0)], kernel="vk_qbinary")  # a position embedding
case("qconcat_constant_part", "QLinearConcat",  # a class token before the patches
     [s(0.1), z(I8, 2), q8(I8, 1, 1, 6), s(0.1), z(I8, 2), q8(I8, 1, 9, 6), s(0.07), z(I8, -1)], {"axis": 1},
     "vk_qconcat")
case("qmul", "QLinearMul", [q8(U8, 7, 3), s(0.02), z(U8, 128), q8(U8, 1, 3), s(0.03), z(U8, 120), s(0.04),
                            z(U8, 128)], kernel="vk_qbinary")
case("qsigmoid_int8", "QLinearSigmoid", [q8(I8, 2, 3, 7), s(0.08), z(I8, 3), s(1 / 256), z(I8, -128)],
     kernel="vk_qunary")
case("qlookup_uint8_to_int8", "QLinearLookup", [q8(U8, 3, 5, 7), RNG.integers(0, 256, 256).astype(np.uint8), z(I8, 4)],
     kernel="vk_qunary")
case("qleakyrelu_uint8", "QLinearLeakyRelu", [q8(U8, 5, 9), s(0.05), z(U8, 130), s(0.04), z(U8, 120)],
     {"alpha": 0.1}, kernel="vk_qunary")
# data movement of 8-bit tensors (shufflenet's channel shuffle: Transpose and Split), bytes through copy.comp
case("transpose_int8", "Transpose", [q8(I8, 2, 3, 5, 7)], {"perm": [0, 2, 1, 3]}, kernel="vk_transpose")
case("split_uint8_odd_parts", "Split", [q8(U8, 1, 7, 3, 5), np.array([2, 5], np.int64)], {"axis": 1, "_opset": 13},
     kernel="vk_split")
case("slice_int8_negative_step", "Slice", [q8(I8, 3, 11, 6), np.array([9, 1], np.int64), np.array([0, 6], np.int64),
                                           np.array([1, 2], np.int64), np.array([-2, 1], np.int64)],
     {"_opset": 13}, kernel="vk_slice")
case("gather_int8_one_index", "Gather", [q8(I8, 3, 2, 5, 7), np.array(-2, np.int64)], {"axis": 0}, kernel="vk_gather")
case("qmatmul_per_column", "QLinearMatMul",
     [q8(U8, 3, 5, 33), s(0.04), z(U8, 128), q8(I8, 33, 17), np.abs(RNG.standard_normal(17)).astype(F32) * 0.01 + 1e-3,
      np.zeros(17, I8), s(0.5), z(U8, 126)], kernel="vk_qmatmul")
case("qmatmul_bias_int8", "QLinearMatMul",
     [q8(I8, 2, 19), s(0.03), z(I8, 0), q8(I8, 19, 10), s(0.02), z(I8, 0), s(0.3), z(I8, 1),
      RNG.integers(-500, 500, 10).astype(I32)], {"bias": 1}, "vk_qmatmul")

case("qmatmul_more_words_than_workgroups", "QLinearMatMul",  # 67,500 output words: over lavapipe's 65,535 groups
     [q8(U8, 2700, 9), s(0.04), z(U8, 128), q8(I8, 9, 100), s(0.01), z(I8, 0), s(0.2), z(U8, 126)], kernel="vk_qmatmul")

#: cases with more than one output
N_OUT = {"split_uint8_odd_parts": 2}

#: inputs that are activations besides the first
ACTIVATIONS = {"QLinearAdd": (0, 3), "QLinearMul": (0, 3)}


#: cases whose activations differ from their op's usual ones (the rest of the inputs are constants)
CASE_ACTIVATIONS = {"qadd_constant_b": (0,), "qconcat_constant_part": (5,)}


def _const(op: str, ins: list, cid: str = "") -> list[bool]:
    if cid in CASE_ACTIVATIONS:
        return [k not in CASE_ACTIVATIONS[cid] for k in range(len(ins))]
    if op == "QLinearConcat":
        return [k < 2 or (k - 2) % 3 != 0 for k in range(len(ins))]
    act = ACTIVATIONS.get(op, (0,))
    return [k not in act for k in range(len(ins))]


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory):
    yield from validated_device(tmp_path_factory.mktemp("vkq"))


@pytest.mark.parametrize("cid,op,ins,attrs,kernel,steps", CASES, ids=[c[0] for c in CASES])
def test_quantised_kernel_matches_oracle(device: Any, cid: str, op: str, ins: list, attrs: dict, kernel: str,
                                         steps: int) -> None:
    from inferd.vulkan.testing import run_single

    if kernel == "vk_qconv_dot" and not device.features.get("shaderIntegerDotProduct"):
        pytest.skip("the device has no packed integer dot product (VK_KHR_shader_integer_dot_product)")
    got, ref, stats = run_single(device, op, ins, attrs, _const(op, ins, cid), kernel, n_outputs=N_OUT.get(cid, 1))
    assert stats["kernels"] == {"n0": kernel}
    assert len(got) == len(ref) == N_OUT.get(cid, 1)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype, (g.shape, g.dtype, r.shape, r.dtype)
        if r.dtype == F32:
            assert np.array_equal(g, r), f"{cid}: max diff {np.abs(g - r).max()}"
            continue
        d = np.abs(g.astype(np.int64) - r.astype(np.int64))
        assert d.max() <= steps, f"{cid}: {int(d.max())} steps from the oracle at {int((d > 0).sum())} of {d.size}"


def test_float_pooling_kernels_leave_8bit_tensors_alone() -> None:
    """A float MaxPool kernel must not apply to an int8 tensor (it would read bytes as floats): the backend takes
    the first kernel that applies and then only checks its dtypes, which would send the node to the CPU."""
    from inferd.ops.base import applicable_kernels, single_node_layer
    from inferd.vulkan.executor import _import_kernels

    _import_kernels()
    layer = single_node_layer("MaxPool", [q8(I8, 1, 2, 5, 5)], {"kernel_shape": [2, 2]})
    assert [k.name for k in applicable_kernels(layer, "vulkan")] == ["vk_qmaxpool"]
    layer = single_node_layer("MaxPool", [np.zeros((1, 2, 5, 5), F32)], {"kernel_shape": [2, 2]})
    assert "vk_qmaxpool" not in [k.name for k in applicable_kernels(layer, "vulkan")]




def _on_cpu_type_device() -> bool:
    from inferd.vulkan.device import get_device

    return get_device().caps.device_type == "cpu"


@pytest.mark.parametrize("name,scheme,conv", [
    *[(n, s, c) for c in ("vk_qconv_gemm", "vk_qconv_dot")
      for n, s in (("squeezenet1_1", "qdq_s8s8"), ("mobilenetv2", "qdq_u8s8_pc"))],
    *[pytest.param(n, s, c, marks=pytest.mark.slow) for c in ("vk_qconv_gemm", "vk_qconv_dot")
      # QLinearSigmoid (the SiLUs); Transpose and Split of int8 (channel shuffle)
      for n, s in (("resnet18", "qdq_s8s8"), ("efficientnet_b0", "qdq_u8s8_pc"), ("shufflenetv2_x1_0", "qdq_s8s8"))],
    # constant operands of QLinearAdd/Concat, int8 Gather of q/k/v: none of it depends on the conv kernel, and its
    # one conv (the patch embedding) is the only layer either kernel takes; once (30 s on lavapipe), not per kernel
    pytest.param("vit_tiny", "qdq_s8s8", "vk_qconv_gemm", marks=pytest.mark.slow)])
def test_quantised_zoo_model_runs_whole_on_vulkan(name: str, scheme: str, conv: str) -> None:
    """A zoo model quantised by onnxruntime runs with every node on the GPU, gives the CPU kernels' integers
    (which tests/test_quant.py holds to onnxruntime layer by layer) and onnxruntime's output within a step."""
    import onnx
    import onnxruntime as ort
    from zoo_fixture import zoo_path

    from inferd.zoo import quant as zquant

    from inferd.vulkan.device import get_device

    if conv == "vk_qconv_dot" and not get_device().features.get("shaderIntegerDotProduct"):
        pytest.skip("the device has no packed integer dot product")
    path = zquant.quantized(zoo_path(name), scheme)
    feeds = zquant.calibration_feeds(path, n=1, seed=7)[0]
    cpu = inferd.load(str(path), device="cpu")
    # forced: on a CPU-type device (lavapipe) the placement keeps int8 layers on the CPU's faster native kernels;
    # by name, the GEMM conv (plain or dot-product) for every conv it takes (what a GPU's placement picks), the
    # direct one for the rest
    from inferd.frontend import import_model
    from inferd.ops.base import Layer
    from inferd.ops.quant_vulkan import VkQConvGemm

    g = import_model(path)
    gemm = {n.name: conv for n in g.nodes if n.op == "QLinearConv" and VkQConvGemm().applies(Layer.of(n, g))}
    assert gemm
    gpu = inferd.load(str(path), device="vulkan", kernels={**INT8_KERNELS, **gemm})
    try:
        want_cpu = list(cpu.run(feeds).values())[0]
        got = list(gpu.run(feeds).values())[0]
        on_cpu = {n: k for n, k in gpu.kernels.items() if k.startswith(("cpu", "host"))}
        assert not on_cpu, f"nodes placed on the CPU: {on_cpu}"
        assert {gpu.kernels[n] for n in gemm} == {conv}, gpu.kernels
    finally:
        cpu.close()
        gpu.close()
    if name == "vit_tiny" and get_device().device_type != "cpu":
        # its float LayerNorm/Softmax/GELU between int8 layers round per device before the next quantisation: on
        # an H200 the output came out 3.2% of its largest magnitude from the CPU's (742 of 1000 values), and as far
        # from onnxruntime as the CPU's (7.1%); its int8 kernels are held exactly to the oracle op by op above
        assert np.abs(got - want_cpu).max() <= 0.05 * np.abs(want_cpu).max(), f"GPU and CPU: {np.abs(got - want_cpu).max()}"
    else:
        assert np.array_equal(got, want_cpu), f"{name} {scheme}: GPU and CPU differ by {np.abs(got - want_cpu).max()}"
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if "u8s8" in scheme:  # its exact u8 x s8 kernels: without VNNI its default ones saturate int16 pair sums
        # (see test_quant.py's _ort; on vit_tiny's s8s8 graph the option makes onnxruntime 1.32 fail to initialise)
        so.add_session_config_entry("session.x64quantprecision", "1")
    want = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    model = onnx.load(str(path))
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    dq = [n for n in model.graph.node if n.output[0] == model.graph.output[0].name][0]
    step = float(np.asarray(inits[dq.input[1]]).reshape(-1)[0])
    # the exact check is the one above (the CPU is held to onnxruntime layer by layer in test_quant.py); end to end
    # a layer's one-step difference can propagate, so the bound is test_quant.py's for a whole network (4 steps;
    # 3 seen on efficientnet_b0, 2 on mobilenetv2 with onnxruntime 1.30 on an H200 host's CPU). vit_tiny keeps
    # LayerNorm, Softmax and GELU in float between its int8 layers, each engine rounding them its own way before
    # the next quantisation: 10 steps (8% of the output's largest value) apart, so it is held to 10% of that.
    if name == "vit_tiny":
        assert np.abs(got - want).max() <= 0.1 * np.abs(want).max()
    else:
        assert np.abs(got - want).max() / step <= 4.0 + 1e-3


def test_cpu_type_device_keeps_int8_layers_on_the_cpu_kernels() -> None:
    """Unforced, an int8 model on lavapipe runs its int8 layers on the CPU's native kernels (the GPU-emulating
    shaders are ~25x slower on the same cores) and answers as the CPU does; on a GPU they are the default."""
    from zoo_fixture import zoo_path

    from inferd.ops.base import single_node_layer
    from inferd.ops.quant_vulkan import VkQLinearConv
    from inferd.vulkan.kernel import UNUSABLE_PRIORITY, Caps
    from inferd.zoo import quant as zquant

    layer = single_node_layer("QLinearConv", qconv(I8, I8, 1, 4, 5, 5, 4, 3, 3)[0])
    k = VkQLinearConv()
    assert k.device_priority(Caps(device_type="cpu"), layer) == UNUSABLE_PRIORITY
    assert k.device_priority(Caps(device_type="discrete"), layer) < UNUSABLE_PRIORITY
    if not _on_cpu_type_device():
        pytest.skip("the device is a GPU: the int8 kernels are its default")
    path = zquant.quantized(zoo_path("squeezenet1_1"), "qdq_s8s8")
    feeds = zquant.calibration_feeds(path, n=1, seed=7)[0]
    cpu = inferd.load(str(path), device="cpu")
    gpu = inferd.load(str(path), device="vulkan")
    try:
        placed = gpu.kernels
        assert all(placed[n].startswith("cpu:") for n in placed if "Conv" in n), placed
        assert np.array_equal(list(gpu.run(feeds).values())[0], list(cpu.run(feeds).values())[0])
    finally:
        cpu.close()
        gpu.close()


def test_int8_conv_kernel_follows_the_integer_dot_product_caps() -> None:
    """The packed dot-product conv is the default only where the device accelerates it on a trusted driver, after
    the plain GEMM where it only has the instructions, never without them or on a CPU-type device."""
    from inferd.ops.base import single_node_layer
    from inferd.ops.quant_vulkan import VkQConvDot, VkQConvGemm
    from inferd.vulkan.kernel import UNUSABLE_PRIORITY, Caps

    layer = single_node_layer("QLinearConv", qconv(I8, I8, 1, 4, 5, 5, 16, 3, 3)[0])
    dot, gemm = VkQConvDot(), VkQConvGemm()
    assert dot.device_priority(Caps(int_dot=2), layer) < gemm.device_priority(Caps(int_dot=2), layer)
    assert dot.device_priority(Caps(int_dot=1), layer) > gemm.device_priority(Caps(int_dot=1), layer)
    assert dot.device_priority(Caps(int_dot=1), layer) < UNUSABLE_PRIORITY
    assert dot.device_priority(Caps(int_dot=0), layer) == UNUSABLE_PRIORITY
    assert dot.device_priority(Caps(int_dot=2, device_type="cpu"), layer) == UNUSABLE_PRIORITY


def test_int_dot_level_needs_the_feature_itself() -> None:
    """Masking shaderIntegerDotProduct (the device is then created without it) takes the dot-product kernel out
    even where the properties call it accelerated."""
    from inferd.vulkan.kernel import int_dot_level

    assert int_dot_level({"shaderIntegerDotProduct": True, "integerDotProduct4x8Accelerated": True}) == 2
    assert int_dot_level({"shaderIntegerDotProduct": True}) == 1
    assert int_dot_level({"shaderIntegerDotProduct": False, "integerDotProduct4x8Accelerated": True}) == 0


def test_integer_dot_product_masked_and_untrusted_drivers() -> None:
    """$INFERD_VK_MASK_FEATURES hides the integer dot product as it hides the others, and a driver on the list
    of those known to compute it wrong is never reported accelerated."""
    from inferd.vulkan import features as F

    assert {"shaderIntegerDotProduct", "integerDotProduct4x8Accelerated"} <= set(F.FEATURES)

    class _Vk:  # the calls _dot_accelerated makes, answering as an AMD driver that says "accelerated"
        VK_DRIVER_ID_AMD_PROPRIETARY, VK_DRIVER_ID_AMD_OPEN_SOURCE = 1, 2

        class _S:
            def __init__(self, **kw):
                self.__dict__.update(kw)

        def VkPhysicalDeviceShaderIntegerDotProductProperties(self):
            return self._S(integerDotProduct4x8BitPackedSignedAccelerated=1,
                           integerDotProduct4x8BitPackedUnsignedAccelerated=1,
                           integerDotProduct4x8BitPackedMixedSignednessAccelerated=1)

        def VkPhysicalDeviceDriverProperties(self, pNext):
            return self._S(driverID=self.driver, pNext=pNext)

        def VkPhysicalDeviceProperties2(self, pNext):
            return self._S(pNext=pNext)

        def vkGetPhysicalDeviceProperties2(self, physical, p2):
            pass

    vk = _Vk()
    vk.driver = 1
    assert not F._dot_accelerated(vk, None, {"VK_KHR_driver_properties"})
    vk.driver = 4  # NVIDIA's proprietary driver
    assert F._dot_accelerated(vk, None, {"VK_KHR_driver_properties"})
