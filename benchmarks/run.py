"""Run every benchmarks/bench_*.py (or those named) and print one table. `--quick` for a fast pass."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from common import Row  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", help="bench module names (e.g. core planner); default: all")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    ap.add_argument("--out", default=str(HERE / "results" / "latest.json"))
    args = ap.parse_args()
    mods = sorted(p.stem for p in HERE.glob("bench_*.py"))
    if args.names:
        mods = [m for m in mods if m.removeprefix("bench_") in args.names]
    rows: list[Row] = []
    # a log file gets the whole table, not rich's 80-column default for output that is not a terminal
    console = Console(width=None if sys.stdout.isatty() else 220)
    for m in mods:
        t0 = time.perf_counter()
        console.print(f"[bold]{m}[/] …")
        rows.extend(importlib.import_module(m).run(quick=args.quick))
        console.print(f"  done in {time.perf_counter() - t0:.1f} s")
    t = Table(title="gpudefrag benchmarks")
    for col in ("area", "benchmark", "value", "target", "ok", "baseline / note"):
        t.add_column(col)
    for r in rows:
        ok = "" if r.ok is None else ("[green]ok[/]" if r.ok else "[red]MISS[/]")
        note = " ".join(x for x in (r.baseline, r.note) if x)
        t.add_row(r.area, r.name, f"{r.value:.4g} {r.unit}", r.target, ok, note)
    console.print(t)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([r.as_dict() for r in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
