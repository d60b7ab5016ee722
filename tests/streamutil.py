"""Shared by the streaming runtime's tests (CPU and Vulkan): client threads hammering an executor while its budget
changes."""
from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np
import pytest

from inferd.planner.flex import BudgetTooSmall


def serve_while_budgets_change(ex: Any, feeds: Sequence[dict[str, np.ndarray]], ref: Sequence[dict[str, np.ndarray]],
                               budgets: Sequence[int], too_small: int) -> list[int]:
    """One client thread per feed, each checking every answer against its ``ref`` (bit for bit) and the tracker,
    while the budget goes through ``budgets`` (some requests answered on each arena, which stays inside it), then
    ``too_small`` is refused and the last budget stays. Fails on any wrong answer, violation or error; returns
    the requests each client had answered."""
    errors: list[str] = []
    answered = [0] * len(feeds)
    stop = threading.Event()

    def client(i: int) -> None:
        while not stop.is_set():
            try:
                got = ex.run(feeds[i])
                if any(not np.array_equal(got[k], ref[i][k]) for k in ref[i]):
                    errors.append(f"client {i}: wrong output")
                tr = ex.tracker
                if tr is not None and tr.violations:
                    errors.append(f"client {i}: {tr.violations[:2]}")
                answered[i] += 1
            except Exception as e:  # none may fail because of a change
                errors.append(f"client {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(feeds))]
    for t in threads:
        t.start()
    try:
        for b in budgets:
            before = sum(answered)
            ex.set_budget(b)
            assert ex.arena.nbytes + ex.small_bytes <= b
            while sum(answered) < before + 2 and not errors:  # some requests run on each arena
                stop.wait(0.01)
        with pytest.raises(BudgetTooSmall):
            ex.set_budget(too_small)
        assert ex.budget == budgets[-1]
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:5]
    assert all(a > 0 for a in answered)
    return answered
