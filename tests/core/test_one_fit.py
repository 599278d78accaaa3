"""One fit model (issue #29): whether a request shape fits a node — its GPUs or share, CPU, memory — is decided in
`core/capacity.py` (`fits`, `fits_one`, `fits_at`, `gpus_fit`, `room_fits`, `Capacity.fits_on` / `room_on`) and
nowhere else. This test reads every module under src/ and fails on a comparison that restates the fit: a count
of GPUs with the share free against the GPUs asked for, or free CPU or memory against what a shape asks.

The two exceptions are not fits and say so: the FGD measure (its own definition of "a task can use this node":
CPU and GPUs, memory never) and the CPU relief's optimistic estimate (CPU alone, by design an upper bound).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "gpudefrag"
HOME = "core/capacity.py"
RESTATED = [
    re.compile(r"\.sum\(axis=1\)\)?\s*>=\s*[\w.]+\.(num_gpu|gpus_per_node)\b"),
    re.compile(r"\b(cpu_free|mem_free|cpu|mem)\b(\[[^\]]*\])?\s*(<|>=)\s*[\w.]+\.(cpu_milli|memory_mib)\b"),
]
NOT_A_FIT = {
    ("core/fragmentation.py", "task_fragment"),  # the FGD measure's own rule (no memory), vectorised per shape
    ("core/capacity.py", "*"),  # the one place
    ("sim/cpu_relief.py", "relief_potential"),  # an optimistic CPU-only bound, not a placement
}


def _functions(tree: ast.AST) -> list[tuple[int, int, str]]:
    return [(n.lineno, n.end_lineno or n.lineno, n.name) for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def restated_fits() -> list[str]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        text = path.read_text()
        funcs = _functions(ast.parse(text))
        for no, line in enumerate(text.splitlines(), 1):
            if not any(p.search(line) for p in RESTATED):
                continue
            inner = min((f for f in funcs if f[0] <= no <= f[1]), key=lambda f: f[1] - f[0], default=None)
            name = inner[2] if inner else "<module>"
            if (rel, "*") in NOT_A_FIT or (rel, name) in NOT_A_FIT:
                continue
            out.append(f"{rel}:{no} ({name}): {line.strip()}")
    return out


def test_no_module_restates_the_fit() -> None:
    assert restated_fits() == [], "call core/capacity.py's fit instead"


def test_the_check_sees_a_restated_fit() -> None:
    """The patterns catch the shapes the simulator used to carry inline."""
    for line in ("ok &= (cl.free >= q.gpu_milli).sum(axis=1) >= q.num_gpu",
                 "if cl.cpu_free[n] < pod.cpu_milli or cl.mem_free[n] < pod.memory_mib:",
                 "if cpu >= pod.cpu_milli and mem >= pod.memory_mib:"):
        assert any(p.search(line) for p in RESTATED), line
    assert (HOME, "*") in NOT_A_FIT
