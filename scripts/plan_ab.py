"""Two plans of the same model in one process, timed layer by layer in alternating rounds.

A planner change (a layout rule, a kernel preference) moves some layers to other kernels and adds or removes
conversions. On the shared 2-vCPU VM whole-model timings of separate processes move 1.5-2x within minutes; two
plans loaded in one process and timed in turns see the same spells, and the executor's per-layer timing
(``run_timed``) shows which layers the change moved and what each now takes.

    python scripts/plan_ab.py --models resnet50,resnet18 --rounds 20 \\
        --base 'inferd.planner.layout:_wide_tiles=lambda: False'

``--base`` (and ``--new``) patch a module attribute with a Python expression while that arm's model loads (the
plan is made at load; the patch is undone after); several patches are joined by `` && `` (a lone conv blocked:
``--new 'inferd.planner.layout:_saving=lambda *a: 1.0 && inferd.planner.layout:ALONE_PATHS=("winograd",)'``).
Per round each arm runs ``--runs`` timed runs (per-layer medians); a second pass times whole runs the same way.
Prints, per model, the layers whose kernel differs, the layers only one arm has (conversions), the sum of the
layers and the whole run: medians and the median of the rounds' ratios (new / base) with their range.
``--json`` writes it all.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from typing import Any

import numpy as np


def _patch(spec: str | None) -> tuple[Any, str, Any] | None:
    if not spec:
        return None
    target, expr = spec.split("=", 1)
    mod, attr = target.split(":")
    m = importlib.import_module(mod)
    old = getattr(m, attr)
    setattr(m, attr, eval(expr))  # noqa: S307 - a developer's own expression from the command line
    return m, attr, old


def _load(path: str, spec: str | None) -> tuple[Any, dict[str, np.ndarray]]:
    import inferd

    done = []
    try:
        # several patches an arm: ``a:b=1 && c:d=2``, applied in order and undone in reverse
        for one in (spec or "").split(" && "):
            p = _patch(one.strip())
            if p is not None:
                done.append(p)
        m = inferd.load(path, device="cpu")
    finally:
        for mod, attr, old in reversed(done):
            setattr(mod, attr, old)
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([d if isinstance(d, int) and d > 0 else 1 for d in i.shape])
             .astype(np.float32) for i in m.inputs}
    m.run(feeds)
    m.wait_warm(60)
    return m, feeds


def _ratio(new: list[float], base: list[float]) -> dict[str, float]:
    r = np.array(new) / np.array(base)
    return {"new_ms": float(np.median(new)) * 1e3, "base_ms": float(np.median(base)) * 1e3,
            "ratio": float(np.median(r)), "lo": float(r.min()), "hi": float(r.max())}


def ab(path: str, base: str | None, new: str | None, rounds: int, runs: int) -> dict[str, Any]:
    arms = {"base": _load(path, base), "new": _load(path, new)}
    kern = {a: {lay.name: k.name for lay, k in m._exec.choice} for a, (m, _) in arms.items()}
    out_b, out_n = (arms[a][0].run(arms[a][1]) for a in ("base", "new"))
    seq = (lambda o: list(o.values()) if isinstance(o, dict) else list(o))
    maxdiff = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(seq(out_b), seq(out_n)))
    per: dict[str, list[dict[str, float]]] = {"base": [], "new": []}
    whole: dict[str, list[float]] = {"base": [], "new": []}
    for r in range(rounds):
        for arm in (("base", "new") if r % 2 == 0 else ("new", "base")):
            m, feeds = arms[arm]
            ex = m._exec
            med = np.median(np.array([ex.run_timed(feeds)[1] for _ in range(runs)]), axis=0)
            per[arm].append({lay.name: float(v) for (lay, _k), v in zip(ex.choice, med)})
    for r in range(rounds):
        for arm in (("base", "new") if r % 2 == 0 else ("new", "base")):
            m, feeds = arms[arm]
            for _ in range(2):
                m.run(feeds)
            ts = []
            for _ in range(runs):
                t = time.perf_counter()
                m.run(feeds)
                ts.append(time.perf_counter() - t)
            whole[arm].append(float(np.median(ts)))
    changed = [n for n in kern["new"] if n in kern["base"] and kern["new"][n] != kern["base"][n]]
    only_new = [n for n in kern["new"] if n not in kern["base"]]
    only_base = [n for n in kern["base"] if n not in kern["new"]]
    for m, _ in arms.values():
        m.close()
    return {
        "max_abs_diff": maxdiff,
        "changed": [{"layer": n, "base": kern["base"][n], "new": kern["new"][n],
                     **_ratio([d[n] for d in per["new"]], [d[n] for d in per["base"]])} for n in changed],
        "only_new": {"layers": only_new, "ms": float(np.median([sum(d[n] for n in only_new)
                                                                 for d in per["new"]])) * 1e3},
        "only_base": {"layers": only_base, "ms": float(np.median([sum(d[n] for n in only_base)
                                                                   for d in per["base"]])) * 1e3},
        "sum_of_layers": _ratio([sum(d.values()) for d in per["new"]], [sum(d.values()) for d in per["base"]]),
        "whole": _ratio(whole["new"], whole["base"]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", required=True, help="zoo names or .onnx paths, comma-separated")
    p.add_argument("--base", default=None, help="module:attr=expression patched while the base arm loads")
    p.add_argument("--new", default=None, help="the same for the new arm")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--runs", type=int, default=6, help="timed runs per arm and round")
    p.add_argument("--zoo-dir", default="/tmp/inferd-bench-zoo")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    from inferd.zoo import write_zoo

    names = [n for n in a.models.split(",") if n]
    paths = {**write_zoo(a.zoo_dir, [n for n in names if not n.endswith(".onnx")]),
             **{n: n for n in names if n.endswith(".onnx")}}
    res = {}
    for n in names:
        r = res[n] = ab(str(paths[n]), a.base, a.new, a.rounds, a.runs)
        print(f"{n}: max |new - base| {r['max_abs_diff']:.1e}")
        for c in r["changed"]:
            print(f"  {c['layer']:40s} {c['base']:>12s} {c['base_ms']:7.3f} ms -> {c['new']:>12s} {c['new_ms']:7.3f} ms"
                  f"  {c['ratio']:.3f} ({c['lo']:.2f}-{c['hi']:.2f})")
        print(f"  only in new: {len(r['only_new']['layers'])} layers, {r['only_new']['ms']:.3f} ms; only in base: "
              f"{len(r['only_base']['layers'])}, {r['only_base']['ms']:.3f} ms")
        for k in ("sum_of_layers", "whole"):
            s = r[k]
            print(f"  {k}: {s['base_ms']:.2f} -> {s['new_ms']:.2f} ms, {s['ratio']:.3f} ({s['lo']:.2f}-{s['hi']:.2f})")
        sys.stdout.flush()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": sys.argv[1:], "models": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
