"""The layering of the design card, as import-linter contracts (.importlinter), and no cycles between
packages: CI fails when an import breaks either. docs/architecture.md draws the layout."""
from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import grimp

from .live_server import ROOT


def test_the_import_contracts_hold():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _packages(graph: grimp.ImportGraph, roots: list[str]) -> list[str]:
    """Every package of the project (a folder with __init__.py), deepest first."""
    packages = [m for m in graph.modules if m.split(".")[0] in roots and (ROOT / m.replace(".", "/") / "__init__.py").exists()]
    return sorted(packages, key=lambda name: name.count("."), reverse=True)


def _package_edges(graph: grimp.ImportGraph, packages: list[str]) -> dict[str, set[str]]:
    """Which package imports which, each module counted in the deepest package holding it; a package
    importing its own subpackage (or the other way) is a parent-child edge, not a sibling's, and is left out."""
    def home(module: str) -> str:
        return next(p for p in packages if module == p or module.startswith(p + "."))

    edges: dict[str, set[str]] = {p: set() for p in packages}
    for module in graph.modules:
        if module.split(".")[0] not in {p.split(".")[0] for p in packages}:
            continue
        source = home(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.split(".")[0] not in {p.split(".")[0] for p in packages}:
                continue
            target = home(imported)
            nested = target.startswith(source + ".") or source.startswith(target + ".")
            if target != source and not nested:
                edges[source].add(target)
    return edges


def _a_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_package_imports_another_that_imports_it_back():
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    roots = config["importlinter"]["root_packages"].split()
    graph = grimp.build_graph(*roots, cache_dir=None)
    packages = _packages(graph, roots)
    assert "workers.engine" in packages and "protocol" in packages
    cycle = _a_cycle(_package_edges(graph, packages))
    assert cycle is None, "package cycle: " + " -> ".join(cycle)


def test_a_cycle_is_found_when_there_is_one():
    """The cycle finder itself: two packages that import each other, and a longer ring."""
    assert _a_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _a_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_one_that_imports_it_back():
    """Cycles between single modules too (a type-only import counts: it still ties the two files together)."""
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    roots = set(config["importlinter"]["root_packages"].split())
    graph = grimp.build_graph(*roots, cache_dir=None)
    modules = {m for m in graph.modules if m.split(".")[0] in roots}
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i in modules and i != m} for m in modules}
    cycle = _a_cycle(edges)
    assert cycle is None, "module cycle: " + " -> ".join(cycle)
