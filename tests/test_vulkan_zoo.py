"""Every zoo model on the Vulkan backend matches onnxruntime (max |vk - ort| / max |ort| <= 1e-3, fp32
storage), with the validation layers on and no validation error; plus one model with the conv kernel
family forced to the shared-memory implicit GEMM (the GPU default, not lavapipe's)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import inferd.ops  # noqa: F401
import inferd.vulkan
from inferd.zoo import ZOO
from vkutil import validated_device
from zoo_fixture import zoo_dir

pytestmark = [pytest.mark.vulkan, pytest.mark.slow,
              pytest.mark.skipif(not inferd.vulkan.available(), reason="no Vulkan device")]

TOL = 1e-3


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory):
    yield from validated_device(tmp_path_factory.mktemp("vkzoo"))


def _ort(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _check(name: str, device: Any, kernels: dict[str, str] | None = None) -> dict[str, str]:
    from inferd.frontend import import_model
    from inferd.vulkan.model import VulkanModel
    from inferd.vulkan.testing import rel_err
    path = zoo_dir([name]) / f"{name}.onnx"
    g = import_model(path)
    rng = np.random.default_rng(123)
    feeds = {t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in g.inputs}
    if name == "vad_lstm":
        feeds["sr"] = np.array(16000, np.int64)
    ref = _ort(path, feeds)
    with VulkanModel(g, device, kernels=kernels) as m:
        got = m.run(feeds)
        used = m.kernel_names
    for t, r in zip(g.outputs, ref):
        err = rel_err(got[t.name], r)
        assert err <= TOL, f"{name}: output {t.name} relative error {err:.3g} > {TOL}"
    return used


@pytest.mark.parametrize("name", ZOO)
def test_zoo_model_matches_onnxruntime(device: Any, name: str) -> None:
    _check(name, device)


def test_gpu_conv_kernels_on_a_zoo_model(device: Any) -> None:
    """The shared-memory tiles (the default on GPUs) through a whole network."""
    used = _check("squeezenet1_1", device, kernels={"Conv": "vk_gemm", "Gemm": "vk_matmul", "MatMul": "vk_matmul"})
    assert "vk_gemm" in used.values()
