"""inferd: an inference daemon for Jetson and other Linux boards.

``inferd.load(path, device="cpu"|"vulkan"|"auto")`` returns a model whose ``run({name: array})``
returns ``{name: array}``.
"""
from __future__ import annotations

__version__ = "0.2.0"

from .errors import (BackendError, InferdError, InputError, KernelError, ModelFormatError,  # noqa: F401
                     ShapeError, UnsupportedOpError, WeightsStoreError)
from .runtime.model import Model, load  # noqa: F401
