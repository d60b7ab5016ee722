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
