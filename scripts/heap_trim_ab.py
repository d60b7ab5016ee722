"""A daemon's RSS serving a few zoo models, with its heap trims (``heap_trim``) on and off.

Per device and arm: a daemon on a fresh cache directory (its first start compiles every model), then a second
daemon on that cache (a start from the packages); each answers one request per model, and the RSS is read once
the idle work after the answers is over (the status's heap trims and RSS unchanged for 1.5 s), with the process's
peak (VmHWM). The daemon's own settings otherwise (256 MiB host pool, resident pipelines). argv: [out.json]
[devices, comma-separated].
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from inferd import zoo
from inferd.server.testing import DaemonProcess, wait_until
from inferd_client import Client

MODELS = ["mlp_small", "mobilenetv2", "resnet18", "tiny"]
MIB = 1 << 20


def _hwm(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _settle(c: Client, timeout: float = 60.0) -> dict:
    last, since, end = None, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < end:
        mem = c.status()["memory"]
        key = (mem["heap"]["trims"], mem["rss_bytes"] // MIB)
        if key != last:
            last, since = key, time.monotonic()
        elif time.monotonic() - since >= 1.5:
            break
        time.sleep(0.25)
    return c.status()["memory"]


def _serve(repo: Path, cache: Path, sock: Path, device: str, trim: bool, log: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    env.update(INFERD_HEAP_TRIM="1" if trim else "0", INFERD_CACHE_DIR=str(cache), INFERD_HOST_POOL="256M",
               INFERD_RESIDENT_PIPELINES="128", INFERD_MEMORY_PRESSURE="off")
    t0 = time.monotonic()
    with DaemonProcess(f"ipc://{sock}/d.sock", repo, env=env, log_path=log, device=device) as d, \
            Client(d.endpoint, timeout=300) as c:
        wait_until(lambda: c.status()["ready"], 600)
        ready_s = time.monotonic() - t0
        for m in c.models():
            name = m["name"]
            ins = {i["name"]: np.zeros(i["shape"], np.float32) for i in m["inputs"]}
            c.infer(name, ins)
        mem = _settle(c)
        return {"ready_s": round(ready_s, 1), "rss_mib": round(mem["rss_bytes"] / MIB, 1),
                "models_mib": round(mem["models_bytes"] / MIB, 1),
                "overhead_mib": round(mem["overhead_bytes"] / MIB, 1),
                "heap": mem["heap"], "process_rss_mib": round(d.rss() / MIB, 1), "peak_mib": _hwm(d.pid)}


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("heap_trim_ab.json")
    devices = (sys.argv[2] if len(sys.argv) > 2 else "cpu,vulkan").split(",")
    tmp = Path(tempfile.mkdtemp(prefix="ifht", dir="/tmp"))
    res: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": platform.node(),
                 "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "models": MODELS,
                 "runs": []}
    try:
        repo = tmp / "m"
        zoo.write_zoo(repo, MODELS)
        for device in devices:
            for trim in (True, False):
                cache = tmp / f"cache-{device}-{int(trim)}"
                for start in ("first", "restart"):
                    r = _serve(repo, cache, tmp, device, trim, tmp / f"{device}-{int(trim)}-{start}.log")
                    r.update(device=device, heap_trim=trim, start=start)
                    print(json.dumps(r), flush=True)
                    res["runs"].append(r)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
