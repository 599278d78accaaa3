"""What every command shares: the console, JSON output, and turning input errors into one line and exit 2."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON instead of tables.")


def emit_json(doc: Any) -> None:
    """JSON to stdout (plain, not through Rich, so it stays parseable when piped)."""
    sys.stdout.write(json.dumps(doc, indent=2, default=_default) + "\n")


def _default(o: Any) -> Any:
    if hasattr(o, "as_dict"):
        return o.as_dict()
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, set | frozenset | tuple):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)
