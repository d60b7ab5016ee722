"""The predictor's regressors and its file: numpy only at run time, no pickle on disk.

Model form, per (unit key, phase): a non-negative linear *base* on a few physical terms (a constant,
FLOPs per thread and in all, bytes moved, weight bytes; fitted to minimise the relative error), times
a boosted-tree *correction* exp(f(log features)) for what is not linear (tile sizes, cache
boundaries, workgroup heuristics, the spikes the co-execution paper saw on GPUs). The base extrapolates
sensibly to shapes outside the training range; the trees fit the shape inside it. Trees are trained
by scikit-learn (the optional ``[train]`` extra) and exported as complete binary trees in flat arrays
(feature, threshold, leaf values), so prediction is a few vectorised numpy steps per model.

File layout (little-endian): ``b"INFDPRED"``, u32 format version, u32 header length, 32-byte sha256
of everything after it, the header (JSON: engine version, device fingerprint, feature names, rates,
per-model metadata with array offsets), then the arrays' bytes. Damage, truncation, another format
version or feature list: :class:`PredictorFileError`; another device or engine: :class:`StalePredictorError`.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import InferdError
from ..fileio import atomic_write
from .features import FEATURES, INDEX

MAGIC = b"INFDPRED"
#: 2: features out_px, k_area, cin_g, work_bytes; the measured read-time table (``read_table``)
FORMAT_VERSION = 2
_HEAD = struct.Struct("<8sII32s")

#: the phases a unit model predicts (reads are a per-device model of bytes, not per unit)
UNIT_PHASES = ("exec", "exec_first", "transform", "pipeline_empty", "pipeline_filled")


class PredictorFileError(InferdError):
    """A predictor file that is damaged, truncated or of another format: never used."""


class StalePredictorError(PredictorFileError):
    """A predictor trained on another device or engine version: never used."""


def log_features(X: np.ndarray) -> np.ndarray:
    """The trees' view of the features: log2(1 + x), -1 where a feature does not apply (x < 0).

    Cast through float32 because scikit-learn's trees compare float32 inputs: the exported thresholds
    then split exactly where they did in training."""
    X = np.asarray(X, dtype=np.float64)
    out = np.where(X >= 0, np.log2(np.maximum(X, 0) + 1.0), -1.0)
    return out.astype(np.float32).astype(np.float64)


def basis(X: np.ndarray, phase: str) -> np.ndarray:
    """The base's physical terms per phase (columns), all >= 0, in units that keep them O(1)."""
    X = np.atleast_2d(np.asarray(X, dtype=np.float64))
    col = lambda f: np.maximum(X[:, INDEX[f]], 0.0)  # noqa: E731
    one = np.ones(len(X))
    thr = np.maximum(col("threads"), 1.0)
    io = col("in_bytes") + col("out_bytes")
    if phase in ("exec", "exec_first"):
        terms = [one, col("flops") / thr / 1e9, col("flops") / 1e9, io / 1e9, col("tw_bytes") / 1e9,
                 col("ws_bytes") / 1e9 / thr, col("invocations").clip(0) / 1e9, col("n_disp").clip(0) / 1e3]
        if phase == "exec_first":
            terms += [col("ws_bytes") / 1e9, col("out_bytes") / 1e9]
    elif phase == "transform":
        terms = [one, col("w_bytes") / 1e9, col("tw_bytes") / 1e9, col("cout") * col("cin") / 1e9]
    elif phase in ("pipeline_empty", "pipeline_filled"):
        terms = [one, col("n_disp").clip(0)]
    else:
        raise KeyError(f"no basis for phase {phase!r}")
    return np.stack(terms, axis=1)


@dataclass
class Trees:
    """Complete binary trees of one depth: node i's children are 2i+1 (x <= threshold) and 2i+2."""

    depth: int
    feature: np.ndarray    # (T, 2^D - 1) int32
    threshold: np.ndarray  # (T, 2^D - 1) float64
    leaves: np.ndarray     # (T, 2^D) float64, learning rate folded in
    init: float = 0.0

    def predict(self, L: np.ndarray) -> np.ndarray:
        """Sum of the trees' leaves for each row of ``L`` (log features): all (row, tree) pairs walk down
        together, gathering only the nodes they visit from the flat arrays."""
        n, t = L.shape[0], self.feature.shape[0]
        if t == 0:
            return np.full(n, self.init)
        inner = 2 ** self.depth - 1
        node0 = np.tile(np.arange(t, dtype=np.intp) * inner, n)
        row = np.repeat(np.arange(n, dtype=np.intp) * L.shape[1], t)
        feat, thr, Lf = self.feature.reshape(-1), self.threshold.reshape(-1), np.ascontiguousarray(L).reshape(-1)
        idx = np.zeros(n * t, dtype=np.intp)
        for _ in range(self.depth):
            g = node0 + idx
            idx = 2 * idx + 1 + (Lf[row + feat[g]] > thr[g])
        leaf = np.tile(np.arange(t, dtype=np.intp) * (inner + 1), n) + (idx - inner)
        return self.init + self.leaves.reshape(-1)[leaf].reshape(n, t).sum(axis=1)

    @staticmethod
    def from_sklearn(estimators: Sequence[Any], learning_rate: float, init: float, depth: int) -> "Trees":
        """Flatten scikit-learn regression trees (of at most ``depth`` levels) into complete trees: a leaf above the
        last level becomes a node that always goes left (threshold +inf) with the leaf's value below it."""
        t = len(estimators)
        inner = 2 ** depth - 1
        feat = np.zeros((t, inner), np.int32)
        thr = np.full((t, inner), np.inf)
        leaves = np.zeros((t, 2 ** depth))
        for k, est in enumerate(estimators):
            tree = est.tree_

            def fill(node: int, pos: int, level: int) -> None:
                if level == depth or tree.children_left[node] == -1:
                    v = float(tree.value[node].reshape(-1)[0]) * learning_rate
                    # every leaf of the complete subtree under pos gets v
                    first, count = pos, 1
                    for _ in range(depth - level):
                        first, count = 2 * first + 1, count * 2
                    leaves[k, first - inner:first - inner + count] = v
                    return
                feat[k, pos] = int(tree.feature[node])
                thr[k, pos] = float(tree.threshold[node])
                fill(int(tree.children_left[node]), 2 * pos + 1, level + 1)
                fill(int(tree.children_right[node]), 2 * pos + 2, level + 1)

            fill(0, 0, 0)
        return Trees(depth, feat, thr, leaves, float(init))


@dataclass
class UnitModel:
    """Seconds of one phase of the units of one key: base(x) * exp(trees(log x))."""

    key: str
    phase: str
    coef: np.ndarray
    trees: Trees | None
    n: int = 0
    #: median relative error on held-out samples at training (nan when there were too few)
    val_mape: float = float("nan")

    def predict(self, X: np.ndarray, L: np.ndarray | None = None) -> np.ndarray:
        """Seconds for feature rows ``X`` (``L``: their :func:`log_features`, when the caller has them)."""
        X = np.atleast_2d(X)
        base = basis(X, self.phase) @ self.coef
        base = np.maximum(base, 1e-7)
        if self.trees is not None:
            base = base * np.exp(np.clip(self.trees.predict(log_features(X) if L is None else L), -3.0, 3.0))
        return base


@dataclass
class Bank:
    """Every unit model of one phase stacked into arrays, so a whole model's rows (of many unit models) are
    evaluated in one pass: the basis once, each row's coefficients and trees picked by its model index. Per
    model calls cost a fixed ~0.1-0.2 ms each in numpy overhead, and a model uses 5-10 unit models; this is
    the "cache per-kernel model evaluation" of the predictor itself (derived from the file, never saved)."""

    phase: str
    index: dict[int, int]     # id(UnitModel) -> row of the arrays below
    coef: np.ndarray          # (M, K)
    depth: int
    feature: np.ndarray       # (M, T, 2^D - 1)
    threshold: np.ndarray     # (M, T, 2^D - 1); +inf pads (always left)
    leaves: np.ndarray        # (M, T, 2^D); 0 pads
    init: np.ndarray          # (M,)
    trees: np.ndarray         # (M,) bool: whether the model has trees (else the base alone)

    @staticmethod
    def build(phase: str, models: Sequence[UnitModel]) -> "Bank | None":
        """None when the models cannot share arrays (trees of different depths, bases of different sizes)."""
        if not models:
            return None
        depths = {m.trees.depth for m in models if m.trees is not None}
        ks = {len(m.coef) for m in models}
        if len(depths) > 1 or len(ks) != 1:
            return None
        depth = depths.pop() if depths else 1
        inner = 2 ** depth - 1
        t = max([m.trees.feature.shape[0] for m in models if m.trees is not None] or [0])
        n = len(models)
        feat = np.zeros((n, t, inner), np.intp)
        thr = np.full((n, t, inner), np.inf)
        leaves = np.zeros((n, t, inner + 1))
        init = np.zeros(n)
        has = np.zeros(n, bool)
        for i, m in enumerate(models):
            if m.trees is None:
                continue
            k = m.trees.feature.shape[0]
            feat[i, :k], thr[i, :k], leaves[i, :k] = m.trees.feature, m.trees.threshold, m.trees.leaves
            init[i], has[i] = m.trees.init, True
        return Bank(phase, {id(m): i for i, m in enumerate(models)}, np.stack([m.coef for m in models]), depth,
                    feat, thr, leaves, init, has)

    def predict(self, X: np.ndarray, L: np.ndarray, mi: np.ndarray) -> np.ndarray:
        """Seconds of rows ``X`` (``L`` their log features), row r by the model at ``mi[r]``: the same as each
        model's :meth:`UnitModel.predict` on its rows."""
        n = X.shape[0]
        base = np.maximum(np.einsum("ij,ij->i", basis(X, self.phase), self.coef[mi]), 1e-7)
        t = self.feature.shape[1]
        if t == 0 or not self.trees[mi].any():
            return base
        inner = 2 ** self.depth - 1
        # walk all (row, tree) pairs down together, gathering only the nodes visited from the flat arrays (a
        # table of every node's decision for every row was 10x the data, and 100 trees of it left the caches)
        tree = (mi[:, None] * t + np.arange(t)[None, :]).reshape(-1)
        node0 = tree * inner
        row = np.repeat(np.arange(n) * L.shape[1], t)
        feat, thr, Lf = self.feature.reshape(-1), self.threshold.reshape(-1), L.reshape(-1)
        idx = np.zeros(n * t, dtype=np.intp)
        for _ in range(self.depth):
            g = node0 + idx
            idx = 2 * idx + 1 + (Lf[row + feat[g]] > thr[g])
        leaf = tree * (inner + 1) + (idx - inner)
        s = self.init[mi] + self.leaves.reshape(-1)[leaf].reshape(n, t).sum(axis=1)
        return np.where(self.trees[mi], base * np.exp(np.clip(s, -3.0, 3.0)), base)


@dataclass
class Predictor:
    """Every unit model of one device, with what the whole-model sum and the read phases need."""

    device: str
    fingerprint: dict[str, str]
    engine: str
    models: dict[tuple[str, str], UnitModel] = field(default_factory=dict)
    #: whole-model warm latency = scale * sum(units) + per_step_s * steps + per_run_s (fitted on measured models)
    overhead: dict[str, float] = field(default_factory=lambda: {"scale": 1.0, "per_step_s": 0.0, "per_run_s": 0.0})
    #: reads: per_read_s + bytes / disk_bw (checksum included), measured on this device's disk
    reads: dict[str, float] = field(default_factory=lambda: {"per_read_s": 5e-5, "disk_bw": 2e8})
    rates: dict[str, float] = field(default_factory=dict)
    caps: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    features: tuple[str, ...] = FEATURES
    #: measured (bytes, median seconds) of cold reads at training, ascending: a read is interpolated in it
    #: (log-log), as readahead makes the time of a cold read far from linear in its size between 16 KB and
    #: a few MB; beyond its ends the linear model above
    read_table: list[tuple[int, float]] = field(default_factory=list)
    #: the speed probe at training (``probe.probe_s``): {"reference": {threads: median seconds}, "spec": the
    #: reference networks}; warm times were fitted at that level, a prediction scales by probe now / reference
    probe: dict[str, Any] = field(default_factory=dict)
    _banks: dict[str, Bank | None] = field(default_factory=dict, repr=False, compare=False)

    def bank(self, phase: str) -> Bank | None:
        """Every unit model of ``phase`` stacked (:class:`Bank`), built on first use."""
        if phase not in self._banks:
            self._banks[phase] = Bank.build(phase, [m for (_k, ph), m in sorted(self.models.items()) if ph == phase])
        return self._banks[phase]

    def get(self, key: str, phase: str) -> UnitModel | None:
        return self.models.get((key, phase))

    def probe_reference(self, threads: int) -> float | None:
        """The training's median probe seconds at ``threads`` (None: no probe, or one of other networks)."""
        from .probe import REFERENCE

        if not self.probe or self.probe.get("spec") != [list(r) for r in REFERENCE]:
            return None
        v = (self.probe.get("reference") or {}).get(str(int(threads)))
        return float(v) if v else None

    def read_seconds(self, nbytes: int, factors: Mapping[int, float] | None = None) -> float:
        """Seconds to read ``nbytes`` cold from this device's disk, checksum included (never zero for n > 0);
        ``factors``: the disk now against the training's table, per size (``probe.read_factors``), interpolated
        over log size and held beyond the probed sizes."""
        t = self._read_seconds(nbytes)
        if factors:
            xs = sorted(factors)
            t *= float(np.interp(np.log(max(float(nbytes), 1.0)), np.log(xs), [factors[x] for x in xs]))
        return t

    def _read_seconds(self, nbytes: int) -> float:
        n = float(nbytes)
        if n <= 0:
            return 0.0
        per, bw = self.reads.get("per_read_s", 5e-5), max(self.reads.get("disk_bw", 2e8), 1.0)
        t = self.read_table
        if len(t) < 2:
            return per + n / bw
        if n <= t[0][0]:
            return max(t[0][1] - (t[0][0] - n) / bw, 1e-7)
        if n >= t[-1][0]:
            return t[-1][1] + (n - t[-1][0]) / bw
        xs = np.log([a for a, _ in t])
        ys = np.log([max(b, 1e-9) for _, b in t])
        return float(np.exp(np.interp(np.log(n), xs, ys)))

    # ------------------------------------------------------------------ the file
    def to_bytes(self) -> bytes:
        blob = bytearray()

        def put(a: np.ndarray, dtype: str) -> list[Any]:
            arr = np.ascontiguousarray(a, dtype=np.dtype(dtype))
            off = len(blob)
            blob.extend(arr.tobytes())
            return [off, list(arr.shape), dtype]

        models = []
        for (key, phase), m in sorted(self.models.items()):
            d: dict[str, Any] = {"key": key, "phase": phase, "coef": [float(c) for c in m.coef], "n": int(m.n),
                                 "val_mape": None if not np.isfinite(m.val_mape) else float(m.val_mape)}
            if m.trees is not None:
                t = m.trees
                d["trees"] = {"depth": t.depth, "init": float(t.init), "feature": put(t.feature, "<i4"),
                              "threshold": put(t.threshold, "<f8"), "leaves": put(t.leaves, "<f8")}
            models.append(d)
        header = {"format": FORMAT_VERSION, "device": self.device, "fingerprint": self.fingerprint,
                  "engine": self.engine, "features": list(self.features), "overhead": self.overhead,
                  "reads": self.reads, "read_table": [[int(a), float(b)] for a, b in self.read_table],
                  "rates": self.rates, "caps": self.caps, "info": self.info, "models": models,
                  "probe": self.probe}
        hb = json.dumps(header, sort_keys=True, allow_nan=False).encode()
        body = hb + bytes(blob)
        return _HEAD.pack(MAGIC, FORMAT_VERSION, len(hb), hashlib.sha256(body).digest()) + body

    def save(self, path: str | os.PathLike) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(p, self.to_bytes())
        return p

    @staticmethod
    def from_bytes(data: bytes, where: str = "predictor") -> "Predictor":
        if len(data) < _HEAD.size:
            raise PredictorFileError(f"{where}: truncated predictor file ({len(data)} bytes)")
        magic, version, hlen, sha = _HEAD.unpack_from(data)
        if magic != MAGIC:
            raise PredictorFileError(f"{where}: not an inferd predictor (magic {magic!r})")
        if version != FORMAT_VERSION:
            raise PredictorFileError(f"{where}: predictor format version {version}, this engine reads {FORMAT_VERSION}")
        body = data[_HEAD.size:]
        if len(body) < hlen:
            raise PredictorFileError(f"{where}: truncated predictor file (header of {hlen} bytes, {len(body)} left)")
        if hashlib.sha256(body).digest() != sha:
            raise PredictorFileError(f"{where}: checksum mismatch (damaged or truncated predictor file)")
        try:
            h = json.loads(body[:hlen].decode())
            blob = memoryview(body)[hlen:]

            def get(ref: list[Any]) -> np.ndarray:
                off, shape, dtype = int(ref[0]), tuple(int(s) for s in ref[1]), np.dtype(str(ref[2]))
                n = int(np.prod(shape)) * dtype.itemsize
                if off < 0 or off + n > len(blob):
                    raise ValueError(f"array at {off}+{n} outside the {len(blob)}-byte blob")
                return np.frombuffer(blob[off:off + n], dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))

            if tuple(h["features"]) != FEATURES:
                raise PredictorFileError(f"{where}: written with another feature list; train it again")
            models: dict[tuple[str, str], UnitModel] = {}
            for d in h["models"]:
                trees = None
                if "trees" in d:
                    t = d["trees"]
                    trees = Trees(int(t["depth"]), get(t["feature"]).astype(np.int64), get(t["threshold"]),
                                  get(t["leaves"]), float(t["init"]))
                    if trees.feature.size and (trees.feature.min() < 0 or trees.feature.max() >= len(FEATURES)):
                        raise ValueError("tree feature index out of range")
                vm = d.get("val_mape")
                models[(str(d["key"]), str(d["phase"]))] = UnitModel(
                    str(d["key"]), str(d["phase"]), np.asarray(d["coef"], dtype=np.float64), trees, int(d["n"]),
                    float("nan") if vm is None else float(vm))
            return Predictor(str(h["device"]), {str(k): str(v) for k, v in h["fingerprint"].items()}, str(h["engine"]),
                             models, {k: float(v) for k, v in h["overhead"].items()},
                             {k: float(v) for k, v in h["reads"].items()}, dict(h.get("rates") or {}),
                             dict(h.get("caps") or {}), dict(h.get("info") or {}),
                             read_table=[(int(a), float(b)) for a, b in h.get("read_table") or []],
                             probe=dict(h.get("probe") or {}))
        except PredictorFileError:
            raise
        except Exception as e:
            raise PredictorFileError(f"{where}: unreadable predictor: {type(e).__name__}: {e}") from e

    @staticmethod
    def load(path: str | os.PathLike, current: Mapping[str, str] | None = None) -> "Predictor":
        """Read and verify ``path``; with ``current`` (this device's fingerprint) also refuse a stale one."""
        p = Path(path)
        try:
            data = p.read_bytes()
        except OSError as e:
            raise PredictorFileError(f"{p}: cannot read predictor: {e}") from e
        pred = Predictor.from_bytes(data, str(p))
        if current is not None:
            check_current(pred, current, str(p))
        return pred


#: fingerprint keys that do not make a predictor stale: the thread count is one of its features
_NOT_IDENTITY = ("threads",)


def check_current(pred: Predictor, current: Mapping[str, str], where: str = "predictor") -> None:
    """``StalePredictorError`` when ``pred`` was trained for another device or engine version."""
    from .. import __version__

    made = {k: v for k, v in pred.fingerprint.items() if k not in _NOT_IDENTITY}
    here = {k: str(v) for k, v in current.items() if k not in _NOT_IDENTITY}
    diff = sorted(k for k in set(made) | set(here) if made.get(k) != here.get(k))
    if pred.engine != __version__:
        diff = ["engine"] + [d for d in diff if d != "engine"]
    if diff:
        what = ", ".join(f"{k}: {made.get(k, pred.engine if k == 'engine' else None)!r}, "
                         f"here {here.get(k, __version__ if k == 'engine' else None)!r}" for k in diff[:4])
        raise StalePredictorError(f"{where}: trained for another device or engine ({what}); train it again with "
                                  f"'inferd predictor train --device {pred.device}'")


# ---------------------------------------------------------------------------------- training (sklearn)

#: below this many samples a key gets the base alone (trees would memorise noise)
MIN_TREE_SAMPLES = 16
#: samples per tree leaf. Not a share of the samples (it was 2%, 10+ leaves' worth): a slow path only a few
#: shapes take -- the depthwise kernel's per-channel form on a 7x7 stride-2 layer with over 1024 outputs per
#: channel, which held-out MobileNetV2 variants ran 3-7x longer than predicted, met by a handful of ~600
#: depthwise samples -- must be able to get a leaf of its own; samples are medians already, and held-out units'
#: split-half noise was a few percent (bench, 2026-11-24)
MIN_LEAF = 3


def fit_base(B: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising the relative error of B @ c against y (then once more without
    the worst 5% of points, so one disturbed measurement does not bend the line)."""
    from scipy.optimize import nnls

    A = B / y[:, None]
    scale = np.maximum(A.max(axis=0), 1e-30)
    c, _ = nnls(A / scale, np.ones(len(y)), maxiter=50 * B.shape[1])
    c = c / scale
    if len(y) >= 20:
        r = np.abs(B @ c / y - 1.0)
        keep = r <= np.quantile(r, 0.95)
        c2, _ = nnls(A[keep] / scale, np.ones(int(keep.sum())), maxiter=50 * B.shape[1])
        c = c2 / scale
    if not np.any(c > 0):
        c = np.zeros(B.shape[1])
        c[0] = float(np.median(y))
    return c


def fit_unit(key: str, phase: str, X: np.ndarray, y: np.ndarray, n_trees: int = 100, depth: int = 4,
             learning_rate: float | None = None, seed: int = 0) -> UnitModel:
    """Fit one unit model on measured seconds ``y`` (> 0) of feature rows ``X`` (``learning_rate`` by default
    8 / ``n_trees``, at most 0.2: fewer trees take larger steps to the same fit)."""
    if learning_rate is None:
        learning_rate = min(0.2, 8.0 / max(n_trees, 1))
    X = np.atleast_2d(np.asarray(X, dtype=np.float64))
    y = np.maximum(np.asarray(y, dtype=np.float64), 1e-8)
    B = basis(X, phase)
    coef = fit_base(B, y)
    trees = None
    if len(y) >= MIN_TREE_SAMPLES:
        from sklearn.ensemble import GradientBoostingRegressor

        resid = np.log(y) - np.log(np.maximum(B @ coef, 1e-7))
        L = log_features(X)
        # squared error, not Huber: a slow path taken by a few shapes (the depthwise kernel's per-channel form
        # on large 7x7 maps runs 5-8x slower) is exactly what the trees are for, and Huber treated those samples
        # as outliers; disturbed timings are already medians over runs and over the variants sharing a shape
        gb = GradientBoostingRegressor(loss="squared_error", n_estimators=n_trees, max_depth=depth,
                                       learning_rate=learning_rate, subsample=0.8,
                                       min_samples_leaf=MIN_LEAF, random_state=seed)
        gb.fit(L.astype(np.float32), resid)
        init = float(np.asarray(gb.init_.predict(L[:1].astype(np.float32))).reshape(-1)[0]) \
            if hasattr(gb.init_, "predict") else 0.0
        trees = Trees.from_sklearn([e[0] for e in gb.estimators_], gb.learning_rate, init, depth)
    return UnitModel(key, phase, coef, trees, len(y))
