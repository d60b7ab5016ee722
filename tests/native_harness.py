"""Building and running the C test harnesses of native/ (test_conv, test_datadep, test_ops_native_hot, test_pool,
test_quant): one way to compile a harness with the native sources it tests, for the host, the host with
sanitizers, or aarch64 under qemu, and to check what it printed.

The native sources are compiled one object per file, on every core at once, into a cache keyed by the compiler's
version, the flags and the bytes of the file and of every native header (``INFERD_HARNESS_CACHE``, default
``~/.cache/inferd/harness-objects``): harnesses built with the same compiler and flags share the objects, and a
run after one that changed nothing in native/ compiles only the harness. Compiling every file in one cc call, one
after another, took 66 s of the suite's time per harness build on the 2-core machine (dwconv.c then 33 s of it,
15 s since its variants are functions of their own)."""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest

NATIVE_DIR = Path(__file__).resolve().parent.parent / "native"
#: the aarch64 cross build, run under qemu: compiler, its flags, the runner
AARCH64_CC, AARCH64_FLAGS, QEMU = "aarch64-linux-gnu-gcc", ["-static"], ["qemu-aarch64"]
needs_aarch64 = pytest.mark.skipif(shutil.which(AARCH64_CC) is None or shutil.which(QEMU[0]) is None,
                                   reason=f"needs {AARCH64_CC} and {QEMU[0]}")
SANITIZERS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
#: the optimisation of the harnesses that build every native file (the package builds with -O3 too), shared so
#: that they share the objects
FULL_OPT = ("-O3", "-fwrapv", "-ffp-contract=fast")
OBJECT_CACHE = Path(os.environ.get("INFERD_HARNESS_CACHE", Path.home() / ".cache" / "inferd" / "harness-objects"))


@functools.lru_cache(maxsize=None)
def _compiler_id(cc: str) -> bytes:
    # not ``-v``: it prints the names of its temporary files, different at every call
    out = [subprocess.run([cc, flag], capture_output=True, timeout=60).stdout for flag in ("--version", "-dumpmachine")]
    return (shutil.which(cc) or cc).encode() + b"\0" + b"\0".join(out)


def _compile(cc: str, args: Sequence[str], source: Path, headers: bytes, timeout: int) -> Path:
    """``source`` compiled to an object (from the cache when there); ``headers``: the digest of native/'s headers."""
    h = hashlib.sha256(_compiler_id(cc))
    for part in (*args, source.name):
        h.update(part.encode() + b"\0")
    h.update(source.read_bytes())
    h.update(headers)
    obj = OBJECT_CACHE / f"{source.stem}-{h.hexdigest()[:32]}.o"
    if obj.exists():
        return obj
    OBJECT_CACHE.mkdir(parents=True, exist_ok=True)
    tmp = obj.with_name(f"{obj.stem}.tmp{os.getpid()}-{threading.get_ident()}.o")
    try:
        subprocess.run([cc, *args, "-c", str(source), "-o", str(tmp)], check=True, capture_output=True,
                       timeout=timeout)
        os.replace(tmp, obj)  # atomic: a concurrent run or an interrupted compile never leaves half an object
    finally:
        tmp.unlink(missing_ok=True)
    return obj


@functools.lru_cache(maxsize=None)
def _build_script() -> Any:
    spec = importlib.util.spec_from_file_location("inferd_build_native", NATIVE_DIR / "build_native.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_and_run(source: Path, natives: Sequence[str] | None, cc: str, flags: Sequence[str], tmp: Path,
                  runner: Sequence[str], opt: Sequence[str] = ("-O2",), timeout: int = 300) -> str:
    """Compile ``source`` with ``natives`` (file names in native/; None: every one) by ``cc`` and run it through
    ``runner`` (e.g. qemu); the harness must exit 0 and print "ok (0 failures)". Returns what it printed."""
    exe = tmp / (source.stem + "_" + os.path.basename(cc))
    files = sorted(NATIVE_DIR.glob("*.c")) if natives is None else [NATIVE_DIR / f for f in natives]
    args = [*opt, "-std=gnu99", "-fno-math-errno", "-DINFERD_NO_CLONES", f"-I{NATIVE_DIR}", *flags]
    todo = [source, *_build_script().compile_order(files)]  # the longest compiles start at once
    headers = hashlib.sha256(b"".join(h.read_bytes() for h in sorted(NATIVE_DIR.glob("*.h")))).digest()
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        objs = dict(zip(todo, pool.map(lambda p: _compile(cc, args, p, headers, timeout), todo)))
    subprocess.run([cc, *opt, *flags, *(str(objs[p]) for p in [source, *files]), "-o", str(exe), "-lm", "-pthread"],
                   check=True, capture_output=True, timeout=timeout)
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
