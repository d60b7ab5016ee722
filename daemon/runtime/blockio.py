"""Measuring how fast a file reads the way the streaming runtime reads it.

The reads themselves (``readv``: ``O_DIRECT`` where the request allows it, a bounce buffer for odd offsets and
lengths, buffered where the file system refuses; short reads continued, ``ShortRead`` when the file ends before
the bytes a caller needs) live in :mod:`inferd.fileio`, which the weights store reads through too.

``read_rate`` measures a file's bandwidth the way the streaming runtime reads it (``O_DIRECT``, ``depth``
reads of ``chunk`` bytes in flight), so that a bound computed from it and the runtime's own reads are
comparable.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from ..fileio import BLOCK, aligned_empty


def read_rate(path: str | os.PathLike, depth: int = 1, chunk: int = 4 << 20, limit: int = 0,
              window: int = 64 << 20) -> float:
    """Bytes/s of one pass over ``path`` (its first ``limit`` bytes; 0: all) bypassing the page cache
    (``O_DIRECT``, buffered where refused; the cached pages dropped first) with ``depth`` threads each reading
    the next ``chunk`` bytes: the streaming runtime's reads, ``depth`` of them in flight. The reads land at
    successive addresses of one large buffer already touched (``window`` bytes, reused in turn), as the
    runtime's land in its arena: the memory's backing changes the rate (numpy backs a large array with huge
    pages where the kernel allows it, and a direct read into physically contiguous memory goes to the device
    in fewer, larger requests than one into scattered 4 KiB pages)."""
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
