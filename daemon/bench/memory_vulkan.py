"""``inferd bench memory --device vulkan``: models streamed on the Vulkan device inside memory budgets.

Per model, on the process's Vulkan device: the reference is the model whole and resident (``VulkanModel``,
warm); the smallest feasible budget of the Vulkan streaming runtime (kernel fallback and slicing allowed:
``vulkan_kernel_memory``) and the smallest at which every weight stays resident; ``--points`` budgets between
them (geometric). At each: preloading and the on-demand baseline, through the page cache and bypassing it,
each run alternating with a warm run of the resident model (the machine's speed drifts). Reported: latency,
the arena and what the model holds (what the budget counts; the instrumented allocator of the tests proves
the arena's high-water mark stays inside it), the bytes read per run, the GPU submissions per run. Peers in
children of their own: onnxruntime (CPU; peak RSS) and ncnn with Vulkan (fp32; peak RSS, which counts its
device memory where that is the host's: lavapipe, an integrated GPU; on a discrete GPU it does not).
"""
from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import fmt

MB = 1 << 20


def bench_model(name: str, onnx: Path, work: Path, points: int, repeat: int, with_ncnn: bool) -> dict[str, Any]:
    from ..frontend import import_model
    from ..planner.flex import BudgetTooSmall
    from ..planner.slicing import MemConfig
    from ..runtime.blockio import read_rate
    from ..runtime.stream import RUN, StreamingExecutor
    from ..runtime.stream_compile import compile_streamed, open_streamed
    from ..vulkan.device import get_device
    from ..vulkan.model import VulkanModel
    from ..vulkan.stream import caps_of, device_facts, vulkan_fit, vulkan_kernel_memory
    from .memory_child import budget_range, median_ms, peers, repeats_for

    dev = get_device()
    facts = device_facts(dev)
    km = vulkan_kernel_memory(caps_of(facts))
    align = int(facts["align"])
    res: dict[str, Any] = {"model": name, "device": dev.name, "device_type": dev.device_type,
                           "shares_host_memory": bool(dev.shares_host_memory)}
    graph = import_model(onnx)
    x = np.random.default_rng(0).standard_normal(graph.inputs[0].shape).astype(np.float32)
    xf = work / f"{name}_x.npy"
    np.save(xf, x)
    whole = VulkanModel(graph, device=dev)
    wfeeds = {graph.inputs[0].name: x}
    ref = whole.run(wfeeds)
    res["warm_ms"] = median_ms(lambda: whole.run(wfeeds), repeat)
    res["whole_memory_bytes"] = int(whole.memory_bytes)
    repeat = repeats_for(res["warm_ms"], repeat)
    res["repeat"] = repeat
    skel0, store, cfg_min = budget_range(res, onnx, graph, work, points, {"vulkan": facts}, {"device": dev},
                                         {"km": km, "alignment": align})
    small, default_min, budgets = res["small_bytes"], res["default_min_budget"], res["budgets"]
    res["disk_bw_bytes_s"] = read_rate(store, StreamingExecutor.bypass_readers, RUN)
    _reserve, fit = vulkan_fit(graph, facts)
    cfgs = {}
    for b in budgets:  # (the model's graph goes before the runs: fitted here)
        try:
            cfgs[b] = MemConfig() if b >= default_min else fit(b - small)
        except BudgetTooSmall:
            cfgs[b] = cfg_min
    del graph
    gc.collect()
    runs = []
    for b in budgets:
        cfg = cfgs[b]
        skel = skel0 if b >= default_min else compile_streamed(onnx, 0, work, config=cfg, in_child=False,
                                                               vulkan=facts)
        for read in ("cache", "bypass"):
            exs = []
            for mode in ("preload", "ondemand"):
                try:
                    ex = open_streamed(skel, b, mode=mode, read=read, device=dev)
                except BudgetTooSmall as e:  # the small parameters took more than the slicing estimated
                    runs.append({"budget": b, "mode": mode, "read": read, "error": str(e)[:200]})
                    continue
                got = ex.run(wfeeds)
                err = max(float(np.abs(got[k] - ref[k]).max() / max(float(np.abs(ref[k]).max()), 1e-30))
                          for k in ref)
                ex.run(wfeeds)
                exs.append((mode, ex, err))
            lat: list[list[float]] = [[] for _ in exs]
            warm: list[list[float]] = [[] for _ in exs]
            rd: list[list[float]] = [[] for _ in exs]
            for _ in range(repeat):
                for i, (_m, ex, _e) in enumerate(exs):
                    t = time.perf_counter()
                    whole.run(wfeeds)
                    warm[i].append(time.perf_counter() - t)
                    t = time.perf_counter()
                    ex.run(wfeeds)
                    lat[i].append(time.perf_counter() - t)
                    rd[i].append(ex.stats.get("read_s", 0.0))
            for i, (mode, ex, err) in enumerate(exs):
                runs.append({"budget": b, "mode": mode, "read": read, "config": cfg.to_dict(),
                             "latency_ms": float(np.median(lat[i])) * 1e3, "latency_all_ms": [v * 1e3 for v in lat[i]],
                             "warm_ms": float(np.median(warm[i])) * 1e3, "warm_all_ms": [v * 1e3 for v in warm[i]],
                             "read_ms": float(np.median(rd[i])) * 1e3, "rel_err": err,
                             "arena_bytes": int(ex.arena.nbytes), "memory_bytes": int(ex.memory_bytes),
                             "streamed_bytes": int(ex.streamed_bytes), "segments": int(ex.segments),
                             "loadavg": list(os.getloadavg())})
                ex.close()
    whole.close()
    res["runs"] = runs
    peers(res, name, onnx, x, xf, work, repeat,
          [("ncnn_vulkan", {"plain": False, "vulkan": True})] if with_ncnn else [])
    return res


def table(data: dict[str, Any]) -> str:
    m = data["machine"]
    lines = [f"# inferd bench memory --device vulkan ({m['date']}, {m['cpu']}, {m['cores']} cores, load "
             f"{m['loadavg']}; shared machine)", ""]
    lines += ["Budgets are what the model may hold (arena + small parameters, the arena host-visible memory the "
              "loaders read into). bound = max(warm, streamed bytes / disk bandwidth), warm: the model whole and "
              "resident (VulkanModel), run before every streamed run; ratio: median over the repeats of each run / "
              "its own bound; vs on-demand: median of each preload run / the on-demand run of the same round. "
              "Goal (issue 9): ratio <= 1.15, vs on-demand < 1. Peers: peak RSS above their baseline (ncnn's "
              "counts its device memory only where that is the host's).", ""]
    for r in data["models"]:
        if "error" in r:
            lines += [f"## {r['model']}: error {r['error']}", ""]
            continue
        bw = r["disk_bw_bytes_s"]
        lines += [f"## {r['model']} on {r['device']} ({r['device_type']}, memory shared with the host: "
                  f"{r['shares_host_memory']})", "",
                  f"weights {r['weights_bytes'] / MB:.1f} MiB; min feasible budget {r['min_budget'] / MB:.2f} MiB "
                  f"(config {r['min_config']}); default kernels' min {r['default_min_budget'] / MB:.2f} MiB; "
                  f"everything resident at {r['full_budget'] / MB:.1f} MiB; the whole model holds "
                  f"{r['whole_memory_bytes'] / MB:.1f} MiB; warm {r['warm_ms']:.1f} ms; disk {bw / 1e6:.0f} MB/s", ""]
        for key in ("ort", "ncnn_vulkan"):
            p = r.get(key)
            if p:
                lines.append(f"- {key}: peak RSS +{p['peak_rss_delta_bytes'] / MB:.1f} MiB, {p['latency_ms']:.1f} ms")
        if r.get("ncnn_error"):
            lines.append(f"- ncnn: {r['ncnn_error'][:200]}")
        lines += ["", "| budget MiB | mode | read | latency ms | warm ms | read ms | streamed MiB | held MiB | "
                  "submits | bound ms | ratio | vs on-demand | rel. error |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        od = {(c["budget"], c["read"]): c for c in r["runs"] if c.get("mode") == "ondemand" and "error" not in c}
        met_b = met_o = n_pre = 0
        for c in r["runs"]:
            if "error" in c:
                lines.append(f"| {c['budget'] / MB:.2f} | {c['mode']} | {c['read']} | {c['error']} |")
                continue
            rb = c["streamed_bytes"] / bw * 1e3
            ratios = [t / max(w, rb) for t, w in zip(c["latency_all_ms"], c["warm_all_ms"])]
            q50 = float(np.median(ratios))
            vs = None
            if c["mode"] == "preload" and (c["budget"], c["read"]) in od:
                o = od[(c["budget"], c["read"])]
                vs = float(np.median([p / q for p, q in zip(c["latency_all_ms"], o["latency_all_ms"])]))
                n_pre += 1
                met_b += q50 <= 1.15
                met_o += vs < 1.0
            lines.append(f"| {c['budget'] / MB:.2f} | {c['mode']} | {c['read']} | {c['latency_ms']:.1f} | "
                         f"{c['warm_ms']:.1f} | {c['read_ms']:.1f} | {c['streamed_bytes'] / MB:.1f} | "
                         f"{c['memory_bytes'] / MB:.2f} | {c['segments']} | {max(c['warm_ms'], rb):.1f} | {q50:.2f} | "
                         f"{fmt(vs, '.2f')} | {c['rel_err']:.1e} |")
        lines += ["", f"preloading: within 1.15 x bound at {met_b} of {n_pre} (budget, read mode) points; faster than "
                  f"on-demand at {met_o} of {n_pre}", ""]
    return "\n".join(lines) + "\n"


def plot(results: list[dict[str, Any]], path: Path) -> None:
    from .memory_child import plot_latency

    plot_latency(results, path, [("preload", "cache", "fit", "-o"), ("preload", "bypass", "fit", "-s"),
                                 ("ondemand", "cache", "fit", "--o"), ("ondemand", "bypass", "fit", "--s")],
                 [("ort", "^"), ("ncnn_vulkan", "v")], "inferd Vulkan warm, whole",
                 lambda r: f"{r['model']} ({r['device']})")
