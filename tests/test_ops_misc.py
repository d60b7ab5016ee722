"""Operators added for coverage (signal, sampling, pools, random generators) against onnxruntime where it runs
them, and the random generators against their distributions (no two engines draw the same values)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from inferd.ops import kernels_for, run_layer, single_node_layer
from ortutil import feeds_for, make_single_node_model


def _ort(op: str, ins: list, attrs: dict, opset: int, const: list[bool] | None = None, n_out: int = 1) -> list:
    m = make_single_node_model(op, ins, attrs, opset=opset, const_mask=const, n_outputs=n_out)
    try:
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # an op or opset this onnxruntime build lacks
        pytest.skip(f"onnxruntime cannot run {op} at opset {opset}: {str(e)[:120]}")
    return sess.run(None, feeds_for(ins, const))


def _ours(op: str, ins: list, attrs: dict, opset: int, const: list[bool] | None = None, n_out: int = 1) -> list:
    const = const or [False] * len(ins)
    layer = single_node_layer(op, ins, dict(attrs, _opset=opset), const=const, n_outputs=n_out)
    (k,) = [k for k in kernels_for(op) if k.applies(layer)][:1]
    return run_layer(k, layer, ins)


def _check(op: str, ins: list, attrs: dict, opset: int, const: list[bool] | None = None, tol: float = 1e-5) -> None:
    want = _ort(op, ins, attrs, opset, const)
    got = _ours(op, ins, attrs, opset, const)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


RNG = np.random.default_rng(0)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("pad", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_matches_onnxruntime(mode: str, pad: str, align: int) -> None:
    x = RNG.standard_normal((2, 3, 7, 9)).astype(np.float32)
    grid = (RNG.random((2, 5, 6, 2)) * 2.6 - 1.3).astype(np.float32)  # some points outside [-1, 1]
    _check("GridSample", [x, grid], {"mode": mode, "padding_mode": pad, "align_corners": align}, 16, tol=1e-4)


def test_affine_grid_then_grid_sample_matches_onnxruntime() -> None:
    theta = RNG.standard_normal((2, 2, 3)).astype(np.float32) * 0.5
    size = np.array([2, 3, 6, 8], np.int64)
    for align in (0, 1):
        _check("AffineGrid", [theta, size], {"align_corners": align}, 20, const=[False, True])


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pools_match_onnxruntime(p: int) -> None:
    x = RNG.standard_normal((2, 3, 8, 7)).astype(np.float32)
    _check("LpPool", [x], {"p": p, "kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1]}, 18, tol=1e-4)
    _check("GlobalLpPool", [x], {"p": p}, 2, tol=1e-4)


def test_det_and_stft_match_onnxruntime() -> None:
    _check("Det", [RNG.standard_normal((3, 4, 4)).astype(np.float32)], {}, 11, tol=1e-4)
    sig = RNG.standard_normal((2, 64, 1)).astype(np.float32)
    win = np.hanning(16).astype(np.float32)
    _check("STFT", [sig, np.array(4, np.int64), win, np.array(16, np.int64)], {"onesided": 1}, 17,
           const=[False, True, False, True], tol=1e-4)


def test_deform_conv_matches_onnxruntime() -> None:
    x = RNG.standard_normal((1, 4, 6, 7)).astype(np.float32)
    w = RNG.standard_normal((6, 2, 3, 3)).astype(np.float32)
    off = (RNG.standard_normal((1, 2 * 9 * 2, 6, 7)) * 1.5).astype(np.float32)
    mask = RNG.random((1, 2 * 9, 6, 7)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    _check("DeformConv", [x, w, off, b, mask], {"pads": [1, 1, 1, 1], "group": 2, "offset_group": 2}, 19, tol=1e-4)


def _draw(op: str, ins: list, attrs: dict, opset: int = 17) -> np.ndarray:
    return _ours(op, ins, attrs, opset)[0]


def test_random_generators_draw_their_distribution() -> None:
    n = 40000
    v = _draw("RandomNormal", [], {"shape": [n], "mean": 2.0, "scale": 3.0})
    assert v.dtype == np.float32 and abs(v.mean() - 2.0) < 0.1 and abs(v.std() - 3.0) < 0.1
    u = _draw("RandomUniformLike", [np.zeros((200, 200), np.float64)], {"low": -1.0, "high": 3.0})
    assert u.dtype == np.float64 and u.min() >= -1.0 and u.max() < 3.0 and abs(u.mean() - 1.0) < 0.05
    p = np.full((n,), 0.3, np.float32)
    b = _draw("Bernoulli", [p], {})
    assert set(np.unique(b)) <= {0.0, 1.0} and abs(b.mean() - 0.3) < 0.02
    logits = np.log(np.array([[0.1, 0.6, 0.3]], np.float32))
    m = _draw("Multinomial", [logits], {"sample_size": n})
    assert m.shape == (1, n) and m.dtype == np.int32
    np.testing.assert_allclose(np.bincount(m[0], minlength=3) / n, [0.1, 0.6, 0.3], atol=0.02)
    # a seed makes the draw repeatable; without one, two runs differ
    a1 = _draw("RandomUniform", [], {"shape": [50], "seed": 5.0})
    a2 = _draw("RandomUniform", [], {"shape": [50], "seed": 5.0})
    c1 = _draw("RandomUniform", [], {"shape": [50]})
    c2 = _draw("RandomUniform", [], {"shape": [50]})
    assert np.array_equal(a1, a2) and not np.array_equal(c1, c2)


def test_maxpool_indices_round_trip_through_maxunpool() -> None:
    x = RNG.standard_normal((2, 3, 6, 8)).astype(np.float32)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    want = _ort("MaxPool", [x], attrs, 12, n_out=2)
    got = _ours("MaxPool", [x], attrs, 12, n_out=2)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    un = _ours("MaxUnpool", [got[0], got[1]], attrs, 11)[0]
    assert un.shape == x.shape and np.array_equal(un[un != 0], x[un != 0])
    assert np.count_nonzero(un) == got[0].size
