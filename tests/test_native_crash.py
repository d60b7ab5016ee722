"""A fatal signal in the process reports the faulting thread's native frames (``native.install_crash_report``,
native/crash.c) and still runs the handler that was there: faulthandler's Python traceback, then the default
action (the process dies of the signal, its exit status says which). Whichever of the two was installed first."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from inferd import native

pytestmark = pytest.mark.skipif(not native.has("inferd_install_crash_report") or sys.platform != "linux",
                                reason="needs the native extension's crash report (Linux)")

_CRASH = "import ctypes; ctypes.string_at(0)"  # a read of address 0 inside C (ctypes' memmove)


@pytest.mark.parametrize("order", ["faulthandler_first", "report_first"])
def test_a_segfault_reports_native_frames_then_python_frames_and_dies_of_it(order: str) -> None:
    steps = ["import faulthandler", "from inferd import native"]
    install = "assert native.install_crash_report() and native.install_crash_report()"  # once; the second says so
    steps += ["faulthandler.enable()", install] if order == "faulthandler_first" else [install, "faulthandler.enable()"]
    r = subprocess.run([sys.executable, "-c", "; ".join([*steps, _CRASH])], capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGSEGV, (r.returncode, r.stderr[-2000:])
    err = r.stderr
    assert f"inferd: fatal signal {int(signal.SIGSEGV)} in thread " in err, err[-2000:]
    # installed last, the report runs first and sees the fault itself; installed first, it runs after faulthandler,
    # which re-raises the signal (then no faulting address is known)
    assert (" at address 0x0;" if order == "faulthandler_first" else "sent by kill or raise") in err, err[-2000:]
    lines = err.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("inferd: fatal signal"))
    assert any("(" in ln and "+0x" in ln for ln in lines[start + 1:start + 20]), err[-2000:]  # native frames
    assert "Fatal Python error: Segmentation fault" in err and "<string>" in err, err[-2000:]  # faulthandler's too


def test_without_the_report_a_segfault_shows_no_native_frames() -> None:
    """What the report adds: faulthandler alone prints no native frames."""
    code = "; ".join(["import faulthandler", "faulthandler.enable()", _CRASH])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGSEGV and "Fatal Python error" in r.stderr
    assert "inferd: fatal signal" not in r.stderr


def test_the_daemon_serves_when_started_without_a_stderr(tmp_path) -> None:
    """``inferd serve`` enables faulthandler and the crash report at its start; started with file descriptor 2 closed
    (``sys.stderr`` is None then, and faulthandler refuses) it still serves."""
    import os

    from inferd_client import Client

    sock = tmp_path / "s.sock"
    (tmp_path / "models").mkdir()
    cmd = [sys.executable, "-m", "inferd.cli", "serve", "--endpoint", f"ipc://{sock}", "--models",
           str(tmp_path / "models"), "--cache-dir", str(tmp_path / "cache")]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(2))
    try:
        assert Client(f"ipc://{sock}").health()["live"] is True
        assert p.poll() is None
    finally:
        p.terminate()
        p.wait(30)


def test_the_report_goes_to_the_descriptor_it_was_given(tmp_path) -> None:
    """The test suite's fd 2 is a capture file during each test, lost with a worker that dies: its conftest gives the
    report the descriptor pytest's faulthandler writes to. Here fd 2 is /dev/null, the report goes to a file."""
    out = tmp_path / "report.txt"
    code = "; ".join(["import os, faulthandler", "from inferd import native",
                      f"fd = os.open({str(out)!r}, os.O_WRONLY | os.O_CREAT)", "faulthandler.enable(file=fd)",
                      "assert native.install_crash_report(fd)", "null = os.open(os.devnull, os.O_WRONLY)",
                      "os.dup2(null, 2)", _CRASH])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGSEGV, (r.returncode, r.stderr[-2000:])
    text = out.read_text(errors="replace")
    assert f"inferd: fatal signal {int(signal.SIGSEGV)} in thread " in text and "+0x" in text, text[-2000:]
    assert "Fatal Python error: Segmentation fault" in text, text[-2000:]
    assert "inferd: fatal signal" not in r.stderr
