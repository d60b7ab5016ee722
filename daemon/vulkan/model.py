"""``VulkanModel``: a graph loaded whole before its first run (every layer of the cold backend prepared in
batched stages, one command buffer recorded). Tools and tests that want a fully loaded model use it;
``inferd.load`` takes the planned cold path over the same backend."""
from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np

from ..ir import Graph, TensorInfo
from .cold import VulkanColdBackend
from .device import Region, VulkanDevice
from .shaders import ShaderCache


class VulkanModel:
    """A graph loaded whole on a Vulkan device before its first run: the cold backend with every layer
    prepared in batched stages and one command buffer recorded. ``run(feeds) -> outputs``; ``close()``
    frees it."""

    def __init__(self, graph: Graph, device: VulkanDevice | None = None, kernels: Mapping[str, str] | None = None,
                 cache: ShaderCache | str | bool | None = None, profile: bool = False, **precision: Any) -> None:
        t0 = time.perf_counter()
        # precision options (precision, fp32_layers, precision_guard): as VulkanColdBackend's
        self._b = b = VulkanColdBackend.loaded(graph, kernels=kernels, device=device, cache=cache, profile=profile,
                                               **precision)
        b.load_stats["total_load_s"] = time.perf_counter() - t0
        self.graph = graph
        self.device = b.device

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._b.run(feeds)

    __call__ = run

    @property
    def load_stats(self) -> dict[str, Any]:
        return self._b.load_stats

    @property
    def kernel_names(self) -> dict[str, str]:
        """Node name -> Vulkan kernel chosen ("alias" for ops that are views)."""
        return self._b.kernel_names

    @property
    def memory_bytes(self) -> int:
        return self._b.memory_bytes

    @property
    def act_region(self) -> Region:
        return self._b.act_region

    @property
    def io_region(self) -> Region:
        return self._b.io.region

    @property
    def weight_regions(self) -> list[Region]:
        return self._b.weight_regions

    @property
    def input_infos(self) -> list[TensorInfo]:
        return self._b.input_infos

    @property
    def output_infos(self) -> list[TensorInfo]:
        return list(self.graph.outputs)

    def last_profile(self) -> list[dict[str, Any]]:
        return self._b.last_profile()

    def close(self) -> None:
        self._b.close()

    def __enter__(self) -> "VulkanModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
