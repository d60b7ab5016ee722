"""Reading byte ranges of a file into memory the caller owns, through the page cache or bypassing it.

``readv`` fills a list of buffers from one file offset: with ``O_DIRECT`` (a second descriptor opened with
it) when the request allows it, which needs the offset, every buffer's address and every buffer's length on
a block boundary; otherwise through an aligned bounce buffer read with ``O_DIRECT`` and copied out (odd offsets
and lengths); a file system or device that refuses ``O_DIRECT`` (``EINVAL``) is read buffered, its pages then
dropped. A read that returns fewer bytes than asked is continued; one that ends at the end of the file before
the bytes the caller needs raises ``ShortRead``, and an I/O error propagates: never a buffer silently left
half filled.

``read_rate`` measures a file's bandwidth the way the streaming runtime reads it (``O_DIRECT``, ``depth``
reads of ``chunk`` bytes in flight), so that a bound computed from it and the runtime's own reads are
comparable.
"""
from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import WeightsStoreError

#: the block ``O_DIRECT`` aligns to (the largest logical block size in common use; 512-byte devices accept it)
BLOCK = 4096
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
    from ..store import aligned_empty

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


def read_rate(path: str | os.PathLike, depth: int = 1, chunk: int = 4 << 20, limit: int = 0,
              window: int = 64 << 20) -> float:
    """Bytes/s of one pass over ``path`` (its first ``limit`` bytes; 0: all) bypassing the page cache
    (``O_DIRECT``, buffered where refused; the cached pages dropped first) with ``depth`` threads each reading
    the next ``chunk`` bytes: the streaming runtime's reads, ``depth`` of them in flight. The reads land at
    successive addresses of one large buffer already touched (``window`` bytes, reused in turn), as the
    runtime's land in its arena: the memory's backing changes the rate (numpy backs a large array with huge
    pages where the kernel allows it, and a direct read into physically contiguous memory goes to the device
    in fewer, larger requests than one into scattered 4 KiB pages)."""
    from ..store import aligned_empty
    from .pagecache import drop_file

    p = Path(path)
    drop_file(p)
    size = p.stat().st_size if not limit else min(limit, p.stat().st_size)
    slots = max(depth, min(window, size + chunk) // chunk)
    dst = aligned_empty(slots * chunk)
    dst.fill(0)  # touched: a reused arena's pages are present
    try:
        fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        fd = os.open(p, os.O_RDONLY)
    nxt = [0]
    done = [0]
    mu = threading.Lock()
    errs: list[BaseException] = []

    def worker() -> None:
        try:
            while True:
                with mu:
                    off = nxt[0]
                    nxt[0] += chunk
                if off >= size:
                    return
                slot = (off // chunk) % slots * chunk
                n = os.preadv(fd, [memoryview(dst[slot:slot + min(chunk, (size - off + BLOCK - 1) // BLOCK * BLOCK)])],
                              off)
                with mu:
                    done[0] += min(n, size - off)
                if n <= 0:
                    return
        except BaseException as e:  # reported by the caller
            errs.append(e)

    th = [threading.Thread(target=worker, name="inferd-read-rate", daemon=True) for _ in range(max(1, depth))]
    t = time.perf_counter()
    try:
        for x in th:
            x.start()
        for x in th:
            x.join()
    finally:
        os.close(fd)
    dt = time.perf_counter() - t
    if errs:
        raise errs[0]
    return done[0] / max(dt, 1e-9)


def disk_rate(path: str | os.PathLike, depth: int, chunk: int = 4 << 20) -> float:
    """The disk's rate for reading ``path``, the best of one sequential pass with one ``chunk`` read in flight
    and one with ``depth`` (the streaming runtime's loaders) in flight: a bound computed from it holds the
    runtime to the faster of the two ways it could read."""
    return max(sequential_read_rate(path, chunk), read_rate(path, depth, chunk))


def sequential_read_rate(path: str | os.PathLike, chunk: int = 4 << 20) -> float:
    """Bytes/s of one sequential pass over ``path`` with one ``chunk`` read in flight into one reused buffer,
    bypassing the page cache: the disk's queue-depth-1 rate."""
    return read_rate(path, 1, chunk, window=chunk)
