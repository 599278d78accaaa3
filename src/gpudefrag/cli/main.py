"""Entry point: builds the Typer app from the command modules and maps gpudefrag errors to exit codes."""

from __future__ import annotations

import importlib
import sys

import typer
from rich.markup import escape

from ..errors import GpudefragError
from .common import err_console

app = typer.Typer(
    name="gpudefrag",
    help="Give GPU clusters their whole nodes back: diagnose fragmentation, plan the cheapest moves, "
    "move running jobs with their state.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Each module defines `register(app)`. One line per area; keep the list in this order.
COMMAND_MODULES = (
    "gpudefrag.cli.core_cmds",
    "gpudefrag.cli.plan_cmd",
    "gpudefrag.cli.checkpoint_cmd",
    "gpudefrag.cli.serve_cmd",
    "gpudefrag.cli.kube_cmds",
    "gpudefrag.cli.slurm_cmds",
    "gpudefrag.cli.simulate_cmd",
    "gpudefrag.cli.controller_cmd",
    "gpudefrag.cli.run_cmd",
    "gpudefrag.cli.node_agent_cmd",
)

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def run(argv: list[str] | None = None) -> None:
    """Console entry point. Input errors: one line on stderr, exit 2, no traceback."""
    try:
        app(args=argv)
    except GpudefragError as e:
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    run()
