"""The native packed GEMM and thread pool (native/gemm.c, native/pool.c) against numpy.

Every micro-kernel level the CPU has is checked (AVX-512, AVX2, baseline here; the aarch64 build is covered by
the C harness in test_conv.py under qemu), with both store layouts, batches, residuals and the fused
activations, on 1-3 pool threads, from several Python threads at once, and after a fork.
"""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from inferd import native
from inferd.ops.activation import apply_act

needs_native = pytest.mark.skipif(not native.AVAILABLE, reason="native kernels not built")
F32 = np.float32

ACTS = [None, ("Relu", ()), ("Clip", (0.0, 6.0)), ("LeakyRelu", (0.1,)), ("Sigmoid", ()), ("SiLU", ()),
        ("HardSwish", ()), ("HardSigmoid", (0.2, 0.5)), ("Gelu", (0.0,)), ("Gelu", (1.0,))]
SHAPES = [(1, 1, 1), (8, 16, 32), (13, 7, 5), (96, 16, 700), (24, 300, 49), (40, 1, 3), (33, 129, 65), (7, 0, 9),
          # ragged last column panels (whole vectors, then 8/4/2/1-column tails), across K blocks, B read in place
          # (M <= 32) and packed (long rows, M > 32)
          (16, 600, 49), (9, 300, 47), (72, 20, 601), (40, 530, 31), (17, 5, 15), (24, 700, 530),
          # the tails' k runs of 2-8 chains with k left over (K not a multiple of the run); 5-8 columns on the
          # few-column path (a 1-D conv over a few frames)
          (24, 301, 49), (40, 203, 47), (258, 255, 5), (20, 37, 7), (64, 387, 8), (9, 3, 6),
          # 17-32 rows on 784 columns or more: B in place through the prefetching micro-kernels (AVX-512)
          (24, 144, 3141), (32, 96, 800), (20, 40, 900),
          # ragged panels of exactly two vectors on AVX2 (16 of its 24 columns: the two-vector micro-kernel, no tail)
          (12, 50, 16), (41, 96, 64),
          # the whole width in one tile, its rows contiguous (a 1x1 conv on a 1-pixel map): the activation goes over
          # the tile at once
          (1152, 48, 1), (37, 5, 3)]


def _ref(a: np.ndarray, b: np.ndarray, bias, res, act) -> np.ndarray:
    y = a.astype(np.float64) @ b.astype(np.float64)
    if bias is not None:
        y += bias[:, None]
    if res is not None:
        y += res
    y = y.astype(F32)
    if act is not None:
        apply_act(y, act)
    return y


def _levels() -> list[int]:
    best = native.gemm_isa()
    return list(range(best + 1)) if best >= 0 else [-1]


@pytest.fixture
def isa_level(request):
    level = request.param
    if native.AVAILABLE:
        native.gemm_set_isa(level)
    yield level
    if native.AVAILABLE:
        native.gemm_set_isa(-1)


@pytest.mark.parametrize("isa_level", _levels(), indirect=True)
@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
@pytest.mark.parametrize("layout", ["nchw", "linear"])
def test_gemm_matches_numpy(isa_level: int, shape, layout: str) -> None:
    m, k, n = shape
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a = rng.standard_normal((m, k), dtype=F32)
    b = rng.standard_normal((k, n), dtype=F32)
    bias = rng.standard_normal(m, dtype=F32)
    res = rng.standard_normal((m, n), dtype=F32)
    ap = native.gemm_pack_a(a)
    assert ap.shape == native.gemm_packed_shape(m, k)
    assert np.array_equal(native.gemm_unpack_a(ap, m), a)
    for act in ACTS:
        for use_bias, use_res in ((False, False), (True, False), (True, True)):
            if layout == "nchw":
                bb, c = b, np.full((m, n), np.nan, F32)
                rr = res if use_res else None
            else:  # B stored (N, K), C and R (N, M): the transposed views a linear layer passes
                bb = np.ascontiguousarray(b.T).T
                c = np.full((n, m), np.nan, F32).T
                rr = np.ascontiguousarray(res.T).T if use_res else None
            native.gemm(ap, m, bb, c, bias if use_bias else None, rr, act)
            want = _ref(a, b, bias if use_bias else None, res if use_res else None, act)
            tol = 2e-5 * max(1.0, np.sqrt(k))
            assert np.allclose(c, want, rtol=tol, atol=tol), (shape, layout, act, use_bias, use_res)


@needs_native
@pytest.mark.parametrize("isa_level", _levels(), indirect=True)
def test_taller_tiles_give_the_same_bits_as_single_panels(isa_level: int) -> None:
    """Rows that a tall GEMM computes in 24-row tiles (AVX-512: three packed panels, or rows read in place) equal
    bit for bit the same rows computed alone through 8-row panels: every output sums the same products in the
    same order, across K blocks, with the epilogue (bias, residual, activation) and the ragged columns' tail."""
    rng = np.random.default_rng(11)
    m, k, n = 72, 700, 601
    a = rng.standard_normal((m, k), dtype=F32)
    b = rng.standard_normal((k, n), dtype=F32)
    bias = rng.standard_normal(m, dtype=F32)
    res = rng.standard_normal((m, n), dtype=F32)
    act = ("Relu", ())
    full = native.gemm(native.gemm_pack_a(a), m, b, np.empty((m, n), F32), bias, res, act)
    for r0 in (0, 24, 64):
        part = native.gemm(native.gemm_pack_a(a[r0:r0 + 8]), 8, b, np.empty((8, n), F32), bias[r0:r0 + 8],
                           res[r0:r0 + 8], act)
        assert np.array_equal(full[r0:r0 + 8], part), r0
    # 17-32 rows on 784 columns or more read B in place (AVX-512: micro-kernels that prefetch along its rows),
    # where the tall GEMM packs it: the same bits
    n2 = 1000
    b2 = rng.standard_normal((k, n2), dtype=F32)
    res2 = rng.standard_normal((m, n2), dtype=F32)
    full2 = native.gemm(native.gemm_pack_a(a), m, b2, np.empty((m, n2), F32), bias, res2, act)
    for rows in (32, 24, 20):
        part = native.gemm(native.gemm_pack_a(a[:rows]), rows, b2, np.empty((rows, n2), F32), bias[:rows],
                           res2[:rows], act)
        assert np.array_equal(full2[:rows], part), rows
    # a linear layer: activation rows read in place (and, as a transposed view, packed three panels at a time)
    x = rng.standard_normal((48, 300), dtype=F32)
    w = rng.standard_normal((300, 130), dtype=F32)
    bp = native.gemm_pack_b(w)
    for xv in (x, np.ascontiguousarray(x.T).T):
        y = np.empty((48, 130), F32)
        native.linear(xv, bp, 130, y)
        y40 = np.empty((40, 130), F32)
        native.linear(xv[8:48], bp, 130, y40)
        assert np.array_equal(y[8:48], y40)
        # few rows (up to gemm.c's GEMV_MAX_M, but for those the slices kernel takes) stream the weight panels once
        # for all of them, summing each output in order of k where the micro-kernels' column tail interleaves runs
        # of it: equal to rounding only
        y4 = np.empty((4, 130), F32)
        native.linear(xv[24:28], bp, 130, y4)
        np.testing.assert_allclose(y4, y[24:28], rtol=1e-5, atol=1e-4)


@needs_native
def test_gemm_batched_and_strided_residual() -> None:
    rng = np.random.default_rng(1)
    q, m, k, n = 3, 20, 37, 45
    a = rng.standard_normal((q, m, k), dtype=F32)
    ap = np.stack([native.gemm_pack_a(a[i]) for i in range(q)])
    b = rng.standard_normal((q, k, n), dtype=F32)
    bias = rng.standard_normal((q, m), dtype=F32)
    res = rng.standard_normal((q, n, m), dtype=F32).transpose(0, 2, 1)  # strides differ from C's
    c = np.empty((q, m, n), F32)
    native.gemm(ap, m, b, c, bias, res, ("Relu", ()))
    for i in range(q):
        assert np.allclose(c[i], _ref(a[i], b[i], bias[i], res[i], ("Relu", ())), rtol=1e-4, atol=1e-4)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
def test_a_threads_packed_b_is_reused_only_within_one_call_and_batch_item(threads: int) -> None:
    """A thread keeps the block of B it packed for the next row task of the same call: calls of the same shape
    one after another (same scratch, new B), the same B buffer rewritten between calls, and batch items with
    their own B must each get their own."""
    rng = np.random.default_rng(4)
    m, k, n = 200, 64, 70  # several row tasks a thread, one K block
    a = rng.standard_normal((m, k), dtype=F32)
    ap = native.gemm_pack_a(a)
    old = native.num_threads()
    try:
        native.set_num_threads(threads)
        b = rng.standard_normal((k, n), dtype=F32)
        for _ in range(3):
            b[...] = rng.standard_normal((k, n), dtype=F32)  # same buffer, new values
            c = native.gemm(ap, m, b, np.empty((m, n), F32))
            np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-3)
        q = 3
        apb = np.stack([ap] * q)
        bb = rng.standard_normal((q, k, n), dtype=F32)
        cb = native.gemm(apb, m, bb, np.empty((q, m, n), F32))
        for i in range(q):
            np.testing.assert_allclose(cb[i], a @ bb[i], rtol=1e-4, atol=1e-3)
    finally:
        native.set_num_threads(old)


@needs_native
def test_gemm_rejects_mismatched_shapes() -> None:
    ap = native.gemm_pack_a(np.ones((4, 3), F32))
    with pytest.raises(ValueError, match="do not agree"):
        native.gemm(ap, 4, np.ones((5, 2), F32), np.empty((4, 2), F32))
    with pytest.raises(ValueError, match="residual"):
        native.gemm(ap, 4, np.ones((3, 2), F32), np.empty((4, 2), F32), res=np.ones((4, 3), F32))


@needs_native
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("m,k,n", [(200, 300, 500), (1024, 64, 49), (203, 40, 30), (16, 50, 40), (256, 528, 196),
                                   (250, 90, 330), (1000, 512, 169)])
def test_pool_sizes_give_identical_results(threads: int, m: int, k: int, n: int) -> None:
    """Each output is computed by one task whatever the split, so results are bitwise equal across pool sizes;
    the split streams the fewest operand bytes, rows, columns or both (256x528x196 on two threads: four row
    tasks by two column tasks; rows in units of whole taller tiles, dealt evenly: the last task of an uneven
    split must still cover the last rows and columns). The ragged panel's leftover columns (1000x512x169: 9 after
    160) go through the same extra vector in taller tiles and in 8-row panels, so a split that moves rows from one
    to the other changes no bits."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((m, k), dtype=F32)
    b = rng.standard_normal((k, n), dtype=F32)
    ap = native.gemm_pack_a(a)
    old = native.num_threads()
    try:
        native.set_num_threads(1)
        one = native.gemm(ap, m, b, np.full((m, n), np.nan, F32))
        native.set_num_threads(threads)
        many = native.gemm(ap, m, b, np.full((m, n), np.nan, F32))
    finally:
        native.set_num_threads(old)
    assert np.array_equal(one, many)
    np.testing.assert_allclose(many, a @ b, rtol=1e-4, atol=1e-3)


@needs_native
def test_pool_shared_by_python_threads() -> None:
    """Callers on several threads at once: one gets the pool, the others run inline; all are right."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 128), dtype=F32)
    ap = native.gemm_pack_a(a)
    bs = [rng.standard_normal((128, 300), dtype=F32) for _ in range(6)]
    want = [a @ b for b in bs]
    errors: list[str] = []

    def work(i: int) -> None:
        c = np.empty((64, 300), F32)
        for _ in range(30):
            native.gemm(ap, 64, bs[i], c)
            if not np.allclose(c, want[i], rtol=1e-4, atol=1e-4):
                errors.append(f"thread {i}")
                return

    ts = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors


@needs_native
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_pool_survives_fork() -> None:
    """The workers do not exist in a forked child: its first job must start new ones, not wait forever."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((64, 64), dtype=F32)
    b = rng.standard_normal((64, 4000), dtype=F32)
    ap = native.gemm_pack_a(a)
    native.gemm(ap, 64, b, np.empty((64, 4000), F32))  # workers started in the parent
    pid = os.fork()
    if pid == 0:  # child: exit code says whether the product was right
        try:
            ok = np.allclose(native.gemm(ap, 64, b, np.empty((64, 4000), F32)), a @ b, rtol=1e-4, atol=1e-4)
        finally:
            os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


@needs_native
@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two cores")
def test_a_worker_on_its_callers_core_moves_off_it_and_keeps_its_affinity() -> None:
    """A pool worker that finds itself on its caller's core leaves it (inferd_pool_leave_core, called as it enters a
    job), with its affinity mask as it was; off that core it changes nothing."""
    out: dict[str, object] = {}

    def body() -> None:
        allowed = os.sched_getaffinity(0)
        core = min(allowed)
        os.sched_setaffinity(0, {core})  # now on that core...
        os.sched_setaffinity(0, allowed)  # ...and free to run anywhere again, which does not move it
        out["before"] = os.sched_getaffinity(0) == allowed
        out["moved_to"] = native.lib.inferd_pool_leave_core(core)
        out["after"] = os.sched_getaffinity(0)
        out["allowed"] = allowed
        again = native.lib.inferd_pool_leave_core(core)  # not on `core` any more: nothing to do
        out["stays"] = again != core and os.sched_getaffinity(0) == allowed
        out["core"] = core

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert out["before"]
    assert out["moved_to"] != out["core"] and out["moved_to"] in out["allowed"], out
    assert out["after"] == out["allowed"], out
    assert out["stays"], out


LINEAR_SHAPES = [(197, 192, 576), (1, 1280, 1000), (3, 64, 97), (8, 5, 200), (50, 300, 7), (4, 0, 9), (9, 33, 96),
                 (2, 600, 200), (4, 768, 300), (3, 257, 101), (16, 384, 200), (7, 600, 97), (29, 300, 96),  # few rows,
                 # K in several blocks of 256
                 (17, 40, 48), (24, 1024, 80),
                 # many rows read in place a 16-column slice at a time (gemm.c's gemm_slices on AVX2): a ragged last
                 # group of rows, a ragged last slice, K in three blocks of at most 384
                 (37, 1000, 130), (33, 40, 16), (64, 384, 96),
                 # short last groups of 11 and 2 rows (AVX-512; 5 and 2 on AVX2), a ragged last slice of 6 columns
                 (23, 300, 70), (26, 200, 40)]


@pytest.mark.parametrize("isa_level", _levels(), indirect=True)
@pytest.mark.parametrize("shape", LINEAR_SHAPES, ids=[str(s) for s in LINEAR_SHAPES])
def test_linear_prepacked_b_matches_numpy(isa_level: int, shape) -> None:
    """x @ W with W prepacked in 96-column panels (rows packed per call; <= 4 rows take the streaming path)."""
    rows, k, n = shape
    rng = np.random.default_rng(rows + 7 * k + 13 * n)
    x = rng.standard_normal((rows, k), dtype=F32)
    w = rng.standard_normal((k, n), dtype=F32)
    bp = native.gemm_pack_b(w)
    assert bp.shape == native.gemm_packed_b_shape(k, n)
    assert np.array_equal(native.gemm_unpack_b(bp, n), w)
    bias = rng.standard_normal(n, dtype=F32)
    res = rng.standard_normal((rows, n), dtype=F32)
    for act in ACTS:
        y = np.full((rows, n), np.nan, F32)
        native.linear(x, bp, n, y, bias, res, act)
        want = _ref(x, w, None, res, None) + bias
        if act is not None:
            apply_act(want, act)
        tol = 2e-5 * max(1.0, np.sqrt(k))
        assert np.allclose(y, want, rtol=tol, atol=tol), (shape, act)
    # transposed input view and a strided output: same numbers
    xt = np.ascontiguousarray(x.T).T
    yt = np.full((n, rows), np.nan, F32).T
    native.linear(xt, bp, n, yt)
    assert np.allclose(yt, x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    # rows read in place at a pitch wider than K (a column slice): same numbers as the contiguous rows
    wide = np.full((rows, k + 5), np.nan, F32)
    wide[:, :k] = x
    yw = np.full((rows, n), np.nan, F32)
    native.linear(wide[:, :k], bp, n, yw, bias, res)
    y = np.full((rows, n), np.nan, F32)
    native.linear(x, bp, n, y, bias, res)
    assert np.array_equal(yw, y)


@pytest.mark.parametrize("isa_level", _levels(), indirect=True)
def test_linear_many_rows_same_bits_whatever_the_split(isa_level: int) -> None:
    """A linear layer of more rows than the few-rows path takes: each output sums its products in K blocks decided
    by the call's shape, so 1, 2 or 3 threads and any subset of the rows give the same bits."""
    rng = np.random.default_rng(11)
    rows, k, n = 97, 1000, 200
    x = rng.standard_normal((rows, k), dtype=F32)
    w = rng.standard_normal((k, n), dtype=F32)
    bp = native.gemm_pack_b(w)
    bias = rng.standard_normal(n, dtype=F32)
    old = native.num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            native.set_num_threads(threads)
            y = np.empty((rows, n), F32)
            native.linear(x, bp, n, y, bias, None, ("Relu", ()))
            outs.append(y)
        assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])
        # more than 32 rows never take the few-rows path; from 21 on they do not where the slices kernel exists
        # (gemm.c's SLICES_MIN_M: AVX2 and AVX-512), nor 8 to 12 rows on AVX-512 (one group of its slices kernel).
        # A short last group (fewer rows than the slices kernel's 12 on AVX-512, 6 on AVX2) runs in calls of 8, 4,
        # 2 and 1 rows: 26, 23 and 31 rows leave 2, 11 and 7 on AVX-512 (2, 5 and 1 on AVX2)
        for r0, r1 in ((5, 45), (0, 33), (60, 97)) + (
                ((3, 27), (10, 36), (1, 24), (40, 71)) if isa_level >= 1 else ()) + (
                ((50, 60), (80, 88), (85, 97)) if isa_level >= 2 else ()):
            part = np.empty((r1 - r0, n), F32)
            native.linear(x[r0:r1], bp, n, part, bias, None, ("Relu", ()))
            assert np.array_equal(part, outs[0][r0:r1]), (r0, r1)
    finally:
        native.set_num_threads(old)
    want = np.maximum(x.astype(np.float64) @ w + bias, 0)
    assert np.allclose(outs[0], want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("isa_level", _levels(), indirect=True)
def test_matmul_of_two_activations(isa_level: int) -> None:
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 197, 64), dtype=F32)
    b = rng.standard_normal((3, 197, 64), dtype=F32).transpose(0, 2, 1)  # a K^T view, not contiguous
    c = np.empty((3, 197, 197), F32)
    native.matmul(a, b, c)
    assert np.allclose(c, np.matmul(a.astype(np.float64), b), rtol=1e-4, atol=1e-4)
    a1 = rng.standard_normal((1, 5, 7), dtype=F32)
    b1 = rng.standard_normal((1, 7, 3), dtype=F32)
    assert np.allclose(native.matmul(a1, b1, np.empty((1, 5, 3), F32)), a1 @ b1, atol=1e-5)
    with pytest.raises(ValueError, match="do not agree"):
        native.matmul(a, b, np.empty((3, 197, 196), F32))


@needs_native
@pytest.mark.parametrize("rows_n", [(1, 1), (600, 197), (7, 1000), (64, 3)])
def test_native_softmax_and_layernorm_rows(rows_n) -> None:
    rows, n = rows_n
    rng = np.random.default_rng(rows * n)
    x = (rng.standard_normal((rows, n)) * 5).astype(F32)
    y = np.empty_like(x)
    native.lib.inferd_softmax(native._ptr(x), native._ptr(y), rows, n, 0)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    sm = e / e.sum(axis=1, keepdims=True)
    assert np.allclose(y, sm, rtol=1e-5, atol=1e-7)
    native.lib.inferd_softmax(native._ptr(x), native._ptr(y), rows, n, 1)
    assert np.allclose(y, np.log(sm), rtol=1e-5, atol=1e-5)
    g, b = rng.standard_normal(n, dtype=F32), rng.standard_normal(n, dtype=F32)
    native.lib.inferd_layernorm(native._ptr(x), native._ptr(y), rows, n, native._ptr(g), native._ptr(b), 1e-5)
    x64 = x.astype(np.float64)
    ln = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5) * g + b
    assert np.allclose(y, ln, rtol=1e-4, atol=1e-4)
    # a row holding +inf or NaN gives what the formula gives (NaN), not a wrong finite number
    x[0, 0] = np.inf
    native.lib.inferd_softmax(native._ptr(x), native._ptr(y), rows, n, 0)
    assert np.isnan(y[0]).any()


@pytest.mark.parametrize("isa_level", _levels(), indirect=True)
@pytest.mark.parametrize("shape", [(1, 160, 960, 49), (2, 13, 7, 5), (16, 64, 64, 16), (1, 8, 3, 1), (3, 100, 50, 63)],
                         ids=str)
def test_gemm_weights_in_either_form(isa_level: int, shape) -> None:
    """pack_weights' A form (8-row panels) and B form (W^T in 96-column panels, for few columns) give the same
    product, through gemm() and through a bound call."""
    g, m, k, n = shape
    rng = np.random.default_rng(m + k + n)
    w = rng.standard_normal((g, m, k), dtype=F32)
    b = rng.standard_normal((g, k, n), dtype=F32)
    bias = rng.standard_normal((g, m), dtype=F32)
    r = rng.standard_normal((g, m, n), dtype=F32)
    ref = np.maximum(np.matmul(w.astype(np.float64), b) + bias[..., None] + r, 0)
    forms = {}
    for ncols in (1, 1 << 30):
        wp = native.pack_weights(w, ncols)
        forms[wp.shape[-1]] = wp
        c = native.gemm(wp, m, b, np.empty((g, m, n), F32), bias, r, ("Relu", ()))
        assert np.allclose(c, ref, rtol=1e-4, atol=1e-3), (shape, wp.shape)
        assert wp.nbytes == native.packed_weights_nbytes(g, m, k, ncols)
        call = native.gemm_bound(wp, m, b, c, bias, r, native.NATIVE_ACTS["Relu"], 0.0, 0.0)
        if native.AVAILABLE:
            c[...] = 0
            call()
            assert np.allclose(c, ref, rtol=1e-4, atol=1e-3)
    assert set(forms) == {native.GEMM_MR, native.GEMM_NBP}


def test_numpy_fallbacks_match(monkeypatch) -> None:
    """Without the extension (a stale or missing build) gemm, linear, matmul and both packings give the same
    numbers through numpy, strided and batched views included."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((2, 20, 30), dtype=F32)
    b = rng.standard_normal((2, 30, 9), dtype=F32)
    bias = rng.standard_normal((2, 20), dtype=F32)
    r = rng.standard_normal((2, 20, 9), dtype=F32)
    act = ("HardSwish", ())
    want = np.matmul(w.astype(np.float64), b) + bias[..., None] + r
    apply_act(want, act)
    packed = [native.pack_weights(w, ncols) for ncols in (1, 1 << 30)]
    x = rng.standard_normal((7, 30), dtype=F32)
    wl = rng.standard_normal((30, 11), dtype=F32)
    bl = native.gemm_pack_b(wl)
    monkeypatch.setattr(native, "AVAILABLE", False)
    for wp in packed:
        c = np.full((2, 9, 20), np.nan, F32).transpose(0, 2, 1)  # a transposed output view
        native.gemm(wp, 20, b, c, bias, r, act)
        assert np.allclose(c, want, rtol=1e-4, atol=1e-4)
    assert np.allclose(native.gemm_pack_b(wl), bl) and np.allclose(native.gemm_unpack_b(bl, 11), wl)
    y = np.empty((11, 7), F32).T
    native.linear(x, bl, 11, y, None, None, ("Relu", ()))
    assert np.allclose(y, np.maximum(x @ wl, 0), rtol=1e-5, atol=1e-5)
    c3 = np.empty((2, 20, 9), F32)
    assert np.allclose(native.matmul(w, b, c3), np.matmul(w, b), rtol=1e-5, atol=1e-5)


def test_daemon_threads_setting_sizes_the_native_pool() -> None:
    from inferd.server.daemon import apply_threads

    old = native.num_threads()
    try:
        apply_threads(3)
        assert native.num_threads() == 3
        if native.AVAILABLE:
            assert native.lib.inferd_pool_threads() == 3
        apply_threads(0)  # 0 keeps what is there
        assert native.num_threads() == 3
    finally:
        native.set_num_threads(old)


@needs_native
def test_fma_peak_bounds_the_gemm() -> None:
    """The measured FMA peak is the roofline's ceiling: the packed GEMM at its best shape must not beat it
    (a peak measured too low, or a chain the compiler folded away, would show here)."""
    import time

    n = 384
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
    ap = native.gemm_pack_a(a)
    c = np.empty((n, n), np.float32)
    old = native.num_threads()
    try:
        native.set_num_threads(1)
        native.gemm(ap, n, b, c)
        # the best of several, taken in turns: another process on the core lowers a measurement, nothing
        # raises one, and alternating gives both the same chances of a quiet moment on a shared machine
        peak, best = 0.0, float("inf")
        for _ in range(7):
            peak = max(peak, native.fma_peak(1))
            best = min(best, _timed(lambda: native.gemm(ap, n, b, c), time))
    finally:
        native.set_num_threads(old)
    assert 1e8 < peak < 1e13
    assert 2.0 * n ** 3 / best <= 1.25 * peak, (2.0 * n ** 3 / best / 1e9, peak / 1e9)


def _timed(fn, time) -> float:  # noqa: ANN001
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


@pytest.mark.parametrize("isa_level", _levels(), indirect=True)
@pytest.mark.parametrize("shape", [(5, 3, 2, 2, 7, 9, 2, 1), (37, 20, 3, 3, 13, 11, 1, 2), (64, 130, 3, 3, 7, 7, 1, 1),
                                   (9, 8, 1, 1, 1, 1, 1, 1), (24, 300, 1, 3, 9, 49, 2, 1)], ids=str)
def test_gemm_koff_matches_numpy(isa_level: int, shape) -> None:
    """The implicit-im2col GEMM (B gathered through row and column offset tables) against numpy, with bias, residual
    and activation, on each micro-kernel level (ragged last panels, K blocks, strided columns)."""
    m, cin, kh, kw, oh, ow, sh, sw = shape
    hp, wp = (oh - 1) * sh + kh + 1, (ow - 1) * sw + kw
    rng = np.random.default_rng(m + cin + oh)
    xp = rng.standard_normal(cin * hp * wp, dtype=F32)
    a = rng.standard_normal((m, cin * kh * kw), dtype=F32)
    bias = rng.standard_normal(m, dtype=F32)
    res = rng.standard_normal((m, oh * ow), dtype=F32)
    boff = (np.arange(cin)[:, None, None] * hp * wp + np.arange(kh)[None, :, None] * wp
            + np.arange(kw)[None, None, :]).reshape(-1).astype(np.int64)
    coff = (np.arange(oh)[:, None] * sh * wp + np.arange(ow)[None, :] * sw).reshape(-1).astype(np.int64)
    ap = native.gemm_pack_a(a)
    col = xp[boff[:, None] + coff[None, :]]
    for act in (None, ("Relu", ()), ("HardSwish", ())):
        for use_res in (False, True):
            c = np.full((m, oh * ow), np.nan, F32)
            native.gemm_koff(ap, m, xp, boff, coff, c, bias, res if use_res else None, act)
            want = _ref(a, col, bias, res if use_res else None, act)
            tol = 2e-5 * max(1.0, np.sqrt(cin * kh * kw))
            assert np.allclose(c, want, rtol=tol, atol=tol), (shape, act, use_res)


def test_gemm_koff_rejects_offsets_outside_the_input() -> None:
    ap = native.gemm_pack_a(np.ones((2, 3), F32))
    x = np.ones(10, F32)
    with pytest.raises(ValueError, match="outside"):
        native.gemm_koff(ap, 2, x, np.array([0, 1, 9], np.int64), np.array([0, 1], np.int64), np.empty((2, 2), F32))
    with pytest.raises(ValueError, match="int64"):
        native.gemm_koff(ap, 2, x, np.array([0, 1, 2], np.int32), np.array([0, 1], np.int64), np.empty((2, 2), F32))


def test_gemm_koff_numpy_fallback(monkeypatch) -> None:
    """Without the native library gemm_koff computes the same product (its numpy twin)."""
    rng = np.random.default_rng(5)
    a, x = rng.standard_normal((11, 6), dtype=F32), rng.standard_normal(40, dtype=F32)
    boff, coff = np.array([0, 3, 5, 8, 13, 21], np.int64), np.array([0, 2, 4, 7, 11], np.int64)
    bias = rng.standard_normal(11, dtype=F32)
    ap = native.gemm_pack_a(a)
    fast = native.gemm_koff(ap, 11, x, boff, coff, np.empty((11, 5), F32), bias, None, ("Relu", ()))
    monkeypatch.setattr(native, "AVAILABLE", False)
    slow = native.gemm_koff(ap, 11, x, boff, coff, np.empty((11, 5), F32), bias, None, ("Relu", ()))
    want = np.maximum(a.astype(np.float64) @ x[boff[:, None] + coff[None, :]] + bias[:, None], 0)
    assert np.allclose(fast, want, atol=1e-5) and np.allclose(slow, want, atol=1e-5)
