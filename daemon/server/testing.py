"""Test support: run a daemon in a subprocess, and fake models for deterministic timing tests.

``DaemonProcess`` starts ``inferd serve`` in a child process (always stopped by its context
manager), waits until it answers ``health`` with ready, and reads its RSS. The child serves with
:func:`testing_loader`: a file whose bytes start with ``FAKE_MAGIC`` is a :class:`FakeModel`
described by the JSON after the magic; every other file goes to the real ``inferd.load``.
Robot-code projects can use the same helper to test against a real daemon.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
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
    ``device``.
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
        self.memory_bytes = 1024
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


def testing_loader(path: str, device: str = "auto", batch: int = 1, cache_dir: str | None = None,
                   **dynamic: Any) -> Any:
    with open(path, "rb") as fh:
        head = fh.read(len(FAKE_MAGIC))
        if head == FAKE_MAGIC:
            name = Path(path).stem if Path(path).name != "model.onnx" else Path(path).parent.name
            return FakeModel(json.loads(fh.read().decode()), name)
    from .daemon import default_loader

    return default_loader(path, device=device, batch=batch, cache_dir=cache_dir, **dynamic)


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
