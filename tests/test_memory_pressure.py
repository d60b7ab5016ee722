"""Memory pressure (PSI triggers) and the cgroup's limits as live budget sources (server/pressure.py and the
daemon's check_memory_sources): the cap's arithmetic, the file found from a fake cgroup tree, a clean
fallback where a trigger is refused, the watcher thread woken by POLLPRI, and the daemon's budget following
a fake cgroup's memory.max and a pressure event through the same path as set_budget."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from inferd.server import pressure as P


def test_cap_shrinks_on_events_relaxes_when_quiet_and_is_dropped_above_the_ceiling() -> None:
    cap = P.PressureCap(shrink=0.5, grow=2.0, quiet_s=10.0, floor=100)
    assert cap.current(0.0, ceiling=10_000) is None
    assert cap.event(1.0, held=4000) == 2000
    assert cap.event(2.0, held=8000) == 2000  # a later event never loosens the cap
    assert cap.event(3.0, held=1000) == 500
    assert cap.event(4.0, held=10) == 100  # never below the floor
    assert cap.current(13.9, ceiling=10_000) == 100  # not a whole quiet period yet
    assert cap.current(14.0, ceiling=10_000) == 200
    assert cap.current(34.0, ceiling=10_000) == 800
    assert cap.current(74.0, ceiling=10_000) is None  # grown past the budget it caps: gone
    assert cap.events == 4
    assert P.apply_cap(0, None) == 0 and P.apply_cap(0, 300) == 0 and P.apply_cap(200, 300) == 200
    with pytest.raises(ValueError):
        P.PressureCap(shrink=1.5)


def _fake_cgroup(tmp: Path, rel: str, pressure_file: bool) -> tuple[str, str]:
    proc = tmp / "cgroup"
    tmp.mkdir(parents=True, exist_ok=True)
    proc.write_text(f"0::{rel}\n")
    d = tmp / "root" / rel.strip("/")
    d.mkdir(parents=True)
    if pressure_file:
        (d / "memory.pressure").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    return str(proc), str(tmp / "root")


def test_pressure_file_is_the_cgroups_else_the_systems(tmp_path: Path) -> None:
    system = tmp_path / "system-pressure"
    system.write_text("some avg10=0.00\n")
    proc, root = _fake_cgroup(tmp_path / "a", "/svc/inferd.service", True)
    assert P.pressure_path(proc, root, str(system)) == Path(root) / "svc/inferd.service/memory.pressure"
    proc, root = _fake_cgroup(tmp_path / "b", "/svc/other", False)
    assert P.pressure_path(proc, root, str(system)) == system
    assert P.pressure_path(proc, root, str(tmp_path / "none")) is None
    assert P.pressure_path(str(tmp_path / "no-proc"), root, str(tmp_path / "none")) is None


def test_absent_or_refused_trigger_falls_back_with_the_reason(tmp_path: Path) -> None:
    w, why = P.start(lambda: None, tmp_path)  # a directory: cannot be opened for writing
    assert w is None and "cannot open" in why
    w, why = P.start(lambda: None, tmp_path / "missing")
    assert w is None and "cannot open" in why
    real = Path("/proc/pressure/memory")
    if not real.exists():
        pytest.skip("no PSI in this kernel")
    fd, why = P.open_trigger(real, stall_us=5, window_us=1)  # a window the kernel refuses
    assert fd is None and "refused" in why


def test_watcher_calls_back_on_pollpri_and_stops() -> None:
    """POLLPRI is what a PSI trigger raises; TCP urgent data raises it too, on demand."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    a = socket.create_connection(srv.getsockname())
    b, _ = srv.accept()
    hits: list[float] = []
    w = P.PressureWatcher(os.dup(b.fileno()), lambda: hits.append(time.monotonic()), min_gap_s=0.2)
    try:
        a.send(b"!", socket.MSG_OOB)
        end = time.monotonic() + 5
        while not hits and time.monotonic() < end:
            time.sleep(0.01)
        assert hits, "the watcher did not wake on POLLPRI"
        time.sleep(0.1)
        assert len(hits) == 1  # no second call within min_gap_s, though urgent data stays pending
        b.recv(1, socket.MSG_OOB)  # consumed: POLLPRI clears, the watcher waits again
        time.sleep(0.4)
        assert len(hits) <= 2 and w.alive
        n = len(hits)
        a.send(b"?", socket.MSG_OOB)  # a second event after the gap is seen
        end = time.monotonic() + 5
        while len(hits) == n and time.monotonic() < end:
            time.sleep(0.01)
        assert len(hits) == n + 1
    finally:
        w.stop()
        for s in (a, b, srv):
            s.close()
    assert not w.alive


def test_real_trigger_where_permitted() -> None:
    real = Path("/proc/pressure/memory")
    if not real.exists():
        pytest.skip("no PSI in this kernel")
    w, what = P.start(lambda: None, real)
    if w is None:
        pytest.skip(f"PSI triggers not permitted here: {what}")
    try:
        assert w.alive and what == str(real)
    finally:
        w.stop()
    assert not w.alive


def test_daemon_budget_follows_a_fake_cgroup_and_pressure_events(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    from inferd.config import load_config
    from inferd.server import budget, daemon

    proc, root = _fake_cgroup(tmp_path, "/svc/inferd", True)
    mem_max = Path(root) / "svc/inferd/memory.max"
    mem_max.write_text("max\n")
    real = budget.cgroup_memory_limit
    monkeypatch.setattr(budget, "cgroup_memory_limit", lambda: real(proc, root))
    models = tmp_path / "models"
    models.mkdir()
    cfg = load_config({"models_dir": str(models), "cache_dir": str(tmp_path / "cache"),
                       "memory_budget": 500_000_000, "memory_pressure": "off"}, environ={})
    srv = daemon.Server(cfg, environ={})
    calls: list[int] = []
    orig = srv.enforce_budget
    monkeypatch.setattr(srv, "enforce_budget", lambda: (calls.append(srv.budget_now()), orig())[1])
    srv.start_pressure_watch()
    try:
        assert srv.pressure_watcher is None and srv.pressure_source == "off"
        assert srv.budget_now() == 500_000_000  # memory.max "max": the configured budget
        t = time.monotonic()
        srv.check_memory_sources(t)
        assert calls == []  # nothing changed
        mem_max.write_text(str(300_000_000 + daemon.process_rss()))
        srv.check_memory_sources(t + daemon.CGROUP_PERIOD_S)
        assert len(calls) == 1 and calls[0] < 310_000_000  # the new limit, less what the process holds besides
        # a pressure event (as the watcher thread reports it): capped below what the models hold (floor here)
        srv.on_memory_pressure()
        srv.check_memory_sources(t + 2 * daemon.CGROUP_PERIOD_S)
        assert len(calls) == 2 and calls[1] == srv.pressure_cap.floor
        st = srv.status()["memory"]["pressure"]
        assert st["events"] == 1 and st["cap_bytes"] == srv.pressure_cap.floor and st["source"] == "off"
        srv.check_memory_sources(t + 2 * daemon.CGROUP_PERIOD_S + 0.1)
        assert len(calls) == 2  # an event is acted on once
    finally:
        srv.stop_pressure_watch()
        srv.ctx.term()
