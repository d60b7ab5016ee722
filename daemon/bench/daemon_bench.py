"""Daemon overhead benchmark: round trip over ipc against a direct in-process ``run``.

    python -m inferd.bench.daemon_bench [--out bench/results] [--n 2000]

Measures, on the CPU device:

* the tiny zoo model (1x3x8x8 input) and a 1x3x224x224-input model (GlobalAveragePool, so the
  600 KB input transfer dominates): p50/p99 latency of ``model.run`` in-process and of
  ``Client.infer`` through the daemon; the difference of the p50s is the daemon's overhead
  (goal: <= 150 us tiny, <= 1 ms for the 224x224 input);
* throughput on the tiny model with 1 and with 8 client processes;
* CPU time per request of the client thread and of each daemon thread (less disturbed by a
  loaded machine than wall time), for both models and for ``health`` (no model).

Writes ``daemon_bench_<date>_<machine>.json`` and ``.md`` into ``out_dir``.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import machine_info, time_calls, write_json

GOALS_US = {"tiny": 150.0, "img224": 1000.0}

_THROUGHPUT_WORKER = r"""
import sys, time, os
import numpy as np
from inferd_client import Client
ep, model, shape, seconds, go = sys.argv[1], sys.argv[2], eval(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
x = np.random.default_rng(os.getpid()).standard_normal(shape).astype(np.float32)
with Client(ep, timeout=30) as c:
    c.infer(model, x)
    while not os.path.exists(go):
        time.sleep(0.001)
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        c.infer(model, x)
        n += 1
print(n)
"""


_ECHO_SERVER = r"""
import sys, zmq
ctx = zmq.Context()
r = ctx.socket(zmq.ROUTER)
r.bind(sys.argv[1])
reply = b"x" * int(sys.argv[2])
one = sys.argv[3] == "1"
while True:
    f = r.recv_multipart(copy=False)
    if f[1].bytes == b"quit":
        break
    r.send_multipart([f[0], reply] if one else [f[0], f[1], reply], copy=False)
"""


class EchoPeer:
    """A bare pyzmq ROUTER in a child process and a DEALER here: what any Python ZeroMQ server pays on this
    machine before doing any work, for the same message shapes. ``one_frame``: each way one frame of the
    message's bytes, as the client sends tensors small enough to travel inside the header
    (``protocol.INLINE_MAX_BYTES``); else a header frame and a payload frame. A context manager, so a bench can
    time it in rounds between its other measurements (a slow spell of a shared VM then hits both)."""

    def __init__(self, tmp: Path, in_bytes: int, out_bytes: int, one_frame: bool = False) -> None:
        import zmq

        ep = f"ipc://{tmp}/echo{in_bytes}.sock"
        self._srv = subprocess.Popen([sys.executable, "-c", _ECHO_SERVER, ep, str(out_bytes + 80 * one_frame),
                                      "1" if one_frame else "0"])
        self._ctx = zmq.Context()
        self._d = self._ctx.socket(zmq.DEALER)
        self._d.setsockopt(zmq.LINGER, 0)
        self._d.connect(ep)
        header = b"h" * 80
        payload = np.zeros(in_bytes, np.uint8)
        self._frames = [header + payload.tobytes()] if one_frame else [header, payload]
        try:
            self.once()
        except BaseException:
            self.close()
            raise

    def once(self) -> None:
        d = self._d
        d.send_multipart(self._frames, copy=False)
        if not d.poll(10000):
            raise TimeoutError("echo server did not answer")
        d.recv_multipart(copy=False)

    def time(self, n: int, warmup: int = 50) -> list[float]:
        return _time(self.once, n, warmup)

    def close(self) -> None:
        try:
            self._d.send(b"quit")
            self._srv.wait(10)
        except subprocess.TimeoutExpired:
            self._srv.kill()
            self._srv.wait(10)
        finally:
            self._d.close()
            self._ctx.term()

    def __enter__(self) -> "EchoPeer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _echo_floor(tmp: Path, in_bytes: int, out_bytes: int, n: int, one_frame: bool = False) -> dict[str, float]:
    """p50/p99 of ``n`` round trips through an :class:`EchoPeer`."""
    with EchoPeer(tmp, in_bytes, out_bytes, one_frame) as echo:
        return _pcts(echo.time(n))


def _thread_cpu_ns(pid: int) -> dict[str, int]:
    """CPU time (ns) of each thread of ``pid``, keyed "tid:name" (Linux schedstat; {} elsewhere)."""
    out: dict[str, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                comm = fh.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                out[f"{tid}:{comm}"] = int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


class _CpuMeter:
    """CPU per call on both sides, which a loaded machine disturbs far less than wall time: the
    calling thread (``time.thread_time``) and each daemon thread (its schedstat)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.calls = 0
        self.client_s = 0.0
        self.daemon_ns: dict[str, int] = {}

    def timed(self, fn: Any, n: int, warmup: int) -> list[float]:
        for _ in range(warmup):
            fn()
        d0, c0 = _thread_cpu_ns(self.pid), time.thread_time()
        samples = _time(fn, n, warmup=0)
        c1, d1 = time.thread_time(), _thread_cpu_ns(self.pid)
        self.calls += n
        self.client_s += c1 - c0
        for k, v in d1.items():
            self.daemon_ns[k] = self.daemon_ns.get(k, 0) + v - d0.get(k, 0)
        return samples

    def result(self) -> dict[str, Any]:
        n = max(1, self.calls)
        # ZeroMQ names its I/O threads ZMQbg/...; the serving (main) thread carries the process name.
        io = sum(v for k, v in self.daemon_ns.items() if "ZMQbg" in k)
        serving = max((v for k, v in self.daemon_ns.items() if "ZMQbg" not in k and k.split(":")[0] == str(self.pid)),
                      default=0)
        return {"client_thread_us": round(self.client_s / n * 1e6, 1),
                "daemon_serving_thread_us": round(serving / n / 1e3, 1),
                "daemon_zmq_io_us": round(io / n / 1e3, 1),
                "daemon_total_us": round(sum(self.daemon_ns.values()) / n / 1e3, 1)}


def _write_img224(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 224, 224])
    y = helper.make_tensor_value_info("mean", TensorProto.FLOAT, [1, 3])
    g = helper.make_graph([helper.make_node("GlobalAveragePool", ["image"], ["p"]),
                           helper.make_node("Flatten", ["p"], ["mean"], axis=1)], "img224", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def _pcts(samples_s: list[float]) -> dict[str, float]:
    a = np.asarray(samples_s) * 1e6
    return {"p50_us": round(float(np.percentile(a, 50)), 1), "p99_us": round(float(np.percentile(a, 99)), 1),
            "mean_us": round(float(a.mean()), 1), "n": int(a.size)}


def _time(fn: Any, n: int, warmup: int = 50) -> list[float]:
    return time_calls(fn, n, warmup)


def _machine() -> dict[str, Any]:
    return {**machine_info(), "system": f"{platform.system()} {platform.release()}",
            "load_avg_start": list(os.getloadavg())}


def _throughput(endpoint: str, model: str, shape: tuple[int, ...], clients: int, seconds: float, tmp: Path) -> float:
    go = tmp / f"go{clients}"
    procs = [subprocess.Popen([sys.executable, "-c", _THROUGHPUT_WORKER, endpoint, model, repr(shape), str(seconds),
                               str(go)], stdout=subprocess.PIPE, text=True) for _ in range(clients)]
    time.sleep(1.0 + 0.2 * clients)  # let every worker import and connect
    go.touch()
    total = 0
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 120)
        total += int(out.strip() or 0)
    return total / seconds


def run(out_dir: str | os.PathLike[str] = "bench/results", n: int = 2000, seconds: float = 3.0) -> dict[str, Any]:
    import inferd
    import inferd.zoo
    from inferd.server.testing import DaemonProcess
    from inferd_client import Client

    tmp = Path(tempfile.mkdtemp(prefix="ifdb", dir="/tmp"))
    try:
        models = tmp / "m"
        models.mkdir()
        inferd.zoo.write_zoo(models, ["tiny"])
        _write_img224(models / "img224.onnx")
        result: dict[str, Any] = {"machine": _machine(), "date": _dt.datetime.now().isoformat(timespec="seconds"),
                                  "device": "cpu", "n": n, "models": {}}
        rng = np.random.default_rng(0)
        with DaemonProcess(f"ipc://{tmp}/s.sock", models, log_path=tmp / "d.log") as daemon, \
                Client(daemon.endpoint, timeout=30) as c:
            for name in ("tiny", "img224"):
                m = inferd.load(str(models / f"{name}.onnx"), device="cpu")
                feeds = {t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in m.inputs}
                np.testing.assert_allclose(c.infer(name, feeds)[m.outputs[0].name], m.run(feeds)[m.outputs[0].name],
                                           rtol=1e-6)
                # interleave blocks so that machine noise hits both sides alike
                direct: list[float] = []
                served: list[float] = []
                cpu = _CpuMeter(daemon.pid)
                for _ in range(10):
                    direct += _time(lambda: m.run(feeds), n // 10, warmup=10)
                    served += cpu.timed(lambda: c.infer(name, feeds), n // 10, warmup=10)
                d, s = _pcts(direct), _pcts(served)
                overhead = round(s["p50_us"] - d["p50_us"], 1)
                in_bytes = sum(int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize for t in m.inputs)
                out_bytes = sum(int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize for t in m.outputs)
                floor = _echo_floor(tmp, in_bytes, out_bytes, n)
                result["models"][name] = {
                    "input_bytes": in_bytes, "direct": d, "daemon": s, "overhead_p50_us": overhead,
                    "zmq_echo_floor": floor, "inferd_above_floor_p50_us": round(overhead - floor["p50_us"], 1),
                    "goal_us": GOALS_US[name], "meets_goal": overhead <= GOALS_US[name],
                    "cpu_per_request_us": cpu.result(),
                }
                m.close()
            hcpu = _CpuMeter(daemon.pid)
            health = _pcts(hcpu.timed(lambda: c.health(), n, warmup=50))
            result["health"] = {"daemon": health, "cpu_per_request_us": hcpu.result()}
            tiny_shape = (1, 3, 8, 8)
            result["throughput_tiny_rps"] = {
                "1_client": round(_throughput(daemon.endpoint, "tiny", tiny_shape, 1, seconds, tmp), 1),
                "8_clients": round(_throughput(daemon.endpoint, "tiny", tiny_shape, 8, seconds, tmp), 1),
            }
            st = c.status()
            result["daemon_status"] = {k: {"compute_ms": v["compute_ms"], "queue_ms": v["queue_ms"], "ok": v["ok"]}
                                       for k, v in st["models"].items()}
        result["machine"]["load_avg_end"] = list(os.getloadavg())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _write(result, Path(out_dir))
    return result


def _write(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    host = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in result["machine"]["host"]) or "machine"
    stem = f"daemon_bench_{result['date'][:10]}_{host}"
    write_json(out, stem, result)
    mach = result["machine"]
    lines = [
        f"# inferd daemon overhead ({result['date']})",
        "",
        f"Machine: {mach['cpu']} ({mach['cores']} cores), {mach['system']}, Python {mach['python']}; "
        f"load average at start {mach['load_avg_start'][0]:.2f}, at end {mach['load_avg_end'][0]:.2f}. "
        f"Device: {result['device']}. {result['n']} timed calls per side, interleaved in blocks.",
        "",
        "| model | input | direct p50 / p99 (us) | daemon p50 / p99 (us) | overhead p50 (us) | goal (us) "
        "| bare pyzmq echo p50 (us) | inferd above echo (us) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in result["models"].items():
        lines.append(f"| {name} | {r['input_bytes']} B | {r['direct']['p50_us']} / {r['direct']['p99_us']} | "
                     f"{r['daemon']['p50_us']} / {r['daemon']['p99_us']} | {r['overhead_p50_us']} | "
                     f"{r['goal_us']:.0f} {'(met)' if r['meets_goal'] else '(missed)'} | "
                     f"{r['zmq_echo_floor']['p50_us']} | {r['inferd_above_floor_p50_us']} |")
    lines += ["", "overhead = daemon p50 - direct p50. The bare pyzmq echo (same message sizes, two processes, "
                  "no work) is the floor any Python ZeroMQ server pays here; on a loaded 2-core machine it is "
                  "dominated by thread wake-ups (client, two ZeroMQ I/O threads, server)."]
    rows = [(name, r["cpu_per_request_us"]) for name, r in result["models"].items() if "cpu_per_request_us" in r]
    if "health" in result:
        rows.append(("health (no model)", result["health"]["cpu_per_request_us"]))
    if rows:
        lines += ["", "CPU time per request (us), less disturbed by machine load than wall time; the serving "
                      "thread's includes the model run (inline for small CPU models):", "",
                  "| request | client thread | daemon serving thread | daemon ZeroMQ I/O | daemon total |",
                  "|---|---|---|---|---|"]
        lines += [f"| {name} | {c['client_thread_us']} | {c['daemon_serving_thread_us']} | {c['daemon_zmq_io_us']} "
                  f"| {c['daemon_total_us']} |" for name, c in rows]
        if "health" in result:
            lines += ["", f"health round trip p50 {result['health']['daemon']['p50_us']} us."]
    tp = result["throughput_tiny_rps"]
    lines += ["", f"Throughput, tiny model: {tp['1_client']} req/s with 1 client process, "
                  f"{tp['8_clients']} req/s with 8 client processes.", ""]
    (out / f"{stem}.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results")
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=3.0)
    a = p.parse_args(argv)
    r = run(a.out, n=a.n, seconds=a.seconds)
    print(json.dumps({k: v for k, v in r.items() if k != "daemon_status"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
