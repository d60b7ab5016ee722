"""Every zoo model on the CPU matches onnxruntime, with the default kernels and with each
applicable conv kernel forced in turn (max |ours - ref| / max |ref| <= 1e-4, float32)."""
from __future__ import annotations

import numpy as np
import pytest

import inferd
from inferd.ops.base import kernels_for
from inferd.runtime.cpu import select_kernels
from inferd.zoo import ZOO
from ortutil import run_ort_file as _ort
from zoo_fixture import zoo_dir

TOL = 1e-4
CONV_KERNELS = [k.name for k in kernels_for("Conv", "cpu")]




@pytest.fixture(scope="module")
def refs():
    d = zoo_dir()
    out = {}
    for name in ZOO:
        path = d / f"{name}.onnx"
        model = inferd.load(path)
        rng = np.random.default_rng(123)
        feeds = {t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in model.inputs}
        out[name] = (path, feeds, _ort(path, feeds), model)
    return out


def _check(got: dict, ref: list, names: list[str], what: str) -> None:
    for n, r in zip(names, ref):
        g = got[n]
        assert g.shape == r.shape, f"{what}: output {n} shape {g.shape} vs onnxruntime {r.shape}"
        err = float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-30))
        assert err <= TOL, f"{what}: output {n} relative error {err:.3g} > {TOL}"


@pytest.mark.parametrize("name", ZOO)
def test_zoo_default_kernels_match_onnxruntime(refs, name):
    path, feeds, ref, model = refs[name]
    _check(model.run(feeds), ref, model.output_names, f"{name} default")


@pytest.mark.parametrize("kernel", CONV_KERNELS)
@pytest.mark.parametrize("name", ZOO)
def test_zoo_with_each_conv_kernel_forced(refs, name, kernel):
    path, feeds, ref, default = refs[name]
    forced = {"Conv": kernel}
    used = {k.name for layer, k in select_kernels(default.graph, "cpu", forced) if layer.op == "Conv"}
    if kernel not in used:
        pytest.skip(f"{kernel} applies to no Conv of {name}")
    model = inferd.load(path, kernels=forced)
    assert kernel in set(model.kernels.values())
    _check(model.run(feeds), ref, model.output_names, f"{name} with Conv={kernel}")


def test_packed_weights_start_on_a_cache_line(refs, tmp_path, monkeypatch):
    """The vector kernels load 64-byte vectors of packed weights: numpy's 16-byte alignment split every such load
    over two cache lines. Every packed weight array of the zoo's fp32 models (GEMM panels, Winograd, blocked convs)
    starts on a 64-byte boundary."""
    from inferd import native

    for shape, dt in (((3, 5), np.float32), ((7,), np.int8), ((2, 3, 4), np.float64), ((1000, 3), np.float32)):
        a = native.empty_aligned(shape, dt)
        assert a.shape == shape and a.dtype == dt and a.ctypes.data % 64 == 0 and a.flags.c_contiguous
    seen = set()
    # the zoo's 1x1 convs all run blocked: mobilenetv2 with the layout off runs its own on the NCHW GEMM (conv1x1);
    # and with the AVX-512 tiles resnets' 3x3s run blocked too: resnet18 with the layout off runs them on Winograd
    monkeypatch.setenv("INFERD_CPU_LAYOUT", "nchw")
    nchw = inferd.load(refs["mobilenetv2"][0], device="cpu")
    nchw_r = inferd.load(refs["resnet18"][0], device="cpu")
    monkeypatch.delenv("INFERD_CPU_LAYOUT")
    for name, model in [(n, refs[n][3]) for n in ("squeezenet1_1", "resnet50", "mobilenetv2", "vit_tiny")] + [
            ("mobilenetv2 (NCHW)", nchw), ("resnet18 (NCHW)", nchw_r)]:
        model.wait_warm(60)
        for step in model._exec.steps:
            if step is None or step.kernel.name not in ("nchwc", "conv1x1", "im2col", "im2col_tiled", "winograd23",
                                                        "winograd43", "gemm_packed"):
                continue
            w = step.params["w"]
            assert w.ctypes.data % 64 == 0, f"{name}: {step.layer.name} ({step.kernel.name}) weights at " \
                                            f"{w.ctypes.data % 64} bytes past a cache line"
            seen.add(step.kernel.name)
    assert {"nchwc", "conv1x1", "gemm_packed", "winograd23"} <= seen, seen
    # and as read back from a compiled package's weights store
    path = refs["resnet18"][0]
    inferd.load(path, device="cpu", cache_dir=tmp_path).wait_warm(60)
    m = inferd.load(path, device="cpu", cache_dir=tmp_path)
    m.wait_warm(60)
    bad = [(s.layer.name, k) for s in m._exec.steps if s is not None for k, a in s.params.items()
           if isinstance(a, np.ndarray) and a.nbytes >= 64 and a.ctypes.data % 64]
    assert not bad, bad
    # and as transformed from the raw weights at a cold load (every layer read raw, no warm switch after it)
    from inferd.planner.plan import PlanOptions

    m = inferd.load(path, device="cpu", cache_dir=tmp_path, cold=PlanOptions(force_source="raw", warm_switch=False))
    m.run({t.name: np.zeros(t.shape, np.float32) for t in m.inputs})
    bad = [(s.layer.name, k) for s in m._exec.steps if s is not None for k, a in s.params.items()
           if isinstance(a, np.ndarray) and a.nbytes >= 64 and a.ctypes.data % 64]
    assert not bad, bad
