"""The client polls awake for the reply of a request whose model answered within ``spin_us`` last time, and only
then (``Client(spin_us=...)``, ``$INFERD_CLIENT_SPIN_US``)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import inferd_client.client as client_mod
from inferd.server.testing import DaemonProcess, fake_daemon
from inferd_client import Client

SPEC = {"inputs": [{"name": "x", "shape": [3], "dtype": "float32"}]}


@pytest.fixture(scope="module")
def daemon():
    with fake_daemon({"echo": SPEC, "slow": {**SPEC, "delay_s": 0.05}, "busy": {**SPEC, "delay_s": 0.4}},
                     prefix="ifsp") as proc:
        yield proc


@pytest.fixture
def yields(monkeypatch) -> list[int]:
    n = [0]

    def counted() -> None:
        n[0] += 1

    monkeypatch.setattr(client_mod, "_sched_yield", counted)
    return n


def _call(c: Client, model: str, yields: list[int]) -> int:
    """The yields one request made; its answer checked."""
    before = yields[0]
    x = np.array([1, 2, 3], np.float32)
    assert np.array_equal(c.infer(model, {"x": x})["y"], x * 2 + 1)
    return yields[0] - before


def _spins_soon(c: Client, model: str, yields: list[int], tries: int = 200) -> bool:
    """Whether one of up to ``tries`` requests waited for its reply awake. Not a fixed few: on a loaded machine
    (CI's other worker on both cores) a round trip can exceed spin_us several times in a row, and the next
    request then rightly sleeps (a CI run saw five such in a row); a client that never spins fails all of them."""
    return any(_call(c, model, yields) > 0 for _ in range(tries))


def test_spins_for_a_model_that_answered_within_spin_us_only(daemon: DaemonProcess, yields: list[int]) -> None:
    with Client(daemon.endpoint, timeout=20, spin_us=client_mod.MAX_SPIN_US) as c:
        assert _call(c, "echo", yields) == 0  # nothing known of this model's round trip yet: no spin
        # its round trip is well under 10 ms: the next requests wait awake, yielding the core between polls
        assert _spins_soon(c, "echo", yields)
        # a model that answers in 50 ms is never spun for: not the first time, nor after it answered
        assert _call(c, "slow", yields) == 0
        assert _call(c, "slow", yields) == 0
        assert _spins_soon(c, "echo", yields)  # per model: echo still spins


def test_no_spin_while_the_daemon_serves_others(daemon: DaemonProcess, yields: list[int]) -> None:
    """A reply says whether the daemon had nothing else to do (``idle``): a client whose last reply came from a
    busy daemon sleeps in its poll, leaving the cores to the daemon."""
    x = {"x": np.array([1, 2, 3], np.float32)}
    with Client(daemon.endpoint, timeout=20, spin_us=client_mod.MAX_SPIN_US) as c, \
            Client(daemon.endpoint, timeout=20, spin_us=0) as other:
        for _ in range(3):
            _call(c, "echo", yields)
        assert c.infer_with_info("echo", x)[1]["idle"] is True
        th = threading.Thread(target=lambda: other.infer("busy", x))  # 0.4 s on the busy model's worker
        th.start()
        try:
            time.sleep(0.05)
            info = c.infer_with_info("echo", x)[1]
            assert info["inline"] is True and info["idle"] is False, info
            assert _call(c, "echo", yields) == 0  # after a busy reply: no spin
        finally:
            th.join(10)
        _call(c, "echo", yields)  # idle again: this reply says so
        assert _spins_soon(c, "echo", yields)


def test_spin_off(daemon: DaemonProcess, yields: list[int], monkeypatch) -> None:
    with Client(daemon.endpoint, timeout=20, spin_us=0) as c:
        assert sum(_call(c, "echo", yields) for _ in range(6)) == 0
    monkeypatch.setenv("INFERD_CLIENT_SPIN_US", "0")
    with Client(daemon.endpoint, timeout=20) as c:
        assert c.spin_s == 0
        assert sum(_call(c, "echo", yields) for _ in range(6)) == 0


def test_spin_us_is_checked(monkeypatch) -> None:
    for bad in (-1.0, client_mod.MAX_SPIN_US + 1, float("nan")):
        with pytest.raises(ValueError, match="spin_us"):
            Client("ipc:///tmp/nowhere.sock", spin_us=bad)
    monkeypatch.setenv("INFERD_CLIENT_SPIN_US", "fast")
    with pytest.raises(ValueError, match="INFERD_CLIENT_SPIN_US"):
        Client("ipc:///tmp/nowhere.sock")
    monkeypatch.setenv("INFERD_CLIENT_SPIN_US", "250")
    c = Client("ipc:///tmp/nowhere.sock")
    try:
        assert c.spin_s == pytest.approx(250e-6)
    finally:
        c.close()
