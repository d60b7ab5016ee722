"""Shared helpers for benchmarks: machine description, timing, result files."""
from __future__ import annotations

import datetime as _dt
import gzip
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import psutil
        mem = psutil.virtual_memory().total
    except Exception:
        mem = 0
    try:
        import numpy as np
        npv = np.__version__
    except Exception:
        npv = "?"
    try:
        load = [round(x, 2) for x in os.getloadavg()]  # other work on the machine while it was measured
    except OSError:
        load = []
    try:  # which kernels ran: INFERD_INT8_KERNELS can put a board's int8 path on this machine
        from .. import native

        kernels = native.kernel_names()
    except Exception:
        kernels = {}
    return {"host": socket.gethostname(), "cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem,
            "machine": platform.machine(), "python": platform.python_version(), "numpy": npv,
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "loadavg": load,
            "kernels": kernels}


def time_calls(fn: Callable[[], Any], repeat: int, warmup: int = 2) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


from ..runtime.profiler import ramp  # noqa: E402,F401 - the benches' name for it

_BUSY = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def busy_loop(core: int) -> "subprocess.Popen[bytes]":
    """A process spinning on ``core`` (the background load the benchmarks run beside): kill it when done."""
    return subprocess.Popen([sys.executable, "-c", _BUSY, str(core)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def daemon_state(device: str, device_pool_bytes: int = 0, resident_pipelines: int = 0, host_pool_bytes: int = 0,
                 claim_cores: bool = False, rehearse: bool = False) -> Any:
    """Put a bench's child in the state of a daemon that is up, before its cold load is timed: the loader threads
    started; ``claim_cores``: numpy's BLAS held to one thread (``server.daemon.apply_threads``); its host pool
    faulted in (``host_pool_bytes``); ``rehearse``: a cold load rehearsed on a small model of its own, as the daemon's
    start does (``runtime.rehearsal``); on Vulkan the device created with its device pool (``device_pool_bytes``) and
    the listed pipelines made resident (``resident_pipelines``) and the Vulkan load path imported, as the daemon's start
    does. Returns ``make_resident``'s answer (None if none)."""
    from ..runtime.scheduler import default_loaders, loader_pool

    loader_pool().set_size(default_loaders())
    if claim_cores:
        from .. import native

        native.claim_cores()
    if host_pool_bytes:
        from ..runtime import hostpool

        pool = hostpool.install(int(host_pool_bytes))
        if pool is not None:
            pool.wait_prefaulted(60)
    if rehearse:
        from ..runtime.rehearsal import rehearse as run

        if run("cpu") is None:
            raise RuntimeError("the cold-load rehearsal failed (INFERD_LOG=debug says why)")
    if device != "vulkan":
        return None
    from ..vulkan import devpool
    from ..vulkan.device import get_device

    devpool.configure(int(device_pool_bytes or 0))
    dev = get_device()
    if dev.pool is not None:
        dev.pool.wait_prefaulted(60)
    if int(resident_pipelines or 0) <= 0:
        return None
    st = dev.make_resident(int(resident_pipelines))
    # as the daemon's start does after making the pipelines resident (``server.daemon._make_resident``): the
    # Vulkan backend's modules and its kernels' host bindings imported before a Vulkan cold load comes (a bench
    # child without it paid 20-60 ms of imports in its first load() on lavapipe, 2026-12-07)
    from ..vulkan import import_load_path

    import_load_path()
    return st


def median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def drop_page_cache(path: str | os.PathLike | None = None) -> bool:
    """Evict ``path`` (or everything, as root) from the page cache, for honest cold reads."""
    ok = False
    if path is not None:
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                ok = True
            finally:
                os.close(fd)
        except (OSError, AttributeError):
            pass
    return ok


#: A result's JSON larger than this is written gzipped (``<name>.json.gz``, whole: ``read_json`` reads either).
#: Why: every device call carries the checkout, bench/results included, in at most 64 MiB, and the results with
#: per-run timelines or per-sample rows (160 files over 64 KiB) had grown to 37 of the tracked 59 MB; gzipped
#: they take about a ninth, and the small ones stay readable as they are.
JSON_GZIP_OVER = 64 << 10


def write_json(out_dir: str | os.PathLike, base: str, data: Any) -> Path:
    """``data`` as ``<out_dir>/<base>.json``, or ``<base>.json.gz`` where its text is over ``JSON_GZIP_OVER``
    bytes (gzip without a timestamp: the same data makes the same file); the other form, left by an earlier
    run of the same name, is removed. Returns the path written."""
    out = Path(out_dir)
    raw = (json.dumps(data, indent=2, default=str) + "\n").encode()
    plain, packed = out / f"{base}.json", out / f"{base}.json.gz"
    keep, drop = (packed, plain) if len(raw) > JSON_GZIP_OVER else (plain, packed)
    keep.write_bytes(gzip.compress(raw, 9, mtime=0) if keep is packed else raw)
    drop.unlink(missing_ok=True)
    return keep


def read_json(path: str | os.PathLike) -> Any:
    """A result file ``write_json`` wrote, gzipped (``.gz``) or not."""
    p = Path(path)
    raw = p.read_bytes()
    return json.loads(gzip.decompress(raw) if p.suffix == ".gz" else raw)


def write_results(out_dir: str | os.PathLike, stem: str, data: dict[str, Any], table_md: str) -> tuple[Path, Path]:
    """``<date>_<stem>`` as JSON (``write_json``: gzipped when large) and its markdown table; their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    day = data.get("machine", {}).get("date", "")[:10] or _dt.date.today().isoformat()
    base = f"{day}_{stem}"
    jp = write_json(out, base, data)
    mp = out / f"{base}.md"
    mp.write_text(table_md)
    return jp, mp


def ratio(a: Any, b: Any) -> float | None:
    """``a / b``, or None when either is missing or ``b`` is not positive (tables print 'n/a', not NaN)."""
    try:
        fa, fb = float(a), float(b)
    except (TypeError, ValueError):
        return None
    if fb <= 0 or fa != fa or fb != fb:
        return None
    return fa / fb


def fmt(x: Any, spec: str = ".1f", missing: str = "n/a") -> str:
    """A number for a markdown cell; ``missing`` for None/NaN/non-numbers."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x:
        return missing
    return format(x, spec)


def run_child(code: str, args: list[str], env: dict[str, str] | None = None, timeout: float = 900) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter; its last ``RESULT {json}`` line, or ``{"error": tail of its output}``."""
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=timeout)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return {"error": (r.stderr or r.stdout)[-3000:]}
    return json.loads(lines[-1][7:])
