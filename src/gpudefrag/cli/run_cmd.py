"""`gpudefrag run -- CMD...`: the job wrapper, for use inside sbatch scripts (in-process as root; as a job's
user, the client of `gpudefrag run-service`, the root service that does root's part)."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from .common import KeyOpt, PolicyOpt, StoreOpt, fail


def register(app: typer.Typer) -> None:
    app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run)
    app.command("run-service")(run_service)


SocketOpt = typer.Option("/run/gpudefrag/run.sock", "--socket", envvar="GPUDEFRAG_RUN_SOCKET",
                         help="The run service's socket (a folder of root's that nobody else may write)")


def _wrapper_settings(policy: Path | None, heartbeat_every: float | None) -> dict[str, object]:
    over: dict[str, object] = {}
    if policy is not None:
        from ..policy import load_policy

        hb = load_policy(policy).action.heartbeat
        if hb is not None:
            over.update(heartbeat_every_s=hb.every_s, heartbeat_cron=hb.cron, keep=hb.keep)
    if heartbeat_every is not None:
        over["heartbeat_every_s"] = heartbeat_every
    return over


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
    sock: Path = SocketOpt,
) -> None:
    """Run CMD under gpudefrag: checkpoint on request (request file or `scancel --signal=USR2 --batch`), on the
    policy's heartbeat schedule, and restore after a move (or cold-start, recording why). As root the wrapper
    runs here; as anyone else this is a client of `gpudefrag run-service` at --socket, whose store, key, run
    folder and policy apply (those options are then not used)."""
    argv = list(ctx.args)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise fail("gpudefrag run: give the command after --, e.g. gpudefrag run -- python train.py")
    if os.geteuid() != 0:
        from ..run_service import run_client

        raise typer.Exit(run_client(argv, socket_path=sock, workload_id=workload_id, json_log=json_out))
    from ..wrapper import run_wrapped

    over: dict[str, object] = {"run_dir": run_dir, "store_root": store, "key_path": key, "workload_id": workload_id,
                                 "user": user, **_wrapper_settings(policy, heartbeat_every)}
    raise typer.Exit(run_wrapped(argv, json_log=json_out, **{k: v for k, v in over.items() if v is not None}))


def run_service(
    sock: Path = SocketOpt,
    run_dir: Path = typer.Option(..., "--run-dir", envvar="GPUDEFRAG_RUN_DIR",
                                 help="Shared directory for request, ticket and status files"),
    store: Path = StoreOpt,
    key: Path = KeyOpt,
    policy: Path = PolicyOpt,
    heartbeat_every: float = typer.Option(None, "--heartbeat-every", help="Heartbeat checkpoint period (s)"),
    jobs: str = typer.Option("slurm", "--jobs", help="How a client's job is established: slurm (the slurmstepd "
                             "it runs under, and the job's user from scontrol) or local (workload ids USER.NAME)"),
    node: str = typer.Option(None, "--node", help="This node's name for --jobs local [default: the host name]"),
    max_per_user: int = typer.Option(64, "--max-per-user", min=1, help="Workloads one user may run under this "
                                      "service at once (each has a root wrapper process)"),
    request_timeout: float = typer.Option(30.0, "--request-timeout", min=0.1, help="Seconds a connection may take "
                                          "to send its request before it is dropped"),
    json_out: bool = typer.Option(False, "--json", help="Say that it listens as one JSON object (stderr)"),
) -> None:
    """Run as root: serve `gpudefrag run` for job users (checkpoint/restore with CRIU, the store and the key are
    this service's; each client's workload runs as the client's own uid, gid and groups)."""
    from ..checkpoint.store import default_key_path
    from ..run_service import ServiceConfig, serve

    if store is None:
        raise fail("gpudefrag run-service: --store (or GPUDEFRAG_STORE) is needed")
    serve(ServiceConfig(socket_path=sock, run_dir=run_dir, store_root=store, key_path=key or default_key_path(),
                        jobs=jobs, node=node, max_per_user=max_per_user, request_timeout_s=request_timeout,
                        wrapper=_wrapper_settings(policy, heartbeat_every)), json_log=json_out)
