"""Runs of bound native calls as one C call (native/steps.c, ``native.fuse_calls``): each entry point's argument
letters against its cffi prototype, fused runs against the same calls one by one (bit for bit, on whole models
too), the order kept around calls from Python, a retargeted input, and a failing step handed back to Python."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from inferd import native
from inferd.ops.conv_nchwc import pack_weights
from zoo_fixture import zoo_path

pytestmark = pytest.mark.skipif(not native.has("inferd_steps_run"), reason="native build without steps.c")

rng = np.random.default_rng(7)

#: every entry point the runner knows (native/steps.c's table)
KINDS = ["inferd_nchwc_conv", "inferd_nchwc_conv_ch", "inferd_nchwc_conv_nchw", "inferd_nchwc_conv_dilated",
         "inferd_nchwc_conv_grouped", "inferd_nchwc_dwconv", "inferd_nchwc_maxpool", "inferd_nchwc_reorder",
         "inferd_nchwc_gap", "inferd_nchwc_scale", "inferd_nchwc_scale_act", "inferd_gemm_ex",
         "inferd_strided_copy", "inferd_dwconv2d", "inferd_dwconv2d_direct", "inferd_bias_act", "inferd_layernorm",
         "inferd_softmax"]


def _letter(t: Any) -> str:
    if t.kind == "pointer":
        return "p"
    return {"int": "i", "long long": "l", "float": "f"}[t.cname]


@pytest.mark.parametrize("name", KINDS)
def test_kind_letters_match_the_prototype(name: str) -> None:
    ks = native._step_kind(name)
    assert ks is not None, name
    want = "".join(_letter(t) for t in native.ffi.typeof(getattr(native.lib, name)).args)
    assert ks[1] == want


def test_unknown_kind_and_short_steps() -> None:
    assert native._step_kind("inferd_no_such_kernel") is None
    assert native.lib.inferd_steps_kind(b"inferd_no_such_kernel", native.ffi.NULL) == -1
    y = np.array([-1.0, 2.0, -3.0, 4.0], np.float32)
    good = native.act_bound(y, ("Relu", ()))
    assert good is not None and len(good.steps) == 1
    st = good.steps[0]
    arr = native.ffi.new("inferd_step[]", 2)
    arr[0].kind, arr[0].nargs, arr[0].a = st.kind, len(st.sig), st.args
    arr[1].kind, arr[1].nargs, arr[1].a = st.kind, len(st.sig) - 1, st.args  # one argument short: not run
    assert native.lib.inferd_steps_run(arr, 2) == 1
    np.testing.assert_array_equal(y, [0, 2, 0, 4])
    arr[1].kind, arr[1].nargs = 999, len(st.sig)
    assert native.lib.inferd_steps_run(arr, 2) == 1
    # a value of the wrong kind for a pointer slot cannot be written
    with pytest.raises(ValueError):
        st.set_ptr(1, native.ffi.NULL)


def _conv_chain(n: int = 1) -> tuple[list[Callable[[], None]], list[np.ndarray], np.ndarray]:
    """x -> 3x3 conv (relu) -> depthwise 3x3 (+ the first's output) -> 1x1 conv -> global mean, all blocked."""
    x = rng.standard_normal((n, 2, 9, 9, 16)).astype(np.float32)
    w1 = pack_weights(rng.standard_normal((32, 32, 3, 3)).astype(np.float32) * 0.1, False, False)
    wd = pack_weights(rng.standard_normal((32, 1, 3, 3)).astype(np.float32), True, False)
    w2 = pack_weights(rng.standard_normal((48, 32, 1, 1)).astype(np.float32) * 0.1, False, False)
    b1 = rng.standard_normal(32).astype(np.float32)
    y1 = np.zeros((n, 2, 9, 9, 16), np.float32)
    y2 = np.zeros_like(y1)
    y3 = np.zeros((n, 3, 9, 9, 16), np.float32)
    g = np.zeros((n, 48, 1, 1), np.float32)
    calls = [native.nchwc_conv_bound(x, w1, b1, None, y1, 3, 3, 1, 1, 1, 1, 1, 0.0, 0.0),
             native.nchwc_conv_bound(y1, wd, None, y1, y2, 3, 3, 1, 1, 1, 1, 0, 0.0, 0.0, depthwise=True),
             native.nchwc_conv_bound(y2, w2, None, None, y3, 1, 1, 1, 1, 0, 0, 0, 0.0, 0.0),
             native.nchwc_gap_bound(y3, g)]
    assert all(c is not None and len(c.steps) == n for c in calls[:3])
    return calls, [y1, y2, y3, g], x


def _reference(calls: list[Callable[[], None]], outs: list[np.ndarray]) -> list[np.ndarray]:
    """The outputs of ``calls`` run one by one from Python; ``outs`` then set to NaN for the run under test."""
    for c in calls:
        c()
    want = [o.copy() for o in outs]
    for o in outs:
        o[...] = np.nan
    return want


@pytest.mark.parametrize("n", [1, 2])
def test_fused_run_equals_the_calls(n: int) -> None:
    calls, outs, _x = _conv_chain(n)
    want = _reference(calls, outs)
    fused = native.fuse_calls(calls)
    assert len(fused) == 1 and fused[0].fused == calls
    fused[0]()
    for o, w in zip(outs, want):
        np.testing.assert_array_equal(o, w)


def test_python_calls_keep_their_place() -> None:
    y = np.array([1.0, -2.0, 3.0, -4.0], np.float32)
    relu = [native.act_bound(y, ("Relu", ())) for _ in range(4)]
    order: list[str] = []

    def flip() -> None:
        order.append("flip")
        np.negative(y, out=y)

    from inferd.ops.tensor import _nothing
    calls = [relu[0], _nothing, relu[1], flip, relu[2], relu[3], _nothing]
    fused = native.fuse_calls(calls)
    assert len(fused) == 3 and fused[1] is flip  # relu, relu | flip | relu, relu; the no-ops dropped
    for c in fused:
        c()
    # relu [1, 0, 3, 0] -> flip [-1, 0, -3, 0] -> relu: all zero (a run moved across the flip would not be)
    np.testing.assert_array_equal(y, [0, 0, 0, 0])
    assert order == ["flip"]
    # a lone native call between Python calls stays the call it was
    lone = native.fuse_calls([flip, relu[0], flip])
    assert lone[1] is relu[0]


def test_retarget_reaches_the_fused_steps() -> None:
    calls, outs, x = _conv_chain()
    fused = native.fuse_calls(calls)
    other = np.ascontiguousarray(rng.standard_normal(x.shape).astype(np.float32))
    calls[0].retarget(other)
    fused[0]()
    got = [o.copy() for o in outs]
    x[...] = other  # the same input through the original array: the calls as bound at first
    calls[0].retarget(x)
    for c in calls:
        c()
    for g, w in zip(got, outs):
        np.testing.assert_array_equal(g, w)


def test_a_failing_step_goes_back_to_python() -> None:
    calls, outs, _x = _conv_chain()
    want = _reference(calls, outs)
    fused = native.fuse_calls(calls)
    calls[1].steps[0].args[1].i = 0  # the depthwise step's block count: the C side refuses it
    fused[0]()  # that call and the ones after it run from Python, whose arguments are whole
    for o, w in zip(outs, want):
        np.testing.assert_array_equal(o, w)
    # where the Python call fails too, its own error comes out
    g = np.zeros((1, 48, 1, 1), np.float32)
    gap = native.nchwc_gap_bound(outs[2], g)
    assert gap is not None
    gap.steps[0].args[1].i = -1  # no images: the C side refuses it

    def failing() -> None:  # (its Python call, given the same bad count)
        raise ValueError("nchwc_gap: bad arguments")
    failing.steps = gap.steps  # type: ignore[attr-defined]
    broken = native.fuse_calls([calls[0], failing])
    assert len(broken) == 1
    with pytest.raises(ValueError, match="nchwc_gap"):
        broken[0]()


def test_models_fused_and_not_agree() -> None:
    import inferd
    from inferd.runtime.cpu import CpuExecutor
    outs = {}
    for fuse in (False, True):
        CpuExecutor.fuse_steps = fuse
        try:
            m = inferd.load(str(zoo_path("squeezenet1_1")), device="cpu")
            x = np.random.default_rng(3).random((1, 3, 224, 224), np.float32)
            m.run({m.inputs[0].name: x})
            m.wait_warm(60)
            ex = m._exec
            n_calls, n_steps = len(ex._calls), len(ex._step_calls)
            outs[fuse] = {k: v.copy() for k, v in m.run({m.inputs[0].name: x}).items()}
        finally:
            CpuExecutor.fuse_steps = True
        if fuse:
            assert n_calls < n_steps // 4  # the whole net, bar a few Python steps, as one or a few C calls
        else:
            assert n_calls == n_steps
    for k in outs[False]:
        np.testing.assert_array_equal(outs[True][k], outs[False][k])
