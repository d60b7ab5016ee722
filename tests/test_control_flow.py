"""If, Loop and Scan as exporters write them, against onnxruntime, through ``inferd.load`` on the CPU and on
Vulkan (lavapipe): value-dependent conditions taking both branches across requests, nested Ifs reading outer
names, conditions on shapes folded per shape variant, Loops with a trip count and with a condition, Scan,
branches whose outputs differ in shape; plus the plumbing ops (Not/And/Or/Xor, CumSum) and 0-d inputs."""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import inferd
import inferd.vulkan
from inferd.ops.base import Layer
from inferd.errors import InferdError

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(nodes: Sequence[onnx.NodeProto], inputs: Sequence[tuple[str, int, Sequence[Any]]],
           outputs: Sequence[tuple[str, int, Sequence[Any] | None]], inits: dict[str, np.ndarray] | None = None,
           opset: int = 17) -> onnx.ModelProto:
    g = helper.make_graph(list(nodes), "cf", [helper.make_tensor_value_info(n, t, list(s)) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, None if s is None else list(s)) for n, t, s in outputs],
                          initializer=[numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _body(nodes: Sequence[onnx.NodeProto], outputs: Sequence[str], inputs: Sequence[tuple[str, int, Any]] = (),
          name: str = "body") -> onnx.GraphProto:
    return helper.make_graph(list(nodes), name, [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                             [helper.make_tensor_value_info(o, F, None) for o in outputs])


def _ort(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _devices() -> list[str]:
    out = ["cpu"]
    if inferd.vulkan.available():
        out.append("vulkan")
    return out


def _same(model: Any, m: onnx.ModelProto, feeds: dict[str, np.ndarray], tol: float = 1e-5) -> None:
    got = model.run(feeds)
    want = _ort(m, feeds)
    for o, w in zip(m.graph.output, want):
        assert got[o.name].shape == w.shape, (o.name, got[o.name].shape, w.shape)
        assert got[o.name].dtype == w.dtype, (o.name, got[o.name].dtype, w.dtype)
        assert np.abs(got[o.name].astype(np.float64) - w).max() <= tol * max(1.0, np.abs(w).max()), o.name


def _nested_if_model() -> onnx.ModelProto:
    """y = x * w1 + 1 if sum(x) > 0 else (x * w2 if max(x) > 1 else x - w1): an If nested in the else branch;
    both bodies read the outer input x and the outer weights w1, w2."""
    inner_then = _body([helper.make_node("Mul", ["x", "w2"], ["it"])], ["it"], name="inner_then")
    inner_else = _body([helper.make_node("Sub", ["x", "w1"], ["ie"])], ["ie"], name="inner_else")
    then = _body([helper.make_node("Mul", ["x", "w1"], ["t0"]), helper.make_node("Add", ["t0", "one"], ["t1"])], ["t1"],
                 name="then")
    other = _body([helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
                   helper.make_node("Greater", ["mx", "one"], ["c2"]),
                   helper.make_node("If", ["c2"], ["e0"], then_branch=inner_then, else_branch=inner_else)], ["e0"],
                  name="else")
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    inits = {"w1": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), "w2": np.full((2, 3), 3.0, np.float32),
             "one": np.array(1.0, np.float32), "zero": np.array(0.0, np.float32)}
    return _model(nodes, [("x", F, (2, 3))], [("y", F, (2, 3))], inits)


@pytest.mark.parametrize("device", _devices())
def test_value_dependent_nested_if_takes_every_branch(device: str) -> None:
    m = _nested_if_model()
    model = inferd.load(m, device=device)
    g = model.graph
    assert [n.op for n in g.nodes if n.op == "If"] == ["If"]  # decided by values: stays in the graph
    cases = [np.ones((2, 3), np.float32), -np.ones((2, 3), np.float32) * np.array([1, 1, 1], np.float32),
             np.array([[-5, 2, 0], [0, 0, -1]], np.float32)]
    for x in cases * 2:  # every branch, twice, in turn: nothing is re-planned between requests
        _same(model, m, {"x": x})
    stats = next(n for n in g.nodes if n.op == "If").notes["stats"].to_dict()
    assert stats["runs"] == 6 and stats["taken"] == {"then_branch": 2, "else_branch": 4}
    model.close()


def test_value_dependent_if_runs_planned_bodies_over_its_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU an If whose branches are planned at the node's shapes is bound once (``bind_run``): a run reads
    the condition and runs the taken body straight over the node's buffers, never through ``run_control``'s
    per-run feeds (made to fail here), for the nested If inside a branch too; both branches still answer."""
    import inferd.ops.control as control

    def refuse(*_a: Any, **_k: Any) -> None:
        raise AssertionError("run_control called: the If was not bound over its buffers")

    monkeypatch.setattr(control, "run_control", refuse)
    m = _nested_if_model()
    model = inferd.load(m, device="cpu")
    cases = [np.ones((2, 3), np.float32), -np.ones((2, 3), np.float32),
             np.array([[-5, 2, 0], [0, 0, -1]], np.float32)]
    for x in cases * 2:
        _same(model, m, {"x": x})
    stats = next(n for n in model.graph.nodes if n.op == "If").notes["stats"].to_dict()
    assert stats["runs"] == 6 and stats["taken"] == {"then_branch": 2, "else_branch": 4}
    model.close()


def test_shape_folded_if_redecided_per_shape_and_value_if_takes_both_branches() -> None:
    """A dynamic model with a shape-dependent If (x wider than 4: keep its first 4 columns, else pad it to 4 with
    a copy of itself) feeding a value-dependent one (sum > 0: * 2, else - 1): each shape variant folds the first
    its own way, and in each the second, bound once, follows the values from run to run."""
    crop = _body([helper.make_node("Slice", ["x", "s0", "s4", "ax1"], ["sl"])], ["sl"], name="crop")
    pad = _body([helper.make_node("Concat", ["x", "x"], ["cc"], axis=1),
                 helper.make_node("Slice", ["cc", "s0", "s4", "ax1"], ["ps"])], ["ps"], name="pad")
    double = _body([helper.make_node("Mul", ["z", "two"], ["d"])], ["d"], name="double")
    minus = _body([helper.make_node("Sub", ["z", "onef"], ["e"])], ["e"], name="minus")
    nodes = [helper.make_node("Shape", ["x"], ["shp"]),
             helper.make_node("Gather", ["shp", "one"], ["w"], axis=0),
             helper.make_node("Greater", ["w", "four"], ["c"]),
             helper.make_node("If", ["c"], ["z"], then_branch=crop, else_branch=pad),
             helper.make_node("ReduceSum", ["z"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zerof"], ["c2"]),
             helper.make_node("If", ["c2"], ["y"], then_branch=double, else_branch=minus)]
    inits = {"one": np.array(1, np.int64), "four": np.array(4, np.int64), "s0": np.array([0], np.int64),
             "s4": np.array([4], np.int64), "ax1": np.array([1], np.int64), "two": np.array(2.0, np.float32),
             "onef": np.array(1.0, np.float32), "zerof": np.array(0.0, np.float32)}
    m = _model(nodes, [("x", F, (1, "W"))], [("y", F, (1, 4))], inits)
    model = inferd.load(m, device="cpu", shapes={"x": (1, 7)})
    for w, sign in ((7, 1), (3, 1), (7, -1), (3, -1), (4, 1), (7, 1), (3, -1)):
        x = sign * (np.arange(w, dtype=np.float32)[None] + 1)
        _same(model, m, {"x": x})
    graphs = [model.graph] + [v.graph for v in model.variants]
    assert len(graphs) == 3
    for g in graphs:  # the shape If folded away, the value If left, and it took both branches
        ifs = [n for n in g.nodes if n.op == "If"]
        assert len(ifs) == 1 and ifs[0].inputs[0] == "c2"
    taken = [n.notes["stats"].to_dict()["taken"] for g in graphs if g.inputs[0].shape[1] in (7, 3)
             for n in g.nodes if n.op == "If"]
    assert len(taken) == 2
    assert all(set(t) == {"then_branch", "else_branch"} for t in taken), taken
    model.close()


def test_shape_dependent_if_folds_per_shape() -> None:
    """if x.shape[1] > 4: y = x[:, :4] * 2 else: y = x + 1 (torch's TorchScript export): a dynamic model whose
    every shape variant has the If decided and inlined, no If left at run time; the branches' outputs differ in
    shape from each other."""
    then = _body([helper.make_node("Slice", ["x", "s0", "s4", "ax1"], ["sl"]),
                  helper.make_node("Mul", ["sl", "two"], ["t"])], ["t"], name="then")
    other = _body([helper.make_node("Add", ["x", "onef"], ["e"])], ["e"], name="else")
    nodes = [helper.make_node("Shape", ["x"], ["shp"]),
             helper.make_node("Gather", ["shp", "one"], ["w"], axis=0),
             helper.make_node("Greater", ["w", "four"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    inits = {"one": np.array(1, np.int64), "four": np.array(4, np.int64), "s0": np.array([0], np.int64),
             "s4": np.array([4], np.int64), "ax1": np.array([1], np.int64), "two": np.array(2.0, np.float32),
             "onef": np.array(1.0, np.float32)}
    m = _model(nodes, [("x", F, (1, "W"))], [("y", F, (1, "Wout"))], inits)
    model = inferd.load(m, device="cpu", shapes={"x": (1, 7)})
    assert not any(n.op == "If" for n in model.graph.nodes)
    for w in (7, 3, 4, 9):
        x = np.arange(w, dtype=np.float32)[None]
        _same(model, m, {"x": x})
    assert len(model.variants) >= 3
    model.close()


def test_value_dependent_if_with_branches_of_different_shapes() -> None:
    """The branch taken decides the output's shape: the CPU runs it with the output shaped at run time."""
    then = _body([helper.make_node("Concat", ["x", "x"], ["t"], axis=1)], ["t"], name="then")
    other = _body([helper.make_node("Neg", ["x"], ["e"])], ["e"], name="else")
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["z"], then_branch=then, else_branch=other),
             helper.make_node("Relu", ["z"], ["y"])]
    m = _model(nodes, [("x", F, (1, 3))], [("y", F, ("a", "b"))], {"zero": np.array(0.0, np.float32)})
    model = inferd.load(m, device="cpu")
    assert "y" in model.graph.runtime_shaped
    for x in (np.ones((1, 3), np.float32), -np.ones((1, 3), np.float32), np.ones((1, 3), np.float32)):
        _same(model, m, {"x": x})
    if inferd.vulkan.available():  # the static head on Vulkan, the If and what follows it on the CPU
        vk = inferd.load(m, device="vulkan")
        assert any(k.startswith("cpu:") for k in vk.kernels.values())
        for x in (np.ones((1, 3), np.float32), -np.ones((1, 3), np.float32)):
            _same(vk, m, {"x": x})
        vk.close()
    model.close()


def _loop_model(with_cond: bool) -> onnx.ModelProto:
    """acc = 0; for i in range(M) [while acc < limit]: acc = acc + x * i; scan out acc (with a trip count) ..."""
    body_nodes = [helper.make_node("Cast", ["i"], ["fi"], to=F),
                  helper.make_node("Mul", ["x", "fi"], ["xi"]),
                  helper.make_node("Add", ["acc_in", "xi"], ["acc_out"])]
    if with_cond:
        body_nodes += [helper.make_node("ReduceSum", ["acc_out"], ["tot"], keepdims=0),
                       helper.make_node("Less", ["tot", "limit"], ["c_out"])]
        outs = ["c_out", "acc_out"]
    else:
        body_nodes += [helper.make_node("Identity", ["c_in"], ["c_out"]),
                       helper.make_node("Identity", ["acc_out"], ["scan"])]
        outs = ["c_out", "acc_out", "scan"]
    body = helper.make_graph(body_nodes, "loop_body",
                             [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c_in", B, []),
                              helper.make_tensor_value_info("acc_in", F, [2])],
                             [helper.make_tensor_value_info("c_out", B, []), helper.make_tensor_value_info("acc_out", F, [2])]
                             + ([] if with_cond else [helper.make_tensor_value_info("scan", F, [2])]))
    loop_outs = ["acc"] if with_cond else ["acc", "scans"]
    nodes = [helper.make_node("Loop", ["M", "cond", "acc0"], loop_outs, body=body)]
    inits = {"M": np.array(100 if with_cond else 5, np.int64), "cond": np.array(True),
             "acc0": np.zeros(2, np.float32), "limit": np.array(50.0, np.float32)}
    outs = [("acc", F, (2,))] + ([] if with_cond else [("scans", F, (5, 2))])
    return _model(nodes, [("x", F, (2,))], outs, inits)


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("with_cond", [False, True])
def test_loop(device: str, with_cond: bool) -> None:
    m = _loop_model(with_cond)
    model = inferd.load(m, device=device)
    for x in (np.array([1.0, 2.0], np.float32), np.array([0.5, -0.25], np.float32), np.array([3.0, 4.0], np.float32)):
        _same(model, m, {"x": x})
    model.close()


@pytest.mark.parametrize("device", _devices())
def test_scan_cumulative_with_outer_weight(device: str) -> None:
    """Scan over axis 1 in reverse: state = state * w + x_t (w read from outside), scan out the state."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["s_in", "w"], ["sw"]), helper.make_node("Add", ["sw", "xt"], ["s_out"]),
         helper.make_node("Tanh", ["s_out"], ["o"])], "scan_body",
        [helper.make_tensor_value_info("s_in", F, [3]), helper.make_tensor_value_info("xt", F, [3])],
        [helper.make_tensor_value_info("s_out", F, [3]), helper.make_tensor_value_info("o", F, [3])])
    nodes = [helper.make_node("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1, scan_input_axes=[1],
                              scan_input_directions=[1], scan_output_axes=[1])]
    m = _model(nodes, [("s0", F, (3,)), ("x", F, (3, 6))], [("s", F, (3,)), ("ys", F, (3, 6))],
               {"w": np.array([0.5, -0.5, 0.9], np.float32)})
    model = inferd.load(m, device=device)
    rng = np.random.default_rng(3)
    for _ in range(3):
        _same(model, m, {"s0": rng.standard_normal(3).astype(np.float32), "x": rng.standard_normal((3, 6)).astype(np.float32)})
    model.close()


def test_plumbing_ops_at_run_time() -> None:
    """int64 and bool tensors computed at run time (not folded): comparisons, Not/And/Or/Xor, Where, Cast between
    float/int/bool, CumSum, Range/Expand/Tile/ConstantOfShape from shapes; a 0-d input and a 0-d output."""
    nodes = [helper.make_node("Greater", ["x", "zero"], ["pos"]),
             helper.make_node("Not", ["pos"], ["neg"]),
             helper.make_node("Less", ["x", "two"], ["small"]),
             helper.make_node("And", ["pos", "small"], ["mid"]),
             helper.make_node("Or", ["neg", "mid"], ["keep"]),
             helper.make_node("Xor", ["keep", "pos"], ["flip"]),
             helper.make_node("Cast", ["flip"], ["flip_i"], to=I64),
             helper.make_node("CumSum", ["flip_i", "ax"], ["pos_idx"]),
             helper.make_node("Cast", ["pos_idx"], ["pos_f"], to=F),
             helper.make_node("Where", ["keep", "x", "pos_f"], ["w"]),
             helper.make_node("Shape", ["x"], ["shp"]),
             helper.make_node("ConstantOfShape", ["shp"], ["ones"], value=numpy_helper.from_array(np.array([1.0], np.float32))),
             helper.make_node("Add", ["w", "ones"], ["w1"]),
             helper.make_node("Cast", ["n"], ["nf"], to=F),
             helper.make_node("Mul", ["w1", "nf"], ["y"]),
             helper.make_node("ReduceSum", ["y"], ["total"], keepdims=0),
             helper.make_node("Add", ["n", "n"], ["n2"])]
    inits = {"zero": np.array(0.0, np.float32), "two": np.array(2.0, np.float32), "ax": np.array(1, np.int64)}
    m = _model(nodes, [("x", F, (2, 5)), ("n", I64, ())],
               [("y", F, (2, 5)), ("total", F, ()), ("n2", I64, ()), ("pos_idx", I64, (2, 5))], inits)
    model = inferd.load(m, device="cpu")
    rng = np.random.default_rng(0)
    for k in range(3):
        _same(model, m, {"x": (rng.standard_normal((2, 5)) * 2).astype(np.float32), "n": np.array(k + 2, np.int64)})
    assert model.outputs[1].shape == () and model.inputs[1].shape == ()
    model.close()


def test_vad_both_sample_rates_on_vulkan_and_info() -> None:
    """The zoo VAD: its sample-rate If stays a host step on Vulkan (a readback), both rates right; ``describe``
    (what ``inferd info`` prints) names the dynamic branches and what deciding costs."""
    from inferd import zoo
    from inferd.ops.control import describe

    if not inferd.vulkan.available():
        pytest.skip("no Vulkan device")
    m = zoo.build("vad_lstm")
    model = inferd.load(m, device="vulkan")
    rng = np.random.default_rng(1)
    state = np.zeros((2, 1, 64), np.float32)
    for sr in (16000, 8000, 16000):
        feeds = {"input": (rng.standard_normal((1, 512)) * 0.3).astype(np.float32), "sr": np.array(sr, np.int64),
                 "state": state}
        _same(model, m, feeds, tol=1e-4)
        state = model.run(feeds)["stateN"]
    text = describe(model.graph)
    assert "If" in text and "then_branch" in text and "readback" in text, text
    model.close()


def test_body_kernels_are_picked_by_measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    """A control-flow body (no cold plan covers it) takes per node the candidate kernel measured fastest, not
    the default pick: with the measurements saying a non-default candidate is faster, that one runs."""
    import inferd.runtime.cpu as cpu
    import inferd.runtime.profiler as profiler
    from inferd.frontend import import_template, specialize
    from inferd.ops.base import Layer
    from inferd.planner.cost import Profile
    from inferd.zoo import build

    g = specialize(import_template(build("vad_lstm")))
    body = next(n for n in g.nodes if n.op == "If").bodies["then_branch"]
    real = profiler.profile_layers
    flipped: dict[str, str] = {}

    def prefer_last(entries: Any, *a: Any, **k: Any) -> Profile:
        prof = real(entries, *a, **k)
        times = dict(prof.times)
        for layer, cands, default in entries:  # the last candidate that is not the default "measures" fastest
            other = [c for c in cands if c is not default][-1]
            times[(layer.name, other.name, "exec")] = 0.0
            flipped[layer.name] = other.name
        return Profile(prof.backend, prof.fingerprint, prof.rates, times)

    monkeypatch.setattr(profiler, "profile_layers", prefer_last)
    monkeypatch.setattr(cpu, "_CHOSEN", {})  # nothing measured before in this process
    picked = cpu.measured_choice(body)
    choice = {layer.name: k.name for layer, k in picked}
    assert flipped and all(choice[name] == k for name, k in flipped.items()), (flipped, choice)
    for layer, k in picked:  # every pick applies to its node
        assert k.applies(Layer.of(layer.node, body))


def _count_profiles(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at each ``profile_layers`` call (each body measured) from now on."""
    import inferd.runtime.profiler as profiler

    calls: list[int] = []
    real = profiler.profile_layers

    def counted(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(profiler, "profile_layers", counted)
    return calls


def _vad_feeds(rng: np.random.Generator, sr: int = 16000, state: float = 0.1) -> dict[str, np.ndarray]:
    """One vad_lstm chunk: 512 samples, the sample rate (which picks the If's branch), a recurrent state."""
    return {"input": (rng.standard_normal((1, 512)) * 0.3).astype(np.float32), "sr": np.array(sr, np.int64),
            "state": (rng.standard_normal((2, 1, 64)) * state).astype(np.float32)}


def test_body_kernels_measured_once_per_shape_and_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same body measured again (a model evicted under the budget and loaded again) takes the picks measured
    before without measuring; its copy from another import too; on another thread count it is measured anew."""
    import inferd.runtime.cpu as cpu
    from inferd import native
    from inferd.frontend import import_template, specialize
    from inferd.zoo import build

    calls = _count_profiles(monkeypatch)
    monkeypatch.setattr(cpu, "_CHOSEN", {})

    def body() -> Any:
        g = specialize(import_template(build("vad_lstm")))
        return next(n for n in g.nodes if n.op == "If").bodies["then_branch"]

    first = [(layer.name, k.name) for layer, k in cpu.measured_choice(body(), reps=1)]
    assert len(calls) == 1
    again = [(layer.name, k.name) for layer, k in cpu.measured_choice(body(), reps=1)]
    assert len(calls) == 1 and again == first
    threads = native.num_threads()
    try:
        native.set_num_threads(threads + 1)
        cpu.measured_choice(body(), reps=1)
        assert len(calls) == 2
    finally:
        native.set_num_threads(threads)


def test_a_package_brings_its_body_kernels_and_a_cold_load_measures_none(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Any) -> None:
    """The kernels its compile measured for the control-flow bodies travel in the package: a cold load in a process
    that measured nothing binds them without measuring (a fresh process had spent 3-18 ms of vad's cold load
    measuring) and answers as onnxruntime does; a record that is damaged or names another shape is skipped, and
    that body is measured as before."""
    import inferd.runtime.cpu as cpu
    from inferd.package import compile_model, read_plan
    from inferd.zoo import build

    m = build("vad_lstm")
    src = tmp_path / "vad.onnx"
    onnx.save(m, src)
    monkeypatch.setattr(cpu, "_CHOSEN", {})
    pkg = compile_model(src, tmp_path / "pkg")
    recs = read_plan(pkg / "plan.bin")["body_choices"]
    assert recs and all(len(r[1]) == len(r[2]) > 0 for r in recs)
    measured = dict(cpu._CHOSEN)  # what the compile measured: the records are these
    assert {(r[0], tuple(r[1])): r[2] for r in recs} == {k: v for k, v in measured.items()}

    calls = _count_profiles(monkeypatch)
    monkeypatch.setattr(cpu, "_CHOSEN", {})  # a fresh process: nothing measured
    feeds = _vad_feeds(np.random.default_rng(0), state=0.0)
    model = inferd.load(str(pkg), device="cpu")
    try:
        out = model.run(feeds)
        assert not calls, "a body was measured at load"
        ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        for got, want in zip(out.values(), ref):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    finally:
        model.close()
    # damaged records and one of another shape: none taken, nothing raised; the body is then measured
    monkeypatch.setattr(cpu, "_CHOSEN", {})
    other = [recs[0][0], [k.replace("64", "65") for k in recs[0][1]], recs[0][2]]
    assert cpu.seed_body_choices([["x"], [1, ["a"], ["b", "c"]], None, other]) == 1
    model = inferd.load(str(tmp_path / "vad.onnx"), device="cpu")
    try:
        model.run(feeds)
        assert calls, "a body with no matching record was not measured"
    finally:
        model.close()


def test_a_control_flow_node_is_prepared_at_load_and_its_plan_prices_the_bodies(monkeypatch: pytest.MonkeyPatch,
                                                                                 tmp_path: Any) -> None:
    """A control-flow node's bodies are built into executors, which no store holds: its plan reads it raw (never a
    stored "transformed" copy of its raw weights, which the store had duplicated) and prices the bodies' build where
    it happens, an If's taken branch at its first run: in the profile's first execution and the predicted cold start
    (vad's had been 0.1 ms)."""
    import inferd.ops.control as control
    from inferd.package import _read_plan, compile_model
    from inferd.planner.cold import layer_candidates
    from inferd.planner.cost import RooflineCost
    from inferd.store import WeightsStore
    from inferd.zoo import build

    real = control._body_executor

    def slow(g: Any) -> Any:  # each body's build: 20 ms more
        time.sleep(0.02)
        return real(g)

    monkeypatch.setattr(control, "_body_executor", slow)
    src = tmp_path / "vad.onnx"
    onnx.save(build("vad_lstm"), src)
    pkg = compile_model(src, tmp_path / "pkg")
    _d, plan, prof = _read_plan(pkg / "plan.bin")
    (lp,) = [lp for lp in plan.layers if lp.kernel == "control"]
    assert lp.source == "raw"
    assert prof is not None and prof.times[(lp.name, "control", "exec_first")] >= 0.02
    assert plan.predicted_s >= 0.02
    with WeightsStore(pkg / "weights.store") as store:
        assert not list(store.find(lp.name, variant="transformed"))
    # the planner offers no stored form of a kernel whose preparation cannot be stored
    g = import_model_graph(src)
    layer = next(Layer.of(n, g) for n in g.nodes if n.op == "If")
    cands = layer_candidates(layer, [control.ControlFlowKernel()], RooflineCost())
    assert {c.source for c in cands} == {"raw"}


def test_a_package_records_its_shaped_bodies_and_an_open_shapes_none(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Any) -> None:
    """plan.bin records the control-flow bodies shaped at the plan's shape (their weights by name, read from the store
    when first used): an open shapes no body (vad's open spent 4 of its 5 ms shaping its two If bodies) and the model
    answers as onnxruntime does, both branches; a record naming a tensor the package lacks is a damaged package."""
    import inferd.frontend.shapes as shapes
    from inferd.errors import WeightsStoreError
    from inferd.package import compile_model, read_plan, write_plan
    from inferd.zoo import build

    m = build("vad_lstm")
    src = tmp_path / "vad.onnx"
    onnx.save(m, src)
    pkg = compile_model(src, tmp_path / "pkg")
    d = read_plan(pkg / "plan.bin")
    assert set(d["at_shape"]["bodies"]["/sr/If"]) == {"then_branch", "else_branch"}
    assert d["at_shape"]["bodies"]["/sr/If"]["then_branch"]["refs"]  # weights by name, not inlined

    def no_shaping(*a: Any, **k: Any) -> Any:
        raise AssertionError("a body was shaped at open")

    monkeypatch.setattr(shapes, "shape_body", no_shaping)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    with inferd.load(str(pkg), device="cpu") as model:
        for sr in (16000, 8000, 16000):
            feeds = _vad_feeds(rng, sr)
            for got, want in zip(model.run(feeds).values(), sess.run(None, feeds)):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    body = d["at_shape"]["bodies"]["/sr/If"]["then_branch"]
    body["refs"][next(iter(body["refs"]))] = "no such weight"
    write_plan(pkg / "plan.bin", d)
    from inferd.package import open_package

    with pytest.raises(WeightsStoreError, match="no such weight"):
        open_package(pkg, "cpu", 1)


def test_an_if_builds_a_branch_when_it_first_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bound If builds a body's executor when that body first runs, not at load: a model whose requests take one
    branch never builds the other (vad's cold preparation was half the second branch); the other branch, taken
    later, is built then and answers right."""
    import inferd.ops.control as control
    from inferd.zoo import build

    real = control._body_executor
    built: list[str] = []

    def counted(g: Any) -> Any:
        built.append(g.name)
        return real(g)

    monkeypatch.setattr(control, "_body_executor", counted)
    m = build("vad_lstm")
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    with inferd.load(m.SerializeToString(), device="cpu") as model:
        model.wait_loaded()
        assert built == []
        names = []
        for sr in (16000, 16000, 8000, 16000, 8000):
            feeds = _vad_feeds(rng, sr)
            for got, want in zip(model.run(feeds).values(), sess.run(None, feeds)):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
            names.append(len(built))
        assert names == [1, 1, 2, 2, 2], (names, built)


def test_a_control_flow_packages_weights_come_from_the_load_stream_once(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Any) -> None:
    """A shaped graph's constants (an overlay over the package's lazily read ones) answer the loader as the bare
    ones do, so the If's raw weights come from the load's stream (they had been read from the store beside it,
    the stream idle), and the branch built at its first run takes the arrays the load read rather than reading
    them again: no read of the store's own after the load began."""
    from inferd.backends.base import LazyConstants
    from inferd.ir import Overlay
    from inferd.package import compile_model
    from inferd.store import WeightsStore
    from inferd.zoo import build

    src = tmp_path / "vad.onnx"
    onnx.save(build("vad_lstm"), src)
    pkg = compile_model(src, tmp_path / "pkg")
    lazy_reads: list[str] = []
    real = WeightsStore.read

    def counted(self: Any, e: Any, *a: Any, **k: Any) -> Any:
        lazy_reads.append(getattr(e, "tensor", "?"))
        return real(self, e, *a, **k)

    monkeypatch.setattr(WeightsStore, "read", counted)
    feeds = _vad_feeds(np.random.default_rng(3), state=0.0)
    with inferd.load(str(pkg), device="cpu") as model:
        model.run(feeds)
        stats = dict(model.cold_stats)
        assert isinstance(model.graph.constants, Overlay) and isinstance(model.graph.constants.base, LazyConstants)
    assert stats["stream_bytes"] > 0 and lazy_reads == [], (stats, lazy_reads)
    # the overlay answers for its base where it does not shadow a name
    base = LazyConstants({"small": np.ones(2, np.float32)}, None, {}, widen={"w"})  # type: ignore[arg-type]
    ov = Overlay({"folded": np.zeros(1, np.float32), "w": np.ones(1, np.float32)}, base)
    half = np.ones(3, np.float16)
    assert ov.widened("v", half) is half and ov.widened("w", half) is half  # "w" is the overlay's own
    assert Overlay({}, base).widened("w", half).dtype == np.float32
    assert ov.entry("folded") is None and ov.entry("small") is None


def import_model_graph(path: Any) -> Any:
    from inferd.frontend import import_template, specialize

    return specialize(import_template(path))


def test_if_body_giving_one_tensor_as_two_outputs() -> None:
    """A branch may name one tensor as two of its outputs: the bound If fills both of the node's buffers."""
    then = _body([helper.make_node("Mul", ["x", "two"], ["t"])], ["t", "t"], name="then")
    other = _body([helper.make_node("Neg", ["x"], ["e"]), helper.make_node("Abs", ["x"], ["a"])], ["a", "e"],
                  name="else")
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y1", "y2"], then_branch=then, else_branch=other)]
    m = _model(nodes, [("x", F, (2, 3))], [("y1", F, (2, 3)), ("y2", F, (2, 3))],
               {"zero": np.array(0.0, np.float32), "two": np.array(2.0, np.float32)})
    model = inferd.load(m, device="cpu")
    for sign in (1, -1, 1):  # against numpy: onnxruntime 1.x fills the second of two same-named outputs wrongly
        x = sign * np.arange(1, 7, dtype=np.float32).reshape(2, 3)
        got = model.run({"x": x})
        want = (2 * x, 2 * x) if sign > 0 else (np.abs(x), -x)
        np.testing.assert_array_equal(got["y1"], want[0])
        np.testing.assert_array_equal(got["y2"], want[1])
    model.close()


def test_control_flow_layers_are_priced_from_their_bodies() -> None:
    """The roofline and the predictor price an If by its dearer branch and a Scan by its body times its length,
    each body layer as its own unit: an If whose branches hold a whole model had been priced as a copy of its
    output."""
    from inferd.frontend import import_template, specialize
    from inferd.ops.base import Layer, choose_kernel
    from inferd.planner.cost import RooflineCost, body_trips, body_units
    from inferd.zoo import build

    rc = RooflineCost()
    g = specialize(import_template(build("vad_lstm")))
    node = next(n for n in g.nodes if n.op == "If")
    layer = Layer.of(node, g)
    k = choose_kernel(layer, "cpu")
    branches = [sum(rc.cost(bl, bk, "exec").seconds for bl, bk in units) for units in body_units(layer, False)]
    assert len(branches) == 2 and min(branches) > 0
    got = rc.cost(layer, k, "exec").seconds
    assert got == pytest.approx(max(branches) + rc.rates.per_step_s, rel=1e-9)
    assert rc.cost(layer, k, "transform").seconds >= sum(
        rc.cost(bl, bk, "transform").seconds for units in body_units(layer, False) for bl, bk in units)
    # a Scan over 7 steps: its body's cost seven times
    body = _body([helper.make_node("Add", ["s", "x"], ["s2"]), helper.make_node("Identity", ["s2"], ["y"])],
                 ["s2", "y"], inputs=[("s", F, [4]), ("x", F, [4])], name="body")
    m = _model([helper.make_node("Scan", ["s0", "xs"], ["sN", "ys"], body=body, num_scan_inputs=1)],
               [("s0", F, (4,)), ("xs", F, (7, 4))], [("sN", F, (4,)), ("ys", F, (7, 4))], {})
    sg = specialize(import_template(m))
    scan = next(n for n in sg.nodes if n.op == "Scan")
    sl = Layer.of(scan, sg)
    assert body_trips(sl) == 7.0
    one = sum(rc.cost(bl, bk, "exec").seconds for bl, bk in body_units(sl, False)[0])
    assert rc.cost(sl, choose_kernel(sl, "cpu"), "exec").seconds == pytest.approx(7 * one + rc.rates.per_step_s)
