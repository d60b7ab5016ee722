"""The device (GPU) memory budget: models placed on a discrete GPU are planned against their own budget (default:
what the device reports), least recently used first, pinned and busy ones kept, a model that cannot fit
answered UNAVAILABLE with the minimum device budget it needs; the host budget does not count them. On a device
whose memory is the host's (an integrated GPU, lavapipe) they count against the host budget, and a configured
device budget caps them besides. Fake Vulkan-placed models for the policy, a real model on lavapipe for the
shared memory."""
from __future__ import annotations

import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from inferd.server.budget import Resident, device_budget, on_device, plan
from inferd.server.testing import DaemonProcess, wait_until, write_fake_model, write_two_io_model
from inferd_client import Client
from inferd_client.cli import format_status
from inferd_client.errors import Unavailable

MB = 1_000_000


def test_device_budget_defaults_to_what_the_device_reports() -> None:
    assert device_budget(0, None) == 0           # no device open, none configured: no budget
    assert device_budget(0, 8 << 30) == 8 << 30  # the device's figure
    assert device_budget(1 << 30, 8 << 30) == 1 << 30
    assert device_budget(16 << 30, 8 << 30) == 8 << 30  # never above what the device has
    assert device_budget(5, None) == 5
    assert on_device("vulkan") and not on_device("cpu") and not on_device("cpu+vulkan") and not on_device(None)
    assert not on_device("vulkan", shares_host=True)  # an integrated GPU's memory is the host's: the host budget
    res = [Resident("g1", 10, 1.0), Resident("g2", 10, 2.0, busy=True), Resident("gp", 10, 0.5, pinned=True)]
    assert plan(res, 20).evict == ("g1",)  # the same LRU policy: never the pinned or the busy one


def _x() -> np.ndarray:
    return np.ones((1, 4), np.float32)


def _state(c: Client) -> dict[str, str]:
    return {n: m["state"] for n, m in c.status()["models"].items()}




def test_vulkan_models_keep_their_own_budget_lru_pinned_and_busy() -> None:
    d = Path(tempfile.mkdtemp(prefix="ifdg", dir="/tmp"))
    try:
        m = d / "m"
        m.mkdir()
        for n in ("g1", "g2", "g3"):
            write_fake_model(m / f"{n}.onnx", memory_bytes=10 * MB, device="vulkan", delay_s=1.0 if n == "g2" else 0)
        (m / "gp").mkdir()
        write_fake_model(m / "gp" / "model.onnx", memory_bytes=10 * MB, device="vulkan")
        (m / "gp" / "config.toml").write_text("pinned = true\n")
        write_fake_model(m / "h.onnx", memory_bytes=10 * MB)  # on the host
        cfg = d / "inferd.toml"
        cfg.write_text(f"device_memory_budget = {25 * MB}\n")
        with DaemonProcess(f"ipc://{d}/s.sock", m, "--no-preload", "--config", str(cfg), "--memory-budget",
                           str(15 * MB), log_path=d / "d.log") as dp, Client(dp.endpoint, timeout=30) as c:
            for n in ("gp", "g1", "h"):
                c.infer(n, {"x": _x()})
            # 20 MB on the device and 10 on the host: each inside its own budget (the host's 15 MB does not
            # count the device's models)
            assert {n for n, s in _state(c).items() if s == "READY"} == {"gp", "g1", "h"}
            st = c.status()
            mem = st["memory"]
            assert mem["device"]["budget_bytes"] == 25 * MB and mem["device"]["models_bytes"] == 20 * MB
            assert "GPU models: 19.1 MiB of device memory, device budget 23.8 MiB" in format_status(st)
            c.infer("g2", {"x": _x()})  # 30 MB on the device: the least recently used unpinned one (g1) goes
            wait_until(lambda: _state(c)["g1"] == "UNLOADED", 15.0)
            st = c.status()["models"]
            assert "device memory budget" in st["g1"]["reason"]
            assert st["gp"]["state"] == "READY" and st["h"]["state"] == "READY"
            # g2 busy under a request while the device budget shrinks to 10 MB: it stays until idle
            box: dict = {}
            th = threading.Thread(target=lambda: box.setdefault("y", c.infer("g2", {"x": _x()})))
            th.start()
            time.sleep(0.3)
            cfg.write_text(f"device_memory_budget = {10 * MB}\n")
            dp.signal(signal.SIGHUP)
            time.sleep(0.5)
            assert _state(c)["g2"] == "READY"
            th.join(10)
            assert "y" in box  # the request under the change was answered
            wait_until(lambda: _state(c)["g2"] == "UNLOADED", 15.0)
            assert _state(c)["gp"] == "READY"  # pinned stays, though it alone fills the budget
            # g1 no longer fits beside the pinned model: UNAVAILABLE naming the device budget it needs
            with pytest.raises(Unavailable, match=r"device memory.*minimum device budget it needs is 20000000"):
                c.infer("g1", {"x": _x()})
            c.infer("gp", {"x": _x()})  # still serving
            c.infer("h", {"x": _x()})
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_lavapipe_model_counts_against_the_host_budget() -> None:
    """lavapipe's memory is the host's (as a Jetson's integrated GPU's is): a Vulkan model there counts against
    the host budget with the CPU models (no device budget of its own unless one is configured, which then caps
    it besides), so ``inferctl budget`` below what it holds unloads it, and a configured device budget too."""
    import inferd.vulkan as vk

    if not vk.available():
        pytest.skip("no Vulkan device")
    from inferd.vulkan.device import VulkanConfig, VulkanDevice

    dev = VulkanDevice(VulkanConfig.from_env(None))
    try:
        shares = dev.shares_host_memory
    finally:
        dev.close()
    if not shares:
        pytest.skip("this Vulkan device has memory of its own")
    d = Path(tempfile.mkdtemp(prefix="ifdl", dir="/tmp"))
    try:
        m = d / "m"
        m.mkdir()
        write_two_io_model(m / "two.onnx")
        write_fake_model(m / "h.onnx", memory_bytes=MB)  # a CPU model beside it, in the same budget
        cfg = d / "inferd.toml"
        cfg.write_text("device_memory_budget = 0\n")
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        with DaemonProcess(f"ipc://{d}/s.sock", m, "--no-preload", "--config", str(cfg), device="vulkan",
                           log_path=d / "d.log") as dp, Client(dp.endpoint, timeout=120) as c:
            out = c.infer("two", {"a": a, "b": a})
            np.testing.assert_allclose(out["sum"], a + a)
            c.infer("h", {"x": _x()})
            st = c.status()
            if st["models"]["two"]["device"] != "vulkan":
                pytest.skip(f"placed on {st['models']['two']['device']}")
            dev_mem = st["memory"]["device"]
            assert dev_mem["shares_host_memory"] is True
            assert "in the memory budget above (the device's memory is the host's)" in format_status(st)
            assert dev_mem["budget_bytes"] == 0  # none of its own: the host budget holds its models
            held = dev_mem["models_bytes"]
            assert held > 0
            # a host budget one byte short of both: the least recently used one goes, the Vulkan model ("h" was
            # used after it), for the host budget's sake
            c.set_budget(held + MB - 1)
            wait_until(lambda: _state(c)["two"] == "UNLOADED", 15.0)
            reason = c.status()["models"]["two"]["reason"]
            assert "memory budget" in reason and "device" not in reason, reason
            assert _state(c)["h"] == "READY"
            c.set_budget(max(1, held // 2))  # below what the Vulkan model alone needs
            with pytest.raises(Unavailable, match=r"memory budget of \d+ bytes"):
                c.infer("two", {"a": a, "b": a})
            c.set_budget(0)  # no host budget: a configured device budget still caps the device's models
            out = c.infer("two", {"a": a, "b": a})
            np.testing.assert_allclose(out["sum"], a + a)
            cfg.write_text(f"device_memory_budget = {max(1, held // 2)}\n")
            dp.signal(signal.SIGHUP)
            wait_until(lambda: c.status()["models"]["two"]["state"] == "UNLOADED", 15.0)
            with pytest.raises(Unavailable, match="device memory budget"):
                c.infer("two", {"a": a, "b": a})
            c.infer("h", {"x": _x()})  # the CPU model still serves
    finally:
        shutil.rmtree(d, ignore_errors=True)
