"""The cold window (``inferd.runtime.window``: the cyclic GC paused and a short GIL switch interval from a
package's opening to its first answer) and the streaming read with several reads in flight: the window
always ends (answer, failed open, close, or its deadline) and puts the process's own settings back; blobs
read by several readers arrive intact, and a damaged one is still found, never handed out; the store's first
blocks read ahead serve the stream's first chunk, and only when they are that file's."""
from __future__ import annotations

import gc
import os
import sys
import threading
import time

import numpy as np
import pytest

import inferd
from inferd.errors import WeightsStoreError
from inferd.package import compile_model
from inferd.runtime import window
from inferd.runtime.scheduler import IO_WORKERS, worker
from inferd.store import ALIGN, HeadRead, StoreStream, StoreWriter, WeightsStore, entries_of
from test_import import conv_bn_relu_add_model


def _settled(timeout: float = 5.0) -> bool:
    """The window is closed (the idle worker leaves it after an answer: wait for it)."""
    end = time.monotonic() + timeout
    while window.active() and time.monotonic() < end:
        time.sleep(0.01)
    return not window.active()


@pytest.fixture(autouse=True)
def _closed_window():
    assert _settled(), "a window left open by an earlier test"
    gc_was, interval = gc.isenabled(), sys.getswitchinterval()
    yield
    assert _settled()
    assert (gc.isenabled(), sys.getswitchinterval()) == (gc_was, interval)


def test_holds_nest_and_the_last_release_restores_the_settings():
    interval = sys.getswitchinterval()
    a = window.hold()
    assert not gc.isenabled() and sys.getswitchinterval() < interval
    b = window.hold()
    a.release()
    a.release()  # idempotent: does not end b's share
    assert window.active() and not gc.isenabled()
    b.release()
    assert not window.active() and gc.isenabled() and sys.getswitchinterval() == interval


def test_a_disabled_collector_stays_disabled_after_the_window():
    gc.disable()
    try:
        window.hold().release()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_hold_nobody_releases_lapses_at_its_deadline():
    h = window.hold(max_s=0.05)
    assert not gc.isenabled()
    time.sleep(0.06)
    window.expire()
    assert not h.held and not window.active() and gc.isenabled()


def _package(tmp_path):
    src = tmp_path / "m.onnx"
    src.write_bytes(conv_bn_relu_add_model(batch=1).SerializeToString())
    x = np.random.default_rng(3).standard_normal((1, 3, 9, 11)).astype(np.float32)
    return src, compile_model(src, tmp_path / "pkg"), x


def test_a_cold_load_holds_the_window_until_its_first_answer(tmp_path):
    src, pkg, x = _package(tmp_path)
    ref = inferd.load(src).run({"x": x})["y"]
    assert _settled()
    m = inferd.load(pkg)
    assert window.active() and not gc.isenabled()  # opened with the package, held through the load
    np.testing.assert_allclose(m.run({"x": x})["y"], ref, rtol=1e-5, atol=1e-5)
    assert _settled() and gc.isenabled()  # left after the answer (by the idle worker)
    m.close()
    m2 = inferd.load(pkg)  # loaded, never run: closing ends its share
    assert window.active()
    m2.close()
    assert not window.active()


def test_a_package_that_fails_to_open_leaves_no_window(tmp_path):
    _src, pkg, _x = _package(tmp_path)
    plan = pkg / "plan.bin"
    b = bytearray(plan.read_bytes())
    b[-3] ^= 0x01
    plan.write_bytes(bytes(b))
    from inferd.package import open_package

    with pytest.raises(WeightsStoreError, match="plan checksum"):
        open_package(pkg)
    assert not window.active() and gc.isenabled()


def test_opening_a_package_for_a_tool_leaves_no_window(tmp_path):
    from inferd.package import load_package

    _src, pkg, _x = _package(tmp_path)
    g = load_package(pkg)
    assert g.constants and not window.active() and gc.isenabled()


def _many_blobs(path, n=40, seed=1):
    rng = np.random.default_rng(seed)
    arrs = {f"t{i}": rng.standard_normal((int(rng.integers(1, 3000)),)).astype(np.float32) for i in range(n)}
    arrs["t20"] = rng.standard_normal((40000,)).astype(np.float32)  # larger than a piece: read in several
    with StoreWriter(path, "f" * 64, "test") as w:
        for k, v in arrs.items():
            w.add("", k, v)
    return arrs


@pytest.mark.parametrize("readers", [1, 2, 3, 5])
def test_several_readers_deliver_every_blob_intact_in_any_order(tmp_path, readers):
    p = tmp_path / "w.store"
    arrs = _many_blobs(p)
    io = [worker(n) for n in IO_WORKERS] + [None] * (readers - len(IO_WORKERS))
    with WeightsStore(p) as s:
        ents = list(entries_of(s))
        # small chunks: many of them, spread over the readers
        st = StoreStream(s, ents, chunk=3 * ALIGN, first=ALIGN, io=io[:readers])
        assert len(st.chunks) > 8
        assert len(st._pieces) > len(st.chunks)  # the large blob's chunk is read in pieces
        for e in reversed(ents):  # the last chunks first: whichever reader has them
            np.testing.assert_array_equal(st.get(e), arrs[e.tensor])
        assert st.bytes >= sum(a.nbytes for a in arrs.values())
        st.release()


@pytest.mark.parametrize("where", ["t37", "t20"])
def test_a_damaged_blob_read_by_another_reader_is_still_found(tmp_path, where):
    p = tmp_path / "w.store"
    arrs = _many_blobs(p)
    with WeightsStore(p) as s:
        ents = list(entries_of(s))
    # far into the stream (read by whichever reader claimed it), or in the last piece of the large blob
    bad = next(e for e in ents if e.tensor == where)
    data = bytearray(p.read_bytes())
    data[bad.offset + bad.size - 5] ^= 0xFF
    p.write_bytes(bytes(data))
    with WeightsStore(p) as s:
        st = StoreStream(s, ents, chunk=3 * ALIGN, first=ALIGN, io=[worker(n) for n in IO_WORKERS])
        for e in ents:
            if e.key == bad.key:
                with pytest.raises(WeightsStoreError, match="checksum mismatch"):
                    st.get(e)
            else:
                np.testing.assert_array_equal(st.get(e), arrs[e.tensor])
        st.release()


def test_a_truncated_store_fails_the_waiting_get_not_hangs_it(tmp_path):
    p = tmp_path / "w.store"
    _many_blobs(p)
    with WeightsStore(p) as s:
        ents = list(entries_of(s))
        with open(p, "r+b") as f:  # cut the file under the open store: the later chunks cannot be read
            f.truncate(ents[len(ents) // 2].offset)
        st = StoreStream(s, ents, chunk=3 * ALIGN, first=ALIGN, io=[worker(n) for n in IO_WORKERS])
        done = threading.Event()
        err: list[BaseException] = []

        def last() -> None:
            try:
                st.get(ents[-1])
            except BaseException as e:
                err.append(e)
            done.set()

        threading.Thread(target=last, daemon=True).start()
        assert done.wait(10)
        assert err and isinstance(err[0], WeightsStoreError)
        st.release()


def test_work_after_an_answer_starts_once_the_answer_is_out() -> None:
    """The idle worker's jobs after a first answer (leaving the window, the warm switch, refining) wait for the
    request to end: started at once they took the GIL from the answer's way out."""
    from inferd.runtime.cold import AFTER_ANSWER_QUIET_S, after_answer
    from inferd.runtime.scheduler import foreground

    ran: list[float] = []
    with foreground:
        done = after_answer(lambda: ran.append(time.monotonic()))
        time.sleep(0.03)
        assert not ran, "ran while the request was still answering"
        t_exit = time.monotonic()
    assert done.wait(5)
    assert ran[0] >= t_exit + AFTER_ANSWER_QUIET_S
    # under requests that never pause, it still runs (the window must always be left): it ran while the
    # foreground was still held (a wall-clock bound here would only measure CI's load)
    ran.clear()
    with foreground:
        done = after_answer(lambda: ran.append(time.monotonic()))
        assert done.wait(5) and ran


def _read_ahead(p, size=3 * ALIGN):
    """A head read of ``p`` on the io worker, finished (a stream may start before it and then read itself)."""
    done: list[threading.Event] = []
    head = HeadRead(p, lambda fn: done.append(worker("io").submit(fn)), size=size)
    assert done[0].wait(10)
    return head


def _stream_with_head(p, head, ents, counted):
    """A stream over ``p`` whose store takes ``head``; ``counted``: the file offsets it read itself."""
    s = WeightsStore(p, head=head)
    span = s._span

    def reading(offset, size, need, out):
        counted.append(offset)
        return span(offset, size, need, out)

    s._span = reading
    return s, StoreStream(s, ents, chunk=3 * ALIGN, first=2 * ALIGN, io=[worker(n) for n in IO_WORKERS])


def test_the_head_read_serves_the_first_chunk_and_the_stream_reads_the_rest(tmp_path):
    p = tmp_path / "w.store"
    arrs = _many_blobs(p)
    with WeightsStore(p) as s:
        ents = list(entries_of(s))
    head = _read_ahead(p)
    counted: list[int] = []
    s, st = _stream_with_head(p, head, ents, counted)
    first_end = st.chunks[0][1]
    assert first_end <= 3 * ALIGN  # the first chunk lies inside the head
    for e in ents:
        np.testing.assert_array_equal(st.get(e), arrs[e.tensor])
    assert counted and min(counted) >= first_end  # never read from the file again
    st.release()
    s.close()


def test_a_stream_started_while_the_head_read_is_under_way_reads_its_second_piece_first(tmp_path, monkeypatch):
    """The head read still under way on the io worker (a cold disk's first read) when the stream starts: the other
    reader does not wait for it holding the first piece, but reads the next piece meanwhile; the first chunk still
    comes from the head once it is done, and every blob is right."""
    from inferd import store as S

    p = tmp_path / "w.store"
    arrs = _many_blobs(p)
    with WeightsStore(p) as s:
        ents = list(entries_of(s))
    gate, started = threading.Event(), threading.Event()
    real = S.readv

    def slow_head(fd, dfd, offset, bufs, **kw):
        if offset == 0 and not gate.is_set():  # the head's read (the stream's start at the first blob's offset)
            started.set()
            gate.wait(10)
        return real(fd, dfd, offset, bufs, **kw)

    monkeypatch.setattr(S, "readv", slow_head)
    head = HeadRead(p, worker("io").submit, size=3 * ALIGN)
    try:
        assert started.wait(10)
        counted: list[int] = []
        s, st = _stream_with_head(p, head, ents, counted)
        first_end = st.chunks[0][1]
        end = time.monotonic() + 5
        while not counted and time.monotonic() < end:
            time.sleep(0.001)
        assert counted and counted[0] >= first_end  # a later piece read while the head's is under way
    finally:
        gate.set()
    for e in ents:
        np.testing.assert_array_equal(st.get(e), arrs[e.tensor])
    assert min(counted) >= first_end  # the first chunk: the head's
    st.release()
    s.close()


def test_a_head_read_of_another_file_or_that_failed_or_never_started_is_not_used(tmp_path):
    p = tmp_path / "w.store"
    arrs = _many_blobs(p)
    # the store replaced on disk after its head was read (another file, other bytes): the stream reads its own
    old = _read_ahead(p)
    assert old.ident is not None and old.span(old.ident, ALIGN, ALIGN) is not None
    tmp = tmp_path / "new.store"
    new = _many_blobs(tmp, seed=2)
    os.replace(tmp, p)
    with WeightsStore(p) as s:
        ents = list(entries_of(s))
    for head in (old,
                 _read_ahead(tmp_path / "missing.store"),  # failed: no such file
                 HeadRead(p, lambda fn: None)):  # queued on a worker that never gets to it: not waited for
        counted: list[int] = []
        s, st = _stream_with_head(p, head, ents, counted)
        for e in ents:
            np.testing.assert_array_equal(st.get(e), new[e.tensor])
        assert min(counted) == st.chunks[0][0]  # the first chunk came from the file
        st.release()
        s.close()
    assert not any(np.array_equal(arrs[k], new[k]) for k in arrs)
