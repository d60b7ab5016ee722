"""Recurrent zoo models served by a real daemon over ipc: the client carries the state (the VAD's ``state`` ->
``stateN``), sends an int64 scalar sample rate, and its stream of chunks equals onnxruntime's; several client
processes stream at once, each its own sequence; bad inputs get INVALID_ARG naming expected and got, and the
daemon keeps serving."""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import msgpack
import numpy as np
import pytest

import inferd.vulkan
import inferd.zoo
from inferd.server.testing import DaemonProcess
from inferd_client import Client, InvalidArgument
from inferd_client.cli import format_status

CHUNKS = 200


def _ort_session(path: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _audio(seed: int, n: int) -> np.ndarray:
    """``n`` chunks of 512 samples: noise with bursts of a tone (speech-like on/off)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n * 512) / 16000
    tone = np.sin(2 * np.pi * (220 + 40 * seed) * t) * (np.sin(2 * np.pi * 0.7 * t) > 0)
    return (0.05 * rng.standard_normal(n * 512) + 0.5 * tone).astype(np.float32).reshape(n, 1, 512)


@pytest.fixture(scope="module")
def models_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="ifds", dir="/tmp"))
    (d / "m").mkdir()
    inferd.zoo.write_zoo(d / "m", ["vad_lstm", "kws_gru"])
    yield d
    import shutil

    shutil.rmtree(d, ignore_errors=True)


def _stream(c: Client, sess, chunks: np.ndarray, sr: int) -> float:
    """Stream ``chunks`` through the daemon and onnxruntime, each with its own state carried; the largest
    difference of any chunk's probability or state."""
    state = np.zeros((2, 1, 64), np.float32)
    ref_state = state.copy()
    worst = 0.0
    for x in chunks:
        out = c.infer("vad_lstm", {"input": x, "sr": np.array(sr, np.int64), "state": state})
        p, ref_state = sess.run(None, {"input": x, "sr": np.array(sr, np.int64), "state": ref_state})
        worst = max(worst, float(np.abs(out["output"] - p).max()), float(np.abs(out["stateN"] - ref_state).max()))
        state = out["stateN"]
    return worst


DEVICES = ["cpu"] + (["vulkan"] if inferd.vulkan.available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_vad_stream_of_200_chunks_equals_onnxruntime(models_dir: Path, device: str) -> None:
    sess = _ort_session(models_dir / "m" / "vad_lstm.onnx")
    with DaemonProcess(f"ipc://{models_dir}/{device}.sock", models_dir / "m", log_path=models_dir / f"{device}.log",
                       device=device) as daemon, Client(daemon.endpoint, timeout=30) as c:
        chunks = _audio(1, CHUNKS)
        assert _stream(c, sess, chunks[:150], 16000) < 1e-4
        assert _stream(c, sess, chunks[150:], 8000) < 1e-4  # the other branch of the sample-rate If
        if device == "cpu":
            # the stream's inline runs tried the serving thread alone against the whole pool (alternating, so
            # both ran the chunks checked above) and kept the faster
            st = c.status()
            th = st["models"]["vad_lstm"].get("threads")
            if th is not None:  # a pool of two or more: the chunks above ran on one thread and on the pool
                assert th["threads"] == (1 if th["alone_us"] <= 1.05 * th["pool_us"] else th["pool"]), th
                assert "vad_lstm: runs on" in format_status(st)
        # the GRU keyword spotter: its state carried too
        kws = _ort_session(models_dir / "m" / "kws_gru.onnx")
        rng = np.random.default_rng(5)
        h = ref = np.zeros((1, 1, 64), np.float32)
        for _ in range(5):
            x = rng.standard_normal((1, 49, 40)).astype(np.float32)
            out = c.infer("kws_gru", {"input": x, "state": h})
            want, ref = kws.run(None, {"input": x, "state": ref})
            assert np.abs(out["output"] - want).max() < 1e-4 and np.abs(out["stateN"] - ref).max() < 1e-4
            h = out["stateN"]

        # bad input: INVALID_ARG naming what was expected and what came; the daemon keeps serving
        x = chunks[0]
        good = {"input": x, "sr": np.array(16000, np.int64), "state": np.zeros((2, 1, 64), np.float32)}
        bad = [({**good, "state": np.zeros((2, 64), np.float32)}, ["state", "[2, 1, 64]", "[2, 64]"]),
               ({**good, "sr": np.array(16000.0, np.float32)}, ["sr", "int64", "float32"]),
               ({**good, "sr": np.array([16000], np.int64)}, ["sr", "[]", "[1]"])]
        for feeds, words in bad:
            with pytest.raises(InvalidArgument) as e:
                c.infer("vad_lstm", feeds)
            assert all(w in str(e.value) for w in words), (str(e.value), words)
            out, info = c.infer_with_info("vad_lstm", good)
            assert out["stateN"].shape == (2, 1, 64)
            # on the CPU a warm VAD chunk runs on the serving thread itself: the checks above held there too
            assert info["inline"] == (device == "cpu"), info


CHILD = r"""
import sys
import numpy as np
import onnxruntime as ort
from inferd_client import Client
sys.path.insert(0, sys.argv[4])
from test_daemon_streaming import _audio, _stream, _ort_session
from pathlib import Path
ep, path, seed = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
with Client(ep, timeout=60) as c:
    worst = _stream(c, _ort_session(path), _audio(seed, 60), 16000 if seed % 2 else 8000)
assert worst < 1e-4, worst
print("STREAM-OK", seed, worst)
"""


def test_several_client_processes_stream_at_once(models_dir: Path) -> None:
    with DaemonProcess(f"ipc://{models_dir}/multi.sock", models_dir / "m", log_path=models_dir / "multi.log") as daemon:
        procs = [subprocess.Popen([sys.executable, "-c", CHILD, daemon.endpoint, str(models_dir / "m" / "vad_lstm.onnx"),
                                   str(seed), str(Path(__file__).parent)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for seed in range(4)]
        for seed, p in enumerate(procs):
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0 and f"STREAM-OK {seed}" in out, err[-2000:]


def test_raw_wire_one_frame_each_way_and_old_framing_still_served(models_dir: Path) -> None:
    """A request whose small tensors sit in its header gets its outputs the same way (one frame each way); one
    that sends a frame per tensor (an older client) gets a frame per output; a bad inline tensor is refused and
    the daemon serves on."""
    import zmq

    from inferd_client import protocol as P

    x = _audio(2, 1)[0]
    feeds = {"input": x, "sr": np.array(16000, np.int64), "state": np.zeros((2, 1, 64), np.float32)}
    ref = _ort_session(models_dir / "m" / "vad_lstm.onnx").run(None, feeds)
    with DaemonProcess(f"ipc://{models_dir}/raw.sock", models_dir / "m", log_path=models_dir / "raw.log") as daemon:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(daemon.endpoint)

        def ask(frames: list) -> list[bytes]:
            sock.send_multipart(frames)
            assert sock.poll(30000)
            return sock.recv_multipart()

        try:
            for rid in range(3):  # the first run goes through the model's worker, later ones inline
                got = ask(P.encode_request(rid, "infer", "vad_lstm", tensors=feeds, inline=True))
                assert len(got) == 1
                rep = P.decode_reply(got)
                assert rep.ok and rep.id == rid, rep
                assert np.abs(rep.tensors["output"] - ref[0]).max() < 1e-4
                assert np.abs(rep.tensors["stateN"] - ref[1]).max() < 1e-4
            got = ask(P.encode_request(7, "infer", "vad_lstm", tensors=feeds))
            assert len(got) == 3 and P.decode_reply(got).ok
            np.testing.assert_allclose(P.decode_reply(got).tensors["stateN"], ref[1], atol=1e-4)
            header = msgpack.packb({"v": 1, "id": 8, "op": "infer", "model": "vad_lstm", "tensors": [
                {"name": "input", "dtype": "float32", "shape": [1, 512], "data": b"\0" * 100}]}, use_bin_type=True)
            rep = P.decode_reply(ask([header]))
            assert not rep.ok and rep.error_code == "INVALID_ARG" and "needs 2048 bytes" in rep.error_message
            assert P.decode_reply(ask(P.encode_request(9, "infer", "vad_lstm", tensors=feeds, inline=True))).ok
        finally:
            sock.close()
            ctx.term()
