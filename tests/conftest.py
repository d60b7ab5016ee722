"""Suite-wide settings: deterministic thread counts and no predictor of the developer's."""
from __future__ import annotations

import os
import tempfile

import pytest

# The suite runs on 2 cores in CI; keep BLAS and lavapipe from oversubscribing them.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
os.environ.setdefault("LP_NUM_THREADS", "2")

# A latency predictor trained on this machine (``inferd predictor train`` writes ~/.cache/inferd/predictor) changes
# how packages are planned and profiled (from predictions, then in idle time): the suite must not depend on whether
# the developer trained one. Tests that want a predictor point INFERD_PREDICTOR_DIR at their own.
os.environ["INFERD_PREDICTOR_DIR"] = tempfile.mkdtemp(prefix="inferd-test-predictor-")

# SPIR-V compiled once for the whole suite: tests open Vulkan devices on caches of their own (a fresh cache is part
# of what many of them test), and each compiled the variants it met again, one glslang process each (test_vulkan_ops'
# device alone: 18 s per worker). Entries are keyed by the expanded source, the defines and the compiler, and read
# back only when their checksum holds (inferd.vulkan.shaders), so a set shared between runs is never stale; tests of
# the cache itself take these variables out. INFERD_TEST_SPIRV= (empty) turns the set off.
_TEST_SPIRV = os.environ.setdefault("INFERD_TEST_SPIRV", os.path.join(os.path.expanduser("~"), ".cache",
                                                                       "inferd-test-spirv"))
if _TEST_SPIRV:
    os.environ["INFERD_SPIRV_PATH"] = os.pathsep.join(
        p for p in (os.environ.get("INFERD_SPIRV_PATH"), _TEST_SPIRV) if p)
    os.environ.setdefault("INFERD_SPIRV_EXPORT", _TEST_SPIRV)

# A crash in a kernel (a worker dies of SIGSEGV) reports its native frames before pytest's faulthandler prints the
# Python ones (native/crash.c): a rare crash of the suite once showed only the Python line that called into C.
from inferd import native as _native  # noqa: E402

_native.install_crash_report()


@pytest.fixture
def no_test_spirv(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's shared SPIR-V set out of the way: for tests that count what a shader cache compiles."""
    monkeypatch.delenv("INFERD_SPIRV_EXPORT", raising=False)
    kept = [p for p in os.environ.get("INFERD_SPIRV_PATH", "").split(os.pathsep) if p and p != _TEST_SPIRV]
    if kept:
        monkeypatch.setenv("INFERD_SPIRV_PATH", os.pathsep.join(kept))
    else:
        monkeypatch.delenv("INFERD_SPIRV_PATH", raising=False)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    # ... where pytest's faulthandler writes (a copy of the real stderr): fd 2 is a capture file during each test,
    # lost with a worker that dies of the signal (a crash of 2026-12-05 showed faulthandler's frames and no report)
    from _pytest.faulthandler import fault_handler_stderr_fd_key

    fd = config.stash.get(fault_handler_stderr_fd_key, None)
    _native.install_crash_report(os.dup(fd) if fd is not None else None)
