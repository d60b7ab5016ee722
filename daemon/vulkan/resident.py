"""The pipelines a device's loads asked for, remembered on disk, so that a daemon can create them at its start.

Why: a cold load creates each compute pipeline its layers dispatch. From a filled ``VkPipelineCache`` that
still costs about a millisecond a pipeline on NVIDIA's driver, and about ten on lavapipe, whose cache keeps
nothing it can reuse (it compiles again): on the H200 squeezenet1_1's loaders spent ~40 ms of a 36 ms cold
load's thread time there, on lavapipe 160 of 280 ms. A daemon's device outlives its models, and the
pipelines of the models it serves are a device resource like the pipeline cache: created once at the
daemon's start, in the background at the lowest priority, a cold load of a model served before finds them
and creates none. Pipelines are keyed by shader variant and specialization constants, not by layer, so a
model needs 15-25 of them and models share most.

File ``<cache_dir>/vulkan/pipelines-<vendor>-<device>.list``: the pipeline cache's header (magic
``INFDVKPL``: device, driver, shader set, payload size and sha256), then a msgpack array of
``[shader, [[define, value], ...], [[spec constant, value], ...], last used (unix s), uses]``. A file for
another device, driver or shader set, or a damaged one, is ignored with a warning and rewritten at the
next save: at worst the daemon creates no pipelines at its start.
"""
from __future__ import annotations

import logging
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol, Sequence

import msgpack

from ..fileio import atomic_write
from .pipeline_cache import PipelineCacheWarning, check_file, make_header
from .pipeline_cache import VulkanDevice as CacheDevice
from .shaders import Defines, default_cache_dir, shader_set_hash


class VulkanDevice(CacheDevice, Protocol):
    """What this module reads of a device (``inferd.vulkan.device`` imports this module: no import back):
    the pipeline cache's header fields, which the list's header shares, and these."""
    closed: bool
    stats: dict[str, Any]
    pipeline_list: "PipelineList"

    def create_listed(self, reqs: Sequence[Request]) -> int: ...

log = logging.getLogger("inferd.vulkan.resident")

MAGIC = b"INFDVKPL"
FORMAT_VERSION = 1
#: entries kept in the file (least recently used dropped): well above what a daemon makes resident
MAX_ENTRIES = 2048
#: a request for a listed pipeline rewrites the file only when its stored "last used" is older than this
#: (the order the daemon creates them in needs hours, not seconds: a load's reuse must not cost a write)
REFRESH_S = 3600.0

#: one request: shader name, normalised defines, specialization constants (sorted items)
Request = tuple[str, Defines, tuple[tuple[str, Any], ...]]


def list_path(dev: "VulkanDevice", cache_dir: Path) -> Path:
    return cache_dir / "vulkan" / f"pipelines-{dev.vendor_id:04x}-{dev.device_id:04x}.list"


def request(name: str, defines: Defines, spec: Mapping[str, Any]) -> Request:
    return name, tuple(defines), tuple(sorted(spec.items()))


class PipelineList:
    """The device's recently requested pipelines. ``status``: "loaded", "missing", "disabled" or "rejected: <why>"."""

    def __init__(self, dev: "VulkanDevice", cache_dir: Path | None) -> None:
        self.dev = dev
        self.path = list_path(dev, cache_dir) if cache_dir is not None else None
        self.shader_hash = bytes.fromhex(shader_set_hash()) if cache_dir is not None else b"\0" * 32
        self._lock = threading.Lock()
        #: request -> [last used, uses]
        self._entries: dict[Request, list[float]] = {}
        self.dirty = False
        if self.path is None:
            self.status = "disabled"
            return
        try:
            blob = self.path.read_bytes()
        except FileNotFoundError:
            self.status = "missing"
            return
        except OSError as e:
            self._reject(f"unreadable ({e})")
            return
        data, why = check_file(dev, self.shader_hash, blob, MAGIC, FORMAT_VERSION)
        if data is None:
            self._reject(why)
            return
        try:
            self._entries = _decode(data)
        except (ValueError, TypeError, msgpack.UnpackException) as e:
            self._reject(f"undecodable entries ({type(e).__name__}: {e})")
            return
        self.status = "loaded"

    def _reject(self, why: str) -> None:
        self.status = f"rejected: {why}"
        self.dirty = True  # replaced at the next save
        msg = f"ignoring Vulkan pipeline list {self.path}: {why}; it will be rebuilt"
        log.warning(msg)
        warnings.warn(msg, PipelineCacheWarning, stacklevel=3)

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, reqs: Iterable[Request], now: float | None = None) -> None:
        """Note that a load asked for these pipelines (new ones, or ones not noted for ``REFRESH_S``, mark
        the file for the next save)."""
        if self.path is None:
            return
        t = time.time() if now is None else now
        with self._lock:
            for r in reqs:
                e = self._entries.get(r)
                if e is None:
                    self._entries[r] = [t, 1]
                    self.dirty = True
                else:
                    e[1] += 1
                    if t - e[0] > REFRESH_S:
                        e[0] = t
                        self.dirty = True

    def recent(self, n: int) -> list[Request]:
        """The ``n`` most recently used requests, most recent first."""
        with self._lock:
            ranked = sorted(self._entries.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))
        return [r for r, _ in ranked[:max(0, n)]]

    def save(self) -> bool:
        """Write the list atomically if it changed; True if written. A failure is reported, never raised."""
        with self._lock:
            if self.path is None or not self.dirty:
                return False
            keep = sorted(self._entries.items(), key=lambda kv: -kv[1][0])[:MAX_ENTRIES]
            self._entries = dict(keep)
            data = msgpack.packb([[n, [list(d) for d in defs], [list(s) for s in spec], e[0], int(e[1])]
                                  for (n, defs, spec), e in keep], use_bin_type=True)
            self.dirty = False
        blob = make_header(self.dev, self.shader_hash, data, MAGIC, FORMAT_VERSION) + data
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, blob, fsync=False)  # a hint: a torn file fails its checksum and is rebuilt
        except OSError as e:
            from .. import cache

            cache.report(self.path, e, "saving the Vulkan pipeline list")
            with self._lock:
                self.dirty = True
            return False
        return True


def _decode(data: bytes) -> dict[Request, list[float]]:
    rows = msgpack.unpackb(data, raw=False, strict_map_key=False)
    if not isinstance(rows, list):
        raise ValueError("not a list")
    out: dict[Request, list[float]] = {}
    for row in rows:
        name, defs, spec, used, uses = row
        if not isinstance(name, str):
            raise ValueError(f"shader name {name!r}")
        req = (name, tuple((str(k), str(v)) for k, v in defs), tuple((str(k), v) for k, v in spec))
        out[req] = [float(used), int(uses)]
    return out


def make_resident(dev: "VulkanDevice", limit: int, batch: int = 4) -> dict[str, float]:
    """Create the device's ``limit`` most recently used pipelines (those it lacks), a few per call so that a
    cold load running meanwhile waits at most for a few of them (the device lets a load wait on a pipeline
    another thread is creating rather than create it twice). A listed shader that no longer exists, or a
    variant that fails, is skipped. Returns counts and the seconds spent."""
    from ..errors import BackendError

    t0 = time.perf_counter()
    reqs = dev.pipeline_list.recent(limit)
    made = skipped = 0
    for i in range(0, len(reqs), max(1, batch)):
        if dev.closed:
            break
        part = reqs[i:i + batch]
        try:
            made += dev.create_listed(part)
        except BackendError as e:
            if dev.closed:
                break
            # one by one, so that one bad variant does not cost the others
            for r in part:
                try:
                    made += dev.create_listed([r])
                except BackendError as e1:
                    skipped += 1
                    log.debug("resident pipeline %s skipped: %s", r[0], e1)
            log.debug("resident pipelines batch failed (%s): retried one by one", e)
    st = {"listed": float(len(reqs)), "created": float(made), "skipped": float(skipped),
          "seconds": time.perf_counter() - t0}
    dev.stats["pipelines_resident"] = dev.stats.get("pipelines_resident", 0) + made
    return st


def listed(cache_dir: Path | None = None) -> bool:
    """Whether the cache directory lists pipelines of some device (a daemon that never served a Vulkan model
    from it has nothing to make resident, and should not start a driver for nothing)."""
    d = (cache_dir if cache_dir is not None else default_cache_dir()) / "vulkan"
    try:
        return any(d.glob("pipelines-*.list"))
    except OSError:
        return False
