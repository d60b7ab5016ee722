"""The children ``inferd bench memory`` measures in (each configuration's peak RSS its own, a peer alone in its
process), its budget points, its latency plot and its results: shared by the CPU arm (``memory_bench``) and the
Vulkan one (``memory_vulkan``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_CHILD = r"""
import gc, json, os, sys, time
import numpy as np

def rss():
    s = open('/proc/self/status').read()
    return int(s.split('VmRSS:')[1].split()[0]) * 1024
def hwm():
    s = open('/proc/self/status').read()
    return int(s.split('VmHWM:')[1].split()[0]) * 1024
def reset():
    gc.collect()
    try:
        open('/proc/self/clear_refs', 'w').write('5')
    except OSError:
        pass

job = json.loads(open(sys.argv[1]).read())
kind, out = job["kind"], []
x = np.load(job["x"])
if kind == "inferd":
    from inferd.frontend import import_model
    from inferd.runtime.cpu import CpuExecutor
    from inferd.runtime.stream_compile import open_streamed
    from inferd.runtime.pagecache import drop_file
    # the unconstrained model, run alternately with each configuration: the machine's load drifts, a warm
    # latency measured minutes apart would not be the reference of this configuration
    from inferd.package import cpu_graph
    g = import_model(job["onnx"])
    warm = CpuExecutor(cpu_graph(g))  # as inferd.load runs it (the CPU's blocked layout, as the streamed runs)
    wfeeds = {g.inputs[0].name: x}
    warm.run(wfeeds)
    del g
    from inferd.planner.flex import simulate, time_lower_bound
    # each configuration alternates with the unconstrained model in a loop of its own (warm, streamed, warm, ...),
    # preloading and on-demand at one (budget, read mode) one after the other: every ratio is taken between runs
    # made seconds apart, not minutes. Not all configurations in one loop: the warm model, running every other
    # time, then kept more of its data in the caches than each configuration did (mobilenetv2 with nothing
    # streamed, 2-core VM: 1.10x the warm run with two configurations in the loop, 1.00x with one)
    groups = {}
    for c in job["configs"]:
        groups.setdefault((c["budget"], c["read"]), []).append(c)
    for (budget, read), cs in groups.items():
        exs = []
        for c in cs:
            reset(); base = rss()
            ex = open_streamed(c["skel"], c["budget"], mode=c["mode"], read=c["read"])
            feeds = {ex.inputs[0].name: x}
            if c["read"] == "bypass":
                drop_file(ex.store.path)
            for _ in range(2):  # peak RSS from this configuration's runs alone (the one opened before stays)
                ex.run(feeds)
            exs.append((c, ex, feeds, base, hwm()))
        ts = [[] for _ in exs]; ws = [[] for _ in exs]; rd = [[] for _ in exs]; wt = [[] for _ in exs]
        for i, (c, ex, feeds, _b, _p) in enumerate(exs):
            warm.run(wfeeds); ex.run(feeds)  # unmeasured: the pair's data back where the loop will find it
            for _ in range(job["repeat"]):
                t = time.perf_counter(); warm.run(wfeeds); ws[i].append(time.perf_counter() - t)
                t = time.perf_counter(); ex.run(feeds); ts[i].append(time.perf_counter() - t)
                rd[i].append(ex.stats["read_s"]); wt[i].append(ex.stats["wait_s"])
        for i, (c, ex, feeds, base, peak) in enumerate(exs):
            floor = lower = None
            if c["mode"] == "preload" and ex.plan.streamed_bytes and job.get("bw"):
                # the plan's own best schedule: per-step compute (measured at compile time) scaled to this
                # configuration's warm runs, whole-layer loads at the disk's rate
                cs_ = [lm.compute_s for lm in ex.layer_mem]
                k = float(np.median(ws[i])) / max(sum(cs_), 1e-9)
                cs_ = [v * k for v in cs_]
                floor = simulate(ex.plan, ex.layer_mem, job["bw"], cs_) * 1e3
            if floor is not None and c["read"] == "bypass":
                # and what no plan of these kernels inside this budget could beat reading from the disk
                # (flex.time_lower_bound; from the page cache the reads run faster than the disk's rate)
                lower = time_lower_bound(ex.layer_mem, ex.activations, ex.plan.budget, job["bw"], cs_) * 1e3
            out.append({**c, "latency_ms": float(np.median(ts[i])) * 1e3, "latency_all_ms": [t * 1e3 for t in ts[i]],
                        "warm_ms": float(np.median(ws[i])) * 1e3, "warm_all_ms": [t * 1e3 for t in ws[i]],
                        "read_ms": float(np.median(rd[i])) * 1e3, "wait_ms": float(np.median(wt[i])) * 1e3,
                        "floor_ms": floor, "lower_bound_ms": lower,
                        "weights_bytes": int(sum(lm.weights for lm in ex.layer_mem)),
                        "arena_bytes": int(ex.arena.nbytes), "memory_bytes": int(ex.memory_bytes),
                        "streamed_bytes": int(ex.streamed_bytes), "resident_layers": int(sum(ex.plan.resident)),
                        "peak_rss_bytes": peak, "base_rss_bytes": base, "peak_rss_delta_bytes": peak - base,
                        "config": ex.config.to_dict(),
                        "loadavg": list(os.getloadavg())})
        for _c, ex, *_r in exs:
            ex.close()
        del exs, ex
elif kind == "ort":
    import onnxruntime as ort
    reset(); base = rss()
    so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.log_severity_level = 3
    s = ort.InferenceSession(job["onnx"], so, providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    s.run(None, {name: x})
    ts = []
    for _ in range(job["repeat"]):
        t = time.perf_counter(); s.run(None, {name: x}); ts.append(time.perf_counter() - t)
    out.append({"latency_ms": float(np.median(ts)) * 1e3, "peak_rss_bytes": hwm(), "base_rss_bytes": base,
                "peak_rss_delta_bytes": hwm() - base, "loadavg": list(os.getloadavg())})
elif kind == "ncnn":
    import ncnn
    if job.get("vulkan"):
        ncnn.create_gpu_instance()
    reset(); base = rss()
    net = ncnn.Net()
    net.opt.use_vulkan_compute = bool(job.get("vulkan"))
    net.opt.num_threads = 2
    net.opt.use_fp16_packed = False; net.opt.use_fp16_storage = False; net.opt.use_fp16_arithmetic = False
    if job["plain"]:
        net.opt.use_winograd_convolution = False
        net.opt.use_sgemm_convolution = False
    net.load_param(job["param"]); net.load_model(job["bin"])
    def once():
        ex = net.create_extractor()
        ex.input("in0", ncnn.Mat(x[0]))
        _r, y = ex.extract("out0")
        return np.array(y)
    once()
    ts = []
    for _ in range(job["repeat"]):
        t = time.perf_counter(); once(); ts.append(time.perf_counter() - t)
    out.append({"latency_ms": float(np.median(ts)) * 1e3, "peak_rss_bytes": hwm(), "base_rss_bytes": base,
                "peak_rss_delta_bytes": hwm() - base, "loadavg": list(os.getloadavg())})
print(json.dumps(out))
"""


def _child(job: dict[str, Any], work: Path, timeout: float = 1800) -> list[dict[str, Any]]:
    jf = work / f"job-{job['kind']}-{os.getpid()}-{time.monotonic_ns()}.json"
    jf.write_text(json.dumps(job))
    # a fixed mmap threshold: a freed arena goes back to the system (glibc's dynamic threshold would keep it in
    # the heap, and the next configuration's peak RSS would not show its own arena)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
    r = subprocess.run([sys.executable, "-c", _CHILD, str(jf)], capture_output=True, text=True, timeout=timeout,
                       env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{job['kind']} child failed: {r.stderr[-1500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _budgets(lo: int, hi: int, n: int) -> list[int]:
    if hi <= lo:
        return [lo]
    r = (hi / lo) ** (1 / max(1, n - 1))
    return sorted({int(lo * r ** i) for i in range(n - 1)} | {hi})


def peers(res: dict[str, Any], name: str, onnx: Path, x: Any, xf: Path, work: Path, repeat: int,
          ncnn: list[tuple[str, dict[str, Any]]]) -> None:
    """onnxruntime's child, and ncnn's (``ncnn``: (result key, options) per variant) into ``res``; a peer that
    fails leaves its error there instead."""
    try:
        res["ort"] = _child({"kind": "ort", "onnx": str(onnx), "repeat": repeat, "x": str(xf)}, work)[0]
    except Exception as e:
        res["ort_error"] = str(e)[-500:]
    if not ncnn:
        return
    try:
        from .ncnn_peer import convert_ncnn

        param, binf = convert_ncnn(onnx, tuple(x.shape), work / f"{name}_ncnn")
        for key, opts in ncnn:
            res[key] = _child({"kind": "ncnn", "param": str(param), "bin": str(binf), "repeat": repeat, "x": str(xf),
                               **opts}, work)[0]
    except Exception as e:
        res["ncnn_error"] = f"{type(e).__name__}: {e}"[-800:]


def finish(out: str, tag: str, data: dict[str, Any], table: str, plot: Any) -> int:
    """Write the results (json, markdown) and the latency plot of the models that ran; print the table."""
    from .common import machine_info, write_results

    data["machine_end"] = machine_info()
    jp, mp = write_results(out, tag, data, table)
    png = jp.with_suffix("").with_name(jp.stem + "_latency.png")
    plotted = [r for r in data["models"] if "runs" in r]
    if plotted:  # (--models "": the adaptation and the outside view only)
        plot(plotted, png)
    print(mp.read_text())
    print(f"wrote {jp}, {mp}" + (f", {png}" if plotted else ""))
    return 0


def plot_latency(results: list[dict[str, Any]], path: Path, arms: list[tuple[str, str, str, str]],
                 peers: list[tuple[str, str]], warm_label: str, title: Any = None) -> None:
    """Latency against budget per model (``arms``: mode, read, slicing, line style of the inferd runs), the peers
    as points at their peak RSS (``peers``: result key, marker), the warm reference as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mb = 1 << 20
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, r in zip(axes[0], results):
        for mode, read, slicing, style in arms:
            pts = sorted((c["budget"] / mb, c["latency_ms"]) for c in r.get("runs", [])
                         if "error" not in c and c["mode"] == mode and c["read"] == read
                         and c.get("slicing", "fit") == slicing)
            if pts:
                tag = f"inferd {mode}/{read}" + (", faster slicing" if slicing == "faster" else "")
                ax.plot(*zip(*pts), style, label=tag, markersize=4)
        for key, mark in peers:
            p = r.get(key)
            if p:
                ax.plot([p["peak_rss_delta_bytes"] / mb], [p["latency_ms"]], mark, markersize=9,
                        label=f"{key} (peak RSS)")
        ax.axhline(r["warm_ms"], color="gray", lw=0.8, ls=":", label=warm_label)
        ax.set_xscale("log")
        ax.set_xlabel("memory budget / peak memory (MiB)")
        ax.set_ylabel("latency (ms)")
        ax.set_title(title(r) if title else r["model"])
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def budget_range(res: dict[str, Any], onnx: Path, graph: Any, work: Path, points: int, compile_kw: dict[str, Any],
                 open_kw: dict[str, Any], fit_kw: dict[str, Any]) -> tuple[Path, Path, Any]:
    """Into ``res``, the budgets a model is measured between: the unsliced configuration's minimum
    (``default_min_budget``) and the smallest budget holding every weight (``full_budget``), the smallest any
    slicing reaches (``min_budget``, its configuration ``min_config``), ``points`` budgets from the smallest to the
    full one (``budgets``); the small parameters' and the weights' bytes, the search's seconds. ``compile_kw``,
    ``open_kw``, ``fit_kw``: the backend's arguments to ``compile_streamed``, ``open_streamed`` and
    ``min_fit_budget``. Returns the unsliced skeleton, its store and the smallest configuration."""
    from ..planner.flex import BudgetTooSmall
    from ..planner.slicing import MemConfig, min_fit_budget
    from ..runtime.stream_compile import compile_streamed, open_streamed

    t = time.perf_counter()
    skel0 = compile_streamed(onnx, 0, work, config=MemConfig(), in_child=False, **compile_kw)
    probe = open_streamed(skel0, 0, **open_kw)
    small, default_min = probe.small_bytes, probe.min_budget()
    lo_full, hi_full = default_min, probe.small_bytes + probe.arena.nbytes
    while hi_full - lo_full > max(64 << 10, hi_full // 200):  # the smallest budget with nothing streamed
        mid = (lo_full + hi_full) // 2
        try:
            ok = probe._make_plan(mid).streamed_bytes == 0
        except BudgetTooSmall:
            ok = False
        lo_full, hi_full = (lo_full, mid) if ok else (mid, hi_full)
    store = Path(probe.store.path)
    probe.close()
    _arena_min, cfg_min = min_fit_budget(graph, lo=max(1 << 20, default_min // 8), **fit_kw)
    skel_min = compile_streamed(onnx, 0, work, config=cfg_min, in_child=False, **compile_kw)
    p2 = open_streamed(skel_min, 0, **open_kw)
    true_min = p2.min_budget()
    p2.close()
    res.update({"plan_search_s": time.perf_counter() - t, "small_bytes": small, "default_min_budget": default_min,
                "min_budget": true_min, "min_config": cfg_min.to_dict(), "full_budget": hi_full,
                "weights_bytes": int(sum(a.nbytes for a in graph.constants.values())),
                "budgets": _budgets(true_min, hi_full, points)})
    return skel0, store, cfg_min


def median_ms(run: Any, repeat: int) -> float:
    """The median wall time of ``repeat`` calls of ``run``, in ms."""
    import statistics

    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        run()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def repeats_for(warm_ms: float, repeat: int) -> int:
    """A small model's runs are short and its ratios noisier: more repeats where they cost little (about 1.5 s of
    warm runs per configuration, at most 25)."""
    return max(repeat, min(25, int(1.5e3 / max(warm_ms, 1.0))))
