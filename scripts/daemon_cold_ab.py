#!/usr/bin/env python3
"""A/B of a daemon's cold request between two source trees: per round a fresh ``inferd serve --no-preload`` of each
tree (a 256 MiB host pool, as a service has it) whose package an earlier daemon of that tree cached, the package's
files dropped from the page cache one second after ready, then one client's first ``infer`` timed; the trees
alternate. The reply's ``queue_us`` (receipt to the first run's start: the load) is kept beside it.

    [RELOAD=1] python scripts/daemon_cold_ab.py MODEL ROUNDS OLD_TREE [OUT.json]

RELOAD=1: each daemon then unloads the model, drops its files and times its load call and a request (a reload).

OLD_TREE: a folder holding an ``inferd`` package (a worktree's ``daemon`` linked as ``inferd``); the new tree is
the checkout's own.
"""
from __future__ import annotations

import glob
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from inferd import zoo
from inferd.bench.common import drop_page_cache
from inferd.server.testing import DaemonProcess
from inferd_client import Client

SYSTEMD_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "INVOCATION_ID", "JOURNAL_STREAM")


#: also time a reload in each daemon: the model unloaded after its first request, its files dropped, loaded again
RELOAD = os.environ.get("RELOAD", "") == "1"


def main() -> int:
    name, rounds, old = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    tmp = Path(tempfile.mkdtemp(prefix="ifdab", dir="/tmp"))
    models = zoo.write_zoo(tmp / "m", [name])[name].parent
    base = {k: v for k, v in os.environ.items() if k not in (*SYSTEMD_VARS, "PYTHONPATH")}
    base.update(INFERD_MEMORY_PRESSURE="off", INFERD_HOST_POOL=str(256 << 20), INFERD_RESIDENT_PIPELINES="0")
    envs = {"old": {**base, "PYTHONPATH": old}, "new": base}
    res: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for side, env in envs.items():  # each tree compiles (and refines) its own package
        with DaemonProcess(f"ipc://{tmp}/w{side}.sock", models, "--cache-dir", str(tmp / f"cache_{side}"), env=env,
                           log_path=tmp / f"w{side}.log") as d, Client(d.endpoint, timeout=60) as c:
            spec = c.models()[0]["inputs"][0]
            x = np.random.default_rng(0).standard_normal(spec["shape"]).astype(np.float32)
            c.infer(name, {spec["name"]: x})
            time.sleep(3)  # its idle-time work done
    for r in range(rounds):
        for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
            cache = tmp / f"cache_{side}"
            with DaemonProcess(f"ipc://{tmp}/d{side}{r}.sock", models, "--cache-dir", str(cache), "--no-preload",
                               env=envs[side], log_path=tmp / f"d{side}{r}.log") as d, \
                    Client(d.endpoint, timeout=60) as c:
                time.sleep(1.0)
                for f in glob.glob(str(cache) + "/**/*.*", recursive=True):
                    drop_page_cache(f)
                t = time.perf_counter()
                _out, info = c.infer_with_info(name, {spec["name"]: x})
                dt = (time.perf_counter() - t) * 1e3
                t = time.perf_counter()
                c.infer(name, {spec["name"]: x})
                row = {"cold_request_ms": dt, "queue_ms": info.get("queue_us", 0) / 1e3,
                       "compute_ms": info.get("compute_us", 0) / 1e3, "next_ms": (time.perf_counter() - t) * 1e3}
                if RELOAD:
                    # the model dropped (as its memory budget or an idle timeout drops it) and asked for again
                    time.sleep(2.0)  # its idle-time work done
                    c.unload(name)
                    time.sleep(0.5)
                    for f in glob.glob(str(cache) + "/**/*.*", recursive=True):
                        drop_page_cache(f)
                    t = time.perf_counter()
                    c.load(name)  # (a model unloaded by request is served again once asked to load)
                    _out, info = c.infer_with_info(name, {spec["name"]: x})
                    row.update(reload_request_ms=(time.perf_counter() - t) * 1e3,
                               reload_queue_ms=info.get("queue_us", 0) / 1e3)
                res[side].append(row)
                print(side, {k: round(v, 2) for k, v in res[side][-1].items()}, flush=True)
    med = {s: {k: float(np.median([r[k] for r in v])) for k in v[0]} for s, v in res.items()}
    print(json.dumps(med))
    if len(sys.argv) > 4:
        Path(sys.argv[4]).write_text(json.dumps({"model": name, "runs": res, "median": med}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
