"""A persistent ``VkPipelineCache``: loaded at device creation, saved atomically after new pipelines.

File layout (little-endian), ``<cache_dir>/vulkan/pipelines-<vendor>-<device>.bin``::

    offset size
      0     8   magic b"INFDVKPC"
      8     4   format version (FORMAT_VERSION)
     12     4   header size (HEADER.size)
     16     4   vendorID
     20     4   deviceID
     24     4   driverVersion
     28    16   pipelineCacheUUID
     44    32   shader-set hash (sha256 of every shader source + compiler version)
     76     8   data size
     84    32   sha256 of the data
    116     -   data from vkGetPipelineCacheData

A file whose header does not match this device/driver/shader set (stale or foreign), or that is
truncated or corrupt, is ignored with a ``PipelineCacheWarning`` (and a log line); the cache is
rebuilt and the file replaced at the next save. Drivers also check their own header inside the
data, but not all of them survive corrupt data: the checksum keeps bad bytes away from them.
"""
from __future__ import annotations

import hashlib
import logging
import struct
import threading
import warnings
from pathlib import Path
from typing import Any, Protocol

from ..fileio import atomic_write

from .shaders import shader_set_hash

class VulkanDevice(Protocol):
    """What the cache needs of a device (typed here, not imported: the device owns the cache)."""

    vendor_id: int
    device_id: int
    driver_version: int
    pipeline_cache_uuid: bytes
    device: Any

log = logging.getLogger("inferd.vulkan.pipeline_cache")

MAGIC = b"INFDVKPC"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sIIIII16s32sQ32s")


class PipelineCacheWarning(UserWarning):
    """The on-disk pipeline cache was ignored (stale, foreign, truncated or corrupt)."""


def cache_path(dev: VulkanDevice, cache_dir: Path) -> Path:
    return cache_dir / "vulkan" / f"pipelines-{dev.vendor_id:04x}-{dev.device_id:04x}.bin"


def make_header(dev: VulkanDevice, shader_hash: bytes, data: bytes, magic: bytes = MAGIC,
                version: int = FORMAT_VERSION) -> bytes:
    return HEADER.pack(magic, version, HEADER.size, dev.vendor_id, dev.device_id, dev.driver_version,
                       dev.pipeline_cache_uuid, shader_hash, len(data), hashlib.sha256(data).digest())


def check_file(dev: VulkanDevice, shader_hash: bytes, blob: bytes, magic: bytes = MAGIC,
               version: int = FORMAT_VERSION) -> tuple[bytes | None, str]:
    """(payload, "ok") if ``blob`` is a valid file of this kind (``magic``, ``version``) for this device, driver
    and shader set, else (None, reason). The pipeline cache and the resident-pipeline list share this header."""
    if len(blob) < HEADER.size:
        return None, f"truncated header ({len(blob)} of {HEADER.size} bytes)"
    got_magic, ver, hsize, vendor, device, driver, uuid, shash, dsize, digest = HEADER.unpack_from(blob)
    if got_magic != magic:
        return None, f"not an inferd {'pipeline cache' if magic == MAGIC else 'pipeline list'} (bad magic)"
    if ver != version or hsize != HEADER.size:
        return None, f"format version {ver} (header {hsize} bytes), expected {version} ({HEADER.size})"
    if (vendor, device, driver, uuid) != (dev.vendor_id, dev.device_id, dev.driver_version, dev.pipeline_cache_uuid):
        return None, (f"made for another device or driver (vendor 0x{vendor:04x} device 0x{device:04x} driver {driver} "
                      f"uuid {uuid.hex()}; this is vendor 0x{dev.vendor_id:04x} device 0x{dev.device_id:04x} "
                      f"driver {dev.driver_version} uuid {dev.pipeline_cache_uuid.hex()})")
    if shash != shader_hash:
        return None, "made for another shader set (shaders or compiler changed)"
    data = blob[HEADER.size:]
    if len(data) != dsize:
        return None, f"truncated data ({len(data)} of {dsize} bytes)"
    if hashlib.sha256(data).digest() != digest:
        return None, "checksum mismatch (corrupt data)"
    return data, "ok"


class PipelineCache:
    """Owns the device's ``VkPipelineCache``. ``status``: "loaded", "missing", "disabled" or "rejected: <why>"."""

    def __init__(self, dev: VulkanDevice, cache_dir: Path | None) -> None:
        import vulkan as vk
        self._vk = vk
        self.dev = dev
        self.path = cache_path(dev, cache_dir) if cache_dir is not None else None
        self.shader_hash = bytes.fromhex(shader_set_hash()) if cache_dir is not None else b"\0" * 32
        self.dirty = False
        self.initial_bytes = 0
        self._lock = threading.Lock()
        data = b""
        if self.path is None:
            self.status = "disabled"
        else:
            try:
                blob = self.path.read_bytes()
            except FileNotFoundError:
                self.status = "missing"
            except OSError as e:
                self.status = f"rejected: unreadable ({e})"
                self._warn()
            else:
                got, why = check_file(dev, self.shader_hash, blob)
                if got is None:
                    self.status = f"rejected: {why}"
                    self._warn()
                    self.dirty = True  # replace the bad file at the next save
                else:
                    data = got
                    self.status = "loaded"
        self.handle = self._create(data)
        self.initial_bytes = len(data)

    def _warn(self) -> None:
        msg = f"ignoring Vulkan pipeline cache {self.path}: {self.status[len('rejected: '):]}; it will be rebuilt"
        log.warning(msg)
        warnings.warn(msg, PipelineCacheWarning, stacklevel=4)

    def _create(self, data: bytes) -> Any:
        vk = self._vk
        ffi = vk.ffi
        info = ffi.new("VkPipelineCacheCreateInfo*")
        info.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO
        buf = ffi.new("char[]", data) if data else ffi.NULL
        info.initialDataSize = len(data)
        info.pInitialData = buf
        out = ffi.new("VkPipelineCache*")
        res = vk.lib.vkCreatePipelineCache(self.dev.device, info, ffi.NULL, out)
        if res != vk.VK_SUCCESS and data:
            # the driver refused the data despite our header: start empty
            self.status = f"rejected: driver refused the data (VkResult {res})"
            self._warn()
            info.initialDataSize, info.pInitialData = 0, ffi.NULL
            res = vk.lib.vkCreatePipelineCache(self.dev.device, info, ffi.NULL, out)
        if res != vk.VK_SUCCESS:
            from ..errors import BackendError
            raise BackendError(f"vkCreatePipelineCache failed ({res})")
        return out[0]

    def data(self) -> bytes:
        """The driver's serialized cache (size query, then fetch: the binding has no wrapper for it)."""
        vk = self._vk
        ffi = vk.ffi
        size = ffi.new("size_t*")
        res = vk.lib.vkGetPipelineCacheData(self.dev.device, self.handle, size, ffi.NULL)
        if res != vk.VK_SUCCESS:
            raise RuntimeError(f"vkGetPipelineCacheData (size) failed ({res})")
        if size[0] == 0:
            return b""
        buf = ffi.new("char[]", size[0])
        res = vk.lib.vkGetPipelineCacheData(self.dev.device, self.handle, size, buf)
        if res not in (vk.VK_SUCCESS, vk.VK_INCOMPLETE):
            raise RuntimeError(f"vkGetPipelineCacheData failed ({res})")
        return bytes(ffi.buffer(buf, size[0]))

    def save(self, force: bool = False) -> bool:
        """Write the cache atomically (temp file + rename) if new pipelines were created; True if written."""
        with self._lock:
            if self.path is None or self.handle is None or not (self.dirty or force):
                return False
            data = self.data()
            blob = make_header(self.dev, self.shader_hash, data) + data
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(self.path, blob, fsync=True)
            except OSError as e:
                from .. import cache

                cache.report(self.path, e, "saving the Vulkan pipeline cache")
                return False
            self.dirty = False
            log.debug("saved pipeline cache %s (%d bytes of driver data)", self.path, len(data))
            return True

    def destroy(self) -> None:
        if self.handle is not None:
            self._vk.vkDestroyPipelineCache(self.dev.device, self.handle, None)
            self.handle = None
