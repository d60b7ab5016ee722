"""Channel-blocked convolution on the CPU: the ``inferd.ConvNchwc`` op and the two reorders around it.

A blocked tensor is (N, ceil(C/16), H, W, 16): the 16 channels of a pixel side by side, the layout
onnxruntime's NCHWc kernels use. Where C is not a multiple of 16 the last block is padded; its padding lanes hold
finite values of no meaning (zeros from a conversion, the activation of zero from a conv), which every blocked conv
reads with zero weights and the conversion back drops, so a 24- or 40-channel stage (mobilenetv2, efficientnet_b0)
runs blocked at the cost of the padded lanes' work (a third more for 24 channels; onnxruntime's AVX2 blocks of 8
need none there). A conv in it packs nothing at run time (a GEMM over NCHW planes packs its input per call, a
quarter of a 1x1 conv's time on 56x56 planes) and reads each tap's pixels as unit-stride scalars
(native/nchwc.c). The CPU backend's layout plan (:mod:`inferd.planner.layout`) rewrites runs of convs into
these ops; nothing else ever reads a blocked tensor, so the graph's other ops, its inputs and outputs stay NCHW.

``inferd.ConvNchwc`` takes the blocked input, the Conv's raw weights (Cout, Cin, kh, kw) and bias, and a fused
residual (blocked, the output's shape) as Conv does (``attrs["residual"]``, ``attrs["act"]``); the Conv's
attributes otherwise. Its oracle unblocks, runs Conv's oracle and blocks the result.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import native
from ..errors import ShapeError
from ..ir import Node, TensorInfo
from .base import BoundOrOracle, Layer, OpSpec, op_spec, raw_key, register_kernel, register_op, weights_key
from .activation import apply_act
from .conv import _act, conv_geom, io_positions
from .pool import pool_geometry, pool_reference

F32 = np.float32
BLOCK = 16


def group_blocks() -> int:
    """Output blocks per packed weight group: the ISA's tiles' (``native.nchwc_group_blocks``; the package's device
    fingerprint names the ISA, so a package packed elsewhere is not read here)."""
    return native.nchwc_group_blocks()


CONV = "inferd.ConvNchwc"
TO = "inferd.ToNchwc"
FROM = "inferd.FromNchwc"
MAXPOOL = "inferd.MaxPoolNchwc"
#: a squeeze-excitation's two passes: the global average pool of a blocked tensor (to NCHW (N, C, 1, 1)) and the
#: product of a blocked tensor with a scale per channel (N or 1, C, 1, 1)
GAP = "inferd.GlobalAveragePoolNchwc"
SCALE = "inferd.ScaleNchwc"


def blocks(c: int) -> int:
    """Blocks of 16 that hold ``c`` channels (the last one padded)."""
    return -(-int(c) // BLOCK)


def to_blocked(x: np.ndarray) -> np.ndarray:
    """(N, C, H, W) -> (N, ceil(C/16), H, W, 16), padding lanes zero."""
    n, c, h, w = x.shape
    if c % BLOCK:
        x = np.concatenate([x, np.zeros((n, blocks(c) * BLOCK - c, h, w), x.dtype)], axis=1)
    return np.ascontiguousarray(x.reshape(n, blocks(c), BLOCK, h, w).transpose(0, 1, 3, 4, 2))


def from_blocked(x: np.ndarray, channels: int | None = None) -> np.ndarray:
    """(N, ceil(C/16), H, W, 16) -> (N, C, H, W): the first ``channels`` (default: every lane)."""
    n, cb, h, w, _ = x.shape
    c = cb * BLOCK if channels is None else int(channels)
    return np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3).reshape(n, cb * BLOCK, h, w)[:, :c])


def depthwise(node: Node, w_shape: Sequence[int]) -> bool:
    """Whether a Conv(Nchwc) with weights of ``w_shape`` is depthwise (one group per channel, multiplier 1)."""
    g = int(node.attrs.get("group", 1))
    return g > 1 and int(w_shape[1]) == 1 and int(w_shape[0]) == g


#: The most multiply-adds a grouped conv may do blocked per its own: groups narrower than a block run ``per`` to a
#: block pair with zero weights between them (RegNet's and ResNeXt's groups of 8 channels: 2; of 4: 4)
MAX_GROUP_WASTE = 4


def block_groups(node: Node, w_shape: Sequence[int]) -> tuple[int, int, int] | None:
    """(per, gi, go) where a grouped conv (neither dense nor depthwise) of weights ``w_shape`` runs blocked: its
    groups ``per`` at a time fill gi input and go output blocks (the last such set may hold fewer groups, where
    the channels end in a partial block); None where no ``per`` up to ``MAX_GROUP_WASTE`` fits."""
    g = int(node.attrs.get("group", 1))
    if g <= 1 or depthwise(node, w_shape) or len(w_shape) != 4:
        return None
    cout, cin_g = int(w_shape[0]), int(w_shape[1])
    if cout % g:
        return None
    cout_g = cout // g
    for per in range(1, MAX_GROUP_WASTE + 1):
        if (per * cin_g) % BLOCK or (per * cout_g) % BLOCK:
            continue
        gi, go, sets = per * cin_g // BLOCK, per * cout_g // BLOCK, -(-g // per)
        if sets * gi == blocks(g * cin_g) and sets * go == blocks(cout):
            return per, gi, go
    return None


def _group_dense(w: np.ndarray, g: int, per: int) -> np.ndarray:
    """Grouped weights (Cout, Cin/g, kh, kw) as a dense conv of each set of ``per`` groups: (sets * per * Cout/g,
    per * Cin/g, kh, kw), a group's weights on its own input channels of the set, zeros between."""
    cout, cin_g, kh, kw = w.shape
    cout_g, sets = cout // g, -(-g // per)
    wg = np.zeros((sets * per, cout_g, cin_g, kh, kw), F32)
    wg[:g] = w.reshape(g, cout_g, cin_g, kh, kw)
    wg = wg.reshape(sets, per, cout_g, cin_g, kh, kw)
    out = np.zeros((sets, per, cout_g, per, cin_g, kh, kw), F32)
    for j in range(per):
        out[:, j, :, j] = wg[:, j]
    return out.reshape(sets * per * cout_g, per * cin_g, kh, kw)


def _group_sparse(wd: np.ndarray, g: int, per: int, cout: int) -> np.ndarray:
    """``_group_dense``'s inverse: the conv's own (Cout, Cin/g, kh, kw)."""
    co, ci, kh, kw = wd.shape
    cout_g, cin_g = cout // g, ci // per
    v = wd.reshape(co // (per * cout_g), per, cout_g, per, cin_g, kh, kw)
    out = np.stack([v[:, j, :, j] for j in range(per)], axis=1)
    return np.ascontiguousarray(out.reshape(-1, cin_g, kh, kw)[:cout])


def pack_grouped(w: np.ndarray, node: Node) -> np.ndarray:
    """A grouped conv's weights for ``inferd_nchwc_conv_grouped``: ``pack_weights`` of ``_group_dense``."""
    per, _gi, _go = block_groups(node, w.shape) or (0, 0, 0)
    if not per:
        raise ShapeError(f"Conv {node.name!r}: group {node.attrs.get('group')} with weights {list(w.shape)} does not "
                         f"fill whole blocks")
    return pack_weights(_group_dense(np.asarray(w, F32), int(node.attrs["group"]), per))


def pack_weights(w: np.ndarray, dw: bool = False, nchw_input: bool = False) -> np.ndarray:
    """Conv weights (Cout, Cin, kh, kw) in native/nchwc.c's order: groups of up to 4 output blocks, each
    [cin block][kh][kw][16 input channels][its blocks x 16 output channels] (``nchw_input``: blocks of one input
    channel, [cin][kh][kw][its blocks x 16]); depthwise (``dw``, (C, 1, kh, kw)): [block][kh][kw][16 channels].
    Channel counts short of a block are padded with zero weights (the padding lanes of a blocked tensor)."""
    w = _padded(w, dw, nchw_input)
    co, ci, kh, kw = w.shape
    cpb = 1 if nchw_input else BLOCK
    if dw:
        out = native.empty_aligned((co // BLOCK, kh, kw, BLOCK))
        out[...] = w.reshape(co // BLOCK, BLOCK, kh, kw).transpose(0, 2, 3, 1)
        return out
    out = native.empty_aligned((w.size,))
    pos = 0
    gb = group_blocks()
    for b0 in range(0, co // BLOCK, gb):
        nb = min(gb, co // BLOCK - b0)
        g = w[b0 * BLOCK:(b0 + nb) * BLOCK].reshape(nb * BLOCK, ci // cpb, cpb, kh, kw)
        out[pos:pos + g.size].reshape(ci // cpb, kh, kw, cpb, nb * BLOCK)[...] = g.transpose(1, 3, 4, 2, 0)
        pos += g.size
    return out


def _padded_dims(co: int, ci: int, dw: bool, nchw_input: bool) -> tuple[int, int]:
    """(Cout, Cin) of conv weights padded to whole blocks: Cout always; Cin where the input is blocked and read
    by every output channel (not a depthwise conv's one input channel, not a stem's NCHW image)."""
    return blocks(co) * BLOCK, (int(ci) if dw or nchw_input else blocks(ci) * BLOCK)


def _padded(w: np.ndarray, dw: bool, nchw_input: bool) -> np.ndarray:
    """Conv weights with Cout (and the input channels a blocked input holds) padded with zeros to whole blocks."""
    co, ci, kh, kw = w.shape
    cop, cip = _padded_dims(co, ci, dw, nchw_input)
    if (cop, cip) == (co, ci):
        return w
    out = np.zeros((cop, cip, kh, kw), F32)
    out[:co, :ci] = w
    return out


def padded_nbytes(w_shape: Sequence[int], dw: bool, nchw_input: bool,
                  grouped: tuple[int, int, int] | None = None) -> int:
    """Bytes of ``pack_weights``'s result for raw weights of ``w_shape`` (``grouped``: ``block_groups``'s
    answer, ``pack_grouped``'s)."""
    co, ci, kh, kw = (int(d) for d in w_shape)
    if grouped is not None:
        return 4 * blocks(co) * BLOCK * grouped[1] * BLOCK * kh * kw
    cop, cip = _padded_dims(co, ci, dw, nchw_input)
    return 4 * cop * cip * kh * kw


def _unblocked(shape: Sequence[int]) -> tuple[int, ...]:
    n, cb, h, w, b = shape
    return (n, cb * b, h, w)


def _logical(node: Node, x_shape: Sequence[int], w_shape: Sequence[int]) -> tuple[int, ...]:
    """The NCHW shape a blocked conv's input stands for: its channels are those the weights read (a blocked
    input's last block may be padded); an NCHW input (a stem's) as it is."""
    if _nchw_input(x_shape):
        return tuple(x_shape)
    n, cb, h, w, _ = x_shape
    c = int(w_shape[1]) * int(node.attrs.get("group", 1))
    if blocks(c) != cb:
        raise ShapeError(f"{node.op} {node.name!r}: a blocked input of {cb} blocks for weights {list(w_shape)} "
                         f"(group {node.attrs.get('group', 1)}) reading {c} channels")
    return (n, c, h, w)


def _check_blocked(node: Node, info: TensorInfo | None) -> tuple[int, ...]:
    if info is None or len(info.shape) != 5 or info.shape[4] != BLOCK:
        raise ShapeError(f"{node.op} {node.name!r}: expected a blocked (N, C/16, H, W, 16) input, got "
                         f"{None if info is None else list(info.shape)}")
    return info.shape


def _infer_to(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    x = ins[0]
    if x is None or len(x.shape) != 4:
        raise ShapeError(f"{node.op} {node.name!r}: expected (N, C, H, W), got {None if x is None else list(x.shape)}")
    n, c, h, w = x.shape
    return [((n, blocks(c), h, w, BLOCK), x.dtype)]


def from_channels(node: Node, blocked_shape: Sequence[int]) -> int:
    """The channels an ``inferd.FromNchwc`` gives back (``attrs["channels"]``; every lane where absent)."""
    c = int(node.attrs.get("channels", int(blocked_shape[1]) * BLOCK))
    if blocks(c) != int(blocked_shape[1]):
        raise ShapeError(f"{node.op} {node.name!r}: {c} channels from {blocked_shape[1]} blocks")
    return c


def _infer_from(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    s = _check_blocked(node, ins[0])
    assert ins[0] is not None
    return [((s[0], from_channels(node, s), s[2], s[3]), ins[0].dtype)]


def _nchw_input(shape: Sequence[int]) -> bool:
    """A blocked conv whose input is (N, C, H, W): a stem reading an image's few channels as they come."""
    return len(shape) == 4


def _infer_conv(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    x, w = ins[0], ins[1]
    if w is None or len(w.shape) != 4:
        raise ShapeError(f"{node.op} {node.name!r}: expected 2-D conv weights (Cout, Cin, kh, kw)")
    s = x.shape if x is not None and _nchw_input(x.shape) else _check_blocked(node, x)
    geo = conv_geom(node, _logical(node, s, w.shape), w.shape)
    return [((geo.n, blocks(geo.cout)) + geo.out_sp + (BLOCK,), ins[0].dtype if ins[0] else F32)]


def _ref_conv(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    conv = op_spec("Conv")
    assert conv is not None
    _, ri = io_positions(node)
    vals = list(inputs)
    assert vals[0] is not None and vals[1] is not None
    w_shape = np.shape(vals[1])
    if not _nchw_input(vals[0].shape):
        vals[0] = from_blocked(vals[0], _logical(node, vals[0].shape, w_shape)[1])
    if ri is not None and vals[ri] is not None:
        vals[ri] = from_blocked(np.asarray(vals[ri]), int(w_shape[0]))
    plain = Node(node.name, "Conv", list(node.inputs), list(node.outputs), dict(node.attrs))
    return [to_blocked(conv.reference(plain, vals)[0])]


def _infer_pool(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    s = _check_blocked(node, ins[0])
    assert ins[0] is not None
    g = pool_geometry(node, _unblocked(s))
    return [((s[0], s[1]) + g.out + (BLOCK,), ins[0].dtype)]


def _ref_pool(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    assert inputs[0] is not None
    plain = Node(node.name, "MaxPool", list(node.inputs), list(node.outputs), dict(node.attrs))
    return [to_blocked(pool_reference(plain, [from_blocked(inputs[0])])[0])]


def _infer_gap(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    sh = _check_blocked(node, ins[0])
    assert ins[0] is not None
    return [((sh[0], from_channels(node, sh), 1, 1), ins[0].dtype)]


def _ref_gap(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    return [from_blocked(x, from_channels(node, x.shape)).mean(axis=(2, 3), keepdims=True, dtype=x.dtype)]


def _scale_shape(node: Node, x: TensorInfo | None, sc: TensorInfo | None) -> tuple[int, ...]:
    sh = _check_blocked(node, x)
    if sc is None or len(sc.shape) != 4 or tuple(sc.shape[2:]) != (1, 1) or sc.shape[0] not in (1, sh[0]) \
            or blocks(sc.shape[1]) != sh[1]:
        raise ShapeError(f"{node.op} {node.name!r}: a scale per channel (N or 1, C, 1, 1) for {sh[1]} blocks, got "
                         f"{None if sc is None else list(sc.shape)}")
    return sh


def _infer_scale(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    assert ins[0] is not None
    return [(_scale_shape(node, ins[0], ins[1]), ins[0].dtype)]


def _ref_scale(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """x times its scale per channel, then (``layout.fuse_scale_gain``) times a gain and through an activation."""
    x, sc = np.asarray(inputs[0]), np.asarray(inputs[1])
    y = from_blocked(x, sc.shape[1]) * sc
    mult, act = float(node.attrs.get("mult", 1.0)), node.attrs.get("act")
    if mult != 1.0:
        y = y * np.float32(mult)
    if act is not None:
        y = apply_act(np.ascontiguousarray(y, dtype=F32), act)
    return [to_blocked(y)]


register_op(OpSpec(GAP, _infer_gap, _ref_gap,
                   notes="inferd's own: GlobalAveragePool of a channel-blocked tensor (the CPU's layout plan inserts "
                         "it)"))
register_op(OpSpec(SCALE, _infer_scale, _ref_scale,
                   notes="inferd's own: a channel-blocked tensor times a scale per channel, a squeeze-excitation's "
                         "Mul (the CPU's layout plan inserts it)"))
register_op(OpSpec(TO, _infer_to, lambda node, v: [to_blocked(v[0])],
                   notes="inferd's own: NCHW to channel-blocked (the CPU's layout plan inserts it)"))
register_op(OpSpec(FROM, _infer_from, lambda node, v: [from_blocked(v[0], from_channels(node, v[0].shape))],
                   notes="inferd's own: channel-blocked to NCHW (the CPU's layout plan inserts it)"))
register_op(OpSpec(CONV, _infer_conv, _ref_conv,
                   notes="inferd's own: Conv on channel-blocked tensors (the CPU's layout plan inserts it)"))
register_op(OpSpec(MAXPOOL, _infer_pool, _ref_pool,
                   notes="inferd's own: MaxPool on channel-blocked tensors (the CPU's layout plan inserts it)"))


class _NativeOrOracle(BoundOrOracle):
    """The native call ``bind`` makes, else ``oracle``. Ahead of any other kernel of its ops (only the layout plan
    makes them); no weights unless a subclass transforms some."""

    priority = 10

    def applies(self, layer: Layer) -> bool:
        return layer.op in self.ops and _f32(layer)

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {}


@register_kernel
class ReorderNchwc(_NativeOrOracle):
    """Both reorders in native/nchwc.c (16 x 16 transposes in registers)."""

    name = "nchwc_reorder"
    ops = (TO, FROM)

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        x = inputs[0]
        return None if x is None else native.nchwc_reorder_bound(x, outputs[0], layer.op == TO)

    def oracle(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray]) -> np.ndarray:
        x = inputs[0]
        assert x is not None
        return to_blocked(x) if layer.op == TO else from_blocked(x, from_channels(layer.node, x.shape))


@register_kernel
class ConvNchwcKernel(_NativeOrOracle):
    """native/nchwc.c over each image; the numpy oracle where the native build is absent."""

    name = "nchwc"
    ops = (CONV,)
    def applies(self, layer: Layer) -> bool:
        # (the op checked too: another input shape's executor asks whether a donor's kernel applies to its own
        # layer of the same name, which may be the plain Conv there)
        return layer.op == CONV and 1 in layer.const_inputs and _f32(layer)

    def transform_key(self, layer: Layer) -> tuple[Any, ...]:
        return weights_key(layer) + (_nchw_input(layer.in_shape(0)),)

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        w = np.asarray(raw[raw_key(1)], dtype=F32)
        if block_groups(layer.node, w.shape) is not None:
            out = {"w": pack_grouped(w, layer.node)}
        else:
            out = {"w": pack_weights(w, depthwise(layer.node, layer.in_shape(1)), _nchw_input(layer.in_shape(0)))}
        bi, _ = io_positions(layer.node)
        if bi is not None and raw_key(bi) in raw:
            b = np.asarray(raw[raw_key(bi)], dtype=F32)
            out["b"] = np.zeros(blocks(b.size) * BLOCK, F32)  # (zero on the padding lanes)
            out["b"][:b.size] = b
        return out

    def transformed_nbytes(self, layer: Layer) -> int:
        bi, _ = io_positions(layer.node)  # (the raw weights reordered, with the padding of a partial block)
        w = layer.in_shape(1)
        return padded_nbytes(w, depthwise(layer.node, w), _nchw_input(layer.in_shape(0)),
                             block_groups(layer.node, w)) + (
            4 * blocks(layer.in_shape(bi)[0]) * BLOCK if bi is not None else 0)

    def native_scratch_nbytes(self, layer: Layer) -> int:
        # the padded or strided copy of its input conv_run makes (native/nchwc.c: inferd_nchwc_scratch_bytes)
        x, w = layer.in_shape(0), layer.in_shape(1)
        g = conv_geom(layer.node, _logical(layer.node, x, w), w).as2d()
        if g is None or (g.group > 1 and block_groups(layer.node, w) is None):
            return 0  # (the depthwise conv allocates nothing)
        return native.nchwc_scratch_nbytes(g.cin, 1 if _nchw_input(x) else BLOCK, g.h, g.w, g.cout, g.kh, g.kw,
                                           g.sh, g.sw, g.pt, g.pl, g.oh, g.ow, g.dh, g.dw)

    def _args(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
              outputs: Sequence[np.ndarray]) -> tuple | None:
        bi, ri = io_positions(layer.node)
        code, p0, p1 = native.native_act(_act(layer.node)) or (-1, 0.0, 0.0)
        x, y = inputs[0], outputs[0]
        res = inputs[ri] if ri is not None else None
        if code < 0 or x is None or (bi is not None and "b" not in params) or (ri is not None and res is None):
            return None
        geo = conv_geom(layer.node, _logical(layer.node, x.shape, layer.in_shape(1)), layer.in_shape(1))
        g2 = geo.as2d()
        dw = depthwise(layer.node, layer.in_shape(1))
        bg = block_groups(layer.node, layer.in_shape(1))
        if g2 is None or (g2.group != 1 and not dw and bg is None) or (bg is not None and _nchw_input(x.shape)):
            return None
        if _dilated(g2):
            if not dilated_ok(g2) or dw or bg is not None or _nchw_input(x.shape):
                return None
        elif g2.pt >= g2.kh or g2.pl >= g2.kw:
            return None
        return x, y, res, params.get("b"), g2, code, p0, p1, bg

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        a = self._args(layer, inputs, params, outputs)
        if a is None:
            return None
        x, y, res, b, g, code, p0, p1, bg = a
        return native.nchwc_conv_bound(x, params["w"], b, res, y, g.kh, g.kw, g.sh, g.sw, g.pt, g.pl, code, p0, p1,
                                       depthwise=g.group > 1 and bg is None, cin=g.cin, cout=g.cout,
                                       grouped=bg[1:] if bg is not None else None,
                                       dilation=(g.dh, g.dw) if _dilated(g) else None)

    def oracle(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray]) -> np.ndarray:
        vals = list(inputs)
        w_shape = layer.in_shape(1)
        bg = block_groups(layer.node, w_shape)
        if bg is not None:
            g, per = int(layer.node.attrs["group"]), bg[0]
            dense = (blocks(w_shape[0]) * BLOCK, bg[1] * BLOCK) + tuple(w_shape[2:])
            vals[1] = _group_sparse(_unpack_weights(params["w"], dense), g, per, int(w_shape[0]))
        else:
            vals[1] = _unpack_weights(params["w"], w_shape, depthwise(layer.node, w_shape),
                                      _nchw_input(layer.in_shape(0)))
        bi, _ = io_positions(layer.node)
        if bi is not None:
            vals[bi] = params["b"][:layer.in_shape(1)[0]] if "b" in params else None
        return _ref_conv(layer.node, vals)[0]


def _dilated(g: Any) -> bool:
    """A dilation that matters: not 1, on a kernel of more than one tap (a 1x1's dilation reads nothing else)."""
    return (g.dh, g.dw) != (1, 1) and (g.kh, g.kw) != (1, 1)


def dilated_ok(g: Any) -> bool:
    """Whether native/nchwc.c's dilated conv takes a 2-D geometry with a dilation (``inferd_nchwc_conv_dilated``:
    stride 1, one group, each pad a whole multiple of its dilation and less than the kernel in dilated steps;
    DeepLab's and FCN's atrous 3x3s with pads equal to the dilation)."""
    return (g.sh == 1 and g.sw == 1 and g.group == 1 and g.pt % g.dh == 0 and g.pl % g.dw == 0
            and g.pt // g.dh < g.kh and g.pl // g.dw < g.kw and native.has("inferd_nchwc_conv_dilated"))


def _f32(layer: Layer) -> bool:
    return layer.inputs[0] is not None and layer.inputs[0].dtype == F32


def _unpack_weights(wp: np.ndarray, shape: Sequence[int], dw: bool = False, nchw_input: bool = False) -> np.ndarray:
    co0, ci0, kh, kw = (int(d) for d in shape)
    co, ci = _padded_dims(co0, ci0, dw, nchw_input)
    cpb = 1 if nchw_input else BLOCK
    if dw:
        full = wp.reshape(co // BLOCK, kh, kw, BLOCK).transpose(0, 3, 1, 2).reshape(co, kh, kw)
        return np.ascontiguousarray(full[:co0, None])
    out = np.empty((co, ci, kh, kw), F32)
    at = 0
    gb = group_blocks()
    for b0 in range(0, co // BLOCK, gb):
        nb = min(gb, co // BLOCK - b0)
        n = nb * BLOCK * ci * kh * kw
        g = wp[at:at + n].reshape(ci // cpb, kh, kw, cpb, nb * BLOCK)
        out[b0 * BLOCK:(b0 + nb) * BLOCK] = g.transpose(4, 0, 3, 1, 2).reshape(nb * BLOCK, ci, kh, kw)
        at += n
    return np.ascontiguousarray(out[:co0, :ci0])


@register_kernel
class MaxPoolNchwcKernel(_NativeOrOracle):
    """native/nchwc.c's pool over each image (dilation 1); the oracle otherwise."""

    name = "nchwc_pool"
    ops = (MAXPOOL,)

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        x = inputs[0]
        if x is None:
            return None
        g = pool_geometry(layer.node, _unblocked(x.shape))
        if any(d != 1 for d in g.dilations) or g.pads_head[0] >= g.kernel[0] or g.pads_head[1] >= g.kernel[1]:
            return None
        return native.nchwc_maxpool_bound(x, outputs[0], g.kernel[0], g.kernel[1], g.strides[0], g.strides[1],
                                          g.pads_head[0], g.pads_head[1])

    def oracle(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray]) -> np.ndarray:
        return _ref_pool(layer.node, list(inputs))[0]


@register_kernel
class SqueezeExciteNchwc(_NativeOrOracle):
    """native/nchwc.c's pool and scale passes; the oracles otherwise."""

    name = "nchwc_se"
    ops = (GAP, SCALE)

    def applies(self, layer: Layer) -> bool:
        # (the layout plan gives a scale computed at run time: a squeeze-excitation's)
        return super().applies(layer) and not layer.const_inputs

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        x = inputs[0]
        if x is None:
            return None
        if layer.op == GAP:
            return native.nchwc_gap_bound(x, outputs[0])
        if inputs[1] is None:
            return None
        attrs = layer.node.attrs
        return native.nchwc_scale_bound(x, inputs[1], outputs[0], float(attrs.get("mult", 1.0)), attrs.get("act"))

    def oracle(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray]) -> np.ndarray:
        ref = _ref_gap if layer.op == GAP else _ref_scale
        return ref(layer.node, list(inputs))[0]
