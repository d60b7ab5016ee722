"""fp16 weights (issue 20, fp16 half): the precision planner, Vulkan kernels reading fp16 weights (16-bit
storage, packed, texel views) against the fp32 model, the overflow guard and the per-layer fp32 override,
features masked -> the packed fallback with a log line, and packages holding fp16 weights."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import inferd.vulkan
from inferd.planner.precision import (FP16_MAX, LayerFacts, PrecisionPlan, cpu_fp16_wins, cpu_precision,
                                      plan_precision)
from inferd.zoo import ZOO
from zoo_fixture import zoo_dir

TOL = 1e-2
vulkan = pytest.mark.skipif(not inferd.vulkan.available(), reason="no Vulkan device")
S16 = {"storageBuffer16BitAccess": True, "shaderFloat16": True}


# ------------------------------------------------------------------------------------------ planner (pure)

def test_plan_choices_follow_the_device_features() -> None:
    assert plan_precision("fp32", "vulkan", S16).precision == "fp32"
    p = plan_precision("auto", "vulkan", S16, arithmetic=True)
    assert (p.precision, p.storage, p.mode, p.arithmetic) == ("fp16", "fp16", 1, "fp16")
    assert "storageBuffer16BitAccess" in p.reason and "shaderFloat16" in p.reason
    assert plan_precision("auto", "vulkan", {"storageBuffer16BitAccess": True}, arithmetic=True).arithmetic == "fp32"
    assert plan_precision("auto", "vulkan", S16).arithmetic == "fp32"  # fp16 arithmetic only when asked
    p = plan_precision("auto", "vulkan", {"storageBuffer16BitAccess": False})
    assert p.precision == "fp32" and "no storageBuffer16BitAccess" in p.reason
    p = plan_precision("fp16", "vulkan", {})
    assert (p.precision, p.storage, p.mode) == ("fp16", "packed", 2) and "unpackHalf2x16" in p.reason
    assert plan_precision("auto", "cpu", S16).precision == "fp32"
    assert plan_precision("fp16", "cpu", {}).storage == "fp16"
    with pytest.raises(ValueError, match="precision must be one of"):
        plan_precision("int4", "vulkan", S16)


def test_overflow_guard_and_override_keep_layers_fp32() -> None:
    layers = [LayerFacts("a", 100, 3.0), LayerFacts("big", 100, FP16_MAX * 2), LayerFacts("c", 100, 1.0),
              LayerFacts("tiny", 100, 1e-6)]
    p = plan_precision("fp16", "vulkan", S16, layers, fp32_layers=["c"])
    assert [n for n, _ in p.fp32_layers] == ["big", "c", "tiny"]
    assert p.layer_mode("a") == 1 and p.layer_mode("big") == 0 and p.layer_mode("c") == 0
    assert "overflow" in dict(p.fp32_layers)["big"]
    assert plan_precision("fp16", "vulkan", S16, layers, guard=False).layer_mode("big") == 1
    with pytest.raises(ValueError, match="names no layer"):
        plan_precision("fp16", "vulkan", S16, layers, fp32_layers=["nope"])
    assert PrecisionPlan.from_dict(p.to_dict()) == p


def test_cpu_fp16_storage_only_where_the_cost_model_says_it_wins() -> None:
    assert cpu_fp16_wins(1 << 20, disk_bw=200e6, mem_bw=4e9)        # slow disk: half the bytes win
    assert not cpu_fp16_wins(1 << 20, disk_bw=20e9, mem_bw=4e9)     # page-cache speed: widening costs more

    class R:
        disk_bw, mem_bw = 20e9, 4e9
    p = cpu_precision("fp16", [LayerFacts("a", 1 << 20, 1.0)], R())
    assert p.layer_mode("a") == 0 and dict(p.fp32_layers)["a"].startswith("cost")


# ------------------------------------------------------------------------------------------ Vulkan

def _feeds(g, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in g.inputs}


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    from inferd.vulkan.testing import rel_err
    return rel_err(a, b)


def _run_both(g, device=None, kernels=None, **fp16) -> tuple[dict, dict, dict, dict]:
    from inferd.vulkan.model import VulkanModel
    feeds = _feeds(g)
    with VulkanModel(g, device, kernels=kernels) as m:
        ref, mem32 = m.run(feeds), m._b.memory_breakdown
    with VulkanModel(g, device, kernels=kernels, precision="fp16", **fp16) as m:
        got, mem16 = m.run(feeds), m._b.memory_breakdown
        assert m._b.precision.precision == "fp16"
    return ref, got, mem32, mem16


def _skip_texel_on_gpus(kernels: dict) -> None:
    """The *_tex kernels bind texel buffers, which inferd uses on CPU-type devices (lavapipe) only."""
    from inferd.vulkan.device import get_device

    if any(str(v).endswith("_tex") for v in kernels.values()) and not get_device().texel_buffers:
        pytest.skip("texel-buffer kernels run on CPU-type Vulkan devices only")


def _zoo_graph(name: str):
    from inferd.frontend import import_model
    return import_model(zoo_dir([name]) / f"{name}.onnx")


def _check_zoo(name: str, kernels=None, device=None) -> None:
    g = _zoo_graph(name)
    ref, got, m32, m16 = _run_both(g, device, kernels)
    for k in ref:
        err = _rel(got[k], ref[k])
        assert err <= TOL, f"{name} {k}: fp16 vs fp32 relative error {err:.3g}"
        assert err > 0, f"{name} {k}: fp16 gave fp32's answer bit for bit: were the weights fp16?"
    assert m16["weights_bytes"] < 0.75 * m32["weights_bytes"], (m16, m32)


@vulkan
@pytest.mark.vulkan
def test_fp16_squeezenet_lavapipe_kernels() -> None:
    _check_zoo("squeezenet1_1")


@vulkan
@pytest.mark.vulkan
@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in ZOO if n != "squeezenet1_1"])
def test_fp16_zoo_within_1e2_of_fp32(name: str) -> None:
    g = _zoo_graph(name)
    if not any(n.op in ("Conv", "Gemm", "MatMul") for n in g.nodes):
        pytest.skip("no layer with fp16-able weights")
    from inferd.vulkan.model import VulkanModel
    feeds = _feeds(g)
    if name == "vad_lstm":
        feeds["sr"] = np.array(16000, np.int64)
    with VulkanModel(g) as m:
        ref = m.run(feeds)
    with VulkanModel(g, precision="fp16") as m:
        got = m.run(feeds)
    for k in ref:
        err = _rel(got[k], ref[k])
        assert err <= TOL, f"{name} {k}: fp16 vs fp32 relative error {err:.3g}"


@vulkan
@pytest.mark.vulkan
@pytest.mark.parametrize("kernels", [{"Conv": "vk_gemm"}, {"Conv": "vk_gemm_reg"}, {"conv1": "vk_conv1x1"},
                                     {"conv1": "vk_conv1x1_reg"}, {"conv1": "vk_conv1x1_tex"}])
def test_fp16_storage_buffer_kernels(kernels: dict) -> None:
    """The GPU kernels (storage buffers, float16_t loads) forced on lavapipe, on a conv stack."""
    _skip_texel_on_gpus(kernels)
    g = _conv_graph(pointwise=any(v.startswith("vk_conv1x1") for v in kernels.values()))
    ref, got, _, _ = _run_both(g, kernels=kernels)
    err = _rel(got["y"], ref["y"])
    assert 0 < err <= TOL, err


def _conv_graph(pointwise: bool = False, scale: float = 1.0, depthwise: bool = False, compensate: bool = True):
    """x -> Conv(3x3 or 1x1, 8->16) -> Relu -> Conv(16->16 or depthwise) -> Gemm: weights ~N(0,1)/sqrt(fan-in),
    the first conv's multiplied by ``scale`` and (``compensate``) the second's divided by it (the output stays
    O(1))."""
    from inferd.frontend import import_model
    rng = np.random.default_rng(1)
    k = 1 if pointwise else 3
    w1 = rng.standard_normal((16, 8, k, k)).astype(np.float32) / np.sqrt(8 * k * k) * scale
    w2 = (rng.standard_normal((16, 1, 3, 3)) / 3 if depthwise else
          rng.standard_normal((16, 16, 3, 3)) / 12).astype(np.float32) / (scale if compensate else 1.0)
    w3 = rng.standard_normal((10, 16 * 12 * 12)).astype(np.float32) / 48
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[k // 2] * 4),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1] * 4,
                              group=16 if depthwise else 1),
             helper.make_node("Flatten", ["c2"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "w3"], ["y"], name="fc", transB=1)]
    inits = [numpy_helper.from_array(a, n) for n, a in
             (("w1", w1), ("b1", np.full(16, 0.1, np.float32)), ("w2", w2), ("w3", w3))]
    graph = helper.make_graph(nodes, "convstack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return import_model(model)


@vulkan
@pytest.mark.vulkan
@pytest.mark.parametrize("kernels", [{"conv2": "vk_winograd43"}, {"conv2": "vk_winograd23"},
                                     {"conv2": "vk_winograd43_tex"}, {"conv2": "vk_direct", "conv1": "vk_direct"},
                                     {"Gemm": "vk_matmul"}, {"Gemm": "vk_matmul_reg"}, {"Gemm": "vk_gemv_nk"}])
def test_fp16_each_kernel_family(kernels: dict) -> None:
    _skip_texel_on_gpus(kernels)
    g = _conv_graph()
    ref, got, _, _ = _run_both(g, kernels=kernels)
    assert 0 < _rel(got["y"], ref["y"]) <= TOL


@vulkan
@pytest.mark.vulkan
@pytest.mark.parametrize("kernels", [{"Conv": "vk_depthwise"}, {"Conv": "vk_depthwise_tex"}])
def test_fp16_depthwise(kernels: dict) -> None:
    _skip_texel_on_gpus(kernels)
    g = _conv_graph(depthwise=True)
    kernels = {"conv2": kernels["Conv"]}
    ref, got, _, _ = _run_both(g, kernels=kernels)
    assert 0 < _rel(got["y"], ref["y"]) <= TOL


@vulkan
@pytest.mark.vulkan
def test_overflowing_layer_fixed_by_override_and_guard(caplog: pytest.LogCaptureFixture) -> None:
    """conv1's weights reach ~1e5 and conv2's are scaled down to match (~1e-6): in fp16 conv1's become inf
    (and conv2's subnormal) and the answer is garbage; the per-layer override keeps both fp32 and the answer
    is right; the guard finds both by itself and says so in the log."""
    g = _conv_graph(scale=3e5)
    assert float(np.abs(np.asarray(g.constants["w1"])).max()) > FP16_MAX
    ref, bad, _, _ = _run_both(g, precision_guard=False)
    assert not np.isfinite(bad["y"]).all() or _rel(bad["y"], ref["y"]) >= 0.5
    _, fixed, _, _ = _run_both(g, precision_guard=False, fp32_layers=["conv1", "conv2"])
    assert _rel(fixed["y"], ref["y"]) <= TOL
    with caplog.at_level(logging.INFO, logger="inferd.vulkan.cold"):
        _, auto, _, _ = _run_both(g)
    assert _rel(auto["y"], ref["y"]) <= TOL
    msgs = [r.getMessage() for r in caplog.records]
    assert any("conv1 (overflow" in m and "conv2 (underflow" in m for m in msgs), msgs


@vulkan
@pytest.mark.vulkan
def test_fp16_arithmetic_overflow_fixed_by_override() -> None:
    """fp16 arithmetic (the shared-memory GEMM kernels, forced): conv1's outputs reach ~1e5, so conv2's fp16
    tiles hold inf and the answer is garbage, though every weight fits fp16 (the guard sees nothing);
    keeping conv2 fp32 (the per-layer override), or fp32 arithmetic, gives the right answer."""
    g = _conv_graph(scale=3e4, compensate=False)
    kernels = {"Conv": "vk_gemm", "Gemm": "vk_matmul"}
    from inferd.vulkan.model import VulkanModel
    with VulkanModel(g, kernels=kernels, precision="fp16", fp16_arithmetic=True) as m:
        assert m._b.precision.arithmetic == "fp16" and not m._b.precision.fp32_layers
    ref, bad, _, _ = _run_both(g, kernels=kernels, fp16_arithmetic=True)
    assert not np.isfinite(bad["y"]).all() or _rel(bad["y"], ref["y"]) >= 0.5
    _, fixed, _, _ = _run_both(g, kernels=kernels, fp16_arithmetic=True, fp32_layers=["conv2"])
    assert 0 < _rel(fixed["y"], ref["y"]) <= TOL
    _, fixed, _, _ = _run_both(g, kernels=kernels, fp16_arithmetic=False)
    assert 0 < _rel(fixed["y"], ref["y"]) <= TOL


@vulkan
@pytest.mark.vulkan
@pytest.mark.parametrize("kernels", [None, {"Conv": "vk_gemm", "Gemm": "vk_gemv_nk"}])
def test_masked_16bit_storage_falls_back_to_packed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture, kernels: dict | None) -> None:
    """A device without storageBuffer16BitAccess (masked): fp16 asked -> weights packed two per uint, a log
    line saying why, right answers (texel kernels and storage-buffer kernels); auto -> fp32."""
    from inferd.vulkan.device import VulkanConfig, VulkanDevice
    from inferd.vulkan.model import VulkanModel
    monkeypatch.setenv("INFERD_VK_MASK_FEATURES", "storageBuffer16BitAccess")
    dev = VulkanDevice(VulkanConfig(cache_dir=str(tmp_path)))
    try:
        assert dev.features["storageBuffer16BitAccess"] is False
        g = _conv_graph()
        with caplog.at_level(logging.INFO, logger="inferd.vulkan.cold"):
            ref, got, _, _ = _run_both(g, dev, kernels)
        assert 0 < _rel(got["y"], ref["y"]) <= TOL
        assert any("packed two per uint" in r.getMessage() for r in caplog.records)
        with VulkanModel(g, dev, precision="auto") as m:
            assert m._b.precision.precision == "fp32" and "no storageBuffer16BitAccess" in m._b.precision.reason
    finally:
        dev.close()


# ------------------------------------------------------------------------------------------ packages

@pytest.mark.parametrize("device", ["cpu", pytest.param("vulkan", marks=[vulkan, pytest.mark.vulkan])])
def test_fp16_package_holds_fp16_weights(tmp_path: Path, device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import inferd
    import inferd.planner.precision as pp
    # the CPU stores fp16 where the measured disk is slow enough (test_cpu_fp16_storage_only_where...); here
    # it must, whatever this machine's page cache makes the disk look like
    monkeypatch.setattr(pp, "cpu_fp16_wins", lambda *a: True)
    from inferd.errors import PackageOptionsError
    from inferd.package import read_plan
    src = zoo_dir(["squeezenet1_1"]) / "squeezenet1_1.onnx"
    outs, pkgs = {}, {}
    feeds = None
    for prec in ("fp32", "fp16"):
        m = inferd.load(src, device=device, cache_dir=tmp_path, precision=prec)
        m.close()
        m = inferd.load(src, device=device, cache_dir=tmp_path, precision=prec)  # from the package
        feeds = feeds or {t.name: np.random.default_rng(0).standard_normal(t.shape).astype(np.float32)
                          for t in m.inputs}
        outs[prec] = m.run(feeds)
        pkgs[prec] = m.package
        assert m.package is not None and m.precision is not None and m.precision.requested == prec
        m.close()
    assert pkgs["fp16"] != pkgs["fp32"]
    # which transformed copies a package holds follows its (profiled) plan, so compare what the bytes are:
    # the fp16 store's weights are fp16 (biases and Winograd matrices stay fp32), the fp32 store's fp32
    from inferd.store import WeightsStore, entries_of
    for prec, want in (("fp16", np.float16), ("fp32", np.float32)):
        with WeightsStore(pkgs[prec] / "weights.store") as st:
            by = {}
            for e in entries_of(st):
                by[np.dtype(e.dtype)] = by.get(np.dtype(e.dtype), 0) + e.size
        assert by.get(np.dtype(want), 0) >= 0.9 * sum(by.values()), (prec, by)
    d = read_plan(pkgs["fp16"] / "plan.bin")
    assert d["precision"]["precision"] == "fp16" and d["fp16_raw"]
    for k in outs["fp32"]:
        assert 0 < _rel(outs["fp16"][k], outs["fp32"][k]) <= TOL
    with pytest.raises(PackageOptionsError, match="precision"):
        inferd.load(pkgs["fp16"], device=device, precision="fp32")


def test_old_plan_version_is_a_cache_miss_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import struct

    from inferd.package import PLAN_VERSION, cached_package
    src = zoo_dir(["tiny"]) / "tiny.onnx"
    pkg = cached_package(src, tmp_path)
    plan = pkg / "plan.bin"
    data = bytearray(plan.read_bytes())
    struct.pack_into("<I", data, 8, PLAN_VERSION - 1)  # a package written by the engine before fp16
    plan.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        again = cached_package(src, tmp_path)
    assert again == pkg and any("plan format version" in r.getMessage() for r in caplog.records)
    assert struct.unpack_from("<I", (pkg / "plan.bin").read_bytes(), 8)[0] == PLAN_VERSION


# ------------------------------------------------------------------------------------------ config, CLI

def test_model_config_precision_keys(tmp_path: Path) -> None:
    from inferd.server.repository import parse_model_config
    p = tmp_path / "config.toml"
    p.write_text('precision = "fp16"\nfp32_layers = ["/fc/Gemm"]\n')
    cfg = parse_model_config(str(p))
    assert cfg.precision == "fp16" and cfg.fp32_layers == ("/fc/Gemm",)
    p.write_text('precision = "half"\n')
    with pytest.raises(ValueError, match="'precision' must be fp32, fp16 or auto"):
        parse_model_config(str(p))


def test_cli_precision_flag(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from inferd import cli
    src = zoo_dir(["mlp_small"]) / "mlp_small.onnx"
    pkg = tmp_path / "p16"
    assert cli.main(["compile", str(src), "--out", str(pkg), "--precision", "fp16", "--no-profile"]) == 0
    assert cli.main(["run", str(pkg)]) == 0  # a package runs at its own precision
    assert cli.main(["run", str(pkg), "--precision", "fp32"]) == 2  # ... and says so when asked for another
    assert "compiled for precision 'fp16'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["run", str(src), "--precision", "bf16"])


def test_a_stored_plan_follows_the_device_it_runs_on() -> None:
    p = plan_precision("fp16", "vulkan", S16)
    q = p.on({"storageBuffer16BitAccess": False, "shaderFloat16": False})
    assert (q.storage, q.mode, q.arithmetic) == ("packed", 2, "fp32") and "unpackHalf2x16" in q.reason
    assert p.on(S16) is p


@vulkan
@pytest.mark.vulkan
def test_fp16_paths_pass_the_validation_layers(tmp_path: Path) -> None:
    """16-bit storage buffers, RGBA16F texel views and fp16 shared-memory tiles on a device created with the
    features enabled: no validation error (the layers are skipped where not installed)."""
    from inferd.vulkan.device import VulkanConfig, VulkanDevice
    dev = VulkanDevice(VulkanConfig(debug=True, cache_dir=str(tmp_path)))
    try:
        g = _conv_graph()
        for kernels in (None, {"Conv": "vk_gemm", "Gemm": "vk_matmul"}):
            ref, got, _, _ = _run_both(g, dev, kernels)
            assert 0 < _rel(got["y"], ref["y"]) <= TOL
        assert not dev.validation_errors, dev.validation_errors[:3]
    finally:
        dev.close()
