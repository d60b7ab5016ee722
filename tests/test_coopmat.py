"""Convolutions on the GPU's matrix units (conv_gemm_coop.comp, VK_NV_cooperative_matrix) for layers whose
precision plan allows fp16 arithmetic: the shader choice (pure, any machine) and, on a device that has the
feature (an NVIDIA GPU; lavapipe has none), outputs against the fp32 model over the shapes that exercise the
tile edges, split-K, groups, the residual epilogue and both weight storage modes."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import inferd.vulkan
from inferd.ops.base import Layer
from inferd.ops.conv_vulkan import VkConv1x1, VkConvGemm
from inferd.vulkan.kernel import HFP_ATTR, Caps

COOP = Caps(coopmat=True)


def _graph(cin: int, cout: int, hw: int, k: int, stride: int = 1, group: int = 1, residual: bool = False,
           seed: int = 0):
    from inferd.frontend import import_model
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin // group * k * k)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32) * 0.1
    oh = (hw + 2 * (k // 2) - k) // stride + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[k // 2] * 4, strides=[stride] * 2,
                              group=group)]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, hw, hw])]
    last = "c"
    if residual:
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"], name="add"))
        ins.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, cout, oh, oh]))
        last = "s"
    nodes.append(helper.make_node("Relu", [last], ["y"], name="relu"))
    graph = helper.make_graph(nodes, "conv", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                   [1, cout, oh, oh])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _conv_layer(g, harith: bool) -> Layer:
    node = next(n for n in g.nodes if n.op == "Conv")
    if harith:
        node.attrs[HFP_ATTR] = 1
    return Layer.of(node, g)


# ------------------------------------------------------------------------------------------ shader choice

@pytest.mark.parametrize("k,hw,cin,cout", [(1, 14, 64, 96), (3, 7, 512, 512)])
def test_coop_shader_only_for_fp16_arithmetic_on_a_coopmat_device(k: int, hw: int, cin: int, cout: int) -> None:
    g = _graph(cin, cout, hw, k)
    kern = VkConv1x1() if k == 1 else VkConvGemm()
    plain = _conv_layer(g, harith=False)
    params = kern.transform(plain, {"in1": np.zeros((cout, cin, k, k), np.float32), "in2": np.zeros(cout, np.float32)})
    shaders = [d.shader for d in kern.dispatches(plain, params, COOP)]
    assert "conv_gemm_coop" not in shaders                       # fp32 arithmetic: never the matrix units
    half = _conv_layer(_graph(cin, cout, hw, k), harith=True)
    got = kern.dispatches(half, params, COOP)
    assert got[0].shader == "conv_gemm_coop" and "HARITH" not in got[0].defines
    if k == 3:  # 7x7 maps with 512 channels: split-K, the reduction keeps its own shader
        assert got[0].defines.get("SPLITK") == 1 and got[1].shader == "splitk_reduce"
    assert kern.dispatches(half, params, Caps())[0].shader == "conv_gemm"          # no feature: HARITH tiles
    assert kern.dispatches(half, params, Caps(coopmat=True, subgroup_size=64))[0].shader == "conv_gemm"

    assert "HARITH" in kern.dispatches(half, params, Caps())[0].defines
    # a device with matrix units but the wrong subgroup width: fp32 arithmetic, not the packed fp16 tile sums
    assert "HARITH" not in kern.dispatches(half, params, Caps(coopmat=True, subgroup_size=64))[0].defines


def test_winograd_gemm_takes_fp16_tile_sums_only_on_a_device_without_matrix_units() -> None:
    # the Winograd GEMM (matmul.comp) has no matrix-unit variant; its packed fp16 tile sums ran slower than fp32 on
    # an H100 and an H200 (vgg16: 0.63 -> 0.77 ms), so a device with matrix units runs it in fp32
    from inferd.ops.conv_vulkan import VkWinograd43

    kern = VkWinograd43()
    g = _graph(256, 256, 28, 3)
    params = kern.transform(_conv_layer(g, harith=False), {"in1": np.zeros((256, 256, 3, 3), np.float32),
                                                           "in2": np.zeros(256, np.float32)})
    half = _conv_layer(_graph(256, 256, 28, 3), harith=True)

    def mm(caps: Caps) -> dict:
        return next(d for d in kern.dispatches(half, params, caps) if d.shader == "matmul").defines

    assert mm(Caps()).get("HARITH") == 1
    assert "HARITH" not in mm(COOP)
    assert "HARITH" not in next(d for d in kern.dispatches(_conv_layer(g, harith=False), params, Caps())
                                if d.shader == "matmul").defines


# ------------------------------------------------------------------------------------------ on the device

def _has_coopmat() -> bool:
    if not inferd.vulkan.available():
        return False
    from inferd.vulkan.device import get_device
    return bool(get_device().features.get("cooperativeMatrixNV"))


coop_device = pytest.mark.skipif(not _has_coopmat(), reason="no Vulkan device with cooperative matrices")


@coop_device
@pytest.mark.vulkan
@pytest.mark.parametrize("cin,cout,hw,k,stride,group,residual", [
    (64, 96, 14, 1, 1, 1, False),      # pointwise (IS1X1), M and N not multiples of the 64 tile
    (37, 70, 9, 3, 1, 1, True),        # odd K (37 * 9), residual epilogue
    (32, 48, 15, 3, 2, 1, False),      # stride 2 with pads
    (512, 512, 7, 3, 1, 1, False),     # split-K
    (64, 64, 12, 3, 1, 4, False),      # groups
    (3, 64, 33, 7, 2, 1, False),       # stem-like: K = 147
])
def test_coop_conv_matches_fp32(cin: int, cout: int, hw: int, k: int, stride: int, group: int, residual: bool) -> None:
    from inferd.vulkan.model import VulkanModel
    g = _graph(cin, cout, hw, k, stride, group, residual)
    rng = np.random.default_rng(3)
    feeds = {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in g.inputs}
    kern = {"conv": "vk_conv1x1" if k == 1 and stride == 1 else "vk_gemm"}
    with VulkanModel(g, kernels=kern) as m:
        ref = m.run(feeds)["y"]
    with VulkanModel(g, kernels=kern, precision="fp16", fp16_arithmetic=True, profile=True) as m:
        got = m.run(feeds)["y"]
        m.run(feeds)
        assert any(p["shader"] == "conv_gemm_coop" for p in m.last_profile())
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    assert 0 < err <= 1e-2, err
