"""``inferd info MODEL --predict``: a model's predicted costs per layer, warm and cold, without running it."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..planner.cost import PHASES

#: the cold phases reported per layer (``exec_first`` is the layer's first execution inside a cold load)
COLD_PHASES = ("read_raw", "read_transformed", "transform", "pipeline_empty", "pipeline_filled", "exec_first")


def predict_report(model: str, device: str = "cpu", threads: int | None = None, batch: int = 1,
                   predictor: str | None = None, probe: bool = True) -> dict[str, Any]:
    """Per layer (its planned cold kernel and its warm kernel) the predicted seconds of every phase; the
    whole model's warm latency (sum of units through the fitted overhead) and cold latency (the cold-start
    plan's predicted makespan from these costs). Layers no unit model covers carry ``source: roofline``.
    ``probe``: on the CPU, with a predictor trained with the speed probe, warm times are scaled by the
    machine's speed now (``probe.SpeedProbe``; ``speed`` in the result, 1.0 without)."""
    from .. import native
    from ..package import backend_fingerprint, load_package, make_backend, make_plan
    from ..planner.plan import PlanOptions
    from ..runtime.model import resolve_device
    from . import load_for
    from .cost import PredictedCost, predict_layers, runs_nothing, whole_model_warm
    from .model import Predictor, PredictorFileError

    t0 = time.perf_counter()
    dev = resolve_device(device)
    p = Path(model)
    if p.is_dir():
        graph = load_package(p, device=dev, batch=batch)
    else:
        from ..frontend import import_template, specialize

        graph = specialize(import_template(model, batch=batch))
    backend = make_backend(graph, dev)
    try:
        fp = backend_fingerprint(backend, dev)
        status = "ok"
        pred: Predictor | None
        if predictor is not None:
            try:
                pred = Predictor.load(predictor, current=fp)
            except PredictorFileError as e:
                pred, status = None, f"not used: {e}"
        else:
            pred = load_for(dev, fp)
            if pred is None:
                from ..config import predictor_path

                status = (f"no valid predictor at {predictor_path(dev)} (missing, damaged or stale; "
                          f"'inferd predictor train --device {dev}'): roofline estimates")
        gpu = dev != "cpu"
        nthreads = 1 if gpu else int(threads or native.num_threads())
        if pred is None:
            # the flagged fallback: an empty predictor answers every unit from the roofline
            pred = Predictor(dev, dict(fp), "", {})
        speed, probe_ms = 1.0, 0.0
        ref = pred.probe_reference(nthreads) if probe and not gpu else None
        if ref:
            from .probe import SpeedProbe

            tp = time.perf_counter()
            speed = SpeedProbe(ref, nthreads).speed()
            probe_ms = (time.perf_counter() - tp) * 1e3
        cost = PredictedCost(pred, threads=nthreads, constants=graph.constants, speed=speed)
        entries = backend.candidates()
        plan = make_plan(backend, entries, None, PlanOptions(), None, predictor=pred, constants=graph.constants)
        kern = {e[0].name: {k.name: k for k in e[1]} for e in entries}
        layers = [e[0] for e in entries]
        warm_pairs = []
        cold_pairs = []
        for layer, lp in zip(layers, plan.layers):
            ks = kern[layer.name]
            cold_pairs.append((layer, ks.get(lp.kernel) or next(iter(ks.values()))))
            warm_pairs.append((layer, ks.get(lp.warm_kernel or lp.kernel) or cold_pairs[-1][1]))
        warm = predict_layers(warm_pairs, cost, ("exec",))
        cold = predict_layers(cold_pairs, cost, COLD_PHASES)
        executed = [i for i, (layer, k) in enumerate(warm_pairs) if not runs_nothing(layer, k, gpu)]
        warm_s = whole_model_warm(pred, [warm[i] for i in executed], len(executed))
        out_layers = []
        for i, (layer, lp) in enumerate(zip(layers, plan.layers)):
            d: dict[str, Any] = {"name": layer.name, "op": layer.op, "kernel": lp.kernel,
                                 "warm_kernel": warm_pairs[i][1].name, "source": warm[i].source,
                                 "warm_ms": warm[i].phases["exec"] * 1e3, "read_source": lp.source}
            for ph in COLD_PHASES:
                d[f"{ph}_ms"] = cold[i].phases[ph] * 1e3
            out_layers.append(d)
        return {"model": str(model), "device": dev, "threads": nthreads, "predictor": status, "speed": speed,
                "speed_probe_ms": probe_ms,
                "warm_ms": warm_s * 1e3, "cold_ms": plan.predicted_s * 1e3,
                "cold_serial_ms": sum(sum(c.phases[ph] for ph in COLD_PHASES if not ph.startswith(("read_transformed",
                                      "pipeline_empty"))) for c in cold) * 1e3,
                "roofline_layers": sum(1 for w in warm if w.source == "roofline"),
                "extrapolated_layers": sum(1 for w in warm if w.source == "extrapolated"),
                "layers": out_layers, "phases": list(PHASES), "predict_ms": (time.perf_counter() - t0) * 1e3}
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            close()


def format_report(r: dict[str, Any]) -> str:
    lines = [f"{r['model']} on {r['device']} ({r['threads']} threads): predicted warm {r['warm_ms']:.2f} ms, "
             f"cold {r['cold_ms']:.1f} ms (planned; {r['cold_serial_ms']:.1f} ms one phase after another); "
             f"predictor: {r['predictor']}" + (f"; machine speed now x{r['speed']:.2f} of its training (probe)"
                                                if r.get("speed", 1.0) != 1.0 else ""),
             f"{'layer':<40} {'op':<18} {'kernel':<14} {'warm ms':>9} {'read ms':>8} {'xform ms':>9} "
             f"{'pipe ms':>8} {'first ms':>9}  source"]
    for d in r["layers"]:
        read = d["read_transformed_ms"] if d["read_source"] == "transformed" else d["read_raw_ms"]
        lines.append(f"{d['name'][-40:]:<40} {d['op']:<18} {d['kernel']:<14} {d['warm_ms']:>9.3f} {read:>8.3f} "
                     f"{d['transform_ms']:>9.3f} {d['pipeline_filled_ms']:>8.3f} {d['exec_first_ms']:>9.3f}  "
                     f"{d['source']}")
    return "\n".join(lines)
