"""inferd's Vulkan backend vs ncnn's Vulkan backend on the same device, in one run.

For each model: warm latency, and cold latency = model load + first inference with the Vulkan
device already created, in a fresh process, the model files evicted from the page cache:
  * inferd with empty caches (SPIR-V cache, VkPipelineCache, driver shader cache all empty),
  * inferd with filled caches (a second process after the first filled them),
  * ncnn with an empty and with a filled driver shader cache (the ``ncnn`` wheel keeps no
    pipeline cache of its own), fp16 off so both run fp32.
The driver's own disk cache is pointed into a fresh folder per configuration
(``__GL_SHADER_DISK_CACHE_PATH`` on NVIDIA, ``MESA_SHADER_CACHE_DIR`` on Mesa).
ncnn models are converted from the same ONNX files with ``pnnx`` (``$INFERD_PNNX`` or on PATH).

    inferd bench vulkan [--models resnet50,mobilenetv2] [--out bench/results] [--tag NAME]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .common import drop_page_cache, machine_info, run_child, write_results
from .ncnn_peer import convert_ncnn, rel_err, run_ncnn

_INFERD_CHILD = r'''
import json, sys, time, numpy as np
import inferd.ops
from inferd.frontend import import_model
from inferd.vulkan.device import VulkanDevice, VulkanConfig
from inferd.vulkan.model import VulkanModel
from inferd.package import cached_package, load_package
path, cache, nwarm, ref, pkgroot = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
dev = VulkanDevice(VulkanConfig(cache_dir=cache))
x = np.load(ref)["x"]
t = time.perf_counter()
if pkgroot:  # the daemon's path: a compiled package (plan + weights store) instead of the ONNX file
    g = load_package(cached_package(path, pkgroot, device="vulkan"), device="vulkan")
else:
    g = import_model(path)
m = VulkanModel(g, dev)
out = m.run({g.inputs[0].name: x})
cold = time.perf_counter() - t
ws = []
for _ in range(nwarm):
    t = time.perf_counter(); m.run({g.inputs[0].name: x}); ws.append(time.perf_counter() - t)
y = list(out.values())[0]
r = np.load(ref)["y"]
res = {"cold_ms": cold * 1e3, "warm_ms": 1e3 * float(np.median(ws)) if ws else None,
       "rel_err": float(np.abs(y - r).max() / np.abs(r).max()), "device": dev.name,
       "load_stats": {k: v for k, v in m.load_stats.items() if isinstance(v, (int, float, str))},
       "pipeline_cache": dev.pipeline_cache.status}
m.close(); dev.close()
print("RESULT " + json.dumps(res))
'''

def _driver_cache_env(folder: Path) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    return dict(os.environ, __GL_SHADER_DISK_CACHE="1", __GL_SHADER_DISK_CACHE_PATH=str(folder),
                __GL_SHADER_DISK_CACHE_SKIP_CLEANUP="1", MESA_SHADER_CACHE_DIR=str(folder))


def bench_model(name: str, onnx_path: Path, work: Path, nwarm: int, with_ncnn: bool) -> dict[str, Any]:
    import numpy as np
    import onnxruntime as ort

    from ..frontend import import_model

    inp = import_model(onnx_path).inputs[0]
    shape = inp.shape
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    y = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"]).run(None, {inp.name: x})[0]
    ref = work / f"{name}_ref.npz"
    np.savez(ref, x=x, y=y)
    res: dict[str, Any] = {}
    cache = work / f"{name}_inferd_cache"
    shutil.rmtree(cache, ignore_errors=True)
    drv = work / f"{name}_drv_inferd"
    shutil.rmtree(drv, ignore_errors=True)
    env = _driver_cache_env(drv)
    pkgroot = work / f"{name}_packages"
    shutil.rmtree(pkgroot, ignore_errors=True)
    drop_page_cache(onnx_path)
    res["inferd_empty"] = run_child(_INFERD_CHILD, [str(onnx_path), str(cache), str(nwarm), str(ref), ""], env)
    drop_page_cache(onnx_path)
    res["inferd_filled"] = run_child(_INFERD_CHILD, [str(onnx_path), str(cache), "0", str(ref), ""], env)
    # first load through the package cache compiles the package (the daemon does this once per model)
    res["inferd_pkg_compile"] = run_child(_INFERD_CHILD, [str(onnx_path), str(cache), "0", str(ref), str(pkgroot)], env)
    for f in pkgroot.rglob("*"):
        if f.is_file():
            drop_page_cache(f)
    res["inferd_pkg_filled"] = run_child(_INFERD_CHILD, [str(onnx_path), str(cache), "0", str(ref), str(pkgroot)], env)
    if with_ncnn:
        try:
            param, binf = convert_ncnn(onnx_path, shape, work / f"{name}_ncnn")
            drv = work / f"{name}_drv_ncnn"
            shutil.rmtree(drv, ignore_errors=True)
            env = _driver_cache_env(drv)
            for tag, n in (("ncnn_empty", nwarm), ("ncnn_filled", 0)):
                drop_page_cache(param)
                drop_page_cache(binf)
                one, outs = run_ncnn(param, binf, [x[0]], 1, work / f"{name}_ncnn", nwarm=n, vulkan=True,
                                     batch_index=False, env=env)
                if outs:
                    one["rel_err"] = rel_err(outs[0], y)
                res[tag] = one
        except Exception as e:  # report, don't hide: the table shows the error
            res["ncnn_error"] = str(e)
    return res


def _ratio(a: Any, b: Any) -> float:
    try:
        return float(a) / float(b)
    except (TypeError, ValueError, ZeroDivisionError):
        return float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="inferd bench vulkan", description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet50,mobilenetv2")
    p.add_argument("--warm", type=int, default=50)
    p.add_argument("--no-ncnn", action="store_true")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--tag", default="")
    p.add_argument("--work", default=None)
    args = p.parse_args(argv)
    from ..zoo import write_zoo

    work = Path(args.work or tempfile.mkdtemp(prefix="inferd-vkbench-"))
    names = [n for n in args.models.split(",") if n]
    paths = write_zoo(work / "zoo", names)
    results = {}
    for n in names:
        results[n] = r = bench_model(n, Path(paths[n]), work, args.warm, not args.no_ncnn)
        print(n, json.dumps({k: ({kk: vv for kk, vv in v.items() if kk != "load_stats"} if isinstance(v, dict) else v)
                             for k, v in r.items()}), flush=True)
    dev = next((v.get("device") for r in results.values() for v in r.values() if isinstance(v, dict) and v.get("device")), "?")
    data = {"machine": machine_info(), "vulkan_device": dev, "models": results}
    try:
        import ncnn
        data["ncnn"] = getattr(ncnn, "__version__", "?")
    except Exception:
        data["ncnn"] = None
    lines = [f"# inferd Vulkan vs ncnn Vulkan on {dev}", "",
             f"Date {data['machine']['date']}; host CPU {data['machine']['cpu']}; ncnn {data['ncnn']} (fp16 off). "
             "Cold = load + first inference, device already created, fresh process, model files evicted from the "
             "page cache; 'empty'/'filled' = state of the caches (inferd: SPIR-V + VkPipelineCache + driver cache; "
             "ncnn: driver cache only, the wheel keeps no pipeline cache).", "",
             "'pkg' = loaded from inferd's compiled package (plan + weights store; what the daemon serves "
             "from after a model's first load) instead of the ONNX file.", "",
             "| model | inferd warm ms | ncnn warm ms | warm ratio | inferd cold empty ms | inferd cold filled ms | "
             "inferd cold filled pkg ms | ncnn cold empty ms | ncnn cold filled ms | pkg filled / ncnn empty | "
             "pkg filled / ncnn filled | onnx filled / ncnn filled | inferd err | ncnn err |", "|---|" + "---:|" * 13]
    for n, r in results.items():
        ie, iF = r.get("inferd_empty", {}), r.get("inferd_filled", {})
        ne, nF = r.get("ncnn_empty", {}), r.get("ncnn_filled", {})
        f = lambda d, k: (f"{d[k]:.2f}" if isinstance(d.get(k), (int, float)) else "n/a")  # noqa: E731
        e = lambda d: (f"{d['rel_err']:.1e}" if isinstance(d.get("rel_err"), float) else "n/a")  # noqa: E731
        iP = r.get("inferd_pkg_filled", {})
        lines.append(f"| {n} | {f(ie, 'warm_ms')} | {f(ne, 'warm_ms')} | {_ratio(ie.get('warm_ms'), ne.get('warm_ms')):.2f} | "
                     f"{f(ie, 'cold_ms')} | {f(iF, 'cold_ms')} | {f(iP, 'cold_ms')} | {f(ne, 'cold_ms')} | {f(nF, 'cold_ms')} | "
                     f"{_ratio(iP.get('cold_ms'), ne.get('cold_ms')):.3f} | {_ratio(iP.get('cold_ms'), nF.get('cold_ms')):.3f} | "
                     f"{_ratio(iF.get('cold_ms'), nF.get('cold_ms')):.3f} | {e(ie)} | {e(ne)} |")
    stem = "vulkan_" + (args.tag or str(dev).lower().replace(" ", "_").replace("/", "_")[:40])
    jp, mp = write_results(args.out, stem, data, "\n".join(lines) + "\n")
    print(f"wrote {jp} and {mp}")
    return 0
