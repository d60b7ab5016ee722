"""Where a cold load's host time goes, per thread: a profile of ``inferd.load`` + first inference of a compiled
package in the state of a daemon that is up (as ``inferd bench cold`` times it), with the cold run's timeline.

Usage (a lent GPU machine, after ``source .gl/run.sh``; yappi from .gl/wheels)::

    python3 scripts/device/profile_cold.py --models squeezenet1_1,mobilenetv2 --out $OUT [--runs 3]

Each run is a fresh process (page cache of the package dropped): the first compiles and fills the caches and
the device's pipeline list; the rest are profiled. Prints the timeline of the last run and, per thread, the
functions with the most own time (wall clock: a thread waiting for the GIL shows it in the function it waits
in) and with CPU clock. A development tool: its output is for reading, not a result file.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, os, sys, time
import numpy as np
spec = json.loads(sys.argv[1])
import inferd
from inferd.runtime.codepages import import_load_path
import_load_path()
from inferd.vulkan import import_load_path as vlp
vlp()
from inferd.bench.common import daemon_state, drop_page_cache
res = daemon_state("vulkan", 64 << 20, 128, 256 << 20, claim_cores=True)
pkg = spec["pkg"]
for f in os.listdir(pkg):
    drop_page_cache(os.path.join(pkg, f))
x = np.random.default_rng(0).standard_normal(spec["shape"]).astype(np.float32)
time.sleep(0.3)
prof = spec.get("clock")
if prof:
    import yappi
    yappi.set_clock_type(prof)
    yappi.start()
t0 = time.perf_counter()
m = inferd.load(pkg, device="vulkan")
t1 = time.perf_counter()
m.run({m.input_names[0]: x})
t2 = time.perf_counter()
if prof:
    yappi.stop()
cr = getattr(getattr(m, "_cold", None), "run", None)
off = (cr.t_start - t0) if cr is not None else 0.0
out = {"resident": res, "load_ms": (t1 - t0) * 1e3, "total_ms": (t2 - t0) * 1e3, "plan_start_ms": off * 1e3,
       "stats": {k: v for k, v in dict(m.cold_stats).items() if isinstance(v, (int, float))},
       "timeline": [{**e, "t0": e["t0"] + off, "t1": e["t1"] + off} for e in (cr.timeline() if cr else [])]}
if prof:
    threads = []
    for t in yappi.get_thread_stats():
        st = yappi.get_func_stats(ctx_id=t.id)
        st.sort("tsub")
        threads.append({"name": t.name, "total_ms": t.ttot * 1e3,
                        "top": [(f.tsub * 1e3, f.ttot * 1e3, f.ncall, f"{f.module.split('/')[-1]}:{f.lineno} {f.name}")
                                for f in list(st)[:spec.get("top", 25)]]})
    out["threads"] = threads
m.close()
from inferd.vulkan.device import close_shared_device
close_shared_device()
print("RESULT " + json.dumps(out))
"""


def run(spec: dict, env: dict) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], env=env, capture_output=True, text=True,
                       timeout=300)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"child failed ({p.returncode}): {p.stderr[-3000:]}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="squeezenet1_1,mobilenetv2")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default="/tmp/profile-cold")
    ap.add_argument("--work", default="/tmp/profile-cold-work")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    from inferd.bench.cold_bench import compile_package
    from inferd.zoo import write_zoo

    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, INFERD_CACHE_DIR=str(work / "cache"))
    names = [n for n in a.models.split(",") if n]
    paths = write_zoo(work / "zoo", names)
    report: dict = {}
    for n in names:
        pkg = work / f"{n}.pkg"
        compile_package(paths[n], pkg, "vulkan")
        import onnx

        inp = onnx.load(str(paths[n])).graph.input[0]
        shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
        spec = {"pkg": str(pkg), "shape": shape, "top": a.top}
        run(spec, env)  # fills the shader caches and the device's pipeline list
        rs = [run(spec, env) for _ in range(a.runs)]  # unprofiled: the times
        rw = run({**spec, "clock": "wall"}, env)
        rc = run({**spec, "clock": "cpu"}, env)
        report[n] = {"runs": rs, "wall": rw, "cpu": rc}
        ms = {k: [round(r[k], 1) for r in rs] for k in ("total_ms", "load_ms", "plan_start_ms")}
        print(f"== {n}: total ms {ms['total_ms']}, load() {ms['load_ms']}, plan start {ms['plan_start_ms']}")
        print("   stats", rs[-1]["stats"])
        for e in rs[-1]["timeline"]:
            print(f"   {e['thread'][:14]:14s} {e['kind']:8s} {e['layer'][:34]:34s} {e['t0'] * 1e3:7.2f} "
                  f"{(e['t1'] - e['t0']) * 1e3:6.2f}")
        for label, r in (("wall", rw), ("cpu", rc)):
            print(f"   -- {label} clock (profiled run: total {r['total_ms']:.1f} ms)")
            for t in r["threads"]:
                if t["total_ms"] < 1:
                    continue
                print(f"   THREAD {t['name']} {t['total_ms']:.1f} ms")
                for tsub, ttot, nc, fn in t["top"]:
                    print(f"      own {tsub:7.2f} tot {ttot:7.2f} n {nc:5d} {fn}")
    (out / f"profile_cold_{time.strftime('%Y%m%dT%H%M%S')}.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
