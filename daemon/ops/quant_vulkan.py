"""Vulkan kernels for int8 models: the ops import fuses a QDQ model into (``inferd.frontend.quantfuse``) run on the
integers on the GPU instead of falling back to the CPU: QuantizeLinear / DequantizeLinear (``quant.comp``),
QLinearConv (``qconv_gemm.comp`` or ``qconv_dot.comp`` then ``qsplitk.comp``; ``qconv.comp`` for depthwise and
other narrow groups), QLinearMatMul with a constant B (``qmatmul.comp``), QLinearAdd/Mul (``qbinary.comp``),
QLinearConcat and QLinearSigmoid/LeakyRelu (``qconcat.comp``: 256-entry tables), QLinearGlobalAveragePool and int8
MaxPool (``qpool.comp``); Transpose, Split and Slice of 8-bit tensors move bytes (``copy.comp``, Q8).

8-bit tensors live in device buffers as bytes and are read out of 32-bit words (``shaders/q8.glsl``), so no 8-bit
storage feature is needed; kernels that write them compute four consecutive outputs per invocation (or pack an
int32 workspace) so no two invocations write one word. Sums are exact int32, requantised as onnxruntime's MLAS
does (``rint(float32(acc) * m) + zp``, the multiplier computed on the host as ``inferd.ops.quant.conv_multiplier``),
so a layer gives the numpy oracle's integers. The GEMM convolution uses the packed 4x8-bit integer dot product
where the device accelerates it on a trusted driver (``Caps.int_dot``), plain arithmetic otherwise. What these
kernels do not take (16-bit quantisation, float16 scales, run-time quantisation parameters, a B computed at run
time, convs of other ranks) stays on the CPU, which the backend's placement does by itself; on a CPU-type device
(lavapipe) all of them do (``_Int8Kernel.device_priority``).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..vulkan.kernel import UNUSABLE_PRIORITY, Caps, Dispatch, In, Out, Param, VulkanKernel, Ws, grid, split_k
from .base import Layer, raw_key, register_kernel, weights_key
from .pool import pool_geometry
from .quant import INT8_TYPES, conv_multiplier, qrange
from .quant_native import layer_geom

F32, I32 = np.float32, np.int32


class _Int8Kernel(VulkanKernel):
    io_dtypes = ("int8", "uint8")

    def device_priority(self, caps: Caps, layer: Layer | None = None) -> int:
        # Unusable on a CPU-type device (lavapipe), so the placement keeps int8 layers on the CPU's native int8
        # kernels there: emulating a GPU on the same cores is far slower (squeezenet1_1 s8s8 on the 2-core VM,
        # direct convs forced: 2.4 s warm against 15 ms with the int8 layers on the CPU; bench/results/
        # 2026-11-28_quant_vulkan_*vm.md). They still run there when a plan or the caller names them (the tests
        # force them, to check them on lavapipe).
        return UNUSABLE_PRIORITY if caps.device_type == "cpu" else self.priority


def _is8(info: Any) -> bool:
    return info is not None and np.dtype(info.dtype) in INT8_TYPES


def _signed(info: Any) -> int:
    return int(np.dtype(info.dtype) == np.int8)


def _consts(layer: Layer, first: int, last: int) -> bool:
    """Every present input in first..last is a constant (quantisation parameters, weights, bias)."""
    return all(k in layer.const_inputs for k in range(first, last + 1) if layer.has_input(k))


def _scalar(raw: Mapping[str, np.ndarray], layer: Layer, k: int, default: float = 0) -> Any:
    return np.asarray(raw[raw_key(k)]).reshape(-1)[0] if layer.has_input(k) else default


def _operand(layer: Layer, k: int) -> Any:
    """Input ``k`` of 8-bit values as a binding: the activation, or the constant's bytes (param ``c<k>``, made by
    ``_const_operands``)."""
    return Param(f"c{k}") if k in layer.const_inputs else In(k)


def _const_operands(layer: Layer, raw: Mapping[str, np.ndarray], ks: Any) -> dict[str, np.ndarray]:
    """The bytes of those of inputs ``ks`` that are constants (a QDQ transformer's position embedding, class token)."""
    return {f"c{k}": _words(np.asarray(raw[raw_key(k)])) for k in ks if k in layer.const_inputs}


def _words(a: np.ndarray) -> np.ndarray:
    """8-bit values as bytes padded to whole 32-bit words (shaders read them a word at a time)."""
    b = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    pad = -b.size % 4
    return np.concatenate([b, np.zeros(pad, np.uint8)]) if pad else b


@register_kernel
class VkQuantize(_Int8Kernel):
    """QuantizeLinear (float32 -> int8/uint8) and DequantizeLinear (int8/uint8 -> float32), per tensor or per
    axis, with constant scales and zero points (``quant.comp``)."""

    name = "vk_quant"
    ops = ("QuantizeLinear", "DequantizeLinear")
    io_dtypes = ("float32", "int8", "uint8")

    def _q8(self, layer: Layer) -> Any:
        """The 8-bit side: the output of a quantise, the input of a dequantise."""
        return layer.outputs[0] if layer.op == "QuantizeLinear" else layer.inputs[0]

    def applies(self, layer: Layer) -> bool:
        if 0 in layer.const_inputs or not _consts(layer, 1, 2) or int(layer.attr("block_size", 0) or 0):
            return False
        f = layer.inputs[0] if layer.op == "QuantizeLinear" else layer.outputs[0]
        s = layer.inputs[1]
        return (_is8(self._q8(layer)) and f is not None and np.dtype(f.dtype) == F32 and s is not None
                and np.dtype(s.dtype) == F32)

    def _axis(self, layer: Layer) -> tuple[int, int]:
        """(inner, channels) of the parameters' broadcast: element i takes parameter (i // inner) % channels."""
        shape = layer.in_shape(0)
        if layer.inputs[1].size == 1 or not shape:  # type: ignore[union-attr]
            return 1, 1
        ax = int(layer.attr("axis", 1)) % len(shape)
        return int(np.prod(shape[ax + 1:], dtype=np.int64)), int(shape[ax])

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        _, ch = self._axis(layer)
        s = np.broadcast_to(np.asarray(raw[raw_key(1)], F32).reshape(-1), (ch,))
        z = (np.asarray(raw[raw_key(2)]).reshape(-1).astype(I32) if layer.has_input(2) else np.zeros(1, I32))
        return {"s": np.ascontiguousarray(s), "z": np.ascontiguousarray(np.broadcast_to(z, (ch,)))}

    def transformed_nbytes(self, layer: Layer) -> int:
        return 8 * self._axis(layer)[1]

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        inner, ch = self._axis(layer)
        n = layer.inputs[0].size  # type: ignore[union-attr]
        q8 = self._q8(layer)
        lo, hi = qrange(q8.dtype)
        quant = layer.op == "QuantizeLinear"
        return [Dispatch("quant", (In(0), Param("s"), Param("z"), Out(0)), grid(-(-n // 4) if quant else n, 256, caps),
                         {"QOP": 0 if quant else 1, "QS": _signed(q8)},
                         push={"n": n, "inner": inner, "channels": ch, "lo": lo, "hi": hi})]


@register_kernel
class VkQLinearConv(_Int8Kernel):
    """QLinearConv, 1-D or 2-D, any groups, strides, dilations and pads; int8 or uint8 activations and weights,
    weight scales and zero points per tensor or per output channel, int32 bias, a fused Relu/Clip as the
    integer clamp (``qconv.comp``: one exact int32 sum per output)."""

    name = "vk_qconv"
    ops = ("QLinearConv",)
    priority = 80  # after vk_qconv_gemm wherever that applies: one sum per invocation re-reads every input

    def applies(self, layer: Layer) -> bool:
        x, w, y = layer.inputs[0], layer.inputs[3], layer.outputs[0]
        if not (_is8(x) and _is8(w) and _is8(y)) or 0 in layer.const_inputs or not _consts(layer, 1, 8):
            return False
        if layer.inputs[1].size != 1 or (layer.has_input(2) and layer.inputs[2].size != 1):  # type: ignore[union-attr]
            return False
        try:
            return layer_geom(layer).as2d() is not None
        except Exception:
            return False

    def transform_key(self, layer: Layer) -> tuple[Any, ...]:
        return weights_key(layer)

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = layer_geom(layer)
        cout = g.cout
        wz = (np.asarray(raw[raw_key(5)]).reshape(-1).astype(I32) if layer.has_input(5) else np.zeros(1, I32))
        bias = (np.asarray(raw[raw_key(8)]).reshape(-1).astype(I32) if layer.has_input(8) else np.zeros(cout, I32))
        mult = conv_multiplier(raw[raw_key(1)], raw[raw_key(4)], raw[raw_key(6)])
        lo, hi = _clamped(layer)
        q = np.array([int(_scalar(raw, layer, 2)), int(_scalar(raw, layer, 7)), lo, hi], I32)
        return {"w": self._pack(layer, np.asarray(raw[raw_key(3)])),
                "wz": np.ascontiguousarray(np.broadcast_to(wz, (cout,))),
                "b": np.ascontiguousarray(np.broadcast_to(bias, (cout,))),
                "m": np.ascontiguousarray(np.broadcast_to(np.asarray(mult, F32).reshape(-1), (cout,))),
                "q": q}

    def _pack(self, layer: Layer, w: np.ndarray) -> np.ndarray:
        """The weights as this kernel's shader reads them: here [Cout, Cin/G, KH, KW] bytes."""
        return _words(w)

    def transformed_nbytes(self, layer: Layer) -> int:
        g = layer_geom(layer)
        return -(-layer.inputs[3].size // 4) * 4 + 12 * g.cout + 16  # type: ignore[union-attr]

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        g = layer_geom(layer).as2d()
        assert g is not None
        zx, zy, lo, hi = (int(v) for v in params["q"])
        total = g.n * g.cout * g.oh * g.ow
        defs = {"XS": _signed(layer.inputs[0]), "WS": _signed(layer.inputs[3]), "YS": _signed(layer.outputs[0])}
        push = dict(total=total, C=g.cin, H=g.h, W=g.w, K=g.cout, OH=g.oh, OW=g.ow, KH=g.kh, KW=g.kw, SH=g.sh,
                    SW=g.sw, DH=g.dh, DW=g.dw, PT=g.pt, PL=g.pl, G=g.group, zx=zx, zy=zy, lo=lo, hi=hi)
        return [Dispatch("qconv", (In(0), Param("w"), Param("wz"), Param("b"), Param("m"), Out(0)),
                         grid(-(-total // 4), 64, caps), defs, push=push)]


@register_kernel
class VkQConvGemm(VkQLinearConv):
    """QLinearConv as an implicit GEMM with 64x64 shared-memory tiles of centred integers (``qconv_gemm.comp``,
    split-K where the output has few tiles) into int32 partial sums, then summed, requantised and packed to bytes
    (``qsplitk.comp``). For convs with at least ``MIN_M`` output channels per group (a depthwise conv's one channel
    per group would leave a 64-row tile nearly empty: the direct kernel takes those)."""

    name = "vk_qconv_gemm"
    priority = 40
    MIN_M = 8
    shader = "qconv_gemm"
    #: the params the GEMM shader binds after the input, in binding order
    weights: tuple[str, ...] = ("w", "wz")

    def applies(self, layer: Layer) -> bool:
        if not super().applies(layer):
            return False
        g = layer_geom(layer).as2d()
        return g is not None and g.cout // g.group >= self.MIN_M

    def _pack(self, layer: Layer, w: np.ndarray) -> np.ndarray:
        g = layer_geom(layer)
        return _words(w.reshape(g.group, g.cout // g.group, -1).transpose(0, 2, 1))  # k-major [G, K, M] bytes

    def _split(self, layer: Layer) -> tuple[int, int]:
        """(splits, K per split): split-K where the output has few 64x64 tiles (``vulkan.kernel.split_k``)."""
        g = layer_geom(layer).as2d()
        assert g is not None
        mg, k = g.cout // g.group, (g.cin // g.group) * g.kh * g.kw
        return split_k(-(-(g.oh * g.ow) // 64) * -(-mg // 64) * g.n * g.group, k)

    def workspace_parts(self, layer: Layer) -> dict[str, int]:
        return {"part": 4 * self._split(layer)[0] * layer.outputs[0].size}

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        g = layer_geom(layer).as2d()
        assert g is not None
        zx, zy, lo, hi = (int(v) for v in params["q"])
        mg, cg = g.cout // g.group, g.cin // g.group
        s, kc = self._split(layer)
        n = layer.outputs[0].size
        push = dict(C=g.cin, H=g.h, W=g.w, Cg=cg, M=mg, OH=g.oh, OW=g.ow, PT=g.pt, PL=g.pl, G=g.group,
                    K=cg * g.kh * g.kw, zx=zx, S=s, Kc=kc, total=n)
        spec = {"KH": g.kh, "KW": g.kw, "SH": g.sh, "SW": g.sw, "DH": g.dh, "DW": g.dw}
        defs = {"XS": _signed(layer.inputs[0]), "WS": _signed(layer.inputs[3])}
        groups = (-(-(g.oh * g.ow) // 64), -(-mg // 64), g.n * g.group * s)
        return [Dispatch(self.shader, (In(0),) + tuple(Param(k) for k in self.weights) + (Ws("part"),), groups, defs,
                         spec, push),
                Dispatch("qsplitk", (Ws("part"), Param("b"), Param("m"), Out(0)), grid(-(-n // 4), 256, caps),
                         push={"total": n, "S": s, "inner": g.oh * g.ow, "channels": g.cout, "zy": zy, "lo": lo,
                               "hi": hi})]


@register_kernel
class VkQConvDot(VkQConvGemm):
    """``vk_qconv_gemm`` on the packed 4x8-bit integer dot product (``qconv_dot.comp``: four multiply-adds an
    instruction, zero points taken out after; weights packed four K steps to a word). The default where the
    device runs it on dedicated units and its driver is trusted (``Caps.int_dot`` 2); usable, after the plain
    GEMM, where it only has the instructions (1); never without them (0)."""

    name = "vk_qconv_dot"
    priority = 30
    shader = "qconv_dot"
    weights = ("w", "wc", "wz")

    def device_priority(self, caps: Caps, layer: Layer | None = None) -> int:
        if caps.int_dot == 0 or caps.device_type == "cpu":
            return UNUSABLE_PRIORITY
        return self.priority if caps.int_dot == 2 else VkQConvGemm.priority + 20

    def _pack(self, layer: Layer, w: np.ndarray) -> np.ndarray:
        g = layer_geom(layer)
        mg = g.cout // g.group
        w = w.reshape(g.group, mg, -1)
        k = w.shape[2]
        wp = np.zeros((g.group, mg, -(-k // 4) * 4), w.dtype)
        wp[..., :k] = w  # taps past K weigh 0 (the shader reads their x as 0 too)
        return _words(wp.reshape(g.group, mg, -1, 4).transpose(0, 2, 1, 3))  # [G, K4, M] words of 4 K steps

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = super().transform(layer, raw)
        w = np.asarray(raw[raw_key(3)])
        k = w[0].size  # taps per output channel: Cin/G x KH x KW
        zx = int(out["q"][0])
        # the constant part of sum (x - zx)(w - zw) over the K taps: K zx zw - zx sum w, per output channel
        wsum = w.reshape(len(w), -1).astype(np.int64).sum(axis=1)
        out["wc"] = (k * zx * out["wz"].astype(np.int64) - zx * wsum).astype(I32)
        return out

    def transformed_nbytes(self, layer: Layer) -> int:
        g = layer_geom(layer).as2d()
        assert g is not None
        k = (g.cin // g.group) * g.kh * g.kw
        return g.group * -(-k // 4) * 4 * (g.cout // g.group) + 16 * g.cout + 16


def _pool_push(layer: Layer) -> dict[str, int] | None:
    """qpool.comp's window geometry of a 1-D or 2-D MaxPool (None: another rank)."""
    shape = layer.in_shape(0)
    if len(shape) not in (3, 4):
        return None
    g = pool_geometry(layer.node, shape)
    if len(shape) == 3:  # 1-D: H = 1
        return dict(H=1, W=shape[2], OH=1, OW=g.out[0], KH=1, KW=g.kernel[0], SH=1, SW=g.strides[0], DH=1,
                    DW=g.dilations[0], PT=0, PL=g.pads_head[0])
    (kh, kw), (sh, sw), (dh, dw), (pt, pl), (oh, ow) = g.kernel, g.strides, g.dilations, g.pads_head, g.out
    return dict(H=shape[2], W=shape[3], OH=oh, OW=ow, KH=kh, KW=kw, SH=sh, SW=sw, DH=dh, DW=dw, PT=pt, PL=pl)


_NO_REQUANT = dict(zx=0, zy=0, lo=0, hi=0, m=0.0)


@register_kernel
class VkQMaxPool(_Int8Kernel):
    """MaxPool of an 8-bit tensor (a QDQ model's pooling runs on the integers: same scale in and out)."""

    name = "vk_qmaxpool"
    ops = ("MaxPool",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        if not _is8(layer.inputs[0]) or len([o for o in layer.node.outputs if o]) != 1 or layer.attr("act"):
            return False
        try:
            return _pool_push(layer) is not None
        except Exception:
            return False

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        push = _pool_push(layer)
        assert push is not None
        total = layer.outputs[0].size
        return [Dispatch("qpool", (In(0), Out(0)), grid(-(-total // 4), 64, caps),
                         {"POOL": 0, "XS": _signed(layer.inputs[0])}, push={"total": total, **push, **_NO_REQUANT})]


@register_kernel
class VkQGlobalAveragePool(_Int8Kernel):
    """QLinearGlobalAveragePool (channels first) as onnxruntime computes it (``qpool.comp``, POOL 1)."""

    name = "vk_qgap"
    ops = ("QLinearGlobalAveragePool",)

    def applies(self, layer: Layer) -> bool:
        x = layer.inputs[0]
        return (_is8(x) and _is8(layer.outputs[0]) and 0 not in layer.const_inputs and _consts(layer, 1, 4)
                and not int(layer.attr("channels_last", 0)) and len(x.shape) >= 3)  # type: ignore[union-attr]

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        count = int(np.prod(layer.in_shape(0)[2:], dtype=np.int64))
        m = np.float32(_scalar(raw, layer, 1, 1.0)) / (np.float32(_scalar(raw, layer, 3, 1.0)) * np.float32(count))
        return {"p": np.array([int(_scalar(raw, layer, 2)), int(_scalar(raw, layer, 4))], I32),
                "m": np.array([m], F32)}

    def transformed_nbytes(self, layer: Layer) -> int:
        return 12

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        shape = layer.in_shape(0)
        total = int(shape[0] * shape[1])
        hw = int(np.prod(shape[2:], dtype=np.int64))
        lo, hi = qrange(layer.outputs[0].dtype)
        zx, zy = (int(v) for v in params["p"])
        push = dict(total=total, H=1, W=hw, OH=1, OW=1, KH=1, KW=1, SH=1, SW=1, DH=1, DW=1, PT=0, PL=0, zx=zx, zy=zy,
                    lo=lo, hi=hi, m=float(params["m"][0]))
        return [Dispatch("qpool", (In(0), Out(0)), grid(-(-total // 4), 64, caps),
                         {"POOL": 1, "XS": _signed(layer.inputs[0])}, push=push)]


#: inputs qconcat.comp takes in one dispatch
QCONCAT_MAX = 4


@register_kernel
class VkQLinearConcat(_Int8Kernel):
    """QLinearConcat of up to four inputs: each input's bytes through a 256-entry table to the output's
    quantisation (the oracle's table, so the same integers), or copied where it already has it."""

    name = "vk_qconcat"
    ops = ("QLinearConcat",)

    def _parts(self, layer: Layer) -> list[int]:
        return list(range(2, len(layer.node.inputs), 3))

    def applies(self, layer: Layer) -> bool:
        parts = self._parts(layer)
        if not parts or len(parts) > QCONCAT_MAX or not _is8(layer.outputs[0]) or not _consts(layer, 0, 1):
            return False
        return all(_is8(layer.inputs[k]) and _consts(layer, k + 1, k + 2) for k in parts)

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from .quant import requant_table

        ydt = np.dtype(layer.outputs[0].dtype)
        ys, yz = np.asarray(raw[raw_key(0)]), np.asarray(raw[raw_key(1)])
        tab = np.tile(np.arange(256, dtype=np.uint32), (QCONCAT_MAX, 1))
        for j, k in enumerate(self._parts(layer)):
            xdt = np.dtype(layer.inputs[k].dtype)  # type: ignore[union-attr]
            s, z = np.asarray(raw[raw_key(k + 1)]), np.asarray(raw[raw_key(k + 2)])
            if xdt == ydt and np.array_equal(np.asarray(s, F32), np.asarray(ys, F32)) and np.array_equal(z, yz):
                continue  # the oracle copies such an input as it is
            tab[j] = requant_table(xdt, s, z, ys, yz, ydt).view(np.uint8)
        return {"t": np.ascontiguousarray(tab.reshape(-1)), **_const_operands(layer, raw, self._parts(layer))}

    def transformed_nbytes(self, layer: Layer) -> int:
        return 4 * 256 * QCONCAT_MAX + sum(-(-layer.inputs[k].size // 4) * 4  # type: ignore[union-attr]
                                           for k in self._parts(layer) if k in layer.const_inputs)

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        parts = self._parts(layer)
        out = layer.out_shape()
        ax = int(layer.attr("axis")) % len(out)
        inner = int(np.prod(out[ax + 1:], dtype=np.int64))
        lens = [int(layer.in_shape(k)[ax]) for k in parts]
        offs = list(np.cumsum([0] + lens[:-1]))
        pad = QCONCAT_MAX - len(parts)
        offs, lens = [int(v) for v in offs] + [int(out[ax])] * pad, lens + [0] * pad
        xs = tuple(_operand(layer, k) for k in parts) + (_operand(layer, parts[0]),) * pad
        n = layer.outputs[0].size
        return [Dispatch("qconcat", xs + (Param("t"), Out(0)), grid(-(-n // 4), 256, caps),
                         push={"n": n, "inner": inner, "axis": int(out[ax]), "off": offs, "len": lens})]


@register_kernel
class VkQLinearUnary(_Int8Kernel):
    """com.microsoft QLinearSigmoid / QLinearLeakyRelu: each byte through the 256-entry table onnxruntime evaluates
    them with (the oracle's ``qunary_table``), and QLinearLookup (its table given), as a one-input ``qconcat.comp``
    (the same table lookup and store)."""

    name = "vk_qunary"
    ops = ("QLinearSigmoid", "QLinearLeakyRelu", "QLinearLookup")

    def applies(self, layer: Layer) -> bool:
        x, y = layer.inputs[0], layer.outputs[0]
        if layer.op == "QLinearLookup":
            return _is8(x) and _is8(y) and 0 not in layer.const_inputs and _consts(layer, 1, 2)
        return (_is8(x) and _is8(y) and np.dtype(x.dtype) == np.dtype(y.dtype)  # type: ignore[union-attr]
                and 0 not in layer.const_inputs and _consts(layer, 1, 4))

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from .quant import by_byte, qunary_table

        tab = np.tile(np.arange(256, dtype=np.uint32), (QCONCAT_MAX, 1))
        if layer.op == "QLinearLookup":
            tab[0] = np.asarray(raw[raw_key(1)], np.uint8)
            return {"t": np.ascontiguousarray(tab.reshape(-1))}
        dt = np.dtype(layer.inputs[0].dtype)  # type: ignore[union-attr]
        get = lambda k: np.asarray(raw[raw_key(k)]) if layer.has_input(k) else None  # noqa: E731
        t = qunary_table(layer.op, float(layer.attr("alpha", 0.01)), get(1), get(2), get(3), get(4), dt)
        tab[0] = by_byte(t, dt).view(np.uint8)
        return {"t": np.ascontiguousarray(tab.reshape(-1))}

    def transformed_nbytes(self, layer: Layer) -> int:
        return 4 * 256 * QCONCAT_MAX

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        n = layer.outputs[0].size
        return [Dispatch("qconcat", (In(0),) * QCONCAT_MAX + (Param("t"), Out(0)), grid(-(-n // 4), 256, caps),
                         push={"n": n, "inner": 1, "axis": n, "off": [0, n, n, n], "len": [n, 0, 0, 0]})]


def _clamped(layer: Layer) -> tuple[int, int]:
    """The output's integer range, narrowed by a fused Relu/Clip (``attrs["qclamp"]``)."""
    lo, hi = qrange(layer.outputs[0].dtype)
    c = layer.attr("qclamp")
    return (max(lo, int(c[0])), min(hi, int(c[1]))) if c is not None else (lo, hi)


@register_kernel
class VkQLinearBinary(_Int8Kernel):
    """com.microsoft QLinearAdd / QLinearMul of two 8-bit tensors with broadcasting (``qbinary.comp``), in
    onnxruntime's arithmetic (the oracle's ``_ref_qbinary``); a fused Relu as the integer clamp."""

    name = "vk_qbinary"
    ops = ("QLinearAdd", "QLinearMul")

    def applies(self, layer: Layer) -> bool:
        from .eltwise_vulkan import _rank_ok

        a, b = layer.inputs[0], layer.inputs[3]
        if not (_is8(a) and _is8(b) and _is8(layer.outputs[0])):
            return False
        return (_consts(layer, 1, 2) and _consts(layer, 4, 7)
                and _rank_ok([layer.in_shape(0), layer.in_shape(3)], layer.out_shape()))

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sa, sb, sc = (np.float32(_scalar(raw, layer, k, 1.0)) for k in (1, 4, 6))
        ra, rb = (sa / sc, sb / sc) if layer.op == "QLinearAdd" else (sa * sb / sc, np.float32(0))
        return {"z": np.array([int(_scalar(raw, layer, k)) for k in (2, 5, 7)], I32), "r": np.array([ra, rb], F32),
                **_const_operands(layer, raw, (0, 3))}

    def transformed_nbytes(self, layer: Layer) -> int:
        return 20 + sum(-(-layer.inputs[k].size // 4) * 4 for k in (0, 3) if k in layer.const_inputs)  # type: ignore[union-attr]

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        from .eltwise_vulkan import broadcast_strides, collapse, contiguous_strides

        out = layer.out_shape()
        sa, sb = broadcast_strides(layer.in_shape(0), out), broadcast_strides(layer.in_shape(3), out)
        dims, (sa, sb, _) = collapse(out, sa, sb, contiguous_strides(out))
        n = layer.outputs[0].size
        za, zb, zc = (int(v) for v in params["z"])
        lo, hi = _clamped(layer)
        return [Dispatch("qbinary", (_operand(layer, 0), _operand(layer, 3), Out(0)), grid(-(-n // 4), 256, caps),
                         {"QOP": int(layer.op == "QLinearMul"), "AS": _signed(layer.inputs[0]),
                          "BS": _signed(layer.inputs[3])},
                         push={"n": n, "rank": len(dims), "dims": dims, "sa": sa, "sb": sb, "za": za, "zb": zb,
                               "zc": zc, "lo": lo, "hi": hi, "ra": float(params["r"][0]), "rb": float(params["r"][1])})]


@register_kernel
class VkQLinearMatMul(_Int8Kernel):
    """QLinearMatMul by a constant 2-D B (a quantised Linear / Gemm, with import's int32 bias): per-column weight
    zero points and scales (``qmatmul.comp``). A B computed at run time stays on the CPU."""

    name = "vk_qmatmul"
    ops = ("QLinearMatMul",)

    def applies(self, layer: Layer) -> bool:
        a, b, y = layer.inputs[0], layer.inputs[3], layer.outputs[0]
        if not (_is8(a) and _is8(b) and _is8(y)) or 0 in layer.const_inputs or not _consts(layer, 1, 8):
            return False
        return (len(b.shape) == 2 and len(a.shape) >= 1 and a.shape[-1] == b.shape[0]  # type: ignore[union-attr]
                and layer.inputs[1].size == 1 and (not layer.has_input(2) or layer.inputs[2].size == 1))  # type: ignore[union-attr]

    def transform_key(self, layer: Layer) -> tuple[Any, ...]:
        return weights_key(layer)

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = int(layer.in_shape(3)[1])
        bz = (np.asarray(raw[raw_key(5)]).reshape(-1).astype(I32) if layer.has_input(5) else np.zeros(1, I32))
        has_bias = bool(layer.attr("bias")) and layer.has_input(8)
        bias = np.asarray(raw[raw_key(8)]).reshape(-1).astype(I32) if has_bias else np.zeros(1, I32)
        mult = conv_multiplier(raw[raw_key(1)], raw[raw_key(4)], raw[raw_key(6)])
        return {"b": _words(np.ascontiguousarray(np.asarray(raw[raw_key(3)]).T)),  # [N, K]: the workgroup reads along K
                "bz": np.ascontiguousarray(np.broadcast_to(bz, (n,))),
                "bias": np.ascontiguousarray(np.broadcast_to(bias, (n,))),
                "m": np.ascontiguousarray(np.broadcast_to(np.asarray(mult, F32).reshape(-1), (n,))),
                "z": np.array([int(_scalar(raw, layer, 2)), int(_scalar(raw, layer, 7))], I32)}

    def transformed_nbytes(self, layer: Layer) -> int:
        return -(-layer.inputs[3].size // 4) * 4 + 12 * int(layer.in_shape(3)[1]) + 8  # type: ignore[union-attr]

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        k, n = (int(v) for v in layer.in_shape(3))
        total = layer.outputs[0].size
        za, zy = (int(v) for v in params["z"])
        lo, hi = _clamped(layer)
        groups = (min(-(-total // 4), caps.max_workgroup_count[0]), 1, 1)  # one per output word, grid-stride past that
        return [Dispatch("qmatmul", (In(0), Param("b"), Param("bz"), Param("bias"), Param("m"), Out(0)),
                         groups, {"AS": _signed(layer.inputs[0]), "BS": _signed(layer.inputs[3])},
                         push={"total": total, "K": k, "N": n, "za": za, "zy": zy, "lo": lo, "hi": hi})]


#: op -> a Vulkan int8 kernel that applies to every node of it, as ``inferd.load(..., kernels=INT8_KERNELS)`` takes
#: it: forces them where the placement keeps int8 layers on the CPU (a CPU-type device), for tests and benchmarks
#: (the direct conv: the GEMM one takes no depthwise conv; name nodes to force it)
INT8_KERNELS = {op: cls.name for cls in (VkQuantize, VkQLinearConv, VkQMaxPool, VkQGlobalAveragePool, VkQLinearConcat,
                                          VkQLinearBinary, VkQLinearMatMul, VkQLinearUnary) for op in cls.ops}
