"""One Client shared by many threads, by short-lived threads, and across fork()."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from inferd.server.testing import DaemonProcess, fake_daemon
from inferd_client import Client

SPEC = {"inputs": [{"name": "x", "shape": [3], "dtype": "float32"}]}


@pytest.fixture(scope="module")
def daemon():
    with fake_daemon({"echo": SPEC, "echo2": {**SPEC, "delay_s": 0.001}}, prefix="ifdt") as proc:
        yield proc


def test_many_threads_share_one_client(daemon: DaemonProcess) -> None:
    errors: list[str] = []
    with Client(daemon.endpoint, timeout=20) as c:
        def work(t: int) -> None:
            for i in range(100):
                x = np.array([0, t, i], np.float32)
                model = "echo" if (t + i) % 2 else "echo2"
                y = c.infer(model, {"x": x})["y"]
                if not np.array_equal(y, x * 2 + 1):
                    errors.append(f"thread {t} request {i}: got {y}")

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not errors, errors[:5]
        assert c.stale_replies == 0
        # short-lived threads do not leave their sockets behind
        for k in range(20):
            th = threading.Thread(target=lambda: c.infer("echo", {"x": np.zeros(3, np.float32)}))
            th.start()
            th.join(20)
        c.infer("echo", {"x": np.zeros(3, np.float32)})
        assert len(c._conns) <= 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_client_survives_fork(daemon: DaemonProcess) -> None:
    with Client(daemon.endpoint, timeout=20) as c:
        x = np.array([1, 2, 3], np.float32)
        np.testing.assert_array_equal(c.infer("echo", {"x": x})["y"], x * 2 + 1)
        pid = os.fork()
        if pid == 0:  # child: the inherited client must build its own context and sockets
            code = 1
            try:
                y = c.infer("echo", {"x": x * 3})["y"]
                code = 0 if np.array_equal(y, x * 6 + 1) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        np.testing.assert_array_equal(c.infer("echo", {"x": x})["y"], x * 2 + 1)  # parent unaffected
