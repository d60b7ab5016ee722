"""The child's side of ``runtime.childcompile``: ``python -m inferd.runtime._compile_child SRC OUT KWARGS THREADS
FINGERPRINT NICE`` compiles one package and exits 0, or prints the compile's exception (``childcompile._ERROR`` and
JSON) as its last line of stdout and exits 1; exit 3: this process's CPU fingerprint is not the parent's."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from .childcompile import _ERROR, REHEARSAL


def _described(e: BaseException) -> dict[str, Any]:
    attrs = {}
    for k, v in vars(e).items():
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            v = None  # (a PackageUnsupported's template: the caller imports the model again without it)
        attrs[k] = v
    try:
        args = json.loads(json.dumps(list(e.args)))
    except (TypeError, ValueError):
        args = None
    return {"module": type(e).__module__, "type": type(e).__qualname__, "message": str(e), "args": args, "attrs": attrs,
            "errno": getattr(e, "errno", None), "strerror": getattr(e, "strerror", None),
            "filename": getattr(e, "filename", None)}


def _main(argv: list[str]) -> int:
    src, out, kwargs, threads, want, nice = (argv[0], Path(argv[1]), json.loads(argv[2]), int(argv[3]),
                                             json.loads(argv[4]), int(argv[5]))
    try:  # a request the daemon serves meanwhile comes first
        os.nice(nice)
    except OSError:
        pass
    from .. import native, package

    native.set_num_threads(threads)
    if want:
        diff = package.fingerprint_diff(want, package.fingerprint("cpu"))
        if diff:  # a package the parent would find stale and compile again itself
            print(f"this process's CPU fingerprint differs from the parent's in {diff}", file=sys.stderr)
            return 3
    try:
        if src == REHEARSAL:
            import onnx

            from .rehearsal_model import model

            src = str(out.parent / "rehearsal.onnx")
            onnx.save(model(), src)
        if "fp32_layers" in kwargs:
            kwargs["fp32_layers"] = tuple(kwargs["fp32_layers"])
        if isinstance(kwargs.get("shapes"), dict):
            kwargs["shapes"] = {n: tuple(v) for n, v in kwargs["shapes"].items()}
        package.compile_model(src, out, **kwargs)
    except Exception as e:  # the parent raises it again
        print(_ERROR + json.dumps(_described(e)), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
