"""The kernel-level latency predictor (nn-Meter's idea on inferd's own units), behind the planners' cost model.

``features``: what a unit (a fused layer run by one kernel) looks like; ``model``: numpy-only regressors and
the portable predictor file; ``sampling``: adaptive sampling; ``space``/``measure``: units and their
measurement on this machine; ``train``: ``inferd predictor train``; ``cost``: ``PredictedCost``, the
``CostModel`` the planners use. :func:`load_for` finds this device's predictor, if a valid one exists.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Mapping

from .model import Predictor, PredictorFileError, StalePredictorError

log = logging.getLogger("inferd.predictor")

__all__ = ["Predictor", "PredictorFileError", "StalePredictorError", "load_for"]

_cache: dict[tuple[str, str], tuple[float, Predictor | None]] = {}


def load_for(device: str, fingerprint: Mapping[str, str], path: str | os.PathLike | None = None) -> Predictor | None:
    """This device's trained predictor, or None when there is none or it is damaged or stale (reported in the
    log once per file version, never used). Cached per file and modification time."""
    from ..config import predictor_path

    p = Path(path) if path is not None else Path(predictor_path(device))
    try:
        mtime = p.stat().st_mtime
    except OSError:
        return None
    key = (str(p), device)
    hit = _cache.get(key)
    if hit is not None and hit[0] == mtime:
        return hit[1]
    pred: Predictor | None
    try:
        pred = Predictor.load(p, current=fingerprint)
        if pred.device != device:
            raise StalePredictorError(f"{p}: a predictor for {pred.device!r}, asked for {device!r}")
    except PredictorFileError as e:
        log.warning("latency predictor not used: %s", e)
        pred = None
    _cache[key] = (mtime, pred)
    return pred
