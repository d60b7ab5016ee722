"""MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool over any number of spatial axes (1-D/2-D/3-D).

Output sizes follow onnxruntime exactly (``pool_geometry``): explicit pads, ``auto_pad`` (SAME_* pads
computed from the *undilated* kernel, as onnxruntime does), and ``ceil_mode`` with the rule that the
last window must start inside the input or the left padding (onnx/onnx#5741).

AveragePool divides by the number of window taps inside the input (``count_include_pad=0``) or
inside input + explicit pads (``count_include_pad=1``); taps that only exist because of
``ceil_mode`` never count -- which is what onnxruntime (and PyTorch) compute.

The ``pool`` CPU kernel is separable: along each spatial axis it combines the ``k`` strided views of
the (padded) input with ``np.maximum``/``np.add``, so a 2-D k x k window costs 2k passes, not k*k.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .. import native
from ..errors import ShapeError, UnsupportedOpError
from ..ir import Node, TensorInfo
from .activation import apply_act
from .base import BoundKernel, ContiguousOut, Kernel, Layer, OpSpec, full_inputs, register_kernel, register_op

__all__ = ["PoolGeometry", "pool_geometry", "pool_reference"]

_LOCAL = ("MaxPool", "AveragePool")
_GLOBAL = ("GlobalAveragePool", "GlobalMaxPool")


@dataclass(frozen=True)
class PoolGeometry:
    """Per spatial axis: window size, stride, dilation, head/tail pads and output size."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_head: tuple[int, ...]
    pads_tail: tuple[int, ...]
    out: tuple[int, ...]


def _trunc_div(a: int, b: int) -> int:
    """C++ integer division (rounds toward zero), which onnxruntime's size arithmetic uses."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _out_size(n: int, k: int, s: int, d: int, head: int, tail: int, ceil_mode: bool) -> int:
    num = n + head + tail - d * (k - 1) - 1
    if not ceil_mode:
        return _trunc_div(num, s) + 1
    o = math.ceil(num / s) + 1
    if (o - 1) * s >= n + head:  # the last window would start in the right padding: drop it
        o -= 1
    return o


def pool_geometry(node: Node, in_shape: Sequence[int]) -> PoolGeometry:
    """The window geometry of a (Max|Average)Pool ``node`` on an input of shape ``in_shape`` (N, C, *spatial)."""
    spatial = tuple(int(d) for d in in_shape[2:])
    nsp = len(spatial)
    if node.op in _GLOBAL:
        return PoolGeometry(spatial, (1,) * nsp, (1,) * nsp, (0,) * nsp, (0,) * nsp, (1,) * nsp)
    ks = node.attr("kernel_shape")
    if ks is None:
        raise ShapeError(f"{node.op} {node.name!r}: kernel_shape is required")
    ks = tuple(int(k) for k in ks)
    if len(ks) != nsp:
        raise ShapeError(f"{node.op} {node.name!r}: kernel_shape {ks} does not match the {nsp} spatial axes "
                         f"of input shape {tuple(in_shape)}")
    strides = tuple(int(s) for s in (node.attr("strides") or (1,) * nsp))
    dil = tuple(int(d) for d in (node.attr("dilations") or (1,) * nsp))
    pads = tuple(int(p) for p in (node.attr("pads") or (0,) * (2 * nsp)))
    if len(strides) != nsp or len(dil) != nsp or len(pads) != 2 * nsp:
        raise ShapeError(f"{node.op} {node.name!r}: strides/dilations/pads lengths do not match kernel_shape {ks}")
    if any(k < 1 for k in ks) or any(s < 1 for s in strides) or any(d < 1 for d in dil):
        raise ShapeError(f"{node.op} {node.name!r}: kernel_shape, strides and dilations must be positive")
    ceil_mode = bool(node.attr("ceil_mode", 0))
    auto_pad = node.attr("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    head, tail, out = [], [], []
    for n, k, s, d, ph, pt in zip(spatial, ks, strides, dil, pads[:nsp], pads[nsp:]):
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            need = (_trunc_div(n + s - 1, s) - 1) * s + k - n  # onnxruntime uses the undilated kernel here
            ph = _trunc_div(need + 1, 2) if auto_pad == "SAME_LOWER" else _trunc_div(need, 2)
            pt = need - ph
        elif auto_pad == "VALID":
            ph = pt = 0
        o = _out_size(n, k, s, d, ph, pt, ceil_mode)
        if o < 1:
            raise ShapeError(f"{node.op} {node.name!r}: window {k} (dilation {d}) does not fit input size {n} "
                             f"with pads ({ph}, {pt})")
        head.append(ph)
        tail.append(pt)
        out.append(o)
    return PoolGeometry(ks, strides, dil, tuple(head), tuple(tail), tuple(out))


def _check(node: Node, opset: int) -> None:
    auto_pad = node.attr("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise UnsupportedOpError(node.op, node.name, opset, f"auto_pad={auto_pad!r}")


def _infer(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    x = ins[0]
    if x is None or len(x.shape) < 3:
        raise ShapeError(f"{node.op} {node.name!r}: input must be (N, C, spatial...), got "
                         f"{None if x is None else x.shape}")
    g = pool_geometry(node, x.shape)
    out = [(tuple(x.shape[:2]) + g.out, x.dtype)]
    if node.op == "MaxPool" and len(node.outputs) > 1 and node.outputs[1]:
        out.append((out[0][0], np.dtype(np.int64)))  # Indices: flat positions in X
    return out


# --------------------------------------------------------------------------- numpy reference

def _tap_counts(o: int, k: int, s: int, d: int, head: int, lo: int, hi: int) -> np.ndarray:
    """Per output position along one axis: the taps whose input coordinate lies in [lo, hi)."""
    pos = np.arange(o)[:, None] * s - head + np.arange(k)[None, :] * d
    return ((pos >= lo) & (pos < hi)).sum(axis=1)


def _counts(g: PoolGeometry, spatial: Sequence[int], include_pad: bool) -> np.ndarray:
    """Divisor of every output position (shape g.out): a product of per-axis tap counts (the window is a box)."""
    c = np.ones((), dtype=np.int64)
    for n, o, k, s, d, ph, pt in zip(spatial, g.out, g.kernel, g.strides, g.dilations, g.pads_head, g.pads_tail):
        per = _tap_counts(o, k, s, d, ph, -ph, n + pt) if include_pad else _tap_counts(o, k, s, d, ph, 0, n)
        c = np.multiply.outer(c, per)
    return c


def _padded(x: np.ndarray, g: PoolGeometry, fill: Any) -> np.ndarray:
    """x padded at the head and at the tail far enough for every window (cropped where windows stop early)."""
    nsp = len(g.kernel)
    spatial = x.shape[2:]
    need = [(o - 1) * s + (k - 1) * d + 1 for o, k, s, d in zip(g.out, g.kernel, g.strides, g.dilations)]
    tails = [m - n - h for m, n, h in zip(need, spatial, g.pads_head)]
    if all(h == 0 for h in g.pads_head) and all(t <= 0 for t in tails):
        return x[(slice(None), slice(None)) + tuple(slice(0, m) for m in need)]
    xp = np.full(x.shape[:2] + tuple(need), fill, dtype=x.dtype)
    dst = tuple(slice(h, h + min(n, m - h)) for h, n, m in zip(g.pads_head, spatial, need))
    src = tuple(slice(0, min(n, m - h)) for h, n, m in zip(g.pads_head, spatial, need))
    xp[(slice(None), slice(None)) + dst] = x[(slice(None), slice(None)) + src]
    assert len(dst) == nsp
    return xp


def pool_reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """Independent oracle: all windows at once with sliding_window_view over a NaN-padded float64 copy."""
    x = np.asarray(inputs[0])
    nsp = x.ndim - 2
    g = pool_geometry(node, x.shape)
    xf = x.astype(np.float64)
    xp = _padded(xf, g, np.nan)
    ext = tuple((k - 1) * d + 1 for k, d in zip(g.kernel, g.dilations))
    axes = tuple(range(2, 2 + nsp))
    win = np.lib.stride_tricks.sliding_window_view(xp, ext, axis=axes)
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in g.strides)
              + tuple(slice(None, None, d) for d in g.dilations)]
    red = tuple(range(2 + nsp, 2 + 2 * nsp))
    if node.op == "MaxPool" and len(node.outputs) > 1 and node.outputs[1]:
        return _max_with_indices(node, x, g, win)
    if node.op in ("MaxPool", "GlobalMaxPool"):
        y = np.nanmax(win, axis=red)
    else:
        total = np.nansum(win, axis=red)
        if node.op == "GlobalAveragePool":
            y = total / float(np.prod(x.shape[2:]))
        else:
            y = total / _counts(g, x.shape[2:], bool(node.attr("count_include_pad", 0)))
    y = np.array(y, dtype=x.dtype, copy=True) if np.issubdtype(x.dtype, np.floating) else \
        np.rint(y).astype(x.dtype)
    if node.attr("act") is not None:
        apply_act(y, node.attr("act"))
    return [y]


def _max_with_indices(node: Node, x: np.ndarray, g: PoolGeometry, win: np.ndarray) -> list[np.ndarray]:
    """MaxPool with its Indices output: the flat position in X (storage_order 1: each plane column-major) of the
    first maximum of each window in row-major window order, as onnxruntime picks it."""
    nsp = x.ndim - 2
    pos = np.arange(x.size, dtype=np.int64).reshape(x.shape)
    if int(node.attr("storage_order", 0)) and nsp >= 2:
        plane = int(np.prod(x.shape[2:]))
        local = np.arange(plane, dtype=np.int64).reshape(x.shape[2:][::-1]).T  # column-major numbering
        pos = (np.arange(x.shape[0] * x.shape[1], dtype=np.int64).reshape(x.shape[:2] + (1,) * nsp) * plane + local)
    pp = _padded(pos, g, -1)
    ext = tuple((k - 1) * d + 1 for k, d in zip(g.kernel, g.dilations))
    axes = tuple(range(2, 2 + nsp))
    pw = np.lib.stride_tricks.sliding_window_view(pp, ext, axis=axes)
    pw = pw[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in g.strides)
            + tuple(slice(None, None, d) for d in g.dilations)]
    flat = win.reshape(win.shape[:2 + nsp] + (-1,))
    vals = np.where(np.isnan(flat), -np.inf, flat)  # padding (NaN) never wins
    arg = np.argmax(vals, axis=-1)[..., None]
    y = np.take_along_axis(flat, arg, axis=-1)[..., 0]
    idx = np.take_along_axis(pw.reshape(flat.shape), arg, axis=-1)[..., 0]
    y = np.array(y, dtype=x.dtype, copy=True) if np.issubdtype(x.dtype, np.floating) else np.rint(y).astype(x.dtype)
    if node.attr("act") is not None:
        apply_act(y, node.attr("act"))
    return [y, np.ascontiguousarray(idx, dtype=np.int64)]


for _op in _LOCAL + _GLOBAL:
    register_op(OpSpec(_op, _infer, pool_reference, check=_check,
                       notes="the Indices output is computed by the numpy reference kernel" if _op == "MaxPool"
                       else ""))


# --------------------------------------------------------------------------- kernels

def _lowest(dt: np.dtype) -> Any:
    return -np.inf if np.issubdtype(dt, np.floating) else np.iinfo(dt).min


@register_kernel
class PoolKernel(Kernel):
    """Separable strided-view pooling: per spatial axis, k passes of np.maximum / np.add over views."""

    name = "pool"
    ops = _LOCAL + _GLOBAL
    priority = 10

    def applies(self, layer: Layer) -> bool:
        return len(layer.outputs) == 1  # MaxPool's Indices output: the reference kernel

    def workspace_nbytes(self, layer: Layer) -> int:
        if layer.op in _GLOBAL:
            return 0
        x = layer.inputs[0]
        g = pool_geometry(layer.node, x.shape)
        itemsize = max(np.dtype(x.dtype).itemsize, 4)
        # upper bound: every intermediate after an axis pass, plus the padded copy fed to the last pass
        total, shape = 0, list(x.shape)
        for ax, o in enumerate(g.out[:-1]):
            shape[2 + ax] = o
            total += int(np.prod(shape))
        need = (g.out[-1] - 1) * g.strides[-1] + (g.kernel[-1] - 1) * g.dilations[-1] + 1
        total += int(np.prod(shape[:-1])) * need
        return int(itemsize * total)

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]):
        """Global pooling of a contiguous float32 arena tensor: the one native call, pre-bound. run() spent
        ~0.1 ms of Python on mobilenetv2's 1280x7x7 GlobalAveragePool whose C call takes 0.01 ms."""
        if layer.op not in _GLOBAL or not native.AVAILABLE or layer.attr("act") is not None:
            return None
        x, y = full_inputs(layer, inputs, params)[0], outputs[0]
        if x is None or x.dtype != np.float32 or y.dtype != np.float32 or not x.size \
                or not x.flags.c_contiguous or not y.flags.c_contiguous:
            return None
        rows = x.shape[0] * x.shape[1]
        fn = native.lib.inferd_reduce_rows
        args = (native._ptr(x), native._ptr(y), rows, x.size // max(rows, 1), int(layer.op == "GlobalMaxPool"))

        def call(_keep=(x, y)) -> None:
            fn(*args)
        return call

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        x = full_inputs(layer, inputs, params)[0]
        y = outputs[0]
        is_max = layer.op in ("MaxPool", "GlobalMaxPool")
        nsp = x.ndim - 2
        if layer.op in _GLOBAL:
            axes = tuple(range(2, 2 + nsp))
            if x.dtype == np.float32 and x.flags.c_contiguous and y.flags.c_contiguous and native.AVAILABLE \
                    and x.size:
                rows = x.shape[0] * x.shape[1]
                native.lib.inferd_reduce_rows(native._ptr(x), native._ptr(y), rows, x.size // max(rows, 1),
                                              int(is_max))
            elif x.dtype == np.float32 and x.flags.c_contiguous and y.flags.c_contiguous:
                # one reduction along contiguous rows: numpy's over axes (2, 3) of NCHW was ~10x slower
                x2, y2 = x.reshape(x.shape[0] * x.shape[1], -1), y.reshape(-1)
                if is_max:
                    np.max(x2, axis=1, out=y2)
                else:
                    np.sum(x2, axis=1, out=y2)
                    y2 *= np.float32(1.0 / x2.shape[1])
            elif is_max:
                np.max(x, axis=axes, keepdims=True, out=y)
            else:
                np.mean(x, axis=axes, keepdims=True, out=y, dtype=np.float32 if x.dtype == np.float16 else None)
        else:
            g = pool_geometry(layer.node, x.shape)
            # float16 sums lose too much; accumulate in float32 and cast once at the end
            acc_dt = np.dtype(np.float32) if (not is_max and x.dtype == np.float16) else x.dtype
            cur = x.astype(acc_dt, copy=False)
            combine = np.maximum if is_max else np.add
            fill = _lowest(acc_dt) if is_max else 0
            # First spatial axis first: its views keep whole contiguous rows, so the larger pass is
            # the vectorised one; the last pass writes into y. Padding of the outer axes is never
            # materialised (taps are clipped); the innermost axis is padded on the already reduced
            # intermediate, since clipped slices of short rows are slower than that copy.
            for ax in range(nsp):
                shape = cur.shape[:2 + ax] + (g.out[ax],) + cur.shape[3 + ax:]
                dst = y if ax == nsp - 1 and acc_dt == y.dtype else np.empty(shape, acc_dt)
                head = g.pads_head[ax]
                if ax == nsp - 1:
                    need = (g.out[ax] - 1) * g.strides[ax] + (g.kernel[ax] - 1) * g.dilations[ax] + 1
                    cur, head = _pad_last(cur, head, need, fill), 0
                _axis_pass(cur, dst, 2 + ax, g.kernel[ax], g.strides[ax], g.dilations[ax], head, combine, fill)
                cur = dst
            if not is_max:
                cnt = _counts(g, x.shape[2:], bool(layer.attr("count_include_pad", 0)))
                np.divide(cur, cnt.astype(acc_dt), out=cur)
            if cur is not y:
                np.copyto(y, cur, casting="unsafe")
        act = layer.attr("act")
        if act is not None:
            apply_act(y, act)


def _pad_last(x: np.ndarray, head: int, need: int, fill: Any) -> np.ndarray:
    """``x`` with ``head`` fill values before its last axis and fill/cropping after, to length ``need``."""
    n = x.shape[-1]
    if head == 0 and need <= n:
        return x
    m = min(n, need - head)
    out = np.empty(x.shape[:-1] + (need,), x.dtype)
    out[..., :head] = fill
    out[..., head:head + m] = x[..., :m]
    out[..., head + m:] = fill
    return out


def _axis_pass(src: np.ndarray, dst: np.ndarray, axis: int, k: int, s: int, d: int, head: int,
               combine: Any, fill: Any) -> None:
    """Pool ``src`` along ``axis`` into ``dst`` without materialising any padding.

    Tap ``t`` of output ``j`` reads input ``j*s - head + t*d``; each tap touches only the outputs
    whose input lies inside ``src`` (padding is the identity of ``combine``), so every pass is a
    strided view combined into a slice of ``dst``.
    """
    n, o = src.shape[axis], dst.shape[axis]
    pre = (slice(None),) * axis
    spans = []
    for t in range(k):
        off = t * d - head
        lo = max(0, (-off + s - 1) // s)  # first output whose tap lands at or after input 0
        hi = min(o, (n - 1 - off) // s + 1) if n - 1 - off >= 0 else 0
        if lo < hi:
            spans.append((lo, hi, off))
    # start from a tap that covers every output (plain copy) if there is one, else from the identity
    full = next((sp for sp in spans if sp[0] == 0 and sp[1] == o), None)
    if full is None:
        dst.fill(fill)
    else:
        np.copyto(dst, src[pre + (slice(full[2], (o - 1) * s + full[2] + 1, s),)])
    for sp in spans:
        if sp is full:
            continue
        lo, hi, off = sp
        part = dst[pre + (slice(lo, hi),)]
        combine(part, src[pre + (slice(lo * s + off, (hi - 1) * s + off + 1, s),)], out=part)


@register_kernel
class PoolReferenceKernel(Kernel):
    """The OpSpec's numpy reference (slow, float64): the oracle the ``pool`` kernel is tested against."""

    name = "reference"
    ops = _LOCAL + _GLOBAL
    priority = 100


@register_kernel
class PoolNativeKernel(Kernel):
    """Float32 2-D MaxPool/AveragePool in native code (rows of taps combined per output row; planes split over
    the native pool). Averages multiply by a reciprocal count map computed at load (the count rule, with or
    without the padding, lives in one place: ``_counts``)."""

    name = "pool_native"
    ops = _LOCAL
    priority = 5

    def applies(self, layer: Layer) -> bool:
        x = layer.inputs[0]
        if not native.AVAILABLE or x is None or len(x.shape) != 4 or np.dtype(x.dtype) != np.float32:
            return False
        return np.dtype(layer.outputs[0].dtype) == np.float32 and len([o for o in layer.node.outputs if o]) == 1

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if layer.op != "AveragePool":
            return dict(raw)
        x = layer.inputs[0]
        g = pool_geometry(layer.node, x.shape)
        cnt = _counts(g, x.shape[2:], bool(layer.attr("count_include_pad", 0))).astype(np.float64)
        with np.errstate(divide="ignore"):
            inv = np.ascontiguousarray((1.0 / cnt).astype(np.float32).reshape(g.out))
        return {**raw, "inv_count": inv}

    def transformed_nbytes(self, layer: Layer) -> int:
        return int(np.prod(layer.outputs[0].shape[2:])) * 4 if layer.op == "AveragePool" else 0

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        self.bind(layer, inputs, params, outputs)()

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]):
        x, y = full_inputs(layer, inputs, params)[0], outputs[0]
        g = pool_geometry(layer.node, x.shape)
        n, c, h, w = x.shape
        is_max = layer.op == "MaxPool"
        inv = params.get("inv_count") if not is_max else None
        if not is_max and inv is None:
            inv = self.transform(layer, {})["inv_count"]
        act = layer.attr("act")
        xc = x if x.flags.c_contiguous else None
        o = ContiguousOut(y)
        args = [None, native._ptr(o.y), n * c, h, w, g.kernel[0], g.kernel[1], g.strides[0], g.strides[1],
                g.dilations[0], g.dilations[1], g.pads_head[0], g.pads_head[1], g.out[0], g.out[1], int(is_max),
                native.ffi.NULL if inv is None else native._ptr(inv)]
        if xc is not None:
            args[0] = native._ptr(xc)
        fn = native.lib.inferd_pool2d
        keep = (x, y, o.y, inv)

        def call(_keep=keep) -> None:
            if xc is None:
                a = list(args)
                a[0] = native._ptr(np.ascontiguousarray(x))
                rc = fn(*a)
            else:
                rc = fn(*args)
            if rc != 0:
                raise MemoryError("pool2d: out of memory")
            o.close()
            if act is not None:
                apply_act(y, act)
        return call


@register_kernel
class PoolInt8NativeKernel(BoundKernel):
    """8-bit (int8/uint8) 2-D MaxPool in native code, as quantised models run it between int8 layers: separable
    row maxima over the planes, split over the native pool. The numpy ``pool`` kernel (strided views) took
    ~10x onnxruntime's time on googlenet's pools."""

    name = "pool_int8_native"
    ops = ("MaxPool",)
    priority = 5

    def applies(self, layer: Layer) -> bool:
        from .quant import INT8_TYPES

        x = layer.inputs[0]
        if not native.AVAILABLE or x is None or len(x.shape) != 4 or np.dtype(x.dtype) not in INT8_TYPES:
            return False
        if len([o for o in layer.node.outputs if o]) != 1 or layer.attr("act") is not None:
            return False
        g = pool_geometry(layer.node, x.shape)
        return min(g.pads_head) >= 0 and min(g.out) > 0

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]):
        x, y = full_inputs(layer, inputs, params)[0], outputs[0]
        if x is None or not (x.flags.c_contiguous and y.flags.c_contiguous):
            return None
        g = pool_geometry(layer.node, x.shape)
        n, c, h, w = x.shape
        args = (native._vptr(x), int(x.dtype == np.int8), n * c, h, w, *g.kernel, *g.strides, *g.dilations,
                *g.pads_head, *g.out, native._vptr(y), native.num_threads())
        fn = native.lib.inferd_q8_maxpool2d

        def call(_keep=(x, y)) -> None:
            if fn(*args):
                raise MemoryError(f"{layer.name}: int8 MaxPool out of memory")
        return call
