"""Layers' weights carved out of a few large device allocations.

Why: a cold load used to make one ``vkAllocateMemory`` + ``vkMapMemory`` per layer, from every loader
thread at once. On the H100 (host-visible device-local memory through the BAR) those calls take about
a millisecond each and the driver serialises them: a sampling profile of a mobilenetv2 cold load put a
quarter of the loader threads' time there. Here a layer takes a 256-byte-aligned range of the current
slab; a slab is sized from what the model's weights are expected to need, so few allocations are made
and little is left over. A layer whose weights exceed half a slab gets an allocation of its own.

A slab is freed when the last layer placed in it is released (a warm kernel switch releases the old
kernel's weights; another input shape of the model may still bind a layer's range after its own
backend closed: the holders count, not the backend).
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .kernel import ALIGN, align_up

if TYPE_CHECKING:
    from .device import Region, VulkanDevice

MIN_SLAB = 1 << 20
MAX_SLAB = 64 << 20


class WeightSlabs:
    def __init__(self, dev: "VulkanDevice", expected: int, label: str = "weights") -> None:
        """``expected``: the bytes the model's weights should take in all (an estimate: the planner's
        kernel choice and a warm switch change it); slabs follow it down, between 1 and 64 MiB."""
        self.dev = dev
        self.label = label
        self._lock = threading.Lock()
        self._left = max(0, int(expected))
        self._open: "Region | None" = None
        self._used = 0
        self._refs: dict[int, int] = {}
        self._regions: dict[int, "Region"] = {}

    def take(self, size: int, label: str) -> tuple["Region", int]:
        """A range of ``size`` bytes: (region, offset)."""
        size = align_up(max(int(size), 4), ALIGN)
        with self._lock:
            slab = self._slab_size()
            if size > slab // 2:
                r = self.dev.allocate_region(size, f"{self.label}:{label}")
                self._hold(r, 1)
                self._left = max(0, self._left - size)
                return r, 0
            if self._open is None or self._used + size > self._open.size:
                self._retire_open()
                self._open = self.dev.allocate_region(slab, f"{self.label}:slab{len(self._regions)}")
                self._used = 0
                self._hold(self._open, 0)
            off = self._used
            self._used += size
            self._refs[id(self._open)] += 1
            self._left = max(0, self._left - size)
            return self._open, off

    def give(self, region: "Region") -> None:
        """Release one range of ``region``; the allocation goes when nothing placed in it is held and
        no more will be (it is not the slab being filled)."""
        with self._lock:
            k = id(region)
            if k not in self._refs:
                return
            self._refs[k] -= 1
            if self._refs[k] <= 0 and region is not self._open:
                self._drop(region)

    def close(self) -> None:
        """No more ranges will be taken: the slab being filled goes if nothing is placed in it."""
        with self._lock:
            self._retire_open()

    @property
    def regions(self) -> list["Region"]:
        """The allocations held now (each counted once, whatever number of layers it holds)."""
        with self._lock:
            return list(self._regions.values())

    def _slab_size(self) -> int:
        return max(MIN_SLAB, min(MAX_SLAB, align_up(self._left, 1 << 16)))

    def _hold(self, r: "Region", n: int) -> None:
        self._refs[id(r)] = n
        self._regions[id(r)] = r

    def _retire_open(self) -> None:
        r = self._open
        self._open = None
        if r is not None and self._refs.get(id(r), 0) <= 0:
            self._drop(r)

    def _drop(self, r: "Region") -> None:
        self._refs.pop(id(r), None)
        self._regions.pop(id(r), None)
        self.dev.free_region(r)
