"""Quantised zoo models, made with onnxruntime's quantiser (the tests and ``inferd bench quant`` share them).

Schemes:
  * ``qdq_s8s8``: ``quantize_static`` QDQ, int8 activations and weights, one scale per tensor (its default);
  * ``qdq_u8s8_pc``: ``quantize_static`` QDQ, uint8 activations, int8 weights with one scale per output channel
    (what onnxruntime recommends on x86 without VNNI-INT8, and the form its CPU kernels fuse there);
  * ``dynamic``: ``quantize_dynamic`` QOperator (DynamicQuantizeLinear + ConvInteger / MatMulInteger), int8 weights.

Static schemes first run ``quant_pre_process`` (BatchNorm folding, shape inference: what onnxruntime documents
before quantising) and calibrate on a few seeded random inputs. Files are cached next to the fp32 model, keyed by
the fp32 file's content hash, so a test session or a benchmark makes each one once.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

SCHEMES = ("qdq_s8s8", "qdq_u8s8_pc", "dynamic")
CALIBRATION_INPUTS = 4


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def calibration_feeds(model_path: str | os.PathLike, n: int = CALIBRATION_INPUTS, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """``n`` seeded random inputs for every float input of the model (dynamic dimensions at 1)."""
    import onnx

    m = onnx.load(str(model_path), load_external_data=False)
    init = {i.name for i in m.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(n):
        d = {}
        for i in m.graph.input:
            if i.name in init:
                continue
            dims = [x.dim_value or 1 for x in i.type.tensor_type.shape.dim]
            d[i.name] = rng.standard_normal(dims).astype(np.float32)
        feeds.append(d)
    return feeds


def quantize(src: str | os.PathLike, scheme: str, out: str | os.PathLike, keep_pre: Path | None = None) -> Path:
    """Quantise the fp32 model ``src`` with ``scheme`` into ``out`` (no caching; see ``quantized``); ``keep_pre``:
    where to keep the pre-processed fp32 model of a static scheme."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if scheme not in SCHEMES:
        raise ValueError(f"unknown quantisation scheme {scheme!r}; known: {', '.join(SCHEMES)}")
    out = Path(out)
    if scheme == "dynamic":
        quantize_dynamic(str(src), str(out), weight_type=QuantType.QInt8)
        return out
    feeds = calibration_feeds(src)

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(feeds)

        def get_next(self) -> dict | None:
            return next(self._it, None)

    with tempfile.TemporaryDirectory() as tmp:
        pre = Path(tmp) / "pre.onnx"
        quant_pre_process(str(src), str(pre))
        if scheme == "qdq_s8s8":
            kw = dict(activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=False)
        else:
            kw = dict(activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True)
        quantize_static(str(pre), str(out), _Reader(), quant_format=QuantFormat.QDQ, **kw)
        if keep_pre is not None:
            os.replace(pre, keep_pre)
    return out


def quantized(src: str | os.PathLike, scheme: str) -> Path:
    """``<src stem>.<scheme>.onnx`` beside ``src``, made once per content of ``src``. For the static schemes the
    pre-processed fp32 model (``<stem>.pre.onnx``) is kept too: the fp32 twin of the quantised graph."""
    src = Path(src)
    out = src.with_name(f"{src.stem}.{scheme}.onnx")
    meta = out.with_name(out.name + ".json")
    key = {"src_sha256": _sha(src), "scheme": scheme, "calibration": CALIBRATION_INPUTS}
    try:
        if out.exists() and json.loads(meta.read_text()) == key:
            return out
    except (OSError, ValueError):
        pass
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    quantize(src, scheme, tmp, keep_pre=src.with_name(f"{src.stem}.pre.onnx"))
    os.replace(tmp, out)
    meta.write_text(json.dumps(key))
    return out
