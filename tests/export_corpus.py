"""A corpus of real architectures exported the way their users export them (issue 18): torchvision and timm
models with random weights through ``torch.onnx.export``, the TorchScript exporter (``dynamo=False``) and the
dynamo exporter, cached on disk so the suite stays fast.

torch, torchvision, timm and onnxscript are test-only, optional dependencies (README, "Tests"): with torch
absent every test of the corpus skips. On machines where torchvision's compiled extension cannot load (the
wheels on PyPI for torch 2.13 are CUDA builds: ``torchvision/_C.so`` needs ``libtorch_cuda.so`` and
``libc10_cuda.so``, which a CPU build of torch lacks), ``import_torchvision`` registers the three
``torchvision::`` operators the corpus needs (``nms``, ``qnms``, ``roi_align``) itself, with plain torch
kernels, before torchvision is imported; the model definitions are pure Python and export unchanged, and the
exporters translate ``torchvision::nms`` / ``roi_align`` to NonMaxSuppression / RoiAlign exactly as with the
compiled extension (the TorchScript exporter through torchvision's own symbolics, dynamo through onnxscript's
torchlib).

The cache: ``$INFERD_EXPORT_CACHE`` or ``~/.cache/inferd/export_corpus``, one folder per (torch, torchvision,
timm, onnxscript) version tuple, one ``<model>.<exporter>.onnx`` per export plus the input it was exported with
(``.npz``); a file that does not load is exported again.
"""
from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

EXPORTERS = ("torchscript", "dynamo")
#: bumped when how a model is built or exported changes, so cached exports of the old recipe are not reused
RECIPE = 2


@dataclass(frozen=True)
class Arch:
    """One corpus entry: how to build the model and the input it is exported and run with."""
    name: str
    source: str  # "torchvision" or "timm"
    builder: str  # torchvision.models attribute path, or timm model name
    shape: tuple[int, ...]  # input shape (a detector takes a list of one CHW image)
    kwargs: dict[str, Any] = field(default_factory=dict)
    detector: bool = False
    seg: bool = False  # torchvision segmentation: the output is a dict; 'out' is exported
    calibrate: bool = True  # batch-norm statistics from random images (see _calibrate_batchnorm)

    def key(self) -> str:
        # (detectors: their backbone's batch norm calibrated since recipe 2)
        extra = ["backbone-bn"] if self.detector and self.calibrate else []
        return hashlib.sha256(json.dumps([RECIPE, self.source, self.builder, self.shape, self.kwargs, self.detector,
                                          self.seg] + extra, sort_keys=True).encode()).hexdigest()[:10]


CORPUS: tuple[Arch, ...] = (
    Arch("resnet18", "torchvision", "resnet18", (1, 3, 64, 64)),
    Arch("mobilenet_v3_small", "torchvision", "mobilenet_v3_small", (1, 3, 64, 64)),
    Arch("efficientnet_b0", "torchvision", "efficientnet_b0", (1, 3, 64, 64)),
    Arch("regnet_y_400mf", "torchvision", "regnet_y_400mf", (1, 3, 64, 64)),
    Arch("convnext_tiny", "torchvision", "convnext_tiny", (1, 3, 64, 64)),
    Arch("swin_t", "torchvision", "swin_t", (1, 3, 64, 64)),
    Arch("maxvit_t", "torchvision", "maxvit_t", (1, 3, 224, 224)),
    Arch("vit_tiny", "timm", "vit_tiny_patch16_224", (1, 3, 64, 64), {"img_size": 64}),
    Arch("deit_tiny", "timm", "deit_tiny_distilled_patch16_224", (1, 3, 64, 64), {"img_size": 64}),
    Arch("edgenext_xx_small", "timm", "edgenext_xx_small", (1, 3, 64, 64)),
    Arch("deeplabv3_mobilenet_v3", "torchvision", "segmentation.deeplabv3_mobilenet_v3_large", (1, 3, 64, 64),
         {"weights_backbone": None}, seg=True),
    Arch("fcn_resnet50", "torchvision", "segmentation.fcn_resnet50", (1, 3, 64, 64),
         {"weights_backbone": None}, seg=True),
    # detectors keep their post-processing in the graph; thresholds low enough that random weights keep boxes
    Arch("ssdlite320", "torchvision", "detection.ssdlite320_mobilenet_v3_large", (3, 320, 320),
         {"weights_backbone": None, "score_thresh": 0.001}, detector=True),
    Arch("fasterrcnn_mobilenet_320", "torchvision", "detection.fasterrcnn_mobilenet_v3_large_320_fpn",
         (3, 320, 320), {"weights_backbone": None, "box_score_thresh": 0.0, "rpn_score_thresh": 0.0},
         detector=True,
         # calibrated, its class scores saturate at 1.0 and the box regression's deltas grow large, so that exp()
         # in the box decoding turns float32 round-off into pixel-sized differences; uncalibrated, its 100 boxes
         # have distinct scores and compare to 1e-7 of the image size
         calibrate=False),
)


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


_SHIM: Any = None
_TV: Any = None


def import_torchvision() -> Any:
    """``torchvision``, imported; where its compiled extension cannot load, the ``torchvision::`` operators the
    corpus needs are registered first (see the module's docstring)."""
    global _SHIM, _TV
    if _TV is not None:
        return _TV
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None:
        raise ImportError("torchvision is not installed")
    if _SHIM is None and "torchvision" not in sys.modules:
        loc = list(spec.submodule_search_locations or [])
        libs = [p for d in loc for p in glob.glob(os.path.join(d, "_C*.so"))]
        try:
            if not libs:
                raise OSError("no torchvision/_C.so")
            torch.ops.load_library(libs[0])
        except (OSError, RuntimeError):
            _SHIM = _register_torchvision_ops()
    import torchvision

    if _SHIM is not None:
        # (``torchvision.ops.roi_align`` the attribute is the function; the module is in sys.modules)
        boxes, roi_align = sys.modules["torchvision.ops.boxes"], sys.modules["torchvision.ops.roi_align"]

        # torchvision asks whether its extension loaded before calling its ops; they exist now
        # (plain functions, not lambdas: torchvision scripts batched_nms while tracing, and TorchScript
        # compiles what it calls)
        boxes._assert_has_ops = _ops_present_check  # type: ignore[attr-defined]
        roi_align._assert_has_ops = _ops_present_check  # type: ignore[attr-defined]
        roi_align._has_ops = _ops_present  # type: ignore[attr-defined]
        _SHIM.impl("roi_align", roi_align._roi_align, "CPU")  # torchvision's own plain-torch RoiAlign
    _TV = torchvision
    return torchvision


def _ops_present_check() -> None:
    pass


def _ops_present() -> bool:
    return True


def _register_torchvision_ops() -> Any:
    import torch

    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
               "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor")

    def nms(dets: Any, scores: Any, iou_threshold: float) -> Any:
        # greedy NMS in score order, torchvision's semantics (IoU strictly above the threshold suppresses)
        x1, y1, x2, y2 = dets.unbind(1)
        area = (x2 - x1) * (y2 - y1)
        suppressed = torch.zeros(dets.shape[0], dtype=torch.bool)
        keep = []
        for i in scores.argsort(descending=True, stable=True).tolist():
            if suppressed[i]:
                continue
            keep.append(i)
            w = (torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1)).clamp(min=0)
            h = (torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1)).clamp(min=0)
            inter = w * h
            suppressed |= inter / (area[i] + area - inter) > iou_threshold
        return torch.tensor(keep, dtype=torch.long)

    lib.impl("nms", nms, "CPU")

    @torch.library.register_fake("torchvision::roi_align", lib=lib)
    def _roi_align_fake(input: Any, rois: Any, spatial_scale: float, ph: int, pw: int, sr: int,
                        aligned: bool) -> Any:
        return input.new_empty((rois.shape[0], input.shape[1], ph, pw))

    return lib


def versions() -> dict[str, str]:
    out = {}
    for m in ("torch", "torchvision", "timm", "onnxscript"):
        try:
            from importlib.metadata import version

            out[m] = version(m)
        except Exception:
            out[m] = "absent"
    return out


def cache_dir() -> Path:
    base = Path(os.environ.get("INFERD_EXPORT_CACHE", Path.home() / ".cache" / "inferd" / "export_corpus"))
    tag = "-".join(f"{k}{v}" for k, v in sorted(versions().items()))
    return base / tag


def build(arch: Arch) -> Any:
    """The model, eval mode, random weights drawn from a fixed seed; batch-norm statistics calibrated."""
    import torch

    torch.manual_seed(0)
    if arch.source == "timm":
        import timm

        model = timm.create_model(arch.builder, pretrained=False, **arch.kwargs)
    else:
        tv = import_torchvision()
        fn: Any = tv.models
        for part in arch.builder.split("."):
            fn = getattr(fn, part)
        model = fn(weights=None, **arch.kwargs)
    # a detector's training forward needs targets: its backbone (where the batch norms are) is calibrated alone;
    # uncalibrated, MobileNetV3's features vanish and SSDlite gives every box the same score, whose order
    # among ties then says nothing about two engines
    if arch.calibrate:
        _calibrate_batchnorm(model.backbone if arch.detector else model, arch)
    return model.eval()


def _calibrate_batchnorm(model: Any, arch: Arch) -> None:
    """Running statistics from a forward pass over random images. With the initial ones (mean 0, variance 1)
    and random weights, some networks' outputs shrink to 1e-10..1e-14 (MobileNetV3, EfficientNet), where
    comparing two engines says little; with real statistics every layer's output is O(1), as in a trained
    model."""
    import torch

    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the calibration batches
    g = torch.Generator().manual_seed(1)
    model.train()
    shape = (4,) + tuple(arch.shape[1:] if not arch.detector else arch.shape)
    with torch.no_grad():
        for _ in range(2):
            model(torch.rand(shape, generator=g))
    model.eval()


class _SegOut:
    """Wraps a torchvision segmentation model so that it returns the 'out' tensor (its users export it so)."""

    def __new__(cls, model: Any) -> Any:
        import torch

        class Seg(torch.nn.Module):
            def __init__(self, m: Any) -> None:
                super().__init__()
                self.m = m

            def forward(self, x: Any) -> Any:
                return self.m(x)["out"]

        return Seg(model).eval()


def example_input(arch: Arch) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.random(arch.shape, dtype=np.float32)


def export(arch: Arch, exporter: str, log: Callable[[str], None] = lambda s: None) -> tuple[Path, np.ndarray]:
    """The exported model (from the cache when there) and its input."""
    import onnx

    d = cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{arch.name}.{arch.key()}.{exporter}.onnx"
    x = example_input(arch)
    if path.exists():
        try:
            onnx.load(str(path), load_external_data=False)
            return path, x
        except Exception as e:  # a damaged cache entry is a miss
            log(f"cache entry {path} does not load ({e}); exporting again")
    import torch

    model = build(arch)
    if arch.seg:
        model = _SegOut(model)
    tx = torch.from_numpy(x)
    args = ([tx],) if arch.detector else (tx,)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with torch.no_grad():
        if exporter == "torchscript":
            torch.onnx.export(model, args, str(tmp), dynamo=False, opset_version=17,
                              input_names=["x"], do_constant_folding=True)
        elif exporter == "dynamo":
            prog = torch.onnx.export(model, args, dynamo=True, input_names=["x"], optimize=True)
            prog.save(str(tmp))
        else:
            raise ValueError(f"unknown exporter {exporter!r}")
    os.replace(tmp, path)
    return path, x
