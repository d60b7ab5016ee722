"""ONNX import (``import_model``, ``import_template``: needs onnx) and shapes (``specialize``,
``check_dims``: do not). The ONNX side is imported on first use, so a compiled package loads without it."""
from typing import Any

from .shapes import check_dims, specialize  # noqa: F401

_ONNX = ("import_model", "import_template", "load_onnx")


def __getattr__(name: str) -> Any:
    if name in _ONNX:
        from . import onnx_import

        return getattr(onnx_import, name)
    raise AttributeError(name)
