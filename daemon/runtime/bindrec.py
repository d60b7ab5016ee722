"""Recorded binds: a CPU cold load prepares a layer from a record of its native steps instead of binding it.

Binding a layer (``Kernel.bind``: its geometry worked out from the node, its arguments laid out, its native steps
built) is 20-70 us of Python a layer on the 2-core VM, and a cold load binds every layer on a loader thread under
the GIL, beside the executor that runs the layers bound before: a small model's preparation is most of its cold
time (shufflenetv2's 140 layers: ~4 ms of binds alone in a loop, 9-13 ms inside a cold load). What a bind makes is
a function of the package (graph, kernels, activation plan) and of two kinds of address, the arena's and the
layer's weights'. Recorded once as offsets from those, after a cold load has answered (idle time), the next cold
load of the package rebuilds each layer's steps from the new addresses: a few integer additions a slot.

Only layers whose bound call is all native steps (``native.with_steps``; none at all: a layer the activation plan
left nothing to do) and whose every pointer falls in the arena or in one of the layer's weight arrays (or in a small
array of integers the bind made, ``_INLINE``) are recorded; the rest (numpy copies, pointers into scratch or into
other memory a bind allocated, layers that read a graph input and are pointed at the caller's array) bind as before.
A record is checked at use: the layer's kernel, its weight arrays' sizes and alignment, each step's entry point
and argument letters; a record that does not fit is not used (the layer binds). The file carries magic, version,
a checksum and a key (model, engine, device fingerprint, the package's kernels, layout and activation plan): a bad
or stale one is a miss with a warning, never used, and the next load records it anew.
"""
from __future__ import annotations

import hashlib
import logging
import os
import struct
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import msgpack
import numpy as np

from .. import __version__, native
from ..fileio import FRAME_HEAD, FrameError, atomic_write, frame_checksum, framed

log = logging.getLogger("inferd.runtime.bindrec")

FILE = "binds.bin"
MAGIC = b"IFDBINDS"
VERSION = 1
#: the alignment a record keeps of each base address: a kernel may lay out its work by it
_ALIGN = 64

#: slot kinds of a pointer argument: NULL, an arena offset, an offset into the layer's weight array i, a small array
#: of long longs the bind allocated (its values recorded: ``_INLINE``)
_NULL, _ARENA, _PARAM, _VALUES = 0, 1, 2, 3

#: entry points with pointer arguments to small arrays of long longs their bind allocates: {slot: the slot that holds
#: their length} (a strided copy's shape and strides, a Transpose's)
_INLINE: dict[str, dict[int, int]] = {"inferd_strided_copy": {3: 2, 4: 2}}


#: One layer's record, as msgpack reads it back (plain lists: a load parses the file in one C call and a loader
#: thread reads its layer's entry when it prepares that layer): [kernel, params, steps], where params lists
#: [name, bytes, address % _ALIGN] of each weight array a pointer refers to, and steps [entry point, argument letters,
#: slots]; a slot is an int or a float, or for a pointer [_NULL], [_ARENA, offset], [_PARAM, index in params,
#: offset] or [_VALUES, the array's values].
Record = list


def enabled() -> bool:
    """Whether cold loads read and record binds: ``INFERD_BINDS=0`` turns both off (a benchmark's first load of a
    package, and the ablation that measures what the records gain)."""
    return os.environ.get("INFERD_BINDS", "1").strip() != "0"


def key_of(meta: Mapping[str, Any]) -> dict[str, Any]:
    """What a package's records depend on, from its plan.bin dict: change any and the records are stale."""
    def digest(v: Any) -> str:
        return hashlib.sha256(msgpack.packb(v, use_bin_type=True, default=str)).hexdigest()[:32]

    return {"engine": __version__, "model": str(meta.get("model_sha256", "")), "batch": meta.get("batch"),
            "fingerprint": digest(meta.get("fingerprint") or {}), "kernels": digest(meta.get("kernels") or {}),
            "layout": digest(meta.get("layout")), "memory": digest(meta.get("memory")),
            "precision": digest(meta.get("precision"))}


def address(a: np.ndarray) -> int:
    """The address of ``a``'s first element."""
    if a.flags.c_contiguous:  # (a third of __array_interface__'s cost: these are most of a replay's lookups)
        return int(native.ffi.cast("uintptr_t", native.ffi.from_buffer(a, require_writable=False)))
    return int(a.__array_interface__["data"][0])


#: struct letters of the argument letters: each slot of ``inferd_arg`` is 8 bytes (long long, double or pointer)
_PACK = str.maketrans("pilf", "Qqqd")


def _kind_names() -> dict[int, str]:
    return {k: name for name, (k, _sig) in native._STEP_KINDS.items() if k >= 0}


def record_layer(kernel: str, steps: Sequence[Any], arena: tuple[int, int],
                 params: Mapping[str, np.ndarray], names: Mapping[int, str]) -> Record | None:
    """The record of one layer's native ``steps`` (``NativeStep``s), or None where a pointer falls outside the
    arena (base, bytes) and the weight arrays ``params``."""
    base, size = arena
    spans = [(n, address(a), a.nbytes) for n, a in params.items() if isinstance(a, np.ndarray) and a.nbytes > 0]
    used: dict[str, int] = {}
    out = []
    for st in steps:
        name = names.get(st.kind)
        if name is None:
            return None
        inline = _INLINE.get(name, {})
        slots: list[Any] = []
        for j, c in enumerate(st.sig):
            arg = st.args[j]
            if c == "p":
                p = int(native.ffi.cast("uintptr_t", arg.p))
                if p == 0:
                    slots.append([_NULL])
                elif j in inline:
                    n = int(st.args[inline[j]].i)
                    if not 0 < n <= 8:
                        return None
                    slots.append([_VALUES, list(native.ffi.cast("long long *", arg.p)[0:n])])
                elif base <= p < base + size:
                    slots.append([_ARENA, p - base])
                else:
                    hit = next(((n, p - a) for n, a, nb in spans if a <= p < a + nb), None)
                    if hit is None:
                        return None  # scratch, or memory the bind allocated: not this record's to rebuild
                    slots.append([_PARAM, used.setdefault(hit[0], len(used)), hit[1]])
            elif c == "f":
                slots.append(float(arg.f))
            else:
                slots.append(int(arg.i))
        out.append([name, st.sig, slots])
    by_index = sorted(used.items(), key=lambda kv: kv[1])
    return [kernel, [[n, int(params[n].nbytes), address(params[n]) % _ALIGN] for n, _i in by_index], out]


def record(executor: Any) -> dict[str, Record]:
    """The records of a CPU executor's prepared layers (those that can have one)."""
    arena = (address(executor.arena), int(executor.arena.nbytes))
    names = _kind_names()
    feeds = {t.name for t in executor.inputs}
    out: dict[str, Record] = {}
    for (layer, k), step in zip(executor.choice, executor.steps):
        bound = getattr(step, "bound", None) if step is not None else None
        steps = getattr(bound, "steps", None)
        # a reader of a graph input is pointed at the caller's array (its bind's ``retarget``): it keeps its bind.
        # A call with no steps at all does no work (the activation plan put its data in place: a Split into views,
        # a Concat its producers wrote into, a Gather of one index): recorded so, its bind's 40-60 us skipped too
        if k is None or step.alias or steps is None or any(n in feeds for n in layer.node.inputs):
            continue
        rec = record_layer(k.name, steps, arena, step.params, names)
        if rec is not None:
            out[layer.name] = rec
    return out


def encode(key: Mapping[str, Any], records: Mapping[str, Any], magic: bytes = MAGIC) -> bytes:
    return framed(magic, VERSION, msgpack.packb({"key": dict(key), "layers": dict(records)}, use_bin_type=True))


class BindsError(ValueError):
    """A binds file that is damaged, of another format version, or made for another package."""


def decode(data: bytes, key: Mapping[str, Any], magic: bytes = MAGIC) -> dict[str, Any]:
    """The records ``encode`` wrote, checked (magic, version, checksum, key); their shape is checked where a layer
    reads its own (``replay``: a record that does not parse there is one that does not fit)."""
    try:
        sha = frame_checksum(data, magic, VERSION, "binds file")
    except FrameError as e:
        raise BindsError(str(e)) from None
    body = data[FRAME_HEAD.size:]
    if hashlib.sha256(body).digest() != sha:
        raise BindsError("checksum mismatch (corrupted file)")
    try:
        d = msgpack.unpackb(body, raw=False, strict_map_key=False)
        same = d["key"] == dict(key)
        layers = d["layers"]
    except Exception as e:
        raise BindsError(f"unreadable: {type(e).__name__}: {e}") from e
    if not same:
        raise BindsError("made for another package, engine or device (stale)")
    if not isinstance(layers, dict):
        raise BindsError("unreadable: no layer table")
    return layers


def load(pkg: Path, key: Mapping[str, Any], file: str = FILE, magic: bytes = MAGIC) -> dict[str, Any] | None:
    """``pkg``'s records, or None where it has none, or a bad or stale file (with a warning: the next load records
    them again). ``file`` and ``magic``: another backend's records in the same format (``vulkan.binds``)."""
    path = Path(pkg) / file
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("%s: unreadable (%s); the layers bind as usual", path, e)
        return None
    try:
        return decode(data, key, magic)
    except BindsError as e:
        log.warning("%s: %s; not used, recorded again after this load", path, e)
        return None


def save(pkg: Path, key: Mapping[str, Any], records: Mapping[str, Any], file: str = FILE,
         magic: bytes = MAGIC) -> bool:
    """Write ``records`` into ``pkg`` (atomically); False where the package cannot be written (read-only)."""
    try:
        atomic_write(Path(pkg) / file, encode(key, records, magic))
        return True
    except OSError as e:
        log.debug("%s: binds not written: %s", pkg, e)
        return False


def replay(rec: Record, kernel: str, arena: np.ndarray, base: int, params: Mapping[str, np.ndarray],
           fallback: Callable[[], Callable[[], None] | None]) -> Callable[[], None] | None:
    """The layer's bound call rebuilt from ``rec`` for this arena (``base``: its address) and these weights, or None
    where the record does not fit them (another kernel, other sizes or alignment, an entry point this build lacks
    or takes other arguments, a record that does not parse): the caller binds. ``fallback()`` binds the layer the
    usual way: the call runs that instead where a native step refuses its arguments (it raises that bind's own
    error, or takes its own fallback)."""
    if not native.AVAILABLE or base % _ALIGN:
        return None
    try:
        rkernel, rparams, rsteps = rec
        if rkernel != kernel:
            return None
        addrs = []
        for name, nbytes, align in rparams:
            a = params.get(name)
            if not isinstance(a, np.ndarray) or a.nbytes != nbytes:
                return None
            p = address(a)
            if p % _ALIGN != align:
                return None
            addrs.append(p)
        steps = []
        ffi, make = native.ffi, native.NativeStep.__new__
        owned: list[Any] = []  # the small arrays recorded by value, alive as long as the call
        for entry, sig, slots in rsteps:
            ks = native._step_kind(entry)
            if ks is None or ks[1] != sig or len(slots) != len(sig):
                return None
            for j, s in enumerate(slots):
                if sig[j] == "p" and s[0] == _VALUES:
                    if j not in _INLINE.get(entry, {}):
                        return None
                    arr = ffi.new("long long[]", [int(v) for v in s[1]])
                    owned.append(arr)
                    slots = slots[:j] + [[_VALUES, int(ffi.cast("uintptr_t", arr))]] + slots[j + 1:]
            vals = [(0 if s[0] == _NULL else base + s[1] if s[0] == _ARENA else addrs[s[1]] + s[2] if s[0] == _PARAM
                     else s[1]) if c == "p" else s for c, s in zip(sig, slots)]
            # the slots packed at once (one NativeStep filled slot by slot cost a bind's worth of Python)
            raw = struct.pack("<" + sig.translate(_PACK), *vals)
            args = ffi.new("inferd_arg[]", len(sig))
            ffi.memmove(args, raw, len(raw))
            st = make(native.NativeStep)
            st.kind, st.sig, st.args = ks[0], sig, args
            steps.append(st)
    except (TypeError, ValueError, IndexError, KeyError, struct.error):
        return None  # (a record of another shape than this engine writes: the checksum cannot tell)
    if not steps:
        return _no_work()
    return _steps_call(steps, fallback, (arena, owned, *params.values()))


def _no_work() -> Callable[[], None]:
    """A layer whose bind did nothing (``native.with_steps``' empty run: it joins any run of native steps)."""
    def call() -> None:
        pass

    call.steps = []  # type: ignore[attr-defined]
    return call


def _steps_call(steps: list[Any], fallback: Callable[[], Callable[[], None] | None],
                keep: tuple[Any, ...]) -> Callable[[], None]:
    n = len(steps)
    arr = native.ffi.new("inferd_step[]", n)
    for i, st in enumerate(steps):
        arr[i].kind, arr[i].nargs, arr[i].a = st.kind, len(st.sig), st.args
    fn = native.lib.inferd_steps_run
    bound: list[Callable[[], None] | None] = [None]

    def call(_keep: Any = (steps, arr, keep)) -> None:
        real = bound[0]
        if real is not None:
            real()
        elif fn(arr, n) != n:
            # a step refused its arguments: the layer as its kernel binds it (with its checks and fallbacks)
            got = fallback()
            if got is None:
                raise RuntimeError("a recorded layer's native step failed and its kernel does not bind")
            bound[0] = got
            # (a run of native steps fused later takes the bind's own; a call with none runs from Python)
            if getattr(got, "steps", None) is not None:
                call.steps = got.steps  # type: ignore[attr-defined]
            else:
                del call.steps  # type: ignore[attr-defined]
            got()

    call.steps = steps  # type: ignore[attr-defined]
    return call
