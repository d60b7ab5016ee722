"""End to end over a real ipc socket with the real engine: infer, load/unload, status, inferctl,
SIGHUP rescan, endpoint ownership, the shared default endpoint."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import inferd
import inferd.zoo
from inferd.server.testing import DaemonProcess, write_two_io_model
from inferd_client import Client, InvalidArgument, NotFound, Unavailable
from ortutil import ort_session


@pytest.fixture(scope="module")
def workdir():
    # Short path: unix socket paths are limited to 107 bytes.
    d = Path(tempfile.mkdtemp(prefix="ifde", dir="/tmp"))
    models = d / "models"
    models.mkdir()
    inferd.zoo.write_zoo(models, ["tiny", "mlp_small"])
    for f in models.iterdir():  # keep only the models (write_zoo may add metadata files)
        if f.suffix != ".onnx":
            f.unlink() if f.is_file() else shutil.rmtree(f)
    write_two_io_model(models / "two_io.onnx")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon(workdir: Path):
    d = DaemonProcess(f"ipc://{workdir}/d.sock", workdir / "models", log_path=workdir / "d.log")
    d.env["INFERD_REHEARSE"] = "true"  # a daemon started as in production: its start rehearses a cold load
    with d:
        yield d


@pytest.fixture(scope="module")
def local_models(workdir: Path):
    ms = {n: inferd.load(str(workdir / "models" / f"{n}.onnx"), device="cpu") for n in ("tiny", "mlp_small", "two_io")}
    yield ms
    for m in ms.values():
        m.close()


def _feeds(model, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in model.inputs}


def _inferctl(endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("inferctl")
    cmd = [exe] if exe else [sys.executable, "-m", "inferd_client.cli"]
    return subprocess.run([*cmd, "--endpoint", endpoint, *args], capture_output=True, text=True, timeout=60)


def test_preloaded_models_finish_loading_in_idle_time(workdir: Path, local_models) -> None:
    """A preloaded model no request has reached yet finishes its cold load (and warm switch) in idle time: its
    first request runs warm, and status does not say it is warming forever."""
    with DaemonProcess(f"ipc://{workdir}/pre.sock", workdir / "models", log_path=workdir / "pre.log") as d:
        with Client(d.endpoint, timeout=30) as c:
            deadline = time.monotonic() + 30
            while (any(m["warm"] is not True for m in c.status()["models"].values())
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            st = c.status()["models"]
            assert all(m["warm"] is True for m in st.values()), {n: m["warm"] for n, m in st.items()}
            for name in ("tiny", "mlp_small", "two_io"):
                # finished without a request: no first run is part of its cold load
                assert st[name]["cold"]["cold_s"] > 0 and "first_run_s" not in st[name]["cold"], st[name]["cold"]
                feeds = _feeds(local_models[name], np.random.default_rng(3))
                got = c.infer(name, feeds)
                want = local_models[name].run(feeds)
                for k, v in want.items():
                    np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6)


def test_infer_on_models_matches_local_run_and_onnxruntime(daemon: DaemonProcess, workdir: Path, local_models) -> None:
    rng = np.random.default_rng(1)
    with Client(daemon.endpoint, timeout=20) as c:
        for name in ("tiny", "mlp_small", "two_io"):
            m = local_models[name]
            sess = ort_session(workdir / "models" / f"{name}.onnx")
            for _ in range(3):
                feeds = _feeds(m, rng)
                got = c.infer(name, feeds)
                want = m.run(feeds)
                assert sorted(got) == sorted(want) == sorted(t.name for t in m.outputs)
                ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
                for k in want:
                    assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape
                    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
                    err = np.abs(got[k] - ref[k]).max() / max(np.abs(ref[k]).max(), 1e-30)
                    assert err <= 1e-4, (name, k, err)
        # a single unnamed array goes to a single-input model; outputs are writable arrays
        x = _feeds(local_models["tiny"], rng)
        out = c.infer("tiny", next(iter(x.values())))
        np.testing.assert_allclose(out["output"], local_models["tiny"].run(x)["output"], rtol=1e-5, atol=1e-6)
        out["output"][...] = 0
        # output selection
        two = _feeds(local_models["two_io"], rng)
        only = c.infer("two_io", two, outputs=["prod"])
        assert list(only) == ["prod"]


def test_errors_name_what_was_expected(daemon: DaemonProcess) -> None:
    with Client(daemon.endpoint, timeout=20) as c:
        with pytest.raises(InvalidArgument) as ei:
            c.infer("tiny", {"input": np.zeros((1, 3, 8, 8), np.float64)})
        msg = str(ei.value)
        assert "tiny" in msg and "'input'" in msg and "float32" in msg and "float64" in msg
        with pytest.raises(InvalidArgument, match=r"\[1, 3, 8, 8\].*\[1, 3, 9, 8\]"):
            c.infer("tiny", {"input": np.zeros((1, 3, 9, 8), np.float32)})
        with pytest.raises(InvalidArgument, match="unknown \\['wrong'\\].*missing \\['input'\\]"):
            c.infer("tiny", {"wrong": np.zeros((1, 3, 8, 8), np.float32)})
        with pytest.raises(InvalidArgument, match="2 inputs"):
            c.infer("two_io", np.zeros((2, 3), np.float32))
        with pytest.raises(InvalidArgument, match="no output"):
            c.infer("two_io", {"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 3), np.float32)}, outputs=["nope"])
        with pytest.raises(NotFound, match="'resnet9000'.*available"):
            c.infer("resnet9000", {"x": np.zeros(1, np.float32)})
        with pytest.raises(NotFound):
            c.load("resnet9000")
        # the daemon still serves after all that
        assert c.infer("mlp_small", {"input": np.zeros((1, 64), np.float32)})["output"].shape == (1, 10)


def test_load_unload_reload_while_another_model_serves(daemon: DaemonProcess, local_models) -> None:
    rng = np.random.default_rng(2)
    stop = threading.Event()
    results: list[bool] = []
    errors: list[BaseException] = []

    def hammer() -> None:
        with Client(daemon.endpoint, timeout=20) as c2:
            while not stop.is_set():
                feeds = _feeds(local_models["tiny"], np.random.default_rng(len(results)))
                try:
                    got = c2.infer("tiny", feeds)["output"]
                    results.append(bool(np.allclose(got, local_models["tiny"].run(feeds)["output"], rtol=1e-5, atol=1e-6)))
                except BaseException as exc:  # noqa: BLE001 - collected and asserted below
                    errors.append(exc)
                    return

    t = threading.Thread(target=hammer)
    t.start()
    try:
        with Client(daemon.endpoint, timeout=30) as c:
            assert c.is_model_ready("mlp_small")
            assert c.unload("mlp_small")["state"] == "UNLOADED"
            assert not c.is_model_ready("mlp_small")
            states = {m["name"]: m for m in c.models()}
            assert states["mlp_small"]["state"] == "UNLOADED" and states["tiny"]["state"] == "READY"
            assert states["mlp_small"]["warm"] is None  # not loaded: neither warm nor cold
            # a model that answered reaches its warm path (the warm switch runs in idle time after the answer):
            # every loaded one here has answered (two_io's switch can queue behind other idle work, such as a
            # package profiled in idle time when its plan came from a trained predictor)
            deadline = time.monotonic() + 30
            while (any(m["warm"] is False for m in c.status()["models"].values())
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            assert c.status()["models"]["tiny"]["warm"] is True and {m["name"]: m for m in c.models()}["tiny"]["warm"]
            from inferd_client.cli import format_status
            st = c.status()
            assert "READY/warming" not in format_status(st)
            st["models"]["tiny"]["warm"] = False  # as a model still on its cold kernels reports itself
            assert "READY/warming" in format_status(st)
            with pytest.raises(Unavailable, match="unloaded"):
                c.infer("mlp_small", _feeds(local_models["mlp_small"], rng))
            info = c.load("mlp_small")
            assert info["state"] == "READY" and info["inputs"][0]["shape"] == [1, 64]
            feeds = _feeds(local_models["mlp_small"], rng)
            np.testing.assert_allclose(c.infer("mlp_small", feeds)["output"], local_models["mlp_small"].run(feeds)["output"], rtol=1e-5, atol=1e-6)
            assert c.load("mlp_small", reload=True)["state"] == "READY"
            np.testing.assert_allclose(c.infer("mlp_small", feeds)["output"], local_models["mlp_small"].run(feeds)["output"], rtol=1e-5, atol=1e-6)
            st = c.status()["models"]["mlp_small"]
            assert st["loads"] >= 3
            time.sleep(0.2)
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors
    assert len(results) > 5 and all(results)


def test_status_models_and_budget(daemon: DaemonProcess) -> None:
    with Client(daemon.endpoint, timeout=20) as c:
        assert c.is_live(timeout=20) and c.is_ready(timeout=20)
        before = c.status()["models"]["tiny"]
        for _ in range(5):
            c.infer("tiny", np.zeros((1, 3, 8, 8), np.float32))
        st = c.status()
        m = st["models"]["tiny"]
        assert m["ok"] - before["ok"] == 5 and m["requests"] - before["requests"] == 5
        assert m["state"] == "READY" and m["device"] == "cpu" and m["memory_bytes"] > 0
        assert m["compute_ms"]["p50"] > 0 and m["compute_ms"]["p99"] >= m["compute_ms"]["p50"]
        assert st["live"] and st["ready"] and st["pid"] == daemon.pid and st["devices_in_use"] == ["cpu"]
        mem = st["memory"]
        assert mem["rss_bytes"] > 10 << 20
        assert mem["models_bytes"] == sum(x["memory_bytes"] for x in st["models"].values()) > 0
        # the loaded packages' plans and store indexes, kept parsed for their next load, are counted
        mc = mem["metadata_cache"]
        assert mc["plans"] >= 1 and mc["plan_file_bytes"] > 0 and mc["indexes"] >= 1 and mc["index_bytes"] > 0, mc
        from inferd_client.cli import format_status
        assert f"{mc['plans']} plans" in format_status(st)
        assert c.set_budget("512M")["budget_bytes"] == 512 << 20
        assert c.status()["memory"]["budget_bytes"] == 512 << 20
        assert c.set_budget(0)["budget_bytes"] == 0
        names = [x["name"] for x in c.models()]
        assert names == sorted(names) and {"tiny", "mlp_small", "two_io"} <= set(names)


def test_inferctl_commands(daemon: DaemonProcess, workdir: Path, local_models) -> None:
    ep = daemon.endpoint
    r = _inferctl(ep, "--json", "status")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["ready"] and "tiny" in st["models"]
    r = _inferctl(ep, "status")
    assert r.returncode == 0 and "tiny" in r.stdout and "READY" in r.stdout and "RSS" in r.stdout
    r = _inferctl(ep, "models", "--json")  # --json also after the command
    assert r.returncode == 0, r.stderr
    assert {m["name"]: m["state"] for m in json.loads(r.stdout)}["two_io"] == "READY"
    assert _inferctl(ep, "health").returncode == 0
    r = _inferctl(ep, "--json", "unload", "two_io")
    assert r.returncode == 0 and json.loads(r.stdout)["state"] == "UNLOADED"
    r = _inferctl(ep, "--json", "load", "two_io")
    assert r.returncode == 0 and json.loads(r.stdout)["state"] == "READY"
    # infer with .npy inputs, outputs saved to .npz and returned in JSON
    rng = np.random.default_rng(3)
    feeds = _feeds(local_models["two_io"], rng)
    for k, v in feeds.items():
        np.save(workdir / f"in_{k}.npy", v)
    out = workdir / "out.npz"
    r = _inferctl(ep, "--json", "infer", "two_io", "--input", f"a={workdir}/in_a.npy", "--input", f"b={workdir}/in_b.npy",
                  "--output", str(out))
    assert r.returncode == 0, r.stderr
    meta = json.loads(r.stdout)
    assert meta["outputs"]["sum"]["shape"] == [2, 3]
    want = local_models["two_io"].run(feeds)
    with np.load(out) as z:
        np.testing.assert_array_equal(z["sum"], want["sum"])
        np.testing.assert_array_equal(z["prod"], want["prod"])
    np.savez(workdir / "in.npz", **feeds)
    r = _inferctl(ep, "--json", "infer", "two_io", "--input", str(workdir / "in.npz"))
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.array(json.loads(r.stdout)["outputs"]["prod"]["data"], np.float32), want["prod"])
    r = _inferctl(ep, "infer", "two_io", "--input", str(workdir / "in.npz"))
    assert r.returncode == 0 and "sum: float32[2, 3]" in r.stdout
    r = _inferctl(ep, "--json", "budget", "1G")
    assert r.returncode == 0 and json.loads(r.stdout)["budget_bytes"] == 1 << 30
    # errors: server error -> 1 with the structured error in JSON; unreachable daemon -> 3
    r = _inferctl(ep, "--json", "load", "nope")
    assert r.returncode == 1 and json.loads(r.stdout)["error"]["code"] == "NOT_FOUND"
    r = _inferctl(f"ipc://{workdir}/nobody.sock", "--timeout", "0.5", "status")
    assert r.returncode == 3 and "no reply" in r.stderr


def test_sighup_rescans_repository(workdir: Path) -> None:
    d = Path(tempfile.mkdtemp(prefix="ifdh", dir="/tmp"))
    try:
        models = d / "m"
        models.mkdir()
        shutil.copy(workdir / "models" / "tiny.onnx", models / "tiny.onnx")
        with DaemonProcess(f"ipc://{d}/s.sock", models, log_path=d / "d.log") as proc, \
                Client(proc.endpoint, timeout=20) as c:
            assert [m["name"] for m in c.models()] == ["tiny"]
            (models / "mlp").mkdir()
            shutil.copy(workdir / "models" / "mlp_small.onnx", models / "mlp" / "model.onnx")
            (models / "mlp" / "config.toml").write_text("preload = true\nmax_queue = 3\npriority = 2\n")
            (models / "tiny.onnx").unlink()
            proc.signal(signal.SIGHUP)
            end = time.monotonic() + 30
            while time.monotonic() < end:
                ms = {m["name"]: m for m in c.models()}
                if "tiny" not in ms and ms.get("mlp", {}).get("state") == "READY":
                    break
                time.sleep(0.05)
            assert "tiny" not in ms and ms["mlp"]["state"] == "READY", ms
            assert ms["mlp"]["max_queue"] == 3 and ms["mlp"]["priority"] == 2
            assert c.infer("mlp", np.zeros((1, 64), np.float32))["output"].shape == (1, 10)
            # the runtime's log lines name a model as the repository does, not by its file (mlp/model.onnx)
            end = time.monotonic() + 10
            while "model mlp: cold" not in (d / "d.log").read_text() and time.monotonic() < end:
                time.sleep(0.05)
            text = (d / "d.log").read_text()
            assert "model mlp: cold" in text and "model model:" not in text, text[-2000:]
            with pytest.raises(NotFound):
                c.infer("tiny", np.zeros((1, 3, 8, 8), np.float32))
            # a file copied in is loadable by name without SIGHUP
            shutil.copy(workdir / "models" / "two_io.onnx", models / "two_io.onnx")
            assert c.load("two_io")["state"] == "READY"
            assert proc.stop() == 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_endpoint_ownership(workdir: Path, daemon: DaemonProcess) -> None:
    # A second daemon on a live endpoint refuses to start and the first keeps serving.
    second = DaemonProcess(daemon.endpoint, workdir / "models", log_path=workdir / "second.log")
    second.start(wait=False)
    try:
        assert second.wait(timeout=60) == 1
        assert "already" in second.log_text()
    finally:
        second.kill()
    # (is_ready's own timeout is 1 s: under load the health request of a daemon that had just come up was answered
    # later than that, and a ready daemon read as not ready: 2 failures in 8 with two busy loops on the 2-core VM,
    # 0 in 6 with the clients' 10 s)
    with Client(daemon.endpoint, timeout=10) as c:
        assert c.is_ready(timeout=10)
    # A stale socket file (bound, never listening, left behind by a crash) is removed.
    stale = workdir / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()
    assert stale.exists()
    with DaemonProcess(f"ipc://{stale}", workdir / "models", log_path=workdir / "stale.log") as d2:
        with Client(d2.endpoint, timeout=10) as c:
            assert c.is_ready(timeout=10)
    assert "stale" in d2.log_text()


def test_default_endpoint_is_shared(workdir: Path, monkeypatch) -> None:
    rt = Path(tempfile.mkdtemp(prefix="ifdr", dir="/tmp"))
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("INFERD_ENDPOINT", "NOTIFY_SOCKET")}
        env["RUNTIME_DIRECTORY"] = str(rt)
        with DaemonProcess(None, workdir / "models", env=env, log_path=rt / "d.log") as d:
            assert d.endpoint == f"ipc://{rt}/inferd.sock"
            assert (rt / "inferd.sock").exists()
            monkeypatch.setenv("RUNTIME_DIRECTORY", str(rt))
            monkeypatch.delenv("INFERD_ENDPOINT", raising=False)
            with Client(timeout=10) as c:  # no endpoint: the same default as the daemon's
                assert c.endpoint == d.endpoint and c.is_ready(timeout=10)
        assert not (rt / "inferd.sock").exists()  # removed on clean exit
    finally:
        shutil.rmtree(rt, ignore_errors=True)


def _vulkan_available() -> bool:
    try:
        from inferd.vulkan import available

        return bool(available())
    except Exception:
        return False


@pytest.mark.vulkan
@pytest.mark.skipif(not _vulkan_available(), reason="no Vulkan device")
def test_two_models_share_the_vulkan_device(workdir: Path, local_models) -> None:
    """Both models on the one Vulkan device, hammered from two threads at once: answers match the CPU."""
    d = DaemonProcess(f"ipc://{workdir}/vk.sock", workdir / "models", device="vulkan", log_path=workdir / "vk.log")
    with d, Client(d.endpoint, timeout=120) as c:
        st = c.status()
        assert all(m["device"] == "vulkan" for m in st["models"].values()), st["models"]
        problems: list[str] = []

        def work(name: str, seed: int) -> None:
            rng = np.random.default_rng(seed)
            for _ in range(15):
                feeds = _feeds(local_models[name], rng)
                got = c.infer(name, feeds)
                for k, want in local_models[name].run(feeds).items():
                    err = np.abs(got[k] - want).max() / max(np.abs(want).max(), 1e-30)
                    if err > 1e-4:
                        problems.append(f"{name}.{k}: {err}")

        threads = [threading.Thread(target=work, args=(n, i)) for i, n in enumerate(("tiny", "mlp_small", "two_io"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not problems, problems
        assert c.status()["devices_in_use"] == ["vulkan"]


@pytest.mark.vulkan
@pytest.mark.skipif(not _vulkan_available(), reason="no Vulkan device")
def test_a_restarted_daemon_makes_its_pipelines_resident(workdir: Path, local_models) -> None:
    """A daemon that served Vulkan models leaves their pipelines listed in its cache directory; the next one
    creates them at its start (status says so), and its cold loads of the same models then create none."""
    cache = workdir / "rescache"
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    env.update(INFERD_CACHE_DIR=str(cache), INFERD_MEMORY_PRESSURE="off", MESA_SHADER_CACHE_DIR=str(cache / "mesa"))
    first = DaemonProcess(f"ipc://{workdir}/r1.sock", workdir / "models", env={**env, "INFERD_RESIDENT_PIPELINES": "0"},
                          device="vulkan", log_path=workdir / "r1.log")
    rng = np.random.default_rng(3)
    with first, Client(first.endpoint, timeout=120) as c:
        # served, not only loaded: a preloaded model is "ready" once its load returns, while its layers (and their
        # pipelines) are still being prepared; a daemon stopped then had listed only some of them (under a busy
        # machine the second daemon's cold load of two_io created the one its predecessor never did)
        for name, local in local_models.items():
            c.infer(name, _feeds(local, rng))
        st = c.status()
        assert st["vulkan_pipelines"]["at_start"] is None  # resident_pipelines = 0: nothing done at start
        # the loads' pipelines are listed (not the other kernels the profiler only timed)
        assert 0 < st["vulkan_pipelines"]["listed"] <= st["vulkan_pipelines"]["held"]
    second = DaemonProcess(f"ipc://{workdir}/r2.sock", workdir / "models",
                           env={**env, "INFERD_RESIDENT_PIPELINES": "128", "INFERD_PRELOAD": "0"},
                           device="vulkan", log_path=workdir / "r2.log")
    with second, Client(second.endpoint, timeout=120) as c:
        deadline = time.monotonic() + 60
        while True:
            vp = c.status()["vulkan_pipelines"]
            if vp and vp["at_start"] and "created" in vp["at_start"]:
                break
            assert time.monotonic() < deadline, vp
            time.sleep(0.05)
        listed = vp["listed"]
        assert vp["at_start"]["created"] == listed == vp["held"] and listed > 0, vp
        for name, local in local_models.items():
            feeds = _feeds(local, rng)
            got = c.infer(name, feeds)
            for k, want in local.run(feeds).items():
                assert np.abs(got[k] - want).max() <= 1e-4 * max(np.abs(want).max(), 1e-30), (name, k)
        colds = {n: m["cold"] for n, m in c.status()["models"].items()}
        assert all(cs.get("pipelines_created") == 0 for cs in colds.values()), colds  # they found them all
