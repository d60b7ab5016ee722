"""A small CPU model's warm runs take the calling thread alone when that measures faster than the native pool
(``inferd.runtime.threads.ThreadChoice``): the trial alternates the two, keeps the faster, tries again later; a
slow model keeps the pool; the cap is the calling thread's own and is put back after each run."""
from __future__ import annotations

import numpy as np
import pytest

import inferd
from inferd import native
from inferd.runtime.threads import ThreadChoice

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="needs the native extension")


@pytest.mark.parametrize("alone_s, pool_s, want", [(1e-4, 1.2e-4, 1), (1.04e-4, 1e-4, 1), (2e-4, 1.2e-4, 0)])
def test_the_trial_keeps_the_faster_and_tries_again(alone_s: float, pool_s: float, want: int) -> None:
    tc = ThreadChoice(pool=2)
    caps = []
    for _ in range(2 * ThreadChoice.TRIAL):
        assert tc.in_trial()
        caps.append(tc.next_cap())
        tc.record(caps[-1], alone_s if caps[-1] == 1 else pool_s)
    assert caps.count(1) == caps.count(0) == ThreadChoice.TRIAL
    assert caps[:2 * ThreadChoice.BLOCK] == [0] * ThreadChoice.BLOCK + [1] * ThreadChoice.BLOCK  # in blocks
    assert not tc.in_trial() and tc.cap == want and tc.info()["threads"] == (1 if want else 2)
    assert tc.info()["alone_us"] == pytest.approx(alone_s * 1e6) and tc.info()["pool_us"] == pytest.approx(pool_s * 1e6)
    seen = []
    for _ in range(ThreadChoice.RETRY - 2 * ThreadChoice.TRIAL):  # runs outside a trial are counted, not timed
        tc.run(lambda _: seen.append(native.caller_threads()), None)
    assert set(seen) == {want} and tc.in_trial()
    for _ in range(2 * ThreadChoice.TRIAL):  # the next trial: the load changed, the other choice wins now
        cap = tc.next_cap()
        tc.record(cap, (3e-4 if want else 0.5e-4) if cap == 1 else 1e-4)
    assert tc.cap == 1 - want


def test_a_slow_model_keeps_the_pool_and_a_pool_of_one_never_tries() -> None:
    tc = ThreadChoice(pool=2)
    caps = []
    for _ in range(2 * ThreadChoice.TRIAL):
        caps.append(tc.next_cap())
        tc.record(caps[-1], 5e-3 if caps[-1] == 1 else 2e-3)
    # the pool's first block measured past MAX_S: no run of the trial went to one thread
    assert caps == [0] * (2 * ThreadChoice.TRIAL)
    assert tc.cap == 0 and not tc.in_trial() and tc.info() == {"threads": 2, "pool": 2, "pool_us": 2000.0}
    for _ in range(3 * ThreadChoice.RETRY):
        assert tc.next_cap() == 0 and not tc.in_trial()
        tc.run(lambda _: None, None)
    single = ThreadChoice(pool=1)
    assert not single.in_trial() and single.next_cap() == 0 and single.info() == {"threads": 1, "pool": 1}


def test_a_model_near_the_limit_is_still_tried_on_one_thread() -> None:
    """Only a pool median past MAX_S ends the trial early; one just under it runs the whole trial."""
    tc = ThreadChoice(pool=2)
    caps = []
    for _ in range(2 * ThreadChoice.TRIAL):
        caps.append(tc.next_cap())
        tc.record(caps[-1], 0.8 * ThreadChoice.MAX_S if caps[-1] == 1 else 0.9 * ThreadChoice.MAX_S)
    assert caps.count(1) == ThreadChoice.TRIAL and tc.cap == 1


def test_the_cap_is_put_back_after_a_run_even_a_failing_one() -> None:
    tc = ThreadChoice(pool=2)
    native.set_caller_threads(0)
    inside = []

    def run(fail: bool) -> None:
        inside.append(native.caller_threads())
        if fail:
            raise RuntimeError("boom")

    for _ in range(ThreadChoice.BLOCK):
        tc.run(run, False)  # the trial's first block: the pool
    with pytest.raises(RuntimeError):
        tc.run(run, True)  # its second block: this thread alone, the first run failing
    assert native.caller_threads() == 0
    tc.run(run, False)  # a failed run is not counted: the same cap again
    assert inside == [0] * ThreadChoice.BLOCK + [1, 1] and native.caller_threads() == 0


def test_a_small_zoo_model_decides_and_answers_the_same_either_way(tmp_path) -> None:
    from inferd import zoo

    path = zoo.write_zoo(tmp_path, ["kws_gru"])["kws_gru"]
    before = native.num_threads()
    native.set_num_threads(2)  # a pool of two whatever an earlier test in this worker left
    m = inferd.load(str(path), device="cpu")
    try:
        m.wait_warm(60)
        rng = np.random.default_rng(0)
        feeds = {"input": rng.standard_normal((1, 49, 40)).astype(np.float32),
                 "state": rng.standard_normal((1, 1, 64)).astype(np.float32)}
        # (a switch to the idle-time profiled plan's kernels starts the trial afresh: run until one is decided)
        outs = [m.run(feeds) for _ in range(2 * ThreadChoice.TRIAL + 4)]
        while len(outs) < 600 and (m.thread_choice is None or m.thread_choice.decided is None):
            outs.append(m.run(feeds))
        tc = m.thread_choice
        assert tc is not None and tc.decided is not None, f"no trial finished in {len(outs)} runs"
        assert tc.info()["threads"] in (1, native.num_threads())
        for o in outs[1:]:  # runs on one thread and on the pool give the same answer
            for k in o:
                np.testing.assert_allclose(o[k], outs[0][k], rtol=1e-5, atol=1e-6)
        assert native.caller_threads() == 0
    finally:
        m.close()
        native.set_num_threads(before)


@pytest.mark.parametrize("alone_s, pool_s, soon", [(8.0e-4, 7.9e-4, True), (7.0e-4, 8.0e-4, False),
                                                   (1.01e-4, 1.0e-4, False)])
def test_a_tie_given_to_one_thread_on_long_runs_is_tried_again_soon(alone_s: float, pool_s: float, soon: bool) -> None:
    """One thread takes a tie within TIE; where the runs are long enough that the pool should shorten them (LONG_S)
    and one thread was not faster, the next trial comes after SOON runs instead of RETRY (the second core was likely
    away for the trial); one thread clearly faster, or short runs, wait the whole RETRY."""
    tc = ThreadChoice(pool=2)
    for _ in range(2 * ThreadChoice.TRIAL):
        cap = tc.next_cap()
        tc.record(cap, alone_s if cap == 1 else pool_s)
    assert tc.cap == 1 and not tc.in_trial()
    gap = (ThreadChoice.SOON if soon else ThreadChoice.RETRY) - 2 * ThreadChoice.TRIAL
    for _ in range(gap - 1):
        tc.run(lambda _: None, None)
        assert not tc.in_trial()
    tc.run(lambda _: None, None)
    assert tc.in_trial()
    for _ in range(2 * ThreadChoice.TRIAL):  # the core is back: the pool wins, and keeps it for RETRY runs
        cap = tc.next_cap()
        tc.record(cap, alone_s if cap == 1 else 0.6 * alone_s)
    assert tc.cap == 0 and not tc.in_trial()
    for _ in range(ThreadChoice.RETRY - 2 * ThreadChoice.TRIAL - 1):
        tc.run(lambda _: None, None)
        assert not tc.in_trial()
