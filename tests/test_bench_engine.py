"""`inferd bench` (warm, CPU): both engines stay loaded in their own processes and take turns in short rounds."""
from __future__ import annotations

import numpy as np
import pytest

from inferd.bench import engine_bench
from zoo_fixture import zoo_dir


def test_rounds_alternate_between_loaded_engines_and_the_ratio_is_their_median() -> None:
    r = engine_bench.bench_model(zoo_dir(["tiny"]) / "tiny.onnx", "cpu", 1, 3, cold=False, rounds=4)
    assert len(r["rounds"]) == 4
    ratios = [x["inferd_ms"] / x["ort_ms"] for x in r["rounds"]]
    assert r["warm_ratio"] == pytest.approx(float(np.median(ratios)))
    assert r["warm_ratio_min"] == pytest.approx(min(ratios)) and r["warm_ratio_max"] == pytest.approx(max(ratios))
    assert 0 < r["warm_ms"] <= r["warm_p95_ms"] and 0 < r["ort_warm_ms"] <= r["ort_warm_p95_ms"]
    assert r["max_rel_err"] < 1e-5  # the two engines' first outputs compared
    assert r["kernels"] and sum(r["kernels"].values()) >= 1
    # the thread count asked for is inferd's pool size too (it read none of the variables that size onnxruntime's,
    # so "--threads 1" compared two inferd threads with one of onnxruntime's)
    assert r["inferd_threads"] == 1


def test_a_child_that_fails_is_reported_with_its_error() -> None:
    """The inferd child cannot load on a device that does not exist: the parent raises with the child's
    stderr instead of waiting for a reply that never comes."""
    with pytest.raises(RuntimeError, match=r"(?s)warm run of inferd failed \(rc [1-9].*nosuchdevice"):
        engine_bench.bench_model(zoo_dir(["tiny"]) / "tiny.onnx", "nosuchdevice", 1, 2, cold=False, rounds=2)


def test_time_pair_takes_any_two_arms_in_turns_and_pairs_each_round() -> None:
    """Two inferd arms (as the quant bench pairs an int8 model with its fp32 twin): each arm's slices are its own,
    the ratio of a round is its two slices' medians, and the order alternates round by round."""
    path = zoo_dir(["tiny"]) / "tiny.onnx"
    r = engine_bench.time_pair(("inferd", path), ("inferd", path), "cpu", 1, 3, rounds=3)
    first, second = r["times"]
    assert len(first) == len(second) == 3 and all(len(s) == 3 for s in first + second)
    assert r["ratios"] == pytest.approx([float(np.median(a) / np.median(b)) for a, b in zip(first, second)])
    assert len(r["infos"]) == 2 and all(i.get("threads") == 1 for i in r["infos"])
    np.testing.assert_array_equal(r["outputs"][0], r["outputs"][1])  # one input for both arms
