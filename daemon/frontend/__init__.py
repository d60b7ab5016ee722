"""Model import: ONNX -> graph IR (shape inference, constant folding, BN folding, fusion)."""
from .onnx_import import import_model, load_onnx  # noqa: F401
