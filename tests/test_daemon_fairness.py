"""Fair share between apps: round-robin between clients within a priority, a cap on each client's
requests in flight. The queue in isolation, then the flood in a real daemon: one client process
sends 1,000 requests at once and keeps that many wanted (retrying refused ones when their hint
says), and another client's p99 stays within 3x its p99 alone."""
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

from inferd.server.scheduler import TAKEN, ClientShares, FairQueue, Job
from inferd.server.testing import DaemonProcess, write_fake_model
from inferd_client import Client, Unavailable


def _job(seq: int, client: str, priority: int = 0) -> Job:
    return Job(b"", seq, None, priority, None, 0.0, seq, client=client)


def test_fair_queue_serves_clients_in_turn_within_a_priority() -> None:
    q = FairQueue()
    for i in range(5):
        q.push(_job(i, "flood"))
    q.push(_job(10, "quiet"))
    q.push(_job(11, "other"))
    q.push(_job(12, "quiet"))
    q.push(_job(20, "late", priority=5))
    order = []
    while (j := q.pop()) is not None:
        assert j.state == TAKEN
        order.append((j.client, j.req_id))
    # a client without a backlog goes before the one with a backlog; then they take turns
    assert order == [("late", 20), ("other", 11), ("quiet", 10), ("flood", 0), ("quiet", 12), ("flood", 1),
                     ("flood", 2), ("flood", 3), ("flood", 4)]
    assert q.entries == 0


def test_fair_queue_skips_jobs_that_left_and_compacts() -> None:
    q = FairQueue()
    jobs = [_job(i, f"c{i % 3}") for i in range(30)]
    for j in jobs:
        q.push(j)
    for j in jobs[:20]:
        j.state = 2  # expired or cancelled while queued
    q.compact()
    assert q.entries == 10 and q.active_clients() == 3
    got = [q.pop().req_id for _ in range(10)]
    assert sorted(got) == list(range(20, 30)) and q.pop() is None


def test_client_shares_cap_release_and_spread_retries() -> None:
    s = ClientShares(2)
    assert s.acquire("a") and s.acquire("a") and not s.acquire("a")
    assert s.acquire("b") and s.acquire("")  # "" (no client) is never capped
    s.release("a")
    assert s.acquire("a") and not s.acquire("a")
    hints = [s.retry_after("a", 0.01) for _ in range(4)]  # a burst refused: one interval more each
    assert all(abs(h - 10 * (i + 1)) < 5 for i, h in enumerate(hints)), hints
    assert s.retry_after("b", 0.01) < 15  # others are not pushed back
    for _ in range(2):
        s.release("a")
    s.release("b")
    assert s.snapshot() == {}  # nothing left behind for idle clients


# --------------------------------------------------------------------------- the flood, end to end

RUN_S = 0.01  # per request: long beside the machine's scheduling noise, short for the test's time
CAP = 16
FLOOD = 1000
N_QUIET = 120

QUIET = r"""
import json, sys, time
import numpy as np
from inferd_client import Client
ep, n = sys.argv[1], int(sys.argv[2])
x = np.zeros(4, np.float32)
lat = []
with Client(ep, timeout=30) as c:
    for _ in range(10):
        c.infer("work", x)
    for _ in range(n):
        t = time.perf_counter()
        c.infer("work", x)
        lat.append(time.perf_counter() - t)
        time.sleep(0.002)
print(json.dumps(lat))
"""

# 1,000 requests at once on one socket; then, like a client with that much work, a new request for
# each one served and each refused one again once its retry hint has passed, until the stop file exists.
FLOODER = r"""
import heapq, json, os, sys, time
import numpy as np
import zmq
from inferd_client import protocol as P
ep, n, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 0)
s.setsockopt(zmq.SNDHWM, 0)
s.setsockopt(zmq.RCVHWM, 0)
s.connect(ep)
x = np.zeros(4, np.float32)
stats = {"ok": 0, "unavailable": 0, "other": 0, "sent": 0, "retry_ms": [], "message": ""}
rid = 0
def send():
    global rid
    rid += 1
    stats["sent"] += 1
    s.send_multipart(P.encode_request(rid, "infer", "work", tensors={"x": x}, timeout_ms=60000))
for _ in range(n):
    send()
print("flooding", flush=True)
later = []
while not os.path.exists(stop):
    now = time.monotonic()
    while later and later[0] <= now:
        heapq.heappop(later)
        send()
    wait = 50 if not later else max(0, min(50, int((later[0] - now) * 1000)))
    if not s.poll(wait):
        continue
    r = P.decode_reply(s.recv_multipart())
    if r.ok:
        stats["ok"] += 1
        send()
    elif r.error_code == P.UNAVAILABLE and r.retry_after_ms is not None:
        stats["unavailable"] += 1
        stats["message"] = r.error_message
        if len(stats["retry_ms"]) < 5000:
            stats["retry_ms"].append(r.retry_after_ms)
        heapq.heappush(later, time.monotonic() + r.retry_after_ms / 1e3)
    else:
        stats["other"] += 1
        stats["message"] = r.error_code + ": " + r.error_message
print(json.dumps(stats))
"""


def _pcts(lat: list[float]) -> str:
    a = np.asarray(lat) * 1e3
    return "p50 %.1f p90 %.1f p99 %.1f max %.1f" % tuple(np.percentile(a, [50, 90, 99, 100]))


def _p99(lat: list[float]) -> float:
    return float(np.percentile(np.asarray(lat) * 1e3, 99))


@pytest.fixture(scope="module")
def flood_daemon():
    d = Path(tempfile.mkdtemp(prefix="ifdf", dir="/tmp"))
    models = d / "m"
    models.mkdir()
    write_fake_model(models / "work.onnx", inputs=[{"name": "x", "shape": [4], "dtype": "float32"}], delay_s=RUN_S)
    with DaemonProcess(f"ipc://{d}/s.sock", models, "--max-inflight-per-client", str(CAP), "--max-queue", "256",
                       log_path=d / "d.log") as daemon:
        yield daemon, d
    shutil.rmtree(d, ignore_errors=True)


def _quiet(ep: str) -> list[float]:
    r = subprocess.run([sys.executable, "-c", QUIET, ep, str(N_QUIET)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _flood_once(daemon: DaemonProcess, d: Path) -> tuple[float, float, dict]:
    """(quiet p99 alone, quiet p99 during the flood, the flooder's stats)."""
    alone = _quiet(daemon.endpoint)
    stop = d / "stop"
    stop.unlink(missing_ok=True)
    flooder = subprocess.Popen([sys.executable, "-c", FLOODER, daemon.endpoint, str(FLOOD), str(stop)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert flooder.stdout is not None
        assert flooder.stdout.readline().strip() == "flooding", flooder.stderr.read() if flooder.stderr else ""
        with Client(daemon.endpoint) as c:  # the flood really is queued before the quiet client starts
            end = time.monotonic() + 10
            while c.status()["models"]["work"]["queued"] == 0:
                assert time.monotonic() < end, "the flood never reached the queue"
                time.sleep(0.001)
        flooded = _quiet(daemon.endpoint)
    finally:
        stop.touch()
        out, err = flooder.communicate(timeout=120)
    assert flooder.returncode == 0, err
    print("alone", _pcts(alone), "| flooded", _pcts(flooded))
    return _p99(alone), _p99(flooded), json.loads(out.strip().splitlines()[-1])


def test_a_flooding_client_cannot_push_another_clients_p99_past_3x(flood_daemon) -> None:
    daemon, d = flood_daemon
    tries = []
    # Other work on a shared 2-core machine can spike either measurement; a real loss of fairness
    # fails every try (FIFO would put ~CAP runs of the flood, 160 ms, before each quiet request).
    for _ in range(3):
        p99_alone, p99_flooded, stats = _flood_once(daemon, d)
        info = (f"quiet client p99 alone {p99_alone:.1f} ms, during the flood {p99_flooded:.1f} ms; flood: "
                f"{stats['sent']} requests sent, {stats['ok']} served, {stats['unavailable']} refused")
        print(info)
        tries.append(info)
        # The flood was real, capped with a retry hint, and still served.
        assert stats["other"] == 0, stats["message"]
        assert stats["ok"] >= CAP and stats["unavailable"] >= FLOOD - CAP, info
        assert "in flight" in stats["message"] and "retry in about" in stats["message"]
        # the hints spread the retries of the burst: later refusals are told to wait longer
        first = stats["retry_ms"][:FLOOD - CAP]
        assert min(first) >= 1.0 and max(first) >= 10 * min(first), (min(first), max(first))
        # the floor keeps the bound meaningful when the alone p99 is one model run plus noise
        if p99_flooded <= 3 * max(p99_alone, RUN_S * 1e3 * 1.2):
            return
    pytest.fail("; ".join(tries))


def test_client_library_gets_retry_hint(flood_daemon) -> None:
    daemon, _ = flood_daemon
    import threading

    with Client(daemon.endpoint, timeout=10) as c:
        errors: list[BaseException] = []
        barrier = threading.Barrier(CAP + 4)

        def one() -> None:
            barrier.wait()
            try:
                c.infer("work", np.zeros(4, np.float32))
            except BaseException as exc:  # noqa: BLE001 - inspected below
                errors.append(exc)

        threads = [threading.Thread(target=one) for _ in range(CAP + 4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    # one process = one client: the requests beyond the cap were refused with a hint
    assert errors and all(isinstance(e, Unavailable) for e in errors), errors
    assert all(e.retry_after is not None and e.retry_after > 0 for e in errors)
