"""No import cycle in linnet.lang or linnet.torch (issue 13): an ast walk over the package
sources, every import counted (a function-level `from .planned import ...` included), and
every module of linnet.lang imports on its own."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TREES = {
    "linnet.lang": REPO / "packages" / "linnet-lang" / "src" / "linnet" / "lang",
    "linnet.torch": REPO / "packages" / "linnet-runtime-torch" / "src" / "linnet" / "torch",
}


def modules(package: str, root: Path) -> dict[str, Path]:
    found = {}
    for py in sorted(root.rglob("*.py")):
        parts = list(py.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join([package, *parts])] = py
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of these packages it imports (anywhere in its text)."""
    mods: dict[str, Path] = {}
    for package, root in TREES.items():
        mods.update(modules(package, root))
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        here = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from pkg import mod` imports the module pkg.mod; `from pkg import name`
                # runs pkg's __init__.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name and t in mods:
                    graph[name].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles a depth-first walk finds (one per back edge)."""
    found, state, stack = [], dict.fromkeys(graph, 0), []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state[n] == 0:
                visit(n)
            elif state[n] == 1:
                found.append([*stack[stack.index(n):], n])
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if state[m] == 0:
            visit(m)
    return found


def test_walk_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle() -> None:
    graph = import_graph()
    assert "linnet.torch.planned" in graph and "linnet.lang.emit.torch" in graph
    assert "linnet.torch.options" in graph["linnet.torch.planned"]
    assert cycles(graph) == []


@pytest.mark.parametrize("name", sorted(modules("linnet.lang", TREES["linnet.lang"])))
def test_every_lang_module_imports(name: str) -> None:
    importlib.import_module(name)
