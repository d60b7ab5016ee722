"""The on-disk cache's health: packages, SPIR-V and pipeline caches are an optimisation, never a
reason to refuse a model.

Every writer of the cache reports the ``OSError`` it met to :func:`report`; the directory's state
becomes ``read-only`` (EROFS, EACCES, EPERM), ``full`` (ENOSPC, EDQUOT) or ``error`` (EIO and the
rest), with one warning per state change naming the directory and the error. While a directory is
not ``ok``, loads skip writing to it (they compile in memory) and :func:`writable` probes it again at
most every ``REPROBE_S`` seconds, so space freed later is used again without a restart.

:func:`clean_leftovers` removes what interrupted writes left behind (temp files and directories of
a process that no longer runs); :func:`evict` keeps the packages under a size limit, least recently
used first (a package's directory mtime is its last use: :func:`touch`).
"""
from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

log = logging.getLogger("inferd.cache")

OK, READ_ONLY, FULL, ERROR = "ok", "read-only", "full", "error"
REPROBE_S = 30.0

_READ_ONLY = {errno.EROFS, errno.EACCES, errno.EPERM}
_FULL = {errno.ENOSPC, errno.EDQUOT}


def state_of(exc: BaseException) -> str:
    err = getattr(exc, "errno", None)
    if err in _READ_ONLY:
        return READ_ONLY
    if err in _FULL:
        return FULL
    return ERROR


@dataclass
class CacheDir:
    root: Path
    state: str = OK
    error: str = ""
    since: float = 0.0
    events: int = 0  # state changes away from ok (shown in status)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def report(self, exc: BaseException, what: str = "") -> None:
        """A write or read under this directory failed with ``exc``."""
        state = state_of(exc)
        msg = f"{type(exc).__name__}: {exc}"
        with self.lock:
            changed = state != self.state
            self.state, self.error, self.since = state, msg, time.monotonic()
            if changed:
                self.events += 1
        if changed:
            log.warning("cache directory %s is %s (%s%s): models are compiled in memory until it works again",
                        self.root, state, f"{what}: " if what else "", msg)

    def ok(self) -> None:
        with self.lock:
            was = self.state
            self.state, self.error = OK, ""
        if was != OK:
            log.info("cache directory %s works again", self.root)

    def probe(self) -> str:
        """Create the directory and write, sync and remove a probe file; returns the state."""
        from . import faults

        p = self.root / f".probe{os.getpid()}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            faults.check("cache.write")
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, b"inferd")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.unlink(p)
        except OSError as exc:
            try:
                p.unlink()
            except OSError:
                pass
            self.report(exc, "probe")
            return self.state
        self.ok()
        return OK

    def writable(self) -> bool:
        """Whether a load should write here now (re-probes a failed directory now and then)."""
        if self.state == OK:
            return True
        if time.monotonic() - self.since >= REPROBE_S:
            return self.probe() == OK
        return False

    def snapshot(self) -> dict[str, object]:
        return {"dir": str(self.root), "state": self.state, "error": self.error, "events": self.events}


_dirs: dict[str, CacheDir] = {}
_dirs_lock = threading.Lock()


def cache_dir(root: str | os.PathLike[str]) -> CacheDir:
    """The process-wide health record of ``root`` (resolved; created on first use)."""
    key = os.path.abspath(os.fspath(root))
    with _dirs_lock:
        cd = _dirs.get(key)
        if cd is None:
            cd = _dirs[key] = CacheDir(Path(key))
        return cd


def holder(path: str | os.PathLike[str], default: str | os.PathLike[str] | None = None) -> CacheDir:
    """The known cache directory that holds ``path`` (the daemon registers its root), else the
    record of ``default`` (``path`` itself when None)."""
    p = os.path.abspath(os.fspath(path))
    with _dirs_lock:
        best = max((k for k in _dirs if p == k or p.startswith(k + os.sep)), key=len, default=None)
    return cache_dir(best or (p if default is None else default))


def report(path: str | os.PathLike[str], exc: BaseException, what: str = "") -> None:
    """Report a failed cache access under ``path`` to the cache directory that holds it."""
    p = os.path.abspath(os.fspath(path))
    holder(p, os.path.dirname(p)).report(exc, what)


# ---------------------------------------------------------------- leftovers, usage, eviction

#: names of interrupted writes: package temp dirs (``.NAME.tmpPID.TID``), store temp files
#: (``weights.store.tmpPID``), ``atomic_write`` temp files (``NAME.PID.RANDOM.tmp``), probes
_TMP = re.compile(r"(?:\.tmp(?P<a>\d+)(?:\.\d+)?$)|(?:\.(?P<b>\d+)\.[^.]+\.tmp$)|(?:^\.probe(?P<c>\d+)$)")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_leftovers(root: str | os.PathLike[str], depth: int = 3) -> list[str]:
    """Remove temp files and directories that interrupted writes left under ``root`` (those whose
    writer process is gone, or that name none and are older than an hour). Returns what went."""
    removed: list[str] = []
    base = Path(root)
    if not base.is_dir():
        return removed

    def walk(d: Path, level: int) -> None:
        try:
            entries = list(os.scandir(d))
        except OSError:
            return
        for e in entries:
            m = _TMP.search(e.name)
            if m is not None:
                pid = next((int(g) for g in m.groups() if g), None)
                stale = not _alive(pid) if pid is not None else False
                if stale:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            shutil.rmtree(e.path)
                        else:
                            os.unlink(e.path)
                        removed.append(e.path)
                    except OSError as exc:
                        log.debug("cannot remove leftover %s: %s", e.path, exc)
                continue
            if level < depth and e.is_dir(follow_symlinks=False):
                walk(Path(e.path), level + 1)

    walk(base, 0)
    if removed:
        log.info("cache %s: removed %d leftovers of interrupted writes", base, len(removed))
    return removed


def tree_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes allocated under ``path`` (missing: 0)."""
    total = 0
    stack = [os.fspath(path)]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            stack.append(e.path)
                        else:
                            total += e.stat(follow_symlinks=False).st_blocks * 512
                    except OSError:
                        pass
        except OSError:
            pass
    return total


def touch(pkg: str | os.PathLike[str]) -> None:
    """Mark a package as just used (its directory's mtime): eviction goes by it."""
    try:
        os.utime(pkg)
    except OSError:
        pass  # a read-only cache: its packages are never evicted by us anyway


def packages(root: str | os.PathLike[str]) -> list[tuple[float, int, Path]]:
    """(last use, bytes, path) of every package directory under ``root``, least recently used first."""
    out = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for e in entries:
        if e.name.startswith(".") or not e.is_dir(follow_symlinks=False):
            continue
        try:
            mtime = e.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        out.append((mtime, tree_bytes(e.path), Path(e.path)))
    out.sort(key=lambda t: t[0])
    return out


def evict(root: str | os.PathLike[str], max_bytes: int, keep: Iterable[str | os.PathLike[str]] = ()) -> list[Path]:
    """Delete least recently used packages under ``root`` until they take at most ``max_bytes``
    (``keep``: packages in use, never deleted). Returns the deleted ones."""
    if max_bytes <= 0:
        return []
    kept = {os.path.abspath(os.fspath(k)) for k in keep}
    pkgs = packages(root)
    total = sum(n for _, n, _ in pkgs)
    gone: list[Path] = []
    for _mtime, n, p in pkgs:
        if total <= max_bytes:
            break
        if os.path.abspath(p) in kept:
            continue
        try:
            shutil.rmtree(p)
        except OSError as exc:
            log.warning("cache: cannot evict %s: %s", p, exc)
            continue
        total -= n
        gone.append(p)
    if gone:
        log.info("cache %s: evicted %d least recently used packages (limit %d bytes, now %d)", root, len(gone),
                 max_bytes, total)
    return gone


def default_max_bytes(root: str | os.PathLike[str]) -> int:
    """Half of what the cache could grow to now (its usage plus the file system's free space),
    capped at 8 GiB: a full disk is left to the rest of the system."""
    p = Path(root)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return 1 << 30
    free = st.f_bavail * st.f_frsize
    return max(64 << 20, min(8 << 30, (free + tree_bytes(root)) // 2))
