"""What the Vulkan host-time diagnostics (`_vk_host_prof.py`, `_vk_cold_phases.py`) share: timers put around
functions (wall time per call, thread CPU and calls per label) and one cold load with its first answer."""
import collections
import functools
import time

import numpy as np

import inferd

wall: dict[str, list[float]] = collections.defaultdict(list)
cpu: dict[str, float] = collections.defaultdict(float)
calls: collections.Counter = collections.Counter()


def wrap(obj, name: str, label: str) -> None:
    """Time every call of ``obj.name`` under ``label``."""
    f = getattr(obj, name)

    @functools.wraps(f)
    def g(*a, **k):
        t, c = time.perf_counter(), time.thread_time()
        try:
            return f(*a, **k)
        finally:
            wall[label].append(time.perf_counter() - t)
            cpu[label] += time.thread_time() - c
            calls[label] += 1
    setattr(obj, name, g)


def clear() -> None:
    wall.clear()
    cpu.clear()
    calls.clear()


def cold_run(path: str, feeds: dict | None = None):
    """(model, feeds, seconds to load() returning, seconds to the first answer) of one load of ``path`` on Vulkan;
    ``feeds`` default to zeros of the model's inputs."""
    t = time.perf_counter()
    m = inferd.load(path, device="vulkan")
    if feeds is None:
        feeds = {i.name: np.zeros(i.shape, np.float32) for i in m.inputs}
    t1 = time.perf_counter()
    m.run(feeds)
    return m, feeds, t1 - t, time.perf_counter() - t
