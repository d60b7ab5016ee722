"""The native strided copy (native/copy.c) that Transpose and other copied views use: every permutation,
dtype and stride pattern gives numpy's answer, bit for bit."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from inferd import native
from inferd.ops.tensor import copies_call

needs_native = pytest.mark.skipif(not native.AVAILABLE, reason="native kernels not built")


def _copy(src: np.ndarray) -> np.ndarray:
    dst = np.full(src.shape, 0x55, np.uint8).view(src.dtype) if src.dtype.itemsize == 1 else \
        np.zeros(src.shape, src.dtype)
    call = native.strided_copy_bound(dst, src)
    assert call is not None
    call()
    return dst


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8, np.bool_])
def test_every_permutation_of_a_4d_tensor(dtype) -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 5, 17, 33)) * 50).astype(dtype)
    for perm in itertools.permutations(range(4)):
        v = x.transpose(perm)
        assert np.array_equal(_copy(v), np.ascontiguousarray(v)), perm


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_attention_shapes_slices_and_negative_strides(dtype) -> None:
    # uint8: a quantised model's K^T and patch-embedding transposes (the swap of the last two axes goes in tiles
    # for one-byte items too; element by element it was 5x slower)
    rng = np.random.default_rng(4)
    qkv = (rng.standard_normal((1, 197, 3, 3, 64)) * 60).astype(dtype)
    for v in (qkv.transpose(2, 0, 3, 1, 4),                       # the q/k/v split: rows of 64 floats
              qkv[0, :, 1].transpose(1, 2, 0),                      # K^T: the last two axes swapped
              qkv[:, ::-1, :, ::2, 5:40],                           # a reversed, stepped, cut view
              qkv[0, 7, 2, 1, ::-3],                                # 1-D, negative step
              qkv[:, 3:4, 1:2, 2:3, 9:10],                          # one element
              qkv[0, :, :, 0].reshape(197, 192).T):                 # the patch embedding's (196+1) x 192 swap
        assert np.array_equal(_copy(v), np.ascontiguousarray(v))


@needs_native
def test_copies_call_uses_it_and_leaves_other_pairs_alone() -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 300), dtype=np.float32)
    big, small = np.empty((300, 64), np.float32), np.empty((4, 4), np.float32)
    call = copies_call([(big, x.T), (small, x[:4, :4])])
    call()
    assert np.array_equal(big, x.T) and np.array_equal(small, x[:4, :4])
    x += 1  # bound views: a second call copies the new values
    call()
    assert np.array_equal(big, x.T)


def test_refuses_what_it_cannot_copy() -> None:
    x = np.zeros((4, 5), np.float32)
    assert native.strided_copy_bound(np.zeros((5, 4), np.float64), x.T) is None  # dtype differs
    assert native.strided_copy_bound(np.zeros((4, 5), np.float32), x.T) is None  # shape differs
    assert native.strided_copy_bound(np.zeros((5, 4), np.float32).T, x) is None  # destination not contiguous
