"""``inferd bench predictor``: the latency predictor against measurements on held-out variants.

    inferd bench predictor [--device cpu|vulkan] [--predictor FILE] [--models N] [--units N]
                           [--minutes M] [--out DIR] [--tag NAME]

Whole models: every held-out variant (or the first N) measured warm (median) and predicted from its
kernels' units plus the fitted overhead. Units: units of held-out variants measured alone, per phase
(warm, first run, transform, reads with the page cache dropped, on Vulkan pipeline creation empty and
filled) against the prediction. Per kernel and per model: the share within +-5% and +-10%, RMSE;
scatter plots (PNG) of predicted vs measured; the time one whole-model prediction takes; the training
time recorded in the predictor file. Results under ``--out`` (default bench/results).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .common import fmt, machine_info, write_results


#: measuring passes over all held-out models (round robin: a disturbance of the shared board lasting seconds
#: touches one pass of a model, and the median of the pass medians ignores it); the spread between passes is
#: the measurement's own noise, reported beside the accuracy
PASSES = 5
#: cold reads per unit and phase (median), twice: the second median is the read measurement's noise
READ_REPS = 7
#: whole-model predictions timed per model (each from a fresh cost model; the median is the model's time)
PREDICT_REPS = 5


def _stats(pred: Sequence[float], meas: Sequence[float]) -> dict[str, float]:
    p, m = np.asarray(pred, dtype=float), np.asarray(meas, dtype=float)
    if not len(p):
        return {"n": 0}
    r = p / m - 1
    return {"n": int(len(p)), "within5": float(np.mean(np.abs(r) <= 0.05)), "within10": float(np.mean(np.abs(r) <= 0.10)),
            "within20": float(np.mean(np.abs(r) <= 0.20)), "rmse_ms": float(np.sqrt(np.mean((p - m) ** 2)) * 1e3),
            "median_abs_err": float(np.median(np.abs(r))), "mean_err": float(np.mean(r))}


def _agree(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ok = (x > 0) & (y > 0)
    if not ok.any():
        return {"n": 0}
    r = np.abs(x[ok] / y[ok] - 1)
    return {"n": int(ok.sum()), "within10": float(np.mean(r <= 0.1)), "within20": float(np.mean(r <= 0.2)),
            "median_abs_dev": float(np.median(r))}


def _noise(rows: Sequence[dict[str, Any]], units: Sequence[dict[str, Any]], phases: Sequence[str]
           ) -> dict[str, dict[str, float]]:
    """How well the same measurement agrees with itself: whole models split-half over their passes and each
    pass against the median; unit warm times split-half; cold phases against their repeat; and the cold goal's
    criterion (every cold phase of a unit within +-20%) applied to the repeat instead of the prediction."""
    out: dict[str, dict[str, float]] = {}
    multi = [r for r in rows if len(r.get("pass_ms", ())) >= 2]
    out["whole model (split-half)"] = _agree([np.median(r["pass_ms"][0::2]) for r in multi],
                                             [np.median(r["pass_ms"][1::2]) for r in multi])
    out["whole model (each pass vs median)"] = _agree([p for r in multi for p in r["pass_ms"]],
                                                      [r["measured_ms"] for r in multi for _ in r["pass_ms"]])
    ex = [u["exec"]["passes"] for u in units if "exec" in u and len(u["exec"].get("passes", ())) >= 2]
    out["unit warm (split-half)"] = _agree([np.median(p[0::2]) for p in ex], [np.median(p[1::2]) for p in ex])
    cold = [ph for ph in phases if ph not in ("exec", "exec_first")]
    for ph in cold:
        sel = [u[ph] for u in units if ph in u and u[ph].get("repeat")]
        out[ph] = _agree([x["repeat"] for x in sel], [x["measured"] for x in sel])
    both = [u for u in units if any(ph in u for ph in cold)
            and all(u[ph].get("repeat") for ph in cold if ph in u)]
    ok = [all(abs(u[ph]["repeat"] / u[ph]["measured"] - 1) <= 0.2 for ph in cold if ph in u) for u in both]
    if ok:
        out["cold unit, every phase"] = {"n": len(ok), "within10": None, "within20": float(np.mean(ok)),
                                         "median_abs_dev": None}
    return out


def _scatter(path: Path, pred: Sequence[float], meas: Sequence[float], labels: Sequence[str], title: str,
             band: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p, m = np.asarray(pred) * 1e3, np.asarray(meas) * 1e3
    fig, ax = plt.subplots(figsize=(5.5, 5))
    cats = sorted(set(labels))
    cmap = plt.get_cmap("tab20")
    for i, c in enumerate(cats):
        sel = [j for j, lab in enumerate(labels) if lab == c]
        ax.scatter(m[sel], p[sel], s=9, alpha=0.7, color=cmap(i % 20), label=c)
    lo = max(min(p.min(), m.min()) * 0.8, 1e-4)
    hi = max(p.max(), m.max()) * 1.25
    xs = np.array([lo, hi])
    ax.plot(xs, xs, "k-", lw=0.8)
    ax.plot(xs, xs * (1 + band), "k:", lw=0.8)
    ax.plot(xs, xs * (1 - band), "k:", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured (ms)")
    ax.set_ylabel("predicted (ms)")
    ax.set_title(title, fontsize=9)
    if len(cats) <= 14:
        ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="inferd bench predictor", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "vulkan"])
    ap.add_argument("--predictor", default=None, help="predictor file (default: this device's in the cache)")
    ap.add_argument("--models", type=int, default=0, help="held-out variants to measure (0: all)")
    ap.add_argument("--units", type=int, default=600, help="units of held-out variants to score (measured in them)")
    ap.add_argument("--minutes", type=float, default=20.0, help="time limit for the measurements")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--tag", default="", help="suffix of the result files (e.g. h100)")
    ap.add_argument("--variants", type=int, default=240)
    args = ap.parse_args(list(argv) if argv is not None else None)

    from ..config import predictor_path
    from ..planner.cost import raw_nbytes
    from ..predictor.cost import PredictedCost, predict_layers, predict_warm
    from ..predictor.features import _DISPATCHES as dispatch_cache, signature
    from ..predictor.measure import measure_model_cpu, measure_model_vulkan, read_once
    from ..predictor.model import Predictor
    from ..predictor.probe import probe_s, read_factors, read_probe, speed_factor
    from ..predictor.train import Trainer, executed_layers, fingerprint_for
    from ..zoo._variants import variant_specs

    t_start = time.monotonic()
    deadline = t_start + args.minutes * 60
    ppath = Path(args.predictor or predictor_path(args.device))
    pred = Predictor.load(ppath, current=fingerprint_for(args.device))  # stale or damaged: an error, not a result
    trainer = Trainer(args.device)
    threads = trainer.threads[0]
    held = [s for s in variant_specs(args.variants) if s.held_out]
    if args.models:
        held = held[:args.models]
    load0 = list(os.getloadavg())
    phases = ("exec", "exec_first", "transform") + (("pipeline_empty", "pipeline_filled") if trainer.gpu else ())
    rows: list[dict[str, Any]] = []
    unit_rows: list[dict[str, Any]] = []
    pred_times: list[float] = []
    pred_times_all: list[float] = []
    import tempfile

    read_dir = ppath.parent if ppath.parent.is_dir() else None
    tmpd = tempfile.mkdtemp(prefix="inferd-bench-reads.", dir=str(read_dir) if read_dir else None)
    rpath = os.path.join(tmpd, "reads.bin")
    max_read = 64 << 20
    with open(rpath, "wb") as f:
        f.write(np.random.default_rng(0).integers(0, 255, max_read + (1 << 20), dtype=np.uint8).tobytes())
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(rpath, os.O_RDONLY)
    reads_done = 0
    read_probes: list[dict[int, float]] = []
    try:
        # every model is measured in PASSES passes, round robin: on a shared board a disturbance lasting a few
        # seconds would otherwise decide a model's "measured median"; a model's (and each of its layers')
        # measured value is the median of its pass medians
        samples: dict[str, list[Any]] = defaultdict(list)
        # CPU: the speed probe beside each measurement (a daemon keeps the median of its recent ones:
        # probe.SpeedProbe); a model's predictions scale by the machine's speed in the passes it was measured in
        probes: dict[str, list[float]] = defaultdict(list)
        pass_probes: dict[int, list[float]] = defaultdict(list)
        model_passes: dict[str, list[int]] = defaultdict(list)
        ref = None if trainer.gpu else pred.probe_reference(threads)
        per_pass = (deadline - time.monotonic()) * 0.6 / PASSES
        for pas in range(PASSES):
            t_pass = time.monotonic()
            for s in held:
                if time.monotonic() - t_pass > per_pass or (pas and s.name not in samples):
                    continue
                g = trainer.graph(s)
                try:
                    if ref:
                        probes[s.name].append(probe_s(threads))
                        pass_probes[pas].append(probes[s.name][-1])
                        model_passes[s.name].append(pas)
                    samples[s.name].append(measure_model_vulkan(g, cold=pas in (0, 1)) if trainer.gpu
                                           else measure_model_cpu(g, threads, transforms=pas in (0, 1)))
                except Exception as e:
                    print(f"  {s.name}: failed: {type(e).__name__}: {e}", file=sys.stderr)
            print(f"  pass {pas + 1}/{PASSES}: {sum(1 for v in samples.values() if len(v) > pas)} models",
                  file=sys.stderr)
        warmed = False
        for i, s in enumerate(held):
            if s.name not in samples:
                continue
            g = trainer.graph(s)
            if not warmed:  # the first prediction in a process imports and fills module-level caches: not timed
                predict_layers(executed_layers(g, samples[s.name][0].kernels, args.device),
                               PredictedCost(pred, threads=threads, constants=g.constants))
                warmed = True
            ms = samples[s.name][0]
            pass_warm = [m.warm_s for m in samples[s.name]]
            ms.warm_s = float(np.median(pass_warm))
            # cold phases measured twice (passes 1 and 2): the second is the first's noise
            again = samples[s.name][1] if len(samples[s.name]) > 1 and \
                len(samples[s.name][1].layers) == len(ms.layers) else None
            exec_passes: dict[int, list[float]] = {}
            for j, ls in enumerate(ms.layers):
                vals = [m.layers[j].phases["exec"] for m in samples[s.name] if len(m.layers) == len(ms.layers)]
                ls.phases["exec"] = float(np.median(vals))
                exec_passes[j] = vals
            layers = executed_layers(g, ms.kernels, args.device)
            # one whole-model prediction as a planner makes it: fresh cost model (no cached features); five
            # of them, each from scratch, and their median is the model's time: a single ~2 ms timing on the
            # shared board is now and then stretched by a preemption, which says nothing about the predictor
            # the machine's speed in each pass this model was measured in, from every probe of that pass (the
            # median of its ~76 probes, a minute or so: the drift is slow, one probe's noise is not); a model's
            # own 5 probes alone moved its prediction by up to 20% on a run with no drift (76% -> 67% within 10%)
            speed = speed_factor(float(np.median([np.median(pass_probes[k]) for k in model_passes[s.name]])), ref) \
                if model_passes.get(s.name) else 1.0
            ts_pred = []
            for _ in range(PREDICT_REPS):
                if trainer.gpu:
                    dispatch_cache.clear()  # Vulkan: the layers' dispatch geometry derived afresh each time too
                t0 = time.perf_counter()
                cost = PredictedCost(pred, threads=threads, constants=g.constants, speed=speed)
                p = predict_warm(layers, cost)
                ts_pred.append(time.perf_counter() - t0)
            pred_times.append(float(np.median(ts_pred)))
            pred_times_all.extend(ts_pred)
            lp = predict_layers(layers, cost)
            p_level = predict_warm(layers, PredictedCost(pred, threads=threads, constants=g.constants))
            meas = ms.warm_s
            rows.append({"model": s.name, "family": s.family, "measured_ms": meas * 1e3, "predicted_ms": p * 1e3,
                         "err": p / meas - 1, "layers": len(layers), "pass_ms": [w * 1e3 for w in pass_warm],
                         "speed": speed, "probe_ms": [x * 1e3 for x in probes.get(s.name, ())],
                         "predicted_unscaled_ms": p_level * 1e3,
                         "roofline_layers": sum(1 for x in lp if x.source == "roofline"),
                         # where a whole-model error comes from: the units' sum (measured in the model, median
                         # over passes) against its prediction, and the whole model against its units' sum
                         "units_measured_ms": float(sum(ls.phases["exec"] for ls in ms.layers)) * 1e3,
                         "units_predicted_ms": float(sum(x.phases["exec"] for x in lp)) * 1e3,
                         # this model's whole-model prediction time (the median of its timings): which models
                         # set the goal's max, and their unit and signature counts
                         "predict_ms": pred_times[-1] * 1e3,
                         "signatures": len({signature(layer, k) for layer, k in layers})})
            print(f"  [{i + 1}/{len(held)}] {s.name}: measured {meas * 1e3:.2f} ms, predicted {p * 1e3:.2f} ms "
                  f"({(p / meas - 1) * 100:+.1f}%)", file=sys.stderr)
            # the disk now (a few cold reads as the training's table measured them): this model's reads are
            # predicted from the table scaled by it, as a daemon scales them by its last cold loads' reads
            if reads_done < 200:
                cost.read_factors = read_factors(read_probe(read_dir), pred.read_table)
                read_probes.append(dict(cost.read_factors))
            # units: the model's layers measured in it, every phase against the prediction
            for j, ls in enumerate(ms.layers):
                if len(unit_rows) >= args.units * (i + 1) // max(len(held), 1) + 20:
                    break  # spread the unit budget over the models
                row: dict[str, Any] = {"unit": ls.layer.name, "key": f"{ls.layer.op}/{ls.kernel.name}",
                                       "threads": threads, "model": s.name}
                for ph in phases:
                    if ph in ls.phases:
                        c = cost.cost(ls.layer, ls.kernel, ph)
                        row[ph] = {"measured": ls.phases[ph], "predicted": c.seconds, "source": c.source}
                        if ph == "exec" and len(exec_passes.get(j, ())) >= 2:
                            row[ph]["passes"] = exec_passes[j]
                        rep_v = again.layers[j].phases.get(ph) if again is not None else None
                        if ph not in ("exec", "exec_first") and rep_v:
                            row[ph]["repeat"] = rep_v
                if reads_done < 200 and ls.layer.const_inputs:
                    for ph, n in (("read_raw", raw_nbytes(ls.layer)),
                                  ("read_transformed", ls.kernel.transformed_nbytes(ls.layer))):
                        if 0 < n <= max_read:
                            ts = [read_once(fd, rpath, n, (r << 20) % (max_read - n + 1) // 4096 * 4096)
                                  for r in range(2 * READ_REPS)]
                            c = cost.cost(ls.layer, ls.kernel, ph)
                            row[ph] = {"measured": float(np.median(ts[0::2])), "predicted": c.seconds,
                                       "source": c.source, "bytes": n, "repeat": float(np.median(ts[1::2])),
                                       "predicted_unscaled": pred.read_seconds(n)}
                    reads_done += 1
                unit_rows.append(row)
    finally:
        os.close(fd)
        try:
            os.unlink(rpath)
            os.rmdir(tmpd)
        except OSError:
            pass
    # ------------------------------------------------------------------ summaries
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = machine_info()
    day = info["date"][:10]
    stem = f"predictor_{args.device}" + (f"_{args.tag}" if args.tag else "")
    all_phases = phases + ("read_raw", "read_transformed")
    per_phase: dict[str, Any] = {}
    per_kernel: dict[str, dict[str, Any]] = defaultdict(dict)
    pngs = []
    for ph in all_phases:
        sel = [r for r in unit_rows if ph in r]
        if not sel:
            continue
        per_phase[ph] = _stats([r[ph]["predicted"] for r in sel], [r[ph]["measured"] for r in sel])
        per_phase[ph]["roofline"] = sum(1 for r in sel if r[ph]["source"] == "roofline")
        by: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in sel:
            by[r["key"]].append(r)
        for key, rs in sorted(by.items()):
            per_kernel[key][ph] = _stats([r[ph]["predicted"] for r in rs], [r[ph]["measured"] for r in rs])
        png = out / f"{day}_{stem}_scatter_{ph}.png"
        _scatter(png, [r[ph]["predicted"] for r in sel], [r[ph]["measured"] for r in sel], [r["key"] for r in sel],
                 f"{ph} per unit ({args.device}, held-out variants)", 0.2 if ph != "exec" else 0.1)
        pngs.append(png.name)
    whole = _stats([r["predicted_ms"] / 1e3 for r in rows], [r["measured_ms"] / 1e3 for r in rows])
    fam: dict[str, Any] = {}
    for f in sorted({r["family"] for r in rows}):
        rs = [r for r in rows if r["family"] == f]
        fam[f] = _stats([r["predicted_ms"] / 1e3 for r in rs], [r["measured_ms"] / 1e3 for r in rs])
    if rows:
        png = out / f"{day}_{stem}_scatter_models.png"
        _scatter(png, [r["predicted_ms"] / 1e3 for r in rows], [r["measured_ms"] / 1e3 for r in rows],
                 [r["family"] for r in rows], f"whole-model warm ({args.device}, held-out variants)", 0.1)
        pngs.append(png.name)
    cold_units = [r for r in unit_rows if any(ph in r for ph in all_phases if ph not in ("exec", "exec_first"))]
    cold_ok = [all(abs(r[ph]["predicted"] / r[ph]["measured"] - 1) <= 0.2 for ph in all_phases
                   if ph in r and ph not in ("exec", "exec_first")) for r in cold_units]
    cold_phase_pts = [abs(r[ph]["predicted"] / r[ph]["measured"] - 1) <= 0.2 for r in unit_rows for ph in all_phases
                      if ph in r and ph not in ("exec", "exec_first")]
    noise = _noise(rows, unit_rows, all_phases)
    # for reference only (the goal is against the median): against each model's quietest pass, the time with
    # the least disturbance from the rest of the shared board
    quiet = _stats([r["predicted_ms"] / 1e3 for r in rows], [min(r["pass_ms"]) / 1e3 for r in rows])
    # the same predictions at the training's level (no speed probe): what a predictor without one would say
    unscaled = _stats([r["predicted_unscaled_ms"] / 1e3 for r in rows], [r["measured_ms"] / 1e3 for r in rows])
    goals = {
        "whole_model_within10_share": whole.get("within10"),
        "whole_model_goal_met": bool(whole.get("within10", 0) >= 0.95) if rows else None,
        "cold_units_all_phases_within20_share": float(np.mean(cold_ok)) if cold_ok else None,
        "cold_phase_predictions_within20_share": float(np.mean(cold_phase_pts)) if cold_phase_pts else None,
        "cold_goal_met": bool(np.mean(cold_ok) >= 0.9) if cold_ok else None,
        "training_s": pred.info.get("seconds"), "training_goal_met": (pred.info.get("seconds") or 1e9) <= 1200,
        "prediction_ms_median": float(np.median(pred_times) * 1e3) if pred_times else None,
        "prediction_ms_max": float(np.max(pred_times) * 1e3) if pred_times else None,
        "prediction_ms_p95": float(np.quantile(pred_times, 0.95) * 1e3) if pred_times else None,
        "prediction_ms_single_timings_max": float(np.max(pred_times_all) * 1e3) if pred_times_all else None,
        "prediction_ms_single_timings_min": float(np.min(pred_times_all) * 1e3) if pred_times_all else None,
        "prediction_goal_met": bool(np.max(pred_times) <= 5e-3) if pred_times else None,
    }
    data = {"machine": info, "device": args.device, "device_fingerprint": pred.fingerprint, "threads": threads,
            "predictor_file": str(ppath), "predictor_info": pred.info, "overhead": pred.overhead, "reads": pred.reads,
            "loadavg_start": load0, "loadavg_end": list(os.getloadavg()), "bench_s": time.monotonic() - t_start,
            "goals": goals, "noise": noise, "whole_model_vs_quietest_pass": quiet, "whole_model_unscaled": unscaled,
            "probe_reference_ms": {k: v * 1e3 for k, v in (pred.probe.get("reference") or {}).items()},
            "read_probe_factors": [{str(k): v for k, v in d.items()} for d in read_probes],
            "whole_model": whole, "per_family": fam, "models": rows, "per_phase": per_phase,
            "per_kernel": per_kernel, "units": unit_rows, "plots": pngs}
    md = [f"# inferd bench predictor: {args.device}{' (' + args.tag + ')' if args.tag else ''}, {day}", "",
          f"Machine: {info['cpu']} ({info['cores']} cores), host {info['host']}; device fingerprint "
          f"{ {k: v for k, v in pred.fingerprint.items() if k != 'engine'} }; threads {threads}.",
          f"Load average at start {load0[0]:.2f} / end {data['loadavg_end'][0]:.2f} (1 min): other work shared "
          f"the machine.", "",
          f"Predictor: {ppath.name}, trained {pred.info.get('trained')} in {fmt(pred.info.get('seconds'), '.0f')} s "
          f"({pred.info.get('units')} units from {pred.info.get('configurations')} configurations, stopped: {pred.info.get('stopped')}, load average at its end "
          f"{fmt((pred.info.get('loadavg_end') or [None])[0], '.2f')}).",
          "", "## Goals", "",
          "| goal | result | met |", "|---|---|---|",
          f"| whole-model warm within +-10% for >= 95% of held-out variants | {fmt((whole.get('within10') or 0) * 100)}% "
          f"of {whole.get('n', 0)} | {goals['whole_model_goal_met']} |",
          f"| cold phases within +-20% for >= 90% of units (every cold phase of the unit) | "
          f"{fmt((goals['cold_units_all_phases_within20_share'] or 0) * 100)}% of {len(cold_ok)} "
          f"(per prediction: {fmt((goals['cold_phase_predictions_within20_share'] or 0) * 100)}%) | {goals['cold_goal_met']} |",
          f"| training <= 20 min | {fmt(pred.info.get('seconds'), '.0f')} s | {goals['training_goal_met']} |",
          f"| one whole-model prediction <= 5 ms (features included, no cache; per model the median of "
          f"{PREDICT_REPS}, single timings {fmt(goals['prediction_ms_single_timings_min'], '.2f')}-"
          f"{fmt(goals['prediction_ms_single_timings_max'], '.2f')} ms) | median "
          f"{fmt(goals['prediction_ms_median'], '.2f')} ms, p95 {fmt(goals['prediction_ms_p95'], '.2f')} ms, "
          f"max {fmt(goals['prediction_ms_max'], '.2f')} ms | "
          f"{goals['prediction_goal_met']} |", "",
          "Slowest whole-model predictions: " + ", ".join(
              f"{r['model']} {r['predict_ms']:.2f} ms ({r['layers']} units, {r['signatures']} signatures)"
              for r in sorted(rows, key=lambda r: -r["predict_ms"])[:3]) + ".", "",
          "## Measurement noise (the same measurement repeated)", "",
          "The board is a shared 2-core VM: a measurement repeated disagrees with itself. Whole models: "
          f"{PASSES} interleaved passes per model, the measured value is the median of the pass medians; "
          "split-half: the median of passes 1, 3, 5 against that of passes 2, 4 (what a second bench run "
          "could measure). Cold phases: measured twice (transforms in two passes, reads as two medians of "
          f"{READ_REPS})."]
    if ref and unscaled.get("n"):
        sp = [r["speed"] for r in rows]
        md += ["", f"Speed probe (`inferd.predictor.probe`: two small reference networks, ~7 ms a run, measured "
                   f"beside every model pass, a model scaled by its passes' median; a daemon keeps the median of its "
                   f"last five): training reference {ref * 1e3:.3f} ms, "
                   f"this run's speed factors {min(sp):.2f}-{max(sp):.2f} (median {float(np.median(sp)):.2f}). "
                   f"Without it (predictions at the training's level): {unscaled['within10'] * 100:.1f}% within "
                   f"+-10%, mean error {unscaled['mean_err'] * 100:+.1f}%."]
    elif not trainer.gpu:
        md += ["", "No speed probe: the predictor file has no reference (trained before the probe existed)."]
    rd = [r[ph] for r in unit_rows for ph in ("read_raw", "read_transformed") if ph in r]
    if rd and read_probes:
        fs = [f for d in read_probes for f in d.values()]
        un = _stats([x["predicted_unscaled"] for x in rd], [x["measured"] for x in rd])
        sc = _stats([x["predicted"] for x in rd], [x["measured"] for x in rd])
        md += ["", f"Read probe (`probe.read_probe`: cold reads of 4 KB, 64 KB and 1 MB as the training's table "
                   f"measured them, before each model's reads): factors {min(fs):.2f}-{max(fs):.2f} against the "
                   f"table; reads within +-20%: {sc['within20'] * 100:.0f}% scaled, "
                   f"{un['within20'] * 100:.0f}% from the table alone."]
    if quiet.get("n"):
        md += ["", f"For reference, against each model's quietest pass instead of the median of its passes: "
                   f"{quiet['within10'] * 100:.1f}% within +-10% (mean error {quiet['mean_err'] * 100:+.1f}%)."]
    md += ["", "| what | n | repeat within +-10% | repeat within +-20% | median abs deviation |", "|---|---|---|---|---|"]
    for k, v in noise.items():
        if v.get("n"):
            pc = lambda x, f=".0f": "n/a" if x is None else f"{x * 100:{f}}%"  # noqa: E731
            md.append(f"| {k} | {v['n']} | {pc(v['within10'])} | {pc(v['within20'])} | "
                      f"{pc(v['median_abs_dev'], '.1f')} |")
    md += ["", "## Whole models (held-out variants)", "",
          "| family | n | within 5% | within 10% | RMSE ms | median abs err | mean err |", "|---|---|---|---|---|---|---|"]
    for f, st in list(fam.items()) + [("all", whole)]:
        if st.get("n"):
            md.append(f"| {f} | {st['n']} | {st['within5'] * 100:.0f}% | {st['within10'] * 100:.0f}% | "
                      f"{st['rmse_ms']:.3f} | {st['median_abs_err'] * 100:.1f}% | {st['mean_err'] * 100:+.1f}% |")
    md += ["", "Where the whole-model error comes from (per family, means over its models): the sum of the "
           "units' predictions against the sum of their times measured inside the model (unit error), and the "
           "whole model's measured time against that measured sum (what runs between units: the executor's loop, "
           "thread-pool wake-ups; and on a loaded board the preemptions a whole run collects, which each unit's "
           "own median leaves out; predicted by the overhead fitted at training).", "",
           "| family | unit-sum error | measured whole / measured units | predicted whole / predicted units |",
           "|---|---|---|---|"]
    for f in sorted({r["family"] for r in rows}) + ["all"]:
        rs = [r for r in rows if (f == "all" or r["family"] == f) and r.get("units_measured_ms")]
        if rs:
            md.append(f"| {f} | {np.mean([r['units_predicted_ms'] / r['units_measured_ms'] - 1 for r in rs]) * 100:+.1f}% | "
                      f"{np.mean([r['measured_ms'] / r['units_measured_ms'] for r in rs]):.3f} | "
                      f"{np.mean([r['predicted_ms'] / r['units_predicted_ms'] for r in rs]):.3f} |")
    md += ["", "## Units per phase (layers of held-out variants, measured inside them)", "",
           "| phase | n | within 5% | within 10% | within 20% | RMSE ms | median abs err | roofline fallbacks |",
           "|---|---|---|---|---|---|---|---|"]
    for ph, st in per_phase.items():
        md.append(f"| {ph} | {st['n']} | {st['within5'] * 100:.0f}% | {st['within10'] * 100:.0f}% | "
                  f"{st['within20'] * 100:.0f}% | {st['rmse_ms']:.4f} | {st['median_abs_err'] * 100:.1f}% | "
                  f"{st['roofline']} |")
    md += ["", "## Per kernel (warm / transform)", "",
           "| unit | n | warm within 5% | warm within 10% | warm RMSE ms | transform n | transform within 20% |",
           "|---|---|---|---|---|---|---|"]
    for key, d in sorted(per_kernel.items()):
        w = d.get("exec", {"n": 0})
        t = d.get("transform", {"n": 0})
        if not w.get("n"):
            continue
        md.append(f"| {key} | {w['n']} | {w['within5'] * 100:.0f}% | {w['within10'] * 100:.0f}% | {w['rmse_ms']:.4f} | "
                  f"{t.get('n', 0)} | {fmt((t.get('within20') or 0) * 100 if t.get('n') else None, '.0f')}% |")
    md += ["", "Plots: " + ", ".join(pngs), ""]
    jp, mp = write_results(out, stem, data, "\n".join(md))
    print(f"wrote {jp} and {mp}")
    return 0
