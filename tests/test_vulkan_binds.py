"""Recorded binds on Vulkan (``inferd.vulkan.binds``): a cold load of a package whose layers were recorded rebuilds
their dispatches from the record, answers exactly as the load that worked them out, and records the same again; a
record that is damaged, stale or does not fit a layer is not used for it. Validation layers on, and no error."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import inferd
import inferd.vulkan
from inferd.package import compile_model, read_plan
from inferd.runtime import bindrec
from inferd.vulkan import binds as vkbinds
from vkutil import validated_shared_device
from zoo_fixture import check_against_reference, zoo_reference

pytestmark = [pytest.mark.vulkan,
              pytest.mark.skipif(not inferd.vulkan.available(), reason="no Vulkan device")]

TOL = 1e-3
SMALL = ["squeezenet1_1", "mobilenetv2"]


@pytest.fixture(scope="module", autouse=True)
def device(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from validated_shared_device(tmp_path_factory.mktemp("vkbinds"))


def _package(name: str, root: Path) -> Path:
    return compile_model(zoo_reference(name)[0], root / name, device="vulkan", profile=False)


def _key(m: inferd.Model, pkg: Path) -> dict[str, Any]:
    return {**bindrec.key_of(read_plan(pkg / "plan.bin")), **m._exec.binds_key}


def _records(pkg: Path, key: dict[str, Any]) -> dict[str, Any]:
    got = bindrec.load(pkg, key, vkbinds.FILE, vkbinds.MAGIC)
    assert got is not None
    return got


def _load(pkg: Path, name: str, what: str) -> tuple[dict[str, np.ndarray], inferd.Model]:
    """One cold load of ``pkg`` on Vulkan, checked, its binds recorded; its first run's outputs and the (closed)
    model."""
    feeds = zoo_reference(name)[1]
    with inferd.load(pkg, device="vulkan") as m:
        out = m.run(feeds)
        check_against_reference(m, name, what, TOL)
        assert m.binds_done is not None and m.binds_done.wait(60)
        assert m.wait_warm(60)
        check_against_reference(m, name, what + ", warm", TOL)
    return out, m


def _planned(m: inferd.Model) -> dict[str, str]:
    return {lp.name: lp.kernel for lp in m.plan.layers}


@pytest.mark.parametrize("name", SMALL)
def test_a_second_cold_load_rebuilds_its_layers_from_the_records_and_answers_the_same(name: str,
                                                                                        tmp_path: Path) -> None:
    pkg = _package(name, tmp_path)
    first, m1 = _load(pkg, name, "first load")
    assert m1.cold_stats.get("binds_replayed", 0) == 0
    recs = _records(pkg, _key(m1, pkg))
    kernel_layers = [s for s in m1._exec._slots if s.kind == "kernel"]
    # every layer the device runs is recorded: its ranges all lie in the arena or its own weights
    assert set(recs) == {s.layer.name for s in kernel_layers}
    second, m2 = _load(pkg, name, "second load, binds replayed")
    planned = _planned(m2)
    assert m2.cold_stats["binds_replayed"] == sum(1 for n, r in recs.items() if planned.get(n) == r[0]) > 0
    for k in first:  # the same dispatches on the same inputs: the same bits
        np.testing.assert_array_equal(second[k], first[k], err_msg=f"{name}: output {k}")


def test_a_replayed_layer_is_what_its_kernel_made(tmp_path: Path) -> None:
    """Recording a load that replayed every layer gives back the records it read, entry for entry: the same shaders,
    defines, specialisation constants, groups, push constants and ranges the kernels worked out."""
    name = "squeezenet1_1"
    pkg = _package(name, tmp_path)
    _out, m1 = _load(pkg, name, "first load")
    key = _key(m1, pkg)
    recs = _records(pkg, key)
    feeds = zoo_reference(name)[1]
    with inferd.load(pkg, device="vulkan") as m:
        m.run(feeds)
        assert m.cold_stats["binds_replayed"] == len(recs)
        again = m._exec.record_binds()
    assert again == recs


def _rewrite(pkg: Path, key: dict[str, Any], recs: dict[str, Any]) -> None:
    assert bindrec.save(pkg, key, recs, vkbinds.FILE, vkbinds.MAGIC)


@pytest.mark.parametrize("damage", ["kernel", "push", "range", "bindings", "weights"])
def test_a_record_that_does_not_fit_its_layer_is_not_used_for_it(damage: str, tmp_path: Path) -> None:
    """A well-formed file whose record of one layer names another kernel, push constants of another size, a range
    past the arena, another binding count or other weight sizes: that layer is prepared the usual way, the others
    from their records, and the answer is right."""
    name = "squeezenet1_1"
    pkg = _package(name, tmp_path)
    first, m1 = _load(pkg, name, "first load")
    key = _key(m1, pkg)
    recs = _records(pkg, key)
    victim = next(n for n, r in recs.items() if r[2] and r[3] and r[3][0][5])  # weights, dispatches, push constants
    rec = recs[victim]
    d0 = rec[3][0]
    if damage == "kernel":
        rec[0] = rec[0] + "_other"
    elif damage == "push":
        d0[5] = d0[5] + b"\0\0\0\0"
    elif damage == "range":
        d0[6][-1] = [vkbinds.ACT, m1._exec.plan.total + 64, 64]
    elif damage == "bindings":
        d0[6] = d0[6][:-1]
    else:
        rec[2][0][1] += 4
    _rewrite(pkg, key, recs)
    second, m2 = _load(pkg, name, f"second load, a {damage} record that does not fit")
    assert m2.cold_stats["binds_replayed"] == len(recs) - 1
    for k in first:
        np.testing.assert_array_equal(second[k], first[k], err_msg=f"output {k}")
    # the load records its layers again, the damaged one as its kernel made it
    assert _records(pkg, key)[victim] != rec


@pytest.mark.parametrize("damage", ["truncated", "flipped", "stale"])
def test_a_bad_or_stale_file_is_a_miss_with_a_warning_and_is_recorded_again(damage: str, tmp_path: Path,
                                                                             caplog: Any) -> None:
    name = "mobilenetv2"
    pkg = _package(name, tmp_path)
    first, m1 = _load(pkg, name, "first load")
    key = _key(m1, pkg)
    f = pkg / vkbinds.FILE
    good = f.read_bytes()
    if damage == "truncated":
        f.write_bytes(good[:len(good) // 2])
    elif damage == "flipped":
        b = bytearray(good)
        b[-10] ^= 0xFF
        f.write_bytes(bytes(b))
    else:  # made for another arena (another engine's activation plan)
        _rewrite(pkg, {**key, "arena": key["arena"] + 64}, _records(pkg, key))
    with caplog.at_level(logging.WARNING, logger="inferd.runtime.bindrec"):
        second, m2 = _load(pkg, name, f"a {damage} binds file")
    assert m2.cold_stats.get("binds_replayed", 0) == 0
    assert any(vkbinds.FILE in r.getMessage() for r in caplog.records)
    for k in first:
        np.testing.assert_array_equal(second[k], first[k], err_msg=f"output {k}")
    assert _records(pkg, key)  # recorded again, under this package's key


def test_parse_refuses_a_record_of_other_arrays() -> None:
    w = np.zeros(16, np.float32)
    rec = ["k", 128, [["w", 64, 0]], [["conv", [["A", "1"]], [["X", 4]], [1, 1, 1], False, b"\0" * 8,
                                       [[vkbinds.ACT, 0, 64], [vkbinds.WEIGHTS, 0, 64]]]]]
    got = vkbinds.parse(rec, "k", {"w": w})
    assert got is not None and got.variants == [("conv", (("A", "1"),))] and got.specs == [{"X": 4}]
    assert got.entries[0][3] == [(vkbinds.ACT, 0, 64), (vkbinds.WEIGHTS, 0, 64)]
    assert vkbinds.parse(rec, "other", {"w": w}) is None
    assert vkbinds.parse(rec, "k", {"w": np.zeros(8, np.float32)}) is None
    assert vkbinds.parse(rec, "k", {}) is None
    assert vkbinds.parse(["k", 32, [["w", 64, 0]], []], "k", {"w": w}) is None  # past the layer's weights
    assert vkbinds.parse(["k", 128], "k", {"w": w}) is None
    assert vkbinds.parse(None, "k", {"w": w}) is None
