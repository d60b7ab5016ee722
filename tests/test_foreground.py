"""Idle-time work yields to requests: ``runtime.scheduler.foreground`` (entered by ``Model.run``) and the idle
profiler waiting on it."""
from __future__ import annotations

import threading
import time

import numpy as np

from inferd.runtime.scheduler import Foreground


def test_wait_quiet_blocks_while_a_request_runs_and_just_after() -> None:
    fg = Foreground()
    assert fg.wait_quiet(0.0, timeout=0.1)
    with fg:
        t0 = time.monotonic()
        assert not fg.wait_quiet(0.01, timeout=0.05)  # a request is running
        assert time.monotonic() - t0 >= 0.04
    assert not fg.wait_quiet(0.5, timeout=0.05)      # one just ended: not quiet for 0.5 s yet
    assert fg.wait_quiet(0.02, timeout=1.0)


def test_idle_profiling_measures_only_between_requests(monkeypatch) -> None:
    """profile_layers on the idle worker's thread starts a measurement only once the foreground is quiet."""
    from inferd.frontend import import_model
    from inferd.ops.base import Layer, applicable_kernels
    from inferd.runtime import profiler
    from inferd.runtime.scheduler import Foreground as F
    from inferd.zoo import build

    fg = F()
    monkeypatch.setattr(profiler, "foreground", fg)
    g = import_model(build("tiny"))
    entries = []
    for n in g.nodes:
        lay = Layer.of(n, g)
        ks = applicable_kernels(lay, "cpu")
        if ks:
            entries.append((lay, ks, ks[0]))
    assert entries
    done: list[float] = []

    def work() -> None:
        profiler.profile_layers(entries, g.constants, profiler.DeviceRates(), {}, reps=1)
        done.append(time.monotonic())

    with fg:  # a request in flight: the idle profiler must not start
        th = threading.Thread(target=work, name="inferd-idle")
        th.start()
        time.sleep(0.3)
        assert not done
        released = time.monotonic()
    th.join(10)
    assert done and done[0] >= released
