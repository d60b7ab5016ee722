"""cffi build script for inferd's native kernels (compiled by the package build; see setup.py)."""
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

#: the sources that take longest to compile (seconds at -O3 with the target clones, Zen 3: dwconv.c 50-59, nchwc.c
#: 20, rnn.c 16, conv.c 12; the others 6 or less): a parallel build (setup.py, the tests' harness) starts them first
SLOW_FIRST = ("dwconv.c", "nchwc.c", "rnn.c", "conv.c")


def compile_order(paths: "list[Path]") -> "list[Path]":
    """``paths`` in the order a parallel build should start them: the slow ones, then the rest largest first."""
    return sorted(paths, key=lambda p: (SLOW_FIRST.index(p.name) if p.name in SLOW_FIRST else len(SLOW_FIRST),
                                        -p.stat().st_size))


ffibuilder = FFI()
ffibuilder.cdef((HERE / "inferd_native.h").read_text())
ffibuilder.set_source(
    "inferd._native",
    '#include "inferd_native.h"',
    sources=[str(p.relative_to(HERE.parent)) for p in compile_order(list(HERE.glob("*.c")))],
    include_dirs=[str(HERE.relative_to(HERE.parent))],
    # a header change rebuilds every source (distutils compares each object with its source and these only)
    depends=[str(p.relative_to(HERE.parent)) for p in sorted(HERE.glob("*.h"))],
    libraries=["pthread"],
    extra_compile_args=["-O3", "-fno-wrapv", "-std=c99", "-fno-math-errno", "-ffp-contract=fast"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
