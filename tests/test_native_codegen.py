"""The hand-dispatched kernels compile to the vector width of the ISA they are written for.

GCC lowers a generic vector wider than the target's registers piece by piece, and a 64-byte vector in a function
built for AVX2 went through the stack: the blocked convolutions' AVX2 tiles ran at 1/30 of their speed for months
with the same results, since every machine they were timed on had AVX-512 (resnet50 at 30x onnxruntime on an AVX2
Zen 3). -Wvector-operation-performance names every such operation; with AVX2 as the baseline ISA (x86-64-v3) the
files that pick a kernel per ISA at run time must have none: their AVX2 and generic kernels then compile to ymm
registers, and only the AVX-512 ones use zmm."""
from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

NATIVE_DIR = Path(__file__).resolve().parent.parent / "native"
#: the files with per-ISA kernels written on generic vectors and chosen at run time (nchwc.c's tiles, gemm.c's
#: micro-kernels, conv.c's depthwise rows); the rest vectorise through target_clones
DISPATCHED = ("nchwc.c", "gemm.c", "conv.c")


def _warnings(cc: str, source: Path, flags: list[str], obj: Path) -> list[str]:
    # -O0: the warning comes from the lowering of generic vector operations, a pass every level runs; at -O0 it
    # listed exactly what -O3 did (gemm.c built for plain x86-64: the same 24 lines; a planted 16-float vector in an
    # AVX2 function, an 8-float one on aarch64: one each) in a sixth of the time (nchwc.c 6 s against 38 on the
    # 2-core VM, where these two tests took 55 and 30 s of the suite)
    out = subprocess.run([cc, "-O0", "-std=c99", "-fno-math-errno", "-ffp-contract=fast", *flags,
                          "-Wvector-operation-performance", f"-I{NATIVE_DIR}", "-c", str(source), "-o", str(obj)],
                         capture_output=True, text=True, timeout=300, check=True)
    return [line for line in out.stderr.splitlines() if "Wvector-operation-performance" in line]


def _x86_cc() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not subprocess.run([cc, "-dumpmachine"], capture_output=True, text=True).stdout.startswith(
            "x86_64"):
        pytest.skip("needs an x86-64 C compiler")
    if "gcc version" not in subprocess.run([cc, "-v"], capture_output=True, text=True).stderr:
        pytest.skip("the warning is GCC's")
    return cc


def test_dispatched_kernels_use_native_vector_widths_on_avx2(tmp_path: Path) -> None:
    cc = _x86_cc()
    with ThreadPoolExecutor(max_workers=len(DISPATCHED)) as pool:
        found = dict(zip(DISPATCHED, pool.map(
            lambda f: _warnings(cc, NATIVE_DIR / f, ["-march=x86-64-v3"], tmp_path / f"{f}.o"), DISPATCHED)))
    bad = {f: w[:3] for f, w in found.items() if w}
    assert not bad, f"vector operations GCC splits into pieces on AVX2: {bad}"


#: their aarch64 builds too (NEON: 4-float vectors), and the other files written on explicit generic vectors, of
#: the target's width there (dwconv.c's rows, gemm.c's GEMVs and column tail, rnn.c's recurrence, rows.c's max)
AARCH64_CLEAN = ("nchwc.c", "conv.c", "dwconv.c", "gemm.c", "rnn.c", "rows.c")


def test_dispatched_kernels_use_native_vector_widths_on_aarch64(tmp_path: Path) -> None:
    cc = "aarch64-linux-gnu-gcc"
    if shutil.which(cc) is None:
        pytest.skip(f"needs {cc}")
    with ThreadPoolExecutor(max_workers=len(AARCH64_CLEAN)) as pool:
        found = dict(zip(AARCH64_CLEAN, pool.map(
            lambda f: _warnings(cc, NATIVE_DIR / f, [], tmp_path / f"{f}.o"), AARCH64_CLEAN)))
    bad = {f: w[:3] for f, w in found.items() if w}
    assert not bad, f"vector operations GCC splits into pieces on aarch64: {bad}"


def test_the_check_sees_a_wide_vector_in_an_avx2_function(tmp_path: Path) -> None:
    # what went wrong before: a 16-float vector in a function built for AVX2
    cc = _x86_cc()
    src = tmp_path / "wide.c"
    src.write_text("typedef float v16 __attribute__((vector_size(64)));\n"
                   "__attribute__((target(\"avx2,fma\"))) void f(float* y, const float* x, float s) {\n"
                   "    v16 a, b; __builtin_memcpy(&a, x, 64); b = a * (s - (v16){0});\n"
                   "    __builtin_memcpy(y, &b, 64); }\n")
    assert _warnings(cc, src, ["-march=x86-64-v3"], tmp_path / "wide.o")
