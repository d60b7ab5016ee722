"""Issue 18's export corpus as a table: every architecture of ``tests/export_corpus.py`` through its exporters
(torch's two, tf2onnx, paddle2onnx; those not installed here are left out), run by inferd on the CPU and on
Vulkan (lavapipe here) against onnxruntime on the CPU.

Per (architecture, exporter, device): passed (the test suite's tolerance: |inferd - onnxruntime| <= 1e-3 relative
+ 5e-4 of the output's largest magnitude; integers equal), the largest difference relative to that magnitude,
and the seconds to load and run once. Writes ``bench/results/<date>_ops_corpus.{json,md}``.
Usage: ``.venv/bin/python scripts/ops_corpus.py [--out bench/results] [--devices cpu,vulkan]``.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _check(names: list[str], got: dict[str, np.ndarray], want: list[np.ndarray]) -> tuple[bool, float]:
    ok, worst = True, 0.0
    for n, w in zip(names, want):
        g = got[n]
        if g.shape != w.shape:
            return False, float("inf")
        if w.dtype.kind in "iub":
            ok &= bool(np.array_equal(g, w))
            continue
        scale = max(float(np.abs(w).max()) if w.size else 0.0, 1e-30)
        d = np.abs(g.astype(np.float64) - w)
        worst = max(worst, float(d.max() / scale) if d.size else 0.0)
        ok &= bool(np.all(d <= 1e-3 * np.abs(w) + 5e-4 * scale))
    return ok, worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--devices", default="cpu,vulkan")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tests"))
    import export_corpus as corpus  # noqa: E402
    import onnxruntime as ort

    import inferd
    import inferd.vulkan
    from inferd.bench.common import machine_info, write_results

    devices = [d for d in a.devices.split(",") if d != "vulkan" or inferd.vulkan.available()]
    rows: list[dict[str, Any]] = []
    for arch in corpus.CORPUS:
        for exporter in corpus.exporters_of(arch):
            if corpus.missing(arch, exporter):
                continue
            row: dict[str, Any] = {"model": arch.name, "source": arch.source, "exporter": exporter}
            rows.append(row)
            try:
                path, x = corpus.export(arch, exporter)
            except Exception as e:
                first = re.sub(r"\x1b\[[0-9;]*m", "", str(e).splitlines()[0])  # no terminal colours
                row["export_error"] = f"{type(e).__name__}: {first[:200]}"
                continue
            sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            feeds = {sess.get_inputs()[0].name: x}
            names = [o.name for o in sess.get_outputs()]
            want = sess.run(None, feeds)
            row["outputs"] = [list(w.shape) for w in want]
            for dev in devices:
                t = time.perf_counter()
                try:
                    got = inferd.load(str(path), device=dev).run(feeds)
                    ok, worst = _check(names, got, want)
                    row[dev] = {"passed": ok, "max_rel_diff": worst, "load_run_s": round(time.perf_counter() - t, 2)}
                except Exception as e:
                    row[dev] = {"passed": False, "error": f"{type(e).__name__}: {str(e)[:200]}"}
            print(row, flush=True)
    data = {"machine": machine_info(), "versions": {k: v for src in ("torch", "keras", "paddle") for k, v in corpus.versions(src).items()}, "devices": devices, "rows": rows}
    m = data["machine"]
    lines = [f"# Export corpus: inferd vs onnxruntime ({m['date']}, {m['cpu']}, load {m['loadavg']})", "",
             f"Versions: {data['versions']}. Vulkan is lavapipe on this machine. Tolerance: 1e-3 relative + 5e-4 of "
             "the output's largest magnitude (the test suite's).", "",
             "| model | exporter | outputs | " + " | ".join(devices) + " |",
             "|---|---|---|" + "---|" * len(devices)]
    for r in rows:
        if "export_error" in r:
            lines.append(f"| {r['model']} | {r['exporter']} | export failed: {r['export_error']} |"
                         + " - |" * len(devices))
            continue
        cells = []
        for d in devices:
            c = r[d]
            why = c.get("error") or f"max rel diff {c.get('max_rel_diff')}"
            cells.append(f"pass ({c['max_rel_diff']:.1e}, {c['load_run_s']} s)" if c["passed"] else f"FAIL: {why}")
        lines.append(f"| {r['model']} | {r['exporter']} | {r['outputs']} | " + " | ".join(cells) + " |")
    exported = [r for r in rows if "export_error" not in r]
    for d in devices:
        n = sum(1 for r in exported if r[d]["passed"])
        lines.append(f"\n{d}: {n} of {len(exported)} exported models match onnxruntime "
                     f"({len(rows) - len(exported)} exports failed in the exporter itself).")
    jp, mp = write_results(a.out, "ops_corpus", data, "\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {jp} and {mp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
