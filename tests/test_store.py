"""Weights store and compiled packages: round trip, and clear errors for damaged files."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import inferd
from inferd.errors import WeightsStoreError
from inferd.package import compile_model
from inferd.store import ALIGN, StoreWriter, WeightsStore
from test_import import conv_bn_relu_add_model


def _write(path):
    rng = np.random.default_rng(0)
    arrs = {"a": rng.standard_normal((3, 5)).astype(np.float32), "b": np.arange(7, dtype=np.int64),
            "empty": np.zeros((0, 4), np.float32)}
    with StoreWriter(path, "f" * 64, "test") as w:
        for k, v in arrs.items():
            w.add("", k, v)
        w.add("conv1", "U", arrs["a"] * 2, kernel="winograd23", variant="transformed")
    return arrs


def test_round_trip_alignment_and_side_by_side_variants(tmp_path):
    p = tmp_path / "w.store"
    arrs = _write(p)
    with WeightsStore(p) as s:
        assert s.model_sha256 == "f" * 64
        for k, v in arrs.items():
            e = s.entries[("", k, "", "raw")]
            assert e.offset % ALIGN == 0
            np.testing.assert_array_equal(s.read(e), v)
        np.testing.assert_array_equal(s.get("conv1", "U", "winograd23", "transformed"), arrs["a"] * 2)
        out = np.empty((3, 5), np.float32)
        s.read(s.entries[("", "a", "", "raw")], out=out)
        np.testing.assert_array_equal(out, arrs["a"])


def test_truncated_store_is_rejected(tmp_path):
    p = tmp_path / "w.store"
    _write(p)
    data = p.read_bytes()
    for n in (10, ALIGN + 3, len(data) - 5):
        p.write_bytes(data[:n])
        with pytest.raises(WeightsStoreError, match="truncated|checksum"):
            WeightsStore(p)


def test_corrupted_blob_and_header_are_rejected(tmp_path):
    p = tmp_path / "w.store"
    _write(p)
    data = bytearray(p.read_bytes())
    data[ALIGN + 1] ^= 0xFF  # inside blob "a"
    p.write_bytes(bytes(data))
    with WeightsStore(p) as s:
        with pytest.raises(WeightsStoreError, match="checksum mismatch"):
            s.get("", "a")
        np.testing.assert_array_equal(s.get("", "b"), np.arange(7))  # other blobs still readable
    data[0:8] = b"NOTASTOR"
    p.write_bytes(bytes(data))
    with pytest.raises(WeightsStoreError, match="not an inferd weights store"):
        WeightsStore(p)
    p.write_bytes(os.urandom(9000))
    with pytest.raises(WeightsStoreError):
        WeightsStore(p)


def test_compiled_package_matches_onnx_load_and_uses_transformed_weights(tmp_path):
    m = conv_bn_relu_add_model(batch=1)
    src = tmp_path / "m.onnx"
    src.write_bytes(m.SerializeToString())
    pkg = compile_model(src, tmp_path / "pkg")
    x = np.random.default_rng(3).standard_normal((1, 3, 9, 11)).astype(np.float32)
    ref = inferd.load(src).run({"x": x})["y"]
    model = inferd.load(pkg)
    got = model.run({"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    planned = {(lp.name, lp.kernel) for lp in model.plan.layers if lp.source == "transformed"}
    assert planned, "the plan reads some transformed weights"
    with WeightsStore(pkg / "weights.store") as s:
        held = {(e.layer, e.kernel.split("/", 1)[1]) for e in s.entries.values() if e.variant == "transformed"}
    assert planned <= held  # the store holds every representation the plan reads
    model.close()


def _corrupt_every_blob(pkg):
    """A flipped byte in every blob, so the damage is met whichever form of a layer's weights the load reads: a
    package is re-planned from what its runs measured, and a plan may read a layer's raw weights and transform
    them instead of reading the transformed blob (with only the first blob damaged, a full-suite run once loaded
    without meeting it)."""
    store = pkg / "weights.store"
    with WeightsStore(store) as s:
        spots = [e.offset + min(8, e.size - 1) for e in s.entries.values() if e.size]
    data = bytearray(store.read_bytes())
    for at in spots:
        data[at] ^= 0x55
    store.write_bytes(bytes(data))


def test_corrupted_package_is_rebuilt_from_its_source_or_gives_a_clear_error(tmp_path):
    m = conv_bn_relu_add_model(batch=1)
    src = tmp_path / "m.onnx"
    src.write_bytes(m.SerializeToString())
    x = np.random.default_rng(3).standard_normal((1, 3, 9, 11)).astype(np.float32)
    ref = inferd.load(src).run({"x": x})["y"]
    pkg = compile_model(src, tmp_path / "pkg")
    _corrupt_every_blob(pkg)
    before = (pkg / "weights.store").stat().st_mtime_ns
    # its source is still there: the damaged blob is found during the first run, the package rebuilt
    rebuilt = inferd.load(pkg)
    np.testing.assert_allclose(rebuilt.run({"x": x})["y"], ref, rtol=1e-5, atol=1e-5)
    assert (pkg / "weights.store").stat().st_mtime_ns != before
    # the plan's refinement after that first answer rewrites plan.bin in idle time: let it land before the
    # package is damaged again below
    assert rebuilt.refine_done is None or rebuilt.refine_done.wait(30)
    with WeightsStore(pkg / "weights.store") as s:
        for e in s.entries.values():
            s.read(e)  # every blob verifies again
    # without its source the damage is a clear error, never a wrong answer, and stays one
    _corrupt_every_blob(pkg)
    src.unlink()
    model = inferd.load(pkg)
    with pytest.raises(WeightsStoreError, match="checksum mismatch"):
        model.run({"x": x})
    with pytest.raises(inferd.errors.BackendError, match="failed to load"):
        model.run({"x": x})
    plan = pkg / "plan.bin"
    pb = bytearray(plan.read_bytes())
    pb[-3] ^= 0x01
    plan.write_bytes(bytes(pb))
    with pytest.raises(WeightsStoreError, match="plan checksum"):
        inferd.load(pkg)
    src.write_bytes(m.SerializeToString())
    with pytest.raises(WeightsStoreError, match="batch"):
        compile_model(src, tmp_path / "pkg2")
        inferd.load(tmp_path / "pkg2", batch=2)


def test_a_model_that_adopts_a_rebuilt_package_refines_with_the_rebuilt_store(tmp_path):
    """A package found damaged during the first run is rebuilt and the model adopts the new load: the plan
    refinement that follows the first run must be the new load's, which re-plans over the rebuilt store. Left
    with the damaged load's, it wrote a plan reading transformed weights that the rebuilt store did not hold
    (the next load then failed; seen as a rare failure of the test above)."""
    src = tmp_path / "m.onnx"
    src.write_bytes(conv_bn_relu_add_model(batch=1).SerializeToString())
    pkg = compile_model(src, tmp_path / "pkg")
    old, fresh = inferd.load(pkg), inferd.load(pkg)
    try:
        assert old._refine is not None and fresh._refine is not None
        mine = fresh._refine
        old._adopt(fresh)
        assert old._refine is mine and fresh._refine is None
        x = np.random.default_rng(5).standard_normal((1, 3, 9, 11)).astype(np.float32)
        np.testing.assert_allclose(old.run({"x": x})["y"], inferd.load(src).run({"x": x})["y"], rtol=1e-5,
                                   atol=1e-5)
    finally:
        old.close()
        fresh.close()


def _cached_source(tmp_path: Path, seed: int) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    """A small model's ONNX file, a cache folder for it, an input and the in-memory load's answer to it."""
    m = conv_bn_relu_add_model(batch=1)
    src = tmp_path / "m.onnx"
    src.write_bytes(m.SerializeToString())
    x = np.random.default_rng(seed).standard_normal((1, 3, 9, 11)).astype(np.float32)
    return src, tmp_path / "cache", x, inferd.load(src).run({"x": x})["y"]


def test_package_cache_compiles_once_then_loads_the_package(tmp_path):
    from inferd.package import cached_package

    m = conv_bn_relu_add_model(batch=1)
    src, cache, x, ref = _cached_source(tmp_path, 5)
    np.testing.assert_allclose(inferd.load(src, cache_dir=cache).run({"x": x})["y"], ref, rtol=1e-5, atol=1e-5)
    pkg = cached_package(src, cache)
    # the weights store's identity, not plan.bin's: a load may refine plan.bin from its observed cold run in the
    # background (a rewrite of the plan, not a compile), which under load lands after any stamp taken here
    ws = (pkg / "weights.store").stat()
    np.testing.assert_allclose(inferd.load(src, cache_dir=cache).run({"x": x})["y"], ref, rtol=1e-5, atol=1e-5)
    again = (pkg / "weights.store").stat()
    assert (again.st_ino, again.st_mtime_ns) == (ws.st_ino, ws.st_mtime_ns)  # reused, not recompiled
    # a damaged cached plan is a miss with a warning: recompiled, right answers
    (pkg / "plan.bin").write_bytes(b"garbage")
    np.testing.assert_allclose(inferd.load(src, cache_dir=cache).run({"x": x})["y"], ref, rtol=1e-5, atol=1e-5)
    assert (pkg / "plan.bin").read_bytes()[:8] == b"INFDPLAN"
    # a damaged weights store in the cache is found by the loader and rebuilt: never a wrong answer
    stamp = (pkg / "plan.bin").stat().st_mtime_ns
    store = pkg / "weights.store"
    data = bytearray(store.read_bytes())
    # a byte in every page past the first: whichever blobs this load's plan reads (the plan depends on what the
    # cache holds, a device predictor for one), one of them is damaged; a single byte may sit in a blob not read
    for off in range(4096 + 2, len(data), 4096):
        data[off] ^= 0x40
    store.write_bytes(bytes(data))
    np.testing.assert_allclose(inferd.load(src, cache_dir=cache).run({"x": x})["y"], ref, rtol=1e-5, atol=1e-5)
    assert (pkg / "plan.bin").stat().st_mtime_ns != stamp  # recompiled
    np.testing.assert_allclose(inferd.load(src, cache_dir=cache).run({"x": x})["y"], ref, rtol=1e-5, atol=1e-5)
    stamp = (pkg / "plan.bin").stat().st_mtime_ns
    # editing the model makes a new package
    src.write_bytes(m.SerializeToString() + b"")
    os.utime(src, ns=(stamp + 10**9, stamp + 10**9))
    assert cached_package(src, cache) != pkg


def test_a_load_through_the_cache_parses_its_plan_once_and_rebuilds_a_plan_that_fails_its_checksum(
        tmp_path, monkeypatch, caplog) -> None:
    import logging

    from inferd import package

    src, cache, x, ref = _cached_source(tmp_path, 6)
    inferd.load(src, cache_dir=cache).close()  # compiled
    parsed: list[Path] = []
    real = package._read_plan

    def counting(path, *a, **kw):
        # this test's packages only: an earlier test's model may be refined on the idle worker meanwhile
        if Path(cache) in Path(path).parents:
            parsed.append(Path(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(package, "_read_plan", counting)
    package._parsed.clear()  # (the compile's own load parsed it: as a fresh process)
    model = inferd.load(src, cache_dir=cache)
    model.wait_loaded()
    # the cache lookup reads plan.bin's header; the open parses it (the second parse cost each load 0.3-1.7 ms)
    assert len([p for p in parsed if p.name == "plan.bin"]) == 1, parsed
    model.close()
    # loaded again (a daemon's model dropped by its budget): the open takes the plan it parsed, and the cache
    # lookup reads no header either (that version's was checked at its parse)
    parsed.clear()
    heads: list[Path] = []
    real_head = package.check_plan_head
    monkeypatch.setattr(package, "check_plan_head",
                        lambda path: (Path(cache) in Path(path).parents and heads.append(path), real_head(path))[1])
    model = inferd.load(src, cache_dir=cache)
    np.testing.assert_allclose(model.run({"x": x})["y"], ref, rtol=1e-5, atol=1e-5)
    assert not [p for p in parsed if p.name == "plan.bin"] and not heads, (parsed, heads)
    model.close()
    pkg = package.cached_package(src, cache)
    plan = pkg / "plan.bin"
    data = bytearray(plan.read_bytes())
    data[-3] ^= 0x5A  # the body, past the header the lookup reads: only the open's checksum sees it
    plan.write_bytes(bytes(data))
    assert package.cached_package(src, cache) == pkg  # the header alone is sound
    with caplog.at_level(logging.WARNING):
        got = inferd.load(src, cache_dir=cache).run({"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert any("checksum" in r.getMessage() and "rebuilding" in r.getMessage() for r in caplog.records)
    package.read_plan(plan)  # rebuilt: sound again


def test_a_store_index_is_read_once_per_version_of_the_file(tmp_path, monkeypatch) -> None:
    """A store opened again (a model loaded again) takes the index its first open read and verified; a store
    written anew at the same path, or changed in place, is read again: its own entries, never the old ones."""
    from inferd import store

    reads: list[int] = []
    real = WeightsStore._read_index

    def counting(self, size):
        reads.append(size)
        return real(self, size)

    monkeypatch.setattr(WeightsStore, "_read_index", counting)
    p = tmp_path / "w.store"
    arrs = _write(p)
    for _ in range(2):
        with WeightsStore(p) as s:
            np.testing.assert_array_equal(s.get("", "a"), arrs["a"])
    assert len(reads) == 1 and store.index_cached(p)
    # written anew (a recompile): another file at the path
    with StoreWriter(p, "e" * 64, "test") as w:
        w.add("", "a", arrs["a"] + 1)
    assert not store.index_cached(p)
    with WeightsStore(p) as s:
        assert s.model_sha256 == "e" * 64 and ("", "b", "", "raw") not in s
        np.testing.assert_array_equal(s.get("", "a"), arrs["a"] + 1)
    assert len(reads) == 2
    # changed in place, same size: its change time moves, and a damaged index is found as at a first open
    data = bytearray(p.read_bytes())
    data[-2] ^= 0xFF  # in the index, at the file's end
    with open(p, "r+b") as f:
        f.write(bytes(data))
    with pytest.raises(WeightsStoreError, match="index"):
        WeightsStore(p)
    assert len(reads) == 3
    monkeypatch.setattr(store, "INDEXES_MAX", 0)  # off: every open reads its index
    _write(p)
    for _ in range(2):
        WeightsStore(p).close()
    assert len(reads) == 5
    monkeypatch.setattr(store, "INDEXES_MAX", 32)
    monkeypatch.setattr(store, "INDEXES_MAX_BYTES", 64)  # an index larger than a quarter of the bound: not kept
    for _ in range(2):
        WeightsStore(p).close()
    assert len(reads) == 7 and not store.index_cached(p)


def test_a_parsed_plan_is_shared_read_only_and_one_with_control_flow_bodies_is_not_kept(tmp_path) -> None:
    """plan.bin parsed by an open is kept for the next open of the same file: its arrays read-only (every load
    of the package shares them: an in-place write would change the next load's constants, so it fails); a plan
    whose nodes carry control-flow bodies (which a load may lower in place) is parsed at every open."""
    from inferd import package, store
    from test_control_flow import _nested_if_model

    src, cache, x, ref = _cached_source(tmp_path, 7)
    model = inferd.load(src, cache_dir=cache)
    np.testing.assert_allclose(model.run({"x": x})["y"], ref, rtol=1e-5, atol=1e-5)
    model.close()
    pkg = package.cached_package(src, cache)
    assert package.parsed_cached(pkg)
    d = package._parsed.get(str(pkg / "plan.bin"), store.file_version((pkg / "plan.bin").stat()))[0]
    arrays = [v for v in d["inline"].values() if isinstance(v, np.ndarray)]
    assert arrays and not any(a.flags.writeable for a in arrays)
    with pytest.raises(ValueError, match="read-only"):
        arrays[0][...] = 0
    # the plan rewritten (as a refinement does, atomically): parsed again
    package.write_plan(pkg / "plan.bin", package.read_plan(pkg / "plan.bin"))
    assert not package.parsed_cached(pkg)
    np.testing.assert_allclose(inferd.load(src, cache_dir=cache).run({"x": x})["y"], ref, rtol=1e-5, atol=1e-5)
    assert package.parsed_cached(pkg)
    # a plan larger than a quarter of the byte bound is not kept (a parse holds a few times its file's bytes)
    package._parsed.clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(package, "PARSED_PLANS_MAX_BYTES", 4 * (pkg / "plan.bin").stat().st_size - 4)
        inferd.load(src, cache_dir=cache).close()
        assert not package.parsed_cached(pkg)
    cf = tmp_path / "if.onnx"
    cf.write_bytes(_nested_if_model().SerializeToString())
    inferd.load(cf, cache_dir=tmp_path / "cfcache").close()
    assert not package.parsed_cached(package.cached_package(cf, tmp_path / "cfcache"))


def test_a_store_that_fails_to_open_never_closes_another_files_descriptor(tmp_path) -> None:
    import gc

    bad = tmp_path / "bad.store"
    bad.write_bytes(b"xx")
    kept: list[BaseException] = []
    try:
        WeightsStore(bad)
    except WeightsStoreError as e:
        kept.append(e)  # its traceback keeps the half-built store alive, as a test's report or a log record does
    assert kept
    fd = os.open(bad, os.O_RDONLY)  # takes the number the failed store had
    try:
        kept.clear()
        gc.collect()  # the failed store's __del__ runs now
        os.fstat(fd)  # EBADF if it closed its old number a second time
    finally:
        os.close(fd)


def test_bfloat16_constants_keep_their_type_through_a_package(tmp_path, monkeypatch) -> None:
    """numpy spells ml_dtypes' bfloat16 "<V2": written that way, a package's bfloat16 weights came back as raw
    bytes and the first Add on them failed. The store, plan and skeleton write the type's name instead, and a
    store holding the old anonymous tag is a bad file (a cache miss), not an array of the wrong type."""
    import ml_dtypes
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    import inferd.store

    w = (np.arange(12, dtype=np.float32).reshape(3, 4) / 7).astype(ml_dtypes.bfloat16)
    nodes = [helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
             helper.make_node("Add", ["xb", "w"], ["s"]),
             helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    src = tmp_path / "bf16.onnx"
    onnx.save(m, str(src))
    x = np.random.default_rng(1).random((3, 4), dtype=np.float32)
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    compile_model(str(src), tmp_path / "pkg")
    np.testing.assert_array_equal(inferd.load(tmp_path / "pkg").run({"x": x})["y"], want)

    p = tmp_path / "old.store"
    monkeypatch.setattr(inferd.store, "dtype_tag", lambda dt: np.dtype(dt).str)
    with StoreWriter(p, "f" * 64, "test") as wr:
        wr.add("", "w", w)
    with pytest.raises(WeightsStoreError, match="raw bytes"):
        WeightsStore(p)


def test_file_memo_keeps_the_latest_used_within_its_bounds() -> None:
    """The memo behind both metadata caches (parsed plans, store indexes): another version of a file is a miss; the
    least recently used entry goes first; bounded in entries and in bytes, a file over a quarter of the byte bound
    is refused, and an entry bound of 0 keeps nothing."""
    from inferd.store import FileMemo

    m, v1, v2 = FileMemo(), (1, 2, 10, 0, 0), (1, 2, 10, 0, 1)
    assert m.put("a", v1, "A", 10, 3, 100) and m.get("a", v1) == "A"
    assert m.get("a", v2) is None and not m.holds("a", v2) and m.holds("a", v1)
    m.put("b", v1, "B", 10, 3, 100)
    m.put("c", v1, "C", 10, 3, 100)
    assert m.get("a", v1) == "A"  # used: b is now the oldest
    m.put("d", v1, "D", 10, 3, 100)
    assert not m.holds("b", v1) and all(m.holds(k, v1) for k in "acd") and m.stats() == (3, 30)
    assert not m.put("e", v1, "E", 26, 3, 100) and m.stats() == (3, 30)  # over a quarter of the byte bound
    assert m.put("e", v1, "E", 25, 3, 100) and m.stats() == (3, 45)  # c went (the entry bound)
    assert m.put("f", v1, "F", 14, 10, 56) and m.stats() == (3, 49)  # a went (the byte bound: 59 > 56)
    assert [k for k in "acdef" if m.holds(k, v1)] == ["d", "e", "f"]
    assert m.put("d", v2, "D2", 5, 4, 60) and m.get("d", v2) == "D2" and m.stats() == (3, 44)  # replaced
    assert not m.put("g", v1, "G", 1, 0, 100)  # off
    m.clear()
    assert m.stats() == (0, 0) and not m.holds("d", v2)


def test_checksum_of_large_blobs_lets_the_gil_go() -> None:
    """The store's checksum is the xxhash binding's sum for every buffer type the store passes, and over a large
    blob it lets the GIL go (a cold load's executor runs its Python meanwhile); the C function the native loaders
    call gives the same sums."""
    import sys
    import threading
    import time

    import xxhash

    from inferd import native
    from inferd.store import checksum, xxh3_c

    rng = np.random.default_rng(0)
    for n in (0, 1, 4095, (4 << 20) - 1, 4 << 20, (4 << 20) + 13):
        a = rng.integers(0, 256, n, dtype=np.uint8)
        want = xxhash.xxh3_64_intdigest(a)
        assert checksum(a) == checksum(memoryview(a)) == checksum(a.tobytes()) == want, n
        fn = xxh3_c()
        if fn is not None:
            assert fn(native.ffi.from_buffer(a), a.nbytes) == want
    f = rng.standard_normal((1 << 20) + 7).astype(np.float32)
    assert checksum(memoryview(f)) == xxhash.xxh3_64_intdigest(f)

    # a long switch interval: a thread that holds the GIL keeps it until it lets it go itself
    count, go, stop = [0], threading.Event(), [False]

    def spin() -> None:
        go.wait()
        while not stop[0]:
            count[0] += 1

    old = sys.getswitchinterval()
    t = threading.Thread(target=spin)
    sys.setswitchinterval(0.2)
    try:
        t.start()
        go.set()
        time.sleep(0.02)  # the spinner holds the GIL now; the next line waits for the interval to take it back
        c0 = count[0]
        checksum(np.ones(64 << 20, np.uint8))
        spun = count[0] - c0
    finally:
        stop[0] = True
        t.join()
        sys.setswitchinterval(old)
    assert spun > 0  # the spinner ran while the sum was computed
