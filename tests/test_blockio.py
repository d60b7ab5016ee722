"""fileio.py (and runtime/blockio.py): byte ranges read into caller memory, through the page cache or with O_DIRECT, give the
file's bytes whatever the offset, length and buffer alignment; a read that the file cannot satisfy or an I/O
error is reported, never a half-filled buffer; the rate measurement reads the whole file."""
from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from inferd import fileio
from inferd.fileio import BLOCK, BOUNCE, ShortRead, readv
from inferd.runtime.blockio import read_rate
from inferd.store import aligned_empty


@pytest.fixture()
def data_file(tmp_path):
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, 3 * BOUNCE + 5 * BLOCK + 123, dtype=np.uint8).tobytes()
    p = tmp_path / "blob.bin"
    p.write_bytes(data)
    fd = os.open(p, os.O_RDONLY)
    try:
        dfd = os.open(p, os.O_RDONLY | os.O_DIRECT)
    except OSError:  # a file system without O_DIRECT: the buffered path is what runs there
        dfd = -1
    yield p, data, fd, dfd
    os.close(fd)
    if dfd >= 0:
        os.close(dfd)


CASES = [(0, BLOCK), (0, 1), (1, 1), (BLOCK - 1, 2), (123, 4567), (BLOCK, 3 * BLOCK), (5000, BOUNCE + 3),
         (BLOCK * 3 + 17, 2 * BOUNCE + BLOCK + 1)]


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("offset,length", CASES)
def test_odd_offsets_lengths_and_buffers_give_the_files_bytes(data_file, direct, offset, length):
    _p, data, fd, dfd = data_file
    want = data[offset:offset + length]
    # an unaligned destination, and the same range split over three buffers of odd sizes
    out = np.zeros(length + 1, np.uint8)[1:]
    assert readv(fd, dfd if direct else -1, offset, [memoryview(out)]) == length
    assert out.tobytes() == want
    cut = [length // 3, length // 3 + 1]
    parts = [np.zeros(n, np.uint8) for n in (cut[0], cut[1] - cut[0], length - cut[1])]
    readv(fd, dfd if direct else -1, offset, [memoryview(b) for b in parts])
    assert b"".join(b.tobytes() for b in parts) == want


def test_aligned_request_reads_in_place_with_o_direct(data_file, monkeypatch):
    _p, data, fd, dfd = data_file
    if dfd < 0:
        pytest.skip("no O_DIRECT on this file system")
    calls = []
    orig = fileio._bounced
    monkeypatch.setattr(fileio, "_bounced", lambda *a: calls.append(a) or orig(*a))
    buf = aligned_empty(2 * BLOCK)
    assert readv(fd, dfd, BLOCK, [memoryview(buf[:BLOCK]), memoryview(buf[BLOCK:])]) == 2 * BLOCK
    assert buf.tobytes() == data[BLOCK:3 * BLOCK]
    assert not calls  # no bounce buffer: straight into the caller's memory
    readv(fd, dfd, 1, [memoryview(buf[:BLOCK])])
    assert calls  # an odd offset goes through it


@pytest.mark.parametrize("direct", [True, False])
def test_reading_past_the_end_is_a_short_read(data_file, direct):
    _p, data, fd, dfd = data_file
    size = len(data)
    out = aligned_empty(2 * BLOCK)
    start = size - size % BLOCK  # the last, partial block
    with pytest.raises(ShortRead, match="short read"):
        readv(fd, dfd if direct else -1, start, [memoryview(out[:2 * BLOCK])])
    # what the caller needs is there: the padding after the end may stay unread
    got = readv(fd, dfd if direct else -1, start, [memoryview(out[:BLOCK])], need=size - start)
    assert got == size - start and out[:got].tobytes() == data[start:]
    with pytest.raises(ShortRead):
        readv(fd, dfd if direct else -1, size + BLOCK, [memoryview(out[:BLOCK])], need=1)


def test_an_io_error_propagates(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)  # a directory: read() fails with EISDIR
    try:
        with pytest.raises(OSError) as ei:
            readv(fd, -1, 0, [memoryview(np.zeros(10, np.uint8))])
        assert ei.value.errno == errno.EISDIR
    finally:
        os.close(fd)


def test_a_refused_direct_read_falls_back_to_buffered_and_drops(data_file, monkeypatch):
    _p, data, fd, dfd = data_file
    if dfd < 0:
        pytest.skip("no O_DIRECT on this file system")
    real = os.preadv
    dropped = []

    def preadv(f, bufs, off):  # noqa: ANN001
        if f == dfd:
            raise OSError(errno.EINVAL, "device wants larger blocks")
        return real(f, bufs, off)

    real_fadvise = os.posix_fadvise
    monkeypatch.setattr(os, "preadv", preadv)
    monkeypatch.setattr(os, "posix_fadvise", lambda f, o, n, a: dropped.append((o, n, a)) or real_fadvise(f, o, n, a))
    out = aligned_empty(BLOCK)
    readv(fd, dfd, BLOCK, [memoryview(out)], drop=True)
    assert out.tobytes() == data[BLOCK:2 * BLOCK]
    assert dropped == [(BLOCK, BLOCK, os.POSIX_FADV_DONTNEED)]


@pytest.mark.parametrize("depth,chunk", [(1, 1 << 20), (3, 256 << 10)])
def test_read_rate_reads_the_whole_file(data_file, monkeypatch, depth, chunk):
    p, data, _fd, _dfd = data_file
    seen = []
    real = os.preadv

    def preadv(f, bufs, off):  # noqa: ANN001
        n = real(f, bufs, off)
        seen.append((off, n))
        return n

    monkeypatch.setattr(os, "preadv", preadv)
    assert read_rate(p, depth, chunk, window=2 * chunk) > 0
    covered = sorted(seen)
    assert covered[0][0] == 0 and sum(min(n, len(data) - o) for o, n in covered) == len(data)


def _thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "none"
    return text.split("[")[1].split("]")[0] if "[" in text else "none"


def _vma(addr: int) -> dict[str, int]:
    """The smaps fields of the mapping holding ``addr``."""
    got: dict[str, int] = {}
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head.endswith(":") and line.split()[1].isdigit():
            got[head[:-1]] = int(line.split()[1])
    return got


def test_huge_bytes_is_an_aligned_arena_in_huge_pages_without_growing(tmp_path):
    """``huge_bytes``: exactly ``nbytes``, aligned, a direct read lands in it; its whole 2 MiB spans may take huge
    pages where the kernel has THP in ``madvise`` mode and its tail may not (the process holds no more than it asked
    for); a small one is an ordinary array."""
    small = fileio.huge_bytes(100_000, BLOCK)
    assert small.nbytes == 100_000 and small.ctypes.data % BLOCK == 0
    n = 2 * fileio.HUGE + 3 * BLOCK
    a = fileio.huge_bytes(n, BLOCK)
    assert a.nbytes == n and a.ctypes.data % fileio.HUGE == 0 and a.flags.writeable
    data = np.random.default_rng(1).integers(0, 256, n, np.uint8)
    path = tmp_path / "blob"
    path.write_bytes(data.tobytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        assert fileio.readv(fd, -1, 0, [memoryview(a)]) == n
    finally:
        os.close(fd)
    assert np.array_equal(a, data)
    if _thp_mode() == "madvise":
        head, tail = _vma(a.ctypes.data), _vma(a.ctypes.data + n - 1)
        assert head.get("THPeligible") == 1, head
        assert tail.get("THPeligible") == 0, tail
        assert head.get("AnonHugePages", 0) << 10 <= n // fileio.HUGE * fileio.HUGE
