"""Fair share between apps: round-robin between clients within a priority, a cap on each client's
requests in flight. The queue in isolation, then the flood in a real daemon: one client process
sends 1,000 requests at once and keeps that many wanted (retrying refused ones when their hint
says), and another client's p99 stays within 3x its p99 alone."""
from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest

from inferd.server.scheduler import TAKEN, ClientShares, FairQueue, Job
from inferd.server.testing import DaemonProcess, flood_run, write_fake_model
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


def test_a_flooding_client_cannot_push_another_clients_p99_past_3x(flood_daemon) -> None:
    daemon, d = flood_daemon
    tries = []
    # Other work on a shared 2-core machine can spike either measurement; a real loss of fairness
    # fails every try (FIFO would put ~CAP runs of the flood, 160 ms, before each quiet request).
    for _ in range(3):
        r = flood_run(daemon.endpoint, "work", [4], d, flood=FLOOD, n_quiet=N_QUIET, mode="hints")
        print("alone", _pcts(r["alone"]), "| flooded", _pcts(r["flooded"]))
        p99_alone, p99_flooded, stats = _p99(r["alone"]), _p99(r["flooded"]), r["flood"]
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
    with Client(daemon.endpoint, timeout=10) as c:
        errors: list[BaseException] = []
        # twice the cap: on a loaded machine the threads' sends spread out while earlier runs (10 ms each)
        # finish, and CAP + 4 of them sometimes never had more than CAP in flight at once
        extra = CAP
        barrier = threading.Barrier(CAP + extra)

        def one() -> None:
            barrier.wait()
            try:
                c.infer("work", np.zeros(4, np.float32))
            except BaseException as exc:  # noqa: BLE001 - inspected below
                errors.append(exc)

        threads = [threading.Thread(target=one) for _ in range(CAP + extra)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    # one process = one client: the requests beyond the cap were refused with a hint
    assert errors and all(isinstance(e, Unavailable) for e in errors), errors
    assert all(e.retry_after is not None and e.retry_after > 0 for e in errors)
