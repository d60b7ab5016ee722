"""``inferctl``: talk to the inferd daemon from a shell.

    inferctl status                         # daemon and per-model state, stats, memory
    inferctl models
    inferctl load NAME [--reload] | unload NAME
    inferctl infer NAME --input x=in.npy [--input y=b.npy | --input all.npz] [--output out.npz]
    inferctl budget 2G                      # the models' memory budget (0 = none): LRU models unloaded to keep it
    inferctl reload                         # re-read config, groups, keys; rescan models
    inferctl health
    inferctl --endpoint tcp://HOST:5599 --key me.key_secret --server-key server.key status   # CURVE

load, unload, budget and reload need the admin role. Human-readable by default, ``--json`` for
scripts. Exit status: 0 ok, 1 the daemon answered with an error, 2 bad usage, 3 the daemon could
not be reached (transport error), 4 permission denied (role too low, or connection refused).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import errors
from .client import Client
from .protocol import default_endpoint, parse_size


def _mib(n: int | float | None) -> str:
    if not n:
        return "0"
    return f"{n / (1 << 20):.1f} MiB"


def _sig(ts: list[dict[str, Any]]) -> str:
    """name:dtype[dims] per tensor; a dynamic dimension by its name (``dims``), else the fixed shape."""
    return ", ".join(f"{t['name']}:{t['dtype']}[{', '.join(str(d) for d in t.get('dims') or t['shape'])}]"
                     for t in ts) or "-"


def _variants(m: dict[str, Any]) -> str:
    """The shapes a dynamic model has prepared: its first (the inputs' ``shape``) and each variant."""
    ins = m.get("inputs") or []
    if not any("dims" in t for t in ins):
        return "-"
    first = "x".join(str(d) for t in ins for d in t["shape"]) if len(ins) == 1 else \
        ";".join(f"{t['name']}={'x'.join(str(d) for d in t['shape'])}" for t in ins)
    out = [first]
    for v in m.get("variants") or []:
        sh = v.get("shapes", {})
        out.append("x".join(str(d) for s in sh.values() for d in s) if len(sh) == 1 else
                   ";".join(f"{k}={'x'.join(str(d) for d in s)}" for k, s in sh.items()))
    return ", ".join(out)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _duration(s: float) -> str:
    s = int(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else f"{m}m{sec:02d}s"


def format_status(st: dict[str, Any]) -> str:
    mem = st.get("memory", {})
    budget = mem.get("budget_bytes") or 0
    state = "ready" if st.get("ready") else ("stopping" if st.get("draining") else "starting")
    lines = [
        f"inferd {st.get('version', '')} on {st.get('endpoint')}  pid {st.get('pid')}  up {_duration(st.get('uptime_s', 0))}  {state}",
        f"device {st.get('device')} (in use: {', '.join(st.get('devices_in_use') or []) or 'none'})  "
        f"memory: RSS {_mib(mem.get('rss_bytes'))}, models {_mib(mem.get('models_bytes'))} (the rest, "
        f"{_mib(mem.get('overhead_bytes'))}, is interpreter, libraries and drivers), page cache of packages "
        f"{_mib(mem.get('page_cache_bytes'))}, budget {_mib(budget) if budget else 'none'}"
        + (f" (cgroup limit {_mib(mem['cgroup_limit_bytes'])}, effective {_mib(mem.get('effective_budget_bytes'))})"
           if mem.get("cgroup_limit_bytes") else ""),
    ]
    dev = mem.get("device")
    if isinstance(dev, dict) and (dev.get("models_bytes") or dev.get("shares_host_memory")):
        # where a GPU model's bytes are counted: one memory on an integrated GPU (or lavapipe), two on a discrete one
        dbudget = dev.get("budget_bytes") or 0
        if dev.get("shares_host_memory"):
            lines.append(f"GPU models: {_mib(dev.get('models_bytes'))}, in the memory budget above (the device's "
                         f"memory is the host's)" + (f"; device budget {_mib(dbudget)} besides" if dbudget else ""))
        else:
            lines.append(f"GPU models: {_mib(dev.get('models_bytes'))} of device memory, device budget "
                         f"{_mib(dbudget) if dbudget else 'none'}")
    heap = mem.get("heap")
    if isinstance(heap, dict) and heap.get("trims"):
        lines.append(f"freed heap given back to the system: {_mib(heap.get('released_bytes'))} in {heap['trims']} "
                     f"trims (the last after {heap.get('last_reason') or '?'})")
    mc = mem.get("metadata_cache")
    if isinstance(mc, dict) and (mc.get("plans") or mc.get("indexes")):
        lines.append(f"kept parsed for the next load: {mc.get('plans', 0)} plans ({_mib(mc.get('plan_file_bytes'))} "
                     f"on disk), {mc.get('indexes', 0)} store indexes ({_mib(mc.get('index_bytes'))})")
    ca = st.get("cache")
    if isinstance(ca, dict):
        line = (f"cache {ca.get('dir')}: {ca.get('state')}, {_mib(ca.get('bytes_used'))} used"
                f" (limit {_mib(ca.get('max_bytes'))})")
        if ca.get("state") != "ok" and ca.get("error"):
            line += f": {ca['error']} (models are compiled in memory)"
        lines.append(line)
    fa = st.get("faults")
    if isinstance(fa, dict) and (fa.get("counts") or fa.get("recovering")):
        counts = ", ".join(f"{k} {v}" for k, v in sorted((fa.get("counts") or {}).items()))
        line = f"faults: {counts or 'none'}"
        if fa.get("last_recovery_s") is not None:
            line += f"; last recovery {fa['last_recovery_s']:.3f} s"
        if fa.get("recovering"):
            line += f"; recovering now: {', '.join(fa['recovering'])}"
        lines.append(line)
    you, sec = st.get("you"), st.get("security")
    if you and sec:
        lines.append(f"you: {you.get('role')} ({you.get('who')}, {you.get('inflight', 0)} in flight of "
                     f"{sec.get('max_inflight_per_client')})  socket_group {sec.get('socket_group')}, admin_group "
                     f"{sec.get('admin_group') or '-'}, CURVE {'on' if sec.get('curve') else 'off'}"
                     + (f" ({sec.get('authorized_keys')} keys)" if sec.get("curve") else ""))
    models = st.get("models", {})
    if not models:
        lines.append(f"no models in {st.get('models_dir')}")
        return "\n".join(lines)
    rows = [["MODEL", "STATE", "DEVICE", "QUEUED", "REQUESTS", "OK", "FAILURES", "QUEUE ms p50/p99", "COMPUTE ms p50/p99"]]
    for name, m in models.items():
        q, c = m.get("queue_ms", {}), m.get("compute_ms", {})
        state = m.get("state", "?")
        if state == "READY" and m.get("warm") is False:  # answering on its cold kernels until its warm switch is done
            state = "READY/warming"
        rows.append([
            name, state, str(m.get("device") or "-"), str(m.get("queued", 0)), str(m.get("requests", 0)),
            str(m.get("ok", 0)), str(m.get("failures", 0)),
            f"{q.get('p50', 0):.3g}/{q.get('p99', 0):.3g}", f"{c.get('p50', 0):.3g}/{c.get('p99', 0):.3g}",
        ])
    lines.append(_table(rows))
    cold = [[name, f"{c['cold_s'] * 1e3:.1f}", f"{c.get('predicted_s', 0) * 1e3:.1f}", f"{c.get('read_s', 0) * 1e3:.1f}",
             f"{c.get('transform_s', 0) * 1e3:.1f}", f"{c.get('pipeline_s', 0) * 1e3:.1f}",
             f"{c.get('execute_s', 0) * 1e3:.1f}", f"{c.get('waiting_s', 0) * 1e3:.1f}"]
            for name, m in models.items() for c in [m.get("cold") or {}] if "cold_s" in c]
    if cold:
        lines.append("last cold load (ms; read/transform/pipeline are summed over the loader threads):")
        lines.append(_table([["MODEL", "COLD", "PREDICTED", "READ", "TRANSFORM", "PIPELINE", "EXECUTE", "WAITING"]] + cold))
    for name, m in models.items():
        co = m.get("coexec")
        if isinstance(co, dict):  # a cpu+vulkan model: which layers the CPU and the GPU share
            lines.append(f"  {name}: co-executed, {co.get('split', 0)} layers split by channels, {co.get('cpu', 0)} on "
                         f"the CPU, {co.get('gpu', 0)} on the GPU ({co.get('cost_source') or '?'} costs)")
    for name, m in models.items():
        th = m.get("threads")
        if isinstance(th, dict) and th.get("alone_us") is not None:  # a small model may run on one thread
            who = "one thread" if th.get("threads") == 1 else f"{th.get('pool')} threads"
            lines.append(f"  {name}: runs on {who} (median {th['alone_us']} us on one, {th.get('pool_us')} us on "
                         f"{th.get('pool')})")
    for name, m in models.items():
        rg = m.get("registration")
        if isinstance(rg, dict) and m.get("state") == "UNLOADED" and rg.get("state") != "skipped":
            # a model that waits for its first request: whether it was prepared for it (package, plan parsed)
            if rg.get("state") == "done":
                did = [w for w, k in (("compiled", "compiled"), ("profiled", "profiled"), ("plan parsed", "parsed"))
                       if rg.get(k)]
                lines.append(f"  {name}: registered in {rg.get('ms')} ms ({', '.join(did) or rg.get('note') or '-'})")
            else:
                err = f": {rg['error']}" if rg.get("error") else ""
                lines.append(f"  {name}: registration {rg.get('state')}{err}")
    for name, m in models.items():
        if m.get("reason") and m.get("state") != "READY" or "failed" in (m.get("reason") or ""):
            lines.append(f"  {name}: {m['reason']}")
    return "\n".join(lines)


def format_models(models: list[dict[str, Any]]) -> str:
    if not models:
        return "no models"
    rows = [["NAME", "STATE", "DEVICE", "INPUTS", "OUTPUTS", "SHAPES", "MEMORY", "REASON"]]
    for m in models:
        rows.append([m["name"], m["state"], str(m.get("device") or "-"), _sig(m.get("inputs", [])),
                     _sig(m.get("outputs", [])), _variants(m) if m.get("state") == "READY" else "-",
                     _mib(m.get("memory_bytes")), m.get("reason") or ""])
    return _table(rows)


def _load_inputs(specs: Sequence[str]) -> dict[str, np.ndarray]:
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        if "=" in spec:
            name, path = spec.split("=", 1)
            try:
                arr = np.load(path, allow_pickle=False)
            except (OSError, ValueError, EOFError) as exc:
                raise ValueError(f"cannot read {path}: {exc}") from None
            if isinstance(arr, np.lib.npyio.NpzFile):
                raise ValueError(f"{path}: NAME=FILE takes a .npy file; pass an .npz without NAME=")
            feeds[name] = arr
        else:
            try:
                npz = np.load(spec, allow_pickle=False)
            except (OSError, ValueError, EOFError) as exc:
                raise ValueError(f"cannot read {spec}: {exc}") from None
            if not isinstance(npz, np.lib.npyio.NpzFile):
                raise ValueError(f"{spec}: expected NAME=FILE.npy or FILE.npz")
            with npz:
                feeds.update({k: npz[k] for k in npz.files})
    if not feeds:
        raise ValueError("infer needs at least one --input NAME=FILE.npy (or --input FILE.npz)")
    return feeds


def _summary(a: np.ndarray) -> str:
    flat = a.reshape(-1)
    head = np.array2string(flat[:6], precision=5, separator=", ")
    stats = ""
    if a.size and np.issubdtype(a.dtype, np.number):
        stats = f"  min {flat.min():.6g} max {flat.max():.6g} mean {flat.astype(np.float64).mean():.6g}"
        if a.ndim >= 1 and a.shape[-1] > 1:
            stats += f"  argmax(last axis) {np.argmax(a, axis=-1).reshape(-1)[:8].tolist()}"
    return f"{a.dtype.name}{list(a.shape)}{stats}\n    {head}{' ...' if a.size > 6 else ''}"


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--endpoint", default=argparse.SUPPRESS,
                        help=f"daemon endpoint (default: {default_endpoint()})")
    common.add_argument("--timeout", type=float, default=argparse.SUPPRESS, help="seconds to wait (default 10)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    common.add_argument("--key", default=argparse.SUPPRESS, metavar="NAME.key_secret",
                        help="this client's CURVE key file, for a tcp:// endpoint with CURVE (default: $INFERD_KEY)")
    common.add_argument("--server-key", default=argparse.SUPPRESS, metavar="server.key",
                        help="the daemon's CURVE public key file or key (default: $INFERD_SERVER_KEY)")
    p = argparse.ArgumentParser(prog="inferctl", description="Control and query the inferd daemon.", parents=[common])
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    sub.add_parser("status", parents=[common], help="daemon status, memory and per-model stats")
    sub.add_parser("models", parents=[common], help="models of the repository and their state")
    sub.add_parser("health", parents=[common], help="live/ready check (exit 0 only when ready)")
    sp = sub.add_parser("load", parents=[common], help="load a model (or reload it from disk)")
    sp.add_argument("name")
    sp.add_argument("--reload", action="store_true", help="reload from disk even if loaded")
    sp = sub.add_parser("unload", parents=[common], help="unload a model")
    sp.add_argument("name")
    sp = sub.add_parser("infer", parents=[common], help="run a model on .npy/.npz inputs")
    sp.add_argument("name")
    sp.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy|FILE.npz")
    sp.add_argument("--output", "-o", metavar="OUT.npz", help="save the outputs to an .npz file")
    sp.add_argument("--priority", type=int, default=0)
    sp = sub.add_parser("budget", parents=[common], help="set the memory budget, e.g. 2G (0 = none)")
    sp.add_argument("size")
    sub.add_parser("reload", parents=[common], help="re-read config, groups and authorised keys; rescan models")
    return p


def _to_json(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (np.generic,)):
        return obj.item()
    if isinstance(obj, bytes):
        return obj.hex()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def main(argv: Sequence[str] | None = None) -> int:
    """``inferctl``; a reader that went away (``| head``) ends it quietly, Ctrl-C with status 130,
    neither with a traceback."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here for output still buffered
        return code
    except BrokenPipeError:
        # Python flushes stdout once more at exit: point it at /dev/null so that flush cannot fail
        # too (the fix the Python docs give for SIGPIPE)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141  # 128 + SIGPIPE, what a tool killed by the signal reports
    except KeyboardInterrupt:
        print("inferctl: interrupted", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    as_json = getattr(args, "json", False)
    endpoint = getattr(args, "endpoint", None)
    timeout = getattr(args, "timeout", 10.0)

    def emit(obj: Any, human: str) -> None:
        print(json.dumps(obj, default=_to_json, indent=2, sort_keys=True) if as_json else human)

    try:
        client = Client(endpoint, timeout=timeout, key=getattr(args, "key", None),
                        server_key=getattr(args, "server_key", None))
    except ValueError as exc:
        print(f"inferctl: {exc}", file=sys.stderr)
        return 2
    try:
        with client as c:
            if args.cmd == "status":
                st = c.status()
                emit(st, format_status(st))
            elif args.cmd == "models":
                ms = c.models()
                emit(ms, format_models(ms))
            elif args.cmd == "health":
                h = c.health()
                emit(h, f"live: {h.get('live')}  ready: {h.get('ready')}" + ("  (stopping)" if h.get("draining") else ""))
                return 0 if h.get("ready") else 1
            elif args.cmd == "load":
                info = c.load(args.name, reload=args.reload)
                emit(info, f"{info['name']}: {info['state']} on {info.get('device')}  "
                           f"inputs {_sig(info.get('inputs', []))}  outputs {_sig(info.get('outputs', []))}")
            elif args.cmd == "unload":
                info = c.unload(args.name)
                emit(info, f"{info['name']}: {info['state']}")
            elif args.cmd == "budget":
                try:
                    size = parse_size(args.size)
                except ValueError as exc:
                    parser.error(str(exc))
                info = c.set_budget(size)
                emit(info, f"memory budget: {_mib(info['budget_bytes']) if info['budget_bytes'] else 'none'}")
            elif args.cmd == "reload":
                info = c.reload()
                emit(info, f"reloaded {info.get('config_file') or '(no config file)'}: {len(info.get('models', []))} "
                           f"models, {info.get('authorized_keys', 0)} authorised CURVE keys")
            elif args.cmd == "infer":
                try:
                    feeds = _load_inputs(args.input)
                except (OSError, ValueError) as exc:
                    print(f"inferctl: {exc}", file=sys.stderr)
                    return 2
                outs, info = c.infer_with_info(args.name, feeds, priority=args.priority)
                if args.output:
                    np.savez(args.output, **outs)
                if as_json:
                    obj: dict[str, Any] = {"model": args.name, "info": info}
                    if args.output:
                        obj["output_file"] = args.output
                        obj["outputs"] = {k: {"dtype": v.dtype.name, "shape": list(v.shape)} for k, v in outs.items()}
                    else:
                        obj["outputs"] = {k: {"dtype": v.dtype.name, "shape": list(v.shape), "data": v.tolist()}
                                          for k, v in outs.items()}
                    emit(obj, "")
                else:
                    lines = [f"{args.name}: queue {info.get('queue_us', 0):.0f} us, compute {info.get('compute_us', 0):.0f} us"
                             f" on {info.get('device')}"]
                    lines += [f"  {k}: {_summary(v)}" for k, v in outs.items()]
                    if args.output:
                        lines.append(f"saved to {args.output}")
                    print("\n".join(lines))
    except errors.TransportError as exc:
        print(f"inferctl: {exc}", file=sys.stderr)
        return 3
    except errors.ServerError as exc:
        if as_json:
            print(json.dumps({"error": {"code": exc.code, "message": exc.message}}))
        print(f"inferctl: {exc}", file=sys.stderr)
        return 4 if isinstance(exc, errors.PermissionDenied) else 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
