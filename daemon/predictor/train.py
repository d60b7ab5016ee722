"""``inferd predictor train``: adaptive sampling of this machine's units, then the predictor file.

Steps (each bounded by a share of ``--minutes``): collect the units of the training variants (held-out
variants never enter), measure the read rate of the disk, run :func:`~inferd.predictor.sampling.adaptive_sample`
on warm execution (the other phases are measured alongside each sample), fit every unit model on all
samples, then measure a few training variants whole to fit the per-step / per-run overhead.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence, Tuple

import numpy as np

from .. import __version__
from ..ops.base import choose_kernel
from .cost import runs_nothing
from .features import features, signature, vulkan_dispatches
from .model import UNIT_PHASES, Predictor, UnitModel, fit_unit
from .sampling import adaptive_sample

log = logging.getLogger("inferd.predictor.train")


class Progress:
    """A one-line progress bar on a terminal; a line every few seconds otherwise (logs, CI)."""

    def __init__(self, total_s: float, stream: Any = None, quiet: bool = False) -> None:
        self.t0 = time.monotonic()
        self.total = max(total_s, 1e-9)
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.quiet = quiet
        self._last = 0.0
        self.samples = 0

    def __call__(self, what: str, got: int, want: int) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if not self.tty and now - self._last < 5.0:
            return
        self._last = now
        frac = min(1.0, (now - self.t0) / self.total)
        bar = "#" * int(frac * 30)
        line = (f"[{bar:<30}] {frac * 100:5.1f}% {now - self.t0:6.0f}s  {what}: {got}/{want}  "
                f"samples {self.samples}")
        self.stream.write(("\r" + line[:120]) if self.tty else line + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty and not self.quiet:
            self.stream.write("\n")


def fingerprint_for(device: str) -> dict[str, str]:
    from ..package import fingerprint

    return fingerprint(device)


#: a model configuration the sampler draws: a variant at a thread count
Config = Tuple[Any, int]


class Trainer:
    """Measures models and fits unit models for one device (``cpu`` or ``vulkan``).

    Samples are kept per unit signature (the same layer shape recurs across variants: its timings are
    pooled and their median used); whole-model timings per configuration for the overhead fit."""

    def __init__(self, device: str, threads: Sequence[int] | None = None, seed: int = 0) -> None:
        self.device = device
        self.gpu = device != "cpu"
        self.seed = seed
        self.rng = np.random.default_rng([seed, 7])
        self.samples: dict[str, list[dict[str, float]]] = defaultdict(list)
        self.units: dict[str, tuple[Any, Any, int]] = {}
        self.feats: dict[str, np.ndarray] = {}
        #: config name -> (measured warm s, unit signatures it ran, executed steps)
        self.models: dict[str, tuple[float, list[str], int]] = {}
        #: CPU: the speed probe before each configuration's measurement (config name -> seconds), and every
        #: probe per thread count; times are fitted at the median probe's level (``probe`` module)
        self.model_probe: dict[str, float] = {}
        #: config name -> the sum of its units' warm times as measured in that run (what the whole-model time is
        #: made of; the rest is what runs between units)
        self.model_units: dict[str, float] = {}
        self.probes: dict[int, list[float]] = defaultdict(list)
        self.runs = 0
        if self.gpu:
            from ..vulkan.device import get_device

            c = get_device().caps
            self.caps = {"subgroup_size": c.subgroup_size, "max_shared_bytes": c.max_shared_bytes,
                         "max_workgroup_invocations": c.max_workgroup_invocations,
                         "max_workgroup_count": list(c.max_workgroup_count), "vendor_id": c.vendor_id,
                         "device_type": c.device_type}
            self.threads = [1]
        else:
            from .. import native

            self.caps = {}
            self.threads = list(threads or sorted({native.num_threads(), 1}, reverse=True))

    @staticmethod
    def name(cfg: Config) -> str:
        return f"{cfg[0].name}@t{cfg[1]}"

    def graph(self, spec: Any) -> Any:
        from ..frontend import import_template, specialize
        from ..zoo._variants import build_variant

        return specialize(import_template(build_variant(spec)))

    def alternatives(self, graph: Any) -> dict[str, str]:
        """Per op type, one candidate kernel other than the default, drawn at random (so every candidate gets
        in-context samples), forced by node name on the nodes it applies to (the default runs elsewhere: the
        Vulkan backend refuses a kernel forced by op type on a node it does not apply to)."""
        from ..runtime.cpu import candidate_kernels
        from ..ops.base import Layer

        alts: dict[str, set[str]] = defaultdict(set)
        fits: dict[str, set[str]] = {}
        backend = "vulkan" if self.gpu else "cpu"
        for node in graph.nodes:
            layer = Layer.of(node, graph)
            try:
                cands, default = candidate_kernels(layer, backend, None, False)
            except Exception:
                continue
            names = {k.name for k in cands if k.name != default.name}
            alts[layer.op] |= names
            fits[node.name] = names
        pick = {op: str(self.rng.choice(sorted(ks))) for op, ks in alts.items() if ks}
        return {node.name: pick[node.op] for node in graph.nodes
                if node.op in pick and pick[node.op] in fits.get(node.name, ())}

    def measure(self, cfg: Config, alternative: bool = True) -> float | None:
        """Measure ``cfg`` with its default kernels (its whole-model time is returned and kept) and, with
        ``alternative``, once more with other candidate kernels (their units only)."""
        from .measure import measure_model_cpu, measure_model_vulkan

        spec, threads = cfg
        try:
            g = self.graph(spec)
            runs = [None] + ([self.alternatives(g)] if alternative else [])
            warm = None
            probe = None
            if not self.gpu:
                from .probe import probe_s

                probe = probe_s(threads)
                self.probes[threads].append(probe)
                self.model_probe[self.name(cfg)] = probe
            for forced in runs:
                if forced == {}:
                    continue
                ms = measure_model_vulkan(g, forced) if self.gpu else measure_model_cpu(g, threads, forced)
                self.runs += 1
                sigs = [self.record(ls, threads, g, probe) for ls in ms.layers]
                if forced is None:
                    self.models[self.name(cfg)] = (ms.warm_s, sigs, len(sigs))
                    self.model_units[self.name(cfg)] = float(sum(ls.phases.get("exec", 0.0) for ls in ms.layers))
                    warm = self.warm(self.name(cfg))
            return warm
        except Exception as e:  # a configuration that cannot run here teaches nothing; say so and go on
            log.warning("measuring %s failed: %s: %s", self.name(cfg), type(e).__name__, e)
            return None

    def record(self, ls: Any, threads: int, graph: Any, probe: float | None = None) -> str:
        sig = f"{threads}|{signature(ls.layer, ls.kernel)}"
        self.samples[sig].append(dict(ls.phases, _probe=probe) if probe else ls.phases)
        if sig not in self.feats:
            ds = ls.dispatches
            if self.gpu and ds is None:
                from .cost import _caps

                ds = vulkan_dispatches(ls.layer, ls.kernel, _caps(self.caps), graph.constants)
            self.feats[sig] = features(ls.layer, ls.kernel, threads, ds)
            self.units[sig] = (ls.layer.op, ls.kernel.name, threads)
        return sig

    def reference(self, threads: int) -> float | None:
        """The median probe at ``threads`` so far: the level every warm time is rescaled to."""
        ps = self.probes.get(threads)
        return float(np.median(ps)) if ps else None

    def _level(self, probe: float | None, threads: int) -> float:
        """Factor that takes a time measured after ``probe`` to the training's reference level."""
        return _to_reference(self.reference(threads), probe)

    def _config_level(self, name: str) -> float:
        """``_level`` of configuration ``name`` (its probe, at its thread count: the name ends in ``@t<threads>``)."""
        threads = int(name.rsplit("@t", 1)[1]) if "@t" in name else 1
        return self._level(self.model_probe.get(name), threads)

    def warm(self, name: str) -> float:
        """Configuration ``name``'s whole-model warm seconds at the reference level."""
        return self.models[name][0] * self._config_level(name)

    def units_measured(self, name: str) -> float | None:
        """The sum of configuration ``name``'s units as measured in its run, at the reference level."""
        u = self.model_units.get(name)
        return None if u is None else u * self._config_level(name)

    def value(self, sig: str, phase: str) -> float | None:
        """Median of a unit's samples of ``phase`` (warm phases at the reference level)."""
        from .cost import EXEC_PHASES

        ref = self.reference(self.units[sig][2] if sig in self.units else 1) \
            if phase in EXEC_PHASES and not self.gpu else None
        vs = [s[phase] * (_to_reference(ref, s.get("_probe")) if ref else 1.0)
              for s in self.samples.get(sig, ()) if phase in s and s[phase] > 0]
        return float(np.median(vs)) if vs else None

    def fit(self, phases: Sequence[str] = UNIT_PHASES, n_trees: int = 150, only: set[str] | None = None
            ) -> dict[tuple[str, str], UnitModel]:
        """Per (op/kernel) and per kernel (the fallback), every phase with samples; ``only``: these signatures."""
        rows: dict[tuple[str, str], list[tuple[np.ndarray, float]]] = defaultdict(list)
        for sig, (op, kname, _t) in self.units.items():
            if only is not None and sig not in only:
                continue
            for ph in phases:
                v = self.value(sig, ph)
                if v is None:
                    continue
                rows[(f"{op}/{kname}", ph)].append((self.feats[sig], v))
                rows[(f"*/{kname}", ph)].append((self.feats[sig], v))
        models: dict[tuple[str, str], UnitModel] = {}
        for (key, ph), r in rows.items():
            X = np.stack([a for a, _ in r])
            y = np.array([b for _, b in r])
            models[(key, ph)] = fit_unit(key, ph, X, y, n_trees=n_trees, seed=self.seed)
        return models

    def unit_sum(self, models: dict[tuple[str, str], UnitModel], sigs: Sequence[str]) -> float:
        """Predicted sum of warm times of ``sigs``, vectorised per unit model."""
        groups: dict[int, tuple[UnitModel, list[np.ndarray]]] = {}
        total = 0.0
        for sig in sigs:
            op, kname, _t = self.units[sig]
            m = models.get((f"{op}/{kname}", "exec")) or models.get((f"*/{kname}", "exec"))
            if m is None:
                total += self.value(sig, "exec") or 0.0
                continue
            groups.setdefault(id(m), (m, []))[1].append(self.feats[sig])
        for m, rows in groups.values():
            total += float(np.sum(m.predict(np.stack(rows))))
        return total

    def predictor(self, models: dict[tuple[str, str], UnitModel], fp: dict[str, str], rates: dict[str, float],
                  reads: dict[str, float], info: dict[str, Any]) -> Predictor:
        return Predictor(self.device, fp, __version__, models, reads=reads, rates=rates, caps=self.caps, info=info)


def fit_overhead(measured: Sequence[tuple[float, float, int]]) -> dict[str, float]:
    """``measured = scale * units + per_step * steps + per_run`` from (measured s, sum of units s, steps)
    of whole models: non-negative least squares on the relative error (a negative per-step or per-run time
    fitted to noise extrapolated badly to models of other sizes), once more without the worst point in ten."""
    from scipy.optimize import nnls

    if len(measured) < 3:
        return {"scale": 1.0, "per_step_s": 0.0, "per_run_s": 0.0}
    y = np.array([m[0] for m in measured])
    A = np.array([[m[1], m[2] * 1e-6, 1e-3] for m in measured])  # steps in us, the run in ms: columns O(1)
    Ar = A / y[:, None]
    keep = np.ones(len(y), bool)
    c = np.array([1.0, 0.0, 0.0])
    for _ in range(2):
        c, _ = nnls(Ar[keep], np.ones(int(keep.sum())))
        r = np.abs(A @ c / y - 1)
        if keep.sum() >= 10:
            keep = r <= np.quantile(r, 0.9)
    if c[0] <= 0:
        c = np.array([1.0, 0.0, 0.0])
    return {"scale": float(c[0]), "per_step_s": float(c[1] * 1e-6), "per_run_s": float(c[2] * 1e-3)}


def _to_reference(ref: float | None, probe: float | None) -> float:
    """Factor that takes a time measured after a speed probe of ``probe`` s to the reference level ``ref`` (1.0
    where either is missing)."""
    return ref / probe if probe and ref else 1.0


def fit_overhead_parts(rows: Sequence[tuple[float, float | None, float, int]]) -> dict[str, float]:
    """The whole-model overhead in two parts, from (measured whole s, its units as measured s, their out-of-sample
    prediction s, steps) per configuration: what runs between the units (``fit_overhead`` on the *measured* unit
    sums: on the H100 a constant ~0.18 ms per run, the submit and the fence; on the CPU ~4% of the units, the
    pool's wake-ups), times ``unit_scale``, the median of measured / predicted unit sums (the unit models' bias
    on shapes they were not fitted on). Fitted jointly on predicted sums alone (``fit_overhead``), the two
    mixed: the H100 predictor got scale 1.10 and 0.10 ms per run for a gap that was 0.18 ms at every size, and
    missed small models by 10-30%. Falls back to the joint fit where measured sums are missing."""
    full = [r for r in rows if r[1] is not None and r[1] > 0 and r[2] > 0]
    if len(full) < 3:
        return fit_overhead([(w, p, n) for w, _m, p, n in rows])
    between = fit_overhead([(w, float(m), n) for w, m, _p, n in full])  # type: ignore[arg-type]
    k = float(np.clip(np.median([float(m) / p for _w, m, p, _n in full]), 0.5, 2.0))  # type: ignore[arg-type]
    return {"scale": between["scale"] * k, "per_step_s": between["per_step_s"], "per_run_s": between["per_run_s"],
            "between_scale": between["scale"], "unit_scale": k}


#: boosted trees per unit model in the file (learning rate 8 / trees): a whole-model prediction walks every
#: tree for every layer (measured for 115 rows of 24 models: 0.32 ms with 100 trees, 0.22 ms with 60)
FINAL_TREES = 60


def cross_fitted_sums(trainer: "Trainer", folds: int = 3, seed: int = 0, n_trees: int = FINAL_TREES
                      ) -> list[tuple[float, float | None, float, int]]:
    """(measured s, its units as measured s, unit sum s, steps) of every measured configuration, each unit sum
    predicted by models fitted without that configuration's units (k-fold over configurations; a unit shape that
    another fold also ran stays in, as a held-out variant shares shapes with training variants too). The units'
    bias in :func:`fit_overhead_parts` is taken from these out-of-sample sums: the trees reproduce their own
    training units almost exactly, so in-sample sums would show none of the error they make on new shapes."""
    names = sorted(trainer.models)
    if len(names) < 2 * folds:
        return []
    order = [names[i] for i in np.random.default_rng(seed).permutation(len(names))]
    out = []
    for f in range(folds):
        test = set(order[f::folds])
        sigs = {sg for n in names if n not in test for sg in trainer.models[n][1]}
        models = trainer.fit(("exec",), n_trees=n_trees, only=sigs)
        for n in sorted(test):
            _w, ss, steps = trainer.models[n]
            out.append((trainer.warm(n), trainer.units_measured(n), trainer.unit_sum(models, ss), steps))
    return out


def executed_layers(graph: Any, kernels: dict[str, str], device: str) -> list[tuple[Any, Any]]:
    """(layer, kernel) of every node a model runs with ``kernels`` (node -> kernel name)."""
    from ..ops.base import Layer

    gpu = device != "cpu"
    out = []
    for node in graph.nodes:
        kname = kernels.get(node.name)
        if kname is None:
            continue
        layer = Layer.of(node, graph)
        try:
            k = choose_kernel(layer, device, kname)
        except Exception:
            continue
        if not runs_nothing(layer, k, gpu):
            out.append((layer, k))
    return out


def _interleave(lanes: Sequence[Sequence[Any]]) -> list[Any]:
    """One from each lane in turn until every lane is empty."""
    out: list[Any] = []
    for i in range(max((len(lane) for lane in lanes), default=0)):
        out.extend(lane[i] for lane in lanes if i < len(lane))
    return out


def stratified(pool: Sequence[Config], rng: np.random.Generator) -> list[Config]:
    """``pool`` in an order each prefix of which spreads over the families and, within a family, over its widths:
    families in turn, and a family's variants its widths in turn (random within a width). The sampler's
    validation set and first training set are a prefix, and a short training (the GPU host's minutes) measures
    little more: drawn at random, 37 configurations of an H100 run held no ViT of width 0.75, and the held-out ViTs
    of that width had their attention projections (65 tokens x 192 channels, 21 us) predicted from the narrow
    ones (12 us)."""
    fams: dict[str, dict[float, list[Config]]] = defaultdict(lambda: defaultdict(list))
    for i in rng.permutation(len(pool)):
        c = pool[int(i)]
        fams[c[0].family][c[0].width].append(c)
    lanes = []
    for fam in sorted(fams):
        widths = sorted(fams[fam])
        lanes.append(_interleave([fams[fam][widths[int(j)]] for j in rng.permutation(len(widths))]))
    return _interleave([lanes[int(j)] for j in rng.permutation(len(lanes))])


def train(device: str, minutes: float, out: str | os.PathLike, n_variants: int = 240, seed: int = 0,
          quiet: bool = False) -> tuple[Predictor, dict[str, Any]]:
    from ..runtime.profiler import measure_rates
    from ..zoo._variants import corner_specs, neighbour, variant_specs
    from .measure import measure_reads, pool_reads

    t_start = time.monotonic()
    budget = max(minutes * 60.0, 10.0)
    prog = Progress(budget, quiet=quiet)
    rng = np.random.default_rng(seed)
    trainer = Trainer(device, seed=seed)
    fp = fingerprint_for(device)
    if "error" in fp:
        raise RuntimeError(f"no {device} device here: {fp['error']}")
    specs = [s for s in variant_specs(n_variants, seed) if not s.held_out]
    # the configurations: every training variant, at the default thread count or (one in five) at one thread
    pool: list[Config] = stratified([(s, trainer.threads[0] if (len(trainer.threads) == 1 or rng.random() < 0.8)
                                      else trainer.threads[-1]) for s in specs], rng)
    out_dir = Path(out).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    rates = measure_rates().to_dict()
    # the read table is measured in three windows (now, half way, at the end) and pooled: see pool_reads
    read_windows = [measure_reads(out_dir)]
    fitted: dict[str, Any] = {}

    def measure(cfg: Config) -> float | None:
        if len(read_windows) == 1 and time.monotonic() - t_start > 0.4 * budget:
            read_windows.append(measure_reads(out_dir))
        v = trainer.measure(cfg, alternative=True)
        prog.samples = len(trainer.units)
        return v

    def fit(cfgs: list[Config], _ys: list[float]) -> Callable[[list[Config]], np.ndarray]:
        models = trainer.fit(("exec",), n_trees=60)
        meas = [(trainer.warm(trainer.name(c)), trainer.unit_sum(models, trainer.models[trainer.name(c)][1]),
                 trainer.models[trainer.name(c)][2]) for c in cfgs if trainer.name(c) in trainer.models]
        oh = fit_overhead(meas)
        fitted["overhead"] = oh

        def predict(cs: list[Config]) -> np.ndarray:
            outp = []
            for c in cs:
                _w, sigs, steps = trainer.models[trainer.name(c)]
                s = trainer.unit_sum(models, sigs)
                outp.append(max(oh["scale"] * s + oh["per_step_s"] * steps + oh["per_run_s"], 0.5 * s))
            return np.asarray(outp)
        return predict

    def perturb(cfg: Config, r: np.random.Generator) -> Config | None:
        s = neighbour(cfg[0], r)
        return None if s is None else (s, cfg[1])

    # the corners of the space first, at the default threads: their units train every model (the sampler's
    # own sets decide what it validates on and where it refines)
    for spec in corner_specs():
        if time.monotonic() - t_start < 0.25 * budget:
            measure((spec, trainer.threads[0]))
    res = adaptive_sample(pool, measure, fit, perturb, initial=min(60, len(pool) - 24), val=24, per_round=16,
                          neighbours=3, explore=0.25, max_rounds=60, patience=5, deadline=t_start + 0.85 * budget,
                          seed=seed, shuffle=False, progress=prog)
    # every phase on every sample; the validation configurations' units scored by models fitted without them
    train_sigs = {s for c in res.train if trainer.name(c) in trainer.models for s in trainer.models[trainer.name(c)][1]}
    val_models = trainer.fit(("exec",), n_trees=FINAL_TREES, only=train_sigs)
    val_err: dict[str, list[float]] = defaultdict(list)
    for c in res.val:
        for sig in trainer.models.get(trainer.name(c), (0, [], 0))[1]:
            if sig in train_sigs:
                continue
            op, kname, _t = trainer.units[sig]
            m = val_models.get((f"{op}/{kname}", "exec")) or val_models.get((f"*/{kname}", "exec"))
            y = trainer.value(sig, "exec")
            if m is not None and y:
                val_err[f"{op}/{kname}"].append(abs(float(m.predict(trainer.feats[sig][None, :])[0]) / y - 1))
    models = trainer.fit(UNIT_PHASES, n_trees=FINAL_TREES)
    for (key, ph), m in models.items():
        if ph == "exec" and val_err.get(key):
            m.val_mape = float(np.median(val_err[key]))
    meas = cross_fitted_sums(trainer, seed=seed) or \
        [(trainer.warm(n), trainer.units_measured(n), trainer.unit_sum(models, sigs), steps)
         for n, (_w, sigs, steps) in trainer.models.items()]
    info: dict[str, Any] = {
        "trained": _dt.datetime.now().isoformat(timespec="seconds"), "units": len(trainer.units),
        "unit_timings": sum(len(v) for v in trainer.samples.values()), "model_runs": trainer.runs,
        "configurations": len(trainer.models), "stopped": res.stopped,
        "rounds": [{"round": r.index, "train": r.train, "val_error": r.val_error, "within10": r.within10}
                   for r in res.rounds],
        "refined": len(res.refined), "threads": trainer.threads, "loadavg_end": list(os.getloadavg()),
        "seconds": time.monotonic() - t_start,
    }
    read_windows.append(measure_reads(out_dir))
    rm = pool_reads(read_windows)
    reads = {"per_read_s": rm.per_read_s, "disk_bw": rm.disk_bw}
    info["read_windows"] = len(read_windows)
    pred = trainer.predictor(models, fp, rates, reads, info)
    pred.overhead = fit_overhead_parts(meas)
    # the one-step fit on predicted sums, for comparison (what the overhead was before the two parts)
    info["overhead_joint"] = fit_overhead([(w, p, n) for w, _m, p, n in meas])
    pred.read_table = list(rm.samples)
    if trainer.probes:
        from .probe import REFERENCE

        pred.probe = {"reference": {str(t): trainer.reference(t) for t in sorted(trainer.probes)},
                      "spec": [list(r) for r in REFERENCE],
                      "spread": {str(t): [float(np.min(v)), float(np.max(v))]
                                 for t, v in sorted(trainer.probes.items())}}
    pred.save(out)
    prog.done()
    return pred, info


# ---------------------------------------------------------------------------------------------- CLI

def default_path(device: str) -> Path:
    from ..config import predictor_path

    return Path(predictor_path(device))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="inferd predictor", description="the kernel-level latency predictor")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="measure this machine's units by adaptive sampling and write a predictor file")
    t.add_argument("--device", default="cpu", choices=["cpu", "vulkan"])
    t.add_argument("--minutes", type=float, default=15.0, help="time budget (default 15)")
    t.add_argument("--out", default=None, help="predictor file (default: the per-user cache's)")
    t.add_argument("--variants", type=int, default=240, help="variants drawn (about 70%% train)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--quiet", action="store_true")
    s = sub.add_parser("show", help="print a predictor file's header (and whether it is valid here)")
    s.add_argument("file")
    s.add_argument("--device", default=None, choices=["cpu", "vulkan"])
    args = p.parse_args(list(argv) if argv is not None else None)
    logging.basicConfig(level=logging.WARNING)
    if args.cmd == "train":
        out = Path(args.out) if args.out else default_path(args.device)
        pred, info = train(args.device, args.minutes, out, args.variants, args.seed, args.quiet)
        keys = sorted({k for k, ph in pred.models if ph == "exec" and not k.startswith("*/")})
        print(f"wrote {out}: {len(pred.models)} unit models ({len(keys)} op/kernel pairs), {info['units']} units, "
              f"{info['seconds']:.0f} s ({info['stopped']}); overhead {json.dumps(pred.overhead)}")
        return 0
    from .model import PredictorFileError

    try:
        pred = Predictor.from_bytes(Path(args.file).read_bytes(), args.file)
    except (OSError, PredictorFileError) as e:
        print(f"inferd predictor: {e}", file=sys.stderr)
        return 2
    status = "ok"
    if args.device or pred.device:
        from .model import check_current

        try:
            check_current(pred, fingerprint_for(args.device or pred.device), args.file)
        except PredictorFileError as e:
            status = f"stale: {e}"
    print(json.dumps({"device": pred.device, "engine": pred.engine, "fingerprint": pred.fingerprint,
                      "models": len(pred.models), "overhead": pred.overhead, "reads": pred.reads,
                      "info": pred.info, "status": status}, indent=1))
    return 0
