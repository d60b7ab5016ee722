"""The OS page cache, for cold measurements: drop a file's cached pages, and ask how much of it is resident.

``drop_caches`` (root) empties the whole cache; otherwise ``posix_fadvise(DONTNEED)`` evicts one
file's clean pages. ``mincore`` on a mapping says which pages are resident, so a benchmark can check
that a "cold" run really found nothing cached.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

def _load_libc() -> ctypes.CDLL:
    # glibc's soname first: find_library runs ``ldconfig -p`` in a subprocess (2-20 ms), and this module is
    # imported on the way to a daemon's first cold load
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


_libc = _load_libc()
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_libc.mincore.restype = ctypes.c_int
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mmap.restype = ctypes.c_void_p
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.munmap.restype = ctypes.c_int
_MAP_FAILED = ctypes.c_void_p(-1).value
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int
#: Linux 5.14: fault pages in for writing without changing what they hold
MADV_POPULATE_WRITE = 23
_populate_ok: bool | None = None


def can_populate() -> bool:
    """Whether :func:`populate` works here (probed once on a scratch page)."""
    global _populate_ok
    if _populate_ok is None:
        probe = mmap.mmap(-1, mmap.PAGESIZE)
        try:
            addr = ctypes.addressof(ctypes.c_char.from_buffer(probe))
            _populate_ok = _libc.madvise(addr, mmap.PAGESIZE, MADV_POPULATE_WRITE) == 0
        except (OSError, ValueError, TypeError):
            _populate_ok = False
        finally:
            try:
                probe.close()
            except BufferError:
                pass
    return _populate_ok


def populate(a: np.ndarray) -> bool:
    """Fault in the pages of ``a`` (C-contiguous) for writing, leaving its bytes as they are: unlike
    writing zeros, safe while another thread already computes in the array, so the first run need not
    wait for it. GIL released (ctypes). False where the kernel lacks ``MADV_POPULATE_WRITE``."""
    if a.nbytes == 0 or not can_populate():
        return a.nbytes == 0
    page = mmap.PAGESIZE
    addr = a.__array_interface__["data"][0]
    start = -(-addr // page) * page  # the whole pages inside the array (the partial ends fault on use)
    end = (addr + a.nbytes) // page * page
    return end <= start or _libc.madvise(start, end - start, MADV_POPULATE_WRITE) == 0


#: faulting in goes in steps, each taking the process's address-space lock: other threads' allocations wait less
POPULATE_STEP = 8 << 20


def populate_steps(a: np.ndarray, progress: Callable[[int], None] | None = None,
                   stop: Callable[[], bool] | None = None) -> bool:
    """:func:`populate` over the uint8 array ``a``, POPULATE_STEP bytes at a time; ``progress`` gets the bytes done
    after each step. False where a step failed or ``stop()`` said so before one (the rest faults on use)."""
    for off in range(0, a.nbytes, POPULATE_STEP):
        if stop is not None and stop():
            return False
        part = a[off:off + POPULATE_STEP]
        if not populate(part):
            return False
        if progress is not None:
            progress(off + part.nbytes)
    return True


def drop_file(path: str | os.PathLike) -> None:
    """Evict ``path``'s clean cached pages (dirty ones are written first)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        try:
            os.fdatasync(fd)
        except OSError:
            pass
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def drop_all() -> bool:
    """Empty the whole page cache (root only). Returns whether it worked."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def drop(paths: Iterable[str | os.PathLike]) -> str:
    """Drop ``paths`` from the cache the strongest way allowed; returns the method used."""
    files = [p for p in _walk(paths)]
    if drop_all():
        return "drop_caches"
    for f in files:
        drop_file(f)
    return "fadvise"


def _walk(paths: Iterable[str | os.PathLike]) -> Iterable[Path]:
    for p in paths:
        p = Path(p)
        if p.is_dir():
            yield from (f for f in p.rglob("*") if f.is_file())
        elif p.is_file():
            yield p


def _resident_pages(p: Path, size: int, windows: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """(resident pages, pages looked at) of ``p`` over (page-aligned offset, bytes) ``windows``, by ``mincore``
    on one mapping of the file; (0, 0) when it cannot be mapped or asked."""
    page = mmap.PAGESIZE
    fd = os.open(p, os.O_RDONLY)
    try:
        from .. import native

        if native.has("inferd_resident_pages"):
            # one call without the GIL: counted here it was a ctypes round trip and a numpy count per window,
            # each return taking the GIL back from a cold load's main thread (native/mincore.c)
            ffi = native.ffi
            looked = ffi.new("long long*")
            got = native.lib.inferd_resident_pages(fd, size, ffi.new("long long[]", [w[0] for w in windows]),
                                                   ffi.new("long long[]", [w[1] for w in windows]), len(windows),
                                                   looked)
            return (int(got), int(looked[0])) if got >= 0 else (0, 0)
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            return 0, 0
        try:
            resident = total = 0
            for off, n in windows:
                vec = (ctypes.c_ubyte * ((n + page - 1) // page))()
                if _libc.mincore(addr + off, n, vec) != 0:
                    return 0, 0
                resident += int(np.count_nonzero(np.frombuffer(vec, np.uint8) & 1))
                total += len(vec)
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)
    return resident, total


def resident_bytes(path: str | os.PathLike) -> tuple[int, int]:
    """(resident bytes, file bytes) of ``path`` by ``mincore``."""
    p = Path(path)
    size = p.stat().st_size
    if size == 0:
        return 0, 0
    resident, _ = _resident_pages(p, size, [(0, size)])
    return min(resident * mmap.PAGESIZE, size), size


#: ``resident_fraction`` samples this many windows of this many bytes; a smaller file is counted page by page
SAMPLE_WINDOWS = 32
SAMPLE_WINDOW_BYTES = 1 << 16


def resident_fraction(path: str | os.PathLike) -> float:
    """Share of ``path`` in the page cache: counted page by page for a small file, else estimated from
    ``SAMPLE_WINDOWS`` evenly spaced windows. Why: a store's buffered-or-direct choice needs a rough share, on the
    way to a cold answer, and counting every page of resnet50's 100 MB store took 4 ms."""
    p = Path(path)
    size = p.stat().st_size
    if size <= 4 * SAMPLE_WINDOWS * SAMPLE_WINDOW_BYTES:
        r, s = resident_bytes(p)
        return r / s if s else 0.0
    page = mmap.PAGESIZE
    win = max(page, SAMPLE_WINDOW_BYTES // page * page)
    last = (size - win) // page * page
    resident, total = _resident_pages(
        p, size, [((last * i // (SAMPLE_WINDOWS - 1)) // page * page, win) for i in range(SAMPLE_WINDOWS)])
    return resident / total if total else 0.0


def resident_in(paths: Iterable[str | os.PathLike]) -> int:
    """Resident bytes over every file of ``paths`` (directories walked)."""
    return sum(resident_bytes(f)[0] for f in _walk(paths))
