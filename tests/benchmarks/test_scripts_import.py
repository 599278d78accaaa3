"""Every benchmark script imports and has its entry point. Nothing else in the suite imports them, and a rename
in the package once broke two of them unnoticed until a benchmark run; the runs themselves take hours and stay
out of the suite (README: `./scripts/bench.sh`)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py"))


@pytest.fixture(autouse=True)
def _on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))  # the scripts import each other (common, gen_cluster) as run.py does


def test_the_scripts_are_found() -> None:
    assert {"run", "common", "bench_sim", "reproduce_fgd", "reproduce_variants"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_imports_with_its_entry_point(name: str) -> None:
    sys.modules.pop(name, None)
    mod = importlib.import_module(name)
    if name.startswith("bench_"):
        assert callable(mod.run)  # run.py calls run(quick=...)
    elif name in ("run", "reproduce_fgd", "reproduce_variants", "rescue_log"):
        assert callable(mod.main)
