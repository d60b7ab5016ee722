"""SPIR-V shipped with the package: the shader variants of ``shaders/shipped.txt`` compiled at build time.

Why: a first start (no SPIR-V cache, no pipeline cache, no driver cache) otherwise runs glslang on every variant a
model needs: on the 2-core VM 1.3-1.5 s of squeezenet1_1's 2.9 s first cold load on lavapipe, where creating its
pipelines took 0.12 s. ncnn ships its SPIR-V inside its library; inferd's variants are a shader plus ``#define``
values, so it ships the ones the zoo's models can ask for on the devices it is measured on (every candidate
kernel of every layer, fp32 and fp16: ``model_variants``, recorded by ``scripts/spirv_record.py`` on lavapipe and
an NVIDIA GPU), and compiles any other one at first use as before.

The build (``setup.py``'s ``build_py``) runs ``python -m inferd.vulkan.precompile --out <package>/_spirv``; the
result is in the read-only format ``ShaderCache`` consults before compiling (``shaders.prebuilt_dirs``: the
package's ``_spirv`` and ``$INFERD_SPIRV_PATH``). A build without glslang ships none (a warning, not a failure).

Usage: ``python -m inferd.vulkan.precompile [--list FILE] [--out DIR]``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from .shaders import Defines, ShaderCache, compiler, norm_defines, shader_dir

#: name of the variant list beside the shader sources
LIST_NAME = "shipped.txt"


def default_list() -> Path:
    return shader_dir() / LIST_NAME


def default_out() -> Path:
    """The package's ``_spirv`` (what ``shaders.prebuilt_dirs`` reads first)."""
    return Path(__file__).resolve().parent.parent / "_spirv"


def read_list(path: Path) -> list[tuple[str, Defines]]:
    """The variants of a list file: one per line, ``shader KEY=VALUE ...``; ``#`` starts a comment."""
    out: list[tuple[str, Defines]] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, *defs = line.split()
        pairs = []
        for d in defs:
            k, sep, v = d.partition("=")
            if not sep or not k:
                raise ValueError(f"{path}:{n}: {d!r} is not KEY=VALUE")
            pairs.append((k, v))
        out.append((name, norm_defines(pairs)))
    return out


def write_list(path: Path, variants: Sequence[tuple[str, Defines]]) -> None:
    lines = sorted({" ".join([name, *(f"{k}={v}" for k, v in defs)]) for name, defs in variants})
    head = ("# SPIR-V variants compiled into the package at build time (inferd/vulkan/precompile.py): every candidate\n"
            "# kernel of the zoo's models on lavapipe and an NVIDIA GPU (scripts/spirv_record.py); any other variant\n"
            "# compiles at first use.\n")
    path.write_text(head + "\n".join(lines) + "\n")


def model_variants(graph: Any, precision: str = "fp32", device: Any = None) -> set[tuple[str, Defines]]:
    """The variants ``graph`` can ask for on ``device`` (default: the process's): every candidate kernel of every
    layer, as a load's planner may pick any of them. Needs the device (its caps choose some defines)."""
    from .cold import VulkanColdBackend
    from .kernel import split_rows

    b = VulkanColdBackend(graph, device=device, precision=precision)
    out: set[tuple[str, Defines]] = set()
    try:
        for s in b._slots:
            if s.kind != "kernel":
                continue
            for k in s.kernels:
                try:
                    params = k.transform(s.layer, b._raw(s, {}))
                    ds = split_rows(k.dispatches(s.layer, params, b.caps), b.caps)
                except Exception:  # a candidate that cannot build here is not one a load would run
                    continue
                out.update((d.shader, norm_defines(d.defines)) for d in ds)
    finally:
        b.close()
    return out


def precompile(variants: Sequence[tuple[str, Defines]], out: Path) -> int:
    """Compile ``variants`` into ``out`` in the prebuilt format; returns how many. A variant whose shader no
    longer exists (a list older than the sources) is skipped with a message, not fatal."""
    names = {p.stem for p in shader_dir().glob("*.comp")}
    todo = [v for v in dict.fromkeys(variants) if v[0] in names]
    for name, _ in variants:
        if name not in names:
            print(f"precompile: no shader {name!r}; its variants are left out", file=sys.stderr)
    cache = ShaderCache(None)
    cache.prebuilt = []  # compile each one: a variant found in another precompiled set would not be written here
    cache.export = out / "spirv"  # what $INFERD_SPIRV_EXPORT does: every compiled variant written there
    cache.get_many(todo)
    return len(todo)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m inferd.vulkan.precompile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", type=Path, default=None, help=f"variant list (default: the shaders' {LIST_NAME})")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default: the package's _spirv)")
    a = ap.parse_args(argv)
    lst = a.list or default_list()
    if compiler() is None:
        print("precompile: glslangValidator not found: no SPIR-V shipped (variants compile at first use)",
              file=sys.stderr)
        return 1
    n = precompile(read_list(lst), a.out or default_out())
    print(f"precompiled {n} SPIR-V variants into {a.out or default_out()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
