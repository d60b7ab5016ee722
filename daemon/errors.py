"""The exception hierarchy of the engine. Every error names what was expected and what came."""
from __future__ import annotations


class InferdError(Exception):
    """Base of every error the engine raises on purpose."""


class ModelFormatError(InferdError):
    """The model file is not a readable ONNX model (truncated, random bytes, bad graph)."""


class UnsupportedOpError(InferdError):
    """An operator (or an attribute value of one) that the engine does not implement."""

    def __init__(self, op_type: str, node: str, opset: int | None = None, detail: str = "") -> None:
        self.op_type, self.node, self.opset = op_type, node, opset
        msg = f"unsupported operator {op_type!r} at node {node!r}"
        if opset is not None:
            msg += f" (opset {opset})"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class ShapeError(InferdError):
    """Shapes that do not fit together in the graph (found during static shape inference)."""


class InputError(InferdError, ValueError):
    """A caller passed an input of the wrong name, shape or dtype."""


class WeightsStoreError(InferdError):
    """A weights store or compiled package is truncated, corrupted, stale or of another version."""


class StalePackageError(WeightsStoreError):
    """A compiled package made for another device, engine version or kernel choice: rebuild it."""


class PackageOptionsError(WeightsStoreError):
    """A sound package compiled with other options (batch, forced kernels) than the load asks for:
    the caller's choice to make, so it is reported, not rebuilt behind their back."""


class PackageUnsupported(InferdError):
    """A model the package format cannot hold yet (a Vulkan model with tensors shaped at run time, which loads as
    a Vulkan head and a CPU tail): the loader compiles it in memory instead of through the package cache.
    ``template``: the model as the compile imported it, so the loader does not import it a second time."""

    def __init__(self, message: str, template: object = None) -> None:
        super().__init__(message)
        self.template = template


class KernelError(InferdError):
    """A forced kernel does not apply to the node it was forced on, or names no kernel."""


class BackendError(InferdError):
    """The compute backend (Vulkan device, driver) failed or is unavailable."""


class DeviceFault(BackendError):
    """The device failed under a request or a load in a way the daemon recovers from by recreating
    the device and reloading its models (the request itself can be run again: inference is idempotent)."""


class DeviceLostError(DeviceFault):
    """``VK_ERROR_DEVICE_LOST``: a driver reset or GPU watchdog took the device away."""


class DeviceTimeoutError(DeviceFault):
    """A submitted dispatch did not finish (its fence did not signal) within the timeout."""


class DeviceOutOfMemoryError(DeviceFault):
    """Out of device memory; ``asked`` and ``free`` (bytes; -1 when unknown) say how far off it was."""

    def __init__(self, message: str, asked: int = -1, free: int = -1) -> None:
        self.asked, self.free = int(asked), int(free)
        super().__init__(message)
