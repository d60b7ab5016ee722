"""Resident pipelines: the device's list of recently used pipelines (format, damage, order, pruning) and a
fresh device that makes them resident, after which a model's cold load creates none of its own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import numpy as np
import pytest

from inferd.vulkan import resident
from inferd.vulkan.pipeline_cache import HEADER, PipelineCacheWarning

DEV = SimpleNamespace(vendor_id=0x10005, device_id=0, driver_version=7, pipeline_cache_uuid=b"u" * 16)
R1 = resident.request("conv_gemm", (("ACT", "1"),), {"KH": 3, "KW": 3})
R2 = resident.request("conv_dw", (), {"STRIDE": 2})
R3 = resident.request("copy", (), {})


def _list(cache: Path, dev: Any = DEV) -> resident.PipelineList:
    return resident.PipelineList(dev, cache)


def test_list_round_trips_in_recency_order(tmp_path: Path) -> None:
    pl = _list(tmp_path)
    assert pl.status == "missing" and len(pl) == 0 and not pl.save()  # nothing to write
    pl.record([R1], now=1000.0)
    pl.record([R2, R3], now=2000.0)
    pl.record([R1], now=2000.0 + resident.REFRESH_S + 1)  # used again much later: the most recent now
    assert pl.save()
    again = _list(tmp_path)
    assert again.status == "loaded"
    assert again.recent(10) == [R1, R2, R3] or again.recent(10) == [R1, R3, R2]
    assert again.recent(1) == [R1]
    assert again.recent(0) == []
    # a request seen within REFRESH_S of its stored time changes nothing on disk
    again.record([R2], now=2000.0 + 5)
    assert not again.dirty and not again.save()


def test_list_keeps_the_most_recent_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resident, "MAX_ENTRIES", 2)
    pl = _list(tmp_path)
    for i, r in enumerate((R1, R2, R3)):
        pl.record([r], now=100.0 * (i + 1))
    assert pl.save()
    assert _list(tmp_path).recent(10) == [R3, R2]


def _payload_file(tmp_path: Path, payload: bytes) -> Path:
    pl = _list(tmp_path)
    path = pl.path
    assert path is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(resident.make_header(DEV, pl.shader_hash, payload, resident.MAGIC, resident.FORMAT_VERSION)
                     + payload)
    return path


@pytest.mark.parametrize("kind", ["truncated", "bad_magic", "other_device", "other_driver", "checksum",
                                  "undecodable", "wrong_rows", "unreadable"])
def test_a_bad_list_is_ignored_with_a_warning_and_rewritten(tmp_path: Path, kind: str) -> None:
    pl = _list(tmp_path)
    pl.record([R1, R2], now=5.0)
    assert pl.save()
    path = pl.path
    assert path is not None
    blob = path.read_bytes()
    dev: Any = DEV
    if kind == "truncated":
        path.write_bytes(blob[:-3])
    elif kind == "bad_magic":
        path.write_bytes(b"NOTALIST" + blob[8:])
    elif kind == "other_device":
        # the same file name (vendor and device ids) from another physical device or driver build
        dev = SimpleNamespace(**{**vars(DEV), "pipeline_cache_uuid": b"v" * 16})
    elif kind == "other_driver":
        dev = SimpleNamespace(**{**vars(DEV), "driver_version": 8})
    elif kind == "checksum":
        path.write_bytes(blob[:-1] + bytes([blob[-1] ^ 0xFF]))
    elif kind == "undecodable":
        _payload_file(tmp_path, b"\xc1\xc1\xc1")
    elif kind == "wrong_rows":
        _payload_file(tmp_path, msgpack.packb([[1, [], [], 0.0, 1]]))
    elif kind == "unreadable":
        path.unlink()
        path.mkdir()  # a directory where the file should be: reading it fails
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bad = _list(tmp_path, dev)
    assert bad.status.startswith("rejected: "), bad.status
    assert len(bad) == 0 and bad.recent(5) == []
    assert any(issubclass(w.category, PipelineCacheWarning) and "pipeline list" in str(w.message) for w in caught)
    if kind == "unreadable":
        path.rmdir()
    # the next save replaces it with a good file
    bad.record([R3], now=9.0)
    assert bad.save()
    assert _list(tmp_path, dev).recent(5) == [R3]


def test_a_list_that_cannot_be_written_is_reported_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache directory should be")
    with pytest.warns(PipelineCacheWarning, match="unreadable"):
        pl = _list(blocker)
    pl.record([R1], now=1.0)
    assert pl.save() is False
    assert pl.dirty  # tried again at the next save


def test_no_cache_dir_lists_nothing(tmp_path: Path) -> None:
    pl = resident.PipelineList(DEV, None)
    pl.record([R1])
    assert pl.status == "disabled" and len(pl) == 0 and not pl.save()
    assert not resident.listed(tmp_path)


def test_header_is_the_pipeline_caches(tmp_path: Path) -> None:
    pl = _list(tmp_path)
    pl.record([R1], now=1.0)
    pl.save()
    assert pl.path is not None and pl.path.read_bytes()[:8] == resident.MAGIC
    assert len(pl.path.read_bytes()) > HEADER.size
    assert resident.listed(tmp_path)


# ----------------------------------------------------------------------------- on a device
import inferd.vulkan  # noqa: E402

# One process: optionally make N listed pipelines resident (and list a shader that no longer exists first),
# then load a small model (4 distinct pipelines) and report what its load created.
_CHILD = r"""
import json, sys, numpy as np
import inferd.ops
from inferd.ir import Graph, Node, TensorInfo
from inferd.vulkan.device import VulkanConfig, VulkanDevice
from inferd.vulkan.model import VulkanModel

f = np.dtype(np.float32)
info = {n: TensorInfo(n, (3, 7), f) for n in ("x", "a", "b", "c", "y")}
nodes = [Node("n0", "Sigmoid", ["x"], ["a"]), Node("n1", "Tanh", ["x"], ["b"]),
         Node("n2", "Mul", ["a", "b"], ["c"]), Node("n3", "Softmax", ["c"], ["y"], {"axis": -1})]
g = Graph("res", nodes, [info["x"]], [info["y"]], {}, info)
dev = VulkanDevice(VulkanConfig(cache_dir=sys.argv[1]))
limit, ghost = int(sys.argv[2]), sys.argv[3] == "ghost"
if ghost:  # a shader removed since the list was written, listed as the most recent
    dev.pipeline_list.record([("no_such_shader", (), ())], now=4e9)
res = dev.make_resident(limit) if limit else None
x = np.linspace(-2, 2, 21, dtype=np.float32).reshape(3, 7)
with VulkanModel(g, dev) as m:
    y = m.run({"x": x})["y"]
    st = dict(m.load_stats)
listed = len(dev.pipeline_list)
dev.close()
ref = np.tanh(x) / (1 + np.exp(-x))
ref = np.exp(ref - ref.max(-1, keepdims=True)); ref /= ref.sum(-1, keepdims=True)
print(json.dumps({"resident": res, "created": st["pipelines_created"], "listed": listed,
                  "err": float(np.abs(y - ref).max())}))
"""


def _child(cache: Path, limit: int, ghost: bool = False) -> dict[str, Any]:
    env = dict(os.environ, MESA_SHADER_CACHE_DIR=str(cache / "mesa"), PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, "-c", _CHILD, str(cache), str(limit), "ghost" if ghost else "-"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.vulkan
@pytest.mark.skipif(not inferd.vulkan.available(), reason="no Vulkan device")
def test_a_fresh_device_makes_the_listed_pipelines_resident_and_the_load_creates_none(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _child(cache, 0)
    assert first["created"] == 4 and first["listed"] == 4 and first["err"] < 1e-5
    assert resident.listed(cache)

    every = _child(cache, 128)
    assert every["resident"]["listed"] == 4 and every["resident"]["created"] == 4
    assert every["created"] == 0 and every["err"] < 1e-5  # the load found all four

    two = _child(cache, 2)
    assert two["resident"]["created"] == 2
    assert two["created"] == 2 and two["err"] < 1e-5

    # a listed shader that no longer exists is skipped; the others are made resident all the same
    ghost = _child(cache, 128, ghost=True)
    assert ghost["resident"]["skipped"] == 1 and ghost["resident"]["created"] == 4
    assert ghost["created"] == 0 and ghost["err"] < 1e-5
