"""Splitting one Conv, Gemm or MatMul by output channels into two parts over one output tensor.

A split at ``g`` gives the GPU channels [0, g) and the CPU channels [g, C). The GPU takes the leading
channels because a Vulkan binding must start at a ``minStorageBufferOffsetAlignment`` boundary: the GPU
part's output (and, for grouped convolutions, its input) then begins where the whole tensor begins, and
the CPU part, which reads and writes numpy views at any byte offset, takes the tail. (The issue states the
split as CPU [0, c), GPU [c, C); which side takes the head changes nothing else.)

Each part is an ordinary node of the same op over sliced constants, so every kernel of either backend runs
it unchanged: its tensors are named ``<tensor>#gpu`` / ``<tensor>#cpu`` and :class:`Part.views` says where
each lies inside the whole tensor (a byte offset; or a column block of a row-major matrix, for Gemm/MatMul
with several rows, which the GPU writes through its ``ldc`` push constant and the CPU through a strided
view).

Pure: no Vulkan, no timing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..ir import Node, TensorInfo
from ..ops.base import Layer
from ..ops.conv import io_positions
from ..ops.gemm import _gemm_c_index, _residual_index

#: the ops a layer may be split in
SPLIT_OPS = ("Conv", "Gemm", "MatMul")


@dataclass(frozen=True)
class SplitShape:
    """How a layer splits: ``channels`` output channels, split points multiples of ``unit`` (a grouped
    convolution splits at group boundaries), ``rows`` > 1 when a channel block is strided in memory (a
    Gemm/MatMul output [rows, channels]), ``inner`` elements per channel in a contiguous block otherwise."""

    op: str
    channels: int
    unit: int
    rows: int = 1
    inner: int = 1

    def points(self) -> list[int]:
        """Every admissible split point g (GPU channels), 0 and ``channels`` included."""
        return list(range(0, self.channels + 1, self.unit))

    def snap(self, g: int) -> int:
        """``g`` rounded to the nearest admissible split point."""
        g = int(round(g / self.unit)) * self.unit
        return max(0, min(self.channels, g))


def split_shape(layer: Layer) -> SplitShape | None:
    """How ``layer`` splits by output channels, or None when it cannot (another op, a batch above 1 in a
    convolution, weights that are not constants, a batched weight matrix, a full (M, N) Gemm bias)."""
    node = layer.node
    if node.op not in SPLIT_OPS or not layer.outputs:
        return None
    out = layer.outputs[0]
    if np.dtype(out.dtype) != np.float32:
        return None
    if node.op == "Conv":
        if 1 not in layer.const_inputs or len(out.shape) < 3 or out.shape[0] != 1:
            return None
        bias, _res = io_positions(node)
        if bias is not None and bias not in layer.const_inputs:
            return None
        c = int(out.shape[1])
        group = int(node.attr("group", 1))
        if group < 1 or c % group:
            return None
        unit = c // group if group > 1 else 1  # a grouped convolution splits at group boundaries
        return SplitShape("Conv", c, unit, 1, int(np.prod(out.shape[2:], dtype=np.int64)))
    # Gemm / MatMul: B must be a constant matrix (no batch), the output [..., M, N]
    if 1 not in layer.const_inputs or len(layer.in_shape(1)) != 2 or len(out.shape) < 2:
        return None
    ci = _gemm_c_index(node)
    if ci is not None:
        if ci not in layer.const_inputs:
            return None
        cs = tuple(layer.in_shape(ci))
        rows_of_c = int(np.prod(cs[:-1], dtype=np.int64)) if len(cs) > 1 else 1
        if rows_of_c > 1:
            return None  # a per-row or full bias: not split (rare; the kernels index it by the whole row)
    n = int(out.shape[-1])
    rows = int(np.prod(out.shape[:-1], dtype=np.int64))
    return SplitShape(node.op, n, 1, rows, 1)


@dataclass(frozen=True)
class View:
    """Where a part's tensor lies in the whole one: ``parent`` at byte ``offset`` (contiguous), or, when
    ``cols`` is set, the column block [col0, col0 + cols) of ``parent`` seen as [rows, parent_cols]."""

    parent: str
    offset: int = 0
    col0: int = 0
    cols: int = 0
    parent_cols: int = 0

    @property
    def strided(self) -> bool:
        return self.cols > 0 and self.parent_cols != self.cols


@dataclass
class Part:
    """One side of a split layer: a node over sliced constants, its tensors' infos, and the views."""

    side: str
    node: Node
    lo: int
    hi: int
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    infos: dict[str, TensorInfo] = field(default_factory=dict)
    views: dict[str, View] = field(default_factory=dict)

    def layer(self, base_infos: Mapping[str, TensorInfo], base_consts: Mapping[str, Any]) -> Layer:
        node = self.node

        def info(n: str) -> TensorInfo | None:
            return self.infos.get(n) or base_infos.get(n)
        ins = tuple(info(i) if i else None for i in node.inputs)
        outs = tuple(info(o) for o in node.outputs if o)
        consts = tuple(k for k, i in enumerate(node.inputs) if i and (i in self.constants or i in base_consts))
        return Layer(node, ins, outs, consts)  # type: ignore[arg-type]


def _sub(name: str, side: str) -> str:
    return f"{name}#{side}"


def _split_residual(part: Part, layer: Layer, ins: list[str], pos: int, side: str, yshape: tuple[int, ...],
                    view: View) -> None:
    """Input ``pos`` (a residual added in the store) read as ``view``: this part's slice of the full residual."""
    r = ins[pos]
    info = layer.inputs[pos]
    assert info is not None
    if tuple(info.shape) != tuple(layer.outputs[0].shape):
        raise ValueError(f"node {layer.node.name}: a broadcast residual is not split")
    part.infos[_sub(r, side)] = TensorInfo(_sub(r, side), yshape, info.dtype)
    part.views[_sub(r, side)] = view
    ins[pos] = _sub(r, side)


def make_part(layer: Layer, consts: Mapping[str, Any], lo: int, hi: int, side: str) -> Part:
    """The node computing output channels [lo, hi) of ``layer`` (``split_shape`` must accept it)."""
    sh = split_shape(layer)
    assert sh is not None and 0 <= lo < hi <= sh.channels and lo % sh.unit == 0 and hi % sh.unit == 0
    node = layer.node
    ins = list(node.inputs)
    attrs = dict(node.attrs)
    part = Part(side, node, lo, hi)
    y = node.outputs[0]
    yi = layer.outputs[0]
    F = 4
    if node.op == "Conv":
        inner = sh.inner
        yshape = (1, hi - lo) + tuple(yi.shape[2:])
        part.infos[_sub(y, side)] = TensorInfo(_sub(y, side), yshape, yi.dtype)
        part.views[_sub(y, side)] = View(y, lo * inner * F)
        w = np.asarray(consts[ins[1]])
        group = int(node.attr("group", 1))
        if group > 1:
            # grouped: the part is the groups [lo/unit, hi/unit) over their input channels
            cin_g = w.shape[1]
            g0, g1 = lo // sh.unit, hi // sh.unit
            x = ins[0]
            xi = layer.inputs[0]
            assert xi is not None
            xinner = int(np.prod(xi.shape[2:], dtype=np.int64))
            xs = (1, (g1 - g0) * cin_g) + tuple(xi.shape[2:])
            part.infos[_sub(x, side)] = TensorInfo(_sub(x, side), xs, xi.dtype)
            part.views[_sub(x, side)] = View(x, g0 * cin_g * xinner * F)
            ins[0] = _sub(x, side)
            attrs["group"] = g1 - g0
        wn = _sub(ins[1], side)
        part.constants[wn] = np.ascontiguousarray(w[lo:hi])
        ins[1] = wn
        bias, res = io_positions(node)
        if bias is not None:
            bn = _sub(ins[bias], side)
            part.constants[bn] = np.ascontiguousarray(np.asarray(consts[ins[bias]])[lo:hi])
            ins[bias] = bn
        if res is not None:
            _split_residual(part, layer, ins, res, side, yshape, View(ins[res], lo * inner * F))
    else:
        n = sh.channels
        yshape = tuple(yi.shape[:-1]) + (hi - lo,)
        part.infos[_sub(y, side)] = TensorInfo(_sub(y, side), yshape, yi.dtype)
        part.views[_sub(y, side)] = View(y, lo * F, lo, hi - lo, n)
        b = np.asarray(consts[ins[1]])
        tb = node.op == "Gemm" and int(node.attr("transB", 0))
        bn = _sub(ins[1], side)
        part.constants[bn] = np.ascontiguousarray(b[lo:hi] if tb else b[:, lo:hi])
        ins[1] = bn
        ci = _gemm_c_index(node)
        if ci is not None:
            c = np.asarray(consts[ins[ci]])
            cn = _sub(ins[ci], side)
            part.constants[cn] = np.ascontiguousarray(c[..., lo:hi]) if c.ndim and c.shape[-1] == n else c
            ins[ci] = cn
        ri = _residual_index(node)
        if ri is not None:
            _split_residual(part, layer, ins, ri, side, yshape, View(ins[ri], lo * F, lo, hi - lo, n))
    for cn, ca in part.constants.items():
        part.infos[cn] = TensorInfo(cn, tuple(ca.shape), ca.dtype)
    outs = [_sub(y, side)] + [o for o in node.outputs[1:]]
    part.node = Node(f"{node.name}#{side}", node.op, ins, outs, attrs, node.domain)
    return part
