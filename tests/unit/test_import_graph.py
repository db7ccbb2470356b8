"""No import circle between our modules, counting every import: deferred ones and ``if TYPE_CHECKING:`` ones too.

import-linter checks the floors and forbids imports between packages, but an
import inside a function or under ``TYPE_CHECKING`` can still close a circle
inside one package (the cache <-> dispatch <-> watcher and audit <->
controllers circles of issue 40 were hidden that way). This test reads every
module of the six packages with :mod:`ast`, takes every ``import``/``from ...
import`` wherever it stands, and fails on any strongly connected component of
more than one module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["hashing", "registry", "range_filter_proxy", "controller_manager", "local_apiserver", "rangeshard"]


def _modules(root: Path, packages: list[str]) -> dict[str, tuple[Path, bool]]:
    found: dict[str, tuple[Path, bool]] = {}
    for top in packages:
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def import_graph(root: Path = ROOT, packages: list[str] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (``from pkg import mod`` counts as importing ``pkg.mod``)."""
    modules = _modules(root, packages)

    def ours(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    base = ".".join([*here[: len(here) - node.level + 1], *([node.module] if node.module else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            edges.update(m for m in map(ours, targets) if m is not None and m != name)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_finder_sees_deferred_and_type_checking_imports(tmp_path: Path) -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}) == [["a", "b", "c"]]
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cache.py").write_text("from pkg.watcher import Watcher\n")
    (pkg / "watcher.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.cache import Cache\nclass Watcher: ...\n"
    )
    (pkg / "audit.py").write_text("def main():\n    from . import controllers\n")
    (pkg / "controllers.py").write_text("import pkg.audit\n")
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.audit"] == {"pkg.controllers"}  # a relative import inside a function
    assert circles(graph) == [["pkg.audit", "pkg.controllers"], ["pkg.cache", "pkg.watcher"]]


def test_the_graph_covers_the_six_packages() -> None:
    graph = import_graph()
    assert {m.split(".")[0] for m in graph} == set(PACKAGES)
    assert "range_filter_proxy.watchcache" in graph["range_filter_proxy.cache"]


def test_no_import_circle_between_our_modules() -> None:
    found = circles(import_graph())
    assert found == [], "import circles (deferred and TYPE_CHECKING imports count):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )
