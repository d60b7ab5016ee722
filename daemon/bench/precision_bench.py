"""Reduced precision: per model, each precision *arm* (fp32, fp16; an int8 arm plugs into ``ARMS``) of
inferd against its own fp32 and a peer, in one run.

Per arm, in fresh processes in the state of a daemon that is up (loader threads started; on Vulkan the device
created with its device pool and its listed pipelines made resident) before the clock starts:
  * warm latency (median of ``--warm`` runs after the warm switch),
  * cold latency from the compiled package: ``inferd.load`` of the package + first inference, the package
    files evicted from the page cache, the shader caches (SPIR-V, VkPipelineCache, driver) filled by the
    compiling process before (the daemon's case after a model's first registration),
  * stored bytes (the package's weights store) and resident bytes (device weight allocations),
  * the error against inferd's fp32 arm and against onnxruntime (fp32), as max |d| / max |ref|.
Peer on Vulkan: ncnn with its default fp16 options (fp16 packed, storage and arithmetic on; ``pnnx`` writes
fp16 weights by default), the same model converted by pnnx, measured the same way (cold = load + first
inference, files evicted, driver cache filled by a first process).

    inferd bench precision [--device vulkan|cpu] [--models squeezenet1_1,mobilenetv2] [--warm N]
                           [--arms fp32,fp16] [--no-ncnn] [--out bench/results] [--tag NAME]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .common import drop_page_cache, fmt, machine_info, ratio, run_child, write_results


@dataclass(frozen=True)
class Arm:
    """One way to run a model: its name in the tables, ``inferd.load``'s precision, and (None: the zoo's own)
    a function making the model file this arm runs from the fp32 one (an int8 arm quantises here)."""

    name: str
    precision: str
    model_for: Callable[[Path, Path], Path] | None = None
    #: more ``inferd.load`` options (JSON-able)
    options: tuple[tuple[str, Any], ...] = ()


#: fp16: fp16 weights and fp16 arithmetic (asked: fp32 arithmetic is the default): the shared-memory GEMM
#: convolutions on the matrix units where the device has cooperative matrices, else fp16 tile sums where it has
#: shaderFloat16; fp16w: fp16 weights, fp32 arithmetic
ARMS: dict[str, Arm] = {"fp32": Arm("fp32", "fp32"),
                        "fp16": Arm("fp16", "fp16", options=(("fp16_arithmetic", True),)),
                        "fp16w": Arm("fp16w", "fp16", options=(("fp16_arithmetic", False),))}

def load_options(arm: str) -> dict[str, Any]:
    """``inferd.load``'s precision options of an arm of ``ARMS`` (the device scripts load the arms the same way)."""
    a = ARMS[arm]
    return {"precision": a.precision, **dict(a.options)}


_INFERD_CHILD = r'''
import json, os, sys, time, numpy as np
from pathlib import Path
import inferd
from inferd.bench.common import ramp
from inferd.vulkan.device import get_device
src, device, prec, pkgroot, nwarm, ref, outp, opts = sys.argv[1:9]
nwarm = int(nwarm)
# the state of a daemon that is up (as the cold bench's child): its loader threads, and on Vulkan the device with
# its device pool and the pipelines it made resident at its start (the daemon's defaults)
from inferd.bench.common import daemon_state
daemon_state(device, DEVICE_POOL, RESIDENT_PIPELINES)
x = np.load(ref)["x"]
t = time.perf_counter()
m = inferd.load(src, device=device, cache_dir=pkgroot, precision=prec, **json.loads(opts))
y = m.run({m.inputs[0].name: x})
cold = time.perf_counter() - t
res = {"cold_ms": cold * 1e3}
if nwarm:
    m.wait_loaded()
    for _ in range(3):
        m.run({m.inputs[0].name: x})
    m.wait_warm(60)
    ramp(lambda: m.run({m.inputs[0].name: x}))
    ws = []
    for _ in range(nwarm):
        t = time.perf_counter(); m.run({m.inputs[0].name: x}); ws.append(time.perf_counter() - t)
    res["warm_ms"] = 1e3 * float(np.median(ws))
    res["warm_min_ms"] = 1e3 * float(np.min(ws))
out = list(y.values())[0]
np.save(outp, out)
r = np.load(ref)["y"]
res["err_ort"] = float(np.abs(out - r).max() / np.abs(r).max())
mb = m.memory_breakdown
res["resident_weights_bytes"] = int(mb.get("weights_bytes", 0))
res["resident_bytes"] = int(m.memory_bytes)
res["package"] = str(m.package) if m.package else None
if m.package:
    res["stored_bytes"] = (Path(m.package) / "weights.store").stat().st_size
p = m.precision
res["precision"] = p.summary() if p is not None else None
res["fp32_layers"] = len(p.fp32_layers) if p is not None else 0
if device == "vulkan":
    dev = get_device()
    res["device"] = dev.name
    res["features"] = dev.features
m.close()
print("RESULT " + json.dumps(res))
'''

def _child_code() -> str:
    """The inferd child with the daemon's defaults for the state it has before a request."""
    from ..config import Config

    d = Config()
    return (_INFERD_CHILD.replace("DEVICE_POOL", str(int(d.device_pool)))
            .replace("RESIDENT_PIPELINES", str(int(d.resident_pipelines))))


def _env(folder: Path) -> dict[str, str]:
    """The driver's shader disk cache in ``folder`` (NVIDIA and Mesa); inferd's caches under it too."""
    folder.mkdir(parents=True, exist_ok=True)
    return dict(os.environ, __GL_SHADER_DISK_CACHE="1", __GL_SHADER_DISK_CACHE_PATH=str(folder / "drv"),
                __GL_SHADER_DISK_CACHE_SKIP_CLEANUP="1", MESA_SHADER_CACHE_DIR=str(folder / "drv"),
                INFERD_CACHE_DIR=str(folder / "inferd"), XDG_CACHE_HOME=str(folder / "xdg"))


def _evict(root: Path) -> None:
    for f in root.rglob("*"):
        if f.is_file():
            drop_page_cache(f)


def _err(a_path: Path, b_path: Path) -> float | None:
    import numpy as np
    try:
        a, b = np.load(a_path).reshape(-1), np.load(b_path).reshape(-1)
    except OSError:
        return None
    return float(np.abs(a - b).max() / np.abs(b).max()) if a.shape == b.shape else None


def bench_model(name: str, onnx_path: Path, work: Path, device: str, arms: list[Arm], nwarm: int,
                with_ncnn: bool, rounds: int = 3) -> dict[str, Any]:
    """Per arm: one process compiles the package (filling every cache); then ``rounds`` rounds, each running
    every arm once in a fresh process (package evicted: cold, then warm), so that a shared machine's slow
    phases fall on every arm alike; medians over the rounds, with their range."""
    import numpy as np
    import onnxruntime as ort

    from ..frontend import import_model

    inp = import_model(onnx_path).inputs[0]
    x = np.random.default_rng(0).standard_normal(inp.shape).astype(np.float32)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    y = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"]).run(None, {inp.name: x})[0]
    ref = work / f"{name}_ref.npz"
    np.savez(ref, x=x, y=y)
    res: dict[str, Any] = {}
    setup: dict[str, tuple[Path, dict[str, str], Path, Path, str]] = {}
    for arm in arms:
        src = arm.model_for(onnx_path, work) if arm.model_for is not None else onnx_path
        folder = work / f"{name}_{arm.name}"
        shutil.rmtree(folder, ignore_errors=True)
        env = _env(folder)
        pkgroot = folder / "packages"
        outp = folder / "out.npy"
        opts = json.dumps(dict(arm.options))
        # compile the package and fill every shader cache (its own load is the first-registration case)
        first = run_child(_child_code(), [str(src), device, arm.precision, str(pkgroot), "0", str(ref), str(outp),
                                          opts],
                       env)
        r = {k: v for k, v in first.items() if k != "cold_ms"}
        r.update(compile_ms=first.get("cold_ms"), out=str(outp), cold_runs=[], warm_runs=[])
        res[arm.name] = r
        setup[arm.name] = (src, env, pkgroot, outp, opts)
    for _ in range(max(1, rounds)):
        for arm in arms:
            src, env, pkgroot, outp, opts = setup[arm.name]
            _evict(pkgroot)
            drop_page_cache(src)
            one = run_child(_child_code(), [str(src), device, arm.precision, str(pkgroot), str(nwarm), str(ref),
                                         str(outp), opts], env)
            r = res[arm.name]
            if "error" in one:
                r["error"] = one["error"]
                continue
            r["cold_runs"].append(one["cold_ms"])
            r["warm_runs"].append(one.get("warm_ms"))
            # after the warm switch: the weights the model keeps
            r.update(resident_weights_bytes=one.get("resident_weights_bytes"), resident_bytes=one.get("resident_bytes"))
    for r in res.values():
        for k in ("cold", "warm"):
            xs = [x for x in r[f"{k}_runs"] if isinstance(x, (int, float))]
            r[f"{k}_ms"] = float(np.median(xs)) if xs else None
            r[f"{k}_range_ms"] = [min(xs), max(xs)] if xs else None
    base = res.get("fp32", {}).get("out")
    for a in res.values():
        a["err_fp32"] = _err(Path(a["out"]), Path(base)) if base and "out" in a else None
    if with_ncnn and device == "vulkan":
        try:
            from .ncnn_peer import convert_ncnn, rel_err, run_ncnn

            nw = work / f"{name}_ncnn"
            # pnnx's defaults: fp16 weights in the .bin (ncnn's default deployment)
            param, binf = convert_ncnn(onnx_path, tuple(inp.shape), nw, fp16=True)
            env = _env(work / f"{name}_ncnn_cache")
            outp = nw / "out.npy"

            def one_run(n: int) -> dict[str, Any]:
                """ncnn's default fp16 options; its first output saved to ``outp`` and checked against ort's."""
                one, outs = run_ncnn(param, binf, [x[0]], 1, nw, nwarm=n, vulkan=True, fp16=True,
                                     batch_index=False, env=env)
                if outs:
                    np.save(outp, outs[0].reshape(-1))
                    one["err_ort"] = rel_err(outs[0], y)
                return one

            first = one_run(0)  # fills the driver cache
            r = {k: v for k, v in first.items() if k != "cold_ms"}
            colds, warms = [], []
            for _ in range(max(1, rounds)):
                drop_page_cache(param)
                drop_page_cache(binf)
                one = one_run(nwarm)
                if "error" in one:
                    r["error"] = one["error"]
                    continue
                colds.append(one["cold_ms"])
                warms.append(one["warm_ms"])
            r.update(cold_runs=colds, warm_runs=warms, cold_ms=float(np.median(colds)) if colds else None,
                     warm_ms=float(np.median(warms)) if warms else None)
            r["stored_bytes"] = binf.stat().st_size
            r["err_fp32"] = _err(outp, Path(base)) if base else None
            res["ncnn_fp16"] = r
        except Exception as e:  # reported in the table, not hidden
            res["ncnn_error"] = str(e)
    return res


def _table(results: dict[str, Any], arms: list[Arm]) -> list[str]:
    lines = ["| model | arm | warm ms | warm / fp32 | cold pkg ms | cold / fp32 | stored MB | stored / fp32 | "
             "resident weights MB | resident / fp32 | err vs fp32 | err vs ort | fp16 warm / ncnn fp16 | "
             "fp16 cold / ncnn fp16 |", "|---|---|" + "---:|" * 12]
    for n, r in results.items():
        b = r.get("fp32", {})
        nc = r.get("ncnn_fp16", {})
        for arm in [a.name for a in arms] + ["ncnn_fp16"]:
            a = r.get(arm)
            if not isinstance(a, dict):
                continue
            mb = lambda v: v / 1e6 if isinstance(v, (int, float)) else None  # noqa: E731
            peer = arm != "ncnn_fp16" and arm != "fp32"
            lines.append(
                f"| {n} | {arm} | {fmt(a.get('warm_ms'), '.2f')} | {fmt(ratio(a.get('warm_ms'), b.get('warm_ms')), '.2f')} | "
                f"{fmt(a.get('cold_ms'), '.1f')} | {fmt(ratio(a.get('cold_ms'), b.get('cold_ms')), '.2f')} | "
                f"{fmt(mb(a.get('stored_bytes')), '.1f')} | {fmt(ratio(a.get('stored_bytes'), b.get('stored_bytes')), '.3f')} | "
                f"{fmt(mb(a.get('resident_weights_bytes')), '.1f')} | "
                f"{fmt(ratio(a.get('resident_weights_bytes'), b.get('resident_weights_bytes')), '.3f')} | "
                f"{fmt(a.get('err_fp32'), '.1e')} | {fmt(a.get('err_ort'), '.1e')} | "
                f"{fmt(ratio(a.get('warm_ms'), nc.get('warm_ms')), '.2f') if peer else ''} | "
                f"{fmt(ratio(a.get('cold_ms'), nc.get('cold_ms')), '.2f') if peer else ''} |")
        if "ncnn_error" in r:
            lines.append(f"| {n} | ncnn_fp16 | error: {str(r['ncnn_error'])[:120]} |" + " |" * 11)
        for arm, a in r.items():
            if isinstance(a, dict) and a.get("error"):
                lines.append(f"| {n} | {arm} | error: {str(a['error'])[-160:].replace(chr(10), ' ')} |" + " |" * 11)
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="inferd bench precision", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="vulkan", choices=["vulkan", "cpu"])
    p.add_argument("--models", default="squeezenet1_1,mobilenetv2,resnet18")
    p.add_argument("--arms", default="fp32,fp16", help=f"precision arms among {list(ARMS)}")
    p.add_argument("--warm", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3, help="cold+warm processes per arm, interleaved over the arms")
    p.add_argument("--no-ncnn", action="store_true")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--tag", default="")
    p.add_argument("--work", default=None)
    args = p.parse_args(argv)
    from ..zoo import write_zoo

    arms = [ARMS[a] for a in args.arms.split(",") if a]
    if not arms or arms[0].name != "fp32":
        arms = [ARMS["fp32"]] + [a for a in arms if a.name != "fp32"]  # every ratio is against fp32
    work = Path(args.work or tempfile.mkdtemp(prefix="inferd-precbench-"))
    names = [n for n in args.models.split(",") if n]
    paths = write_zoo(work / "zoo", names)
    machine_before = machine_info()
    results = {}
    for n in names:
        results[n] = r = bench_model(n, Path(paths[n]), work, args.device, arms, args.warm, not args.no_ncnn,
                                     args.rounds)
        print(n, json.dumps({k: ({kk: vv for kk, vv in v.items() if kk not in ("features", "error")}
                                 if isinstance(v, dict) else v) for k, v in r.items()}), flush=True)
    dev = next((v.get("device") for r in results.values() for v in r.values() if isinstance(v, dict) and v.get("device")),
               args.device)
    feats = next((v.get("features") for r in results.values() for v in r.values() if isinstance(v, dict)
                  and v.get("features")), None)
    data = {"machine": machine_info(), "machine_before": machine_before, "device": args.device, "vulkan_device": dev,
            "features": feats, "arms": [a.name for a in arms], "warm_runs": args.warm, "models": results}
    try:
        import ncnn
        data["ncnn"] = getattr(ncnn, "__version__", "?")
    except Exception:
        data["ncnn"] = None
    m = data["machine"]
    lines = [f"# Reduced precision on {dev} ({args.device})", "",
             f"Date {m['date']}; host {m['host']} CPU {m['cpu']} ({m['cores']} cores); load average before "
             f"{machine_before.get('loadavg')}, after {m.get('loadavg')}; ncnn {data['ncnn']} with its default fp16 "
             f"options; device features {feats}.", "",
             "inferd fp16 = weights stored and read in fp16 (16-bit storage buffers, or RGBA16F texel views on a "
             "CPU-type device), activations fp32; fp16 arithmetic: the shared-memory GEMM convolutions on the matrix "
             "units (cooperative matrices, fp32 sums) where the device has them, else fp16 tile sums where it has "
             "shaderFloat16 (fp16w: fp32 arithmetic). Warm runs follow a 1 s burst that brings a GPU to its running "
             "clock. Per arm, a first process compiles the package and fills "
             f"the shader caches; then {args.rounds} rounds each run every arm once in a fresh process: cold = "
             "`inferd.load` of the package + first inference (package evicted from the page cache; the process in the "
             "state of a daemon that is up: loader threads started, device created with its device pool, the "
             f"pipelines it lists made resident, all before the clock), then warm = median of {args.warm} runs "
             "after the warm switch; the table gives the "
             "medians over the rounds (ranges in the JSON). ncnn likewise (load_param/load_model + first inference, "
             "files evicted, driver cache filled by a first process). Stored = weights.store (ncnn: the .bin); "
             "resident = device weight allocations. Errors: max |d| / max |ref| of the first output.", ""]
    lines += _table(results, arms)
    stem = "precision_" + (args.tag or f"{args.device}_" + str(dev).lower().split(" (")[0].replace(" ", "_")[:30])
    jp, mp = write_results(args.out, stem, data, "\n".join(lines) + "\n")
    print(f"wrote {jp} and {mp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
