"""The ``inferd`` command: run, compile, info, ops, zoo, bench, serve, keys, demo."""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

import numpy as np


def _kv(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for it in items or []:
        if "=" not in it:
            raise SystemExit(f"inferd: {what} must be NAME=VALUE, got {it!r}")
        k, v = it.split("=", 1)
        out[k] = v
    return out


def _random_feeds(model: "object", seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for t in model.inputs:  # type: ignore[attr-defined]
        if np.issubdtype(t.dtype, np.floating):
            feeds[t.name] = rng.standard_normal(t.shape).astype(t.dtype)
        else:
            feeds[t.name] = np.zeros(t.shape, t.dtype)
    return feeds


def cmd_run(args: argparse.Namespace) -> int:
    import inferd

    kernels = _kv(args.kernel, "--kernel") or None
    t0 = time.perf_counter()
    extra: dict[str, Any] = {"split": _splits(args.split)} if args.device == "cpu+vulkan" and args.split else {}
    if args.precision:
        extra["precision"] = args.precision
    model = inferd.load(args.model, device=args.device, batch=args.batch, kernels=kernels, **extra)
    load_s = time.perf_counter() - t0
    if args.input:
        feeds = {k: np.load(v) for k, v in _kv(args.input, "--input").items()}
    else:
        feeds = _random_feeds(model, args.seed)
        print(f"no --input given: using seeded random inputs (seed {args.seed})", file=sys.stderr)
    times = []
    out = {}
    for _ in range(max(1, args.repeat)):
        t1 = time.perf_counter()
        out = model.run(feeds)
        times.append(time.perf_counter() - t1)
    print(f"model {model.name} on {model.device}: load {load_s * 1e3:.1f} ms, first run {times[0] * 1e3:.2f} ms"
          + (f", warm median {np.median(times[1:]) * 1e3:.2f} ms over {len(times) - 1}" if len(times) > 1 else ""))
    for name, a in out.items():
        flat = a.reshape(-1)
        print(f"  {name}: shape {list(a.shape)} {a.dtype.name} mean {float(flat.mean()):.6g} "
              f"min {float(flat.min()):.6g} max {float(flat.max()):.6g} first {np.array2string(flat[:5], precision=4)}")
    if args.output:
        np.savez(args.output, **out)
        print(f"wrote {args.output}")
    model.close()
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from .package import compile_model, read_plan
    from .planner.plan import ColdPlan

    t0 = time.perf_counter()
    out = compile_model(args.model, args.out, device=args.device, batch=args.batch,
                        kernels=_kv(args.kernel, "--kernel") or None, transformed=not args.raw_only,
                        loaders=args.loaders, profile=not args.no_profile, precision=args.precision or "fp32")
    d = read_plan(out / "plan.bin")
    plan = ColdPlan.from_dict(d["plan"])
    prof = d.get("profile") or {}
    print(f"compiled {args.model} -> {out} in {time.perf_counter() - t0:.2f} s: {len(prof.get('times', []))} "
          f"profiled costs, predicted cold {plan.predicted_s * 1e3:.1f} ms (warm {plan.warm_s * 1e3:.1f} ms); "
          f"'inferd info {out}' prints the plan")
    return 0


def _splits(items: list[str] | None) -> dict[str, float | str]:
    """--split NODE_OR_OP=FRACTION (of output channels on the CPU) or =cpu / =gpu."""
    out: dict[str, float | str] = {}
    for k, v in _kv(items, "--split").items():
        try:
            out[k] = v if v in ("cpu", "gpu") else float(v)
        except ValueError:
            raise SystemExit(f"--split {k}={v}: expected a fraction in [0, 1], 'cpu' or 'gpu'") from None
    return out


def cmd_info(args: argparse.Namespace) -> int:
    if args.device == "cpu+vulkan":
        from .coexec.load import info_report

        print(info_report(args.model, args.batch, _splits(args.split), args.json, args.threads))
        return 0
    if args.predict:
        from .predictor.report import format_report, predict_report

        r = predict_report(args.model, args.device, args.threads, args.batch, args.predictor,
                           probe=not args.no_probe)
        print(json.dumps(r, indent=1) if args.json else format_report(r))
        return 0
    import inferd

    model = inferd.load(args.model, device=args.device, batch=args.batch,
                        **({"precision": args.precision} if args.precision else {}))
    model.wait_loaded()
    info = {"name": model.name, "device": model.device,
            "inputs": [[t.name, list(t.shape), np.dtype(t.dtype).name] for t in model.inputs],
            "outputs": [[t.name, list(t.shape), np.dtype(t.dtype).name] for t in model.outputs],
            "nodes": len(model.graph.nodes), "memory_bytes": model.memory_bytes, "kernels": model.kernels}
    if model.template is not None:  # dynamic dimensions: the plan is for the shapes above, any other is planned when met
        info["dims"] = {k: list(v) for k, v in model.dims.items()}
    if model.plan is not None:
        info["plan"] = model.plan.to_dict()
    if model.precision is not None:
        info["precision"] = model.precision.to_dict()
    from .ops.control import CONTROL_OPS, describe

    if any(n.op in CONTROL_OPS for n in model.graph.nodes):
        # what deciding costs is measured: one run on zeros (a value-dependent condition takes one of its bodies)
        model.run({t.name: np.zeros(t.shape, t.dtype) for t in model.inputs})
        info["control_flow"] = describe(model.graph).splitlines()
    if model.device != "cpu":  # mixed placement: the nodes no Vulkan kernel runs go to the CPU between segments
        kn = model.kernels
        order = [n.name for n in model.graph.nodes if n.name in kn]
        info["placement"] = {"cpu": [n for n in order if kn[n].startswith("cpu:")],
                             "gpu": [n for n in order if not kn[n].startswith(("cpu:", "host"))]}
    if model.device == "cpu":
        from . import native

        if "binds_replayed" in model.cold_stats:  # a package's load: its layers rebuilt from recorded binds
            info["binds_replayed"] = model.cold_stats["binds_replayed"]
        names = native.kernel_names()
        info["native"] = {"available": native.AVAILABLE, "threads": native.num_threads(), "gemm_isa": names["gemm"],
                          "int8_isa": names["int8"], "scratch_bytes": native.native_scratch_bytes()}
    if args.json or model.plan is None:
        print(json.dumps(info, indent=2))
    else:
        print(f"{info['name']} on {info['device']}: inputs {info['inputs']}, outputs {info['outputs']}, "
              f"{info['nodes']} nodes, {info['memory_bytes'] / 2**20:.1f} MiB")
        if "dims" in info:
            print(f"dynamic dimensions {info['dims']}: planned at the shapes above, other shapes when they come")
        if "native" in info:
            print(f"native: {info['native']}")
        if "binds_replayed" in info:
            print(f"layers rebuilt from the package's recorded binds: {info['binds_replayed']} of "
                  f"{len(model.plan.layers)}")
        if model.precision is not None:
            print(model.precision.summary())
        for line in info.get("control_flow", []):
            print(f"control flow: {line}")
        if info.get("placement", {}).get("cpu"):
            print(f"placed on the CPU between GPU segments: {', '.join(info['placement']['cpu'])}")
        print(model.plan.summary())
    model.close()
    return 0


def cmd_ops(args: argparse.Namespace) -> int:
    from .ops.coverage import coverage, format_table

    cov = coverage()
    print(json.dumps(cov, indent=2) if args.json else format_table(cov))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # subcommands owned by other modules parse their own arguments
    if argv and argv[0] == "zoo":
        from .zoo import main as zoo_main
        return zoo_main(argv[1:])
    if argv and argv[0] == "serve":
        from .server import serve_main
        return serve_main(argv[1:])
    if argv and argv[0] == "bench":
        from .bench import main as bench_main
        return bench_main(argv[1:])
    if argv and argv[0] == "keys":
        from .server.keys import main as keys_main
        return keys_main(argv[1:])
    if argv and argv[0] == "predictor":
        from .predictor.train import main as predictor_main
        return predictor_main(argv[1:])
    if argv and argv[0] == "demo":
        from .demo import main as demo_main
        return demo_main(argv[1:])

    p = argparse.ArgumentParser(prog="inferd", description="inferd: inference daemon and engine")
    p.add_argument("--log-level", default="WARNING")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("zoo", "serve", "bench", "demo", "keys", "predictor"):
        sub.add_parser(name, help=f"see 'inferd {name} --help'", add_help=False)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("model", help="ONNX file or compiled package directory")
        sp.add_argument("--device", default="cpu", choices=["cpu", "vulkan", "auto", "cpu+vulkan"])
        sp.add_argument("--batch", type=int, default=1, help="value for a dynamic batch dimension")
        sp.add_argument("--split", action="append", metavar="OP_OR_NODE=FRACTION",
                        help="cpu+vulkan: fraction of a layer's output channels on the CPU (0: GPU, 1: CPU)")
        sp.add_argument("--precision", default=None, choices=["fp32", "fp16", "auto"],
                        help="weights' precision (default fp32, or a package's own; auto: fp16 on a GPU with 16-bit "
                        "storage, fp32 on the CPU)")

    r = sub.add_parser("run", help="run a model once (or --repeat N times) and print outputs and timings")
    common(r)
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    r.add_argument("--output", metavar="OUT.npz")
    r.add_argument("--kernel", action="append", metavar="OP_OR_NODE=KERNEL", help="force a kernel")
    r.add_argument("--repeat", type=int, default=1)
    r.add_argument("--seed", type=int, default=0)
    r.set_defaults(fn=cmd_run)
    c = sub.add_parser("compile", help="compile an ONNX model into a package (plan + weights store)")
    common(c)
    c.add_argument("--out", required=True)
    c.add_argument("--kernel", action="append", metavar="OP_OR_NODE=KERNEL")
    c.add_argument("--raw-only", action="store_true", help="plan every layer to read raw weights (transform at load)")
    c.add_argument("--loaders", type=int, default=None, help="threads preparing layers at a cold load (default: cores)")
    c.add_argument("--no-profile", action="store_true", help="plan without measuring: from the latency predictor's costs where "
                   "this device has one ('inferd predictor train'), the roofline elsewhere")
    c.set_defaults(fn=cmd_compile)
    i = sub.add_parser("info", help="print a model's inputs, outputs, memory and its cold-start plan")
    common(i)
    i.add_argument("--json", action="store_true", help="one JSON object (kernels, plan, ...)")
    i.add_argument("--predict", action="store_true",
                   help="predicted per-layer costs (warm and cold phases) and totals, without running the model")
    i.add_argument("--threads", type=int, default=None, help="CPU threads to predict for (--predict)")
    i.add_argument("--predictor", default=None, help="predictor file (--predict; default: this device's)")
    i.add_argument("--no-probe", action="store_true",
                   help="--predict on the CPU: predict at the training's speed, without timing the reference "
                        "networks now (~40 ms) to scale the warm times by the machine's current speed")
    i.set_defaults(fn=cmd_info)
    o = sub.add_parser("ops", help="print the operator coverage table (opsets, CPU and Vulkan kernels, notes)")
    o.add_argument("--json", action="store_true", help="one JSON object: max_opset, ops [{op, opsets, cpu, vulkan, notes}]")
    o.set_defaults(fn=cmd_ops)
    args = p.parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING))
    from .errors import InferdError
    try:
        return int(args.fn(args))
    except InferdError as e:
        print(f"inferd: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
