"""``inferd bench --device cpu --layers``: where each layer loses against onnxruntime and against the roofline.

Per model, each engine in its own process with the same thread count:

* inferd: the warm executor run layer by layer with a timer around each (``CpuExecutor.run_timed``),
  median per layer over ``--repeat`` runs;
* onnxruntime: its own profiler (``enable_profiling``), per node, median over the same number of runs
  after a warm-up; its nodes are matched to inferd's layers by the tensor they produce (onnxruntime names
  a fused node after its last output, NCHWc ones with ``_nchwc``); its layout conversions (ReorderInput /
  ReorderOutput) and nodes inferd folded away are listed apart;
* the roofline of each layer: max(FLOPs / the measured FMA peak of the threads, bytes moved / the measured
  memory bandwidth), bytes being inputs, outputs, weights and workspace once each.

The table names, for the slowest models, the layers with the largest gap to onnxruntime.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..ops.conv_nchwc import FROM as FROM_BLOCKED, TO as TO_BLOCKED
from ..planner.layout import SUFFIX as BLOCKED_SUFFIX
from .common import fmt, ratio

_INFERD = r"""
import json, sys, time
import numpy as np
import inferd
from inferd import native
from inferd.planner.cost import io_nbytes, layer_flops
path, repeat, x_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
x = np.load(x_path)
m = inferd.load(path, device="cpu")
m.run({m.inputs[0].name: x}); m.wait_warm(60)
ex = m._exec
feeds = {m.inputs[0].name: x}
for _ in range(3):
    ex.run_timed(feeds)
# the FMA peak before, between and after the timings, their median: the 2-vCPU VM's slow spells lower the
# two-thread peak and the layers' times alike (one reading in a run of ten read 99 GFLOP/s against 205)
peaks = [native.fma_peak(native.num_threads())]
per = [ex.run_timed(feeds)[1] for _ in range(repeat)]
peaks.append(native.fma_peak(native.num_threads()))
whole = []
for _ in range(repeat):
    t = time.perf_counter(); ex.run(feeds); whole.append(time.perf_counter() - t)
peaks.append(native.fma_peak(native.num_threads()))
med = np.median(np.array(per), axis=0)
layers = []
for (layer, k), s in zip(ex.choice, med):
    consts = sum(layer.inputs[i].nbytes for i in layer.const_inputs if layer.inputs[i] is not None)
    layers.append({"name": layer.name, "op": layer.op, "kernel": k.name, "out": layer.node.outputs[0],
                   "absorbed": list(layer.node.attrs.get("_absorbed", [])),
                   "ms": float(s) * 1e3, "flops": float(layer_flops(layer)),
                   "bytes": int(io_nbytes(layer) + consts + k.workspace_nbytes(layer))})
big = np.ones(16 << 20, np.float32); dst = np.empty_like(big)
np.copyto(dst, big)
bw = max(2 * big.nbytes / (lambda t: (np.copyto(dst, big), time.perf_counter() - t)[1])(time.perf_counter())
         for _ in range(5))
print("RESULT " + json.dumps({"layers": layers, "whole_ms": float(np.median(whole)) * 1e3,
                              "peak_flops": float(np.median(peaks)), "peak_readings": peaks, "mem_bw": bw,
                              "threads": native.num_threads()}))
"""

_ORT = r"""
import json, os, re, sys, time
import numpy as np
import onnxruntime as ort
path, repeat, x_path, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
x = np.load(x_path)
so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.log_severity_level = 3
so.enable_profiling = True
# the profile goes to a scratch folder, never the caller's working directory
import tempfile; so.profile_file_prefix = os.path.join(tempfile.mkdtemp(prefix="inferd-ortprof-"), "ort")
s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
feeds = {s.get_inputs()[0].name: x}
for _ in range(3):
    s.run(None, feeds)
t0 = time.perf_counter_ns() // 1000
whole = []
for _ in range(repeat):
    t = time.perf_counter(); s.run(None, feeds); whole.append(time.perf_counter() - t)
f = s.end_profiling()
events = json.load(open(f))
os.remove(f); os.rmdir(os.path.dirname(f))
# runs are 'model_run' events; nodes belong to the runs after the warm-up (the last ``repeat`` of them)
runs = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")[-repeat:]
per: dict = {}
for e in events:
    if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time") or not runs or e["ts"] < runs[0]:
        continue
    name = e["name"][: -len("_kernel_time")]
    per.setdefault(name, {"op": e.get("args", {}).get("op_name", "?"), "us": []})["us"].append(e["dur"])
nodes = [{"name": k, "op": v["op"], "ms": float(np.median(v["us"])) / 1e3 * len(v["us"]) / max(1, len(runs))}
         for k, v in per.items()]
print("RESULT " + json.dumps({"nodes": nodes, "whole_ms": float(np.median(whole)) * 1e3}))
"""


def _child(code: str, args: list[str], threads: int) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               INFERD_NUM_THREADS=str(threads))
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=1200)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"per-layer child failed: {r.stderr[-2000:]}")
    return json.loads(lines[-1][7:])


_SUFFIX = re.compile(r"(_nchwc|_token_\d+|_fused)+$")


def match(layers: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """onnxruntime's time per inferd layer (by produced tensor or node name) and its unmatched nodes."""
    by: dict[str, str] = {}
    for ly in layers:
        if ly.get("op") in (TO_BLOCKED, FROM_BLOCKED):
            continue  # inferd's own layout conversions: the NCHW tensor a FROM writes is its blocked conv's output
        for t in ly.get("absorbed", []):  # tensors of the BN/activation/add fused into it
            by[t] = ly["name"]
        by[ly["out"]] = ly["name"]
        # a blocked layer writes the blocked twin of its tensor (``name::nchwc``); onnxruntime's NCHWc node is named
        # after the tensor with ``_nchwc``, which _SUFFIX strips
        by[ly["out"].removesuffix(BLOCKED_SUFFIX)] = ly["name"]
        by[ly["name"]] = ly["name"]
    got: dict[str, float] = {}
    rest = []
    for n in nodes:
        key = next((k for k in (n["name"], _SUFFIX.sub("", n["name"])) if k in by), None)
        if key is None:
            rest.append(n)
        else:
            got[by[key]] = got.get(by[key], 0.0) + n["ms"]
    return got, rest


def bench_layers(path: Path, threads: int, repeat: int, work: Path, rounds: int = 1) -> dict[str, Any]:
    """One model's per-layer table. With ``rounds`` > 1 the two engines' children run in turns, ``rounds`` each:
    the 2-vCPU VM's spells move every layer of a child together by 1.5-2x within minutes (googlenet's layers
    read 1.71x onnxruntime's in one pair of children and 0.97x in an alternating whole-model run minutes
    before), so each figure is the median over the rounds, the whole-model ratio the median of the rounds'
    ratios, and a layer's share of the FMA peak is taken against the peak its own child measured."""
    import numpy as np

    from ..frontend import import_model

    inp = import_model(path).inputs[0]
    xp = work / f"{path.stem}_x.npy"
    np.save(xp, np.random.default_rng(0).standard_normal(inp.shape).astype(inp.dtype))
    ours_r, theirs_r, got_r = [], [], []
    rest: list[dict[str, Any]] = []
    for _ in range(max(1, rounds)):
        ours_r.append(_child(_INFERD, [str(path), str(repeat), str(xp)], threads))
        theirs_r.append(_child(_ORT, [str(path), str(repeat), str(xp), str(threads)], threads))
        got, rest = match(ours_r[-1]["layers"], theirs_r[-1]["nodes"])
        got_r.append(got)
    ours = ours_r[0]
    readings = [p for o in ours_r for p in o.get("peak_readings", [o["peak_flops"]])]
    peak = float(np.median(readings))
    bw = max(o["mem_bw"] for o in ours_r)
    rows = []
    for i, ly in enumerate(ours["layers"]):
        per = [o["layers"][i]["ms"] for o in ours_r]
        ms = float(np.median(per))
        theirs_ms = [g[ly["name"]] for g in got_r if ly["name"] in g]
        shares = [ly["flops"] / (m / 1e3) / o["peak_flops"] for m, o in zip(per, ours_r) if m > 0 and o["peak_flops"]]
        roof = max(ly["flops"] / peak if peak else 0.0, ly["bytes"] / bw if bw else 0.0) * 1e3
        rows.append({**ly, "ms": ms, "ms_rounds": per, "ort_ms": float(np.median(theirs_ms)) if theirs_ms else None,
                     "roofline_ms": roof, "peak_share": float(np.median(shares)) if shares else None})
    whole = [o["whole_ms"] for o in ours_r]
    ort_whole = [t["whole_ms"] for t in theirs_r]
    ratios = [a / b for a, b in zip(whole, ort_whole) if b > 0]
    out = {"model": path.stem, "rounds": len(ours_r), "inferd_ms": float(np.median(whole)),
           "ort_ms": float(np.median(ort_whole)), "inferd_rounds_ms": whole, "ort_rounds_ms": ort_whole,
           "ratio": float(np.median(ratios)) if ratios else None,
           "ratio_range": [min(ratios), max(ratios)] if ratios else None,
           "inferd_layer_sum_ms": sum(r["ms"] for r in rows),
           "ort_node_sum_ms": float(np.median([sum(n["ms"] for n in t["nodes"]) for t in theirs_r])),
           "ort_unmatched": sorted(rest, key=lambda n: -n["ms"]), "peak_flops": peak,
           "peak_readings": readings, "mem_bw": bw, "threads": ours["threads"], "layers": rows}
    out["gemm"] = gemm_summary(out)
    return out


#: the layers issue 17's "GEMM-bound layers at 70% of the FMA peak" counts: convolutions and products whose
#: FLOPs at the peak take longer than their bytes at the copy bandwidth (the roofline says compute), less the
#: depthwise and pooling-like kernels, whose FLOPs no register tile reuses
GEMM_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "inferd.ConvNchwc", "inferd.MatMulT", "inferd.LinearT")
PEAK_GOAL = 0.70


def gemm_bound(r: dict[str, Any]) -> list[dict[str, Any]]:
    """``r``'s layers that the roofline calls compute-bound GEMM work (see GEMM_OPS)."""
    peak, bw = r["peak_flops"], r["mem_bw"]
    return [x for x in r["layers"] if x["op"] in GEMM_OPS and "depthwise" not in x["kernel"]
            and "dw" not in x["kernel"] and peak and bw and x["flops"] / peak > x["bytes"] / bw and x["ms"] > 0]


def gemm_summary(r: dict[str, Any]) -> dict[str, Any]:
    """How many GEMM-bound layers reach PEAK_GOAL of the FMA peak, their share of those layers' time, and the
    layers' aggregate share of the peak (their FLOPs over their time; a Winograd layer counts its direct FLOPs)."""
    xs = gemm_bound(r)
    t = sum(x["ms"] for x in xs)
    hit = [x for x in xs if (x["peak_share"] or 0.0) >= PEAK_GOAL]
    flops = sum(x["flops"] for x in xs)
    return {"layers": len(xs), "at_goal": len(hit), "time_ms": t,
            "time_share_at_goal": sum(x["ms"] for x in hit) / t if t else None,
            "aggregate_peak_share": flops / (t / 1e3) / r["peak_flops"] if t else None}


def _ratio(r: dict[str, Any]) -> float | None:
    """inferd / onnxruntime for the whole model: the median of the rounds' ratios where there were rounds."""
    return r["ratio"] if r.get("ratio") is not None else ratio(r["inferd_ms"], r["ort_ms"])


def table(results: list[dict[str, Any]], top: int = 12, slowest: int = 3) -> str:
    """Per model the totals; for the ``slowest`` models (by inferd / onnxruntime) the ``top`` layers by gap."""
    lines = ["| model | inferd ms | ort ms | inferd / ort | sum of inferd layers ms | sum of ort nodes ms | "
             "ort layout conversions ms | FMA peak GFLOP/s | memory GB/s |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        reorder = sum(n["ms"] for n in r["ort_unmatched"] if n["op"].startswith("Reorder"))
        rr = _ratio(r)
        span = f" ({r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f})" if r.get("rounds", 1) > 1 and r.get(
            "ratio_range") else ""
        lines.append(f"| {r['model']} | {r['inferd_ms']:.2f} | {r['ort_ms']:.2f} | {fmt(rr, '.2f')}{span} | "
                     f"{r['inferd_layer_sum_ms']:.2f} | {r['ort_node_sum_ms']:.2f} | {reorder:.2f} | "
                     f"{r['peak_flops'] / 1e9:.0f} | {r['mem_bw'] / 1e9:.1f} |")
    lines += ["", f"GEMM-bound layers (convolutions and products the roofline calls compute-bound, depthwise left "
              f"out) at {PEAK_GOAL:.0%} or more of the FMA peak:", "",
              "| model | GEMM-bound layers | at >= 70% | their share of those layers' time | aggregate % of peak | "
              "those layers' ms |", "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        g = r.get("gemm") or gemm_summary(r)
        pct = [None if g[k] is None else g[k] * 100 for k in ("time_share_at_goal", "aggregate_peak_share")]
        lines.append(f"| {r['model']} | {g['layers']} | {g['at_goal']} | {fmt(pct[0], '.0f')}% | "
                     f"{fmt(pct[1], '.0f')}% | {g['time_ms']:.2f} |")
    worst = sorted(results, key=lambda r: -(_ratio(r) or 0))[:slowest]
    for r in worst:
        lines += ["", f"### {r['model']}: the {top} layers with the largest gap (inferd - onnxruntime)", "",
                  "| layer | op | kernel | inferd ms | ort ms | gap ms | roofline ms | inferd / roofline | % of FMA peak |",
                  "|---|---|---|---:|---:|---:|---:|---:|---:|"]
        rows = sorted(r["layers"], key=lambda x: -(x["ms"] - (x["ort_ms"] if x["ort_ms"] is not None else 0.0)))[:top]
        for x in rows:
            gap = x["ms"] - x["ort_ms"] if x["ort_ms"] is not None else None
            share = x["peak_share"] * 100 if x["peak_share"] is not None else None
            lines.append(f"| {x['name']} | {x['op']} | {x['kernel']} | {x['ms']:.3f} | {fmt(x['ort_ms'], '.3f')} | "
                         f"{fmt(gap, '.3f')} | {x['roofline_ms']:.3f} | {fmt(ratio(x['ms'], x['roofline_ms']), '.1f')} | "
                         f"{fmt(share, '.0f')} |")
        un = [n for n in r["ort_unmatched"] if not n["op"].startswith("Reorder")][:5]
        if un:
            lines.append("")
            lines.append("onnxruntime nodes with no inferd layer of that name (folded or fused differently): " +
                         ", ".join(f"{n['name']} ({n['op']}, {n['ms']:.3f} ms)" for n in un))
    return "\n".join(lines) + "\n"


def run(paths: dict[str, Path], threads: int, repeat: int, rounds: int = 1) -> list[dict[str, Any]]:
    out = []
    with tempfile.TemporaryDirectory() as d:
        for name, p in paths.items():
            r = bench_layers(Path(p), threads, repeat, Path(d), rounds)
            out.append(r)
            print(f"{name:20s} layers: inferd {r['inferd_ms']:.2f} ms (sum {r['inferd_layer_sum_ms']:.2f}), "
                  f"ort {r['ort_ms']:.2f} ms (sum {r['ort_node_sum_ms']:.2f})", flush=True)
    return out
