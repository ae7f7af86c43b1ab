"""No import circles among modelpress's modules: a module never imports, directly or through
others, a module that imports it. Function-local imports count (they only delay the circle);
imports under ``if TYPE_CHECKING:`` do not (they never run). An import of ``pkg.mod`` counts as an
import of that module, an import of a name from ``pkg`` as one of ``pkg/__init__.py``."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def import_graph(root: Path) -> dict[str, set[str]]:
    files = {_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_only(tree)
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    package = ".".join(base + ([node.module] if node.module else []))
                else:
                    package = node.module or ""
                for a in node.names:
                    full = f"{package}.{a.name}"
                    if full in files:
                        deps.add(full)
                    elif package in files:
                        deps.add(package)
        deps.discard(mod)
        graph[mod] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, deps = work[-1]
            nxt = next(deps, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles():
    found = cycles(import_graph(SRC))
    assert not found, "import circles:\n" + "\n".join(" ↔ ".join(c) for c in found)


def test_the_check_finds_a_planted_cycle(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from p.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from p import c\n")
    (pkg / "c.py").write_text("from . import a\n")
    (pkg / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import a\n"
    )
    assert cycles(import_graph(tmp_path)) == [["p.a", "p.b", "p.c"]]
