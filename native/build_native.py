"""cffi build script for inferd's native kernels (compiled by the package build; see setup.py)."""
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

ffibuilder = FFI()
ffibuilder.cdef((HERE / "inferd_native.h").read_text())
ffibuilder.set_source(
    "inferd._native",
    '#include "inferd_native.h"',
    sources=[str(p.relative_to(HERE.parent)) for p in sorted(HERE.glob("*.c"))],
    include_dirs=[str(HERE.relative_to(HERE.parent))],
    # a header change rebuilds every source (distutils compares each object with its source and these only)
    depends=[str(p.relative_to(HERE.parent)) for p in sorted(HERE.glob("*.h"))],
    libraries=["pthread"],
    extra_compile_args=["-O3", "-fno-wrapv", "-std=c99", "-fno-math-errno", "-ffp-contract=fast"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
