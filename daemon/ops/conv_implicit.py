"""Conv by an implicit-im2col GEMM: the native GEMM gathers its column blocks straight from the (zero-padded)
input through offset tables, so the column matrix im2col writes and the GEMM reads back (K x OH*OW floats, 1.7 MB
for squeezenet's 16->64 3x3 on 55x55) is never stored; each block is gathered into the GEMM's L2-sized packing
buffer instead. Any kernel size, stride, dilation and padding, group 1.

Kept beside ``im2col``, after it (priority 45 > 40): on the 2-core Zen 4 with two threads im2col was faster on every
shape tried (one copy, parallel, then B read in place; here each task gathers its own column blocks, and a strided
gather does not vectorise): 128->128 3x3 s2 on 56x56 1.35 vs 1.84 ms, 64->64 on 56x56 1.41 vs 1.53; on one thread it
won on big maps (64->64 on 56x56 2.7 vs 3.6 ms). So it is a candidate the planner takes where it measured faster,
and it needs no column-matrix workspace (7 MB for that 56x56 layer), never the default.
"""
from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np

from .. import native
from .base import ContiguousOut, Layer, raw_key, register_kernel
from .conv import (A_FORM, F32, GEMM_A_WEIGHTS, Geom2D, _bias_param, _ConvKernelBase, _finish, _geo2d, _passthrough,
                   _res_per_image, layer_geom, pack_gemm_weights, packed_nbytes, scratch)

#: scratch slot of the zero-padded input (im2col and Winograd use 0-2)
_PAD_SLOT = 3

_OFFS: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
_OFFS_LOCK = threading.Lock()


def _offsets(g: Geom2D, hp: int, wp: int) -> tuple[np.ndarray, np.ndarray]:
    """(row offsets (cin*kh*kw,), column offsets (oh*ow,)) into a (cin, hp, wp) plane stack, int64, cached per
    geometry: row (c, i, j) starts at tap (i, j) of plane c, column (oh, ow) at the window's origin."""
    key = (g.cin, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.oh, g.ow, hp, wp)
    hit = _OFFS.get(key)
    if hit is None:
        c = np.arange(g.cin, dtype=np.int64)[:, None, None] * (hp * wp)
        i = np.arange(g.kh, dtype=np.int64)[None, :, None] * (g.dh * wp)
        j = np.arange(g.kw, dtype=np.int64)[None, None, :] * g.dw
        boff = np.ascontiguousarray((c + i + j).reshape(-1))
        oh = np.arange(g.oh, dtype=np.int64)[:, None] * (g.sh * wp)
        ow = np.arange(g.ow, dtype=np.int64)[None, :] * g.sw
        coff = np.ascontiguousarray((oh + ow).reshape(-1))
        hit = (boff, coff)
        with _OFFS_LOCK:
            if len(_OFFS) > 1024:
                _OFFS.clear()
            _OFFS[key] = hit
    return hit


def _padded(g: Geom2D) -> tuple[int, int, bool]:
    """(rows, columns) of the input plane the offsets index, and whether it is a padded copy."""
    padded = bool(g.pt or g.pl or g.pb or g.pr)
    return g.h + g.pt + g.pb, g.w + g.pl + g.pr, padded


@register_kernel
class ConvImplicitGemm(_ConvKernelBase):
    """W (Cout, Cin*kh*kw) @ col on the native GEMM with col gathered block by block from the input (see the module
    docstring); bias, a same-shape residual and a native activation in the GEMM's store. Workspace: the
    zero-padded input of one image (none without padding)."""

    name = "implicit"
    ops = ("Conv",)
    priority = 45
    weights_form = GEMM_A_WEIGHTS

    def applies(self, layer: Layer) -> bool:
        g = self._base_applies(layer)
        # the Cin < 8 stems stay with im2col (few rows to gather per column: the gather costs what the GEMM does)
        return (g is not None and g.group == 1 and g.cin >= 8 and min(g.pt, g.pl, g.pb, g.pr) >= 0
                and not g.unpadded_1x1)

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = layer_geom(layer)
        w3 = np.asarray(raw[raw_key(1)], dtype=F32).reshape(1, g.cout, -1)
        return {**_passthrough(layer, raw), "w": pack_gemm_weights(w3, A_FORM), **_bias_param(layer, raw)}

    def _w_nbytes(self, layer: Layer) -> int:
        g = layer_geom(layer)
        return packed_nbytes(1, g.cout, layer.inputs[1].size // g.cout, A_FORM)  # type: ignore[union-attr]

    def workspace_nbytes(self, layer: Layer) -> int:
        return sum(self.scratch_floats(layer).values()) * 4

    def scratch_floats(self, layer: Layer) -> dict[int, int]:
        g = _geo2d(layer)
        assert g is not None
        hp, wp, padded = _padded(g)
        return {_PAD_SLOT: g.cin * hp * wp} if padded else {}

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        g = _geo2d(layer)
        assert g is not None
        x, bias, res, act = self._common(layer, inputs, params)
        o = ContiguousOut(outputs[0])
        hp, wp, padded = _padded(g)
        boff, coff = _offsets(g, hp, wp)
        npix = g.oh * g.ow
        x4 = x.reshape(g.n, g.cin, g.h, g.w)
        y3 = o.y.reshape(g.n, g.cout, npix)
        r3 = _res_per_image(res, o.y.shape, (g.n, g.cout, npix))
        nat = act is None or act[0] in native.NATIVE_ACTS
        fuse = nat and (res is None or r3 is not None)  # otherwise bias/residual/activation after the GEMM
        xp = scratch(_PAD_SLOT, g.cin * hp * wp).reshape(g.cin, hp, wp) if padded else None
        for i in range(g.n):
            if xp is not None:
                # the borders every time: the slot is shared with other layers' pads
                xp[:, : g.pt] = 0.0
                xp[:, g.pt + g.h:] = 0.0
                xp[:, g.pt: g.pt + g.h, : g.pl] = 0.0
                xp[:, g.pt: g.pt + g.h, g.pl + g.w:] = 0.0
                xp[:, g.pt: g.pt + g.h, g.pl: g.pl + g.w] = x4[i]
                src: Any = xp.reshape(-1)
            else:
                src = x4[i].reshape(-1)
            native.gemm_koff(params["w"][0], g.cout, src, boff, coff, y3[i], bias if fuse else None,
                             r3[i] if fuse and r3 is not None else None, act if fuse else None)
        if not fuse:
            _finish(o.y.reshape(g.n, g.cout, -1), bias, res, act)
        o.close()
