"""``inferd bench ops``: detection post-processing nodes against onnxruntime.

Each case is a one-node ONNX model (TopK over a few thousand scores, NonMaxSuppression over a few thousand boxes,
RoiAlign over a feature map) run by inferd's CPU engine (``CpuExecutor.run``: feed copy, the node, output copy)
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


def _cases(rng: np.random.Generator) -> list[tuple[str, Any, dict[str, np.ndarray]]]:
    from onnx import TensorProto as T, helper as h

    def model(node, inputs):  # type: ignore[no-untyped-def]
        g = h.make_graph([node], "g", [h.make_tensor_value_info(n, t, list(a.shape)) for n, t, a in inputs],
                         [h.make_empty_tensor_value_info(o) for o in node.output])
        m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
        m.ir_version = 8
        return m, {n: a for n, _t, a in inputs}

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


def run(repeat: int = 30) -> dict[str, Any]:
    import onnx
    import onnxruntime as ort

    from .. import native
    from ..frontend import import_model
    from ..runtime.cpu import CpuExecutor

    native.claim_cores()
    threads = native.num_threads() if hasattr(native, "num_threads") else (os.cpu_count() or 1)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name, m, feeds in _cases(np.random.default_rng(0)):
            p = Path(d) / "m.onnx"
            onnx.save(m, p)
            ex = CpuExecutor(import_model(str(p)))
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            sess = ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"])
            ours, theirs = [], []
            for _ in range(3):  # alternate, so a burst of load hits both
                ours += time_calls(lambda: ex.run(feeds), repeat // 3, warmup=3)
                theirs += time_calls(lambda: sess.run(None, feeds), repeat // 3, warmup=3)
            got, want = ex.run(feeds), sess.run(None, feeds)
            same = all(np.array_equal(got[o.name], w) if w.dtype.kind in "iu" else np.allclose(got[o.name], w, atol=1e-5)
                       for o, w in zip(m.graph.output, want))
            rows.append({"case": name, "kernels": [k.name for _l, k in ex.choice], "inferd_ms": median_ms(ours),
                         "ort_ms": median_ms(theirs), "ratio": ratio(median_ms(ours), median_ms(theirs)),
                         "outputs_equal": bool(same), "out_shape": [list(np.shape(w)) for w in want]})
    return {"machine": machine_info(), "threads": threads, "repeat": repeat, "rows": rows}


def table(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [f"# Detection post-processing nodes vs onnxruntime ({m['date']}, {m['cpu']}, {m['cores']} cores, "
             f"load {m['loadavg']}, shared machine)", "",
             "| case | inferd kernel | inferd ms | onnxruntime ms | ratio (goal <= 1.0) | same outputs |",
             "|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['case']} | {', '.join(r['kernels'])} | {fmt(r['inferd_ms'], '.3f')} | "
                     f"{fmt(r['ort_ms'], '.3f')} | {fmt(r['ratio'], '.2f')} | {r['outputs_equal']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="inferd bench ops", description=__doc__)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args(argv)
    res = run(a.repeat)
    md = table(res)
    jp, mp = write_results(a.out, "ops_detection_cpu", res, md)
    print(md)
    print(f"wrote {jp} and {mp}")
    return 0
