"""The persistent VkPipelineCache: a second process creates its pipelines from the saved file; a file
with a wrong header, a truncated file and random bytes are each rejected with a warning, and the
answers stay right (the cache is rebuilt and the file replaced)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import inferd.ops  # noqa: F401
import inferd.vulkan

pytestmark = [pytest.mark.vulkan,
              pytest.mark.skipif(not inferd.vulkan.available(), reason="no Vulkan device")]

# One process: load a small model (4 distinct pipelines), run it, report what the cache did.
_CHILD = r"""
import json, sys, numpy as np
import inferd.ops
from inferd.ir import Graph, Node, TensorInfo
from inferd.vulkan.device import VulkanConfig, VulkanDevice
from inferd.vulkan.model import VulkanModel

def model_graph():
    f = np.dtype(np.float32)
    info = {n: TensorInfo(n, (3, 7), f) for n in ("x", "a", "b", "c", "y")}
    nodes = [Node("n0", "Sigmoid", ["x"], ["a"]), Node("n1", "Tanh", ["x"], ["b"]),
             Node("n2", "Mul", ["a", "b"], ["c"]), Node("n3", "Softmax", ["c"], ["y"], {"axis": -1})]
    return Graph("pc", nodes, [info["x"]], [info["y"]], {}, info)

dev = VulkanDevice(VulkanConfig(cache_dir=sys.argv[1]))
status, initial = dev.pipeline_cache.status, dev.pipeline_cache.initial_bytes
x = np.linspace(-2, 2, 21, dtype=np.float32).reshape(3, 7)
with VulkanModel(model_graph(), dev) as m:
    y = m.run({"x": x})["y"]
    st = dict(m.load_stats)
stats = dict(dev.stats)
dev.close()
ref = np.tanh(x) / (1 + np.exp(-x))
ref = np.exp(ref - ref.max(-1, keepdims=True)); ref /= ref.sum(-1, keepdims=True)
print(json.dumps({"status": status, "initial_bytes": initial, "stats": stats,
                  "pipelines_created": st["pipelines_created"], "err": float(np.abs(y - ref).max())}))
"""


def _child(cache_dir: Path, mesa: Path) -> dict[str, Any]:
    env = dict(os.environ, MESA_SHADER_CACHE_DIR=str(mesa), PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, "-c", _CHILD, str(cache_dir)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _cache_file(cache_dir: Path) -> Path:
    files = list((cache_dir / "vulkan").glob("pipelines-*.bin"))
    assert len(files) == 1, files
    return files[0]


def test_second_process_creates_pipelines_from_saved_cache(tmp_path: Path) -> None:
    from inferd.vulkan.pipeline_cache import HEADER, MAGIC
    cache, mesa = tmp_path / "cache", tmp_path / "mesa"
    first = _child(cache, mesa)
    assert first["status"] == "missing" and first["initial_bytes"] == 0
    assert first["pipelines_created"] == 4 and first["err"] < 1e-5
    blob = _cache_file(cache).read_bytes()
    assert blob[:8] == MAGIC and len(blob) > HEADER.size
    data_len = len(blob) - HEADER.size

    second = _child(cache, mesa)
    assert second["err"] < 1e-5
    # the driver got the whole saved blob as the cache's initial data, and every pipeline of the
    # second process was created through that cache
    assert second["status"] == "loaded"
    assert second["initial_bytes"] == data_len > 0
    assert second["stats"]["pipelines_from_loaded_cache"] == second["pipelines_created"] == 4
    # drivers that store pipelines (more than the 32-byte VkPipelineCacheHeaderVersionOne; lavapipe
    # stores none) and report creation feedback must report every creation as a cache hit
    if data_len > 32 and second["stats"]["pipeline_feedback"]:
        assert second["stats"]["pipeline_cache_hits"] == second["pipelines_created"]


def _good_file(tmp_path: Path) -> tuple[Path, bytes]:
    cache = tmp_path / "cache"
    _child(cache, tmp_path / "mesa")
    f = _cache_file(cache)
    return cache, f.read_bytes()


def _corruptions(blob: bytes) -> dict[str, tuple[bytes, str]]:
    from inferd.vulkan.pipeline_cache import HEADER
    wrong_vendor = bytearray(blob)
    wrong_vendor[16:20] = (int.from_bytes(blob[16:20], "little") ^ 0x1234).to_bytes(4, "little")
    wrong_shaders = bytearray(blob)
    wrong_shaders[44] ^= 0xFF
    flipped = bytearray(blob)
    flipped[-1] ^= 0x01
    rng = np.random.default_rng(3)
    return {
        "wrong_header_device": (bytes(wrong_vendor), "another device or driver"),
        "wrong_header_shaders": (bytes(wrong_shaders), "another shader set"),
        "truncated_data": (blob[:HEADER.size + (len(blob) - HEADER.size) // 2], "truncated data"),
        "truncated_header": (blob[:HEADER.size // 2], "truncated header"),
        "random_bytes": (rng.integers(0, 256, len(blob), dtype=np.uint8).tobytes(), "bad magic"),
        "corrupt_data": (bytes(flipped), "checksum"),
    }


@pytest.mark.parametrize("kind", ["wrong_header_device", "wrong_header_shaders", "truncated_data", "truncated_header",
                                  "random_bytes", "corrupt_data"])
def test_bad_cache_file_is_rejected_with_warning_and_rebuilt(tmp_path: Path, kind: str) -> None:
    from inferd.vulkan.pipeline_cache import PipelineCacheWarning, check_file
    from inferd.vulkan.device import VulkanConfig, VulkanDevice
    cache, blob = _good_file(tmp_path)
    bad, reason = _corruptions(blob)[kind]
    path = _cache_file(cache)
    path.write_bytes(bad)
    os.environ["MESA_SHADER_CACHE_DIR"] = str(tmp_path / "mesa")
    with pytest.warns(PipelineCacheWarning, match=reason):
        dev = VulkanDevice(VulkanConfig(cache_dir=str(cache)))
    try:
        assert dev.pipeline_cache.status.startswith("rejected") and dev.pipeline_cache.initial_bytes == 0
        # the model still runs and is right
        out = _child_in_process(dev)
        assert out < 1e-5
    finally:
        dev.close()
    # the bad file was replaced by a valid one for this device
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dev2 = VulkanDevice(VulkanConfig(cache_dir=str(cache)))
    try:
        assert dev2.pipeline_cache.status == "loaded"
        data, why = check_file(dev2, dev2.pipeline_cache.shader_hash, path.read_bytes())
        assert data is not None, why
    finally:
        dev2.close()


def _child_in_process(dev: Any) -> float:
    ns: dict[str, Any] = {}
    src = _CHILD.split("dev = VulkanDevice")[0]
    exec(compile(src, "<child>", "exec"), ns)
    from inferd.vulkan.model import VulkanModel
    x = np.linspace(-2, 2, 21, dtype=np.float32).reshape(3, 7)
    with VulkanModel(ns["model_graph"](), dev) as m:
        y = m.run({"x": x})["y"]
    ref = np.tanh(x) / (1 + np.exp(-x))
    ref = np.exp(ref - ref.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    return float(np.abs(y - ref).max())


def test_no_cache_dir_disables_the_file(tmp_path: Path) -> None:
    from inferd.vulkan.device import VulkanConfig, VulkanDevice
    dev = VulkanDevice(VulkanConfig(cache_dir=""))
    try:
        assert dev.pipeline_cache.status == "disabled" and not dev.pipeline_cache.save(force=True)
        assert _child_in_process(dev) < 1e-5
    finally:
        dev.close()
