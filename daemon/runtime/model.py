"""The user-facing model object: ``inferd.load(path, device=...)``."""
from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx

from ..errors import BackendError, WeightsStoreError
from ..ir import Graph, TensorInfo
from .cpu import CpuExecutor, check_feeds

log = logging.getLogger(__name__)


class Model:
    """A loaded model. ``run`` is not re-entrant (one arena); the daemon serialises runs per model."""

    def __init__(self, name: str, graph: Graph, executor: Any, device: str, load_s: float) -> None:
        self.name = name
        self.graph = graph
        self._exec = executor
        self.device = device
        self.load_s = load_s
        self._lock = threading.Lock()

    @property
    def inputs(self) -> list[TensorInfo]:
        return list(self.graph.inputs)

    @property
    def outputs(self) -> list[TensorInfo]:
        return list(self.graph.outputs)

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.graph.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.graph.outputs]

    @property
    def memory_bytes(self) -> int:
        return int(self._exec.memory_bytes)

    @property
    def kernels(self) -> dict[str, str]:
        """node name -> kernel name chosen for it."""
        return {layer.name: k.name for layer, k in getattr(self._exec, "choice", [])}

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = check_feeds(self.graph.inputs, feeds, self.name)
        with self._lock:
            return self._exec.run(feeds)

    def close(self) -> None:
        close = getattr(self._exec, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        ins = ", ".join(f"{t.name}{list(t.shape)}:{np.dtype(t.dtype).name}" for t in self.inputs)
        return f"<inferd.Model {self.name} on {self.device} ({ins})>"


def _vulkan_available() -> bool:
    try:
        from ..vulkan import available
    except Exception:
        return False
    try:
        return bool(available())
    except Exception:
        return False


def resolve_device(device: str) -> str:
    if device not in ("cpu", "vulkan", "auto"):
        raise ValueError(f"device must be 'cpu', 'vulkan' or 'auto', got {device!r}")
    if device == "auto":
        return "vulkan" if _vulkan_available() else "cpu"
    return device


def load(path: "str | os.PathLike | bytes | onnx.ModelProto", device: str = "cpu", batch: int = 1,
         kernels: dict[str, str] | None = None, shapes: dict[str, tuple[int, ...]] | None = None,
         name: str | None = None, cache_dir: str | os.PathLike | None = None, **options: Any) -> Model:
    """Load an ONNX model (or a compiled package directory) for ``device`` ('cpu', 'vulkan', 'auto').

    ``kernels`` forces kernels: {node name or op type: kernel name}. With ``cache_dir``, an ONNX file
    is compiled once into a package there and later loads read the package instead (cold start).
    """
    t0 = time.perf_counter()
    dev = resolve_device(device)
    params = None
    in_memory = not isinstance(path, (str, os.PathLike))
    if cache_dir is not None and not in_memory and Path(path).is_file():
        # Serve from a compiled package (plan + weights store): no protobuf parse, no folding, and
        # CPU weights already transformed. A damaged cache falls back to the ONNX file.
        from ..package import cached_package, load_package

        pkg = None
        try:
            pkg = cached_package(path, Path(cache_dir), batch=batch, device=dev)
            graph, params = load_package(pkg, device=dev, batch=batch, kernels=kernels)
            return _make(name or Path(path).stem, graph, params, dev, kernels, t0, options)
        except WeightsStoreError as e:
            log.warning("package cache for %s unusable (%s); loading the ONNX file", path, e)
            if pkg is not None:  # drop it so that the next load recompiles
                shutil.rmtree(pkg, ignore_errors=True)
    if not in_memory and Path(path).is_dir():
        from ..package import load_package

        graph, params = load_package(Path(path), device=dev, batch=batch, kernels=kernels)
        mname = name or Path(path).name
    else:
        from ..frontend import import_model

        graph = import_model(path, batch=batch, shapes=shapes)
        mname = name or (graph.name if in_memory else Path(path).stem)
    return _make(mname, graph, params, dev, kernels, t0, options)


def _make(mname: str, graph: Graph, params: dict[str, dict[str, np.ndarray]] | None, dev: str,
          kernels: dict[str, str] | None, t0: float, options: dict[str, Any]) -> Model:
    if dev == "cpu":
        ex = CpuExecutor(graph, kernels=kernels, params=params)
    else:
        try:
            from ..vulkan.device import get_device
            from ..vulkan.executor import VulkanModel
        except ImportError as e:
            raise BackendError(f"the Vulkan backend is not available: {e}") from e
        ex = VulkanModel(graph, get_device(), kernels=kernels, **options)
    return Model(mname, graph, ex, dev, time.perf_counter() - t0)
