"""The inferd model zoo: deterministic, seeded-random ONNX models with real architectures.

The models reproduce the graph structure and parameter counts of the torchvision / timm
reference implementations as ``torch.onnx.export`` (opset 17, eval mode) writes them, but
carry seeded random weights scaled to keep activations O(1). Nothing is downloaded.

Public API: :data:`MODELS`, :data:`ZOO`, :func:`build`, :func:`write_zoo`,
:func:`count_params`, :func:`main` (the ``inferd zoo`` command).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import tempfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from . import _cnn, _dynamic, _recurrent, _vit
from ._graph import OPSET, Dim, GraphBuilder, count_params, is_trainable

__all__ = [
    "MODELS",
    "ZOO",
    "OPSET",
    "ModelInfo",
    "build",
    "write_zoo",
    "count_params",
    "is_trainable",
    "main",
    "add_arguments",
    "run",
]

log = logging.getLogger(__name__)

Shape = tuple[Dim, ...]


@dataclass(frozen=True)
class ModelInfo:
    """Static description of a zoo model.

    ``params`` is the trainable parameter count of the reference implementation
    (torch's ``sum(p.numel() for p in parameters())``); :func:`count_params` on the built
    model must equal it. Non-trainable initializers are recognisable by name: BatchNorm
    buffers end in ``running_mean``/``running_var``, constants start with ``onnx::``.
    """

    name: str
    inputs: tuple[tuple[str, Shape], ...]
    outputs: tuple[tuple[str, Shape], ...]
    description: str
    params: int
    zoo: bool = True  # False for the tiny test models that are not part of the zoo proper
    #: inputs/outputs that are not float32, by name -> numpy dtype name (an int64 sample rate)
    dtypes: tuple[tuple[str, str], ...] = ()
    #: the recurrent models: state inputs -> the output that carries the state on (streamed by the client)
    state: tuple[tuple[str, str], ...] = ()

    def dtype(self, name: str) -> str:
        return dict(self.dtypes).get(name, "float32")

    @property
    def input_shape(self) -> Shape:
        return self.inputs[0][1]

    @property
    def input_name(self) -> str:
        return self.inputs[0][0]

    @property
    def output_shape(self) -> Shape:
        return self.outputs[0][1]

    @property
    def dynamic_batch(self) -> bool:
        return isinstance(self.input_shape[0], str)

    @property
    def dynamic(self) -> bool:
        """Whether a dimension other than the batch is dynamic."""
        return any(isinstance(d, str) for d in self.input_shape[1:])

    def concrete_input_shape(self, batch: int = 1, size: int = 224) -> tuple[int, ...]:
        """The first input's shape with a symbolic batch dimension at ``batch`` and any other dynamic one at
        ``size`` (224 by default: where inferd's import probes dynamic dimensions)."""
        return tuple((batch if k == 0 else size) if isinstance(d, str) else d for k, d in enumerate(self.input_shape))


_IMG: Shape = (1, 3, 224, 224)
_IMG_N: Shape = ("N", 3, 224, 224)


def _info(name: str, shape: Shape, out: Shape, params: int, desc: str, zoo: bool = True) -> ModelInfo:
    return ModelInfo(name, (("input", shape),), (("output", out),), desc, params, zoo)


MODELS: dict[str, ModelInfo] = {
    m.name: m
    for m in [
        _info("tiny", (1, 3, 8, 8), (1, 10), 314,
              "1x3x8x8 -> Conv3x3 -> Relu -> GlobalAveragePool -> Flatten -> Gemm(10); daemon round-trip tests",
              zoo=False),
        _info("mlp_small", (1, 64), (1, 10), 9610,
              "1x64 -> Gemm(128) -> Relu -> Gemm(10) -> Softmax", zoo=False),
        _info("resnet18", _IMG_N, ("N", 1000), 11689512,
              "torchvision resnet18 (BasicBlock, BN, residual Add), symbolic batch N"),
        _info("resnet50", _IMG, (1, 1000), 25557032, "torchvision resnet50 (Bottleneck v1.5)"),
        _info("mobilenetv2", _IMG_N, ("N", 1000), 3504872,
              "torchvision mobilenet_v2 (depthwise convs, ReLU6 as Clip(0,6)), symbolic batch N"),
        _info("squeezenet1_1", _IMG, (1, 1000), 1235496,
              "torchvision squeezenet1_1 (Fire modules, Concat, ceil-mode MaxPool)"),
        _info("shufflenetv2_x1_0", _IMG, (1, 1000), 2278604,
              "torchvision shufflenet_v2_x1_0 (Split, channel shuffle via Reshape/Transpose/Reshape)"),
        _info("vgg16", _IMG, (1, 1000), 138357544, "torchvision vgg16 (no BN, 553 MB of FC-heavy weights)"),
        _info("efficientnet_b0", _IMG, (1, 1000), 5288548,
              "torchvision efficientnet_b0 (MBConv, SiLU as x*Sigmoid(x), squeeze-excitation)"),
        _info("googlenet", _IMG, (1, 1000), 6624904,
              "torchvision googlenet without aux heads (inception branches + Concat, BN)"),
        _info("unet_small", (1, 3, 128, 128), (1, 4, 128, 128), 460772,
              "small U-Net segmenter: Conv/BN/Relu encoder with MaxPool, Resize(nearest) and "
              "ConvTranspose decoder, skip Concat"),
        _info("vit_tiny", _IMG, (1, 1000), 5717416,
              "timm vit_tiny_patch16_224 (LayerNormalization, attention MatMuls, erf GELU)"),
        ModelInfo("detnet_dyn", (("input", ("N", 3, "H", "W")),), (("output", ("N", 3, "cells", 6)),),
                  "fully convolutional detector, batch/height/width dynamic: residual stages, FPN Resize sized "
                  "from the skip's Shape, head reshaped by a Shape-derived size", 128194),
        ModelInfo("recnet_dyn", (("input", ("N", 3, 32, "W")),), (("output", ("N", "T", 37)),),
                  "text-line recogniser, batch/width dynamic: conv stem pooling the height to 1, self-attention "
                  "over the width (MatMul, Softmax), per-step classifier, Shape-derived reshapes", 152869),
        ModelInfo("vad_lstm", (("input", (1, 512)), ("sr", ()), ("state", (2, 1, 64))),
                  (("output", (1, 1)), ("stateN", (2, 1, 64))),
                  "voice-activity detector: shape- and value-dependent If (sample rate, int64 scalar), Conv1d STFT, "
                  "conv encoder, LSTM decoder with its state in and out", 120129,
                  dtypes=(("sr", "int64"),), state=(("state", "stateN"),)),
        ModelInfo("crnn_lstm", (("input", (1, 1, 32, "W")),), (("output", ("T", 1, 37)),),
                  "CRNN text recogniser, width dynamic: conv stem, bidirectional LSTM over the columns, "
                  "CTC-style LogSoftmax (time-major)", 339397),
        ModelInfo("kws_gru", (("input", (1, 49, 40)), ("state", (1, 1, 64))),
                  (("output", (1, 12)), ("stateN", (1, 1, 64))),
                  "keyword spotter: GRU (linear_before_reset) over 49 feature frames with its state in and out, "
                  "classifier on the last step", 21132, state=(("state", "stateN"),)),
    ]
}

# The zoo proper, in a stable order (small before large).
ZOO: list[str] = [n for n, m in MODELS.items() if m.zoo]

_BUILDERS: dict[str, Callable[[GraphBuilder, str], str]] = {
    "tiny": _cnn.tiny,
    "mlp_small": _cnn.mlp_small,
    "resnet18": _cnn.resnet18,
    "resnet50": _cnn.resnet50,
    "mobilenetv2": _cnn.mobilenetv2,
    "squeezenet1_1": _cnn.squeezenet1_1,
    "shufflenetv2_x1_0": _cnn.shufflenetv2_x1_0,
    "vgg16": _cnn.vgg16,
    "efficientnet_b0": _cnn.efficientnet_b0,
    "googlenet": _cnn.googlenet,
    "unet_small": _cnn.unet_small,
    "vit_tiny": _vit.vit_tiny,
    "detnet_dyn": _dynamic.detnet_dyn,
    "recnet_dyn": _dynamic.recnet_dyn,
    "vad_lstm": _recurrent.vad_lstm,
    "crnn_lstm": _recurrent.crnn_lstm,
    "kws_gru": _recurrent.kws_gru,
}
#: builders that take every input name and return every output (several inputs or outputs)
_MULTI = {"vad_lstm", "crnn_lstm", "kws_gru"}
assert _BUILDERS.keys() == MODELS.keys()


def _lookup(name: str) -> ModelInfo:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(MODELS)}") from None


def build(name: str, seed: int = 0) -> onnx.ModelProto:
    """Build zoo model ``name`` with weights drawn from ``seed`` (same seed -> same bytes)."""
    info = _lookup(name)
    # Seeding per model keeps each model's weights independent of which others get built.
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    g = GraphBuilder(rng)
    if name in _MULTI:
        outs = _BUILDERS[name](g, [n for n, _ in info.inputs])  # type: ignore[arg-type]
    else:
        outs = [_BUILDERS[name](g, info.input_name)]
    elem = {"int64": onnx.TensorProto.INT64, "float32": onnx.TensorProto.FLOAT}
    return g.finish(
        name,
        info.inputs,
        info.outputs,
        outs,
        info.description,
        {"inferd.zoo.name": name, "inferd.zoo.seed": str(seed)},
        {n: elem[d] for n, d in info.dtypes},
    )


# --------------------------------------------------------------------------- writing


def _fingerprint() -> str:
    """Identifies the generator: any change to the zoo sources or onnx/numpy versions
    invalidates cached files' metadata, so stale models are rebuilt (and rewritten only
    if their bytes actually changed)."""
    h = hashlib.sha256()
    for src in sorted(Path(__file__).parent.glob("*.py")):
        h.update(src.name.encode())
        h.update(src.read_bytes())
    h.update(onnx.__version__.encode())
    h.update(np.__version__.encode())
    return h.hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def _meta_path(path: Path) -> Path:
    return path.with_name(path.name + ".zoo.json")


def _atomic_write(path: Path, data: bytes | str) -> None:
    # Concurrent test processes may share the cache directory: readers must never see
    # a half-written model.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates 0600; models must stay readable by e.g. a daemon running as another user.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _up_to_date(path: Path, meta: dict[str, object]) -> bool:
    try:
        recorded = json.loads(_meta_path(path).read_text())
        st = path.stat()
    except (OSError, ValueError):
        return False
    return (
        isinstance(recorded, dict)
        and all(recorded.get(k) == v for k, v in meta.items())
        and recorded.get("size") == st.st_size
        and recorded.get("mtime_ns") == st.st_mtime_ns
    )


def _write_one(out_dir: Path, name: str, seed: int, fingerprint: str) -> tuple[Path, bool]:
    """Write one model; returns (path, written). Skips building entirely when the sidecar
    metadata says the file came from this generator and seed and is untouched since."""
    path = out_dir / f"{name}.onnx"
    meta: dict[str, object] = {"name": name, "seed": seed, "generator": fingerprint}
    if _up_to_date(path, meta):
        return path, False
    data = build(name, seed).SerializeToString()
    digest = hashlib.sha256(data).hexdigest()
    written = not (path.is_file() and path.stat().st_size == len(data) and _file_sha256(path) == digest)
    if written:
        _atomic_write(path, data)
    del data  # keep at most one model's bytes alive (vgg16 is 553 MB)
    st = path.stat()
    meta.update(sha256=digest, size=st.st_size, mtime_ns=st.st_mtime_ns)
    _atomic_write(_meta_path(path), json.dumps(meta, indent=1, sort_keys=True))
    return path, written


def write_zoo(out_dir: str | Path, names: list[str] | None = None, seed: int = 0) -> dict[str, Path]:
    """Write ``<out_dir>/<name>.onnx`` for ``names`` (default: every model in MODELS).

    Files that already hold exactly the bytes the generator would produce are left alone
    (mtime unchanged). Models are built one at a time so memory stays at one model.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    selected = list(MODELS) if names is None else list(names)
    for n in selected:
        _lookup(n)
    fp = _fingerprint()
    paths: dict[str, Path] = {}
    for n in selected:
        path, written = _write_one(out, n, seed, fp)
        log.info("%s %s", "wrote" if written else "up to date:", path)
        paths[n] = path
    return paths


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``inferd zoo``; for wiring into a subparser."""
    parser.add_argument("names", nargs="*", metavar="NAME", help="models to write (default: all)")
    parser.add_argument("--out", type=Path, help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument("--list", action="store_true", help="list the models and exit")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Execute parsed ``inferd zoo`` arguments."""

    def fail(msg: str) -> int:
        if parser is not None:
            parser.error(msg)  # exits with status 2
        print(f"inferd zoo: error: {msg}", file=sys.stderr)
        return 2

    if args.list:
        width = max(map(len, MODELS))
        for m in MODELS.values():
            shapes = ", ".join("x".join(map(str, s)) for _, s in m.inputs)
            tag = "" if m.zoo else " [test]"
            print(f"{m.name:<{width}}  {shapes:<14} {m.params:>11,d} params  {m.description}{tag}")
        return 0
    if args.out is None:
        return fail("--out DIR is required (or use --list)")
    unknown = [n for n in args.names if n not in MODELS]
    if unknown:
        return fail(f"unknown model(s): {', '.join(unknown)}; see --list")
    if args.seed < 0:
        return fail("--seed must be >= 0")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    fp = _fingerprint()
    for n in args.names or list(MODELS):
        path, written = _write_one(out, n, args.seed, fp)
        print(f"{'wrote' if written else 'up to date'}  {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``inferd zoo --out DIR [NAME ...] [--seed N] [--list]``; ``argv`` excludes the
    ``zoo`` sub-command word."""
    parser = argparse.ArgumentParser(
        prog="inferd zoo", description="Write seeded-random ONNX models of standard architectures."
    )
    add_arguments(parser)
    args = parser.parse_args(None if argv is None else list(argv))
    return run(args, parser)
