"""Native kernels of the hot-path operators of issue 18 (GridSample, Einsum lowered to the GEMM, CumSum,
GatherND/ScatterND, GroupNormalization, RMSNormalization, DepthToSpace): each against its numpy oracle and
onnxruntime over its attribute space, and each stepping aside when the native extension lacks its entry point."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferd import native
from inferd.errors import KernelError
from inferd.ops import kernels_for, run_layer, single_node_layer
from native_harness import AARCH64_CC, AARCH64_FLAGS, QEMU, build_and_run, needs_aarch64, with_sanitizers
from ortutil import feeds_for, make_single_node_model, ort_session

NATIVE_NAMES = {"GridSample": "gridsample_native", "Einsum": "einsum_gemm", "CumSum": "cumsum_native",
                "GatherND": "gathernd_native", "ScatterND": "gathernd_native", "GroupNormalization": "groupnorm_native",
                "RMSNormalization": "rmsnorm_native", "DepthToSpace": "d2s_native"}


def _check(op: str, ins: list[Any], attrs: dict[str, Any], opset: int = 17, rtol: float = 1e-5,
           atol: float = 1e-5, native_applies: bool = True, ort: bool = True) -> None:
    """The native kernel, the numpy kernel and onnxruntime (where it has the type) agree; the native kernel
    applies where expected."""
    layer = single_node_layer(op, ins, dict(attrs, _opset=opset), const=[False] * len(ins))
    ks = {k.name: k for k in kernels_for(op)}
    ref = run_layer(ks["numpy"], layer, ins)[0]
    want = ref
    if ort:
        model = make_single_node_model(op, ins, attrs, opset=opset)
        want = ort_session(model).run(None, feeds_for(ins))[0]
    np.testing.assert_allclose(ref, want, rtol=rtol, atol=atol, err_msg="numpy oracle vs onnxruntime")
    nk = ks[NATIVE_NAMES[op]]
    if not native.AVAILABLE:
        assert not nk.applies(layer)
        return
    assert nk.applies(layer) == native_applies
    if native_applies:
        for bound in (False, True):  # run, and the call bind makes where the kernel has one
            got = run_layer(nk, layer, ins, bound=bound)[0]
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{nk.name} vs onnxruntime")
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, err_msg=f"{nk.name} vs numpy")


def _grid(rng: np.random.Generator, n: int, oh: int, ow: int, reach: float) -> np.ndarray:
    return ((rng.random((n, oh, ow, 2), dtype=np.float32) * 2 - 1) * reach).astype(np.float32)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("pad", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_native(mode: str, pad: str, align: int) -> None:
    rng = np.random.default_rng(len(mode) * 7 + len(pad) + align)
    x = rng.standard_normal((2, 5, 7, 9), dtype=np.float32)
    g = _grid(rng, 2, 6, 11, 1.6)  # well past the border: padding matters; far enough to reflect twice
    g[0, 0, :4] = [[-1, -1], [1, 1], [-1, 1], [0, 0]]  # the corners exactly
    _check("GridSample", [x, g], {"mode": mode, "padding_mode": pad, "align_corners": align}, opset=16)


def test_grid_sample_bicubic_and_3d_stay_on_numpy() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 5, 6), dtype=np.float32)
    _check("GridSample", [x, _grid(rng, 1, 3, 4, 1.0)], {"mode": "bicubic"}, opset=16, native_applies=False)
    x5 = rng.standard_normal((1, 2, 3, 4, 5), dtype=np.float32)
    g5 = ((rng.random((1, 2, 3, 4, 3), dtype=np.float32) * 2 - 1)).astype(np.float32)
    _check("GridSample", [x5, g5], {"mode": "linear"}, opset=20, native_applies=False)


@pytest.mark.parametrize("eq,sa,sb,lowered", [
    ("bhqd,bhkd->bhqk", (1, 3, 7, 5), (1, 3, 6, 5), True),
    ("bhqk,bhkd->bhqd", (2, 3, 7, 6), (2, 3, 6, 5), True),
    ("bij,bjk->bik", (4, 5, 6), (4, 6, 3), True),
    ("bnd,dk->bnk", (2, 9, 8), (8, 5), True),
    ("ij,jk->ki", (5, 6), (6, 7), True),  # output not in (batch, free-A, free-B) order
    ("bhqd,bkhd->bhqk", (1, 2, 4, 3), (1, 5, 2, 3), True),  # a transposed operand
    ("ij,ij->i", (4, 6), (4, 6), True),  # a batched dot
    ("ii,ij->j", (4, 4), (4, 5), False),  # a diagonal
    ("ij,jk", (3, 4), (4, 2), False),  # implicit output
    ("...ij,...jk->...ik", (2, 3, 4), (2, 4, 5), False),
    ("ij,kj->i", (3, 4), (5, 4), False),  # k summed within one operand
])
def test_einsum_lowered_to_gemm(eq: str, sa: tuple[int, ...], sb: tuple[int, ...], lowered: bool) -> None:
    rng = np.random.default_rng(len(eq))
    a, b = rng.standard_normal(sa, dtype=np.float32), rng.standard_normal(sb, dtype=np.float32)
    _check("Einsum", [a, b], {"equation": eq}, rtol=1e-4, atol=1e-4, native_applies=lowered)


@pytest.mark.parametrize("axis", [0, 1, -1, 2])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum_native(axis: int, exclusive: int, reverse: int) -> None:
    rng = np.random.default_rng(axis + 3 * exclusive + 5 * reverse + 10)
    x = rng.standard_normal((3, 130, 70), dtype=np.float32)
    _check("CumSum", [x, np.array(axis, np.int64)], {"exclusive": exclusive, "reverse": reverse}, rtol=1e-4,
           atol=1e-4)


def test_cumsum_int_stays_on_numpy() -> None:
    x = np.arange(12, dtype=np.int64).reshape(3, 4)
    _check("CumSum", [x, np.array(1, np.int64)], {}, native_applies=False)


@pytest.mark.parametrize("batch_dims", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
def test_gather_nd_native(batch_dims: int, dtype: type) -> None:
    rng = np.random.default_rng(batch_dims)
    data = (rng.random((2, 6, 5, 4)) * 100).astype(dtype)
    for m in (1, 2, 3):
        if batch_dims + m > 4:
            continue
        dims = data.shape[batch_dims:batch_dims + m]
        idx = np.stack([rng.integers(-d, d, (2, 7)) for d in dims], -1).astype(np.int64)  # negatives count back
        _check("GatherND", [data, idx], {"batch_dims": batch_dims}, opset=13)


def test_gather_nd_index_out_of_range_is_an_error() -> None:
    data = np.zeros((3, 4), np.float32)
    idx = np.array([[0, 1], [3, 0]], np.int64)
    layer = single_node_layer("GatherND", [data, idx], {}, const=[False, False])
    for k in kernels_for("GatherND"):
        if k.applies(layer):
            for bound in (False, True):
                with pytest.raises((KernelError, IndexError, ValueError)):
                    run_layer(k, layer, [data, idx], bound=bound)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_native(reduction: str) -> None:
    rng = np.random.default_rng(len(reduction))
    data = rng.standard_normal((6, 5, 4), dtype=np.float32)
    for k in (1, 2, 3):
        n = 8
        idx = np.stack([rng.integers(-d, d, n) for d in data.shape[:k]], -1).astype(np.int64)
        if reduction == "none":  # onnxruntime's result with duplicates is its own order: keep them unique
            flat = np.unique(np.ravel_multi_index(tuple(np.where(idx < 0, idx + np.array(data.shape[:k]), idx).T),
                                                  data.shape[:k]))
            idx = np.stack(np.unravel_index(flat, data.shape[:k]), -1).astype(np.int64)
        upd = rng.standard_normal(idx.shape[:-1] + data.shape[k:], dtype=np.float32)
        attrs = {} if reduction == "none" else {"reduction": reduction}
        _check("ScatterND", [data, idx, upd], attrs, opset=18)


def test_scatter_nd_duplicates_last_update_wins() -> None:
    data = np.zeros((4, 3), np.float32)
    idx = np.array([[1], [2], [1]], np.int64)
    upd = np.arange(9, dtype=np.float32).reshape(3, 3)
    layer = single_node_layer("ScatterND", [data, idx, upd], {}, const=[False] * 3)
    ks = {k.name: k for k in kernels_for("ScatterND")}
    ref = run_layer(ks["numpy"], layer, [data, idx, upd])[0]
    np.testing.assert_array_equal(ref[1], upd[2])
    if ks["gathernd_native"].applies(layer):
        np.testing.assert_array_equal(run_layer(ks["gathernd_native"], layer, [data, idx, upd])[0], ref)


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("shape,groups", [((2, 6, 5, 7), 3), ((1, 8, 33), 8), ((2, 4, 3, 2, 2), 1)])
def test_group_normalization_native(opset: int, shape: tuple[int, ...], groups: int) -> None:
    rng = np.random.default_rng(opset + groups)
    x = (rng.standard_normal(shape, dtype=np.float32) * 3 + 1).astype(np.float32)
    n = groups if opset == 18 else shape[1]
    s, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    _check("GroupNormalization", [x, s, b], {"num_groups": groups, "epsilon": 1e-4}, opset=opset, rtol=1e-4,
           atol=1e-4)


@pytest.mark.parametrize("axis,shape", [(-1, (2, 5, 48)), (1, (2, 5, 6)), (0, (3, 4)), (2, (2, 3, 17))])
def test_rms_normalization_native(axis: int, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(len(shape) + axis + 10)
    x = rng.standard_normal(shape, dtype=np.float32)
    a = axis + len(shape) if axis < 0 else axis
    s = rng.standard_normal(shape[a:], dtype=np.float32)
    _check("RMSNormalization", [x, s], {"axis": axis, "epsilon": 1e-5}, opset=23, rtol=1e-4, atol=1e-5)


def test_rms_normalization_broadcast_scale_stays_on_numpy() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 8), dtype=np.float32)
    _check("RMSNormalization", [x, rng.standard_normal((8,), dtype=np.float32)], {"axis": 1}, opset=23, rtol=1e-4,
           native_applies=False)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("bs", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int64])
def test_depth_to_space_native(mode: str, bs: int, dtype: type) -> None:
    rng = np.random.default_rng(bs)
    x = (rng.random((2, 2 * bs * bs, 5, 7)) * 200).astype(dtype)
    # onnxruntime's CPU DepthToSpace has float and uint8, not int64: that type is checked against numpy
    _check("DepthToSpace", [x], {"blocksize": bs, "mode": mode}, opset=13, ort=dtype != np.int64)


@pytest.mark.parametrize("op,fn", [("GridSample", "inferd_grid_sample"), ("CumSum", "inferd_cumsum"),
                                   ("GatherND", "inferd_gather_nd"), ("GroupNormalization", "inferd_groupnorm"),
                                   ("RMSNormalization", "inferd_rmsnorm"), ("DepthToSpace", "inferd_depth_to_space")])
def test_native_kernels_step_aside_without_their_entry_point(op: str, fn: str, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    rng = np.random.default_rng(0)
    ins = {"GridSample": [rng.random((1, 2, 3, 4), dtype=np.float32), _grid(rng, 1, 2, 2, 1.0)],
           "CumSum": [rng.random((3, 4), dtype=np.float32), np.array(1, np.int64)],
           "GatherND": [rng.random((3, 4), dtype=np.float32), np.array([[1, 2]], np.int64)],
           "GroupNormalization": [rng.random((1, 4, 3), dtype=np.float32)] + [np.ones(4, np.float32)] * 2,
           "RMSNormalization": [rng.random((2, 4), dtype=np.float32), np.ones(4, np.float32)],
           "DepthToSpace": [rng.random((1, 4, 2, 2), dtype=np.float32)]}[op]
    attrs = {"GroupNormalization": {"num_groups": 2, "_opset": 21}, "DepthToSpace": {"blocksize": 2},
             "RMSNormalization": {"_opset": 23}}.get(op, {})
    layer = single_node_layer(op, ins, attrs, const=[False] * len(ins))
    nk = {k.name: k for k in kernels_for(op)}[NATIVE_NAMES[op]]
    real = native.has
    monkeypatch.setattr(native, "has", lambda f: False if f == fn else real(f))
    assert not nk.applies(layer)
    # the layer still runs: the numpy kernel is the one left
    assert any(k.applies(layer) for k in kernels_for(op) if k.name == "numpy")


# ------------------------------------------------------------------------------ native C on other ISAs

_HARNESS = r"""
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "inferd_native.h"
static unsigned long long rs = 88172645463325252ULL;
static float rnd(void){ rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (float)((rs >> 11) % 2000001) / 1000000.0f - 1.0f; }
static int fails = 0;
static void close_to(const char* what, const float* a, const double* b, long long n, double tol) {
  for (long long i = 0; i < n; ++i) if (!(fabs(a[i] - b[i]) <= tol * (1.0 + fabs(b[i])))) {
    printf("FAIL %s at %lld: %g vs %g\n", what, i, a[i], b[i]); fails++; return; } }
/* onnxruntime's bilinear GridSample of one pixel, written out directly */
static float gs_ref_reflect(float x, float lo, float hi) { float r = hi - lo;
  if (x < lo) { float d = lo - x; int n = (int)(d / r); float m = d - n * r; return n % 2 == 0 ? lo + m : hi - m; }
  if (x > hi) { float d = x - hi; int n = (int)(d / r); float m = d - n * r; return n % 2 == 0 ? hi - m : lo + m; }
  return x; }
static float gs_px(const float* im, long long r, long long c, int H, int W, int pad, float xlo, float xhi, float ylo, float yhi) {
  if (pad == 0) return (c >= 0 && c < W && r >= 0 && r < H) ? im[r * W + c] : 0.0f;
  if (pad == 2) { c = (long long)gs_ref_reflect((float)c, xlo, xhi); r = (long long)gs_ref_reflect((float)r, ylo, yhi); }
  c = c < 0 ? 0 : (c >= W ? W - 1 : c); r = r < 0 ? 0 : (r >= H ? H - 1 : r);
  return im[r * W + c]; }
int main(void){
  inferd_pool_set_threads(2);
  for (int it = 0; it < 24; ++it) { /* GridSample bilinear, every padding and alignment */
    int C = 3 + it % 5, H = 4 + it % 7, W = 5 + it % 3, P = 37, pad = it % 3, al = (it / 3) % 2;
    float* x = malloc(sizeof(float) * C * H * W); float* g = malloc(sizeof(float) * P * 2);
    float* y = malloc(sizeof(float) * C * P); double* r = malloc(sizeof(double) * C * P);
    for (int i = 0; i < C * H * W; ++i) x[i] = rnd();
    for (int i = 0; i < P * 2; ++i) g[i] = rnd() * 1.7f;
    inferd_grid_sample(x, 1, C, H, W, g, P, y, 0, pad, al);
    float xlo = al ? 0.0f : -0.5f, xhi = al ? W - 1.0f : W - 0.5f, ylo = al ? 0.0f : -0.5f, yhi = al ? H - 1.0f : H - 0.5f;
    for (int q = 0; q < P; ++q) {
      float gx = g[q * 2], gy = g[q * 2 + 1];
      float fx = al ? (gx + 1) / 2 * (W - 1) : ((gx + 1) * W - 1) / 2, fy = al ? (gy + 1) / 2 * (H - 1) : ((gy + 1) * H - 1) / 2;
      if (fx < xlo || fx > xhi || fy < ylo || fy > yhi) {
        if (pad == 1) { fx = fx < 0 ? 0 : (fx > W - 1 ? W - 1 : fx); fy = fy < 0 ? 0 : (fy > H - 1 ? H - 1 : fy); }
        else if (pad == 2) { fx = gs_ref_reflect(fx, xlo, xhi); fy = gs_ref_reflect(fy, ylo, yhi); } }
      long long x1 = (long long)floorf(fx), y1 = (long long)floorf(fy);
      float dx1 = fx - x1, dx2 = x1 + 1 - fx, dy1 = fy - y1, dy2 = y1 + 1 - fy;
      for (int c = 0; c < C; ++c) { const float* im = x + c * H * W;
        r[c * P + q] = dy2 * (dx2 * gs_px(im, y1, x1, H, W, pad, xlo, xhi, ylo, yhi) + dx1 * gs_px(im, y1, x1 + 1, H, W, pad, xlo, xhi, ylo, yhi))
                     + dy1 * (dx2 * gs_px(im, y1 + 1, x1, H, W, pad, xlo, xhi, ylo, yhi) + dx1 * gs_px(im, y1 + 1, x1 + 1, H, W, pad, xlo, xhi, ylo, yhi)); } }
    close_to("gridsample", y, r, (long long)C * P, 1e-5);
    free(x); free(g); free(y); free(r);
  }
  for (int it = 0; it < 16; ++it) { /* CumSum along the middle axis, exclusive / reverse */
    int O = 1 + it % 3, N = 3 + it * 5, I = 1 + it * 9, ex = it % 2, rv = (it / 2) % 2;
    float* x = malloc(sizeof(float) * O * N * I); float* y = malloc(sizeof(float) * O * N * I); double* r = malloc(sizeof(double) * O * N * I);
    for (int i = 0; i < O * N * I; ++i) x[i] = rnd();
    inferd_cumsum(x, y, O, N, I, ex, rv);
    for (int o = 0; o < O; ++o) for (int i = 0; i < I; ++i) { double s = 0;
      for (int k = 0; k < N; ++k) { int n = rv ? N - 1 - k : k; long long at = ((long long)o * N + n) * I + i;
        if (ex) { r[at] = s; s += x[at]; } else { s += x[at]; r[at] = s; } } }
    close_to("cumsum", y, r, (long long)O * N * I, 1e-4);
    free(x); free(y); free(r);
  }
  for (int it = 0; it < 8; ++it) { /* DepthToSpace, DCR and CRD */
    int N = 1 + it % 2, C = 1 + it % 3, bs = 1 + it % 3, H = 3, W = 4 + it, crd = it % 2;
    long long n = (long long)N * C * bs * bs * H * W;
    float* x = malloc(sizeof(float) * n); float* y = malloc(sizeof(float) * n); double* r = malloc(sizeof(double) * n);
    for (long long i = 0; i < n; ++i) x[i] = (float)i;
    inferd_depth_to_space(x, y, N, C, H, W, bs, crd, 4);
    for (int b = 0; b < N; ++b) for (int c = 0; c < C; ++c) for (int h = 0; h < H * bs; ++h) for (int w = 0; w < W * bs; ++w) {
      int i = h % bs, j = w % bs, ic = crd ? c * bs * bs + i * bs + j : (i * bs + j) * C + c;
      r[(((long long)b * C + c) * H * bs + h) * W * bs + w] = x[(((long long)b * C * bs * bs + ic) * H + h / bs) * W + w / bs]; }
    close_to("depth_to_space", y, r, n, 0.0);
    free(x); free(y); free(r);
  }
  { /* GatherND / ScatterND: slices, negative indices, an index out of range */
    float d[4 * 5 * 3]; for (int i = 0; i < 60; ++i) d[i] = (float)i;
    long long dims[2] = {4, 5}, idx[6] = {1, 2, -1, -5, 3, 0}; float out[9]; double want[9];
    long long bad = inferd_gather_nd(d, dims, 2, 1, 0, idx, 3, 3 * sizeof(float), out);
    int rows[3] = {1 * 5 + 2, 3 * 5 + 0, 3 * 5 + 0};
    for (int t = 0; t < 3; ++t) for (int k = 0; k < 3; ++k) want[t * 3 + k] = d[rows[t] * 3 + k];
    if (bad != -1) { printf("FAIL gather_nd bad %lld\n", bad); fails++; }
    close_to("gather_nd", out, want, 9, 0.0);
    long long oob[2] = {4, 0};
    if (inferd_gather_nd(d, dims, 2, 1, 0, oob, 1, 12, out) != 0) { printf("FAIL gather_nd range\n"); fails++; }
    float o[60]; float u[9] = {100, 101, 102, 200, 201, 202, 300, 301, 302};
    if (inferd_scatter_nd(o, d, 60, dims, 2, idx, 3, u, 3, 1) != -1) { printf("FAIL scatter_nd\n"); fails++; }
    double w2[60]; for (int i = 0; i < 60; ++i) w2[i] = d[i];
    for (int t = 0; t < 3; ++t) for (int k = 0; k < 3; ++k) w2[rows[t] * 3 + k] += u[t * 3 + k];
    close_to("scatter_nd add", o, w2, 60, 0.0);
  }
  for (int it = 0; it < 6; ++it) { /* RMSNormalization and GroupNormalization against double sums */
    int rows = 3 + it, n = 7 + it * 11, G = 1 + it % 3, Cg = 2, HW = 5 + it * 3, C = G * Cg;
    float* x = malloc(sizeof(float) * rows * n); float* y = malloc(sizeof(float) * rows * n); double* r = malloc(sizeof(double) * rows * n);
    float* g = malloc(sizeof(float) * n); for (int i = 0; i < n; ++i) g[i] = rnd();
    for (int i = 0; i < rows * n; ++i) x[i] = rnd() * 3;
    inferd_rmsnorm(x, y, rows, n, g, 1e-5f);
    for (int q = 0; q < rows; ++q) { double s = 0; for (int k = 0; k < n; ++k) s += (double)x[q * n + k] * x[q * n + k];
      double inv = 1.0 / sqrt(s / n + 1e-5); for (int k = 0; k < n; ++k) r[q * n + k] = x[q * n + k] * inv * g[k]; }
    close_to("rmsnorm", y, r, (long long)rows * n, 1e-4);
    free(x); free(y); free(r); free(g);
    long long m = 2LL * C * HW;
    x = malloc(sizeof(float) * m); y = malloc(sizeof(float) * m); r = malloc(sizeof(double) * m);
    float* s = malloc(sizeof(float) * C); float* b = malloc(sizeof(float) * C);
    for (int i = 0; i < C; ++i) { s[i] = rnd(); b[i] = rnd(); }
    for (long long i = 0; i < m; ++i) x[i] = rnd() * 2 + 1;
    inferd_groupnorm(x, y, 2, C, HW, G, s, b, 1e-5f);
    for (int t = 0; t < 2 * G; ++t) { long long len = (long long)Cg * HW; const float* xg = x + t * len; double mu = 0, v = 0;
      for (long long k = 0; k < len; ++k) mu += xg[k]; mu /= len; for (long long k = 0; k < len; ++k) v += (xg[k] - mu) * (xg[k] - mu); v /= len;
      for (long long k = 0; k < len; ++k) { int c = (t % G) * Cg + (int)(k / HW); r[t * len + k] = (xg[k] - mu) / sqrt(v + 1e-5) * s[c] + b[c]; } }
    close_to("groupnorm", y, r, m, 1e-4);
    free(x); free(y); free(r); free(s); free(b);
  }
  for (int it = 0; it < 12; ++it) { /* RoiAlign avg (separable path) against onnxruntime's per-sample formula */
    int C = 4 + it, H = 9 + it % 4, W = 11 + it % 5, OH = 2 + it % 4, OW = 3 + it % 3, sr = it % 3, half = it % 2;
    float* x = malloc(sizeof(float) * C * H * W); for (int i = 0; i < C * H * W; ++i) x[i] = rnd();
    float rois[12]; long long bi[3] = {0, 0, 0};
    for (int q = 0; q < 3; ++q) { float a = (rnd() + 1) * W * 0.6f - 1, c = (rnd() + 1) * H * 0.6f - 1;
      rois[q * 4] = a; rois[q * 4 + 1] = c; rois[q * 4 + 2] = a + (rnd() + 1.2f) * W * 0.5f; rois[q * 4 + 3] = c + (rnd() + 1.2f) * H * 0.5f; }
    float* y = malloc(sizeof(float) * 3 * C * OH * OW); double* r = malloc(sizeof(double) * 3 * C * OH * OW);
    inferd_roi_align(x, 1, C, H, W, rois, bi, 3, OH, OW, sr, 1.0f, half, 0, y);
    for (int q = 0; q < 3; ++q) { float off = half ? 0.5f : 0.0f, sw = rois[q*4] - off, sh = rois[q*4+1] - off;
      float rw = rois[q*4+2] - off - sw, rh = rois[q*4+3] - off - sh; if (!half) { rw = rw > 1 ? rw : 1; rh = rh > 1 ? rh : 1; }
      float bh = rh / OH, bw = rw / OW; int gh = sr ? sr : (int)ceilf(rh / OH), gw = sr ? sr : (int)ceilf(rw / OW);
      int cnt = gh * gw > 1 ? gh * gw : 1;
      for (int c = 0; c < C; ++c) for (int ph = 0; ph < OH; ++ph) for (int pw = 0; pw < OW; ++pw) { double acc = 0;
        for (int iy = 0; iy < gh; ++iy) for (int ix = 0; ix < gw; ++ix) {
          float yy = sh + ph * bh + (iy + 0.5f) * bh / gh, xx = sw + pw * bw + (ix + 0.5f) * bw / gw;
          if (yy < -1 || yy > H || xx < -1 || xx > W) continue;
          if (yy <= 0) yy = 0; if (xx <= 0) xx = 0;
          int yl = (int)yy, xl = (int)xx, yh, xh;
          if (yl >= H - 1) { yh = yl = H - 1; yy = yl; } else yh = yl + 1;
          if (xl >= W - 1) { xh = xl = W - 1; xx = xl; } else xh = xl + 1;
          float ly = yy - yl, lx = xx - xl, hy = 1 - ly, hx = 1 - lx; const float* im = x + c * H * W;
          acc += hy * hx * im[yl * W + xl] + hy * lx * im[yl * W + xh] + ly * hx * im[yh * W + xl] + ly * lx * im[yh * W + xh]; }
        r[((q * C + c) * OH + ph) * OW + pw] = acc / cnt; } }
    close_to("roialign", y, r, 3LL * C * OH * OW, 1e-5);
    free(x); free(y); free(r);
  }
  printf("hot ops: %s (%d failures)\n", fails ? "FAILED" : "ok", fails);
  return fails != 0;
}
"""
def _build_and_run(cc: str, flags: list[str], tmp: Path, runner: list[str]) -> None:
    src = tmp / "hot_test.c"
    src.write_text(_HARNESS)
    build_and_run(src, ("sampling.c", "gather.c", "rows.c", "detect.c", "pool.c"), cc, flags, tmp, runner,
                  ("-O2", "-ffp-contract=fast"))


@pytest.mark.slow
@needs_aarch64
def test_hot_ops_c_aarch64(tmp_path: Path) -> None:
    _build_and_run(AARCH64_CC, AARCH64_FLAGS, tmp_path, QEMU)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs cc")
def test_hot_ops_c_host_with_sanitizers(tmp_path: Path) -> None:
    with_sanitizers(lambda flags: _build_and_run("cc", flags, tmp_path, []))


def test_ops_bench_hot_cases_run_native_and_match_onnxruntime(tmp_path: Path) -> None:
    """`inferd bench ops --set hot`'s cases at their real sizes, once each: the engine picks the native kernel
    (where the extension is built) and its outputs equal onnxruntime's."""
    import onnx

    from inferd.bench.ops_bench import _hot_cases
    from inferd.frontend import import_model
    from inferd.runtime.cpu import CpuExecutor

    for name, m, feeds in _hot_cases(np.random.default_rng(0)):
        p = tmp_path / "m.onnx"
        onnx.save(m, p)
        ex = CpuExecutor(import_model(str(p)))
        op = m.graph.node[0].op_type
        if native.AVAILABLE:
            assert [k.name for _l, k in ex.choice] == [NATIVE_NAMES[op]], name
        got = ex.run(feeds)
        want = ort_session(p).run(None, feeds)
        for o, w in zip(m.graph.output, want):
            np.testing.assert_allclose(got[o.name], w, rtol=1e-4, atol=1e-4, err_msg=name)
