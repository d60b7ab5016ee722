"""CPU-GPU co-execution on lavapipe: a Conv (every Vulkan conv kernel), Gemm or MatMul split by output channels
between the CPU kernels and the GPU answers like onnxruntime for splits 0, all, one channel, odd counts and a
fraction; a split layer's output is complete before any consumer reads it (random graphs and split plans; many
inferences with one side slowed at random); errors on the GPU side fail the request whole."""
from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
import pytest

import inferd.vulkan
from inferd.ops.base import single_node_layer
from inferd.vulkan.testing import coexec_skip_reason, graph_of_layer, rel_err

_SKIP = coexec_skip_reason()
pytestmark = [pytest.mark.vulkan, pytest.mark.skipif(_SKIP is not None, reason=str(_SKIP))]

TOL = 2e-4


def _ort(op: str, inputs: list[Any], attrs: dict[str, Any]) -> np.ndarray:
    from ortutil import make_single_node_model, ort_session

    m = make_single_node_model(op, inputs, attrs, const_mask=[i > 0 for i in range(len(inputs))])
    sess = ort_session(m, threads=1)
    return sess.run(None, {"x0": inputs[0]})[0]


def _splits(c: int) -> list[Any]:
    # all GPU, all CPU, one channel either side, odd counts (not multiples of 4 or 8), a fraction
    return sorted({0, c, 1, c - 1, 3, c - 3 if c > 6 else 1, 0.5}, key=str)


def _check(op: str, inputs: list[Any], attrs: dict[str, Any], splits: list[Any], gpu_kernel: str | None = None,
           cpu_kernel: str | None = None) -> list[str]:
    from inferd.coexec.engine import CoexecModel

    layer = single_node_layer(op, inputs, attrs)
    g = graph_of_layer(layer, inputs)
    want = _ort(op, inputs, attrs)
    sides = []
    for s in splits:
        with CoexecModel(g, {"n0": s}, kernels={"n0": gpu_kernel} if gpu_kernel else None,
                         cpu_kernels={"n0": cpu_kernel} if cpu_kernel else None) as m:
            for trial in range(2):  # the second run reuses the recorded program
                x = inputs[0] * (1 + trial)
                got = m.run({"x0": x})["y0"]
                ref = want if trial == 0 else _ort(op, [x] + inputs[1:], attrs)
                err = rel_err(got, ref)
                assert err <= TOL, f"{op} split {s} ({m.placements[0]}): error {err:.3g}"
            p = m.placements[0]
            sides.append(p.side)
            if p.side == "split":
                assert 0 < p.gpu_channels < p.channels
                if gpu_kernel and p.gpu_channels > 1:  # one channel of a depthwise conv is a plain conv
                    assert p.gpu_kernel == gpu_kernel
                if cpu_kernel and p.channels - p.gpu_channels > 1:
                    assert p.cpu_kernel == cpu_kernel
    return sides


rng = np.random.default_rng(5)
F = np.float32


def _a(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(F)


# (Vulkan kernel, conv inputs, attrs): a layer each kernel applies to; 13 output channels (odd, not 4k/8k)
CONV_CASES = [
    ("vk_direct", [_a(1, 6, 9, 9), _a(13, 6, 3, 3), _a(13)], {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("vk_gemm_reg", [_a(1, 6, 9, 9), _a(13, 6, 3, 3), _a(13)], {"pads": [1, 1, 1, 1]}),
    ("vk_gemm", [_a(1, 6, 9, 9), _a(13, 6, 3, 3), _a(13)], {"pads": [1, 1, 1, 1]}),
    ("vk_gemm_tex", [_a(1, 8, 9, 9), _a(13, 8, 5, 5), _a(13)], {"pads": [2, 2, 2, 2]}),
    ("vk_conv1x1", [_a(1, 16, 7, 7), _a(13, 16, 1, 1), _a(13)], {}),
    ("vk_conv1x1_reg", [_a(1, 16, 7, 7), _a(13, 16, 1, 1), _a(13)], {}),
    ("vk_conv1x1_tex", [_a(1, 16, 8, 8), _a(13, 16, 1, 1), _a(13)], {}),
    ("vk_winograd23", [_a(1, 8, 10, 10), _a(13, 8, 3, 3), _a(13)], {"pads": [1, 1, 1, 1]}),
    ("vk_winograd43", [_a(1, 8, 10, 10), _a(13, 8, 3, 3), _a(13)], {"pads": [1, 1, 1, 1]}),
    ("vk_winograd43_tex", [_a(1, 8, 10, 10), _a(13, 8, 3, 3), _a(13)], {"pads": [1, 1, 1, 1]}),
    ("vk_depthwise", [_a(1, 13, 9, 9), _a(13, 1, 3, 3), _a(13)], {"pads": [1, 1, 1, 1], "group": 13}),
    ("vk_depthwise_tex", [_a(1, 13, 9, 9), _a(13, 1, 3, 3), _a(13)], {"pads": [1, 1, 1, 1], "group": 13}),
]


@pytest.mark.parametrize("kernel,inputs,attrs", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_split_matches_onnxruntime_for_every_vulkan_kernel(kernel: str, inputs: list[Any],
                                                                attrs: dict[str, Any]) -> None:
    from inferd.coexec.split_ops import make_part
    from inferd.ops.base import kernels_for
    from inferd.vulkan.executor import _import_kernels

    _import_kernels()
    layer = single_node_layer("Conv", inputs, attrs)
    g = graph_of_layer(layer, inputs)
    # the kernel must apply to the GPU part (12 of 13 channels) too, or the case tests nothing
    part = make_part(layer, g.constants, 0, 12, "gpu")
    pl = part.layer(g.infos, part.constants)
    k = [k for k in kernels_for("Conv", "vulkan") if k.name == kernel][0]
    assert k.applies(layer) and k.applies(pl), kernel
    sides = _check("Conv", inputs, attrs, _splits(13), gpu_kernel=kernel)
    assert sides.count("split") >= 4 and "gpu" in sides and "cpu" in sides


@pytest.mark.parametrize("cpu_kernel", ["im2col", "direct", "winograd23", "winograd43", "conv1x1", "depthwise"])
def test_conv_split_every_cpu_conv_kernel(cpu_kernel: str) -> None:
    if cpu_kernel == "conv1x1":
        inputs, attrs = [_a(1, 16, 7, 7), _a(11, 16, 1, 1), _a(11)], {}
    elif cpu_kernel == "depthwise":
        inputs, attrs = [_a(1, 11, 8, 8), _a(11, 1, 3, 3), _a(11)], {"pads": [1, 1, 1, 1], "group": 11}
    else:
        inputs, attrs = [_a(1, 6, 10, 10), _a(11, 6, 3, 3), _a(11)], {"pads": [1, 1, 1, 1]}
    _check("Conv", inputs, attrs, [1, 5, 10], cpu_kernel=cpu_kernel)


def test_grouped_conv_splits_at_group_boundaries() -> None:
    inputs, attrs = [_a(1, 12, 8, 8), _a(18, 4, 3, 3), _a(18)], {"pads": [1, 1, 1, 1], "group": 3}
    from inferd.coexec.split_ops import split_shape

    sh = split_shape(single_node_layer("Conv", inputs, attrs))
    assert sh is not None and sh.unit == 6 and sh.points() == [0, 6, 12, 18]
    sides = _check("Conv", inputs, attrs, [6, 12, 7, 0.5])  # 7 CPU channels snaps to the nearest boundary
    assert sides.count("split") == 4


@pytest.mark.parametrize("case", ["gemm", "gemm_transB", "gemv_row", "matmul_rows", "matmul_vec_rows"])
def test_gemm_matmul_split_matches_onnxruntime(case: str) -> None:
    if case == "gemm":
        op, inputs, attrs = "Gemm", [_a(5, 40), _a(40, 37), _a(37)], {}
    elif case == "gemm_transB":
        op, inputs, attrs = "Gemm", [_a(6, 40), _a(37, 40), _a(37)], {"transB": 1, "alpha": 0.5, "beta": 2.0}
    elif case == "gemv_row":
        op, inputs, attrs = "Gemm", [_a(1, 64), _a(64, 37), _a(1, 37)], {}
    elif case == "matmul_rows":
        op, inputs, attrs = "MatMul", [_a(1, 9, 40), _a(40, 37)], {}
    else:
        op, inputs, attrs = "MatMul", [_a(3, 40), _a(40, 37)], {}
    sides = _check(op, inputs, attrs, _splits(37))
    assert sides.count("split") >= 4


def _random_graph(seed: int) -> Any:
    """A random small ONNX model of Conv/Relu/Add/MatMul/Gemm chains with a skip connection, and its feeds."""
    import onnx
    from onnx import helper, numpy_helper

    r = np.random.default_rng(seed)
    c = int(r.integers(3, 12))
    hw = int(r.integers(4, 9))
    nodes, inits = [], []
    cur, ch = "x", c
    names = iter(range(1000))

    def w(shape: tuple[int, ...]) -> str:
        n = f"w{next(names)}"
        inits.append(numpy_helper.from_array((r.standard_normal(shape) * 0.3).astype(F), n))
        return n
    skip = None
    for _ in range(int(r.integers(2, 6))):
        kind = r.choice(["conv3", "conv1", "dw", "relu", "add"])
        out = f"t{next(names)}"
        if kind == "conv3":
            co = int(r.integers(2, 14))
            nodes.append(helper.make_node("Conv", [cur, w((co, ch, 3, 3)), w((co,))], [out], pads=[1, 1, 1, 1]))
            ch = co
        elif kind == "conv1":
            co = int(r.integers(2, 14))
            nodes.append(helper.make_node("Conv", [cur, w((co, ch, 1, 1))], [out]))
            ch = co
        elif kind == "dw":
            nodes.append(helper.make_node("Conv", [cur, w((ch, 1, 3, 3)), w((ch,))], [out], pads=[1, 1, 1, 1],
                                          group=ch))
        elif kind == "relu":
            nodes.append(helper.make_node("Relu", [cur], [out]))
        else:
            if skip is None or skip[1] != ch:
                nodes.append(helper.make_node("Relu", [cur], [out]))
            else:
                nodes.append(helper.make_node("Add", [cur, skip[0]], [out]))
        if r.random() < 0.5:
            skip = (out, ch)
        cur = out
    flat = f"t{next(names)}"
    nodes.append(helper.make_node("Flatten", [cur], [flat]))
    k = ch * hw * hw
    h = f"t{next(names)}"
    n1 = int(r.integers(3, 20))
    nodes.append(helper.make_node("Gemm", [flat, w((k, n1)), w((n1,))], [h]))
    y = "y"
    nodes.append(helper.make_node("MatMul", [h, w((n1, int(r.integers(2, 9))))], [y]))
    g = helper.make_graph(nodes, f"rand{seed}", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                               [1, c, hw, hw])],
                          [onnx.ValueInfoProto(name=y)], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, {"x": r.standard_normal((1, c, hw, hw)).astype(F)}


def _ort_model(m: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    from ortutil import ort_session

    return ort_session(m, threads=1).run(None, feeds)


def test_property_random_graphs_and_split_plans() -> None:
    """Random graphs, random per-node plans (CPU, GPU, a random channel split): every consumer, on either side,
    reads the whole tensor (the answer equals onnxruntime's), over two inferences with different inputs."""
    from inferd.coexec.engine import CoexecModel
    from inferd.frontend import import_model

    seen = set()
    for seed in range(10):
        m, feeds = _random_graph(seed)
        g = import_model(m)
        r = np.random.default_rng(100 + seed)
        plan: dict[str, Any] = {}
        for n in g.nodes:
            plan[n.name] = r.choice(["cpu", "gpu", "frac"])
            if plan[n.name] == "frac":
                plan[n.name] = float(r.random())
        with CoexecModel(g, plan) as cm:
            seen |= {p.side for p in cm.placements}
            for trial in range(2):
                f = {"x": feeds["x"] * (1.0 - 2 * trial)}
                want = _ort_model(m, f)[0]
                got = cm.run(f)[g.outputs[0].name]
                assert rel_err(got, want) <= TOL, (seed, plan, cm.placements)
    assert seen == {"cpu", "gpu", "split"}


def _gate(dev: Any) -> Any:
    """A command buffer that holds the queue until the host sets an event: delays the GPU at will."""
    from inferd.vulkan.device import vk

    d = dev.device
    ev = vk.vkCreateEvent(d, vk.VkEventCreateInfo(), None)
    pool = vk.vkCreateCommandPool(d, vk.VkCommandPoolCreateInfo(queueFamilyIndex=dev.queue_family), None)
    cb = vk.vkAllocateCommandBuffers(d, vk.VkCommandBufferAllocateInfo(
        commandPool=pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
    vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo())
    vk.vkCmdWaitEvents(cb, 1, [ev], vk.VK_PIPELINE_STAGE_HOST_BIT, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                       0, None, 0, None, 0, None)
    vk.vkEndCommandBuffer(cb)
    return ev, pool, cb


@pytest.mark.parametrize("sync", ["fence", "flag"])
def test_stress_one_side_slowed_at_random(sync: str) -> None:
    """Many inferences of a chain of split layers with the GPU held back (an event the host sets late) or the
    CPU delayed, at random: each answer equals the reference, so no consumer read a half-written tensor."""
    import time

    from inferd.coexec.engine import CoexecModel
    from inferd.frontend import import_model
    from inferd.vulkan.device import vk

    m, feeds = _random_graph(3)
    g = import_model(m)
    plan = {n.name: 0.5 for n in g.nodes}
    r = np.random.default_rng(7)
    with CoexecModel(g, plan, sync=sync) as cm:
        assert sum(p.side == "split" for p in cm.placements) >= 2
        dev = cm.device
        ev, pool, gate_cb = _gate(dev)
        real_submit = dev.queue_submit
        tasks = [arg for op, arg in cm.program if op == "cpu"]
        real_calls = [t.call for t in tasks]
        try:
            timers: list[threading.Timer] = []

            def slow_submit(infos: Any, fence: Any) -> None:
                # one gate at a time (the gate's command buffer and event are reused): only once the last opened
                if r.random() < 0.5 and not (timers and timers[-1].is_alive()):
                    dev.wait_idle()  # the previous gate's command buffer has left the queue
                    vk.vkResetEvent(dev.device, ev)
                    t = threading.Timer(float(r.random()) * 0.004, lambda: vk.vkSetEvent(dev.device, ev))
                    timers.append(t)
                    t.start()
                    real_submit([vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[gate_cb])], vk.VK_NULL_HANDLE)
                real_submit(infos, fence)
            dev.queue_submit = slow_submit  # type: ignore[method-assign]
            for t, call in zip(tasks, real_calls):
                def slow(call: Any = call) -> None:
                    if r.random() < 0.3:
                        time.sleep(float(r.random()) * 0.004)
                    call()
                t.call = slow
            for i in range(40):
                f = {"x": r.standard_normal(feeds["x"].shape).astype(F)}
                got = cm.run(f)[g.outputs[0].name]
                want = _ort_model(m, f)[0]
                assert rel_err(got, want) <= TOL, f"inference {i}: incomplete split output"
        finally:
            dev.queue_submit = real_submit  # type: ignore[method-assign]
            for t in timers:  # no timer may touch the event after it is destroyed
                t.join()
            vk.vkSetEvent(dev.device, ev)
            dev.wait_idle()
            vk.vkDestroyCommandPool(dev.device, pool, None)
            vk.vkDestroyEvent(dev.device, ev, None)


def test_bad_split_values_are_refused() -> None:
    from inferd.coexec.engine import CoexecModel

    inputs = [_a(1, 4, 5, 5), _a(6, 4, 3, 3)]
    g = graph_of_layer(single_node_layer("Conv", inputs, {}), inputs)
    for bad, msg in [(1.5, "outside"), (7, "CPU channels"), ("half", "must be")]:
        with pytest.raises(ValueError, match=msg):
            CoexecModel(g, {"n0": bad})
    relu = single_node_layer("Relu", [_a(1, 4)])
    with pytest.raises(ValueError, match="cannot be split"):
        CoexecModel(graph_of_layer(relu, [_a(1, 4)]), {"n0": 2})


ZOO_MODELS = ["tiny", "mlp_small", "mobilenetv2", "squeezenet1_1", "shufflenetv2_x1_0", "resnet18", "vit_tiny",
              "efficientnet_b0", "googlenet", "unet_small", "resnet50", "vgg16"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO_MODELS)
def test_zoo_model_split_plans_match_onnxruntime(name: str) -> None:
    """Each zoo model co-executed with the planner's plan, and with a random plan (every splittable layer split at
    a random fraction, odd channel counts included; the others on a random side), answers like onnxruntime."""
    from inferd.coexec.engine import CoexecModel, CoexecUnsupported
    from inferd.coexec.load import plan_for
    from inferd.frontend import import_model
    from inferd.vulkan.testing import rel_err
    from zoo_fixture import zoo_reference

    path, feeds, want, names = zoo_reference(name)
    g = import_model(path)
    sides, _plan, _src = plan_for(g, None, None, 1)
    r = np.random.default_rng(len(name))
    rand = {n.name: (float(r.random()) if r.random() < 0.8 else str(r.choice(["cpu", "gpu"]))) for n in g.nodes}
    for plan in (sides, rand):
        try:
            m = CoexecModel(g, plan)
        except CoexecUnsupported as e:
            pytest.skip(str(e))
        with m:
            got = m.run(feeds)
            for n, w in zip(names, want):
                assert rel_err(got[n], w) <= 1e-3, (name, n, [p for p in m.placements if p.side == "split"][:3])


@pytest.mark.slow
def test_cpu_layers_run_as_regions_of_the_cpu_backend() -> None:
    """Consecutive CPU-only layers run as one region: the CPU backend's executor over them, with its layout plan
    (blocked convs) and kernels, not the co-execution's per-layer NCHW calls; a GPU layer between two runs of CPU
    layers makes two regions whose boundary tensors go through the shared arena. Both answer like onnxruntime."""
    import onnx

    from inferd.coexec.engine import CoexecModel
    from inferd.frontend import import_model
    from inferd.package import cpu_graph
    from inferd.vulkan.testing import rel_err
    from zoo_fixture import zoo_reference

    path, feeds, want, names = zoo_reference("resnet18")
    g = import_model(path)
    blocked = [n.name for n in cpu_graph(g).nodes if n.op == "inferd.ConvNchwc"]
    assert len(blocked) >= 4  # the layout plan blocks resnet18's convs: what the regions must keep
    convs = [n.name for n in g.nodes if n.op == "Conv"]
    mid = convs[len(convs) // 2]
    on_cpu = {n.name: "cpu" for n in g.nodes}
    for sides, n_regions in ((on_cpu, 1), (on_cpu | {mid: "gpu"}, 2)):
        with CoexecModel(g, sides) as m:
            assert len(m.regions) == n_regions
            assert m.load_stats["cpu_tasks"] == n_regions
            kern = {p.name: p.cpu_kernel for p in m.placements if p.side == "cpu"}
            tr: list[Any] = []
            m.run(feeds, trace=tr)  # a traced run notes each layer of a region, in order, with its time
            noted = [what for op, what, _t in tr if op == "cpu"]
            assert [n for n in noted if n in kern] == [n for n in kern if n in noted] and len(noted) > len(kern) // 2
            assert all(t1 <= t2 for (_o, _w, t1), (_p, _v, t2) in zip(tr, tr[1:]))
            on_blocked = [n for n in blocked if kern.get(n) == "nchwc"]
            # with a conv on the GPU its neighbours may lose their blocked partner (each region plans its layout)
            assert len(on_blocked) >= len(blocked) - 3 * (n_regions - 1), kern
            for trial in range(2):
                f = {k: v * (1.0 - 2 * trial) for k, v in feeds.items()}
                got = m.run(f)
                ref = want if trial == 0 else _ort_model(onnx.load(str(path)), f)
                for n, w in zip(names, ref):
                    assert rel_err(got[n], w) <= 1e-3, (n, sides.get(mid))


@pytest.mark.parametrize("side", ["split", "cpu"])
def test_close_gives_the_cpu_side_back_while_the_model_is_still_referenced(side: str) -> None:
    """``close()`` frees the CPU side at once: a CPU region's executor (its arena and weights) and a split layer's
    CPU half (the recorded program holds its weights), not when the object is collected; a run after it is refused
    and a second close does nothing. (The CPU work is checked through weak references with the collector off: only
    the model's own references kept it.)"""
    import gc
    import weakref

    from inferd.coexec.engine import CoexecModel, _CpuTask
    from inferd.errors import BackendError

    inputs = [_a(1, 6, 9, 9), _a(13, 6, 3, 3), _a(13)]
    attrs = {"pads": [1, 1, 1, 1]}
    g = graph_of_layer(single_node_layer("Conv", inputs, attrs), inputs)
    m = CoexecModel(g, {"n0": 0.5 if side == "split" else "cpu"})
    want = _ort("Conv", inputs, attrs)
    assert rel_err(m.run({"x0": inputs[0]})["y0"], want) <= TOL
    tasks = [arg for _op, arg in m.program if isinstance(arg, _CpuTask)]
    assert len(tasks) == 1 and tasks[0].split == (side == "split")
    call = weakref.ref(tasks[0].call)
    regions = list(m.regions)
    assert len(regions) == (1 if side == "cpu" else 0)
    held = [ex.arena.nbytes for ex in regions]
    del tasks
    was = gc.isenabled()
    gc.disable()
    try:
        assert call() is not None  # the model holds it
        m.close()
        assert call() is None, "the closed model still holds its CPU work"
        assert all(n > 0 for n in held) and all(ex.arena.nbytes == 0 for ex in regions)
        assert m.regions == [] and m.program == []
    finally:
        if was:
            gc.enable()
    with pytest.raises(BackendError, match="closed"):
        m.run({"x0": inputs[0]})
    m.close()
