"""``inferd bench quant``: int8 models on the CPU against inferd's own fp32 and onnxruntime on the same QDQ model.

For each zoo model and quantisation scheme (``inferd.zoo.quant``: onnxruntime's ``quantize_static`` with a few
seeded calibration inputs, after ``quant_pre_process``; the fp32 twin is the pre-processed fp32 model, the same
graph unquantised), alternating engines (on the CPU each in a process of its own, as ``inferd bench`` times them):

* warm latency (median of ``--repeat`` runs): inferd int8, inferd fp32, onnxruntime on the QDQ model (default
  session, all graph optimisations, which fuse QDQ into its int8 kernels; same thread count), onnxruntime fp32;
* cold latency: a fresh process loads the ONNX file (page cache of it dropped) and answers one request;
* stored weight bytes: the raw weights in inferd's package store (int8 and fp32 compare weight for weight, not
  two plans' choices of transformed weights to store beside them; the whole store beside it) and, for
  reference, the ONNX file's initializers (onnxruntime's QDQ file); resident weight bytes (what the loaded
  executor holds);
* error against onnxruntime on the same quantised model, in output quantisation steps.

``--device vulkan`` loads both inferd models on the Vulkan device (onnxruntime stays on the CPU); ``--int8-gpu``
forces the Vulkan int8 kernels where the placement would keep int8 layers on the CPU (a CPU-type device).

Goals (issue 20, CPU int8 on the 2-core machine): warm <= 1.0x onnxruntime on the QDQ model and <= 0.5x inferd's
fp32; int8 weight bytes <= 0.27x fp32. The load average is recorded with every model: the machine is shared.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .common import drop_page_cache, fmt, machine_info, median_ms, ramp, ratio, time_calls, write_results

DEFAULT_MODELS = "resnet18,mobilenetv2,squeezenet1_1,googlenet"
DEFAULT_SCHEMES = "qdq_u8s8_pc,qdq_s8s8"

_COLD_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np, inferd
path, shape = sys.argv[1], tuple(json.loads(sys.argv[2]))
x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
m = inferd.load(path, device=sys.argv[3], kernels=json.loads(sys.argv[4]) or None)
m.run({m.input_names[0]: x})
print(json.dumps({"cold_ms": (time.perf_counter() - t0) * 1e3}))
"""


def _cold_ms(path: Path, shape: tuple[int, ...], repeat: int, device: str = "cpu",
             kernels: dict[str, str] | None = None) -> float | None:
    out = []
    for _ in range(repeat):
        drop_page_cache(path)
        r = subprocess.run([sys.executable, "-c", _COLD_CHILD, str(path), json.dumps(list(shape)), device,
                            json.dumps(kernels or {})],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            return None
        out.append(json.loads(r.stdout.strip().splitlines()[-1])["cold_ms"])
    return float(np.median(out)) if out else None


def _stored_bytes(path: Path) -> int:
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(path))
    return int(sum(numpy_helper.to_array(i).nbytes for i in m.graph.initializer))


@functools.lru_cache(maxsize=None)
def _package_bytes(src: Path, device: str) -> tuple[int, int]:
    """(raw weight bytes, whole store bytes) of the package inferd compiles from ``src`` (planned without
    profiling: the store, not the plan's timings, is what is measured). The raw entries are the weights
    themselves, which any plan can be served from; the rest are the transformed weights this plan reads.
    Once per file and device in a run: each scheme's fp32 twin is the same file."""
    import shutil
    import tempfile

    from ..package import compile_model
    from ..store import WeightsStore, entries_of

    tmp = Path(tempfile.mkdtemp(prefix="ifqpkg", dir="/tmp"))
    try:
        out = compile_model(src, tmp / "p", device=device, profile=False)
        with WeightsStore(out / "weights.store") as st:
            raw = sum(e.size for e in entries_of(st) if e.variant == "raw")
        return raw, sum(f.stat().st_size for f in out.iterdir() if f.name != "plan.bin")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _output_step(path: Path) -> float | None:
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(path))
    inits = {i.name: i for i in m.graph.initializer}
    out = m.graph.output[0].name
    for n in m.graph.node:
        if out in n.output and n.op_type == "DequantizeLinear" and n.input[1] in inits:
            return float(numpy_helper.to_array(inits[n.input[1]]).reshape(-1)[0])
    return None


def _ort_session(path: Path, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def bench_model(name: str, scheme: str, repeat: int, cold_repeat: int, threads: int, device: str = "cpu",
                int8_gpu: bool = False) -> dict[str, Any]:
    import inferd
    from inferd.zoo import quant as zquant

    from ..zoo import write_zoo
    from .. import native

    cache = Path(os.environ.get("INFERD_ZOO_DIR") or Path.home() / ".cache" / "inferd-test-zoo")
    src = write_zoo(cache, [name])[name]
    qpath = zquant.quantized(src, scheme)
    fpath = src.with_name(f"{src.stem}.pre.onnx")
    feeds = zquant.calibration_feeds(qpath, n=1, seed=7)[0]
    iname = next(iter(feeds))
    x = feeds[iname]
    native.set_num_threads(threads)
    from ..ops.quant_vulkan import INT8_KERNELS

    k8 = INT8_KERNELS if int8_gpu else None
    # both on their warm path, and their idle-time profiling done, before any run counts: the warm switch and the
    # package's profiling (refine_done) run in the background after the first run, and timing under them measured
    # mobilenetv2's int8 model 1.3-2x slower than it runs
    def settle(m: Any) -> Any:
        m.run({iname: x})
        m.wait_warm(60)
        if m.refine_done is not None:
            m.refine_done.wait(120)
        return m

    load0 = os.getloadavg()[0]
    res: dict[str, Any] = {"model": name, "scheme": scheme, "device": device, "int8_gpu": int8_gpu}
    t: dict[str, list[float]] = {}
    paired: dict[str, list[float]] = {}
    separate = device == "cpu" and not int8_gpu
    if separate:
        # Each engine in a process of its own (``engine_bench.time_pair``, as ``inferd bench`` times the zoo),
        # taking turns in slices of 5 timed runs, 0.15 s apart, the order alternating: in one process onnxruntime's
        # pool threads spin for tens of milliseconds after its calls and the engines share one allocator and one
        # set of cores' caches (inferd's int8 resnet50 took 17-21 ms a run there with the fp32 engines loaded beside
        # it, 12.6-13.7 ms without). The 2-core VM also runs at two speeds for seconds at a time, so each ratio
        # reported is the median of each round's own (a round is two adjacent slices): inferd / onnxruntime on the
        # same model, and inferd int8 / inferd fp32 (two loops minutes apart had compared different spells).
        from .engine_bench import time_pair

        n = max(3, repeat // 5)
        for prec, path in (("int8", qpath), ("fp32", fpath)):
            r = time_pair(("inferd", path), ("ort", path), device, threads, 5, n)
            t[f"inferd_{prec}"] = [x for rnd in r["times"][0] for x in rnd]
            t[f"ort_{prec}"] = [x for rnd in r["times"][1] for x in rnd]
            paired[prec] = r["ratios"]
        v = time_pair(("inferd", qpath), ("inferd", fpath), device, threads, 5, n)["ratios"]
        res["warm_vs_fp32_paired"] = round(float(np.median(v)), 3)
        res["warm_vs_fp32_paired_iqr"] = [round(float(np.percentile(v, q)), 3) for q in (25, 75)]
        res["timing"] = "separate processes"
    m8 = settle(inferd.load(qpath, device=device, kernels=k8))
    s8 = _ort_session(qpath, threads)

    def rounds(prec: str, ours: Callable[[], Any], theirs: Callable[[], Any]) -> None:
        # in one process (inferd on a GPU): alternating blocks of 5 calls, each after a 0.15 s ramp of its own (the
        # other engine's spin-down passes in it); each round's ratio between its own two blocks
        calls = {f"inferd_{prec}": ours, f"ort_{prec}": theirs}
        ratios = paired.setdefault(prec, [])
        for rnd in range(max(1, repeat // 5)):
            block: dict[str, float] = {}
            for k in (list(calls) if rnd % 2 == 0 else list(calls)[::-1]):
                fn = calls[k]
                ramp(fn, 0.15)
                v = time_calls(fn, 5, warmup=0)
                t.setdefault(k, []).extend(v)
                block[k] = float(np.median(v))
            ratios.append(block[f"inferd_{prec}"] / block[f"ort_{prec}"])

    if not separate:
        # the int8 pair before the fp32 engines are loaded: with both in the process inferd's int8 runs slowed
        rounds("int8", lambda: m8.run({iname: x}), lambda: s8.run(None, {iname: x}))
    want = s8.run(None, {iname: x})[0]
    del s8
    m32 = settle(inferd.load(fpath, device=device))
    if not separate:
        s32 = _ort_session(fpath, threads)
        rounds("fp32", lambda: m32.run({iname: x}), lambda: s32.run(None, {iname: x}))
        del s32
    for k, v in t.items():
        res[f"{k}_warm_ms"] = median_ms(v)
    for p, v in paired.items():
        res[f"warm_vs_ort_{p}_paired"] = round(float(np.median(v)), 3)
        res[f"warm_vs_ort_{p}_paired_iqr"] = [round(float(np.percentile(v, q)), 3) for q in (25, 75)]
    res["loadavg"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    got = m8.run({iname: x})
    got = np.asarray(list(got.values())[0] if isinstance(got, dict) else got[0])
    step = _output_step(qpath)
    d = np.abs(got - want)
    res["output_step"] = step
    res["err_max_steps"] = float(d.max() / step) if step else None
    res["err_frac_differing"] = float((d > (step or 0) * 0.5).mean()) if step else None
    res["err_max_abs"] = float(d.max())
    got32 = m32.run({iname: x})
    got32 = np.asarray(list(got32.values())[0] if isinstance(got32, dict) else got32[0])
    res["int8_vs_fp32_max_abs"] = float(np.abs(got - got32).max())
    res["stored_bytes_int8"], res["stored_bytes_fp32"] = _stored_bytes(qpath), _stored_bytes(fpath)
    res["package_raw_bytes_int8"], res["package_bytes_int8"] = _package_bytes(qpath, device)
    res["package_raw_bytes_fp32"], res["package_bytes_fp32"] = _package_bytes(fpath, device)
    res["resident_weights_int8"] = int(m8.memory_breakdown.get("weights_bytes", 0))
    res["resident_weights_fp32"] = int(m32.memory_breakdown.get("weights_bytes", 0))
    res["int8_kernels"] = sorted(set(m8.kernels.values()))
    del m8, m32
    if cold_repeat > 0:
        res["inferd_int8_cold_ms"] = _cold_ms(qpath, tuple(x.shape), cold_repeat, device, k8)
        res["inferd_fp32_cold_ms"] = _cold_ms(fpath, tuple(x.shape), cold_repeat, device)
    res["warm_vs_ort"] = ratio(res["inferd_int8_warm_ms"], res["ort_int8_warm_ms"])
    res["warm_vs_fp32"] = ratio(res["inferd_int8_warm_ms"], res["inferd_fp32_warm_ms"])
    res["stored_ratio"] = ratio(res["stored_bytes_int8"], res["stored_bytes_fp32"])
    res["package_raw_ratio"] = ratio(res["package_raw_bytes_int8"], res["package_raw_bytes_fp32"])
    res["package_ratio"] = ratio(res["package_bytes_int8"], res["package_bytes_fp32"])
    res["resident_ratio"] = ratio(res["resident_weights_int8"], res["resident_weights_fp32"])
    return res


def vs_fp32(r: dict[str, Any]) -> str:
    """The int8 / fp32 cell: the paired ratio with its interquartile range where the row has one, else the ratio of
    the two loops' medians."""
    if r.get("warm_vs_fp32_paired") is None:
        return f"{fmt(r.get('warm_vs_fp32'), '.2f')}x"
    lo, hi = r.get("warm_vs_fp32_paired_iqr") or [None, None]
    return f"{fmt(r['warm_vs_fp32_paired'], '.2f')}x ({fmt(lo, '.2f')}-{fmt(hi, '.2f')})"


def table(rows: list[dict[str, Any]], machine: dict[str, Any]) -> str:
    dev = rows[0].get("device", "cpu") if rows else "cpu"
    how = f"inferd on {dev}" + (" with the Vulkan int8 kernels forced" if rows and rows[0].get("int8_gpu") else "")
    if dev == "cpu" and (machine.get("kernels") or {}).get("int8"):
        how += f" (int8 kernels: {machine['kernels']['int8']})"
    lines = [f"# inferd bench quant: {machine.get('date')} on {machine.get('host')} ({machine.get('cpu')}, "
             f"{machine.get('cores')} cores; machine shared, load average per row); {how}; onnxruntime on the CPU\n",
             "Goals: int8 warm <= 1.0x onnxruntime (same QDQ model) and <= 0.5x inferd fp32; weight bytes <= 0.27x fp32.\n",
             "Weight bytes, int8 / fp32: *stored* is the raw weights in inferd's package store (the whole store, "
             "which adds the transformed weights its plan reads, in brackets); *QDQ file* the ONNX initializers "
             "onnxruntime's quantizer wrote, for reference; *resident* what the loaded executors hold.\n",
             "*vs ort*: the median over rounds of each round's inferd int8 / onnxruntime int8 (adjacent slices of 5 "
             "timed runs, the interquartile range in brackets), so that a spell of the machine running slower for a "
             "while compares like with like; the ratio of the whole loop's medians beside it. On the CPU each engine "
             "runs in a process of its own (`inferd bench`'s warm children: slices 0.15 s apart, the order "
             "alternating); with inferd on a GPU both share this process. *vs fp32*: inferd int8 / inferd fp32, paired "
             "the same way on the CPU (interquartile range in brackets), else the two loops' medians.\n",
             "| model | scheme | int8 ms | fp32 ms | ort int8 ms | ort fp32 ms | vs ort | vs ort (medians) | vs fp32 | "
             "cold int8/fp32 ms | stored | QDQ file | resident | err (steps, frac) | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['scheme']} | error: {r['error']} |" + " |" * 12)
            continue
        iqr = r.get("warm_vs_ort_int8_paired_iqr") or [None, None]
        lines.append(
            f"| {r['model']} | {r['scheme']} | {fmt(r['inferd_int8_warm_ms'], '.2f')} | {fmt(r['inferd_fp32_warm_ms'], '.2f')} | "
            f"{fmt(r['ort_int8_warm_ms'], '.2f')} | {fmt(r['ort_fp32_warm_ms'], '.2f')} | "
            f"{fmt(r.get('warm_vs_ort_int8_paired'), '.2f')}x ({fmt(iqr[0], '.2f')}-{fmt(iqr[1], '.2f')}) | "
            f"{fmt(r['warm_vs_ort'], '.2f')}x | "
            f"{vs_fp32(r)} | {fmt(r.get('inferd_int8_cold_ms'), '.0f')} / {fmt(r.get('inferd_fp32_cold_ms'), '.0f')} | "
            f"{fmt(r.get('package_raw_ratio'), '.3f')}x ({fmt(r.get('package_ratio'), '.3f')}x) | "
            f"{fmt(r['stored_ratio'], '.3f')}x | {fmt(r['resident_ratio'], '.3f')}x | "
            f"{fmt(r['err_max_steps'], '.2f')}, {fmt(r['err_frac_differing'], '.3f')} | {r['loadavg']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="inferd bench quant", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=DEFAULT_MODELS)
    p.add_argument("--schemes", default=DEFAULT_SCHEMES)
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--cold-repeat", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--device", choices=("cpu", "vulkan"), default="cpu", help="where inferd runs (onnxruntime: the CPU)")
    p.add_argument("--int8-gpu", action="store_true", help="force the Vulkan int8 kernels (a CPU-type device keeps "
                                                           "int8 layers on the CPU otherwise)")
    args = p.parse_args(argv)
    machine = machine_info()
    rows = []
    for name in [m for m in args.models.split(",") if m]:
        for scheme in [s for s in args.schemes.split(",") if s]:
            try:
                r = bench_model(name, scheme, args.repeat, args.cold_repeat, args.threads, args.device, args.int8_gpu)
            except Exception as e:  # one model's failure is a row, not the end of the run
                r = {"model": name, "scheme": scheme, "error": f"{type(e).__name__}: {e}"}
            rows.append(r)
            print(json.dumps(r, default=str), flush=True)
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    data = {"machine": machine, "threads": args.threads, "results": rows}
    tag = "" if args.device == "cpu" else f"_{args.device}" + ("_int8gpu" if args.int8_gpu else "")
    jp, mp = write_results(args.out, f"quant{tag}_{machine['host']}", data, table(rows, machine))
    print(table(rows, machine))
    print(f"wrote {jp} and {mp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
