"""File helpers shared by the on-disk caches and formats."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
