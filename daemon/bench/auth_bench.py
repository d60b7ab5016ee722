"""What authentication and fair share cost: round trip over ipc, plain TCP and CURVE, and a quiet
client's latency while another floods.

    inferd bench auth [--out bench/results] [--n 1000] [--date YYYY-MM-DD]

* Round trip (``Client.infer``, CPU device) on the tiny zoo model (768 B in, 40 B out) and on a
  1x3x224x224 input (602 KB in, 12 B out), through one daemon's ipc socket, its plain loopback
  TCP endpoint and a second daemon's CURVE loopback TCP endpoint, in the same run, interleaved in
  blocks so that machine noise hits every transport alike. Also ``health`` (no tensors) and the
  time to connect (first request on a new client, which includes the CURVE handshake).
* Fair share: a quiet client's p50/p99 alone and while one client process sends 1,000 requests at
  once to the same model (a fake model sleeping 10 ms per run, so the two clients contend only
  for the daemon's scheduling, not for the cores), with the flooder following the retry hints and
  with a flooder that ignores them and re-sends 1,000 as soon as all are answered.

Writes ``<date>_auth.json`` and ``.md`` into ``--out``.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import machine_info
from .daemon_bench import _pcts, _time, _write_img224

FLOOD_RUN_S = 0.01
FLOOD_CAP = 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ms(lat: list[float]) -> dict[str, float]:
    a = np.asarray(lat) * 1e3
    return {"p50_ms": round(float(np.percentile(a, 50)), 2), "p99_ms": round(float(np.percentile(a, 99)), 2),
            "max_ms": round(float(a.max()), 2), "n": int(a.size)}


def _round_trips(tmp: Path, n: int) -> dict[str, Any]:
    import inferd.zoo
    from inferd.server import keys as K
    from inferd.server.testing import DaemonProcess
    from inferd_client import Client

    models = tmp / "m"
    models.mkdir()
    inferd.zoo.write_zoo(models, ["tiny"])
    _write_img224(models / "img224.onnx")
    kd, ck = tmp / "keys", tmp / "clientkeys"
    K.init(kd)
    key = K.client(kd, "bench", "infer", ck)
    p_plain, p_curve = _free_port(), _free_port()
    plain = DaemonProcess(f"ipc://{tmp}/a.sock", models, "--remote-endpoint", f"tcp://127.0.0.1:{p_plain}",
                          log_path=tmp / "a.log")
    curve = DaemonProcess(f"ipc://{tmp}/b.sock", models, "--remote-endpoint", f"tcp://127.0.0.1:{p_curve}",
                          "--curve", "--keys-dir", str(kd), log_path=tmp / "b.log")
    eps = {"ipc": (f"ipc://{tmp}/a.sock", {}), "tcp": (f"tcp://127.0.0.1:{p_plain}", {}),
           "tcp+curve": (f"tcp://127.0.0.1:{p_curve}", {"key": key, "server_key": kd / "server.key"})}
    out: dict[str, Any] = {"models": {}, "connect": {}}
    rng = np.random.default_rng(0)
    with plain, curve:
        clients = {t: Client(ep, timeout=30, **kw) for t, (ep, kw) in eps.items()}
        try:
            feeds = {"tiny": {"input": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)},
                     "img224": {"image": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}}
            for name, f in feeds.items():
                ref = clients["ipc"].infer(name, f)
                for t, c in clients.items():  # same answer on every transport (two daemons may profile
                    # different kernels, hence the tolerance)
                    got = c.infer(name, f)
                    for k in ref:
                        np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-6)
            work = {name: (lambda c, f=f, name=name: c.infer(name, f)) for name, f in feeds.items()}
            work["health"] = lambda c: c.health()
            samples: dict[str, dict[str, list[float]]] = {w: {t: [] for t in clients} for w in work}
            for _ in range(10):
                for w, fn in work.items():
                    for t, c in clients.items():
                        samples[w][t] += _time(lambda c=c, fn=fn: fn(c), max(1, n // 10), warmup=5)
            for w in work:
                in_bytes = sum(a.nbytes for a in feeds[w].values()) if w in feeds else 0
                out["models"][w] = {"input_bytes": in_bytes, **{t: _pcts(s) for t, s in samples[w].items()}}
                base = out["models"][w]["tcp"]["p50_us"]
                out["models"][w]["curve_minus_tcp_p50_us"] = round(out["models"][w]["tcp+curve"]["p50_us"] - base, 1)
                out["models"][w]["tcp_minus_ipc_p50_us"] = round(base - out["models"][w]["ipc"]["p50_us"], 1)
        finally:
            for c in clients.values():
                c.close()
        for t, (ep, kw) in eps.items():  # a new client's first request: connect + handshake + health
            times = []
            for _ in range(20):
                t0 = time.perf_counter()
                with Client(ep, timeout=30, **kw) as c:
                    c.health()
                times.append(time.perf_counter() - t0)
            out["connect"][t] = _pcts(times)
    return out


def _flood(tmp: Path, n_quiet: int) -> dict[str, Any]:
    from inferd.server.testing import DaemonProcess, flood_run, write_fake_model

    models = tmp / "fm"
    models.mkdir()
    write_fake_model(models / "work.onnx", inputs=[{"name": "x", "shape": [4], "dtype": "float32"}],
                     delay_s=FLOOD_RUN_S)
    out: dict[str, Any] = {"run_ms": FLOOD_RUN_S * 1e3, "max_inflight_per_client": FLOOD_CAP, "flood": 1000}
    with DaemonProcess(f"ipc://{tmp}/f.sock", models, "--max-inflight-per-client", str(FLOOD_CAP),
                       "--max-queue", "256", log_path=tmp / "f.log") as d:
        for mode in ("hints", "burst"):
            r = flood_run(d.endpoint, "work", [4], tmp, flood=1000, n_quiet=n_quiet, mode=mode)
            st = r["flood"]
            out[mode] = {"alone": _ms(r["alone"]), "flooded": _ms(r["flooded"]),
                         "p99_ratio": round(_ms(r["flooded"])["p99_ms"] / _ms(r["alone"])["p99_ms"], 2),
                         "flooder": {k: st[k] for k in ("sent", "ok", "unavailable", "other")},
                         "retry_hint_ms": {"min": round(min(st["retry_ms"]), 2), "max": round(max(st["retry_ms"]), 2)}
                         if st["retry_ms"] else None}
    return out


def run(out_dir: str, n: int, n_quiet: int, date: str | None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="ifdauth", dir="/tmp"))
    try:
        result: dict[str, Any] = {"machine": {**machine_info(), "load_avg_start": list(os.getloadavg())},
                                  "date": date or _dt.date.today().isoformat(), "n": n}
        result["round_trip"] = _round_trips(tmp, n)
        result["fair_share"] = _flood(tmp, n_quiet)
        result["machine"]["load_avg_end"] = list(os.getloadavg())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _write(result, Path(out_dir))
    return result


def _write(r: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{r['date']}_auth"
    (out / f"{stem}.json").write_text(json.dumps(r, indent=2) + "\n")
    m = r["machine"]
    rt = r["round_trip"]
    lines = [f"# inferd: what authentication and fair share cost ({r['date']})", "",
             f"Machine: {m['cpu']} ({m['cores']} cores, shared), Python {m['python']}; load average "
             f"{m['load_avg_start'][0]:.2f} at start, {m['load_avg_end'][0]:.2f} at end. CPU device. "
             f"{r['n']} calls per cell, interleaved in 10 blocks across transports.", "",
             "## Round trip (`Client.infer`), p50 / p99 in us", "",
             "| request | input | ipc | TCP (loopback) | TCP + CURVE | CURVE - TCP (p50) |", "|---|---|---|---|---|---|"]
    for w, c in rt["models"].items():
        lines.append(f"| {w} | {c['input_bytes']} B | {c['ipc']['p50_us']} / {c['ipc']['p99_us']} | "
                     f"{c['tcp']['p50_us']} / {c['tcp']['p99_us']} | {c['tcp+curve']['p50_us']} / "
                     f"{c['tcp+curve']['p99_us']} | {c['curve_minus_tcp_p50_us']:+} |")
    lines += ["", "New client, first `health` (connect + handshake), p50 in us: " + ", ".join(
        f"{t} {v['p50_us']}" for t, v in rt["connect"].items()) + ".", "",
        "## Fair share: a quiet client while another floods", "",
        f"Model: sleeps {r['fair_share']['run_ms']:.0f} ms per run; max_inflight_per_client "
        f"{r['fair_share']['max_inflight_per_client']}; the flooder sends 1,000 requests at once. The quiet client "
        "sends one request at a time.", "",
        "| flooder | quiet alone p50 / p99 (ms) | quiet during flood p50 / p99 (ms) | p99 ratio | flooder sent / served / refused | retry hints (ms) |",
        "|---|---|---|---|---|---|"]
    for mode, label in (("hints", "follows the retry hints"), ("burst", "ignores them: 1,000 again once answered")):
        f = r["fair_share"][mode]
        h = f["retry_hint_ms"]
        lines.append(f"| {label} | {f['alone']['p50_ms']} / {f['alone']['p99_ms']} | {f['flooded']['p50_ms']} / "
                     f"{f['flooded']['p99_ms']} | {f['p99_ratio']} | {f['flooder']['sent']} / {f['flooder']['ok']} / "
                     f"{f['flooder']['unavailable']} | {h['min']} .. {h['max']} |" if h else "| - |")
    lines.append("")
    (out / f"{stem}.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="inferd bench auth", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results")
    p.add_argument("--n", type=int, default=1000, help="timed calls per request kind and transport")
    p.add_argument("--n-quiet", type=int, default=200, help="quiet client's requests per phase")
    p.add_argument("--date", default=None, help="date in the file names (default: today)")
    a = p.parse_args(argv)
    r = run(a.out, a.n, a.n_quiet, a.date)
    print(json.dumps({k: v for k, v in r.items() if k != "machine"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
