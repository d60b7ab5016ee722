"""Building and running the C test harnesses of native/ (test_conv, test_datadep, test_ops_native_hot): one way
to compile a harness with the native sources it tests, for the host, the host with sanitizers, or aarch64 under
qemu, and to check what it printed."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Sequence

NATIVE_DIR = Path(__file__).resolve().parent.parent / "native"


def build_and_run(source: Path, natives: Sequence[str] | None, cc: str, flags: Sequence[str], tmp: Path,
                  runner: Sequence[str], opt: Sequence[str] = ("-O2",), timeout: int = 300) -> None:
    """Compile ``source`` with ``natives`` (file names in native/; None: every one) by ``cc`` and run it through
    ``runner`` (e.g. qemu); the harness must exit 0 and print "ok (0 failures)"."""
    exe = tmp / (source.stem + "_" + os.path.basename(cc))
    files = sorted(NATIVE_DIR.glob("*.c")) if natives is None else [NATIVE_DIR / f for f in natives]
    subprocess.run([cc, *opt, "-std=gnu99", "-fno-math-errno", "-DINFERD_NO_CLONES", f"-I{NATIVE_DIR}", *flags,
                    str(source), *map(str, files), "-o", str(exe), "-lm", "-pthread"], check=True,
                   capture_output=True, timeout=timeout)
    out = subprocess.run([*runner, str(exe)], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0 and "ok (0 failures)" in out.stdout, (out.stdout[-2000:], out.stderr[-4000:])
