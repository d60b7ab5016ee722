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

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .common import run_child


def pnnx_exe() -> str | None:
    """The standalone pnnx binary (the wheel's ``pnnx`` script on PATH imports torch; the binary does not)."""
    exe = os.environ.get("INFERD_PNNX")
    if exe:
        return exe
    try:
        import importlib.util
        spec = importlib.util.find_spec("pnnx")
        if spec and spec.origin:
            cand = Path(spec.origin).parent / "pnnx"
            if cand.is_file():
                return str(cand)
    except Exception:
        pass
    return shutil.which("pnnx")


def convert_ncnn(onnx_path: Path, shape: "tuple[int, ...] | list[tuple[tuple[int, ...], str]]", work: Path,
                 fp16: bool = False) -> tuple[Path, Path]:
    """(param, bin) made by pnnx; ``fp16``: its default fp16 weights (ncnn's default deployment), else fp32.
    ``shape``: the one float input's shape, or per input (shape, numpy dtype name) in the graph's order."""
    import hashlib

    work.mkdir(parents=True, exist_ok=True)
    dst = work / onnx_path.name
    shapes = [(tuple(shape), "float32")] if all(isinstance(d, int) for d in shape) else list(shape)
    suffix = {"float32": "", "int64": "i64", "int32": "i32"}
    spec = ",".join(f"[{','.join(map(str, s))}]{suffix[dt]}" for s, dt in shapes)
    args = [f"inputshape={spec}"] + ([] if fp16 else ["fp16=0"])
    param, binf = work / (dst.stem + ".ncnn.param"), work / (dst.stem + ".ncnn.bin")
    # a conversion of the same bytes with the same arguments is reused (a re-run, or a machine without pnnx
    # given the converted files)
    stamp = work / (dst.stem + ".ncnn.src")
    key = hashlib.sha256(onnx_path.read_bytes()).hexdigest() + " " + " ".join(args)
    try:
        if param.is_file() and binf.is_file() and stamp.read_text() == key:
            return param, binf
    except OSError:
        pass
    exe = pnnx_exe()
    if exe is None:
        raise RuntimeError("pnnx not found: set INFERD_PNNX or install the pnnx package")
    shutil.copy(onnx_path, dst)
    r = subprocess.run([exe, dst.name, *args], cwd=work, capture_output=True, text=True, timeout=900)
    if not param.is_file():
        raise RuntimeError(f"pnnx failed on {onnx_path.name}: {r.stderr[-2000:]}")
    stamp.write_text(key)
    return param, binf



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
param, binf, io_path = sys.argv[1:4]
o = json.loads(sys.argv[4])
z = np.load(io_path)
ins = [np.ascontiguousarray(z[f"in{i}"]) for i in range(o["n_in"])]
dev = "cpu"
if o["vulkan"]:
    ncnn.create_gpu_instance()
    dev = ncnn.get_gpu_device(0).info().device_name() if hasattr(ncnn, "get_gpu_device") else "?"
t = time.perf_counter()
net = ncnn.Net()
net.opt.use_vulkan_compute = o["vulkan"]
if o["threads"]:
    net.opt.num_threads = o["threads"]
if not o["fp16"]:
    net.opt.use_fp16_packed = net.opt.use_fp16_storage = net.opt.use_fp16_arithmetic = False
net.load_param(param); net.load_model(binf)
if o["batch_index"]:  # pnnx's convention for inputs given with their batch dimension
    mat, arr = (lambda a: ncnn.Mat(a, batch_index=233).clone()), (lambda m: m.numpy(batch_index=233))
else:
    mat, arr = ncnn.Mat, (lambda m: m)
def run():
    ex = net.create_extractor()
    for i, a in enumerate(ins):
        ex.input(f"in{i}", mat(a))
    return [np.array(arr(ex.extract(f"out{j}")[1])) for j in range(o["n_out"])]
outs = run()
cold = time.perf_counter() - t
for _ in range(o["warmup"]):
    run()
ws = []
for _ in range(o["nwarm"]):
    t = time.perf_counter(); run(); ws.append(time.perf_counter() - t)
np.savez(io_path + ".out.npz", *outs)
res = {"cold_ms": cold * 1e3, "warm_ms": 1e3 * float(np.median(ws)) if ws else None, "device": str(dev),
       "fp16": [bool(net.opt.use_fp16_packed), bool(net.opt.use_fp16_storage), bool(net.opt.use_fp16_arithmetic)]}
del net
if o["vulkan"]:
    ncnn.destroy_gpu_instance()
print("RESULT " + json.dumps(res))
"""


def run_ncnn(param: Path, binf: Path, inputs: Sequence[np.ndarray], n_out: int, work: Path, *, nwarm: int,
             warmup: int = 0, vulkan: bool = False, fp16: bool = False, threads: int = 0, batch_index: bool = True,
             env: Mapping[str, str] | None = None) -> tuple[dict[str, Any], list[np.ndarray]]:
    """ncnn on ``inputs`` (pnnx's ``in0``.. order) in a fresh interpreter: ``cold_ms`` (Net, load, first run),
    ``warm_ms`` (median of ``nwarm`` runs after ``warmup`` more), the device and its fp16 options (``fp16``:
    ncnn's defaults, else all off; ``threads`` 0: ncnn's default), and the outputs ``out0``.. of the first run.
    ``batch_index``: inputs carry their batch dimension (pnnx's convention), else they come without it.
    On failure the dict is ``{"error": ...}`` and the list empty."""
    work.mkdir(parents=True, exist_ok=True)
    io = work / f"ncnn_io_{'vk' if vulkan else 'cpu'}_{threads}.npz"
    np.savez(io, **{f"in{i}": a for i, a in enumerate(inputs)})
    opts = {"n_in": len(inputs), "n_out": n_out, "vulkan": vulkan, "fp16": fp16, "threads": threads,
            "batch_index": batch_index, "nwarm": nwarm, "warmup": warmup}
    r = run_child(_CHILD, [str(param), str(binf), str(io), json.dumps(opts)], dict(env) if env is not None else None)
    if "error" in r:
        return r, []
    got = np.load(str(io) + ".out.npz")
    return r, [got[f"arr_{j}"] for j in range(n_out)]


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| over max |want| (flattened), or inf when the sizes differ."""
    g, w = np.asarray(got, np.float32).reshape(-1), np.asarray(want, np.float32).reshape(-1)
    if g.size != w.size:
        return float("inf")
    return float(np.max(np.abs(g - w)) / max(float(np.max(np.abs(w))), 1e-12)) if w.size else 0.0


def time_ncnn(param: Path, binf: Path, inputs: Sequence[np.ndarray], ref: Sequence[np.ndarray], threads: int,
              repeat: int, warmup: int, work: Path, tol: float = 1e-3) -> dict[str, Any]:
    """Warm median ms of ncnn on the CPU (fp32, ``threads``), with the largest error of its outputs against
    ``ref`` (pnnx's ``out0``.. order); a result whose error exceeds ``tol`` is an error, not a timing."""
    r, outs = run_ncnn(param, binf, inputs, len(ref), work, nwarm=repeat, warmup=warmup, threads=threads)
    if "error" in r:
        return r
    err = max((rel_err(o, w) for o, w in zip(outs, ref)), default=0.0)
    if err > tol:
        return {"error": f"ncnn's outputs differ from onnxruntime's (max rel err {err:.2e} > {tol:g})",
                "ms": r["warm_ms"]}
    return {"ms": round(r["warm_ms"], 4), "max_rel_err": float(f"{err:.3g}")}
