"""Recurrent zoo models, written the way torch.onnx.export writes them (LSTM/GRU weights already in ONNX gate
order as initializers, states as explicit inputs and outputs, TorchScript ``if``s as ``If`` nodes whose bodies
read the enclosing graph's tensors and weights).

* ``vad_lstm``: a voice-activity detector shaped like the public one: 512 audio samples, an int64 scalar
  sample rate and a (2, 1, 64) LSTM state (h and c stacked) in; a speech probability (1, 1) and the new state
  out. A shape-dependent ``If`` (``if x.dim() == 1: x = x.unsqueeze(0)``) around the input, then a
  value-dependent ``If`` on ``sr == 16000`` choosing the 16 kHz or the 8 kHz front end (a Conv1d as the STFT,
  magnitude, a small strided conv encoder); each front end holds a nested shape-dependent ``If`` (crop to the
  last 512 samples); the LSTM decoder (with the state) is shared: both branches read its weights from outside.
* ``crnn_lstm``: a CRNN text recogniser over a line of any width (1, 1, 32, W): conv stem pooling the height
  to 1, a bidirectional LSTM over the W/4 columns, a per-step classifier and LogSoftmax over 37 symbols,
  time-major (T, 1, 37) as CTC wants it.
* ``kws_gru``: a keyword spotter: 49 frames of 40 features and a (1, 1, 64) GRU state in (torch's GRU export:
  ``linear_before_reset=1``), 12 class probabilities from the last step and the new state out.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from onnx import TensorProto, helper

from ._graph import GraphBuilder

VAD_HIDDEN = 64
CRNN_HIDDEN, CRNN_SYMBOLS = 96, 37
KWS_HIDDEN, KWS_FEATS, KWS_FRAMES, KWS_CLASSES = 64, 40, 49, 12


def _i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def _body(g: GraphBuilder, name: str, fn: Callable[[], Sequence[str]]) -> object:
    """A subgraph (If branch) built by ``fn`` with ``g``'s helpers: its nodes go into the body, its weights into
    the enclosing model's initializers (torch writes them there too), read from the body by name."""
    saved, g.nodes = g.nodes, []
    try:
        outs = list(fn())
        body_nodes = g.nodes
    finally:
        g.nodes = saved
    # a body output must be produced inside it: pass-through names get an Identity, as torch writes them
    produced = {o for n in body_nodes for o in n.output}
    final = []
    for o in outs:
        if o not in produced:
            ident = f"{name}/Identity_{len(final)}_output_0"
            body_nodes.append(helper.make_node("Identity", [o], [ident], name=f"{name}/Identity_{len(final)}"))
            o = ident
        final.append(o)
    return helper.make_graph(body_nodes, name, [], [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                     for o in final])


def _if(g: GraphBuilder, cond: str, then: Callable[[], Sequence[str]], other: Callable[[], Sequence[str]],
        scope: str, n_out: int) -> list[str]:
    name = f"/{scope}/If"
    t = _body(g, f"{name}_then", then)
    e = _body(g, f"{name}_else", other)
    return g.node("If", [cond], scope, n_out, then_branch=t, else_branch=e)


def _conv1d(g: GraphBuilder, x: str, name: str, cin: int, cout: int, k: int, stride: int = 1, pad: int = 0,
            bias: bool = True, gain: float = 2.0) -> str:
    w = g.add_init(f"{name}.weight", g.fan_in_weight((cout, cin, k), (1, 2), gain, cin * k))
    ins = [x, w]
    if bias:
        ins.append(g.add_init(f"{name}.bias", g.normal((cout,), 0.05)))
    return g.op("Conv", ins, name, dilations=[1], group=1, kernel_shape=[k], pads=[pad, pad], strides=[stride])


def _rnn_weights(g: GraphBuilder, name: str, gates: int, fin: int, h: int, dirs: int) -> tuple[str, str, str]:
    """W (dirs, G*H, in), R (dirs, G*H, H), B (dirs, 2*G*H): torch's weight_ih/weight_hh/bias_ih+bias_hh, uniform
    in +-1/sqrt(H) as torch initialises them (named as parameters: they count as trainable)."""
    s = 1.0 / np.sqrt(h)
    w = g.add_init(f"{name}.weight_ih", g.uniform((dirs, gates * h, fin), -s, s))
    r = g.add_init(f"{name}.weight_hh", g.uniform((dirs, gates * h, h), -s, s))
    b = g.add_init(f"{name}.bias", g.uniform((dirs, 2 * gates * h), -s, s))
    return w, r, b


def _stft_encoder(g: GraphBuilder, x: str, scope: str, n_fft: int, hop: int) -> str:
    """(1, 512) audio -> (1, 64, 2) features: Conv1d STFT (real and imaginary kernels), magnitude, conv encoder."""
    bins = n_fft // 2 + 1
    # crop to the last 512 samples when given more (shape-dependent: folded wherever the shape is known)
    n = g.op("Gather", [g.op("Shape", [x], scope), g.constant_node(np.array(1, np.int64), scope)], scope, axis=0)
    longer = g.op("Greater", [n, g.constant_node(np.array(512, np.int64), scope)], scope)
    x = _if(g, longer,
            lambda: [g.op("Slice", [x, g.constant_node(_i64(-512), scope), g.constant_node(_i64(2 ** 62), scope),
                                     g.constant_node(_i64(1), scope)], f"{scope}.crop")],
            lambda: [x], f"{scope}.crop", 1)[0]
    x3 = g.op("Unsqueeze", [x, g.constant_node(_i64(1), scope)], scope)                     # (1, 1, 512)
    # the STFT basis as torch's silero-style export holds it: a constant (not trained) Conv1d weight
    t = np.arange(n_fft)[None, :]
    k = np.arange(bins)[:, None]
    win = np.hanning(n_fft + 1)[:-1].astype(np.float32)
    basis = np.concatenate([np.cos(2 * np.pi * k * t / n_fft), -np.sin(2 * np.pi * k * t / n_fft)]) * win
    w = g.const(basis[:, None, :].astype(np.float32), f"{scope}.stft")
    spec = g.op("Conv", [x3, w], f"{scope}.stft", dilations=[1], group=1, kernel_shape=[n_fft], pads=[0, 0],
                strides=[hop])
    re = g.op("Slice", [spec, g.constant_node(_i64(0), scope), g.constant_node(_i64(bins), scope),
                        g.constant_node(_i64(1), scope)], scope)
    im = g.op("Slice", [spec, g.constant_node(_i64(bins), scope), g.constant_node(_i64(2 * bins), scope),
                        g.constant_node(_i64(1), scope)], scope)
    mag = g.op("Sqrt", [g.op("Add", [g.op("Mul", [re, re], scope), g.op("Mul", [im, im], scope)], scope)], scope)
    y = g.relu(_conv1d(g, mag, f"{scope}.encoder.0", bins, 64, 3, 1, 1), f"{scope}.encoder.0")
    y = g.relu(_conv1d(g, y, f"{scope}.encoder.1", 64, 64, 3, 2, 1), f"{scope}.encoder.1")
    return g.relu(_conv1d(g, y, f"{scope}.encoder.2", 64, 64, 3, 2, 1), f"{scope}.encoder.2")


def vad_lstm(g: GraphBuilder, inputs: Sequence[str]) -> list[str]:
    x, sr, state = inputs
    h = VAD_HIDDEN
    # if x.dim() == 1: x = x.unsqueeze(0)  (TorchScript keeps the if)
    rank = g.op("Size", [g.op("Shape", [x], "prep")], "prep")
    one_d = g.op("Equal", [rank, g.constant_node(np.array(1, np.int64), "prep")], "prep")
    x2 = _if(g, one_d, lambda: [g.op("Unsqueeze", [x, g.constant_node(_i64(0), "prep")], "prep")],
             lambda: [x], "prep", 1)[0]
    w, r, b = _rnn_weights(g, "decoder.rnn", 4, 64, h, 1)
    dec_w = g.add_init("decoder.out.weight", g.fan_in_weight((1, h, 1), (1, 2), 1.0, h))
    dec_b = g.add_init("decoder.out.bias", g.normal((1,), 0.05))

    def branch(scope: str, n_fft: int, hop: int) -> list[str]:
        feats = _stft_encoder(g, x2, scope, n_fft, hop)                                   # (1, 64, T)
        seq = g.op("Transpose", [feats], f"{scope}.decoder", perm=[2, 0, 1])               # (T, 1, 64)
        h0 = g.op("Gather", [state, g.constant_node(np.array([0], np.int64), scope)], f"{scope}.decoder", axis=0)
        c0 = g.op("Gather", [state, g.constant_node(np.array([1], np.int64), scope)], f"{scope}.decoder", axis=0)
        y, yh, yc = g.node("LSTM", [seq, w, r, b, "", h0, c0], f"{scope}.decoder.rnn", 3, hidden_size=h)
        new_state = g.op("Concat", [yh, yc], f"{scope}.decoder", axis=0)                 # (2, 1, H)
        y = g.op("Squeeze", [y, g.constant_node(_i64(1), scope)], f"{scope}.decoder")     # (T, 1, H)
        y = g.op("Transpose", [g.relu(y, f"{scope}.decoder")], f"{scope}.decoder", perm=[1, 2, 0])  # (1, H, T)
        p = g.op("Sigmoid", [g.op("Conv", [y, dec_w, dec_b], f"{scope}.decoder.out", dilations=[1], group=1,
                                     kernel_shape=[1], pads=[0, 0], strides=[1])], f"{scope}.decoder")  # (1, 1, T)
        out = g.op("ReduceMean", [p], f"{scope}.decoder", axes=[2], keepdims=0)           # (1, 1)
        return [out, new_state]

    is16k = g.op("Equal", [sr, g.constant_node(np.array(16000, np.int64), "sr")], "sr")
    return _if(g, is16k, lambda: branch("model16k", 256, 64), lambda: branch("model8k", 128, 64), "sr", 2)


def crnn_lstm(g: GraphBuilder, inputs: Sequence[str]) -> list[str]:
    (x,) = inputs

    def cbr(y: str, name: str, cin: int, cout: int, k: int | tuple[int, int], pad: int) -> str:
        return g.relu(g.bn(g.conv(y, f"{name}.conv", cin, cout, k, 1, pad), f"{name}.bn", cout), f"{name}.relu")

    y = g.maxpool(cbr(x, "cnn.0", 1, 32, 3, 1), 2, 2, scope="cnn.pool0")                     # 16 x W/2
    y = g.maxpool(cbr(y, "cnn.1", 32, 64, 3, 1), 2, 2, scope="cnn.pool1")                    # 8 x W/4
    y = cbr(y, "cnn.2", 64, 128, 3, 1)
    y = g.op("MaxPool", [y], "cnn.pool2", kernel_shape=[2, 1], strides=[2, 1], pads=[0, 0, 0, 0])  # 4 x W/4
    y = cbr(y, "cnn.3", 128, 128, (4, 1), 0)                                                 # 1 x W/4
    seq = g.op("Squeeze", [y, g.constant_node(_i64(2), "rnn")], "rnn")                       # (1, C, T)
    seq = g.op("Transpose", [seq], "rnn", perm=[2, 0, 1])                                    # (T, 1, C)
    h = CRNN_HIDDEN
    w, r, b = _rnn_weights(g, "rnn.lstm", 4, 128, h, 2)
    yseq = g.node("LSTM", [seq, w, r, b], "rnn.lstm", 1, hidden_size=h, direction="bidirectional")[0]  # (T, 2, 1, H)
    yseq = g.op("Transpose", [yseq], "rnn", perm=[0, 2, 1, 3])                              # (T, 1, 2, H)
    tb = g.op("Shape", [yseq], "rnn", start=0, end=2)
    yseq = g.op("Reshape", [yseq, g.op("Concat", [tb, g.constant_node(_i64(2 * h), "rnn")], "rnn", axis=0)], "rnn")
    logits = g.linear_matmul(yseq, "fc", 2 * h, CRNN_SYMBOLS)                                 # (T, 1, 37)
    return [g.op("LogSoftmax", [logits], "out", axis=-1)]


def kws_gru(g: GraphBuilder, inputs: Sequence[str]) -> list[str]:
    x, state = inputs                                                                          # (1, 49, 40), (1, 1, H)
    h = KWS_HIDDEN
    seq = g.op("Transpose", [x], "rnn", perm=[1, 0, 2])                                      # (49, 1, 40)
    w, r, b = _rnn_weights(g, "rnn.gru", 3, KWS_FEATS, h, 1)
    y, yh = g.node("GRU", [seq, w, r, b, "", state], "rnn.gru", 2, hidden_size=h, linear_before_reset=1)
    last = g.op("Reshape", [yh, g.constant_node(_i64(1, h), "head")], "head")               # (1, H)
    logits = g.gemm(last, "head.fc", h, KWS_CLASSES, gain=1.0)
    return [g.op("Softmax", [logits], "head", axis=-1), g.op("Identity", [yh], "state")]
