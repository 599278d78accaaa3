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

# The options every command that plans, moves or reads checkpoints shares, declared once so each means the same
# everywhere: the same policy file gives the same settings (`policy.options`: filter, budgets, planner limit,
# compatibility rule, triggers, heartbeat) and the same cost file the same prices in `plan`, `diagnose`, `serve`,
# `kube plan`, `controller` and `run`; --store is always the one folder of signed checkpoints that `run` and
# `checkpoint` write and the others read.
PolicyOpt = typer.Option(None, "--policy", help="Policy file (YAML: trigger, filter, action, budgets, compat); "
                         "the same file gives the same settings in every command [default: the built-in policy]")
CostsOpt = typer.Option(None, "--costs", help="Cost file (JSON/YAML): bandwidths in GB/s, per-pair links, measured "
                        "migrations (docs/planner.md) [default: the built-in costs]")
StoreOpt = typer.Option(None, "--store", envvar="GPUDEFRAG_STORE", help="The checkpoint store: the one folder of "
                        "signed checkpoints, which `run` and `checkpoint` write and `restore` and `checkpoints` read "
                        "(default /var/lib/gpudefrag/checkpoints); `controller`, `serve` and --slurm read it for "
                        "checkpoint sizes, ages and verification when it is given")
KeyOpt = typer.Option(None, "--key", envvar="GPUDEFRAG_KEY", help="The store's signing key, root-only (0600); only "
                      "`checkpoint` and `keys init` create it [default /etc/gpudefrag/checkpoint.key]")


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


def log_line(text: str, *, markup: bool = False) -> None:
    """One log line of a long-running command (controller, node agent) on stdout. Never wrapped: Rich would break
    it at the console's width (80 columns when stdout is a pipe, as in a container's log), and a line that a
    collector, `kubectl logs | grep` or a test reads must stay whole."""
    console.print(text, markup=markup, highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)
