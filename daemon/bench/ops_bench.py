"""``inferd bench ops``: single nodes on inferd's hot paths against onnxruntime.

Two case sets: ``detection`` (TopK over a few thousand scores, NonMaxSuppression over a few thousand boxes, RoiAlign
over a feature map) and ``hot`` (the other operators issue 18 wants native where they sit on a hot path, at the
sizes real models give them: GridSample as RAFT and spatial transformers use it, Einsum as attention writes it,
CumSum, GatherND/ScatterND as detectors and Swin export them, GroupNormalization, RMSNormalization, DepthToSpace).
Each case is a one-node ONNX model run by inferd's CPU engine (``CpuExecutor.run``: feed copy, the node, output copy)
and by onnxruntime (default session, all graph optimisations, the same thread count: its strongest CPU
configuration for one node), alternating in one process; medians of ``--repeat`` runs and their ratio. The goal
(issue 18) is a ratio of at most 1.0.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .common import fmt, machine_info, median_ms, ratio, time_calls, write_results


Case = tuple[str, Any, dict[str, np.ndarray]]


def _model(node: Any, inputs: list[tuple[str, int, np.ndarray]], opset: int = 17) -> tuple[Any, dict[str, np.ndarray]]:
    from onnx import helper as h

    g = h.make_graph([node], "g", [h.make_tensor_value_info(n, t, list(a.shape)) for n, t, a in inputs],
                     [h.make_empty_tensor_value_info(o) for o in node.output])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8 if opset <= 17 else 10
    return m, {n: a for n, _t, a in inputs}


def _cases(rng: np.random.Generator) -> list[Case]:
    from onnx import TensorProto as T, helper as h

    model = _model

    def boxes(b: int, n: int) -> np.ndarray:
        xy = rng.random((b, n, 2), dtype=np.float32) * 600
        return np.concatenate([xy, xy + 20 + rng.random((b, n, 2), dtype=np.float32) * 80], -1)

    out = []
    for n, k in ((5000, 100), (20000, 1000)):
        s = rng.random((1, n), dtype=np.float32)
        out.append((f"TopK 1x{n} k={k}",) + model(h.make_node("TopK", ["s", "k"], ["v", "i"]),
                                                   [("s", T.FLOAT, s), ("k", T.INT64, np.array([k], np.int64))]))
    for b, c, n, mo in ((1, 1, 3000, 200), (1, 1, 5000, 1000), (1, 80, 1000, 100)):
        sc = rng.random((b, c, n), dtype=np.float32)
        out.append((f"NMS {c} class x {n} boxes, max {mo}",) + model(
            h.make_node("NonMaxSuppression", ["b", "s", "mo", "iou", "st"], ["sel"]),
            [("b", T.FLOAT, boxes(b, n)), ("s", T.FLOAT, sc), ("mo", T.INT64, np.array([mo], np.int64)),
             ("iou", T.FLOAT, np.array([0.5], np.float32)), ("st", T.FLOAT, np.array([0.05], np.float32))]))
    x = rng.random((1, 256, 50, 68), dtype=np.float32)
    for r, sr in ((100, 2), (512, 0)):
        rois = rng.random((r, 4), dtype=np.float32) * 400
        rois[:, 2:] = rois[:, :2] + 16 + rng.random((r, 2), dtype=np.float32) * 200
        out.append((f"RoiAlign 256x50x68, {r} rois 7x7 sampling {sr}",) + model(
            h.make_node("RoiAlign", ["x", "r", "bi"], ["y"], output_height=7, output_width=7, sampling_ratio=sr,
                        spatial_scale=0.125),
            [("x", T.FLOAT, x), ("r", T.FLOAT, rois), ("bi", T.INT64, np.zeros(r, np.int64))]))
    return out


def _hot_cases(rng: np.random.Generator) -> list[Case]:
    from onnx import TensorProto as T, helper as h

    F, I = T.FLOAT, T.INT64
    out: list[Case] = []

    def grid(n: int, oh: int, ow: int) -> np.ndarray:
        # a smooth warp of the identity (a flow field), reaching a little past the border
        ys, xs = np.meshgrid(np.linspace(-1.05, 1.05, oh, dtype=np.float32), np.linspace(-1.05, 1.05, ow, dtype=np.float32),
                             indexing="ij")
        g = np.stack([xs, ys], -1)[None].repeat(n, 0)
        return (g + (rng.random(g.shape, dtype=np.float32) - 0.5) * 0.1).astype(np.float32)

    x = rng.random((1, 64, 64, 64), dtype=np.float32)
    for pad in ("zeros", "border"):
        for ac in (0, 1):
            out.append((f"GridSample 1x64x64x64, 64x64 grid, bilinear {pad} align_corners={ac}",) + _model(
                h.make_node("GridSample", ["x", "g"], ["y"], mode="bilinear", padding_mode=pad, align_corners=ac),
                [("x", F, x), ("g", F, grid(1, 64, 64))]))
    xr = rng.random((1, 256, 46, 62), dtype=np.float32)
    out.append(("GridSample 1x256x46x62 (RAFT), 46x62 grid, bilinear zeros align_corners=1",) + _model(
        h.make_node("GridSample", ["x", "g"], ["y"], mode="bilinear", padding_mode="zeros", align_corners=1),
        [("x", F, xr), ("g", F, grid(1, 46, 62))]))
    q = rng.standard_normal((1, 8, 196, 32), dtype=np.float32)
    k = rng.standard_normal((1, 8, 196, 32), dtype=np.float32)
    p = rng.random((1, 8, 196, 196), dtype=np.float32)
    out.append(("Einsum bhqd,bhkd->bhqk 1x8x196x32",) + _model(
        h.make_node("Einsum", ["a", "b"], ["y"], equation="bhqd,bhkd->bhqk"), [("a", F, q), ("b", F, k)]))
    out.append(("Einsum bhqk,bhkd->bhqd 1x8x196x196 . 1x8x196x32",) + _model(
        h.make_node("Einsum", ["a", "b"], ["y"], equation="bhqk,bhkd->bhqd"), [("a", F, p), ("b", F, k)]))
    out.append(("Einsum bij,bjk->bik 8x196x64 . 8x64x196",) + _model(
        h.make_node("Einsum", ["a", "b"], ["y"], equation="bij,bjk->bik"),
        [("a", F, rng.standard_normal((8, 196, 64), dtype=np.float32)),
         ("b", F, rng.standard_normal((8, 64, 196), dtype=np.float32))]))
    out.append(("CumSum 1x4096x64 axis 1",) + _model(
        h.make_node("CumSum", ["x", "a"], ["y"]),
        [("x", F, rng.random((1, 4096, 64), dtype=np.float32)), ("a", I, np.array(1, np.int64))]))
    sc = rng.random((1, 80, 3000), dtype=np.float32)
    sel = np.stack([np.zeros(1000, np.int64), rng.integers(0, 80, 1000), rng.integers(0, 3000, 1000)], -1)
    out.append(("GatherND scores 1x80x3000 by 1000 NMS triples",) + _model(
        h.make_node("GatherND", ["d", "i"], ["y"]), [("d", F, sc), ("i", I, sel)]))
    feat = rng.random((1, 3000, 256), dtype=np.float32)
    out.append(("GatherND rows 1x3000x256 by 1x300x1, batch_dims=1",) + _model(
        h.make_node("GatherND", ["d", "i"], ["y"], batch_dims=1),
        [("d", F, feat), ("i", I, rng.integers(0, 3000, (1, 300, 1)).astype(np.int64))]))
    # Swin's shifted-window mask / slice assignment as torch exports it: rows of a 56x56x96 map overwritten
    hh, ww = np.meshgrid(np.arange(53, 56), np.arange(56), indexing="ij")
    idx = np.stack([np.zeros(hh.size, np.int64), hh.reshape(-1), ww.reshape(-1)], -1).astype(np.int64)
    out.append(("ScatterND 1x56x56x96, 168 rows of 96",) + _model(
        h.make_node("ScatterND", ["d", "i", "u"], ["y"]),
        [("d", F, rng.random((1, 56, 56, 96), dtype=np.float32)), ("i", I, idx),
         ("u", F, rng.random((idx.shape[0], 96), dtype=np.float32))]))
    rows = rng.permutation(4096)[:512].reshape(512, 1)
    out.append(("ScatterND 1x4096x64, 512 rows of 64",) + _model(
        h.make_node("ScatterND", ["d", "i", "u"], ["y"]),
        [("d", F, rng.random((4096, 64), dtype=np.float32)), ("i", I, rows.astype(np.int64)),
         ("u", F, rng.random((512, 64), dtype=np.float32))]))
    out.append(("GroupNormalization 1x256x64x64, 32 groups",) + _model(
        h.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=32, epsilon=1e-5),
        [("x", F, rng.standard_normal((1, 256, 64, 64), dtype=np.float32)),
         ("s", F, rng.random(256, dtype=np.float32)), ("b", F, rng.random(256, dtype=np.float32))], opset=21))
    out.append(("RMSNormalization 1x196x384",) + _model(
        h.make_node("RMSNormalization", ["x", "s"], ["y"], axis=-1, epsilon=1e-6),
        [("x", F, rng.standard_normal((1, 196, 384), dtype=np.float32)), ("s", F, rng.random(384, dtype=np.float32))],
        opset=23))
    xd = rng.random((1, 64, 56, 56), dtype=np.float32)
    for mode in ("DCR", "CRD"):
        out.append((f"DepthToSpace 1x64x56x56 blocksize 2 {mode}",) + _model(
            h.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, mode=mode), [("x", F, xd)]))
    return out


CASE_SETS = {"detection": _cases, "hot": _hot_cases}


def run(repeat: int = 30, case_set: str = "detection") -> dict[str, Any]:
    import onnx
    import onnxruntime as ort

    from .. import native
    from ..frontend import import_model
    from ..runtime.cpu import CpuExecutor

    native.claim_cores()
    threads = native.num_threads() if hasattr(native, "num_threads") else (os.cpu_count() or 1)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name, m, feeds in CASE_SETS[case_set](np.random.default_rng(0)):
            p = Path(d) / "m.onnx"
            onnx.save(m, p)
            ex = CpuExecutor(import_model(str(p)))
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            sess = ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"])
            # the nodes alone besides: run() less its feed and output copies (onnxruntime reads its feeds in
            # place), what the kernels cost beside what a caller of CpuExecutor.run pays
            ex.run(feeds)
            calls = list(ex._calls)
            ours, theirs, nodes = [], [], []
            for _ in range(3):  # alternate, so a burst of load hits all three
                ours += time_calls(lambda: ex.run(feeds), repeat // 3, warmup=3)
                theirs += time_calls(lambda: sess.run(None, feeds), repeat // 3, warmup=3)
                nodes += time_calls(lambda: [c() for c in calls], repeat // 3, warmup=3)
            got, want = ex.run(feeds), sess.run(None, feeds)
            same = all(np.array_equal(got[o.name], w) if w.dtype.kind in "iu" else np.allclose(got[o.name], w, atol=1e-5)
                       for o, w in zip(m.graph.output, want))
            rows.append({"case": name, "kernels": [k.name for _l, k in ex.choice], "inferd_ms": median_ms(ours),
                         "ort_ms": median_ms(theirs), "ratio": ratio(median_ms(ours), median_ms(theirs)),
                         "inferd_nodes_ms": median_ms(nodes), "nodes_ratio": ratio(median_ms(nodes), median_ms(theirs)),
                         "outputs_equal": bool(same), "out_shape": [list(np.shape(w)) for w in want]})
    return {"machine": machine_info(), "threads": threads, "repeat": repeat, "case_set": case_set, "rows": rows}


def table(res: dict[str, Any]) -> str:
    m = res["machine"]
    title = "Hot-path operator nodes" if res.get("case_set") == "hot" else "Detection post-processing nodes"
    lines = [f"# {title} vs onnxruntime ({m['date']}, {m['cpu']}, {m['cores']} cores, "
             f"load {m['loadavg']}, shared machine)", "",
             "| case | inferd kernel | inferd ms | onnxruntime ms | ratio (goal <= 1.0) | inferd nodes ms | nodes ratio "
             "| same outputs |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['case']} | {', '.join(r['kernels'])} | {fmt(r['inferd_ms'], '.3f')} | "
                     f"{fmt(r['ort_ms'], '.3f')} | {fmt(r['ratio'], '.2f')} | {fmt(r.get('inferd_nodes_ms'), '.3f')} | "
                     f"{fmt(r.get('nodes_ratio'), '.2f')} | {r['outputs_equal']} |")
    lines += ["", "inferd ms: CpuExecutor.run (feed copy into the arena, the node, output copy); inferd nodes ms: the "
              "node's bound call alone (onnxruntime reads its feeds in place, so a node with a large input pays "
              "the copy only on inferd's side)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="inferd bench ops", description=__doc__)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--set", dest="case_set", choices=sorted(CASE_SETS), default="detection")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--tag", default="", help="suffix of the result files' names")
    a = ap.parse_args(argv)
    res = run(a.repeat, a.case_set)
    md = table(res)
    stem = f"ops_{a.case_set}_cpu" + (f"_{a.tag}" if a.tag else "")
    jp, mp = write_results(a.out, stem, res, md)
    print(md)
    print(f"wrote {jp} and {mp}")
    return 0
