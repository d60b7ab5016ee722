"""Detection post-processing: NonMaxSuppression, RoiAlign, MaxRoiPool, and the native TopK kernel.

The numpy functions are the oracles; the native kernels (``native/detect.c``) follow onnxruntime's rules exactly
(NMS: strict score threshold, IoU strictly above the threshold suppresses, ties in score to the lower box index;
RoiAlign: its bilinear sampling and its max mode, the max of the four weighted corner values). NonMaxSuppression's
output is data-dependent (``OpSpec.bounded``): its bound is batches x classes x min(boxes, max_output_boxes_per_class
when that is a constant), capped as ``datadep`` caps every bound.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from .. import native
from ..errors import InputError, KernelError, ShapeError
from ..ir import Node, TensorInfo
from .base import Kernel, Layer, OpSpec, full_inputs, register_kernel, register_op
from .datadep import capped

Infos = list["TensorInfo | None"]


def _opset(node: Node) -> int:
    return int(node.attr("_opset", 17))


def _topk_k_of(node: Node, k_in: np.ndarray | None) -> int:
    from .indexing import _topk_k

    return _topk_k(node, k_in)


# ------------------------------------------------------------------------------------- NonMaxSuppression

def _nms_scalar(v: np.ndarray | None, default: float) -> float:
    if v is None or np.asarray(v).size == 0:
        return default
    return float(np.asarray(v).reshape(-1)[0])


def _nms_count(v: np.ndarray | None) -> int:
    """max_output_boxes_per_class as the integer it is (int64): through float, torchvision's INT64_MAX ("no
    limit") became 2**63, which no C long long holds."""
    if v is None or np.asarray(v).size == 0:
        return 0
    return max(0, int(np.asarray(v).reshape(-1)[0]))


def _infer_nms(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    b, s = ins[0], ins[1]
    assert b is not None and s is not None
    if len(b.shape) != 3 or b.shape[2] != 4 or len(s.shape) != 3 or s.shape[0] != b.shape[0] or s.shape[2] != b.shape[1]:
        raise ShapeError(f"node {node.name!r} (NonMaxSuppression): boxes {list(b.shape)} must be [B, N, 4] and "
                         f"scores {list(s.shape)} [B, C, N]")
    per = b.shape[1]
    if len(node.inputs) > 2 and node.inputs[2]:
        if node.inputs[2] in consts:
            per = min(per, _nms_count(consts[node.inputs[2]]))
    else:
        per = 0  # no max_output_boxes_per_class: the spec's default 0 selects nothing
    return [((capped(s.shape[0] * s.shape[1] * per, 3), 3), np.dtype(np.int64))]


def _check_iou(node: Node, iou: float) -> float:
    # the spec's range; onnxruntime refuses the run too (a negative threshold would suppress every box)
    if not 0.0 <= iou <= 1.0:
        raise InputError(f"node {node.name!r} (NonMaxSuppression): iou_threshold {iou} must be in [0, 1]")
    return iou


def _nms_args(node: Node, ins: Sequence[np.ndarray | None]) -> tuple[int, float, float | None]:
    g = lambda i: ins[i] if len(ins) > i else None  # noqa: E731
    max_out = _nms_count(g(2))
    iou = _check_iou(node, _nms_scalar(g(3), 0.0))
    st = g(4)
    score = None if st is None or np.asarray(st).size == 0 else float(np.asarray(st).reshape(-1)[0])
    return max_out, iou, score


def _corners(boxes: np.ndarray, center: bool) -> np.ndarray:
    """(..., 5) float32: xmin, ymin, xmax, ymax, area, as onnxruntime computes them."""
    b = boxes.astype(np.float32)
    if center:
        hw, hh = b[..., 2] / np.float32(2), b[..., 3] / np.float32(2)
        x0, x1, y0, y1 = b[..., 0] - hw, b[..., 0] + hw, b[..., 1] - hh, b[..., 1] + hh
    else:
        y0, y1 = np.minimum(b[..., 0], b[..., 2]), np.maximum(b[..., 0], b[..., 2])
        x0, x1 = np.minimum(b[..., 1], b[..., 3]), np.maximum(b[..., 1], b[..., 3])
    return np.stack([x0, y0, x1, y1, (x1 - x0) * (y1 - y0)], axis=-1).astype(np.float32)


def nms(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    boxes, scores = np.asarray(ins[0], np.float32), np.asarray(ins[1], np.float32)
    max_out, iou_thr, score_thr = _nms_args(node, ins)
    geo = _corners(boxes, bool(node.attr("center_point_box", 0)))
    out: list[tuple[int, int, int]] = []
    thr = np.float32(iou_thr)
    for b in range(scores.shape[0]):
        g = geo[b]
        for c in range(scores.shape[1]):
            if max_out == 0:
                break
            sc = scores[b, c]
            cand = np.arange(sc.size) if score_thr is None else np.flatnonzero(sc > np.float32(score_thr))
            cand = cand[np.lexsort((cand, -sc[cand]))]  # descending score, lower index first on ties
            kept = 0
            while cand.size and kept < max_out:
                i = int(cand[0])
                out.append((b, c, i))
                kept += 1
                rest = cand[1:]
                h = g[rest]
                ix0, ix1 = np.maximum(g[i, 0], h[:, 0]), np.minimum(g[i, 2], h[:, 2])
                iy0, iy1 = np.maximum(g[i, 1], h[:, 1]), np.minimum(g[i, 3], h[:, 3])
                inter = (ix1 - ix0) * (iy1 - iy0)
                uni = g[i, 4] + h[:, 4] - inter
                ok = (ix1 > ix0) & (iy1 > iy0) & (inter > 0) & (g[i, 4] > 0) & (h[:, 4] > 0) & (uni > 0)
                with np.errstate(divide="ignore", invalid="ignore"):
                    sup = ok & (inter / np.where(ok, uni, np.float32(1)) > thr)
                cand = rest[~sup]
    return [np.array(out, dtype=np.int64).reshape(-1, 3)]


# ------------------------------------------------------------------------------------- RoiAlign

def _roi_half_pixel(node: Node) -> bool:
    if _opset(node) < 16:
        return False  # opset 10 had no attribute: output_half_pixel
    m = node.attr("coordinate_transformation_mode", "half_pixel")
    m = m.decode() if isinstance(m, bytes) else str(m)
    if m not in ("half_pixel", "output_half_pixel"):
        raise ShapeError(f"node {node.name!r} (RoiAlign): coordinate_transformation_mode {m!r} is not an ONNX mode")
    return m == "half_pixel"


def _roi_mode_max(node: Node) -> bool:
    m = node.attr("mode", "avg")
    m = m.decode() if isinstance(m, bytes) else str(m)
    if m not in ("avg", "max"):
        raise ShapeError(f"node {node.name!r} (RoiAlign): mode {m!r} is not avg or max")
    return m == "max"


def _infer_roi_align(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x, r = ins[0], ins[1]
    assert x is not None and r is not None
    if len(x.shape) != 4 or len(r.shape) != 2 or r.shape[1] != 4:
        raise ShapeError(f"node {node.name!r} (RoiAlign): X {list(x.shape)} must be [N, C, H, W] and rois "
                         f"{list(r.shape)} [R, 4]")
    _roi_half_pixel(node), _roi_mode_max(node)
    oh, ow = int(node.attr("output_height", 1)), int(node.attr("output_width", 1))
    return [((r.shape[0], x.shape[1], oh, ow), np.dtype(x.dtype))]


def _check_batch(node: Node, bi: np.ndarray, n: int) -> np.ndarray:
    bi = np.ascontiguousarray(bi, dtype=np.int64).reshape(-1)
    if bi.size and (bi.min() < 0 or bi.max() >= n):
        raise KernelError(f"node {node.name!r} ({node.op}): batch index out of range ({bi.min()}..{bi.max()} "
                          f"for {n} images)")
    return bi


def roi_align(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    rois = np.asarray(ins[1], np.float32)
    n, c, h, w = x.shape
    bi = _check_batch(node, np.asarray(ins[2]), n)
    oh, ow = int(node.attr("output_height", 1)), int(node.attr("output_width", 1))
    sr = int(node.attr("sampling_ratio", 0))
    scale = np.float32(node.attr("spatial_scale", 1.0))
    half, mmax = _roi_half_pixel(node), _roi_mode_max(node)
    off = np.float32(0.5 if half else 0.0)
    y = np.zeros((rois.shape[0], c, oh, ow), np.float32)
    xf = x.astype(np.float32).reshape(n, c, h * w)
    for r in range(rois.shape[0]):
        sw, sh, ew, eh = (rois[r] * scale - off)
        rw, rh = np.float32(ew - sw), np.float32(eh - sh)
        if not half:
            rw, rh = max(rw, np.float32(1)), max(rh, np.float32(1))
        bh, bw = np.float32(rh / np.float32(oh)), np.float32(rw / np.float32(ow))
        gh = sr if sr > 0 else max(int(np.ceil(rh / np.float32(oh))), 0)
        gw = sr if sr > 0 else max(int(np.ceil(rw / np.float32(ow))), 0)
        if gh * gw == 0:
            continue  # no samples: avg gives 0 / 1, max its initial 0
        count = np.float32(max(gh * gw, 1))
        ph = np.arange(oh, dtype=np.float32)[:, None, None, None]
        pw = np.arange(ow, dtype=np.float32)[None, :, None, None]
        iy = np.arange(gh, dtype=np.float32)[None, None, :, None]
        ix = np.arange(gw, dtype=np.float32)[None, None, None, :]
        yy = np.broadcast_to(sh + ph * bh + (iy + np.float32(0.5)) * bh / np.float32(gh), (oh, ow, gh, gw))
        xx = np.broadcast_to(sw + pw * bw + (ix + np.float32(0.5)) * bw / np.float32(gw), (oh, ow, gh, gw))
        out = (yy < -1) | (yy > h) | (xx < -1) | (xx > w)
        yv, xv = np.maximum(yy, np.float32(0)), np.maximum(xx, np.float32(0))
        yl, xl = yv.astype(np.int64), xv.astype(np.int64)
        ytop, xtop = yl >= h - 1, xl >= w - 1
        yl, xl = np.where(ytop, h - 1, yl), np.where(xtop, w - 1, xl)
        yv, xv = np.where(ytop, yl.astype(np.float32), yv), np.where(xtop, xl.astype(np.float32), xv)
        yh, xh = np.where(ytop, yl, yl + 1), np.where(xtop, xl, xl + 1)
        ly, lx = (yv - yl).astype(np.float32), (xv - xl).astype(np.float32)
        hy, hx = np.float32(1) - ly, np.float32(1) - lx
        ws = [np.where(out, 0, hy * hx), np.where(out, 0, hy * lx), np.where(out, 0, ly * hx), np.where(out, 0, ly * lx)]
        ps = [np.where(out, 0, yl * w + xl), np.where(out, 0, yl * w + xh), np.where(out, 0, yh * w + xl),
              np.where(out, 0, yh * w + xh)]
        img = xf[bi[r]]  # (c, h*w)
        terms = [img[:, p].astype(np.float32) * wt.astype(np.float32) for p, wt in zip(ps, ws)]  # (c, oh, ow, gh, gw)
        if mmax:
            v = np.maximum(np.maximum(np.maximum(terms[0], terms[1]), terms[2]), terms[3])
            y[r] = v.reshape(c, oh, ow, -1).max(axis=-1)
        else:
            s = ((terms[0] + terms[1]) + terms[2]) + terms[3]
            y[r] = s.reshape(c, oh, ow, -1).sum(axis=-1, dtype=np.float32) / count
    return [y.astype(x.dtype, copy=False)]


# ------------------------------------------------------------------------------------- MaxRoiPool

def _infer_max_roi_pool(node: Node, ins: Infos, consts: Mapping[str, np.ndarray]) -> list:
    x, r = ins[0], ins[1]
    assert x is not None and r is not None
    ps = node.attr("pooled_shape")
    if ps is None or len(ps) != 2 or len(x.shape) != 4 or len(r.shape) != 2 or r.shape[1] != 5:
        raise ShapeError(f"node {node.name!r} (MaxRoiPool): needs pooled_shape [h, w], X [N, C, H, W] and rois "
                         f"[R, 5] (got {list(x.shape)}, {list(r.shape)})")
    return [((r.shape[0], x.shape[1], int(ps[0]), int(ps[1])), np.dtype(x.dtype))]


def _round_half_away(v: np.ndarray) -> np.ndarray:
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def max_roi_pool(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Caffe's ROIPooling as onnxruntime runs it: rois [batch, x1, y1, x2, y2] rounded after scaling, bins
    floor/ceil-split, an empty bin gives 0."""
    x, rois = np.asarray(ins[0]), np.asarray(ins[1], np.float32)
    n, c, h, w = x.shape
    ph_n, pw_n = (int(v) for v in node.attr("pooled_shape"))
    scale = float(node.attr("spatial_scale", 1.0))
    y = np.zeros((rois.shape[0], c, ph_n, pw_n), x.dtype)
    bi = _check_batch(node, rois[:, 0].astype(np.int64), n)
    for r in range(rois.shape[0]):
        x1, y1, x2, y2 = (int(v) for v in _round_half_away(rois[r, 1:].astype(np.float64) * scale))
        rh, rw = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
        bh, bw = rh / ph_n, rw / pw_n
        for ph in range(ph_n):
            hs = min(max(int(np.floor(ph * bh)) + y1, 0), h)
            he = min(max(int(np.ceil((ph + 1) * bh)) + y1, 0), h)
            for pw in range(pw_n):
                ws = min(max(int(np.floor(pw * bw)) + x1, 0), w)
                we = min(max(int(np.ceil((pw + 1) * bw)) + x1, 0), w)
                if he > hs and we > ws:
                    y[r, :, ph, pw] = x[bi[r], :, hs:he, ws:we].max(axis=(1, 2))
    return [y]


# ------------------------------------------------------------------------------------- registration

_COMPUTE = {"NonMaxSuppression": nms, "RoiAlign": roi_align, "MaxRoiPool": max_roi_pool}


def _reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    return [np.array(r, order="C", copy=True) for r in _COMPUTE[node.op](node, inputs)]


register_op(OpSpec("NonMaxSuppression", _infer_nms, _reference, min_opset=10, bounded=lambda n, c: True,
                   notes="output sized at run time within batches x classes x min(boxes, max_output_boxes_per_class "
                         "when constant), at most INFERD_MAX_BOUND_ELEMS elements; a run exceeding it fails"))
register_op(OpSpec("RoiAlign", _infer_roi_align, _reference, min_opset=10,
                   notes="onnxruntime's sampling (max mode: max of the weighted corners)"))
register_op(OpSpec("MaxRoiPool", _infer_max_roi_pool, _reference, min_opset=1))


@register_kernel
class DetectionNumpy(Kernel):
    """The numpy oracles, run as kernels (where the native extension is missing or stale)."""

    name = "numpy"
    ops = tuple(_COMPUTE)
    priority = 90

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        for o, r in zip(outputs, _COMPUTE[layer.op](layer.node, full_inputs(layer, inputs, params))):
            np.copyto(o, r)


@register_kernel
class NmsNative(Kernel):
    """native/detect.c: sort per class, greedy suppression against the kept boxes; writes into the planned bound
    and stops, failing the run, before it would pass it."""

    name = "nms_native"
    ops = ("NonMaxSuppression",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        return native.has("inferd_nms")

    def run_bounded(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
                    outputs: Sequence[np.ndarray]) -> list[tuple[int, ...]]:
        ins = full_inputs(layer, inputs, params)
        boxes = np.ascontiguousarray(ins[0], np.float32)
        scores = np.ascontiguousarray(ins[1], np.float32)
        max_out, iou, st = _nms_args(layer.node, ins)
        out = outputs[0]
        cap = out.shape[0]
        ffi = native.ffi
        n = native.lib.inferd_nms(ffi.cast("const float*", boxes.ctypes.data), ffi.cast("const float*", scores.ctypes.data),
                                  scores.shape[0], scores.shape[1], scores.shape[2],
                                  int(layer.attr("center_point_box", 0)), max_out, iou, 0.0 if st is None else st,
                                  0 if st is None else 1, ffi.cast("long long*", out.ctypes.data), cap)
        if n < 0:
            self._fail(layer, n, out)
        return [(int(n), 3)]

    def bind_bounded(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
                     outputs: Sequence[np.ndarray]):  # type: ignore[no-untyped-def]
        ins = full_inputs(layer, inputs, params)
        if any(a is None or not a.flags.c_contiguous or a.dtype != np.float32 for a in ins[:2]):
            return None
        ffi, lib = native.ffi, native.lib
        boxes, scores, out = ins[0], ins[1], outputs[0]
        pb, ps = ffi.cast("const float*", boxes.ctypes.data), ffi.cast("const float*", scores.ctypes.data)
        po, cap = ffi.cast("long long*", out.ctypes.data), out.shape[0]
        b, c, n = scores.shape
        center = int(layer.attr("center_point_box", 0))
        node = layer.node

        # the scalars may be computed at run time: read each run, through flat views bound once
        flat = [ins[i].reshape(-1) if len(ins) > i and ins[i] is not None and ins[i].size else None for i in (2, 3, 4)]
        mo_v, iou_v, st_v = flat

        def call() -> list[tuple[int, ...]]:
            max_out = max(0, int(mo_v[0])) if mo_v is not None else 0
            iou = _check_iou(node, float(iou_v[0])) if iou_v is not None else 0.0
            st = float(st_v[0]) if st_v is not None else 0.0
            got = lib.inferd_nms(pb, ps, b, c, n, center, max_out, iou, st, 0 if st_v is None else 1, po, cap)
            if got < 0:
                self._fail(layer, got, out)
            return [(int(got), 3)]

        return call

    @staticmethod
    def _fail(layer: Layer, got: int, out: np.ndarray) -> None:
        if got == -1:
            raise KernelError(f"node {layer.name!r} (NonMaxSuppression): more than {out.shape[0]} boxes selected this "
                              f"run, past the planned bound {list(out.shape)}; the request fails rather than write "
                              f"past its buffer")
        raise MemoryError("inferd_nms: out of memory")

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        raise KernelError(f"node {layer.name!r} (NonMaxSuppression): data-dependent, runs through run_bounded")


@register_kernel
class RoiAlignNative(Kernel):
    """native/detect.c: avg mode separable (the bins' summed row and column taps computed once per roi, then per
    channel contiguous row multiply-adds over the roi's column span and a short dot per output); max mode and
    sparse grids with per-sample taps; tasks over (roi, channel block) split over the native pool."""

    name = "roialign_native"
    ops = ("RoiAlign",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        return native.has("inferd_roi_align") and layer.inputs[0] is not None and \
            np.dtype(layer.inputs[0].dtype) == np.float32

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        ins = full_inputs(layer, inputs, params)
        x = np.ascontiguousarray(ins[0], np.float32)
        rois = np.ascontiguousarray(ins[1], np.float32)
        n, c, h, w = x.shape
        bi = _check_batch(layer.node, np.asarray(ins[2]), n)
        y = outputs[0]
        assert y.flags.c_contiguous
        ffi = native.ffi
        rc = native.lib.inferd_roi_align(
            ffi.cast("const float*", x.ctypes.data), n, c, h, w, ffi.cast("const float*", rois.ctypes.data),
            ffi.cast("const long long*", bi.ctypes.data), rois.shape[0], y.shape[2], y.shape[3],
            int(layer.attr("sampling_ratio", 0)), float(layer.attr("spatial_scale", 1.0)),
            int(_roi_half_pixel(layer.node)), int(_roi_mode_max(layer.node)), ffi.cast("float*", y.ctypes.data))
        if rc:
            raise MemoryError("inferd_roi_align: out of memory")


@register_kernel
class TopKNative(Kernel):
    """native/detect.c: values as integer keys (order, NaN rule and ties in one compare), a buffer of 2k candidates
    cut back to the best k by selection, blocks of 16 that cannot pass the k-th skipped after one vectorised
    test, then a sort of the k; float32 rows along the last axis. A run-time k is data-dependent
    (``run_bounded``)."""

    name = "topk_native"
    ops = ("TopK",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        x = layer.inputs[0]
        if not native.has("inferd_topk") or x is None or np.dtype(x.dtype) != np.float32 or not x.shape:
            return False
        a = int(layer.attr("axis", -1))
        return a in (-1, len(x.shape) - 1)

    def _k(self, layer: Layer, ins: Sequence[np.ndarray | None]) -> int:
        from .indexing import _topk_k

        return _topk_k(layer.node, ins[1] if len(ins) > 1 else None)

    def _go(self, layer: Layer, x: np.ndarray, k: int, vals: np.ndarray, idx: np.ndarray) -> None:
        n = x.shape[-1]
        if not 0 <= k <= n:
            raise KernelError(f"node {layer.name!r} (TopK): k {k} outside 0..{n} (last axis of {list(x.shape)})")
        x = np.ascontiguousarray(x, np.float32)
        ffi = native.ffi
        native.lib.inferd_topk(ffi.cast("const float*", x.ctypes.data), x.size // max(n, 1), n, k,
                               int(layer.attr("largest", 1)), ffi.cast("float*", vals.ctypes.data),
                               ffi.cast("long long*", idx.ctypes.data))

    @staticmethod
    def _pair(layer: Layer, outputs: Sequence[np.ndarray], m: int) -> tuple[np.ndarray, np.ndarray]:
        """(values, indices) buffers of m elements: the outputs' first m, scratch for an output the node omits."""
        outs = iter(outputs)
        got = [next(outs).reshape(-1)[:m] if i < len(layer.node.outputs) and layer.node.outputs[i] else None
               for i in range(2)]
        vals = got[0] if got[0] is not None else np.empty(m, np.float32)
        idx = got[1] if got[1] is not None else np.empty(m, np.int64)
        return vals, idx

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        ins = full_inputs(layer, inputs, params)
        x = np.asarray(ins[0])
        k = layer.outputs[0].shape[-1]
        self._go(layer, x, k, *self._pair(layer, outputs, outputs[0].size))

    def run_bounded(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
                    outputs: Sequence[np.ndarray]) -> list[tuple[int, ...]]:
        ins = full_inputs(layer, inputs, params)
        x = np.asarray(ins[0])
        k = self._k(layer, ins)  # the bound is the whole axis: _go refuses a k past it before writing
        shape = tuple(x.shape[:-1]) + (k,)
        self._go(layer, x, k, *self._pair(layer, outputs, int(np.prod(shape))))
        return [shape] * len(outputs)

    def _bound(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
               outputs: Sequence[np.ndarray], runtime_k: bool):  # type: ignore[no-untyped-def]
        ins = full_inputs(layer, inputs, params)
        x = ins[0]
        if x is None or not x.flags.c_contiguous or any(not o.flags.c_contiguous for o in outputs):
            return None
        n = x.shape[-1]
        rows = x.size // max(n, 1)
        vals, idx = self._pair(layer, outputs, outputs[0].size)
        ffi, lib = native.ffi, native.lib
        px, pv, pi = (ffi.cast("const float*", x.ctypes.data), ffi.cast("float*", vals.ctypes.data),
                      ffi.cast("long long*", idx.ctypes.data))
        largest = int(layer.attr("largest", 1))
        node, kin = layer.node, ins[1] if len(ins) > 1 else None
        lead = tuple(x.shape[:-1])
        nout = len(outputs)
        static_k = layer.outputs[0].shape[-1]

        k_at = kin.reshape(-1) if runtime_k and kin is not None and kin.size == 1 else None

        def call() -> list[tuple[int, ...]]:
            k = (int(k_at[0]) if k_at is not None else _topk_k_of(node, kin)) if runtime_k else static_k
            if not 0 <= k <= n:
                raise KernelError(f"node {layer.name!r} (TopK): k {k} outside 0..{n} (last axis of {list(x.shape)})")
            lib.inferd_topk(px, rows, n, k, largest, pv, pi)
            return [lead + (k,)] * nout

        return call

    def bind_bounded(self, layer, inputs, params, outputs):  # type: ignore[no-untyped-def]
        return self._bound(layer, inputs, params, outputs, True)

    def bind(self, layer, inputs, params, outputs):  # type: ignore[no-untyped-def]
        f = self._bound(layer, inputs, params, outputs, False)
        return None if f is None else (lambda: f() and None)

