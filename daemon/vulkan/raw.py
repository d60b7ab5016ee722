"""The Vulkan calls a load makes per layer and per dispatch, made through the binding's own cffi handle.

Why: the ``vulkan`` package turns every argument and struct field into cffi through generic Python
(``_callApi``, ``_new``, ``_cast_ptr``): on the 2-core VM one recorded ``vkCmdDispatch`` cost 3.4 us against
0.6 us through ``vk.lib``, a barrier 11.1 against 1.7 us, a ``VkWriteDescriptorSet`` with its buffer info
18.6 against about 1 us. A cold load makes thousands of these (a descriptor pool, its sets, their writes and
texel views per layer; a bind, a push and a dispatch per dispatch), all holding the GIL that its loader
threads and the executor share: bind_descriptors took 0.3-0.4 ms of CPU a layer and recording 60-95 us a
dispatch. Everything else (creation of devices, pipelines, memory) stays with the package's wrappers.

A call that fails raises the package's own exception for its result (``vk.exception_codes``), as its wrappers do.

A resident model's warm run resets its fence, submits and polls the fence through ctypes with the GIL held
(``ctypes.PYFUNCTYPE`` on the same entry points, ``held``), not through cffi, which releases the GIL around every call:
each returns in a microsecond or so, and a thread that lets the GIL go while another runs Python waits up to the
switch interval to have it back (2-core VM, two Python threads spinning: a cffi ``vkCmdDispatch`` 17-93 us at a 0.5
ms interval, 1.4 ms at Python's 5 ms; held, 1.5-2 us; a small resident model beside one spinning thread 5.3-10.4 ms a
run, held 48-61 us on lavapipe and an H200). The cold executor's recording stays on cffi: held, on an H200, it left
the executor free early and it took preparation tasks from the loaders, three threads preparing under the GIL where
two had, and squeezenet1_1's and mobilenetv2's cold loads took 4-5 ms longer (``2026-12-07r``).
"""
from __future__ import annotations

import ctypes
import functools
from typing import Any, Sequence

try:  # not through .device, which imports this module: the loader may be missing (then nothing here is called)
    import vulkan as vk
except Exception:  # pragma: no cover - depends on the machine
    vk = None  # type: ignore[assignment]

if vk is not None:  # (no loader: the backend is unavailable and nothing here is called)
    ffi: Any = vk.ffi
    lib: Any = vk.lib
    NULL: Any = ffi.NULL
    _COMPUTE_BIND = vk.VK_PIPELINE_BIND_POINT_COMPUTE
    _COMPUTE_STAGE = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
    _SHADER_STAGE = vk.VK_SHADER_STAGE_COMPUTE_BIT
    _SW, _SR = vk.VK_ACCESS_SHADER_WRITE_BIT, vk.VK_ACCESS_SHADER_READ_BIT


def check(result: int) -> None:
    if result != vk.VK_SUCCESS:
        raise vk.exception_codes[result]


_P, _U, _I = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int32


def _held(name: str, restype: Any, *argtypes: Any) -> Any:
    """``lib.<name>`` called with the GIL held (the entry point cffi resolved, through a ctypes PYFUNCTYPE)."""
    return ctypes.PYFUNCTYPE(restype, *argtypes)(int(ffi.cast("uintptr_t", getattr(lib, name))))


def addr(handle: Any) -> int:
    """A handle's (or a cffi array's) address, as the held calls take it. An int keeps nothing alive: an array made
    for a call must be held by a name until the call returns."""
    return int(ffi.cast("uintptr_t", handle))


class _Held:
    """The held entry points, resolved at first use (``held``; no loader: never)."""

    def __init__(self) -> None:
        self.submit = _held("vkQueueSubmit", _I, _P, _U, _P, _P)
        self.reset_fences = _held("vkResetFences", _I, _P, _U, _P)
        self.fence_status = _held("vkGetFenceStatus", _I, _P, _P)


@functools.cache
def held() -> _Held:
    return _Held()


def create_descriptor_pool(device: Any, sizes: Sequence[tuple[int, int]], max_sets: int,
                           free_sets: bool = False) -> Any:
    """A descriptor pool for ``max_sets`` sets holding ``sizes`` ((descriptor type, count), ...); ``free_sets``:
    sets can be given back one by one (``free_descriptor_sets``)."""
    ps = ffi.new("VkDescriptorPoolSize[]", list(sizes))
    info = ffi.new("VkDescriptorPoolCreateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                                    "maxSets": max_sets, "poolSizeCount": len(sizes),
                                                    "pPoolSizes": ps,
                                                    "flags": vk.VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT
                                                    if free_sets else 0})
    out = ffi.new("VkDescriptorPool*")
    check(lib.vkCreateDescriptorPool(device, info, NULL, out))
    return out[0]


def allocate_descriptor_sets(device: Any, pool: Any, layouts: Sequence[Any]) -> list[Any]:
    """One set per layout, from ``pool``; each as a one-element array, what ``vkCmdBindDescriptorSets`` takes."""
    n = len(layouts)
    ls = ffi.new("VkDescriptorSetLayout[]", list(layouts))
    info = ffi.new("VkDescriptorSetAllocateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                                     "descriptorPool": pool, "descriptorSetCount": n,
                                                     "pSetLayouts": ls})
    sets = ffi.new("VkDescriptorSet[]", n)
    check(lib.vkAllocateDescriptorSets(device, info, sets))
    return [ffi.new("VkDescriptorSet[1]", [sets[i]]) for i in range(n)]


def free_descriptor_sets(device: Any, pool: Any, sets: Sequence[Any]) -> None:
    """Give ``sets`` (one-element arrays, as ``allocate_descriptor_sets`` returns them) back to ``pool``
    (created with ``VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT``)."""
    if sets:
        check(lib.vkFreeDescriptorSets(device, pool, len(sets), ffi.new("VkDescriptorSet[]", [s[0] for s in sets])))


def destroy_descriptor_pool(device: Any, pool: Any) -> None:
    lib.vkDestroyDescriptorPool(device, pool, NULL)


def create_buffer_view(device: Any, buffer: Any, fmt: int, offset: int, nbytes: int) -> Any:
    info = ffi.new("VkBufferViewCreateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_BUFFER_VIEW_CREATE_INFO,
                                                "buffer": buffer, "format": fmt, "offset": offset, "range": nbytes})
    out = ffi.new("VkBufferView*")
    check(lib.vkCreateBufferView(device, info, NULL, out))
    return out[0]


def destroy_buffer_views(device: Any, views: Sequence[Any]) -> None:
    for v in views:
        lib.vkDestroyBufferView(device, v, NULL)


#: one descriptor write: (set (a one-element array), first binding, descriptor type, buffer ranges
#: ((buffer, offset, bytes), ...) or None, texel buffer views or None)
Write = tuple[Any, int, int, "Sequence[tuple[Any, int, int]] | None", "Sequence[Any] | None"]


def update_descriptor_sets(device: Any, writes: Sequence[Write]) -> None:
    """All ``writes`` in one ``vkUpdateDescriptorSets``."""
    if not writes:
        return
    arr = ffi.new("VkWriteDescriptorSet[]", len(writes))
    keep = []  # the arrays the writes point to live until the call returns
    for w, (dset, binding, dtype, infos, views) in zip(arr, writes):
        w.sType = vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET
        w.dstSet = dset[0]
        w.dstBinding = binding
        w.descriptorType = dtype
        if views is not None:
            v = ffi.new("VkBufferView[]", list(views))
            w.pTexelBufferView = v
            w.descriptorCount = len(views)
        else:
            v = ffi.new("VkDescriptorBufferInfo[]", list(infos or ()))
            w.pBufferInfo = v
            w.descriptorCount = len(infos or ())
        keep.append(v)
    lib.vkUpdateDescriptorSets(device, len(writes), arr, 0, NULL)


def cmd_bind_pipeline(cb: Any, pipeline: Any) -> None:
    lib.vkCmdBindPipeline(cb, _COMPUTE_BIND, pipeline)


def cmd_dispatch(cb: Any, layout: Any, dset: Any, push: bytes, groups: Sequence[int]) -> None:
    """Bind ``dset`` (a one-element array), push ``push`` (bytes, none when empty) and dispatch ``groups``."""
    lib.vkCmdBindDescriptorSets(cb, _COMPUTE_BIND, layout, 0, 1, dset, 0, NULL)
    if push:
        lib.vkCmdPushConstants(cb, layout, _SHADER_STAGE, 0, len(push), ffi.from_buffer(push))
    lib.vkCmdDispatch(cb, groups[0], groups[1], groups[2])


_BARRIERS: dict[tuple[int, int], Any] = {}  # (src access, dst access) -> the struct every such call passes


def cmd_barrier(cb: Any, src_stage: int, dst_stage: int, src_access: int, dst_access: int) -> None:
    """One global memory barrier: ``src_access`` at ``src_stage`` before, visible to ``dst_access`` at ``dst_stage``."""
    b = _BARRIERS.get((src_access, dst_access))
    if b is None:
        b = _BARRIERS[(src_access, dst_access)] = ffi.new(
            "VkMemoryBarrier*", {"sType": vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER, "srcAccessMask": src_access,
                                 "dstAccessMask": dst_access})
    lib.vkCmdPipelineBarrier(cb, src_stage, dst_stage, 0, 1, b, 0, NULL, 0, NULL)


def cmd_memory_barrier(cb: Any) -> None:
    """Every shader write before this, visible to every shader read and write after it."""
    cmd_barrier(cb, _COMPUTE_STAGE, _COMPUTE_STAGE, _SW, _SR | _SW)


def cmd_copy_buffer(cb: Any, src: Any, dst: Any, regions: Sequence[tuple[int, int, int]]) -> None:
    """Copy ranges (source offset, destination offset, bytes) of buffer ``src`` to ``dst`` (none: nothing)."""
    if not regions:
        return
    arr = ffi.new("VkBufferCopy[]", [{"srcOffset": a, "dstOffset": b, "size": n} for a, b, n in regions])
    lib.vkCmdCopyBuffer(cb, src, dst, len(regions), arr)


def allocate_command_buffer(device: Any, pool: Any, one_time: bool = True) -> Any:
    """A primary command buffer from ``pool``, begun (for one submission when ``one_time``)."""
    info = ffi.new("VkCommandBufferAllocateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                                     "commandPool": pool, "commandBufferCount": 1,
                                                     "level": vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY})
    out = ffi.new("VkCommandBuffer*")
    check(lib.vkAllocateCommandBuffers(device, info, out))
    begin = ffi.new("VkCommandBufferBeginInfo*", {"sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                                  "flags": vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT
                                                  if one_time else 0})
    check(lib.vkBeginCommandBuffer(out[0], begin))
    return out[0]


def end_command_buffer(cb: Any) -> None:
    check(lib.vkEndCommandBuffer(cb))


def queue_submit_infos(queue: Any, infos: Sequence[Any], fence: Any) -> None:
    """One ``vkQueueSubmit`` of the package's ``VkSubmitInfo`` structs (``fence`` None: none)."""
    if len(infos) == 1:
        arr = ffi.addressof(infos[0])
    else:
        arr = ffi.new("VkSubmitInfo[]", len(infos))
        for i, info in enumerate(infos):
            arr[i] = info
    check(held().submit(addr(queue), len(infos), addr(arr), None if fence is None else addr(fence)))


def reset_fence(device: Any, fence: Any) -> None:
    arr = ffi.new("VkFence[1]", [fence])  # (named: a temporary's memory would be freed before the call)
    check(held().reset_fences(addr(device), 1, addr(arr)))


def queue_submit(queue: Any, cbs: Sequence[Any], fence: Any) -> None:
    """One ``vkQueueSubmit`` of ``cbs`` (``fence`` None: none); failures raise the package's exceptions."""
    arr = ffi.new("VkCommandBuffer[]", list(cbs))
    info = ffi.new("VkSubmitInfo*", {"sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "commandBufferCount": len(cbs),
                                     "pCommandBuffers": arr})
    check(lib.vkQueueSubmit(queue, 1, info, NULL if fence is None else fence))
