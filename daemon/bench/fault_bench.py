"""``inferd bench faults``: how long the daemon takes to come back from a device loss, and from a
restart with warm caches.

    inferd bench faults [--device vulkan|cpu] [--models tiny,squeezenet1_1] [--repeat 5] [--out DIR]

Device loss: the daemon runs with the test-only fault seam on (``INFERD_TESTING=1``,
``INFERD_FAULTS=backend.run:device_lost@...``), no CPU fallback, so requests wait for the device.
One client sends requests to the first model; every ``PERIOD``-th run fails with a lost device. The
figure per loss is the latency of the request that hit it (detect, recreate the Vulkan device,
reload every Vulkan model through the pipeline cache, run again) beside a normal request's, and
the daemon's own recovery time (``status.faults.last_recovery_s``).

Restart: SIGTERM, then a new daemon on the same (warm) cache dir: start-to-READY and
start-to-first-answer, as a systemd restart would see them.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import fmt, machine_info, write_results

PERIOD = 25  # runs between injected device losses


def _device_info(device: str) -> dict[str, Any]:
    if device != "vulkan":
        return {"device": device}
    try:
        from ..vulkan.device import get_device

        d = get_device()
        return {"device": "vulkan", "name": d.name, "type": d.device_type, "driver": str(d.driver_version)}
    except Exception as e:
        return {"device": "vulkan", "error": f"{type(e).__name__}: {e}"}


def _feeds(models: Path, name: str) -> dict[str, np.ndarray]:
    import inferd

    m = inferd.load(str(models / f"{name}.onnx"), device="cpu")
    rng = np.random.default_rng(0)
    out = {t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in m.inputs}
    m.close()
    return out


def run(device: str, names: list[str], repeat: int, out_dir: str) -> dict[str, Any]:
    import inferd.zoo
    from ..server.testing import DaemonProcess
    from inferd_client import Client

    tmp = Path(tempfile.mkdtemp(prefix="inferd-faultbench-"))
    models, cache_dir = tmp / "m", tmp / "c"
    inferd.zoo.write_zoo(models, names)
    env = dict(os.environ)
    for var in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "INVOCATION_ID", "JOURNAL_STREAM"):
        env.pop(var, None)
    env["INFERD_CACHE_DIR"] = str(cache_dir)
    ep = f"ipc://{tmp}/s.sock"
    first = names[0]
    feeds = _feeds(models, first)
    result: dict[str, Any] = {"machine": machine_info(), "device": _device_info(device), "models": names,
                              "repeat": repeat}
    try:
        # 1. cold start (fills the package, SPIR-V and pipeline caches)
        t0 = time.monotonic()
        with DaemonProcess(ep, models, "--cache-dir", str(cache_dir), env=env, device=device,
                           log_path=tmp / "cold.log") as d:
            result["cold_start_to_ready_s"] = round(time.monotonic() - t0, 3)
            with Client(ep, timeout=120) as c:
                st = c.status()
                result["devices"] = {n: m["device"] for n, m in st["models"].items()}
                for n in names:  # first runs (the cold loads' tails) before any timing
                    c.infer(n, _feeds(models, n))
        # 2. restart to READY with warm caches
        restarts = []
        for _ in range(repeat):
            t0 = time.monotonic()
            d = DaemonProcess(ep, models, "--cache-dir", str(cache_dir), env=env, device=device,
                              log_path=tmp / "warm.log").start(timeout=300)
            t_ready = time.monotonic() - t0
            with Client(ep, timeout=120) as c:
                c.infer(first, feeds)
                t_first = time.monotonic() - t0
            d.stop()
            restarts.append({"ready_s": round(t_ready, 3), "first_answer_s": round(t_first, 3)})
        result["restart_warm"] = restarts
        # 3. device loss under a request stream
        fenv = dict(env, INFERD_TESTING="1", INFERD_FAULTS=f"backend.run:device_lost@{PERIOD}/{PERIOD}*{repeat}")
        losses = []
        with DaemonProcess(ep, models, "--cache-dir", str(cache_dir), "--fallback", "none", env=fenv,
                           device=device, log_path=tmp / "faults.log").start(timeout=300) as d:
            with Client(ep, timeout=300) as c:
                lat = []
                seen = 0
                while seen < repeat:
                    t = time.monotonic()
                    c.infer(first, feeds)
                    lat.append(time.monotonic() - t)
                    rec = c.status()["faults"]
                    n = rec["counts"].get("recovered", 0)
                    if n > seen:
                        seen = n
                        events = [e for e in rec["recent"] if e["event"] == "recovered"]
                        losses.append({"request_s": round(lat[-1], 4), "daemon_recovery_s": rec["last_recovery_s"],
                                       "event": events[-1]["detail"] if events else ""})
                result["normal_request_ms"] = round(1e3 * float(np.median(lat)), 3)
        result["device_loss"] = losses
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    day = result["machine"]["date"][:10]
    dev = result["device"].get("name") or device
    md = [f"# Fault recovery ({day}, {result['machine']['host']}, {result['machine']['cpu']}, "
          f"{result['machine']['cores']} cores; device {dev})", "",
          f"Models: {', '.join(names)} on {device}; {repeat} repetitions. `inferd bench faults`.", "",
          f"Cold start to READY (empty caches): {fmt(result['cold_start_to_ready_s'], '.2f')} s", "",
          "| restart (warm caches) | to READY s | to first answer s |", "| --- | --- | --- |"]
    md += [f"| {i + 1} | {r['ready_s']:.2f} | {r['first_answer_s']:.2f} |" for i, r in enumerate(restarts)]
    md += ["", f"Device loss (every {PERIOD}th run of {first}; no CPU fallback, so the request waits; normal "
           f"request {fmt(result['normal_request_ms'], '.2f')} ms):", "",
           "| loss | request that hit it, s | daemon recovery s | |", "| --- | --- | --- | --- |"]
    md += [f"| {i + 1} | {r['request_s']:.3f} | {fmt(r['daemon_recovery_s'], '.3f')} | {r['event']} |"
           for i, r in enumerate(losses)]
    jp, mp = write_results(out_dir, f"faults_{device}_{(dev or '').split()[0].lower() or device}", result,
                           "\n".join(md) + "\n")
    print("\n".join(md))
    print(f"wrote {jp} and {mp}")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="inferd bench faults", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="vulkan", choices=["vulkan", "cpu"])
    p.add_argument("--models", default="tiny,squeezenet1_1")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", default="bench/results")
    a = p.parse_args(argv)
    run(a.device, [m for m in a.models.split(",") if m], max(1, a.repeat), a.out)
    return 0
