"""GLSL compute shaders -> SPIR-V, with an on-disk cache and a reflected manifest.

Sources live in ``shaders/`` (ncnn layout: ``<family>[_variant].comp``, shared snippets in ``*.glsl``
pulled in with ``#include "x.glsl"``). A *variant* is a source plus a set of ``#define`` values
(fused activation, op selector, tile sizes). Its SPIR-V is cached under
``<cache_dir>/spirv/<key>.spv`` with a JSON manifest beside it, where ``key`` is the sha256 of the
include-expanded source, the sorted defines, the target environment and the compiler version.

The manifest is reflected from the SPIR-V itself (not parsed from GLSL), so it is exact under
``#if``: descriptor bindings with their read/write access (used by the executor to place barriers),
push-constant members with offsets (used to pack push data by name), specialization constants
by name and id, and the workgroup size.

Nothing here touches Vulkan; it only needs ``glslangValidator`` on a cache miss.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..errors import BackendError
from ..fileio import atomic_write

log = logging.getLogger("inferd.vulkan.shaders")

#: Target environment of the generated SPIR-V (Vulkan 1.1: SPIR-V 1.3, supported on Jetson and lavapipe).
TARGET_ENV = "vulkan1.1"
#: ``spirv/bundle.bin``: every variant this cache served, in one file read at device creation. Why: each cache entry is
#: two small files, and a cold load with the page cache dropped read them one by one (on the H100 host's disk,
#: ~4 ms a read: 120 ms of a mobilenetv2 cold load's loader time, more than creating its pipelines). A daemon owns
#: its device for hours, so reading the variants it has served is device bring-up, as loading the pipeline cache is.
BUNDLE_MAGIC = b"INFDSPVB"
BUNDLE_VERSION = 1
_BUNDLE_HEAD = struct.Struct("<8sII32s")  # magic, version, entries, sha256 of the msgpack body
#: entries beyond these bounds are not bundled (they stay per-file entries, read on demand)
BUNDLE_MAX_ENTRIES = 4096
BUNDLE_MAX_BYTES = 32 << 20
#: Bump when the manifest format or the way variants are built changes (invalidates the disk cache).
CACHE_FORMAT = 3  # 3: image16 binding kind

_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.M)

Defines = tuple[tuple[str, str], ...]


def shader_dir() -> Path:
    """Directory holding the ``.comp`` sources: $INFERD_SHADER_DIR, the installed copy, or the repo's."""
    env = os.environ.get("INFERD_SHADER_DIR")
    if env:
        return Path(env)
    pkg = Path(__file__).resolve().parent.parent
    for cand in (pkg / "_shaders", pkg.parent / "shaders"):
        if cand.is_dir() and any(cand.glob("*.comp")):
            return cand
    raise BackendError(f"no shader directory found (looked in {pkg / '_shaders'} and {pkg.parent / 'shaders'}; "
                       f"set INFERD_SHADER_DIR)")


def default_cache_dir() -> Path:
    env = os.environ.get("INFERD_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "inferd"


def norm_defines(defines: Mapping[str, Any] | Iterable[tuple[str, Any]] | None) -> Defines:
    """Canonical, hashable form of a define set (sorted, values as strings; bools as 0/1)."""
    if not defines:
        return ()
    items = defines.items() if isinstance(defines, Mapping) else defines
    out = []
    for k, v in items:
        if isinstance(v, bool):
            v = int(v)
        out.append((str(k), str(v)))
    return tuple(sorted(out))


# --------------------------------------------------------------------------------------------
# SPIR-V reflection
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BindingInfo:
    binding: int
    name: str
    readonly: bool
    writeonly: bool
    #: descriptor kind: "buffer" (storage buffer), "texel" (uniform texel buffer, ``samplerBuffer``) or
    #: "image" (read-only storage texel buffer, ``imageBuffer``); texel kinds are bound as
    #: R32G32B32A32_SFLOAT views ("image16": an ``rgba16f`` imageBuffer, bound as R16G16B16A16_SFLOAT), on CPU-type devices only, where texel reads are gathers while
    #: storage-buffer loads are per-lane loops
    kind: str = "buffer"

    @property
    def reads(self) -> bool:
        return not self.writeonly

    @property
    def writes(self) -> bool:
        return not self.readonly


@dataclass(frozen=True)
class PushMember:
    name: str
    offset: int
    kind: str   # struct code: "i" int32, "I" uint32, "f" float32
    count: int  # >1 for arrays (std430 stride 4)


@dataclass(frozen=True)
class SpecConst:
    id: int
    name: str
    kind: str   # "i", "I", "f", "?" (bool, packed as uint32)
    default: Any


@dataclass(frozen=True)
class Manifest:
    bindings: tuple[BindingInfo, ...]
    push: tuple[PushMember, ...]
    push_size: int
    spec: tuple[SpecConst, ...]
    local_size: tuple[int, int, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "bindings": [_asdict(b) for b in self.bindings],
            "push": [_asdict(p) for p in self.push],
            "push_size": self.push_size,
            "spec": [_asdict(s) for s in self.spec],
            "local_size": list(self.local_size),
        }

    # what every dispatch of a cold load asks of its shader's manifest, worked out once per manifest
    @cached_property
    def kinds(self) -> tuple[str, ...]:
        """Descriptor kinds of the bindings, in binding order (the set layout's key)."""
        return tuple(b.kind for b in self.bindings)

    @cached_property
    def read_idx(self) -> tuple[int, ...]:
        """Positions of the bindings the shader reads."""
        return tuple(i for i, b in enumerate(self.bindings) if b.reads)

    @cached_property
    def write_idx(self) -> tuple[int, ...]:
        """Positions of the bindings the shader writes."""
        return tuple(i for i, b in enumerate(self.bindings) if b.writes)

    @cached_property
    def _push_struct(self) -> tuple[struct.Struct, frozenset[str]]:
        """The push block as one struct (gaps as pad bytes) and its member names."""
        fmt, pos = "<", 0
        for p in self.push:
            if p.offset > pos:
                fmt += f"{p.offset - pos}x"
            fmt += f"{p.count}{p.kind}"
            pos = p.offset + 4 * p.count
        if self.push_size > pos:
            fmt += f"{self.push_size - pos}x"
        return struct.Struct(fmt), frozenset(p.name for p in self.push)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "Manifest":
        return Manifest(tuple(BindingInfo(**b) for b in d["bindings"]), tuple(PushMember(**p) for p in d["push"]),
                        int(d["push_size"]), tuple(SpecConst(**s) for s in d["spec"]),
                        tuple(d["local_size"]))  # type: ignore[arg-type]

    def pack_push(self, values: Mapping[str, Any], where: str = "") -> bytes:
        """Push-constant bytes from member values by name (arrays as sequences); unknown or missing names raise."""
        if not self.push:
            if values:
                raise BackendError(f"{where}: shader has no push constants but got {sorted(values)}")
            return b""
        st, names = self._push_struct
        if len(values) == len(names) and names.issuperset(values):
            # the common case in one struct call (a cold load packs one block per dispatch); anything odd
            # (a missing or unknown name, an array too long, a negative uint) goes the checking way below
            flat: list[Any] = []
            ok = True
            for p in self.push:
                v = values[p.name]
                if p.count > 1:
                    vals = list(v)
                    if len(vals) > p.count:
                        ok = False
                        break
                    flat += [float(x) if p.kind == "f" else int(x) for x in vals]
                    flat += [0] * (p.count - len(vals))
                else:
                    flat.append(float(v) if p.kind == "f" else int(v))
            if ok:
                try:
                    return st.pack(*flat)
                except struct.error:
                    pass
        buf = bytearray(self.push_size)
        names = {p.name for p in self.push}
        extra = set(values) - names
        if extra:
            raise BackendError(f"{where}: unknown push constants {sorted(extra)}; shader declares {sorted(names)}")
        for p in self.push:
            if p.name not in values:
                raise BackendError(f"{where}: push constant {p.name!r} not given")
            v = values[p.name]
            if p.count > 1:
                vals = list(v)
                if len(vals) > p.count:
                    raise BackendError(f"{where}: push array {p.name} holds {p.count}, got {len(vals)}")
                vals = vals + [0] * (p.count - len(vals))
                struct.pack_into(f"<{p.count}{p.kind}", buf, p.offset, *[_conv(x, p.kind) for x in vals])
            else:
                struct.pack_into(f"<{p.kind}", buf, p.offset, _conv(v, p.kind))
        return bytes(buf)

    def pack_spec(self, values: Mapping[str, Any], where: str = "") -> tuple[tuple[tuple[int, int], ...], bytes]:
        """(map entries (constantID, offset), data) for the given spec constants by name (others keep defaults)."""
        by_name = {s.name: s for s in self.spec}
        extra = set(values) - set(by_name)
        if extra:
            raise BackendError(f"{where}: unknown specialization constants {sorted(extra)}; shader declares {sorted(by_name)}")
        entries = []
        data = bytearray()
        for name in sorted(values, key=lambda n: by_name[n].id):
            s = by_name[name]
            kind = "I" if s.kind == "?" else s.kind
            entries.append((s.id, len(data)))
            data += struct.pack(f"<{kind}", _conv(values[name], kind))
        return tuple(entries), bytes(data)


def _conv(v: Any, kind: str) -> Any:
    if kind == "f":
        return float(v)
    iv = int(v)
    if kind == "I" and iv < 0:
        raise BackendError(f"negative value {iv} for a uint constant")
    return iv


def _asdict(o: Any) -> dict[str, Any]:
    return {k: getattr(o, k) for k in o.__dataclass_fields__}


def _spv_string(words: Sequence[int]) -> str:
    raw = b"".join(struct.pack("<I", w) for w in words)
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def reflect(spv: bytes) -> Manifest:
    """Reflect bindings, push constants, spec constants and local size from a SPIR-V module."""
    if len(spv) < 20 or len(spv) % 4:
        raise BackendError("SPIR-V module is truncated")
    words = struct.unpack(f"<{len(spv) // 4}I", spv)
    if words[0] != 0x07230203:
        raise BackendError("not a SPIR-V module (bad magic)")
    names: dict[int, str] = {}
    member_names: dict[tuple[int, int], str] = {}
    decos: dict[int, dict[int, list[int]]] = {}
    member_decos: dict[tuple[int, int], dict[int, list[int]]] = {}
    types: dict[int, tuple] = {}
    consts: dict[int, int] = {}
    spec_defs: dict[int, tuple[int, Any]] = {}  # result id -> (type id, default)
    variables: list[tuple[int, int, int]] = []   # (pointer type, id, storage class)
    local_size = (1, 1, 1)
    i = 5
    n = len(words)
    while i < n:
        wc, op = words[i] >> 16, words[i] & 0xFFFF
        if wc == 0:
            raise BackendError("corrupt SPIR-V (zero word count)")
        a = words[i + 1:i + wc]
        if op == 5:
            names[a[0]] = _spv_string(a[1:])
        elif op == 6:
            member_names[(a[0], a[1])] = _spv_string(a[2:])
        elif op == 16 and a[1] == 17:
            local_size = (a[2], a[3], a[4])
        elif op == 71:
            decos.setdefault(a[0], {})[a[1]] = list(a[2:])
        elif op == 72:
            member_decos.setdefault((a[0], a[1]), {})[a[2]] = list(a[3:])
        elif op == 20:
            types[a[0]] = ("bool",)
        elif op == 21:
            types[a[0]] = ("int", a[1], a[2])
        elif op == 22:
            types[a[0]] = ("float", a[1])
        elif op == 23:
            types[a[0]] = ("vec", a[1], a[2])
        elif op == 25:
            types[a[0]] = ("image", a[2], a[6], a[7] if len(a) > 7 else 0)  # (dim, sampled, format)
        elif op == 27:
            types[a[0]] = ("sampledimage", a[1])
        elif op == 28:
            types[a[0]] = ("array", a[1], a[2])
        elif op == 29:
            types[a[0]] = ("rtarray", a[1])
        elif op == 30:
            types[a[0]] = ("struct", tuple(a[1:]))
        elif op == 32:
            types[a[0]] = ("ptr", a[1], a[2])
        elif op == 43:
            consts[a[1]] = a[2]
        elif op in (48, 49):
            spec_defs[a[1]] = (a[0], op == 48)
        elif op == 50:
            spec_defs[a[1]] = (a[0], a[2])
        elif op == 59:
            variables.append((a[0], a[1], a[2]))
        i += wc

    def scalar_kind(tid: int) -> str:
        t = types[tid]
        if t[0] == "int":
            return "i" if t[2] else "I"
        if t[0] == "float":
            return "f"
        if t[0] == "bool":
            return "?"
        raise BackendError(f"unsupported push/spec constant type {t}")

    bindings = []
    push: list[PushMember] = []
    push_size = 0
    for ptype, vid, sc in variables:
        pointee = types[ptype][2]
        if sc in (2, 12) and 33 in decos.get(vid, {}):
            st = types[pointee]
            members = st[1] if st[0] == "struct" else ()
            var_d = decos.get(vid, {})
            nw = 24 in var_d or (bool(members) and all(24 in member_decos.get((pointee, m), {}) for m in range(len(members))))
            nr = 25 in var_d or (bool(members) and all(25 in member_decos.get((pointee, m), {}) for m in range(len(members))))
            bname = names.get(vid) or names.get(pointee, f"b{decos[vid][33][0]}")
            bindings.append(BindingInfo(decos[vid][33][0], bname, nw, nr))
        elif sc == 0 and 33 in decos.get(vid, {}) and types.get(pointee, ("",))[0] in ("sampledimage", "image"):
            sampled = types[pointee][0] == "sampledimage"
            img = types.get(types[pointee][1], ("",)) if sampled else types[pointee]
            b = decos[vid][33][0]
            if img[0] != "image" or img[1] != 5:  # Dim Buffer
                raise BackendError(f"binding {b}: only texel buffers (samplerBuffer, imageBuffer) are supported")
            if not sampled and 24 not in decos.get(vid, {}):
                raise BackendError(f"binding {b}: storage texel buffers must be readonly")
            # an RGBA16F storage texel buffer (ImageFormat 2) holds fp16 weights: bound through a 16-bit view
            kind = "texel" if sampled else ("image16" if img[3] == 2 else "image")
            bindings.append(BindingInfo(b, names.get(vid, f"t{b}"), False, True, kind))
        elif sc == 9:
            st = types[pointee]
            for m, mt in enumerate(st[1]):
                off = member_decos[(pointee, m)][35][0]
                t = types[mt]
                if t[0] == "array":
                    kind, count = scalar_kind(t[1]), consts[t[2]]
                else:
                    kind, count = scalar_kind(mt), 1
                push.append(PushMember(member_names.get((pointee, m), f"m{m}"), off, kind, count))
                push_size = max(push_size, off + 4 * count)
    spec = []
    for sid, (tid, default) in spec_defs.items():
        if 1 not in decos.get(sid, {}):
            continue
        kind = scalar_kind(tid)
        if kind == "f":
            default = struct.unpack("<f", struct.pack("<I", default))[0]
        elif kind == "i" and default >= 2**31:
            default -= 2**32
        spec.append(SpecConst(decos[sid][1][0], names.get(sid, f"s{sid}"), kind, default))
    # blocks aliasing one binding (e.g. float and vec4 views of an output) merge into one
    merged: dict[int, BindingInfo] = {}
    for b in bindings:
        o = merged.get(b.binding)
        if o is not None:
            if o.kind != b.kind:
                raise BackendError(f"binding {b.binding} declared as both {o.kind} and {b.kind}")
            b = BindingInfo(b.binding, o.name, o.readonly and b.readonly, o.writeonly and b.writeonly, b.kind)
        merged[b.binding] = b
    bindings = sorted(merged.values(), key=lambda b: b.binding)
    if [b.binding for b in bindings] != list(range(len(bindings))):
        raise BackendError(f"shader bindings must be dense from 0, got {[b.binding for b in bindings]}")
    return Manifest(tuple(bindings), tuple(sorted(push, key=lambda p: p.offset)), push_size,
                    tuple(sorted(spec, key=lambda s: s.id)), tuple(local_size))  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# compilation and cache
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShaderModule:
    """A compiled variant: SPIR-V bytes plus its manifest; ``key`` identifies it everywhere."""

    name: str
    defines: Defines
    key: str
    spirv: bytes = field(repr=False)
    manifest: Manifest = field(repr=False)


def expand_source(name: str, sdir: Path | None = None) -> str:
    """``shaders/<name>.comp`` with ``#include "x.glsl"`` expanded (each file at most once)."""
    sdir = sdir or shader_dir()
    path = sdir / f"{name}.comp"
    if not path.is_file():
        raise BackendError(f"shader source {path} not found")
    seen: set[str] = set()

    def expand(text: str, origin: str) -> str:
        def sub(m: re.Match[str]) -> str:
            inc = m.group(1)
            if inc in seen:
                return ""
            seen.add(inc)
            p = sdir / inc
            if not p.is_file():
                raise BackendError(f"{origin}: included file {p} not found")
            return expand(p.read_text(), inc)
        return _INCLUDE_RE.sub(sub, text)

    return expand(path.read_text(), path.name)


_compiler_lock = threading.Lock()
_compiler_info: tuple[str, str] | None = None  # (path, version)


def compiler() -> tuple[str, str] | None:
    """(path, version string) of glslangValidator, or None if not installed."""
    global _compiler_info
    with _compiler_lock:
        if _compiler_info is None:
            exe = os.environ.get("INFERD_GLSLANG") or shutil.which("glslangValidator")
            if not exe:
                _compiler_info = ("", "")
            else:
                try:
                    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
                    ver = " ".join(line.strip() for line in out.splitlines()[:1])
                except (OSError, subprocess.SubprocessError):
                    ver = ""
                _compiler_info = (exe, ver) if ver else ("", "")
        return _compiler_info if _compiler_info[0] else None


def prebuilt_dirs() -> list[Path]:
    """Read-only SPIR-V directories: the package's ``_spirv`` (install-time precompile) and $INFERD_SPIRV_PATH."""
    out = []
    pkg = Path(__file__).resolve().parent.parent / "_spirv" / "spirv"
    if pkg.is_dir():
        out.append(pkg)
    for p in os.environ.get("INFERD_SPIRV_PATH", "").split(os.pathsep):
        if p:
            out.append(Path(p) / "spirv")
    return out


def shader_set_hash(sdir: Path | None = None) -> str:
    """sha256 over every shader source file and the compiler version: the pipeline cache's shader-set key."""
    sdir = sdir or shader_dir()
    h = hashlib.sha256()
    h.update(f"{CACHE_FORMAT}|{TARGET_ENV}|".encode())
    comp = compiler()
    h.update((comp[1] if comp else "prebuilt").encode())
    for p in sorted(list(sdir.glob("*.comp")) + list(sdir.glob("*.glsl"))):
        h.update(p.name.encode())
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


class ShaderCache:
    """Compiles variants on demand and keeps their SPIR-V on disk (and in memory for the process).

    ``cache_dir=None`` disables the disk cache (cold benchmarks of the compile step).
    Thread-safe; misses are compiled in parallel, one glslang process each.
    """

    def __init__(self, cache_dir: str | os.PathLike[str] | None, sdir: Path | None = None) -> None:
        self.sdir = sdir or shader_dir()
        self.dir = Path(cache_dir) / "spirv" if cache_dir is not None else None
        # read-only SPIR-V shipped with the package or precompiled by the install step, consulted on a
        # miss before compiling (also how a machine without glslang runs): <pkg>/_spirv, $INFERD_SPIRV_PATH
        self.prebuilt = prebuilt_dirs()
        # $INFERD_SPIRV_EXPORT: also write every newly compiled variant there (to build a prebuilt set)
        exp = os.environ.get("INFERD_SPIRV_EXPORT")
        self.export = Path(exp) / "spirv" if exp else None
        self._mem: dict[tuple[str, Defines], ShaderModule] = {}
        #: the bundle as read at ``preload_bundle``: key -> (name, defines, spirv, manifest json)
        self._bundle: dict[str, tuple[str, Defines, bytes, dict[str, Any]]] = {}
        self._bundle_dirty = False  # this process served variants the bundle on disk lacks
        self.bundle_hits = 0
        self._lock = threading.Lock()
        self._src: dict[str, str] = {}
        self.compiled = 0
        self.disk_hits = 0
        self.memory_hits = 0

    def _source(self, name: str) -> str:
        src = self._src.get(name)
        if src is None:
            src = self._src[name] = expand_source(name, self.sdir)
        return src

    def preload_sources(self) -> None:
        """Expand every shader source now (the device does it at creation): a cache key needs the
        source, and a first cold load should not wait on the disk for dozens of small GLSL files."""
        for p in sorted(self.sdir.glob("*.comp")):
            try:
                self._source(p.stem)
            except BackendError as e:  # a broken include fails the variants that use it, later, with this message
                log.debug("shader source %s: %s", p.name, e)

    def _key(self, name: str, defines: Defines, comp_version: str) -> str:
        h = hashlib.sha256()
        h.update(f"{CACHE_FORMAT}|{TARGET_ENV}|{comp_version}|{name}|".encode())
        h.update(repr(defines).encode())
        h.update(self._source(name).encode())
        return h.hexdigest()

    def get(self, name: str, defines: Mapping[str, Any] | Defines | None = None) -> ShaderModule:
        return self.get_many([(name, norm_defines(defines))])[0]

    def get_many(self, variants: Sequence[tuple[str, Defines]]) -> list[ShaderModule]:
        """Modules for ``variants`` (name, normalised defines), compiling the missing ones in parallel."""
        comp = compiler()
        version = comp[1] if comp else "prebuilt"
        results: dict[tuple[str, Defines], ShaderModule] = {}
        missing: list[tuple[str, Defines, str]] = []
        todo: list[tuple[str, Defines]] = []
        with self._lock:
            for v in dict.fromkeys(variants):
                mod = self._mem.get(v)
                if mod is not None:
                    self.memory_hits += 1
                    results[v] = mod
                else:
                    todo.append(v)
        # the disk is read outside the lock: on a cold page cache each entry is a disk read, and a
        # cold load's loader threads all come here at once (on the H100 they queued behind one another)
        found: list[ShaderModule] = []
        bundled: list[ShaderModule] = []
        for name, defs in todo:
            key = self._key(name, defs, version)
            ent = self._bundle.get(key) if comp else None
            if ent is not None and ent[0] == name and ent[1] == defs:
                try:
                    bundled.append(ShaderModule(name, defs, key, ent[2], Manifest.from_json(ent[3])))
                    continue
                except (KeyError, TypeError, ValueError) as e:  # a bundle that passed its checksum but not this
                    log.warning("SPIR-V bundle entry for %s unreadable (%s); reading its own entry", name, e)
            mod = self._load(name, defs, key) if comp else self._load_alias(self.dir, name, defs)
            if mod is None:
                for d in self.prebuilt:
                    mod = self._load_alias(d, name, defs)
                    if mod is not None:
                        break
            if mod is not None:
                found.append(mod)
            else:
                missing.append((name, defs, key))
        if found or bundled:
            with self._lock:
                for mod in found + bundled:  # another thread may have read the same entry meanwhile: keep the first
                    results[(mod.name, mod.defines)] = self._mem.setdefault((mod.name, mod.defines), mod)
                self.disk_hits += len(found)
                self.bundle_hits += len(bundled)
                if found and self.dir is not None:
                    self._bundle_dirty = True
        if missing:
            if comp is None:
                raise BackendError(f"glslangValidator is not installed and no precompiled SPIR-V exists for "
                                   f"{[(n, dict(d)) for n, d, _ in missing]}")
            workers = max(1, min(len(missing), os.cpu_count() or 1))
            with ThreadPoolExecutor(workers) as pool:
                mods = list(pool.map(lambda m: self._compile(comp[0], *m), missing))
            with self._lock:
                for mod in mods:
                    self.compiled += 1
                    self._mem[(mod.name, mod.defines)] = results[(mod.name, mod.defines)] = mod
                    self._store(mod, version)
                if mods and self.dir is not None:
                    self._bundle_dirty = True
        return [results[v] for v in variants]

    def _compile(self, exe: str, name: str, defines: Defines, key: str) -> ShaderModule:
        src = self._source(name)
        with tempfile.TemporaryDirectory(prefix="inferd-glsl-") as td:
            sp = Path(td) / f"{name}.comp"
            sp.write_text(src)
            out = Path(td) / "out.spv"
            cmd = [exe, "-V", "--target-env", TARGET_ENV, "-S", "comp", "-o", str(out)]
            cmd += [f"-D{k}={v}" for k, v in defines]
            cmd.append(str(sp))
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0 or not out.is_file():
                msg = (r.stdout + r.stderr).strip()
                raise BackendError(f"glslang failed on shader {name} with defines {dict(defines)}:\n{msg}")
            spv = out.read_bytes()
        return ShaderModule(name, defines, key, spv, reflect(spv))

    def _paths(self, key: str, d: Path | None = None) -> tuple[Path, Path]:
        d = d or self.dir
        assert d is not None
        return d / f"{key}.spv", d / f"{key}.json"

    def _load(self, name: str, defines: Defines, key: str, d: Path | None = None) -> ShaderModule | None:
        d = d or self.dir
        if d is None:
            return None
        spv_p, man_p = self._paths(key, d)
        try:
            spv = spv_p.read_bytes()
            meta = json.loads(man_p.read_text())
            if meta.get("spirv_sha256") != hashlib.sha256(spv).hexdigest():
                log.warning("SPIR-V cache entry %s is corrupt; recompiling", spv_p)
                return None
            return ShaderModule(name, defines, key, spv, Manifest.from_json(meta["manifest"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("SPIR-V cache entry %s unreadable (%s); recompiling", spv_p, e)
            return None

    def _load_alias(self, d: Path | None, name: str, defines: Defines) -> ShaderModule | None:
        """The entry for this source + defines in ``d`` whatever glslang built it (no compiler here,
        or a prebuilt set): SPIR-V is SPIR-V; the compiler only keys the cache."""
        if d is None:
            return None
        alias = d / f"src-{self._key(name, defines, '*')}.txt"
        try:
            key = alias.read_text().strip()
        except OSError:
            return None
        return self._load(name, defines, key, d)

    def _store(self, mod: ShaderModule, version: str) -> None:
        for d in (self.dir, self.export):
            if d is None:
                continue
            try:
                d.mkdir(parents=True, exist_ok=True)
                spv_p, man_p = self._paths(mod.key, d)
                meta = {"name": mod.name, "defines": dict(mod.defines), "compiler": version, "target_env": TARGET_ENV,
                        "spirv_sha256": hashlib.sha256(mod.spirv).hexdigest(), "manifest": mod.manifest.to_json()}
                atomic_write(spv_p, mod.spirv)
                atomic_write(man_p, json.dumps(meta, indent=1).encode())
                atomic_write(d / f"src-{self._key(mod.name, mod.defines, '*')}.txt", mod.key.encode())
            except OSError as e:
                from .. import cache

                cache.report(d, e, "writing the SPIR-V cache")

    def _bundle_path(self) -> Path | None:
        return self.dir / "bundle.bin" if self.dir is not None else None

    def _read_bundle(self) -> dict[str, tuple[str, Defines, bytes, dict[str, Any]]]:
        """The bundle on disk; {} (with a warning) when it is missing, damaged or of another version: a miss,
        never an error."""
        path = self._bundle_path()
        if path is None:
            return {}
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as e:
            log.warning("SPIR-V bundle %s unreadable (%s); reading entries one by one", path, e)
            return {}
        try:
            if len(data) < _BUNDLE_HEAD.size:
                raise ValueError(f"truncated ({len(data)} bytes)")
            magic, version, count, sha = _BUNDLE_HEAD.unpack_from(data)
            if magic != BUNDLE_MAGIC:
                raise ValueError(f"magic {magic!r}")
            if version != BUNDLE_VERSION:
                raise ValueError(f"format version {version}, this engine reads {BUNDLE_VERSION}")
            body = memoryview(data)[_BUNDLE_HEAD.size:]
            if hashlib.sha256(body).digest() != sha:
                raise ValueError("checksum mismatch")
            import msgpack

            rows = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
            if not isinstance(rows, list) or len(rows) != count:
                raise ValueError("entry count differs from the header")
            out: dict[str, tuple[str, Defines, bytes, dict[str, Any]]] = {}
            for key, name, defs, spv, man in rows:
                if not (isinstance(key, str) and isinstance(name, str) and isinstance(spv, bytes)
                        and isinstance(man, dict) and isinstance(defs, list)):
                    raise ValueError("malformed entry")
                out[key] = (name, tuple((str(k), str(v)) for k, v in defs), spv, man)
            return out
        except Exception as e:  # msgpack raises several unrelated types on a damaged body
            log.warning("SPIR-V bundle %s is damaged (%s); ignoring it, entries are read one by one", path, e)
            return {}

    def preload_bundle(self) -> int:
        """Read ``spirv/bundle.bin`` (the device does it at creation); returns how many variants it holds."""
        bundle = self._read_bundle()
        with self._lock:
            self._bundle = bundle
        return len(bundle)

    def save_bundle(self) -> bool:
        """Rewrite the bundle with the variants this process served that it lacked (merged with what other
        processes wrote meanwhile), atomically; True if written. Cheap when nothing is new."""
        path = self._bundle_path()
        if path is None or not self._bundle_dirty:
            return False
        with self._lock:
            mine = {m.key: (m.name, m.defines, m.spirv, m.manifest.to_json()) for m in self._mem.values()}
            self._bundle_dirty = False
        merged = self._read_bundle()
        merged.update(mine)  # this process's variants last: they are kept when the bounds cut
        rows: list[list[Any]] = []
        total = 0
        for key, (name, defs, spv, man) in reversed(list(merged.items())):
            total += len(spv)
            if len(rows) >= BUNDLE_MAX_ENTRIES or total > BUNDLE_MAX_BYTES:
                break
            rows.append([key, name, [list(p) for p in defs], spv, man])
        rows.reverse()
        import msgpack

        body = msgpack.packb(rows, use_bin_type=True)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, _BUNDLE_HEAD.pack(BUNDLE_MAGIC, BUNDLE_VERSION, len(rows),
                                                 hashlib.sha256(body).digest()) + body)
        except OSError as e:
            from .. import cache

            cache.report(path.parent, e, "writing the SPIR-V bundle")
            return False
        with self._lock:
            for key, name, defs, spv, man in rows:
                self._bundle.setdefault(key, (name, tuple((k, v) for k, v in defs), spv, man))
        return True

    def manifest_index(self) -> dict[str, Any]:
        """Every variant this cache knows in memory: {key: {name, defines, manifest}} (for tools and tests)."""
        with self._lock:
            return {m.key: {"name": m.name, "defines": dict(m.defines), "manifest": m.manifest.to_json()}
                    for m in self._mem.values()}


def precompile(variants: Sequence[tuple[str, Mapping[str, Any] | None]], cache_dir: str | os.PathLike[str] | None = None) -> int:
    """Compile ``variants`` into the disk cache (the install step's hook); returns how many were built."""
    cache = ShaderCache(cache_dir if cache_dir is not None else default_cache_dir())
    before = cache.compiled
    cache.get_many([(n, norm_defines(d)) for n, d in variants])
    return cache.compiled - before
