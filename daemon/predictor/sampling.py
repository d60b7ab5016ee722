"""Adaptive sampling (nn-Meter's): measure configurations drawn from the distribution real models use,
fit, then measure more finely around the configurations with the largest error, until the validation
error stops falling or the time is up.

Generic over the configuration type, so the loop is tested on a synthetic cost function with a known
spike and used unchanged by the trainer on real units.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Generic, Sequence, TypeVar

import numpy as np

C = TypeVar("C")


@dataclass
class Round:
    index: int
    train: int               # training samples after this round's fit
    val_error: float         # the error the stop rule watches (mean |log(pred / measured)|)
    within10: float          # share of validation samples within +-10%
    added_near: list[int] = field(default_factory=list)  # indices (into the result's configs) of the worst points
    seconds: float = 0.0


@dataclass
class SamplingResult(Generic[C]):
    train: list[C]
    y_train: list[float]
    val: list[C]
    y_val: list[float]
    rounds: list[Round]
    #: (round, config) of every point added around a bad one
    refined: list[tuple[int, C]]
    stopped: str


def relative_errors(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.abs(np.log(np.maximum(pred, 1e-12) / np.maximum(y, 1e-12)))


def adaptive_sample(pool: Sequence[C], measure: Callable[[C], float | None],
                    fit: Callable[[list[C], list[float]], Callable[[list[C]], np.ndarray]],
                    perturb: Callable[[C, np.random.Generator], C | None], *,
                    initial: int, val: int, per_round: int = 16, neighbours: int = 4, explore: float = 0.25,
                    max_rounds: int = 20, patience: int = 2, min_gain: float = 0.02,
                    deadline: float | None = None, seed: int = 0, shuffle: bool = True,
                    progress: Callable[[str, int, int], None] | None = None) -> SamplingResult[C]:
    """Run the loop. ``pool``: configurations from the real distribution (the first ``val`` of a shuffled
    copy are the fixed validation set, the next ``initial`` the first training set, the rest are drawn
    from to explore). Each round refits, scores the validation set, then measures ``neighbours``
    perturbations of each of the ``per_round / neighbours`` worst validation points (and a share
    ``explore`` of fresh pool points; ``shuffle`` False keeps ``pool``'s order, e.g. a stratified one). Stops when the validation error has not fallen by ``min_gain``
    (relative) for ``patience`` rounds, at ``max_rounds``, or at ``deadline`` (``time.monotonic()``)."""
    rng = np.random.default_rng(seed)
    order = list(rng.permutation(len(pool))) if shuffle else list(range(len(pool)))
    queue = [pool[i] for i in order]
    val_cfg: list[C] = []
    y_val: list[float] = []
    train: list[C] = []
    y_train: list[float] = []
    refined: list[tuple[int, C]] = []
    rounds: list[Round] = []

    def over() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    def take(dst: list[C], ys: list[float], want: int, what: str) -> None:
        got = 0
        while queue and got < want and not over():
            c = queue.pop(0)
            v = measure(c)
            if v is not None and np.isfinite(v) and v > 0:
                dst.append(c)
                ys.append(float(v))
                got += 1
            if progress is not None:
                progress(what, got, want)

    take(val_cfg, y_val, val, "validation")
    take(train, y_train, initial, "initial")
    best = float("inf")
    stale = 0
    stopped = "pool exhausted"
    for r in range(max_rounds):
        t0 = time.monotonic()
        if not train:
            stopped = "no samples"
            break
        predict = fit(train, y_train)
        if not val_cfg:
            stopped = "no validation samples"
            break
        err = relative_errors(np.asarray(predict(val_cfg), dtype=np.float64), np.asarray(y_val))
        ve = float(np.mean(err))
        rounds.append(Round(r, len(train), ve, float(np.mean(err <= np.log(1.1))), seconds=0.0))
        if ve < best * (1 - min_gain):
            best, stale = ve, 0
        else:
            stale += 1
        if stale >= patience:
            stopped = "validation error stopped falling"
            break
        if over():
            stopped = "time is up"
            break
        n_worst = max(1, int(round(per_round * (1 - explore) / max(neighbours, 1))))
        worst = list(np.argsort(-err)[:n_worst])
        rounds[-1].added_near = [int(i) for i in worst]
        for i in worst:
            for _ in range(neighbours):
                if over():
                    break
                c = perturb(val_cfg[i], rng)
                if c is None:
                    continue
                v = measure(c)
                if v is not None and np.isfinite(v) and v > 0:
                    train.append(c)
                    y_train.append(float(v))
                    refined.append((r, c))
            if progress is not None:
                progress(f"refine round {r + 1}", worst.index(i) + 1, len(worst))
        take(train, y_train, int(round(per_round * explore)), f"explore round {r + 1}")
        rounds[-1].seconds = time.monotonic() - t0
    else:
        stopped = "round limit"
    return SamplingResult(train, y_train, val_cfg, y_val, rounds, refined, stopped)
