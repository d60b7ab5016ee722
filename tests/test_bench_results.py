"""Result files: small JSON stays plain, large JSON is gzipped whole, and either reads back as written."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from inferd.bench import common


def test_small_results_stay_plain_json(tmp_path: Path) -> None:
    data = {"machine": {"date": "2026-12-06T00:00:00Z"}, "ratio": 0.5}
    jp, mp = common.write_results(tmp_path, "small", data, "| a |\n")
    assert jp == tmp_path / "2026-12-06_small.json" and mp.read_text() == "| a |\n"
    assert json.loads(jp.read_text()) == data and common.read_json(jp) == data
    assert not (tmp_path / "2026-12-06_small.json.gz").exists()


def test_large_results_are_gzipped_whole_and_the_same_data_makes_the_same_file(tmp_path: Path) -> None:
    rows = [{"layer": f"/block{i}/conv", "t0": i * 1e-4, "t1": i * 1e-4 + 3e-5} for i in range(3000)]
    data = {"machine": {"date": "2026-12-06T00:00:00Z"}, "timeline": rows}
    assert len(json.dumps(data, indent=2)) > common.JSON_GZIP_OVER
    jp, _ = common.write_results(tmp_path, "big", data, "")
    assert jp.name == "2026-12-06_big.json.gz" and not (tmp_path / "2026-12-06_big.json").exists()
    assert json.loads(gzip.decompress(jp.read_bytes())) == data and common.read_json(jp) == data
    first = jp.read_bytes()
    assert len(first) < common.JSON_GZIP_OVER
    again, _ = common.write_results(tmp_path, "big", data, "")
    assert again == jp and jp.read_bytes() == first  # no timestamp inside: a rerun changes nothing in git


def test_a_rerun_leaves_only_the_form_it_wrote(tmp_path: Path) -> None:
    """A result that was large and is small now (or the other way) does not leave its old file beside the new."""
    big = {"rows": list(range(40000))}
    small = {"rows": [1]}
    p1 = common.write_json(tmp_path, "r", big)
    assert p1.suffix == ".gz"
    p2 = common.write_json(tmp_path, "r", small)
    assert p2 == tmp_path / "r.json" and not p1.exists() and common.read_json(p2) == small
    p3 = common.write_json(tmp_path, "r", big)
    assert p3 == p1 and not p2.exists() and common.read_json(p3) == big
