"""One Vulkan cold load of a package in a daemon's state (loader threads, host and device pools, resident
pipelines), page cache dropped, with a sampling profile (sys._current_frames every 0.5 ms) per thread and the
backend's own counters. argv: pkg [rounds]. Diagnostic for issue 8 (small models' Vulkan cold)."""
import collections
import os
import sys
import threading
import time

import numpy as np

import inferd
import inferd.vulkan.cold  # noqa: F401
import inferd.vulkan.executor  # noqa: F401
import inferd.vulkan.host  # noqa: F401
from inferd.bench.common import daemon_state
from inferd.bench.cold_bench import evict

pkg = sys.argv[1]
#: VARIANT: "switch100" (the cold window's GIL switch interval 100 us instead of 500), "nopipe" (the first run waits
#: for every layer's preparation and records them all at once, where it records each as it is ready)
VARIANT = os.environ.get("VARIANT", "")
if VARIANT == "switch100":
    from inferd.runtime import window

    window.SWITCH_INTERVAL_S = 0.0001
LOADERS = int(os.environ["LOADERS"]) if os.environ.get("LOADERS") else None  # default: the plan's
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
print("resident", daemon_state("vulkan", 64 << 20, 128, 256 << 20, claim_cores=True))


def drop() -> None:
    evict([pkg], mode="fadvise")  # the package's files only, as the cold bench's tests do


def sample(stop: threading.Event, ours: collections.Counter, n: list[int]) -> None:
    names: dict[int, str] = {}
    while not stop.is_set():
        for tid, fr in sys._current_frames().items():
            if tid == threading.get_ident():
                continue
            th = names.get(tid)
            if th is None:
                th = next((t.name for t in threading.enumerate() if t.ident == tid), "?")
                th = "loader" if "loader" in th else th
                names[tid] = th
            f, chain = fr, []
            while f is not None and len(chain) < 3:
                fn = f.f_code.co_filename
                if ("/daemon/" in fn or "/inferd/" in fn or "vulkan/" in fn) and "threading" not in fn:
                    chain.append(f"{os.path.basename(fn)}:{f.f_code.co_name}:{f.f_lineno}")
                f = f.f_back
            if not chain or "scheduler.py:_run" in chain[0] or "scheduler.py:_worker" in chain[0]:
                continue
            ours[(th, " < ".join(chain))] += 1
        n[0] += 1
        time.sleep(0.0005)


for r in range(rounds):
    profile = r == rounds - 1 and os.environ.get("SAMPLE", "1") == "1"
    drop()
    ours: collections.Counter = collections.Counter()
    n = [0]
    stop = threading.Event()
    s = threading.Thread(target=sample, args=(stop, ours, n), daemon=True)
    if profile:
        s.start()
    t0 = time.perf_counter()
    m = inferd.load(pkg, device="vulkan", loaders=LOADERS)
    t_load = time.perf_counter()
    if VARIANT == "nopipe" and m._cold is not None:
        from dataclasses import replace

        m._cold.plan = replace(m._cold.plan, options=replace(m._cold.plan.options, pipeline=False))
    feeds = {i.name: np.random.rand(*i.shape).astype(i.dtype) for i in m.inputs}
    t1 = time.perf_counter()
    m.run(feeds)
    t = time.perf_counter() - t0 - (t1 - t_load)
    stop.set()
    cs = {k: (round(v * 1e3, 2) if isinstance(v, float) else v) for k, v in m.cold_stats.items()
          if isinstance(v, (int, float))}
    cold = m._cold
    be = getattr(cold, "backend", None) if cold is not None else None
    stats = getattr(be, "load_stats", None) or {}
    ls = {k: (round(v * 1e3, 2) if isinstance(v, float) else v) for k, v in stats.items()
          if isinstance(v, (int, float))}
    if os.environ.get("SUMMARY") == "1":  # one line a load (vk-cold-diag-ab.sh)
        if r or os.environ.get("FIRST") == "1":  # FIRST=1: the process's first load too (a daemon's first after start)
            print(f"SUMMARY cold {t * 1e3:6.1f} load() {1e3 * (t_load - t0):5.1f} upload {ls.get('upload_s', 0):6.2f} "
                  f"alloc {ls.get('alloc_s', 0):5.2f} first_run {cs.get('first_run_s', 0):6.2f}")
        m.close()
        continue
    print(f"round {r} {'(sampled)' if profile else ''} cold_ms {t * 1e3:.1f} load() {1e3 * (t_load - t0):.1f}")
    print("  cold_stats(ms)", cs)
    print("  load_stats(ms)", ls)
    if cold is not None:
        tl = cold.run.timeline()
        by: dict[str, list[float]] = collections.defaultdict(list)
        for e in tl:
            by[e["kind"]].append((e["t1"] - e["t0"]) * 1e3)
        print("  timeline", {k: (len(v), round(sum(v), 2), round(max(v), 3)) for k, v in by.items()})
        prep = sorted(((e["t1"] - e["t0"]) * 1e3, e["layer"]) for e in tl if e["kind"] == "prepare")[-6:]
        print("  slowest prepares", [(round(a, 3), b) for a, b in prep])
    if profile:
        s.join()
        print("  samples", n[0])
        for (th, fn), k in ours.most_common(40):
            print(f"  {k:5d} {th[:14]:14} {fn}")
    m.close()
