"""Faults and lifecycle: SIGKILL mid-request and restart, 1,000 malformed messages, SIGTERM drain,
the sd_notify protocol on a real NOTIFY_SOCKET, and `systemd-analyze verify` on the unit."""
from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

import inferd
import inferd.zoo
from inferd.server.testing import DaemonProcess, write_fake_model
from inferd_client import Client, ConnectionError as IConnectionError, TransportError, Unavailable
from inferd_client import protocol as P

REPO = Path(__file__).resolve().parents[1]
SPEC = {"inputs": [{"name": "x", "shape": [2], "dtype": "float32"}], "sleep_from_input": True}


@pytest.fixture()
def tmp():
    d = Path(tempfile.mkdtemp(prefix="ifdf", dir="/tmp"))
    (d / "m").mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _tiny(models: Path) -> Path:
    inferd.zoo.write_zoo(models, ["tiny"])
    return models / "tiny.onnx"


def _x(sleep_s: float, marker: float) -> np.ndarray:
    return np.array([sleep_s, marker], np.float32)


def test_sigkill_mid_request_then_restart(tmp: Path) -> None:
    models = tmp / "m"
    tiny_path = _tiny(models)
    write_fake_model(models / "slow.onnx", **SPEC)
    local = inferd.load(str(tiny_path), device="cpu")
    feeds = {"input": np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    want = local.run(feeds)["output"]
    ep = f"ipc://{tmp}/s.sock"
    d1 = DaemonProcess(ep, models, log_path=tmp / "d1.log").start()
    try:
        busy, idle = Client(ep, timeout=5), Client(ep, timeout=5)
        np.testing.assert_allclose(busy.infer("tiny", feeds)["output"], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(idle.infer("tiny", feeds)["output"], want, rtol=1e-5, atol=1e-6)
        box: dict[str, Any] = {}

        def in_flight() -> None:
            t0 = time.monotonic()
            try:
                busy.infer("slow", {"x": _x(3.0, 1)})
            except BaseException as exc:  # noqa: BLE001
                box["error"] = exc
            box["elapsed"] = time.monotonic() - t0

        th = threading.Thread(target=in_flight)
        th.start()
        time.sleep(0.4)
        d1.proc.kill()  # SIGKILL mid-request
        th.join(15)
        assert not th.is_alive(), "client hung after the daemon died"
        assert isinstance(box.get("error"), TransportError), box
        assert box["elapsed"] < 5 + busy.grace  # within the client's timeout...
        assert isinstance(box["error"], IConnectionError) and box["elapsed"] < 2.0  # ...in fact at once
        # while it is down: a transport error within the timeout, no hang (ConnectionError when the
        # socket's disconnect or a refused reconnect is noticed during the call, else TimeoutError: which
        # one depends on when libzmq retries the connection, so either is right)
        t0 = time.monotonic()
        for _ in range(2):
            with pytest.raises(TransportError):
                idle.infer("tiny", feeds, timeout=0.5)
        assert time.monotonic() - t0 < 2 * (0.5 + idle.grace) + 1.0
        # restart on the same endpoint (the dead daemon's socket file is stale) ...
        d2 = DaemonProcess(ep, models, log_path=tmp / "d2.log").start()
        try:
            # ... and the very same client objects work again, from any thread
            np.testing.assert_allclose(busy.infer("tiny", feeds)["output"], want, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(idle.infer("tiny", feeds)["output"], want, rtol=1e-5, atol=1e-6)
            out: list[np.ndarray] = []
            t = threading.Thread(target=lambda: out.append(busy.infer("tiny", feeds)["output"]))
            t.start()
            t.join(15)
            np.testing.assert_allclose(out[0], want, rtol=1e-5, atol=1e-6)
            assert busy.stale_replies == 0
        finally:
            d2.stop()
        busy.close()
        idle.close()
    finally:
        d1.kill()


def _malformed(rng: random.Random, i: int) -> list[bytes]:
    """One malformed request (frames after the identity)."""
    good = {"v": 1, "id": i, "op": "infer", "model": "tiny",
            "tensors": [{"name": "input", "dtype": "float32", "shape": [1, 3, 8, 8]}]}
    payload = b"\0" * (4 * 3 * 8 * 8)
    kind = i % 16
    pack = lambda h: msgpack.packb(h, use_bin_type=True)  # noqa: E731
    if kind == 0:
        return [rng.randbytes(rng.randint(0, 300))]
    if kind == 1:
        return [rng.randbytes(rng.randint(1, 64)), rng.randbytes(rng.randint(0, 64))]
    if kind == 2:
        return [pack(rng.choice([[1, 2, 3], 7, "str", None, 1.5, b"bin", True]))]
    if kind == 3:  # wrong types in each field
        bad = {"v": [2, "1", [1], None], "id": [[1], -1.5, "x" * 300, b"\xff", {"a": 1}],
               "op": [None, 5, "nope"], "model": [None, "x" * 300, 5, "a/b"], "tensors": [{"a": 1}, "x", 5],
               "timeout_ms": [-1.5, "5", [1]], "priority": [1.5, "hi", 2**40, None], "args": [[1], "x", 5]}
        key = rng.choice(sorted(bad))
        h = dict(good, **{key: rng.choice(bad[key])})
        return [pack(h), payload]
    if kind == 4:  # tensors described, frame missing
        return [pack(good)]
    if kind == 5:  # extra frames
        return [pack(good), payload, payload, b"extra"]
    if kind == 6:  # huge claimed shapes
        if i % 32 == 6:  # empty, so the byte count matches: only numpy's own limits stop these dims
            h = dict(good, tensors=[{"name": "input", "dtype": "float32", "shape": [0, 2**63]}])
            return [pack(h), b""]
        h = dict(good, tensors=[{"name": "input", "dtype": "float32", "shape": [2**62, 2**62, 2**40]}])
        return [pack(h), payload]
    if kind == 7:  # frame size does not match shape x dtype
        return [pack(good), payload[:-4]]
    if kind == 8:  # bad dtype
        h = dict(good, tensors=[{"name": "input", "dtype": rng.choice(["object", "<U5", "complex64", "V8", ""]),
                                 "shape": [1, 3, 8, 8]}])
        return [pack(h), payload]
    if kind == 9:  # msgpack claiming a huge string/array with few bytes behind it
        return [rng.choice([b"\xdb\xff\xff\xff\xff" + b"ab", b"\xdd\xff\xff\xff\xff\x01", b"\xdf\x7f\xff\xff\xff"])]
    if kind == 10:  # deeply nested
        depth = rng.randint(100, 3000)
        return [b"\x91" * depth + b"\xc0"]
    if kind == 11:  # too many dims / negative dims
        h = dict(good, tensors=[{"name": "input", "dtype": "float32", "shape": rng.choice([[1] * 40, [-1, 192], [1.5]])}])
        return [pack(h), payload]
    if kind == 12:  # semantically wrong inputs for a real model
        h = dict(good, tensors=[{"name": rng.choice(["nope", "input"]), "dtype": "float32", "shape": [1, 192]}])
        return [pack(h), payload]
    if kind == 13:  # unknown op / version / model
        h = dict(good, **rng.choice([{"op": "rm -rf"}, {"v": 99}, {"model": "no_such_model"}, {"model": "../../etc"}]))
        return [pack(h), payload]
    if kind == 14:  # many tensors
        n = 200
        h = dict(good, tensors=[{"name": f"t{j}", "dtype": "uint8", "shape": [1]} for j in range(n)])
        return [pack(h)] + [b"\0"] * n
    # truncated valid header
    raw = pack(good)
    return [raw[: rng.randint(1, len(raw) - 1)], payload]


def test_malformed_messages_never_crash_the_daemon(tmp: Path) -> None:
    models = tmp / "m"
    tiny_path = _tiny(models)
    ep = f"ipc://{tmp}/s.sock"
    with DaemonProcess(ep, models, "--max-message-bytes", "1M", log_path=tmp / "d.log") as d:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(ep)
        rng = random.Random(1234)

        def blast(n: int, start: int) -> int:
            replies = 0
            for i in range(start, start + n):
                sock.send_multipart(_malformed(rng, i))
            end = time.monotonic() + 30
            while replies < n and time.monotonic() < end:
                if sock.poll(1000):
                    frames = sock.recv_multipart()
                    rep = P.decode_reply(frames)
                    assert not rep.ok and rep.error_code in P.ERROR_CODES and rep.error_message
                    replies += 1
            return replies

        assert blast(200, 0) == 200  # warm-up: allocator pools, code paths
        rss0 = d.rss()
        got = 0
        for k in range(5):
            got += blast(200, 1000 + 200 * k)
        rss1 = d.rss()
        assert got == 1000  # each was answered (none needed dropping)
        assert d.proc.poll() is None
        assert rss1 - rss0 < 10 << 20, (rss0, rss1)
        # an over-limit frame gets the peer disconnected by ZeroMQ; the daemon carries on
        big = ctx.socket(zmq.DEALER)
        big.setsockopt(zmq.LINGER, 0)
        big.connect(ep)
        big.send_multipart([P.encode_request(1, "health")[0], b"\0" * (2 << 20)])
        time.sleep(0.3)
        big.close()
        sock.close()
        ctx.term()
        local = inferd.load(str(tiny_path), device="cpu")
        x = np.random.default_rng(5).standard_normal((1, 3, 8, 8)).astype(np.float32)
        with Client(ep, timeout=10) as c:
            np.testing.assert_allclose(c.infer("tiny", x)["output"], local.run({"input": x})["output"], rtol=1e-5, atol=1e-6)
            assert c.status()["live"]
        assert "suppressed" in d.log_text() or d.log_text().count("bad request") <= 200  # rate-limited log


def test_sigterm_drains_in_flight_requests(tmp: Path) -> None:
    models = tmp / "m"
    log = tmp / "runs"
    write_fake_model(models / "slow.onnx", **SPEC, log=str(log))
    ep = f"ipc://{tmp}/s.sock"
    d = DaemonProcess(ep, models, log_path=tmp / "d.log").start()
    try:
        c = Client(ep, timeout=20)
        results: dict[int, Any] = {}

        def call(i: int, sleep_s: float) -> None:
            try:
                results[i] = c.infer("slow", {"x": _x(sleep_s, i)})["y"]
            except BaseException as exc:  # noqa: BLE001
                results[i] = exc

        # the first run is long: on a loaded machine (two busy loops on the 2-core VM, 3 failures in 12) the first
        # request started 0.7 s after it was sent, and no status poll saw the four behind it queued during its 0.6 s
        # run: the poll ran out, SIGTERM found nothing in flight and the request below found no daemon (0 in 12 so)
        threads = [threading.Thread(target=call, args=(0, 2.0))]
        threads[0].start()
        time.sleep(0.15)
        for i in range(1, 5):
            threads.append(threading.Thread(target=call, args=(i, 0.1)))
            threads[-1].start()
        end = time.monotonic() + 10
        queued = 0
        while queued < 4 and time.monotonic() < end:
            queued = c.status()["models"]["slow"]["queued"]
            if queued < 4:
                time.sleep(0.01)
        assert queued >= 4, f"the four requests behind the first were never seen queued (last status: {queued})"
        d.signal(signal.SIGTERM)
        time.sleep(0.05)
        with pytest.raises(Unavailable, match="stopping"):
            c.infer("slow", {"x": _x(0.0, 99)})
        for t in threads:
            t.join(20)
        assert d.wait(20) == 0
        for i in range(5):
            assert isinstance(results[i], np.ndarray), results[i]
            np.testing.assert_array_equal(results[i], _x(2.0 if i == 0 else 0.1, i) * 2 + 1)
        assert sorted(float(v) for v in log.read_text().split()) == [0, 1, 2, 3, 4]
        c.close()
    finally:
        d.kill()


def test_sd_notify_protocol(tmp: Path) -> None:
    models = tmp / "m"
    write_fake_model(models / "m1.onnx", load_delay_s=0.5)
    path = str(tmp / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.2)
    msgs: list[tuple[float, str]] = []
    stop = threading.Event()

    def collect() -> None:
        while not stop.is_set():
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            msgs.append((time.monotonic(), data.decode()))

    th = threading.Thread(target=collect)
    th.start()
    env = {k: v for k, v in os.environ.items() if k not in ("INVOCATION_ID", "JOURNAL_STREAM", "WATCHDOG_PID")}
    env.update(NOTIFY_SOCKET=path, WATCHDOG_USEC="300000")
    ep = f"ipc://{tmp}/s.sock"
    d = DaemonProcess(ep, models, env=env, log_path=tmp / "d.log")
    t_start = time.monotonic()
    d.start(wait=False)
    try:
        def wait_for(pred, timeout: float = 20.0) -> tuple[float, str]:
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                for m in list(msgs):
                    if pred(m[1]):
                        return m
                time.sleep(0.02)
            raise AssertionError(f"no matching notification in {[m[1] for m in msgs]}")

        t_ready, ready = wait_for(lambda s: "READY=1" in s.split("\n"))
        assert "STATUS=1/1 models ready" in ready
        assert t_ready - t_start >= 0.5  # only after the preloaded model finished loading
        assert any("STATUS=loading" in m for t, m in msgs if t <= t_ready)
        with Client(ep, timeout=5) as c:
            assert c.is_ready(timeout=5)
        time.sleep(1.0)
        dogs = [t for t, m in msgs if m == "WATCHDOG=1"]
        assert len(dogs) >= 4, len(dogs)  # every ~150 ms (WATCHDOG_USEC / 2)
        assert max(np.diff(dogs[-4:])) < 0.3
        n_before = len(msgs)
        d.signal(signal.SIGHUP)
        wait_for(lambda s: s.startswith("RELOADING=1") and "MONOTONIC_USEC=" in s)
        end = time.monotonic() + 10
        while not any("READY=1" in m.split("\n") for _, m in msgs[n_before:]) and time.monotonic() < end:
            time.sleep(0.02)
        assert any("READY=1" in m.split("\n") for _, m in msgs[n_before:])
        d.signal(signal.SIGTERM)
        assert d.wait(20) == 0
        wait_for(lambda s: "STOPPING=1" in s.split("\n"))
    finally:
        d.kill()
        stop.set()
        th.join(5)
        sock.close()


def test_systemd_analyze_verify_unit(tmp: Path) -> None:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.skip("systemd-analyze is not installed")
    inferd_bin = shutil.which("inferd")
    if inferd_bin is None:
        pytest.skip("the inferd console script is not installed")
    unit = (REPO / "systemd" / "inferd.service").read_text()
    assert "ExecStart=/usr/local/bin/inferd serve --config /etc/inferd/inferd.toml" in unit
    for key in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "RuntimeDirectory=inferd", "CacheDirectory=inferd",
                "StateDirectory=inferd", "DeviceAllow=char-drm", "DeviceAllow=/dev/nvmap", "ProtectSystem=strict",
                "EnvironmentFile=-/etc/inferd/inferd.env"):
        assert key in unit, key
    assert "PrivateDevices=yes" not in unit and "PrivateDevices=true" not in unit
    # verify needs the ExecStart binary to exist: point it at the installed script in a copy
    (tmp / "inferd.service").write_text(unit.replace("/usr/local/bin/inferd", os.path.realpath(inferd_bin)))
    r = subprocess.run([exe, "verify", str(tmp / "inferd.service")], capture_output=True, text=True, timeout=60)
    problems = [ln for ln in (r.stdout + r.stderr).splitlines() if "inferd.service" in ln]
    assert r.returncode == 0 and not problems, r.stdout + r.stderr
    # the check can fail: a typo'd key is reported
    (tmp / "bad.service").write_text(unit.replace("/usr/local/bin/inferd", os.path.realpath(inferd_bin))
                                     .replace("WatchdogSec=", "WatchdgSec="))
    r = subprocess.run([exe, "verify", str(tmp / "bad.service")], capture_output=True, text=True, timeout=60)
    assert "WatchdgSec" in r.stdout + r.stderr


def test_watchdog_stops_while_a_run_hangs(tmp: Path) -> None:
    """With stall_timeout, a run stuck longer than that stops WATCHDOG=1 (so systemd would restart
    the daemon); pings resume once it returns."""
    models = tmp / "m"
    write_fake_model(models / "slow.onnx", **SPEC)
    path = str(tmp / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.1)
    env = {k: v for k, v in os.environ.items() if k not in ("INVOCATION_ID", "JOURNAL_STREAM", "WATCHDOG_PID")}
    env.update(NOTIFY_SOCKET=path, WATCHDOG_USEC="200000")
    d = DaemonProcess(f"ipc://{tmp}/s.sock", models, "--stall-timeout", "0.3", env=env, log_path=tmp / "d.log")
    try:
        d.start()
        with Client(d.endpoint, timeout=10) as c:
            done: list[float] = []
            th = threading.Thread(target=lambda: (c.infer("slow", {"x": _x(1.5, 0)}), done.append(time.monotonic())))
            t_run = time.monotonic()
            th.start()
            dogs: list[float] = []
            end = t_run + 3.0
            # until 1 s after the answer: under load the run started up to 0.9 s after the request was sent
            while time.monotonic() < (end if not done else max(end, done[0] + 1.0)) and time.monotonic() < t_run + 10:
                try:
                    if sock.recv(4096) == b"WATCHDOG=1":
                        dogs.append(time.monotonic() - t_run)
                except TimeoutError:
                    pass
            th.join(10)
        assert done, "the hanging run never answered"
        # the run's own start (its 1.5 s ended at the answer, give or take the reply's way back): the pings are
        # placed against it, not against the request, which a loaded machine delivered late
        s0 = max(0.0, done[0] - t_run - 1.5)
        during = [t for t in dogs if s0 + 0.45 < t < s0 + 1.2]
        assert not during, (s0, dogs)  # silent while the run hangs past stall_timeout
        assert any(t < s0 + 0.35 for t in dogs) and any(t > s0 + 1.6 for t in dogs), (s0, dogs)  # before and after
        assert "stopping the watchdog" in d.log_text()
    finally:
        d.kill()
        sock.close()
