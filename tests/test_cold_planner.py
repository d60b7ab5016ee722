"""The cold-start planner and the scheduler that carries out its plans, without any model or device.

Property tests over random layer lists and costs: every plan is well formed, its predicted
schedule respects every dependency, it is never worse than NNV12's choice or the warm default under
the same time model, the ablation switches do what they say; and the scheduler, driving a fake
backend with random delays, never executes a layer before its preparation is done, whatever the
plan, the thread count or the stealing.
"""
from __future__ import annotations

import random
import threading
import time

import pytest

from inferd.planner import cold
from inferd.planner.cold import Candidate, ColdLayer, nnv12_makespan, plan_cold
from inferd.planner.plan import ColdPlan, LayerPlan, PlanOptions
from inferd.runtime.scheduler import ColdRun, LoaderPool


def random_layers(rng: random.Random, n: int) -> list[ColdLayer]:
    layers = []
    for i in range(n):
        cands = []
        if rng.random() < 0.25:  # no weights: one candidate, nothing to prepare
            cands.append(Candidate("eltwise", "none", 0.0, 0.0, 0.0, rng.uniform(1e-5, 1e-3)))
        else:
            for k in range(rng.randint(1, 3)):
                read_raw = rng.uniform(1e-5, 5e-3)
                xform = rng.choice([0.0, rng.uniform(1e-5, 8e-3)])
                ex = rng.uniform(1e-5, 4e-3)
                cands.append(Candidate(f"k{k}", "raw", read_raw, xform, 0.0, ex))
                if xform:
                    cands.append(Candidate(f"k{k}", "transformed", read_raw * rng.uniform(0.8, 2.5), 0.0, 0.0, ex))
        warm = min(cands, key=lambda c: c.exec_s).kernel
        layers.append(ColdLayer(i, f"n{i}", "Conv", tuple(cands), warm))
    return layers


def check_schedule(plan: ColdPlan, layers: list[ColdLayer], gpu: bool = False) -> None:
    """The predicted schedule of ``plan``: executions in order, each after its own preparation; one
    thread prepares one layer at a time; each layer exactly once."""
    assert [lp.index for lp in plan.layers] == list(range(len(layers)))
    prev_end = 0.0
    for lp in plan.layers:
        start = lp.exec_end_s - lp.exec_s
        assert start >= lp.ready_s - 1e-12, (lp.name, start, lp.ready_s)
        assert start >= prev_end - 1e-12
        prev_end = lp.exec_end_s
        cand = [c for c in layers[lp.index].candidates if c.kernel == lp.kernel and c.source == lp.source]
        assert cand, f"{lp.name}: planned ({lp.kernel}, {lp.source}) is not one of its candidates"
    queues = plan.queues()
    assert sorted(p for q in queues for p in q) == list(range(len(layers)))
    for q, members in enumerate(queues[:plan.loaders]):
        spans = sorted((plan.layers[p].ready_s - plan.layers[p].prep_s, plan.layers[p].ready_s) for p in members)
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert b0 >= a1 - 1e-9, f"loader {q} prepares two layers at once"
    assert plan.predicted_s == pytest.approx(plan.layers[-1].exec_end_s if plan.layers else 0.0)


@pytest.mark.parametrize("seed", range(40))
def test_random_plans_are_valid_and_never_worse_than_nnv12(seed: int) -> None:
    rng = random.Random(seed)
    layers = random_layers(rng, rng.randint(1, 60))
    loaders = rng.randint(0, 4)
    gpu = rng.random() < 0.3
    plan = plan_cold(layers, loaders, "cpu", gpu=gpu)
    check_schedule(plan, layers, gpu)
    assert plan.predicted_s <= nnv12_makespan(layers, plan.loaders, gpu=gpu) * (1 + 1e-9)
    assert ColdPlan.from_dict(plan.to_dict()) == plan


def test_executor_preparing_beats_nnv12_on_a_transform_bound_model() -> None:
    # transforms dominate and there is one loader: NNV12 picks per layer in isolation and leaves the
    # executor idle while the loader works through nine transforms; planning the whole schedule runs
    # the first layers with the kernel that needs no transform and hides the others' transforms
    layers = [ColdLayer(i, f"n{i}", "Conv", (Candidate("a", "raw", 5e-4, 4e-3, 0.0, 1e-3),
                                             Candidate("b", "raw", 5e-4, 0.0, 0.0, 6e-3)), "a")
              for i in range(10)]
    plan = plan_cold(layers, 1)
    assert plan.predicted_s < 0.75 * nnv12_makespan(layers, 1)
    assert {lp.kernel for lp in plan.layers} == {"a", "b"}


def test_reads_share_one_disk() -> None:
    # reads dominate: however many loaders, no plan beats the time to read what it reads
    layers = [ColdLayer(i, f"n{i}", "Conv", (Candidate("a", "raw", 4e-3, 1e-3, 0.0, 1e-3),
                                             Candidate("a", "transformed", 6e-3, 0.0, 0.0, 1e-3)), "a")
              for i in range(10)]
    for loaders in (1, 2, 4):
        plan = plan_cold(layers, loaders)
        assert plan.predicted_s >= sum(lp.read_s for lp in plan.layers) - 1e-12
        assert all(lp.source == "raw" for lp in plan.layers)  # smaller reads win when the disk is the limit


def test_ablation_switches() -> None:
    rng = random.Random(7)
    layers = random_layers(rng, 40)
    raw_only = plan_cold(layers, 2, options=PlanOptions(cache=False))
    assert all(lp.source != "transformed" for lp in raw_only.layers)
    warm_kernels = plan_cold(layers, 2, options=PlanOptions(select=False))
    assert all(lp.kernel == layers[lp.index].warm_kernel for lp in warm_kernels.layers)
    assert all(not lp.warm_kernel for lp in warm_kernels.layers)  # nothing to switch to
    serial = plan_cold(layers, 2, options=PlanOptions(pipeline=False))
    assert serial.predicted_s == pytest.approx(max(lp.ready_s for lp in serial.layers)
                                               + sum(lp.exec_s for lp in serial.layers))
    forced = plan_cold(layers, 2, options=PlanOptions(force_source="transformed"))
    for lp in forced.layers:
        if any(c.source == "transformed" for c in layers[lp.index].candidates):
            assert lp.source == "transformed"
    full = plan_cold(layers, 2)
    assert full.predicted_s <= min(raw_only.predicted_s, warm_kernels.predicted_s, serial.predicted_s) + 1e-12


def test_planner_work_stays_near_linear_on_a_large_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon plans a new model before its first answer, so the local search must not simulate every
    suffix of a long model for every trial (O(n^2) layer steps). Counted in simulated layer steps, not
    seconds: a wall-clock bound failed under CI's load, and speed is the benchmarks' business."""
    steps = [0]
    real_step = cold._step

    def counting_step(*args: object, **kwargs: object) -> tuple[int, float]:
        steps[0] += 1
        return real_step(*args, **kwargs)

    monkeypatch.setattr(cold, "_step", counting_step)
    per_layer = []
    for n in (100, 400):
        steps[0] = 0
        plan = plan_cold(random_layers(random.Random(1), n), 3)
        assert len(plan.layers) == n
        per_layer.append(steps[0] / n)
    # the search's passes times the candidates tried per layer, times a short suffix per trial
    assert per_layer[1] < 250, per_layer
    assert per_layer[1] < 4 * per_layer[0], per_layer


# ------------------------------------------------------------------------------------ the scheduler

class FakeBackend:
    """Records when each layer's preparation finished and when it executed."""

    def __init__(self, n: int, rng: random.Random, fail: int | None = None) -> None:
        self.prepared: dict[int, float] = {}
        self.executed: list[tuple[int, float]] = []
        self.delays = [rng.uniform(0, 0.004) for _ in range(n)]
        self.fail = fail
        self.threads: dict[int, str] = {}
        self.lock = threading.Lock()

    def prepare(self, pos: int) -> dict[str, float]:
        time.sleep(self.delays[pos])
        if pos == self.fail:
            raise ValueError("boom")
        with self.lock:
            self.prepared[pos] = time.perf_counter()
            self.threads[pos] = threading.current_thread().name
        return {"read_s": self.delays[pos]}


def random_plan(rng: random.Random, n: int, loaders: int, **opts: bool) -> ColdPlan:
    layers = []
    counters = [0] * (loaders + 1)
    for i in range(n):
        who = rng.randint(0, loaders)
        layers.append(LayerPlan(i, f"n{i}", "Conv", "k", "raw", who, counters[who], "", read_s=rng.uniform(0, 4e-3)))
        counters[who] += 1
    return ColdPlan("cpu", loaders, tuple(layers), 0.0, 0.0, 0.0, PlanOptions(**opts))


@pytest.mark.parametrize("seed", range(12))
def test_scheduler_never_executes_before_preparation(seed: int) -> None:
    rng = random.Random(100 + seed)
    n = rng.randint(1, 40)
    loaders = rng.randint(0, 3)
    opts = {"steal": rng.random() < 0.6, "executor_prepares": rng.random() < 0.7}
    plan = random_plan(rng, n, loaders, **opts)
    fb = FakeBackend(n, rng)
    pool = LoaderPool(rng.randint(1, 3))
    run = ColdRun(plan, fb.prepare, f"m{seed}")
    pool.submit(run)
    try:
        for pos in range(n):
            run.wait_ready(pos)
            fb.executed.append((pos, time.perf_counter()))
    finally:
        pool.stop()
    assert [p for p, _ in fb.executed] == list(range(n))
    for pos, t in fb.executed:
        assert fb.prepared[pos] <= t
    assert sorted(fb.prepared) == list(range(n))  # each prepared exactly once (a dict would hide twice: count)
    assert run.breakdown()["tasks"] == n
    if not opts["steal"]:
        for pos, th in fb.threads.items():  # without stealing a loader only takes its own queues' tasks
            if th.startswith("inferd-loader-"):
                w = int(th.rsplit("-", 1)[1])
                assert plan.layers[pos].loader < plan.loaders and plan.layers[pos].loader % pool.n == w % pool.n


def test_idle_loader_steals_from_a_busy_one() -> None:
    # every task planned on loader 0, which is held on its first (slow) task before a second loader exists;
    # the second loader, once started, steals every other task (the caller only polls, so it takes none)
    n = 8
    layers = tuple(LayerPlan(i, f"n{i}", "Conv", "k", "raw", 0, i, "", read_s=1e-3) for i in range(n))
    plan = ColdPlan("cpu", 2, layers, 0.0, 0.0, 0.0, PlanOptions(executor_prepares=False))
    slow, started = threading.Event(), threading.Event()

    def prepare(pos: int) -> dict[str, float]:
        if pos == 0:
            started.set()
            slow.wait(30)
        else:
            time.sleep(0.002)
        return {}

    pool = LoaderPool(1)
    run = ColdRun(plan, prepare, "steal")
    pool.submit(run)
    try:
        assert started.wait(30)
        pool.set_size(2)
        end = time.monotonic() + 30
        while not all(run.ready(p) for p in range(1, n)) and time.monotonic() < end:
            time.sleep(0.005)
        assert all(run.ready(p) for p in range(1, n)), "the idle loader did not take the busy one's tasks"
        assert not run.ready(0)
        slow.set()
        run.wait_ready(0)
    finally:
        slow.set()
        pool.stop()
    assert run.breakdown()["stolen"] == n - 1


def test_failed_preparation_is_reported_at_its_layer() -> None:
    plan = random_plan(random.Random(3), 10, 2)
    fb = FakeBackend(10, random.Random(4), fail=6)
    pool = LoaderPool(2)
    run = ColdRun(plan, fb.prepare, "bad")
    pool.submit(run)
    try:
        for pos in range(6):
            run.wait_ready(pos)
        with pytest.raises(Exception, match="boom"):
            run.wait_ready(6)
    finally:
        pool.stop()


def test_cold_runs_share_the_pool_fairly() -> None:
    # two runs, everything on loader 0 and no executor help: the single worker alternates between them
    order: list[str] = []
    lock = threading.Lock()

    def prep(tag: str):
        def f(pos: int) -> dict[str, float]:
            with lock:
                order.append(tag)
            time.sleep(0.001)
            return {}
        return f

    mk = lambda: ColdPlan("cpu", 1, tuple(LayerPlan(i, f"n{i}", "Conv", "k", "raw", 0, i, "", read_s=1e-3)
                                          for i in range(10)), 0.0, 0.0, 0.0, PlanOptions(steal=False,
                                                                                            executor_prepares=False))
    pool = LoaderPool(1)
    a, b = ColdRun(mk(), prep("a"), "a"), ColdRun(mk(), prep("b"), "b")
    pool.submit(a)
    pool.submit(b)
    try:
        a.wait_ready(9)
        b.wait_ready(9)
    finally:
        pool.stop()
    # once both are queued, neither waits for the other to finish: runs interleave
    first_b = order.index("b")
    assert "a" in order[first_b:], order


def _calibration_case():
    import numpy as np

    from inferd.ops.base import Kernel, single_node_layer
    from inferd.planner.cost import DeviceRates, Profile, ProfiledCost, RooflineCost, calibrated_roofline

    class Fast(Kernel):
        name = "fast"

    class Slow(Kernel):
        name = "slow"

    rng = np.random.default_rng(0)
    layers = [single_node_layer("Conv", [rng.standard_normal((1, c, 14, 14)).astype(np.float32),
                                         rng.standard_normal((c, c, 1, 1)).astype(np.float32)],
                                {"kernel_shape": [1, 1]}, name=f"c{i}") for i, c in enumerate((16, 32, 64, 128))]
    rates = DeviceRates()
    base = RooflineCost(rates, gpu=True)
    # every layer's "fast" measured at 20x its roofline; "slow" at 3x on the first layer only
    times = {(L.name, "fast", "exec"): 20 * base.cost(L, Fast(), "exec").seconds for L in layers}
    times[(layers[0].name, "slow", "exec")] = 3 * base.cost(layers[0], Slow(), "exec").seconds
    prof = Profile("vulkan", {}, rates, times)
    entries = [(L, [Fast(), Slow()], Fast()) for L in layers]
    return layers, Fast(), Slow(), base, prof, entries, calibrated_roofline, ProfiledCost


def test_unmeasured_candidates_are_priced_like_the_measured_ones_beside_them() -> None:
    """A profile that measured a kernel on some layers prices it elsewhere at the ratio it showed there (the bare
    roofline put lavapipe's unmeasured 1x1 kernels at a tenth of the measured ones, and the cold plan took them);
    a kernel measured nowhere gets the median ratio of all; the measured times themselves are kept."""
    layers, fast, slow, base, prof, entries, calibrated_roofline, ProfiledCost = _calibration_case()
    cal = calibrated_roofline(prof, entries, gpu=True)
    cost = ProfiledCost(prof, cal)
    for L in layers[1:]:
        got = cost.cost(L, slow, "exec")
        assert got.source == "roofline" and got.seconds == pytest.approx(3 * base.cost(L, slow, "exec").seconds)
        assert cost.cost(L, fast, "exec").seconds == pytest.approx(prof.times[(L.name, "fast", "exec")])
        # the cold-run phases scale alike
        assert cal.cost(L, slow, "exec_cold").seconds == pytest.approx(3 * base.cost(L, slow, "exec_cold").seconds)

    class Other(type(fast)):
        name = "other"

    # measured nowhere: the median of the five ratios (20, 20, 20, 20, 3)
    want = 20 * base.cost(layers[2], Other(), "exec").seconds
    assert cal.cost(layers[2], Other(), "exec").seconds == pytest.approx(want)
    # reads, transforms and pipelines are not execution times: unscaled
    assert cal.cost(layers[2], slow, "read_raw") == base.cost(layers[2], slow, "read_raw")


def test_a_profile_without_execution_times_leaves_the_roofline_as_it_is() -> None:
    layers, fast, slow, base, prof, entries, calibrated_roofline, _ = _calibration_case()
    from inferd.planner.cost import Profile

    empty = Profile("vulkan", {}, prof.rates, {(layers[0].name, "fast", "transform"): 1e-3})
    cal = calibrated_roofline(empty, entries, gpu=True)
    assert cal.exec_scale == {} and cal.cost(layers[1], slow, "exec") == base.cost(layers[1], slow, "exec")


def test_a_helper_that_defers_leaves_the_tasks_to_a_running_request() -> None:
    """The idle-time finish of a load (``wait_all(defer=...)``) takes no task while a request runs: the request
    prepares what its first run needs on its own thread, and the helper takes the rest once the request is over."""
    n = 6
    layers = tuple(LayerPlan(i, f"n{i}", "Conv", "k", "raw", 0, i, "", read_s=1e-3) for i in range(n))
    plan = ColdPlan("cpu", 0, layers, 0.0, 0.0, 0.0, PlanOptions())  # no loaders: every task is the caller's
    who: dict[int, str] = {}

    def prepare(pos: int) -> dict[str, float]:
        who[pos] = threading.current_thread().name
        return {}

    run = ColdRun(plan, prepare, "defer")
    busy = threading.Event()
    busy.set()  # a request is running
    errors: list[BaseException] = []

    def helper() -> None:
        try:
            run.wait_all(defer=busy.is_set)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    th = threading.Thread(target=helper, name="helper")
    th.start()
    try:
        time.sleep(0.2)
        assert not who, "the helper prepared a layer while a request ran"
        for pos in range(3):  # the request's first run prepares what it reaches, on its own thread
            run.wait_ready(pos)
        assert {who[p] for p in range(3)} == {threading.current_thread().name}
    finally:
        busy.clear()  # the request is over: the helper finishes the load
        th.join(10)
    assert not th.is_alive() and not errors
    assert all(run.ready(p) for p in range(n))
    assert {who[p] for p in range(3, n)} == {"helper"}
