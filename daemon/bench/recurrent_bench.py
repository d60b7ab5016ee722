"""``inferd bench recurrent``: the recurrent zoo models against onnxruntime, and streaming through the daemon.

* warm latency of ``vad_lstm`` (one 32 ms chunk at 16 kHz), ``crnn_lstm`` (a 32 x 128 text line) and ``kws_gru``
  (49 frames), inferd CPU (and Vulkan where a device is there) vs onnxruntime CPU, both with their default
  threads and both with one thread, and ncnn (``ncnn_peer``: the models specialised to the benchmark's inputs,
  converted by pnnx, timed in a child; not measured where ncnn or pnnx is missing, and the result says why);
* the daemon round trip of one VAD chunk (state and int64 sample rate in, probability and state out) against a
  bare pyzmq echo of the same bytes between two processes, and against that echo plus the in-process warm time;
* how many 32 ms streams one core sustains: 32 ms over the per-chunk time on one thread, in process and through
  the daemon (the daemon's serving CPU time per chunk, client excluded, without the serving thread's spin).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..config import Config
from .common import fmt, machine_info, median_ms, ratio, time_calls, write_results
from .daemon_bench import EchoPeer, _pcts

MODELS = ["vad_lstm", "crnn_lstm", "kws_gru"]
CHUNK_S = 0.032  # 512 samples at 16 kHz
#: warm-up runs before timing (each engine): the first few hundred sub-millisecond runs of a fresh model are
#: slower (thread pool, caches, clock ramp); 20 left inferd's VAD at 0.48 ms where it settles at 0.29
WARMUP = 300


def _feeds(name: str) -> dict[str, np.ndarray]:
    from .. import zoo

    info = zoo.MODELS[name]
    rng = np.random.default_rng(0)
    out = {}
    for n, shape in info.inputs:
        if info.dtype(n) == "int64":
            out[n] = np.array(16000, np.int64)
        else:
            dims = tuple(128 if isinstance(d, str) else d for d in shape)
            out[n] = (rng.standard_normal(dims) * 0.3).astype(np.float32)
    return out


def _ort(path: Path, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _ncnn(name: str, path: Path, feeds: dict[str, np.ndarray], repeat: int, threads: list[int],
          work: Path) -> dict[str, Any]:
    """ncnn fp32 on this model (pnnx conversion, ``If``s inlined for these feeds, int64 inputs frozen), per
    thread count its median ms, checked against onnxruntime; ``{"ncnn_error": why}`` when it cannot run."""
    try:
        import ncnn  # noqa: F401
        import onnx

        from .ncnn_peer import convert_ncnn, fold_gru_weights, inline_ifs, time_ncnn, toposort_param
    except Exception as e:
        return {"ncnn_error": f"not measured: {type(e).__name__}: {e}"}
    try:
        frozen = [k for k, v in feeds.items() if v.dtype == np.int64]
        spec = inline_ifs(onnx.load(str(path)), feeds, freeze=frozen)
        ins = [i.name for i in spec.graph.input]
        sp = work / f"{name}_ncnn.onnx"
        onnx.save(spec, str(sp))
        ref = _ort(sp, 0).run(None, {k: feeds[k] for k in ins})
        param, binf = convert_ncnn(sp, [(feeds[k].shape, str(feeds[k].dtype)) for k in ins], work / f"{name}_ncnn")
        toposort_param(param)
        fold_gru_weights(param, binf, spec)
        out: dict[str, Any] = {}
        for t in threads:
            r = time_ncnn(param, binf, [feeds[k] for k in ins], ref, t, repeat, WARMUP, work / f"{name}_ncnn")
            if "error" in r:
                return {"ncnn_error": r["error"][-300:]}
            out[f"ncnn_{t}t_ms"] = r["ms"]
            out["ncnn_max_rel_err"] = r["max_rel_err"]
        return out
    except Exception as e:
        return {"ncnn_error": f"{type(e).__name__}: {str(e)[-300:]}"}


#: how the peer was made, for the results' header
NCNN_HOW = ("pnnx conversion of each model specialised to the benchmark's inputs (ncnn has no control flow: every If "
            "decided by these feeds replaced by its branch, the int64 sample rate made a constant; pnnx's layer order "
            "sorted, its dynamic-weight GRU given ncnn's GRU weights), fp32, timed in a child process, outputs checked "
            "against onnxruntime; the specialised graph has fewer nodes than the one inferd and onnxruntime run")


def main(argv: list[str] | None = None) -> int:
    import inferd
    from .. import native, zoo

    ap = argparse.ArgumentParser(prog="inferd bench recurrent")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--repeat", type=int, default=300)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--no-vulkan", action="store_true")
    ap.add_argument("--no-daemon", action="store_true")
    args = ap.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    tmp = Path(tempfile.mkdtemp(prefix="ifrb", dir="/tmp"))
    paths = zoo.write_zoo(tmp / "m", names)
    import inferd.vulkan

    vulkan = inferd.vulkan.available() and not args.no_vulkan
    res: dict[str, Any] = {"machine": {**machine_info(), "load_avg_start": list(os.getloadavg())},
                           "repeat": args.repeat, "ncnn": NCNN_HOW, "models": {}}
    default_threads = native.num_threads()
    res["threads"] = default_threads
    # the VAD chunk through the daemon first: a client app never runs models on the GPU itself, and a bench
    # process that had (the per-model Vulkan runs below) streamed the chunk 80-90 us slower on an H100 host
    if "vad_lstm" in names:
        feeds = _feeds("vad_lstm")
        native.set_num_threads(1)
        m = inferd.load(str(paths["vad_lstm"]), device="cpu")
        try:
            m.wait_warm(60)
            one = median_ms(time_calls(lambda: m.run(feeds), args.repeat, 20)) / 1e3
            st: dict[str, Any] = {"in_process_1thread_us": round(one * 1e6, 1),
                                  "streams_per_core_in_process": int(CHUNK_S / one)}
            if not args.no_daemon:
                st.update(_daemon(tmp, paths["vad_lstm"].parent, feeds, args.repeat, lambda: m.run(feeds)))
        finally:
            m.close()
            native.set_num_threads(default_threads)
        res["streaming"] = st
        print("streaming", st, flush=True)
    for name in names:
        feeds = _feeds(name)
        r: dict[str, Any] = {"inputs": {k: list(v.shape) for k, v in feeds.items()}}
        m = inferd.load(str(paths[name]), device="cpu", shapes={k: v.shape for k, v in feeds.items()})
        m.wait_warm(60)
        for threads, tag in ((default_threads, "default"), (1, "1thread")):
            native.set_num_threads(threads)
            s = _ort(paths[name], 0 if tag == "default" else 1)
            r.update(_interleaved(tag, lambda: m.run(feeds), lambda: s.run(None, feeds), args.repeat))
            if tag == "default" and m.thread_choice is not None:  # what its runs took: the pool or one thread
                r["inferd_thread_choice"] = m.thread_choice.info()
        native.set_num_threads(default_threads)
        m.close()
        r.update(_ncnn(name, paths[name], feeds, args.repeat, [default_threads, 1], tmp))
        r["ratio_to_ncnn"] = ratio(r["inferd_cpu_default_ms"], r.get(f"ncnn_{default_threads}t_ms"))
        if vulkan:
            mv = inferd.load(str(paths[name]), device="vulkan", shapes={k: v.shape for k, v in feeds.items()})
            mv.wait_warm(60)
            r["inferd_vulkan_ms"] = round(median_ms(time_calls(lambda: mv.run(feeds), max(args.repeat // 3, 20), 10)), 4)
            mv.close()
        res["models"][name] = r
        print(name, r, flush=True)
    if vulkan:
        from ..vulkan.device import get_device

        res["vulkan_device"] = get_device().name
    tag = "_" + res["vulkan_device"].split(" (")[0].lower().replace(" ", "_")[:24] if vulkan else ""
    jp, mp = write_results(args.out, "recurrent_cpu" + tag, res, _table(res))
    print(f"wrote {jp} and {mp}")
    return 0


#: the round trip, the echo and the in-process run are timed in this many alternating rounds: this VM's speed
#: moves by 1.3-1.5x within minutes, and a figure timed minutes apart from the one it is divided by measured the
#: spell rather than the daemon (ratios of 1.34, 1.70 and 1.83 in three runs of one build)
ROUNDS = 6


def _interleaved(tag: str, ours: Any, theirs: Any, repeat: int) -> dict[str, Any]:
    """inferd's and onnxruntime's warm runs of one model timed in ``ROUNDS`` alternating rounds (after ``WARMUP``
    each), ``repeat`` runs each in all: their medians over every round, the ratio of those, and the ratio per
    round. Timed one after the other, minutes apart, they had measured the VM's spells: the VAD's ratio 1.20, 1.46
    and 1.59 in three runs of one build, where 12 alternating rounds in one process gave 0.95-1.15 (both engines
    70 us in one spell and 100-115 in the next). A pause before each engine's round lets the other's pool threads
    (their spin after a run) go quiet, and a few untimed runs wake its own."""
    for fn in (ours, theirs):
        time_calls(fn, 0, WARMUP)
    per = max(repeat // ROUNDS, 20)
    a: list[float] = []
    b: list[float] = []
    rounds = []
    for _ in range(ROUNDS):
        got = []
        for fn in (ours, theirs):
            time.sleep(0.02)
            got.append(time_calls(fn, per, 10))
        a += got[0]
        b += got[1]
        rounds.append(ratio(float(np.median(got[0])), float(np.median(got[1]))))
    mine, peer = round(median_ms(a), 4), round(median_ms(b), 4)
    return {f"inferd_cpu_{tag}_ms": mine, f"ort_cpu_{tag}_ms": peer, f"ratio_{tag}": ratio(mine, peer),
            f"ratio_{tag}_per_round": rounds}


def _daemon(tmp: Path, models: Path, feeds: dict[str, np.ndarray], n: int, run_inproc: Any) -> dict[str, Any]:
    from inferd_client import Client
    from inferd_client.protocol import INLINE_MAX_BYTES

    from ..server.testing import DaemonProcess

    out: dict[str, Any] = {}
    in_bytes = sum(a.nbytes for a in feeds.values()) + 64
    out_bytes = 4 + 2 * 64 * 4 + 64
    per = max(n // ROUNDS, 50)
    # the client sends this chunk as one frame (its tensors inside the header): the echo sends the same
    # c: the default client, which waits for a short request's reply awake (``spin_us``); c0 sleeps in its poll
    with DaemonProcess(f"ipc://{tmp}/d.sock", models, log_path=tmp / "d.log", device="cpu") as d, \
            Client(d.endpoint, timeout=30) as c, Client(d.endpoint, timeout=30, spin_us=0) as c0, \
            EchoPeer(tmp, in_bytes, out_bytes, one_frame=in_bytes <= INLINE_MAX_BYTES) as echo:
        _warm_up(c, feeds)
        _warm_up(c0, feeds)
        rt: list[float] = []
        rt0: list[float] = []
        ec: list[float] = []
        ip: list[float] = []
        cpu = [0.0, 0.0]
        rounds = []
        rounds0 = []
        for _ in range(ROUNDS):
            r_ip = time_calls(run_inproc, per, 20)
            r_ec = echo.time(per, 20)
            t0 = time.thread_time()
            r_rt = time_calls(lambda: c.infer("vad_lstm", feeds), per, 20)
            t1 = time.thread_time()
            r_rt0 = time_calls(lambda: c0.infer("vad_lstm", feeds), per, 20)
            cpu[0] += t1 - t0
            cpu[1] += time.thread_time() - t1
            ip += r_ip
            ec += r_ec
            rt += r_rt
            rt0 += r_rt0
            base = float(np.median(r_ec)) + float(np.median(r_ip))
            rounds.append(ratio(float(np.median(r_rt)), base))
            rounds0.append(ratio(float(np.median(r_rt0)), base))
        out["daemon_round_trip"] = _pcts(rt)
        out["client_spin_us"] = c.spin_s * 1e6
        out["daemon_round_trip_client_nospin"] = _pcts(rt0)
        out["ratio_per_round_client_nospin"] = rounds0
        # the client's calling thread, per chunk (its warm-up calls included): what the spin costs the app
        n_calls = ROUNDS * (per + 20)
        out["client_thread_cpu_us"] = round(cpu[0] / n_calls * 1e6, 1)
        out["client_thread_cpu_nospin_us"] = round(cpu[1] / n_calls * 1e6, 1)
        out["spin_us"] = Config().spin_us
        out["daemon_cpu_per_chunk_us"] = _cpu_per_chunk(d.pid, lambda: c.infer("vad_lstm", feeds))
    out["zmq_echo"] = echo_p = _pcts(ec)
    inproc_us = float(np.median(ip)) * 1e6
    out["in_process_interleaved_us"] = round(inproc_us, 1)
    out["rounds"] = ROUNDS
    out["ratio_per_round"] = rounds
    budget = 1.5 * (echo_p["p50_us"] + inproc_us)
    out["goal_us (1.5 x (echo + in-process))"] = round(budget, 1)
    out["ratio_to_echo_plus_inprocess"] = ratio(out["daemon_round_trip"]["p50_us"], echo_p["p50_us"] + inproc_us)
    out["ratio_client_nospin"] = ratio(out["daemon_round_trip_client_nospin"]["p50_us"], echo_p["p50_us"] + inproc_us)
    # the same daemon with spin_us = 0, in the same run: what the serving thread's spin gives, and the serving
    # CPU per chunk without the spin, which fills the wait between one client's chunks but not a saturated
    # daemon's time (many streams at once: the next chunk is already there)
    with DaemonProcess(f"ipc://{tmp}/d0.sock", models, "--spin-us", "0", log_path=tmp / "d0.log", device="cpu") as d, \
            Client(d.endpoint, timeout=30) as c:
        _warm_up(c, feeds)
        out["daemon_round_trip_spin0"] = _pcts(time_calls(lambda: c.infer("vad_lstm", feeds), n, 50))
        us = out["daemon_cpu_per_chunk_spin0_us"] = _cpu_per_chunk(d.pid, lambda: c.infer("vad_lstm", feeds))
        out["streams_per_core_daemon"] = int(CHUNK_S / (us * 1e-6)) if us > 0 else None
    return out


def _warm_up(c: Any, feeds: dict[str, np.ndarray]) -> None:
    """As for the in-process figure: the warm path (after the warm switch), after as many warm-up runs."""
    c.infer("vad_lstm", feeds)
    end = time.monotonic() + 60
    while not c.status()["models"]["vad_lstm"].get("warm") and time.monotonic() < end:
        c.infer("vad_lstm", feeds)
    for _ in range(300):
        c.infer("vad_lstm", feeds)


def _cpu_per_chunk(pid: int, call: Any, k: int = 500) -> float:
    """The daemon process's CPU time (all its threads, 10 ms ticks) per call over ``k`` calls, in us."""
    import psutil

    proc = psutil.Process(pid)
    t0 = sum(proc.cpu_times()[:2])
    for _ in range(k):
        call()
    return round((sum(proc.cpu_times()[:2]) - t0) / k * 1e6, 1)


def _table(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [f"# inferd bench recurrent ({m['date'][:10]})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, numpy {m['numpy']}; host {m['host']}.",
             f"Median of {res['repeat']} warm runs after {WARMUP} warm-ups; inferd and onnxruntime timed in "
             f"{ROUNDS} alternating rounds (the ratio per round below the table). ncnn: {res['ncnn']}.", "",
             "| model | inputs | inferd CPU (ms) | onnxruntime (ms) | ratio | ncnn (ms) | inferd / ncnn | inferd 1 thread "
             f"| ort 1 thread | ratio 1t | ncnn 1 thread | inferd Vulkan {res.get('vulkan_device', '')} (ms) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    threads = res.get("threads", res["machine"]["cores"])
    for name, r in res["models"].items():
        lines.append(f"| {name} | {r['inputs']} | {fmt(r['inferd_cpu_default_ms'], '.3f')} | "
                     f"{fmt(r['ort_cpu_default_ms'], '.3f')} | {fmt(r['ratio_default'], '.2f')} | "
                     f"{fmt(r.get(f'ncnn_{threads}t_ms'), '.3f')} | {fmt(r.get('ratio_to_ncnn'), '.2f')} | "
                     f"{fmt(r['inferd_cpu_1thread_ms'], '.3f')} | {fmt(r['ort_cpu_1thread_ms'], '.3f')} | "
                     f"{fmt(r['ratio_1thread'], '.2f')} | {fmt(r.get('ncnn_1t_ms'), '.3f')} | "
                     f"{fmt(r.get('inferd_vulkan_ms'), '.3f')} |")
    per_round = [f"{n} {', '.join(fmt(x, '.2f') for x in r['ratio_default_per_round'])} (1 thread: "
                 f"{', '.join(fmt(x, '.2f') for x in r.get('ratio_1thread_per_round', []))}; inferd's runs on "
                 f"{(r.get('inferd_thread_choice') or {}).get('threads', '?')} thread(s) at the end)"
                 for n, r in res["models"].items() if r.get("ratio_default_per_round")]
    if per_round:
        lines += ["", "inferd / onnxruntime per round: " + "; ".join(per_round)]
    errs = [f"{n}: {r['ncnn_error']}" for n, r in res["models"].items() if r.get("ncnn_error")]
    if errs:
        lines += ["", "ncnn not measured: " + "; ".join(errs)]
    st = res.get("streaming")
    if st:
        lines += ["", "## Streaming one VAD chunk (512 samples, int64 sr, (2, 1, 64) state in and out)", ""]
        lines.append(f"- in process, one thread: {st['in_process_1thread_us']} us per chunk -> "
                     f"{st['streams_per_core_in_process']} concurrent 32 ms streams per core")
        if "daemon_round_trip" in st:
            rt, echo = st["daemon_round_trip"], st["zmq_echo"]
            lines.append(f"- daemon round trip over ipc: p50 {rt['p50_us']} us, p99 {rt['p99_us']} us; bare pyzmq echo "
                         f"of the same bytes p50 {echo['p50_us']} us; in process (one thread) "
                         f"{st.get('in_process_interleaved_us', st['in_process_1thread_us'])} us, the three timed in "
                         f"{st.get('rounds', 1)} alternating rounds; goal 1.5 x (echo + in-process) = "
                         f"{st['goal_us (1.5 x (echo + in-process))']} us; measured / (echo + in-process) = "
                         f"{fmt(st['ratio_to_echo_plus_inprocess'], '.2f')} (per round: "
                         f"{', '.join(fmt(x, '.2f') for x in st.get('ratio_per_round', []))})")
            if "daemon_round_trip_client_nospin" in st:
                rn = st["daemon_round_trip_client_nospin"]
                lines.append(f"- the client waits for the reply awake up to spin_us = {st['client_spin_us']:g} us (the "
                             f"default): its calling thread's CPU {st['client_thread_cpu_us']} us per chunk. A client "
                             f"with spin_us = 0, in the same rounds: p50 {rn['p50_us']} us, p99 {rn['p99_us']} us, "
                             f"{fmt(st['ratio_client_nospin'], '.2f')} x (echo + in-process) (per round: "
                             f"{', '.join(fmt(x, '.2f') for x in st['ratio_per_round_client_nospin'])}); its thread's "
                             f"CPU {st['client_thread_cpu_nospin_us']} us per chunk")
            if "daemon_round_trip_spin0" in st:
                rt0 = st["daemon_round_trip_spin0"]
                lines.append(f"- the same daemon with its own spin_us = 0 (default {st.get('spin_us')}): p50 "
                             f"{rt0['p50_us']} us, p99 {rt0['p99_us']} us")
            if st.get("daemon_cpu_per_chunk_us"):
                lines.append(f"- daemon CPU per chunk, back to back: {st.get('daemon_cpu_per_chunk_spin0_us')} us "
                             f"with spin_us = 0 -> {st['streams_per_core_daemon']} streams per core through the "
                             f"daemon; {st['daemon_cpu_per_chunk_us']} us with the default (its spin fills the "
                             "wait for one client's next chunk)")
    return "\n".join(lines) + "\n"
