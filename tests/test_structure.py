"""The package's layering: no module of inferd imports (at module level or inside a function) a module that
imports it back, directly or through others. The data flows one way (import -> plan -> runtime -> daemon);
a circle means two layers each need the other, which is how twins of a mechanism start."""
from __future__ import annotations

import ast
from pathlib import Path

import inferd

ROOT = Path(inferd.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        rel = p.relative_to(ROOT).with_suffix("")
        parts = ["inferd", *rel.parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m.split(".") if p.name == "__init__.py" else m.split(".")[:-1]
        for node in ast.walk(ast.parse(p.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or "" if node.level == 0 else ".".join(
                    pkg[:len(pkg) - (node.level - 1)] + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                while t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                # the root package re-exports the public API (it imports everything): not a layer
                if t in mods and t != m and t != "inferd":
                    edges[m].add(t)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index and v != "inferd":
            visit(v)
    return out


def test_the_scanner_sees_imports_and_finds_a_planted_circle() -> None:
    edges = _imports(_modules())
    assert "inferd.ir" in edges["inferd.frontend.shapes"]  # relative imports resolved
    planted = {k: set(v) for k, v in edges.items()}
    planted["inferd.ir"].add("inferd.frontend.shapes")
    assert any("inferd.ir" in c and "inferd.frontend.shapes" in c for c in _cycles(planted))


def test_no_import_circles() -> None:
    assert _cycles(_imports(_modules())) == []
