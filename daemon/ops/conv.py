"""Conv and ConvTranspose: op specs (shape inference, numpy reference) and the CPU kernels.

Layout is NCHW float32. 1-D convolutions run through the 2-D kernels as H = 1; 3-D and higher
only through ``direct`` (the reference). Every kernel honours the optional bias, a fused
``attrs["residual"]`` (the node's last input, added after the bias) and a fused ``attrs["act"]``.

Conv kernels, in default order (``priority``; measured warm on an AMD EPYC (Zen 4), see each class's
docstring and :func:`preferred_3x3_kernel`):

* ``depthwise_direct`` (4): depthwise 3x3/5x5, stride 1/2, dilation 1, multiplier 1, straight from NCHW rows
  (native/dwconv.c); preferred for 3x3 where it reads the rows in place (stride 1, "same" columns, 9 columns
  or more) and on wide maps (``DW_DIRECT_MIN_OW``).
* ``depthwise`` (5): group == Cin > 1, Cout = mult * Cin, any kernel/stride/dilation, native C.
* ``conv1x1`` (10): 1x1 kernel, no padding, any stride: one GEMM per image (strided input copied first).
* ``winograd23`` (20) / ``winograd43`` (25): 3x3 stride 1 dilation 1 group 1. F(4x4,3x3) wins on
  large maps with many channels, F(2x2,3x3) from 64 input channels on elsewhere, ``direct_gemm`` with 8-48,
  im2col below 8:
  :func:`preferred_3x3_kernel` says which, and each kernel's ``preferred(layer)`` exposes it for the
  planner (static priorities cannot).
* ``im2col_tiled`` (38): group 1, im2col + GEMM band by band of output rows (native/convtile.c); preferred up to
  C*kh*kw = ``TILED_MAX_K`` (the stems), where the column matrix costs more than the GEMM.
* ``direct_gemm`` (39): group 1, any stride (1-4) and dilation: the GEMM's micro-kernel reading the padded or
  phase-split input in place (native/convdirect.c); preferred for 3x3 stride-1 layers of 8-48 input channels on
  any map unless F(4,3) applies with more than 16 output channels (:func:`preferred_3x3_kernel`).
* ``im2col`` (40): anything 1-D/2-D: native im2col then a batched GEMM over groups.
* ``implicit`` (45, in :mod:`.conv_implicit`): group 1, Cin >= 8, anything 1-D/2-D but an unpadded 1x1: the GEMM
  gathers its column blocks from the input through offset tables (no column matrix stored); a measured
  alternative to im2col, not the default.
* ``direct`` (90): the readable reference, any rank.

ConvTranspose: ``col2im`` (40: GEMM then native scatter-add) and ``direct`` (90).
"""
from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

import numpy as np

from .. import native
from ..errors import ShapeError, UnsupportedOpError
from ..ir import Node, TensorInfo
from .activation import apply_act
from .base import (ContiguousOut, Kernel, Layer, OpSpec, raw_key, register_kernel, register_op,
                   weights_key)

F32 = np.float32
AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
Act = tuple[str, tuple[float, ...]]


# =========================================================================== geometry


def _ints(v: Any, n: int, default: int) -> tuple[int, ...]:
    if v is None:
        return (default,) * n
    t = tuple(int(a) for a in (v.tolist() if isinstance(v, np.ndarray) else v))
    if len(t) != n:
        raise ShapeError(f"attribute has {len(t)} values, expected {n}")
    return t


def _auto_pad(node: Node) -> str:
    a = node.attr("auto_pad", "NOTSET")
    return a.decode() if isinstance(a, bytes) else str(a)


@dataclass(frozen=True)
class ConvGeom:
    """Resolved N-D geometry of one Conv or ConvTranspose node.

    For Conv, ``in_sp`` is the input's spatial shape and ``out_sp`` the output's; for ConvTranspose
    too (so the transposed kernel maps ``in_sp`` to ``out_sp``). ``pb``/``pe`` are the begin/end pads.
    """

    n: int
    cin: int
    cout: int
    group: int
    in_sp: tuple[int, ...]
    k: tuple[int, ...]
    s: tuple[int, ...]
    d: tuple[int, ...]
    pb: tuple[int, ...]
    pe: tuple[int, ...]
    out_sp: tuple[int, ...]

    @property
    def nsp(self) -> int:
        return len(self.in_sp)

    def as2d(self) -> "Geom2D | None":
        """The 2-D view of a 1-D or 2-D geometry (a 1-D conv is a 2-D conv of height 1)."""
        if self.nsp == 2:
            h, w = self.in_sp
            kh, kw = self.k
            sh, sw = self.s
            dh, dw = self.d
            pt, pl = self.pb
            pb, pr = self.pe
            oh, ow = self.out_sp
        elif self.nsp == 1:
            h, w, kh, kw, sh, sw, dh, dw = 1, self.in_sp[0], 1, self.k[0], 1, self.s[0], 1, self.d[0]
            pt, pl, pb, pr, oh, ow = 0, self.pb[0], 0, self.pe[0], 1, self.out_sp[0]
        else:
            return None
        return Geom2D(self.n, self.cin, h, w, self.cout, self.group, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, oh, ow)


@dataclass(frozen=True)
class Geom2D:
    n: int
    cin: int
    h: int
    w: int
    cout: int
    group: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int
    pl: int
    pb: int
    pr: int
    oh: int
    ow: int

    @property
    def unpadded_1x1(self) -> bool:
        """A 1x1 kernel with no padding: the input itself is the GEMM operand (any stride)."""
        return self.kh == 1 and self.kw == 1 and not (self.pt or self.pl or self.pb or self.pr)

    @property
    def pointwise(self) -> bool:
        """1x1, stride 1, unpadded: every output pixel is one input pixel."""
        return self.unpadded_1x1 and self.sh == 1 and self.sw == 1


def conv_pads(in_sp: Sequence[int], k: Sequence[int], s: Sequence[int], d: Sequence[int], auto_pad: str,
              pads: Sequence[int] | None) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(begin pads, end pads, output spatial shape) of a Conv, as ONNX (and onnxruntime) define them."""
    n = len(in_sp)
    begins: list[int] = []
    ends: list[int] = []
    outs: list[int] = []
    for a in range(n):
        ext = (k[a] - 1) * d[a] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-in_sp[a] // s[a])
            need = max(0, (out - 1) * s[a] + ext - in_sp[a])
            b = need // 2 if auto_pad == "SAME_UPPER" else need - need // 2
            e = need - b
        elif auto_pad == "VALID":
            b = e = 0
        else:
            p = _ints(pads, 2 * n, 0)
            b, e = p[a], p[a + n]
        out = (in_sp[a] + b + e - ext) // s[a] + 1
        if out < 1:
            raise ShapeError(f"Conv output size {out} < 1 on spatial axis {a} (input {in_sp[a]}, kernel extent {ext}, "
                             f"stride {s[a]}, pads {b},{e})")
        begins.append(b)
        ends.append(e)
        outs.append(out)
    return tuple(begins), tuple(ends), tuple(outs)


def conv_transpose_pads(in_sp: Sequence[int], k: Sequence[int], s: Sequence[int], d: Sequence[int],
                        output_padding: Sequence[int], auto_pad: str, pads: Sequence[int] | None,
                        output_shape: Sequence[int] | None) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(begin pads, end pads, output spatial shape) of a ConvTranspose (ONNX spec, as onnxruntime implements it)."""
    n = len(in_sp)
    begins: list[int] = []
    ends: list[int] = []
    outs: list[int] = []
    for a in range(n):
        full = s[a] * (in_sp[a] - 1) + output_padding[a] + (k[a] - 1) * d[a] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER") or output_shape is not None:
            out = in_sp[a] * s[a] if auto_pad in ("SAME_UPPER", "SAME_LOWER") else int(output_shape[a])  # type: ignore[index]
            total = full - out
            if auto_pad == "SAME_UPPER":
                b = total // 2
                e = total - b
            else:
                e = total // 2
                b = total - e
        elif auto_pad == "VALID":
            b = e = 0
            out = full
        else:
            p = _ints(pads, 2 * n, 0)
            b, e = p[a], p[a + n]
            out = full - b - e
        if out < 1:
            raise ShapeError(f"ConvTranspose output size {out} < 1 on spatial axis {a}")
        begins.append(b)
        ends.append(e)
        outs.append(out)
    return tuple(begins), tuple(ends), tuple(outs)


def conv_geom(node: Node, x_shape: Sequence[int], w_shape: Sequence[int]) -> ConvGeom:
    if len(x_shape) < 3 or len(w_shape) != len(x_shape):
        raise ShapeError(f"Conv {node.name!r}: input rank {len(x_shape)} and weight rank {len(w_shape)} "
                         f"must be equal and >= 3")
    nsp = len(x_shape) - 2
    g = int(node.attr("group", 1))
    n, c = int(x_shape[0]), int(x_shape[1])
    cout, cg = int(w_shape[0]), int(w_shape[1])
    k = tuple(int(v) for v in w_shape[2:])
    ks = node.attr("kernel_shape")
    if ks is not None and _ints(ks, nsp, 1) != k:
        raise ShapeError(f"Conv {node.name!r}: kernel_shape {list(ks)} but weights {list(w_shape)}")
    if g < 1 or c != cg * g or cout % g:
        raise ShapeError(f"Conv {node.name!r}: {c} input channels, weights {list(w_shape)} and group {g} do not fit")
    s = _ints(node.attr("strides"), nsp, 1)
    d = _ints(node.attr("dilations"), nsp, 1)
    pb, pe, out = conv_pads(x_shape[2:], k, s, d, _auto_pad(node), node.attr("pads"))
    return ConvGeom(n, c, cout, g, tuple(int(v) for v in x_shape[2:]), k, s, d, pb, pe, out)


def conv_transpose_geom(node: Node, x_shape: Sequence[int], w_shape: Sequence[int]) -> ConvGeom:
    if len(x_shape) < 3 or len(w_shape) != len(x_shape):
        raise ShapeError(f"ConvTranspose {node.name!r}: input rank {len(x_shape)} and weight rank {len(w_shape)} "
                         f"must be equal and >= 3")
    nsp = len(x_shape) - 2
    g = int(node.attr("group", 1))
    n, c = int(x_shape[0]), int(x_shape[1])
    if g < 1 or int(w_shape[0]) != c or c % g:
        raise ShapeError(f"ConvTranspose {node.name!r}: {c} input channels, weights {list(w_shape)}, group {g}")
    cout = int(w_shape[1]) * g
    k = tuple(int(v) for v in w_shape[2:])
    s = _ints(node.attr("strides"), nsp, 1)
    d = _ints(node.attr("dilations"), nsp, 1)
    op = _ints(node.attr("output_padding"), nsp, 0)
    osh = node.attr("output_shape")
    if osh is not None:
        osh = [int(v) for v in (osh.tolist() if isinstance(osh, np.ndarray) else osh)]
        if len(osh) == nsp + 2:  # some exporters give the full shape
            osh = osh[2:]
        if len(osh) != nsp:
            raise ShapeError(f"ConvTranspose {node.name!r}: output_shape {osh} for {nsp} spatial axes")
    pb, pe, out = conv_transpose_pads(x_shape[2:], k, s, d, op, _auto_pad(node), node.attr("pads"), osh)
    return ConvGeom(n, c, cout, g, tuple(int(v) for v in x_shape[2:]), k, s, d, pb, pe, out)


def layer_geom(layer: Layer) -> ConvGeom:
    """The layer's geometry, computed once per Layer object: kernel selection asks every candidate's
    ``applies``/``priority``, ~18 times per conv (resnet50 on Vulkan: 992 calls, 29 ms of a 69 ms set-up)."""
    cached = layer.__dict__.get("_geom")
    if cached is not None:
        return cached
    x, w = layer.in_shape(0), layer.in_shape(1)
    g = conv_geom(layer.node, x, w) if layer.op == "Conv" else conv_transpose_geom(layer.node, x, w)
    object.__setattr__(layer, "_geom", g)  # Layer is frozen; the geometry is a pure function of it
    return g


def io_positions(node: Node) -> tuple[int | None, int | None]:
    """Input positions of the bias and of the fused residual (None where absent).

    The residual is the node's last input (import appends it after a placeholder bias ``""``)."""
    n = len(node.inputs)
    res = n - 1 if node.attrs.get("residual") else None
    core = n - 1 if res is not None else n
    bias = 2 if core > 2 and node.inputs[2] else None
    return bias, res


def _act(node: Node) -> Act | None:
    a = node.attrs.get("act")
    if a is None:
        return None
    return str(a[0]), tuple(float(v) for v in (a[1] if len(a) > 1 else ()))


# =========================================================================== reference math


def conv_nd(x: np.ndarray, w: np.ndarray, geo: ConvGeom) -> np.ndarray:
    """Convolution without bias, any rank: a sum over kernel taps of (G, Cout/G, Cin/G) @ shifted inputs."""
    n, g = x.shape[0], geo.group
    cg, cog = geo.cin // g, geo.cout // g
    pads = [(0, 0), (0, 0)] + [(b, e) for b, e in zip(geo.pb, geo.pe)]
    xp = np.pad(x, pads)
    npix = math.prod(geo.out_sp)
    wg = w.reshape((g, cog, cg) + geo.k)
    acc = np.zeros((n, g, cog, npix), dtype=np.result_type(x.dtype, w.dtype))
    for tap in np.ndindex(*geo.k):
        win = tuple(slice(t * d, t * d + (o - 1) * s + 1, s) for t, d, o, s in zip(tap, geo.d, geo.out_sp, geo.s))
        xs = xp[(slice(None), slice(None)) + win].reshape(n, g, cg, npix)
        acc += np.matmul(wg[(Ellipsis,) + tap], xs)
    return acc.reshape((n, geo.cout) + geo.out_sp)


def conv_transpose_nd(x: np.ndarray, w: np.ndarray, geo: ConvGeom) -> np.ndarray:
    """Transposed convolution without bias, any rank: each tap scatters (Cout/G, Cin/G) @ x into a strided window."""
    n, g = x.shape[0], geo.group
    cg, cog = geo.cin // g, geo.cout // g
    full = [(i - 1) * s + (k - 1) * d + 1 for i, s, k, d in zip(geo.in_sp, geo.s, geo.k, geo.d)]
    # the output window is [pb, pb + out) of the full (unpadded) result; negative pads extend it
    shift = [max(0, -b) for b in geo.pb]
    size = [sh + max(f, b + o) for sh, f, b, o in zip(shift, full, geo.pb, geo.out_sp)]
    acc = np.zeros((n, g, cog, *size), dtype=np.result_type(x.dtype, w.dtype))
    wg = w.reshape((g, cg, cog) + geo.k)
    xg = x.reshape(n, g, cg, math.prod(geo.in_sp))
    for tap in np.ndindex(*geo.k):
        contrib = np.matmul(np.swapaxes(wg[(Ellipsis,) + tap], 1, 2), xg).reshape((n, g, cog) + geo.in_sp)
        win = tuple(slice(sh + t * d, sh + t * d + (i - 1) * s + 1, s)
                    for sh, t, d, i, s in zip(shift, tap, geo.d, geo.in_sp, geo.s))
        acc[(slice(None),) * 3 + win] += contrib
    crop = tuple(slice(sh + b, sh + b + o) for sh, b, o in zip(shift, geo.pb, geo.out_sp))
    return acc[(slice(None),) * 3 + crop].reshape((n, geo.cout) + geo.out_sp)


def _epilogue_numpy(y: np.ndarray, bias: np.ndarray | None, res: np.ndarray | None, act: Act | None) -> np.ndarray:
    if bias is not None:
        y += bias.reshape((1, -1) + (1,) * (y.ndim - 2)).astype(y.dtype, copy=False)
    if res is not None:
        y += res
    return apply_act(y, act)


# =========================================================================== op specs


def _check_conv(node: Node, opset: int) -> None:
    ap = _auto_pad(node)
    if ap not in AUTO_PADS:
        raise UnsupportedOpError(node.op, node.name, opset, f"auto_pad {ap!r}")


def _infer_conv(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    x, w = ins[0], ins[1]
    if x is None or w is None:
        raise ShapeError(f"{node.op} {node.name!r}: input and weights are required")
    geo = conv_geom(node, x.shape, w.shape) if node.op == "Conv" else conv_transpose_geom(node, x.shape, w.shape)
    return [((geo.n, geo.cout) + geo.out_sp, x.dtype)]


def _ref_conv(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    x, w = inputs[0], inputs[1]
    assert x is not None and w is not None
    bi, ri = io_positions(node)
    if node.op == "Conv":
        y = conv_nd(x, w, conv_geom(node, x.shape, w.shape))
    else:
        y = conv_transpose_nd(x, w, conv_transpose_geom(node, x.shape, w.shape))
    y = y.astype(x.dtype, copy=False)
    return [_epilogue_numpy(y, inputs[bi] if bi is not None else None, inputs[ri] if ri is not None else None,
                            _act(node))]


register_op(OpSpec("Conv", _infer_conv, _ref_conv, check=_check_conv))
register_op(OpSpec("ConvTranspose", _infer_conv, _ref_conv, check=_check_conv))


# =========================================================================== kernel helpers

_tls = threading.local()


def scratch(slot: int, n: int) -> np.ndarray:
    """A float32 buffer of ``n`` elements, reused across runs (one per thread and slot; grows as needed).

    Keeps the im2col/Winograd workspaces mapped between runs so a warm run does not page-fault
    them in again; :func:`release_scratch` frees them."""
    bufs = getattr(_tls, "bufs", None)
    if bufs is None:
        bufs = _tls.bufs = {}
    b = bufs.get(slot)
    if b is None or b.size < n:
        b = bufs[slot] = np.empty(max(n, 1), F32)
    return b[:n]


def release_scratch() -> None:
    """Drop this thread's kernel workspaces."""
    _tls.bufs = {}


def prefault_scratch(sizes: dict[int, int]) -> dict[int, np.ndarray]:
    """Workspaces of ``sizes`` (slot -> elements) with their pages faulted in, made on any thread for
    :func:`adopt_scratch` on the thread that will run the kernels (a VM page fault costs microseconds:
    an 8 MB im2col buffer first touched inside the first run costs it milliseconds). From the host pool where
    the process has one: already faulted in there (vit_tiny's 0.6 MB and resnet18's 3.5 MB took 2.2 and 2.9 ms
    to fault in on the 2-core VM, beside the loader and the executor)."""
    from ..fileio import empty_aligned
    from ..runtime.hostpool import fault_in

    out = {}
    for slot, n in sizes.items():
        b = empty_aligned((max(int(n), 1),), F32)
        fault_in(b)
        out[slot] = b
    return out


def adopt_scratch(bufs: dict[int, np.ndarray]) -> None:
    """Make ``bufs`` this thread's workspaces where they are larger than what it has."""
    mine = getattr(_tls, "bufs", None)
    if mine is None:
        mine = _tls.bufs = {}
    for slot, b in bufs.items():
        cur = mine.get(slot)
        if cur is None or cur.size < b.size:
            mine[slot] = b


def _arg(layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
         i: int | None) -> np.ndarray | None:
    if i is None:
        return None
    x = inputs[i] if i < len(inputs) else None
    return params.get(raw_key(i)) if x is None else x


def _finish(y: np.ndarray, bias: np.ndarray | None, res: np.ndarray | None, act: Act | None) -> None:
    """In place on ``y`` (N, C, ...): add bias[c] and the residual, then the activation (one native pass
    when the activation is one the C epilogue knows)."""
    if bias is None and res is None and act is None:
        return
    if res is not None and (res.shape != y.shape or res.dtype != y.dtype):
        _epilogue_numpy(y, bias, np.broadcast_to(res, y.shape).astype(y.dtype, copy=False), act)
        return
    nat = act is None or act[0] in native.NATIVE_ACTS
    if res is not None and not res.flags.c_contiguous:
        res = np.ascontiguousarray(res)
    for i in range(y.shape[0]):
        native.bias_act(y[i], bias, None if res is None else res[i], act if nat else None)
    if not nat:
        apply_act(y, act)


def _is_f32(layer: Layer) -> bool:
    x = layer.inputs[0]
    return x is not None and np.dtype(x.dtype) == F32 and np.dtype(layer.outputs[0].dtype) == F32


_GEO_CACHE: dict[int, tuple[weakref.ref, Geom2D | None]] = {}


def _geo2d(layer: Layer) -> Geom2D | None:
    """The layer's 2-D geometry (None for 3-D+ or malformed), cached per Layer object: parsing the attributes
    costs ~10 us, which adds up over the dozens of convs of a small model's warm run."""
    hit = _GEO_CACHE.get(id(layer))
    if hit is not None and hit[0]() is layer:
        return hit[1]
    try:
        g = layer_geom(layer).as2d()
    except Exception:
        g = None
    if len(_GEO_CACHE) > 4096:
        _GEO_CACHE.clear()
    _GEO_CACHE[id(layer)] = (weakref.ref(layer), g)
    return g


_INFO_CACHE: dict[int, tuple[weakref.ref, tuple]] = {}


def _fast_info(layer: Layer) -> tuple:
    """(bias position, residual position, act code, p0, p1), cached per Layer object; code -1 when the fused
    activation is not one the C epilogue knows. Saves re-parsing node attributes on every warm run."""
    hit = _INFO_CACHE.get(id(layer))
    if hit is not None and hit[0]() is layer:
        return hit[1]
    bi, ri = io_positions(layer.node)
    act = _act(layer.node)
    code, p0, p1 = native.native_act(act) or (-1, 0.0, 0.0)
    info = (bi, ri, code, p0, p1)
    if len(_INFO_CACHE) > 4096:
        _INFO_CACHE.clear()
    _INFO_CACHE[id(layer)] = (weakref.ref(layer), info)
    return info


def _fast_io(layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             out: np.ndarray) -> tuple | None:
    """(x, bias, res, code, p0, p1) when the layer can take a kernel's fast path: one thread of native code,
    contiguous float32 input/output/residual of the expected shapes, constant bias already transformed,
    and a native (or no) activation. None otherwise (the general path handles everything)."""
    if not native.fast_path():
        return None
    bi, ri, code, p0, p1 = _fast_info(layer)
    if code < 0 or (bi is not None and "b" not in params):
        return None
    x = inputs[0] if inputs else None
    if x is None or x.dtype != F32 or not x.flags.c_contiguous:
        return None
    if out.dtype != F32 or not out.flags.c_contiguous:
        return None
    res = None
    if ri is not None:
        res = _arg(layer, inputs, params, ri)
        if res is None or res.shape != out.shape or res.dtype != F32 or not res.flags.c_contiguous:
            return None
    return x, params.get("b"), res, code, p0, p1


def _bound_io(layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
              out: np.ndarray) -> tuple[Geom2D, tuple] | None:
    """(geometry, :func:`_fast_io`'s tuple) for a call bound once over one image on the native kernels (the
    ``bind`` of im2col, Winograd and ConvTranspose's col2im); None where only ``run`` applies."""
    g = _geo2d(layer)
    if g is None or g.n != 1 or not native.AVAILABLE:
        return None
    f = _fast_io(layer, inputs, params, out)
    return None if f is None else (g, f)


def _passthrough(layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Raw constants other than the weights and bias (e.g. a constant residual), kept under their raw keys."""
    bi, _ = io_positions(layer.node)
    return {k: v for k, v in raw.items() if k not in (raw_key(1), raw_key(bi) if bi is not None else "")}


def _bias_param(layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    bi, _ = io_positions(layer.node)
    if bi is not None and raw_key(bi) in raw:
        return {"b": np.ascontiguousarray(raw[raw_key(bi)], dtype=F32).reshape(-1)}
    return {}


def _bias_nbytes(layer: Layer) -> int:
    bi, _ = io_positions(layer.node)
    if bi is not None and bi in layer.const_inputs:
        return layer.inputs[bi].size * 4  # type: ignore[union-attr]
    return 0


def _other_const_nbytes(layer: Layer) -> int:
    bi, _ = io_positions(layer.node)
    return sum(layer.inputs[k].nbytes for k in layer.const_inputs  # type: ignore[union-attr]
               if k not in (1, bi) and layer.inputs[k] is not None)


class _ConvKernelBase(Kernel):
    """Shared plumbing of the transformed (float32, 1-D/2-D) conv kernels."""

    backend = "cpu"

    def transform_key(self, layer: Layer) -> tuple[Any, ...]:
        return weights_key(layer)  # packs, Winograd transforms and tiles the filters only

    def preferred(self, layer: Layer) -> bool:
        """Whether this kernel should be the default among the applicable ones (shape-dependent refinement
        of ``priority``; a planner that knows this method skips applicable kernels that are not preferred)."""
        return True

    def _base_applies(self, layer: Layer) -> Geom2D | None:
        if not _is_f32(layer) or 1 not in layer.const_inputs:
            return None
        return _geo2d(layer)

    def _w_nbytes(self, layer: Layer) -> int:
        return layer.inputs[1].size * 4  # type: ignore[union-attr]  # transform casts to float32

    def transformed_nbytes(self, layer: Layer) -> int:
        return self._w_nbytes(layer) + _bias_nbytes(layer) + _other_const_nbytes(layer)

    def _common(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray]
                ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, Act | None]:
        bi, ri = io_positions(layer.node)
        x = _arg(layer, inputs, params, 0)
        assert x is not None
        if x.dtype != F32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=F32)
        bias = params.get("b")
        if bias is None and bi is not None:
            b = _arg(layer, inputs, params, bi)
            bias = None if b is None else np.ascontiguousarray(b, dtype=F32).reshape(-1)
        res = _arg(layer, inputs, params, ri)
        return x, bias, res, _act(layer.node)


def _run_reference(layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
                   outputs: Sequence[np.ndarray], compute: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
    """The reference kernels' shared body: ``compute(x, w)``, then bias, residual and activation in numpy."""
    bi, ri = io_positions(layer.node)
    x, w = _arg(layer, inputs, params, 0), _arg(layer, inputs, params, 1)
    assert x is not None and w is not None
    y = compute(x, w).astype(outputs[0].dtype, copy=False)
    _epilogue_numpy(y, _arg(layer, inputs, params, bi), _arg(layer, inputs, params, ri), _act(layer.node))
    np.copyto(outputs[0], y)


def pack_gemm_weights(w3: np.ndarray, ncols: int) -> np.ndarray:
    """(G, M, K) weights packed for :func:`native.gemm` against ``ncols``-column operands (its A or B form)."""
    return native.pack_weights(w3, ncols)


#: Column count that selects the A form in pack_gemm_weights. The 1x1 and im2col convs always use it: measured on
#: Zen 4, the B form made mobilenetv2's 7x7 1x1 convs 1.3-1.4x slower (short K, scattered stores); Winograd takes
#: the B form only below native.GEMM_BFORM_MAX_COLS tiles.
A_FORM = 1 << 30

#: ``Kernel.weights_form`` of the conv kernels whose weights are ``pack_gemm_weights(w, A_FORM)`` of the
#: (G, Cout/G, Cin/G*kh*kw) filter matrix
GEMM_A_WEIGHTS = "gemm_a"


def packed_nbytes(groups: int, m: int, k: int, ncols: int) -> int:
    return native.packed_weights_nbytes(groups, m, k, ncols)


def _gemm_into(wp: np.ndarray, mg: int, xs: np.ndarray, y: np.ndarray, bias: np.ndarray | None,
               res: np.ndarray | None, act: Act | None) -> None:
    """y (G, mg, P) = act(W xs + bias + res) per group; xs (G, K, P). The epilogue runs inside the GEMM when the
    activation is native and the residual has y's shape; otherwise after it, in one more pass."""
    nat = act is None or act[0] in native.NATIVE_ACTS
    fused_res = res is not None and res.shape == y.shape and res.dtype == F32
    b2 = None if bias is None else bias.reshape(y.shape[0], mg)
    if nat and (res is None or fused_res):
        native.gemm(wp, mg, xs, y, b2, res, act)
        return
    native.gemm(wp, mg, xs, y, b2, res if fused_res else None, None)
    _epilogue_numpy(y.reshape(-1, y.shape[-1]), None,
                    None if res is None or fused_res else np.broadcast_to(res, y.shape).reshape(-1, y.shape[-1]), act)


def _res_per_image(res: np.ndarray | None, yshape: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray | None:
    """The residual as ``shape`` (N, G, M, P) when it has the output's full shape (then the GEMM adds it);
    None when there is none or it broadcasts (then it is added after the GEMM)."""
    if res is None or tuple(res.shape) != tuple(yshape):
        return None
    return np.asarray(res, dtype=F32).reshape(shape)


# =========================================================================== Conv kernels


@register_kernel
class ConvDirect(Kernel):
    """The reference: sum over kernel taps of grouped matmuls on shifted views (any rank, any dtype)."""

    name = "direct"
    ops = ("Conv",)
    priority = 90

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        _run_reference(layer, inputs, params, outputs,
                       lambda x, w: conv_nd(x, w, conv_geom(layer.node, x.shape, w.shape)))


def _im2col_gemm_bound(layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
                       outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
    """One image: the native im2col (a strided 1x1's: its strided pixels) and the bound GEMM, resolved now (run()
    spent tens of microseconds of argument plumbing per call). The column buffer is this thread's scratch, looked
    up per call (it may grow or be another thread's), the GEMM re-bound when it changed."""
    b = _bound_io(layer, inputs, params, outputs[0])
    if b is None:
        return None
    g, (x, bias, res, code, p0, p1) = b
    k, mg, npix = g.cin // g.group * g.kh * g.kw, g.cout // g.group, g.oh * g.ow
    n = g.cin * g.kh * g.kw * npix
    y3 = outputs[0].reshape(g.group, mg, npix)
    r3 = None if res is None else res.reshape(g.group, mg, npix)
    w = params["w"]
    im = native.lib.inferd_im2col
    iargs = (native._ptr(x), g.cin, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.pt, g.pl, g.oh, g.ow)
    probe = native.gemm_bound(w, mg, np.empty((g.group, k, npix), F32), y3, bias, r3, code, p0, p1)
    if probe is None:
        return None
    state: list[Any] = [None, None, None]  # scratch base, its pointer, the GEMM bound to it

    def call(_keep: Any = (x, w, bias, res, outputs[0])) -> None:
        col = scratch(0, n)
        if col.base is not state[0] or state[2] is None:
            state[0], state[1] = col.base, native._ptr(col)
            state[2] = native.gemm_bound(w, mg, col.reshape(g.group, k, npix), y3, bias, r3, code, p0, p1)
        im(*iargs, state[1])
        state[2]()
    return call


@register_kernel
class ConvIm2col(_ConvKernelBase):
    """Native im2col per image, then W (G, Cout/G, Cin/G*kh*kw) @ col (G, Cin/G*kh*kw, OH*OW) on the native GEMM,
    written straight into the output. Workspace: the column matrix of one image."""

    name = "im2col"
    ops = ("Conv",)
    priority = 40
    weights_form = GEMM_A_WEIGHTS

    def applies(self, layer: Layer) -> bool:
        return self._base_applies(layer) is not None

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = layer_geom(layer)
        w3 = np.asarray(raw[raw_key(1)], dtype=F32).reshape(g.group, g.cout // g.group, -1)
        return {**_passthrough(layer, raw), "w": pack_gemm_weights(w3, A_FORM), **_bias_param(layer, raw)}

    def _w_nbytes(self, layer: Layer) -> int:
        g = layer_geom(layer)
        return packed_nbytes(g.group, g.cout // g.group, layer.inputs[1].size // g.cout,  # type: ignore[union-attr]
                             A_FORM)

    def workspace_nbytes(self, layer: Layer) -> int:
        return sum(self.scratch_floats(layer).values()) * 4

    def scratch_floats(self, layer: Layer) -> dict[int, int]:
        g = _geo2d(layer)
        assert g is not None
        return {0: g.cin * g.kh * g.kw * g.oh * g.ow}

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        return _im2col_gemm_bound(layer, inputs, params, outputs)

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        g = _geo2d(layer)
        assert g is not None
        x, bias, res, act = self._common(layer, inputs, params)
        o = ContiguousOut(outputs[0])
        w = params["w"]
        k = g.cin // g.group * g.kh * g.kw
        col = scratch(0, g.cin * g.kh * g.kw * g.oh * g.ow).reshape(g.cin * g.kh * g.kw, g.oh * g.ow)
        mg, npix = g.cout // g.group, g.oh * g.ow
        x4 = x.reshape(g.n, g.cin, g.h, g.w)
        y4 = o.y.reshape(g.n, g.group, mg, npix)
        r4 = _res_per_image(res, o.y.shape, (g.n, g.group, mg, npix))
        for i in range(g.n):
            native.im2col(x4[i], g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.pt, g.pl, g.oh, g.ow, col)
            _gemm_into(w, mg, col.reshape(g.group, k, npix), y4[i], bias, r4[i] if r4 is not None else None,
                       act if r4 is not None or res is None else None)
        if res is not None and r4 is None:
            _finish(o.y.reshape(g.n, g.cout, -1), None, res, act)
        o.close()


#: Largest C*kh*kw for which ``im2col_tiled`` is preferred over ``im2col``: measured on Zen 4 (one thread),
#: banding won on the 3-channel stems (K = 27: 0.28 vs 0.31 ms; K = 147: 2.57 vs 3.41 ms), where the column
#: matrix is large against the GEMM's work, and tied or lost from K = 576 on (resnet's 3x3/2 convs: the GEMM
#: already dominates and shorter GEMMs per task cost more).
TILED_MAX_K = 256


class _BandedNativeConv(_ConvKernelBase):
    """Group-1 convs run by one native call per image with a workspace of per-thread slots (``im2col_tiled``,
    ``direct_gemm``): the GEMM's packed weights (``im2col``'s), and bind / run around the call. The C functions
    share their arguments up to the workspace; ``_tail`` gives the ones after it."""

    ops = ("Conv",)
    weights_form = GEMM_A_WEIGHTS
    #: the native function and its name in errors
    _cname: ClassVar[str] = ""

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return ConvIm2col().transform(layer, raw)

    def _w_nbytes(self, layer: Layer) -> int:
        return ConvIm2col()._w_nbytes(layer)

    def _tail(self, g: Geom2D) -> tuple[int, ...]:
        """The call's arguments after the workspace (for the pool's current thread count)."""
        raise NotImplementedError

    def _ws_floats(self, g: Geom2D, tail: tuple[int, ...]) -> int:
        raise NotImplementedError

    def workspace_nbytes(self, layer: Layer) -> int:
        return sum(self.scratch_floats(layer).values()) * 4

    def scratch_floats(self, layer: Layer) -> dict[int, int]:
        g = _geo2d(layer)
        assert g is not None
        return {0: self._ws_floats(g, self._tail(g))}

    def _call(self, g: Geom2D, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, res: np.ndarray | None,
              y: np.ndarray, code: int, p0: float, p1: float, ws: np.ndarray, tail: tuple[int, ...]
              ) -> Callable[[], None]:
        ffi = native.ffi
        args = (native._ptr(x), g.cin, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.pt, g.pl, g.oh, g.ow,
                native._ptr(w), g.cout, ffi.NULL if bias is None else native._ptr(bias),
                ffi.NULL if res is None else native._ptr(res), native._ptr(y), code, p0, p1, native._ptr(ws), *tail)
        fn = getattr(native.lib, self._cname)
        what = self._cname

        def call(_keep: Any = (x, w, bias, res, y, ws)) -> None:
            if fn(*args) != 0:  # applies() rules out the geometries they refuse: only a failed allocation is left
                raise MemoryError(f"{what}: out of memory")
        return call

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        g = _geo2d(layer)
        if g is None or g.n != 1 or g.group != 1:
            return None
        f = _fast_io(layer, inputs, params, outputs[0])
        if f is None:
            return None
        x, bias, res, code, p0, p1 = f
        tail = self._tail(g)
        # the layer's own workspace (a slot per pool thread): the bound call may run on any thread
        ws = np.empty(max(1, self._ws_floats(g, tail)), F32)
        return self._call(g, x, params["w"], bias, res, outputs[0], code, p0, p1, ws, tail)

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        g = _geo2d(layer)
        assert g is not None
        x, bias, res, act = self._common(layer, inputs, params)
        code, p0, p1 = native.native_act(act) or (-1, 0.0, 0.0)
        o = ContiguousOut(outputs[0])
        full_res = res is not None and tuple(res.shape) == tuple(o.y.shape) and res.dtype == F32
        r4 = np.ascontiguousarray(res).reshape(g.n, g.cout, g.oh, g.ow) if full_res else None
        inner = code >= 0 and (res is None or full_res)
        tail = self._tail(g)
        ws = scratch(0, max(1, self._ws_floats(g, tail)))
        x4 = x.reshape(g.n, g.cin, g.h, g.w)
        y4 = o.y.reshape(g.n, g.cout, g.oh, g.ow)
        for i in range(g.n):
            self._call(g, x4[i], params["w"], bias, r4[i] if r4 is not None else None, y4[i],
                       code if inner else 0, p0, p1, ws, tail)()
        if not inner:
            _finish(o.y.reshape(g.n, g.cout, -1), None, None if full_res else res, act)
        o.close()


@register_kernel
class ConvIm2colTiled(_BandedNativeConv):
    """Group-1 conv as im2col + GEMM band by band of output rows (native/convtile.c): each pool task builds the
    columns of the few output rows that fill ~256 KB and multiplies them on one thread, so the column matrix
    never travels through memory. Same packed weights as ``im2col``. Workspace: one band per pool thread."""

    name = "im2col_tiled"
    priority = 38
    _cname = "inferd_conv_tiled"

    def applies(self, layer: Layer) -> bool:
        g = self._base_applies(layer)
        return g is not None and g.group == 1 and native.AVAILABLE

    def preferred(self, layer: Layer) -> bool:
        g = _geo2d(layer)
        if g is None or not self.applies(layer):
            return False
        if _is_3x3_s1(g):  # the measured 3x3 rule decides between it and the direct/Winograd kernels
            return preferred_3x3_kernel(g) == "im2col" and g.cin * 9 <= TILED_MAX_K
        return g.cin * g.kh * g.kw <= TILED_MAX_K and not g.unpadded_1x1

    def _tail(self, g: Geom2D) -> tuple[int, ...]:
        """(output rows per band, column slices: one per pool thread)."""
        return int(native.lib.inferd_conv_tiled_band(g.cin, g.kh, g.kw, g.oh, g.ow)), native.num_threads()

    def _ws_floats(self, g: Geom2D, tail: tuple[int, ...]) -> int:
        band, slots = tail
        return int(native.lib.inferd_conv_tiled_workspace(g.cin, g.kh, g.kw, g.ow, band, slots))


@register_kernel
class ConvDirectGemm(_BandedNativeConv):
    """Group-1 conv as the GEMM's micro-kernel reading the input in place (native/convdirect.c): each task copies
    the input of a band of output rows into planes whose rows share their padding (stride 1) or into s x s phase
    planes (stride s), so every row of the implicit column matrix is a contiguous run of them, read through a
    table of row offsets; no column matrix, gathered panels or Winograd transforms. Same packed weights as
    ``im2col``. Workspace: the row offsets and a band buffer per pool thread."""

    name = "direct_gemm"
    priority = 39
    _cname = "inferd_conv_direct"

    def applies(self, layer: Layer) -> bool:
        g = self._base_applies(layer)
        return (g is not None and g.group == 1 and native.AVAILABLE
                and bool(native.lib.inferd_conv_direct_applies(g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.pt, g.pl,
                                                               g.pb, g.pr)))

    def preferred(self, layer: Layer) -> bool:
        g = _geo2d(layer)
        return g is not None and _is_3x3_s1(g) and self.applies(layer) and preferred_3x3_kernel(g) == self.name

    def _tail(self, g: Geom2D) -> tuple[int, ...]:
        """(band buffers: one per pool thread,)."""
        return (native.num_threads(),)

    def _ws_floats(self, g: Geom2D, tail: tuple[int, ...]) -> int:
        return int(native.lib.inferd_conv_direct_workspace(g.cin, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.pt,
                                                           g.pl, g.oh, g.ow, tail[0]))

def in_slice_bounds(cin: int, slices: int) -> list[tuple[int, int]]:
    """The input-channel ranges of a conv sliced ``slices`` ways (as even as possible, none empty)."""
    s = max(1, min(int(slices), cin))
    step = -(-cin // s)
    return [(a, min(cin, a + step)) for a in range(0, cin, step)]


@register_kernel
class ConvIm2colInSliced(_ConvKernelBase):
    """im2col sliced by input channel (FlexNN's input slicing, for convs whose column buffer sets the peak):
    the node's ``_in_slices`` attribute S cuts the input channels into S ranges; per image, each range's
    columns go through the GEMM with that range of the weights and are summed (the first with the bias and
    any residual, each later one adding the sum so far as the GEMM's residual, the last with the activation).
    The GEMM cannot add its own output in place, so the sums alternate between the output and a second
    buffer of its size, arranged so the last lands in the output. Workspace: the columns of one range (about
    1/S of im2col's) plus one image's output. Never chosen unless the memory planner set ``_in_slices``
    (group 1 only)."""

    name = "im2col_cs"
    ops = ("Conv",)
    priority = 95

    @staticmethod
    def _slices(layer: Layer) -> int:
        return int(layer.node.attrs.get("_in_slices", 1))

    def applies(self, layer: Layer) -> bool:
        g = self._base_applies(layer)
        return g is not None and g.group == 1 and self._slices(layer) > 1 and g.cin >= self._slices(layer)

    def _ranges(self, layer: Layer) -> list[tuple[int, int]]:
        g = _geo2d(layer)
        assert g is not None
        return in_slice_bounds(g.cin, self._slices(layer))

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = layer_geom(layer)
        taps = layer.inputs[1].size // (g.cout * g.cin)  # type: ignore[union-attr]
        w2 = np.asarray(raw[raw_key(1)], dtype=F32).reshape(g.cout, g.cin * taps)
        out = {**_passthrough(layer, raw), **_bias_param(layer, raw)}
        for j, (a, b) in enumerate(self._ranges(layer)):
            out[f"w{j}"] = pack_gemm_weights(w2[None, :, a * taps:b * taps], A_FORM)
        return out

    def _w_nbytes(self, layer: Layer) -> int:
        g = layer_geom(layer)
        taps = layer.inputs[1].size // (g.cout * g.cin)  # type: ignore[union-attr]
        return sum(packed_nbytes(1, g.cout, (b - a) * taps, A_FORM) for a, b in self._ranges(layer))

    def workspace_nbytes(self, layer: Layer) -> int:
        return sum(self.scratch_floats(layer).values()) * 4

    def scratch_floats(self, layer: Layer) -> dict[int, int]:
        g = _geo2d(layer)
        assert g is not None
        widest = max(b - a for a, b in self._ranges(layer))
        return {0: widest * g.kh * g.kw * g.oh * g.ow, 1: g.cout * g.oh * g.ow}

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        g = _geo2d(layer)
        assert g is not None
        x, bias, res, act = self._common(layer, inputs, params)
        o = ContiguousOut(outputs[0])
        ranges = self._ranges(layer)
        npix = g.oh * g.ow
        taps = g.kh * g.kw
        buf = scratch(0, max(b - a for a, b in ranges) * taps * npix)
        other = scratch(1, g.cout * npix).reshape(1, g.cout, npix)
        x4 = x.reshape(g.n, g.cin, g.h, g.w)
        y4 = o.y.reshape(g.n, 1, g.cout, npix)
        r4 = _res_per_image(res, o.y.shape, (g.n, 1, g.cout, npix))
        last_act = act if r4 is not None or res is None else None
        s_n = len(ranges)
        for i in range(g.n):
            prev = None
            for j, (a, b) in enumerate(ranges):
                k = (b - a) * taps
                col = buf[:k * npix].reshape(k, npix)
                native.im2col(x4[i, a:b], g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.pt, g.pl, g.oh, g.ow, col)
                first, last = j == 0, j == s_n - 1
                dst = y4[i] if (s_n - 1 - j) % 2 == 0 else other
                add = (r4[i] if r4 is not None else None) if first else prev
                _gemm_into(params[f"w{j}"], g.cout, col.reshape(1, k, npix), dst, bias if first else None, add,
                           last_act if last else None)
                prev = dst
        if res is not None and r4 is None:
            _finish(o.y.reshape(g.n, g.cout, -1), None, res, act)
        o.close()


@register_kernel
class Conv1x1(_ConvKernelBase):
    """1x1 kernel, zero pads: W (G, Cout/G, Cin/G) @ x (G, Cin/G, H*W) per image on the native GEMM (weights
    packed at load, bias / residual / activation in its store), no im2col. A stride s > 1 first copies the
    strided pixels into a workspace."""

    name = "conv1x1"
    ops = ("Conv",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        g = self._base_applies(layer)
        return g is not None and g.unpadded_1x1

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = layer_geom(layer)
        w3 = np.asarray(raw[raw_key(1)], dtype=F32).reshape(g.group, g.cout // g.group, g.cin // g.group)
        return {**_passthrough(layer, raw), "w": pack_gemm_weights(w3, A_FORM), **_bias_param(layer, raw)}

    def _w_nbytes(self, layer: Layer) -> int:
        g = layer_geom(layer)
        return packed_nbytes(g.group, g.cout // g.group, g.cin // g.group, A_FORM)

    def workspace_nbytes(self, layer: Layer) -> int:
        return sum(self.scratch_floats(layer).values()) * 4

    def scratch_floats(self, layer: Layer) -> dict[int, int]:
        g = _geo2d(layer)
        assert g is not None
        return {} if g.sh == g.sw == 1 else {0: g.cin * g.oh * g.ow}

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        g = _geo2d(layer)
        if g is not None and g.n == 1 and not (g.sh == g.sw == 1):
            # the strided pixels copied out as im2col does, then the GEMM: one bound call (run() paid ~20 us of
            # Python around RegNetY-400MF's 208->440 s2 on 4x4, 35 us in all against im2col's bound 15)
            return _im2col_gemm_bound(layer, inputs, params, outputs)
        if g is None or g.n != 1:
            return None
        f = _fast_io(layer, inputs, params, outputs[0])
        if f is None:
            return None
        x, bias, res, code, p0, p1 = f
        cg, mg, npix = g.cin // g.group, g.cout // g.group, g.oh * g.ow
        return native.gemm_bound(params["w"], mg, x.reshape(g.group, cg, npix), outputs[0].reshape(g.group, mg, npix),
                                 bias, None if res is None else res.reshape(g.group, mg, npix), code, p0, p1)

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        g = _geo2d(layer)
        assert g is not None
        x, bias, res, act = self._common(layer, inputs, params)
        o = ContiguousOut(outputs[0])
        w = params["w"]
        cg, mg, npix = g.cin // g.group, g.cout // g.group, g.oh * g.ow
        x4 = x.reshape(g.n, g.cin, g.h, g.w)
        y4 = o.y.reshape(g.n, g.group, mg, npix)
        r4 = _res_per_image(res, o.y.shape, (g.n, g.group, mg, npix))
        strided = not (g.sh == g.sw == 1)
        buf = scratch(0, g.cin * npix).reshape(g.cin, g.oh, g.ow) if strided else None
        for i in range(g.n):
            if buf is not None:
                native.im2col(x4[i], 1, 1, g.sh, g.sw, 1, 1, 0, 0, g.oh, g.ow, buf.reshape(g.cin, -1))
                xs = buf
            else:
                xs = x4[i]
            _gemm_into(w, mg, xs.reshape(g.group, cg, npix), y4[i], bias, r4[i] if r4 is not None else None,
                       act if r4 is not None or res is None else None)
        if res is not None and r4 is None:
            _finish(o.y.reshape(g.n, g.cout, -1), None, res, act)
        o.close()


@register_kernel
class ConvDepthwise(_ConvKernelBase):
    """group == Cin > 1 and Cout = mult * Cin: native C, channels split over the native pool. Maps up to 1024
    output pixels take a 16-channel blocked form (channels in vector lanes), larger ones per-channel loops
    over a zero-padded plane. Bias and the activation are applied in the same pass."""

    name = "depthwise"
    ops = ("Conv",)
    priority = 5

    def applies(self, layer: Layer) -> bool:
        g = self._base_applies(layer)
        return g is not None and g.group == g.cin > 1 and g.cout % g.cin == 0

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = _geo2d(layer)
        assert g is not None
        w = np.ascontiguousarray(raw[raw_key(1)], dtype=F32).reshape(g.cout, g.kh, g.kw)
        return {**_passthrough(layer, raw), "w": w, **_bias_param(layer, raw)}

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        g = _geo2d(layer)
        if g is None or g.n != 1:
            return None
        f = _fast_io(layer, inputs, params, outputs[0])
        if f is None:
            return None
        x, bias, res, code, p0, p1 = f
        return native.dwconv2d_bound(x.reshape(g.cin, g.h, g.w), params["w"], bias,
                                     outputs[0].reshape(g.cout, g.oh, g.ow), g.sh, g.sw, g.dh, g.dw, g.pt, g.pl,
                                     code, p0, p1, res)

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        g = _geo2d(layer)
        assert g is not None
        call = self.bind(layer, inputs, params, outputs)  # one image in the C contract: the bound call
        if call is not None:
            call()
            return
        x, bias, res, act = self._common(layer, inputs, params)
        o = ContiguousOut(outputs[0])
        x4 = x.reshape(g.n, g.cin, g.h, g.w)
        y4 = o.y.reshape(g.n, g.cout, g.oh, g.ow)
        # the activation goes into the C pass unless a residual must be added before it
        inner = act if res is None and act is not None and act[0] in native.NATIVE_ACTS else None
        for i in range(g.n):
            native.dwconv2d(x4[i], params["w"], bias, y4[i], g.sh, g.sw, g.dh, g.dw, g.pt, g.pl, inner)
        _finish(o.y.reshape(g.n, g.cout, -1), None, None if res is None else res.reshape(g.n, g.cout, -1),
                None if inner is not None else act)
        o.close()


#: Narrowest output map (columns) for which ``depthwise_direct`` is preferred, by stride, where it goes through
#: padded row copies: measured on Zen 4, 3x3. Where it reads rows in place (stride 1, "same" columns, W >= 9:
#: ``inferd_dwconv2d_direct_inplace``) it is preferred at any width: 2 threads, 0.10 vs 0.20 ms on 32x112x112,
#: 0.12 vs 0.23 on 144x56x56, 0.026 vs 0.043 on 384x14x14, 0.010 vs 0.014 on 384x10x10, against ``depthwise``'s
#: per-plane and channel-blocked forms. Stride 2 (deinterleaved row copies): 0.19 vs 0.31 ms on 96x112x112 ->
#: 56x56, 1.2x slower on 144x56x56 -> 28x28 and 3x on 576x14x14 -> 7x7 (the blocked form's ground). 5x5 stays
#: with ``depthwise`` (1.3-1.6x slower here: its 25 weight vectors crowd the registers).
DW_DIRECT_MIN_OW = {1: 96, 2: 48}


@register_kernel
class ConvDepthwiseDirect(_ConvKernelBase):
    """Depthwise 3x3/5x5, stride 1 or 2, dilation 1, multiplier 1, straight from NCHW (native/dwconv.c): each
    input row read in place (stride 1, "same" columns) or copied once into a ring of zero-padded rows, every
    output row one branch-free vector loop with the bias and activation fused. Preferred for 3x3 in place and on
    wide maps (``DW_DIRECT_MIN_OW``); ``depthwise`` elsewhere."""

    name = "depthwise_direct"
    ops = ("Conv",)
    priority = 4

    def applies(self, layer: Layer) -> bool:
        g = self._base_applies(layer)
        return (g is not None and native.AVAILABLE and g.group == g.cin > 1 and g.cout == g.cin
                and bool(native.lib.inferd_dwconv2d_direct_applies(1, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw)))

    def preferred(self, layer: Layer) -> bool:
        g = _geo2d(layer)
        return (g is not None and self.applies(layer) and g.kh == 3
                and (g.ow >= DW_DIRECT_MIN_OW[g.sh]
                     or bool(native.lib.inferd_dwconv2d_direct_inplace(g.kh, g.sh, g.pl, g.w, g.ow))))

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return ConvDepthwise().transform(layer, raw)

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        g = _geo2d(layer)
        if g is None or g.n != 1:
            return None
        f = _fast_io(layer, inputs, params, outputs[0])
        if f is None or f[2] is not None:  # a residual: the general path adds it before the activation
            return None
        x, bias, _res, code, p0, p1 = f
        y, w = outputs[0], params["w"]
        if w.dtype != F32 or not w.flags.c_contiguous:
            return None
        ffi = native.ffi
        args = (native._ptr(x), native._ptr(w), ffi.NULL if bias is None else native._ptr(bias), native._ptr(y),
                g.cin, g.h, g.w, g.kh, g.sh, g.pt, g.pl, g.oh, g.ow, code, p0, p1)
        fn = native.lib.inferd_dwconv2d_direct

        def call(_keep: Any = (x, w, bias, y)) -> None:
            if fn(*args) != 0:
                raise MemoryError("dwconv2d_direct: out of memory")
        return native.with_steps(call, [("inferd_dwconv2d_direct", args)])

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        call = self.bind(layer, inputs, params, outputs)
        if call is not None:
            call()
            return
        g = _geo2d(layer)
        assert g is not None
        x, bias, res, act = self._common(layer, inputs, params)
        o = ContiguousOut(outputs[0])
        code, p0, p1 = native.native_act(act) or (-1, 0.0, 0.0)
        inner = res is None and code > 0
        x4 = x.reshape(g.n, g.cin, g.h, g.w)
        y4 = o.y.reshape(g.n, g.cout, g.oh, g.ow)
        ffi = native.ffi
        w = np.ascontiguousarray(params["w"], dtype=F32)
        for i in range(g.n):
            xi, yi = np.ascontiguousarray(x4[i]), y4[i]
            if native.lib.inferd_dwconv2d_direct(native._ptr(xi), native._ptr(w),
                                                 ffi.NULL if bias is None else native._ptr(bias), native._ptr(yi),
                                                 g.cin, g.h, g.w, g.kh, g.sh, g.pt, g.pl, g.oh, g.ow,
                                                 code if inner else 0, p0, p1) != 0:
                raise MemoryError("dwconv2d_direct: out of memory")
        _finish(o.y.reshape(g.n, g.cout, -1), None, None if res is None else res.reshape(g.n, g.cout, -1),
                None if inner else act)
        o.close()


# --------------------------------------------------------------------------- Winograd


def winograd_matrices(m: int, r: int, points: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Toom-Cook matrices (AT (m, a), G (a, r), BT (a, a)), a = m + r - 1, for ``a - 1`` finite points plus infinity.

    1-D: y = AT @ ((G @ g) * (BT @ d)) is the correlation y[i] = sum_k d[i + k] g[k]. AT and G are the
    usual Vandermonde/Lagrange forms; BT is the unique solution of sum_j AT[i,j] G[j,k] BT[j,l] = [l == i+k]."""
    a = m + r - 1
    if len(points) != a - 1:
        raise ValueError(f"F({m},{r}) needs {a - 1} finite points, got {len(points)}")
    p = np.asarray(points, np.float64)
    at = np.zeros((m, a))
    at[:, : a - 1] = p[None, :] ** np.arange(m)[:, None]
    at[m - 1, a - 1] = 1.0
    f = np.array([np.prod([pj - pl for pl in p if pl != pj]) for pj in p])
    gm = np.zeros((a, r))
    gm[: a - 1] = p[:, None] ** np.arange(r)[None, :] / f[:, None]
    gm[a - 1, r - 1] = 1.0
    kmat = (at[:, None, :] * gm.T[None, :, :]).reshape(m * r, a)  # rows (i, k), columns j
    rhs = np.zeros((m * r, a))
    for i in range(m):
        for k in range(r):
            rhs[i * r + k, i + k] = 1.0
    bt, *_ = np.linalg.lstsq(kmat, rhs, rcond=None)
    if not np.allclose(kmat @ bt, rhs, atol=1e-9):
        raise ValueError(f"no Winograd F({m},{r}) transform for points {list(points)}")
    bt[np.abs(bt) < 1e-12] = 0.0
    return at, gm, bt


class WinogradKernel(_ConvKernelBase):
    """F(m x m, 3 x 3) for 3x3 stride 1 dilation 1 group 1 (any pads).

    transform: U = G g G^T as (alpha^2, Cout, Cin), packed per position for the native GEMM. run: native input
    transform into V (alpha^2, Cin, P tiles), one batched GEMM U @ V -> M over the alpha^2 positions, native output transform (+ bias) into the output.
    The tiles of a big image are processed a band of tile rows at a time so the workspace stays bounded."""

    ops = ("Conv",)
    m: int = 2
    points: tuple[float, ...] = (0.0, 1.0, -1.0)
    #: V + M workspace above which the tile rows are processed in bands (bytes)
    band_bytes = 8 << 20

    def __init__(self) -> None:
        at, gm, bt = winograd_matrices(self.m, 3, self.points)
        self.alpha = self.m + 2
        self.at64, self.g64, self.bt64 = at, gm, bt
        self.at = np.ascontiguousarray(at, dtype=F32)
        self.bt = np.ascontiguousarray(bt, dtype=F32)

    def applies(self, layer: Layer) -> bool:
        g = self._base_applies(layer)
        return g is not None and _is_3x3_s1(g)

    def _tiles(self, g: Geom2D) -> tuple[int, int, int]:
        """(tile rows, tile columns, tile rows per band)."""
        th, tw = -(-g.oh // self.m), -(-g.ow // self.m)
        per_row = self.alpha ** 2 * (g.cin + g.cout) * tw * 4
        return th, tw, max(1, min(th, self.band_bytes // max(per_row, 1)))

    def _w_nbytes(self, layer: Layer) -> int:
        g = _geo2d(layer)
        assert g is not None
        th, tw, band = self._tiles(g)
        return packed_nbytes(self.alpha ** 2, g.cout, g.cin, band * tw)

    def workspace_nbytes(self, layer: Layer) -> int:
        g = _geo2d(layer)
        assert g is not None
        _, tw, band = self._tiles(g)
        return self.alpha ** 2 * (g.cin + g.cout) * band * tw * 4

    def scratch_floats(self, layer: Layer) -> dict[int, int]:
        g = _geo2d(layer)
        assert g is not None
        th, tw, band = self._tiles(g)
        out = {0: self.alpha ** 2 * g.cin * band * tw, 1: self.alpha ** 2 * g.cout * band * tw}
        if band < th:
            out[2] = g.cout * min(g.oh, band * self.m) * g.ow
        return out

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = _geo2d(layer)
        assert g is not None
        w = np.asarray(raw[raw_key(1)], dtype=F32).reshape(g.cout, g.cin, 3, 3)
        # U[a, b] = G w G^T per (o, c), as two plain GEMMs over all filters at once (einsum's path with its
        # transposing copies took ~0.5 s of resnet18's load). float32: each U element sums at most 9 products,
        # so it is within a few float32 ulps of the float64 result (the tests bound the end-to-end error), and the
        # temporaries are half the size (a cold process pays a page fault per 4 KB of them)
        gm = self.g64.astype(F32)
        t1 = np.tensordot(w, gm, axes=([3], [1]))           # (o, c, i, b)
        t2 = np.tensordot(gm, t1, axes=([1], [2]))          # (a, o, c, b)
        u = np.empty((self.alpha, self.alpha, g.cout, g.cin), F32)
        u[...] = t2.transpose(0, 3, 1, 2)
        u = u.reshape(self.alpha ** 2, g.cout, g.cin)
        _, tw, band = self._tiles(g)
        return {**_passthrough(layer, raw), "w": pack_gemm_weights(u, band * tw), **_bias_param(layer, raw)}

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        """One image in one band: the input transform, the batched GEMM and the output transform (bias, residual
        and activation fused) as three C calls resolved now. run() spent 0.1-0.13 ms a layer outside the native
        jobs on argument plumbing (resnet18's twelve Winograd layers: ~1.4 ms of its 16.5). The transform
        buffers are this thread's scratch, looked up per call (they may grow or be another thread's), the
        pointers and the GEMM re-resolved when they moved."""
        b = _bound_io(layer, inputs, params, outputs[0])
        if b is None:
            return None
        g, (x, bias, res, code, p0, p1) = b
        th, tw, band = self._tiles(g)
        if band < th:
            return None
        a2, m, alpha, p = self.alpha ** 2, self.m, self.alpha, th * tw
        w, y, bt, at = params["w"], outputs[0], self.bt, self.at
        if native.gemm_bound(w, g.cout, np.empty((a2, g.cin, p), F32), np.empty((a2, g.cout, p), F32),
                             None, None, 0, 0.0, 0.0) is None:
            return None
        lib, ffi = native.lib, native.ffi
        xp, btp, atp, yp = native._ptr(x), native._ptr(bt), native._ptr(at), native._ptr(y)
        biasp = ffi.NULL if bias is None else native._ptr(bias)
        resp = ffi.NULL if res is None else native._ptr(res)
        nv, nm = a2 * g.cin * p, a2 * g.cout * p
        win, wout = lib.inferd_winograd_input, lib.inferd_winograd_output_ex
        state: list[Any] = [None, None, None, None, None]  # V's and M's scratch bases, their pointers, the GEMM

        def call(_keep: Any = (x, w, bias, res, y, bt, at)) -> None:
            v, mm = scratch(0, nv), scratch(1, nm)
            if v.base is not state[0] or mm.base is not state[1] or state[4] is None:
                state[4] = native.gemm_bound(w, g.cout, v.reshape(a2, g.cin, p), mm.reshape(a2, g.cout, p),
                                             None, None, 0, 0.0, 0.0)
                state[0], state[1], state[2], state[3] = v.base, mm.base, native._ptr(v), native._ptr(mm)
            if win(xp, g.cin, g.h, g.w, g.pt, g.pl, th, tw, m, alpha, btp, state[2], g.cin * p, p, 0) != 0:
                raise MemoryError("winograd_input: out of memory")
            state[4]()
            if wout(state[3], g.cout, g.oh, g.ow, th, tw, m, alpha, atp, biasp, yp, g.cout * p, p, 0, resp,
                    code, p0, p1) != 0:
                raise MemoryError("winograd_output: out of memory")
        return call

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        g = _geo2d(layer)
        assert g is not None
        x, bias, res, act = self._common(layer, inputs, params)
        o = ContiguousOut(outputs[0])
        a2, m = self.alpha ** 2, self.m
        th, tw, band = self._tiles(g)
        x4 = x.reshape(g.n, g.cin, g.h, g.w)
        y4 = o.y.reshape(g.n, g.cout, g.oh, g.ow)
        vbuf = scratch(0, a2 * g.cin * band * tw)
        mbuf = scratch(1, a2 * g.cout * band * tw)
        # residual and activation in the output transform (per channel, while the plane is in cache) when the
        # image is one band, the activation native and the residual of the output's shape; else one pass after
        fuse = (band >= th and (act is None or act[0] in native.NATIVE_ACTS)
                and (res is None or (res.shape == o.y.shape and res.dtype == F32)))
        r4 = np.ascontiguousarray(res).reshape(g.n, g.cout, g.oh, g.ow) if fuse and res is not None else None
        for i in range(g.n):
            for t0 in range(0, th, band):
                nb = min(band, th - t0)
                p = nb * tw
                v = vbuf[: a2 * g.cin * p].reshape(a2, g.cin, p)
                mm = mbuf[: a2 * g.cout * p].reshape(a2, g.cout, p)
                native.winograd_input(x4[i], g.pt - t0 * m, g.pl, nb, tw, m, self.bt, v, 0)
                native.gemm(params["w"], g.cout, v, mm)
                r0, r1 = t0 * m, min(g.oh, (t0 + nb) * m)
                if r0 == 0 and r1 == g.oh:
                    native.winograd_output(mm, nb, tw, m, self.at, bias, y4[i], 0,
                                           r4[i] if r4 is not None else None, act if fuse else None)
                else:
                    band_out = scratch(2, g.cout * (r1 - r0) * g.ow).reshape(g.cout, r1 - r0, g.ow)
                    native.winograd_output(mm, nb, tw, m, self.at, bias, band_out, 0)
                    y4[i, :, r0:r1] = band_out
        if not fuse:
            _finish(o.y.reshape(g.n, g.cout, -1), None, None if res is None else res.reshape(g.n, g.cout, -1), act)
        o.close()


def _is_3x3_s1(g: Geom2D) -> bool:
    """A layer :func:`preferred_3x3_kernel` rules on: 3x3, stride and dilation 1, group 1."""
    return g.kh == 3 and g.kw == 3 and g.sh == g.sw == 1 and g.dh == g.dw == 1 and g.group == 1


def preferred_3x3_kernel(g: Geom2D) -> str:
    """The measured-fastest kernel for a 3x3 stride-1 group-1 conv: "winograd43", "winograd23", "direct_gemm" or
    "im2col".

    F(4,3) does 2.25 multiplies per output and input channel against F(2,3)'s 4, but its transforms cost more
    per pixel and its 36 weight matrices are bigger, so it needs enough channels (cin*cout) and enough tiles per
    image (p43). Measured with OpenBLAS, one thread, AMD EPYC (Zen 4), ms (im2col / F(2,3) / F(4,3)); re-checked
    on the native GEMM (two threads), where the same rule still picks the best or one within ~10%:
      64@56 2.7/1.64/1.32, 48@56 1.64/1.02/0.88, 32@56 0.81/0.50/0.53, 128@28 2.48/1.48/1.24,
      64@28 0.70/0.45/0.51, 256@14 2.65/1.55/2.16, 192->256@14 1.87/1.23/1.21, 512@7 3.13/3.14/6.64,
      256@7 0.76/0.63/0.94, 16->32@28 0.123/0.122/0.152, 8->16@56 0.148/0.150/0.177, 3->16@112 0.23/0.30/0.30.
    With up to 16 input channels the transforms cost more than the GEMM saves: im2col (its banded form,
    ``im2col_tiled``, there: C*9 <= TILED_MAX_K; since replaced by the direct kernel from 8 channels on, below).
    Re-measured on the native GEMM, two threads, min of 9 rounds, ms
    (F(2,3) / F(4,3) / im2col_tiled): 16->64@55 (squeezenet's expand3x3) 0.40/0.36/0.31, 16->16@56 0.17/0.18/0.10,
    16->64@28 0.14/0.19/0.10, 16->128@28 0.21/0.29/0.17, 16->64@112 2.0/1.6/1.2; from 24 channels on it is a tie
    or Winograd: 24->96@28 0.20/0.24/0.20, 24->64@56 0.47/0.40/0.49, 32->128@27 0.30/0.33/0.33.
    On U-Net-sized maps (96x96 and up) F(4,3) wins with few channels too (2026-11-29, single-conv models, two
    threads, p20 of 30, F(2,3) / F(4,3) / im2col_tiled): 32->16@128 1.30/0.92/1.18 and 1.18/0.96/1.17 (unet_small's
    dec1), 24->24@128 1.22/0.87/1.10, 48->24@112 1.66/1.24/1.84, 32->32@96 1.00/0.77/1.07, 32->16@96 0.59/0.56/0.67.
    With 8-48 input channels the direct kernel (``direct_gemm``: no transforms, no column matrix) beats the
    others except where F(4,3) applies with more than 16 output channels (2026-11-29, in the models, two threads,
    min of 6 rounds, layer time of direct_gemm / the old choice): googlenet's third-branch 3x3s 24->64@14 0.48,
    32->64@14 0.51, 32->128@14 0.70, 32->128@7 0.37, 48->128@7 0.44, 16->48@14 0.69, 16->32@28 0.85; squeezenet's
    48->192@13 0.85, 32->128@27 0.95-1.0; unet_small's 16->16@128 0.80 and 0.81 (banded im2col), 16->32@64 0.83,
    32->32@64 0.77 and 0.94 (F(2,3)), 32->16@128 0.80 (F(4,3)); single layers: 16->64@55 0.296 ms against the
    banded im2col's 0.300, 32->16@96 0.445 against F(4,3)'s 0.484. F(4,3) keeps 24->24@128 (0.86 vs 0.91 ms),
    32->32@96 (0.66 vs 0.83), 48->24@112 (1.15 vs 1.36). From 64 channels on direct loses (64->64@32 1.18-1.23,
    128->128@16 1.23-1.29, 96->208@14 1.14, resnet's 1.3-1.5), except on maps of 14x14 and less with 64 input
    channels, where F(2,3)'s transforms and its padded tiles (13x13 in 7x7 tiles of 2) cost more than its fewer
    multiplies save (2026-11-29, single layers, two threads, F(2,3) / direct ms: 64->64@13 0.122/0.081,
    64->128@13 0.178/0.144, 64->256@13 0.276/0.270 and 0.457/0.288 in a slow spell, 64->256@7 0.153/0.097;
    128->128@13 a tie, 0.273/0.281; squeezenet1_1 with its two 64->256@13 layers direct: 0.955-0.978x the model's
    time, three alternating A/Bs).
    """
    p43 = -(-g.oh // 4) * -(-g.ow // 4)
    cc = g.cin * g.cout
    if g.cin < 8:
        return "im2col"
    if g.cin <= 16 or (g.cin <= 48 and g.cout <= 16):
        return "direct_gemm"
    if (p43 >= 196 and cc >= 2048) or (p43 >= 49 and cc >= 8192) or (p43 >= 576 and cc >= 512):
        return "winograd43"
    if g.cin <= 48 or (g.cin <= 64 and g.oh * g.ow <= 196):
        return "direct_gemm"
    return "winograd23"


@register_kernel
class ConvWinograd23(WinogradKernel):
    """F(2x2, 3x3): 16 positions, 2.25x fewer multiplies than direct; points 0, 1, -1.

    Static priority puts it before F(4,3): as the default for every 3x3 stride-1 conv it is never far off
    (<= 1.25x the best), whereas F(4,3) is 2x slower than the others on 7x7 maps. ``preferred`` refines it."""

    name = "winograd23"
    priority = 20
    m = 2
    points = (0.0, 1.0, -1.0)

    def preferred(self, layer: Layer) -> bool:
        g = _geo2d(layer)
        return g is not None and self.applies(layer) and preferred_3x3_kernel(g) == self.name


@register_kernel
class ConvWinograd43(WinogradKernel):
    """F(4x4, 3x3): 36 positions, 4x fewer multiplies; points 0, 1, -1, 1/2, -2 (better conditioned in float32
    than the 0, +-1, +-2 of Lavin/ncnn: max relative error 3e-6 vs 1e-5 on 256-channel layers; see tests)."""

    name = "winograd43"
    priority = 25
    m = 4
    points = (0.0, 1.0, -1.0, 0.5, -2.0)

    def preferred(self, layer: Layer) -> bool:
        g = _geo2d(layer)
        return g is not None and self.applies(layer) and preferred_3x3_kernel(g) == self.name


# =========================================================================== ConvTranspose kernels


@register_kernel
class ConvTransposeDirect(Kernel):
    """The reference: each kernel tap scatters a grouped matmul into a strided output window (any rank)."""

    name = "direct"
    ops = ("ConvTranspose",)
    priority = 90

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        _run_reference(layer, inputs, params, outputs,
                       lambda x, w: conv_transpose_nd(x, w, conv_transpose_geom(layer.node, x.shape, w.shape)))


@register_kernel
class ConvTransposeCol2im(_ConvKernelBase):
    """col = W^T (G, Cout/G*kh*kw, Cin/G) @ x (G, Cin/G, H*W) per image on the native GEMM (the weights packed at
    load), then a native scatter-add (col2im) into the output, each plane first set to its bias in the same
    parallel pass. Workspace: the column matrix of one image."""

    name = "col2im"
    ops = ("ConvTranspose",)
    priority = 40

    def applies(self, layer: Layer) -> bool:
        return self._base_applies(layer) is not None

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = _geo2d(layer)
        assert g is not None
        w = np.asarray(raw[raw_key(1)], dtype=F32).reshape(g.group, g.cin // g.group, -1)
        return {**_passthrough(layer, raw), "w": pack_gemm_weights(np.swapaxes(w, 1, 2), A_FORM),
                **_bias_param(layer, raw)}

    def _w_nbytes(self, layer: Layer) -> int:
        g = _geo2d(layer)
        assert g is not None
        return packed_nbytes(g.group, g.cout // g.group * g.kh * g.kw, g.cin // g.group, A_FORM)

    def workspace_nbytes(self, layer: Layer) -> int:
        return sum(self.scratch_floats(layer).values()) * 4

    def scratch_floats(self, layer: Layer) -> dict[int, int]:
        g = _geo2d(layer)
        assert g is not None
        return {0: g.cout * g.kh * g.kw * g.h * g.w}

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        """One image without a fused residual or activation: the GEMM and the bias-initialised col2im as two C
        calls resolved now (the column matrix is this thread's scratch, looked up per call)."""
        b = _bound_io(layer, inputs, params, outputs[0])
        if b is None:
            return None
        g, (x, bias, res, code, _, _) = b
        if res is not None or code != 0:
            return None
        kk, hw = g.kh * g.kw, g.h * g.w
        mg = g.cout // g.group * kk
        w, y = params["w"], outputs[0]
        xs = x.reshape(g.group, g.cin // g.group, hw)
        if native.gemm_bound(w, mg, xs, np.empty((g.group, mg, hw), F32), None, None, 0, 0.0, 0.0) is None:
            return None
        ffi = native.ffi
        fn, yp = native.lib.inferd_col2im_ex, native._ptr(y)
        biasp = ffi.NULL if bias is None else native._ptr(bias)
        state: list[Any] = [None, None, None]  # the column scratch's base, its pointer, the GEMM bound to it

        def call(_keep: Any = (x, w, bias, y)) -> None:
            col = scratch(0, g.cout * kk * hw)
            if col.base is not state[0] or state[2] is None:
                state[2] = native.gemm_bound(w, mg, xs, col.reshape(g.group, mg, hw), None, None, 0, 0.0, 0.0)
                state[0], state[1] = col.base, native._ptr(col)
            state[2]()
            fn(state[1], g.cout, g.oh, g.ow, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.pt, g.pl, g.h, g.w, yp, biasp, 1)
        return call

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        g = _geo2d(layer)
        assert g is not None
        x, bias, res, act = self._common(layer, inputs, params)
        o = ContiguousOut(outputs[0])
        kk = g.kh * g.kw
        mg = g.cout // g.group * kk
        col = scratch(0, g.cout * kk * g.h * g.w).reshape(g.group, mg, g.h * g.w)
        x4 = x.reshape(g.n, g.group, g.cin // g.group, g.h * g.w)
        y4 = o.y.reshape(g.n, g.cout, g.oh, g.ow)
        b = None if bias is None else np.ascontiguousarray(bias, F32).reshape(g.cout)
        for i in range(g.n):
            native.gemm(params["w"], mg, x4[i], col)
            # ConvTranspose's output is the image that a conv with the same geometry would read
            native.col2im_init(col.reshape(g.cout * kk, g.h * g.w), g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.pt,
                               g.pl, g.h, g.w, y4[i], b)
        _finish(o.y.reshape(g.n, g.cout, -1), None, None if res is None else res.reshape(g.n, g.cout, -1), act)
        o.close()


# ------------------------------------------------------------------------- CausalConvWithState (opset 27)

def _check_causal_conv(node: Node, opset: int) -> None:
    act = node.attr("activation", "none")
    if act not in ("none", "silu", "swish"):
        raise UnsupportedOpError("CausalConvWithState", node.name, opset, f"activation {act!r} (none, silu or swish)")


def _infer_causal_conv(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    x, w = ins[0], ins[1]
    assert x is not None and w is not None
    if len(x.shape) != 3 or len(w.shape) != 3 or w.shape[0] != x.shape[1] or w.shape[1] != 1 or w.shape[2] < 1:
        raise ShapeError(f"node {node.name!r} (CausalConvWithState): input {list(x.shape)} must be (B, C, L) and "
                         f"weight {list(w.shape)} (C, 1, k)")
    b, c, _ = x.shape
    k = w.shape[2]
    past = ins[3] if len(ins) > 3 else None
    if past is not None and tuple(past.shape) != (b, c, k - 1):
        raise ShapeError(f"node {node.name!r} (CausalConvWithState): past_state {list(past.shape)} must be "
                         f"{[b, c, k - 1]}")
    dt = np.dtype(x.dtype)
    return [(tuple(x.shape), dt), ((b, c, k - 1), dt)][:len(node.outputs)]


def causal_conv_with_state(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Depthwise causal 1-D convolution over [past_state, input] (zeros without a past): output[t] sees the k
    positions ending at t; present_state is the last k - 1 positions; ``silu``/``swish`` applied after the bias.
    float16 is computed in float32 and rounded once."""
    x, w = np.asarray(ins[0]), np.asarray(ins[1])
    bias = ins[2] if len(ins) > 2 else None
    past = ins[3] if len(ins) > 3 else None
    b, c, length = x.shape
    k = w.shape[2]
    ct = np.float64 if x.dtype == np.float64 else np.float32
    pad = np.zeros((b, c, k - 1), x.dtype) if past is None else np.asarray(past, x.dtype)
    padded = np.concatenate([pad, x], axis=2)
    xf, wf = padded.astype(ct), w.astype(ct)
    y = np.zeros((b, c, length), ct)
    for j in range(k):
        y += wf[None, :, 0, j, None] * xf[:, :, j:j + length]
    if bias is not None:
        y += np.asarray(bias, ct)[None, :, None]
    if node.attr("activation", "none") in ("silu", "swish"):
        y = y * (0.5 + 0.5 * np.tanh(0.5 * y))
    return [y.astype(x.dtype), np.ascontiguousarray(padded[:, :, padded.shape[2] - (k - 1):])]


register_op(OpSpec("CausalConvWithState", _infer_causal_conv,
                   lambda n, i: [np.array(r, copy=True) for r in causal_conv_with_state(n, i)], min_opset=27,
                   check=_check_causal_conv, notes="numpy, one multiply-add per tap (k is small: 2-4 in Mamba/DeltaNet)"))


@register_kernel
class CausalConvWithStateKernel(Kernel):
    name = "numpy"
    ops = ("CausalConvWithState",)
