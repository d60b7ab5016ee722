"""Native kernels of the hot-path operators of issue 18 (GridSample, Einsum lowered to the GEMM, CumSum,
GatherND/ScatterND, GroupNormalization, RMSNormalization, DepthToSpace): each against its numpy oracle and
onnxruntime over its attribute space, and each stepping aside when the native extension lacks its entry point."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from inferd import native
from inferd.errors import KernelError
from inferd.ops import kernels_for, run_layer, single_node_layer
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
        got = run_layer(nk, layer, ins)[0]
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
            with pytest.raises((KernelError, IndexError, ValueError)):
                run_layer(k, layer, [data, idx])


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
