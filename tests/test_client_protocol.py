"""The wire protocol module on its own: round trips, every validation rule, endpoint defaults."""
from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest

from inferd_client import errors, protocol as P


def _bytes(frames: list) -> list[bytes]:
    return [bytes(memoryview(f)) for f in frames]


def test_request_round_trip_all_dtypes() -> None:
    rng = np.random.default_rng(0)
    tensors = {}
    for i, dt in enumerate(sorted(P.ALLOWED_DTYPES)):
        shape = (2, 3) if i % 2 else (4,)
        tensors[f"t_{dt}"] = (rng.standard_normal(shape) * 10).astype(dt)
    tensors["scalar"] = np.array(3.5, np.float32)
    tensors["empty"] = np.zeros((0, 5), np.float32)
    tensors["noncontig"] = np.arange(24, dtype=np.int32).reshape(4, 6)[:, ::2]
    tensors["bigendian"] = np.arange(5, dtype=">f4")
    frames = _bytes(P.encode_request(42, "infer", "m", tensors=tensors, timeout_ms=250, priority=-3))
    req = P.decode_request(frames)
    assert (req.id, req.op, req.model, req.timeout_ms, req.priority) == (42, "infer", "m", 250.0, -3)
    assert list(req.tensors) == list(tensors)
    for k, v in tensors.items():
        got = req.tensors[k]
        assert got.shape == v.shape and got.dtype == v.dtype.newbyteorder("=")
        np.testing.assert_array_equal(got, v)


def test_reply_round_trip_and_error() -> None:
    out = {"y": np.arange(6, dtype=np.float32).reshape(2, 3)}
    rep = P.decode_reply(_bytes(P.encode_reply("abc", {"k": 1}, out)))
    assert rep.ok and rep.id == "abc" and rep.result == {"k": 1}
    np.testing.assert_array_equal(rep.tensors["y"], out["y"])
    err = P.decode_reply(_bytes(P.encode_error(7, P.NOT_FOUND, "model 'x' not found")))
    assert not err.ok and err.id == 7 and err.error_code == "NOT_FOUND" and "model 'x'" in err.error_message
    # an unknown code never goes on the wire
    assert P.decode_reply(_bytes(P.encode_error(7, "WHATEVER", "m"))).error_code == "INTERNAL"


def _header(**kw: object) -> bytes:
    h = {"v": 1, "id": 5, "op": "infer", "model": "m"}
    h.update(kw)
    return msgpack.packb({k: v for k, v in h.items() if v is not _DROP}, use_bin_type=True)


_DROP = object()


@pytest.mark.parametrize(
    "frames, needle",
    [
        ([], "empty message"),
        ([b"\xc1garbage"], "not valid msgpack"),
        ([msgpack.packb([1, 2, 3])], "must be a msgpack map"),
        ([_header(v=2)], "protocol version 2"),
        ([_header(v=True)], "protocol version"),
        ([_header(op="explode")], "unknown op"),
        ([_header(op=5)], "unknown op"),
        ([_header(model=_DROP)], "needs 'model'"),
        ([_header(model="../etc/passwd")], "needs 'model'"),
        ([_header(model=["x"])], "needs 'model'"),
        ([_header(id=[1])], "'id' must be"),
        ([_header(id="x" * 500)], "'id' must be"),
        ([_header(timeout_ms=-1)], "'timeout_ms'"),
        ([_header(timeout_ms=float("nan"))], "'timeout_ms'"),
        ([_header(timeout_ms="5")], "'timeout_ms'"),
        ([_header(priority=1.5)], "'priority'"),
        ([_header(priority=2**40)], "'priority'"),
        ([_header(args=[1])], "'args' must be a map"),
        ([_header(tensors={"a": 1})], "'tensors' must be a list"),
        ([_header(tensors=[{"name": "x", "dtype": "float32", "shape": [2]}])], "carries 0 tensor frames"),
        ([_header(tensors=[]), b"\0" * 8], "carries 1 tensor frames"),
        ([_header(tensors=[{"name": "x", "dtype": "object", "shape": [1]}]), b"\0" * 8], "not allowed"),
        ([_header(tensors=[{"name": "x", "dtype": ">f4", "shape": [1]}]), b"\0" * 4], "not allowed"),
        ([_header(tensors=[{"name": "x", "dtype": "float32", "shape": [2**40, 2**40]}]), b"\0" * 4], "needs"),
        ([_header(tensors=[{"name": "x", "dtype": "float32", "shape": [3]}]), b"\0" * 8], "needs 12 bytes"),
        # empty tensors pass the byte count whatever the other dims: numpy must not be asked for them
        ([_header(tensors=[{"name": "x", "dtype": "float32", "shape": [0, 2**63]}]), b""], "beyond what an array"),
        ([_header(tensors=[{"name": "x", "dtype": "float32", "shape": [0, 2**62, 2**62]}]), b""], "beyond what an array"),
        ([_header(tensors=[{"name": "x", "dtype": "float32", "shape": [-1]}]), b"\0" * 4], "non-negative"),
        ([_header(tensors=[{"name": "x", "dtype": "float32", "shape": [1.0]}]), b"\0" * 4], "non-negative"),
        ([_header(tensors=[{"name": "x", "dtype": "float32", "shape": [1] * 9}]), b"\0" * 4], "at most 8 dims"),
        ([_header(tensors=[{"name": 3, "dtype": "float32", "shape": [1]}]), b"\0" * 4], "'name'"),
        ([_header(tensors=["x"]), b"\0" * 4], "descriptor must be a map"),
        ([_header(tensors=[{"name": "x", "dtype": "uint8", "shape": [1]}] * 2), b"\0", b"\0"], "appears twice"),
        ([_header(op="status", tensors=[{"name": "x", "dtype": "uint8", "shape": [1]}]), b"\0"], "takes no tensors"),
        ([msgpack.packb({1: 2})], "not valid msgpack"),  # non-str keys refused by strict_map_key
    ],
)
def test_decode_request_rejects(frames: list[bytes], needle: str) -> None:
    with pytest.raises(P.WireError) as ei:
        P.decode_request(frames)
    assert ei.value.code == P.INVALID_ARG
    assert needle in ei.value.message, ei.value.message


def test_limits_enforced() -> None:
    lim = P.Limits(max_message_bytes=1000, max_header_bytes=300, max_tensors=2, max_dims=2)
    big = P.encode_request(1, "infer", "m", tensors={"x": np.zeros(300, np.float32)})
    with pytest.raises(P.WireError, match="exceeds the limit of 1000"):
        P.decode_request(_bytes(big), lim)
    with pytest.raises(P.WireError, match="header of"):
        P.decode_request([msgpack.packb({"v": 1, "pad": "x" * 400})], lim)
    three = P.encode_request(1, "infer", "m", tensors={k: np.zeros(1, np.uint8) for k in "abc"})
    with pytest.raises(P.WireError, match="too many tensors"):
        P.decode_request(_bytes(three), lim)
    # the request id survives into the error so the client can match it
    with pytest.raises(P.WireError) as ei:
        P.decode_request(_bytes(P.encode_request(99, "infer", "m", tensors={"x": np.zeros((1, 1, 1), np.uint8)})), lim)
    assert ei.value.request_id == 99


def test_decoded_tensors_are_views_not_copies() -> None:
    frames = P.encode_request(1, "infer", "m", tensors={"x": np.arange(100_000, dtype=np.float32)})
    payload = bytearray(bytes(memoryview(frames[1])))
    req = P.decode_request([bytes(memoryview(frames[0])), payload])
    payload[0:4] = np.float32(123.0).tobytes()
    assert req.tensors["x"][0] == 123.0  # shares memory with the frame


def test_unserialisable_dtype_refused_on_encode() -> None:
    with pytest.raises(ValueError, match="cannot go on the wire"):
        P.encode_request(1, "infer", "m", tensors={"x": np.array(["a"], dtype=object)})


def test_default_endpoint_order(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(P, "SYSTEM_SOCKET", str(tmp_path / "nonexistent.sock"))
    assert P.default_endpoint({"INFERD_ENDPOINT": "tcp://127.0.0.1:5555", "RUNTIME_DIRECTORY": "/r"}) == "tcp://127.0.0.1:5555"
    assert P.default_endpoint({"RUNTIME_DIRECTORY": "/run/inferd:/run/other", "XDG_RUNTIME_DIR": "/x"}) == "ipc:///run/inferd/inferd.sock"
    assert P.default_endpoint({"XDG_RUNTIME_DIR": "/run/user/7"}) == "ipc:///run/user/7/inferd.sock"
    tmp_default = P.default_endpoint({})
    assert tmp_default.startswith("ipc://") and tmp_default.endswith("/inferd.sock") and "inferd-" in tmp_default
    # the system service's socket wins over the per-user runtime dir when it exists
    sys_sock = tmp_path / "sys.sock"
    sys_sock.touch()
    monkeypatch.setattr(P, "SYSTEM_SOCKET", str(sys_sock))
    assert P.default_endpoint({"XDG_RUNTIME_DIR": "/run/user/7"}) == f"ipc://{sys_sock}"


def test_ipc_path_and_parse_size() -> None:
    assert P.ipc_path("ipc:///a/b.sock") == "/a/b.sock"
    assert P.ipc_path("ipc://@abstract") is None and P.ipc_path("tcp://1.2.3.4:5") is None
    assert P.parse_size("512M") == 512 << 20
    assert P.parse_size("1.5GiB") == int(1.5 * (1 << 30))
    assert P.parse_size(" 2g ") == 2 << 30
    assert P.parse_size(1234) == 1234 and P.parse_size("0") == 0
    for bad in ("-1", "lots", "2X", True, -5):
        with pytest.raises(ValueError):
            P.parse_size(bad)  # type: ignore[arg-type]


def test_error_classes() -> None:
    e = errors.error_from_wire("DEADLINE_EXCEEDED", "late")
    assert isinstance(e, errors.DeadlineExceeded) and isinstance(e, errors.ServerError) and e.message == "late"
    assert isinstance(errors.error_from_wire("NEW_CODE", "x"), errors.ServerError)
    assert errors.error_from_wire("NEW_CODE", "x").code == "NEW_CODE"
    # transport errors are catchable as the builtins too, and never as server errors
    assert issubclass(errors.TimeoutError, TimeoutError) and issubclass(errors.ConnectionError, ConnectionError)
    assert not issubclass(errors.TimeoutError, errors.ServerError)
    assert math.isfinite(P.PRIORITY_MAX)


def _vad_chunk() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {"input": rng.standard_normal((1, 512)).astype(np.float32), "sr": np.array(16000, np.int64),
            "state": rng.standard_normal((2, 1, 64)).astype(np.float32)}


def test_small_tensors_travel_inside_the_header() -> None:
    feeds = _vad_chunk()
    frames = _bytes(P.encode_request(3, "infer", "vad", tensors=feeds, inline=True))
    assert len(frames) == 1  # one frame: no frame per tensor
    req = P.decode_request(frames)
    assert req.inline and list(req.tensors) == list(feeds)
    for k, v in feeds.items():
        assert req.tensors[k].shape == v.shape and req.tensors[k].dtype == v.dtype
        np.testing.assert_array_equal(req.tensors[k], v)
    # past INLINE_MAX_BYTES the tensors take frames again, and such a request is not marked inline
    big = {"x": np.zeros(P.INLINE_MAX_BYTES // 4 + 1, np.float32), "y": np.ones(3, np.float32)}
    frames = _bytes(P.encode_request(4, "infer", "m", tensors=big, inline=True))
    assert len(frames) == 3 and not P.decode_request(frames).inline
    # without inline= the frames are as they always were (what older clients send)
    assert len(P.encode_request(5, "infer", "m", tensors=feeds)) == 4
    assert not P.decode_request(_bytes(P.encode_request(5, "infer", "m", tensors=feeds))).inline


def test_inline_reply_is_one_frame_and_writable() -> None:
    out = {"output": np.array([[0.25]], np.float32), "stateN": np.arange(128, dtype=np.float32).reshape(2, 1, 64)}
    frames = _bytes(P.encode_reply(9, {"k": 1}, out, inline=True))
    assert len(frames) == 1
    rep = P.decode_reply(frames)
    for k, v in out.items():
        np.testing.assert_array_equal(rep.tensors[k], v)
        assert rep.tensors[k].flags.writeable  # as documented for replies: the caller may write the state
    rep.tensors["stateN"][0, 0, 0] = 7.0
    assert len(_bytes(P.encode_reply(9, {"k": 1}, out))) == 3  # not asked: one frame per tensor


def test_inline_and_framed_tensors_mix_in_order() -> None:
    a, b, c = np.arange(4, dtype=np.float32), np.arange(6, dtype=np.int64).reshape(2, 3), np.array(True)
    header = {"v": 1, "id": 1, "op": "infer", "model": "m", "tensors": [
        {"name": "a", "dtype": "float32", "shape": [4]},
        {"name": "b", "dtype": "int64", "shape": [2, 3], "data": b.tobytes()},
        {"name": "c", "dtype": "bool", "shape": [], }]}
    req = P.decode_request([msgpack.packb(header, use_bin_type=True), a.tobytes(), c.tobytes()])
    np.testing.assert_array_equal(req.tensors["a"], a)
    np.testing.assert_array_equal(req.tensors["b"], b)
    assert req.tensors["c"].shape == () and bool(req.tensors["c"]) and not req.inline


@pytest.mark.parametrize("descs, frames, needle", [
    ([{"name": "x", "dtype": "float32", "shape": [4], "data": b"\0" * 12}], [], "needs 16 bytes but its frame has 12"),
    ([{"name": "x", "dtype": "float32", "shape": [1], "data": "abcd"}], [], "inline 'data' must be msgpack bin"),
    ([{"name": "x", "dtype": "float32", "shape": [1], "data": b"\0" * 4}], [b"\0" * 4], "1 of them inline"),
    ([{"name": "x", "dtype": "float32", "shape": [1], "data": None},
      {"name": "y", "dtype": "float32", "shape": [1], "data": b"\0" * 4}], [b"\0" * 4, b"\0" * 4], "tensor frames"),
    ([{"name": "x", "dtype": "float32", "shape": [1], "data": None}], [], "tensor frames"),
])
def test_bad_inline_tensors_are_invalid_arg(descs: list, frames: list, needle: str) -> None:
    header = msgpack.packb({"v": 1, "id": 8, "op": "infer", "model": "m", "tensors": descs}, use_bin_type=True)
    with pytest.raises(P.WireError) as ei:
        P.decode_request([header, *frames])
    assert ei.value.code == P.INVALID_ARG and ei.value.request_id == 8
    assert needle in ei.value.message, ei.value.message


def test_inline_tensor_bytes_do_not_count_against_a_small_header_limit() -> None:
    lim = P.Limits(max_header_bytes=300)
    feeds = _vad_chunk()  # 2.6 KB inline
    req = P.decode_request(_bytes(P.encode_request(1, "infer", "vad", tensors=feeds, inline=True)), lim)
    np.testing.assert_array_equal(req.tensors["state"], feeds["state"])
    # the header itself still keeps the limit, inline data or not
    padded = P.encode_request(2, "infer", "vad", args={"pad": "x" * 400}, tensors=feeds, inline=True)
    with pytest.raises(P.WireError, match="header of .* exceeds the limit of 300") as ei:
        P.decode_request(_bytes(padded), lim)
    assert ei.value.request_id == 2
    # and a header that claims more inline bytes than INLINE_MAX_BYTES is refused before any use
    big = {"v": 1, "id": 3, "op": "infer", "model": "m", "tensors": [
        {"name": "x", "dtype": "uint8", "shape": [P.INLINE_MAX_BYTES + 1], "data": b"\0" * (P.INLINE_MAX_BYTES + 1)}]}
    with pytest.raises(P.WireError, match="exceeds the limit"):
        P.decode_request([msgpack.packb(big, use_bin_type=True)], P.Limits(max_header_bytes=1024))


def test_inline_headers_from_templates_equal_the_general_encoding() -> None:
    """Inline requests and replies are spliced from cached templates: every dtype, 0-d and empty tensors, any id,
    and new data on each use of the same template decode exactly as the general encoding does."""
    rng = np.random.default_rng(7)
    tensors = {f"t_{dt}": (rng.standard_normal((2, 3)) * 10).astype(dt) for dt in sorted(P.ALLOWED_DTYPES)}
    tensors["scalar"] = np.array(3.5, np.float32)
    tensors["empty"] = np.zeros((0, 5), np.float32)
    for rid in (None, 0, 2**64 - 1, "req-é"):
        for step in range(3):  # the template is built once, then reused with new data and ids
            t = {k: v + step for k, v in tensors.items()} if step else tensors
            t = {k: v.astype(tensors[k].dtype) for k, v in t.items()}
            frames = _bytes(P.encode_request(rid, "infer", "m", tensors=t, inline=True, timeout_ms=250, priority=-3))
            assert len(frames) == 1
            got = P.decode_request(frames)
            want = P.decode_request(_bytes(P.encode_request(rid, "infer", "m", tensors=t, timeout_ms=250, priority=-3)))
            assert (got.id, got.op, got.model, got.timeout_ms, got.priority) == (want.id, "infer", "m", 250.0, -3)
            assert list(got.tensors) == list(t)
            for k, v in t.items():
                assert got.tensors[k].dtype == v.dtype and got.tensors[k].shape == v.shape
                np.testing.assert_array_equal(got.tensors[k], v)
            rep = P.decode_reply(_bytes(P.encode_reply(rid, {"compute_us": 1.5 + step, "inline": True}, t, inline=True)))
            assert rep.ok and rep.id == rid and rep.result == {"compute_us": 1.5 + step, "inline": True}
            for k, v in t.items():
                np.testing.assert_array_equal(rep.tensors[k], v)
    # what the template cannot take goes the general way, still inline and still right
    odd = {"noncontig": np.arange(24, dtype=np.int32).reshape(4, 6)[:, ::2], "bigendian": np.arange(5, dtype=">f4"),
           "listed": [1.0, 2.0]}
    got = P.decode_request(_bytes(P.encode_request(1, "infer", "m", tensors=odd, inline=True)))  # type: ignore[arg-type]
    assert got.inline
    for k, v in odd.items():
        np.testing.assert_array_equal(got.tensors[k], np.asarray(v))


def test_a_seen_inline_layout_is_read_without_a_full_decode_and_checked_the_same() -> None:
    """Receivers remember the byte layout of an inline stream's messages: later ones are read in place (their arrays
    view the frame itself) and come out equal to a full decode; anything that differs from the layout, or breaks a
    limit, is decoded in full and refused with the full decode's error."""
    feeds = _vad_chunk()
    first = _bytes(P.encode_request(1, "infer", "vad_seen", tensors=feeds, inline=True, timeout_ms=40))
    P.decode_request(first)  # learns the layout
    feeds2 = {k: np.asarray(v + 1, v.dtype) for k, v in feeds.items()}
    frame = _bytes(P.encode_request("r-2", "infer", "vad_seen", tensors=feeds2, inline=True, timeout_ms=40))[0]
    got = P.decode_request([frame])
    assert (got.id, got.op, got.model, got.timeout_ms, got.priority, got.args, got.inline) == (
        "r-2", "infer", "vad_seen", 40.0, 0, {}, True)
    buf = np.frombuffer(frame, np.uint8)
    for k, v in feeds2.items():
        np.testing.assert_array_equal(got.tensors[k], v)
        assert np.shares_memory(got.tensors[k], buf)  # read in place: the learned layout was used
    assert got.args is not P.decode_request([frame]).args  # a fresh args map per request
    # an id the full decode refuses (a list), after the layout was learned: refused the same way
    int_id = _bytes(P.encode_request(5, "infer", "vad_seen", tensors=feeds2, inline=True, timeout_ms=40))[0]
    assert int_id.endswith(b"\xa2id\x05") and P.decode_request([int_id]).id == 5
    bad_id = int_id[:-1] + b"\x91\x05"  # the tail's id (a fixint) becomes [5]
    with pytest.raises(P.WireError, match="'id' must be an int or a string"):
        P.decode_request([bad_id])
    # truncated data: no longer the layout, and the full decode names the damage
    with pytest.raises(P.WireError):
        P.decode_request([frame[:100] + frame[104:]])
    # a smaller header limit is another check: the full decode applies it (and the padding breaks it)
    padded = _bytes(P.encode_request(3, "infer", "vad_seen", args={"pad": "x" * 400}, tensors=feeds, inline=True))
    with pytest.raises(P.WireError, match="exceeds the limit of 300"):
        P.decode_request(padded, P.Limits(max_header_bytes=300))
    # a message of the same layout under a limit it breaks: refused although the layout is known
    with pytest.raises(P.WireError, match="exceeds the limit"):
        P.decode_request([frame], P.Limits(max_message_bytes=len(frame) - 1))
    # replies: an inline reply stream is read in place too, its arrays still writable copies
    out = {"output": np.array([[0.5]], np.float32), "stateN": np.ones((2, 1, 64), np.float32)}
    P.decode_reply(_bytes(P.encode_reply(5, {"compute_us": 1.0}, out, inline=True)))
    rep = P.decode_reply(_bytes(P.encode_reply(6, {"compute_us": 2.0, "queue_us": 3}, out, inline=True)))
    assert rep.ok and rep.id == 6 and rep.result == {"compute_us": 2.0, "queue_us": 3}
    for k, v in out.items():
        np.testing.assert_array_equal(rep.tensors[k], v)
        assert rep.tensors[k].flags.writeable
    err = P.decode_reply(_bytes(P.encode_error(7, P.NOT_FOUND, "no such model")))
    assert not err.ok and err.error_code == P.NOT_FOUND and err.id == 7
