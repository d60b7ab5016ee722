"""Native erf / GELU (native/conv.c via inferd.native) against float64 references, and their wiring into
apply_act's Gelu and the Erf op."""
from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from scipy.special import erf as sp_erf

from inferd import native
from inferd.ops.activation import apply_act
from ortutil import ort_session

NATIVE_DIR = Path(__file__).resolve().parent.parent / "native"

needs_native = pytest.mark.skipif(not native.AVAILABLE, reason="native extension not built")

SPECIALS = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-30, -1e-38, 1e-7, -3e-8, 0.921875, -0.921875, 3.925, -3.925,
                     3.9250002, 5.0, -5.0, 10.0, -10.0, 1e30, -1e30, 3.4e38, -3.4e38, np.inf, -np.inf, np.nan],
                    np.float32)


def _grid() -> np.ndarray:
    dense = np.linspace(-9.0, 9.0, 1_800_001, dtype=np.float64).astype(np.float32)
    logs = np.logspace(-40, 38, 4000).astype(np.float32)
    return np.concatenate([dense, logs, -logs, SPECIALS])


def _gelu_ref(x: np.ndarray, approximate: bool) -> np.ndarray:
    xd = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if approximate:
            return 0.5 * xd * (1 + np.tanh(math.sqrt(2 / math.pi) * (xd + 0.044715 * xd ** 3)))
        return 0.5 * xd * (1 + sp_erf(xd / math.sqrt(2)))


@needs_native
def test_erf_dense_grid_and_specials() -> None:
    x = _grid()
    y = native.erf(x)
    ref = sp_erf(x.astype(np.float64))
    fin = ~np.isnan(x)
    err = np.abs(y[fin].astype(np.float64) - ref[fin])
    assert err.max() <= 2e-7, (err.max(), x[fin][err.argmax()])
    assert np.isnan(y[np.isnan(x)]).all()
    s = native.erf(SPECIALS)
    assert s[SPECIALS == np.inf][0] == 1.0 and s[SPECIALS == -np.inf][0] == -1.0
    assert np.signbit(s[1]) and s[1] == 0.0 and not np.signbit(s[0])
    assert np.all(np.abs(y[fin]) <= 1.0)
    for v in (0.1, 0.5, 1.0, 2.0, 3.0, -0.7, -2.5):  # independent oracle: math.erf
        assert abs(float(native.erf(np.array([v], np.float32))[0]) - math.erf(float(np.float32(v)))) <= 2e-7


@needs_native
def test_erf_out_and_in_place() -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 100_001)) * 3).astype(np.float32)  # > 2 * 128k elements: split over threads
    ref = native.erf(x)
    out = np.empty_like(x)
    assert native.erf(x, out) is out
    np.testing.assert_array_equal(out, ref)
    y = x.copy()
    native.erf(y, y)
    np.testing.assert_array_equal(y, ref)
    # partial overlap falls back to a safe path
    buf = np.concatenate([x.ravel(), np.zeros(7, np.float32)])
    native.erf(buf[:-7], buf[7:])
    np.testing.assert_allclose(buf[7:], ref.ravel(), atol=2e-7)


@needs_native
@pytest.mark.parametrize("approximate", [False, True])
def test_gelu_vs_float64(approximate: bool) -> None:
    x = _grid()
    y = native.gelu_(x.copy(), approximate)
    ref = _gelu_ref(x, approximate)
    ok = np.isfinite(ref)
    err = np.abs(y[ok].astype(np.float64) - ref[ok]) / np.maximum(1.0, np.abs(ref[ok]))
    # the erf form's rational erf is within ~4e-7 of -1 near z = -4 in float32, and 1 + erf(z) keeps that error
    # absolute: 0.5 |x| times it is ~1.1e-6 at x = -5.6 (where the value is -4e-8)
    assert err.max() <= (5e-7 if approximate else 1.5e-6), (err.max(), x[ok][err.argmax()])
    g = native.gelu_(np.array([np.inf, -np.inf, np.nan, -0.0, 0.0], np.float32), approximate)
    assert g[0] == np.inf and g[1] == 0.0 and np.isnan(g[2]) and g[3] == 0.0 and g[4] == 0.0


@pytest.mark.parametrize("approximate", [False, True])
def test_gelu_numpy_fallback_matches(approximate: bool) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(10_000) * 4).astype(np.float32)
    a = native.numpy_gelu(x.copy(), approximate)
    b = native.gelu_(x.copy(), approximate)
    np.testing.assert_allclose(a, b, rtol=2e-6, atol=5e-7 if approximate else 1.5e-6)


@pytest.mark.parametrize("approximate", [0.0, 1.0])
def test_apply_act_gelu(approximate: float) -> None:
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((1, 197, 768)) * 3).astype(np.float32)
    ref = _gelu_ref(x, approximate == 1.0)
    y = x.copy()
    assert apply_act(y, ("Gelu", (approximate,))) is y
    assert np.max(np.abs(y - ref)) / np.max(np.abs(ref)) <= 1e-6
    # strided view and float64 keep the numpy path and agree
    v = x.copy()[:, ::2]
    apply_act(v, ("Gelu", (approximate,)))
    np.testing.assert_allclose(v, ref[:, ::2], rtol=1e-5, atol=1e-6)
    d = x.astype(np.float64)
    apply_act(d, ("Gelu", (approximate,)))
    np.testing.assert_allclose(d, ref, rtol=1e-5, atol=1e-6)


def test_erf_op_vs_onnxruntime() -> None:
    import inferd

    node = helper.make_node("Erf", ["x"], ["y"])
    g = helper.make_graph([node], "erf", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 1000])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1000])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = onnx._serialize(model) if hasattr(onnx, "_serialize") else model.SerializeToString()
    x = (np.random.default_rng(3).standard_normal((4, 1000)) * 2.5).astype(np.float32)
    want = ort_session(data).run(None, {"x": x})[0]
    got = inferd.load(data).run({"x": x})
    got = got["y"] if isinstance(got, dict) else got[0]
    np.testing.assert_allclose(got, want, atol=3e-7)
    np.testing.assert_allclose(got, sp_erf(x.astype(np.float64)), atol=2e-7)



# Every activation code's loop must vectorise: a ?: that GCC threads into branches leaves it scalar ("control flow
# in loop"), ~3 ns a value with the same results, so no value test sees it (Sigmoid, SiLU, LeakyRelu and HardSwish
# ran scalar this way on x86 and aarch64 until their selects went through the bits).
def _act_loop_vectorises(cc: str, attr: str, act: int, tmp_path: Path) -> bool:
    src = tmp_path / f"act{act}_{cc}.c"
    src.write_text('#include <stddef.h>\n#include <string.h>\n#include "inferd_internal.h"\n'
                   f"{attr} void act(float* d, ptrdiff_t n, float p0, float p1)"
                   f" {{ act_inplace(d, n, {act}, p0, p1); }}\n")
    out = subprocess.run([cc, "-O3", "-std=c99", "-fno-math-errno", "-ffp-contract=fast", f"-I{NATIVE_DIR}", "-c",
                          str(src), "-o", str(src.with_suffix(".o")), "-fopt-info-vec-optimized"],
                         capture_output=True, text=True, timeout=120, check=True)
    return "loop vectorized" in out.stderr


@pytest.mark.parametrize("cc, attr", [("cc", '__attribute__((target("avx2,fma")))'), ("aarch64-linux-gnu-gcc", "")])
def test_every_activation_loop_vectorises(cc: str, attr: str, tmp_path: Path) -> None:
    if shutil.which(cc) is None:
        pytest.skip(f"needs {cc}")
    if "avx2" in attr and not subprocess.run([cc, "-dumpmachine"], capture_output=True, text=True).stdout.startswith(
            "x86_64"):
        pytest.skip("the x86 form needs an x86-64 compiler")
    scalar = [act for act in range(1, 10) if not _act_loop_vectorises(cc, attr, act, tmp_path)]
    assert scalar == [], f"activation codes whose loop {cc} left scalar: {scalar}"
