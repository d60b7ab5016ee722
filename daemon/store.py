"""The weights store: the on-disk format of a compiled model's tensors.

Layout::

    [0, 4096)   header block: struct HEADER (magic, format version, index offset/size, index sha256)
    blobs       each aligned to 4096 bytes, so it can be read straight into arena memory with
                pread (or O_DIRECT, whose buffers and offsets must be block aligned)
    index       msgpack: model sha256, engine version, device fingerprint, entries

Each entry: layer ("" for graph-level raw constants), tensor, kernel ("" for raw), variant
("raw" | "transformed"), dtype, shape, offset, size, checksum (XXH3-64 of the blob: ~25 GB/s and
GIL-free, where zlib's CRC32 ran at ~4 GB/s and took a core from the first run while loaders read).
Raw and transformed variants of the same layer can live side by side. Any inconsistency raises
``WeightsStoreError``: a bad store is never silently read as wrong numbers.

Reads can bypass the page cache (``O_DIRECT``: the disk's DMA lands in the destination, no copy
through the cache, a fraction of the CPU time); blobs are block aligned for it.
"""
from __future__ import annotations

import hashlib
import logging
import os
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import msgpack
import numpy as np
import xxhash

from . import faults
from .fileio import ShortRead, aligned_empty, empty_aligned, readv
from .errors import WeightsStoreError
from .ir import dtype_from_tag, dtype_tag

log = logging.getLogger("inferd.store")

MAGIC = b"INFDWTS\x00"
FORMAT_VERSION = 2
ALIGN = 4096
_HEADER = struct.Struct("<8sIIQQ32s")  # magic, version, reserved, index offset, index size, index sha256


@dataclass(frozen=True)
class Entry:
    layer: str
    tensor: str
    kernel: str
    variant: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    size: int
    checksum: int
    #: (layer, tensor, kernel, variant): made once (an open asks each entry's key several times: ~1,000 for
    #: shufflenetv2's, a tuple built per ask when this was a property)
    key: tuple[str, str, str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.layer, self.tensor, self.kernel, self.variant))


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def checksum(data: Any) -> int:
    """xxh3-64 (seed 0) of a buffer's bytes: the store's blob checksum. (The xxhash binding lets the GIL go while
    it sums a buffer of about 1 MB and more, xxhash 4.1: a loader verifying a large blob does not hold up the
    executor's Python.)"""
    return int(xxhash.xxh3_64_intdigest(data))


_XXH3: list[Any] = []


def xxh3_c() -> Any:
    """The xxhash module's C function ``XXH3_64bits`` as a cffi function pointer (``inferd_hash_fn``), the store's
    checksum computed by the same code as ``xxhash.xxh3_64_intdigest``: for the native streaming loaders. None where
    the native extension or the export is missing, or the probe's sum differs."""
    if not _XXH3:
        fn = None
        try:
            import ctypes

            import xxhash._xxhash as xx

            from . import native

            if native.ffi is not None:
                addr = ctypes.cast(ctypes.CDLL(xx.__file__).XXH3_64bits, ctypes.c_void_p).value
                cand = native.ffi.cast("inferd_hash_fn", addr)
                probe = b"inferd stream checksum probe"
                if cand(native.ffi.from_buffer(probe), len(probe)) == xxhash.xxh3_64_intdigest(probe):
                    fn = cand
        except (ImportError, OSError, AttributeError, TypeError):
            pass
        _XXH3.append(fn)
    return _XXH3[0]


#: a cold load's first streamed chunk at most (the first layers' weights, which the executor waits for)
FIRST_CHUNK = 512 << 10


def _file_ident(st: os.stat_result) -> tuple[int, int, int, int]:
    """Which file (and which version of it) a descriptor reads: a store replaced on disk is another one."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def file_version(st: os.stat_result) -> tuple[int, ...]:
    """Which file, and which version of it, a stat describes: a file replaced (plan.bin's atomic rewrite) or
    rewritten in place has another inode or change time (which no tool can set back). Its size is [2]."""
    return (*_file_ident(st), st.st_ctime_ns)


class FileMemo:
    """What an open read and verified from a file (a package's parsed plan.bin, a store's index), by path, while
    the file is the one it was read from (``file_version``): a daemon that loads a model again (after its memory
    budget, an unload or an idle timeout dropped it) skips the read, the checksum and the parsing. Least recently
    used first out; bounded in entries and in the files' bytes (a parse holds a few times its file's bytes: a
    board's memory outside every model's budget), and one file larger than a quarter of the byte bound is not
    kept. The bounds are passed at each ``put`` (module settings that a test or a daemon may change); an entry
    bound of 0 keeps nothing. What is kept is shared by every open that gets it: callers keep only what no open
    changes."""

    def __init__(self) -> None:
        self._d: dict[str, tuple[tuple[int, ...], Any, int]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str, version: tuple[int, ...]) -> Any:
        """The value kept for ``key`` at ``version`` (now the most recently used), else None."""
        with self._lock:
            hit = self._d.get(key)
            if hit is None or hit[0] != version:
                return None
            self._d[key] = self._d.pop(key)
            return hit[1]

    def holds(self, key: str, version: tuple[int, ...]) -> bool:
        with self._lock:
            hit = self._d.get(key)
        return hit is not None and hit[0] == version

    def drop(self, key: str) -> None:
        """Forget what is kept for ``key`` (a file that is gone)."""
        with self._lock:
            old = self._d.pop(key, None)
            if old is not None:
                self._bytes -= old[2]

    @staticmethod
    def admits(nbytes: int, max_entries: int, max_bytes: int) -> bool:
        """Whether these bounds keep a value read from ``nbytes`` of a file (a caller may skip preparing one)."""
        return max_entries > 0 and nbytes <= max_bytes // 4

    def put(self, key: str, version: tuple[int, ...], value: Any, nbytes: int, max_entries: int,
            max_bytes: int) -> bool:
        """Keep ``value`` (read from ``nbytes`` of the file) unless the bounds refuse it; whether it was kept."""
        if not self.admits(nbytes, max_entries, max_bytes):
            return False
        with self._lock:
            old = self._d.pop(key, None)
            if old is not None:
                self._bytes -= old[2]
            self._d[key] = (version, value, nbytes)
            self._bytes += nbytes
            while self._d and (len(self._d) > max_entries or self._bytes > max_bytes):
                self._bytes -= self._d.pop(next(iter(self._d)))[2]
        return True

    def stats(self) -> tuple[int, int]:
        """(entries, bytes of the files they were read from)."""
        with self._lock:
            return len(self._d), self._bytes

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self._bytes = 0


class HeadRead:
    """The first blocks of a weights store (its header and ``FIRST_CHUNK`` of blobs), read on a worker as soon
    as a cold load opens the package. Why: a package is written in its plan's read order, so these are the
    first layers' weights; read after the plan is parsed and the store opened (4-18 ms into a cold load on the
    2-core VM), their first read kept the executor waiting another 3-5 ms of disk latency. Started at the
    open, the disk serves it while the plan is parsed. Only a speed-up: a read that fails, or a store that
    changed on disk meanwhile, leaves the stream to read those bytes itself.

    ``resident``: the share of the store in the page cache before this read (the store's buffered-or-direct
    choice, made here off the caller's thread)."""

    def __init__(self, path: str | os.PathLike, submit: Callable[[Callable[[], None]], Any],
                 size: int = ALIGN + FIRST_CHUNK) -> None:
        self.path = Path(path)
        self._size = size
        self.buf: np.ndarray | None = None
        self.ident: tuple[int, int, int, int] | None = None
        self.resident: float | None = None
        self._lock = threading.Lock()
        self._state = "queued"  # -> "reading" -> "done", or "dropped" when nobody waited for it to start
        self._done = threading.Event()
        submit(self._run)

    def _run(self) -> None:
        with self._lock:
            if self._state != "queued":
                return
            self._state = "reading"
        fd = dfd = -1
        try:
            from .runtime.pagecache import resident_fraction

            fd = os.open(self.path, os.O_RDONLY)
            st = os.fstat(fd)
            n = min(self._size, st.st_size)
            self.resident = resident_fraction(self.path)
            if self.resident < 0.5 and hasattr(os, "O_DIRECT"):
                try:
                    dfd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
                except OSError:
                    dfd = -1
            buf = aligned_empty(n)
            readv(fd, dfd, 0, [memoryview(buf)], need=n)
            self.buf, self.ident = buf[:n], _file_ident(st)
        except Exception as e:  # the stream reads these bytes itself
            log.debug("%s: reading its first blocks ahead failed: %s", self.path, e)
        finally:
            for d in (fd, dfd):
                if d >= 0:
                    os.close(d)
            with self._lock:
                self._state = "done"
            self._done.set()

    def reading(self, offset: int, n: int) -> bool:
        """Whether this read is under way (started, not done) and will hold bytes [offset, offset + n)."""
        with self._lock:
            return self._state == "reading" and offset + n <= self._size

    def span(self, ident: tuple[int, int, int, int], offset: int, n: int) -> np.ndarray | None:
        """Bytes [offset, offset + n) of the file ``ident`` if this read holds them (waiting for it if it is
        under way), else None. A read its worker has not started yet is dropped: the caller reads sooner."""
        if offset + n > self._size:
            return None  # not the head's bytes: no waiting for it
        with self._lock:
            if self._state == "queued":
                self._state = "dropped"
                self._done.set()
                return None
        self._done.wait()
        buf = self.buf
        if buf is None or self.ident != ident or offset + n > len(buf):
            return None
        return buf[offset:offset + n]


class StoreWriter:
    """Streams tensors to ``path`` (written to a temp file, renamed into place on close)."""

    def __init__(self, path: str | os.PathLike, model_sha256: str, engine_version: str,
                 fingerprint: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self._tmp = self.path.with_name(self.path.name + f".tmp{os.getpid()}")
        self._f = open(self._tmp, "wb")
        self._f.write(b"\0" * ALIGN)
        self._pos = ALIGN
        self._entries: list[Entry] = []
        self._keys: set[tuple[str, str, str, str]] = set()
        self.meta = {"model_sha256": model_sha256, "engine_version": engine_version,
                     "fingerprint": fingerprint or {}}

    def add(self, layer: str, tensor: str, array: np.ndarray, kernel: str = "", variant: str = "raw") -> Entry:
        if variant not in ("raw", "transformed"):
            raise ValueError(f"variant must be 'raw' or 'transformed', got {variant!r}")
        faults.check("cache.write")
        key = (layer, tensor, kernel, variant)
        if key in self._keys:
            raise ValueError(f"duplicate store entry {key}")
        a = np.ascontiguousarray(array).reshape(np.shape(array))  # ascontiguousarray makes a 0-d array 1-d
        data = a.tobytes()
        e = Entry(layer, tensor, kernel, variant, dtype_tag(a.dtype), tuple(int(d) for d in a.shape), self._pos,
                  len(data), checksum(data))
        self._f.write(data)
        pad = _align(len(data)) - len(data)
        self._f.write(b"\0" * pad)
        self._pos += len(data) + pad
        self._entries.append(e)
        self._keys.add(key)
        return e

    def close(self) -> Path:
        faults.check("cache.write")
        index = msgpack.packb({**self.meta, "entries": [
            [e.layer, e.tensor, e.kernel, e.variant, e.dtype, list(e.shape), e.offset, e.size, e.checksum]
            for e in self._entries]}, use_bin_type=True)
        self._f.write(index)
        self._f.seek(0)
        self._f.write(_HEADER.pack(MAGIC, FORMAT_VERSION, 0, self._pos, len(index), hashlib.sha256(index).digest()))
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self._tmp, self.path)
        return self.path

    def __enter__(self) -> "StoreWriter":
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._f.close()
            self._tmp.unlink(missing_ok=True)


#: store indexes read and verified at an open (``FileMemo``): a model loaded again opens its store without reading
#: the index again. Entries are frozen and the dicts are not changed after the open; each blob's checksum is still
#: verified on read. 0 turns it off.
INDEXES_MAX = 32
#: ... and at most this many index bytes in all (an entry's objects take a few times its bytes)
INDEXES_MAX_BYTES = 8 << 20
#: path -> (entries, entries by layer, meta)
_indexes = FileMemo()


def index_stats() -> dict[str, int]:
    """What ``_indexes`` holds: store indexes and their bytes on disk."""
    n, nbytes = _indexes.stats()
    return {"indexes": n, "index_bytes": nbytes}


def forget_index(path: str | os.PathLike) -> None:
    """Drop the index ``_indexes`` keeps of the store at ``path`` (a store that is removed)."""
    _indexes.drop(str(Path(path)))


def index_cached(path: str | os.PathLike) -> bool:
    """Whether the index of the store at ``path``, as it is on disk now, is in ``_indexes`` (its open reads none)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return _indexes.holds(str(Path(path)), file_version(st))


class WeightsStore:
    """Read side. Validates header, index checksum and file length at open; each blob's checksum on read.

    ``direct``: read blobs with ``O_DIRECT`` (True), through the page cache (False), or decide by
    whether the file is resident (None: direct when less than half of it is cached). ``head``: the store's
    first blocks, being read ahead (a cold load's), which reads of those bytes take from it."""

    def __init__(self, path: str | os.PathLike, direct: bool | None = False, head: HeadRead | None = None) -> None:
        self.path = Path(path)
        self._fd = self._dfd = -1
        self.head = head
        #: the cold window a package's opening entered (``runtime.window``): released by the cold load
        #: at its first answer, or here at close when the load never got that far
        self.window: Any = None
        try:
            self._fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise WeightsStoreError(f"cannot open weights store {str(self.path)!r}: {e}") from e
        try:
            self._open()
        except Exception:
            # -1 first: __del__ closes self._fd again, and by then the number may belong to another file
            fd, self._fd = self._fd, -1
            os.close(fd)
            raise
        if direct is None:
            from .runtime.pagecache import resident_fraction

            share = head.resident if head is not None else None  # (measured there before its own read)
            direct = (resident_fraction(self.path) if share is None else share) < 0.5
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self._dfd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
            except OSError:  # tmpfs and some FUSE file systems refuse it: buffered reads then
                self._dfd = -1

    @property
    def direct(self) -> bool:
        return self._dfd >= 0

    def _open(self) -> None:
        st = os.fstat(self._fd)
        size = st.st_size
        self._ident = _file_ident(st)
        version = file_version(st)
        key = str(self.path)
        hit = _indexes.get(key, version)
        if hit is not None:
            self.entries, self._by_layer, self.meta = hit
            return
        isize = self._read_index(size)
        _indexes.put(key, version, (self.entries, self._by_layer, self.meta), isize, INDEXES_MAX, INDEXES_MAX_BYTES)

    def _read_index(self, size: int) -> int:
        """Read and verify the index (``size``: the file's); returns the index's bytes."""
        head = os.pread(self._fd, _HEADER.size, 0)
        if len(head) < _HEADER.size:
            raise WeightsStoreError(f"{self.path}: truncated weights store ({size} bytes; expected a "
                                    f"{_HEADER.size}-byte header at least)")
        magic, version, _, ioff, isize, isha = _HEADER.unpack(head)
        if magic != MAGIC:
            raise WeightsStoreError(f"{self.path}: not an inferd weights store (magic {magic!r}, expected {MAGIC!r})")
        if version != FORMAT_VERSION:
            raise WeightsStoreError(f"{self.path}: weights store format version {version}, this engine reads "
                                    f"version {FORMAT_VERSION}")
        if ioff + isize > size:
            raise WeightsStoreError(f"{self.path}: truncated weights store: index at {ioff}+{isize} "
                                    f"but the file has {size} bytes")
        index = os.pread(self._fd, isize, ioff)
        if hashlib.sha256(index).digest() != isha:
            raise WeightsStoreError(f"{self.path}: weights store index checksum mismatch (corrupted file)")
        try:
            meta = msgpack.unpackb(index, raw=False)
            self.entries: dict[tuple[str, str, str, str], Entry] = {}
            new = object.__new__
            for r in meta.pop("entries"):
                # the fields set directly, not through the frozen dataclass's __init__ (an object.__setattr__ per
                # field, most of an open's index parse: one entry per weight tensor)
                e = new(Entry)
                key = (r[0], r[1], r[2], r[3])
                offset, nbytes = int(r[6]), int(r[7])
                e.__dict__.update(layer=r[0], tensor=r[1], kernel=r[2], variant=r[3], dtype=r[4], shape=tuple(r[5]),
                                  offset=offset, size=nbytes, checksum=int(r[8]), key=key)
                dtype_from_tag(e.dtype)  # an unknown type is a bad file now, not a wrong array later
                if offset % ALIGN or offset + nbytes > ioff:
                    raise WeightsStoreError(f"{self.path}: entry {key} lies outside the blob area")
                self.entries[key] = e
            # per layer: a load asks for each layer's entries, and a scan of every entry per layer was
            # quadratic (10 ms of squeezenet's Vulkan set-up)
            self._by_layer: dict[str, list[Entry]] = {}
            for e in self.entries.values():
                self._by_layer.setdefault(e.layer, []).append(e)
        except WeightsStoreError:
            raise
        except Exception as ex:
            raise WeightsStoreError(f"{self.path}: unreadable weights store index: {ex}") from ex
        self.meta: dict[str, Any] = meta
        return int(isize)

    @property
    def model_sha256(self) -> str:
        return str(self.meta.get("model_sha256", ""))

    def __contains__(self, key: tuple[str, str, str, str]) -> bool:
        return key in self.entries

    def find(self, layer: str, kernel: str | None = None, variant: str | None = None) -> Iterator[Entry]:
        for e in self._by_layer.get(layer, ()):
            if (kernel is None or e.kernel == kernel) and (variant is None or e.variant == variant):
                yield e

    def read(self, entry: Entry, out: np.ndarray | None = None) -> np.ndarray:
        """Read one blob (into ``out`` if given, e.g. an arena view) and verify its checksum."""
        faults.check("cache.read")
        dt = dtype_from_tag(entry.dtype)
        n = int(np.prod(entry.shape, dtype=np.int64)) * dt.itemsize
        if n != entry.size:
            raise WeightsStoreError(f"{self.path}: entry {entry.key} claims {entry.size} bytes for shape "
                                    f"{entry.shape} {dt.name} ({n} bytes)")
        if out is None and self._dfd >= 0 and entry.size:
            # the blob's blocks, padding included (blobs start on a block): one direct read, no bounce copy
            buf = self._span(entry.offset, _align(entry.size), entry.size, None)[:entry.size]
            mv = memoryview(buf)
            a = buf.view(dt).reshape(entry.shape)
        else:
            a = empty_aligned(tuple(entry.shape), dt) if out is None else out
            if a.nbytes != entry.size or not a.flags.c_contiguous:
                raise WeightsStoreError(f"destination for {entry.key} has {a.nbytes} bytes, entry has {entry.size}")
            mv = memoryview(a.reshape(-1).view(np.uint8))
            try:
                readv(self._fd, -1, entry.offset, [mv])
            except ShortRead as ex:
                raise WeightsStoreError(f"{self.path}: truncated weights store: {entry.key}: {ex}") from None
        if checksum(mv) != entry.checksum:
            raise WeightsStoreError(f"{self.path}: checksum mismatch in {entry.key} (corrupted weights)")
        return a

    def _read_span(self, offset: int, size: int, need: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """``size`` bytes at ``offset`` (block aligned, as every blob is) into an aligned buffer (``out``
        if given: ALIGN-aligned, ``size`` bytes), of which the first ``need`` (default: all) must come
        from the file; the rest is alignment padding past the last blob, which the file may end before."""
        faults.check("cache.read")
        need = size if need is None else need
        head = self.head
        if head is not None and out is not None:
            got = head.span(self._ident, offset, need)
            if got is not None:
                out[:need] = got
                return out[:size]
        return self._span(offset, size, need, out)

    def _span(self, offset: int, size: int, need: int, out: np.ndarray | None) -> np.ndarray:
        buf = aligned_empty(size) if out is None else out
        # a short read must end in the padding: the buffer is not zeroed, and bytes it still held from
        # earlier use could otherwise pass for the blob (a store truncated under its open index)
        try:
            readv(self._fd, self._dfd, offset, [memoryview(buf[:size])], need=need)
        except ShortRead as ex:
            raise WeightsStoreError(f"{self.path}: truncated weights store: {size} bytes at {offset}: {ex}") from None
        return buf[:size]

    def get(self, layer: str, tensor: str, kernel: str = "", variant: str = "raw") -> np.ndarray:
        key = (layer, tensor, kernel, variant)
        if key not in self.entries:
            raise WeightsStoreError(f"{self.path}: no entry {key}")
        return self.read(self.entries[key])

    def close(self) -> None:
        self.release_window()
        self.head = None
        # the field is cleared before the close, so no path can close the same number twice
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
        dfd, self._dfd = self._dfd, -1
        if dfd >= 0:
            os.close(dfd)

    def release_window(self) -> None:
        w, self.window = getattr(self, "window", None), None
        if w is not None:
            w.release()

    def __enter__(self) -> "WeightsStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class StoreStream:
    """Reads a set of blobs in file order, in large chunks, on I/O threads; ``get`` hands out
    checksummed views into the chunk that holds a blob as soon as that chunk has arrived.

    Per-blob reads pay the disk's latency once per tensor (with ``O_DIRECT`` there is no readahead
    to hide it: mobilenetv2's 55 reads took 4x the time of one sequential pass); a cold load's
    blobs sit in the store in the order it needs them, so one sequential pass delivers them in time.
    The views are the weights' final place: a chunk lives as long as a view into it does.

    ``entries`` come in the order they are needed; chunks are read in that order, each a run of blobs
    that follow one another in the file (the store is written in a plan's order, so a run is long;
    a plan refined later may need another order, which costs more, smaller reads, never a wait for
    blobs needed later).

    ``io``: a worker (with a ``submit``) or several; each runs a reader that claims the next piece (of
    at most ``chunk`` bytes) not yet claimed, so ``len(io)`` reads are in flight. Why: one ``O_DIRECT`` read at a time leaves the
    disk idle between requests (45 MB of resnet18's store: 4 MB reads one at a time ~58 ms, 2 MB reads
    two at a time ~42 ms, 2-core VM, medians of 4). The first chunk is small (``first``) so that the
    first layer's weights, which the executor waits for, are not behind megabytes of later layers'."""

    def __init__(self, store: WeightsStore, entries: Iterable[Entry], chunk: int = 2 << 20, gap: int = 64 << 10,
                 io: Any = None, first: int = FIRST_CHUNK,
                 on_read: Callable[[int, int, float, float], None] | None = None, origin: str = "run") -> None:
        self.store = store
        #: where the load started it: "open" (the package's, from plan.bin's list), "set-up" (before the backend's),
        #: "run" (with the cold run); a load's ``cold_stats['stream_from']``
        self.origin = origin
        # the readers report each piece to ``_on_read``; without one, pieces wait in ``_early`` for ``listen``
        # (a stream started before its load's run exists: at the package's open)
        self._on_read: Callable[..., None] = on_read if on_read is not None else self._report
        self._sink: Callable[..., None] | None = None
        self._early: list[tuple[int, int, float, float, str]] = []
        chunk = _align(max(chunk, 1))  # pieces stay block aligned (O_DIRECT)
        ents = self._unique(entries)
        self.chunks: list[tuple[int, int, list[Entry]]] = []
        for e in ents:
            if self.chunks:
                start, end, members = self.chunks[-1]
                limit = first if len(self.chunks) == 1 else chunk
                if 0 <= e.offset - end <= gap and e.offset + e.size - start <= limit:
                    self.chunks[-1] = (start, e.offset + e.size, members + [e])
                    continue
            self.chunks.append((e.offset, e.offset + e.size, [e]))
        self._where = {e.key: i for i, (_, _, m) in enumerate(self.chunks) for e in m}
        self._bufs: dict[int, np.ndarray] = {}
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        # each chunk is read in pieces of at most ``chunk`` bytes: a blob larger than that (resnet18's
        # 9 MB convolutions) is then read by every reader at once instead of by one while the others idle
        self._pieces = [(i, off, min(chunk, _align(end) - off)) for i, (start, end, _m) in enumerate(self.chunks)
                        for off in range(start, _align(end), chunk)]
        readers = list(io) if isinstance(io, (list, tuple)) else [io]
        head = getattr(store, "head", None)
        if len(self._pieces) > 1 and len(readers) > 1 and head is not None:
            c0, off0, n0 = self._pieces[0]
            if head.reading(off0, min(n0, self.chunks[c0][1] - off0)):
                # the first piece is the head read's, which its worker has under way (a cold disk's first read,
                # 2-5 ms on the 2-core VMs): a reader that claimed it would only wait for it, with no other read
                # in flight. With two readers or more the next piece goes first; the first is claimed next, by the
                # head's worker once its read is done (an instant copy) or another reader, no later than before
                self._pieces[0], self._pieces[1] = self._pieces[1], self._pieces[0]
        self._claimed = 0  # pieces handed to a reader so far (in order)
        self._left = [0] * len(self.chunks)  # pieces of each chunk not read yet
        for i, _off, _n in self._pieces:
            self._left[i] += 1
        self._partial: dict[int, np.ndarray] = {}  # chunk -> its buffer while its pieces arrive
        self._t0 = time.perf_counter()
        self.read_s = 0.0
        self.bytes = sum(end - start for start, end, _ in self.chunks)
        self._stop = False
        self._inflight = 0  # pieces claimed and not yet stored (their reader holds the chunk's buffer)
        for w in readers[:max(1, len(self._pieces))]:
            if w is not None:
                w.submit(self._run)
            else:
                threading.Thread(target=self._run, name="inferd-store-stream", daemon=True).start()

    @staticmethod
    def _unique(entries: Iterable[Entry]) -> list[Entry]:
        seen: set[tuple[str, str, str, str]] = set()
        ents = []
        for e in entries:
            if e.size and e.key not in seen:
                seen.add(e.key)
                ents.append(e)
        return ents

    @staticmethod
    def order(entries: Iterable[Entry]) -> list[tuple[str, str, str, str]]:
        """The keys a stream of ``entries`` reads, in its order (``keys`` of that stream)."""
        return [e.key for e in StoreStream._unique(entries)]

    def __contains__(self, entry: Entry) -> bool:
        return entry.key in self._where

    def keys(self) -> list[tuple[str, str, str, str]]:
        """The entries streamed, in the order they are read."""
        return [e.key for _s, _e, m in self.chunks for e in m]

    def _report(self, off: int, n: int, t0: float, t1: float) -> None:
        with self._cond:
            sink = self._sink
            if sink is None:
                self._early.append((off, n, t0, t1, threading.current_thread().name))
                return
        sink(off, n, t0, t1)

    def listen(self, sink: Callable[..., None]) -> None:
        """Report the pieces read from now on to ``sink(offset, bytes, t0, t1)``, and those read so far (before
        anyone listened) with a keyword ``thread``: the reader's name, which is not the caller's."""
        with self._cond:
            self._sink = sink
            early, self._early = self._early, []
        for off, n, t0, t1, thread in early:
            sink(off, n, t0, t1, thread=thread)

    def _claim(self) -> tuple[int, int, int, np.ndarray] | None:
        """The next piece to read: (chunk, file offset, bytes, the chunk's buffer)."""
        with self._cond:
            if self._stop or self._error is not None or self._claimed >= len(self._pieces):
                return None
            i, off, n = self._pieces[self._claimed]
            self._claimed += 1
            self._inflight += 1
            buf = self._partial.get(i)
            if buf is None:
                start, end, _m = self.chunks[i]
                buf = self._partial[i] = aligned_empty(_align(end) - start)
            return i, off, n, buf

    def _run(self) -> None:
        st = self.store
        try:
            while (got := self._claim()) is not None:
                i, off, n, buf = got
                start, end, _m = self.chunks[i]
                t0 = time.perf_counter()
                st._read_span(off, n, min(n, end - off), out=buf[off - start:off - start + n])
                self._on_read(off, n, t0, time.perf_counter())
                with self._cond:
                    self._inflight -= 1
                    if self._stop:  # released meanwhile: what this read filled goes with it
                        self._partial.pop(i, None)
                        self._cond.notify_all()
                        break
                    self._left[i] -= 1
                    if self._left[i] == 0:
                        self._bufs[i] = self._partial.pop(i)[:_align(end) - start]
                        self.read_s = max(self.read_s, time.perf_counter() - self._t0)
                        self._cond.notify_all()
        except BaseException as e:  # reported to whoever waits for a blob
            with self._cond:
                self._inflight = max(0, self._inflight - 1)
                self._error = e
                self._cond.notify_all()

    def get(self, entry: Entry) -> np.ndarray:
        i = self._where[entry.key]
        with self._cond:
            while i not in self._bufs and self._error is None and not self._stop:
                self._cond.wait(0.5)
            if i not in self._bufs:
                if self._error is None:
                    raise WeightsStoreError(f"{self.store.path}: the streaming read was stopped (the load was cancelled)")
                raise WeightsStoreError(f"{self.store.path}: streaming read failed: {self._error}") from self._error
            buf = self._bufs[i]
        start = self.chunks[i][0]
        mv = buf[entry.offset - start: entry.offset - start + entry.size]
        if checksum(memoryview(mv)) != entry.checksum:
            raise WeightsStoreError(f"{self.store.path}: checksum mismatch in {entry.key} (corrupted weights)")
        return mv.view(dtype_from_tag(entry.dtype)).reshape(entry.shape)

    def wait_stopped(self, timeout: float) -> bool:
        """After ``release``: wait until no read is under way (so that the memory it fills goes now). False on
        timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._inflight <= 0, timeout)

    def release(self) -> None:
        """Forget the chunks, read and half read (the views handed out keep theirs alive); a read under way drops
        its chunk when it ends (it had put it back after a cancelled load's release, held until collected)."""
        with self._cond:
            self._stop = True
            self._bufs.clear()
            self._partial.clear()
            self._cond.notify_all()


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(chunk), b""):
            h.update(b)
    return h.hexdigest()


def entries_of(store: WeightsStore) -> Iterable[Entry]:
    return sorted(store.entries.values(), key=lambda e: e.offset)
