"""The Vulkan device: instance, physical-device choice, compute queue, memory regions, pipelines.

One process owns one device for its whole life (``get_device``); models share it. Choice order:
discrete > integrated > virtual > CPU (Mesa lavapipe), unless configured by index or name
(``VulkanConfig.device`` or ``$INFERD_VK_DEVICE``). Debug mode (``debug=True`` or
``$INFERD_VK_DEBUG=1``) enables ``VK_LAYER_KHRONOS_validation`` and a debug messenger that
records every message; ``validation_errors`` lists the errors.

Memory policy: a region (one ``VkBuffer`` on one ``VkDeviceMemory``) is allocated DEVICE_LOCAL |
HOST_VISIBLE when such a type exists with a heap large enough (Jetson's unified memory, desktop
GPUs with resizable BAR, lavapipe) and is then persistently mapped, so weights and inputs are
written in place; otherwise it is DEVICE_LOCAL only and filled through a reusable staging buffer.

Teardown is explicit: ``close()`` (also run at interpreter exit) closes the models still open,
saves the pipeline cache, and destroys every Vulkan object before the instance.
"""
from __future__ import annotations

import atexit
import ctypes
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .. import faults
from ..errors import (BackendError, DeviceFault, DeviceLostError, DeviceOutOfMemoryError,
                      DeviceTimeoutError)
from . import devpool, raw
from .devpool import DevicePool
from .kernel import ALIGN
from .shaders import ShaderCache, ShaderModule, default_cache_dir

log = logging.getLogger("inferd.vulkan")

try:  # the loader may be missing entirely (no libvulkan.so.1): the backend is then unavailable
    import vulkan as vk
    _IMPORT_ERROR: Exception | None = None
except Exception as e:  # pragma: no cover - depends on the machine
    vk = None  # type: ignore[assignment]
    _IMPORT_ERROR = e

VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"
#: uploads of at least this many bytes into mapped memory copy without the GIL. Below, the copy keeps it: a thread
#: that lets the GIL go while the loaders and the executor run Python waits up to the switch interval (0.5 ms in a
#: cold load) to have it back, and 4 MiB take about that long to copy (the H100's BAR mapping took a 16 MiB memmove
#: at 13-14 GB/s, where a cold load's uploads of 64 KiB and more had averaged 1.4 GB/s of wall time on the loaders)
NOGIL_COPY = 4 << 20
#: fences a device keeps for its models' loads (``VulkanDevice.take_fence``): a daemon loads models one after another
SPARE_FENCES = 2
_TYPE_RANK = {2: 0, 1: 1, 3: 2, 4: 3, 0: 4}  # discrete, integrated, virtual, cpu, other
_TYPE_NAME = {0: "other", 1: "integrated", 2: "discrete", 3: "virtual", 4: "cpu"}


@dataclass(frozen=True)
class VulkanConfig:
    #: physical device by index (in enumeration order) or by a case-insensitive name substring
    device: int | str | None = None
    #: validation layers + debug messenger
    debug: bool = False
    #: root of the SPIR-V and pipeline caches; None = default (~/.cache/inferd), "" = no disk caches
    cache_dir: str | None = None
    #: never use host-visible device memory (tests the staging path on unified-memory devices)
    force_staging: bool = False
    #: apiVersion requested from the instance
    api_version: tuple[int, int] = (1, 1)
    #: create (and drop) one tiny pipeline at device creation so that the driver's shader compiler is
    #: loaded then, not inside the first model's cold load (env INFERD_VK_WARM=0 turns it off)
    warm_driver: bool = True

    @staticmethod
    def from_env(base: "VulkanConfig | Mapping[str, Any] | None" = None) -> "VulkanConfig":
        if isinstance(base, VulkanConfig):
            cfg = base
        else:
            cfg = VulkanConfig(**dict(base or {}))
        dev = os.environ.get("INFERD_VK_DEVICE")
        if cfg.device is None and dev:
            cfg = replace(cfg, device=int(dev) if dev.isdigit() else dev)
        if not cfg.debug and os.environ.get("INFERD_VK_DEBUG", "") not in ("", "0"):
            cfg = replace(cfg, debug=True)
        if cfg.warm_driver and os.environ.get("INFERD_VK_WARM", "") == "0":
            cfg = replace(cfg, warm_driver=False)
        return cfg


@dataclass(frozen=True)
class DeviceCaps:
    """What kernels may look at when they plan dispatches (no Vulkan objects)."""

    name: str
    vendor_id: int
    device_type: str
    subgroup_size: int
    max_shared_bytes: int
    max_workgroup_invocations: int
    max_workgroup_count: tuple[int, int, int]
    max_storage_range: int
    min_storage_align: int
    max_push_bytes: int


@dataclass
class Region:
    """One buffer on its own memory allocation or on a range of the device pool's; ``mapped`` is a uint8 view
    when host-visible."""

    buffer: Any
    memory: Any
    size: int
    host_visible: bool
    coherent: bool
    mapped: np.ndarray | None
    label: str
    _raw_map: Any = field(default=None, repr=False)
    heap: int = -1  # memory heap and allocation size, for the bytes-free figure of an OOM error
    alloc_size: int = 0
    #: HOST_CACHED: host reads are fast. Device-local memory the host can map without it (a discrete GPU's
    #: BAR) takes writes at full speed but reads at PCIe-uncached speed (~100 MB/s)
    cached: bool = False
    #: where the buffer is bound in ``memory``: 0 for an allocation of its own; a range of the device pool's
    #: memory (``pool`` set) starts anywhere
    offset: int = 0
    pool: Any = field(default=None, repr=False)

    def view(self, offset: int, shape: Sequence[int], dtype: Any) -> np.ndarray:
        assert self.mapped is not None, f"region {self.label} is not host-visible"
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return self.mapped[offset:offset + n].view(dtype).reshape(shape)


@dataclass
class Pipeline:
    handle: Any
    layout: Any
    set_layout: Any
    module: ShaderModule
    spec: tuple[tuple[str, Any], ...]
    cache_hit: bool | None  # from VK_EXT_pipeline_creation_feedback when the driver reports it


_devices: "weakref.WeakSet[VulkanDevice]" = weakref.WeakSet()
_shared: "VulkanDevice | None" = None
#: how long a fence wait lasts before the dispatch counts as hung (DeviceTimeoutError); the daemon
#: sets it from its ``gpu_timeout`` option
fence_timeout_s: float = 120.0


def set_fence_timeout(seconds: float) -> None:
    global fence_timeout_s
    fence_timeout_s = float(seconds)
_shared_lock = threading.Lock()
_available: bool | None = None


def binding_kinds(man: Any) -> tuple[str, ...]:
    """The descriptor kinds of a shader manifest's bindings, in binding order (the set layout's key)."""
    return tuple(b.kind for b in man.bindings)


def descriptor_type(kind: str) -> int:
    if kind == "buffer":
        return vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
    if kind == "texel":
        return vk.VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER
    if kind in ("image", "image16"):
        return vk.VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER
    raise BackendError(f"unknown descriptor kind {kind!r}")


def _check_loader() -> None:
    if vk is None:
        raise BackendError(f"Vulkan loader not available: {_IMPORT_ERROR}")


def available() -> bool:
    """True when a Vulkan instance can be created and has at least one device with a compute queue."""
    global _available
    if _available is not None:
        return _available
    if vk is None:
        _available = False
        return False
    try:
        app = vk.VkApplicationInfo(pApplicationName="inferd-probe", apiVersion=vk.VK_MAKE_VERSION(1, 1, 0))
        inst = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=app), None)
        try:
            ok = any(any(q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT for q in vk.vkGetPhysicalDeviceQueueFamilyProperties(pd))
                     for pd in vk.vkEnumeratePhysicalDevices(inst))
        finally:
            vk.vkDestroyInstance(inst, None)
        _available = bool(ok)
    except Exception as e:  # any loader/driver failure means "no Vulkan here"
        log.info("Vulkan unavailable: %s", e)
        _available = False
    return _available


def get_device(config: "VulkanConfig | Mapping[str, Any] | None" = None) -> "VulkanDevice":
    """The process-wide shared device, created on first call (thread-safe).

    A later call with a different config gets the existing device (one device per process) and a
    log line; close it first (``close_shared_device``) to change the configuration.
    """
    global _shared
    with _shared_lock:
        cfg = VulkanConfig.from_env(config)
        if _shared is not None and not _shared.closed:
            if config is not None and cfg != _shared.config:
                log.info("get_device: keeping the existing device (%s); requested config %s differs", _shared.config, cfg)
            return _shared
        _shared = VulkanDevice(cfg)
        return _shared


def shared_device_if_open() -> "VulkanDevice | None":
    """The process-wide device when one is open (never creates one: a CPU-only daemon must not start a driver
    just to ask what memory it has)."""
    d = _shared
    return d if d is not None and not d.closed else None


def close_shared_device() -> None:
    global _shared
    with _shared_lock:
        if _shared is not None:
            _shared.close()
            _shared = None


@atexit.register
def _close_all() -> None:
    for d in list(_devices):
        try:
            d.close()
        except Exception as e:  # pragma: no cover - best effort at exit
            log.warning("closing Vulkan device at exit: %s", e)


class VulkanDevice:
    """A logical device with one compute queue, plus the caches and pools models share."""

    def __init__(self, config: "VulkanConfig | Mapping[str, Any] | None" = None) -> None:
        _check_loader()
        self.config = VulkanConfig.from_env(config)
        self.closed = False
        self._closing = False  # close() has begun (its models close before the device lock is taken)
        self.messages: list[tuple[int, str]] = []
        self.queue_lock = threading.Lock()
        self._lock = threading.RLock()
        self._models: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._shader_modules: dict[str, Any] = {}
        self._set_layouts: dict[tuple[str, ...], Any] = {}
        self._pipe_layouts: dict[tuple[tuple[str, ...], int], Any] = {}
        self._pipelines: dict[tuple[str, tuple[tuple[str, Any], ...]], Pipeline] = {}
        #: pipelines being created by some thread right now (others wait on the event instead of compiling twice)
        self._inflight: dict[tuple[str, tuple[tuple[str, Any], ...]], threading.Event] = {}
        self._staging: Region | None = None
        self.pool = self.host_pool = None
        self._messenger = None
        self._callback = None
        #: pipelines_created: new VkPipelines; pipelines_from_loaded_cache: of those, created through a
        #: pipeline cache initialised from the disk file; pipeline_cache_hits: creations the driver
        #: reported (VK_EXT_pipeline_creation_feedback) as served from the cache; pipelines_reused:
        #: requests served by a pipeline this device already had.
        self.stats = {"pipelines_created": 0, "pipelines_from_loaded_cache": 0, "pipeline_cache_hits": 0,
                      "pipeline_feedback": 0, "pipelines_reused": 0}
        t0 = time.perf_counter()
        self._create_instance()
        try:
            self._pick_physical()
            self._create_device()
            cache_dir = self.config.cache_dir
            self.cache_dir: Path | None = None if cache_dir == "" else Path(cache_dir) if cache_dir else default_cache_dir()
            self.shader_cache = ShaderCache(self.cache_dir)
            self.shader_cache.preload_sources()
            self.shader_cache.preload_bundle()
            from .pipeline_cache import PipelineCache  # local: it imports this module's types
            from .resident import PipelineList
            self.pipeline_cache = PipelineCache(self, self.cache_dir)
            self.pipeline_list = PipelineList(self, self.cache_dir)
        except BaseException:
            self._destroy()
            raise
        self.warm_s = self._warm_driver() if self.config.warm_driver else 0.0
        self.pool: DevicePool | None = self._create_pool(devpool.capacity(), self._pool_type(False))
        #: host regions (a model's input/output staging) from a small pool of the host type, or from the device
        #: pool where that is the same memory type, mapped (lavapipe unless force_staging)
        self.host_pool: DevicePool | None = self.pool
        if self.pool is not None:
            host_type = self._pool_type(True)
            if host_type != self.pool.type_index or self.pool.mapped is None:
                self.host_pool = self._create_pool(devpool.host_capacity(devpool.capacity()), host_type, host=True)
        self.create_s = time.perf_counter() - t0
        _devices.add(self)

    # ---------------------------------------------------------------- creation
    def _warm_driver(self) -> float:
        """Create and destroy one small pipeline, outside the pipeline cache and the device's books.

        Why: drivers load their shader compiler at the first pipeline (NVIDIA's libnvidia-gpucomp is
        ~70 MB, mapped lazily); on the H100 with the page cache dropped that first creation cost a
        model's cold load 50-80 ms. A daemon owns its device for hours, so that cost belongs to device
        bring-up. Nothing is cached or counted: models see the same pipelines and statistics either way.

        Likewise a process's first command buffer and first descriptor pool: on the H100 the first
        vkAllocateCommandBuffers + vkBeginCommandBuffer of a process took 0.6-0.8 ms and its first descriptor pool
        0.17-0.19 ms, later ones 0.01-0.03 (scripts/device/_vk_setup_micro.py), and a cold load made both."""
        t0 = time.perf_counter()
        try:
            mod = self.shader_cache.get("copy")
            with self._lock:
                batch = self._create_infos([(mod, {})])
            handles, _ = self._create_batch(batch, cache=vk.ffi.NULL)
            for h in handles:
                vk.vkDestroyPipeline(self.device, h, None)
        except Exception as e:  # a missing compiler or shader only loses the head start
            log.debug("driver warm-up skipped: %s", e)
        try:
            pool = vk.vkCreateCommandPool(self.device, vk.VkCommandPoolCreateInfo(queueFamilyIndex=self.queue_family),
                                          None)
            try:
                raw.end_command_buffer(raw.allocate_command_buffer(self.device, pool))
            finally:
                vk.vkDestroyCommandPool(self.device, pool, None)  # (frees its command buffer)
            types = sorted({descriptor_type(k) for k in ("buffer", "texel", "image")})
            raw.destroy_descriptor_pool(self.device, raw.create_descriptor_pool(self.device, [(t, 1) for t in types], 1,
                                                                                free_sets=True))
        except Exception as e:
            log.debug("command buffer warm-up skipped: %s", e)
        return time.perf_counter() - t0

    def _create_instance(self) -> None:
        layers: list[str] = []
        exts: list[str] = []
        if self.config.debug:
            have_layers = {lp.layerName for lp in vk.vkEnumerateInstanceLayerProperties()}
            have_exts = {e.extensionName for e in vk.vkEnumerateInstanceExtensionProperties(None)}
            if VALIDATION_LAYER in have_layers:
                layers.append(VALIDATION_LAYER)
            else:
                log.warning("debug mode: %s is not installed; running without validation", VALIDATION_LAYER)
            if "VK_EXT_debug_utils" in have_exts:
                exts.append("VK_EXT_debug_utils")
        major, minor = self.config.api_version
        app = vk.VkApplicationInfo(pApplicationName="inferd", applicationVersion=1, pEngineName="inferd",
                                   engineVersion=1, apiVersion=vk.VK_MAKE_VERSION(major, minor, 0))
        info = vk.VkInstanceCreateInfo(pApplicationInfo=app, enabledLayerCount=len(layers), ppEnabledLayerNames=layers or None,
                                       enabledExtensionCount=len(exts), ppEnabledExtensionNames=exts or None)
        try:
            self.instance = vk.vkCreateInstance(info, None)
        except Exception as e:
            raise BackendError(f"vkCreateInstance failed: {e!r}") from e
        self.validation = bool(layers)
        if "VK_EXT_debug_utils" in exts:
            self._install_messenger()

    def _install_messenger(self) -> None:
        ffi = vk.ffi
        me = weakref.ref(self)

        @ffi.callback("VkBool32(VkDebugUtilsMessageSeverityFlagBitsEXT, VkDebugUtilsMessageTypeFlagsEXT, "
                      "const VkDebugUtilsMessengerCallbackDataEXT*, void*)")
        def callback(severity: int, types: int, data: Any, user: Any) -> int:
            try:
                msg = ffi.string(data.pMessage).decode("utf-8", "replace") if data.pMessage else ""
                d = me()
                if d is not None:
                    d.messages.append((int(severity), msg))
                if severity >= vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT:
                    log.error("Vulkan validation: %s", msg)
                elif severity >= vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT:
                    log.warning("Vulkan validation: %s", msg)
            except Exception:  # never raise into the driver
                pass
            return 0

        info = ffi.new("VkDebugUtilsMessengerCreateInfoEXT*")
        info.sType = vk.VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT
        info.messageSeverity = (vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT
                                | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT)
        info.messageType = (vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT
                            | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT)
        info.pfnUserCallback = callback
        create = vk.vkGetInstanceProcAddr(self.instance, "vkCreateDebugUtilsMessengerEXT")
        self._messenger = create(self.instance, info, None)
        self._callback = callback  # keep the cffi callback alive as long as the messenger

    @property
    def validation_errors(self) -> list[str]:
        return [m for s, m in self.messages if s >= vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT]

    def _pick_physical(self) -> None:
        pds = list(vk.vkEnumeratePhysicalDevices(self.instance))
        cands = []
        for idx, pd in enumerate(pds):
            props = vk.vkGetPhysicalDeviceProperties(pd)
            qfs = vk.vkGetPhysicalDeviceQueueFamilyProperties(pd)
            qf = next((i for i, q in enumerate(qfs) if q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT), None)
            if qf is None:
                continue
            cands.append((idx, pd, props, qf))
        if not cands:
            raise BackendError("no Vulkan device with a compute queue")
        want = self.config.device
        if isinstance(want, int):
            chosen = [c for c in cands if c[0] == want]
            if not chosen:
                raise BackendError(f"Vulkan device index {want} not found; devices: "
                                   f"{[(c[0], c[2].deviceName) for c in cands]}")
        elif isinstance(want, str) and want:
            chosen = [c for c in cands if want.lower() in str(c[2].deviceName).lower()]
            if not chosen:
                raise BackendError(f"no Vulkan device name contains {want!r}; devices: {[c[2].deviceName for c in cands]}")
        else:
            chosen = sorted(cands, key=lambda c: (_TYPE_RANK.get(c[2].deviceType, 9), c[0]))
        idx, pd, props, qf = chosen[0]
        self.physical = pd
        self.queue_family = qf
        self.index = idx
        self.name = str(props.deviceName)
        self.vendor_id = int(props.vendorID)
        self.device_id = int(props.deviceID)
        self.driver_version = int(props.driverVersion)
        self.api_version = int(props.apiVersion)
        self.device_type = _TYPE_NAME.get(props.deviceType, "other")
        self.pipeline_cache_uuid = bytes(vk.ffi.buffer(props.pipelineCacheUUID))
        lim = props.limits
        sg = vk.VkPhysicalDeviceSubgroupProperties()
        m3 = vk.VkPhysicalDeviceMaintenance3Properties(pNext=sg)
        p2 = vk.VkPhysicalDeviceProperties2(pNext=m3)
        try:
            vk.vkGetPhysicalDeviceProperties2(self.physical, p2)
            subgroup, max_alloc = int(sg.subgroupSize) or 32, int(m3.maxMemoryAllocationSize) or (1 << 30)
        except Exception:  # a 1.0-only driver
            subgroup, max_alloc = 32, 1 << 30
        self.max_allocation = max_alloc
        self.non_coherent_atom = int(lim.nonCoherentAtomSize)
        # GPU timestamps (VulkanModel(profile=True)): ns per tick, and whether the compute queue has them
        self.timestamp_period = float(lim.timestampPeriod)
        qprops = vk.vkGetPhysicalDeviceQueueFamilyProperties(pd)[qf]
        self.timestamps = int(qprops.timestampValidBits) > 0 and self.timestamp_period > 0
        # Uniform texel buffers (RGBA32F views) for the CPU-type kernels: on lavapipe a texel fetch is a
        # straight-line gather while a storage-buffer load is a per-lane loop (several times slower).
        # Only CPU-type devices get the usage bit, so GPU buffers are created exactly as before.
        self.texel_buffers = self.device_type == "cpu"
        self.min_texel_align = int(lim.minTexelBufferOffsetAlignment)
        self.max_texel_elements = int(lim.maxTexelBufferElements)
        self.caps = DeviceCaps(
            name=self.name, vendor_id=self.vendor_id, device_type=self.device_type, subgroup_size=subgroup,
            max_shared_bytes=int(lim.maxComputeSharedMemorySize),
            max_workgroup_invocations=int(lim.maxComputeWorkGroupInvocations),
            max_workgroup_count=tuple(int(x) for x in lim.maxComputeWorkGroupCount),  # type: ignore[arg-type]
            max_storage_range=int(lim.maxStorageBufferRange),
            min_storage_align=int(lim.minStorageBufferOffsetAlignment),
            max_push_bytes=int(lim.maxPushConstantsSize))
        mp = vk.vkGetPhysicalDeviceMemoryProperties(pd)
        self._mem_types = [(int(mp.memoryTypes[i].propertyFlags), int(mp.memoryTypes[i].heapIndex))
                           for i in range(mp.memoryTypeCount)]
        self._heaps = [int(mp.memoryHeaps[i].size) for i in range(mp.memoryHeapCount)]
        self._heap_local = [bool(int(mp.memoryHeaps[i].flags) & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
                            for i in range(mp.memoryHeapCount)]
        self._heap_used = [0] * len(self._heaps)
        exts = {e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(pd, None)}
        self._feedback = "VK_EXT_pipeline_creation_feedback" in exts
        from .features import read_features

        #: optional features (16-bit storage, float16/int8 arithmetic) as the driver reports them, less any
        #: masked by $INFERD_VK_MASK_FEATURES; enabled at device creation; the precision planner reads them
        self.features = read_features(vk, pd, self.api_version, self.instance)
        log.info("Vulkan device %d: %s (%s, vendor 0x%04x, subgroup %d)", idx, self.name, self.device_type,
                 self.vendor_id, subgroup)

    def _create_device(self) -> None:
        qinfo = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.queue_family, queueCount=1, pQueuePriorities=[1.0])
        exts = ["VK_EXT_pipeline_creation_feedback"] if self._feedback else []
        from .features import feature_chain

        chain, fexts = feature_chain(vk, self.features, self.api_version)
        exts += fexts
        info = vk.VkDeviceCreateInfo(pNext=chain, queueCreateInfoCount=1, pQueueCreateInfos=[qinfo],
                                     enabledExtensionCount=len(exts), ppEnabledExtensionNames=exts or None)
        try:
            self.device = vk.vkCreateDevice(self.physical, info, None)
        except Exception as e:
            raise BackendError(f"vkCreateDevice failed on {self.name}: {e!r}") from e
        self.queue = vk.vkGetDeviceQueue(self.device, self.queue_family, 0)
        self._cmd_pool = vk.vkCreateCommandPool(self.device, vk.VkCommandPoolCreateInfo(
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=self.queue_family), None)
        self._upload_fence = vk.vkCreateFence(self.device, vk.VkFenceCreateInfo(), None)
        #: signalled fences for the models' loads (``take_fence``): NVIDIA's vkCreateFence took 0.3-0.4 ms of every
        #: cold load's set-up on the H100 hosts (lavapipe's 10-20 us), made here at the device's open instead
        self._spare_fences: list[Any] = [self._new_fence() for _ in range(SPARE_FENCES)]

    def _new_fence(self) -> Any:
        return vk.vkCreateFence(self.device, vk.VkFenceCreateInfo(flags=vk.VK_FENCE_CREATE_SIGNALED_BIT), None)

    def take_fence(self) -> Any:
        """A signalled fence for a model (one kept from the device's open or from a closed model, else a new one);
        ``give_fence`` hands it back."""
        with self._lock:
            if self._spare_fences:
                return self._spare_fences.pop()
        return self._new_fence()

    def give_fence(self, fence: Any, signalled: bool) -> None:
        """Keep ``fence`` (``signalled``: its last submission completed) for the next model's ``take_fence``, or
        destroy it (not known signalled, enough kept, the device closing)."""
        with self._lock:
            if signalled and not (self.closed or self._closing) and len(self._spare_fences) < SPARE_FENCES:
                self._spare_fences.append(fence)
                return
            if self.device is not None and not self.closed:
                vk.vkDestroyFence(self.device, fence, None)

    # ---------------------------------------------------------------- memory
    def _find_type(self, bits: int, want: int, avoid: int = 0, min_heap: int = 0) -> int | None:
        for i, (flags, heap) in enumerate(self._mem_types):
            if bits & (1 << i) and flags & want == want and not flags & avoid and self._heaps[heap] >= min_heap:
                return i
        return None

    @property
    def shares_host_memory(self) -> bool:
        """Whether the device's memory is the host's own RAM: an integrated GPU (a Jetson's) or a CPU device
        (lavapipe). Its allocations then come out of the memory the host budget governs."""
        return self.device_type in ("cpu", "integrated")

    @property
    def unified_memory(self) -> bool:
        """Whether DEVICE_LOCAL|HOST_VISIBLE memory exists (and is allowed): regions are written in place."""
        want = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
        return not self.config.force_staging and any(f & want == want for f, _ in self._mem_types)

    def _memory_order(self, host: bool) -> list[tuple[int, int]]:
        """(wanted, avoided) property flags, best first, of a region's memory type."""
        HV, HC, DL, CA = (vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT, vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                          vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT)
        if host:
            return [(HV | HC | CA, 0), (HV | HC, 0), (HV, 0)]
        if self.config.force_staging:
            return [(DL, HV), (DL, 0)]
        return [(DL | HV | HC, 0), (DL | HV, 0), (DL, 0)]

    def _buffer_usage(self) -> int:
        usage = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                 | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
        if self.texel_buffers:
            usage |= vk.VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT | vk.VK_BUFFER_USAGE_STORAGE_TEXEL_BUFFER_BIT
        return usage

    def _mappable(self, flags: int, host: bool) -> bool:
        # force_staging: leave device regions unmapped even where the only memory is host-visible (lavapipe)
        return bool(flags & vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) and (host or not self.config.force_staging)

    def allocate_region(self, size: int, label: str, host: bool = False) -> Region:
        """A buffer on memory of its own, or on a range of the device pool's. ``host=True``: a host-visible
        staging/IO region (from the host pool, where there is one).

        Device regions are DEVICE_LOCAL|HOST_VISIBLE (mapped) when possible, else DEVICE_LOCAL only.
        """
        size = max(int(size), 16)
        if size > self.max_allocation:
            raise BackendError(f"{label}: a {size}-byte allocation exceeds the device's maxMemoryAllocationSize "
                               f"{self.max_allocation}")
        buf = vk.vkCreateBuffer(self.device, vk.VkBufferCreateInfo(size=size, usage=self._buffer_usage(),
                                                                    sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        req = vk.vkGetBufferMemoryRequirements(self.device, buf)
        pool = self.host_pool if host else self.pool
        pooled = pool is not None and bool(int(req.memoryTypeBits) & (1 << pool.type_index))
        if pool is not None and pooled:
            try:
                faults.check("vulkan.alloc")
            except DeviceOutOfMemoryError as e:
                vk.vkDestroyBuffer(self.device, buf, None)
                raise self._oom(label, int(req.size), pool.heap, e) from e
            except BaseException:
                vk.vkDestroyBuffer(self.device, buf, None)
                raise
            off = pool.take(int(req.size), max(int(req.alignment), ALIGN))
            if off is not None:
                vk.vkBindBufferMemory(self.device, buf, pool.memory, off)
                flags = pool.flags
                mapped = pool.mapped[off:off + size] if pool.mapped is not None else None
                HC, CA = vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT
                # the pool's bytes were counted on its heap once, when it was made (free_region gives
                # alloc_size back to the pool, not to the heap)
                return Region(buf, pool.memory, size, mapped is not None, bool(flags & HC), mapped, label, None,
                              pool.heap, int(req.size), bool(flags & CA), off, pool)
        # headroom: a heap is shared with everything else on the device
        need = int(req.size * 1.1)
        type_idx = None
        for want, avoid in self._memory_order(host):
            type_idx = self._find_type(req.memoryTypeBits, want, avoid, need)
            if type_idx is not None:
                break
        if type_idx is None:
            vk.vkDestroyBuffer(self.device, buf, None)
            raise BackendError(f"{label}: no memory type for a {size}-byte buffer (heaps {self._heaps})")
        try:
            # (a fault injected at this site was checked once already on the way through the pool)
            mem = self._allocate_memory(int(req.size), type_idx, label, check=not pooled)
        except BaseException:
            vk.vkDestroyBuffer(self.device, buf, None)
            raise
        vk.vkBindBufferMemory(self.device, buf, mem, 0)
        flags, heap = self._mem_types[type_idx]
        hv = self._mappable(flags, host)
        mapped = raw = None
        if hv:
            raw = vk.vkMapMemory(self.device, mem, 0, req.size, 0)
            mapped = np.frombuffer(raw, dtype=np.uint8, count=size)
        return Region(buf, mem, size, hv, bool(flags & vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT), mapped, label, raw,
                      heap, int(req.size), bool(flags & vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT))

    def _allocate_memory(self, size: int, type_idx: int, label: str, check: bool = True) -> Any:
        """``vkAllocateMemory``, its failures as inferd's errors, its bytes counted on their heap."""
        heap = self._mem_types[type_idx][1]
        try:
            if check:
                faults.check("vulkan.alloc")
            mem = vk.vkAllocateMemory(self.device, vk.VkMemoryAllocateInfo(allocationSize=size,
                                                                          memoryTypeIndex=type_idx), None)
        except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory, DeviceOutOfMemoryError) as e:
            raise self._oom(label, size, heap, e) from e
        except vk.VkErrorDeviceLost as e:
            raise DeviceLostError(f"{label}: the Vulkan device was lost (VK_ERROR_DEVICE_LOST)") from e
        except Exception as e:
            raise BackendError(f"{label}: vkAllocateMemory of {size} bytes failed: {e!r}") from e
        with self._lock:
            self._heap_used[heap] += size
        return mem

    def _oom(self, label: str, size: int, heap: int, e: BaseException) -> DeviceOutOfMemoryError:
        free = max(0, self._heaps[heap] - self._heap_used[heap])
        return DeviceOutOfMemoryError(
            f"{label}: out of device memory: asked {size} bytes, about {free} free of heap {heap}'s "
            f"{self._heaps[heap]} ({self._heap_used[heap]} held by inferd) ({type(e).__name__})",
            asked=size, free=free)

    def _pool_type(self, host: bool) -> int | None:
        """The memory type a region of this kind takes (what ``allocate_region`` would choose)."""
        probe = vk.vkCreateBuffer(self.device, vk.VkBufferCreateInfo(size=1 << 20, usage=self._buffer_usage(),
                                                                      sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        try:
            bits = int(vk.vkGetBufferMemoryRequirements(self.device, probe).memoryTypeBits)
        finally:
            vk.vkDestroyBuffer(self.device, probe, None)
        for want, avoid in self._memory_order(host):
            type_idx = self._find_type(bits, want, avoid)
            if type_idx is not None:
                return type_idx
        return None

    def _create_pool(self, capacity: int, type_idx: int | None, host: bool = False) -> DevicePool | None:
        """The device pool (``devpool``): one allocation of memory type ``type_idx``, the one device regions take
        (``host``: host regions), at most 1/HEAP_SHARE of its heap, mapped where such regions are, and its mapped
        pages faulted in (host memory: host regions, a CPU device, an integrated GPU; or a discrete GPU's memory
        mapped through the BAR), so that a load's first writes do not fault. None where the setting is 0, the type
        is not host-coherent (flushes would have to cover neighbours' ranges) or the allocation fails."""
        if capacity <= 0 or type_idx is None:
            return None
        flags, heap = self._mem_types[type_idx]
        mappable = self._mappable(flags, host)
        if mappable and not flags & vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT:
            log.info("no %s pool: its memory is mapped but not host-coherent", "host" if host else "device")
            return None
        size = min(int(capacity), self._heaps[heap] // devpool.HEAP_SHARE, self.max_allocation) // ALIGN * ALIGN
        if size <= 0:
            return None
        try:
            # not a fault-injection site: a pool that fails only leaves loads allocating as before
            mem = self._allocate_memory(size, type_idx, "host pool" if host else "device pool", check=False)
        except Exception as e:
            log.warning("no %s pool of %d MiB: %s", "host" if host else "device", size >> 20, e)
            return None
        mapped = raw = None
        if mappable:
            raw = vk.vkMapMemory(self.device, mem, 0, size, 0)
            mapped = np.frombuffer(raw, dtype=np.uint8, count=size)
        pool = DevicePool(mem, size, type_idx, heap, flags, mapped, raw)
        log.info("%s pool: %d MiB of memory type %d (heap %d)", "host" if host else "device", size >> 20, type_idx,
                 heap)
        if mapped is not None:
            pool.prefault(host_memory=host or self.shares_host_memory)
        return pool

    def pool_stats(self) -> dict[str, Any] | None:
        """The device pool's figures, with the host regions' pool's under ``host`` where it is another one (None:
        no pool)."""
        if self.pool is None:
            return None
        st = self.pool.stats()
        if self.host_pool is not None and self.host_pool is not self.pool:
            st["host"] = self.host_pool.stats()
        return st

    def free_region(self, r: Region | None) -> None:
        if r is None or self.closed:
            return
        if r.pool is not None:  # a range of the pool: its buffer goes, the memory stays the pool's
            if r.buffer is None:  # freed already: the range must not be given back twice
                return
            r.mapped = None
            vk.vkDestroyBuffer(self.device, r.buffer, None)
            r.buffer = None
            r.pool.give(r.offset, r.alloc_size)
            return
        if r.host_visible:
            r.mapped = None
            r._raw_map = None
            vk.vkUnmapMemory(self.device, r.memory)
        vk.vkDestroyBuffer(self.device, r.buffer, None)
        vk.vkFreeMemory(self.device, r.memory, None)
        if r.heap >= 0:
            with self._lock:
                self._heap_used[r.heap] -= r.alloc_size

    def flush(self, r: Region, offset: int = 0, size: int | None = None) -> None:
        """Make host writes visible to the device (a no-op on coherent memory)."""
        if r.coherent or not r.host_visible:
            return
        vk.vkFlushMappedMemoryRanges(self.device, 1, [self._range(r, offset, size)])

    def invalidate(self, r: Region, offset: int = 0, size: int | None = None) -> None:
        if r.coherent or not r.host_visible:
            return
        vk.vkInvalidateMappedMemoryRanges(self.device, 1, [self._range(r, offset, size)])

    def _range(self, r: Region, offset: int, size: int | None) -> Any:
        # flush/invalidate ranges must be multiples of nonCoherentAtomSize (or reach the end); never a pool's
        # range: the pool is host-coherent memory only
        a = self.non_coherent_atom
        lo = offset // a * a
        sz = vk.VK_WHOLE_SIZE
        if size is not None:
            hi = -(-(offset + size) // a) * a
            if hi < r.size:
                sz = hi - lo
        return vk.VkMappedMemoryRange(memory=r.memory, offset=lo, size=sz)

    def upload(self, items: Sequence[tuple[Region, int, np.ndarray]], chunk: int = 64 << 20) -> None:
        """Write arrays into device regions: in place when mapped, else through the staging buffer."""
        staged: list[tuple[Region, int, np.ndarray]] = []
        for r, off, arr in items:
            data = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            if r.mapped is not None:
                n = data.size
                if n >= NOGIL_COPY:
                    if off < 0 or off + n > r.mapped.size:
                        raise BackendError(f"upload of {n} bytes at {off} overruns region {r.label} ({r.mapped.size})")
                    # ctypes calls drop the GIL: a loader copying a layer's MBs (into write-combined BAR memory on
                    # a discrete GPU) leaves the executor and the other loaders running; numpy's copy would not
                    ctypes.memmove(r.mapped.ctypes.data + off, data.ctypes.data, n)
                else:
                    r.mapped[off:off + n] = data
                self.flush(r, off, n)
            else:
                staged.append((r, off, data))
        if not staged:
            return
        with self._lock:
            total = sum(d.size for _, _, d in staged)
            st = self._staging_region(min(max(total, 1 << 20), chunk))
            pending: list[tuple[Region, int, int, int]] = []  # (dst, dst_off, src_off, n)
            used = 0
            for r, off, data in staged:
                pos = 0
                while pos < data.size:
                    n = min(data.size - pos, st.size - used)
                    if n == 0:
                        self._flush_copies(st, pending)
                        pending, used = [], 0
                        continue
                    assert st.mapped is not None
                    st.mapped[used:used + n] = data[pos:pos + n]
                    pending.append((r, off + pos, used, n))
                    used += n
                    pos += n
            self._flush_copies(st, pending)

    def download(self, r: Region, offset: int, nbytes: int) -> np.ndarray:
        """Bytes of a device region (through staging if not mapped); used by tests and debugging."""
        if r.mapped is not None:
            self.invalidate(r, offset, nbytes)
            return r.mapped[offset:offset + nbytes].copy()
        with self._lock:
            st = self._staging_region(nbytes)
            self.one_time(lambda cb: vk.vkCmdCopyBuffer(cb, r.buffer, st.buffer, 1,
                                                        [vk.VkBufferCopy(srcOffset=offset, dstOffset=0, size=nbytes)]),
                          host_read=True)
            self.invalidate(st, 0, nbytes)
            assert st.mapped is not None
            return st.mapped[:nbytes].copy()

    def _staging_region(self, size: int) -> Region:
        if self._staging is None or self._staging.size < size:
            self.free_region(self._staging)
            self._staging = None
            self._staging = self.allocate_region(size, "staging", host=True)
        return self._staging

    def _flush_copies(self, st: Region, pending: list[tuple[Region, int, int, int]]) -> None:
        if not pending:
            return
        self.flush(st)

        def rec(cb: Any) -> None:
            by_dst: dict[int, tuple[Region, list[Any]]] = {}
            for dst, doff, soff, n in pending:
                by_dst.setdefault(id(dst), (dst, []))[1].append(vk.VkBufferCopy(srcOffset=soff, dstOffset=doff, size=n))
            for dst, copies in by_dst.values():
                vk.vkCmdCopyBuffer(cb, st.buffer, dst.buffer, len(copies), copies)
        self.one_time(rec)

    def one_time(self, record: Callable[[Any], None], host_read: bool = False) -> None:
        """Record, submit and wait for a throw-away command buffer (load-time uploads only)."""
        with self._lock:
            cb = vk.vkAllocateCommandBuffers(self.device, vk.VkCommandBufferAllocateInfo(
                commandPool=self._cmd_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
            try:
                vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
                record(cb)
                bar = vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                                         dstAccessMask=(vk.VK_ACCESS_HOST_READ_BIT if host_read else
                                                        vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT))
                vk.vkCmdPipelineBarrier(cb, vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
                                        vk.VK_PIPELINE_STAGE_HOST_BIT if host_read else vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                                        0, 1, [bar], 0, None, 0, None)
                vk.vkEndCommandBuffer(cb)
                self.submit_and_wait(cb, self._upload_fence)
            finally:
                vk.vkFreeCommandBuffers(self.device, self._cmd_pool, 1, [cb])

    def submit_and_wait(self, cb: Any, fence: Any, timeout_ns: int | None = None) -> None:
        # (a loader's upload, the idle-time profiler: their calls let the GIL go, the executor's to take)
        vk.vkResetFences(self.device, 1, [fence])
        info = vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cb])
        self._submit(lambda: vk.vkQueueSubmit(self.queue, 1, [info], fence))
        self.wait_fence(fence, timeout_ns)

    def reset_fence(self, fence: Any) -> None:
        """Unsignal ``fence`` (with the GIL held: ``raw``)."""
        raw.reset_fence(self.device, fence)

    def queue_submit(self, infos: Sequence[Any], fence: Any) -> None:
        """``vkQueueSubmit`` (with the GIL held: ``raw``; a resident model's warm run) under the queue lock; the device
        faults a submit can report as DeviceFault."""
        self._submit(lambda: raw.queue_submit_infos(self.queue, infos, fence))

    def submit_buffers(self, cbs: Sequence[Any], fence: Any = None) -> None:
        """``queue_submit`` of command buffers (the cold run's segments)."""
        self._submit(lambda: raw.queue_submit(self.queue, cbs, fence))

    def _submit(self, call: Callable[[], Any]) -> None:
        try:
            with self.queue_lock:
                call()
        except vk.VkErrorDeviceLost as e:
            raise DeviceLostError("the Vulkan device was lost (VK_ERROR_DEVICE_LOST) at vkQueueSubmit") from e
        except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory) as e:
            raise DeviceOutOfMemoryError(f"out of memory at vkQueueSubmit ({type(e).__name__})") from e

    def wait_fence_polled(self, fence: Any, poll_s: float) -> bool:
        """``wait_fence``, first asking for the fence's status with the GIL held for up to ``poll_s`` seconds: a run
        done by then answers without letting the GIL go (a thread that lets it go waits up to the interpreter's switch
        interval to have it back while another thread runs Python: a small resident model on lavapipe, one Python
        thread spinning beside it, 5-10 ms a run against 70 us alone). True when the poll saw it signalled."""
        if poll_s > 0 and not faults.enabled:  # (an injected fence fault takes wait_fence's path)
            status = raw.held().fence_status
            d, f = raw.addr(self.device), raw.addr(fence)
            end = time.perf_counter() + poll_s
            while True:
                r = status(d, f)
                if r == vk.VK_SUCCESS:
                    return True
                if r != vk.VK_NOT_READY or time.perf_counter() >= end:
                    break  # (an error: the blocking wait reports it)
        self.wait_fence(fence)
        return False

    def wait_fence(self, fence: Any, timeout_ns: int | None = None) -> None:
        if timeout_ns is None:
            timeout_ns = int(fence_timeout_s * 1e9)
        try:
            if faults.enabled:
                try:
                    faults.check("vulkan.fence")
                except DeviceFault:
                    # an injected fault leaves the queue as a real one would after the wait: the work
                    # is over (a test process must not free command buffers the device still runs)
                    vk.vkWaitForFences(self.device, 1, [fence], vk.VK_TRUE, timeout_ns)
                    raise
            r = vk.vkWaitForFences(self.device, 1, [fence], vk.VK_TRUE, timeout_ns)
        except vk.VkTimeout:
            raise DeviceTimeoutError(f"the Vulkan queue did not finish within {timeout_ns / 1e9:.3g} s "
                                     "(a hung dispatch: the device is recreated)") from None
        except vk.VkErrorDeviceLost as e:
            raise DeviceLostError("the Vulkan device was lost (VK_ERROR_DEVICE_LOST) while waiting for a fence") from e
        except vk.VkErrorOutOfDeviceMemory as e:
            raise DeviceOutOfMemoryError("out of device memory while running (VK_ERROR_OUT_OF_DEVICE_MEMORY)") from e
        except DeviceFault:
            raise
        except Exception as e:
            raise BackendError(f"vkWaitForFences failed: {e!r}") from e
        if r not in (None, vk.VK_SUCCESS):
            raise BackendError(f"vkWaitForFences returned {r}")

    # ---------------------------------------------------------------- pipelines
    def _set_layout(self, kinds: tuple[str, ...]) -> Any:
        lay = self._set_layouts.get(kinds)
        if lay is None:
            binds = [vk.VkDescriptorSetLayoutBinding(binding=i, descriptorType=descriptor_type(k),
                                                     descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                     for i, k in enumerate(kinds)]
            lay = vk.vkCreateDescriptorSetLayout(self.device, vk.VkDescriptorSetLayoutCreateInfo(
                bindingCount=len(kinds), pBindings=binds or None), None)
            self._set_layouts[kinds] = lay
        return lay

    def _pipe_layout(self, kinds: tuple[str, ...], push: int) -> Any:
        key = (kinds, push)
        lay = self._pipe_layouts.get(key)
        if lay is None:
            rng = [vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=push)] if push else None
            lay = vk.vkCreatePipelineLayout(self.device, vk.VkPipelineLayoutCreateInfo(
                setLayoutCount=1, pSetLayouts=[self._set_layout(kinds)], pushConstantRangeCount=1 if push else 0,
                pPushConstantRanges=rng), None)
            self._pipe_layouts[key] = lay
        return lay

    def _shader_module(self, mod: ShaderModule) -> Any:
        h = self._shader_modules.get(mod.key)
        if h is None:
            h = vk.vkCreateShaderModule(self.device, vk.VkShaderModuleCreateInfo(codeSize=len(mod.spirv), pCode=mod.spirv), None)
            self._shader_modules[mod.key] = h
        return h

    @staticmethod
    def pipeline_key(mod: ShaderModule, spec: Mapping[str, Any]) -> tuple[str, tuple[tuple[str, Any], ...]]:
        return mod.key, tuple(sorted(spec.items()))

    def pipelines(self, requests: Sequence[tuple[ShaderModule, Mapping[str, Any]]],
                  counts: dict[str, int] | None = None, record: bool = True) -> list[Pipeline]:
        """Compute pipelines for (module, spec constants) pairs, created in one batch through the pipeline cache.

        Safe to call from several threads: the driver compiles outside the device lock (the
        ``VkPipelineCache`` is internally synchronised), so loader threads compile in parallel, and a
        pipeline another thread is already creating is waited for rather than created twice.
        ``counts`` (if given) gets this call's ``created``, ``reused`` and ``cache_hits`` added; ``record``:
        note the requests in the pipeline list (what the daemon makes resident at its next start)."""
        keys = [self.pipeline_key(m, spec) for m, spec in requests]
        if record:
            self.pipeline_list.record([(m.name, m.defines, k[1]) for (m, _s), k in zip(requests, keys)])
        todo: dict[tuple[str, tuple[tuple[str, Any], ...]], tuple[ShaderModule, Mapping[str, Any]]] = {}
        others: list[threading.Event] = []
        reused = 0
        with self._lock:
            if self.closed:  # a loader thread of a load the device's close() cut short
                raise BackendError("the Vulkan device is closed")
            for k, req in zip(keys, requests):
                if k in self._pipelines:
                    reused += 1
                elif k in todo:
                    continue
                elif k in self._inflight:
                    reused += 1
                    others.append(self._inflight[k])
                else:
                    todo[k] = req
            self.stats["pipelines_reused"] += reused
            mine = {k: threading.Event() for k in todo}
            self._inflight.update(mine)
            try:
                batch = self._create_infos(list(todo.values())) if todo else None
            except BaseException:
                self._settle(mine)
                raise
        hits = 0
        if batch is not None:
            try:
                handles, fb = self._create_batch(batch)
            except BaseException:
                with self._lock:
                    self._settle(mine)
                raise
            with self._lock:
                for k, (mod, _spec), h, hit in zip(todo, todo.values(), handles, fb):
                    man = mod.manifest
                    self._pipelines[k] = Pipeline(h, self._pipe_layout(binding_kinds(man), man.push_size),
                                                  self._set_layout(binding_kinds(man)), mod, k[1], hit)
                    hits += int(bool(hit))
                self.stats["pipeline_cache_hits"] += hits
                self.stats["pipeline_feedback"] += sum(1 for h in fb if h is not None)
                self.stats["pipelines_created"] += len(todo)
                if self.pipeline_cache.status == "loaded":
                    self.stats["pipelines_from_loaded_cache"] += len(todo)
                # the file is rewritten (with an fsync) only when the driver compiled something: a load
                # whose pipelines all came from the cache (as reported) leaves it as it is
                if not all(h is True for h in fb):
                    self.pipeline_cache.dirty = True
                self._settle(mine)
        for ev in others:
            ev.wait()
        with self._lock:
            lost = [k for k in keys if k not in self._pipelines]
            if lost:
                raise BackendError(f"pipeline creation failed on another thread for shaders "
                                   f"{sorted({m.name for m, _ in requests})}")
            if counts is not None:
                counts["created"] = counts.get("created", 0) + len(todo)
                counts["reused"] = counts.get("reused", 0) + reused
                counts["cache_hits"] = counts.get("cache_hits", 0) + hits
            return [self._pipelines[k] for k in keys]

    def create_listed(self, reqs: Sequence[tuple[str, Any, tuple[tuple[str, Any], ...]]]) -> int:
        """Create the pipelines of pipeline-list requests (shader name, defines, spec items) this device
        lacks, without noting them as used; returns how many were created. A shader that no longer exists
        raises ``BackendError``."""
        try:
            mods = self.shader_cache.get_many([(n, tuple(d)) for n, d, _ in reqs])
        except BackendError:
            raise
        except Exception as e:  # a shader removed since the list was written, a source that no longer compiles
            raise BackendError(f"shaders {sorted({n for n, _, _ in reqs})}: {type(e).__name__}: {e}") from e
        counts: dict[str, int] = {}
        self.pipelines([(m, dict(spec)) for m, (_n, _d, spec) in zip(mods, reqs)], counts, record=False)
        return counts.get("created", 0)

    def make_resident(self, limit: int) -> dict[str, float]:
        """Create the ``limit`` most recently used pipelines of this device's list (see ``inferd.vulkan.resident``)."""
        from .resident import make_resident
        return make_resident(self, limit)

    def pipeline_count(self) -> int:
        with self._lock:
            return len(self._pipelines)

    def save_caches(self) -> None:
        """Write the pipeline cache and the pipeline list if they changed."""
        self.pipeline_cache.save()
        self.pipeline_list.save()

    def _settle(self, events: Mapping[Any, threading.Event]) -> None:
        """End in-flight creations (done or failed): waiters then find the pipeline or report its loss."""
        for k, ev in events.items():
            self._inflight.pop(k, None)
            ev.set()

    def time_pipelines(self, requests: Sequence[tuple[ShaderModule, Mapping[str, Any]]], empty: bool) -> float:
        """Seconds to create these pipelines afresh (then destroyed), through an empty ``VkPipelineCache``
        or through the device's (filled) one: the profiler's two pipeline phases."""
        uniq = list({self.pipeline_key(m, s): (m, s) for m, s in requests}.values())
        if not uniq:
            return 0.0
        with self._lock:
            batch = self._create_infos(uniq)
        cache = None
        if empty:
            out = vk.ffi.new("VkPipelineCache*")
            info = vk.ffi.new("VkPipelineCacheCreateInfo*")
            info.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO
            res = vk.lib.vkCreatePipelineCache(self.device, info, vk.ffi.NULL, out)
            if res != vk.VK_SUCCESS:
                raise BackendError(f"vkCreatePipelineCache failed ({res})")
            cache = out[0]
        try:
            t0 = time.perf_counter()
            handles, _ = self._create_batch(batch, cache)
            dt = time.perf_counter() - t0
        finally:
            if cache is not None:
                vk.vkDestroyPipelineCache(self.device, cache, None)
        for h in handles:
            vk.vkDestroyPipeline(self.device, h, None)
        return dt

    def _create_infos(self, reqs: Sequence[tuple[ShaderModule, Mapping[str, Any]]]) -> tuple[Any, list[Any], list[Any], list[str]]:
        """The create-info array for ``reqs`` (under the device lock: modules and layouts are shared), with
        the cffi objects it points into and the creation-feedback structs."""
        ffi = vk.ffi
        infos = []
        keep: list[Any] = []
        feedbacks: list[Any] = []
        for mod, spec in reqs:
            man = mod.manifest
            entries, data = man.pack_spec(spec, f"shader {mod.name}")
            sinfo = None
            if entries:
                ents = ffi.new("VkSpecializationMapEntry[]", len(entries))
                for i, (cid, off) in enumerate(entries):
                    ents[i].constantID, ents[i].offset, ents[i].size = cid, off, 4
                dbuf = ffi.new("char[]", data)
                sinfo = ffi.new("VkSpecializationInfo*")
                sinfo.mapEntryCount, sinfo.pMapEntries, sinfo.dataSize, sinfo.pData = len(entries), ents, len(data), dbuf
                keep += [ents, dbuf, sinfo]
            stage = ffi.new("VkPipelineShaderStageCreateInfo*")
            stage.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO
            stage.stage = vk.VK_SHADER_STAGE_COMPUTE_BIT
            stage.module = self._shader_module(mod)
            name = ffi.new("char[]", b"main")
            stage.pName = name
            stage.pSpecializationInfo = sinfo if sinfo is not None else ffi.NULL
            keep += [stage, name]
            info = ffi.new("VkComputePipelineCreateInfo*")
            info.sType = vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO
            info.stage = stage[0]
            if any(b.kind != "buffer" for b in man.bindings) and not self.texel_buffers:
                raise BackendError(f"shader {mod.name} binds texel buffers, which this device's regions do "
                                   f"not support (CPU-type devices only)")
            info.layout = self._pipe_layout(binding_kinds(man), man.push_size)
            info.basePipelineIndex = -1
            if self._feedback:
                fb = ffi.new("VkPipelineCreationFeedback*")
                fbs = ffi.new("VkPipelineCreationFeedback[1]")
                fci = ffi.new("VkPipelineCreationFeedbackCreateInfo*")
                fci.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_CREATION_FEEDBACK_CREATE_INFO
                fci.pPipelineCreationFeedback = fb
                fci.pipelineStageCreationFeedbackCount = 1
                fci.pPipelineStageCreationFeedbacks = fbs
                info.pNext = fci
                keep += [fb, fbs, fci]
                feedbacks.append(fb)
            else:
                feedbacks.append(None)
            keep.append(info)
            infos.append(info)
        arr = ffi.new("VkComputePipelineCreateInfo[]", len(infos))
        for i, inf in enumerate(infos):
            arr[i] = inf[0]
        return arr, keep, feedbacks, [m.name for m, _ in reqs]

    def _create_batch(self, batch: tuple[Any, list[Any], list[Any], list[str]], cache: Any = None
                      ) -> tuple[list[Any], list[bool | None]]:
        """vkCreateComputePipelines on a prepared batch (no device lock held); per pipeline its handle and
        whether the driver reported a pipeline-cache hit (None: not reported)."""
        ffi = vk.ffi
        arr, _keep, feedbacks, names = batch
        n = len(feedbacks)
        out = ffi.new("VkPipeline[]", n)
        handle = cache if cache is not None else self.pipeline_cache.handle
        res = vk.lib.vkCreateComputePipelines(self.device, handle, n, arr, ffi.NULL, out)
        if res != vk.VK_SUCCESS:
            raise BackendError(f"vkCreateComputePipelines failed ({res}) for {names}")
        hit_bit = vk.VK_PIPELINE_CREATION_FEEDBACK_APPLICATION_PIPELINE_CACHE_HIT_BIT
        valid_bit = vk.VK_PIPELINE_CREATION_FEEDBACK_VALID_BIT
        hits = [bool(fb.flags & hit_bit) if fb is not None and fb.flags & valid_bit else None for fb in feedbacks]
        return [out[i] for i in range(n)], hits

    def fingerprint(self) -> dict[str, str]:
        """What makes plans, profiles and pipeline caches made on this device valid elsewhere: the same
        engine, device and driver (the pipeline-cache UUID changes with the driver build)."""
        from .. import __version__
        return {"backend": "vulkan", "engine": __version__, "vendor_id": f"0x{self.vendor_id:04x}",
                "device_id": f"0x{self.device_id:04x}", "driver_version": str(self.driver_version),
                "device_name": self.name, "pipeline_cache_uuid": self.pipeline_cache_uuid.hex()}

    # ---------------------------------------------------------------- lifetime
    def register_model(self, model: Any) -> None:
        self._models.add(model)

    def wait_idle(self) -> None:
        with self.queue_lock:
            vk.vkQueueWaitIdle(self.queue)

    def memory_report(self) -> dict[str, int]:
        """What the device reports for the models' memory: ``available`` is the largest device-local heap (any
        heap where none is marked so: a CPU device such as lavapipe), ``held`` what inferd's allocations on
        that heap take now. The daemon's default device memory budget is ``available``."""
        idx = [i for i, loc in enumerate(self._heap_local) if loc] or list(range(len(self._heaps)))
        best = max(idx, key=lambda i: self._heaps[i]) if idx else -1
        return {"available": self._heaps[best] if best >= 0 else 0,
                "held": self._heap_used[best] if best >= 0 else 0, "heap": best}

    def close(self) -> None:
        """Close open models, save the pipeline cache, destroy every Vulkan object (idempotent)."""
        with self._lock:
            if self.closed or self._closing:
                return
            self._closing = True
            models = list(self._models)
        # the models close outside the device lock: a model's background work holds the model's lock and takes
        # the device's (the warm switch swaps kernels in under the model's lock and creates their pipelines),
        # and a model's close waits for its lock; with the device lock held here, a process exiting while a
        # warm switch ran (atexit closes every device) hung for good
        for m in models:
            try:
                m.close()
            except Exception as e:  # pragma: no cover
                log.warning("closing model at device teardown: %s", e)
        with self._lock:
            try:
                vk.vkDeviceWaitIdle(self.device)
            except Exception:
                pass
            try:
                self.save_caches()
            except Exception as e:  # pragma: no cover
                log.warning("saving the pipeline cache failed: %s", e)
            try:
                self.shader_cache.save_bundle()
            except Exception as e:  # pragma: no cover
                log.warning("saving the SPIR-V bundle failed: %s", e)
            self._destroy()

    def _destroy(self) -> None:
        dev = getattr(self, "device", None)
        if dev is not None:
            for p in self._pipelines.values():
                vk.vkDestroyPipeline(dev, p.handle, None)
            for lay in self._pipe_layouts.values():
                vk.vkDestroyPipelineLayout(dev, lay, None)
            for lay in self._set_layouts.values():
                vk.vkDestroyDescriptorSetLayout(dev, lay, None)
            for sm in self._shader_modules.values():
                vk.vkDestroyShaderModule(dev, sm, None)
            self._pipelines.clear()
            self._pipe_layouts.clear()
            self._set_layouts.clear()
            self._shader_modules.clear()
            if self._staging is not None:
                self.free_region(self._staging)
                self._staging = None
            # the pools after the models' regions and the staging: nothing is bound to them any more
            for pool in {id(p): p for p in (self.pool, self.host_pool) if p is not None}.values():
                pool.stop_prefault()
                if pool.mapped is not None:
                    pool.mapped = None
                    vk.vkUnmapMemory(dev, pool.memory)
                vk.vkFreeMemory(dev, pool.memory, None)
            self.pool = self.host_pool = None
            pc = getattr(self, "pipeline_cache", None)
            if pc is not None:
                pc.destroy()
            vk.vkDestroyFence(dev, self._upload_fence, None)
            for f in getattr(self, "_spare_fences", ()):
                vk.vkDestroyFence(dev, f, None)
            self._spare_fences = []
            vk.vkDestroyCommandPool(dev, self._cmd_pool, None)
            vk.vkDestroyDevice(dev, None)
            self.device = None
        self.closed = True
        if self._messenger is not None:
            destroy = vk.vkGetInstanceProcAddr(self.instance, "vkDestroyDebugUtilsMessengerEXT")
            destroy(self.instance, self._messenger, None)
            self._messenger = None
        inst = getattr(self, "instance", None)
        if inst is not None:
            vk.vkDestroyInstance(inst, None)
            self.instance = None

    def __repr__(self) -> str:
        return f"<VulkanDevice {getattr(self, 'name', '?')} ({getattr(self, 'device_type', '?')})>"
