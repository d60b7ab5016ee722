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

# A crash in a kernel (a worker dies of SIGSEGV) reports its native frames before pytest's faulthandler prints the
# Python ones (native/crash.c): a rare crash of the suite once showed only the Python line that called into C.
from inferd import native as _native  # noqa: E402

_native.install_crash_report()


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    # ... where pytest's faulthandler writes (a copy of the real stderr): fd 2 is a capture file during each test,
    # lost with a worker that dies of the signal (a crash of 2026-12-05 showed faulthandler's frames and no report)
    from _pytest.faulthandler import fault_handler_stderr_fd_key

    fd = config.stash.get(fault_handler_stderr_fd_key, None)
    _native.install_crash_report(os.dup(fd) if fd is not None else None)
