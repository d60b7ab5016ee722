"""The Vulkan backend: device, static arena, SPIR-V and pipeline caches, recorded command buffers.

``available()`` says whether a Vulkan device can be used; ``get_device()`` returns the process-wide
device; ``VulkanModel(graph, device)`` loads a graph on it. Importing this package does not load
the Vulkan loader (``inferd.vulkan.kernel`` and the ``*_vulkan`` host bindings never do).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .device import VulkanDevice
    from .model import VulkanModel

__all__ = ["available", "get_device", "import_load_path", "VulkanModel", "VulkanDevice"]


def available() -> bool:
    """True when the Vulkan loader, a device with a compute queue and the shader sources are present
    (never raises: a missing binding or a failing driver is a False)."""
    try:
        from .device import available as _dev_available
        from .shaders import shader_dir
        shader_dir()
        return bool(_dev_available())
    except Exception:
        return False


def import_load_path() -> float:
    """Import what a Vulkan cold load runs that ``import inferd`` leaves to its first use: the backend's modules and
    every kernel's host binding (58 ms on the 2-core VM). The daemon does it when it opens the device at its start,
    so that the first cold load after a start does not. Loads the Vulkan binding. Returns the seconds it took."""
    import time

    t0 = time.perf_counter()
    from . import cold, executor, host, model  # noqa: F401

    executor._import_kernels()
    return time.perf_counter() - t0


def get_device(config: Any = None) -> "VulkanDevice":
    from .device import get_device as _get
    return _get(config)


def __getattr__(name: str) -> Any:
    if name == "VulkanModel":
        from .model import VulkanModel
        return VulkanModel
    if name == "VulkanDevice":
        from .device import VulkanDevice
        return VulkanDevice
    raise AttributeError(name)
