"""`inferd bench --layers`: onnxruntime's profiled nodes matched to inferd's layers, a real run on a tiny model."""
from __future__ import annotations

from pathlib import Path

from inferd.bench.layers_bench import bench_layers, match, table
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
    assert abs(sum(x["ms"] for x in r["layers"]) - r["inferd_layer_sum_ms"]) < 1e-9
    md = table([r], top=len(r["layers"]), slowest=1)  # every layer: which has the largest gap depends on speed
    assert "| tiny |" in md and "/conv/Conv" in md


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
