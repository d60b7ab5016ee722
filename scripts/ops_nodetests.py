"""Issue 18's coverage figure: the ONNX backend node tests of the in-scope operators, passed / counted.

Runs ``tests/test_onnx_backend.py``'s node tests (pytest, junit XML to a temporary file) and classifies each
selected test (``SELECTED``: every op of its graph is one inferd claims):

* *issue-18 tests*: those whose graph holds an operator added by issue 18 (the ``# issue 18`` blocks of
  ``SUPPORTED_OPS``); the goal (>= 98%) is counted on them.
* *not expressible at opset <= MAX_OPSET*: a test skipped because its model needs a feature of an opset above the
  importer's range (``NOT_EXPRESSIBLE``): left out of the denominator, listed. Empty since the importer reads up to
  opset 28, the newest onnx 1.23 knows: every other exclusion is a limitation and counts as a miss.
* every other test counts: passed, or failed / skipped (a skip for a real limitation is a miss).

Also prints the same figure over all selected node tests. Writes ``bench/results/<date>_ops_nodetests.{json,md}``.
Usage: ``.venv/bin/python scripts/ops_nodetests.py [--out bench/results]``.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: exclusion reasons (names in tests/test_onnx_backend.py) that mean "not representable at the importer's opset"
NOT_EXPRESSIBLE: tuple[str, ...] = ()


def _outcomes(xml: Path) -> dict[str, str]:
    out = {}
    for tc in ET.parse(xml).getroot().iter("testcase"):
        kids = {c.tag for c in tc}
        out[tc.get("name", "")] = ("failed" if kids & {"failure", "error"} else
                                   "skipped" if "skipped" in kids else "passed")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tests"))
    import test_onnx_backend as T  # noqa: E402  (the selection and exclusions the suite itself uses)

    from inferd.bench.common import machine_info, write_results
    from inferd.frontend.onnx_import import MAX_OPSET

    src = (ROOT / "tests" / "test_onnx_backend.py").read_text()
    blocks = re.findall(r"# issue 18[^\n]*\n(.*?)(?=\n\s*#|\n\}\))", src, re.S)
    ops18 = {op for b in blocks for op in re.findall(r'"(\w+)"', b)}
    not_expr = {getattr(T, r) for r in NOT_EXPRESSIBLE}

    with tempfile.TemporaryDirectory() as d:
        xml = Path(d) / "junit.xml"
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests" /
                        "test_onnx_backend.py"), "-k", "OnnxBackendNodeModelTest", f"--junitxml={xml}"],
                       cwd=ROOT, stdout=subprocess.DEVNULL, check=False)
        res = _outcomes(xml)

    def figure(names: set[str]) -> dict[str, Any]:
        counted, left_out, misses = 0, [], []
        passed = 0
        for n in sorted(names):
            ex = T._exclusion(n)
            if ex is not None and ex[1] in not_expr:
                left_out.append(n)
                continue
            counted += 1
            if res.get(n) == "passed":
                passed += 1
            else:
                misses.append({"test": n, "outcome": res.get(n, "not run"), "reason": ex[1] if ex else ""})
        return {"selected": len(names), "not_expressible": len(left_out), "counted": counted, "passed": passed,
                "percent": round(100.0 * passed / counted, 2) if counted else None, "misses": misses}

    sel18 = {n for n, ops in T.SELECTED.items() if ops & ops18}
    data = {"machine": machine_info(), "max_opset": MAX_OPSET, "issue18_ops": sorted(ops18),
            "issue18": figure(sel18), "all_selected": figure(set(T.SELECTED)),
            "raw": {k: sum(1 for n in T.SELECTED if res.get(n) == k) for k in ("passed", "skipped", "failed")}}
    m, f18, fall = data["machine"], data["issue18"], data["all_selected"]
    lines = [f"# ONNX backend node tests of the in-scope operators ({m['date']}, {m['cpu']}, load {m['loadavg']})", "",
             f"Importer opset range up to {MAX_OPSET}; tests that need a later opset's feature are left out (listed "
             "in the JSON).", "",
             "| scope | selected | not expressible | counted | passed | % (goal >= 98) |", "|---|---|---|---|---|---|",
             f"| tests with an issue-18 operator | {f18['selected']} | {f18['not_expressible']} | {f18['counted']} | "
             f"{f18['passed']} | {f18['percent']} |",
             f"| all selected node tests | {fall['selected']} | {fall['not_expressible']} | {fall['counted']} | "
             f"{fall['passed']} | {fall['percent']} |", "",
             f"Goal (issue-18 operators >= 98%): {'met' if (f18['percent'] or 0) >= 98 else 'missed'}.", "",
             "Misses among the issue-18 tests:", ""]
    lines += [f"- `{x['test']}` ({x['outcome']}): {x['reason']}" for x in f18["misses"]] or ["- none"]
    from collections import Counter

    lines += ["", "Misses among all selected node tests, by reason:", ""]
    lines += [f"- {n}: {r or '(failed)'}" for r, n in Counter(x["reason"] for x in fall["misses"]).most_common()]
    jp, mp = write_results(a.out, "ops_nodetests", data, "\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {jp} and {mp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
