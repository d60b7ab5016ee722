"""ncnn as a peer for models it cannot take as exported: value-dependent ``If`` inlined, timed in a child.

ncnn has no control flow, and pnnx cannot convert an ONNX graph whose ``If`` branches on an input's value
(a VAD's sample rate). For a benchmark the inputs are fixed, so the graph can be specialised to them: every
``If`` whose condition onnxruntime evaluates on the benchmark's feeds is replaced by the branch it takes,
repeatedly (nested ``If``s surface as their parent is inlined). The result computes the same outputs for
those feeds, which ``time_ncnn`` checks against the caller's reference before a timing counts. This favours
ncnn (fewer nodes than the model inferd and onnxruntime run), which the benchmark states.

Timing runs in a child interpreter: ncnn's OpenMP workers spin after each run and would steal the cores
from whatever the parent times next.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .common import run_child


def _if_conditions(model: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, bool]:
    """The value each top-level ``If``'s condition takes on ``feeds`` (onnxruntime evaluates them)."""
    import onnx
    import onnxruntime as ort

    conds = sorted({n.input[0] for n in model.graph.node if n.op_type == "If"})
    if not conds:
        return {}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    for c in conds:
        probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(c))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in s.get_inputs()}
    vals = s.run(conds, {k: v for k, v in feeds.items() if k in names})
    return {c: bool(np.asarray(v).reshape(-1)[0]) for c, v in zip(conds, vals)}


def _prune(g: Any) -> None:
    """Drop nodes whose outputs nothing reads (the conditions of inlined ``If``s), then unused inputs."""
    while True:
        used = {o.name for o in g.output}
        for n in g.node:
            used.update(n.input)
        keep = [n for n in g.node if any(o in used for o in n.output)]
        if len(keep) == len(g.node):
            break
        del g.node[:]
        g.node.extend(keep)
    ins = [i for i in g.input if i.name in used]
    del g.input[:]
    g.input.extend(ins)


def inline_ifs(model: Any, feeds: Mapping[str, np.ndarray], freeze: Sequence[str] = (), max_rounds: int = 16) -> Any:
    """A copy of ``model`` with every ``If`` decided by ``feeds`` replaced by its taken branch (see module doc),
    the inputs named in ``freeze`` made constants of their feeds, and what no output needs any more dropped.
    Raises ValueError when an ``If`` is left (a condition onnxruntime could not evaluate)."""
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for _ in range(max_rounds):
        conds = _if_conditions(m, feeds)
        if not conds:
            frozen = [i for i in g.input if i.name in freeze]
            for i in frozen:
                g.input.remove(i)
                g.initializer.append(numpy_helper.from_array(np.asarray(feeds[i.name]), i.name))
            _prune(g)
            return m
        taken_names = {i.name for i in g.initializer}
        nodes = []
        for n in g.node:
            if n.op_type != "If":
                nodes.append(n)
                continue
            attr = {a.name: a.g for a in n.attribute}
            br = attr["then_branch" if conds[n.input[0]] else "else_branch"]
            for init in br.initializer:
                if init.name in taken_names:
                    raise ValueError(f"inlining {n.name}: initializer {init.name} exists twice")
                g.initializer.append(init)
                taken_names.add(init.name)
            nodes.extend(br.node)
            for src, dst in zip(br.output, n.output):
                nodes.append(helper.make_node("Identity", [src.name], [dst], name=f"{n.name}/inlined/{dst}"))
        del g.node[:]
        g.node.extend(nodes)
    raise ValueError(f"If nodes left after {max_rounds} rounds of inlining")


def toposort_param(param: Path) -> bool:
    """Put an ncnn ``.param``'s layers in dependency order, in place; True if it changed. pnnx writes some
    layers before the layers that produce their inputs (an LSTM's state outputs feeding a Concat), which
    ncnn rejects ("find_blob_index_by_name failed"); ncnn runs layers in file order, so sorting is enough."""
    lines = param.read_text().splitlines()
    head, layers = lines[:2], [ln for ln in lines[2:] if ln.strip()]
    parsed = []
    for ln in layers:
        f = ln.split()
        nin, nout = int(f[2]), int(f[3])
        parsed.append((ln, f[4:4 + nin], f[4 + nin:4 + nin + nout]))
    made: set[str] = set()
    out: list[str] = []
    todo = list(parsed)
    while todo:
        i = next((k for k, (_, ins, _o) in enumerate(todo) if all(b in made for b in ins)), None)
        if i is None:
            raise ValueError(f"{param}: a layer reads a blob no layer makes (cycle or missing producer)")
        ln, _ins, outs = todo.pop(i)
        out.append(ln)
        made.update(outs)
    if out == layers:
        return False
    param.write_text("\n".join(head + out) + "\n")
    return True


def fold_gru_weights(param: Path, binf: Path, model: Any) -> bool:
    """Give pnnx's dynamic-weight ``GRU`` (its weights as three ``MemoryData`` inputs and no parameters,
    which ncnn refuses at load) its weights as ncnn's own GRU layer stores them, from the ONNX ``GRU``
    node; in place, True if changed. Only the layout this conversion makes is handled: the three
    ``MemoryData`` are the first layers with weights in the file; anything else raises ValueError."""
    from onnx import numpy_helper

    lines = param.read_text().splitlines()
    gi = next((i for i, ln in enumerate(lines[2:], 2) if ln.split()[0] == "GRU" and len(ln.split()) == 4 + 5 + 2), None)
    if gi is None:
        return False
    f = lines[gi].split()
    x, wi, wh, b, h0 = f[4:9]
    mem = {ln.split()[4]: (i, ln) for i, ln in enumerate(lines[2:], 2) if ln.split()[0] == "MemoryData"}
    if not {wi, wh, b} <= set(mem) or len(mem) != 3:
        raise ValueError("GRU weights are not the three MemoryData layers this fix expects")
    weighted = {"Convolution", "Convolution1D", "InnerProduct", "Gemm", "LSTM", "GRU", "RNN", "BatchNorm",
                "Scale", "ConvolutionDepthWise", "Deconvolution", "Embed"}
    if any(ln.split()[0] in weighted for ln in lines[2:gi]):
        raise ValueError("a layer with weights precedes the GRU: its bytes cannot be located")
    nodes = [n for n in model.graph.node if n.op_type == "GRU"]
    if len(nodes) != 1:
        raise ValueError(f"{len(nodes)} GRU nodes in the model, this fix takes one")
    node = nodes[0]
    attrs = {a.name: a for a in node.attribute}
    if attrs.get("linear_before_reset") is None or attrs["linear_before_reset"].i != 1:
        raise ValueError("ncnn's GRU computes linear_before_reset=1 only")
    direction = {b"forward": 0, b"reverse": 1, b"bidirectional": 2}[attrs["direction"].s if "direction" in attrs else b"forward"]
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    W, R, B = (inits[n] for n in node.input[1:4])  # [dirs, 3H, in] (gates z, r, h), [dirs, 3H, H], [dirs, 6H]
    H = R.shape[-1]
    zrh = lambda a: np.concatenate([a[:, H:2 * H], a[:, :H], a[:, 2 * H:]], axis=1)  # ncnn and torch: r, z, n
    bias = np.stack([B[:, H:2 * H] + B[:, 4 * H:5 * H], B[:, :H] + B[:, 3 * H:4 * H], B[:, 2 * H:3 * H],
                     B[:, 5 * H:]], axis=1)  # [dirs, 4, H]
    flag = np.zeros(1, np.uint32).tobytes()  # ModelBin type 0: a zero flag word, then raw float32
    blob = b"".join(flag + np.ascontiguousarray(a, np.float32).tobytes() for a in (zrh(W), bias, zrh(R)))
    mem_bytes = 0
    for _i, ln in mem.values():
        p = dict(kv.split("=") for kv in ln.split()[5:])
        mem_bytes += 4 * int(p.get("0", 1)) * int(p.get("1", 1)) * int(p.get("2", 1))
    old = binf.read_bytes()
    drop = {i for i, _ in mem.values()}
    # pnnx swaps (batch, time) before the GRU; ncnn has no batch dimension, its sequence is already (T, features)
    inputs = {ln.split()[4] for ln in lines[2:] if ln.split()[0] == "Input"}
    perm = next((i for i, ln in enumerate(lines[2:gi], 2) if ln.split()[0] == "Permute" and ln.split()[5] == x
                 and ln.split()[4] in inputs), None)
    if perm is not None:
        x = lines[perm].split()[4]
        drop.add(perm)
    lines[gi] = (f"GRU {f[1]} 2 2 {x} {h0} {f[9]} {f[10]} 0={H} 1={W.size} 2={direction}")
    keep = [ln for i, ln in enumerate(lines) if i not in drop]
    n_layers, n_blobs = map(int, keep[1].split())
    keep[1] = f"{n_layers - len(drop)} {n_blobs - len(drop)}"
    param.write_text("\n".join(keep) + "\n")
    binf.write_bytes(blob + old[mem_bytes:])
    return True


_CHILD = r"""
import json, sys, time
import numpy as np
import ncnn
param, binf, feeds_path, threads, repeat, warmup = sys.argv[1:7]
threads, repeat, warmup = int(threads), int(repeat), int(warmup)
z = np.load(feeds_path)
ins = [z[f"in{i}"] for i in range(len([k for k in z.files if k.startswith("in")]))]
n_out = int(z["n_out"])
net = ncnn.Net()
net.opt.num_threads = threads
net.opt.use_fp16_storage = net.opt.use_fp16_arithmetic = net.opt.use_fp16_packed = False
net.load_param(param); net.load_model(binf)
def run():
    ex = net.create_extractor()
    for i, a in enumerate(ins):
        ex.input(f"in{i}", ncnn.Mat(np.ascontiguousarray(a), batch_index=233).clone())
    return [np.array(ex.extract(f"out{j}")[1].numpy(batch_index=233)) for j in range(n_out)]
for _ in range(warmup):
    outs = run()
ts = []
for _ in range(repeat):
    t = time.perf_counter(); run(); ts.append(time.perf_counter() - t)
np.savez(feeds_path + ".out.npz", *outs)
print("RESULT " + json.dumps({"ms": float(np.median(ts) * 1e3)}))
"""


def time_ncnn(param: Path, binf: Path, inputs: Sequence[np.ndarray], ref: Sequence[np.ndarray], threads: int,
              repeat: int, warmup: int, work: Path, tol: float = 1e-3) -> dict[str, Any]:
    """Median ms of ncnn (fp32, ``threads``) on ``inputs`` (pnnx's ``in0``.. order), with the largest error of
    its outputs against ``ref`` (pnnx's ``out0``.. order, relative to each output's largest magnitude); a
    result whose error exceeds ``tol`` is reported as an error, not a timing."""
    work.mkdir(parents=True, exist_ok=True)
    fp = work / f"feeds_{threads}.npz"
    np.savez(fp, n_out=np.array(len(ref)), **{f"in{i}": a for i, a in enumerate(inputs)})
    r = run_child(_CHILD, [str(param), str(binf), str(fp), str(threads), str(repeat), str(warmup)])
    if "error" in r:
        return r
    got = np.load(str(fp) + ".out.npz")
    errs = []
    for j, want in enumerate(ref):
        have = got[f"arr_{j}"].reshape(-1)
        want = np.asarray(want, np.float32).reshape(-1)
        if have.size != want.size:
            return {"error": f"output {j}: ncnn gave {have.size} values, the reference {want.size}"}
        errs.append(float(np.max(np.abs(have - want)) / max(float(np.max(np.abs(want))), 1e-12)))
    err = max(errs) if errs else 0.0
    if err > tol:
        return {"error": f"ncnn's outputs differ from onnxruntime's (max rel err {err:.2e} > {tol:g})",
                "ms": r["ms"]}
    return {"ms": round(r["ms"], 4), "max_rel_err": float(f"{err:.3g}")}
