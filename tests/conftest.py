"""Suite-wide settings: deterministic thread counts and a per-run cache directory."""
from __future__ import annotations

import os

# The suite runs on 2 cores in CI; keep BLAS and lavapipe from oversubscribing them.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
os.environ.setdefault("LP_NUM_THREADS", "2")
