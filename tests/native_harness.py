"""Building and running the C test harnesses of native/ (test_conv, test_datadep, test_ops_native_hot): one way
to compile a harness with the native sources it tests, for the host, the host with sanitizers, or aarch64 under
qemu, and to check what it printed."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Sequence

import pytest

NATIVE_DIR = Path(__file__).resolve().parent.parent / "native"
#: the aarch64 cross build, run under qemu: compiler, its flags, the runner
AARCH64_CC, AARCH64_FLAGS, QEMU = "aarch64-linux-gnu-gcc", ["-static"], ["qemu-aarch64"]
needs_aarch64 = pytest.mark.skipif(shutil.which(AARCH64_CC) is None or shutil.which(QEMU[0]) is None,
                                   reason=f"needs {AARCH64_CC} and {QEMU[0]}")
SANITIZERS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]


def build_and_run(source: Path, natives: Sequence[str] | None, cc: str, flags: Sequence[str], tmp: Path,
                  runner: Sequence[str], opt: Sequence[str] = ("-O2",), timeout: int = 300) -> str:
    """Compile ``source`` with ``natives`` (file names in native/; None: every one) by ``cc`` and run it through
    ``runner`` (e.g. qemu); the harness must exit 0 and print "ok (0 failures)". Returns what it printed."""
    exe = tmp / (source.stem + "_" + os.path.basename(cc))
    files = sorted(NATIVE_DIR.glob("*.c")) if natives is None else [NATIVE_DIR / f for f in natives]
    subprocess.run([cc, *opt, "-std=gnu99", "-fno-math-errno", "-DINFERD_NO_CLONES", f"-I{NATIVE_DIR}", *flags,
                    str(source), *map(str, files), "-o", str(exe), "-lm", "-pthread"], check=True,
                   capture_output=True, timeout=timeout)
    out = subprocess.run([*runner, str(exe)], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0 and "ok (0 failures)" in out.stdout, (out.stdout[-2000:], out.stderr[-4000:])
    return out.stdout


def with_sanitizers(build: Callable[[list[str]], object]) -> None:
    """``build(flags)`` with AddressSanitizer and UBSan; where the compiler has no sanitizer runtime (the build
    fails), the plain build, which still checks the results."""
    try:
        build(SANITIZERS)
    except subprocess.CalledProcessError:
        build([])
