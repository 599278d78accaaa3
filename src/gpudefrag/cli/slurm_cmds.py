"""`gpudefrag slurm snapshot OUT`, and the live Slurm cluster behind `diagnose --slurm` and `plan --slurm`.

Each reads the cluster through the Slurm engine (`sinfo`/`squeue --json`, SLURM_CONF selects the cluster) and
builds the controller's own planning options: the policy's filter, minus jobs that do not run under
`gpudefrag run` (with `--run-dir`), checkpoint sizes from the store (with `--store`). So `diagnose --slurm`
and `plan --slurm` give the decision `controller --once` would take on the same cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer
from rich.markup import escape

from ..core.model import ClusterState
from ..core.planner import PlanOptions
from ..engines.base import EngineError
from .common import JsonOpt, KeyOpt, StoreOpt, console, emit_json, fail

slurm_app = typer.Typer(help="The live Slurm cluster (SLURM_CONF selects it).", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(slurm_app, name="slurm")


@dataclass(frozen=True)
class LiveSlurm:
    """The cluster as the controller sees it, and the controller's planning options for it."""

    state: ClusterState
    options: PlanOptions
    plan_anyway: bool


def live_slurm(policy: Path | None = None, run_dir: Path | None = None, store: Path | None = None,
               key: Path | None = None, costs: Path | None = None) -> LiveSlurm:
    """Observe the Slurm cluster and build the options the controller would plan with (same policy, same
    wrapper and store inputs). A Slurm client that fails is one line and exit 2."""
    from ..control.controller import Controller, enrich_from_store
    from ..engines.slurm import SlurmEngine
    from ..policy.costs import load_cost_model
    from ..policy.loader import load_policy
    from ..policy.models import Policy

    pol = load_policy(policy) if policy is not None else Policy()
    st = None
    if store is not None:
        from ..checkpoint.keys import load_key
        from ..checkpoint.store import CheckpointStore, default_key_path

        st = CheckpointStore(store, key or default_key_path())
        load_key(st.key_path, create=False)  # the store's key must exist: never a new one here
    can = None
    if run_dir is not None:
        from ..control.agent import FileAgent

        wrappers = FileAgent(run_dir, st)

        def can(w):  # type: ignore[no-untyped-def]
            return wrappers.has_wrapper(w.id)

    eng = SlurmEngine()
    ctl = Controller(eng, pol, None, dry_run=True, enrich=enrich_from_store(st) if st is not None else None,
                     can_checkpoint=can, costs=load_cost_model(costs) if costs is not None else None)
    try:
        state = ctl.observe()
    except EngineError as e:
        raise fail(f"slurm: {e}") from None
    return LiveSlurm(state, ctl.options(set()), pol.trigger.plan_anyway)


RunDirOpt = typer.Option(None, "--run-dir", envvar="GPUDEFRAG_RUN_DIR",
                         help="--slurm: the wrappers' shared directory (only jobs under `gpudefrag run` may move)")


@slurm_app.command("snapshot")
def slurm_snapshot(
    out: Path = typer.Argument(..., help="Where to write the snapshot (JSON)"),
    store: Path = StoreOpt,
    key: Path = KeyOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Write the live cluster as a gpudefrag snapshot (nodes, jobs, priorities, reasons; checkpoint sizes with
    --store), to diagnose, plan or simulate offline; `gpudefrag snapshot validate OUT` accepts it."""
    from ..snapshot import save_snapshot

    live = live_slurm(store=store, key=key)
    save_snapshot(out, live.state)
    s = live.state
    info = {"file": str(out), "nodes": len(s.nodes), "gpus": int(s.gpu_counts.sum()), "running": len(s.running),
            "pending": len(s.pending)}
    if json_out:
        emit_json(info)
    else:
        console.print(f"wrote {escape(str(out))}: {info['nodes']} nodes, {info['gpus']} GPUs, {info['running']} "
                      f"running, {info['pending']} pending jobs")
