"""The operator coverage table (``inferd ops``), generated from the registry so that it cannot drift.

One row per registered operator: the opsets the importer reads it at (from the op's ``min_opset`` to the
importer's ``MAX_OPSET``), its CPU and Vulkan kernels by name, and notes: the ``OpSpec``'s own (limits of the
implementation) plus what follows from the registry (alias ops are views; an op with no Vulkan kernel makes a
Vulkan model run the node on the CPU between GPU segments unless it folds to a constant).
"""
from __future__ import annotations

from typing import Any

from . import registered_ops
from .base import kernels_for
from .control import CONTROL_OPS, OPTIONAL_OPS

NO_VULKAN = ("no Vulkan kernel: in a Vulkan model it runs on the CPU between GPU segments (mixed placement) "
             "unless it folds to a constant")
HOST_VULKAN = "Vulkan: a host step between GPU segments (bodies run as nested Vulkan models)"
LOWERED = "lowered at import (to an Identity or a constant): no node of it is left to place on any backend"


def _load_vulkan_kernels() -> str | None:
    """Register the Vulkan kernels (their host bindings need no device); the reason when that fails."""
    try:
        from ..vulkan.executor import _import_kernels

        _import_kernels()
        return None
    except Exception as e:  # no Vulkan loader or bindings on this machine: the column says so
        return f"{type(e).__name__}: {e}"


def coverage() -> dict[str, Any]:
    """``{"max_opset", "vulkan_error", "ops": [{"op", "opsets": [lo, hi], "cpu", "vulkan", "notes"}, ...]}``,
    rows sorted by operator name. ``vulkan`` is None for every op when the Vulkan kernels could not be loaded."""
    from ..frontend.onnx_import import MAX_OPSET

    vk_error = _load_vulkan_kernels()
    rows = []
    for op, spec in sorted(registered_ops().items()):
        notes = [spec.notes] if spec.notes else []
        if spec.alias:
            notes.append("a view of its input (no copy)")
        vk = None if vk_error else [k.name for k in kernels_for(op, "vulkan")]
        if op in CONTROL_OPS:
            notes.append(HOST_VULKAN)
        elif op in OPTIONAL_OPS:
            notes.append(LOWERED)
        elif vk == [] and not spec.alias:
            notes.append(NO_VULKAN)
        rows.append({"op": op, "opsets": [max(spec.min_opset, 1), MAX_OPSET],
                     "cpu": [k.name for k in kernels_for(op, "cpu")], "vulkan": vk, "notes": notes})
    return {"max_opset": MAX_OPSET, "vulkan_error": vk_error, "ops": rows}


def format_table(cov: dict[str, Any]) -> str:
    """The coverage as a fixed-width text table, with a count line at the end."""
    rows = cov["ops"]
    head = ("operator", "opsets", "CPU kernels", "Vulkan kernels", "notes")
    cells = []
    for r in rows:
        vk = "?" if r["vulkan"] is None else (", ".join(r["vulkan"]) or "-")
        cells.append((r["op"], f"{r['opsets'][0]}-{r['opsets'][1]}", ", ".join(r["cpu"]) or "-", vk,
                      "; ".join(r["notes"])))
    widths = [max(len(head[i]), *(len(c[i]) for c in cells)) if cells else len(head[i]) for i in range(4)]
    widths = [min(w, 48) for w in widths]

    def line(c: tuple[str, ...]) -> str:
        return "  ".join(c[i].ljust(widths[i]) for i in range(4)) + "  " + c[4]

    out = [line(head), line(tuple("-" * w for w in widths) + ("-----",))]
    out += [line(c) for c in cells]
    other = [r for r in rows if "." in r["op"]]  # another domain's ops: "<domain>.<op>"
    rows = [r for r in rows if "." not in r["op"]]
    n_cpu = sum(1 for r in rows if r["cpu"])
    if cov["vulkan_error"]:
        vk_line = f"Vulkan kernels unknown ({cov['vulkan_error']})"
    else:
        vk_line = f"{sum(1 for r in rows if r['vulkan'])} with a Vulkan kernel"
    out.append(f"{len(rows)} operators of the default domain registered (importer opsets up to "
               f"{cov['max_opset']}): {n_cpu} with a CPU kernel, {vk_line}")
    if other:
        out.append(f"{len(other)} operators of other domains: {', '.join(r['op'] for r in other)}")
    return "\n".join(out)
