"""Vulkan kernels for Conv and ConvTranspose (1-D and 2-D; NCHW float32).

Conv kernels, in default order (``priority``, mirroring the CPU kernels):

* ``vk_depthwise`` (5): group == Cin, Cout = mult * Cin; ``conv_dw.comp``, kernel/stride/dilation
  as specialization constants.
* ``vk_conv1x1`` (10): 1x1, stride 1, no pads: ``conv_gemm.comp`` with IS1X1 (the input is the
  GEMM's B matrix as is).
* ``vk_winograd43`` (20) / ``vk_winograd23`` (25): 3x3 stride 1 dilation 1 group 1. Weights
  transformed once on the host (U = G g G^T, (A*A, Cout, Cin)); three dispatches: input transform
  into workspace V, one batched GEMM (``matmul.comp``, A*A batches) into workspace M, output
  transform with bias/residual/activation.
* ``vk_gemm`` (40): any groups/strides/dilations/pads: implicit GEMM with shared-memory tiles
  (``conv_gemm.comp``); weights re-laid out as (G, Cin/G*KH*KW, Cout/G). When the output has few
  64x64 tiles (7x7 maps) the K range is split over workgroups (partial sums in a workspace, then
  ``splitk_reduce.comp`` with the epilogue) so a large GPU is filled.
* ``vk_gemm_reg`` (45) / ``vk_conv1x1_reg`` (15): the same GEMMs with 4x4 register blocks and no
  shared memory; the defaults on CPU-type devices (lavapipe, where barriers are coroutine switches).
* ``vk_direct`` (90): the reference, one invocation per output (``conv_direct.comp``).

On GPUs Winograd yields to ``vk_gemm`` when the map has fewer than 64 tiles (``device_priority``).

ConvTranspose: ``vk_direct`` (90), a gather formulation (``deconv.comp``; kernel/stride/dilation as
specialization constants).

Every kernel takes the optional bias (a zero bias is bound when absent), the fused residual (the
node's last input) and the fused activation.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..vulkan.kernel import (Caps, Dispatch, In, Out, Param, VulkanKernel, Ws, act_of, act_supported, grid, split_k)
from .base import Layer, raw_key, register_kernel
from .conv import Geom2D, io_positions, layer_geom, winograd_matrices

F32 = np.float32
LOCAL = 256


def geo2d(layer: Layer) -> Geom2D | None:
    try:
        return layer_geom(layer).as2d()
    except Exception:
        return None


def _bias(layer: Layer, raw: Mapping[str, np.ndarray], cout: int) -> np.ndarray:
    bi, _ = io_positions(layer.node)
    if bi is not None and raw_key(bi) in raw:
        return np.ascontiguousarray(raw[raw_key(bi)], dtype=F32).reshape(cout)
    return np.zeros(cout, F32)


def _tail(layer: Layer) -> tuple:
    """(residual binding or nothing) + output binding."""
    _, ri = io_positions(layer.node)
    return ((In(ri),) if ri is not None else ()) + (Out(0),)


def _res_define(layer: Layer) -> int:
    return int(io_positions(layer.node)[1] is not None)


class _ConvBase(VulkanKernel):
    ops = ("Conv",)

    def _geo(self, layer: Layer) -> Geom2D | None:
        if 1 not in layer.const_inputs or not act_supported(layer):
            return None
        bi, ri = io_positions(layer.node)
        if bi is not None and bi not in layer.const_inputs:
            return None
        g = geo2d(layer)
        if g is None:
            return None
        if ri is not None and tuple(layer.in_shape(ri)) != tuple(layer.out_shape()):
            return None
        return g

    def applies(self, layer: Layer) -> bool:
        return self._geo(layer) is not None

    def transformed_nbytes(self, layer: Layer) -> int:
        g = geo2d(layer)
        assert g is not None
        return 4 * (layer.inputs[1].size + g.cout)  # type: ignore[union-attr]

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = geo2d(layer)
        assert g is not None
        return {"w": np.ascontiguousarray(raw[raw_key(1)], dtype=F32), "b": _bias(layer, raw, g.cout)}

    @staticmethod
    def _act_push(layer: Layer) -> tuple[dict, dict]:
        a = act_of(layer)
        return {"ACT": a[0], "RESIDUAL": _res_define(layer)}, {"act_a": a[1], "act_b": a[2]}


@register_kernel
class VkConvDirect(_ConvBase):
    """One invocation per output element: the readable reference."""

    name = "vk_direct"
    priority = 90

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        g = geo2d(layer)
        assert g is not None
        defs, push = self._act_push(layer)
        total = g.n * g.cout * g.oh * g.ow
        push.update(total=total, C=g.cin, H=g.h, W=g.w, K=g.cout, OH=g.oh, OW=g.ow, KH=g.kh, KW=g.kw, SH=g.sh, SW=g.sw,
                    DH=g.dh, DW=g.dw, PT=g.pt, PL=g.pl, G=g.group)
        return [Dispatch("conv_direct", (In(0), Param("w"), Param("b")) + _tail(layer), grid(total, LOCAL, caps),
                         defs, push=push)]


@register_kernel
class VkConvGemm(_ConvBase):
    """Implicit GEMM with 64x64 shared-memory tiles; any conv."""

    name = "vk_gemm"
    priority = 40
    is1x1 = False
    registers = False

    def _split(self, layer: Layer) -> tuple[int, int, int]:
        """(splits, K per split, output elements): split-K for convs with few output tiles (GPU variant only)."""
        g = geo2d(layer)
        assert g is not None
        mg, cg = g.cout // g.group, g.cin // g.group
        k = cg * g.kh * g.kw
        total = g.n * g.cout * g.oh * g.ow
        if self.registers:
            return 1, k, total
        tiles = -(-(g.oh * g.ow) // 64) * -(-mg // 64) * g.n * g.group
        s, kc = split_k(tiles, k)
        return s, kc, total

    def workspace_parts(self, layer: Layer) -> dict[str, int]:
        s, _, total = self._split(layer)
        return {"part": 4 * s * total} if s > 1 else {}

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = geo2d(layer)
        assert g is not None
        mg = g.cout // g.group
        w = np.asarray(raw[raw_key(1)], dtype=F32).reshape(g.group, mg, -1)
        return {"w": np.ascontiguousarray(w.transpose(0, 2, 1)), "b": _bias(layer, raw, g.cout)}

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        g = geo2d(layer)
        assert g is not None
        defs, push = self._act_push(layer)
        defs["IS1X1"] = int(self.is1x1)
        mg, cg = g.cout // g.group, g.cin // g.group
        push.update(C=g.cin, H=g.h, W=g.w, Cg=cg, M=mg, OH=g.oh, OW=g.ow, PT=g.pt, PL=g.pl, G=g.group,
                    K=cg * g.kh * g.kw)
        spec = {} if self.is1x1 else {"KH": g.kh, "KW": g.kw, "SH": g.sh, "SW": g.sw, "DH": g.dh, "DW": g.dw}
        binds = (In(0), Param("w"), Param("b")) + _tail(layer)
        if self.registers:
            blocks = -(-(g.oh * g.ow) // 4) * -(-mg // 4)
            return [Dispatch("conv_gemm_reg", binds, (-(-blocks // 64), 1, g.n * g.group), defs, spec, push)]
        s, kc, total = self._split(layer)
        push.update(S=s, Kc=kc, total=total)
        groups = (-(-(g.oh * g.ow) // 64), -(-mg // 64), g.n * g.group * s)
        if s == 1:
            return [Dispatch("conv_gemm", binds, groups, defs, spec, push)]
        d1 = Dispatch("conv_gemm", (In(0), Param("w"), Ws("part")), groups, dict(defs, SPLITK=1, ACT=0, RESIDUAL=0),
                      spec, push)
        a = act_of(layer)
        d2 = Dispatch("splitk_reduce", (Ws("part"), Param("b")) + _tail(layer), grid(total, 256, caps),
                      {"HAS_BIAS": 1, "RESIDUAL": _res_define(layer), "ACT": a[0]},
                      push={"total": total, "S": s, "DIV": g.oh * g.ow, "MOD": g.cout, "act_a": a[1], "act_b": a[2]})
        return [d1, d2]


@register_kernel
class VkConv1x1(VkConvGemm):
    """1x1 stride-1 unpadded convs: the GEMM reads the input directly as its B matrix."""

    name = "vk_conv1x1"
    priority = 10
    is1x1 = True

    def applies(self, layer: Layer) -> bool:
        g = self._geo(layer)
        return (g is not None and g.kh == g.kw == 1 and g.sh == g.sw == 1
                and g.pt == g.pl == g.pb == g.pr == 0)


@register_kernel
class VkConvGemmReg(VkConvGemm):
    """Implicit GEMM without shared memory: 4x4 register blocks read straight from global memory.

    The default on CPU-type devices (lavapipe), where workgroup barriers are coroutine switches:
    it measured 2x faster than ``vk_gemm`` there (64->64 3x3 conv at 56x56)."""

    name = "vk_gemm_reg"
    priority = 45
    registers = True

    def device_priority(self, caps: Caps, layer: Layer | None = None) -> int:
        return 35 if caps.device_type == "cpu" else self.priority


@register_kernel
class VkConv1x1Reg(VkConv1x1):
    """``vk_conv1x1`` with register blocks instead of shared-memory tiles (CPU-type devices)."""

    name = "vk_conv1x1_reg"
    priority = 15
    registers = True

    def device_priority(self, caps: Caps, layer: Layer | None = None) -> int:
        return 8 if caps.device_type == "cpu" else self.priority


@register_kernel
class VkConvDepthwise(_ConvBase):
    name = "vk_depthwise"
    priority = 5

    def applies(self, layer: Layer) -> bool:
        g = self._geo(layer)
        return g is not None and g.group == g.cin and g.group > 1 and g.cout % g.cin == 0

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        g = geo2d(layer)
        assert g is not None
        defs, push = self._act_push(layer)
        total = g.n * g.cout * g.oh * g.ow
        push.update(total=total, C=g.cin, H=g.h, W=g.w, K=g.cout, OH=g.oh, OW=g.ow, PT=g.pt, PL=g.pl,
                    MULT=g.cout // g.cin)
        spec = {"KH": g.kh, "KW": g.kw, "SH": g.sh, "SW": g.sw, "DH": g.dh, "DW": g.dw}
        return [Dispatch("conv_dw", (In(0), Param("w"), Param("b")) + _tail(layer), grid(total, LOCAL, caps),
                         defs, spec, push)]


class _VkWinograd(_ConvBase):
    m = 2
    points: tuple[float, ...] = (0.0, 1.0, -1.0)

    def __init__(self) -> None:
        at, gm, bt = winograd_matrices(self.m, 3, self.points)
        self.alpha = self.m + 2
        self.at64, self.g64, self.bt64 = at, gm, bt

    def applies(self, layer: Layer) -> bool:
        g = self._geo(layer)
        return (g is not None and g.kh == g.kw == 3 and g.sh == g.sw == 1 and g.dh == g.dw == 1
                and g.group == 1)

    def _tiles(self, g: Geom2D) -> tuple[int, int, int]:
        th, tw = -(-g.oh // self.m), -(-g.ow // self.m)
        return th, tw, g.n * th * tw

    def device_priority(self, caps: Caps, layer: Layer | None = None) -> int:
        # On GPUs a map with few tiles (7x7 at F(4x4): 4 tiles) leaves the batched GEMM's 64-wide tiles
        # nearly empty; the split-K implicit GEMM is faster there (H200: 85 vs 40 us on resnet layer4)
        g = geo2d(layer) if layer is not None else None
        if caps.device_type != "cpu" and g is not None and self._tiles(g)[2] < 64:
            return 50
        return self.priority

    def transformed_nbytes(self, layer: Layer) -> int:
        g = geo2d(layer)
        assert g is not None
        a = self.alpha
        return 4 * (a * a * g.cout * g.cin + g.cout + a * a + self.m * a)

    def workspace_parts(self, layer: Layer) -> dict[str, int]:
        g = geo2d(layer)
        assert g is not None
        _, _, t = self._tiles(g)
        a2 = self.alpha ** 2
        return {"V": 4 * a2 * g.cin * t, "M": 4 * a2 * g.cout * t}

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = geo2d(layer)
        assert g is not None
        # U[(a,b), o, c] = sum_ij G[a,i] G[b,j] w[o,c,i,j]: one GEMM with kron(G, G) (fast, float64)
        w = np.asarray(raw[raw_key(1)], dtype=np.float64).reshape(g.cout * g.cin, 9)
        u = np.kron(self.g64, self.g64) @ w.T
        return {"u": np.ascontiguousarray(u.reshape(self.alpha ** 2, g.cout, g.cin), dtype=F32),
                "b": _bias(layer, raw, g.cout),
                "bt": np.ascontiguousarray(self.bt64, dtype=F32), "at": np.ascontiguousarray(self.at64, dtype=F32)}

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        g = geo2d(layer)
        assert g is not None
        th, tw, t = self._tiles(g)
        a2 = self.alpha ** 2
        d_in = Dispatch("winograd_in", (In(0), Param("bt"), Ws("V")), grid(g.cin * t, LOCAL, caps), {"MO": self.m},
                        push={"total": g.cin * t, "C": g.cin, "H": g.h, "W": g.w, "PT": g.pt, "PL": g.pl, "TH": th,
                              "TW": tw, "T": t})
        # M[e] (Cout x T) = U[e] (Cout x Cin) @ V[e] (Cin x T), e over the A*A positions
        # CPU Vulkan: the barrier-free register-blocked GEMM (see gemm_vulkan.VkMatMulReg)
        reg = caps.device_type == "cpu"
        d_mm = Dispatch("matmul_reg" if reg else "matmul", (Param("u"), Ws("V"), Ws("M")),
                        (-(-(-(-t // 4) * -(-g.cout // 4)) // 64), 1, a2) if reg else (-(-t // 64), -(-g.cout // 64), a2),
                        {"BIAS_MODE": 0, "RESIDUAL": 0, "ACT": 0},
                        push={"M": g.cout, "N": t, "K": g.cin, "sa_m": g.cin, "sa_k": 1, "sb_k": t, "sb_n": 1,
                              "bd1": 1, "bd2": 1, "sa0": g.cout * g.cin, "sa1": 0, "sa2": 0, "sb0": g.cin * t,
                              "sb1": 0, "sb2": 0, "ldc": t, "c_off": 0, "alpha": 1.0, "act_a": 0.0, "act_b": 0.0,
                              **({} if reg else {"S": 1, "Kc": g.cin, "total": 0})})
        defs, push = self._act_push(layer)
        defs["MO"] = self.m
        push.update(total=g.cout * t, K=g.cout, OH=g.oh, OW=g.ow, TH=th, TW=tw, T=t)
        d_out = Dispatch("winograd_out", (Ws("M"), Param("at"), Param("b")) + _tail(layer),
                         grid(g.cout * t, LOCAL, caps), defs, push=push)
        return [d_in, d_mm, d_out]


@register_kernel
class VkWinograd23(_VkWinograd):
    name = "vk_winograd23"
    priority = 25
    m = 2
    points = (0.0, 1.0, -1.0)


@register_kernel
class VkWinograd43(_VkWinograd):
    """F(4x4,3x3) with points 0, +-1, +-1/2 (as the CPU kernel: better conditioned in float32)."""

    name = "vk_winograd43"
    priority = 20
    m = 4
    points = (0.0, 1.0, -1.0, 0.5, -0.5)


@register_kernel
class VkConvTransposeDirect(_ConvBase):
    name = "vk_direct"
    ops = ("ConvTranspose",)
    priority = 90

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        g = geo2d(layer)
        assert g is not None
        defs, push = self._act_push(layer)
        total = g.n * g.cout * g.oh * g.ow
        push.update(total=total, C=g.cin, H=g.h, W=g.w, K=g.cout, OH=g.oh, OW=g.ow, PT=g.pt, PL=g.pl, G=g.group)
        spec = {"KH": g.kh, "KW": g.kw, "SH": g.sh, "SW": g.sw, "DH": g.dh, "DW": g.dw}
        return [Dispatch("deconv", (In(0), Param("w"), Param("b")) + _tail(layer), grid(total, LOCAL, caps),
                         defs, spec, push)]

