"""The client package works where none of the daemon's dependencies can be imported.

A child interpreter installs an import hook that refuses inferd, onnx, onnxruntime, psutil,
vulkan, systemd, cffi and friends before anything is imported, then uses inferd_client (and
inferctl's main) against a running daemon and checks the answer against the engine's."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import inferd
import inferd.zoo
from inferd.server.testing import DaemonProcess

CHILD = r"""
import importlib.abc, sys
BLOCKED = {"inferd", "onnx", "onnxruntime", "psutil", "vulkan", "systemd", "cffi", "_cffi_backend", "tomli",
           "google", "threadpoolctl", "ml_dtypes"}
already = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not already, already

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{name} is blocked in this test", name=name)
        return None

sys.meta_path.insert(0, Block())
try:
    import inferd
except ModuleNotFoundError:
    pass
else:
    raise AssertionError("the blocker does not work")

import json, io, contextlib
import numpy as np
from inferd_client import Client, NotFound
from inferd_client.cli import main as inferctl

ep, x_path, want_path = sys.argv[1:4]
x = np.load(x_path)
with Client(ep, timeout=20) as c:
    assert c.is_ready(timeout=20)
    out = c.infer("tiny", {"input": x})
    np.testing.assert_allclose(out["output"], np.load(want_path), rtol=1e-5, atol=1e-6)
    try:
        c.infer("nope", x)
    except NotFound:
        pass
    else:
        raise AssertionError("expected NotFound")
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    rc = inferctl(["--endpoint", ep, "--json", "models"])
assert rc == 0 and json.loads(buf.getvalue())[0]["name"] == "tiny"
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not loaded, loaded
print("CLIENT-ISOLATED-OK")
"""


def test_client_without_daemon_dependencies() -> None:
    d = Path(tempfile.mkdtemp(prefix="ifdi", dir="/tmp"))
    try:
        models = d / "m"
        models.mkdir()
        inferd.zoo.write_zoo(models, ["tiny"])
        x = np.random.default_rng(7).standard_normal((1, 3, 8, 8)).astype(np.float32)
        m = inferd.load(str(models / "tiny.onnx"), device="cpu")
        np.save(d / "x.npy", x)
        np.save(d / "want.npy", m.run({"input": x})["output"])
        with DaemonProcess(f"ipc://{d}/s.sock", models, log_path=d / "d.log") as daemon:
            r = subprocess.run([sys.executable, "-c", CHILD, daemon.endpoint, str(d / "x.npy"), str(d / "want.npy")],
                               capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "CLIENT-ISOLATED-OK" in r.stdout, r.stdout + r.stderr
    finally:
        shutil.rmtree(d, ignore_errors=True)
