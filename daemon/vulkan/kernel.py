"""The Vulkan kernel contract: a ``Kernel`` whose work is a list of compute dispatches.

Like CPU kernels, a ``VulkanKernel`` declares ``applies``, a pure host-side ``transform`` of the
raw constants (e.g. Winograd-domain or transposed weights; done once at load), its
``transformed_nbytes`` and its ``workspace_nbytes``, so the planners treat CPU and GPU kernels
alike. Instead of ``run`` it describes ``dispatches(layer, params, caps)``: for each dispatch the shader
(``shaders/<name>.comp``), its ``#define``s (fused activation, op selector, tile sizes),
specialization constants (structural plan-time values such as kernel size and stride: each distinct
set is a distinct pipeline, so tensor sizes go in push constants instead, keeping the number of
pipelines per model, and so the cold compile cost, small), push constants by name, the descriptor
bindings in binding order, and the workgroup counts. The executor records these once.

This module imports no Vulkan: planners may use Vulkan kernels on machines without a GPU.
"""
from __future__ import annotations

import re

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from ..ops.base import Kernel, Layer

#: Sub-allocation alignment of workspace parts and parameter arrays: the largest
#: minStorageBufferOffsetAlignment the spec allows, so layouts do not depend on the device.
ALIGN = 256
#: The smallest maxStorageBufferRange the spec allows (2^27): weights larger than this are split so
#: that every binding fits on every conformant device (lavapipe's limit is exactly this).
MAX_BINDING_BYTES = 1 << 27

#: ``device_priority`` at or above which a kernel is not usable on the device (texel kernels off CPU-type devices,
#: the int8 kernels on them).
UNUSABLE_PRIORITY = 1000

#: Fused-activation ids, as in shaders/act.glsl.
ACT_IDS = {None: 0, "Relu": 1, "LeakyRelu": 2, "Clip": 3, "Sigmoid": 4, "HardSigmoid": 5, "HardSwish": 6,
           "Tanh": 7, "SiLU": 8, "Gelu": 9, "GeluTanh": 10, "Softplus": 11, "QuickGelu": 12}


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


# Ref and Dispatch: slotted, hashable and not frozen. A frozen dataclass's __init__ stores each field through
# object.__setattr__: a Dispatch with its Refs cost ~6 us to build, ~3.5x this, and every layer's dispatch list
# is built at each cold load's prepare and at each of the predictor's whole-model predictions. Nothing changes
# one after it is made (``dataclasses.replace`` makes a new one).
@dataclass(unsafe_hash=True, slots=True)
class Ref:
    """What a descriptor binding points at.

    kind: "in" (node input ``key``; a constant input binds its raw array), "out" (node output ``key``),
    "param" (array ``key`` of the kernel's transform), "ws" (workspace part ``key``).
    ``offset``/``size`` (bytes) select a sub-range (``size=None``: to the end).
    """

    kind: str
    key: int | str
    offset: int = 0
    size: int | None = None


def In(i: int, offset: int = 0, size: int | None = None) -> Ref:
    return Ref("in", i, offset, size)


def Out(i: int = 0, offset: int = 0, size: int | None = None) -> Ref:
    return Ref("out", i, offset, size)


def Param(key: str, offset: int = 0, size: int | None = None) -> Ref:
    return Ref("param", key, offset, size)


def Ws(key: str, offset: int = 0, size: int | None = None) -> Ref:
    return Ref("ws", key, offset, size)


@dataclass(unsafe_hash=True, slots=True)
class Dispatch:
    shader: str
    bindings: tuple[Ref, ...]
    groups: tuple[int, int, int]
    defines: Mapping[str, Any] = field(default_factory=dict)
    spec: Mapping[str, Any] = field(default_factory=dict)
    push: Mapping[str, Any] = field(default_factory=dict)
    #: True when this dispatch writes only elements that no earlier dispatch of the same layer wrote or
    #: read, and reads nothing they wrote (e.g. the parts of a Concat): no barrier between them.
    independent: bool = False


@dataclass(frozen=True)
class Caps:
    """Device facts a kernel may plan with (a subset of ``device.DeviceCaps``; defaults fit any GPU)."""

    subgroup_size: int = 32
    max_shared_bytes: int = 16384
    max_workgroup_invocations: int = 128
    max_workgroup_count: tuple[int, int, int] = (65535, 65535, 65535)
    vendor_id: int = 0
    #: "discrete", "integrated", "virtual", "cpu" (lavapipe) or "other"
    device_type: str = "discrete"
    #: the device runs conv_gemm_coop.comp (features.py's cooperativeMatrixNV)
    coopmat: bool = False
    #: packed 4x8-bit integer dot products (features.py): 0 none, 1 available, 2 accelerated on a trusted driver
    int_dot: int = 0


#: Node attribute the Vulkan backend sets on a layer its precision plan runs with fp16 weights: the
#: storage mode of common.glsl's WBUF (1: float16_t in 16-bit storage buffers, 2: pairs packed in a
#: uint). Absent or 0: fp32. Kernels read it through ``VulkanKernel.wfp``, never a global switch.
WFP_ATTR = "_wfp"


#: Node attribute set (1) on a layer whose plan allows fp16 arithmetic (``shaderFloat16``): the shared-memory
#: GEMM shaders (conv_gemm, matmul) then build with HARITH (fp16 tiles, fp16 sums per K tile into fp32).
HFP_ATTR = "_hfp"


def layer_wfp(layer: Layer) -> int:
    return int(layer.attr(WFP_ATTR, 0) or 0)


def harith(layer: Layer, caps: "Caps") -> dict[str, int]:
    """The HARITH define (fp16 tile sums) of a shared-memory GEMM dispatch for this layer ({} for fp32 arithmetic).
    Not on a device with matrix units (``Caps.coopmat``): there a layer's fp16 arithmetic is the cooperative-matrix
    shader where it has one, and fp32 elsewhere, since the packed fp16 tile sums ran slower than fp32 on NVIDIA's
    H100 and H200 (vgg16's Winograd GEMMs, ``matmul``: 0.63 -> 0.77 ms on both, batch 1;
    bench/results/2026-12-05_precision_h200b_profile.txt)."""
    return {"HARITH": 1} if layer.attr(HFP_ATTR, 0) and not caps.coopmat else {}


def int_dot_level(features: Mapping[str, bool]) -> int:
    """``Caps.int_dot`` from the device's features: 2 accelerated (and trusted), 1 present, 0 absent. Accelerated
    counts only with the feature itself on: a mask that hides ``shaderIntegerDotProduct`` leaves the device
    created without it, whatever the properties said."""
    if not features.get("shaderIntegerDotProduct"):
        return 0
    return 2 if features.get("integerDotProduct4x8Accelerated") else 1


def use_coopmat(layer: Layer, caps: Caps) -> bool:
    """Whether this layer's shared-memory GEMM runs on the matrix units: its plan allows fp16 arithmetic
    and the device has the cooperative-matrix shape with 32-wide subgroups (the shader's layout)."""
    return bool(layer.attr(HFP_ATTR, 0)) and caps.coopmat and caps.subgroup_size == 32


class VulkanKernel(Kernel):
    backend: ClassVar[str] = "vulkan"
    #: dtypes this kernel reads or writes in device buffers (tensors are float32 unless a kernel says
    #: otherwise: int64 is stored as 8 bytes and written as (low word, 0); bool as one byte)
    io_dtypes: ClassVar[tuple[str, ...]] = ("float32",)
    #: the params this kernel can read as fp16 (its shaders take the WFP/AFP/BFP defines); a kernel
    #: without any keeps fp32 weights on an fp16 layer
    half_params: ClassVar[tuple[str, ...]] = ()

    def wfp(self, layer: Layer) -> int:
        """The weights' storage mode for this layer with this kernel (0: fp32)."""
        return layer_wfp(layer) if self.half_params else 0

    def wbytes(self, layer: Layer) -> int:
        """Bytes per stored weight element."""
        return 2 if self.wfp(layer) else 4

    def stored(self, layer: Layer, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``params`` with the half-able weights in fp16 where the layer runs so (the end of ``transform``)."""
        if not self.wfp(layer):
            return params
        return {k: (np.ascontiguousarray(v, dtype=np.float16) if k in self.half_params and v.dtype == np.float32
                    else v) for k, v in params.items()}

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Default: float constants as float32, bool as bytes, other integers as int32."""
        def conv(v: np.ndarray) -> np.ndarray:
            if np.issubdtype(v.dtype, np.floating):
                return np.ascontiguousarray(v, dtype=np.float32)
            if v.dtype == np.bool_:
                return np.ascontiguousarray(v).view(np.uint8)
            return np.ascontiguousarray(v, dtype=np.int32)
        return {k: conv(v) for k, v in raw.items()}

    def transformed_nbytes(self, layer: Layer) -> int:
        # default transform: every constant becomes a 4-byte float32/int32 array
        return sum(4 * layer.inputs[k].size for k in layer.const_inputs if layer.inputs[k] is not None)

    def device_priority(self, caps: Caps, layer: Layer | None = None) -> int:
        """``priority`` on this kind of device for this layer (the executor's default pick is the lowest
        that applies)."""
        return self.priority

    def refuses(self, layer: Layer, consts: Mapping[str, Any]) -> str | None:
        """Why this kernel cannot run ``layer`` given its constant inputs' values (``consts``: name -> array),
        which ``applies`` does not see (axes given as an input); None when it can. The backend then places
        the node where a kernel takes it (the CPU), as it does for dtypes no Vulkan kernel handles."""
        return None

    def workspace_parts(self, layer: Layer) -> dict[str, int]:
        """Named scratch buffers (bytes) live only during this layer's dispatches."""
        return {}

    def workspace_nbytes(self, layer: Layer) -> int:
        parts = self.workspace_parts(layer)
        # most layers have none: the generator and sum cost more than the test (a whole-model prediction asks
        # each unit twice)
        return sum(align_up(n) for n in parts.values()) if parts else 0

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        """The compute work for this layer; ``params`` is what ``transform`` returned (values may set push constants)."""
        raise NotImplementedError

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        raise NotImplementedError(f"{self!r} runs on a Vulkan device: build an inferd.vulkan.executor.VulkanModel")


# ------------------------------------------------------------------------------------------------
# helpers shared by the host bindings
# ------------------------------------------------------------------------------------------------

def act_of(layer: Layer) -> tuple[int, float, float]:
    """(ACT define id, act_a, act_b) for the layer's fused activation attrs["act"]."""
    act = layer.attr("act")
    if act is None:
        return 0, 0.0, 0.0
    name, p = act[0], tuple(act[1]) if len(act) > 1 and act[1] is not None else ()
    if name == "Gelu" and p and float(p[0]) == 1.0:
        name = "GeluTanh"
    if name not in ACT_IDS:
        raise ValueError(f"unknown fused activation {name!r}")
    a = float(p[0]) if len(p) > 0 else 0.0
    b = float(p[1]) if len(p) > 1 else 0.0
    if name == "LeakyRelu" and not p:
        a = 0.01
    if name == "HardSigmoid" and not p:
        a, b = 0.2, 0.5
    if name == "Clip":
        a = -math.inf if not p or p[0] is None else float(p[0])
        b = math.inf if len(p) < 2 or p[1] is None else float(p[1])
    return ACT_IDS[name], a, b


def act_supported(layer: Layer) -> bool:
    act = layer.attr("act")
    return act is None or act[0] in ACT_IDS or act[0] == "Gelu"


def grid(n: int, local: int, caps: Caps) -> tuple[int, int, int]:
    """Workgroup counts covering ``n`` invocations of ``local`` threads, 2-D when x would exceed the limit.

    Shaders recover the linear id with ``gid()`` from common.glsl.
    """
    groups = max(1, -(-n // local))
    maxx = caps.max_workgroup_count[0]
    if groups <= maxx:
        return (groups, 1, 1)
    return (maxx, -(-groups // maxx), 1)


_LOCAL_X = re.compile(r"layout\s*\(\s*local_size_x\s*=\s*(\d+)")
_local_x: dict[str, int | None] = {}


def _shader_local_x(shader: str) -> int | None:
    """The literal ``local_size_x`` of a shader that uses ``gid()`` (None: not splittable)."""
    if shader not in _local_x:
        from .shaders import shader_dir

        try:
            src = (shader_dir() / f"{shader}.comp").read_text()
        except OSError:
            src = ""
        m = _LOCAL_X.search(src)
        _local_x[shader] = int(m.group(1)) if m and "gid()" in src else None
    return _local_x[shader]


def split_rows(ds: Sequence[Dispatch], caps: Caps) -> list[Dispatch]:
    """Every 2-D grid made by :func:`grid` as 1-D dispatches of at most ``maxComputeWorkGroupCount[0]``
    groups, each starting at its ``GID_BASE`` (see common.glsl: lavapipe runs rows y >= 1 only in part)."""
    maxx = caps.max_workgroup_count[0]
    out: list[Dispatch] = []
    for d in ds:
        gx, gy, gz = d.groups
        local = _shader_local_x(d.shader) if gy > 1 and gz == 1 and gx == maxx else None
        if local is None:
            out.append(d)
            continue
        for row in range(gy):
            out.append(replace(d, groups=(maxx, 1, 1), spec={**d.spec, "GID_BASE": row * maxx * local}))
    return out


def collapse(shape: Sequence[int], *strides: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """Merge adjacent dims that are contiguous in every stride set (fewer dims for the index math).

    Dims of size 1 are dropped. Returns (dims, [strides per set]), outermost first.
    """
    dims: list[int] = []
    sts: list[list[int]] = [[] for _ in strides]
    for d in range(len(shape)):
        if shape[d] == 1:
            continue
        if dims and all(sts[k][-1] == strides[k][d] * shape[d] for k in range(len(strides))):
            dims[-1] *= shape[d]
            for k in range(len(strides)):
                sts[k][-1] = strides[k][d]
            continue
        dims.append(int(shape[d]))
        for k in range(len(strides)):
            sts[k].append(int(strides[k][d]))
    if not dims:
        dims = [1]
        sts = [[1] for _ in strides]
    return dims, sts


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    st = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        st[d] = st[d + 1] * int(shape[d + 1])
    return st


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> list[int]:
    """Element strides of a contiguous ``shape`` read at ``out_shape`` positions (0 on broadcast dims)."""
    shape = [1] * (len(out_shape) - len(shape)) + list(shape)
    st = contiguous_strides(shape)
    return [0 if s == 1 and o != 1 else st[d] for d, (s, o) in enumerate(zip(shape, out_shape))]


#: Workgroups a split-K GEMM aims for: enough to fill a large GPU (132 SMs on an H100) twice.
SPLIT_TARGET = 256


def split_k(tiles: int, k: int, min_chunk: int = 128, max_splits: int = 32) -> tuple[int, int]:
    """(splits, K per split) so that ``tiles`` output tiles times the splits approach SPLIT_TARGET
    workgroups; (1, k) when the GEMM already has enough tiles or too short a K to split."""
    if tiles >= SPLIT_TARGET or k < 2 * min_chunk:
        return 1, k
    s = min(-(-SPLIT_TARGET // tiles), k // min_chunk, max_splits)
    if s <= 1:
        return 1, k
    kc = -(-k // s)
    kc = -(-kc // 16) * 16  # whole K tiles per split
    return -(-k // kc), kc
