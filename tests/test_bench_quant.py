"""``inferd bench quant``'s table: the paired ratio (the median of each round's own inferd / onnxruntime ratio, with
its interquartile range) stands first, the ratio of the loop's medians beside it, and a row that failed keeps
the table's column count."""
from __future__ import annotations

from inferd.bench.quant_bench import table

MACHINE = {"date": "2026-12-04T00:00:00Z", "host": "vm", "cpu": "test cpu", "cores": 2}


def _row(**over: object) -> dict:
    r = {"model": "resnet50", "scheme": "qdq_u8s8_pc", "device": "cpu", "inferd_int8_warm_ms": 13.2,
         "inferd_fp32_warm_ms": 40.0, "ort_int8_warm_ms": 12.0, "ort_fp32_warm_ms": 41.0, "warm_vs_ort": 1.1,
         "warm_vs_ort_int8_paired": 1.031, "warm_vs_ort_int8_paired_iqr": [1.004, 1.096], "warm_vs_fp32": 0.33,
         "package_raw_ratio": 0.249, "package_ratio": 0.225, "stored_ratio": 0.254, "resident_ratio": 0.196,
         "err_max_steps": 0.0, "err_frac_differing": 0.0, "loadavg": [1.0, 1.0]}
    r.update(over)
    return r


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_paired_ratio_comes_first_and_the_medians_ratio_beside_it() -> None:
    lines = table([_row()], MACHINE).splitlines()
    header = next(ln for ln in lines if ln.startswith("| model"))
    row = next(ln for ln in lines if ln.startswith("| resnet50"))
    cols = _cells(header)
    cells = _cells(row)
    assert len(cells) == len(cols)
    assert cells[cols.index("vs ort")] == "1.03x (1.00-1.10)"
    assert cells[cols.index("vs ort (medians)")] == "1.10x"


def test_a_row_without_a_paired_ratio_or_with_an_error_keeps_the_columns() -> None:
    old = _row()
    del old["warm_vs_ort_int8_paired"], old["warm_vs_ort_int8_paired_iqr"]
    text = table([old, {"model": "vgg16", "scheme": "qdq_s8s8", "error": "boom"}], MACHINE)
    lines = text.splitlines()
    ncols = len(_cells(next(ln for ln in lines if ln.startswith("| model"))))
    for name in ("resnet50", "vgg16"):
        row = next(ln for ln in lines if ln.startswith(f"| {name}"))
        assert len(_cells(row)) == ncols
    assert "n/a" in _cells(next(ln for ln in lines if ln.startswith("| resnet50")))[6]


def test_the_int8_to_fp32_cell_is_paired_where_the_row_has_a_paired_ratio() -> None:
    lines = table([_row(warm_vs_fp32_paired=0.451, warm_vs_fp32_paired_iqr=[0.402, 0.5]), _row()], MACHINE).splitlines()
    cols = _cells(next(ln for ln in lines if ln.startswith("| model")))
    rows = [_cells(ln) for ln in lines if ln.startswith("| resnet50")]
    assert rows[0][cols.index("vs fp32")] == "0.45x (0.40-0.50)"
    assert rows[1][cols.index("vs fp32")] == "0.33x"  # the two loops' medians where nothing was paired
