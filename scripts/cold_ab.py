#!/usr/bin/env python3
"""A/B of one zoo model's cold load between two source trees: each tree compiles its own package, then fresh
processes alternate (old, new, old, ...), each in a daemon's state (loader threads up, host pool faulted in),
the package's files dropped from the page cache, timing ``inferd.load`` + the first run.

    python scripts/cold_ab.py vad_lstm --old /tmp/wtpkg [--new ""] [--rounds 7] [--via-cache] [--reload]
                              [--rehearse] [--same-package]

``--reload``: each child first loads, runs and closes the package (its refinement done), then the timed load is a
reload, as a daemon's model dropped by its memory budget is loaded again.

``--rehearse``: each child rehearses a cold load first, as a daemon's start does (``runtime.rehearsal``).
``--same-package``: both sides load the package the new tree compiled (each tree's own compile measures its own
profile, and two plans differ by more than most changes to the load path).

``--old`` / ``--new``: a folder holding an ``inferd`` package (a worktree's ``daemon`` linked as ``inferd``;
empty: the checkout's own). ``--via-cache``: each tree's package sits in a package cache and the child loads the
ONNX file with ``cache_dir`` (the daemon's path) instead of the package folder. Prints one line per run and the
medians; ``--json`` writes them.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = r'''
import glob, json, sys, time
import inferd
from inferd.bench.common import daemon_state, drop_page_cache
from inferd.bench.recurrent_bench import _feeds
name, pkg, RELOAD, REHEARSE = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1"
src = sys.argv[5] if len(sys.argv) > 5 else ""  # the ONNX file, loaded through the cache that holds pkg
daemon_state("cpu", 0, 0, 256 << 20, claim_cores=True, rehearse=REHEARSE)  # a daemon's default host pool
from pathlib import Path
import numpy as np
from inferd.ir import dtype_from_tag
from inferd.package import read_plan
d = read_plan(Path(pkg) / "plan.bin")  # the inputs at the package's shape (a dynamic batch dimension included)
if name in ("vad_lstm", "kws_gru", "crnn_lstm"):
    feeds = _feeds(name)  # an int64 sample rate, a state: the values the bench gives them
else:
    rng = np.random.default_rng(0)
    feeds = {r[0]: rng.standard_normal(r[1]).astype(dtype_from_tag(r[2])) for r in d["inputs"]}
def _load():
    return inferd.load(src, device="cpu", cache_dir=str(Path(pkg).parent)) if src else inferd.load(pkg, device="cpu")
if RELOAD:  # a daemon's model dropped and asked for again: this process served it before
    m0 = _load()
    m0.run(feeds)
    if getattr(m0, "refine_done", None) is not None:
        m0.refine_done.wait(60)
    m0.close()
    del m0
for f in glob.glob(pkg + "/*"):
    drop_page_cache(f)
t0 = time.perf_counter()
m = _load()
t_load = time.perf_counter() - t0
m.run(feeds)
t = time.perf_counter() - t0
st = {k: v for k, v in dict(m.cold_stats).items() if isinstance(v, (int, float))}
print(json.dumps({"cold_ms": t * 1e3, "load_ms": t_load * 1e3, "plan_predicted_ms": m.plan.predicted_s * 1e3,
                  "cold_s_ms": st.get("cold_s", 0) * 1e3}))
'''

_COMPILE = "import sys\nfrom inferd.package import compile_model\ncompile_model(sys.argv[1], sys.argv[2])\n"
_CACHE = "import sys\nfrom inferd.package import cached_package\nprint(cached_package(sys.argv[1], sys.argv[2]))\n"


def _env(path: str) -> dict[str, str]:
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = path
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", default="")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default="")
    ap.add_argument("--via-cache", action="store_true")
    ap.add_argument("--rehearse", action="store_true", help="each child rehearses a cold load first (a daemon's start)")
    ap.add_argument("--same-package", action="store_true", help="both sides load the new tree's package")
    ap.add_argument("--reload", action="store_true",
                    help="each child loads, runs and closes the package once before the timed load (a reload)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cold_ab_"))
    write = "import sys\nfrom inferd import zoo\nzoo.write_zoo(sys.argv[1], [sys.argv[2]])"
    subprocess.run([sys.executable, "-c", write, str(work / "zoo"), args.model], check=True)
    src = next((work / "zoo").glob(f"{args.model}*.onnx"))
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    pkgs: dict[str, list[str]] = {}
    for side, path in (("old", args.old), ("new", args.new)):
        if args.via_cache:
            made = subprocess.run([sys.executable, "-c", _CACHE, str(src), str(work / side)], check=True,
                                  env=_env(path), capture_output=True, text=True).stdout.strip().splitlines()[-1]
            pkgs[side] = [made, str(src)]
        else:
            subprocess.run([sys.executable, "-c", _COMPILE, str(src), str(work / side)], check=True, env=_env(path))
            pkgs[side] = [str(work / side)]
    if args.same_package:
        if args.via_cache:
            ap.error("--same-package loads package folders: not with --via-cache")
        shutil.rmtree(work / "old")
        shutil.copytree(work / "new", work / "old")
    for _ in range(args.rounds):
        for side, path in (("old", args.old), ("new", args.new)):
            child = [sys.executable, "-c", _CHILD, args.model, pkgs[side][0], "1" if args.reload else "0",
                     "1" if args.rehearse else "0", *pkgs[side][1:]]
            out = subprocess.run(child, check=True,
                                 env=_env(path), capture_output=True, text=True).stdout.strip().splitlines()[-1]
            r = json.loads(out)
            runs[side].append(r)
            print(side, {k: round(v, 2) for k, v in r.items()}, flush=True)
    summary = {side: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for side, rs in runs.items()}
    for side, s in summary.items():
        print(f"{side}: median " + ", ".join(f"{k} {v:.2f}" for k, v in s.items()))
    # each round's new / old: the VM's speed drifts between rounds, less within one
    pairs = [n["cold_ms"] / o["cold_ms"] for o, n in zip(runs["old"], runs["new"])]
    faster = sum(p < 1 for p in pairs)
    print(f"new / old per round: median {statistics.median(pairs):.3f}, new faster in {faster} of {len(pairs)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "runs": runs, "median": summary,
                                               "pair_ratio_median": statistics.median(pairs), "new_faster": faster,
                                               "rehearse": args.rehearse, "same_package": args.same_package},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
