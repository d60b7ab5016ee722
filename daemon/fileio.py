"""File helpers shared by the on-disk caches and formats."""
from __future__ import annotations

import errno
import hashlib
import math
import os
import struct
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .errors import WeightsStoreError


def atomic_write(path: Path, data: bytes, fsync: bool = False) -> None:
    """Write ``data`` to a temp file beside ``path`` and rename it into place, so a reader (another
    process, or this one after a crash) sees the old file or the new one, never half of one.
    ``fsync`` also makes the new content durable before the rename."""
    from . import faults

    faults.check("cache.write")
    # the pid in the name lets a later start tell a dead writer's leftover from a live one's file
    fd, tmp = tempfile.mkstemp(prefix=f"{path.name}.{os.getpid()}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# ---------------------------------------------------------------------------- framed files

#: the head of a small framed file (plan.bin, binds.bin): magic, format version, SHA-256 of the body after it
FRAME_HEAD = struct.Struct("<8sI32s")


class FrameError(ValueError):
    """A framed file's head that is missing, or not of this magic and format version (its message says which)."""


def framed(magic: bytes, version: int, body: bytes) -> bytes:
    """``body`` behind a head of ``magic``, ``version`` and its SHA-256."""
    return FRAME_HEAD.pack(magic, version, hashlib.sha256(body).digest()) + body


def frame_checksum(data: bytes, magic: bytes, version: int, what: str) -> bytes:
    """The SHA-256 a framed file's head records, from its first bytes ``data``; ``FrameError`` naming ``what``
    where the head is missing or of another magic or format version."""
    if len(data) < FRAME_HEAD.size:
        raise FrameError(f"missing or truncated {what} ({len(data)} bytes)")
    got, v, sha = FRAME_HEAD.unpack_from(data)
    if got != magic:
        raise FrameError(f"not an inferd {what} (magic {got!r}, expected {magic!r})")
    if v != version:
        raise FrameError(f"{what} format version {v}, this engine reads {version}")
    return sha


# ---------------------------------------------------------------------------- block reads
# Reading byte ranges of a file into memory the caller owns, bypassing the page cache where the request allows:
# the weights store and the streaming runtime (runtime/blockio.py) both read through ``readv``.

#: the block ``O_DIRECT`` aligns to (the largest logical block size in common use; 512-byte devices accept it)
BLOCK = 4096


#: where large aligned arrays come from first: the daemon's host pool (``runtime.hostpool.install`` sets it),
#: returning None when it cannot serve one
pool_alloc: Callable[[int], np.ndarray | None] | None = None


def aligned_bytes(nbytes: int, align: int) -> np.ndarray:
    """A uint8 array of ``nbytes`` whose data starts on an ``align`` boundary (numpy's own: 16 bytes); from the
    host pool where the process has one (its arrays start on a page, which every ``align`` in use divides)."""
    take = pool_alloc
    if take is not None:
        a = take(nbytes)
        if a is not None and a.ctypes.data % align == 0:
            return a
    raw = np.empty(nbytes + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + nbytes]


#: Alignment of transformed weights: a kernel's vector loads of a 64-byte vector stay within one cache line
VECTOR_ALIGN = 64


def empty_aligned(shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    """``np.empty`` whose data starts on a VECTOR_ALIGN boundary. numpy aligns to 16 bytes only, so a packed weight
    array started anywhere in a cache line and every zmm load of it split two (squeezenet1_1 2-3.5% slower on the
    Emerald Rapids VM, in one process alternating with aligned copies)."""
    dt = np.dtype(dtype)
    return aligned_bytes(math.prod(shape) * dt.itemsize, VECTOR_ALIGN).view(dt).reshape(shape)


def cache_aligned(a: Any) -> Any:
    """``a``, or a copy of it that starts on a VECTOR_ALIGN boundary as the weights store's reads do: a kernel's
    transform from raw weights returns small arrays (a bias cast or sliced from the raw one) that numpy started
    anywhere in a cache line. Anything that is not an ndarray, or too small to matter, is returned as it is."""
    if not isinstance(a, np.ndarray) or a.nbytes < VECTOR_ALIGN or a.ctypes.data % VECTOR_ALIGN == 0:
        return a
    out = empty_aligned(a.shape, a.dtype)
    np.copyto(out, a)
    return out


#: transparent huge pages: their size, and the smallest array worth backing with them
HUGE = 2 << 20


def advise_huge(mm: Any, start: int = 0, length: int = 0) -> bool:
    """Ask for transparent huge pages over ``length`` bytes (0: to the end) of the mapping ``mm`` from ``start``;
    False where the kernel or Python has no ``MADV_HUGEPAGE`` or refuses it (ordinary pages, nothing else)."""
    import mmap

    adv = getattr(mmap, "MADV_HUGEPAGE", None)
    if adv is None:
        return False
    try:
        mm.madvise(adv, start, length) if length else mm.madvise(adv, start)
    except (OSError, ValueError):
        return False
    return True


def huge_bytes(nbytes: int, align: int) -> np.ndarray:
    """``aligned_bytes`` for an arena that a kernel copy or a compute loop sweeps: its whole 2 MiB spans backed by
    transparent huge pages where the kernel allows them (``madvise`` mode included), its tail by ordinary pages,
    so that it holds no more memory than ``nbytes``. Why: on the 2-core VM (a PVM guest, whose page walks are
    shadowed by the host) a read from the page cache into 4 KiB pages ran at 4.7 GB/s and into huge pages at
    9 GB/s (16 MiB in 1 MiB reads: 3.54 against 1.86 ms), the streaming runtime's main cost inside a budget.
    Small arrays, and systems without THP, get ``aligned_bytes``."""
    import mmap

    if nbytes < HUGE or getattr(mmap, "MADV_HUGEPAGE", None) is None or pool_alloc is not None:
        return aligned_bytes(nbytes, align)
    try:
        mm = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError):
        return aligned_bytes(nbytes, align)
    raw = np.frombuffer(mm, np.uint8)  # holds the mapping: unmapped when the last view of it goes
    off = (-raw.ctypes.data) % HUGE
    advise_huge(mm, off, nbytes // HUGE * HUGE)
    return raw[off:off + nbytes]


def aligned_empty(nbytes: int) -> np.ndarray:
    """A uint8 array of ``nbytes`` rounded up to BLOCK whose data starts on a BLOCK boundary (O_DIRECT)."""
    return aligned_bytes((max(nbytes, 1) + BLOCK - 1) // BLOCK * BLOCK, BLOCK)


#: the bounce buffer's size for unaligned direct reads (memory held only during the call)
BOUNCE = 1 << 20


class ShortRead(WeightsStoreError):
    """The file ended before the bytes a read needed."""


def _aligned(offset: int, bufs: Sequence[memoryview]) -> bool:
    if offset % BLOCK:
        return False
    for b in bufs:
        if len(b) % BLOCK or np.frombuffer(b, np.uint8).ctypes.data % BLOCK:
            return False
    return True


def _rest(bufs: Sequence[memoryview], skip: int) -> list[memoryview]:
    """``bufs`` without their first ``skip`` bytes."""
    out: list[memoryview] = []
    for b in bufs:
        if skip >= len(b):
            skip -= len(b)
            continue
        out.append(b[skip:] if skip else b)
        skip = 0
    return out


def _preadv_full(fd: int, bufs: Sequence[memoryview], offset: int) -> int:
    """``preadv`` until every buffer is full or the file ends; the bytes read."""
    total = sum(len(b) for b in bufs)
    got = 0
    todo = list(bufs)
    while got < total:
        n = os.preadv(fd, todo, offset + got)
        if n <= 0:
            break
        got += n
        todo = _rest(bufs, got)
    return got


def _bounced(dfd: int, bufs: Sequence[memoryview], offset: int) -> int:
    """Direct reads of the blocks covering the request into an aligned bounce buffer, copied out."""
    total = sum(len(b) for b in bufs)
    bounce = aligned_empty(BOUNCE + BLOCK)
    got = 0
    todo = list(bufs)
    while got < total:
        pos = offset + got
        start = pos - pos % BLOCK
        want = min(total - got, BOUNCE)
        span = (pos + want - start + BLOCK - 1) // BLOCK * BLOCK
        n = _preadv_full(dfd, [memoryview(bounce[:span])], start)
        avail = max(0, min(n - (pos - start), want))
        if avail <= 0:
            break
        src = bounce[pos - start:pos - start + avail]
        k = 0
        while k < avail:  # copy into the buffers in order
            b = todo[0]
            m = min(len(b), avail - k)
            np.frombuffer(b, np.uint8)[:m] = src[k:k + m]
            k += m
            todo = _rest(todo, m)
        got += avail
        if avail < want:
            break
    return got


def readv(fd: int, dfd: int, offset: int, bufs: Sequence[memoryview], need: int | None = None,
          drop: bool = False) -> int:
    """Fill ``bufs`` in order from ``offset`` of the file open as ``fd`` (buffered) and ``dfd`` (``O_DIRECT``;
    -1: none). Returns the bytes read; ``ShortRead`` when fewer than ``need`` (default: all of them) came
    back. ``drop``: after a buffered read, drop the pages it cached (the bypass mode without ``O_DIRECT``)."""
    bufs = [memoryview(b).cast("B") for b in bufs]
    total = sum(len(b) for b in bufs)
    need = total if need is None else need
    got = -1
    if dfd >= 0 and total:
        try:
            got = _preadv_full(dfd, bufs, offset) if _aligned(offset, bufs) else _bounced(dfd, bufs, offset)
        except OSError as e:
            if e.errno != errno.EINVAL:  # EINVAL: the device wants larger blocks; read buffered below
                raise
            got = -1
    if got < 0:
        got = _preadv_full(fd, bufs, offset) if total else 0
        if drop and total:
            os.posix_fadvise(fd, offset, total, os.POSIX_FADV_DONTNEED)
    if got < need:
        raise ShortRead(f"short read: {need} bytes needed at offset {offset}, the file gave {got}")
    return got


