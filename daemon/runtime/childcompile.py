"""Packages compiled in a child process: what a serving process (the daemon) does instead of compiling in itself.

A compile imports onnx, and onnx imports ml_dtypes, whose extension module initialised for ~1 s of one core holding
the GIL all that time (ml_dtypes 0.7 with numpy 2.4 on the 2-core EPYC VM): a daemon compiling a model its cache
lacked answered nothing meanwhile, to any client (1.36 s on an idle VM, 2.46 s beside three busy loops, health asked
every 50 ms). The project now excludes ml_dtypes 0.7 (pyproject.toml), but ``import onnx`` still holds the GIL for
0.2 s and the compile's import passes and profiling are Python too: the compile stays out of the serving process. The
child takes this process's kernel threads and checks its CPU fingerprint against this one's (both
are in the package's fingerprint: a package the parent finds stale would be compiled again, in the parent); a
model's error comes back as the exception the compile raised (its type, message and plain attributes), so that the
caller reports and handles it as before; a child that could not run at all raises :class:`ChildFailed`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

#: a compile may take this long (seconds): it runs at nice 10 beside what the daemon serves
TIMEOUT_S = 600.0
#: the child's last line of stdout when the compile raised: this prefix, then the exception as JSON
_ERROR = "inferd-compile-error "
#: the child's module (its own: this one is imported by ``package``, which the child imports)
_CHILD = "inferd.runtime._compile_child"
#: ``src`` that asks the child for the cold-load rehearsal's built-in model (``runtime.rehearsal``)
REHEARSAL = "@rehearsal"


class ChildFailed(RuntimeError):
    """The child did not compile nor report a compile error (no interpreter, a crash, a timeout, another device)."""


def compile_package(src: str | os.PathLike, out: str | os.PathLike, kwargs: dict[str, Any], nice: int = 10) -> None:
    """``package.compile_model(src, out, **kwargs)`` in a child process (``src`` ``REHEARSAL``: the rehearsal's
    model, written beside ``out``). ``kwargs`` must be JSON: tuples come back as lists. Raises what the compile
    raised, or :class:`ChildFailed`."""
    from .. import native
    from .profiler import cpu_fingerprint

    if not sys.executable:
        raise ChildFailed("no interpreter to run the compile in (sys.executable is empty)")
    want = cpu_fingerprint() if kwargs.get("device", "cpu") == "cpu" else {}
    cmd = [sys.executable, "-m", _CHILD, str(src), str(out), json.dumps(kwargs), str(native.num_threads()),
           json.dumps(want), str(nice)]
    try:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"the compile took more than {TIMEOUT_S:.0f} s") from None
    except OSError as e:  # (the interpreter cannot be started)
        raise ChildFailed(f"could not start {sys.executable}: {e}") from None
    if r.returncode == 0:
        return
    lines = r.stdout.decode("utf-8", "replace").strip().splitlines()
    if lines and lines[-1].startswith(_ERROR):
        raise _rebuilt(json.loads(lines[-1][len(_ERROR):]))
    last = r.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["(nothing on stderr)"]
    raise ChildFailed(f"the compile exited with {r.returncode}: {last[0]}")


def _rebuilt(d: dict[str, Any]) -> BaseException:
    """The child's exception, as the same type where this process has it (inferd's errors, OSError and its kinds,
    the builtin ones); another type is a RuntimeError naming it."""
    import builtins
    import importlib

    cls: Any = None
    if d["module"] == "builtins":
        cls = getattr(builtins, d["type"], None)
    elif str(d["module"]).startswith("inferd."):
        try:
            cls = getattr(importlib.import_module(d["module"]), d["type"], None)
        except ImportError:
            cls = None
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        return RuntimeError(f"{d['module']}.{d['type']}: {d['message']}")
    if issubclass(cls, OSError) and d.get("errno") is not None:
        # (strerror, not the message: OSError's own str() adds "[Errno N]" and the file name again)
        return cls(d["errno"], d.get("strerror") or d["message"], *([d["filename"]] if d.get("filename") else []))
    e = cls.__new__(cls)
    # (not cls.__init__: its arguments are the raiser's, e.g. an op and a node; the args as raised, where they travel:
    # a KeyError's str() quotes its one argument)
    Exception.__init__(e, *(d["args"] if d.get("args") is not None else [d["message"]]))
    for k, v in d["attrs"].items():
        try:
            setattr(e, k, v)
        except AttributeError:
            pass
    return e
