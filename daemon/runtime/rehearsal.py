"""A cold load rehearsed at a daemon's start, in the background, on a small built-in model.

A process's first cold load runs much of its Python for the first time: the package's open (plan.bin's parse,
the store's index, the graph and layers rebuilt), the cold scheduler, the kernels' binding and first runs. Code
that runs for the first time is slower (lazily filled caches, C functions resolved at their first call, the
interpreter's specialisation of hot bytecode): milliseconds of a 15-40 ms cold load of a small CNN. A
daemon that has loaded one model has paid it; one just started has not, and the first model a client asks for
would. So the daemon's start (``codepages.warm_start``) compiles a tiny model into a temporary package and loads
it cold once, then throws both away: ~0.1 s of one core in the background, nothing written to disk.

Measured with ``inferd bench cold`` on the 2-core VM (Xeon, 2026-12-06; page cache dropped, median of 5 rounds,
two runs with the rehearsal and two without, alternating): load + first answer of mobilenetv2 21.3 / 22.2 ->
20.2 / 20.0 ms, shufflenetv2_x1_0 31.8 / 29.0 -> 29.2 / 28.1, resnet18 38.4 / 37.4 -> 36.0 / 36.1; squeezenet1_1 moved
within its noise (16.2 / 14.7 -> 14.0 / 16.9). A rehearsal through an ONNX model loaded in memory gained a third as
much: the package's open is the part it must run. The model holds the kernel families most CNNs run (3x3, 1x1
and depthwise convolutions, pooling, a concatenation, a residual add, a GEMM).

The package is compiled in a child process; only its load runs in the daemon. A compile imports onnx, and onnx
imports ml_dtypes, whose extension module initialises for ~1 s of one core (ml_dtypes 0.7 with numpy 2.4 on the
2-core EPYC VM) holding the GIL all that time: the daemon, serving since its socket was bound, answered nothing
meanwhile, not even a connection's ZAP handshake (2.5-4.4 s late with the VM's cores busy, which failed the suite's
auth test once in CI). A daemon whose models are all compiled now never imports onnx (15 MiB of RSS less).
The compile's profiling no longer runs the candidate kernels in this process: in alternating A/B against the
in-process compile (``scripts/cold_ab.py --rehearse --same-package``, 2-core EPYC VM in a slow spell), the next
cold load + first answer moved 0.98-1.10x (mobilenetv2) and 0.99-1.07x (squeezenet1_1) in three runs of 14-20
pairs each, new faster in 23 and 22 of 54: within this VM's noise, a loss of a few percent not excluded.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from .rehearsal_model import SHAPE, model  # noqa: F401 - (model: built where the compile runs; tests use it)

log = logging.getLogger("inferd.runtime.rehearsal")


def _scratch() -> str | None:
    """Where the package is written: memory (/dev/shm) where there is one, so that nothing of it reaches the disk.
    With it on the disk, the H100's host VM read the next cold load's weights slower in a bench that starts its
    timed load right after the rehearsal (resnet50 on Vulkan, 102 MB: 69-72 ms of reading against 49-58 without a
    rehearsal, in alternating runs); the file system's journal committing the files' creation and removal a few
    seconds later is the likely cause, not confirmed on the device since (no machine was lent again)."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


#: a rehearsal's folder: this prefix, the pid of the process that made it, a random part
PREFIX = "inferd-rehearsal-"
#: a folder named before names carried the pid is removed once this old
LEGACY_AGE_S = 3600.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep(root: str | os.PathLike) -> int:
    """Remove the rehearsal folders under ``root`` whose process is gone: a daemon killed while it rehearsed left its
    folder behind, and /dev/shm is memory until the next boot (a day of this VM's test runs and benches had left 55
    there, 2.4 MB; the fault tests' killed daemons leave one or two a run). Returns how many were removed."""
    n = 0
    for p in Path(root).glob(PREFIX + "*"):
        owner = p.name[len(PREFIX):].split("-", 1)[0]
        try:
            if owner.isdigit() and _alive(int(owner)):
                continue
            if not owner.isdigit() and time.time() - p.stat().st_mtime < LEGACY_AGE_S:
                continue
        except OSError:
            continue
        shutil.rmtree(p, ignore_errors=True)
        n += not p.exists()
    return n


def compile_in_child(pkg: Path, device: str) -> None:
    """Compile the rehearsal model into ``pkg`` (its ONNX file beside it) in a child process
    (``runtime.childcompile``): onnx is imported there, not here (the module's docstring says why)."""
    from .childcompile import REHEARSAL, compile_package

    compile_package(REHEARSAL, pkg, {"device": device})


def rehearse(device: str = "cpu") -> dict[str, float] | None:
    """Compile the rehearsal model into a temporary package (in a child process), load it cold on ``device``, answer
    once, close it and remove the package. Seconds of each part; None when it failed (best effort: logged, never
    raised)."""
    from .. import faults, package, store

    if faults.enabled:
        # the test seam counts calls at each site process-wide: a rehearsal beside the test's requests would take
        # the faults (and shift the counts) the test meant for them
        return None
    from .model import load

    t0 = time.perf_counter()
    root = _scratch() or tempfile.gettempdir()
    sweep(root)
    work = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root))
    pkg = work / "pkg"
    try:
        compile_in_child(pkg, device)
        t1 = time.perf_counter()
        m = load(str(pkg), device=device, name="inferd-rehearsal")
        try:
            m.run({"input": np.zeros(SHAPE, np.float32)})
        finally:
            m.close()
            # the load's idle-time recording of its binds (runtime.bindrec) writes into the package: done or
            # skipped (the model is closed) before the package is removed, or its file could outlive the folder
            if m.binds_done is not None:
                m.binds_done.wait(5)
        return {"compile_s": round(t1 - t0, 6), "load_s": round(time.perf_counter() - t1, 6)}
    except Exception as e:  # only a speed-up: the first real cold load then pays its first runs itself
        log.debug("cold-load rehearsal on %s failed: %s: %s", device, type(e).__name__, e)
        return None
    finally:
        # what the open kept for a later open of the same files, which are removed here
        package.forget_parsed(pkg)
        store.forget_index(pkg / "weights.store")
        shutil.rmtree(work, ignore_errors=True)
