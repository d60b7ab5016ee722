"""Quantised operators: the QDQ pair (QuantizeLinear / DequantizeLinear), the QOperator ops onnxruntime's
``quantize_dynamic`` and ``quantize_static(quant_format=QOperator)`` write (QLinearConv, QLinearMatMul,
ConvInteger, MatMulInteger, DynamicQuantizeLinear) and their com.microsoft companions (QLinearAdd, QLinearMul,
QLinearSigmoid, QLinearLeakyRelu, QLinearGlobalAveragePool, QLinearConcat, DynamicQuantizeMatMul,
MatMulIntegerToFloat).

Every op has a numpy oracle here. Arithmetic follows onnxruntime's CPU kernels where the ONNX text leaves a
choice, so that an int8 model gives onnxruntime's integers: requantisation is ``rint(float32(acc) * m) + zp``
with the float32 multiplier ``m = x_scale * w_scale / y_scale`` (MLAS' ``MlasRequantizeOutput``), rounding half
to even; DynamicQuantizeLinear takes its range with 0 included and a scale of 1 for a constant-zero input.

Import fuses QDQ patterns into QLinearConv / QLinearMatMul (``inferd.frontend.quantfuse``), which then carry
two extensions of the standard ops: ``attrs["qclamp"] = (lo, hi)``, a fused Relu/Clip applied as a clamp in the
output's integer domain (quantisation is monotone, so clamping the integers equals quantising the clamped
float), and for QLinearMatMul an int32 bias as a 9th input (``attrs["bias"]``), added to the accumulator.

The fast CPU kernels for the two GEMM-shaped ops live in ``inferd.ops.quant_native``.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .. import native
from ..errors import ShapeError, UnsupportedOpError
from ..ir import Node, TensorInfo
from .base import Kernel, Layer, OpSpec, full_inputs, register_kernel, register_op
from .conv import conv_geom, conv_nd
from .gemm import matmul_shape

Infos = list["TensorInfo | None"]

#: the integer types the oracles handle; the fused int8 kernels take int8/uint8 only
QTYPES = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16), np.dtype(np.uint16))
INT8_TYPES = (np.dtype(np.int8), np.dtype(np.uint8))
#: ops of the com.microsoft domain that import accepts
MS_OPS = ("QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearGlobalAveragePool", "QLinearConcat",
          "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLSTM")


def qrange(dt: np.dtype) -> tuple[int, int]:
    info = np.iinfo(np.dtype(dt))
    return int(info.min), int(info.max)


def _f32(v: np.ndarray | float | None) -> np.ndarray:
    return np.asarray(1.0 if v is None else v, np.float32)


def _zp(v: np.ndarray | None, dt: np.dtype = np.dtype(np.uint8)) -> np.ndarray:
    return np.zeros((), dt) if v is None else np.asarray(v)


def _bcast(p: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    """A per-tensor (size 1) or per-axis (1-D) parameter shaped to broadcast along ``axis`` of an ndim array."""
    p = np.asarray(p)
    if p.size == 1:
        return p.reshape(())
    shape = [1] * ndim
    shape[axis] = p.size
    return p.reshape(shape)


def quantize(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, dt: np.dtype, axis: int = 1) -> np.ndarray:
    """saturate(rint(x / scale) + zp) in float32, as onnxruntime's QuantizeLinear."""
    x = np.asarray(x, np.float32)
    ax = axis % x.ndim if x.ndim else 0
    s, z = _bcast(_f32(scale), x.ndim, ax), _bcast(np.asarray(zp, np.float32), x.ndim, ax)
    lo, hi = qrange(dt)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.rint(x / s) + z
    return np.clip(y, lo, hi).astype(dt)


def dequantize(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, axis: int = 1) -> np.ndarray:
    """(x - zp) * scale in float32 (the scale's type where that is a float16)."""
    x = np.asarray(x)
    ax = axis % x.ndim if x.ndim else 0
    s = np.asarray(scale)
    out_t = s.dtype if np.issubdtype(s.dtype, np.floating) else np.dtype(np.float32)
    z = _bcast(np.asarray(0 if zp is None else zp, np.int64), x.ndim, ax)
    return ((x.astype(np.int64) - z).astype(np.float32) * _bcast(s.astype(np.float32), x.ndim, ax)).astype(out_t)


def requantize(acc: np.ndarray, mult: np.ndarray, zp: np.ndarray, dt: np.dtype, axis: int,
               clamp: tuple[int, int] | None = None) -> np.ndarray:
    """int32 accumulator -> output integers: rint(float32(acc) * mult) + zp, saturated (and clamped)."""
    m = _bcast(np.asarray(mult, np.float32), acc.ndim, axis % acc.ndim)
    v = np.rint(acc.astype(np.float32) * m) + np.float32(np.asarray(zp).reshape(-1)[0])
    lo, hi = qrange(dt)
    if clamp is not None:
        lo, hi = max(lo, int(clamp[0])), min(hi, int(clamp[1]))
    return np.clip(v, lo, hi).astype(dt)


def conv_multiplier(x_scale: np.ndarray, w_scale: np.ndarray, y_scale: np.ndarray) -> np.ndarray:
    """The float32 requantisation multiplier per output channel (1 element per tensor-wide scale)."""
    return (_f32(x_scale).reshape(-1)[0] * _f32(w_scale).reshape(-1)) / _f32(y_scale).reshape(-1)[0]


# --------------------------------------------------------------------------- checks

def _axis(node: Node) -> int:
    return int(node.attr("axis", 1))


def _check_qdq(node: Node, opset: int) -> None:
    if int(node.attr("block_size", 0) or 0) > 0:
        raise UnsupportedOpError(node.op, node.name, opset, "pattern: blocked quantisation (block_size > 0) is not "
                                                            "supported; per-tensor and per-axis scales are")
    od = int(node.attr("output_dtype", 0) or 0)
    if node.op == "QuantizeLinear" and od not in (0, 2, 3, 4, 5):
        raise UnsupportedOpError(node.op, node.name, opset, f"pattern: output_dtype {od} (int8, uint8, int16 and "
                                                            "uint16 are supported; 4-bit and float8 are not)")


def _qtype_check(node: Node, t: TensorInfo | None, what: str, allowed: Sequence[np.dtype] = QTYPES) -> None:
    if t is not None and np.dtype(t.dtype) not in allowed:
        raise UnsupportedOpError(node.op, node.name, None, f"pattern: {what} of type {np.dtype(t.dtype).name} "
                                                           f"(supported: {', '.join(d.name for d in allowed)})")


def _param_check(node: Node, ins: Infos, pos: Sequence[int], channels: int | None, what: str) -> None:
    for p in pos:
        t = ins[p] if p < len(ins) else None
        if t is None:
            continue
        if t.size != 1 and (len(t.shape) != 1 or channels is None or t.size != channels):
            raise UnsupportedOpError(node.op, node.name, None, f"pattern: {what} parameter {node.inputs[p]!r} of shape "
                                                               f"{list(t.shape)} (per-tensor or one per channel "
                                                               f"{channels} supported)")


# --------------------------------------------------------------------------- QuantizeLinear / DequantizeLinear

def _infer_q(node: Node, ins: Infos, consts) -> list:
    x = ins[0]
    assert x is not None
    zp = ins[2] if len(ins) > 2 else None
    od = int(node.attr("output_dtype", 0) or 0)
    dt = np.dtype(zp.dtype) if zp is not None else {0: np.dtype(np.uint8), 2: np.dtype(np.uint8), 3: np.dtype(np.int8),
                                                   4: np.dtype(np.uint16), 5: np.dtype(np.int16)}[od]
    _qtype_check(node, TensorInfo("zp", (), dt), "zero point")
    ax = _axis(node) % max(1, len(x.shape))
    _param_check(node, ins, (1, 2), x.shape[ax] if x.shape else None, "scale/zero point")
    return [(x.shape, dt)]


def _ref_q(node: Node, ins: list) -> list:
    x, s = ins[0], ins[1]
    zp = ins[2] if len(ins) > 2 else None
    od = int(node.attr("output_dtype", 0) or 0)
    dt = np.asarray(zp).dtype if zp is not None else {0: np.uint8, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16}[od]
    return [quantize(x, s, _zp(zp, dt), np.dtype(dt), _axis(node))]


def _infer_dq(node: Node, ins: Infos, consts) -> list:
    x, s = ins[0], ins[1]
    assert x is not None and s is not None
    _qtype_check(node, x, "input", QTYPES + (np.dtype(np.int32),))
    ax = _axis(node) % max(1, len(x.shape))
    _param_check(node, ins, (1, 2), x.shape[ax] if x.shape else None, "scale/zero point")
    out_t = s.dtype if np.issubdtype(np.dtype(s.dtype), np.floating) else np.dtype(np.float32)
    return [(x.shape, out_t)]


def _ref_dq(node: Node, ins: list) -> list:
    return [dequantize(ins[0], ins[1], ins[2] if len(ins) > 2 else None, _axis(node))]


# --------------------------------------------------------------------------- DynamicQuantizeLinear

def dynamic_qparams(x: np.ndarray) -> tuple[np.float32, np.uint8]:
    """onnxruntime's uint8 range for a float tensor: [min(x, 0), max(x, 0)] over 255 steps."""
    x = np.asarray(x, np.float32)
    lo = min(float(x.min()) if x.size else 0.0, 0.0)
    hi = max(float(x.max()) if x.size else 0.0, 0.0)
    lo32, hi32 = np.float32(lo), np.float32(hi)
    scale = np.float32(1.0) if hi32 == lo32 else np.float32((hi32 - lo32) / np.float32(255.0))
    zp = np.float32(0.0) - lo32 / scale
    zp = np.uint8(np.rint(np.clip(zp, 0.0, 255.0)))
    return scale, zp


def _infer_dql(node: Node, ins: Infos, consts) -> list:
    x = ins[0]
    assert x is not None
    return [(x.shape, np.dtype(np.uint8)), ((), np.dtype(np.float32)), ((), np.dtype(np.uint8))]


def _ref_dql(node: Node, ins: list) -> list:
    s, z = dynamic_qparams(ins[0])
    return [quantize(ins[0], s, z, np.dtype(np.uint8)), np.asarray(s, np.float32), np.asarray(z, np.uint8)]


# --------------------------------------------------------------------------- integer conv / matmul

def _geo(node: Node, x: tuple[int, ...], w: tuple[int, ...]):
    return conv_geom(node, x, w)


def _centered(v: np.ndarray, zp: np.ndarray | None, axis: int | None = None) -> np.ndarray:
    v = np.asarray(v).astype(np.int64)
    if zp is None:
        return v
    z = np.asarray(zp).astype(np.int64)
    if z.size == 1:
        return v - z.reshape(())
    return v - _bcast(z, v.ndim, axis if axis is not None else 0)


def int_conv(x: np.ndarray, xz: np.ndarray | None, w: np.ndarray, wz: np.ndarray | None, node: Node) -> np.ndarray:
    """Exact integer convolution of (x - xz) and (w - wz) (int64; padding reads the zero point, i.e. 0)."""
    geo = _geo(node, x.shape, w.shape)
    xc = _centered(x, xz).astype(np.float64)  # float64 sums of int8 products are exact far beyond any layer's K
    wc = _centered(w, wz, 0).astype(np.float64)
    return np.rint(conv_nd(xc, wc, geo)).astype(np.int64)


def _infer_qconv(node: Node, ins: Infos, consts) -> list:
    x, w = ins[0], ins[3]
    if x is None or w is None:
        raise ShapeError(f"QLinearConv {node.name!r}: x and w are required")
    _qtype_check(node, x, "input x", INT8_TYPES)
    _qtype_check(node, w, "weights w", INT8_TYPES)
    geo = _geo(node, x.shape, w.shape)
    _param_check(node, ins, (1, 2, 6, 7), None, "x/y")
    _param_check(node, ins, (4, 5), geo.cout, "weight")
    yz = ins[7]
    dt = np.dtype(yz.dtype) if yz is not None else np.dtype(x.dtype)
    return [((geo.n, geo.cout) + geo.out_sp, dt)]


def _ref_qconv(node: Node, ins: list) -> list:
    x, xs, xz, w, ws, wz, ys, yz = ins[:8]
    b = ins[8] if len(ins) > 8 else None
    acc = int_conv(x, xz, w, wz, node)
    if b is not None:
        acc = acc + np.asarray(b, np.int64).reshape((1, -1) + (1,) * (acc.ndim - 2))
    dt = np.asarray(yz).dtype if yz is not None else np.asarray(x).dtype
    return [requantize(acc.astype(np.int32), conv_multiplier(xs, ws, ys), _zp(yz, dt), dt, 1, node.attr("qclamp"))]


def _infer_conv_integer(node: Node, ins: Infos, consts) -> list:
    x, w = ins[0], ins[1]
    assert x is not None and w is not None
    _qtype_check(node, x, "input x", INT8_TYPES)
    _qtype_check(node, w, "weights w", INT8_TYPES)
    geo = _geo(node, x.shape, w.shape)
    _param_check(node, ins, (2,), None, "x zero point")
    _param_check(node, ins, (3,), geo.cout, "w zero point")
    return [((geo.n, geo.cout) + geo.out_sp, np.dtype(np.int32))]


def _ref_conv_integer(node: Node, ins: list) -> list:
    xz = ins[2] if len(ins) > 2 else None
    wz = ins[3] if len(ins) > 3 else None
    return [int_conv(ins[0], xz, ins[1], wz, node).astype(np.int32)]


def int_matmul(a: np.ndarray, az: np.ndarray | None, b: np.ndarray, bz: np.ndarray | None) -> np.ndarray:
    """Exact (a - az) @ (b - bz) as int64; a per-row ``az`` (1-D of M) and a per-column ``bz`` (1-D of N) allowed."""
    ac = np.asarray(a).astype(np.int64)
    if az is not None:
        z = np.asarray(az).astype(np.int64)
        ac = ac - (z.reshape(()) if z.size == 1 else z.reshape(-1, 1))
    bc = np.asarray(b).astype(np.int64)
    if bz is not None:
        z = np.asarray(bz).astype(np.int64)
        bc = bc - (z.reshape(()) if z.size == 1 else z.reshape(z.shape[:-1] + (1, z.shape[-1])) if z.ndim > 1 else z)
    return np.matmul(ac.astype(np.float64), bc.astype(np.float64)).round().astype(np.int64)


def _infer_qmatmul(node: Node, ins: Infos, consts) -> list:
    a, b = ins[0], ins[3]
    assert a is not None and b is not None
    _qtype_check(node, a, "input a", INT8_TYPES)
    _qtype_check(node, b, "input b", INT8_TYPES)
    out = matmul_shape(a.shape, b.shape, node.name)
    _param_check(node, ins, (1, 2, 6, 7), None, "a/y")
    _param_check(node, ins, (4, 5), b.shape[-1], "b")
    yz = ins[7]
    return [(out, np.dtype(yz.dtype) if yz is not None else np.dtype(a.dtype))]


def _ref_qmatmul(node: Node, ins: list) -> list:
    a, a_s, az, b, bs, bz, ys, yz = ins[:8]
    acc = int_matmul(a, az, b, bz)
    if node.attr("bias") and len(ins) > 8 and ins[8] is not None:
        acc = acc + np.asarray(ins[8], np.int64)
    dt = np.asarray(yz).dtype if yz is not None else np.asarray(a).dtype
    return [requantize(acc.astype(np.int32), conv_multiplier(a_s, bs, ys), _zp(yz, dt), dt, -1, node.attr("qclamp"))]


def _infer_matmul_integer(node: Node, ins: Infos, consts) -> list:
    a, b = ins[0], ins[1]
    assert a is not None and b is not None
    _qtype_check(node, a, "input A", INT8_TYPES)
    _qtype_check(node, b, "input B", INT8_TYPES)
    return [(matmul_shape(a.shape, b.shape, node.name), np.dtype(np.int32))]


def _opt(ins: list, i: int):
    return ins[i] if len(ins) > i else None


def _ref_matmul_integer(node: Node, ins: list) -> list:
    return [int_matmul(ins[0], _opt(ins, 2), ins[1], _opt(ins, 3)).astype(np.int32)]


# --------------------------------------------------------------------------- com.microsoft

def _infer_dqmatmul(node: Node, ins: Infos, consts) -> list:
    a, b = ins[0], ins[1]
    assert a is not None and b is not None
    _qtype_check(node, b, "input B", INT8_TYPES)
    return [(matmul_shape(a.shape, b.shape, node.name), np.dtype(np.float32))]


def _ref_dqmatmul(node: Node, ins: list) -> list:
    """DynamicQuantizeMatMul(A, B, b_scale, b_zp?, bias?): A quantised to uint8 as DynamicQuantizeLinear does."""
    a, b, bs = ins[0], ins[1], ins[2]
    bz, bias = _opt(ins, 3), _opt(ins, 4)
    s, z = dynamic_qparams(a)
    aq = quantize(a, s, z, np.dtype(np.uint8))
    acc = int_matmul(aq, z, b, bz).astype(np.float32)
    y = acc * (np.float32(s) * _f32(bs).reshape(-1))
    if bias is not None:
        y = y + np.asarray(bias, np.float32)
    return [y.astype(np.float32)]


def _infer_mmi2f(node: Node, ins: Infos, consts) -> list:
    a, b = ins[0], ins[1]
    assert a is not None and b is not None
    _qtype_check(node, a, "input A", INT8_TYPES)
    _qtype_check(node, b, "input B", INT8_TYPES)
    return [(matmul_shape(a.shape, b.shape, node.name), np.dtype(np.float32))]


def _ref_mmi2f(node: Node, ins: list) -> list:
    """MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zp?, b_zp?, bias?)."""
    a, b, a_s, bs = ins[:4]
    az, bz, bias = _opt(ins, 4), _opt(ins, 5), _opt(ins, 6)
    acc = int_matmul(a, az, b, bz).astype(np.float32)
    y = acc * (_f32(a_s).reshape(-1)[0] * _f32(bs).reshape(-1))
    if bias is not None:
        y = y + np.asarray(bias, np.float32)
    return [y.astype(np.float32)]


def _infer_qbinary(node: Node, ins: Infos, consts) -> list:
    a, b = ins[0], ins[3]
    assert a is not None and b is not None
    _qtype_check(node, a, "input A", INT8_TYPES)
    _qtype_check(node, b, "input B", INT8_TYPES)
    try:
        out = tuple(np.broadcast_shapes(a.shape, b.shape))
    except ValueError:
        raise ShapeError(f"{node.op} {node.name!r}: shapes {a.shape} and {b.shape} do not broadcast") from None
    _param_check(node, ins, (1, 2, 4, 5, 6, 7), None, "scale/zero point")
    zc = _opt(ins, 7)
    return [(out, np.dtype(zc.dtype) if zc is not None else np.dtype(a.dtype))]


def _ref_qbinary(node: Node, ins: list) -> list:
    a, a_s, az, b, bs, bz, cs = ins[:7]
    cz = _opt(ins, 7)
    dt = np.asarray(cz).dtype if cz is not None else np.asarray(a).dtype
    # MLAS' form: the scale ratios to the output, and the output zero point added before rounding
    ai = (np.asarray(a).astype(np.int32) - np.asarray(_zp(az)).astype(np.int32)).astype(np.float32)
    bi = (np.asarray(b).astype(np.int32) - np.asarray(_zp(bz)).astype(np.int32)).astype(np.float32)
    sa, sb, sc = (_f32(v).reshape(-1)[0] for v in (a_s, bs, cs))
    zc = np.float32(np.asarray(_zp(cz, dt)).reshape(-1)[0])
    if node.op == "QLinearAdd":
        v = ai * (sa / sc) + bi * (sb / sc) + zc
    else:
        v = ai * bi * (sa * sb / sc) + zc
    lo, hi = qrange(dt)
    c = node.attr("qclamp")
    if c is not None:
        lo, hi = max(lo, int(c[0])), min(hi, int(c[1]))
    return [np.clip(np.rint(v), lo, hi).astype(dt)]


def _infer_qunary(node: Node, ins: Infos, consts) -> list:
    x = ins[0]
    assert x is not None
    _qtype_check(node, x, "input X", INT8_TYPES)
    _param_check(node, ins, (1, 2, 3, 4), None, "scale/zero point")
    yz = _opt(ins, 4)
    return [(x.shape, np.dtype(yz.dtype) if yz is not None else np.dtype(x.dtype))]


def qunary_table(op: str, alpha: float, xs, xz, ys, yz, dt: np.dtype) -> np.ndarray:
    """The 256-entry table onnxruntime evaluates these ops with: quantise(f(dequantise(q))) for every q."""
    lo, _ = qrange(dt)
    q = np.arange(lo, lo + 256).astype(dt)
    f = dequantize(q, xs, xz)
    if op == "QLinearSigmoid":
        f = (1.0 / (1.0 + np.exp(-f.astype(np.float64)))).astype(np.float32)
    else:
        f = np.where(f < 0, f * np.float32(alpha), f).astype(np.float32)
    return quantize(f, ys, _zp(yz, dt), dt)


def by_byte(table: np.ndarray, xdt: np.dtype) -> np.ndarray:
    """A 256-entry table indexed from the type's lowest value (as ``qunary_table`` makes them) re-indexed by the
    input's byte (int8 -128 is byte 128), as the kernels look bytes up."""
    lo, _ = qrange(xdt)
    return np.ascontiguousarray(table[np.arange(256).astype(np.uint8).view(xdt).astype(np.int64) - lo])


def requant_table(xdt: np.dtype, xs, xz, ys, yz, ydt: np.dtype) -> np.ndarray:
    """Every 8-bit value of type ``xdt`` on (xs, xz) requantised to (ys, yz) of type ``ydt``, indexed by the input's
    byte: how onnxruntime concatenates inputs of other scales (QLinearConcat)."""
    lo, _ = qrange(xdt)
    return by_byte(quantize(dequantize(np.arange(lo, lo + 256).astype(xdt), xs, xz), ys, yz, ydt), xdt)


def _infer_qlookup(node: Node, ins: Infos, consts) -> list:
    x, t, yz = ins[0], ins[1], ins[2]
    assert x is not None and t is not None and yz is not None
    _qtype_check(node, x, "input X", INT8_TYPES)
    _qtype_check(node, yz, "output zero point", INT8_TYPES)
    if tuple(t.shape) != (256,) or np.dtype(t.dtype) != np.uint8:
        raise UnsupportedOpError(node.op, node.name, None, f"pattern: table {node.inputs[1]!r} of shape "
                                                           f"{list(t.shape)} {np.dtype(t.dtype).name} (256 bytes)")
    return [(x.shape, np.dtype(yz.dtype))]


def _ref_qlookup(node: Node, ins: list) -> list:
    x, table = np.asarray(ins[0]), np.asarray(ins[1], np.uint8)
    return [table[x.view(np.uint8)].view(np.asarray(ins[2]).dtype)]


def _ref_qunary(node: Node, ins: list) -> list:
    x, xs, xz, ys = ins[:4]
    yz = _opt(ins, 4)
    dt = np.asarray(x).dtype
    t = qunary_table(node.op, float(node.attr("alpha", 0.01)), xs, xz, ys, yz, dt)
    lo, _ = qrange(dt)
    return [t[np.asarray(x).astype(np.int64) - lo]]


def _infer_qgap(node: Node, ins: Infos, consts) -> list:
    x = ins[0]
    assert x is not None
    _qtype_check(node, x, "input X", INT8_TYPES)
    if len(x.shape) < 3:
        raise ShapeError(f"QLinearGlobalAveragePool {node.name!r}: input of rank {len(x.shape)} (>= 3 expected)")
    if int(node.attr("channels_last", 0)):
        out = (x.shape[0],) + (1,) * (len(x.shape) - 2) + (x.shape[-1],)
    else:
        out = tuple(x.shape[:2]) + (1,) * (len(x.shape) - 2)
    yz = _opt(ins, 4)
    return [(out, np.dtype(yz.dtype) if yz is not None else np.dtype(x.dtype))]


def _ref_qgap(node: Node, ins: list) -> list:
    """onnxruntime's: integer sum minus the zero point's share, times x_scale / (y_scale * count), rint, + y_zp."""
    x, xs, xz, ys = ins[:4]
    yz = _opt(ins, 4)
    x = np.asarray(x)
    cl = int(node.attr("channels_last", 0))
    axes = tuple(range(1, x.ndim - 1)) if cl else tuple(range(2, x.ndim))
    count = int(np.prod([x.shape[a] for a in axes]))
    acc = x.astype(np.int64).sum(axis=axes, keepdims=True) - int(np.asarray(_zp(xz)).reshape(-1)[0]) * count
    m = _f32(xs).reshape(-1)[0] / (_f32(ys).reshape(-1)[0] * np.float32(count))
    dt = np.asarray(yz).dtype if yz is not None else x.dtype
    lo, hi = qrange(dt)
    v = np.rint(acc.astype(np.float32) * m) + np.float32(np.asarray(_zp(yz, dt)).reshape(-1)[0])
    return [np.clip(v, lo, hi).astype(dt)]


def _infer_qconcat(node: Node, ins: Infos, consts) -> list:
    xs = [ins[i] for i in range(2, len(ins), 3)]
    if not xs or any(t is None for t in xs) or (len(ins) - 2) % 3:
        raise ShapeError(f"QLinearConcat {node.name!r}: expected Y_scale, Y_zp and (X, X_scale, X_zp) triples")
    for t in xs:
        _qtype_check(node, t, "input", INT8_TYPES)
    r = len(xs[0].shape)
    ax = int(node.attr("axis")) % r
    out = list(xs[0].shape)
    out[ax] = sum(t.shape[ax] for t in xs)
    yz = ins[1]
    return [(tuple(out), np.dtype(yz.dtype) if yz is not None else np.dtype(xs[0].dtype))]


def _ref_qconcat(node: Node, ins: list) -> list:
    ys, yz = ins[0], ins[1]
    dt = np.asarray(yz).dtype
    parts = []
    for i in range(2, len(ins), 3):
        x, s, z = ins[i], ins[i + 1], ins[i + 2]
        if np.asarray(x).dtype == dt and np.array_equal(_f32(s), _f32(ys)) and np.array_equal(np.asarray(z), np.asarray(yz)):
            parts.append(np.asarray(x))
        else:  # a function of the 8-bit value alone: a 256-entry table, as onnxruntime does it
            xa = np.asarray(x)
            lo, _ = qrange(xa.dtype)
            table = quantize(dequantize(np.arange(lo, lo + 256).astype(xa.dtype), s, z), ys, yz, dt)
            parts.append(table[xa.astype(np.int64) - lo] if lo else table[xa])
    return [np.concatenate(parts, axis=int(node.attr("axis")))]


def _check_ms(node: Node, opset: int) -> None:
    if node.op == "QLinearConcat" and node.attr("axis") is None:
        raise UnsupportedOpError(node.op, node.name, opset, "attribute axis is required")


_SPECS = [
    OpSpec("QuantizeLinear", _infer_q, _ref_q, min_opset=10, check=_check_qdq,
           notes="per-tensor and per-axis; int8/uint8/int16/uint16; no blocked, 4-bit or float8"),
    OpSpec("DequantizeLinear", _infer_dq, _ref_dq, min_opset=10, check=_check_qdq,
           notes="per-tensor and per-axis; int8/uint8/int16/uint16/int32; no blocked, 4-bit or float8"),
    OpSpec("DynamicQuantizeLinear", _infer_dql, _ref_dql, min_opset=11),
    OpSpec("QLinearConv", _infer_qconv, _ref_qconv, min_opset=10, notes="int8/uint8; native int8 kernel for 2-D"),
    OpSpec("QLinearMatMul", _infer_qmatmul, _ref_qmatmul, min_opset=10, notes="int8/uint8; native int8 kernel"),
    OpSpec("ConvInteger", _infer_conv_integer, _ref_conv_integer, min_opset=10),
    OpSpec("MatMulInteger", _infer_matmul_integer, _ref_matmul_integer, min_opset=10),
    OpSpec("QLinearAdd", _infer_qbinary, _ref_qbinary, notes="com.microsoft"),
    OpSpec("QLinearMul", _infer_qbinary, _ref_qbinary, notes="com.microsoft"),
    OpSpec("QLinearSigmoid", _infer_qunary, _ref_qunary, notes="com.microsoft; 256-entry table"),
    OpSpec("QLinearLeakyRelu", _infer_qunary, _ref_qunary, notes="com.microsoft; 256-entry table"),
    OpSpec("QLinearGlobalAveragePool", _infer_qgap, _ref_qgap, notes="com.microsoft"),
    OpSpec("QLinearLookup", _infer_qlookup, _ref_qlookup,
           notes="inferd's own, made at import: (x, 256-byte table, y zero point); QLinearSigmoid then QLinearMul "
                 "by the same input (SiLU) as one table"),
    OpSpec("QLinearConcat", _infer_qconcat, _ref_qconcat, check=_check_ms, notes="com.microsoft"),
    OpSpec("DynamicQuantizeMatMul", _infer_dqmatmul, _ref_dqmatmul, notes="com.microsoft"),
    OpSpec("MatMulIntegerToFloat", _infer_mmi2f, _ref_mmi2f, notes="com.microsoft"),
]
for _s in _SPECS:
    register_op(_s)
QUANT_OPS = tuple(s.op for s in _SPECS)


@register_kernel
class QuantNumpyKernel(Kernel):
    """The oracle straight into the arena: the fallback where no native int8 kernel applies."""

    name = "numpy"
    ops = QUANT_OPS

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        from .base import op_spec

        spec = op_spec(layer.op)
        assert spec is not None
        res = spec.reference(layer.node, full_inputs(layer, inputs, params))
        for o, r in zip(outputs, res):
            o[...] = r


@register_kernel
class QConcatKernel(Kernel):
    """QLinearConcat straight into the output's slices: inputs on the output's scale and zero point are copied,
    the others mapped through their 256-entry requantisation table (built at load from the constant scales)."""

    name = "table"
    ops = ("QLinearConcat",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        n = len(layer.node.inputs)
        params = [0, 1] + [k for i in range(2, n, 3) for k in (i + 1, i + 2)]
        return (all(p in layer.const_inputs for p in params)
                and all(layer.inputs[i] is not None and np.dtype(layer.inputs[i].dtype) in INT8_TYPES for i in range(2, n, 3)))

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from .base import raw_key

        ys, yz = raw[raw_key(0)], raw[raw_key(1)]
        dt = np.asarray(yz).dtype
        out: dict[str, np.ndarray] = {}
        for j, i in enumerate(range(2, len(layer.node.inputs), 3)):
            xdt = np.dtype(layer.inputs[i].dtype)
            s, z = raw[raw_key(i + 1)], raw[raw_key(i + 2)]
            if xdt == dt and np.array_equal(_f32(s), _f32(ys)) and np.array_equal(np.asarray(z), np.asarray(yz)):
                continue
            out[f"t{j}"] = requant_table(xdt, s, z, ys, yz, dt)
        for j, i in enumerate(range(2, len(layer.node.inputs), 3)):
            if i in layer.const_inputs:  # a constant part (a transformer's class token): its bytes, kept as given
                out[f"x{j}"] = np.ascontiguousarray(raw[raw_key(i)])
        return out

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        """Where the parts lie one after another in the output (nothing but ones before the axis) and are
        contiguous: one native call for all of them, pointers and tables bound once."""
        y = outputs[0]
        ax = int(layer.attr("axis")) % y.ndim
        if not native.AVAILABLE or not y.flags.c_contiguous or any(d != 1 for d in y.shape[:ax]):
            return None
        xs, tables, at = [], [], [0]
        for j, i in enumerate(range(2, len(layer.node.inputs), 3)):
            x = inputs[i] if inputs[i] is not None else params[f"x{j}"]
            if not x.flags.c_contiguous:
                return None
            xs.append(x)
            tables.append(params.get(f"t{j}"))
            at.append(at[-1] + int(x.size))
        if at[-1] != y.size:
            return None
        ffi, lib = native.ffi, native.lib
        xp = ffi.new("void *[]", [native._vptr(x) for x in xs])
        tp = ffi.new("unsigned char *[]", [ffi.NULL if t is None else ffi.cast("unsigned char *", ffi.from_buffer(t))
                                           for t in tables])
        atp = ffi.new("long long[]", at)
        yp = native._vptr(y)
        n, threads = len(xs), native.num_threads()
        keep = (xs, tables, y, xp, tp, atp)

        def call() -> None:
            _ = keep
            lib.inferd_q8_concat(n, xp, tp, atp, yp, threads)

        return call

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        y = outputs[0]
        ax = int(layer.attr("axis")) % y.ndim
        at = 0
        for j, i in enumerate(range(2, len(layer.node.inputs), 3)):
            x = inputs[i] if inputs[i] is not None else params[f"x{j}"]
            n = x.shape[ax]
            dst = y[(slice(None),) * ax + (slice(at, at + n),)]
            t = params.get(f"t{j}")
            if native.AVAILABLE and dst.flags.c_contiguous and x.flags.c_contiguous:
                # in C: numpy's take widened every byte to an int64 index (~5x slower on squeezenet's concats)
                native.lib.inferd_q8_map(native._vptr(x), native.ffi.NULL if t is None
                                         else native.ffi.cast("unsigned char *", native.ffi.from_buffer(t)),
                                         native._vptr(dst), x.size, native.num_threads())
            elif t is None:
                dst[...] = x
            else:
                np.take(t, x.view(np.uint8), out=dst) if dst.flags.c_contiguous else dst.__setitem__(..., t[x.view(np.uint8)])
            at += n
