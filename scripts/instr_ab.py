"""Instruction counts of a Python code path, for A/Bs the 2-core VM's noise cannot resolve.

The shared VM's speed moves 1.5-2x within minutes: two timings of the same whole-model prediction, a cold
load's open or a daemon request disagree by more than most changes to them. Callgrind's instruction counts
do not move with it (repeatable to 0.1-0.5% run to run where the path is single-threaded and timing-blind),
and ``--toggle-collect`` limits them to one C function: here ``math.fsum``, through which :func:`window`
runs the code being measured, so the interpreter's start-up, the imports and the set-up are not counted.

    python scripts/instr_ab.py predict --arms base=/tmp/pp/base,head=/tmp/pp/head --models 3 --reps 3
    python scripts/instr_ab.py load --arms head=/tmp/pp/head --package /tmp/pk_squeezenet1_1 [--run]

Each arm is a directory that holds ``inferd`` (and ``inferd_client``), put first on ``PYTHONPATH`` (a worktree's
``daemon`` linked as ``inferd``: ``ln -s <tree>/daemon <dir>/inferd``). Prints the main thread's instructions per
repetition and the ratio of each arm to the first.

Caveats: valgrind hides AVX-512 from the process, so a CPU package compiled outside it is stale inside (another
``gemm_isa`` in its fingerprint) and its load rebuilds it: compile the packages a ``load`` A/B opens under
valgrind (``--prepare``: ``valgrind --tool=none``, three loads). Where threads decide by timing (the cold
runtime's stealing, a thread-count trial) the counts move by a few percent; instructions are not time for SIMD
or crypto code either (a SHA-256 runs without SHA-NI under valgrind): use this for the Python between them.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

TOGGLE = "math_fsum"


def window(fn: Callable[[], Any], reps: int = 1) -> list[Any]:
    """``fn()`` ``reps`` times inside ``math.fsum``: the only code a ``--toggle-collect=math_fsum`` run counts."""
    out: list[Any] = []

    def gen() -> Any:
        for _ in range(reps):
            out.append(fn())
            yield 0.0
    math.fsum(gen())
    return out


# ------------------------------------------------------------------ the measured programs (run under valgrind)

def _child_predict(models: int, reps: int) -> None:
    """Whole-model Vulkan predictions of the slowest held-out variant families, each from a fresh cost model with
    the dispatch cache cleared (as ``inferd bench predictor`` times them); the predictor is the one given, or a
    roofline-only stand-in (the features are what is measured)."""
    from inferd.frontend import import_template, specialize
    from inferd.ops.base import Layer, choose_kernel
    from inferd.predictor.cost import PredictedCost, predict_warm
    from inferd.predictor.features import _DISPATCHES
    from inferd.predictor.model import Predictor
    from inferd.predictor.train import executed_layers
    from inferd.vulkan.executor import _import_kernels
    from inferd.zoo._variants import build_variant, variant_specs

    _import_kernels()
    pred = Predictor.load(os.environ["INSTR_PREDICTOR"])
    names = ["efficientnet_w075_r192_d100_k3", "efficientnet_w035_r192_d075_k5", "vit_w050_r192_d075_k5",
             "efficientnet_w100_r160_d075_k7", "efficientnet_w035_r128_d100_k7"][:models]
    work = []
    for s in variant_specs(240):
        if s.name in names:
            g = specialize(import_template(build_variant(s)))
            ks = {}
            for n in g.nodes:
                try:
                    ks[n.name] = choose_kernel(Layer.of(n, g), "vulkan").name
                except Exception:  # noqa: BLE001 - a node no Vulkan kernel takes runs elsewhere
                    pass
            work.append((g, executed_layers(g, ks, "vulkan")))
    for g, layers in work:  # module caches and imports first
        predict_warm(layers, PredictedCost(pred, threads=1, constants=g.constants))

    def all_models() -> float:
        tot = 0.0
        for g, layers in work:
            _DISPATCHES.clear()
            tot += predict_warm(layers, PredictedCost(pred, threads=1, constants=g.constants))
        return tot
    print("predicted", sum(window(all_models, reps)))


def _child_load(package: str, run: bool) -> None:
    """``inferd.load`` of a package (files cached), after the daemon's start-up state; ``run``: the first run too
    (counted with the load)."""
    import numpy as np

    import inferd
    from inferd.bench.common import daemon_state
    from inferd.runtime.codepages import import_load_path

    import_load_path()
    daemon_state("cpu", 0, 0, 64 << 20, claim_cores=False, rehearse=True)
    x: dict[str, Any] = {}

    def load() -> None:
        m = inferd.load(package, device="cpu")
        if run:
            m.run({i.name: np.zeros(i.shape, i.dtype) for i in m.inputs})
        x["m"] = m
    window(load)
    m = x["m"]
    m.wait_loaded()
    if getattr(m, "refine_done", None) is not None:
        m.refine_done.wait(120)
    print("loaded", m.name)


# ------------------------------------------------------------------ the driver

def _count(out_prefix: str) -> int:
    """The main thread's instructions in a ``--separate-threads=yes`` run (its file's summary line reads 0 where
    collection was toggled: callgrind_annotate sums the costs)."""
    ann = subprocess.run(["callgrind_annotate", out_prefix + "-01"], capture_output=True, text=True).stdout
    m = re.search(r"([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", ann)
    return int(m.group(1).replace(",", "")) if m else 0


def _run_arm(path: str, child: list[str], env_extra: dict[str, str]) -> int:
    tmp = tempfile.mkdtemp(prefix="instr.")
    out = os.path.join(tmp, "cg.out")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(env_extra, PYTHONPATH=path, PYTHONHASHSEED="0")
    cmd = ["valgrind", "--tool=callgrind", f"--toggle-collect={TOGGLE}", "--separate-threads=yes",
           f"--callgrind-out-file={out}", sys.executable, __file__, *child]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{path}: the child failed:\n{r.stderr[-3000:]}")
    try:
        return _count(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["predict", "load", "_child"])
    ap.add_argument("--arms", default="head=" + str(Path(__file__).resolve().parent.parent / ".instr" / "head"),
                    help="name=PYTHONPATH,... (the first is the reference)")
    ap.add_argument("--models", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--predictor", default=None, help="a Vulkan predictor file (predict)")
    ap.add_argument("--package", default=None, help="a compiled CPU package (load), copied afresh for each arm")
    ap.add_argument("--run", action="store_true", help="load: count the first run too")
    ap.add_argument("--prepare", action="store_true", help="load: compile the package under valgrind first")
    ap.add_argument("--child", nargs=argparse.REMAINDER, default=[])
    args = ap.parse_args(argv)
    if args.what == "_child":
        kind, *rest = args.child
        if kind == "predict":
            _child_predict(int(rest[0]), int(rest[1]))
        else:
            _child_load(rest[0], rest[1] == "1")
        return 0
    arms = [a.split("=", 1) for a in args.arms.split(",")]
    env: dict[str, str] = {}
    if args.what == "predict":
        if not args.predictor:
            sys.exit("predict needs --predictor (inferd predictor train --device vulkan --minutes 2 --out FILE)")
        env["INSTR_PREDICTOR"] = args.predictor
        child = ["_child", "--child", "predict", str(args.models), str(args.reps)]
        per = args.reps
    else:
        if not args.package:
            sys.exit("load needs --package")
        if args.prepare:
            subprocess.run(["valgrind", "--tool=none", "-q", sys.executable, "-c",
                            "import sys, inferd, numpy as np\n"
                            "for _ in range(3):\n"
                            "    m = inferd.load(sys.argv[1], device='cpu')\n"
                            "    m.run({i.name: np.zeros(i.shape, i.dtype) for i in m.inputs}); m.wait_loaded()\n"
                            "    r = getattr(m, 'refine_done', None)\n"
                            "    r is not None and r.wait(120); m.close()\n", args.package],
                           env={**os.environ, "PYTHONPATH": arms[0][1]}, check=True)
        per = 1
    ref = None
    for name, path in arms:
        if args.what == "load":
            copy = tempfile.mkdtemp(prefix="instr.pkg.")
            shutil.rmtree(copy)
            shutil.copytree(args.package, copy)
            child = ["_child", "--child", "load", copy, "1" if args.run else "0"]
        n = _run_arm(path, child, env) // per
        if args.what == "load":
            shutil.rmtree(copy, ignore_errors=True)
        ref = ref or n
        print(f"{name}: {n:,} instructions per repetition ({n / ref:.3f} x {arms[0][0]})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
