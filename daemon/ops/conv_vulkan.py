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

CPU-type devices (lavapipe) get their own kernels, which read every operand through RGBA32F storage
texel buffer views (``shaders/texel.glsl``): llvmpipe compiles a texel load to a straight-line
gather, a storage-buffer load to a per-lane loop with a branch per lane (several times slower), and
a barrier to a coroutine switch. They never apply elsewhere (``device_priority`` 1000 off CPU-type
devices, class ``priority`` 200 for caps-less picks): ``vk_depthwise_tex`` (2, ``conv_dw_tex.comp``),
``vk_winograd43_tex`` (3, ``winograd_in_tex`` / ``gemm_tex`` / ``winograd_out_tex``),
``vk_conv1x1_tex`` (4, ``gemm_tex.comp`` on the input itself when the map holds a multiple of 4
pixels) and ``vk_gemm_tex`` (6, ``im2col_tex.comp`` into a workspace, then ``gemm_tex.comp``; any
conv but depthwise). ``gemm_tex.comp`` keeps a 16x16 register block per invocation (16 output
channels x 16 pixels) over weights packed as (G, ceil(M/16), K, 16). On the 2-core lavapipe host this
took resnet50 from 1463 to ~190 ms warm.

ConvTranspose: ``vk_direct`` (90), a gather formulation (``deconv.comp``; kernel/stride/dilation as
specialization constants).

Every kernel takes the optional bias (a zero bias is bound when absent), the fused residual (the
node's last input) and the fused activation.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..vulkan.kernel import (MAX_BINDING_BYTES, UNUSABLE_PRIORITY, Caps, Dispatch, In, Out, Param, VulkanKernel, Ws,
                             act_of, act_supported, grid, harith, split_k, use_coopmat)
from .base import Layer, raw_key, register_kernel, weights_key
from .conv import Geom2D, io_positions, layer_geom, winograd_matrices

F32 = np.float32
LOCAL = 256


def geo2d(layer: Layer) -> Geom2D | None:
    """The layer's 2-D geometry (None where it has none), once per Layer object like ``layer_geom``: a
    conv's kernels ask for it at selection, at their workspace sizing and at every dispatch list."""
    d = layer.__dict__
    if "_geo2d" in d:
        return d["_geo2d"]
    try:
        g: Geom2D | None = layer_geom(layer).as2d()
    except Exception:
        g = None
    object.__setattr__(layer, "_geo2d", g)  # Layer is frozen; the geometry is a pure function of it
    return g


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
    half_params = ("w",)

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

    def transform_key(self, layer: Layer) -> tuple[Any, ...]:
        return weights_key(layer)  # filters laid out by output/input channel and taps, never by spatial size

    def transformed_nbytes(self, layer: Layer) -> int:
        g = geo2d(layer)
        assert g is not None
        return self.wbytes(layer) * layer.inputs[1].size + 4 * g.cout  # type: ignore[union-attr]

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = geo2d(layer)
        assert g is not None
        return self.stored(layer, {"w": np.ascontiguousarray(raw[raw_key(1)], dtype=F32), "b": _bias(layer, raw, g.cout)})

    def _act_push(self, layer: Layer) -> tuple[dict, dict]:
        a = act_of(layer)
        defs = {"ACT": a[0], "RESIDUAL": _res_define(layer)}
        if self.wfp(layer):
            defs["WFP"] = self.wfp(layer)
        return defs, {"act_a": a[1], "act_b": a[2]}

    def _afp(self, layer: Layer) -> dict[str, int]:
        """The define of a GEMM shader whose A operand is this layer's (maybe fp16) weights."""
        return {"AFP": self.wfp(layer)} if self.wfp(layer) else {}


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
        return self.stored(layer, {"w": np.ascontiguousarray(w.transpose(0, 2, 1)), "b": _bias(layer, raw, g.cout)})

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
        # the matrix-unit variant keeps the 64x64 tile, bindings and split-K contract: only the shader changes
        shader = "conv_gemm_coop" if use_coopmat(layer, caps) else "conv_gemm"
        if shader == "conv_gemm":
            defs.update(harith(layer, caps))
        groups = (-(-(g.oh * g.ow) // 64), -(-mg // 64), g.n * g.group * s)
        if s == 1:
            return [Dispatch(shader, binds, groups, defs, spec, push)]
        d1 = Dispatch(shader, (In(0), Param("w"), Ws("part")), groups, dict(defs, SPLITK=1, ACT=0, RESIDUAL=0),
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
        return g is not None and g.pointwise


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


#: Workgroup size of gemm_tex.comp: lavapipe runs a workgroup's 8-lane subgroups one after another on
#: one thread, so small groups only cost launch overhead while spreading narrow products over threads.
TEX_LOCAL = 16


def tex_rn(texels: int, rn_max: int = 16) -> int:
    """Columns per invocation of gemm_tex.comp for rows of ``texels`` texels: the widest block (fewest
    gathers per FMA) that wastes at most a fifth of the row in padding (lavapipe: Winograd's 52-column
    products at 28x28 run 9.6 ms with 8-column blocks, 11.2 ms with 16)."""
    rn = rn_max
    while rn > 4:
        t = rn // 4
        if -(-texels // t) * t - texels <= texels / 5:
            break
        rn //= 2
    return rn


def tex_defines(rm: int, rn: int, act: int = 0, residual: bool | int = False, vout: bool = False,
                bias: bool = True) -> dict[str, int]:
    """gemm_tex.comp's defines: block shape and epilogue."""
    return {"RM": rm, "RN": rn, "LX": TEX_LOCAL, "ACT": act, "RESIDUAL": int(bool(residual)), "VOUT": int(vout),
            "BIAS": int(bias)}


def tex_groups(texels: int, m: int, z: int, rm: int, rn: int) -> tuple[int, int, int]:
    """Workgroup counts of gemm_tex.comp for rows of ``texels`` 4-column texels, ``m`` rows, ``z`` batches."""
    lanes = -(-texels // (rn // 4)) * -(-m // rm)
    return (-(-lanes // TEX_LOCAL), 1, z)


class _ConvTex(VkConvGemm):
    """GEMM convolution for CPU-type devices (lavapipe) through uniform texel buffers (``gemm_tex.comp``).

    Weights packed as (G, ceil(M/RM), K, RM) so that each k reads RM/4 texels; the B operand is the
    input itself (``vk_conv1x1_tex``: 1x1 stride-1 convs whose maps hold a multiple of 4 pixels) or an
    im2col workspace written by ``im2col_tex.comp`` (``vk_gemm_tex``: any other conv). On lavapipe a
    texel fetch compiles to a straight-line gather and a storage-buffer load to a per-lane loop, which
    made these 5-10x faster than ``vk_gemm_reg`` there. Only CPU-type devices create texel views
    (``device_priority`` keeps these off GPUs; the class ``priority`` keeps them off any caps-less pick).
    """

    priority = 200
    cpu_priority = 200
    # 16x16 register blocks: lavapipe, 1 thread, 256->64 1x1 at 56x56: 16x4 7.8 ms, 16x8 5.3-6.4,
    # 32x8 4.9, 16x16 4.3; past 256 accumulators LLVM spills them and it falls off a cliff (32x16: 52)
    RM = 16
    RN = 16
    direct = False

    def _geo(self, layer: Layer) -> Geom2D | None:
        g = super()._geo(layer)
        if g is None or (g.group == g.cin and g.group > 1):  # depthwise: vk_depthwise
            return None
        return g

    def applies(self, layer: Layer) -> bool:
        # every binding must fit the smallest maxStorageBufferRange (the im2col workspace grows with K x N)
        return self._geo(layer) is not None and max(self.workspace_parts(layer).values(), default=0) <= MAX_BINDING_BYTES

    def device_priority(self, caps: Caps, layer: Layer | None = None) -> int:
        return self.cpu_priority if caps.device_type == "cpu" else UNUSABLE_PRIORITY

    def transformed_nbytes(self, layer: Layer) -> int:
        g = geo2d(layer)
        assert g is not None
        mg = g.cout // g.group
        mp = -(-mg // self.RM) * self.RM
        return g.group * mp * (self.wbytes(layer) * (g.cin // g.group) * g.kh * g.kw + 4)

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = geo2d(layer)
        assert g is not None
        mg = g.cout // g.group
        mb = -(-mg // self.RM)
        w = np.asarray(raw[raw_key(1)], dtype=F32).reshape(g.group, mg, -1)
        k = w.shape[2]
        wp = np.zeros((g.group, mb * self.RM, k), F32)
        wp[:, :mg] = w
        wp = wp.reshape(g.group, mb, self.RM, k).transpose(0, 1, 3, 2)
        b = np.zeros((g.group, mb * self.RM), F32)
        b[:, :mg] = _bias(layer, raw, g.cout).reshape(g.group, mg)
        return self.stored(layer, {"w": np.ascontiguousarray(wp), "b": b.reshape(-1)})

    def _ldb4(self, g: Geom2D) -> int:
        return -(-(g.oh * g.ow) // 4)

    def workspace_parts(self, layer: Layer) -> dict[str, int]:
        if self.direct:
            return {}
        g = geo2d(layer)
        assert g is not None
        k = (g.cin // g.group) * g.kh * g.kw
        return {"B": 16 * g.n * g.group * k * self._ldb4(g)}

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        g = geo2d(layer)
        assert g is not None
        mg, cg = g.cout // g.group, g.cin // g.group
        n_pix = g.oh * g.ow
        k = cg * g.kh * g.kw
        ldb4 = self._ldb4(g)
        z = g.n * g.group
        out: list[Dispatch] = []
        if self.direct:
            b_ref, b_z4 = In(0), cg * n_pix // 4
        else:
            total = z * k * ldb4
            out.append(Dispatch("im2col_tex", (In(0), Ws("B")), grid(total, 64, caps), {},
                                {"KH": g.kh, "KW": g.kw, "SH": g.sh, "SW": g.sw, "DH": g.dh, "DW": g.dw},
                                {"total": total, "C": g.cin, "H": g.h, "W": g.w, "Cg": cg, "OH": g.oh, "OW": g.ow,
                                 "PT": g.pt, "PL": g.pl, "G": g.group, "K": k, "ldb4": ldb4}))
            b_ref, b_z4 = Ws("B"), k * ldb4
        rn = tex_rn(ldb4, self.RN)
        a = act_of(layer)
        res = _res_define(layer)
        push = {"M": mg, "N": n_pix, "K": k, "G": g.group, "ldb4": ldb4, "b_z4": b_z4, "ldc": n_pix, "c_z": mg * n_pix,
                "act_a": a[1], "act_b": a[2]}
        tail = _tail(layer)
        out.append(Dispatch("gemm_tex", (Param("w"), b_ref, Param("b"), tail[0] if res else Param("b"), tail[-1]),
                            tex_groups(ldb4, mg, z, self.RM, rn),
                            dict(tex_defines(self.RM, rn, a[0], res, n_pix % 4 == 0), **self._afp(layer)), {}, push))
        return out


@register_kernel
class VkConv1x1Tex(_ConvTex):
    name = "vk_conv1x1_tex"
    cpu_priority = 4
    direct = True

    def applies(self, layer: Layer) -> bool:
        g = self._geo(layer)
        return g is not None and g.pointwise and (g.oh * g.ow) % 4 == 0


@register_kernel
class VkGemmTex(_ConvTex):
    name = "vk_gemm_tex"
    cpu_priority = 6


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


@register_kernel
class VkConvDepthwiseTex(VkConvDepthwise):
    """``vk_depthwise`` for CPU-type devices: ``conv_dw_tex.comp``, 4 outputs of a row per invocation
    reading each input row segment once through texel views (see ``_ConvTex``)."""

    name = "vk_depthwise_tex"
    priority = 200

    def device_priority(self, caps: Caps, layer: Layer | None = None) -> int:
        return 2 if caps.device_type == "cpu" else UNUSABLE_PRIORITY

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        g = geo2d(layer)
        assert g is not None
        a = act_of(layer)
        res = _res_define(layer)
        ow4 = -(-g.ow // 4)
        total = g.n * g.cout * g.oh * ow4
        push = {"total": total, "C": g.cin, "H": g.h, "W": g.w, "K": g.cout, "OH": g.oh, "OW": g.ow, "OW4": ow4,
                "PT": g.pt, "PL": g.pl, "MULT": g.cout // g.cin, "has_res": res, "act_a": a[1], "act_b": a[2]}
        spec = {"KH": g.kh, "KW": g.kw, "SH": g.sh, "SW": g.sw, "DH": g.dh, "DW": g.dw}
        tail = _tail(layer)
        return [Dispatch("conv_dw_tex", (In(0), Param("w"), Param("b"), tail[0] if res else Param("w"), tail[-1]),
                         grid(total, 64, caps), {"ACT": a[0], **({"WFP": self.wfp(layer)} if self.wfp(layer) else {})},
                         spec, push)]


class _VkWinograd(_ConvBase):
    half_params = ("u",)
    m = 2
    points: tuple[float, ...] = (0.0, 1.0, -1.0)

    def __init__(self) -> None:
        at, gm, bt = winograd_matrices(self.m, 3, self.points)
        self.alpha = self.m + 2
        self.at64, self.g64, self.bt64 = at, gm, bt

    def applies(self, layer: Layer) -> bool:
        g = self._geo(layer)
        # the transformed weights are one binding: FCN-ResNet50's 2048->512 3x3 head at F(4x4) is 151 MB in
        # float32, past the smallest maxStorageBufferRange (lavapipe's): the warm switch then failed at recording
        return (g is not None and g.kh == g.kw == 3 and g.sh == g.sw == 1 and g.dh == g.dw == 1
                and g.group == 1 and self.transformed_nbytes(layer) <= MAX_BINDING_BYTES)

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
        return self.wbytes(layer) * a * a * g.cout * g.cin + 4 * (g.cout + a * a + self.m * a)

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
        return self.stored(layer, {"u": np.ascontiguousarray(u.reshape(self.alpha ** 2, g.cout, g.cin), dtype=F32),
                                   "b": _bias(layer, raw, g.cout), "bt": np.ascontiguousarray(self.bt64, dtype=F32),
                                   "at": np.ascontiguousarray(self.at64, dtype=F32)})

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
                        {"BIAS_MODE": 0, "RESIDUAL": 0, "ACT": 0, **self._afp(layer),
                         **({} if reg else harith(layer, caps))},
                        push={"M": g.cout, "N": t, "K": g.cin, "sa_m": g.cin, "sa_k": 1, "sb_k": t, "sb_n": 1,
                              "bd1": 1, "bd2": 1, "sa0": g.cout * g.cin, "sa1": 0, "sa2": 0, "sb0": g.cin * t,
                              "sb1": 0, "sb2": 0, "ldc": t, "c_off": 0, "alpha": 1.0, "act_a": 0.0, "act_b": 0.0,
                              **({} if reg else {"S": 1, "Kc": g.cin, "total": 0})})
        defs, push = self._act_push(layer)
        defs.pop("WFP", None)  # winograd_out reads no weights
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


def _pack_rows(w: np.ndarray, rm: int) -> np.ndarray:
    """(B, M, K) -> (B, ceil(M/rm), K, rm), zero rows past M: the A operand layout of gemm_tex.comp."""
    b, m, k = w.shape
    mb = -(-m // rm)
    wp = np.zeros((b, mb * rm, k), F32)
    wp[:, :m] = w
    return np.ascontiguousarray(wp.reshape(b, mb, rm, k).transpose(0, 1, 3, 2))


@register_kernel
class VkWinograd43Tex(VkWinograd43):
    """F(4x4,3x3) for CPU-type devices: ``winograd_in_tex`` / ``gemm_tex`` (the A*A products as one
    batched dispatch) / ``winograd_out_tex``, every operand read through texel views (see ``_ConvTex``).
    V and M rows are padded to a multiple of 4 tiles so that the GEMM reads and writes whole texels."""

    name = "vk_winograd43_tex"
    priority = 200
    RM = 16
    RN = 16

    def device_priority(self, caps: Caps, layer: Layer | None = None) -> int:
        # lavapipe (1 thread): 64->64 at 56x56 15 vs 33 ms for vk_gemm_tex, 512->512 at 7x7 7 vs 18 ms
        return 3 if caps.device_type == "cpu" else UNUSABLE_PRIORITY

    def applies(self, layer: Layer) -> bool:
        return super().applies(layer) and max(self.workspace_parts(layer).values()) <= MAX_BINDING_BYTES

    def _tp(self, g: Geom2D) -> int:
        return -(-self._tiles(g)[2] // 4) * 4

    def transformed_nbytes(self, layer: Layer) -> int:
        g = geo2d(layer)
        assert g is not None
        a = self.alpha
        mp = -(-g.cout // self.RM) * self.RM
        return self.wbytes(layer) * a * a * mp * g.cin + 4 * (g.cout + a * a + self.m * a)

    def workspace_parts(self, layer: Layer) -> dict[str, int]:
        g = geo2d(layer)
        assert g is not None
        a2 = self.alpha ** 2
        tp = self._tp(g)
        return {"V": 4 * a2 * g.cin * tp, "M": 4 * a2 * g.cout * tp}

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = geo2d(layer)
        assert g is not None
        # U = kron(G, G) w in float32 (the float64 product of the GPU variant dominated resnet50's load:
        # 0.21 s; float32 adds ~1e-7 relative error), written straight into gemm_tex's row blocks
        mb = -(-g.cout // self.RM)
        w = np.asarray(raw[raw_key(1)], dtype=F32).reshape(g.cout, g.cin, 9)
        if mb * self.RM != g.cout:
            w = np.concatenate([w, np.zeros((mb * self.RM - g.cout, g.cin, 9), F32)])
        w = w.reshape(mb, self.RM, g.cin, 9).transpose(3, 0, 2, 1).reshape(9, -1)  # (9, Mb*Cin*RM)
        u = np.kron(self.g64, self.g64).astype(F32) @ w
        return self.stored(layer, {"u": u.reshape(self.alpha ** 2, mb, g.cin, self.RM), "b": _bias(layer, raw, g.cout),
                                   "bt": np.ascontiguousarray(self.bt64, dtype=F32),
                                   "at": np.ascontiguousarray(self.at64, dtype=F32)})

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        g = geo2d(layer)
        assert g is not None
        th, tw, t = self._tiles(g)
        tp = self._tp(g)
        a2 = self.alpha ** 2
        d_in = Dispatch("winograd_in_tex", (In(0), Param("bt"), Ws("V")), grid(g.cin * tp // 4, LOCAL, caps),
                        {"MO": self.m}, push={"total": g.cin * tp // 4, "C": g.cin, "H": g.h, "W": g.w, "PT": g.pt, "PL": g.pl, "TH": th,
                              "TW": tw, "T": t, "TP": tp})
        rn = tex_rn(tp // 4, self.RN)
        d_mm = Dispatch("gemm_tex", (Param("u"), Ws("V"), Param("u"), Param("u"), Ws("M")),
                        tex_groups(tp // 4, g.cout, a2, self.RM, rn), dict(tex_defines(self.RM, rn, vout=True, bias=False), **self._afp(layer)),
                        push={"M": g.cout, "N": tp, "K": g.cin, "G": a2, "ldb4": tp // 4, "b_z4": g.cin * tp // 4,
                              "ldc": tp, "c_z": g.cout * tp, "act_a": 0.0, "act_b": 0.0})
        a = act_of(layer)
        res = _res_define(layer)
        tail = _tail(layer)
        push = {"total": g.cout * tp // 4, "K": g.cout, "OH": g.oh, "OW": g.ow, "TH": th, "TW": tw, "T": t, "TP": tp,
                "has_res": res, "act_a": a[1], "act_b": a[2]}
        d_out = Dispatch("winograd_out_tex", (Ws("M"), Param("at"), Param("b"), tail[0] if res else Ws("M"), tail[-1]),
                         grid(g.cout * tp // 4, LOCAL, caps),
                         {"MO": self.m, "ACT": a[0], "VOUT": int(self.m == 4 and g.ow % 4 == 0)}, push=push)
        return [d_in, d_mm, d_out]


@register_kernel
class VkConvTransposeDirect(_ConvBase):
    name = "vk_direct"
    ops = ("ConvTranspose",)
    half_params = ()  # deconv.comp reads fp32 weights: an fp16 layer keeps them
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

