"""The latency predictor: its file (round trip, damage, staleness), coverage of every op (trained or flagged
roofline, never zero), adaptive sampling on a cost function with a known spike, and the cold planner
working from predictions alone (a model with no profile gets a valid plan, loads by it and runs right).

A small real predictor is trained once per module from two tiny variants measured on this machine (a few
seconds); nothing here checks accuracy, which is the benchmark's business (``inferd bench predictor``).
"""
from __future__ import annotations

import json
import logging
import struct
import time

import numpy as np
import pytest

pytest.importorskip("sklearn")

from inferd import __version__  # noqa: E402
from inferd.ops.base import applicable_kernels, registered_ops, single_node_layer  # noqa: E402
from inferd.predictor import load_for  # noqa: E402
from inferd.predictor.cost import (PredictedCost, predict_arrays, predict_layers, predict_warm,  # noqa: E402
                                   runs_nothing, whole_model_warm)
from inferd.predictor.model import (Predictor, PredictorFileError, StalePredictorError, Trees,  # noqa: E402
                                    check_current)
from inferd.predictor.sampling import adaptive_sample  # noqa: E402
from inferd.predictor.train import (Trainer, executed_layers, fingerprint_for, fit_overhead,  # noqa: E402
                                   stratified)
from inferd.zoo._variants import VariantSpec, build_variant, variant_specs  # noqa: E402

TINY = [VariantSpec("resnet", 0.25, 64, 0.5, 3), VariantSpec("mobilenetv2", 0.25, 64, 0.5, 5),
        VariantSpec("squeezenet", 0.25, 64, 0.5, 3)]


@pytest.fixture(scope="module")
def trained() -> tuple[Predictor, Trainer]:
    tr = Trainer("cpu", threads=[1])
    for s in TINY:
        assert tr.measure((s, 1), alternative=True) is not None
    models = tr.fit(n_trees=20)
    pred = tr.predictor(models, fingerprint_for("cpu"), {}, {"per_read_s": 1e-4, "disk_bw": 5e8}, {"test": True})
    pred.read_table = [(4096, 6e-5), (65536, 1.5e-4), (1 << 20, 1.6e-3)]
    pred.overhead = fit_overhead([(w, tr.unit_sum(models, sigs), n) for w, sigs, n in tr.models.values()])
    return pred, tr


# ------------------------------------------------------------------------------------------ the file

def test_round_trip_gives_identical_predictions(trained: tuple[Predictor, Trainer], tmp_path) -> None:
    pred, tr = trained
    path = pred.save(tmp_path / "cpu.ipred")
    back = Predictor.load(path, current=fingerprint_for("cpu"))
    assert set(back.models) == set(pred.models)
    assert any(m.trees is not None for m in back.models.values())  # the trees travel, not just the base
    X = np.stack(list(tr.feats.values()))
    for key, m in pred.models.items():
        assert np.array_equal(m.predict(X), back.models[key].predict(X)), key
    assert back.overhead == pred.overhead and back.reads == pred.reads and back.read_table == pred.read_table
    assert back.to_bytes() == pred.to_bytes()  # deterministic: same predictor, same bytes


def test_exported_trees_equal_sklearn() -> None:
    from sklearn.ensemble import GradientBoostingRegressor

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 10, (300, 5)).astype(np.float32)
    y = np.sin(X[:, 0]) + (X[:, 1] > 5) * 2.0 + 0.1 * X[:, 2]
    gb = GradientBoostingRegressor(n_estimators=30, max_depth=3, random_state=0).fit(X, y)
    init = float(gb.init_.predict(X[:1]).reshape(-1)[0])
    t = Trees.from_sklearn([e[0] for e in gb.estimators_], gb.learning_rate, init, 3)
    assert np.allclose(t.predict(X.astype(np.float64)), gb.predict(X), rtol=0, atol=1e-9)


def test_damaged_truncated_and_foreign_files_are_refused(trained: tuple[Predictor, Trainer], tmp_path) -> None:
    pred, _ = trained
    data = pred.to_bytes()
    cases = {
        "flipped": data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0x40]) + data[len(data) // 2 + 1:],
        "truncated": data[:len(data) - 17],
        "header only": data[:20],
        "empty": b"",
        "magic": b"NOTAPRED" + data[8:],
        "version": data[:8] + struct.pack("<I", 99) + data[12:],
    }
    for what, bad in cases.items():
        with pytest.raises(PredictorFileError):
            Predictor.from_bytes(bad, what)
        p = tmp_path / f"{what.replace(' ', '_')}.ipred"
        p.write_bytes(bad)
        assert load_for("cpu", fingerprint_for("cpu"), p) is None, what  # reported and never used


def test_stale_predictor_is_reported_not_used(trained: tuple[Predictor, Trainer], tmp_path) -> None:
    pred, _ = trained
    fp = fingerprint_for("cpu")
    check_current(pred, fp)  # valid here
    other_cpu = Predictor(pred.device, {**pred.fingerprint, "cpu": "Some Other CPU"}, pred.engine, pred.models)
    other_engine = Predictor(pred.device, pred.fingerprint, "0.0.1", pred.models)
    for stale in (other_cpu, other_engine):
        with pytest.raises(StalePredictorError):
            check_current(stale, fp)
        p = stale.save(tmp_path / "stale.ipred")
        seen: list[str] = []
        handler = logging.Handler(logging.WARNING)
        handler.emit = lambda rec: seen.append(rec.getMessage())  # type: ignore[method-assign]
        lg = logging.getLogger("inferd.predictor")
        lg.addHandler(handler)  # the suite's other tests configure logging: listen on the logger itself
        try:
            assert load_for("cpu", fp, p) is None
        finally:
            lg.removeHandler(handler)
        assert any("trained for another device or engine" in m for m in seen), seen
    # another thread count is not another device: threads is a feature
    assert load_for("cpu", {**fp, "threads": "7"}, pred.save(tmp_path / "ok.ipred")) is not None
    assert __version__ == pred.engine


def test_a_file_of_the_previous_format_version_is_refused(trained: tuple[Predictor, Trainer], tmp_path) -> None:
    """Version 1 files carried a shorter feature list: read with this engine's, every model would be misread."""
    from inferd.predictor.model import FORMAT_VERSION

    pred, _ = trained
    data = pred.to_bytes()
    old = data[:8] + struct.pack("<I", FORMAT_VERSION - 1) + data[12:]
    with pytest.raises(PredictorFileError, match="format version"):
        Predictor.from_bytes(old, "old")
    p = tmp_path / "old.ipred"
    p.write_bytes(old)
    assert load_for("cpu", fingerprint_for("cpu"), p) is None


def test_reads_follow_the_measured_table(trained: tuple[Predictor, Trainer]) -> None:
    pred, _ = trained
    t = pred.read_table
    for n, s in t:  # at a measured size: the measurement
        assert pred.read_seconds(n) == pytest.approx(s, rel=1e-9)
    # between sizes: between their times (log-log), not the linear model's answer
    mid = pred.read_seconds(16384)
    assert t[0][1] < mid < t[1][1]
    assert mid != pytest.approx(pred.reads["per_read_s"] + 16384 / pred.reads["disk_bw"], rel=1e-3)
    # beyond the table: its last point plus the bandwidth; below it: never zero, never above the first point
    big = 8 << 20
    assert pred.read_seconds(big) == pytest.approx(t[-1][1] + (big - t[-1][0]) / pred.reads["disk_bw"])
    assert 0 < pred.read_seconds(100) <= t[0][1]
    assert pred.read_seconds(0) == 0.0
    # no table (an older predictor's reads): the linear model
    bare = Predictor("cpu", {}, __version__, {}, reads={"per_read_s": 1e-4, "disk_bw": 1e9})
    assert bare.read_seconds(1e6) == pytest.approx(1e-4 + 1e-3)


def test_read_windows_pooled_ignore_one_disturbed_window() -> None:
    from inferd.predictor.measure import ReadModel, pool_reads

    def window(scale: float) -> ReadModel:
        t = {n: [scale * (5e-5 + n / 1e9)] * 11 for n in (4096, 65536, 1 << 20)}
        return ReadModel(0.0, 0.0, [], t)

    quiet, disturbed = window(1.0), window(40.0)  # another process's reads queued ours in one window
    r = pool_reads([quiet, disturbed, window(1.0)])
    assert [n for n, _ in r.samples] == [4096, 65536, 1 << 20]
    for n, s in r.samples:
        assert s == pytest.approx(5e-5 + n / 1e9)
    assert r.disk_bw == pytest.approx(1e9, rel=1e-6) and r.per_read_s == pytest.approx(5e-5, rel=1e-6)


def test_overhead_fit_recovers_known_terms_and_stays_non_negative() -> None:
    rng = np.random.default_rng(0)
    units = rng.uniform(1e-3, 3e-2, 40)
    steps = rng.integers(10, 120, 40)
    meas = [(1.1 * u + 4e-6 * n + 2e-4, u, int(n)) for u, n in zip(units, steps)]
    o = fit_overhead(meas)
    assert o["scale"] == pytest.approx(1.1, rel=1e-3)
    assert o["per_step_s"] == pytest.approx(4e-6, rel=1e-2) and o["per_run_s"] == pytest.approx(2e-4, rel=1e-2)
    # models that run faster than their units' sum: the fit lowers the scale, it does not invent negative steps
    o2 = fit_overhead([(0.9 * u, u, int(n)) for u, n in zip(units, steps)])
    assert o2["per_step_s"] >= 0 and o2["per_run_s"] >= 0 and o2["scale"] == pytest.approx(0.9, rel=1e-3)


def test_overhead_in_two_parts_keeps_a_constant_gap_apart_from_the_units_bias() -> None:
    from inferd.predictor.train import fit_overhead_parts

    rng = np.random.default_rng(1)
    units = rng.uniform(2e-4, 1.5e-3, 30)  # measured unit sums (the H100's range)
    steps = rng.integers(13, 116, 30)
    # whole = units + 0.18 ms per run (no per-step part); the unit models predict 10% short of the measured sums
    rows = [(u + 1.8e-4, u, u / 1.1, int(n)) for u, n in zip(units, steps)]
    o = fit_overhead_parts(rows)
    assert o["per_run_s"] == pytest.approx(1.8e-4, rel=1e-2) and o["per_step_s"] == pytest.approx(0, abs=1e-9)
    assert o["unit_scale"] == pytest.approx(1.1, rel=1e-6) and o["scale"] == pytest.approx(1.1, rel=1e-2)
    for u, n in zip(units[:5], steps[:5]):  # held-out models of every size come out right
        pred = o["scale"] * (u / 1.1) + o["per_step_s"] * n + o["per_run_s"]
        assert pred == pytest.approx(u + 1.8e-4, rel=1e-2)
    # without measured unit sums: the joint fit on predicted sums
    assert fit_overhead_parts([(w, None, p, n) for w, _m, p, n in rows]) == fit_overhead(
        [(w, p, n) for w, _m, p, n in rows])


def test_signature_names_the_work_not_the_fused_nodes() -> None:
    """Two fused layers that differ only in which nodes a fusion folded in (``_absorbed``) are one unit: a model's
    repeated blocks share their derived features; an attribute the kernel reads still tells units apart."""
    from inferd.ops.base import kernels_for
    from inferd.predictor.features import signature

    x = np.zeros((1, 8, 6, 6), np.float32)
    w = np.zeros((8, 8, 3, 3), np.float32)
    base = {"pads": [1, 1, 1, 1], "strides": [1, 1], "act": ("Relu", ())}
    a = single_node_layer("Conv", [x, w], {**base, "_absorbed": ["/block1/relu"]}, name="c1")
    b = single_node_layer("Conv", [x, w], {**base, "_absorbed": ["/block7/bn", "/block7/relu"]}, name="c7")
    plain = single_node_layer("Conv", [x, w], base, name="c0")
    other = single_node_layer("Conv", [x, w], {**base, "act": ("Clip", (0.0, 6.0))}, name="c2")
    k = kernels_for("Conv", "cpu")[0]
    assert signature(a, k) == signature(b, k) == signature(plain, k)
    assert signature(other, k) != signature(a, k)


def test_fast_whole_model_path_equals_the_per_layer_one(trained: tuple[Predictor, Trainer]) -> None:
    from inferd.frontend import import_template, specialize
    from inferd.runtime.cpu import CpuExecutor

    from inferd.predictor.features import signature

    pred, _ = trained
    repeated = 0
    for spec in TINY:
        g = specialize(import_template(build_variant(spec)))
        ex = CpuExecutor(g)
        kern = {s.layer.name: s.kernel.name for s in ex.steps if s is not None and not s.alias}
        layers = executed_layers(g, kern, "cpu")
        # (units of one signature are predicted once and spread back: the per-layer path below checks that too)
        repeated += len({signature(layer, k) for layer, k in layers}) < len(layers)
        cost = PredictedCost(pred, threads=1, constants=g.constants)
        vals, roof = predict_arrays(layers, cost, ("exec", "transform"))
        lp = predict_layers(layers, PredictedCost(pred, threads=1, constants=g.constants), ("exec", "transform"))
        single = [PredictedCost(pred, threads=1).cost(layer, k, "exec").seconds for layer, k in layers]
        assert np.allclose(vals["exec"], [x.phases["exec"] for x in lp], rtol=1e-12)
        assert np.allclose(vals["exec"], single, rtol=1e-9)  # the planners' one-unit path agrees
        assert (vals["exec"] > 0).all() and not roof.any()
        assert predict_warm(layers, cost) == pytest.approx(whole_model_warm(pred, lp, len(layers)), rel=1e-12)
    assert repeated  # a model with repeated blocks among them


# ------------------------------------------------------------------------------------------ coverage

def _op_layers() -> list:
    """A layer of every registered op that can be built from small float tensors (most can), plus the layers of
    the tiny variants."""
    out = []
    x = np.random.default_rng(0).standard_normal((1, 4, 6, 6)).astype(np.float32)
    for op in sorted(registered_ops()):
        for ins, attrs in (([x], {}), ([x, x], {}), ([x, x, x], {})):
            try:
                layer = single_node_layer(op, ins, attrs, const=[False] * len(ins))
            except Exception:
                continue
            if applicable_kernels(layer, "cpu"):
                out.append(layer)
                break
    return out


def test_every_op_gets_a_nonzero_flagged_prediction(trained: tuple[Predictor, Trainer]) -> None:
    pred, _ = trained
    from inferd.frontend import import_template, specialize
    from inferd.runtime.cpu import candidate_kernels

    cost = PredictedCost(pred, threads=1)
    layers = _op_layers()
    assert len({layer.op for layer in layers}) >= 40  # most of the engine's ops are covered by this construction
    for s in TINY:
        g = specialize(import_template(build_variant(s)))
        from inferd.ops.base import Layer

        layers += [Layer.of(n, g) for n in g.nodes]
    sources = set()
    for layer in layers:
        for k in candidate_kernels(layer, "cpu", None, False)[0]:
            for phase in ("exec", "exec_first", "exec_cold"):
                c = cost.cost(layer, k, phase)
                assert c.seconds > 0, (layer.op, k.name, phase)
                assert c.source in ("predicted", "extrapolated", "roofline")
                sources.add(c.source)
                # a unit model of this op, or the kernel's model from other ops (flagged), or neither
                own = pred.get(f"{layer.op}/{k.name}", "exec") is not None
                if c.source == "extrapolated":
                    assert not own and pred.get(f"*/{k.name}", "exec") is not None, (layer.op, k.name)
                elif c.source == "predicted":  # its own model, or a unit that runs nothing (a Dropout)
                    assert own or runs_nothing(layer, k, False), (layer.op, k.name)
            for phase in ("read_raw", "read_transformed", "transform", "pipeline_empty", "pipeline_filled"):
                c = cost.cost(layer, k, phase)
                assert c.seconds >= 0 and np.isfinite(c.seconds)
                if phase == "read_raw" and layer.const_inputs:
                    assert c.seconds > 0
    # trained units answer from their models, the rest say so: an op the training never ran with a kernel it
    # did (a MatMul through the Gemm classifiers' GEMM kernels) is "extrapolated"
    assert sources == {"predicted", "extrapolated", "roofline"}
    # the per-layer report (`inferd info --predict`) flags each unit as the planner's cost model does
    pairs = [(layer, k) for layer in layers for k in candidate_kernels(layer, "cpu", None, False)[0]]
    assert [lp.source for lp in predict_layers(pairs, cost)] == [cost.cost(la, k, "exec").source for la, k in pairs]
    # a unit with no model at all: the roofline at measured rates, flagged
    empty = PredictedCost(Predictor("cpu", {}, __version__, {}), threads=1)
    conv = next(layer for layer in layers if layer.op == "Conv")
    k = candidate_kernels(conv, "cpu", None, False)[1]
    c = empty.cost(conv, k, "exec")
    assert c.source == "roofline" and c.seconds > 0


def test_only_a_units_own_model_chooses_its_warm_kernel_over_the_default() -> None:
    """The warm kernel differs from the engine's default only where costs were measured or predicted by a
    model of the layer's own op: an extrapolated prediction (the kernel's model trained on other ops) ranks
    nothing. It did: vit_tiny's attention projections took the unpacked GEMM at 3x the packed one's time."""
    from inferd.planner.cold import cold_layers
    from inferd.planner.cost import Cost

    x = np.zeros((1, 197, 192), np.float32)
    w = np.zeros((192, 192), np.float32)
    layer = single_node_layer("MatMul", [x, w], {}, const=[False, True])
    kernels = applicable_kernels(layer, "cpu")
    assert len(kernels) >= 2
    default, other = kernels[0], kernels[1]

    class Fake:
        def __init__(self, source: str) -> None:
            self.source = source

        def cost(self, layer, kernel, phase):  # the other kernel looks 3x faster
            s = 1e-4 if kernel.name == other.name else 3e-4
            return Cost(s if phase.startswith("exec") else 0.0, self.source)

    for source, want in (("extrapolated", default.name), ("roofline", default.name), ("predicted", other.name),
                         ("profiled", other.name)):
        got = cold_layers([(layer, kernels, default)], Fake(source))[0].warm_kernel
        assert got == want, (source, got)


def test_whole_model_prediction_is_sum_of_units_through_overhead(trained: tuple[Predictor, Trainer]) -> None:
    pred, tr = trained
    from inferd.frontend import import_template, specialize
    from inferd.predictor.measure import measure_model_cpu

    g = specialize(import_template(build_variant(TINY[0])))
    ms = measure_model_cpu(g, 1, transforms=False)
    layers = executed_layers(g, ms.kernels, "cpu")
    lp = predict_layers(layers, PredictedCost(pred, threads=1, constants=g.constants))
    assert len(lp) == len(layers) and all(x.phases["exec"] > 0 for x in lp)
    s = sum(x.phases["exec"] for x in lp)
    o = pred.overhead
    assert whole_model_warm(pred, lp, len(layers)) == pytest.approx(
        max(o["scale"] * s + o["per_step_s"] * len(layers) + o["per_run_s"], 0.5 * s))


# ------------------------------------------------------------------------------------------ speed probe

def test_training_records_a_probe_per_configuration_and_keeps_the_callers_threads(
        trained: tuple[Predictor, Trainer]) -> None:
    from inferd import native
    from inferd.predictor.probe import probe_s

    _pred, tr = trained
    assert len(tr.probes[1]) == len(TINY) and all(p > 0 for p in tr.probes[1])
    assert set(tr.model_probe) == set(tr.models)
    before = native.num_threads()
    other = 1 if before != 1 else 2
    assert probe_s(other, runs=2) > 0
    assert native.num_threads() == before


def test_samples_are_rescaled_to_the_training_reference_warm_phases_only() -> None:
    tr = Trainer("cpu", threads=[1])
    sig = "1|unit"
    tr.units[sig] = ("Conv", "im2col", 1)
    tr.probes[1] = [1.0, 1.0, 1.0]  # the reference level: 1.0
    # a sample measured while the machine ran at half speed (probe 2.0) took twice as long: the same unit
    tr.samples[sig] = [{"exec": 1.0, "transform": 0.5, "_probe": 1.0}, {"exec": 2.0, "transform": 1.0, "_probe": 2.0},
                       {"exec": 2.2, "transform": 1.1, "_probe": 2.0}]
    assert tr.value(sig, "exec") == pytest.approx(1.0)
    assert tr.value(sig, "transform") == pytest.approx(1.0)  # cold phases as measured (median)
    tr.models["m@t1"] = (4.0, [sig], 1)
    tr.model_probe["m@t1"] = 2.0
    assert tr.warm("m@t1") == pytest.approx(2.0)


def test_speed_scales_the_warm_phases_and_travels_in_the_file(trained: tuple[Predictor, Trainer], tmp_path) -> None:
    import dataclasses

    from inferd.frontend import import_template, specialize
    from inferd.predictor.probe import REFERENCE, speed_factor

    pred, _tr = trained
    p = dataclasses.replace(pred, probe={"reference": {"1": 0.002}, "spec": [list(r) for r in REFERENCE]},
                            _banks={})
    back = Predictor.load(p.save(tmp_path / "p.ipred"))
    assert back.probe_reference(1) == 0.002 and back.probe_reference(2) is None
    assert dataclasses.replace(back, probe={"reference": {"1": 0.002}, "spec": [["vgg", 1, 1, 1, 1]]}
                               ).probe_reference(1) is None  # another reference network: no scaling
    assert pred.probe_reference(1) is None  # trained without a probe: predictions stay at its level
    g = specialize(import_template(build_variant(TINY[1])))
    layers = executed_layers(g, _defaults(g), "cpu")
    base, _ = predict_arrays(layers, PredictedCost(back, threads=1, constants=g.constants), ("exec", "transform"))
    slow, _ = predict_arrays(layers, PredictedCost(back, threads=1, constants=g.constants, speed=1.5),
                             ("exec", "transform"))
    assert np.allclose(slow["exec"], 1.5 * base["exec"], rtol=1e-9)
    assert np.array_equal(slow["transform"], base["transform"])
    one = PredictedCost(back, threads=1, speed=1.5).cost(layers[0][0], layers[0][1], "exec").seconds
    assert one == pytest.approx(slow["exec"][0], rel=1e-9)
    assert speed_factor(0.004, 0.002) == 2.0 and speed_factor(None, 0.002) == 1.0
    assert speed_factor(1.0, 0.002) == 4.0  # a preempted probe is clamped, not believed


def test_speed_probe_keeps_the_median_of_its_recent_probes(monkeypatch) -> None:
    import inferd.predictor.probe as probe

    seq = iter([2e-3, 2e-3, 9e-3, 2e-3, 4e-3, 4e-3, 4e-3, 4e-3])
    monkeypatch.setattr(probe, "probe_s", lambda threads, runs=probe.PROBE_RUNS: next(seq))
    sp = probe.SpeedProbe(1e-3, threads=2, max_age_s=0.0, keep=3)
    got = [sp.speed() for _ in range(8)]
    assert got[:3] == [2.0, 2.0, 2.0]  # one disturbed probe (9 ms) does not move it
    assert got[-1] == 4.0  # a lasting change does, once it is most of the recent probes
    assert probe.SpeedProbe(None, threads=2).speed() == 1.0  # no reference: nothing is timed
    cached = probe.SpeedProbe(1e-3, threads=2, max_age_s=3600.0)
    seq = iter([3e-3])
    assert cached.speed() == 3.0 and cached.speed() == 3.0  # a recent probe is reused, not retaken


def test_read_probe_factors_scale_the_table_by_size(trained: tuple[Predictor, Trainer], tmp_path) -> None:
    from inferd.predictor.probe import READ_PROBE_SIZES, read_factors, read_probe

    pred, _ = trained
    table = [(1 << 12, 5e-5), (1 << 16, 1e-4), (1 << 20, 1e-3)]
    f = read_factors({1 << 12: 1e-4, 1 << 16: 1e-4, 1 << 20: 5e-4, 1 << 13: 1.0}, table)
    assert f == {1 << 12: 2.0, 1 << 16: 1.0, 1 << 20: 0.5}  # a size the table lacks is left out
    assert read_factors({}, table) == {} and read_factors({4096: 1e-4}, []) == {}
    for n, k in ((1 << 12, 2.0), (1 << 14, 1.5), (1 << 16, 1.0), (1 << 18, 0.75), (1 << 20, 0.5), (1 << 24, 0.5),
                 (64, 2.0)):
        assert pred.read_seconds(n, f) == pytest.approx(pred.read_seconds(n) * k, rel=1e-9), n
    lay = single_node_layer("Conv", [np.zeros((1, 8, 8, 8), np.float32), np.zeros((16, 8, 3, 3), np.float32)],
                            {"pads": [1, 1, 1, 1]})
    k = applicable_kernels(lay, "cpu")[0]
    c1 = PredictedCost(pred, threads=1).cost(lay, k, "read_raw").seconds
    c2 = PredictedCost(pred, threads=1, read_factors=f).cost(lay, k, "read_raw").seconds
    assert c2 != c1 and c2 == pytest.approx(pred.read_seconds(16 * 8 * 9 * 4, f), rel=1e-9)
    got = read_probe(tmp_path)  # real cold reads on this disk: every size, each a positive time
    assert sorted(got) == list(READ_PROBE_SIZES) and all(t > 0 for t in got.values())
    assert list(tmp_path.iterdir()) == []  # its scratch file is gone


def _defaults(g) -> dict[str, str]:
    from inferd.runtime.cpu import CpuExecutor

    ex = CpuExecutor(g)
    return {s.layer.name: s.kernel.name for s in ex.steps if s is not None and not s.alias}


# ------------------------------------------------------------------------------------------ sampling

def test_adaptive_sampling_adds_points_where_the_error_is_largest() -> None:
    spike_at, width = 0.7, 0.02

    def cost(x: float) -> float:  # flat, with one narrow spike a coarse sample misses
        return 1.0 + 20.0 * np.exp(-((x - spike_at) / width) ** 2)

    def fit(xs: list[float], ys: list[float]):
        order = np.argsort(xs)
        xa, ya = np.asarray(xs)[order], np.asarray(ys)[order]
        return lambda q: np.interp(np.asarray(q, dtype=float), xa, ya)

    def perturb(x: float, rng: np.random.Generator) -> float:
        return float(np.clip(x + rng.normal(0, 0.02), 0, 1))

    pool = list(np.random.default_rng(3).uniform(0, 1, 400))
    res = adaptive_sample(pool, cost, fit, perturb, initial=12, val=60, per_round=20, neighbours=4, explore=0.2,
                          max_rounds=8, patience=8, seed=1)
    refined = np.array([x for _r, x in res.refined])
    assert len(refined) >= 40
    near = np.abs(refined - spike_at) <= 0.1
    # a uniform draw puts 20% of its points within +-0.1 of the spike; refinement must put most there
    assert near.mean() >= 0.6, near.mean()
    assert res.rounds[-1].val_error < 0.5 * res.rounds[0].val_error
    # and the first round's worst validation points were the ones at the spike
    worst = [res.val[i] for i in res.rounds[0].added_near]
    assert np.all(np.abs(np.asarray(worst) - spike_at) <= 0.1)


def test_variants_are_many_and_split_stably() -> None:
    specs = variant_specs(240)
    assert len(specs) == 240 and len({s.name for s in specs}) == 240
    assert len({s.family for s in specs}) >= 5
    held = [s for s in specs if s.held_out]
    assert 0.2 * len(specs) <= len(held) <= 0.4 * len(specs)
    assert {s.name for s in variant_specs(120) if s.held_out} <= {s.name for s in held}  # a name decides
    m = build_variant(specs[3])
    assert m.graph.input[0].type.tensor_type.shape.dim[2].dim_value == specs[3].resolution


def test_training_order_spreads_every_prefix_over_families_and_widths() -> None:
    pool = [(s, 2) for s in variant_specs(240) if not s.held_out]
    order = stratified(pool, np.random.default_rng(0))
    assert sorted(s.name for s, _t in order) == sorted(s.name for s, _t in pool)  # a reordering, nothing lost
    fams = {s.family for s, _t in pool}
    # each run of one configuration per family holds every family (while every family has some left)
    first = [s.family for s, _t in order[:3 * len(fams)]]
    assert all(set(first[i:i + len(fams)]) == fams for i in range(0, len(first), len(fams)))
    # a family's first configurations are as many widths as it has (random order would repeat some)
    for fam in fams:
        widths = {s.width for s, _t in pool if s.family == fam}
        mine = [s.width for s, _t in order if s.family == fam][:len(widths)]
        assert set(mine) == widths, fam
    # and the order is the seed's
    assert [s.name for s, _t in stratified(pool, np.random.default_rng(0))] == [s.name for s, _t in order]
    assert [s.name for s, _t in stratified(pool, np.random.default_rng(1))] != [s.name for s, _t in order]


def test_vit_variants_train_the_transformer_units() -> None:
    """The convolutional families have no MatMul, LayerNorm or Softmax: a predictor trained on them priced
    vit_tiny's layers from other ops' models. A vit variant is vit_tiny's graph at another size; it matches
    onnxruntime and its measurement records those units."""
    import onnxruntime as ort

    from inferd.frontend import import_template, specialize
    from inferd.runtime.cpu import CpuExecutor
    from inferd.zoo._variants import vit_config

    spec = VariantSpec("vit", 0.25, 64, 0.5, 5)
    c = vit_config(spec)
    assert (c.embed, c.heads, c.depth, c.mlp, c.tokens) == (64, 1, 6, 128, 17)
    m = build_variant(spec)
    x = np.random.default_rng(0).standard_normal(spec.input_shape).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    got = CpuExecutor(specialize(import_template(m))).run({"input": x})["output"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert sum(s.family == "vit" for s in variant_specs(240)) >= 30
    tr = Trainer("cpu", threads=[1])
    assert tr.measure((spec, 1), alternative=False) is not None
    ops = {op for op, _k, _t in tr.units.values()}
    assert {"MatMul", "LayerNormalization", "Softmax"} <= ops, ops


# ------------------------------------------------------------------------------------------ planners

def test_cold_planner_plans_from_predictions_alone(trained: tuple[Predictor, Trainer], tmp_path,
                                                   monkeypatch) -> None:
    """A model with no profile gets a valid cold plan from the predictor, loads by it and runs correctly."""
    pred, _ = trained
    from inferd.frontend import import_template, specialize
    from inferd.package import compile_model, make_backend, make_plan, read_plan
    from inferd.planner.plan import PlanOptions
    from inferd.runtime.cpu import CpuExecutor

    import inferd

    spec = VariantSpec("mobilenetv2", 0.35, 64, 0.5, 3)
    g = specialize(import_template(build_variant(spec)))
    backend = make_backend(g, "cpu")
    entries = backend.candidates()
    plan = make_plan(backend, entries, None, PlanOptions(), 2, predictor=pred, constants=g.constants)
    assert [lp.name for lp in plan.layers] == [n.name for n in g.nodes]
    for (layer, kernels, _d), lp in zip(entries, plan.layers):
        assert lp.kernel in {k.name for k in kernels}
        assert lp.source in ("raw", "transformed", "none")
        assert lp.exec_s > 0
        assert lp.exec_end_s - lp.exec_s >= lp.ready_s - 1e-12  # executes after its preparation
    assert plan.predicted_s > 0 and plan.warm_s > 0
    roof = make_plan(backend, entries, None, PlanOptions(), 2)
    assert plan.predicted_s != roof.predicted_s  # the predictor's costs, not the roofline's
    # through the package path: compiled without profiling, the plan records predicted costs
    monkeypatch.setenv("INFERD_PREDICTOR_DIR", str(tmp_path / "pred"))
    pred.save(tmp_path / "pred" / "cpu.ipred")
    src = tmp_path / "m.onnx"
    src.write_bytes(build_variant(spec).SerializeToString())
    pkg = compile_model(src, tmp_path / "pkg", profile="auto")
    d = read_plan(pkg / "plan.bin")
    assert d["costs"] == "predicted" and d["profile"] is None
    x = {"input": np.random.default_rng(0).standard_normal(spec.input_shape).astype(np.float32)}
    want = CpuExecutor(g).run(x)["output"]
    m = inferd.load(pkg)
    try:
        got = m.run(x)["output"]
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
        # idle time: the model profiles itself and the package gets measured costs and a new plan
        assert m.refine_done is not None and m.refine_done.wait(120)
    finally:
        m.close()
    d = read_plan(pkg / "plan.bin")
    assert d["costs"] == "profiled" and d["profile"] is not None
    # and the list of what its new plan reads, which a cold open streams from, is that plan's
    from inferd.backends.base import WeightSource
    from inferd.package import open_package
    from inferd.store import StoreStream

    op = open_package(pkg)
    try:
        ws = WeightSource(op.graph.constants, op.store, "cpu")
        assert d["stream"] == [list(k) for k in StoreStream.order(ws.entries_by_name(op.run_graph, op.plan) or [])]
    finally:
        op.store.close()


def test_a_model_planned_from_predictions_switches_to_its_profiled_kernels(trained: tuple[Predictor, Trainer],
                                                                           tmp_path, monkeypatch) -> None:
    """Once idle-time profiling has re-planned the package, the running model takes the new plan's warm
    kernels (it kept the predicted ones until its next load). A plan that wants another kernel for one layer
    switches that layer, under the run lock, and the outputs stay right; the real refinement leaves every layer
    on its new plan's choice."""
    import dataclasses

    pred, _ = trained
    from inferd.package import compile_model, read_plan
    from inferd.planner.plan import ColdPlan
    from inferd.runtime.cpu import CpuExecutor, candidate_kernels
    from inferd.frontend import import_template, specialize

    import inferd

    spec = VariantSpec("resnet", 0.25, 64, 0.5, 3)
    monkeypatch.setenv("INFERD_PREDICTOR_DIR", str(tmp_path / "pred"))
    pred.save(tmp_path / "pred" / "cpu.ipred")
    src = tmp_path / "m.onnx"
    src.write_bytes(build_variant(spec).SerializeToString())
    pkg = compile_model(src, tmp_path / "pkg", profile="auto")
    assert read_plan(pkg / "plan.bin")["costs"] == "predicted"
    x = {"input": np.random.default_rng(0).standard_normal(spec.input_shape).astype(np.float32)}
    want = CpuExecutor(specialize(import_template(build_variant(spec)))).run(x)["output"]
    m = inferd.load(pkg)
    try:
        np.testing.assert_allclose(m.run(x)["output"], want, rtol=1e-3, atol=1e-4)
        assert m.refine_done is not None and m.refine_done.wait(120)
        cold = m._cold
        refined = ColdPlan.from_dict(read_plan(pkg / "plan.bin")["plan"])
        assert cold.plan_switches(refined) == []  # every layer runs the refined plan's warm kernel
        # a plan that wants another kernel for one layer (the classifier's Gemm: the blocked convs have one):
        # that layer alone switches
        now = [cold.backend.kernel_params(i) for i in range(len(refined.layers))]
        pos, alt = next((i, k.name) for i in range(len(refined.layers)) if now[i] is not None
                        for k in candidate_kernels(cold.layers[i], "cpu", None, False)[0]
                        if k.name != now[i][0].name)
        layers = list(refined.layers)
        layers[pos] = dataclasses.replace(layers[pos], warm_kernel=alt)
        m._follow_plan(cold, dataclasses.replace(refined, layers=tuple(layers)))
        assert cold.backend.kernel_params(pos)[0].name == alt
        assert all(cold.backend.kernel_params(i)[0].name == now[i][0].name for i in range(len(now))
                   if i != pos and now[i] is not None)
        assert m.cold_stats["refined_switch_layers"] == 1
        np.testing.assert_allclose(m.run(x)["output"], want, rtol=1e-3, atol=1e-4)
        # another model's plan (other layer names) switches nothing
        other = dataclasses.replace(refined, layers=tuple(dataclasses.replace(lp, name=lp.name + "'")
                                                          for lp in layers))
        assert cold.plan_switches(other) == []
    finally:
        m.close()


def test_a_registered_model_is_profiled_before_its_first_request(trained: tuple[Predictor, Trainer], tmp_path,
                                                                 monkeypatch) -> None:
    """What the daemon does for a model it does not preload (``inferd.register(profile=True)``, issue 10's
    registration): met for the first time, its package is planned from predictions, then profiled on this device
    before any request, and the plan its first load parses is the profiled one (the load reads no plan.bin). A
    registration told to stop gives the profiling up, stores nothing, and says so."""
    pred, _ = trained
    from inferd import package as package_mod
    from inferd.frontend import import_template, specialize
    from inferd.package import read_plan
    from inferd.runtime.cpu import CpuExecutor

    import inferd

    monkeypatch.setenv("INFERD_PREDICTOR_DIR", str(tmp_path / "pred"))
    pred.save(tmp_path / "pred" / "cpu.ipred")
    spec = VariantSpec("mobilenetv2", 0.35, 64, 0.5, 3)
    src = tmp_path / "m.onnx"
    src.write_bytes(build_variant(spec).SerializeToString())
    cache = tmp_path / "cache"
    first = inferd.register(src, cache_dir=cache)
    assert first.compiled and not first.profiled and first.package is not None
    assert read_plan(first.package / "plan.bin")["costs"] == "predicted"
    stopped = inferd.register(src, cache_dir=cache, profile=True, stop=lambda: True)
    assert not stopped.profiled and "put off" in stopped.note
    assert read_plan(first.package / "plan.bin")["costs"] == "predicted"
    r = inferd.register(src, cache_dir=cache, profile=True)
    assert r.profiled and not r.compiled and r.parsed and r.package == first.package
    d = read_plan(r.package / "plan.bin")
    assert d["costs"] == "profiled" and d["profile"] is not None
    reads: list[str] = []
    real_read = package_mod._read_plan
    monkeypatch.setattr(package_mod, "_read_plan", lambda p, *a, **k: (reads.append(str(p)), real_read(p, *a, **k))[1])
    x = {"input": np.random.default_rng(0).standard_normal(spec.input_shape).astype(np.float32)}
    want = CpuExecutor(specialize(import_template(build_variant(spec)))).run(x)["output"]
    m = inferd.load(src, cache_dir=cache)
    try:
        assert reads == [] and m.package == r.package
        np.testing.assert_allclose(m.run(x)["output"], want, rtol=1e-3, atol=1e-4)
        assert m.refine_done is None or m.refine_done.wait(60)  # (nothing left to profile after its answer)
    finally:
        m.close()
    assert read_plan(r.package / "plan.bin")["costs"] == "profiled"


def test_idle_profiling_yields_to_requests_and_to_close(trained: tuple[Predictor, Trainer], tmp_path,
                                                        monkeypatch) -> None:
    """A package planned from predictions profiles itself between requests only: under a foreground that is never
    quiet it gives the idle worker back (other idle work runs meanwhile), and closing the model abandons it at
    once, storing nothing, its retry cancelled."""
    pred, _ = trained
    from inferd.package import compile_model, read_plan
    from inferd.runtime import model as model_mod
    from inferd.runtime import profiler
    from inferd.runtime.cold import after_answer
    from inferd.runtime.scheduler import foreground

    import inferd

    monkeypatch.setenv("INFERD_PREDICTOR_DIR", str(tmp_path / "pred"))
    monkeypatch.setattr(profiler, "IDLE_WAIT_S", 0.2)
    monkeypatch.setattr(model_mod, "REFINE_RETRY_S", 0.3)
    pred.save(tmp_path / "pred" / "cpu.ipred")
    spec = VariantSpec("mobilenetv2", 0.35, 64, 0.5, 3)
    src = tmp_path / "m.onnx"
    src.write_bytes(build_variant(spec).SerializeToString())
    pkg = compile_model(src, tmp_path / "pkg", profile="auto")
    assert read_plan(pkg / "plan.bin")["costs"] == "predicted"
    x = {"input": np.zeros(spec.input_shape, np.float32)}
    m = inferd.load(pkg)
    closed = False
    try:
        with foreground:  # a request that never ends, as under a steady stream
            m.run(x)
            assert m.refine_done is not None
            time.sleep(1.0)  # the first try and at least one retry have given up by now
            assert not m.refine_done.is_set()
            assert after_answer(lambda: None).wait(5)  # the idle worker is not held by the put-off profile
            t0 = time.perf_counter()
            m.close()
            closed = True
            assert time.perf_counter() - t0 < 2.0
            assert m.refine_done.is_set() and m._refine_retry is None
    finally:
        if not closed:
            m.close()
    time.sleep(0.5)  # a retry that was not cancelled would fire in this window and profile
    d = read_plan(pkg / "plan.bin")
    assert d["costs"] == "predicted" and d["profile"] is None


def test_info_predict_json(trained: tuple[Predictor, Trainer], tmp_path, monkeypatch, capsys) -> None:
    pred, _ = trained
    from inferd.cli import main

    monkeypatch.setenv("INFERD_PREDICTOR_DIR", str(tmp_path))
    pred.save(tmp_path / "cpu.ipred")
    src = tmp_path / "m.onnx"
    src.write_bytes(build_variant(TINY[1]).SerializeToString())
    assert main(["info", str(src), "--predict", "--json", "--threads", "1"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["predictor"] == "ok" and r["warm_ms"] > 0 and r["cold_ms"] > 0
    assert r["cold_ms"] > r["warm_ms"]
    for d in r["layers"]:
        assert {"name", "op", "kernel", "warm_ms", "read_raw_ms", "transform_ms", "pipeline_empty_ms",
                "pipeline_filled_ms"} <= set(d)
        assert d["warm_ms"] > 0
    assert r["speed"] == 1.0  # trained without the speed probe: predicted at its own level, nothing timed
    assert main(["info", str(src), "--predict"]) == 0
    assert "predicted warm" in capsys.readouterr().out
    # with a probe reference the warm times follow the machine's speed now (measured here, so only its use is
    # checked: the report's warm time is the unscaled one times the speed it states)
    import dataclasses

    from inferd.predictor.probe import REFERENCE

    dataclasses.replace(pred, probe={"reference": {"1": 1e-3}, "spec": [list(x) for x in REFERENCE]},
                        _banks={}).save(tmp_path / "cpu.ipred")
    assert main(["info", str(src), "--predict", "--json", "--threads", "1"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["speed"] != 1.0 and s["speed_probe_ms"] > 0
    assert s["layers"][0]["warm_ms"] == pytest.approx(r["layers"][0]["warm_ms"] * s["speed"], rel=1e-9)
    assert main(["info", str(src), "--predict", "--json", "--threads", "1", "--no-probe"]) == 0
    assert json.loads(capsys.readouterr().out)["speed"] == 1.0
    # no predictor: the flagged fallback, still a full answer
    monkeypatch.setenv("INFERD_PREDICTOR_DIR", str(tmp_path / "none"))
    assert main(["info", str(src), "--predict", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["predictor"].startswith("no valid predictor") and r["roofline_layers"] == len(
        [d for d in r["layers"] if d["source"] == "roofline"]) > 0 and r["warm_ms"] > 0


@pytest.mark.vulkan
def test_vulkan_units_are_measured_featurised_and_predicted() -> None:
    """On the Vulkan device (lavapipe here): a model's layers are timed by GPU timestamps inside it, with their
    transform and pipeline creation (empty and filled cache); a predictor fitted on them predicts every
    layer from its dispatch features (workgroup counts, local size), the same features at training and
    at planning time."""
    import inferd.vulkan

    if not inferd.vulkan.available():
        pytest.skip("no Vulkan device")
    tr = Trainer("vulkan")
    spec = VariantSpec("squeezenet", 0.25, 48, 0.5, 3)
    assert tr.measure((spec, 1), alternative=False) is not None
    w, sigs, steps = tr.models[tr.name((spec, 1))]
    assert w > 0 and steps == len(sigs) > 5
    phases = {ph for s in sigs for d in tr.samples[s] for ph in d}
    assert {"exec", "pipeline_empty", "pipeline_filled"} <= phases
    from inferd.predictor.features import INDEX

    for s in sigs:
        f = tr.feats[s]
        assert f[INDEX["n_disp"]] >= 1 and f[INDEX["wg_total"]] >= 1 and f[INDEX["local"]] >= 1
    models = tr.fit(n_trees=10)
    pred = tr.predictor(models, fingerprint_for("vulkan"), {}, {"per_read_s": 1e-4, "disk_bw": 5e8}, {})
    g = tr.graph(spec)
    from inferd.package import make_backend, make_plan
    from inferd.planner.plan import PlanOptions

    be = make_backend(g, "vulkan")
    try:
        cost = PredictedCost(pred, threads=1, constants=g.constants)
        for layer, kernels, _d in be.candidates():
            for k in kernels:
                c = cost.cost(layer, k, "exec")
                assert c.seconds > 0 and c.source in ("predicted", "roofline")
                if k.name not in ("fold", "alias") and (f"{layer.op}/{k.name}", "exec") in pred.models:
                    assert c.source == "predicted"
                    assert cost.cost(layer, k, "pipeline_empty").seconds > 0
        plan = make_plan(be, be.candidates(), None, PlanOptions(), 2, predictor=pred, constants=g.constants)
        assert plan.predicted_s > 0 and len(plan.layers) == len(g.nodes)
        # the planners' features are the training's, unit by unit, and the whole-model path (one array of the
        # units' rows) predicts what the one-unit path does
        from inferd.predictor.features import signature

        same = 0
        for layer, kernels, _d in be.candidates():
            for k in kernels:
                key = f"1|{signature(layer, k)}"
                if key in tr.feats:
                    assert np.array_equal(cost.features(layer, k), tr.feats[key]), (layer.name, k.name)
                    same += 1
        assert same >= 5
        layers = [(layer, d) for layer, _ks, d in be.candidates()]
        vals, _roof = predict_arrays(layers, PredictedCost(pred, threads=1, constants=g.constants), ("exec",))
        assert np.allclose(vals["exec"], [cost.cost(layer, k, "exec").seconds for layer, k in layers], rtol=1e-9)
    finally:
        be.close()


def test_vulkan_dispatch_features_of_gemms_need_no_transform(monkeypatch) -> None:
    """A Vulkan GEMM's dispatches, as the predictor derives them for its features, come from the layer's shapes:
    the same as the kernel records from really transformed weights, and without transforming stand-in weights
    (asking the lazy params whether a bias was there transformed them all: most of a Vulkan whole-model
    prediction's time on vit variants)."""
    import inferd.ops.gemm_vulkan  # noqa: F401  (registers the Vulkan GEMM kernels)
    from inferd.ops.base import raw_key
    from inferd.predictor.features import _DISPATCHES, vulkan_dispatches
    from inferd.vulkan.kernel import Caps, split_rows

    x = np.zeros((1, 50, 96), np.float32)
    w = np.random.default_rng(0).standard_normal((96, 160)).astype(np.float32)
    cases = [single_node_layer("Gemm", [x[0], w, np.ones(160, np.float32)], {"beta": 0.5}),
             single_node_layer("Gemm", [x[0], w.T.copy(), np.ones((50, 160), np.float32)], {"transB": 1}),
             single_node_layer("Gemm", [x[0], w, np.ones((50, 160), np.float32)], {}, const=[False, True, False]),
             single_node_layer("MatMul", [x, w], {}, const=[False, True])]
    caps = Caps()
    for layer in cases:
        ks = [k for k in applicable_kernels(layer, "vulkan") if k.name.startswith("vk_matmul")]
        assert ks, layer.op
        for k in ks:
            raw = {raw_key(i): np.asarray(np.ones(layer.inputs[i].shape, np.float32)) for i in layer.const_inputs}
            want = split_rows(k.dispatches(layer, k.transform(layer, raw), caps), caps)
            _DISPATCHES.clear()

            def no_transform(*_a, **_k):
                raise AssertionError("transformed stand-in weights")

            monkeypatch.setattr(type(k), "transform", no_transform)
            got = vulkan_dispatches(layer, k, caps, None)
            monkeypatch.undo()
            assert got is not None
            assert got == want, (layer.node.attrs, k.name)
