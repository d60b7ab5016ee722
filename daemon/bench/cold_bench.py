"""``inferd bench cold``: cold inference against its peers and its own floor, in one run.

Cold inference = the process is up (libraries imported, loader threads started), the model is not
resident, the page cache holds none of its files, a request arrives; cold latency = time to that
request's answer. Every cold measurement here runs in a FRESH child process: the child imports its
libraries and prepares its input, says READY, and waits; the parent then empties the page cache
(``drop_caches`` as root, plus ``posix_fadvise(DONTNEED)`` on every file the run reads), reads the
child's already-mapped library files back in (a process that is up has its code resident; only the
model's files must be cold), checks with ``mincore`` that none of the run's files is resident
(fails loudly above 1 %) and says GO; the child times load + first run and reports.

Per model and round (engines in a rotated order each round, median of ``--repeat`` rounds):

* inferd from its compiled package (compiled beforehand): load + first run, its ``cold_stats``
  breakdown, timeline and plan, then its warm latency in the same process;
* onnxruntime: a default session on the ONNX file, and its strongest cold configuration: the model
  optimised offline and saved with external initializers (with and without pre-packed weights),
  loaded with graph optimisation off, so the weights are memory-mapped;
* ncnn (pnnx-converted, fp16 off): load_param + load_model + first extract;
* the read floor: one thread reading, with large sequential reads, the package regions the plan
  reads (and, for reference, the whole ``plan.bin`` + ``weights.store``);
* with ``--ablation``: inferd with kernel selection, the transformed-weight cache, pipelining or
  work stealing off (one at a time; each from a package compiled with the same options, so no
  re-planning happens inside the timer);
* with ``--background``: inferd with a busy-looping process pinned to one core;
* inferd after plan refinement: inferd rewrites a package's plan.bin after a cold run from the costs
  it observed; every round above measures the package as compiled (plan.bin put back before each
  run), and a copy refined once is measured too (what later cold loads would read).

The machine is small and shared: a run waits (a bounded time) for other processes to quiet down,
the child measures how much CPU others used during its timer, and contended runs are measured
again (within a per-model time budget) or reported as contended.

    inferd bench cold [--device cpu|vulkan] [--models a,b] [--repeat N] [--out DIR] [--no-ncnn]
                      [--ablation] [--background]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from .common import busy_loop, fmt, machine_info, ratio, write_results

DEFAULT_MODELS = ["resnet50", "resnet18", "mobilenetv2", "squeezenet1_1", "shufflenetv2_x1_0", "efficientnet_b0",
                  "vit_tiny"]

#: goals (see the issue): cold <= 0.6x the better peer, <= 1.3x max(read floor, warm);
#: a busy core costs at most 15 %
GOAL_PEER = 0.6
GOAL_FLOOR = 1.3
GOAL_BACKGROUND = 0.15
#: a "cold" run that finds more than this fraction of its files resident is not cold: abort
RESIDENT_MAX = 0.01

#: ablation variant -> the PlanOptions switch it turns off
ABLATIONS: dict[str, str] = {"no_select": "select", "no_cache": "cache", "no_pipeline": "pipeline",
                             "no_steal": "steal"}
ABLATION_LABEL = {"no_select": "kernel selection off", "no_cache": "transformed-weight cache off",
                  "no_pipeline": "pipelining off", "no_steal": "work stealing off"}


class ColdCacheError(RuntimeError):
    """The page cache still held a run's files after the drop: the measurement would not be cold."""


class ChildError(RuntimeError):
    """A measurement child failed (its stderr tail is the message)."""


# --------------------------------------------------------------------------------------------- page cache

def evict(paths: Iterable[str | os.PathLike], mode: str = "auto") -> str:
    """Empty the page cache of ``paths``. ``auto``: ``drop_caches`` when allowed (root) AND
    ``posix_fadvise(DONTNEED)`` per file (the latter is what an unprivileged run relies on, and it
    costs nothing after the former); ``fadvise``: per file only (tests: leave the rest of the
    machine's cache alone). Returns the method that took effect."""
    from ..runtime.pagecache import _walk, drop_all, drop_file

    files = list(_walk(paths))
    method = "fadvise"
    if mode == "auto" and drop_all():
        method = "drop_caches+fadvise"
    for f in files:
        drop_file(f)
    return method


def resident(paths: Iterable[str | os.PathLike]) -> tuple[int, int]:
    """(resident bytes by ``mincore``, total bytes) over the files of ``paths``."""
    from ..runtime.pagecache import _walk, resident_bytes

    r = t = 0
    for f in _walk(paths):
        a, b = resident_bytes(f)
        r += a
        t += b
    return r, t


def check_cold(paths: Sequence[str | os.PathLike], what: str) -> dict[str, int]:
    """Raise :class:`ColdCacheError` if more than ``RESIDENT_MAX`` of ``paths`` is resident."""
    r, t = resident(paths)
    if t and r > RESIDENT_MAX * t:
        raise ColdCacheError(f"{what}: {r} of {t} bytes of {[str(p) for p in paths]} still resident in the page "
                             f"cache after dropping it ({100.0 * r / t:.1f} % > {100 * RESIDENT_MAX:.0f} %): "
                             "the run would not be cold (tmpfs? files mapped by another process?)")
    return {"resident_bytes": r, "file_bytes": t}


def _mapped_files(pid: int) -> list[Path]:
    """Regular files mapped into process ``pid`` (its interpreter, shared libraries, extension modules)."""
    out: dict[str, None] = {}
    try:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/") and not parts[5].endswith("(deleted)"):
                out[parts[5]] = None
    except OSError:
        pass
    return [Path(p) for p in out if Path(p).is_file() and not str(p).startswith(("/dev/", "/proc/", "/sys/"))]


def rewarm_libraries(pid: int, exclude: Sequence[str | os.PathLike]) -> int:
    """Read the files ``pid`` has mapped back into the page cache (skipping ``exclude``, the run's
    own files). Why: ``drop_caches`` also evicts the not-yet-touched pages of the child's libraries
    (onnxruntime's, ncnn's, ours), which the first call would then fault in from disk. That is
    process start-up, not model cold, and it would add disk noise that differs per engine."""
    from ..runtime.pagecache import _walk

    skip = {str(Path(p).resolve()) for p in _walk(exclude)}
    buf = bytearray(8 << 20)
    n = 0
    for f in _mapped_files(pid):
        if str(f.resolve()) in skip:
            continue
        try:
            with open(f, "rb", buffering=0) as fh:
                while True:
                    k = fh.readinto(buf)
                    if not k:
                        break
                    n += k
        except OSError:
            continue
    return n


# --------------------------------------------------------------------------------------------- the child

# One script for every engine: set up (imports, input) -> READY -> wait for GO -> timed cold -> RESULT.
_CHILD = r'''
import json, os, sys, time
spec = json.loads(sys.argv[1])
eng, device, threads = spec["engine"], spec.get("device", "cpu"), int(spec.get("threads", 2))
import numpy as np
ref = np.load(spec["ref"]) if spec.get("ref") else None
names = list(spec.get("input_names", []))
feeds = {n: np.ascontiguousarray(ref["x%d" % i]) for i, n in enumerate(names)} if ref is not None else {}
def rel_err(y):
    if ref is None or y is None:
        return None
    r = ref["y"].reshape(-1).astype(np.float64); y = np.asarray(y, np.float64).reshape(-1)
    if y.size != r.size:
        return None
    return float(np.abs(y - r).max() / max(np.abs(r).max(), 1e-30))
if eng == "inferd":
    import inferd
    from inferd.planner.plan import PlanOptions
    opts = PlanOptions.from_dict(spec.get("options") or {})
    # what inferd.load would import lazily, imported as a daemon's start does, so that no import lands inside the
    # timer (``import inferd`` brings the rest of the cold path)
    from inferd.runtime.codepages import import_load_path
    import_load_path()  # the daemon's background warm_start
    if device == "vulkan":
        from inferd.vulkan import import_load_path as vulkan_load_path
        vulkan_load_path()  # as the daemon does where it opens the device at its start
    from inferd.bench.common import daemon_state
    _resident = daemon_state(device, spec.get("device_pool") or 0, spec.get("resident_pipelines") or 0,
                             spec.get("host_pool") or 0, claim_cores=True, rehearse=bool(spec.get("rehearse")))
    if spec.get("reload"):
        # a daemon's model dropped (its memory budget, an unload) and asked for again: this process served it
        # before, until its plan.bin stopped changing (the refinement after a first run rewrites it at most twice)
        _plan_bin = os.path.join(spec["path"], "plan.bin")
        for _ in range(3):
            _v0 = os.stat(_plan_bin).st_ctime_ns
            _m0 = inferd.load(spec["path"], device=device, cold=opts, loaders=spec.get("loaders"))
            _m0.run(feeds)
            if getattr(_m0, "refine_done", None) is not None:
                _m0.refine_done.wait(60)
            _m0.close()
            del _m0
            if os.stat(_plan_bin).st_ctime_ns == _v0:
                break
        from pathlib import Path as _P
        from inferd.package import parsed_cached
        from inferd.store import index_cached
        _reload_cached = parsed_cached(_P(spec["path"])) and index_cached(_P(spec["path"]) / "weights.store")
    if spec.get("register"):
        # a model of a daemon's repository asked for the first time: the daemon registered it at its start
        # (``ModelSlot.register``: its package validated, plan and store index parsed; no weight read)
        _registered = inferd.register(spec["path"], device=device).parsed
elif eng == "ort":
    import onnxruntime as ort
    so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.log_severity_level = 3
    if spec.get("opt_off"):  # the offline-optimised file: optimising again would only cost time
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
elif eng == "ncnn":
    import ncnn
    if device == "vulkan":
        ncnn.create_gpu_instance()
    x0 = np.ascontiguousarray(ref["x0"][0])     # pnnx drops the batch dimension
    mat = ncnn.Mat(x0)
elif eng == "floor":
    import mmap
def _jiffies():
    # machine busy and this process's CPU, both in clock ticks: how much else ran during the timer
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        with open("/proc/self/stat") as f:
            st = f.read().rsplit(")", 1)[1].split()
        return sum(v) - v[3] - (v[4] if len(v) > 4 else 0), int(st[11]) + int(st[12])
    except (OSError, ValueError, IndexError):
        return None
before = set(sys.modules)
print("READY", flush=True)
if sys.stdin.readline().strip() != "GO":
    sys.exit(3)
res = {}
j0 = _jiffies()
t0 = time.perf_counter()
if eng == "inferd":
    m = inferd.load(spec["path"], device=device, cold=opts, loaders=spec.get("loaders"))
    t_load = time.perf_counter()
    out = m.run(feeds)
    cold = time.perf_counter() - t0
    mods = set(sys.modules)  # at the answer: the idle-time work after it imports what it likes
    y = out[m.output_names[0]]
    res["load_call_ms"] = (t_load - t0) * 1e3
    if spec.get("reload"):
        res["reload_cached"] = _reload_cached  # the parsed plan and index the load was to take were there
    if spec.get("register"):
        res["registered"] = _registered
    if device == "vulkan":
        res["resident_pipelines"] = _resident
    res["cold_stats"] = {k: v for k, v in dict(m.cold_stats).items() if isinstance(v, (int, float, str))}
    cr = getattr(getattr(m, "_cold", None), "run", None)
    tl = None
    if cr is not None and spec.get("timeline", True):
        # the scheduler's clock starts when the plan starts; shift it to the timer's origin and show
        # what came before (plan read, store open, backend built) as a 'setup' bar of the caller
        off = cr.t_start - t0
        tl = [{**e, "t0": round(e["t0"] + off, 6), "t1": round(e["t1"] + off, 6)} for e in cr.timeline()]
        tl.insert(0, {"thread": "MainThread", "kind": "setup", "layer": "", "t0": 0.0, "t1": round(off, 6)})
        res["plan_start_ms"] = off * 1e3
        ex = [e["t0"] for e in tl if e["kind"] == "execute"]
        res["first_execute_ms"] = min(ex) * 1e3 if ex else None
    if tl:
        # what follows the last recorded event until the answer (backend.end(): output copy, and on a
        # GPU the submit and wait that carry the real execution) would otherwise be invisible
        last = max(e["t1"] for e in tl)
        if cold > last:
            tl.append({"thread": "MainThread", "kind": "finish", "layer": "", "t0": last, "t1": round(cold, 6)})
    res["timeline"] = tl
    p = m.plan
    if p is not None:
        srcs = {}
        for lp in p.layers:
            srcs[lp.source] = srcs.get(lp.source, 0) + 1
        res["plan"] = {"predicted_ms": p.predicted_s * 1e3, "read_ms": p.read_s * 1e3, "warm_ms": p.warm_s * 1e3,
                       "loaders": p.loaders, "options": p.options.to_dict(), "sources": srcs,
                       "kernels": sorted({lp.kernel for lp in p.layers})}
    ev = getattr(m, "refine_done", None)
    if spec.get("join_refine") or int(spec.get("warm_runs", 0)) > 0:
        # inferd records the layers' binds and refines the package's plan from what this run observed, in idle
        # time; let them finish (they would otherwise compete with the warm runs, or die with the process half way)
        for _ev in (getattr(m, "binds_done", None), ev):
            if _ev is not None:
                _ev.wait(60)
    res["refine_ran"] = ev is not None
    nwarm = int(spec.get("warm_runs", 0))
    if nwarm > 0:
        m.wait_warm(60)
        for _ in range(3):
            m.run(feeds)
        ws, t_end = [], time.perf_counter() + float(spec.get("warm_budget_s", 3.0))
        while len(ws) < nwarm and (len(ws) < 5 or time.perf_counter() < t_end):
            a = time.perf_counter(); m.run(feeds); ws.append(time.perf_counter() - a)
        res["warm_ms"] = float(np.median(ws)) * 1e3
        res["warm_runs"] = len(ws)
        res["warm_switch"] = {k: v for k, v in dict(m.cold_stats).items() if k.startswith("warm_")}
    m.close()
    if device == "vulkan":
        try:
            from inferd.vulkan.device import close_shared_device
            close_shared_device()
        except Exception:
            pass
elif eng == "ort":
    s = ort.InferenceSession(spec["path"], so, providers=["CPUExecutionProvider"])
    y = s.run(None, feeds)[0]
    cold = time.perf_counter() - t0
    mods = set(sys.modules)  # at the answer: the idle-time work after it imports what it likes
elif eng == "ncnn":
    net = ncnn.Net()
    net.opt.use_vulkan_compute = device == "vulkan"
    net.opt.num_threads = threads
    if not spec.get("fp16"):  # the default is fp16 storage and arithmetic (the Vulkan goals' anchor)
        net.opt.use_fp16_packed = False; net.opt.use_fp16_storage = False; net.opt.use_fp16_arithmetic = False
    net.load_param(spec["param"]); net.load_model(spec["bin"])
    ex = net.create_extractor()
    ex.input("in0", mat)
    _, o = ex.extract("out0")
    y = np.array(o)
    cold = time.perf_counter() - t0
    mods = set(sys.modules)  # at the answer: the idle-time work after it imports what it likes
    del ex, net
    if device == "vulkan":
        ncnn.destroy_gpu_instance()
elif eng == "floor":
    direct = bool(spec.get("direct"))
    # an anonymous mapping is page aligned, as O_DIRECT wants its buffer
    buf = mmap.mmap(-1, int(spec.get("chunk", 8 << 20))); mv = memoryview(buf); n = 0
    for path, regions in spec["files"]:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        try:
            if regions is None:
                regions = [[0, os.fstat(fd).st_size]]
            for off, size in regions:
                if direct:  # O_DIRECT offsets and lengths must be block multiples
                    end = -(-(off + size) // 4096) * 4096
                    off = off // 4096 * 4096
                    size = end - off
                while size > 0:
                    got = os.preadv(fd, [mv[:min(size, len(buf))]], off)
                    if got <= 0:
                        break
                    off += got; size -= got; n += got
        finally:
            os.close(fd)
    cold = time.perf_counter() - t0
    mods = set(sys.modules)  # at the answer: the idle-time work after it imports what it likes
    y = None
    res["bytes"] = n
else:
    raise SystemExit("unknown engine " + eng)
# /proc/stat counts in clock ticks (10 ms): a window of a few ticks says nothing, so the sample
# spans at least 0.3 s (this child sleeps after its timer if need be; what else runs then is what
# ran during it, or close). Own CPU is subtracted: the rest is other processes' share of the machine.
span, pad = time.perf_counter() - t0, float(spec.get("sample_s", 0.3))
if span < pad:
    time.sleep(pad - span)
j1 = _jiffies()
res["cold_ms"] = cold * 1e3
if j0 and j1:
    span = time.perf_counter() - t0
    ticks = os.sysconf("SC_CLK_TCK") * span * (os.cpu_count() or 1)
    res["others_cpu"] = round(max(0.0, ((j1[0] - j0[0]) - (j1[1] - j0[1])) / ticks), 3) if ticks > 0 else None
res["rel_err"] = rel_err(y)
res["imported_in_timer"] = sorted(mods - before)[:20]
print("RESULT " + json.dumps(res), flush=True)
'''


@dataclass
class Config:
    """One thing measured cold: the child's spec, and the files whose cache state makes it cold."""

    key: str
    spec: dict[str, Any]
    files: list[str]
    background: bool = False
    env: dict[str, str] | None = None
    #: files put back to these bytes before every run: inferd rewrites its package's plan.bin after a
    #: cold run (refinement), and each round must measure the same package
    restore: dict[str, bytes] | None = None


def _busy_core() -> int:
    """The core the background load is pinned to: the last one this process may use."""
    try:
        return max(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return (os.cpu_count() or 1) - 1


def _busy_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v)


def machine_busy(interval: float = 0.3) -> float:
    """Fraction of the machine's CPU time used over ``interval`` seconds (0..1)."""
    try:
        b0, t0 = _busy_ticks()
        time.sleep(interval)
        b1, t1 = _busy_ticks()
    except (OSError, ValueError):
        return 0.0
    return (b1 - b0) / max(t1 - t0, 1)


#: a run starts when other processes use at most this fraction of the machine (or after QUIET_WAIT_S):
#: on a 2-core machine another process's test suite doubles a cold time
QUIET_BUSY = 0.15
QUIET_WAIT_S = 20.0
#: other processes' share of the machine during a timed run above which the run is contended:
#: measured again up to RETRIES times, and reported if it still was
CONTENDED = 0.25
RETRIES = 2


def wait_quiet(max_wait: float = QUIET_WAIT_S, threshold: float = QUIET_BUSY) -> tuple[float, float]:
    """Wait until the machine is quiet (our child is blocked on stdin then, so what runs is someone
    else's). Returns (busy fraction last seen, seconds waited)."""
    t = time.perf_counter()
    busy = machine_busy()
    while busy > threshold and time.perf_counter() - t < max_wait:
        time.sleep(0.7)
        busy = machine_busy()
    return busy, time.perf_counter() - t


def _restore(snap: dict[str, bytes] | None) -> int:
    """Put ``snap``'s files back where their bytes differ (atomically, as inferd writes them); returns
    how many were."""
    n = 0
    for f, data in (snap or {}).items():
        p = Path(f)
        if not p.is_file() or p.read_bytes() != data:
            tmp = p.with_name(p.name + ".bench-restore")
            tmp.write_bytes(data)
            os.replace(tmp, p)
            n += 1
    return n


def snapshot(pkg: Path) -> dict[str, bytes]:
    """The bytes of a package's plan.bin (the part of a package inferd rewrites after a cold run)."""
    return {str(pkg / "plan.bin"): (pkg / "plan.bin").read_bytes()}


_SHIPPED: list[str] = []  # the SPIR-V set a first start reads, made once per process (shipped_spirv)


def shipped_spirv() -> str:
    """A directory with the SPIR-V the package ships (``inferd.vulkan.precompile``): none when the installed
    package has it (a wheel), else compiled once from ``shaders/shipped.txt`` into a temporary directory, outside
    any timer: an editable install has no build step, and a first start is measured as a wheel's would be."""
    from ..vulkan.precompile import default_list, precompile, read_list
    from ..vulkan.shaders import compiler, prebuilt_dirs

    if not _SHIPPED:
        d = ""
        if compiler() is not None and not any(p.is_dir() for p in prebuilt_dirs()):
            d = tempfile.mkdtemp(prefix="inferd-shipped-")
            precompile(read_list(default_list()), Path(d))
        _SHIPPED.append(d)
    return _SHIPPED[0]


def run_child(cfg: Config, drop_mode: str = "auto", timeout: float = 240.0,
              quiet_wait: float = QUIET_WAIT_S) -> dict[str, Any]:
    """One cold measurement of ``cfg`` in a fresh process (protocol in the module docstring)."""
    env = dict(cfg.env or os.environ)
    fresh = tempfile.mkdtemp(prefix="inferd-first-") if cfg.spec.get("fresh_caches") else None
    if fresh is not None:
        # a first start: inferd's SPIR-V and pipeline caches and the driver's shader cache all empty, the SPIR-V
        # the package ships present
        env.update(INFERD_CACHE_DIR=os.path.join(fresh, "inferd"), __GL_SHADER_DISK_CACHE_PATH=os.path.join(fresh, "nv"),
                   MESA_SHADER_CACHE_DIR=os.path.join(fresh, "mesa"))
        if cfg.spec.get("engine", "inferd") == "inferd" and shipped_spirv():
            env["INFERD_SPIRV_PATH"] = shipped_spirv()
    try:
        return _run_child(cfg, env, drop_mode, timeout, quiet_wait)
    finally:
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)


def _run_child(cfg: Config, env: dict[str, str], drop_mode: str, timeout: float, quiet_wait: float) -> dict[str, Any]:
    with tempfile.TemporaryFile("w+") as errf:
        p = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(cfg.spec)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=errf, text=True, env=env)
        # a child that hangs (a deadlocked load) must not hang the bench
        killer = threading.Timer(timeout, p.kill)
        killer.start()
        busy: subprocess.Popen[bytes] | None = None
        try:
            assert p.stdout is not None and p.stdin is not None
            line = p.stdout.readline()
            while line and line.strip() != "READY":
                line = p.stdout.readline()
            if not line:
                p.wait()
                errf.seek(0)
                raise ChildError(f"{cfg.key}: child died before READY (rc {p.returncode}): {errf.read()[-2000:]}")
            busy_before, waited = wait_quiet(quiet_wait) if quiet_wait > 0 else (None, 0.0)
            restored = _restore(cfg.restore)
            method = evict(cfg.files, drop_mode)
            lib_bytes = rewarm_libraries(p.pid, cfg.files) if drop_mode == "auto" else 0
            try:
                cache = check_cold(cfg.files, cfg.key)
            except ColdCacheError:
                p.kill()
                raise
            if cfg.background:
                busy = busy_loop(_busy_core())
                time.sleep(0.2)  # let it start spinning before the request arrives
            p.stdin.write("GO\n")
            p.stdin.flush()
            out = p.stdout.read()
            p.wait()
        finally:
            killer.cancel()
            if busy is not None:
                busy.kill()
                busy.wait()
            if p.poll() is None:
                p.kill()
                p.wait()
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            errf.seek(0)
            raise ChildError(f"{cfg.key}: child failed (rc {p.returncode}): {errf.read()[-2000:]}")
        res: dict[str, Any] = json.loads(lines[-1][7:])
    res["cache"] = {"method": method, "libraries_rewarmed_bytes": lib_bytes, **cache}
    res["machine_busy_before"] = None if busy_before is None else round(busy_before, 3)
    res["restored_files"] = restored
    # did this run leave the package changed (a refined plan.bin)?
    res["package_rewritten"] = bool(cfg.restore) and any(
        Path(f).read_bytes() != b for f, b in (cfg.restore or {}).items() if Path(f).is_file())
    res["quiet_wait_s"] = round(waited, 2)
    return res


# --------------------------------------------------------------------------------------------- preparation

def _files_under(*paths: Path) -> list[str]:
    out: list[str] = []
    for p in paths:
        if p.is_dir():
            out += sorted(str(f) for f in p.rglob("*") if f.is_file())
        elif p.is_file():
            out.append(str(p))
    return out


def _merge(regions: list[tuple[int, int]]) -> list[list[int]]:
    """Sorted, adjacent/overlapping regions merged (large sequential reads, as a floor should)."""
    out: list[list[int]] = []
    for off, size in sorted(regions):
        if out and off <= out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][1], off + size - out[-1][0])
        else:
            out.append([off, size])
    return out


def plan_regions(pkg: Path, device: str = "cpu") -> tuple[list[list[int]], int]:
    """The ``weights.store`` regions a cold load of ``pkg`` reads by its plan: the header and index
    (read at open), each layer's transformed blobs where the plan reads them transformed, and its
    large raw constants where it reads raw (small ones travel inside plan.bin). Returns (merged
    regions, bytes)."""
    from ..backends.base import transformed_key
    from ..package import read_plan
    from ..planner.plan import ColdPlan
    from ..store import ALIGN, WeightsStore

    d = read_plan(pkg / "plan.bin")
    plan = ColdPlan.from_dict(d["plan"])
    inputs = {r[0]: list(r[2]) for r in d["nodes"]}
    regs: list[tuple[int, int]] = [(0, ALIGN)]
    with WeightsStore(pkg / "weights.store") as st:
        ents = list(st.entries.values())
        blob_end = max(((e.offset + e.size + ALIGN - 1) // ALIGN * ALIGN for e in ents), default=ALIGN)
        size = (pkg / "weights.store").stat().st_size
        regs.append((blob_end, size - blob_end))  # the index follows the last blob
        raw = {e.tensor: e for e in st.find("", kernel="", variant="raw")}
        for lp in plan.layers:
            if lp.source == "transformed":
                regs += [(e.offset, e.size) for e in st.find(lp.name, kernel=transformed_key(device, lp.kernel),
                                                           variant="transformed")]
            elif lp.source == "raw":
                regs += [(raw[n].offset, raw[n].size) for n in inputs.get(lp.name, []) if n in raw]
    merged = _merge(regs)
    return merged, sum(s for _, s in merged)


def prepare_ort(onnx_path: Path, out_dir: Path, prepacked: bool) -> Path:
    """onnxruntime's strongest cold form, made offline: the model optimised once (level ALL) and saved
    with its initializers in an external file (memory-mapped at load), optionally with the
    pre-packed weights saved too, so the load neither optimises nor packs."""
    import onnxruntime as ort

    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{onnx_path.stem}.ort_opt{'_prepacked' if prepacked else ''}.onnx"
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(out)
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", out.name + ".data")
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    if prepacked:
        so.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
    ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    return out


def _ablation_options(variant: str | None) -> dict[str, Any]:
    from ..planner.plan import PlanOptions

    d = PlanOptions().to_dict()
    if variant is not None:
        d[ABLATIONS[variant]] = False
    return d


def compile_package(onnx_path: Path, out: Path, device: str, variant: str | None = None,
                    loaders: int | None = None) -> Path:
    """A package planned with ``variant``'s option off (loaded later with the same options, so the
    runtime follows the stored plan instead of re-planning inside the timer)."""
    from ..package import compile_model
    from ..planner.plan import PlanOptions

    shutil.rmtree(out, ignore_errors=True)
    return compile_model(onnx_path, out, device=device, options=PlanOptions.from_dict(_ablation_options(variant)),
                         loaders=loaders)


def _ncnn_available() -> tuple[bool, str]:
    """Whether ncnn and pnnx can be used; installs the wheels with pip if ncnn is missing. ncnn without pnnx is
    used too (a machine with no network given the conversions: ``convert_ncnn`` reuses one of the same ONNX bytes
    and says so where it would have to convert)."""
    from .ncnn_peer import pnnx_exe

    def ok() -> bool:
        try:
            import importlib

            importlib.invalidate_caches()
            importlib.import_module("ncnn")
            return True
        except Exception:
            return False
    if ok():
        return True, "" if pnnx_exe() is not None else "pnnx not found: conversions made before only"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "ncnn", "pnnx"], capture_output=True,
                       text=True, timeout=900)
    if ok():
        return True, "installed ncnn and pnnx with pip"
    return False, f"ncnn/pnnx unavailable (pip install: rc {r.returncode}: {(r.stderr or r.stdout)[-500:]})"


# --------------------------------------------------------------------------------------------- summaries

def _median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def goal_ratios(cold_ms: float | None, warm_ms: float | None, floor_ms: float | None,
                peers: dict[str, float | None]) -> dict[str, Any]:
    """The ratios the goals use: cold / the better (lower) peer cold, and cold / max(read floor, warm).
    A missing input makes its ratio (and goal) None, never a silent pass."""
    have = {k: v for k, v in peers.items() if isinstance(v, (int, float)) and v > 0}
    best = min(have, key=lambda k: have[k]) if have else None
    vs_peer = ratio(cold_ms, have[best]) if best is not None else None
    bounds = [v for v in (floor_ms, warm_ms) if isinstance(v, (int, float)) and v > 0]
    bound = max(bounds) if bounds else None
    vs_floor = ratio(cold_ms, bound)
    return {"peer_best": best, "peer_best_ms": have.get(best) if best else None, "cold_vs_peer": vs_peer,
            "floor_bound_ms": bound, "floor_bound_is": (None if bound is None else
                                                        "read floor" if bound == floor_ms else "warm"),
            "cold_vs_floor": vs_floor,
            "goal_peer_met": None if vs_peer is None else vs_peer <= GOAL_PEER,
            "goal_floor_met": None if vs_floor is None else vs_floor <= GOAL_FLOOR}


def loss(variant_ms: float | None, base_ms: float | None) -> float | None:
    """Relative slow-down of a variant against the full configuration (0.25 = 25 % slower)."""
    r = ratio(variant_ms, base_ms)
    return None if r is None else r - 1.0


def _mark(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "missed")


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per configuration: median / min / max cold ms over the rounds that succeeded, and the errors."""
    out: dict[str, dict[str, Any]] = {}
    for key, rs in runs.items():
        ok = [r["cold_ms"] for r in rs if isinstance(r.get("cold_ms"), (int, float))]
        errs = [r["error"] for r in rs if "error" in r]
        out[key] = {"cold_ms": _median(ok), "min_ms": min(ok) if ok else None, "max_ms": max(ok) if ok else None,
                    "n": len(ok), "errors": errs[:2]}
        warm = [r["warm_ms"] for r in rs if isinstance(r.get("warm_ms"), (int, float))]
        if warm:
            out[key]["warm_ms"] = _median(warm)
        errs_rel = [r["rel_err"] for r in rs if isinstance(r.get("rel_err"), (int, float))]
        if errs_rel:
            out[key]["rel_err"] = max(errs_rel)
        busy = [r["others_cpu"] for r in rs if isinstance(r.get("others_cpu"), (int, float))]
        if busy:
            out[key]["others_cpu_max"] = max(busy)
        nbytes = [r["bytes"] for r in rs if isinstance(r.get("bytes"), int)]
        if nbytes:
            out[key]["bytes"] = nbytes[0]
    return out


def _median_round(rs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The round whose cold time is the median (its breakdown and timeline are the ones shown)."""
    ok = sorted((r for r in rs if isinstance(r.get("cold_ms"), (int, float))), key=lambda r: r["cold_ms"])
    return ok[(len(ok) - 1) // 2] if ok else None


# --------------------------------------------------------------------------------------------- one model

@dataclass
class BenchOptions:
    device: str = "cpu"
    repeat: int = 3
    ncnn: bool = True
    first_start: bool = False  # Vulkan: also inferd and ncnn with every cache empty
    ablation: bool = False
    background: bool = False
    warm_runs: int = 30
    threads: int = field(default_factory=lambda: os.cpu_count() or 2)
    loaders: int | None = None
    drop_mode: str = "auto"
    ort_prepacked: bool = True
    #: the inferd child's host pool, as the daemon's ``host_pool`` setting (0: none)
    host_pool: int = 256 << 20
    #: Vulkan: the inferd child's device pool, as the daemon's ``device_pool`` setting (0: none)
    device_pool: int = 64 << 20
    #: the inferd child rehearses a cold load on a small model before the request, as the daemon's start does
    #: (its ``rehearse`` setting; ``inferd.runtime.rehearsal``)
    rehearse: bool = True
    quiet_wait: float = QUIET_WAIT_S
    retries: int = RETRIES
    #: seconds per model that waiting for quiet and re-measuring contended runs may cost in all (when
    #: someone runs a test suite for minutes, the bench goes on, and says which runs were contended)
    patience_s: float = 60.0
    #: shortest window over which a child samples other processes' CPU use (see the child script)
    sample_s: float = 0.3
    #: also measure the package after inferd refined its plan from one observed cold run
    refined: bool = True
    #: also measure a reload: the package loaded again in a process that served it before (a daemon's model that
    #: its memory budget or an unload dropped), its files evicted as for every run
    reload: bool = True
    #: also measure the first load of a model the daemon registered at its start (``inferd.register``: the package's
    #: plan and store index parsed, no weight read), its files evicted as for every run
    registered: bool = True
    #: measure with the package's binds recorded by a load before the rounds, and its first load without
    binds: bool = True
    #: Vulkan: pipelines the inferd child makes resident before the request, as the daemon does at its start
    #: (its ``resident_pipelines`` setting); a second inferd configuration is measured without them
    resident_pipelines: int = 128


def _child_env(opts: BenchOptions, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=str(opts.threads), OPENBLAS_NUM_THREADS=str(opts.threads),
               LP_NUM_THREADS=str(opts.threads))
    env.update(extra or {})
    return env


def measure_model(name: str, onnx_path: Path, work: Path, opts: BenchOptions,
                  log: Any = print) -> dict[str, Any]:
    """Everything for one model: preparation outside any timer, then ``opts.repeat`` rounds."""
    import numpy as np
    import onnxruntime as ort

    from ..frontend import import_model

    t_model = time.perf_counter()
    load0 = os.getloadavg()
    tree = _tree_state()  # the engine may change between models while people work
    work.mkdir(parents=True, exist_ok=True)
    dev = opts.device
    res: dict[str, Any] = {"onnx": str(onnx_path), "onnx_bytes": onnx_path.stat().st_size, "errors": {},
                           "prepare_s": {}, "tree": tree}
    errors: dict[str, str] = res["errors"]

    # input and reference output (onnxruntime, default session) for a correctness check of every engine
    g = import_model(onnx_path)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(t.shape).astype(t.dtype) for t in g.inputs]
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    y = sess.run(None, {t.name: x for t, x in zip(g.inputs, xs)})[0]
    del sess
    ref = work / "ref.npz"
    np.savez(ref, y=y, **{f"x{i}": x for i, x in enumerate(xs)})
    base_spec = {"device": dev, "threads": opts.threads, "sample_s": opts.sample_s, "ref": str(ref),
                 "input_names": [t.name for t in g.inputs], "host_pool": opts.host_pool, "rehearse": opts.rehearse,
                 "device_pool": opts.device_pool,
                 "resident_pipelines": opts.resident_pipelines if dev == "vulkan" else 0}
    env = _child_env(opts)
    if dev == "vulkan":
        from .vulkan_bench import _driver_cache_env

        env = _child_env(opts, {k: v for k, v in _driver_cache_env(work / "driver_cache").items()
                                if k.startswith(("__GL_", "MESA_"))})
        env["INFERD_CACHE_DIR"] = str(work / "inferd_cache")
    configs: list[Config] = []

    # inferd packages: the default one, and one per ablation variant
    variants: list[str | None] = [None] + (list(ABLATIONS) if opts.ablation else [])
    pkgs: dict[str | None, Path] = {}
    for v in variants:
        t = time.perf_counter()
        try:
            pkgs[v] = compile_package(onnx_path, work / "pkg" / (v or "default"), dev, v, opts.loaders)
        except Exception as e:  # e.g. the Vulkan cold backend is not there yet: say so, go on
            errors[f"compile_{v or 'default'}"] = f"{type(e).__name__}: {e}"
        res["prepare_s"][f"compile_{v or 'default'}"] = round(time.perf_counter() - t, 3)
    if None in pkgs:
        p = pkgs[None]
        res["package_bytes"] = {f.name: f.stat().st_size for f in p.iterdir() if f.is_file()}
        regions, nbytes = plan_regions(p, dev)
        res["plan_read_bytes"] = nbytes + (p / "plan.bin").stat().st_size
        # the folder, not its files now: what a load writes into it later (binds.bin) is evicted and checked too
        files = [str(p)]
        snap = snapshot(p)
        configs.append(Config("inferd", {**base_spec, "engine": "inferd", "path": str(p), "options":
                                         _ablation_options(None), "warm_runs": opts.warm_runs,
                                         "loaders": opts.loaders}, files, env=env, restore=snap))
        if opts.refined:
            # what later cold loads of the same package see: inferd rewrites plan.bin after a cold run
            # with the costs it observed (when it predicts a gain); refine a copy once, then measure it
            rp = work / "pkg" / "refined"
            shutil.rmtree(rp, ignore_errors=True)
            shutil.copytree(p, rp)
            spec = {**base_spec, "engine": "inferd", "path": str(rp), "options": _ablation_options(None),
                    "loaders": opts.loaders, "timeline": False}
            try:
                x = run_child(Config("inferd_refine", {**spec, "join_refine": True}, _files_under(rp), env=env,
                                     restore=snapshot(rp)), opts.drop_mode, quiet_wait=0)
                res["refined_plan"] = bool(x.get("package_rewritten"))
                if res["refined_plan"]:
                    configs.append(Config("inferd_refined", spec, _files_under(rp), env=env, restore=snapshot(rp)))
            except ChildError as e:
                errors["refine"] = str(e)[:1500]
        configs.append(Config("floor", {**base_spec, "engine": "floor", "ref": "", "files": [
            [str(p / "plan.bin"), None], [str(p / "weights.store"), regions]]}, files, env=env))
        configs.append(Config("floor_direct", {**base_spec, "engine": "floor", "ref": "", "direct": True, "files": [
            [str(p / "plan.bin"), None], [str(p / "weights.store"), regions]]}, files, env=env))
        configs.append(Config("floor_whole", {**base_spec, "engine": "floor", "ref": "", "files": [
            [str(p / "plan.bin"), None], [str(p / "weights.store"), None]]}, files, env=env))
        if opts.binds:
            # the package's first load after its compile: no recorded binds read, none written (the CPU's
            # runtime.bindrec, Vulkan's vulkan.binds)
            configs.append(Config("inferd_no_binds", {**base_spec, "engine": "inferd", "path": str(p),
                                                      "options": _ablation_options(None), "loaders": opts.loaders,
                                                      "timeline": False}, files,
                                  env={**(env or os.environ), "INFERD_BINDS": "0"}, restore=snap))
        if opts.reload:
            configs.append(Config("inferd_reload", {**base_spec, "engine": "inferd", "path": str(p),
                                                    "options": _ablation_options(None), "loaders": opts.loaders,
                                                    "reload": True, "timeline": False}, files, env=env, restore=snap))
        if opts.registered:
            configs.append(Config("inferd_registered", {**base_spec, "engine": "inferd", "path": str(p),
                                                        "options": _ablation_options(None), "loaders": opts.loaders,
                                                        "register": True, "timeline": False}, files, env=env,
                                  restore=snap))
        if dev == "vulkan" and opts.resident_pipelines > 0:
            # the same package in a daemon whose device has none of its pipelines yet (it never served the model
            # since its start, or it was started with resident_pipelines = 0)
            configs.append(Config("inferd_no_resident", {**base_spec, "engine": "inferd", "path": str(p),
                                                         "options": _ablation_options(None), "loaders": opts.loaders,
                                                         "resident_pipelines": 0, "timeline": False},
                                  files, env=env, restore=snap))
        if opts.background:
            configs.append(Config("inferd_background", {**base_spec, "engine": "inferd", "path": str(p),
                                                        "options": _ablation_options(None),
                                                        "loaders": opts.loaders}, files, background=True, env=env,
                                restore=snap))
    elif dev == "vulkan":
        # no package for Vulkan (its cold backend is missing or failed): measure what the user would
        # get from inferd.load(onnx, device='vulkan') today, clearly labelled
        configs.append(Config("inferd_onnx", {**base_spec, "engine": "inferd", "path": str(onnx_path),
                                              "options": _ablation_options(None), "warm_runs": opts.warm_runs},
                              [str(onnx_path)], env=env))
    for v in variants:
        if v is not None and v in pkgs:
            configs.append(Config(f"inferd_{v}", {**base_spec, "engine": "inferd", "path": str(pkgs[v]),
                                                  "options": _ablation_options(v), "loaders": opts.loaders,
                                                  "timeline": False}, _files_under(pkgs[v]), env=env,
                                  restore=snapshot(pkgs[v])))

    # onnxruntime (CPU only: its Vulkan-free CPU provider is no peer of a GPU run)
    if dev == "cpu":
        configs.append(Config("ort_default", {**base_spec, "engine": "ort", "path": str(onnx_path)},
                              [str(onnx_path)], env=env))
        for pre in ([False, True] if opts.ort_prepacked else [False]):
            key = "ort_opt_prepacked" if pre else "ort_opt"
            t = time.perf_counter()
            try:
                op = prepare_ort(onnx_path, work / "ort", pre)
                configs.append(Config(key, {**base_spec, "engine": "ort", "path": str(op), "opt_off": True},
                                      [str(op), str(op) + ".data"], env=env))
            except Exception as e:
                errors[key] = f"{type(e).__name__}: {e}"
            res["prepare_s"][key] = round(time.perf_counter() - t, 3)

    # ncnn
    if opts.ncnn:
        ok, why = _ncnn_available()
        if not ok:
            errors["ncnn"] = why
        else:
            from .ncnn_peer import convert_ncnn

            t = time.perf_counter()
            try:
                param, binf = convert_ncnn(onnx_path, tuple(g.inputs[0].shape), work / "ncnn")
                cfg = Config("ncnn", {**base_spec, "engine": "ncnn", "param": str(param), "bin": str(binf)},
                             [str(param), str(binf)], env=env)
                if dev == "cpu":
                    # pnnx can write graphs ncnn cannot run (it then crashes): try once, unmeasured
                    run_child(cfg, "fadvise", quiet_wait=0)
                configs.append(cfg)
                if dev == "vulkan":  # its default options (fp16 storage and arithmetic), primed and first start
                    fp16 = {**cfg.spec, "fp16": True}
                    configs.append(Config("ncnn_fp16", fp16, cfg.files, env=env))
                    if opts.first_start:
                        configs.append(Config("ncnn_fp16_first", {**fp16, "fresh_caches": True}, cfg.files, env=env))
            except Exception as e:
                errors["ncnn"] = f"{type(e).__name__}: {e}"[:1500]
            res["prepare_s"]["ncnn_convert"] = round(time.perf_counter() - t, 3)

    # one load of the package before the rounds records its layers' binds (runtime.bindrec, vulkan.binds), as a
    # daemon's first load of it does: the rounds measure the loads after that one (``inferd_no_binds``: the first)
    if opts.binds:
        primed: set[str] = set()
        for c in configs:
            path = c.spec.get("path") if c.spec.get("engine") == "inferd" else None
            if not path or c.key == "inferd_no_binds" or path in primed or not Path(path).is_dir():
                continue
            primed.add(path)
            try:
                run_child(Config(f"prime_binds_{c.key}", {**c.spec, "warm_runs": 0, "join_refine": True,
                                                          "timeline": False}, c.files, env=c.env, restore=c.restore),
                          opts.drop_mode, quiet_wait=0)
                if c.key == "inferd":  # (0: no layer of this model could be recorded)
                    from ..package import binds_files

                    f = Path(path) / binds_files(dev)[0]
                    res["binds_file_bytes"] = f.stat().st_size if f.is_file() else 0
            except (ChildError, OSError) as e:
                errors[f"prime_binds_{c.key}"] = str(e)[:1500]
    # Vulkan: fill the shader/pipeline caches first (the daemon's state after a model's first load);
    # cold here means model files evicted, caches filled
    if dev == "vulkan":
        if opts.first_start and "inferd" in {c.key for c in configs}:
            c0 = next(c for c in configs if c.key == "inferd")
            # (a package's first load on a fresh device has no recorded binds either)
            configs.append(Config("inferd_first", {**c0.spec, "fresh_caches": True}, c0.files,
                                  env={**(c0.env or os.environ), "INFERD_BINDS": "0"}))
        for c in configs:
            if c.spec["engine"] in ("inferd", "ncnn") and not c.background and not c.spec.get("fresh_caches"):
                try:
                    run_child(Config(c.key, {**c.spec, "warm_runs": 0}, c.files, env=c.env), opts.drop_mode,
                              quiet_wait=opts.quiet_wait)
                except ChildError as e:
                    errors[f"prime_{c.key}"] = str(e)[:1500]

    # rounds: every configuration once per round, the order rotated so no engine always goes first
    runs: dict[str, list[dict[str, Any]]] = {c.key: [] for c in configs}
    t_rounds = time.perf_counter()
    spent = 0.0  # of opts.patience_s
    for r in range(max(1, opts.repeat)):
        k = r % max(1, len(configs))
        for c in configs[k:] + configs[:k]:
            for attempt in range(1 + max(0, opts.retries)):
                t_run = time.perf_counter()
                try:
                    x = run_child(c, opts.drop_mode, quiet_wait=min(opts.quiet_wait, max(0.0, opts.patience_s - spent)))
                except ChildError as e:
                    x = {"error": str(e)[-1500:]}
                spent += float(x.get("quiet_wait_s") or 0.0)
                x["attempt"] = attempt
                # another process took a good part of the machine during the timer: measure again
                # (the background runs bring their own busy loop, so they are kept as they are)
                if (c.background or (x.get("others_cpu") or 0.0) <= CONTENDED or "error" in x
                        or spent >= opts.patience_s):
                    break
                spent += time.perf_counter() - t_run - float(x.get("quiet_wait_s") or 0.0)
            runs[c.key].append(x)
    res["rounds_s"] = round(time.perf_counter() - t_rounds, 1)
    res["patience_spent_s"] = round(spent, 1)

    summ = summarize(runs)
    res["summary"] = summ
    main_key = "inferd" if "inferd" in summ else "inferd_onnx" if "inferd_onnx" in summ else None
    med = _median_round(runs[main_key]) if main_key else None
    inferd_cold = summ[main_key]["cold_ms"] if main_key else None
    inferd_warm = summ[main_key].get("warm_ms") if main_key else None
    # the floor is the faster way of reading those bytes: through the page cache or around it
    floors = {k: summ[k]["cold_ms"] for k in ("floor", "floor_direct") if summ.get(k, {}).get("cold_ms")}
    floor_key = min(floors, key=lambda k: floors[k]) if floors else None
    floor = floors.get(floor_key) if floor_key else None
    res["floor"] = {"ms": floor, "how": {"floor": "buffered", "floor_direct": "O_DIRECT"}.get(floor_key or ""),
                    "bytes": summ.get("floor", {}).get("bytes")}
    peers: dict[str, float | None] = {}
    ort_keys = [k for k in ("ort_default", "ort_opt", "ort_opt_prepacked") if summ.get(k, {}).get("cold_ms")]
    if ort_keys:
        best_ort = min(ort_keys, key=lambda k: summ[k]["cold_ms"])
        res["ort_best"] = best_ort
        peers["onnxruntime"] = summ[best_ort]["cold_ms"]
    if summ.get("ncnn", {}).get("cold_ms"):
        peers["ncnn"] = summ["ncnn"]["cold_ms"]
    res["inferd"] = {"key": main_key, "source": "package" if main_key == "inferd" else "onnx" if main_key else None,
                     "cold_ms": inferd_cold, "warm_ms": inferd_warm,
                     "cold_stats": med.get("cold_stats") if med else None,
                     "load_call_ms": med.get("load_call_ms") if med else None,
                     "plan_start_ms": med.get("plan_start_ms") if med else None,
                     "first_execute_ms": med.get("first_execute_ms") if med else None,
                     "plan": med.get("plan") if med else None,
                     "warm_switch": next((x.get("warm_switch") for x in runs.get(main_key or "", [])
                                          if x.get("warm_switch")), None),
                     "timeline": med.get("timeline") if med else None}
    res["ratios"] = goal_ratios(inferd_cold, inferd_warm, floor, peers)
    refined = summ.get("inferd_refined", {}).get("cold_ms")
    if refined:
        res["ratios_refined"] = goal_ratios(refined, inferd_warm, floor, peers)
    if summ.get("inferd_no_binds", {}).get("cold_ms"):
        res["binds"] = {"cold_ms": inferd_cold, "no_binds_cold_ms": summ["inferd_no_binds"]["cold_ms"],
                        "layers_replayed": (med.get("cold_stats") or {}).get("binds_replayed") if med else None,
                        "layers": (med.get("cold_stats") or {}).get("tasks") if med else None}
    reloaded = summ.get("inferd_reload", {}).get("cold_ms")
    if reloaded:
        res["ratios_reload"] = goal_ratios(reloaded, inferd_warm, floor, peers)
    registered = summ.get("inferd_registered", {}).get("cold_ms")
    if registered:
        res["ratios_registered"] = goal_ratios(registered, inferd_warm, floor, peers)
    res["package_rewritten_runs"] = sum(1 for k, rs in runs.items() if k.startswith("inferd")
                                        for x in rs if x.get("package_rewritten"))
    if opts.ablation and inferd_cold:
        res["ablation"] = {v: {"cold_ms": summ.get(f"inferd_{v}", {}).get("cold_ms"),
                               "loss": loss(summ.get(f"inferd_{v}", {}).get("cold_ms"), inferd_cold),
                               "plan": (_median_round(runs.get(f"inferd_{v}", [])) or {}).get("plan")}
                           for v in ABLATIONS}
    if opts.background and inferd_cold:
        bg = summ.get("inferd_background", {}).get("cold_ms")
        lo = loss(bg, inferd_cold)
        res["background"] = {"cold_ms": bg, "loss": lo, "core": _busy_core(),
                             "goal_met": None if lo is None else lo <= GOAL_BACKGROUND}
    # runs during which other processes used a good part of the machine (the background runs' own
    # busy loop excluded): their times are suspect, the report says how many there were
    res["contended_runs"] = sorted(f"{k}#{i}" for k, rs in runs.items() if not k.endswith("background")
                                   for i, x in enumerate(rs) if (x.get("others_cpu") or 0) > CONTENDED)
    res["cache"] = {"methods": sorted({x["cache"]["method"] for rs in runs.values() for x in rs if "cache" in x}),
                    "max_resident_bytes": max((x["cache"]["resident_bytes"] for rs in runs.values() for x in rs
                                               if "cache" in x), default=None),
                    "imported_in_timer": sorted({m for rs in runs.values() for x in rs
                                                 for m in x.get("imported_in_timer", [])})}
    # the per-round records, minus the bulky timelines (the median round's is kept above)
    res["runs"] = {k: [{kk: vv for kk, vv in x.items() if kk != "timeline"} for x in rs] for k, rs in runs.items()}
    res["model_s"] = round(time.perf_counter() - t_model, 1)
    # other work on this small machine shows here (the bench itself keeps ~1 core busy)
    res["loadavg"] = {"start": [round(x, 2) for x in load0], "end": [round(x, 2) for x in os.getloadavg()]}
    return res


# --------------------------------------------------------------------------------------------- plots

def _plt() -> Any:
    """matplotlib's pyplot on the Agg backend, installed with pip if missing; None if it cannot be had."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except Exception:
        pass
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], capture_output=True, timeout=900)
    try:
        import importlib

        importlib.invalidate_caches()
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except Exception:
        return None


_KIND_COLOUR = {"setup": "#999999", "prepare": "#4c72b0", "execute": "#55a868", "wait": "#c44e52",
                "finish": "#8172b2", "read": "#dd8452", "prefault": "#937860"}


def plot_timeline(plt: Any, events: list[dict[str, Any]], title: str, path: Path,
                  load_returns_ms: float | None = None) -> None:
    """One row per thread (loaders, then the executor), a bar per event coloured by kind; a line where
    ``inferd.load`` returned (a gap on the executor's row after it is time the scheduler does not see)."""
    threads = sorted({e["thread"] for e in events}, key=lambda t: (t == "MainThread", t))
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.55 * len(threads)))
    for row, th in enumerate(threads):
        for kind, colour in _KIND_COLOUR.items():
            bars = [(e["t0"] * 1e3, max((e["t1"] - e["t0"]) * 1e3, 0.02)) for e in events
                    if e["thread"] == th and e["kind"] == kind]
            if bars:
                ax.broken_barh(bars, (row - 0.38, 0.76), facecolors=colour, edgecolor="none")
    handles: list[Any] = []
    if load_returns_ms is not None:
        handles.append(ax.axvline(load_returns_ms, color="black", linestyle="--", linewidth=0.8,
                                  label="load() returned"))
    ax.set_yticks(range(len(threads)))
    ax.set_yticklabels(["executor (MainThread)" if t == "MainThread" else t for t in threads])
    ax.set_xlabel("ms since the request (timer start; 'setup' = inferd.load before the plan starts)")
    ax.set_title(title, fontsize=10)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=k) for k, c in _KIND_COLOUR.items()] + handles, loc="upper left",
              bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bars(plt: Any, models: dict[str, dict[str, Any]], title: str, path: Path) -> None:
    """Cold vs warm vs read floor vs peers, all models, log scale (models span two decades)."""
    series = [("inferd cold", lambda r: r["inferd"]["cold_ms"]),
              ("inferd cold, refined plan", lambda r: r["summary"].get("inferd_refined", {}).get("cold_ms")),
              ("inferd warm", lambda r: r["inferd"]["warm_ms"]),
              ("read floor", lambda r: r["floor"]["ms"]),
              ("ort default cold", lambda r: r["summary"].get("ort_default", {}).get("cold_ms")),
              ("ort best cold", lambda r: r["summary"].get(r.get("ort_best") or "", {}).get("cold_ms")),
              ("ncnn cold", lambda r: r["summary"].get("ncnn", {}).get("cold_ms"))]
    names = list(models)
    n = len(series)
    w = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(names) + 2), 4.8))
    for i, (label, get) in enumerate(series):
        vals = []
        for m in names:
            try:
                v = get(models[m])
            except (KeyError, TypeError):
                v = None
            vals.append(v if isinstance(v, (int, float)) and v > 0 else 0.0)
        if any(vals):
            ax.bar([j + (i - n / 2 + 0.5) * w for j in range(len(names))], vals, w, label=label)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("ms (log scale)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------- report

def vulkan_goals(data: dict[str, Any]) -> list[str]:
    """The Vulkan goals' table: against ncnn with its default options (fp16), caches filled and empty."""
    lines = ["", "Vulkan goals: with caches filled, cold <= 0.15x ncnn's default options (fp16, driver cache primed) and "
             "<= 1.5x (warm + read floor); first start (inferd's SPIR-V and pipeline caches and the driver's shader "
             "cache empty; inferd reads the SPIR-V the package ships, `inferd.vulkan.precompile`) <= 0.25x ncnn's "
             "first start. "
             "inferd cold: the model's pipelines made resident by the daemon's start (`resident_pipelines`, from the "
             "device's list of recently used pipelines); 'no resident' is the same package in a daemon whose "
             "device has created none of them yet.", "",
             "| model | inferd cold ms | ncnn fp16 primed ms | ratio | goal 0.15 | warm + floor ms | ratio | goal 1.5 | "
             "no resident ms | ratio | inferd first start ms | ncnn fp16 first start ms | ratio | goal 0.25 |",
             "|---|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    for n, r in data["models"].items():
        s, i = r.get("summary", {}), r.get("inferd", {})
        cold, warm, floor = i.get("cold_ms"), i.get("warm_ms"), (r.get("floor") or {}).get("ms")
        nf = s.get("ncnn_fp16", {}).get("cold_ms")
        wf = warm + floor if warm and floor else None
        fi, fn = s.get("inferd_first", {}).get("cold_ms"), s.get("ncnn_fp16_first", {}).get("cold_ms")
        nr = s.get("inferd_no_resident", {}).get("cold_ms")

        def met(x: float | None, goal: float) -> str:
            return "n/a" if x is None else ("met" if x <= goal else "missed")
        r1, r2, r3 = ratio(cold, nf), ratio(cold, wf), ratio(fi, fn)
        lines.append(f"| {n} | {fmt(cold)} | {fmt(nf)} | {fmt(r1, '.3f')} | {met(r1, 0.15)} | {fmt(wf)} | "
                     f"{fmt(r2, '.2f')} | {met(r2, 1.5)} | {fmt(nr)} | {fmt(ratio(nr, wf), '.2f')} | {fmt(fi)} | "
                     f"{fmt(fn)} | {fmt(r3, '.3f')} | {met(r3, 0.25)} |")
    return lines


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    dev = data["device"]
    lines = [f"# inferd cold inference, {dev}", "",
             f"Date {m['date']}; {m['cpu']}, {m['cores']} cores; onnxruntime {data['versions'].get('onnxruntime')}, "
             f"ncnn {data['versions'].get('ncnn')} (pnnx, fp16 off); {data['threads']} threads for every engine; "
             f"inferd {data['versions'].get('inferd')} at {str(data.get('tree', {}).get('commit', '?'))[:10]}"
             f" (+{len(data.get('tree', {}).get('modified_files', []))} modified files).",
             "",
             f"Cold = fresh process with the libraries imported (and inferd's loader threads started, and its host "
             f"pool of {int(data.get('host_pool_bytes') or 0) >> 20} MiB faulted in"
             + (f", and its device pool of {int(data.get('device_pool_bytes') or 0) >> 20} MiB allocated with the device"
                if dev == "vulkan" else "")
             + (", and a cold load rehearsed on a small model of its own" if data.get("rehearse") else "")
             + ", as a daemon that is up), page cache "
             f"dropped ({', '.join(data['cache_methods']) or 'n/a'}; max resident bytes of the run's files found by "
             f"mincore before a run: {data['max_resident_bytes']}), load + first inference. Median of "
             f"{data['repeat']} rounds, engines in rotated order per round. inferd loads its compiled package; "
             "onnxruntime 'best' = the better of its default session and its offline-optimised model with "
             "external (memory-mapped) initializers loaded with optimisation off; read floor = one thread "
             "reading what the plan reads (store regions + plan.bin) with large sequential reads, the faster of "
             "buffered and O_DIRECT; the whole package read buffered is in the JSON (floor_whole). inferd "
             "rewrites its package's plan.bin after a cold run (refinement from observed costs): every round "
             "here measures the package as compiled (plan.bin restored before each run); 'cold after "
             "refinement' measures a copy refined once, which is what later cold loads would use.", "",
             f"Goals: cold <= {GOAL_PEER}x the better peer; cold <= {GOAL_FLOOR}x max(read floor, warm).", "",
             "| model | inferd cold ms (range) | warm ms | read floor ms (MB) | ort default ms | "
             "ort best ms (config) | "
             "ncnn ms | cold / best peer | peer goal | cold / max(floor, warm) | floor goal | "
             "cold after refinement ms (/ peer, / floor-warm) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---:|"]
    for n, r in data["models"].items():
        s, q, i = r.get("summary", {}), r.get("ratios", {}), r.get("inferd", {})
        fl = r.get("floor") or {}
        ob = r.get("ort_best")
        mb = fl["bytes"] / 1e6 if fl.get("bytes") else None
        lines.append(
            f"| {n} | {fmt(i.get('cold_ms'))} ({_range(s.get(i.get('key') or '', {}))}) | "
            f"{fmt(i.get('warm_ms'), '.2f')} | {fmt(fl.get('ms'))} "
            f"({fmt(mb, '.1f')}, {fl.get('how') or 'n/a'}) | {fmt(s.get('ort_default', {}).get('cold_ms'))} | "
            f"{fmt(s.get(ob or '', {}).get('cold_ms'))} ({ob or 'n/a'}) | {fmt(s.get('ncnn', {}).get('cold_ms'))} | "
            f"{fmt(q.get('cold_vs_peer'), '.2f')} ({q.get('peer_best') or 'n/a'}) | {_mark(q.get('goal_peer_met'))} | "
            f"{fmt(q.get('cold_vs_floor'), '.2f')} ({q.get('floor_bound_is') or 'n/a'}) | "
            f"{_mark(q.get('goal_floor_met'))} | {_refined_cell(r)} |")
    lines += ["", "inferd's own breakdown (median round; seconds summed over threads, so read + transform can "
              "exceed the wall time):", "",
              "| model | wall ms | plan starts at ms | cold_s ms | load() returns ms | first execute at ms | "
              "read ms | transform ms | execute ms | waiting ms | stolen / tasks | predicted ms | plan reads | "
              "max rel err |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for n, r in data["models"].items():
        i = r.get("inferd", {})
        cs = i.get("cold_stats") or {}
        pl = i.get("plan") or {}
        # (inferd's configurations only: ncnn's fp16 peer differs from onnxruntime by 1e-3, which is not inferd's)
        errs = [v.get("rel_err") for k, v in r.get("summary", {}).items()
                if k.startswith("inferd") and isinstance(v.get("rel_err"), float)]
        lines.append(f"| {n} | {fmt(i.get('cold_ms'))} | {fmt(i.get('plan_start_ms'))} | "
                     f"{fmt(_ms(cs.get('cold_s')))} | {fmt(i.get('load_call_ms'))} | {fmt(i.get('first_execute_ms'))} "
                     f"| {fmt(_ms(cs.get('read_s')))} | {fmt(_ms(cs.get('transform_s')))} | "
                     f"{fmt(_ms(cs.get('execute_s')))} | {fmt(_ms(cs.get('waiting_s')))} | "
                     f"{cs.get('stolen', 'n/a')} / {cs.get('tasks', 'n/a')} | {fmt(pl.get('predicted_ms'))} | "
                     f"{pl.get('sources', 'n/a')} | {fmt(max(errs) if errs else None, '.1e')} |")
    if any(r.get("binds") for r in data["models"].values()):
        lines += ["", "Recorded binds (`inferd.runtime.bindrec` on the CPU, `inferd.vulkan.binds` on Vulkan): a "
                  "package's first cold load binds every layer (the CPU's native steps laid out from the node, "
                  "Vulkan's dispatches worked out and their bindings resolved: Python under the GIL, beside the "
                  "executor); it then records "
                  "them in the package, and its later cold loads rebuild them from the new addresses. The rounds "
                  "above follow one such load; 'first load' is the same package with the records neither read nor "
                  "written (`INFERD_BINDS=0`), as right after `inferd compile`.", "",
                  "| model | cold ms (binds recorded) | first load ms (none) | recorded / first | layers rebuilt |",
                  "|---|---:|---:|---:|---:|"]
        for n, r in data["models"].items():
            b = r.get("binds") or {}
            lines.append(f"| {n} | {fmt(b.get('cold_ms'))} | {fmt(b.get('no_binds_cold_ms'))} | "
                         f"{fmt(ratio(b.get('cold_ms'), b.get('no_binds_cold_ms')), '.2f')} | "
                         f"{b.get('layers_replayed', 'n/a')} of {b.get('layers', 'n/a')} |")
    # the rounds of the same package in another daemon state, each beside the never-seen model's cold
    for cfg, word, intro in (
            ("reload", "reload", "Reload: the same package loaded again by a process that served it before (a "
             "daemon's model that its memory budget or an unload dropped), its files evicted as for every run: the "
             "load takes the plan and store index that process parsed (`package._open_plan`, `store._indexes`); "
             "the weights are read again."),
            ("registered", "registered", "Registered: the first request for a model of a daemon's repository that "
             "the daemon registered at its start (`inferd.register`, what `ModelSlot.register` runs in idle time for "
             "every model it does not preload: the package validated, its plan and store index parsed, no weight "
             "read), its files evicted as for every run. The cold column above is a model the daemon never saw "
             "before the request.")):
        if not any(f"inferd_{cfg}" in r.get("summary", {}) for r in data["models"].values()):
            continue
        lines += ["", intro, "",
                  f"| model | inferd cold ms | {word} ms (range) | {word} / cold | {word} / best peer | "
                  f"{word} / max(floor, warm) |", "|---|---:|---:|---:|---:|---:|"]
        for n, r in data["models"].items():
            s, i = r.get("summary", {}), r.get("inferd", {})
            v = s.get(f"inferd_{cfg}", {})
            q = r.get(f"ratios_{cfg}") or {}
            lines.append(f"| {n} | {fmt(i.get('cold_ms'))} | {fmt(v.get('cold_ms'))} ({_range(v)}) | "
                         f"{fmt(ratio(v.get('cold_ms'), i.get('cold_ms')), '.2f')} | "
                         f"{fmt(q.get('cold_vs_peer'), '.2f')} | {fmt(q.get('cold_vs_floor'), '.2f')} |")
    if data.get("ablation"):
        lines += ["", "Ablation: inferd cold with one technique off (everything else on); loss = slow-down "
                  "against the full configuration.", "",
                  "| model | full ms | " + " | ".join(ABLATION_LABEL[v] + " ms (loss)" for v in ABLATIONS) + " |",
                  "|---|---:|" + "---:|" * len(ABLATIONS)]
        for n, r in data["models"].items():
            a = r.get("ablation") or {}
            cells = [f"{fmt(a.get(v, {}).get('cold_ms'))} ({_pct(a.get(v, {}).get('loss'))})" for v in ABLATIONS]
            lines.append(f"| {n} | {fmt(r.get('inferd', {}).get('cold_ms'))} | " + " | ".join(cells) + " |")
    if data.get("background"):
        lines += ["", f"Background load: a busy-looping process pinned to one core during the cold run "
                  f"(goal: at most {100 * GOAL_BACKGROUND:.0f} % loss).", "",
                  "| model | cold ms | cold ms, one core busy | loss | goal |", "|---|---:|---:|---:|---|"]
        for n, r in data["models"].items():
            b = r.get("background") or {}
            lines.append(f"| {n} | {fmt(r.get('inferd', {}).get('cold_ms'))} | {fmt(b.get('cold_ms'))} | "
                         f"{_pct(b.get('loss'))} | {_mark(b.get('goal_met'))} |")
    if dev == "vulkan":
        lines += vulkan_goals(data)
    notes = list(data.get("notes", []))
    commits = {n: (r.get("tree") or {}).get("commit") for n, r in data["models"].items()}
    if len(set(commits.values())) > 1:
        notes.append("the engine changed during this run (work in progress): " + ", ".join(
            f"{n} at {str(c)[:10]}" for n, c in commits.items()))
    for n, r in data["models"].items():
        for k, v in (r.get("errors") or {}).items():
            notes.append(f"{n}: {k}: {_first_lines(v)}")
        for k, v in (r.get("summary") or {}).items():
            for e in v.get("errors", []):
                notes.append(f"{n}: {k} failed: {_first_lines(e)}")
        if r.get("package_rewritten_runs"):
            notes.append(f"{n}: inferd rewrote its package's plan.bin after {r['package_rewritten_runs']} measured "
                         "runs (put back before every run)")
        cont = r.get("contended_runs") or []
        if cont:
            total = sum(len(v) for v in (r.get("runs") or {}).values())
            notes.append(f"{n}: {len(cont)} of {total} runs had other processes using more than "
                         f"{100 * CONTENDED:.0f} % of the machine during the timer: {', '.join(cont[:8])}")
        imp = (r.get("cache") or {}).get("imported_in_timer")
        if imp:
            notes.append(f"{n}: modules imported inside the timer: {', '.join(imp)}")
    if notes:
        lines += ["", "Notes:", ""] + [f"- {x}" for x in notes]
    if data.get("plots"):
        lines += ["", "Plots: " + ", ".join(f"`{p}`" for p in data["plots"])]
    return "\n".join(lines) + "\n"


def _refined_cell(r: dict[str, Any]) -> str:
    if "refined_plan" not in r:
        return "n/a"
    if not r["refined_plan"]:
        return "plan kept"
    q = r.get("ratios_refined") or {}
    return (f"{fmt(r['summary'].get('inferd_refined', {}).get('cold_ms'))} ({fmt(q.get('cold_vs_peer'), '.2f')}, "
            f"{fmt(q.get('cold_vs_floor'), '.2f')})")


def _first_lines(msg: Any, n: int = 2) -> str:
    """The head of an error (where the cause is; a child's stderr tail ends in noise)."""
    lines = [ln.strip() for ln in str(msg).strip().splitlines() if ln.strip()]
    return " / ".join(lines[:n])[:400]


def _range(summ: dict[str, Any]) -> str:
    return f"{fmt(summ.get('min_ms'))}-{fmt(summ.get('max_ms'))}"


def _ms(s: Any) -> float | None:
    return s * 1e3 if isinstance(s, (int, float)) else None


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.0f} %"


# --------------------------------------------------------------------------------------------- CLI

def _tree_state() -> dict[str, Any]:
    """The commit measured and whether the work tree differed from it (read-only git queries): the
    engine changes under a benchmark that runs while people work."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.split("\n")
        return {"commit": head, "modified_files": sorted(ln[3:] for ln in dirty if ln.strip())}
    except (OSError, subprocess.SubprocessError):
        return {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="inferd bench cold", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "vulkan"])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS))
    p.add_argument("--repeat", type=int, default=3, help="rounds per model (median reported)")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--no-ncnn", action="store_true")
    p.add_argument("--ablation", action="store_true", help="also inferd with each cold technique off")
    p.add_argument("--background", action="store_true", help="also inferd with one core busy")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--first-start", action="store_true",
                   help="Vulkan: also inferd and ncnn (default options) with their SPIR-V, pipeline and driver caches empty")
    p.add_argument("--no-refined", action="store_true", help="skip measuring the package after refinement")
    p.add_argument("--no-binds", action="store_true",
                   help="skip the recorded binds (no priming load, no first-load figure)")
    p.add_argument("--no-reload", action="store_true",
                   help="skip measuring a reload (the package loaded again by a process that served it before)")
    p.add_argument("--no-registered", action="store_true",
                   help="skip measuring the first load of a model the daemon registered at its start")
    p.add_argument("--warm-runs", type=int, default=30)
    p.add_argument("--host-pool", type=float, default=256,
                   help="MiB of host pool the inferd child faults in before the request, as the daemon does at its "
                        "start (its host_pool setting; 0: none)")
    p.add_argument("--no-rehearse", action="store_true",
                   help="the inferd child skips the cold-load rehearsal a daemon's start runs (its rehearse setting)")
    p.add_argument("--device-pool", type=float, default=64,
                   help="Vulkan: MiB of device pool the inferd child allocates with its device, as the daemon does "
                        "(its device_pool setting; 0: none)")
    p.add_argument("--resident-pipelines", type=int, default=128,
                   help="Vulkan: pipelines the inferd child makes resident before the request, as the daemon does "
                        "at its start (its resident_pipelines setting; 0: none, and no run without them)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--loaders", type=int, default=None, help="inferd loader threads (default: the plan's)")
    p.add_argument("--work", default=None, help="working folder (zoo, packages, converted models)")
    p.add_argument("--tag", default="", help="suffix of the result files' names")
    p.add_argument("--quiet-wait", type=float, default=QUIET_WAIT_S,
                   help="seconds a run may wait for other processes to quiet down (0: don't)")
    p.add_argument("--patience", type=float, default=60.0,
                   help="seconds per model for waiting for quiet and re-measuring contended runs")
    args = p.parse_args(argv)
    from ..zoo import write_zoo

    work = Path(args.work or Path(tempfile.gettempdir()) / "inferd-coldbench")
    names = [n for n in args.models.split(",") if n]
    opts = BenchOptions(device=args.device, repeat=args.repeat, ncnn=not args.no_ncnn, ablation=args.ablation,
                        first_start=args.first_start,
                        background=args.background, warm_runs=args.warm_runs, threads=args.threads,
                        loaders=args.loaders, quiet_wait=args.quiet_wait, patience_s=args.patience,
                        refined=not args.no_refined, reload=not args.no_reload, binds=not args.no_binds,
                        registered=not args.no_registered,
                        host_pool=int(args.host_pool * (1 << 20)),
                        device_pool=int(args.device_pool * (1 << 20)), rehearse=not args.no_rehearse,
                        resident_pipelines=max(0, args.resident_pipelines))
    paths = write_zoo(work / "zoo", names)
    notes: list[str] = []
    if os.geteuid() != 0:
        notes.append("not root: page cache emptied with posix_fadvise(DONTNEED) per file, not drop_caches")
    results: dict[str, Any] = {}
    for n in names:
        r = results[n] = measure_model(n, Path(paths[n]), work / args.device / n, opts)
        s, q, i = r["summary"], r["ratios"], r["inferd"]
        print(f"{n:18s} inferd cold {fmt(i['cold_ms']):>7} ms warm {fmt(i['warm_ms'], '.2f'):>7}  floor "
              f"{fmt(r['floor']['ms']):>6}  ort {fmt(s.get('ort_default', {}).get('cold_ms')):>6}"
              f" / best {fmt(q.get('peer_best_ms') if q.get('peer_best') == 'onnxruntime' else None):>6}"
              f"  ncnn {fmt(s.get('ncnn', {}).get('cold_ms')):>6}  vs peer {fmt(q['cold_vs_peer'], '.2f')}"
              f"  vs floor/warm {fmt(q['cold_vs_floor'], '.2f')}  ({r['model_s']:.0f} s)"
              + (f"  errors: {list(r['errors'])}" if r["errors"] else ""), flush=True)
    versions: dict[str, Any] = {}
    try:
        import onnxruntime as ort
        versions["onnxruntime"] = ort.__version__
    except Exception:
        versions["onnxruntime"] = None
    try:
        import ncnn
        versions["ncnn"] = getattr(ncnn, "__version__", "?")
    except Exception:
        versions["ncnn"] = None
    from .. import __version__
    versions["inferd"] = __version__
    data: dict[str, Any] = {
        "machine": machine_info(), "tree": _tree_state(), "device": args.device, "repeat": args.repeat,
        "threads": args.threads, "rehearse": opts.rehearse,
        "host_pool_bytes": opts.host_pool, "device_pool_bytes": opts.device_pool,
        "versions": versions, "ablation": args.ablation, "background": args.background,
        "goals": {"cold_vs_peer_max": GOAL_PEER, "cold_vs_floor_warm_max": GOAL_FLOOR,
                  "background_loss_max": GOAL_BACKGROUND},
        "cache_methods": sorted({m for r in results.values() for m in r["cache"]["methods"]}),
        "max_resident_bytes": max((r["cache"]["max_resident_bytes"] or 0 for r in results.values()), default=None),
        "models": results, "notes": notes}
    stem = f"cold_{args.device}" + (f"_{args.tag}" if args.tag else "")
    day = data["machine"]["date"][:10]
    plots: list[str] = []
    if not args.no_plots:
        plt = _plt()
        if plt is None:
            notes.append("matplotlib unavailable: no plots written")
        else:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            for n, r in results.items():
                tl = r["inferd"].get("timeline")
                if tl:
                    f = out / f"{day}_{stem}_timeline_{n}.png"
                    plot_timeline(plt, tl, f"{n}: inferd cold {fmt(r['inferd']['cold_ms'])} ms on {args.device} "
                                  f"(median round): loader threads and executor", f,
                                  r["inferd"].get("load_call_ms"))
                    plots.append(f.name)
            f = out / f"{day}_{stem}_bars.png"
            plot_bars(plt, results, f"cold vs warm vs read floor vs peers ({args.device}, {data['machine']['cores']} "
                      f"cores, median of {args.repeat})", f)
            plots.append(f.name)
    data["plots"] = plots
    jp, mp = write_results(args.out, stem, data, markdown(data))
    print(f"wrote {jp} and {mp}" + (f" and {len(plots)} plots" if plots else ""))
    return 0
