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
        profiler.profile_layers(entries, g.constants, profiler.DeviceRates(), {}, reps=1, between_requests=True)
        done.append(time.monotonic())

    with fg:  # a request in flight: the idle profiler must not start
        th = threading.Thread(target=work, name="inferd-idle")
        th.start()
        time.sleep(0.3)
        assert not done
        released = time.monotonic()
    th.join(10)
    assert done and done[0] >= released


def test_a_body_profiled_on_the_idle_worker_under_a_waiting_request_does_not_wait_for_quiet(monkeypatch) -> None:
    """A preloaded model's cold load is finished on the idle worker, which prepares the layers nobody has started,
    a control-flow body's included (its kernels measured: ``measured_choice``). A request that came meanwhile
    waits on that layer inside the foreground: measuring only between requests would wait for the very request
    that waits on it, and failed it with IdleBusy after ``IDLE_WAIT_S`` (seen with the daemon on one core)."""
    from inferd.frontend import import_model
    from inferd.runtime import profiler
    from inferd.runtime.cold import idle_worker
    from inferd.runtime.cpu import measured_choice
    from inferd.runtime.scheduler import Foreground as F
    from inferd.zoo import build

    fg = F()
    monkeypatch.setattr(profiler, "foreground", fg)
    monkeypatch.setattr(profiler, "IDLE_WAIT_S", 0.3)
    g = import_model(build("tiny"))
    out: list[object] = []

    def work() -> None:
        try:
            out.append(measured_choice(g, reps=1))
        except Exception as e:  # noqa: BLE001 - the assertion below names it
            out.append(e)

    with fg:  # the waiting request
        t0 = time.monotonic()
        done = idle_worker().submit(work)
        assert done.wait(10)
    assert not isinstance(out[0], Exception), out[0]
    assert len(out[0]) == len(g.nodes)  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 0.3 + 5
