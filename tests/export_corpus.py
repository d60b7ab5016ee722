"""A corpus of real architectures exported the way their users export them (issue 18): torchvision and timm
models with random weights through ``torch.onnx.export``, the TorchScript exporter (``dynamo=False``) and the
dynamo exporter; Keras models (``keras.applications`` and small custom ones, NHWC as Keras has them) through
tf2onnx, from the Keras model, from a ``tf.function`` and from a SavedModel; ``paddle.vision.models`` through
``paddle.jit.save`` and paddle2onnx. All cached on disk so the suite stays fast.

TensorFlow/tf2onnx and paddlepaddle/paddle2onnx exports run in a child process of the same interpreter
(``python tests/export_corpus.py <model> <exporter> <out.onnx> ...``, every export of the family that the cache
lacks in one child): TensorFlow, paddle and torch each bring
their own OpenMP/MKL and thread pools and several hundred MB, which the test process should not keep, and
``import tensorflow`` then ``import paddle`` in one process ends in a segmentation fault (TF 2.21, paddle 3.3.1).

torch, torchvision, timm and onnxscript are test-only, optional dependencies (README, "Tests"): with torch
absent every test of the corpus skips. On machines where torchvision's compiled extension cannot load (the
wheels on PyPI for torch 2.13 are CUDA builds: ``torchvision/_C.so`` needs ``libtorch_cuda.so`` and
``libc10_cuda.so``, which a CPU build of torch lacks), ``import_torchvision`` registers the three
``torchvision::`` operators the corpus needs (``nms``, ``qnms``, ``roi_align``) itself, with plain torch
kernels, before torchvision is imported; the model definitions are pure Python and export unchanged, and the
exporters translate ``torchvision::nms`` / ``roi_align`` to NonMaxSuppression / RoiAlign exactly as with the
compiled extension (the TorchScript exporter through torchvision's own symbolics, dynamo through onnxscript's
torchlib).

The cache: ``$INFERD_EXPORT_CACHE`` or ``~/.cache/inferd/export_corpus``, one folder per version tuple of the
exporting libraries (torch, torchvision, timm, onnxscript; tensorflow, keras, tf2onnx; paddlepaddle,
paddle2onnx), one ``<model>.<exporter>.onnx`` per export plus the input it was exported with
(``.npz``); a file that does not load is exported again.
"""
from __future__ import annotations

import fcntl
import glob
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

TORCH_EXPORTERS = ("torchscript", "dynamo")
#: tf2onnx's three entry points: ``from_keras``, ``from_function`` (a ``tf.function``), and its command line on a
#: SavedModel (``model.export``), which is how most TensorFlow models reach it
TF_EXPORTERS = ("tf2onnx_keras", "tf2onnx_function", "tf2onnx_saved_model")
EXPORTERS = TORCH_EXPORTERS + TF_EXPORTERS + ("paddle2onnx",)
#: the modules each source's export needs
NEEDS = {"torchvision": ("torch", "torchvision"), "timm": ("torch", "timm"), "keras": ("tensorflow", "tf2onnx"),
         "paddle": ("paddle", "paddle2onnx")}
#: bumped when how a model is built or exported changes, so cached exports of the old recipe are not reused
RECIPE = 2


@dataclass(frozen=True)
class Arch:
    """One corpus entry: how to build the model and the input it is exported and run with."""
    name: str
    source: str  # "torchvision", "timm", "keras" or "paddle"
    # torchvision.models attribute path, timm model name, keras.applications name or one of CUSTOM_KERAS,
    # paddle.vision.models name
    builder: str
    shape: tuple[int, ...]  # input shape (a detector takes a list of one CHW image; Keras images are NHWC)
    kwargs: dict[str, Any] = field(default_factory=dict)
    detector: bool = False
    seg: bool = False  # torchvision segmentation: the output is a dict; 'out' is exported
    calibrate: bool = True  # batch-norm statistics from random images (see _calibrate_batchnorm)
    exporters: tuple[str, ...] = ()  # the source's default when empty (see exporters_of)
    # exported with a symbolic batch dimension, as TensorFlow and Paddle users export (the tests run batch 1)
    dynamic_batch: bool = False

    def key(self) -> str:
        # (detectors: their backbone's batch norm calibrated since recipe 2)
        extra = ["backbone-bn"] if self.detector and self.calibrate else []
        extra += ["dynamic-batch"] if self.dynamic_batch else []
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
    # NF-Nets standardise their weights with F.batch_norm(training=True): the TorchScript exporter writes a
    # training-mode BatchNormalization on the constants (dynamo writes an inference-mode one over statistics it
    # computes with ReduceMean, which ran before)
    Arch("nf_regnet_b0", "timm", "nf_regnet_b0", (1, 3, 64, 64), exporters=("torchscript",)),
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
    # Keras 3 models through tf2onnx, NHWC: tf2onnx transposes to NCHW around each Conv and then cancels what
    # it can, so these graphs carry its Transpose patterns
    Arch("keras_mobilenet_v2", "keras", "MobileNetV2", (1, 64, 64, 3), exporters=("tf2onnx_keras",),
         dynamic_batch=True),
    Arch("keras_efficientnet_b0", "keras", "EfficientNetB0", (1, 64, 64, 3), exporters=("tf2onnx_keras",)),
    Arch("keras_resnet50", "keras", "ResNet50", (1, 64, 64, 3), exporters=("tf2onnx_saved_model",),
         dynamic_batch=True),
    Arch("keras_convnet", "keras", "convnet", (1, 32, 32, 3), exporters=("tf2onnx_function", "tf2onnx_saved_model")),
    # Keras 3's LSTM and GRU reach ONNX as Loop nodes (tf2onnx's LSTM/GRU rewriters do not match them)
    Arch("keras_lstm", "keras", "lstm", (1, 12, 8), exporters=("tf2onnx_function",)),
    Arch("keras_lstm_any_batch", "keras", "lstm", (1, 12, 8), exporters=("tf2onnx_function",), dynamic_batch=True),
    # a text model takes int32 token ids (tf2onnx keeps TensorFlow's dtype), which Keras 3's Embedding wraps
    # (negative ids plus the vocabulary) before its Gather
    Arch("keras_text", "keras", "text", (2, 20), exporters=("tf2onnx_keras",), dynamic_batch=True),
    # paddle's deployment tools export with InputSpec([None, 3, H, W])
    Arch("paddle_mobilenet_v2", "paddle", "mobilenet_v2", (1, 3, 64, 64), dynamic_batch=True),
    Arch("paddle_resnet18", "paddle", "resnet18", (1, 3, 64, 64)),
    Arch("paddle_mobilenet_v3_small", "paddle", "mobilenet_v3_small", (1, 3, 64, 64), dynamic_batch=True),
)

#: small Keras models written the way Keras users write them, for layers the applications do not have
CUSTOM_KERAS = ("convnet", "lstm", "text")
#: models whose input is integer token ids below this vocabulary size (int32, as Keras has them)
TOKEN_VOCAB = {"text": 1000}


def exporters_of(arch: Arch) -> tuple[str, ...]:
    """The exporters an architecture goes through."""
    if arch.exporters:
        return arch.exporters
    return {"keras": ("tf2onnx_keras",), "paddle": ("paddle2onnx",)}.get(arch.source, TORCH_EXPORTERS)


def missing(arch: Arch, exporter: str) -> str | None:
    """Why this export cannot run here (an exporter that is not installed), or None."""
    extra = ("the 'corpus' extra" if arch.source in ("torchvision", "timm")
             else "the 'exporters' extra, which scripts/dev.sh installs unless INFERD_TEST_EXPORTERS=0; README, Tests")
    for mod in NEEDS[arch.source] + (("onnxscript",) if exporter == "dynamo" else ()):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed ({extra})"
    return None


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


#: the distributions whose versions key the cache, per source (the torch sources share one folder)
_VERSIONED = {"torch": ("torch", "torchvision", "timm", "onnxscript"), "keras": ("tensorflow", "keras", "tf2onnx"),
              "paddle": ("paddlepaddle", "paddle2onnx")}


def _family(source: str) -> str:
    return source if source in ("keras", "paddle") else "torch"


def versions(source: str = "torch") -> dict[str, str]:
    out = {}
    from importlib.metadata import PackageNotFoundError, version

    for m in _VERSIONED[_family(source)]:
        out[m] = "absent"
        for dist in (m, f"{m}-cpu"):  # TensorFlow's CPU-only wheel is another distribution
            try:
                out[m] = version(dist)
                break
            except PackageNotFoundError:
                pass
    return out


def cache_dir(source: str = "torch") -> Path:
    base = Path(os.environ.get("INFERD_EXPORT_CACHE", Path.home() / ".cache" / "inferd" / "export_corpus"))
    tag = "-".join(f"{k}{v}" for k, v in sorted(versions(source).items()))
    return base / tag


def build(arch: Arch) -> Any:
    """The model, eval mode, random weights drawn from a fixed seed; batch-norm statistics calibrated."""
    import torch

    torch.manual_seed(0)
    if arch.source == "timm":
        # timm imports torchvision (timm.layers._fx): the torchvision:: operators must be registered before that,
        # or a process whose first export is a timm model fails in torchvision's meta registrations
        import_torchvision()
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
    if arch.source == "keras" and arch.builder in TOKEN_VOCAB:
        return rng.integers(0, TOKEN_VOCAB[arch.builder], arch.shape).astype(np.int32)
    return rng.random(arch.shape, dtype=np.float32)


def export(arch: Arch, exporter: str, log: Callable[[str], None] = lambda s: None) -> tuple[Path, np.ndarray]:
    """The exported model (from the cache when there) and its input."""
    import onnx

    d = cache_dir(arch.source)
    d.mkdir(parents=True, exist_ok=True)
    path = _cached_path(arch, exporter)
    x = example_input(arch)
    # one export of a model (of a Keras or paddle family: one batch) at a time across the suite's workers
    # (pytest-xdist): the others wait for it and read the cache rather than export it again beside it
    family = arch.source if arch.source in ("keras", "paddle") else arch.name
    with open(d / f".{family}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            try:
                onnx.load(str(path), load_external_data=False)
                return path, x
            except Exception as e:  # a damaged cache entry is a miss
                log(f"cache entry {path} does not load ({e}); exporting again")
        return _export_to_cache(arch, exporter, path, x)


def _export_to_cache(arch: Arch, exporter: str, path: Path, x: np.ndarray) -> tuple[Path, np.ndarray]:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    if arch.source in ("keras", "paddle"):
        _export_family(arch, exporter, path)
        return path, x
    import torch

    model = build(arch)
    if arch.seg:
        model = _SegOut(model)
    tx = torch.from_numpy(x)
    args = ([tx],) if arch.detector else (tx,)
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


def _cached_path(arch: Arch, exporter: str) -> Path:
    return cache_dir(arch.source) / f"{arch.name}.{arch.key()}.{exporter}.onnx"


def _export_family(arch: Arch, exporter: str, path: Path) -> None:
    """Exports ``arch`` to ``path`` in a child process, and with it every other export of its family (Keras or
    paddle) that the cache lacks: one child pays for ``import tensorflow`` (~6 s on the 2-core VM) once rather
    than once per export, which is what a fresh machine (CI) runs into. An export the batch did not produce
    (one that failed, or a child that crashed on another) is retried alone."""
    batch = [(arch, exporter, path)]
    for a in CORPUS:
        if a.source != arch.source:
            continue
        for e in exporters_of(a):
            p = _cached_path(a, e)
            if (a.name, e) != (arch.name, exporter) and not p.exists() and missing(a, e) is None:
                batch.append((a, e, p))
    r = _export_in_child(batch)
    if not path.exists() and len(batch) > 1:
        r = _export_in_child(batch[:1])
    if not path.exists():
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"{exporter} export of {arch.name} failed (exit {r.returncode}):\n{tail}")


def _export_in_child(batch: list[tuple[Arch, str, Path]]) -> subprocess.CompletedProcess[str]:
    """Runs ``_export_here`` for each (arch, exporter, path) in one child process of this interpreter (see the
    module's docstring); each export it finishes is moved to its path (a temporary name until then)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    tmps = [p.with_suffix(f".tmp{os.getpid()}") for _a, _e, p in batch]
    args = [x for (a, e, _p), t in zip(batch, tmps) for x in (a.name, e, str(t))]
    try:
        r = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True,
                           timeout=600)  # (inside pytest-timeout's 900 s)
        for (_a, _e, p), t in zip(batch, tmps):
            if t.exists():
                os.replace(t, p)
    finally:
        for t in tmps:
            t.unlink(missing_ok=True)
    return r


def _export_here(arch: Arch, exporter: str, out: Path) -> None:
    if arch.source == "keras":
        _export_keras(arch, exporter, out)
    elif arch.source == "paddle":
        _export_paddle(arch, out)
    else:
        raise ValueError(f"{arch.name}: {arch.source} models export in the test process")


def _keras_model(arch: Arch) -> Any:
    import keras

    keras.utils.set_random_seed(0)
    if arch.builder == "convnet":
        # the layers of small image models written by hand: separable and depthwise convolutions, pooling,
        # up-sampling and a skip concatenation, dense layers
        L = keras.layers
        x0 = keras.Input(arch.shape[1:], batch_size=None if arch.dynamic_batch else arch.shape[0])
        x = L.Rescaling(1 / 127.5, offset=-1)(x0)
        x = L.Conv2D(16, 3, strides=2, padding="same", use_bias=False)(x)
        x = L.BatchNormalization()(x)
        x = L.ReLU(6.0)(x)
        y = L.DepthwiseConv2D(3, padding="same")(x)
        y = L.BatchNormalization()(y)
        y = L.Activation("swish")(y)
        y = L.SeparableConv2D(24, 3, padding="same", activation="relu")(y)
        z = L.MaxPooling2D(2)(y)
        z = L.Conv2D(24, 1, activation="elu")(z)
        z = L.UpSampling2D(2)(z)
        x = L.Concatenate()([x, y, z])
        x = L.AveragePooling2D(2)(x)
        # (not gelu: Keras 3 computes it with erfc, which tf2onnx writes as an "Erfc" node ONNX does not have)
        x = L.Conv2D(32, 3, padding="valid", dilation_rate=2, activation="selu")(x)
        x = L.LayerNormalization()(x)
        x = L.GlobalAveragePooling2D()(x)
        x = L.Dense(64, activation="tanh")(x)
        x = L.Dropout(0.2)(x)
        model = keras.Model(x0, L.Dense(10)(x))
    elif arch.builder == "lstm":
        L = keras.layers
        x0 = keras.Input(arch.shape[1:], batch_size=None if arch.dynamic_batch else arch.shape[0])
        x = L.LSTM(16, return_sequences=True)(x0)
        x = L.GRU(12)(x)
        model = keras.Model(x0, L.Dense(4)(x))
    elif arch.builder == "text":
        L = keras.layers
        x0 = keras.Input(arch.shape[1:], batch_size=None if arch.dynamic_batch else arch.shape[0], dtype="int32")
        x = L.Embedding(TOKEN_VOCAB[arch.builder], 32)(x0)
        x = L.Conv1D(32, 3, padding="same", activation="relu")(x)
        x = L.Bidirectional(L.LSTM(16, return_sequences=True))(x)
        x = L.GlobalAveragePooling1D()(x)
        model = keras.Model(x0, L.Dense(3)(x))
    else:
        # logits rather than softmax probabilities, which would hide differences in the logits
        model = getattr(keras.applications, arch.builder)(weights=None, input_shape=arch.shape[1:],
                                                         classifier_activation=None)
    if arch.calibrate:
        _calibrate_keras_batchnorm(model, arch)
    return model


def _calibrate_keras_batchnorm(model: Any, arch: Arch) -> None:
    """As _calibrate_batchnorm: running statistics from random images, the batch's own (momentum 0)."""
    import keras
    import numpy as np

    bns = [m for m in model._flatten_layers(include_self=False, recursive=True)
           if isinstance(m, keras.layers.BatchNormalization)]
    if not bns:
        return
    for m in bns:
        m.momentum = 0.0
    # (the range of example_input's images, which the models are then run with)
    model(np.random.default_rng(1).random((4,) + tuple(arch.shape[1:]), dtype=np.float32), training=True)


def _spec_shape(arch: Arch) -> tuple[int | None, ...]:
    return ((None,) + arch.shape[1:]) if arch.dynamic_batch else arch.shape


def _export_keras(arch: Arch, exporter: str, out: Path) -> None:
    import tempfile

    import tensorflow as tf
    import tf2onnx

    model = _keras_model(arch)
    spec = (tf.TensorSpec(_spec_shape(arch), tf.int32 if arch.builder in TOKEN_VOCAB else tf.float32, name="x"),)
    if exporter == "tf2onnx_keras":
        tf2onnx.convert.from_keras(model, input_signature=spec, opset=17, output_path=str(out))
    elif exporter == "tf2onnx_function":
        fn = tf.function(lambda x: model(x, training=False), input_signature=spec)
        tf2onnx.convert.from_function(fn, input_signature=spec, opset=17, output_path=str(out))
    elif exporter == "tf2onnx_saved_model":
        with tempfile.TemporaryDirectory() as d:
            model.export(d, format="tf_saved_model", input_signature=list(spec))
            # the command line, as the tf2onnx README shows it
            subprocess.run([sys.executable, "-m", "tf2onnx.convert", "--saved-model", d, "--opset", "17",
                            "--output", str(out)], check=True)
    else:
        raise ValueError(f"unknown exporter {exporter!r} for a Keras model")


def _export_paddle(arch: Arch, out: Path) -> None:
    import tempfile

    import numpy as np
    import paddle
    import paddle2onnx

    paddle.seed(0)
    model = getattr(paddle.vision.models, arch.builder)(**arch.kwargs)
    if arch.calibrate:
        bns = [m for m in model.sublayers() if isinstance(m, paddle.nn.layer.norm._BatchNormBase)]
        for m in bns:
            m._momentum = 0.0  # the batch's statistics (paddle keeps momentum * old + (1 - momentum) * batch)
        model.train()
        x = np.random.default_rng(1).random((4,) + tuple(arch.shape[1:]), dtype=np.float32)
        with paddle.no_grad():
            model(paddle.to_tensor(x))
    model.eval()
    with tempfile.TemporaryDirectory() as d:
        spec = [paddle.static.InputSpec(shape=list(_spec_shape(arch)), dtype="float32", name="x")]
        paddle.jit.save(model, os.path.join(d, "model"), input_spec=spec)
        # paddle 3 writes its PIR program as model.json, paddle 2 model.pdmodel
        prog = next(os.path.join(d, f) for f in ("model.json", "model.pdmodel") if os.path.exists(os.path.join(d, f)))
        paddle2onnx.export(prog, os.path.join(d, "model.pdiparams"), str(out), opset_version=17)


if __name__ == "__main__":
    # the child of _export_in_child: (<model> <exporter> <out.onnx>)...; one failed export does not stop the others
    import traceback

    _failed = 0
    for _i in range(1, len(sys.argv) - 2, 3):
        _name, _exporter, _out = sys.argv[_i:_i + 3]
        try:
            _export_here(next(a for a in CORPUS if a.name == _name), _exporter, Path(_out))
        except Exception:
            _failed += 1
            Path(_out).unlink(missing_ok=True)
            print(f"{_exporter} export of {_name} failed:", file=sys.stderr)
            traceback.print_exc()
    sys.exit(1 if _failed else 0)
