"""A streamed model (``memory = "stream"``) in the daemon: it runs inside its share of the budget, re-plans
when the budget changes while several client processes keep sending, and no request is lost or fails."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from inferd.server.testing import DaemonProcess
from inferd_client import Client
from ortutil import ort_session
from zoo_fixture import zoo_dir

MB = 1 << 20

_CLIENT = r"""
import json, sys, time
from pathlib import Path
import numpy as np
from inferd_client import Client
ep, ref, stop = sys.argv[1], np.load(sys.argv[2]), Path(sys.argv[3])
x, y = ref["x"], ref["y"]
ok = bad = 0
errors = []
with Client(ep, timeout=120) as c:
    while not stop.exists():
        try:
            got = c.infer("mnv2", {"input": x})["output"]
            err = float(np.abs(got - y).max() / np.abs(y).max())
            if err <= 1e-4:
                ok += 1
            else:
                bad += 1
                errors.append(f"relative error {err}")
        except Exception as e:
            bad += 1
            errors.append(f"{type(e).__name__}: {e}")
print(json.dumps({"ok": ok, "bad": bad, "errors": errors[:5]}))
"""


def _streamed_repo(d: Path, model: str, name: str) -> Path:
    """A repository under ``d / "m"`` holding the zoo's ``model`` as ``name``, served with ``memory = "stream"``;
    returns the zoo file."""
    (d / "m" / name).mkdir(parents=True)
    src = zoo_dir([model]) / f"{model}.onnx"
    shutil.copy(src, d / "m" / name / "model.onnx")
    (d / "m" / name / "config.toml").write_text('memory = "stream"\n')
    return src


@pytest.mark.slow
def test_streamed_model_follows_budget_changes_under_load() -> None:
    d = Path(tempfile.mkdtemp(prefix="ifds", dir="/tmp"))
    procs: list[subprocess.Popen[str]] = []
    try:
        src = _streamed_repo(d, "mobilenetv2", "mnv2")
        x = np.random.default_rng(3).standard_normal((1, 3, 224, 224)).astype(np.float32)
        y = ort_session(src).run(None, {"input": x})[0]
        np.savez(d / "ref.npz", x=x, y=y)
        with DaemonProcess(f"ipc://{d}/s.sock", d / "m", "--cache-dir", str(d / "c"), "--memory-budget",
                           str(40 * MB), log_path=d / "d.log") as dp, Client(dp.endpoint, timeout=120) as c:
            got = c.infer("mnv2", {"input": x})["output"]
            assert float(np.abs(got - y).max() / np.abs(y).max()) <= 1e-4
            st = c.status()["models"]["mnv2"]
            assert st["memory_bytes"] <= 40 * MB and st["budget_bytes"] <= 40 * MB
            assert st["arena_bytes"] + st["weights_bytes"] == st["memory_bytes"]
            stop = d / "stop"
            procs = [subprocess.Popen([sys.executable, "-c", _CLIENT, dp.endpoint, str(d / "ref.npz"), str(stop)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
            time.sleep(1.0)
            for b in (10 * MB, 30 * MB, 9 * MB, 16 * MB, 40 * MB):
                c.set_budget(b)
                end = time.monotonic() + 20
                while c.status()["models"]["mnv2"]["memory_bytes"] > b:  # swapped at the end of a request
                    assert time.monotonic() < end, "the arena never followed the budget"
                    time.sleep(0.02)
                time.sleep(0.3)
            # below the model's minimum: refused with the size it needs, and the model keeps serving
            c.set_budget(1 * MB)
            time.sleep(0.5)
            assert "needs at least" in dp.log_text() or c.status()["models"]["mnv2"]["state"] != "READY"
            c.set_budget(0)
            stop.touch()
            outs = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
            assert all(o["bad"] == 0 for o in outs), outs
            assert all(o["ok"] > 0 for o in outs), outs
            got = c.infer("mnv2", {"input": x})["output"]
            assert float(np.abs(got - y).max() / np.abs(y).max()) <= 1e-4
            assert "outside the memory budget" in dp.log_text()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(d, ignore_errors=True)


def test_shares_and_config(tmp_path: Path) -> None:
    from inferd.server.repository import parse_model_config
    from inferd.server.streamed import UNLIMITED, shares

    assert shares([("a", 10), ("b", 30)], 0) == {"a": UNLIMITED, "b": UNLIMITED}  # no budget
    s = shares([("a", 10), ("b", 30)], 80)
    assert s["a"] >= 10 and s["b"] >= 30 and s["a"] + s["b"] <= 80 and s["b"] == 3 * s["a"]
    assert shares([("a", 10), ("b", 30)], 20) == {"a": 5, "b": 15}  # below the minimums: sliced again
    (tmp_path / "c.toml").write_text('memory = "stream"\n')
    assert parse_model_config(str(tmp_path / "c.toml")).memory == "stream"
    (tmp_path / "c.toml").write_text('memory = "sliced"\n')
    with pytest.raises(ValueError, match="'memory' must be whole or stream"):
        parse_model_config(str(tmp_path / "c.toml"))
    # streamed runs on the CPU or the GPU, not split: a config that asks for both is refused, not served on one
    (tmp_path / "c.toml").write_text('memory = "stream"\ndevice = "cpu+vulkan"\n')
    with pytest.raises(ValueError, match=r'memory = "stream" runs on the CPU or on the GPU, not split .*cpu\+vulkan'):
        parse_model_config(str(tmp_path / "c.toml"))
    for dev in ("cpu", "auto", "vulkan"):
        (tmp_path / "c.toml").write_text(f'memory = "stream"\ndevice = "{dev}"\n')
        assert parse_model_config(str(tmp_path / "c.toml")).device == dev


def test_two_models_named_model_onnx_get_their_own_stores(tmp_path: Path) -> None:
    from inferd.runtime.stream_compile import compile_streamed, read_skeleton

    for m in ("squeezenet1_1", "mobilenetv2"):
        (tmp_path / m).mkdir()
        shutil.copy(zoo_dir([m]) / f"{m}.onnx", tmp_path / m / "model.onnx")
    a = compile_streamed(tmp_path / "squeezenet1_1" / "model.onnx", 0, tmp_path / "w", in_child=False)
    b = compile_streamed(tmp_path / "mobilenetv2" / "model.onnx", 0, tmp_path / "w", in_child=False)
    assert read_skeleton(a)[1]["store"] != read_skeleton(b)[1]["store"]


@pytest.mark.slow
def test_streamed_model_is_sliced_again_when_its_slicing_no_longer_fits() -> None:
    d = Path(tempfile.mkdtemp(prefix="ifdr", dir="/tmp"))
    try:
        _streamed_repo(d, "resnet50", "r50")
        x = np.random.default_rng(4).standard_normal((1, 3, 224, 224)).astype(np.float32)
        # first a budget that holds the whole model, which its compile then leaves unsliced (under a budget that
        # streams it, ``faster_config`` may slice it for speed, and enough to fit the smaller one below)
        with DaemonProcess(f"ipc://{d}/s.sock", d / "m", "--cache-dir", str(d / "c"), "--memory-budget",
                           str(160 * MB), log_path=d / "d.log") as dp, Client(dp.endpoint, timeout=300) as c:
            y = c.infer("r50", {"input": x})["output"]
            # below the unsliced minimum (~12.6 MiB, blocked; 20.5 before the streamed models ran the CPU's
            # blocked layout), above the sliced one (~9.8 MiB)
            c.set_budget(11 * MB)
            end = time.monotonic() + 120
            during = 0  # requests the current plan answered while the new slicing was being made
            while True:
                st = c.status()["models"]["r50"]
                if st["state"] == "READY" and 0 < st["memory_bytes"] <= 11 * MB:
                    break
                assert time.monotonic() < end, (st, dp.log_text()[-2000:])
                reslicing = "slicing it again" in dp.log_text()
                got = c.infer("r50", {"input": x})["output"]  # serving all along
                assert float(np.abs(got - y).max() / np.abs(y).max()) <= 1e-4
                # answered, and the old arena still in place: served beside the compile, not queued behind it
                # (the compile ran on the model's worker once, and every request waited for it)
                if reslicing and c.status()["models"]["r50"]["memory_bytes"] > 11 * MB:
                    during += 1
                time.sleep(0.2)
            got = c.infer("r50", {"input": x})["output"]
            assert float(np.abs(got - y).max() / np.abs(y).max()) <= 1e-4
            assert "slicing it again" in dp.log_text()
            assert during > 0, dp.log_text()[-2000:]
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.slow
def test_a_streamed_model_loaded_with_no_budget_is_sliced_for_the_first_budget_that_streams_it() -> None:
    """Loaded with no budget, a streamed model is unsliced (it fits any share down to its minimum); the first share
    that has its weights read on every run gets it sliced for a budget (``faster_config``'s choice), once, in the
    background, serving right all along."""
    d = Path(tempfile.mkdtemp(prefix="ifdn", dir="/tmp"))
    try:
        src = _streamed_repo(d, "mobilenetv2", "mnv2")
        x = np.random.default_rng(5).standard_normal((1, 3, 224, 224)).astype(np.float32)
        y = ort_session(src).run(None, {"input": x})[0]
        with DaemonProcess(f"ipc://{d}/s.sock", d / "m", "--cache-dir", str(d / "c"), log_path=d / "d.log") as dp, \
                Client(dp.endpoint, timeout=120) as c:
            got = c.infer("mnv2", {"input": x})["output"]
            assert float(np.abs(got - y).max() / np.abs(y).max()) <= 1e-4
            assert dp.log_text().count("for streaming in a child process") == 1
            c.set_budget(30 * MB)  # everything resident (~20 MiB): nothing streams, nothing to slice
            time.sleep(0.5)
            c.infer("mnv2", {"input": x})
            assert "compiled without a memory budget" not in dp.log_text()
            c.set_budget(12 * MB)  # weights read on every run
            end = time.monotonic() + 120
            while dp.log_text().count("for streaming in a child process") < 2 or \
                    c.status()["models"]["mnv2"]["loads"] < 2:
                assert time.monotonic() < end, dp.log_text()[-3000:]
                got = c.infer("mnv2", {"input": x})["output"]
                assert float(np.abs(got - y).max() / np.abs(y).max()) <= 1e-4
                time.sleep(0.1)
            assert "compiled without a memory budget" in dp.log_text()
            st = c.status()["models"]["mnv2"]
            assert st["state"] == "READY" and 0 < st["memory_bytes"] <= 12 * MB
            c.set_budget(10 * MB)  # another share: re-planned, not sliced again (once per model)
            time.sleep(0.5)
            got = c.infer("mnv2", {"input": x})["output"]
            assert float(np.abs(got - y).max() / np.abs(y).max()) <= 1e-4
            assert dp.log_text().count("for streaming in a child process") == 2
    finally:
        shutil.rmtree(d, ignore_errors=True)
