"""The machine code a cold load runs, made resident when the daemon starts rather than inside a cold load.

A shared library is mapped at import, but its pages come in from disk only when first executed. In a fresh
daemon (or after the page cache was emptied, which drops every cached page no process has mapped) the first
cold load of a model then takes major faults on its kernels' code: OpenBLAS's sgemm, inferd's own kernels,
numpy's loops. Each waits for the disk behind the weights the same load is reading: on the 2-core VM, 9-17
such faults per cold load, vit_tiny's first MatMul 0.6 ms warm and 25-60 ms cold (four faults in OpenBLAS, one
at a time behind 1.7 MB reads). A daemon that has run for a while has these pages mapped; one that has just
started should too.

``make_resident`` maps the executable pages of the libraries a load runs (inferd's extension and the small
ones on its path, numpy's loops, and whatever a caller adds), and runs numpy's BLAS once per path it takes
(OpenBLAS's text is 20 MB for every CPU it supports; the few pages this CPU uses are what matters). Mapped
clean file pages are what any long-running process holds: counted in RSS, shared, and reclaimable by the
kernel under pressure (a page taken comes back by a fault, as without this).
"""
from __future__ import annotations

import ctypes
import importlib
import logging
import mmap
import os
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

log = logging.getLogger("inferd.runtime.codepages")

#: Linux 5.14: fault a range in for reading (file pages: read from disk where not cached, then mapped)
MADV_POPULATE_READ = 22

#: extension modules whose code a cold load runs (numpy's ufunc loops under either numpy's layout)
LOAD_PATH_MODULES = ("inferd._native", "_cffi_backend", "xxhash._xxhash", "msgpack._cmsgpack",
                     "numpy._core._multiarray_umath", "numpy.core._multiarray_umath")


@dataclass(frozen=True)
class Residency:
    """What ``make_resident`` did: bytes of code mapped, from how many files, how, and in how long."""

    bytes: int
    files: int
    method: str  # "populate" (one madvise per mapping), "touch" (a read per page), or "none"
    seconds: float


def module_files(names: Iterable[str]) -> list[str]:
    """The shared-object files of the importable modules among ``names`` (the others are skipped)."""
    out: list[str] = []
    for name in names:
        try:
            f = getattr(importlib.import_module(name), "__file__", None)
        except Exception:  # not installed, or a pure-Python fallback: nothing to map
            continue
        if f and ".so" in os.path.basename(f):
            out.append(os.path.realpath(f))
    return out


def executable_mappings(files: Sequence[str], maps: str = "/proc/self/maps") -> list[tuple[int, int, str]]:
    """(start, end, path) of this process's executable mappings of ``files`` (real paths)."""
    want = {os.path.realpath(f) for f in files}
    out: list[tuple[int, int, str]] = []
    try:
        with open(maps) as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) < 6 or "x" not in parts[1]:
                    continue
                path = parts[5].strip()
                if path not in want:
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi, path))
    except OSError as exc:  # no procfs: nothing to do, a cold load faults its code in itself
        log.debug("cannot read %s: %s", maps, exc)
    return out


def _populate(lo: int, hi: int) -> bool:
    from .pagecache import _libc

    return _libc.madvise(lo, hi - lo, MADV_POPULATE_READ) == 0


def _touch(lo: int, hi: int) -> None:
    # a read of one byte per page maps it (readable: the mapping is r-x)
    for addr in range(lo, hi, mmap.PAGESIZE):
        ctypes.string_at(addr, 1)


def map_code(files: Sequence[str], *, populate: bool = True) -> tuple[int, int, str]:
    """Map every executable page of ``files`` in this process: (bytes, files, method). ``populate=False``
    takes the fallback (a read per page) that kernels before 5.14 get."""
    maps = executable_mappings(files)
    method = "none"
    total = 0
    for lo, hi, _ in maps:
        if populate and method != "touch" and _populate(lo, hi):
            method = "populate"
        else:
            _touch(lo, hi)
            method = "touch"
        total += hi - lo
    return total, len({p for _, _, p in maps}), method


#: (rows, K, N) products that take OpenBLAS's paths inferd's float32 kernels use: the few-rows loop of
#: ``ops.gemm`` (rows 1-3: gemv), the small-matrix path and the packed one, with B plain and transposed
_BLAS_SHAPES = ((1, 64, 48), (3, 64, 48), (8, 32, 32), (96, 192, 160))


def run_blas() -> None:
    """numpy's BLAS once per path inferd takes, so that its code for this CPU is mapped."""
    for m, k, n in _BLAS_SHAPES:
        a = np.ones((m, k), np.float32)
        for b in (np.ones((k, n), np.float32), np.ones((n, k), np.float32).T):
            if m <= 3:
                for i in range(m):
                    np.matmul(a[i], b)
            np.matmul(a, b)


def import_load_path() -> float:
    """Import the Python modules a CPU cold load (and its idle-time work after the answer) runs that ``import inferd``
    leaves to their first use (the page-cache probe a package's open asks, the profiler a refinement runs, the BLAS
    limiter): a few milliseconds off a daemon's first cold load. The Vulkan backend's are
    ``inferd.vulkan.import_load_path``, imported where the daemon opens its device. Returns the seconds it took."""
    t0 = time.perf_counter()
    from . import pagecache, profiler  # noqa: F401

    # every package's open checks it: the one /proc/cpuinfo read (0.3-0.6 ms on the 2-core VM) now, not in a load
    profiler.cpu_fingerprint()
    try:
        import threadpoolctl  # noqa: F401
    except ImportError:  # optional: the BLAS limit then comes from numpy's bundled OpenBLAS or not at all
        pass
    return time.perf_counter() - t0


def warm_start(rehearse: bool = False) -> None:
    """The daemon's start, in the background: the cold load's Python modules imported, its machine code mapped;
    ``rehearse``: then a cold load rehearsed on a small model (``inferd.runtime.rehearsal``)."""
    import_load_path()
    make_resident()
    if rehearse:
        from .rehearsal import rehearse as run

        took = run("cpu")
        if took is not None:
            log.debug("cold-load rehearsal: %s", took)


def make_resident(extra_files: Sequence[str] = (), *, blas: bool = True) -> Residency:
    """Map the code of a cold load's libraries (``LOAD_PATH_MODULES`` plus ``extra_files``) and run the BLAS
    paths once. Best effort: a failure is logged and leaves the first cold load to fault its code in."""
    t0 = time.perf_counter()
    nbytes = nfiles = 0
    method = "none"
    try:
        nbytes, nfiles, method = map_code(module_files(LOAD_PATH_MODULES) + [os.path.realpath(f) for f in extra_files])
        if blas:
            run_blas()
    except Exception as exc:  # only a speed-up
        log.debug("could not make the code resident: %s", exc)
    res = Residency(nbytes, nfiles, method, time.perf_counter() - t0)
    log.debug("code resident: %d KiB of %d files (%s) in %.1f ms", res.bytes >> 10, res.files, res.method,
              res.seconds * 1e3)
    return res
