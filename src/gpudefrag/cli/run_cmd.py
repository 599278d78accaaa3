"""`gpudefrag run -- CMD...`: the job wrapper, for use inside sbatch scripts."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import KeyOpt, PolicyOpt, StoreOpt, fail


def register(app: typer.Typer) -> None:
    app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run)


def run(
    ctx: typer.Context,
    run_dir: Path = typer.Option(None, "--run-dir", envvar="GPUDEFRAG_RUN_DIR",
                                 help="Shared directory for request, ticket and status files"),
    store: Path = StoreOpt,
    key: Path = KeyOpt,
    policy: Path = PolicyOpt,
    heartbeat_every: float = typer.Option(None, "--heartbeat-every", help="Heartbeat checkpoint period (s)"),
    workload_id: str = typer.Option(None, "--workload-id", help="Default: $SLURM_JOB_ID"),
    user: str = typer.Option(None, "--user", help="The job's user (name or uid): the workload runs as it, "
                             "the wrapper (root) never lends it more [default: $SLURM_JOB_UID]"),
    json_out: bool = typer.Option(False, "--json", help="Log one JSON object per event (stderr) instead of text"),
) -> None:
    """Run CMD under gpudefrag: checkpoint on request (request file or `scancel --signal=USR2 --batch`), on the
    policy's heartbeat schedule, and restore after a move (or cold-start, recording why)."""
    argv = list(ctx.args)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise fail("gpudefrag run: give the command after --, e.g. gpudefrag run -- python train.py")
    from ..wrapper import run_wrapped

    over: dict[str, object] = {"run_dir": run_dir, "store_root": store, "key_path": key, "workload_id": workload_id,
                                 "user": user}
    if policy is not None:
        from ..policy import load_policy

        hb = load_policy(policy).action.heartbeat
        if hb is not None:
            over.update(heartbeat_every_s=hb.every_s, heartbeat_cron=hb.cron, keep=hb.keep)
    if heartbeat_every is not None:
        over["heartbeat_every_s"] = heartbeat_every
    raise typer.Exit(run_wrapped(argv, json_log=json_out, **{k: v for k, v in over.items() if v is not None}))
