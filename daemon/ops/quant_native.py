"""Native int8 CPU kernels for QLinearConv and QLinearMatMul (native/int8.c): int32 accumulation, bias and
requantisation (and a fused Relu/Clip as a clamp) in the store, weights packed once at load.

They apply where the C code's assumptions hold: signed 8-bit weights with zero point 0 (symmetric, per tensor
or per output channel: what ``quantize_static``/``quantize_dynamic`` write by default), constant quantisation
parameters, int8 or uint8 activations with one scale and zero point. Anything else runs on the numpy oracle
(``QuantNumpyKernel``), the ground truth these kernels are tested against.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import native
from .base import BoundKernel, Layer, raw_key, register_kernel, weights_key
from .conv import conv_geom
from .quant import INT8_TYPES, conv_multiplier, qrange

_I8 = np.dtype(np.int8)


def layer_geom(layer: Layer):
    """The conv geometry of a QLinearConv (x at input 0, w at input 3), cached on the layer like conv's."""
    g = layer.__dict__.get("_qgeom")
    if g is None:
        g = conv_geom(layer.node, layer.in_shape(0), layer.in_shape(3))
        object.__setattr__(layer, "_qgeom", g)
    return g


def _c(kind: str, a: np.ndarray) -> Any:
    return native.ffi.cast(kind, native.ffi.from_buffer(a, require_writable=False))


def _consts(layer: Layer, pos: Sequence[int]) -> bool:
    return all(p in layer.const_inputs for p in pos if layer.has_input(p))


def _zero(layer: Layer, raw: dict[str, np.ndarray] | None, pos: int) -> bool:
    return raw is None or not layer.has_input(pos) or not np.any(np.asarray(raw[raw_key(pos)]))


def _qparams(layer: Layer, raw: dict[str, np.ndarray], x_zp: int, y_scale: int, y_zp: int) -> np.ndarray:
    """[zx, zy, lo, hi] (the clamp of a fused activation folded into the output range)."""
    zx = int(np.asarray(raw[raw_key(x_zp)]).reshape(-1)[0]) if layer.has_input(x_zp) else 0
    zy = int(np.asarray(raw[raw_key(y_zp)]).reshape(-1)[0]) if layer.has_input(y_zp) else 0
    lo, hi = qrange(layer.outputs[0].dtype)
    c = layer.attr("qclamp")
    if c is not None:
        lo, hi = max(lo, int(c[0])), min(hi, int(c[1]))
    return np.array([zx, zy, lo, hi], np.int64)


def _mult(raw: dict[str, np.ndarray], xs: int, ws: int, ys: int, n: int) -> np.ndarray:
    m = conv_multiplier(raw[raw_key(xs)], raw[raw_key(ws)], raw[raw_key(ys)])
    return np.ascontiguousarray(np.broadcast_to(m, (n,)), np.float32)


def _pack(w2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(packed B^T panels, row sums) of a GEMM's (N, K) weights."""
    n, k = w2.shape
    w2 = np.ascontiguousarray(w2, np.int8)
    wp = native.empty_aligned((int(native.lib.inferd_q8_packed_size(n, k)),), np.int8)
    wsum = np.empty(n, np.int32)
    native.lib.inferd_q8_pack(_c("signed char *", w2), n, k, _c("signed char *", wp), _c("int *", wsum))
    return wp, wsum


def _conv_mode(g) -> int:
    """The weight packing (and kernel) the C code runs this conv geometry fastest with on this CPU: 0, 1, or 2 (AMX
    tiles; any CPU runs it, with mode 0's kernels where it has no AMX)."""
    return int(native.lib.inferd_q8_conv_mode(g.cin, g.cout, g.k[0], g.k[1], g.s[1], g.d[1], g.out_sp[0],
                                              g.out_sp[1]))


def _pack_conv(w: np.ndarray, mode: int) -> tuple[np.ndarray, np.ndarray]:
    """(packed weights, row sums) of a conv's (N, C, kh, kw) weights: groups of 4 channels at one tap, in rows
    of channels (mode 0), panels of 32 channels (mode 1), or rows of channels ordered tap by tap (mode 2)."""
    n, c = w.shape[:2]
    taps = int(np.prod(w.shape[2:]))
    w = np.ascontiguousarray(w, np.int8)
    wp = native.empty_aligned((int(native.lib.inferd_q8_conv_packed_size(n, c, taps, mode)),), np.int8)
    wsum = np.empty(n, np.int32)
    native.lib.inferd_q8_conv_pack(_c("signed char *", w), n, c, taps, mode, _c("signed char *", wp),
                                   _c("int *", wsum))
    return wp, wsum


def set_isa(level: int) -> int:
    """Force the int8 micro-kernel (tests): 0 portable C, 1 VNNI/sdot where the CPU has it, 2 VNNI and AMX tiles
    where it has them, -1 the best. Returns what is set, as ``isa()`` reports it: 3 where that is the AVX2 kernels
    (an x86 CPU without AVX-512 VNNI; ``inferd_q8_cap_avx512(1)`` makes 1 and -1 pick them on any x86 CPU with
    AVX2)."""
    return int(native.lib.inferd_q8_set_isa(level)) if native.AVAILABLE else -1


def isa() -> int:
    return native.int8_isa()


@register_kernel
class QConvNative(BoundKernel):
    """QLinearConv, 2-D, group 1 (im2col blocks + int8 GEMM) or depthwise (direct)."""

    name = "int8_native"
    ops = ("QLinearConv",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        x, w = layer.inputs[0], layer.inputs[3]
        if not native.AVAILABLE or x is None or w is None or len(x.shape) != 4 or len(w.shape) != 4:
            return False
        if np.dtype(x.dtype) not in INT8_TYPES or np.dtype(w.dtype) != _I8 or np.dtype(layer.outputs[0].dtype) not in INT8_TYPES:
            return False
        if not _consts(layer, range(1, 9)) or (layer.inputs[1].size != 1 or (layer.has_input(2) and layer.inputs[2].size != 1)):
            return False
        if not layer.attr("w_zp0"):
            return False
        g = layer_geom(layer)
        return g.group == 1 or (g.group == g.cin == g.cout)

    def transform_key(self, layer: Layer) -> tuple[Any, ...]:
        return weights_key(layer)

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not _zero(layer, raw, 5):
            raise ValueError(f"{layer.name}: int8_native needs weight zero points of 0")
        g = layer_geom(layer)
        w = np.asarray(raw[raw_key(3)])
        out: dict[str, np.ndarray] = {}
        if g.group == 1:
            mode = _conv_mode(g)
            out["wp"], out["wsum"] = _pack_conv(w, mode)
            out["mode"] = np.array([mode], np.int32)
        else:
            out["w"] = np.ascontiguousarray(w.reshape(g.cout, -1), np.int8)
        out["bias"] = (np.ascontiguousarray(np.asarray(raw[raw_key(8)]).reshape(-1), np.int32) if layer.has_input(8)
                       else np.zeros(g.cout, np.int32))
        out["mult"] = _mult(raw, 1, 4, 6, g.cout)
        out["q"] = _qparams(layer, raw, 2, 6, 7)
        return out

    def transformed_nbytes(self, layer: Layer) -> int:
        g = layer_geom(layer)
        k = (g.cin // g.group) * int(np.prod(g.k))
        if g.group == 1:
            wb = int(native.lib.inferd_q8_conv_packed_size(g.cout, g.cin, int(np.prod(g.k)), _conv_mode(g)))
        else:
            wb = g.cout * k
        return wb + 12 * g.cout + 36

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        x, y = inputs[0], outputs[0]
        if x is None or not x.flags.c_contiguous or not y.flags.c_contiguous:
            return None
        g = layer_geom(layer)
        zx, zy, lo, hi = (int(v) for v in params["q"])
        xs, ys = int(x.dtype == _I8), int(y.dtype == _I8)
        n, c, h, wd = x.shape
        oh, ow = g.out_sp
        kh, kw = g.k
        sh, sw = g.s
        dh, dw = g.d
        pt, pl = g.pb
        lib, threads = native.lib, native.num_threads()
        bias, mult = _c("int *", params["bias"]), _c("float *", params["mult"])
        xb = [native._vptr(x[i:i + 1]) for i in range(n)]
        yb = [native._vptr(y[i:i + 1]) for i in range(n)]
        keep = (x, y, params)  # the pointers above live as long as these arrays
        if g.group == 1:
            wp, wsum = _c("signed char *", params["wp"]), _c("int *", params["wsum"])
            mode = int(params["mode"][0])

            def call() -> None:
                _ = keep
                for i in range(n):
                    if lib.inferd_q8_conv2d(xb[i], xs, zx, c, h, wd, wp, wsum, g.cout, kh, kw, sh, sw, dh, dw, pt, pl,
                                            oh, ow, bias, mult, zy, lo, hi, yb[i], ys, mode, threads):
                        raise MemoryError(f"{layer.name}: int8 conv out of memory")
        else:
            w = _c("signed char *", params["w"])

            def call() -> None:
                _ = keep
                for i in range(n):
                    if lib.inferd_q8_dwconv2d(xb[i], xs, zx, c, h, wd, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow,
                                              bias, mult, zy, lo, hi, yb[i], ys, threads):
                        raise MemoryError(f"{layer.name}: int8 depthwise conv out of memory")
        return call


@register_kernel
class QMatMulNative(BoundKernel):
    """QLinearMatMul with a constant 2-D B (a quantised Linear / Gemm): rows of A times packed B^T."""

    name = "int8_native"
    ops = ("QLinearMatMul",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        a, b = layer.inputs[0], layer.inputs[3]
        if not native.AVAILABLE or a is None or b is None or len(b.shape) != 2 or len(a.shape) < 1:
            return False
        if np.dtype(a.dtype) not in INT8_TYPES or np.dtype(b.dtype) != _I8 or np.dtype(layer.outputs[0].dtype) not in INT8_TYPES:
            return False
        if not _consts(layer, range(1, 9)) or layer.inputs[1].size != 1 or (layer.has_input(2) and layer.inputs[2].size != 1):
            return False
        return bool(layer.attr("w_zp0"))

    def transform_key(self, layer: Layer) -> tuple[Any, ...]:
        return weights_key(layer)

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not _zero(layer, raw, 5):
            raise ValueError(f"{layer.name}: int8_native needs weight zero points of 0")
        b = np.asarray(raw[raw_key(3)])
        k, n = b.shape
        out: dict[str, np.ndarray] = {}
        out["wp"], out["wsum"] = _pack(b.T)
        out["bias"] = (np.ascontiguousarray(np.asarray(raw[raw_key(8)]).reshape(-1), np.int32)
                       if layer.attr("bias") and layer.has_input(8) else np.zeros(n, np.int32))
        out["mult"] = _mult(raw, 1, 4, 6, n)
        out["q"] = _qparams(layer, raw, 2, 6, 7)
        return out

    def transformed_nbytes(self, layer: Layer) -> int:
        k, n = layer.inputs[3].shape
        return int(-(-n // 16) * 16 * ((k + 3) & ~3)) + 12 * n + 32

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        a, y = inputs[0], outputs[0]
        if a is None or not a.flags.c_contiguous or not y.flags.c_contiguous:
            return None
        zx, zy, lo, hi = (int(v) for v in params["q"])
        k = a.shape[-1]
        n = y.shape[-1]
        m = a.size // k
        xs, ys = int(a.dtype == _I8), int(y.dtype == _I8)
        lib, threads = native.lib, native.num_threads()
        ap = native._vptr(a)
        yp = native._vptr(y)
        wp, wsum = _c("signed char *", params["wp"]), _c("int *", params["wsum"])
        bias, mult = _c("int *", params["bias"]), _c("float *", params["mult"])
        keep = (a, y, params)

        def call() -> None:
            _ = keep
            if lib.inferd_q8_gemm(ap, xs, zx, k, m, k, wp, wsum, n, bias, mult, zy, lo, hi, yp, ys, n, 1, threads):
                raise MemoryError(f"{layer.name}: int8 GEMM out of memory")

        return call


def _binary_params(layer: Layer, raw: dict[str, np.ndarray]) -> tuple:
    """A QLinearAdd/Mul's constants: the three scales as float32 scalars (the oracle's), the zero points (zc as
    float32) and the output range with a fused clamp folded in."""
    from .quant import _f32

    def z(i: int) -> int:
        return int(np.asarray(raw[raw_key(i)]).reshape(-1)[0]) if layer.has_input(i) else 0

    sa, sb, sc = (_f32(raw[raw_key(i)]).reshape(-1)[0] for i in (1, 4, 6))
    lo, hi = qrange(layer.outputs[0].dtype)
    c = layer.attr("qclamp")
    if c is not None:
        lo, hi = max(lo, int(c[0])), min(hi, int(c[1]))
    return sa, sb, sc, z(2), z(5), np.float32(z(7)), lo, hi


@register_kernel
class QAddNative(BoundKernel):
    """QLinearAdd of two same-shaped int8/uint8 tensors (residual adds; one of them may be a constant, as a
    transformer's position embedding) in C, with the oracle's float arithmetic."""

    name = "int8_native"
    ops = ("QLinearAdd",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        a, b = layer.inputs[0], layer.inputs[3]
        if not native.AVAILABLE or a is None or b is None or tuple(a.shape) != tuple(b.shape):
            return False
        if (0 in layer.const_inputs and 3 in layer.const_inputs) or not _consts(layer, (1, 2, 4, 5, 6, 7)):
            return False
        return all(np.dtype(t.dtype) in INT8_TYPES for t in (a, b, layer.outputs[0]))

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sa, sb, sc, za, zb, zc, lo, hi = _binary_params(layer, raw)
        out = {"f": np.array([sa / sc, sb / sc, zc], np.float32), "i": np.array([za, zb, lo, hi], np.int64)}
        for i in (0, 3):
            if i in layer.const_inputs:
                out["c"] = np.ascontiguousarray(raw[raw_key(i)], layer.inputs[i].dtype)
        return out

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        a, b, y = inputs[0], inputs[3], outputs[0]
        if 0 in layer.const_inputs:
            a = params["c"]
        elif 3 in layer.const_inputs:
            b = params["c"]
        if a is None or b is None or not (a.flags.c_contiguous and b.flags.c_contiguous and y.flags.c_contiguous):
            return None
        ra, rb, zc = (float(v) for v in params["f"])
        za, zb, lo, hi = (int(v) for v in params["i"])
        ap, bp, yp = (native._vptr(v) for v in (a, b, y))
        asg, bsg = int(a.dtype == _I8), int(b.dtype == _I8)
        n, lib, threads = int(y.size), native.lib, native.num_threads()
        keep = (a, b, y)

        def call() -> None:
            _ = keep
            lib.inferd_q8_add(ap, asg, za, ra, bp, bsg, zb, rb, zc, lo, hi, yp, n, threads)

        return call


@register_kernel
class QuantizeNative(BoundKernel):
    """QuantizeLinear of a float32 tensor with one constant scale and zero point, to int8/uint8 (a model's input
    quantisation): the oracle's float32 division and rounding, in C over the threads."""

    name = "int8_native"
    ops = ("QuantizeLinear",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        x = layer.inputs[0]
        if not native.AVAILABLE or x is None or np.dtype(x.dtype) != np.float32 or 0 in layer.const_inputs:
            return False
        if np.dtype(layer.outputs[0].dtype) not in INT8_TYPES or not layer.has_input(1) or not _consts(layer, (1, 2)):
            return False
        return layer.inputs[1].size == 1 and (not layer.has_input(2) or layer.inputs[2].size == 1)

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        zp = int(np.asarray(raw[raw_key(2)]).reshape(-1)[0]) if layer.has_input(2) else 0
        lo, hi = qrange(layer.outputs[0].dtype)
        return {"s": np.asarray(raw[raw_key(1)], np.float32).reshape(1), "i": np.array([zp, lo, hi], np.int64)}

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        x, y = inputs[0], outputs[0]
        if x is None or not (x.flags.c_contiguous and y.flags.c_contiguous):
            return None
        s = float(params["s"][0])
        zp, lo, hi = (int(v) for v in params["i"])
        xp = native._rawptr(x)
        yp = native._vptr(y)
        n, lib, threads = int(y.size), native.lib, native.num_threads()
        keep = (x, y)

        def call() -> None:
            _ = keep
            lib.inferd_q8_quantize(xp, s, zp, lo, hi, yp, n, threads)

        return call


@register_kernel
class DequantizeNative(BoundKernel):
    """DequantizeLinear of an int8/uint8 tensor with one constant float32 scale and zero point (a model's output
    dequantisation): the oracle's arithmetic in C (numpy widened every byte to int64 first)."""

    name = "int8_native"
    ops = ("DequantizeLinear",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        x = layer.inputs[0]
        if not native.AVAILABLE or x is None or np.dtype(x.dtype) not in INT8_TYPES or 0 in layer.const_inputs:
            return False
        if np.dtype(layer.outputs[0].dtype) != np.float32 or not layer.has_input(1) or not _consts(layer, (1, 2)):
            return False
        s = layer.inputs[1]
        return (s.size == 1 and np.dtype(s.dtype) == np.float32
                and (not layer.has_input(2) or layer.inputs[2].size == 1))

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        zp = int(np.asarray(raw[raw_key(2)]).reshape(-1)[0]) if layer.has_input(2) else 0
        return {"s": np.asarray(raw[raw_key(1)], np.float32).reshape(1), "i": np.array([zp], np.int64)}

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        x, y = inputs[0], outputs[0]
        if x is None or not (x.flags.c_contiguous and y.flags.c_contiguous):
            return None
        s, zp = float(params["s"][0]), int(params["i"][0])
        xp = native._vptr(x)
        yp = native._rawptr(y)
        xsg, n, lib, threads = int(x.dtype == _I8), int(y.size), native.lib, native.num_threads()
        keep = (x, y)

        def call() -> None:
            _ = keep
            lib.inferd_q8_dequantize(xp, xsg, zp, s, yp, n, threads)

        return call


@register_kernel
class QGlobalAveragePoolNative(BoundKernel):
    """QLinearGlobalAveragePool, channels first, constant quantisation parameters: integer row sums in C."""

    name = "int8_native"
    ops = ("QLinearGlobalAveragePool",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        x = layer.inputs[0]
        if not native.AVAILABLE or x is None or int(layer.attr("channels_last", 0)) or len(x.shape) < 3:
            return False
        if np.dtype(x.dtype) not in INT8_TYPES or np.dtype(layer.outputs[0].dtype) not in INT8_TYPES:
            return False
        return (layer.has_input(1) and layer.has_input(3) and _consts(layer, (1, 2, 3, 4))
                and int(np.prod(x.shape[2:])) < 1 << 23)

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from .quant import _f32

        hw = int(np.prod(layer.inputs[0].shape[2:]))
        xs, ys = _f32(raw[raw_key(1)]).reshape(-1)[0], _f32(raw[raw_key(3)]).reshape(-1)[0]
        m = np.float32(xs / (ys * np.float32(hw)))  # the oracle's float32 expression, operation for operation

        def z(i: int) -> int:
            return int(np.asarray(raw[raw_key(i)]).reshape(-1)[0]) if layer.has_input(i) else 0

        lo, hi = qrange(layer.outputs[0].dtype)
        return {"m": np.array([m], np.float32), "i": np.array([z(2), z(4), lo, hi], np.int64)}

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        x, y = inputs[0], outputs[0]
        if x is None or not (x.flags.c_contiguous and y.flags.c_contiguous):
            return None
        m = float(params["m"][0])
        zx, zy, lo, hi = (int(v) for v in params["i"])
        hw = int(np.prod(x.shape[2:]))
        rows = int(x.size) // max(1, hw)
        xp = native._vptr(x)
        yp = native._vptr(y)
        xsg, lib, threads = int(x.dtype == _I8), native.lib, native.num_threads()
        keep = (x, y)

        def call() -> None:
            _ = keep
            lib.inferd_q8_gap(xp, xsg, zx, rows, hw, m, zy, lo, hi, yp, threads)

        return call


def _row_broadcast(a_shape: Sequence[int], b_shape: Sequence[int]) -> tuple[int, int] | None:
    """(rows, inner) where b is one value per row of a viewed as rows x inner (b's shape a's leading dims then
    ones: [1, C, 1, 1] against [1, C, H, W]); None otherwise."""
    b = (1,) * (len(a_shape) - len(b_shape)) + tuple(b_shape)
    if len(b) != len(a_shape):
        return None
    k = len(b)
    while k > 0 and b[k - 1] == 1:
        k -= 1
    if tuple(b[:k]) != tuple(a_shape[:k]):
        return None
    return int(np.prod(a_shape[:k], dtype=np.int64)), int(np.prod(a_shape[k:], dtype=np.int64))


@register_kernel
class QMulNative(BoundKernel):
    """QLinearMul of int8/uint8 tensors of one shape, or one scaled per row by the other ([1, C, 1, 1] against
    [1, C, H, W]: efficientnet's squeeze-excitation and SiLU), in C with the oracle's float32 expression."""

    name = "int8_native"
    ops = ("QLinearMul",)
    priority = 10

    def _shape(self, layer: Layer) -> tuple[bool, int, int, bool] | None:
        """(swap, rows, inner, b_row): swap when input 3 is the full one."""
        a, b = layer.inputs[0], layer.inputs[3]
        if tuple(a.shape) == tuple(b.shape):
            n = int(np.prod(a.shape, dtype=np.int64))
            return False, 1, n, False
        rb = _row_broadcast(a.shape, b.shape)
        if rb is not None and tuple(layer.outputs[0].shape) == tuple(a.shape):
            return False, rb[0], rb[1], True
        ra = _row_broadcast(b.shape, a.shape)
        if ra is not None and tuple(layer.outputs[0].shape) == tuple(b.shape):
            return True, ra[0], ra[1], True
        return None

    def applies(self, layer: Layer) -> bool:
        a, b = layer.inputs[0], layer.inputs[3]
        if not native.AVAILABLE or a is None or b is None:
            return False
        if 0 in layer.const_inputs or 3 in layer.const_inputs or not _consts(layer, (1, 2, 4, 5, 6, 7)):
            return False
        if not layer.has_input(1) or not layer.has_input(4) or not layer.has_input(6):
            return False
        if not all(np.dtype(t.dtype) in INT8_TYPES for t in (a, b, layer.outputs[0])):
            return False
        return self._shape(layer) is not None

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sa, sb, sc, za, zb, zc, lo, hi = _binary_params(layer, raw)
        # the oracle's float32 scalars: (sa * sb) / sc, then zc
        return {"f": np.array([sa * sb / sc, zc], np.float32), "i": np.array([za, zb, lo, hi], np.int64)}

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        a, b, y = inputs[0], inputs[3], outputs[0]
        shp = self._shape(layer)
        if a is None or b is None or shp is None or not (a.flags.c_contiguous and b.flags.c_contiguous
                                                         and y.flags.c_contiguous):
            return None
        swap, rows, inner, b_row = shp
        m, zc = (float(v) for v in params["f"])
        za, zb, lo, hi = (int(v) for v in params["i"])
        if swap:
            a, b, za, zb = b, a, zb, za
        ap, bp, yp = (native._vptr(v) for v in (a, b, y))
        asg, bsg = int(a.dtype == _I8), int(b.dtype == _I8)
        lib, threads = native.lib, native.num_threads()
        keep = (a, b, y)

        def call() -> None:
            _ = keep
            lib.inferd_q8_mul(ap, asg, za, bp, bsg, zb, rows, inner, int(b_row), m, zc, lo, hi, yp, threads)

        return call


@register_kernel
class QUnaryTableNative(BoundKernel):
    """QLinearSigmoid / QLinearLeakyRelu as onnxruntime evaluates them, a 256-entry table (built at load from the
    constant scales), and QLinearLookup (its table given), looked up by byte in C."""

    name = "int8_native"
    ops = ("QLinearSigmoid", "QLinearLeakyRelu", "QLinearLookup")
    priority = 10

    def applies(self, layer: Layer) -> bool:
        x = layer.inputs[0]
        if not native.AVAILABLE or x is None or 0 in layer.const_inputs:
            return False
        if np.dtype(x.dtype) not in INT8_TYPES or np.dtype(layer.outputs[0].dtype) not in INT8_TYPES:
            return False
        if layer.op == "QLinearLookup":
            return _consts(layer, (1, 2))
        if np.dtype(layer.outputs[0].dtype) != np.dtype(x.dtype):
            return False
        return layer.has_input(1) and layer.has_input(3) and _consts(layer, (1, 2, 3, 4))

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from .quant import by_byte, qunary_table

        if layer.op == "QLinearLookup":
            return {"table": np.ascontiguousarray(raw[raw_key(1)], np.uint8)}
        dt = np.dtype(layer.inputs[0].dtype)
        xz = raw.get(raw_key(2)) if layer.has_input(2) else None
        yz = raw.get(raw_key(4)) if layer.has_input(4) else None
        t = qunary_table(layer.op, float(layer.attr("alpha", 0.01)), raw[raw_key(1)], xz, raw[raw_key(3)], yz, dt)
        return {"table": np.ascontiguousarray(by_byte(t, dt)).view(np.uint8)}

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        x, y = inputs[0], outputs[0]
        if x is None or not (x.flags.c_contiguous and y.flags.c_contiguous):
            return None
        table = np.ascontiguousarray(params["table"]).view(np.uint8)
        xp = native._vptr(x)
        yp = native._vptr(y)
        tp = native.ffi.cast("unsigned char *", native.ffi.from_buffer(table))
        n, lib, threads = int(y.size), native.lib, native.num_threads()
        keep = (x, y, table)

        def call() -> None:
            _ = keep
            lib.inferd_q8_map(xp, tp, yp, n, threads)

        return call
