"""Costs of the Vulkan objects a cold load creates per model, in a fresh process after the device is up: a command
pool and its first command buffers, a descriptor pool and its first sets (scripts/device; for reading)."""
import time

import vulkan as vk

from inferd.vulkan import raw
from inferd.vulkan.device import get_device
from inferd.vulkan.executor import descriptor_type

T = time.perf_counter
dev = get_device()
d = dev.device
out = {}
for rep in range(3):
    t = T(); pool = vk.vkCreateCommandPool(d, vk.VkCommandPoolCreateInfo(queueFamilyIndex=dev.queue_family), None)
    out.setdefault("create_command_pool", []).append(T() - t)
    for i in range(3):
        t = T(); cb = raw.allocate_command_buffer(d, pool)
        out.setdefault(f"alloc+begin cb {i}", []).append(T() - t)
    t = T(); raw.end_command_buffer(cb); out.setdefault("end cb", []).append(T() - t)
    types = {descriptor_type(k) for k in ("buffer", "texel", "image")}
    t = T(); dp = raw.create_descriptor_pool(d, [(ty, 1024) for ty in sorted(types)], 256, free_sets=True)
    out.setdefault("create_descriptor_pool", []).append(T() - t)
    vk.vkDestroyCommandPool(d, pool, None)
    raw.destroy_descriptor_pool(d, dp)
for k, v in out.items():
    print(f"{k:24s} " + "  ".join(f"{x * 1e3:7.3f}" for x in v) + " ms")
