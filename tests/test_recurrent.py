"""LSTM, GRU and RNN over their attribute space: the numpy oracle and the packed CPU kernel against
onnxruntime (layout=1, which onnxruntime refuses, against onnxruntime on the same problem transposed to
layout 0), and the native step loop against its numpy twin."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferd.ops import kernels_for, run_layer, single_node_layer

sys.path.insert(0, str(Path(__file__).parent))
from ortutil import make_single_node_model, run_ort  # noqa: E402

TOL = 1e-4
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
NOUT = {"LSTM": 3, "GRU": 2, "RNN": 2}


def _problem(op: str, seq: int, batch: int, isz: int, h: int, dirs: int, seed: int, *, bias: bool = True,
             lens: bool = False, init: bool = False, peep: bool = False) -> list[np.ndarray | None]:
    rng = np.random.default_rng(seed)
    g = GATES[op]
    f = lambda *s: (rng.standard_normal(s) * 0.5).astype(np.float32)  # noqa: E731
    ins: list[np.ndarray | None] = [f(seq, batch, isz), f(dirs, g * h, isz), f(dirs, g * h, h)]
    ins.append(f(dirs, 2 * g * h) if bias else None)
    ins.append(rng.integers(1, seq + 1, batch).astype(np.int32) if lens else None)
    ins.append(f(dirs, batch, h) if init else None)
    if op == "LSTM":
        ins.append(f(dirs, batch, h) if init else None)
        ins.append(f(dirs, 3 * h) if peep else None)
    while ins and ins[-1] is None:
        ins.pop()
    return ins


def _to_layout1(ins: list[np.ndarray | None]) -> list[np.ndarray | None]:
    out = list(ins)
    out[0] = np.ascontiguousarray(ins[0].transpose(1, 0, 2))  # type: ignore[union-attr]
    for k in (5, 6):
        if k < len(out) and out[k] is not None:
            out[k] = np.ascontiguousarray(out[k].transpose(1, 0, 2))  # type: ignore[union-attr]
    return out


def _ort_layout1(res: list[np.ndarray]) -> list[np.ndarray]:
    return [np.ascontiguousarray(res[0].transpose(2, 0, 1, 3))] + [np.ascontiguousarray(r.transpose(1, 0, 2)) for r in res[1:]]


def _check_all_kernels(op: str, ins: list[np.ndarray | None], attrs: dict[str, Any], want: list[np.ndarray],
                       const_states: bool = False) -> None:
    # weights (W, R, B, P) are initializers in exported models; X, lengths and states run-time inputs
    const = [k in (1, 2, 3, 7) or (const_states and k in (4, 5, 6)) for k in range(len(ins))]
    layer = single_node_layer(op, ins, {**attrs, "_opset": 14}, const=const, n_outputs=NOUT[op])
    for o, w in zip(layer.outputs, want):
        assert tuple(o.shape) == w.shape, (o.shape, w.shape)
    names = set()
    for k in kernels_for(op, "cpu"):
        if not k.applies(layer):
            continue
        names.add(k.name)
        got = run_layer(k, layer, ins)
        for i, (g, w) in enumerate(zip(got, want)):
            err = float(np.abs(g - w).max()) / max(1.0, float(np.abs(w).max()))
            assert err < TOL, f"{k.name} output {i}: relative error {err}"
    assert {"reference", "rnn_packed"} <= names


CASES = [
    # op, direction, extra attrs, problem options
    ("LSTM", "forward", {}, {}),
    ("LSTM", "reverse", {}, {"lens": True, "init": True}),
    ("LSTM", "bidirectional", {}, {"lens": True, "init": True, "peep": True}),
    ("LSTM", "forward", {"input_forget": 1, "clip": 0.7}, {"peep": True, "init": True}),
    ("LSTM", "bidirectional", {"activations": ["HardSigmoid", "Tanh", "Relu", "Sigmoid", "Softsign", "Tanh"],
                               "activation_alpha": [0.3, 0.2], "activation_beta": [0.4, 0.6]}, {"bias": False}),
    ("GRU", "forward", {"linear_before_reset": 1}, {"init": True}),
    ("GRU", "reverse", {"linear_before_reset": 0}, {"lens": True}),
    ("GRU", "bidirectional", {"linear_before_reset": 1, "clip": 0.5}, {"lens": True, "init": True}),
    ("GRU", "bidirectional", {"activations": ["Sigmoid", "LeakyRelu", "HardSigmoid", "Tanh"],
                              "activation_alpha": [0.05, 0.25], "activation_beta": [0.45]}, {}),
    ("RNN", "forward", {}, {"init": True}),
    ("RNN", "bidirectional", {"activations": ["Relu", "Tanh"], "clip": 1.5}, {"lens": True, "init": True}),
    ("RNN", "reverse", {"activations": ["Affine"], "activation_alpha": [0.8], "activation_beta": [0.1]}, {"lens": True}),
]


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("op,direction,extra,opts", CASES)
def test_recurrent_vs_onnxruntime(op: str, direction: str, extra: dict, opts: dict, layout: int) -> None:
    dirs = 2 if direction == "bidirectional" else 1
    h = 5
    ins = _problem(op, 6, 3, 4, h, dirs, seed=len(op) * 7 + dirs + layout, **opts)
    attrs = {"hidden_size": h, "direction": direction, **extra}
    model = make_single_node_model(op, ins, attrs, opset=14, const_mask=[k in (1, 2, 3, 7) for k in range(len(ins))],
                                   n_outputs=NOUT[op])
    feeds = {f"x{k}": a for k, a in enumerate(ins) if a is not None and k not in (1, 2, 3, 7)}
    want = run_ort(model, feeds)
    if layout == 1:
        ins, want = _to_layout1(ins), _ort_layout1(want)
    _check_all_kernels(op, ins, {**attrs, "layout": layout}, want)
    if opts.get("init"):  # states given as constants (a model with its initial state baked in)
        _check_all_kernels(op, ins, {**attrs, "layout": layout}, want, const_states=True)


def test_longer_sequence_and_hidden() -> None:
    """A size where the native GEMM and the vectorised step loop both do real work."""
    ins = _problem("LSTM", 40, 2, 48, 64, 2, seed=5, lens=True, init=True)
    attrs = {"hidden_size": 64, "direction": "bidirectional"}
    model = make_single_node_model("LSTM", ins, attrs, opset=14, const_mask=[k in (1, 2, 3) for k in range(len(ins))],
                                   n_outputs=3)
    want = run_ort(model, {f"x{k}": a for k, a in enumerate(ins) if a is not None and k not in (1, 2, 3)})
    _check_all_kernels("LSTM", ins, attrs, want)


def test_absent_outputs_and_only_state() -> None:
    """An exporter that keeps only Y_h (Y absent): the kernels write the outputs that exist."""
    ins = _problem("GRU", 5, 2, 3, 4, 1, seed=9, init=True)
    attrs = {"hidden_size": 4}
    model = make_single_node_model("GRU", ins, attrs, opset=14, const_mask=[k in (1, 2, 3) for k in range(len(ins))],
                                   n_outputs=2)
    want = run_ort(model, {"x0": ins[0], "x5": ins[5]})
    from inferd.ir import Node
    layer = single_node_layer("GRU", ins, {**attrs, "_opset": 14}, const=[k in (1, 2, 3) for k in range(len(ins))],
                              n_outputs=2)
    node = layer.node
    node.outputs = ["", "y1"]
    from dataclasses import replace
    layer = replace(layer, outputs=layer.outputs[1:])
    for k in kernels_for("GRU", "cpu"):
        got = run_layer(k, layer, ins)
        assert len(got) == 1 and np.abs(got[0] - want[1]).max() < TOL, k.name
    assert isinstance(node, Node)


@pytest.mark.parametrize("h", [9, 72])  # 72: the 64-column register blocks, then 8-wide and scalar tails
@pytest.mark.parametrize("kind", [0, 1, 2])
def test_native_steps_match_numpy(kind: int, h: int) -> None:
    from inferd import native

    if not native.AVAILABLE:
        pytest.skip("native kernels not built")
    rng = np.random.default_rng(kind)
    g = {0: 1, 1: 3, 2: 4}[kind]
    seq, batch = 7, 3
    xw = rng.standard_normal((seq, batch, 2 * g * h)).astype(np.float32)[:, :, g * h:]  # strided, as in the kernel
    rt = rng.standard_normal((h, g * h)).astype(np.float32) * 0.3
    rb = rng.standard_normal(g * h).astype(np.float32)
    peep = rng.standard_normal(3 * h).astype(np.float32) if kind == 2 else None
    lens = np.array([7, 3, 5], np.int32)
    acts = np.array([7, 6, 9], np.int32)  # HardSigmoid, ScaledTanh, Softsign
    al, be = np.array([0.2, 0.7, 0], np.float32), np.array([0.5, 1.3, 0], np.float32)
    h0 = rng.standard_normal((batch, h)).astype(np.float32)
    outs = []
    for fn in (native.numpy_rnn_dir, native.rnn_dir):
        hs, cs = h0.copy(), np.ones((batch, h), np.float32)
        y = np.zeros((seq, batch, h), np.float32)
        args = (kind, seq, batch, h, xw, rt, rb, peep, lens, 1, hs, cs, y, acts, al, be, 0.9, 0, 1)
        if fn is native.rnn_dir:
            fn(*args, np.empty((g + 2) * h, np.float32))
        else:
            fn(*args)
        outs.append((hs, cs, y))
    for a, b in zip(outs[0], outs[1]):
        assert np.abs(a - b).max() < 1e-5


@pytest.mark.parametrize("kind", [1, 2])
def test_native_bidir_matches_two_directions(kind: int) -> None:
    """inferd_rnn_bidir (both directions as one pool job) gives what inferd_rnn_dir gives per direction, Y strided
    as the kernel's (seq, dirs, batch, H) view of it and item lengths shorter than the sequence."""
    from inferd import native

    if not native.AVAILABLE:
        pytest.skip("native kernels not built")
    rng = np.random.default_rng(10 + kind)
    g = {1: 3, 2: 4}[kind]
    seq, batch, h = 6, 2, 20
    gh = g * h
    xw = rng.standard_normal((seq, batch, 2 * gh)).astype(np.float32)
    rt = (rng.standard_normal((2, h, gh)) * 0.3).astype(np.float32)
    rb = rng.standard_normal((2, gh)).astype(np.float32)
    peep = rng.standard_normal((2, 3 * h)).astype(np.float32) if kind == 2 else None
    lens = np.array([6, 4], np.int32)
    acts = np.array([[0, 1, 1], [7, 6, 9]], np.int32)
    al = np.array([[0, 0, 0], [0.2, 0.7, 0]], np.float32)
    be = np.array([[0, 0, 0], [0.5, 1.3, 0]], np.float32)
    h0 = rng.standard_normal((2, batch, h)).astype(np.float32)
    res = []
    for joint in (False, True):
        hs, cs = h0.copy(), np.full((2, batch, h), 0.5, np.float32)
        y = np.zeros((seq, 2, batch, h), np.float32)
        ws = np.empty(2 * (g + 2) * h, np.float32)
        if joint:
            call = native.rnn_bidir_bound(kind, seq, batch, h, xw, rt, rb, peep, lens, hs, cs, y, acts, al, be, 0.0, 0,
                                          1, ws)
            assert call is not None
            call()
        else:
            for d in range(2):
                native.rnn_dir(kind, seq, batch, h, xw[:, :, d * gh:(d + 1) * gh], rt[d], rb[d],
                               None if peep is None else peep[d], lens, d, hs[d], cs[d], y[:, d], acts[d], al[d],
                               be[d], 0.0, 0, 1, ws[:(g + 2) * h])
        res.append((hs, cs, y))
    for a, b in zip(*res):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------------------------- Vulkan (lavapipe)

@pytest.fixture(scope="module")
def vk_device(tmp_path_factory: pytest.TempPathFactory):
    import inferd.vulkan

    if not inferd.vulkan.available():
        pytest.skip("no Vulkan device")
    from inferd.vulkan.device import VulkanConfig, VulkanDevice

    tmp = tmp_path_factory.mktemp("vkrnn")
    dev = VulkanDevice(VulkanConfig(debug=True, cache_dir=str(tmp / "cache")))
    yield dev
    errors = dev.validation_errors
    dev.close()
    assert not errors, errors[:5]


VK_CASES = [CASES[k] for k in (1, 2, 3, 4, 6, 7, 8, 10, 11)]


@pytest.mark.vulkan
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("op,direction,extra,opts", VK_CASES)
def test_recurrent_vulkan_vs_onnxruntime(vk_device: Any, op: str, direction: str, extra: dict, opts: dict,
                                         layout: int) -> None:
    """The one-shader Vulkan kernel over the same attribute space, against onnxruntime (lengths as constants:
    the kernel lays them out at load, as exporters write them when they write them at all)."""
    from inferd.vulkan.testing import rel_err, run_single

    dirs = 2 if direction == "bidirectional" else 1
    h = 5
    ins = _problem(op, 6, 3, 4, h, dirs, seed=len(op) * 11 + dirs + layout, **opts)
    attrs = {"hidden_size": h, "direction": direction, **extra}
    const = [k in (1, 2, 3, 4, 7) for k in range(len(ins))]
    model = make_single_node_model(op, ins, attrs, opset=14, const_mask=const, n_outputs=NOUT[op])
    want = run_ort(model, {f"x{k}": a for k, a in enumerate(ins) if a is not None and not const[k]})
    if layout == 1:
        ins, want = _to_layout1(ins), _ort_layout1(want)
    got, _ref, stats = run_single(vk_device, op, ins, {**attrs, "layout": layout, "_opset": 14}, const=const,
                                  n_outputs=NOUT[op])
    assert "vk_rnn" in stats["kernels"].values()
    for i, (g, w) in enumerate(zip(got, want)):
        assert rel_err(g, w) < 1e-4, f"output {i}"
