"""8 client processes x 200 requests over 3 real models at once: every reply matches its request
(values against a local run of the same input), none lost, none duplicated."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import inferd
import inferd.zoo
from inferd.server.testing import DaemonProcess, write_two_io_model
from inferd_client import Client

N_PROCS = 8
N_REQ = 200
MODELS = ("tiny", "mlp_small", "two_io")

# A worker needs only the client: its inputs are seeded by (process, request), so the test
# process can recompute every expected output with the engine afterwards.
WORKER = r"""
import sys, time, os
import numpy as np
from inferd_client import Client
ep, pid, n, go, out, sigs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], eval(sys.argv[6])
models = sorted(sigs)
with Client(ep, timeout=60) as c:
    c.health()
    while not os.path.exists(go):
        time.sleep(0.005)
    res = {}
    for i in range(n):
        name = models[(pid + i) % len(models)]
        rng = np.random.default_rng(pid * 100000 + i)
        feeds = {k: rng.standard_normal(shape).astype(np.float32) for k, shape in sigs[name]}
        got = c.infer(name, feeds)
        for k, v in got.items():
            res[f"{i}|{name}|{k}"] = v
    res["stale"] = np.array(c.stale_replies)
np.savez(out, **res)
"""


@pytest.fixture(scope="module")
def setup():
    d = Path(tempfile.mkdtemp(prefix="ifdx", dir="/tmp"))
    models = d / "m"
    models.mkdir()
    inferd.zoo.write_zoo(models, ["tiny", "mlp_small"])
    write_two_io_model(models / "two_io.onnx")
    yield d, models
    shutil.rmtree(d, ignore_errors=True)


def test_many_processes_many_requests(setup) -> None:
    d, models = setup
    local = {n: inferd.load(str(models / f"{n}.onnx"), device="cpu") for n in MODELS}
    sigs = {n: [(t.name, tuple(t.shape)) for t in m.inputs] for n, m in local.items()}
    go = d / "go"
    with DaemonProcess(f"ipc://{d}/s.sock", models, log_path=d / "d.log") as daemon:
        with Client(daemon.endpoint, timeout=20) as c:
            before = c.status()["models"]
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, daemon.endpoint, str(p), str(N_REQ), str(go),
                                   str(d / f"out{p}.npz"), repr(sigs)]) for p in range(N_PROCS)]
        try:
            time.sleep(0.5)
            go.touch()
            for p in procs:
                assert p.wait(150) == 0
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        with Client(daemon.endpoint, timeout=20) as c:
            after = c.status()["models"]
    # every request got exactly its own answer
    for p in range(N_PROCS):
        with np.load(d / f"out{p}.npz") as z:
            assert int(z["stale"]) == 0  # no reply arrived for a request it was not waiting for
            keys = [k for k in z.files if k != "stale"]
            idx = sorted({int(k.split("|")[0]) for k in keys})
            assert idx == list(range(N_REQ))  # none lost
            for i in range(N_REQ):
                name = sorted(sigs)[(p + i) % len(sigs)]
                rng = np.random.default_rng(p * 100000 + i)
                feeds = {k: rng.standard_normal(shape).astype(np.float32) for k, shape in sigs[name]}
                want = local[name].run(feeds)
                for k, v in want.items():
                    np.testing.assert_allclose(z[f"{i}|{name}|{k}"], v, rtol=1e-5, atol=1e-6, err_msg=f"proc {p} request {i} {name}.{k}")
    # the daemon ran each request exactly once: nothing duplicated, nothing failed
    total_req = sum(after[n]["requests"] - before[n]["requests"] for n in MODELS)
    total_ok = sum(after[n]["ok"] - before[n]["ok"] for n in MODELS)
    assert total_req == total_ok == N_PROCS * N_REQ
    assert all(after[n]["failures"] == before[n]["failures"] for n in MODELS)
