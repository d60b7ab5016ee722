"""``inferd bench shapes``: models with dynamic input dimensions.

For each dynamic zoo model, from its compiled package on ``--device``:

* cold load: a fresh process (libraries imported, page cache of the package dropped) loads the model
  and answers one request at its first shape; median of ``--cold-repeat`` processes;
* a new shape for the resident model: the time ``Model.prepare`` takes to plan it (specialise the
  graph, choose kernels, plan the arena, on a GPU record its commands) over the resident weights, and
  the first request at that shape, against the cold load;
* warm latency at three shapes against onnxruntime (default session, all graph optimisations, the
  same thread count) at the same shapes, in the same process, alternating.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import fmt, machine_info, median_ms, ratio, time_calls, write_results

#: new shapes per model (the first shape is the package's: batch 1 and 224 for every other dynamic dimension)
SHAPES: dict[str, list[tuple[int, ...]]] = {
    "detnet_dyn": [(1, 3, 320, 320), (1, 3, 480, 640), (2, 3, 160, 160)],
    "recnet_dyn": [(1, 3, 32, 100), (1, 3, 32, 400), (4, 3, 32, 160)],
}

_COLD_CHILD = r"""
import json, sys, time, glob
import numpy as np
import inferd, inferd.package, inferd.runtime.cold, inferd.runtime.cpu, inferd.frontend.shapes
from inferd.runtime import pagecache
from inferd.runtime.scheduler import default_loaders, loader_pool
pkg, device, shape = sys.argv[1], sys.argv[2], tuple(json.loads(sys.argv[3]))
loader_pool().set_size(default_loaders())
if device == "vulkan":
    import inferd.vulkan.cold
    from inferd.vulkan.device import get_device
    get_device()
pagecache.drop(glob.glob(pkg + "/*"))
x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
from inferd.planner.plan import PlanOptions
t0 = time.perf_counter()
m = inferd.load(pkg, device=device, cold=PlanOptions(warm_switch=False))
m.run({m.input_names[0]: x})
print(json.dumps({"cold_ms": (time.perf_counter() - t0) * 1e3}))
"""


def _cold_ms(pkg: Path, device: str, shape: tuple[int, ...], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        r = subprocess.run([sys.executable, "-c", _COLD_CHILD, str(pkg), device, json.dumps(list(shape))],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"cold child failed: {r.stderr[-2000:]}")
        out.append(float(json.loads(r.stdout.strip().splitlines()[-1])["cold_ms"]))
    return out


def _ort(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def base_shape(pkg: Path) -> tuple[int, ...]:
    """The shape a package's model is planned at (its first input's, as recorded)."""
    from inferd.package import read_plan

    return tuple(read_plan(pkg / "plan.bin")["inputs"][0][1])


def bench_model(name: str, device: str, work: Path, repeat: int, cold_repeat: int, threads: int,
                prepare_repeat: int = 5) -> dict[str, Any]:
    import inferd
    from inferd.package import cached_package
    from inferd.zoo import write_zoo

    src = write_zoo(work / "zoo", [name])[name]
    pkg = cached_package(src, work / "cache", device=device)
    cold = _cold_ms(pkg, device, base_shape(pkg), cold_repeat)
    rng = np.random.default_rng(1)

    def resident() -> Any:
        """The model loaded from its package, answered once, idle-time work (warm switch, plan
        refinement) finished: what a daemon holds when a request at a new shape comes."""
        m = inferd.load(pkg, device=device)
        m.run({"input": rng.standard_normal(m.inputs[0].shape).astype(np.float32)})
        m.wait_warm(60)
        if m.refine_done is not None:
            m.refine_done.wait(60)
        return m

    # the time to prepare a shape, median over fresh resident models (one prepare each per shape)
    prep: dict[tuple[int, ...], list[float]] = {s: [] for s in SHAPES[name]}
    for _ in range(prepare_repeat):
        m = resident()
        for shape in SHAPES[name]:
            t = time.perf_counter()
            m.prepare([{"input": shape}])
            prep[shape].append((time.perf_counter() - t) * 1e3)
        m.close()
    m = resident()
    base = tuple(m.inputs[0].shape)
    sess = _ort(src, threads)
    rows = []
    for shape in [base] + SHAPES[name]:
        x = {"input": rng.standard_normal(shape).astype(np.float32)}
        row: dict[str, Any] = {"shape": list(shape)}
        if shape != base:
            (v,) = m.prepare([{"input": shape}])
            row["prepare_ms"] = statistics.median(prep[shape])
            row["prepare_runs_ms"] = [round(x, 3) for x in prep[shape]]
            t = time.perf_counter()
            y = m.run(x)["output"]
            row["first_run_ms"] = (time.perf_counter() - t) * 1e3
            row["shared_layers"], row["own_layers"] = v.shared, v.own
            row["variant_bytes"] = v.memory_bytes
        else:
            y = m.run(x)["output"]
        ref = sess.run(None, x)[0]
        row["max_rel_err"] = float(np.abs(y - ref).max() / max(float(np.abs(ref).max()), 1e-30))
        # alternate the two engines in rounds, so that a noisy neighbour hits both alike
        a, b = [], []
        for _ in range(3):
            a += time_calls(lambda: m.run(x), max(1, repeat // 3), warmup=2)
            b += time_calls(lambda: sess.run(None, x), max(1, repeat // 3), warmup=2)
        row["inferd_warm_ms"], row["ort_warm_ms"] = median_ms(a), median_ms(b)
        row["warm_ratio"] = ratio(row["inferd_warm_ms"], row["ort_warm_ms"])
        rows.append(row)
    out = {"model": name, "device": device, "first_shape": list(base), "cold_ms": statistics.median(cold),
           "cold_runs_ms": cold, "memory_bytes": m.memory_bytes, "rows": rows}
    m.close()
    return out


def table(data: dict[str, Any]) -> str:
    mi = data["machine"]
    gpu = f" ({data['gpu']})" if data.get("gpu") else ""
    lines = [f"# inferd with dynamic input dimensions, {data['device']}{gpu}", "",
             f"Date {mi['date']}; {mi['cpu']}, {mi['cores']} cores; onnxruntime {data.get('onnxruntime')}; "
             f"{data['threads']} threads for both engines; inferd at {data.get('commit', '?')}; load average at "
             f"the start {mi.get('loadavg', '?')} (other work on the machine), at the end {data.get('loadavg_end', '?')}.",
             "",
             "Cold = a fresh process (libraries imported, the package's page cache dropped) loads the compiled package "
             "and answers one request at the first shape (median of "
             f"{data['cold_repeat']}). New shape = `Model.prepare` on the resident model (the graph specialised, "
             "kernels chosen, the arena planned, on a GPU the commands recorded; the weights are the resident "
             "shape's; median over 5 freshly loaded, answered and idle models), then the first request at it "
             "(first touch of the new arena). Warm = median of "
             f"{data['repeat']} runs, inferd and onnxruntime alternating in 3 rounds.", "",
             "| model | shape | prepare ms | / cold | first run ms | layers sharing weights (own) | variant MiB | "
             "inferd warm ms | onnxruntime warm ms | inferd / ort | max rel err |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in data["results"]:
        for row in r["rows"]:
            first = "prepare_ms" not in row
            shape = "x".join(str(d) for d in row["shape"]) + (" (first, cold " + fmt(r["cold_ms"]) + " ms)" if first else "")
            lines.append(
                f"| {r['model']} | {shape} | {fmt(row.get('prepare_ms'), '.2f')} | "
                f"{fmt(ratio(row.get('prepare_ms'), r['cold_ms']), '.3f')} | {fmt(row.get('first_run_ms'), '.2f')} | "
                f"{row.get('shared_layers', '-')} ({row.get('own_layers', '-')}) | "
                f"{fmt((row.get('variant_bytes') or 0) / 2**20 if not first else None, '.2f')} | "
                f"{fmt(row['inferd_warm_ms'], '.2f')} | {fmt(row['ort_warm_ms'], '.2f')} | "
                f"{fmt(row['warm_ratio'], '.2f')} | {row['max_rel_err']:.1e} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="inferd bench shapes", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "vulkan"])
    p.add_argument("--models", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--repeat", type=int, default=30, help="warm runs per shape and engine")
    p.add_argument("--cold-repeat", type=int, default=3, help="cold processes per model")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads of both engines")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    bad = [m for m in models if m not in SHAPES]
    if bad:
        p.error(f"unknown model(s) {bad}; choose from {sorted(SHAPES)}")
    import onnxruntime

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or "?"
    except OSError:
        commit = "?"
    gpu = ""
    if args.device == "vulkan":
        from inferd.vulkan.device import get_device

        gpu = str(get_device().fingerprint().get("device_name", ""))
    data: dict[str, Any] = {"machine": machine_info(), "device": args.device, "gpu": gpu, "threads": args.threads,
                            "repeat": args.repeat, "cold_repeat": args.cold_repeat,
                            "onnxruntime": onnxruntime.__version__, "commit": commit, "results": []}
    with tempfile.TemporaryDirectory(prefix="inferd-shapes-") as td:
        for name in models:
            r = bench_model(name, args.device, Path(td), args.repeat, args.cold_repeat, args.threads)
            data["results"].append(r)
            print(f"{name}: cold {r['cold_ms']:.1f} ms; " + "; ".join(
                f"{'x'.join(map(str, row['shape']))}: prepare {fmt(row.get('prepare_ms'), '.2f')} ms, warm "
                f"{row['inferd_warm_ms']:.2f} vs ort {row['ort_warm_ms']:.2f} ms" for row in r["rows"]), flush=True)
    data["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    md = table(data)
    tag = f"_{gpu.split()[0].lower()}" if gpu else ""
    jp, mp = write_results(args.out, f"shapes_{args.device}{tag}", data, md)
    print(md)
    print(f"wrote {jp} and {mp}")
    return 0
