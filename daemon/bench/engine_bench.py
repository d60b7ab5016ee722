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


def _child_env(threads: int) -> dict[str, str]:
    """Both engines' pools at ``threads``: OMP_NUM_THREADS sizes onnxruntime's and numpy's, INFERD_NUM_THREADS
    inferd's (which read neither of the others: "--threads 1" had timed two inferd threads against one)."""
    return dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
                INFERD_NUM_THREADS=str(threads))


def _cold(which: str, path: Path, threads: int, device: str) -> float:
    drop_page_cache(path)
    env = _child_env(threads)
    r = subprocess.run([sys.executable, "-c", _COLD, which, str(path), str(threads), device],
                       capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"cold run of {which} on {path.name} failed: {r.stderr[-2000:]}")
    return float(r.stdout.strip().splitlines()[-1])


# A warm child: loads the model, warms it, then times slices of runs on command ("run N" on stdin: two runs
# untimed, N timed, their seconds printed), until "end" (the first output saved, kernel counts printed).
_WARM = r"""
import sys, time, json, numpy as np
which, path, threads, device = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
x = np.load(sys.argv[5])
if which == "ort":
    import onnxruntime as ort
    so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.log_severity_level = 3
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feeds = {s.get_inputs()[0].name: x}
    run = lambda: s.run(None, feeds)[0]
else:
    import inferd, os
    from inferd import native
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
print("READY", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if not cmd or cmd[0] != "run":
        break
    run(); run()
    ts = []
    for _ in range(int(cmd[1])):
        t = time.perf_counter(); run(); ts.append(time.perf_counter() - t)
    print("TIMES " + json.dumps(ts), flush=True)
np.save(sys.argv[6], y)
extra = {}
if which != "ort":
    kc = {}
    for k in m.kernels.values():
        kc[k] = kc.get(k, 0) + 1
    extra = {"kernels": kc, "memory_bytes": m.memory_bytes, "threads": native.num_threads()}
print("RESULT " + json.dumps(extra), flush=True)
"""


class _WarmChild:
    """One engine in its own process: onnxruntime's spinning pool threads and OpenBLAS' would otherwise steal
    the other's cores and distort both numbers. It stays loaded between slices, so the two engines can take
    turns many times a second apart instead of once per fresh process."""

    def __init__(self, which: str, path: Path, threads: int, device: str, x_path: Path, y_path: Path,
                 err_path: Path) -> None:
        self.which = which
        env = _child_env(threads)
        self._err = open(err_path, "w+")
        self.p = subprocess.Popen([sys.executable, "-c", _WARM, which, str(path), str(threads), device,
                                   str(x_path), str(y_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self._err, text=True, env=env)
        try:
            self._reply("READY")
        except BaseException:
            self.close()  # not yet in the caller's list: its stderr file is closed here
            raise

    def _reply(self, tag: str) -> str:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            if line.startswith(tag):
                return line[len(tag):].strip()
        self.p.wait(30)
        self._err.seek(0)
        raise RuntimeError(f"warm run of {self.which} failed (rc {self.p.returncode}): {self._err.read()[-2000:]}")

    def _send(self, line: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def times(self, n: int) -> list[float]:
        self._send(f"run {n}")
        return [float(t) for t in json.loads(self._reply("TIMES "))]

    def end(self) -> dict[str, Any]:
        self._send("end")
        out = json.loads(self._reply("RESULT "))
        self.p.wait(60)
        return out

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self._err.close()


#: pause between two engines' slices: onnxruntime's pool threads spin for 50-75 ms after its last run (its CPU
#: time, Zen 3 VM); 50 ms let them run into inferd's first timed runs
SLICE_GAP_S = 0.15


def time_pair(first: tuple[str, Path], second: tuple[str, Path], device: str, threads: int, repeat: int,
              rounds: int = 10) -> dict[str, Any]:
    """Warm runs of two (engine, model file) arms, each loaded in a process of its own, taking turns: ``rounds``
    rounds, each timing ``repeat`` runs of one arm then of the other (the first alternating), 0.15 s apart. A
    shared VM has phases (seconds long) in which it runs like one core or at another clock; rounds a fraction of a
    second long put both arms of a round in the same phase (with fresh processes per round, 3 rounds of 20 runs,
    one model's ratio ranged 0.66-1.32), so the ratio to report is the median of the per-round ratios
    (``ratios``, first / second). Both arms get the same input (the first arm's model's first input, seeded).
    Returns each arm's runs per round (s), its child's end record and its first output."""
    from ..frontend import import_model

    inp = import_model(first[1]).inputs[0]
    times: tuple[list[list[float]], list[list[float]]] = ([], [])
    with tempfile.TemporaryDirectory() as d:
        xp = Path(d) / "x.npy"
        ys = (Path(d) / "first.npy", Path(d) / "second.npy")
        np.save(xp, np.random.default_rng(0).standard_normal(inp.shape).astype(inp.dtype))
        kids: list[_WarmChild] = []
        try:
            for (which, path), y, tag in zip((first, second), ys, ("first", "second")):
                kids.append(_WarmChild(which, path, threads, device, xp, y, Path(d) / f"{tag}.err"))
            # onnxruntime's warm-up runs just ended: its pool threads spin into the first slice otherwise (inferd's
            # first round ran 1.1-1.9x its others on the export corpus)
            time.sleep(SLICE_GAP_S)
            for r in range(max(1, rounds)):
                got: dict[int, list[float]] = {}
                for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                    got[i] = kids[i].times(max(1, repeat))
                    time.sleep(SLICE_GAP_S)
                times[0].append(got[0])
                times[1].append(got[1])
            infos = [kid.end() for kid in kids]
        finally:
            for kid in kids:
                kid.close()
        outs = [np.load(y) for y in ys]
    return {"times": times, "infos": infos, "outputs": outs,
            "ratios": [float(np.median(a) / np.median(b)) for a, b in zip(*times)]}


def bench_model(path: Path, device: str, threads: int, repeat: int, cold: bool, rounds: int = 10) -> dict[str, Any]:
    """Warm: inferd and onnxruntime on ``path``, each in a process of its own, taking turns (``time_pair``); the
    ratio reported is the median of the per-round ratios, with their range. Times: median and p95 over all runs."""
    pair = time_pair(("inferd", path), ("ort", path), device, threads, repeat, rounds)
    ours, theirs = pair["times"]
    info = pair["infos"][0]
    got_y, ref = pair["outputs"]
    err = float(np.abs(got_y - ref).max() / max(np.abs(ref).max(), 1e-30))
    ratios = pair["ratios"]
    all_o, all_t = np.concatenate(ours) * 1e3, np.concatenate(theirs) * 1e3
    res: dict[str, Any] = {"warm_ms": float(np.median(all_o)), "ort_warm_ms": float(np.median(all_t)),
                           "warm_ratio": float(np.median(ratios)), "warm_ratio_min": min(ratios),
                           "warm_ratio_max": max(ratios),
                           "rounds": [{"inferd_ms": float(np.median(o)) * 1e3, "ort_ms": float(np.median(t)) * 1e3}
                                      for o, t in zip(ours, theirs)],
                           "warm_p95_ms": float(np.percentile(all_o, 95)),
                           "ort_warm_p95_ms": float(np.percentile(all_t, 95)),
                           "max_rel_err": err, "kernels": info.get("kernels"), "inferd_threads": info.get("threads"),
                           "memory_bytes": info.get("memory_bytes")}
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
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help="zoo model names, or paths of .onnx files (real exported models), comma-separated")
    p.add_argument("--repeat", type=int, default=None,
                   help="timed runs per round (default 10), or per layer with --layers (default 20)")
    p.add_argument("--rounds", type=int, default=None,
                   help="alternating inferd/onnxruntime warm rounds per model (default 10), or with --layers "
                        "alternating pairs of per-layer children (default 3; medians over them)")
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
    if args.repeat is None:
        args.repeat = 20 if args.layers else 10
    if args.rounds is None:
        args.rounds = 3 if args.layers else 10
    os.environ["INFERD_BENCH_PRECISION"] = args.precision
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from ..zoo import write_zoo

    zoo = Path(args.zoo_dir or Path(tempfile.gettempdir()) / "inferd-bench-zoo")
    names = [n for n in args.models.split(",") if n]
    # an ONNX file given by its path (a real exported model) is benched as it is, under its file name
    files = {Path(n).name: Path(n) for n in names if n.endswith(".onnx")}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise SystemExit(f"inferd bench: no such model file: {', '.join(missing)}")
    paths: dict[str, Any] = {**write_zoo(zoo, [n for n in names if not n.endswith(".onnx")]), **files}
    names = [Path(n).name if n.endswith(".onnx") else n for n in names]
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

    results = run(paths, args.threads, args.repeat, args.rounds)
    data = {"machine": machine_info(), "device": "cpu", "threads": args.threads, "repeat": args.repeat,
            "rounds": args.rounds, "models": results}
    mi = data["machine"]
    head = (f"# Per layer: inferd vs onnxruntime vs roofline, cpu, {args.threads} threads\n\n"
            f"Machine: {mi['cpu']}, {mi['cores']} cores; date {mi['date']}; load average {mi.get('loadavg')}. "
            f"inferd: median per layer of {args.repeat} timed runs; onnxruntime: its profiler, median per node; "
            f"the two engines' children in {args.rounds} alternating rounds, each figure the median over them and "
            "inferd / ort the median of the rounds' ratios (their range in brackets); "
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
             f" onnxruntime {ort.__version__}; warm: each engine loaded in its own process, then {args.rounds}"
             f" rounds of {args.repeat} runs of one engine then the other (the first alternating; times: median and"
             " p95 over all runs; ratio: median of the rounds' ratios of medians, with their range); first output"
             " of the model compared; cold = fresh process, model file evicted from the page cache, load + first"
             " inference (libraries already imported), one round." + bg, "",
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
