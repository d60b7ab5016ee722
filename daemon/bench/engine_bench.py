"""Engine vs onnxruntime on the zoo, same thread count, in one run: warm and cold latency."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import busy_loop, drop_page_cache, machine_info, write_results

DEFAULT_MODELS = ["resnet50", "mobilenetv2", "resnet18", "squeezenet1_1", "shufflenetv2_x1_0", "efficientnet_b0",
                  "googlenet", "unet_small", "vit_tiny", "vgg16"]

# Cold = fresh process with libraries imported, page cache of the model file dropped, then load + first run.
_COLD = r"""
import sys, time, numpy as np
which, path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
if which == "ort":
    import onnxruntime as ort
else:
    import inferd
    from inferd.frontend import import_model  # import cost is not part of cold
t0 = time.perf_counter()
if which == "ort":
    so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.log_severity_level = 3
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32) for i in s.get_inputs()}
    s.run(None, feeds)
else:
    import os
    m = inferd.load(path, device=sys.argv[4], precision=os.environ.get("INFERD_BENCH_PRECISION", "fp32"))
    m.run({t.name: np.zeros(t.shape, t.dtype) for t in m.inputs})
print(time.perf_counter() - t0)
"""


def _cold(which: str, path: Path, threads: int, device: str) -> float:
    drop_page_cache(path)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    r = subprocess.run([sys.executable, "-c", _COLD, which, str(path), str(threads), device],
                       capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"cold run of {which} on {path.name} failed: {r.stderr[-2000:]}")
    return float(r.stdout.strip().splitlines()[-1])


_WARM = r"""
import sys, time, json, numpy as np
which, path, threads, repeat, device = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
x = np.load(sys.argv[6])
if which == "ort":
    import onnxruntime as ort
    so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.log_severity_level = 3
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feeds = {s.get_inputs()[0].name: x}
    run = lambda: s.run(None, feeds)[0]
else:
    import inferd, os
    m = inferd.load(path, device=device, precision=os.environ.get("INFERD_BENCH_PRECISION", "fp32"))
    feeds = {m.inputs[0].name: x}
    out0 = m.output_names[0]
    run = lambda: m.run(feeds)[out0]
y = run()
if which != "ort":
    # steady state: the background load and the warm switch (idle-time work after a cold load) done before
    # the clock, or under a busy loop they ran into the timed runs (mobilenetv2 24 vs 8.4 ms)
    m.wait_loaded()
    run()
    m.wait_warm(60)
for _ in range(3):
    run()
ts = []
for _ in range(repeat):
    t = time.perf_counter(); run(); ts.append(time.perf_counter() - t)
np.save(sys.argv[7], y)
extra = {}
if which != "ort":
    kc = {}
    for k in m.kernels.values():
        kc[k] = kc.get(k, 0) + 1
    extra = {"kernels": kc, "memory_bytes": m.memory_bytes}
print("RESULT " + json.dumps({"warm_ms": float(np.median(ts)) * 1e3, "p95_ms": float(np.percentile(ts, 95)) * 1e3,
                              **extra}))
"""


def _warm(which: str, path: Path, threads: int, repeat: int, device: str, x_path: Path, y_path: Path) -> dict[str, Any]:
    # Each engine in its own process: onnxruntime's spinning pool threads and OpenBLAS' would
    # otherwise steal the other's cores and distort both numbers.
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    r = subprocess.run([sys.executable, "-c", _WARM, which, str(path), str(threads), str(repeat), device,
                        str(x_path), str(y_path)], capture_output=True, text=True, env=env, timeout=1200)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"warm run of {which} on {path.name} failed: {r.stderr[-2000:]}")
    return json.loads(lines[-1][7:])


def bench_model(path: Path, device: str, threads: int, repeat: int, cold: bool, rounds: int = 3) -> dict[str, Any]:
    """Warm: ``rounds`` rounds, each timing inferd then onnxruntime in fresh processes. A shared VM has phases
    (seconds long) in which it runs like one core; a single pair of runs can land one engine in such a phase,
    so the reported ratio is the median of the per-round ratios, with their range."""
    from ..frontend import import_model

    inp = import_model(path).inputs[0]
    ours_r: list[dict[str, Any]] = []
    theirs_r: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as d:
        xp, yo, yr = Path(d) / "x.npy", Path(d) / "ours.npy", Path(d) / "ref.npy"
        np.save(xp, np.random.default_rng(0).standard_normal(inp.shape).astype(inp.dtype))
        for _ in range(max(1, rounds)):
            ours_r.append(_warm("inferd", path, threads, repeat, device, xp, yo))
            theirs_r.append(_warm("ort", path, threads, repeat, device, xp, yr))
        got, ref = np.load(yo), np.load(yr)
    err = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
    ratios = [o["warm_ms"] / t["warm_ms"] for o, t in zip(ours_r, theirs_r)]
    res: dict[str, Any] = {"warm_ms": float(np.median([o["warm_ms"] for o in ours_r])),
                           "ort_warm_ms": float(np.median([t["warm_ms"] for t in theirs_r])),
                           "warm_ratio": float(np.median(ratios)), "warm_ratio_min": min(ratios),
                           "warm_ratio_max": max(ratios), "rounds": [{"inferd_ms": o["warm_ms"], "ort_ms": t["warm_ms"]}
                                                                     for o, t in zip(ours_r, theirs_r)],
                           "warm_p95_ms": float(np.median([o["p95_ms"] for o in ours_r])),
                           "ort_warm_p95_ms": float(np.median([t["p95_ms"] for t in theirs_r])),
                           "max_rel_err": err, "kernels": ours_r[-1].get("kernels"),
                           "memory_bytes": ours_r[-1].get("memory_bytes")}
    if cold:
        res["cold_ms"] = _cold("inferd", path, threads, device) * 1e3
        res["ort_cold_ms"] = _cold("ort", path, threads, device) * 1e3
        res["cold_ratio"] = res["cold_ms"] / res["ort_cold_ms"]
    return res


def _kernel_counts(model: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in model.kernels.values():
        out[k] = out.get(k, 0) + 1
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="inferd bench", description="engine vs onnxruntime on the zoo")
    p.add_argument("--device", default="cpu", choices=["cpu", "vulkan"])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS))
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3, help="alternating inferd/onnxruntime warm rounds per model")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--no-cold", action="store_true")
    p.add_argument("--zoo-dir", default=None)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--layers", action="store_true",
                   help="per layer: inferd beside onnxruntime's profiler and the roofline (measured FMA peak and "
                        "memory bandwidth); the table names the layers where the gap is")
    p.add_argument("--background", type=int, default=0, metavar="N",
                   help="a busy loop pinned to each of N cores during the warm runs of both engines (p50 and p95)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "auto"],
                   help="inferd's precision (the children read $INFERD_BENCH_PRECISION); 'inferd bench precision' "
                        "compares them")
    args = p.parse_args(argv)
    os.environ["INFERD_BENCH_PRECISION"] = args.precision
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from ..zoo import write_zoo

    zoo = Path(args.zoo_dir or Path(tempfile.gettempdir()) / "inferd-bench-zoo")
    names = [n for n in args.models.split(",") if n]
    paths = write_zoo(zoo, names)
    if args.layers:
        return _layers_main(args, {n: Path(paths[n]) for n in names})
    busy = _busy_loops(args.background)
    try:
        results = _warm_and_cold(args, names, paths)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    return _report(args, results)


def _busy_loops(n: int) -> list[subprocess.Popen]:
    """``n`` processes spinning, each pinned to one core (the first ``n`` the benchmark may use)."""
    out = [busy_loop(c) for c in sorted(os.sched_getaffinity(0))[:max(0, n)]]
    time.sleep(0.2 if out else 0)
    return out


def _layers_main(args: argparse.Namespace, paths: dict[str, Path]) -> int:
    from .layers_bench import run, table

    results = run(paths, args.threads, args.repeat)
    data = {"machine": machine_info(), "device": "cpu", "threads": args.threads, "repeat": args.repeat,
            "models": results}
    mi = data["machine"]
    head = (f"# Per layer: inferd vs onnxruntime vs roofline, cpu, {args.threads} threads\n\n"
            f"Machine: {mi['cpu']}, {mi['cores']} cores; date {mi['date']}; load average {mi.get('loadavg')}. "
            f"inferd: median per layer of {args.repeat} timed runs; onnxruntime: its profiler, median per node; "
            "roofline: max(FLOPs / measured FMA peak of the threads, bytes / measured copy bandwidth); "
            "'% of FMA peak' counts the layer's direct FLOPs (a Winograd layer can exceed 100%).\n\n")
    jp, mp = write_results(args.out, "engine_cpu_layers", data, head + table(results))
    print(table(results))
    print(f"wrote {jp} and {mp}")
    return 0


def _warm_and_cold(args: argparse.Namespace, names: list[str], paths: dict[str, Any]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for n in names:
        t = time.perf_counter()
        results[n] = bench_model(Path(paths[n]), args.device, args.threads, args.repeat, not args.no_cold,
                                 args.rounds)
        r = results[n]
        print(f"{n:20s} warm {r['warm_ms']:8.2f} ms  ort {r['ort_warm_ms']:8.2f} ms  ratio {r['warm_ratio']:5.2f}"
              f" ({r['warm_ratio_min']:.2f}-{r['warm_ratio_max']:.2f})"
              + (f"  cold {r['cold_ms']:8.1f} ms  ort {r['ort_cold_ms']:8.1f} ms" if "cold_ms" in r else "")
              + f"  err {r['max_rel_err']:.1e}  ({time.perf_counter() - t:.0f} s)", flush=True)
    return results


def _report(args: argparse.Namespace, results: dict[str, Any]) -> int:
    import onnxruntime as ort
    data = {"machine": machine_info(), "device": args.device, "precision": args.precision, "threads": args.threads,
            "repeat": args.repeat,
            "rounds": args.rounds, "background": args.background,
            "onnxruntime": ort.__version__, "models": results}
    bg = (f" A busy loop ran pinned to each of {args.background} core(s) during the warm runs of both engines."
          if args.background else "")
    lines = [f"# inferd vs onnxruntime, {args.device}, {args.threads} threads",
             "", f"Machine: {data['machine']['cpu']}, {data['machine']['cores']} cores; date {data['machine']['date']};"
             f" onnxruntime {ort.__version__}; warm = median of {args.repeat} runs, each engine in its own process,"
             f" {args.rounds} alternating rounds (times: median over rounds; ratio: median of the rounds' ratios,"
             " with their range); first output of the model compared; cold = fresh process, model file"
             " evicted from the page cache, load + first inference (libraries already imported), one round." + bg, "",
             "| model | inferd warm ms | ort warm ms | warm ratio | ratio range | inferd p95 ms | ort p95 ms | p95 ratio |"
             " inferd cold ms | ort cold ms | cold ratio | max rel err |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n, r in results.items():
        lines.append(f"| {n} | {r['warm_ms']:.2f} | {r['ort_warm_ms']:.2f} | {r['warm_ratio']:.2f} | "
                     f"{r['warm_ratio_min']:.2f}-{r['warm_ratio_max']:.2f} | {r['warm_p95_ms']:.2f} | "
                     f"{r['ort_warm_p95_ms']:.2f} | {r['warm_p95_ms'] / r['ort_warm_p95_ms']:.2f} | "
                     f"{r.get('cold_ms', float('nan')):.1f} | {r.get('ort_cold_ms', float('nan')):.1f} | "
                     f"{r.get('cold_ratio', float('nan')):.2f} | {r['max_rel_err']:.1e} |")
    stem = f"engine_{args.device}" + (f"_background{args.background}" if args.background else "")
    jp, mp = write_results(args.out, stem, data, "\n".join(lines) + "\n")
    print(f"wrote {jp} and {mp}")
    return 0
