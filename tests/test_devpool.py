"""The free list the pools share (``inferd.runtime.extents``) and the device pool (``inferd.vulkan.devpool``): one
device allocation made with the device, from which regions take aligned ranges. Ranges never overlap, come back when
their regions are freed (once, however often a region is freed), a region the pool cannot hold gets memory of its
own, host regions take a mapped pool where device regions cannot be mapped, a model placed in the pool answers as
onnxruntime does and gives every range back when closed, and a size of 0 means no pool."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import inferd
import inferd.vulkan
from inferd.runtime.extents import Extents
from inferd.vulkan import devpool


def test_extents_never_overlap_stay_aligned_and_merge_back_into_one() -> None:
    rng = random.Random(3)
    cap = 1 << 16
    ext = Extents(cap)
    live: dict[int, int] = {}
    for step in range(3000):
        if live and (rng.random() < 0.45 or ext.largest_free < 64):
            off = rng.choice(list(live))
            ext.give(off, live.pop(off))
        else:
            size, align = rng.randint(1, 3000), rng.choice([1, 4, 64, 256])
            off = ext.take(size, align)
            if off is None:  # only when no free extent holds it, aligned
                assert all(-(-o // align) * align + size > o + n for o, n in ext.free), (size, align, ext.free)
                continue
            assert off % align == 0 and 0 <= off and off + size <= cap
            for o, n in live.items():
                assert off + size <= o or o + n <= off, (off, size, o, n)
            live[off] = size
        assert ext.in_use == sum(live.values())
        # the free list: sorted, inside the range, never touching (merged) and never covering a live range
        for (o1, n1), (o2, _n2) in zip(ext.free, ext.free[1:]):
            assert o1 + n1 < o2
        for o, n in ext.free:
            assert all(o + n <= lo or lo + ln <= o for lo, ln in live.items())
    for off, size in list(live.items()):
        ext.give(off, size)
    assert ext.free == [(0, cap)] and ext.in_use == 0 and ext.high_water > 0
    with pytest.raises(ValueError):
        ext.take(0)


vk_only = pytest.mark.skipif(not inferd.vulkan.available(), reason="no Vulkan device")


@pytest.fixture
def pool_size():
    """Devices created inside the test get a pool; the setting goes back after it."""
    before = devpool.capacity()
    yield devpool.configure
    devpool.configure(before)


@vk_only
def test_regions_take_disjoint_ranges_of_the_pool_and_give_them_back_once(pool_size) -> None:
    from inferd.vulkan.device import VulkanConfig, VulkanDevice

    pool_size(4 << 20)
    dev = VulkanDevice(VulkanConfig(cache_dir="", warm_driver=False))
    try:
        pool = dev.pool
        assert pool is not None and pool.size == 4 << 20
        assert dev.memory_report()["held"] == pool.size  # counted on its heap once, whatever it holds
        regions = [dev.allocate_region(n, f"r{i}") for i, n in enumerate([1000, 300_000, 64, 1 << 20, 5000])]
        assert all(r.pool is pool for r in regions)
        spans = sorted((r.offset, r.offset + r.alloc_size) for r in regions)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
        assert all(r.offset % 256 == 0 for r in regions)
        for i, r in enumerate(regions):  # each region's bytes are its own
            r.mapped[:] = i + 1
        for i, r in enumerate(regions):
            assert (dev.download(r, 0, r.size) == i + 1).all()
        big = dev.allocate_region(6 << 20, "too big")  # more than the pool holds: memory of its own
        assert big.pool is None and big.offset == 0 and dev.pool_stats()["fallbacks"] == 1
        assert dev.memory_report()["held"] == pool.size + big.alloc_size
        in_use = dev.pool_stats()["in_use_bytes"]
        dev.free_region(regions[1])
        dev.free_region(regions[1])  # a second free gives nothing back twice
        assert dev.pool_stats()["in_use_bytes"] == in_use - regions[1].alloc_size
        for r in regions + [big]:
            dev.free_region(r)
        st = dev.pool_stats()
        assert st["in_use_bytes"] == 0 and st["regions"] == 0 and st["free_extents"] == 1
        assert dev.memory_report()["held"] == pool.size
    finally:
        dev.close()


@vk_only
def test_unmapped_device_regions_take_the_pool_and_staging_takes_a_mapped_host_pool(pool_size) -> None:
    """force_staging: device regions are not mapped, so the staging and the models' input/output regions (host
    regions) come from a second, mapped pool; data goes through it both ways."""
    from inferd.vulkan.device import VulkanConfig, VulkanDevice

    pool_size(16 << 20)  # its host pool, 2 MiB, holds the 1 MiB staging region
    dev = VulkanDevice(VulkanConfig(cache_dir="", warm_driver=False, force_staging=True))
    try:
        assert dev.pool is not None and dev.pool.mapped is None
        hp = dev.host_pool
        assert hp is not None and hp is not dev.pool and hp.mapped is not None
        assert dev.pool_stats()["host"]["capacity_bytes"] == hp.size == devpool.host_capacity(16 << 20)
        r = dev.allocate_region(100_000, "weights")
        assert r.pool is dev.pool and r.mapped is None
        data = np.arange(25_000, dtype=np.float32)
        dev.upload([(r, 0, data)])  # through the staging region, a range of the host pool
        assert hp.stats()["regions"] == 1
        np.testing.assert_array_equal(dev.download(r, 0, data.nbytes).view(np.float32), data)
        io = dev.allocate_region(1000, "io", host=True)
        assert io.pool is hp and io.mapped is not None
        dev.free_region(io)
        dev.free_region(r)
        assert dev.pool_stats()["in_use_bytes"] == 0
    finally:
        dev.close()


@vk_only
def test_no_pool_where_the_setting_is_zero(pool_size) -> None:
    from inferd.vulkan.device import VulkanConfig, VulkanDevice

    pool_size(0)
    dev = VulkanDevice(VulkanConfig(cache_dir="", warm_driver=False))
    try:
        assert dev.pool is None and dev.pool_stats() is None
        r = dev.allocate_region(4096, "own")
        assert r.pool is None and dev.memory_report()["held"] == r.alloc_size
        dev.free_region(r)
        assert dev.memory_report()["held"] == 0
    finally:
        dev.close()


def _conv_model() -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array((rng.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    b = numpy_helper.from_array((rng.standard_normal(16) * 0.1).astype(np.float32), "b")
    w2 = numpy_helper.from_array((rng.standard_normal((8, 16, 1, 1)) * 0.3).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    g = helper.make_graph(nodes, "pooled", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 20, 20])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 20, 20])], [w, b, w2])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8  # what any onnxruntime reads: the GPU host's onnx writes 14, its onnxruntime reads up to 13
    return m


@vk_only
def test_a_model_in_the_pool_answers_as_onnxruntime_and_gives_its_ranges_back(pool_size, tmp_path: Path) -> None:
    import onnxruntime as ort

    from inferd.vulkan import device as vd

    vd.close_shared_device()
    pool_size(8 << 20)
    try:
        dev = vd.get_device({"cache_dir": str(tmp_path / "c")})
        assert dev.pool is not None
        proto = _conv_model()
        x = np.random.default_rng(2).standard_normal((1, 3, 20, 20)).astype(np.float32)
        sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        want = sess.run(None, {"x": x})[0]
        m = inferd.load(proto, device="vulkan")
        got = m.run({"x": x})["y"]
        held = dev.pool_stats()
        assert held["regions"] > 0 and held["in_use_bytes"] > 0 and held["fallbacks"] == 0, held
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        m.close()
        after = dev.pool_stats()
        assert after["in_use_bytes"] == 0 and after["regions"] == 0, after
    finally:
        vd.close_shared_device()


@vk_only
def test_threads_taking_and_giving_ranges_at_once_never_share_bytes(pool_size) -> None:
    """Loader threads place layers at once: ranges handed out concurrently never overlap, each keeps what its
    thread wrote, and all come back."""
    import threading

    from inferd.vulkan.device import VulkanConfig, VulkanDevice

    pool_size(8 << 20)
    dev = VulkanDevice(VulkanConfig(cache_dir="", warm_driver=False))
    errors: list[str] = []
    try:
        def work(k: int) -> None:
            rng = random.Random(k)
            held = []
            for step in range(60):
                if held and rng.random() < 0.4:
                    r, tag = held.pop(rng.randrange(len(held)))
                    if not (r.mapped == tag).all():
                        errors.append(f"thread {k}: region {r.label} overwritten")
                    dev.free_region(r)
                else:
                    r = dev.allocate_region(rng.randint(1, 200_000), f"t{k}s{step}")
                    tag = (k * 61 + step) % 251 + 1
                    r.mapped[:] = tag
                    held.append((r, tag))
            for r, tag in held:
                if not (r.mapped == tag).all():
                    errors.append(f"thread {k}: region {r.label} overwritten")
                dev.free_region(r)

        ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors, errors[:3]
        st = dev.pool_stats()
        assert st["in_use_bytes"] == 0 and st["regions"] == 0 and st["free_extents"] == 1, st
        assert st["high_water_bytes"] > 0
    finally:
        dev.close()


@pytest.mark.parametrize("host_memory", [True, False])
def test_a_mapped_pool_is_faulted_in_before_any_range_is_taken_and_only_host_memory_counts_as_ours(
        host_memory: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Device memory mapped through a discrete GPU's BAR is faulted in too (a byte per page, where the populate
    is refused), synchronously, so that a cold load's first uploads into its slabs do not fault; it is not counted as
    the process's memory (``host_memory``), host memory is."""
    from inferd.runtime import pagecache

    monkeypatch.setattr(pagecache, "can_populate", lambda: False)  # the BAR's case: a byte per page, here
    mem = np.full(16 * devpool.PAGE, 7, np.uint8)
    p = devpool.DevicePool(None, mem.size, 0, 0, 0, mem, None)
    p.prefault(host_memory=host_memory)
    assert p.wait_prefaulted(10) and p.prefault_ms is not None
    assert (mem[::devpool.PAGE] == 0).all() and (mem[1::devpool.PAGE] == 7).all()
    assert p.host_memory is host_memory and p.stats()["host_memory"] is host_memory
    unmapped = devpool.DevicePool(None, mem.size, 0, 0, 0, None, None)
    unmapped.prefault(host_memory=False)  # nothing mapped: nothing to fault, nothing counted
    assert unmapped.prefault_ms is None and not unmapped.host_memory


@vk_only
def test_driver_warm_up_at_bring_up_leaves_nothing_the_device_counts(pool_size) -> None:
    """Bring-up makes (and destroys) a pipeline, a command buffer and a descriptor pool so that a model's cold load
    does not pay their first-of-the-process costs: the device it leaves is the one made without the warm-up."""
    from inferd.vulkan import raw
    from inferd.vulkan.device import VulkanConfig, VulkanDevice, vk

    pool_size(0)
    cold = VulkanDevice(VulkanConfig(cache_dir="", warm_driver=False))
    warm = VulkanDevice(VulkanConfig(cache_dir="", warm_driver=True))
    try:
        assert cold.warm_s == 0.0 and warm.warm_s > 0.0
        assert warm.stats == cold.stats and warm.pipeline_count() == cold.pipeline_count() == 0
        assert warm.memory_report()["held"] == cold.memory_report()["held"]
        pool = vk.vkCreateCommandPool(warm.device, vk.VkCommandPoolCreateInfo(queueFamilyIndex=warm.queue_family), None)
        try:  # what a load then makes works as before
            raw.end_command_buffer(raw.allocate_command_buffer(warm.device, pool))
        finally:
            vk.vkDestroyCommandPool(warm.device, pool, None)
    finally:
        warm.close()
        cold.close()
