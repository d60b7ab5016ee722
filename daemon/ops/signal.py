"""Signal processing: DFT, STFT, the window generators (Hann, Hamming, Blackman) and MelWeightMatrix.

Complex tensors are ONNX's: a trailing dimension of 2 (real, imaginary), or 1 for a real input. numpy's FFT
(pocketfft) is both the oracle and the CPU kernel: these ops sit in audio front ends, off the hot path of
the networks behind them. The transform runs in the input's precision (complex64 for float32 and float16,
complex128 for float64), as ONNX's reference and onnxruntime compute it: a float64 transform of a float32 model
gives other round-off than the reference's, which tests with an absolute tolerance of 1e-7 catch near zero. Lengths, axes and sizes are shape-defining, so they must be constants.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..errors import ShapeError
from ..ir import Node, TensorInfo
from .base import Kernel, Layer, OpSpec, full_inputs, register_kernel, register_op
from .tensor import const_getter

Infos = list["TensorInfo | None"]

_ONNX_FLOAT = {1: np.float32, 10: np.float16, 11: np.float64}
_ONNX_ANY = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
             10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


def _opset(node: Node) -> int:
    return int(node.attr("_opset", 17))


def _scalar(v: np.ndarray | None, default: int | None = None) -> int | None:
    if v is None:
        return default
    return int(np.asarray(v).reshape(-1)[0])


def _out_dtype(node: Node, table: dict[int, type] = _ONNX_ANY) -> np.dtype:
    t = int(node.attr("output_datatype", 1))
    if t not in table:
        raise ShapeError(f"node {node.name!r} ({node.op}): output_datatype {t} is not supported")
    return np.dtype(table[t])


def _complex(x: np.ndarray) -> np.ndarray:
    """The complex array an ONNX complex tensor (trailing 1 or 2) holds, without the trailing dimension, in the
    input's precision (numpy >= 2 transforms complex64 in single precision)."""
    x = x.astype(np.float64 if x.dtype == np.float64 else np.float32)
    return x[..., 0] if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1]


def _pack(c: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.stack([c.real, c.imag], axis=-1).astype(dtype)


# ------------------------------------------------------------------------------------- DFT

def _dft_params(node: Node, shape: Sequence[int], get) -> tuple[int, int, bool, bool]:  # type: ignore[no-untyped-def]
    rank = len(shape)
    if _opset(node) >= 20:
        a = _scalar(get(2), -2)
    else:
        a = int(node.attr("axis", 1))
    assert a is not None
    a = a + rank if a < 0 else a
    if not 0 <= a < rank - 1:  # the last dimension holds (real, imaginary)
        raise ShapeError(f"node {node.name!r} (DFT): axis {a} out of range for input of rank {rank}")
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    n = _scalar(get(1))
    if n is None:
        n = 2 * (shape[a] - 1) if inverse and onesided else shape[a]
    if n < 1:
        raise ShapeError(f"node {node.name!r} (DFT): dft_length {n} must be positive")
    return a, n, inverse, onesided


def _infer_dft(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x = ins[0]
    assert x is not None
    if not x.shape or x.shape[-1] not in (1, 2):
        raise ShapeError(f"node {node.name!r} (DFT): the last dimension must be 1 (real) or 2 (complex), got {list(x.shape)}")
    a, n, inverse, onesided = _dft_params(node, x.shape, const_getter(node, consts, {1: "dft_length", 2: "axis"}))
    shape = list(x.shape)
    if inverse and onesided:
        shape[a], shape[-1] = n, 1
    else:
        shape[a], shape[-1] = (n // 2 + 1 if onesided else n), 2
    return [(tuple(shape), np.dtype(x.dtype))]


def dft(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    get = lambda i: ins[i] if len(ins) > i else None  # noqa: E731
    a, n, inverse, onesided = _dft_params(node, x.shape, get)
    c = _complex(x)
    if inverse and onesided:
        return [np.fft.irfft(c, n=n, axis=a)[..., None].astype(x.dtype)]
    r = np.fft.ifft(c, n=n, axis=a) if inverse else np.fft.fft(c, n=n, axis=a)
    if onesided:
        r = np.take(r, np.arange(n // 2 + 1), axis=a)
    return [_pack(r, x.dtype)]


# ------------------------------------------------------------------------------------- STFT

def _stft_params(node: Node, shape: Sequence[int], get) -> tuple[int, int, np.ndarray | None, bool]:  # type: ignore[no-untyped-def]
    step = _scalar(get(1))
    win = get(2)
    fl = _scalar(get(3))
    if fl is None:
        fl = int(np.asarray(win).shape[0]) if win is not None else int(shape[1])
    if step is None or step < 1 or fl < 1 or fl > shape[1]:
        raise ShapeError(f"node {node.name!r} (STFT): frame_step {step} and frame_length {fl} do not fit a signal of "
                         f"length {shape[1]}")
    if win is not None and np.asarray(win).shape[0] != fl:
        raise ShapeError(f"node {node.name!r} (STFT): window length {np.asarray(win).shape[0]} != frame_length {fl}")
    return step, fl, win, bool(node.attr("onesided", 1))


def _infer_stft(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x = ins[0]
    assert x is not None
    if len(x.shape) != 3 or x.shape[2] not in (1, 2):
        raise ShapeError(f"node {node.name!r} (STFT): signal must be [batch, length, 1 or 2], got {list(x.shape)}")
    get = const_getter(node, consts, {1: "frame_step", 3: "frame_length"})

    def g(i: int) -> np.ndarray | None:
        if i == 2:  # the window's values are not needed for the shape, only its length
            if len(node.inputs) > 2 and node.inputs[2]:
                info = ins[2]
                assert info is not None
                return np.zeros(info.shape, np.float32)
            return None
        return get(i)

    step, fl, _w, onesided = _stft_params(node, x.shape, g)
    frames = 1 + (x.shape[1] - fl) // step
    return [((x.shape[0], frames, fl // 2 + 1 if onesided else fl, 2), np.dtype(x.dtype))]


def stft(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    get = lambda i: ins[i] if len(ins) > i else None  # noqa: E731
    step, fl, win, onesided = _stft_params(node, x.shape, get)
    frames = 1 + (x.shape[1] - fl) // step
    c = _complex(x)  # (batch, length)
    idx = np.arange(frames)[:, None] * step + np.arange(fl)[None, :]
    fr = c[:, idx]  # (batch, frames, fl)
    if win is not None:
        fr = fr * np.asarray(win, fr.real.dtype)
    r = np.fft.fft(fr, n=fl, axis=-1)
    if onesided:
        r = r[..., : fl // 2 + 1]
    return [_pack(r, x.dtype)]


# ------------------------------------------------------------------------------------- windows

def _infer_window(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    n = _scalar(const_getter(node, consts, {0: "size"})(0))
    assert n is not None
    if n < 0:
        raise ShapeError(f"node {node.name!r} ({node.op}): size {n} is negative")
    return [((n,), _out_dtype(node))]


def window(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    n = _scalar(ins[0])
    assert n is not None
    d = n if int(node.attr("periodic", 1)) else n - 1
    k = np.arange(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = k / d if d else np.zeros(n)
    if node.op == "HannWindow":
        w = np.sin(np.pi * t) ** 2
    elif node.op == "HammingWindow":
        a = 25.0 / 46.0
        w = a - (1 - a) * np.cos(2 * np.pi * t)
    else:
        w = 0.42 - 0.5 * np.cos(2 * np.pi * t) + 0.08 * np.cos(4 * np.pi * t)
    return [w.astype(_out_dtype(node))]


# ------------------------------------------------------------------------------------- MelWeightMatrix

def _infer_mel(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    get = const_getter(node, consts, {0: "num_mel_bins", 1: "dft_length"})
    mel, n = _scalar(get(0)), _scalar(get(1))
    assert mel is not None and n is not None
    return [((n // 2 + 1, mel), _out_dtype(node, _ONNX_FLOAT))]


def mel_weight_matrix(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Triangular filters between mel-spaced points, as the ONNX reference places them (bins floored)."""
    mel, n, rate = (_scalar(ins[i]) for i in range(3))
    lo, hi = (float(np.asarray(ins[i]).reshape(-1)[0]) for i in (3, 4))
    assert mel is not None and n is not None and rate is not None
    pts = np.arange(mel + 2)
    lo_m = 2595 * np.log1p(lo / 700) / np.log(10)
    hi_m = 2595 * np.log1p(hi / 700) / np.log(10)
    f = 700 * np.expm1((pts * ((hi_m - lo_m) / pts.shape[0]) + lo_m) / 2595 * np.log(10))
    bins = (((n + 1) * f) // rate).astype(int)
    out = np.zeros((n // 2 + 1, mel))
    for i in range(mel):
        left, mid, right = bins[i], bins[i + 1], bins[i + 2]
        if mid == left:
            out[mid, i] = 1
        else:
            j = np.arange(left, mid + 1)
            out[j, i] = (j - left) / float(mid - left)
        if right > mid:
            j = np.arange(mid, right)
            out[j, i] = (right - j) / float(right - mid)
    return [out.astype(_out_dtype(node, _ONNX_FLOAT))]


# ------------------------------------------------------------------------------------- registration

_COMPUTE = {"DFT": dft, "STFT": stft, "HannWindow": window, "HammingWindow": window, "BlackmanWindow": window,
            "MelWeightMatrix": mel_weight_matrix}
_INFER = {"DFT": _infer_dft, "STFT": _infer_stft, "HannWindow": _infer_window, "HammingWindow": _infer_window,
          "BlackmanWindow": _infer_window, "MelWeightMatrix": _infer_mel}
SIGNAL_OPS = tuple(_COMPUTE)


def _reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    return [np.array(r, order="C", copy=True) for r in _COMPUTE[node.op](node, inputs)]


for _op in SIGNAL_OPS:
    register_op(OpSpec(_op, _INFER[_op], _reference, min_opset=17,
                       notes="numpy.fft in the input's precision on the CPU" if _op in ("DFT", "STFT") else ""))


@register_kernel
class SignalKernel(Kernel):
    name = "numpy"
    ops = SIGNAL_OPS

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        for o, r in zip(outputs, _COMPUTE[layer.op](layer.node, full_inputs(layer, inputs, params))):
            np.copyto(o, r)
