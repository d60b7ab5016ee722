"""``inferd bench memory``: models served inside memory budgets, against ncnn and onnxruntime in the same run.

    inferd bench memory [--models resnet50,vgg16,mobilenetv2,vit_tiny] [--points 8] [--repeat 5]
                        [--out DIR] [--no-ncnn] [--no-adapt] [--no-daemon]

Per model: the smallest feasible budget (slicing and kernel fallback allowed) and the smallest at which
every weight stays resident; ``--points`` budgets between them (geometric). At each, in a child process
whose peak RSS is reset before each configuration (``/proc/self/clear_refs``): latency of the streaming
runtime with preloading and of the on-demand baseline, through the page cache and bypassing it
(``posix_fadvise(DONTNEED)``), the arena, the peak RSS above the child's baseline. Peers, each in its own
child: onnxruntime (its peak RSS and latency), ncnn (pnnx-converted; default options, and with Winograd and
sgemm off). The disk's bandwidth (O_DIRECT sequential read of the store). Adaptation: resnet50 re-planned
between budgets while 4 client threads send. Outside view: a daemon serving resnet50 and mobilenetv2
(``memory = "stream"``) under ``--memory-budget 40M``: its peak RSS against the idle daemon's.

The goals (issue 9) are evaluated in the markdown table. The machine is shared: load averages are recorded.
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from .common import fmt, machine_info, write_results
from .memory_child import _budgets, _child, budget_range, finish, median_ms, peers, plot_latency, repeats_for

MODELS = ["resnet50", "vgg16", "mobilenetv2", "vit_tiny"]
MB = 1 << 20

def bench_model(name: str, onnx: Path, work: Path, points: int, repeat: int, with_ncnn: bool,
                faster: bool = True) -> dict[str, Any]:
    from ..frontend import import_model
    from ..planner.flex import BudgetTooSmall
    from ..planner.slicing import MemConfig, faster_config, fit_config
    from ..runtime.cpu import CpuExecutor
    from ..runtime.blockio import read_rate, sequential_read_rate
    from ..runtime.stream import RUN, StreamingExecutor
    from ..runtime.stream_compile import compile_streamed, read_skeleton, sliced_layout

    res: dict[str, Any] = {"model": name}
    graph = import_model(onnx)
    x = np.random.default_rng(0).standard_normal(graph.inputs[0].shape).astype(np.float32)
    xf = work / f"{name}_x.npy"
    np.save(xf, x)
    # inferd unconstrained, warm (the reference latency), as inferd.load runs it (the CPU's blocked layout)
    from ..package import cpu_graph

    ex = CpuExecutor(cpu_graph(graph))
    feeds = {graph.inputs[0].name: x}
    ex.run(feeds)
    res["warm_ms"] = median_ms(partial(ex.run, feeds), repeat)
    res["warm_loadavg"] = list(os.getloadavg())
    repeat = repeats_for(res["warm_ms"], repeat)
    res["repeat"] = repeat
    del ex
    gc.collect()
    # the default configuration (no slicing) and the smallest feasible one
    skel0, store, cfg_min = budget_range(res, onnx, graph, work, points, {}, {}, {})
    small, default_min, budgets = res["small_bytes"], res["default_min_budget"], res["budgets"]
    configs = []
    # the slicing a daemon's streamed model gets for a budget (``stream_compile``): fit_config's, sliced further
    # where the plan runs faster (``faster_config``, from the unsliced model's measured times); fit_config's
    # alone is run beside it, preloading, in the same loop (the "fit" rows)
    g0, meta0 = read_skeleton(skel0)
    per_node = {n.name: float(t) for n, t in zip(g0.nodes, meta0.get("compute_s") or [])}
    res["faster_slicing"] = faster
    for b in budgets:
        if b >= default_min:
            cfg, skel = MemConfig(), skel0
        else:
            try:
                cfg = fit_config(graph, b - small)
            except BudgetTooSmall:
                cfg = cfg_min
            skel = compile_streamed(onnx, 0, work, config=cfg, in_child=False)
        fast = faster_config(graph, b - small, cfg, per_node, float(meta0.get("read_bw") or 0.0),
                             layout=sliced_layout) if faster else cfg
        for mode in ("preload", "ondemand"):
            for read in ("cache", "bypass"):
                configs.append({"budget": b, "skel": str(skel), "mode": mode, "read": read, "slicing": "fit"})
        if fast != cfg:
            skf = compile_streamed(onnx, 0, work, config=fast, in_child=False)
            for read in ("cache", "bypass"):
                configs.append({"budget": b, "skel": str(skf), "mode": "preload", "read": read, "slicing": "faster"})
    del graph
    gc.collect()
    # the bound's bandwidth: the faster of one 4 MiB read in flight and the runtime's own loaders' (several in
    # flight, into a large buffer as into the arena); the runtime is held to the faster
    res["disk_bw_qd1_bytes_s"] = sequential_read_rate(store)
    res["disk_bw_bytes_s"] = max(res["disk_bw_qd1_bytes_s"],
                                 read_rate(store, StreamingExecutor.bypass_readers, RUN))
    res["runs"] = _child({"kind": "inferd", "configs": configs, "repeat": repeat, "x": str(xf), "onnx": str(onnx),
                          "bw": res["disk_bw_bytes_s"]}, work)
    peers(res, name, onnx, x, xf, work, repeat,
          [("ncnn", {"plain": False}), ("ncnn_plain", {"plain": True})] if with_ncnn else [])
    return res


def adaptation(onnx: Path, work: Path, n_changes: int = 24, clients: int = 4) -> dict[str, Any]:
    """Budget changes without re-slicing while ``clients`` threads send requests to one executor."""
    from ..planner.slicing import MemConfig
    from ..runtime.stream_compile import compile_streamed, open_streamed

    skel = compile_streamed(onnx, 0, work, config=MemConfig(), in_child=False)
    ex = open_streamed(skel, 0)
    lo, hi = ex.min_budget(), ex.memory_bytes
    ex.close()
    budgets = _budgets(lo, hi, 6)
    ex = open_streamed(skel, budgets[0])
    x = {ex.inputs[0].name: np.random.default_rng(0).standard_normal(ex.inputs[0].shape).astype(np.float32)}
    stop = threading.Event()
    done = [0] * clients
    errors: list[str] = []

    def client(i: int) -> None:
        while not stop.is_set():
            try:
                ex.run(x)
                done[i] += 1
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}")

    th = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in th:
        t.start()
    plans, replies = [], []
    rng = np.random.default_rng(1)
    try:
        time.sleep(1.0)
        for k in range(n_changes):
            b = int(budgets[int(rng.integers(len(budgets)))])
            t = time.perf_counter()
            st = ex.set_budget(b, wait=False)
            replies.append(time.perf_counter() - t)
            plans.append(st["plan_s"])
            time.sleep(0.25)
    finally:
        stop.set()
        for t in th:
            t.join()
    adapt = list(ex.adapt_s)
    swaps = list(ex.swap_s)
    ex.close()
    q = lambda xs, p: float(np.percentile(xs, p) * 1e3) if xs else None  # noqa: E731
    return {"clients": clients, "changes": n_changes, "swaps": len(adapt), "requests": sum(done), "errors": errors[:5],
            "budgets": budgets, "adapt_p50_ms": q(adapt, 50), "adapt_p90_ms": q(adapt, 90),
            "plan_p50_ms": q(plans, 50), "swap_p50_ms": q(swaps, 50),
            "replan_p50_ms": q([p + s for p, s in zip(plans, swaps)], 50),
            "call_p50_ms": q(replies, 50), "loadavg": list(os.getloadavg())}


def outside_view(zoo: Path, work: Path, budget: int = 40_000_000) -> dict[str, Any]:
    """A daemon with ``--memory-budget`` serving resnet50 and mobilenetv2 (streamed): idle and peak RSS."""
    from inferd_client import Client

    from ..server.testing import DaemonProcess

    d = Path(tempfile.mkdtemp(prefix="ifdmb", dir="/tmp"))
    try:
        for m in ("resnet50", "mobilenetv2"):
            (d / "m" / m).mkdir(parents=True)
            shutil.copy(zoo / f"{m}.onnx", d / "m" / m / "model.onnx")
            (d / "m" / m / "config.toml").write_text('memory = "stream"\n')
        with DaemonProcess(f"ipc://{d}/s.sock", d / "m", "--no-preload", "--cache-dir", str(d / "c"),
                           "--memory-budget", str(budget), log_path=d / "d.log") as dp, \
                Client(dp.endpoint, timeout=600) as c:
            time.sleep(1.0)
            st = open(f"/proc/{dp.pid}/status").read()
            idle = int(st.split("VmRSS:")[1].split()[0]) * 1024
            x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
            lat: dict[str, list[float]] = {"resnet50": [], "mobilenetv2": []}
            for _ in range(6):
                for m in lat:
                    t = time.perf_counter()
                    c.infer(m, {"input": x})
                    lat[m].append(time.perf_counter() - t)
            st = open(f"/proc/{dp.pid}/status").read()
            peak = int(st.split("VmHWM:")[1].split()[0]) * 1024
            status = c.status()
            mem = {m: status["models"][m]["memory_bytes"] for m in lat}
        return {"budget_bytes": budget, "idle_rss_bytes": idle, "peak_rss_bytes": peak,
                "goal_bytes": idle + budget + 40 * MB, "models_bytes": mem,
                "latency_ms": {m: statistics.median(v[1:]) * 1e3 for m, v in lat.items()},
                "loadavg": list(os.getloadavg())}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    plot_latency(results, path, [("preload", "cache", "fit", "-o"), ("preload", "bypass", "fit", "-s"),
                                 ("preload", "cache", "faster", ":o"), ("preload", "bypass", "faster", ":s"),
                                 ("ondemand", "cache", "fit", "--o"), ("ondemand", "bypass", "fit", "--s")],
                 [("ort", "^"), ("ncnn", "v"), ("ncnn_plain", "<")], "inferd warm, unconstrained")


def _table(data: dict[str, Any]) -> str:
    m = data["machine"]
    lines = [f"# inferd bench memory ({m['date']}, {m['cpu']}, {m['cores']} cores, load {m['loadavg']}; "
             f"shared machine)", ""]
    lines += ["Budgets are what the model may hold (arena + small parameters). Peak RSS: above the child's own "
              "baseline (interpreter, numpy, libraries). ncnn/ort: peak RSS above their baseline.", ""]
    for r in data["models"]:
        if "error" in r:
            lines += [f"## {r['model']}: error {r['error']}", ""]
            continue
        bw = r["disk_bw_bytes_s"]
        lines += [f"## {r['model']}", "",
                  f"weights {r['weights_bytes'] / MB:.1f} MiB; min feasible budget {r['min_budget'] / MB:.2f} MiB "
                  f"(config {r['min_config']}); unsliced min {r['default_min_budget'] / MB:.2f} MiB; everything "
                  f"resident at {r['full_budget'] / MB:.1f} MiB; warm unconstrained {r['warm_ms']:.1f} ms; disk "
                  f"{bw / 1e6:.0f} MB/s (best of one 4 MiB read in flight"
                  + (f", {r['disk_bw_qd1_bytes_s'] / 1e6:.0f} MB/s" if r.get('disk_bw_qd1_bytes_s') else "")
                  + ", and the loaders' reads in flight)", ""]
        for key in ("ort", "ncnn", "ncnn_plain"):
            p = r.get(key)
            if p:
                lines.append(f"- {key}: peak RSS +{p['peak_rss_delta_bytes'] / MB:.1f} MiB, {p['latency_ms']:.1f} ms")
        if r.get("ncnn_error"):
            lines.append(f"- ncnn: {r['ncnn_error'][:200]}")
        ncnn_peak = (r.get("ncnn") or {}).get("peak_rss_delta_bytes")
        if ncnn_peak:
            lines.append(f"- min budget / ncnn peak = {r['min_budget'] / ncnn_peak:.3f} (goal <= 0.10 for resnet50, vgg16)")
        lines += ["", "bound = max(warm, streamed bytes / disk bandwidth), warm run before every streamed run in the same "
                  "child; each configuration alternates with the warm model in a loop of its own, preload and "
                  "on-demand at one (budget, read) one after the other. ratio: median over the "
                  "repeats of each run / its own bound (p25-p75 beside it: the noise); read ms: wall time with a read in flight; "
                  "vs on-demand: median of the preload runs / their warm runs over the same of the on-demand runs. "
                  "floor: this memory plan's best schedule "
                  "(flex.simulate: compute scaled to the warm runs, whole-layer loads at the disk rate), what any "
                  "runtime could reach inside the budget (goal: ratio <= 1.15, vs on-demand < 1). any plan >=: what "
                  "no plan of these kernels can beat inside the budget, whatever it keeps resident and however it "
                  "reads (flex.time_lower_bound: the weights of the steps from i on that fit neither beside step "
                  "i nor beside step i - 1 at its end are read after the compute before i); beside it, over the "
                  "largest bound any plan "
                  "could be held to, max(warm, every weight / disk bandwidth): above 1.15 the budget itself forbids "
                  "the goal.", "",
                  "| budget MiB | mode | slicing | read | latency ms | warm ms | read ms | wait ms | streamed MiB | "
                  "peak RSS +MiB | bound ms | floor ms | ratio to bound (p25-p75) | floor / bound | vs on-demand | "
                  "any plan >= ms (/ max bound) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        od = {(c["budget"], c["read"]): c for c in r["runs"] if c["mode"] == "ondemand"}
        # the goal is counted on the preloading row inferd serves with: the faster slicing where there is one
        faster_at = {(c["budget"], c["read"]) for c in r["runs"] if c.get("slicing") == "faster"}
        met_b = met_o = n_pre = met_f = forbid = 0
        fit_b = fit_f = 0
        for c in r["runs"]:
            warm = c.get("warm_ms", r["warm_ms"])
            rb = c["streamed_bytes"] / bw * 1e3
            bound = max(warm, rb)
            lat_all = c.get("latency_all_ms") or [c["latency_ms"]]
            warm_all = c.get("warm_all_ms") or [warm] * len(lat_all)
            ratios = [t / max(w, rb) for t, w in zip(lat_all, warm_all)]
            q25, q50, q75 = (float(np.percentile(ratios, q)) for q in (25, 50, 75))
            vs = None
            floor = c.get("floor_ms")
            lower = c.get("lower_bound_ms")
            # the largest bound any plan at this budget is held to: every weight read, or the warm run
            lower_r = lower / max(warm, c["weights_bytes"] / bw * 1e3) if lower and c.get("weights_bytes") else None
            slicing = c.get("slicing", "fit")
            if c["mode"] == "preload":
                o = od[(c["budget"], c["read"])]
                o_lat = o.get("latency_all_ms") or [o["latency_ms"]]
                o_warm = o.get("warm_all_ms") or [o.get("warm_ms", r["warm_ms"])] * len(o_lat)
                # each against the warm runs of its own loop (the two loops ran one after the other)
                vs = float(np.median([t / w for t, w in zip(lat_all, warm_all)])
                           / np.median([t / w for t, w in zip(o_lat, o_warm)]))
                if slicing == "fit":
                    fit_b += q50 <= 1.15
                    fit_f += floor is None or floor <= 1.15 * bound
                if slicing == "faster" or (c["budget"], c["read"]) not in faster_at:
                    n_pre += 1
                    met_b += q50 <= 1.15
                    met_o += vs < 1.0
                    met_f += floor is None or floor <= 1.15 * bound
                    forbid += lower_r is not None and lower_r > 1.15
            lines.append(f"| {c['budget'] / MB:.2f} | {c['mode']} | {slicing} | {c['read']} | {c['latency_ms']:.1f} | "
                         f"{warm:.1f} | "
                         f"{c['read_ms']:.1f} | {c['wait_ms']:.1f} | {c['streamed_bytes'] / MB:.1f} | "
                         f"{c['peak_rss_delta_bytes'] / MB:.1f} | {bound:.1f} | {fmt(floor, '.1f')} | {q50:.2f} "
                         f"({q25:.2f}-{q75:.2f}) | {fmt(floor / bound if floor else None, '.2f')} | {fmt(vs, '.2f')} | "
                         f"{fmt(lower, '.1f')} ({fmt(lower_r, '.2f')}) |")
        lines += ["", f"preloading: within 1.15 x bound at {met_b} of {n_pre} (budget, read mode) points (the plan's own "
                  f"floor is within 1.15 x bound at {met_f} of {n_pre}); faster than on-demand at {met_o} of {n_pre}"
                  + (f"; with fit_config's slicing alone (the \"fit\" rows): {fit_b} of {n_pre} (floor {fit_f})"
                     if faster_at else "")
                  + f"; the budget itself forbids 1.15 x (any plan >= 1.15 x its largest bound) at {forbid} of "
                    f"{n_pre}", ""]
    a = data.get("adaptation")
    if a:
        lines += ["## Adaptation (resnet50, no re-slicing)", "",
                  f"{a['clients']} client threads, {a['changes']} changes, {a['swaps']} swaps, {a['requests']} "
                  f"requests, errors {a['errors']}: adaptation (plan + wait for the running request + swap) p50 "
                  f"{fmt(a['adapt_p50_ms'])} ms, p90 {fmt(a['adapt_p90_ms'])} ms; re-plan + swap (without the wait) p50 "
                  f"{fmt(a['replan_p50_ms'])} ms (plan {fmt(a['plan_p50_ms'])}, swap {fmt(a['swap_p50_ms'])}; goal "
                  f"p50 <= 50 ms); load {a['loadavg']}", ""]
    o = data.get("outside")
    if o:
        lines += ["## Outside view (daemon, resnet50 + mobilenetv2 streamed, --memory-budget 40M)", "",
                  f"idle RSS {o['idle_rss_bytes'] / MB:.1f} MiB, peak RSS {o['peak_rss_bytes'] / MB:.1f} MiB, goal "
                  f"<= {o['goal_bytes'] / MB:.1f} MiB (idle + budget + 40 MiB); models {o['models_bytes']}; "
                  f"latency {o['latency_ms']}", ""]
    return "\n".join(lines) + "\n"


def _main_vulkan(a: Any) -> int:
    from ..zoo import write_zoo
    from . import memory_vulkan

    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="inferd-membench-vk-"))
    work.mkdir(parents=True, exist_ok=True)
    tag = "memory_vulkan" if a.tag == "memory_cpu" else a.tag
    try:
        names = [m for m in a.models.split(",") if m]
        zoo = work / "zoo"
        write_zoo(zoo, names)
        data: dict[str, Any] = {"machine": machine_info(), "device": "vulkan", "models": []}
        for m in names:
            t = time.perf_counter()
            try:
                r = memory_vulkan.bench_model(m, zoo / f"{m}.onnx", work, a.points, a.repeat, not a.no_ncnn)
            except Exception as e:
                r = {"model": m, "error": f"{type(e).__name__}: {e}"}
            r["bench_s"] = time.perf_counter() - t
            data["models"].append(r)
            print(f"{m}: done in {r['bench_s']:.0f} s", flush=True)
            write_results(a.out, tag, data, memory_vulkan.table(data))  # a time limit keeps the models done
        return finish(a.out, tag, data, memory_vulkan.table(data), memory_vulkan.plot)
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="inferd bench memory")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--points", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--tag", default="memory_cpu")
    ap.add_argument("--no-ncnn", action="store_true")
    ap.add_argument("--no-adapt", action="store_true")
    ap.add_argument("--no-faster-slicing", action="store_true",
                    help="only fit_config's slicing (no faster_config arm)")
    ap.add_argument("--no-daemon", action="store_true")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temporary one, removed)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "vulkan"),
                    help="vulkan: the models streamed on the Vulkan device (memory_vulkan.py; no adaptation or "
                         "daemon arm)")
    a = ap.parse_args(argv)
    if a.device == "vulkan":
        return _main_vulkan(a)
    from ..zoo import write_zoo

    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="inferd-membench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        names = [m for m in a.models.split(",") if m]
        zoo = work / "zoo"
        write_zoo(zoo, names + ["resnet50", "mobilenetv2"])
        data: dict[str, Any] = {"machine": machine_info(), "models": []}
        for m in names:
            t = time.perf_counter()
            try:
                r = bench_model(m, zoo / f"{m}.onnx", work, a.points, a.repeat, not a.no_ncnn,
                                faster=not a.no_faster_slicing)
            except Exception as e:
                r = {"model": m, "error": f"{type(e).__name__}: {e}"}
            r["bench_s"] = time.perf_counter() - t
            data["models"].append(r)
            print(f"{m}: done in {r['bench_s']:.0f} s", flush=True)
        if not a.no_adapt:
            data["adaptation"] = adaptation(zoo / "resnet50.onnx", work)
        if not a.no_daemon:
            try:
                data["outside"] = outside_view(zoo, work)
            except Exception as e:
                data["outside_error"] = f"{type(e).__name__}: {e}"
        return finish(a.out, a.tag, data, _table(data), _plot)
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
