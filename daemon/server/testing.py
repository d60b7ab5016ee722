"""Test support: run a daemon in a subprocess, and fake models for deterministic timing tests.

``DaemonProcess`` starts ``inferd serve`` in a child process (always stopped by its context
manager), waits until it answers ``health`` with ready, and reads its RSS. The child serves with
:func:`testing_loader`: a file whose bytes start with ``FAKE_MAGIC`` is a :class:`FakeModel`
described by the JSON after the magic; every other file goes to the real ``inferd.load``.
Robot-code projects can use the same helper to test against a real daemon. :func:`flood_run`
measures one client's latency while another client process floods the daemon (the fair-share test
and ``inferd bench auth``).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferd_client import Client
from inferd_client.protocol import default_endpoint

FAKE_MAGIC = b"#inferd-fake\n"


class FakeModel:
    """Computes ``y = 2 * x + 1`` on its first input after sleeping.

    Spec keys: ``inputs`` [{name, shape, dtype}], ``delay_s`` (fixed sleep), ``sleep_from_input``
    (sleep ``x.flat[0]`` seconds instead), ``log`` (a file that gets ``x.flat[-1]`` appended per
    run, to check the order runs happened in), ``load_delay_s``, ``fail_load`` (message),
    ``device``, ``memory_bytes`` (what it reports holding; 1024 by default).
    """

    def __init__(self, spec: Mapping[str, Any], name: str) -> None:
        from inferd.ir import TensorInfo

        if spec.get("fail_load"):
            raise RuntimeError(str(spec["fail_load"]))
        time.sleep(float(spec.get("load_delay_s", 0.0)))
        self.name = name
        self.device = str(spec.get("device", "cpu"))
        ins = spec.get("inputs") or [{"name": "x", "shape": [1, 4], "dtype": "float32"}]
        self.inputs = [TensorInfo(i["name"], tuple(i["shape"]), np.dtype(i["dtype"])) for i in ins]
        first = self.inputs[0]
        self.outputs = [TensorInfo("y", first.shape, first.dtype)]
        self.delay = float(spec.get("delay_s", 0.0))
        self.sleep_from_input = bool(spec.get("sleep_from_input", False))
        self.log = spec.get("log")
        self.memory_bytes = int(spec.get("memory_bytes", 1024))
        self.runs = 0

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from inferd.errors import InputError

        for t in self.inputs:
            a = feeds.get(t.name)
            if a is None or a.shape != t.shape or a.dtype != t.dtype:
                raise InputError(f"{self.name}: input {t.name!r} expects {np.dtype(t.dtype).name}{list(t.shape)}")
        x = feeds[self.inputs[0].name]
        delay = float(x.flat[0]) if self.sleep_from_input else self.delay
        if delay > 0:
            time.sleep(delay)
        if self.log:
            with open(self.log, "a") as fh:
                fh.write(f"{float(x.flat[-1])!r}\n")
        self.runs += 1
        return {"y": x * 2 + 1}

    def close(self) -> None:
        pass


def write_fake_model(path: str | os.PathLike[str], **spec: Any) -> Path:
    p = Path(path)
    p.write_bytes(FAKE_MAGIC + json.dumps(spec).encode())
    return p


@contextlib.contextmanager
def fake_daemon(models: Mapping[str, Mapping[str, Any]], *args: str, prefix: str = "iffk",
                device: str = "cpu") -> Iterator["DaemonProcess"]:
    """A daemon serving fake models ({name: ``write_fake_model``'s spec}) on an ipc socket in a fresh folder under
    /tmp (an ipc path must be short), ``args`` added to its command line; the folder is removed after."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        (d / "m").mkdir()
        for name, spec in models.items():
            write_fake_model(d / "m" / f"{name}.onnx", **spec)
        with DaemonProcess(f"ipc://{d}/s.sock", d / "m", *args, log_path=d / "d.log", device=device) as proc:
            yield proc
    finally:
        shutil.rmtree(d, ignore_errors=True)


def write_two_io_model(path: str | os.PathLike[str]) -> Path:
    """A real ONNX model with two inputs and two outputs: sum = a + b, prod = Relu(a * b), all [2, 3]."""
    import onnx
    from onnx import TensorProto, helper

    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3])
    s = helper.make_tensor_value_info("sum", TensorProto.FLOAT, [2, 3])
    p = helper.make_tensor_value_info("prod", TensorProto.FLOAT, [2, 3])
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Mul", ["a", "b"], ["m"]),
                           helper.make_node("Relu", ["m"], ["prod"])], "two_io", [a, b], [s, p])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return Path(path)


def _fake_spec(path: str) -> dict[str, Any] | None:
    """A fake model's spec (the JSON after ``FAKE_MAGIC``), or None for any other file."""
    with open(path, "rb") as fh:
        if fh.read(len(FAKE_MAGIC)) != FAKE_MAGIC:
            return None
        return json.loads(fh.read().decode())


def testing_loader(path: str, device: str = "auto", batch: int = 1, cache_dir: str | None = None,
                   **dynamic: Any) -> Any:
    spec = _fake_spec(path)
    if spec is not None:
        name = Path(path).stem if Path(path).name != "model.onnx" else Path(path).parent.name
        return FakeModel(spec, name)
    from .daemon import default_loader

    return default_loader(path, device=device, batch=batch, cache_dir=cache_dir, **dynamic)


def testing_register(path: str, device: str = "auto", batch: int = 1, cache_dir: str | None = None,
                     **kw: Any) -> Any:
    """``testing_loader``'s ``register``: nothing for a fake model, ``inferd.register`` for the others."""
    if _fake_spec(path) is not None:
        from ..runtime.model import Registration

        return Registration(None, False, False, False, 0.0, "a fake model: nothing to prepare")
    from .daemon import default_register

    return default_register(path, device=device, batch=batch, cache_dir=cache_dir, **kw)


testing_loader.register = testing_register  # type: ignore[attr-defined]


def _child_main(argv: Sequence[str]) -> int:
    from . import serve_main

    return serve_main(list(argv), loader=testing_loader)


_CHILD = "import sys\nfrom inferd.server.testing import _child_main\nsys.exit(_child_main(sys.argv[1:]))\n"


def read_rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class DaemonProcess:
    """``inferd serve`` in a child process on ``endpoint``; use as a context manager."""

    def __init__(
        self,
        endpoint: str | None,
        models_dir: str | os.PathLike[str],
        *args: str,
        env: Mapping[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        device: str = "cpu",
    ) -> None:
        """``endpoint=None`` lets the daemon pick its default (computed here from ``env`` too)."""
        self.env = dict(os.environ if env is None else env)
        if env is None:
            # Inherited systemd variables would make the child talk to the real service manager.
            for var in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "INVOCATION_ID", "JOURNAL_STREAM"):
                self.env.pop(var, None)
            # the machine's own memory pressure would cap the budget of a test's daemon at random moments
            self.env.setdefault("INFERD_MEMORY_PRESSURE", "off")
        # a test's daemon holds no host pool unless the test asks (256 MiB faulted in per daemon started would
        # cost the suite seconds, and the RSS checks would read it)
        self.env.setdefault("INFERD_HOST_POOL", "0")
        # nor makes pipelines resident (the suite's Vulkan tests fill the shared cache directory's list: every
        # daemon started after them would open the device and create them)
        self.env.setdefault("INFERD_RESIDENT_PIPELINES", "0")
        # nor rehearses a cold load at its start (a child interpreter compiling a model, then a load: 1.5-3 s of
        # the suite's two cores per daemon started, beside the test's own requests); the daemon tests that keep
        # the start's rehearsal ask for it (INFERD_REHEARSE=true)
        self.env.setdefault("INFERD_REHEARSE", "false")
        self.endpoint = endpoint or default_endpoint(self.env)
        ep_args = ["--endpoint", endpoint] if endpoint else []
        self.argv = [*ep_args, "--models", str(models_dir), "--device", device, *args]
        self.log_path = Path(log_path) if log_path else Path(models_dir).parent / f"inferd-{os.getpid()}-{id(self):x}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, wait: bool = True, timeout: float = 60.0) -> DaemonProcess:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, *self.argv], env=self.env,
                                     stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if wait:
            self.wait_ready(timeout)
        return self

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        with Client(self.endpoint, timeout=1.0) as c:
            while time.monotonic() < end:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}")
                if c.is_ready(timeout=0.5):
                    return
                time.sleep(0.05)
        raise RuntimeError(f"daemon not ready within {timeout} s:\n{self.log_text()[-4000:]}")

    def rss(self) -> int:
        return read_rss(self.pid)

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, wait; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._close_log()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._close_log()

    def _close_log(self) -> None:
        log = getattr(self, "_log", None)
        if log is not None and not log.closed:
            log.close()

    def __enter__(self) -> DaemonProcess:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop(timeout=15.0)
        finally:
            self.kill()


# --------------------------------------------------------------------------- fair share under a flood
# Shared by the flood test and ``inferd bench auth``: a quiet client's latency alone and while
# another client process floods the same model.

_QUIET_CLIENT = r"""
import json, sys, time
import numpy as np
from inferd_client import Client
ep, model, shape, n = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
x = np.zeros(shape, np.float32)
lat = []
with Client(ep, timeout=60) as c:
    for _ in range(10):
        c.infer(model, x)
    for _ in range(n):
        t = time.perf_counter()
        c.infer(model, x)
        lat.append(time.perf_counter() - t)
        time.sleep(0.002)
print(json.dumps(lat))
"""

# ``n`` requests at once on one socket. mode "hints": then, like a client with that much work, a
# new request for each one served and each refused one again once its retry hint has passed.
# mode "burst": ignores the hints, sends the next n as soon as all n are answered. Until ``stop`` exists.
_FLOOD_CLIENT = r"""
import heapq, json, os, sys, time
import numpy as np
import zmq
from inferd_client import protocol as P
ep, model, shape, n, stop, mode = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 0)
s.setsockopt(zmq.SNDHWM, 0)
s.setsockopt(zmq.RCVHWM, 0)
s.connect(ep)
x = np.zeros(shape, np.float32)
stats = {"ok": 0, "unavailable": 0, "other": 0, "sent": 0, "retry_ms": [], "message": "", "mode": mode}
rid = 0
def send():
    global rid
    rid += 1
    stats["sent"] += 1
    s.send_multipart(P.encode_request(rid, "infer", model, tensors={"x": x}, timeout_ms=60000))
def receive(wait_ms):
    if not s.poll(wait_ms):
        return None
    r = P.decode_reply(s.recv_multipart())
    if r.ok:
        stats["ok"] += 1
    elif r.error_code == P.UNAVAILABLE and r.retry_after_ms is not None:
        stats["unavailable"] += 1
        stats["message"] = r.error_message
        if len(stats["retry_ms"]) < 5000:
            stats["retry_ms"].append(r.retry_after_ms)
    else:
        stats["other"] += 1
        stats["message"] = r.error_code + ": " + r.error_message
    return r
for _ in range(n):
    send()
print("flooding", flush=True)
later = []
outstanding = n
while not os.path.exists(stop):
    if mode == "burst":
        if receive(50) is not None:
            outstanding -= 1
        if outstanding == 0:
            for _ in range(n):
                send()
            outstanding = n
        continue
    now = time.monotonic()
    while later and later[0] <= now:
        heapq.heappop(later)
        send()
    r = receive(50 if not later else max(0, min(50, int((later[0] - now) * 1000))))
    if r is None:
        continue
    if r.ok:
        send()
    elif r.retry_after_ms is not None:
        heapq.heappush(later, time.monotonic() + r.retry_after_ms / 1e3)
print(json.dumps(stats))
"""


def quiet_latencies(endpoint: str, model: str, shape: Sequence[int], n: int) -> list[float]:
    """Round trips (s) of one client process sending one request at a time (2 ms apart)."""
    r = subprocess.run([sys.executable, "-c", _QUIET_CLIENT, endpoint, model, json.dumps(list(shape)), str(n)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"quiet client failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def flood_run(endpoint: str, model: str, shape: Sequence[int], stop_dir: str | os.PathLike[str], *,
              flood: int = 1000, n_quiet: int = 120, mode: str = "hints") -> dict[str, Any]:
    """The quiet client's latencies alone, then while another process floods ``model`` with ``flood``
    requests at once (``mode`` "hints" or "burst", see above): {"alone", "flooded", "flood": stats}."""
    alone = quiet_latencies(endpoint, model, shape, n_quiet)
    stop = Path(stop_dir) / f"stop-flood-{os.getpid()}"
    stop.unlink(missing_ok=True)
    flooder = subprocess.Popen([sys.executable, "-c", _FLOOD_CLIENT, endpoint, model, json.dumps(list(shape)),
                                str(flood), str(stop), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert flooder.stdout is not None
        if flooder.stdout.readline().strip() != "flooding":
            raise RuntimeError(f"flooder failed: {flooder.stderr.read() if flooder.stderr else ''}")
        with Client(endpoint) as c:  # the flood really is queued before the quiet client starts
            end = time.monotonic() + 10
            while c.status()["models"][model]["queued"] == 0:
                if time.monotonic() > end:
                    raise RuntimeError("the flood never reached the queue")
                time.sleep(0.001)
        flooded = quiet_latencies(endpoint, model, shape, n_quiet)
    finally:
        stop.touch()
        out, err = flooder.communicate(timeout=120)
        stop.unlink(missing_ok=True)
    if flooder.returncode != 0:
        raise RuntimeError(f"flooder failed: {err[-2000:]}")
    return {"alone": alone, "flooded": flooded, "flood": json.loads(out.strip().splitlines()[-1])}


def wait_until(pred: Any, timeout: float = 10.0) -> None:
    """Poll ``pred()`` every 20 ms until it holds; AssertionError after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached")
