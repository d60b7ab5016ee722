"""`inferd bench --layers`: onnxruntime's profiled nodes matched to inferd's layers, a real run on a tiny model."""
from __future__ import annotations

from pathlib import Path

from inferd.bench.layers_bench import bench_layers, gemm_summary, match, table
from zoo_fixture import zoo_dir


def test_nodes_match_layers_by_the_tensor_they_produce() -> None:
    layers = [{"name": "/conv1/Conv", "out": "/relu1/Relu_output_0"}, {"name": "/fc/Gemm", "out": "logits"}]
    nodes = [{"name": "/relu1/Relu_output_0_nchwc", "op": "Conv", "ms": 1.0},   # NCHWc: named after its output
             {"name": "/fc/Gemm", "op": "Gemm", "ms": 0.5},                      # by node name
             {"name": "logits_token_7", "op": "Add", "ms": 0.25},               # a fused leftover, same tensor
             {"name": "ReorderOutput_token_1", "op": "ReorderOutput", "ms": 0.1}]
    got, rest = match(layers, nodes)
    assert got == {"/conv1/Conv": 1.0, "/fc/Gemm": 0.75}
    assert [n["op"] for n in rest] == ["ReorderOutput"]
    # inferd's own blocked conv writes the tensor's blocked twin: still the same onnxruntime node, also where a
    # conversion back to NCHW writes the tensor itself (a branch of a Concat that is not blocked)
    blocked = [{"name": "/conv1/Conv", "op": "inferd.ConvNchwc", "out": "/relu1/Relu_output_0::nchwc"},
               {"name": "/relu1/Relu_output_0::nchwc#from", "op": "inferd.FromNchwc", "out": "/relu1/Relu_output_0"}]
    got, rest = match(blocked, nodes[:1])
    assert got == {"/conv1/Conv": 1.0} and not rest


def test_a_blocked_convs_flops_are_its_convs() -> None:
    import numpy as np

    from inferd.ops.conv_nchwc import CONV
    from inferd.planner.cost import layer_flops
    from inferd.ops.base import single_node_layer

    x = np.zeros((1, 2, 6, 6, 16), np.float32)
    w = np.zeros((48, 32, 3, 3), np.float32)
    layer = single_node_layer(CONV, [x, w, np.zeros(48, np.float32)],
                              {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [1, 1]},
                              const=[False, True, True])
    assert layer_flops(layer) == 2 * 48 * 36 * 32 * 9


def test_a_real_run_times_every_layer_and_the_roofline(tmp_path: Path) -> None:
    r = bench_layers(zoo_dir(["tiny"]) / "tiny.onnx", 1, 3, tmp_path)
    conv = next(x for x in r["layers"] if x["op"] == "Conv")
    assert conv["ms"] > 0 and conv["roofline_ms"] > 0 and conv["flops"] == 2 * 8 * 8 * 8 * 27
    assert conv["ort_ms"] is not None and conv["ort_ms"] > 0  # onnxruntime's conv node found
    assert r["peak_flops"] > 1e8 and r["mem_bw"] > 1e8
    assert len(r["peak_readings"]) == 3 and sorted(r["peak_readings"])[1] == r["peak_flops"]  # the median of three
    assert abs(sum(x["ms"] for x in r["layers"]) - r["inferd_layer_sum_ms"]) < 1e-9
    md = table([r], top=len(r["layers"]), slowest=1)  # every layer: which has the largest gap depends on speed
    assert "| tiny |" in md and "/conv/Conv" in md


def test_gemm_bound_layers_are_counted_against_the_peak_goal() -> None:
    """Issue 17's "GEMM-bound layers at 70% of the FMA peak": only convolutions and products the roofline calls
    compute-bound count (not a depthwise conv, not a memory-bound product, not an Add), weighted by time."""
    peak, bw = 100e9, 10e9

    def ly(name: str, op: str, kernel: str, gflop: float, mb: float, ms: float) -> dict:
        return {"name": name, "op": op, "kernel": kernel, "flops": gflop * 1e9, "bytes": mb * 1e6, "ms": ms,
                "peak_share": gflop * 1e9 / (ms / 1e3) / peak}

    layers = [ly("a", "Conv", "conv1x1", 0.08, 1.0, 1.0),        # 80% of peak, compute-bound: at the goal
              ly("b", "inferd.ConvNchwc", "nchwc", 0.06, 1.0, 1.0),  # 60%: under it
              ly("c", "MatMul", "gemm_packed", 0.01, 8.0, 1.0),      # bytes set its roofline: left out
              ly("d", "Conv", "depthwise", 0.09, 0.1, 1.0),          # depthwise: left out
              ly("e", "Add", "numpy", 0.09, 0.1, 1.0)]               # not a GEMM: left out
    g = gemm_summary({"peak_flops": peak, "mem_bw": bw, "layers": layers})
    assert (g["layers"], g["at_goal"]) == (2, 1)
    assert abs(g["time_share_at_goal"] - 0.5) < 1e-9 and abs(g["aggregate_peak_share"] - 0.7) < 1e-9
    md = table([{"model": "m", "inferd_ms": 5.0, "ort_ms": 5.0, "inferd_layer_sum_ms": 5.0, "ort_node_sum_ms": 5.0,
                 "ort_unmatched": [], "peak_flops": peak, "mem_bw": bw, "layers": layers}], slowest=0)
    assert "| m | 2 | 1 | 50% | 70% | 2.00 |" in md


def test_fused_tensors_match_the_layer_that_absorbed_them() -> None:
    """onnxruntime names a fused Conv+BN after the BN's output; inferd's layer (Conv+BN+Add+Relu) produces
    the Relu's: the import records the tensors a layer absorbed, and the match uses them."""
    from inferd.frontend import import_model
    from test_import import conv_bn_relu_add_model  # a model with BN, activation and residual fusions

    g = import_model(conv_bn_relu_add_model())
    fused = [n for n in g.nodes if n.attrs.get("_absorbed")]
    assert fused, [n.op for n in g.nodes]
    layers = [{"name": n.name, "out": n.outputs[0], "absorbed": n.attrs["_absorbed"]} for n in fused]
    nodes = [{"name": layers[0]["absorbed"][0] + "_nchwc", "op": "Conv", "ms": 0.5}]
    got, rest = match(layers, nodes)
    assert got == {layers[0]["name"]: 0.5} and not rest


def test_rounds_alternate_the_engines_and_report_medians(tmp_path: Path) -> None:
    """``--layers --rounds 2``: two children of each engine in turns; a layer's time is the median of its rounds,
    the whole model's ratio the median of the rounds' ratios, inside their range, which the table prints."""
    r = bench_layers(zoo_dir(["tiny"]) / "tiny.onnx", 1, 3, tmp_path, rounds=2)
    assert r["rounds"] == 2 and len(r["inferd_rounds_ms"]) == 2 and len(r["ort_rounds_ms"]) == 2
    assert len(r["peak_readings"]) == 6
    for x in r["layers"]:
        assert len(x["ms_rounds"]) == 2 and abs(x["ms"] - sum(x["ms_rounds"]) / 2) < 1e-9
    lo, hi = r["ratio_range"]
    assert lo <= r["ratio"] <= hi
    assert f"({lo:.2f}-{hi:.2f})" in table([r], top=3, slowest=1)
