"""Vulkan kernels for data movement: Concat, Split, Slice, Transpose, Expand, Tile, Gather, Pad, and copies.

Most are one strided copy (``copy.comp``: y[dbase + sum c*ds] = x[sbase + sum c*ss] over at most
8 dims after merging contiguous ones); Pad has ``pad.comp`` (all four modes, negative pads crop) and
Gather with constant indices ``gather.comp``. Reshape/Flatten/Squeeze/Unsqueeze/Identity/Dropout are
aliases (the executor gives them no buffer and no dispatch); ``vk_copy`` covers them when they are
not (e.g. a planner that disables aliasing) and float32 -> float32 Cast.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..vulkan.kernel import Caps, Dispatch, In, Out, Param, VulkanKernel, collapse, contiguous_strides, grid
from .base import Layer, register_kernel
from .quant import INT8_TYPES
from .tensor import _axis, _concat_shape, _pad_params, _perm, _slices, _split_sizes, array_getter, onnx_dtype

MAX_COPY_RANK = 8
MAX_PAD_RANK = 6


def copy_dispatch(shape: Sequence[int], ss: Sequence[int], ds: Sequence[int], sbase: int, dbase: int, src, dst,
                  caps: Caps, independent: bool = False, q8: bool = False) -> Dispatch | None:
    """One strided copy over index space ``shape``; None if it needs more than 8 dims. ``q8``: of 8-bit
    elements, four output bytes per invocation, so only into a whole output in index order (else None)."""
    dims, (s2, d2) = collapse(shape, ss, ds)
    if len(dims) > MAX_COPY_RANK:
        return None
    n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    if q8 and (dbase != 0 or d2 != contiguous_strides(dims)):
        return None
    return Dispatch("copy", (src, dst), grid(-(-n // 4) if q8 else n, 256, caps), {"Q8": 1} if q8 else {},
                    push={"n": n, "rank": len(dims), "dims": dims, "ss": s2, "ds": d2, "sbase": sbase, "dbase": dbase},
                    independent=independent)


def _q8(layer: Layer) -> bool:
    """Input 0 holds 8-bit values (a quantised model's activations): the whole-output copies move them as bytes."""
    return np.dtype(layer.inputs[0].dtype) in INT8_TYPES  # type: ignore[union-attr]


def _raw_getter(layer: Layer, params: Mapping[str, np.ndarray]):
    """A tensor.py Getter over the layer's constant inputs (from the kernel's params)."""
    vals: list[np.ndarray | None] = [None] * len(layer.node.inputs)
    for k in layer.const_inputs:
        vals[k] = params.get(f"c{k}")
    return array_getter(vals)


class _TensorBase(VulkanKernel):
    """Keeps constant inputs (shapes, axes, pads) host-side under ``c{k}``; nothing is uploaded for them."""

    priority = 10

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {f"c{k[2:]}": np.asarray(v) for k, v in raw.items()}

    def transformed_nbytes(self, layer: Layer) -> int:
        return 0

    def applies(self, layer: Layer) -> bool:
        return 0 not in layer.const_inputs and self._build(layer, None) is not None

    def _build(self, layer: Layer, params: Mapping[str, np.ndarray] | None) -> list[Dispatch] | None:
        raise NotImplementedError

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        d = self._build(layer, params, caps)  # type: ignore[call-arg]
        if d is None:
            raise ValueError(f"{layer.op} {layer.name!r}: more dims than the copy shader handles")
        return d


def _needs_consts(layer: Layer, params: Mapping[str, np.ndarray] | None) -> bool:
    return params is None and bool(layer.const_inputs)


@register_kernel
class VkConcat(_TensorBase):
    name = "vk_concat"
    ops = ("Concat",)

    def applies(self, layer: Layer) -> bool:
        # constant parts are allowed (bound from the weights region)
        return len(layer.out_shape()) <= MAX_COPY_RANK

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: np.ascontiguousarray(v, np.float32) for k, v in raw.items()}

    def transformed_nbytes(self, layer: Layer) -> int:
        return sum(4 * layer.inputs[k].size for k in layer.const_inputs)  # type: ignore[union-attr]

    def _build(self, layer: Layer, params=None, caps: Caps = Caps()) -> list[Dispatch] | None:
        ks = [k for k in range(len(layer.node.inputs)) if layer.has_input(k)]
        shapes = [tuple(layer.in_shape(k)) for k in ks]
        out, axis = _concat_shape(layer.node, shapes)
        ost = contiguous_strides(out)
        res = []
        off = 0
        for k, s in zip(ks, shapes):
            if s[axis] == 0:
                continue
            d = copy_dispatch(s, contiguous_strides(s), ost, 0, off * ost[axis], In(k), Out(0), caps, independent=True)
            if d is None:
                return None
            res.append(d)
            off += s[axis]
        return res

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        return self._build(layer, params, caps) or []


@register_kernel
class VkSplit(_TensorBase):
    name = "vk_split"
    ops = ("Split",)
    io_dtypes = ("float32", "int8", "uint8")

    def _build(self, layer: Layer, params=None, caps: Caps = Caps()) -> list[Dispatch] | None:
        if _needs_consts(layer, params):
            return []
        shape = tuple(layer.in_shape(0))
        axis = _axis(layer.node, int(layer.attr("axis", 0)), len(shape))
        sizes = _split_sizes(layer.node, shape[axis], _raw_getter(layer, params or {}))
        st = contiguous_strides(shape)
        res = []
        off = 0
        for j, sz in enumerate(sizes):
            if j < len(layer.node.outputs) and layer.node.outputs[j] and sz > 0:
                os_ = shape[:axis] + (sz,) + shape[axis + 1:]
                d = copy_dispatch(os_, st, contiguous_strides(os_), off * st[axis], 0, In(0), Out(j), caps,
                                  q8=_q8(layer))
                if d is None:
                    return None
                res.append(d)
            off += sz
        return res


@register_kernel
class VkSlice(_TensorBase):
    name = "vk_slice"
    ops = ("Slice",)
    io_dtypes = ("float32", "int8", "uint8")

    def _build(self, layer: Layer, params=None, caps: Caps = Caps()) -> list[Dispatch] | None:
        if _needs_consts(layer, params):
            return []
        shape = tuple(layer.in_shape(0))
        sl = _slices(layer.node, shape, _raw_getter(layer, params or {}))
        st = contiguous_strides(shape)
        out, ss, base = [], [], 0
        for s, d, stride in zip(sl, shape, st):
            start, _, step = s.indices(d)
            n = len(range(*s.indices(d)))
            out.append(n)
            ss.append(step * stride)
            base += start * stride if n else 0
        if int(np.prod(out, dtype=np.int64)) == 0:
            return []
        d = copy_dispatch(out, ss, contiguous_strides(out), base, 0, In(0), Out(0), caps, q8=_q8(layer))
        return None if d is None else [d]


def _permuted_copy(shape: Sequence[int], perm: Sequence[int], caps: Caps, q8: bool = False) -> list[Dispatch] | None:
    """Input 0, viewed as ``shape``, written to output 0 with its axes in ``perm``'s order: one strided copy."""
    st = contiguous_strides(shape)
    out = [shape[p] for p in perm]
    d = copy_dispatch(out, [st[p] for p in perm], contiguous_strides(out), 0, 0, In(0), Out(0), caps, q8=q8)
    return None if d is None else [d]


@register_kernel
class VkTranspose(_TensorBase):
    name = "vk_transpose"
    ops = ("Transpose",)
    io_dtypes = ("float32", "int8", "uint8")

    def _build(self, layer: Layer, params=None, caps: Caps = Caps()) -> list[Dispatch] | None:
        shape = tuple(layer.in_shape(0))
        return _permuted_copy(shape, _perm(layer.node, len(shape)), caps, _q8(layer))


@register_kernel
class VkExpand(_TensorBase):
    name = "vk_expand"
    ops = ("Expand",)

    def _build(self, layer: Layer, params=None, caps: Caps = Caps()) -> list[Dispatch] | None:
        shape = tuple(layer.in_shape(0))
        out = tuple(layer.out_shape())
        s = (1,) * (len(out) - len(shape)) + shape
        st = contiguous_strides(s)
        ss = [0 if a == 1 and b != 1 else t for a, b, t in zip(s, out, st)]
        d = copy_dispatch(out, ss, contiguous_strides(out), 0, 0, In(0), Out(0), caps)
        return None if d is None else [d]


@register_kernel
class VkTile(_TensorBase):
    name = "vk_tile"
    ops = ("Tile",)

    def _build(self, layer: Layer, params=None, caps: Caps = Caps()) -> list[Dispatch] | None:
        shape = tuple(layer.in_shape(0))
        out = tuple(layer.out_shape())
        reps = [o // s if s else 1 for o, s in zip(out, shape)]
        st = contiguous_strides(shape)
        dims, ss, ds = [], [], []
        ost = contiguous_strides(out)
        for r, s, t, ot in zip(reps, shape, st, ost):
            if r > 1:  # tiled dim: (repeat, size); the repeat index moves the output by s rows
                dims += [r, s]
                ss += [0, t]
                ds += [s * ot, ot]
            else:
                dims.append(s)
                ss.append(t)
                ds.append(ot)
        d = copy_dispatch(dims, ss, ds, 0, 0, In(0), Out(0), caps)
        return None if d is None else [d]


@register_kernel
class VkCopy(_TensorBase):
    """A plain copy: alias ops the planner did not alias, Identity, float32 -> float32 Cast."""

    name = "vk_copy"
    ops = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout", "Cast", "CastLike")
    priority = 50

    def applies(self, layer: Layer) -> bool:
        if 0 in layer.const_inputs:
            return False
        if layer.op == "Cast":
            try:
                return onnx_dtype(layer.attr("to")) == np.float32 and np.dtype(layer.inputs[0].dtype) == np.float32  # type: ignore[union-attr]
            except Exception:
                return False
        if layer.op == "Dropout" and len([o for o in layer.node.outputs if o]) > 1:
            return False
        return layer.inputs[0].nbytes == layer.outputs[0].nbytes  # type: ignore[union-attr]

    def _build(self, layer: Layer, params=None, caps: Caps = Caps()) -> list[Dispatch] | None:
        n = layer.outputs[0].size
        return [copy_dispatch((n,), (1,), (1,), 0, 0, In(0), Out(0), caps)]  # type: ignore[list-item]


@register_kernel
class VkGather(_TensorBase):
    name = "vk_gather"
    ops = ("Gather",)
    io_dtypes = ("float32", "int8", "uint8")

    def applies(self, layer: Layer) -> bool:
        # 8-bit data: one index (a transformer's q/k/v picked out of one tensor), a byte copy
        return (0 not in layer.const_inputs and 1 in layer.const_inputs
                and (not _q8(layer) or layer.inputs[1].size == 1))  # type: ignore[union-attr]

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        shape = tuple(layer.in_shape(0))
        axis = _axis(layer.node, int(layer.attr("axis", 0)), len(shape))
        idx = np.asarray(raw["in1"]).astype(np.int64).reshape(-1)
        dim = shape[axis]
        if idx.size and (idx.min() < -dim or idx.max() >= dim):
            raise ValueError(f"Gather {layer.name!r}: indices out of range [-{dim}, {dim})")
        return {"idx": np.ascontiguousarray(np.where(idx < 0, idx + dim, idx), np.int32)}

    def transformed_nbytes(self, layer: Layer) -> int:
        return 4 * layer.inputs[1].size  # type: ignore[union-attr]

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        shape = tuple(layer.in_shape(0))
        axis = _axis(layer.node, int(layer.attr("axis", 0)), len(shape))
        outer = int(np.prod(shape[:axis], dtype=np.int64))
        inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
        nidx = int(params["idx"].size)
        n = outer * nidx * inner
        if n == 0:
            return []
        if nidx == 1:
            # one index (a transformer's q/k/v picked out of one tensor): a strided copy (8-bit data four bytes an
            # invocation), which the executor leaves out where the memory plan put the output in place (a slice led
            # by size-1 axes)
            d = copy_dispatch((outer, inner), (shape[axis] * inner, 1), (inner, 1), int(params["idx"][0]) * inner, 0,
                              In(0), Out(0), caps, q8=_q8(layer))
            assert d is not None  # a whole output in index order
            return [d]
        return [Dispatch("gather", (In(0), Param("idx"), Out(0)), grid(n, 256, caps),
                         push={"n": n, "L": shape[axis], "inner": inner, "nidx": nidx})]


@register_kernel
class VkPad(_TensorBase):
    name = "vk_pad"
    ops = ("Pad",)
    MODES = {"constant": 0, "reflect": 1, "edge": 2, "wrap": 3}

    def applies(self, layer: Layer) -> bool:
        return 0 not in layer.const_inputs and all(k in layer.const_inputs for k in range(1, len(layer.node.inputs))
                                                   if layer.has_input(k))

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        shape = tuple(layer.in_shape(0))
        widths, mode, value = _pad_params(layer.node, len(shape), _raw_getter(layer, params), np.dtype(np.float32))
        st = contiguous_strides(shape)
        od: list[int] = []
        cd: list[int] = []
        sts: list[int] = []
        pb: list[int] = []
        untouched: list[bool] = []
        base = 0
        for d, (b, e), s in zip(shape, widths, st):
            crop_b, crop_e = max(-b, 0), max(-e, 0)
            base += crop_b * s
            c = d - crop_b - crop_e
            o = c + max(b, 0) + max(e, 0)
            if b == 0 and e == 0 and untouched and untouched[-1]:
                # two neighbouring dims without pads: one dim (the input is contiguous)
                od[-1] *= o
                cd[-1] *= c
                sts[-1] = s
                continue
            od.append(o)
            cd.append(c)
            sts.append(s)
            pb.append(max(b, 0))
            untouched.append(b == 0 and e == 0)
        if len(od) > MAX_PAD_RANK:
            raise ValueError(f"Pad {layer.name!r}: {len(od)} dims after merging; at most {MAX_PAD_RANK}")
        n = layer.outputs[0].size
        if n == 0:
            return []
        if mode not in self.MODES:
            raise ValueError(f"Pad mode {mode!r}")
        return [Dispatch("pad", (In(0), Out(0)), grid(n, 256, caps), {"MODE": self.MODES[mode]},
                         push={"n": n, "rank": len(od), "od": od, "cd": cd, "st": sts, "pb": pb, "base": base,
                               "value": float(value)})]


#: (op, mode) -> (the input's 6-D view: 0 as (N, bs, bs, C', H, W), 1 as (N, C', bs, bs, H, W), 2 as
#: (N, C, H', bs, W', bs); the permutation of that view that is the output)
_PIXEL_SHUFFLE = {("DepthToSpace", "DCR"): (0, (0, 3, 4, 1, 5, 2)), ("DepthToSpace", "CRD"): (1, (0, 1, 4, 2, 5, 3)),
                  ("SpaceToDepth", "DCR"): (2, (0, 3, 5, 1, 2, 4)), ("SpaceToDepth", "CRD"): (2, (0, 1, 3, 5, 2, 4))}


@register_kernel
class VkPixelShuffle(_TensorBase):
    """DepthToSpace / SpaceToDepth (both modes): the transpose of a 6-D view of the input, one strided copy."""

    name = "vk_pixel_shuffle"
    ops = ("DepthToSpace", "SpaceToDepth")

    def _build(self, layer: Layer, params=None, caps: Caps = Caps()) -> list[Dispatch] | None:
        from .layout import _blocksize, _mode

        n, c, h, w = layer.in_shape(0)
        bs = _blocksize(layer.node)
        view, perm = _PIXEL_SHUFFLE[(layer.op, _mode(layer.node))]
        shape6 = ((n, bs, bs, c // (bs * bs), h, w), (n, c // (bs * bs), bs, bs, h, w),
                  (n, c, h // bs, bs, w // bs, bs))[view]
        return _permuted_copy(shape6, perm, caps)


@register_kernel
class VkGatherElements(VulkanKernel):
    """GatherElements of a float tensor (``gather.comp``'s ELEMENTS variant): indices computed (int64) or constant,
    negative ones counted from the end; at most 6 dims. Constant indices are checked at load; a computed index out
    of range, which the CPU kernel refuses, is clamped to the axis on the device (it reads an edge element)."""

    name = "vk_gather_elements"
    ops = ("GatherElements",)
    io_dtypes = ("float32", "int64")

    def applies(self, layer: Layer) -> bool:
        it = layer.inputs[1]
        return (0 not in layer.const_inputs and 0 < len(layer.in_shape(0)) <= 6 and layer.outputs[0].size > 0
                and it is not None and np.dtype(it.dtype) in (np.dtype(np.int64), np.dtype(np.int32))
                and (1 in layer.const_inputs or np.dtype(it.dtype) == np.int64))

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if "in1" not in raw:
            return {}
        shape = layer.in_shape(0)
        dim = shape[_axis(layer.node, int(layer.attr("axis", 0)), len(shape))]
        idx = np.asarray(raw["in1"]).astype(np.int64)
        if idx.size and (idx.min() < -dim or idx.max() >= dim):
            raise ValueError(f"GatherElements {layer.name!r}: indices out of range [-{dim}, {dim})")
        return {"in1": np.ascontiguousarray(idx, np.int32)}

    def transformed_nbytes(self, layer: Layer) -> int:
        return 4 * layer.inputs[1].size if 1 in layer.const_inputs else 0  # type: ignore[union-attr]

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        shape = tuple(layer.in_shape(0))
        ishape = tuple(layer.in_shape(1))
        axis = _axis(layer.node, int(layer.attr("axis", 0)), len(shape))
        n = layer.outputs[0].size
        pad = 6 - len(shape)
        return [Dispatch("gather", (In(0), In(1), Out(0)), grid(n, 256, caps), {"ELEMENTS": 1},
                         push={"n": n, "rank": len(shape), "axis": axis, "L": shape[axis],
                               "istride": 1 if 1 in layer.const_inputs else 2,
                               "dims": list(ishape) + [1] * pad, "xs": contiguous_strides(shape) + [0] * pad})]
