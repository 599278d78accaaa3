"""Packages import downwards only, and no module is part of an import cycle (issues #12, #29).

Walks the AST of every module under src/gpudefrag (imports inside functions and under `if TYPE_CHECKING:` count
too: a lazy or type-only import is still a dependency) and resolves relative imports to module names. Every
module belongs to a layer of the table below, so a new top-level module or package fails until it is placed.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = "gpudefrag"

# core ← policy ← checkpoint / engines / sim ← control ← web / cli (a package may import any lower layer).
# jobside (the job-side protocol: environment names, spool, job folder, tickets, statuses) sits below both the
# backends and the code that runs inside a job (job.py, wrapper.py), so neither imports the other to learn it.
# registry (the one registry shape: cause checks, triggers, engines, checkpoint backends) sits with core.
LAYER = {"errors": 0, "fileio": 0, "typed_json": 0, "registry": 0, "core": 0,
         "snapshot": 1, "policy": 1, "jobside": 1, "render": 1,
         "checkpoint": 2, "engines": 2, "sim": 2, "demo": 2,
         "control": 3, "job": 3, "wrapper": 3, "run_service": 3,
         "web": 4, "cli": 4}


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


class Graph:
    def __init__(self) -> None:
        self.out: dict[str, set[str]] = {}

    def add_node(self, n: str) -> None:
        self.out.setdefault(n, set())

    def add_edge(self, a: str, b: str) -> None:
        self.add_node(a)
        self.add_node(b)
        self.out[a].add(b)

    @property
    def edges(self) -> list[tuple[str, str]]:
        return [(a, b) for a, bs in self.out.items() for b in bs]

    def cycles(self) -> list[set[str]]:
        """Strongly connected components of more than one module (Tarjan, iterative)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on: set[str] = set()
        out: list[set[str]] = []
        for root in self.out:
            if root in index:
                continue
            work = [(root, iter(sorted(self.out[root])))]
            index[root] = low[root] = len(index)
            stack.append(root)
            on.add(root)
            while work:
                v, it = work[-1]
                w = next(it, None)
                if w is not None:
                    if w not in index:
                        index[w] = low[w] = len(index)
                        stack.append(w)
                        on.add(w)
                        work.append((w, iter(sorted(self.out[w]))))
                    elif w in on:
                        low[v] = min(low[v], index[w])
                    continue
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.add(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        out.append(comp)
        return out


@functools.cache
def _graph() -> Graph:
    g = Graph()
    files = {_module(p): p for p in (SRC / PKG).rglob("*.py")}
    for mod, path in files.items():
        g.add_node(mod)
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = pkg.split(".")
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for t in targets:
                if t.startswith(PKG) and t in files and t != mod:
                    g.add_edge(mod, t)
    return g


# Known debts other changes of this round remove (each owner's files); an entry that no longer occurs fails the
# test, so the list only shrinks. Both are empty now.
KNOWN_CYCLES: list[list[str]] = []
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _top(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_module_is_in_an_import_cycle() -> None:
    g = _graph()
    cycles = sorted(sorted(c) for c in g.cycles())
    assert [c for c in cycles if c not in KNOWN_CYCLES] == [], f"import cycles: {cycles}"
    assert [c for c in KNOWN_CYCLES if c not in cycles] == [], "a known cycle is gone: drop it from the list"


def test_no_package_cycle() -> None:
    """Packages of one layer may import each other, but not both ways (that is a cycle one level up)."""
    g = Graph()
    for a, b in _graph().edges:
        if _top(a) != _top(b):
            g.add_edge(_top(a), _top(b))
    assert g.cycles() == [], f"packages import each other: {g.cycles()}"


def test_every_module_has_a_layer() -> None:
    g = _graph()
    missing = sorted(m for m in g.out if m != PKG and _top(m) not in LAYER)
    assert missing == [], f"modules outside the layer table (add them to LAYER): {missing}"


@pytest.mark.parametrize("pkg", sorted(LAYER))
def test_packages_import_downwards_only(pkg: str) -> None:
    g = _graph()
    up = {(a, b) for a, b in g.edges if _top(a) == pkg and _top(b) in LAYER and LAYER[_top(b)] > LAYER[pkg]}
    assert sorted(up - KNOWN_UPWARD) == [], f"{pkg} imports upwards: {sorted(up - KNOWN_UPWARD)}"
    known_here = {e for e in KNOWN_UPWARD if _top(e[0]) == pkg}
    assert sorted(known_here - up) == [], "a known upward import is gone: drop it from the list"


def test_the_walk_sees_imports() -> None:
    """The checks above are only as good as the graph: it must hold the edges we know exist."""
    g = _graph()
    assert ("gpudefrag.core.decision", "gpudefrag.core.planner") in g.edges
    assert ("gpudefrag.control.controller", "gpudefrag.core.decision") in g.edges
    assert ("gpudefrag.cli.plan_cmd", "gpudefrag.policy.options") in g.edges
    assert ("gpudefrag.sim.cpu_relief", "gpudefrag.sim.search") in g.edges  # under `if TYPE_CHECKING:`
    assert ("gpudefrag.wrapper", "gpudefrag.checkpoint.operations") in g.edges  # inside a function
    assert len({_top(m) for m in g.out}) >= len(LAYER)  # every layer's package was walked


def test_the_checks_catch_an_upward_import_and_a_cycle() -> None:
    """The layer and cycle checks fail on the shapes this round removed (app_hook → job, repack ↔ cpu_relief)."""
    g = Graph()
    g.add_edge("gpudefrag.checkpoint.app_hook", "gpudefrag.job")
    g.add_edge("gpudefrag.job", "gpudefrag.checkpoint.store")
    assert [(a, b) for a, b in g.edges if LAYER[_top(b)] > LAYER[_top(a)]] == [
        ("gpudefrag.checkpoint.app_hook", "gpudefrag.job")]
    g.add_edge("gpudefrag.checkpoint.store", "gpudefrag.checkpoint.app_hook")
    assert [sorted(c) for c in g.cycles()] == [
        ["gpudefrag.checkpoint.app_hook", "gpudefrag.checkpoint.store", "gpudefrag.job"]]
