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
    from inferd.runtime.cpu import CpuExecutor
    from inferd.runtime import profiler
    from inferd.runtime.scheduler import Foreground as F
    from inferd.zoo import build

    fg = F()
    monkeypatch.setattr(profiler, "foreground", fg)
    g = import_model(build("tiny"))
    entries = CpuExecutor(g, lazy=True).candidates()  # each layer with its candidate kernels and default
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
    from inferd.runtime import cpu

    monkeypatch.setattr(cpu, "_CHOSEN", {})  # measured here, not taken from an earlier test's measurement
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


def test_a_preloads_idle_time_finish_leaves_its_layers_to_a_request(tmp_path) -> None:
    """``Model.wait_prepared`` (the daemon's finish of a load no request waits on, on the idle worker at nice 19)
    prepares nothing while a request runs and holds no lock it needs: a request that comes meanwhile runs its
    cold first run at once, preparing on its own thread, and gets the right answer."""
    import inferd
    from inferd.package import compile_model
    from inferd.runtime.scheduler import foreground
    from inferd.zoo import build

    src = tmp_path / "tiny.onnx"
    src.write_bytes(build("tiny").SerializeToString())
    pkg = compile_model(src, tmp_path / "pkg")
    x = {"input": np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    want = inferd.load(str(pkg), device="cpu")
    try:
        ref = want.run(x)["output"]
    finally:
        want.close()
    m = inferd.load(str(pkg), device="cpu", loaders=0)  # no loader threads: every layer waits for a caller
    try:
        run = m._cold.run
        with foreground:  # a request (of any model) is running
            th = threading.Thread(target=m.wait_prepared, name="inferd-idle-test")
            th.start()
            time.sleep(0.2)
            assert not any(run.ready(p) for p in range(len(run.tasks))), "prepared while a request ran"
            t0 = time.monotonic()
            y = m.run(x)["output"]  # not behind the helper: it holds no lock and takes no layer
            assert time.monotonic() - t0 < 5
        th.join(10)
        assert not th.is_alive()
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
        assert m.wait_loaded() is m
    finally:
        m.close()


def test_the_idle_time_finish_defers_for_a_bounded_time(tmp_path, monkeypatch) -> None:
    """Under a foreground that never goes quiet (a steady stream of another model's requests), ``wait_prepared``
    prepares the layers itself after ``PREPARED_DEFER_S``: the idle worker is one queue, not held by it."""
    import inferd
    from inferd.package import compile_model
    from inferd.runtime import model as model_mod
    from inferd.runtime.scheduler import foreground
    from inferd.zoo import build

    monkeypatch.setattr(model_mod, "PREPARED_DEFER_S", 0.3)
    src = tmp_path / "tiny.onnx"
    src.write_bytes(build("tiny").SerializeToString())
    pkg = compile_model(src, tmp_path / "pkg")
    m = inferd.load(str(pkg), device="cpu", loaders=0)
    try:
        run = m._cold.run
        with foreground:
            t0 = time.monotonic()
            m.wait_prepared()
            dt = time.monotonic() - t0
            assert all(run.ready(p) for p in range(len(run.tasks)))
        assert 0.25 <= dt < 10, dt
    finally:
        m.close()
