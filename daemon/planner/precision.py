"""The precision planner: which representation each layer's weights take, from the device's facts.

Pure: the requested precision, the backend, the device features (as the driver reported them, less any
masked) and per-layer weight facts in; a frozen :class:`PrecisionPlan` out. The Vulkan backend marks
each fp16 layer from the plan (``inferd.vulkan.kernel.WFP_ATTR``); kernels read that, never a flag.

What fp16 means here: weights stored and read in fp16 (half the bytes in the package, in device memory
and in the shaders' weight loads); activations stay fp32 in memory; with ``shaderFloat16`` the
shared-memory GEMM kernels (the GPU's conv_gemm and matmul) hold their tiles in fp16 and sum each
16-deep K tile in fp16 into fp32 accumulators, other kernels compute in fp32. Storage:
  "fp16"   16-bit storage buffers (``storageBuffer16BitAccess``): ``float16_t`` loads;
  "packed" two halves per uint, ``unpackHalf2x16`` (core GLSL: any device, the fallback);
texel-buffer kernels (CPU-type devices) read fp16 through RGBA16F views either way. A layer stays fp32
when listed in ``fp32_layers`` (the per-layer override, like ncnn's layer feature mask) or, with
``guard``, when its weights do not fit fp16 (magnitude beyond 65504: they would become inf; all below
2^-13: subnormal, fewer significant bits than fp16 has).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

PRECISIONS = ("fp32", "fp16", "auto")
#: ops whose Vulkan kernels can read fp16 weights: the layers an fp16 plan marks (others keep fp32 weights)
VULKAN_HALF_OPS = ("Conv", "Gemm", "MatMul")
#: largest finite fp16
FP16_MAX = 65504.0
#: weights whose largest magnitude is below this are subnormal in fp16 (normal from 2^-14), keeping fewer than
#: fp16's 11 significant bits even for the largest of them
FP16_TINY = 2.0 ** -13


@dataclass(frozen=True)
class LayerFacts:
    """What the planner needs of one layer: its name, whether it has float weights, their largest magnitude."""

    name: str
    weight_bytes: int
    absmax: float = 0.0


@dataclass(frozen=True)
class PrecisionPlan:
    requested: str
    #: what the model runs at: "fp32" or "fp16"
    precision: str
    #: how fp16 weights are stored on the device: "fp32" (none), "fp16" (16-bit storage) or "packed"
    storage: str
    #: arithmetic: "fp32", or "fp16" (``shaderFloat16``: the shared-memory GEMM kernels sum each K tile in
    #: fp16 into fp32 accumulators; the other kernels compute in fp32)
    arithmetic: str
    reason: str
    #: layers kept fp32 with why ("override" or "overflow <absmax>")
    fp32_layers: tuple[tuple[str, str], ...] = ()
    #: device features the choice read
    features: tuple[tuple[str, bool], ...] = field(default=())

    @property
    def mode(self) -> int:
        """common.glsl's WFP mode of an fp16 layer: 1 (16-bit storage) or 2 (packed); 0 for fp32."""
        return {"fp16": 1, "packed": 2}.get(self.storage, 0) if self.precision == "fp16" else 0

    @property
    def features_dict(self) -> dict[str, bool]:
        return dict(self.features)

    def layer_harith(self, name: str) -> bool:
        return self.precision == "fp16" and self.arithmetic == "fp16" and name not in dict(self.fp32_layers)

    def layer_mode(self, name: str) -> int:
        if not self.mode or name in dict(self.fp32_layers):
            return 0
        return self.mode

    def on(self, features: Mapping[str, bool]) -> "PrecisionPlan":
        """This plan (a package's, made elsewhere or before a feature was masked) on a device with ``features``:
        16-bit storage falls back to packed fp16 (the same fp16 bytes), fp16 arithmetic to fp32."""
        storage, arith, why = self.storage, self.arithmetic, []
        if storage == "fp16" and not features.get("storageBuffer16BitAccess"):
            storage = "packed"
            why.append("no storageBuffer16BitAccess here: weights packed two per uint (unpackHalf2x16)")
        if arith == "fp16" and not features.get("shaderFloat16"):
            arith = "fp32"
            why.append("no shaderFloat16 here: fp32 arithmetic")
        if not why:
            return self
        return replace(self, storage=storage, arithmetic=arith, reason=self.reason + "; " + "; ".join(why),
                       features=tuple(sorted((str(k), bool(v)) for k, v in features.items())))

    def summary(self) -> str:
        kept = ", ".join(f"{n} ({why})" for n, why in self.fp32_layers[:5])
        more = f" and {len(self.fp32_layers) - 5} more" if len(self.fp32_layers) > 5 else ""
        return (f"precision {self.precision} (asked {self.requested}; weights {self.storage}, arithmetic "
                f"{self.arithmetic}): {self.reason}" + (f"; fp32 layers: {kept}{more}" if kept else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"requested": self.requested, "precision": self.precision, "storage": self.storage,
                "arithmetic": self.arithmetic, "reason": self.reason,
                "fp32_layers": [list(x) for x in self.fp32_layers], "features": dict(self.features)}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "PrecisionPlan":
        return PrecisionPlan(str(d["requested"]), str(d["precision"]), str(d["storage"]), str(d["arithmetic"]),
                             str(d["reason"]), tuple((str(a), str(b)) for a, b in d.get("fp32_layers", ())),
                             tuple(sorted((str(k), bool(v)) for k, v in dict(d.get("features", {})).items())))


FP32 = PrecisionPlan("fp32", "fp32", "fp32", "fp32", "fp32 asked")


def check_precision(requested: str) -> str:
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {requested!r}")
    return requested


def plan_precision(requested: str, backend: str, features: Mapping[str, bool], layers: Sequence[LayerFacts] = (),
                   fp32_layers: Sequence[str] = (), guard: bool = True, arithmetic: bool = False) -> PrecisionPlan:
    """The precision of a model on ``backend`` ("cpu" or "vulkan") with the device's ``features``;
    ``arithmetic`` False keeps fp32 arithmetic even where the device has ``shaderFloat16``."""
    check_precision(requested)
    feats = tuple(sorted((str(k), bool(v)) for k, v in features.items()))
    storage16 = bool(features.get("storageBuffer16BitAccess"))
    if requested == "fp32":
        return PrecisionPlan("fp32", "fp32", "fp32", "fp32", "fp32 asked", (), feats)
    if backend != "vulkan":
        if requested == "auto":
            return PrecisionPlan("auto", "fp32", "fp32", "fp32", "auto on the CPU: fp32", (), feats)
        # the CPU computes in fp32: fp16 is a storage format of the package, converted at load
        storage, reason = "fp16", "fp16 asked on the CPU: weights stored fp16, converted to fp32 at load"
    elif requested == "auto":
        if not storage16:
            return PrecisionPlan("auto", "fp32", "fp32", "fp32",
                                 "auto: the device has no storageBuffer16BitAccess, fp32", (), feats)
        storage, reason = "fp16", "auto: the device has storageBuffer16BitAccess"
    elif storage16:
        storage, reason = "fp16", "fp16 asked; the device has storageBuffer16BitAccess"
    else:
        storage, reason = "packed", ("fp16 asked; the device has no storageBuffer16BitAccess: weights packed "
                                     "two per uint (unpackHalf2x16)")
    arith = "fp32"
    if backend == "vulkan":
        if features.get("shaderFloat16") and arithmetic:
            arith = "fp16"
            reason += ("; cooperative matrices: the shared-memory GEMM convolutions on the matrix units (fp16 "
                       "products, fp32 sums), fp32 arithmetic elsewhere" if features.get("cooperativeMatrixNV") else
                       "; shaderFloat16: fp16 tile sums in the shared-memory GEMM kernels, fp32 accumulators")
        else:
            reason += ("; fp16 arithmetic not asked" if features.get("shaderFloat16")
                       else "; no shaderFloat16: fp32 arithmetic")
    keep: list[tuple[str, str]] = []
    forced = set(fp32_layers)
    for lf in layers:
        if lf.name in forced:
            keep.append((lf.name, "override"))
        elif guard and lf.weight_bytes and lf.absmax > FP16_MAX:
            keep.append((lf.name, f"overflow: weights reach {lf.absmax:.3g} > {FP16_MAX:g}"))
        elif guard and lf.weight_bytes and 0 < lf.absmax < FP16_TINY:
            keep.append((lf.name, f"underflow: weights below {lf.absmax:.3g}, subnormal in fp16"))
    unknown = forced - {lf.name for lf in layers}
    if unknown and layers:
        raise ValueError(f"fp32_layers names no layer of the model: {sorted(unknown)[:5]}")
    return PrecisionPlan(requested, "fp16", storage, arith, reason, tuple(keep), feats)


def cpu_fp16_wins(nbytes: int, disk_bw: float, mem_bw: float) -> bool:
    """Whether reading ``nbytes`` of fp32 weights as fp16 and widening them is faster than reading them:
    half the bytes from the disk against one pass that reads 2 and writes 4 bytes per element."""
    saved = nbytes / 2 / disk_bw
    widen = 1.5 * nbytes / mem_bw
    return saved > widen


def cpu_precision(requested: str, layers: Sequence[LayerFacts], rates: Any, fp32_layers: Sequence[str] = (),
                  guard: bool = True) -> PrecisionPlan:
    """The CPU's plan: fp16 asked stores the weights of the layers where the cost model says fewer
    bytes win (``cpu_fp16_wins`` with the device's measured disk and memory rates) in fp16 in the
    package, widened to fp32 at load; the others, and those fp16 cannot hold, stay fp32."""
    plan = plan_precision(requested, "cpu", {}, layers, fp32_layers, guard)
    if plan.precision != "fp16":
        return plan
    keep = list(plan.fp32_layers)
    kept = {n for n, _ in keep}
    for lf in layers:
        if lf.name not in kept and not cpu_fp16_wins(lf.weight_bytes, rates.disk_bw, rates.mem_bw):
            keep.append((lf.name, "cost: reading fp32 is faster than reading fp16 and widening"))
    return PrecisionPlan(plan.requested, plan.precision, plan.storage, plan.arithmetic,
                         plan.reason + f" where faster (disk {rates.disk_bw / 1e6:.0f} MB/s, memory "
                         f"{rates.mem_bw / 1e9:.1f} GB/s)", tuple(keep), plan.features)
