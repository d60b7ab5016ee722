"""Resize (opsets 10-19) and Upsample (opsets 7/9), nearest and (multi)linear, matching onnxruntime.

Which semantics a node has is read off the node (infer/reference do not get the opset): the
importer's ``attrs["_opset"]`` when present, else the input count.
  * ``Upsample`` and Resize-10 (opset < 11, or exactly two inputs X, scales) use the legacy rules:
    coordinate transformation ``asymmetric`` and onnxruntime's pre-11 nearest rounding (truncate
    when upsampling an axis, ceil when downsampling it);
  * Resize-11+ (X, roi, scales[, sizes]) uses the opset-11+ attributes.

As in onnxruntime, sizes are computed in float32 (``out = trunc(float32(scale) * in)``), the
coordinate transform uses the *given* scale (not out/in) when scales are given, and the per-axis
``x_original`` arithmetic is float32, so nearest-neighbour ties round the same way. Linear
interpolation is separable: any set of axes (bilinear on NCHW/NHWC, 1-D, trilinear...). An axis
with scale 1 is copied as it is in every mode (as onnxruntime does, even where the coordinate
transform would shift it, e.g. tf_half_pixel_for_nn with nearest_mode=ceil).

Known difference: with ``half_pixel_symmetric`` + nearest, a coordinate that is an exact .5 tie in
exact arithmetic but not in float32 (e.g. 7 -> 4 with scale 0.6) can round to the other
neighbour than onnxruntime picks (which seems to get the exact tie); no other mode showed this.

Integer tensors interpolate in float32 and truncate, as onnxruntime does for uint8.

Unsupported (``check`` raises UnsupportedOpError at import): cubic, antialias=1,
tf_crop_and_resize (the only mode that reads roi), keep_aspect_ratio_policy other than stretch
when sizes are given.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .. import native
from ..errors import ShapeError, UnsupportedOpError
from ..ir import Node, TensorInfo
from .activation import apply_act
from .base import Kernel, Layer, OpSpec, full_inputs, register_kernel, register_op

__all__ = ["ResizePlan", "resize_plan", "resize_reference", "axis_table"]

_F32 = np.float32
_CTMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
         "tf_half_pixel_for_nn")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _legacy(node: Node) -> bool:
    """Upsample, or Resize-10: asymmetric coordinates and the pre-11 nearest rounding.

    The importer records the model's opset as ``attrs["_opset"]``; without it, a Resize with
    exactly two inputs (X, scales) is Resize-10 (opset 11+ has X, roi, scales[, sizes]).
    """
    if node.op == "Upsample":
        return True
    opset = node.attr("_opset")
    return int(opset) < 11 if opset is not None else len(node.inputs) == 2


def _mode(node: Node) -> str:
    m = _s(node.attr("mode", "nearest")).lower()
    return "linear" if m == "bilinear" else m  # Upsample-1 spelled it "bilinear"


def _input_positions(node: Node) -> tuple[int | None, int | None]:
    """Positions of the scales and sizes inputs (None where the node has no such input)."""
    def present(i: int) -> int | None:
        return i if i < len(node.inputs) and node.inputs[i] else None
    if _legacy(node):
        return present(1), None
    return present(2), present(3)


def _check(node: Node, opset: int) -> None:
    def bad(detail: str) -> UnsupportedOpError:
        return UnsupportedOpError(node.op, node.name, opset, detail)
    mode = _mode(node)
    if mode not in ("nearest", "linear", "cubic") or (mode == "cubic" and _legacy(node)):
        raise bad(f"mode={mode!r}")
    if _legacy(node):
        return
    ctm = _s(node.attr("coordinate_transformation_mode", "half_pixel"))
    if ctm not in _CTMS + ("tf_crop_and_resize",):  # cubic, antialias, tf_crop_and_resize: resize_general
        raise bad(f"coordinate_transformation_mode={ctm!r}")
    if mode == "nearest" and _s(node.attr("nearest_mode", "round_prefer_floor")) not in _NEAREST_MODES:
        raise bad(f"nearest_mode={_s(node.attr('nearest_mode'))!r}")
    policy = _s(node.attr("keep_aspect_ratio_policy", "stretch"))
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise bad(f"keep_aspect_ratio_policy={policy!r}")


# --------------------------------------------------------------------------- the plan

@dataclass(frozen=True)
class ResizePlan:
    """Everything the kernels need: output shape and, per axis, the float32 scale onnxruntime uses."""

    mode: str            # "nearest" | "linear"
    ctm: str             # coordinate transformation mode
    nearest_mode: str    # "" = the legacy (pre-11) rounding
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    scales: tuple[float, ...]  # float32 values, stored as Python floats


def _vector(node: Node, what: str, v: np.ndarray | None) -> np.ndarray | None:
    if v is None:
        return None
    v = np.asarray(v).reshape(-1)
    return v if v.size else None  # an empty tensor stands for "not given" (opset 11/12 placeholders)


def resize_plan(node: Node, in_shape: Sequence[int], scales: np.ndarray | None,
                sizes: np.ndarray | None) -> ResizePlan:
    """Output shape and per-axis scales of ``node`` for input shape ``in_shape`` and the constant
    ``scales``/``sizes`` values (None when absent; Upsample-7 reads its ``scales`` attribute)."""
    rank = len(in_shape)
    in_shape = tuple(int(d) for d in in_shape)
    if node.op == "Upsample" and scales is None and node.attr("scales") is not None:
        scales = np.asarray(node.attr("scales"), np.float32)
    scales, sizes = _vector(node, "scales", scales), _vector(node, "sizes", sizes)
    if (scales is None) == (sizes is None):
        raise ShapeError(f"{node.op} {node.name!r}: exactly one of scales and sizes must be given "
                         f"(scales={scales}, sizes={sizes})")
    axes = node.attr("axes") if not _legacy(node) else None
    axes = [int(a) % rank for a in axes] if axes is not None else list(range(rank))
    given = scales if scales is not None else sizes
    if len(given) != len(axes):
        raise ShapeError(f"{node.op} {node.name!r}: {'scales' if sizes is None else 'sizes'} has {len(given)} "
                         f"values for {len(axes)} axes (input shape {in_shape})")
    sc = [_F32(1.0)] * rank
    out = list(in_shape)
    policy = _s(node.attr("keep_aspect_ratio_policy", "stretch")) if not _legacy(node) else "stretch"
    if sizes is not None and policy != "stretch":
        # one scale for every resized axis (the smallest or the largest of sizes / input), sizes rounded half up
        ratios = [float(v) / in_shape[a] for a, v in zip(axes, given)]
        k = min(ratios) if policy == "not_larger" else max(ratios)
        for a in axes:
            out[a] = int(k * in_shape[a] + 0.5)
            sc[a] = _F32(k)
        given = []  # done
    for a, v in zip(axes, given):
        if sizes is not None:
            out[a] = int(v)
            sc[a] = _F32(out[a]) / _F32(in_shape[a]) if in_shape[a] else _F32(1.0)
        else:
            sc[a] = _F32(v)
            if not sc[a] > 0:
                raise ShapeError(f"{node.op} {node.name!r}: scale {float(v)} on axis {a} must be positive")
            out[a] = int(np.floor(sc[a] * _F32(in_shape[a])))  # float32 product, as onnxruntime computes it
        if out[a] < 1 and in_shape[a] > 0:
            raise ShapeError(f"{node.op} {node.name!r}: axis {a} of size {in_shape[a]} resizes to {out[a]}")
    mode = _mode(node)
    if _legacy(node):
        ctm, nm = "asymmetric", ""
    else:
        ctm = _s(node.attr("coordinate_transformation_mode", "half_pixel"))
        nm = _s(node.attr("nearest_mode", "round_prefer_floor"))
    return ResizePlan(mode, ctm, nm, in_shape, tuple(out), tuple(float(s) for s in sc))


def _const(node: Node, i: int | None, consts: dict[str, np.ndarray]) -> np.ndarray | None:
    if i is None:
        return None
    name = node.inputs[i]
    if name not in consts:
        raise ShapeError(f"{node.op} {node.name!r}: input {name!r} ({'scales' if i in (1, 2) else 'sizes'}) is "
                         f"computed at run time; only constant scales/sizes are supported (static shapes)")
    return consts[name]


def _infer(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    x = ins[0]
    if x is None:
        raise ShapeError(f"{node.op} {node.name!r}: input X is required")
    si, zi = _input_positions(node)
    p = resize_plan(node, x.shape, _const(node, si, consts), _const(node, zi, consts))
    return [(p.out_shape, x.dtype)]


# --------------------------------------------------------------------------- per-axis tables

def _original(ctm: str, n_out: int, n_in: int, scale: float) -> np.ndarray:
    """x_original for every output coordinate, in onnxruntime's float32 operation order."""
    x = np.arange(n_out, dtype=_F32)
    s = _F32(scale)
    h = _F32(0.5)
    if ctm == "asymmetric":
        return x / s
    if ctm == "half_pixel":
        return (x + h) / s - h
    if ctm == "pytorch_half_pixel":
        return (x + h) / s - h if n_out > 1 else np.zeros(n_out, _F32)
    if ctm == "tf_half_pixel_for_nn":
        return (x + h) / s
    if ctm == "align_corners":
        return x * _F32(n_in - 1) / _F32(n_out - 1) if n_out > 1 else np.zeros(n_out, _F32)
    if ctm == "half_pixel_symmetric":
        adjustment = _F32(n_out) / (s * _F32(n_in))
        offset = (_F32(n_in) / _F32(2)) * (_F32(1) - adjustment)
        # onnxruntime mixes in double literals here: the tail is evaluated in double
        return (np.float64(offset) + (x.astype(np.float64) + 0.5) / np.float64(s) - 0.5).astype(_F32)
    raise ValueError(f"unknown coordinate_transformation_mode {ctm!r}")


def _nearest(orig: np.ndarray, nearest_mode: str, downsample: bool) -> np.ndarray:
    if nearest_mode == "":
        i = np.ceil(orig) if downsample else np.trunc(orig)
    elif nearest_mode == "floor":
        i = np.floor(orig)
    elif nearest_mode == "ceil":
        i = np.ceil(orig)
    else:
        fl = np.floor(orig)
        frac = orig - fl  # exact in float32 for the magnitudes of pixel coordinates
        # std::round (half away from zero); ties go down for round_prefer_floor. Negative
        # coordinates are clamped to 0 below, so their tie direction does not matter.
        up = frac > 0.5 if nearest_mode == "round_prefer_floor" else frac >= 0.5
        i = fl + up
    return i.astype(np.int64)


@functools.lru_cache(maxsize=512)
def axis_table(mode: str, ctm: str, nearest_mode: str, n_in: int, n_out: int,
               scale: float) -> tuple[np.ndarray, ...]:
    """Per-axis gather tables (read-only, cached): (idx,) for nearest, (lo, hi, w_lo, w_hi) for linear."""
    if np.float32(scale) == 1:  # onnxruntime leaves scale-1 axes alone in every mode
        t: tuple[np.ndarray, ...] = (np.arange(n_out), np.arange(n_out), np.ones(n_out, _F32), np.zeros(n_out, _F32))
    else:
        orig = _original(ctm, n_out, n_in, scale)
        if mode == "nearest":
            t = (np.clip(_nearest(orig, nearest_mode, scale < 1), 0, n_in - 1),)
        else:
            xc = np.clip(orig, _F32(0), _F32(n_in - 1))
            lo = np.minimum(xc.astype(np.int64), n_in - 1)
            hi = np.minimum(lo + 1, n_in - 1)
            w_hi = np.abs(xc - lo.astype(_F32))  # onnxruntime's dx1
            w_lo = np.abs(xc - hi.astype(_F32))  # onnxruntime's dx2
            same = lo == hi
            w_lo[same] = _F32(0.5)
            w_hi[same] = _F32(0.5)
            t = (lo, hi, w_lo, w_hi)
    for a in t:
        a.setflags(write=False)
    return t


def _tables(p: ResizePlan) -> list[tuple[np.ndarray, ...] | None]:
    """Per axis: its table, or None when the axis is left as it is."""
    out: list[tuple[np.ndarray, ...] | None] = []
    for n_in, n_out, s in zip(p.in_shape, p.out_shape, p.scales):
        t = axis_table(p.mode, p.ctm, p.nearest_mode, n_in, n_out, s)
        if n_in == n_out and np.array_equal(t[0], np.arange(n_out)) and (p.mode == "nearest" or not t[3].any()):
            out.append(None)
        else:
            out.append(t)
    return out


def _plan_from_inputs(node: Node, x: np.ndarray, inputs: Sequence[np.ndarray | None]) -> ResizePlan:
    si, zi = _input_positions(node)
    return resize_plan(node, x.shape, inputs[si] if si is not None else None, inputs[zi] if zi is not None else None)


# --------------------------------------------------------------------------- numpy reference

def resize_reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """Direct N-D gather: nearest via one fancy index, linear as the sum over all 2^k corners (float64)."""
    if extended(node):
        return resize_ext(node, inputs)
    x = np.asarray(inputs[0])
    p = _plan_from_inputs(node, x, inputs)
    tabs = [axis_table(p.mode, p.ctm, p.nearest_mode, a, b, s) for a, b, s in zip(p.in_shape, p.out_shape, p.scales)]
    if p.mode == "nearest":
        y = x[np.ix_(*[t[0] for t in tabs])]
    elif np.issubdtype(x.dtype, np.floating):
        xf = x.astype(np.float64)
        acc = np.zeros(p.out_shape, np.float64)
        for corner in itertools.product((0, 1), repeat=x.ndim):
            idx = [t[c] for t, c in zip(tabs, corner)]
            w = functools.reduce(np.multiply.outer, [t[2 + c].astype(np.float64) for t, c in zip(tabs, corner)])
            acc += xf[np.ix_(*idx)] * w
        y = acc
    else:
        # integer tensors as onnxruntime computes them: in float32, each corner's weight the product of its axes'
        # weights from the last axis in, the corners summed with the last axis varying fastest, then truncated.
        # A float64 sum truncated differently wherever the float32 one lands just below an integer (uint8 at
        # scales 1.5 x 0.5: one element in six inputs)
        xf = x.astype(np.float32)
        acc = np.zeros(p.out_shape, np.float32)
        for corner in itertools.product((0, 1), repeat=x.ndim):
            idx = [t[c] for t, c in zip(tabs, corner)]
            ws = [t[2 + c].astype(np.float32) for t, c in zip(tabs, corner)]
            w = functools.reduce(lambda a, b: np.multiply.outer(b, a), ws[::-1])
            acc += w * xf[np.ix_(*idx)]
        y = np.trunc(acc)
    y = np.array(y, dtype=x.dtype, copy=True)
    if node.attr("act") is not None:
        apply_act(y, node.attr("act"))
    return [y]


register_op(OpSpec("Resize", _infer, resize_reference, min_opset=10, check=_check,
                   notes="cubic, antialias and tf_crop_and_resize run on the CPU's resize_general kernel "
                         "(separable weight matrices)"))
register_op(OpSpec("Upsample", _infer, resize_reference, check=_check))


# --------------------------------------------------------------------------- kernels

def _repeat_factor(t: tuple[np.ndarray, ...], n_in: int, n_out: int) -> int:
    """f when the nearest table is exactly i // f (integer upsampling by f), else 0."""
    if n_out % n_in:
        return 0
    f = n_out // n_in
    return f if np.array_equal(t[0], np.arange(n_out) // f) else 0


@register_kernel
class ResizeKernel(Kernel):
    """Per-axis gathers with index/weight tables cached per (mode, sizes, scale) in ``axis_table``
    (the kernel itself stays stateless); integer-factor nearest upsampling (the YOLO/FPN 2x case)
    is f_h * f_w strided assignments of the input into the output, no gather."""

    name = "resize"
    ops = ("Resize", "Upsample")
    priority = 10

    def applies(self, layer: Layer) -> bool:
        return not extended(layer.node)

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        ins = full_inputs(layer, inputs, params)
        x, y = ins[0], outputs[0]
        p = _plan_from_inputs(layer.node, x, ins)
        tabs = _tables(p)
        axes = [a for a, t in enumerate(tabs) if t is not None]
        if not axes:
            np.copyto(y, x)
        elif p.mode == "nearest":
            self._nearest(x, y, p, tabs, axes)
        else:
            call = self._native_linear(x, y, p, tabs, axes)
            if call is not None:
                call()
            else:
                self._linear(x, y, tabs, axes)
        act = layer.attr("act")
        if act is not None:
            apply_act(y, act)

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        # the native upsampling with its plan made once, where the scales or sizes are constants (the run
        # path's per-call plan and tables cost 80 us beside a 15 us copy on a 16x16 -> 32x32 map)
        si, zi = _input_positions(layer.node)
        if layer.attr("act") is not None or any(i is not None and layer.has_input(i) and i not in layer.const_inputs
                                                for i in (si, zi)):
            return None
        ins = full_inputs(layer, inputs, params)
        x, y = ins[0], outputs[0]
        if x is None:
            return None
        p = _plan_from_inputs(layer.node, x, ins)
        tabs = _tables(p)
        axes = [a for a, t in enumerate(tabs) if t is not None]
        if p.mode != "nearest":
            return self._native_linear(x, y, p, tabs, axes)
        return self._native_nearest(x, y, p, tabs, axes)

    @staticmethod
    def _native_linear(x: np.ndarray, y: np.ndarray, p: ResizePlan, tabs: list,
                       axes: list[int]) -> Callable[[], None] | None:
        """A float32 linear resize of the last two axes in C, its tables made here once, as a call; None where it
        does not apply (other axes resized, other dtypes)."""
        nd = len(p.in_shape)
        if not (native.AVAILABLE and axes and nd >= 2 and set(axes) <= {nd - 2, nd - 1} and x.dtype == np.float32
                and y.dtype == np.float32 and x.flags.c_contiguous and y.flags.c_contiguous):
            return None
        h, w, oh, ow = p.in_shape[nd - 2], p.in_shape[nd - 1], p.out_shape[nd - 2], p.out_shape[nd - 1]

        def table(a: int, n: int) -> list[np.ndarray]:
            t = tabs[a]
            if t is None:  # an axis left as it is: each output reads its own input
                t = (np.arange(n), np.arange(n), np.ones(n, _F32), np.zeros(n, _F32))
            return [np.ascontiguousarray(t[0], np.int32), np.ascontiguousarray(t[1], np.int32),
                    np.ascontiguousarray(t[2], _F32), np.ascontiguousarray(t[3], _F32)]
        ty, tx = table(nd - 2, oh), table(nd - 1, ow)
        planes = int(np.prod(p.in_shape[:nd - 2], dtype=np.int64))
        ptr = native.ffi.cast
        args = (native._ptr(x), native._ptr(y), planes, h, w, oh, ow,
                *[ptr("int *" if t.dtype == np.int32 else "float *", t.ctypes.data) for t in ty + tx])
        fn, keep = native.lib.inferd_resize_linear2d, (x, y, ty, tx)

        def call() -> None:
            _ = keep
            if fn(*args) != 0:
                raise RuntimeError("inferd_resize_linear2d: bad tables")  # (built above: cannot happen)
        return call

    @staticmethod
    def _native_nearest(x: np.ndarray, y: np.ndarray, p: ResizePlan, tabs: list,
                        axes: list[int]) -> Callable[[], None] | None:
        """Integer-factor nearest upsampling of the last two axes in C, as a call; None where it does not apply.
        numpy did it as strided assignments whose inner loop stepped over fw elements at a time (0.21 ms with the
        per-run plan for unet_small's 128@16x16 -> 32x32 against onnxruntime's 0.03; 0.024 ms bound)."""
        nd = len(p.in_shape)
        if not (native.AVAILABLE and axes and nd >= 2 and set(axes) <= {nd - 2, nd - 1} and x.flags.c_contiguous
                and y.flags.c_contiguous and x.dtype == y.dtype and x.itemsize in (1, 2, 4, 8)):
            return None
        factors = {a: _repeat_factor(tabs[a], p.in_shape[a], p.out_shape[a]) for a in axes}
        if not all(factors.values()):
            return None
        planes = int(np.prod(p.in_shape[:nd - 2], dtype=np.int64))
        args = (native._vptr(x), native._vptr(y), planes, p.in_shape[nd - 2], p.in_shape[nd - 1],
                factors.get(nd - 2, 1), factors.get(nd - 1, 1), x.itemsize)
        fn, keep = native.lib.inferd_upsample_nearest, (x, y)

        def call() -> None:
            _ = keep
            fn(*args)
        return call

    @staticmethod
    def _nearest(x: np.ndarray, y: np.ndarray, p: ResizePlan, tabs: list, axes: list[int]) -> None:
        call = ResizeKernel._native_nearest(x, y, p, tabs, axes)
        if call is not None:
            call()
            return
        factors = {a: _repeat_factor(tabs[a], p.in_shape[a], p.out_shape[a]) for a in axes}
        if y.flags.c_contiguous and all(factors.values()):
            # y viewed as (..., n, f, ...): one strided assignment of x per offset combination.
            # A single broadcast copy would run numpy's inner loop over f (=2) elements only.
            ysplit: list[int] = []
            for a, n in enumerate(p.in_shape):
                ysplit += [n, factors[a]] if a in factors else [n]
            yv = y.reshape(ysplit)
            for offs in itertools.product(*[range(factors[a]) for a in axes]):
                idx: list[Any] = []
                it = iter(offs)
                for a in range(len(p.in_shape)):
                    idx += [slice(None), next(it)] if a in factors else [slice(None)]
                yv[tuple(idx)] = x
            return
        cur = x
        for i, a in enumerate(axes):
            if i == len(axes) - 1:
                np.take(cur, tabs[a][0], axis=a, out=y)
            else:
                cur = np.take(cur, tabs[a][0], axis=a)

    @staticmethod
    def _linear(x: np.ndarray, y: np.ndarray, tabs: list, axes: list[int]) -> None:
        if np.issubdtype(y.dtype, np.integer):
            # as onnxruntime (and the reference): the corners' weighted sum in float32, in its order, truncated;
            # the separable passes below round differently and truncate to the next integer down now and then
            f32 = np.dtype(np.float32)
            xf = x.astype(f32)
            acc = np.zeros(y.shape, f32)
            for corner in itertools.product((0, 1), repeat=len(axes)):
                cur, w = xf, None
                for a, c in zip(axes, corner):
                    cur = np.take(cur, tabs[a][c], axis=a)
                    wa = tabs[a][2 + c].astype(f32).reshape((-1,) + (1,) * (x.ndim - a - 1))
                    w = wa if w is None else w * wa
                acc += w * cur
            np.copyto(y, np.trunc(acc), casting="unsafe")
            return
        # float16 tensors interpolate in float32 and are cast once at the end
        work_dt = y.dtype if y.dtype in (np.float32, np.float64) else np.dtype(np.float32)
        cur = x.astype(work_dt, copy=False)
        for i, a in enumerate(axes):
            lo, hi, wlo, whi = tabs[a]
            bshape = (-1,) + (1,) * (x.ndim - a - 1)
            last = i == len(axes) - 1
            dst = y if last and y.dtype == work_dt else None
            t = np.take(cur, lo, axis=a)
            t = np.multiply(t, wlo.reshape(bshape).astype(work_dt, copy=False), out=t)
            u = np.take(cur, hi, axis=a)
            np.multiply(u, whi.reshape(bshape).astype(work_dt, copy=False), out=u)
            cur = np.add(t, u, out=dst if dst is not None else t)
        if cur is not y:
            np.copyto(y, cur, casting="unsafe")


@register_kernel
class ResizeReferenceKernel(Kernel):
    """The OpSpec's numpy reference (the oracle the ``resize`` kernel is tested against)."""

    name = "reference"
    ops = ("Resize", "Upsample")
    priority = 100

    def applies(self, layer: Layer) -> bool:
        return not extended(layer.node)

# --------------------------------------------------------------------------- beyond nearest/linear
# Resize beyond nearest/linear: cubic (``cubic_coeff_a``, ``exclude_outside``), antialiasing (linear and cubic
# filters stretched by 1/scale when downsampling) and ``tf_crop_and_resize`` (roi, ``extrapolation_value``).
#
# Separable: per resized axis, a weight matrix (out x in) built as the ONNX reference builds each output's taps (the
# pixel left of x_original is the reference, ratio in (0, 1], taps past the edge read the edge pixel unless
# ``exclude_outside``); the tensor is multiplied by each matrix in turn (float64), so one kernel serves every rank and
# every mode. The output shape and per-axis scales come from ``resize.resize_plan`` (``keep_aspect_ratio_policy``
# included), shared with the fast kernels.


def extended(node: Node) -> bool:
    """Whether a Resize node needs this module's kernel (cubic, antialias or tf_crop_and_resize)."""
    if _legacy(node):
        return False
    return _mode(node) == "cubic" or bool(node.attr("antialias", 0)) or \
        _s(node.attr("coordinate_transformation_mode", "half_pixel")) == "tf_crop_and_resize"


def _x_original(ctm: str, x: int, scale: float, n_in: int, n_out: int, roi: tuple[float, float]) -> float | None:
    """x_original of output coordinate ``x`` (None: tf_crop_and_resize outside the image, extrapolated)."""
    if ctm == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if ctm == "half_pixel_symmetric":
        adj = n_out / (scale * n_in)
        return n_in / 2 * (1 - adj) + (x + 0.5) / scale - 0.5
    if ctm == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if n_out > 1 else 0.0
    if ctm == "align_corners":
        return 0.0 if n_out == 1 else x * (n_in - 1) / (n_out - 1)
    if ctm == "asymmetric":
        return x / scale
    if ctm == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    # tf_crop_and_resize
    start, end = roi
    v = start * (n_in - 1) + x * (end - start) * (n_in - 1) / (n_out - 1) if n_out > 1 else \
        0.5 * (start + end) * (n_in - 1)
    return None if v < 0 or v > n_in - 1 else v


def _cubic(ratio: float, scale: float, a: float, antialias: bool) -> np.ndarray:
    s = min(scale, 1.0) if antialias else 1.0
    i0 = int(math.floor(-2 / s) + 1)
    xs = np.abs(s * (np.arange(i0, 2 - i0) - ratio))
    c = np.where(xs <= 1, (a + 2) * xs ** 3 - (a + 3) * xs ** 2 + 1,
                 np.where(xs < 2, a * xs ** 3 - 5 * a * xs ** 2 + 8 * a * xs - 4 * a, 0.0))
    return c / c.sum() if antialias else c


def _linear(ratio: float, scale: float, antialias: bool) -> np.ndarray:
    s = min(scale, 1.0) if antialias else 1.0
    i0 = int(math.floor(-1 / s) + 1)
    c = np.clip(1 - np.abs((np.arange(i0, 2 - i0) - ratio) * s), 0, 1)
    return c / c.sum()


def _nearest_idx(x: float, mode: str, scale: float) -> int:
    if mode == "floor":
        return math.floor(x)
    if mode == "ceil":
        return math.ceil(x)
    fl = math.floor(x)
    frac = x - fl
    if frac == 0.5:
        return fl if mode == "round_prefer_floor" else fl + 1
    return round(x) if frac != 0.5 else fl


@functools.lru_cache(maxsize=256)
def axis_matrix(mode: str, ctm: str, nearest_mode: str, n_in: int, n_out: int, scale: float, a: float,
                exclude: bool, antialias: bool, roi: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """(W (n_out, n_in), extrapolated (n_out,) bool) of one axis."""
    w = np.zeros((n_out, n_in))
    extra = np.zeros(n_out, bool)
    for x in range(n_out):
        xo = _x_original(ctm, x, scale, n_in, n_out, roi)
        if xo is None:
            extra[x] = True
            continue
        if mode == "nearest":
            w[x, min(max(_nearest_idx(xo, nearest_mode, scale), 0), n_in - 1)] = 1
            continue
        left = math.ceil(xo) - 1 if float(xo).is_integer() else math.floor(xo)
        ratio = xo - left  # (0, 1]: the reference prefers the pixel left of x_original
        c = _cubic(ratio, scale, a, antialias) if mode == "cubic" else _linear(ratio, scale, antialias)
        n = c.size
        idx = np.arange(left - n // 2 + 1, left + n // 2 + 1)
        if exclude:
            c = np.where((idx >= 0) & (idx < n_in), c, 0.0)
            tot = c.sum()
            c = c / tot if tot else c
        np.add.at(w[x], np.clip(idx, 0, n_in - 1), c)
    w.setflags(write=False)
    extra.setflags(write=False)
    return w, extra


def resize_ext(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    si, zi = _input_positions(node)
    get = lambda i: None if i is None or i >= len(inputs) else inputs[i]  # noqa: E731
    p = resize_plan(node, x.shape, get(si), get(zi))
    mode = _mode(node)
    ctm = _s(node.attr("coordinate_transformation_mode", "half_pixel"))
    rank = x.ndim
    roi = get(1)
    axes = node.attr("axes")
    axes = [int(a) % rank for a in axes] if axes is not None else list(range(rank))
    full_roi = [(0.0, 1.0)] * rank
    if roi is not None and np.asarray(roi).size:
        r = np.asarray(roi, np.float64).reshape(-1)
        for i, a in enumerate(axes if r.size == 2 * len(axes) else range(rank)):
            full_roi[a] = (float(r[i]), float(r[r.size // 2 + i]))
    extrap = float(node.attr("extrapolation_value", 0.0))
    y = x.astype(np.float64)
    ext_mask = np.zeros((), bool)
    for ax in range(rank):
        n_in, n_out, sc = p.in_shape[ax], p.out_shape[ax], p.scales[ax]
        if n_in == n_out and sc == 1.0 and ctm != "tf_crop_and_resize":
            continue
        w, extra = axis_matrix(mode, ctm, _s(node.attr("nearest_mode", "round_prefer_floor")), n_in, n_out,
                               float(sc), float(node.attr("cubic_coeff_a", -0.75)),
                               bool(node.attr("exclude_outside", 0)), bool(node.attr("antialias", 0)), full_roi[ax])
        y = np.moveaxis(np.tensordot(w, np.moveaxis(y, ax, 0), axes=(1, 0)), 0, ax)
        if extra.any():
            shape = [1] * rank
            shape[ax] = n_out
            ext_mask = ext_mask | extra.reshape(shape)
    if np.any(ext_mask):
        y = np.where(np.broadcast_to(ext_mask, y.shape), extrap, y)
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        y = np.clip(np.trunc(y), info.min, info.max)
    return [y.astype(x.dtype)]


@register_kernel
class ResizeGeneralKernel(Kernel):
    """Separable weight matrices (numpy tensordot, float64): the only kernel for cubic, antialias and
    tf_crop_and_resize nodes."""

    name = "resize_general"
    ops = ("Resize",)
    priority = 50

    def applies(self, layer: Layer) -> bool:
        return extended(layer.node)

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        np.copyto(outputs[0], resize_ext(layer.node, full_inputs(layer, inputs, params))[0])
