"""`gpudefrag plan`: the cheapest moves that let a pending job land, with each move's cost and a before/after
GPU map. Exit code 1 when no plan exists (with the reason), 2 for bad input."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.markup import escape
from rich.table import Table

from ..core.compat import CompatRule, VersionMatch
from ..core.cost import GB, CostModel, TransferSample
from ..core.model import MILLI, ClusterState, Request
from ..core.planner import Plan, PlanOptions, placements_state, plan_all_pending, plan_moves
from ..errors import InputError, loc_to_path
from ..render import gpu_map, legend, workload_tags
from ..snapshot import load_snapshot, read_document
from .common import JsonOpt, console, emit_json, fail

# ---------------------------------------------------------------------------------------------- cost file
Pos = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegF = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LinkIn(_Strict):
    source: Annotated[str, Field(min_length=1)]
    target: Annotated[str, Field(min_length=1)]
    gbps: Pos


class SampleIn(_Strict):
    source: Annotated[str, Field(min_length=1)]
    target: Annotated[str, Field(min_length=1)]
    bytes: Annotated[int, Field(ge=0)]
    checkpoint_s: NonNegF
    transfer_s: NonNegF
    restore_s: NonNegF


class CostsIn(_Strict):
    """A cost file (JSON or YAML): bandwidths in GB/s, per-pair links, and measured migrations."""

    checkpoint_gbps: Pos = 2.0
    transfer_gbps: Pos = 1.25
    restore_gbps: Pos = 2.0
    overhead_s: NonNegF = 10.0
    cold_start_s: NonNegF = 300.0
    shared_storage: bool = False
    links: list[LinkIn] = []
    history: list[SampleIn] = []


def cost_model_from_doc(doc: Any, source: str) -> CostModel:
    """The CostModel a cost document describes; bad input is one InputError naming the file and field."""
    try:
        c = CostsIn.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        raise InputError(source, loc_to_path(err["loc"]), err["msg"]) from None
    model = CostModel(
        checkpoint_bps=c.checkpoint_gbps * GB, transfer_bps=c.transfer_gbps * GB, restore_bps=c.restore_gbps * GB,
        overhead_s=c.overhead_s, cold_start_s=c.cold_start_s, shared_storage=c.shared_storage,
        link_bps={(lk.source, lk.target): lk.gbps * GB for lk in c.links},
    )
    samples = [TransferSample(s.source, s.target, s.bytes, s.checkpoint_s, s.transfer_s, s.restore_s)
               for s in c.history]
    model = model.from_history(samples) if samples else model
    if not all(math.isfinite(v) for v in (model.checkpoint_bps, model.transfer_bps, model.restore_bps)):
        raise InputError(source, "history", "measured bandwidths are not finite")
    return model


def load_cost_model(path: Path) -> CostModel:
    return cost_model_from_doc(read_document(path, "cost"), str(path))


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)


def _pick_request(state: ClusterState, file: Path, job: str | None, gpus: int | None, model: str | None,
                  share: int) -> tuple[Request, str | None]:
    if job is not None:
        if job not in state.workload_index:
            raise fail(f"{file}: no workload with id {job!r}")
        w = state.workload(job)
        if w.is_running:
            raise fail(f"{file}: workload {job!r} is running, not pending")
        return w.request, job
    if gpus is not None:
        if gpus < 0 or not 1 <= share <= MILLI or (share < MILLI and gpus != 1):
            raise fail(f"--gpus must be >= 0 and --share in 1..{MILLI} (a share below {MILLI} needs --gpus 1)")
        return Request(gpus_per_node=gpus, gpu_milli=share, gpu_models=(model,) if model else ()), None
    pending = [w for w in state.pending if w.request.gpus_per_node > 0]
    if not pending:
        raise fail(f"{file}: no pending GPU workload; name one with --job or a shape with --gpus")
    return pending[0].request, pending[0].id


def plan(
    file: Path = typer.Argument(..., help="Snapshot file"),
    job: str = typer.Option(None, "--job", help="Plan for this pending workload (default: the oldest pending)"),
    gpus: int = typer.Option(None, "--gpus", help="Plan for a hypothetical request of this many GPUs"),
    model: str = typer.Option(None, "--model", help="GPU model of the hypothetical request"),
    share: int = typer.Option(MILLI, "--share", help="Per-GPU share of the hypothetical request, milli-GPU"),
    max_moves: int = typer.Option(8, "--max-moves", min=0, help="At most this many moves in the plan"),
    max_moves_per_node: int = typer.Option(8, "--max-moves-per-node", min=0, help="Moves touching one node"),
    all_pending: bool = typer.Option(False, "--all-pending", help="Plan for the K oldest pending jobs together"),
    k: int = typer.Option(None, "--k", min=1, help="With --all-pending: how many (default: all)"),
    solver: str = typer.Option("auto", "--solver", help="auto | exact | heuristic"),
    time_limit: float = typer.Option(2.0, "--time-limit", help="Exact solver time limit, seconds"),
    heartbeat: bool = typer.Option(False, "--heartbeat", help="Move from the last heartbeat checkpoint "
                                   "(loses the work since) instead of taking a fresh one"),
    costs: Path = typer.Option(None, "--costs", help="Cost file (JSON/YAML): bandwidths in GB/s, per-pair links, "
                               "measured migrations (see docs/planner.md)"),
    driver_rule: str = typer.Option("exact", "--driver-rule", help="exact | minor | major | at-least | any"),
    cuda_rule: str = typer.Option("exact", "--cuda-rule", help="exact | minor | major | at-least | any"),
    explain: bool = typer.Option(False, "--explain", help="Say why: excluded targets, rejected nodes, "
                                 "the alternatives (evict, drain)"),
    json_out: bool = JsonOpt,
) -> None:
    """The cheapest moves that free room for a pending job: each move with its cost, the totals, the node
    that becomes whole, and the GPU map before and after. Exit 1 with the reason when there is no plan."""
    state = load_snapshot(file)
    if solver not in ("auto", "exact", "heuristic"):
        raise fail(f"--solver must be auto, exact or heuristic, not {solver!r}")
    try:
        rule = CompatRule(driver=VersionMatch(driver_rule), cuda=VersionMatch(cuda_rule))
    except ValueError as e:
        raise fail(f"--driver-rule/--cuda-rule: {e}") from None
    if not time_limit > 0:
        raise fail("--time-limit must be > 0")
    cost_model = load_cost_model(costs) if costs is not None else CostModel()
    opts = PlanOptions(max_moves=max_moves, max_moves_per_node=max_moves_per_node, solver=solver,  # type: ignore[arg-type]
                       time_limit_s=time_limit, fresh_checkpoint=not heartbeat, compat=rule, cost_model=cost_model)
    if all_pending:
        plans = plan_all_pending(state, opts, k)
        if not plans:
            raise fail(f"{file}: no pending GPU workload", 1)
        if json_out:
            emit_json({"file": str(file), "plans": [p.as_dict() for p in plans]})
        else:
            for p in plans:
                console.rule(f"[bold]{escape(p.workload_id or 'request')}[/]")
                print_plan(state, p, explain=explain, maps=False)
        if not all(p.feasible for p in plans):
            raise typer.Exit(1)
        return
    request, wid = _pick_request(state, file, job, gpus, model, share)
    p = plan_moves(state, request, opts)
    if wid is not None:
        p = dataclasses.replace(p, workload_id=wid)
    if json_out:
        emit_json({"file": str(file), "plan": p.as_dict()})
    else:
        print_plan(state, p, explain=explain)
    if not p.feasible:
        raise typer.Exit(1)


def moves_table(p: Plan) -> Table:
    """One row per move: the workload, from → to [GPUs], the cost by phase (checkpoint + transfer + restore),
    work lost (only when moving from a heartbeat checkpoint), total seconds and GPU-seconds."""
    t = Table(title=f"plan for {escape(p.workload_id or 'the request')} ({escape(p.request.label())})",
              header_style="bold", show_footer=True, box=None, pad_edge=False)
    lost = any(m.cost.lost_work_s > 0 for m in p.moves)
    t.add_column("workload", footer="total", no_wrap=True)
    t.add_column("from → to [GPUs]", no_wrap=True)
    t.add_column("ckpt+xfer+rst", justify="right", no_wrap=True)
    if lost:
        t.add_column("lost s", justify="right")
    t.add_column("total s", justify="right", footer=f"{p.total_cost_s:.0f}")
    t.add_column("GPU-s", justify="right", footer=f"{p.total_gpu_s:.0f}")
    for m in p.moves:
        c = m.cost
        row = [escape(m.workload_id), f"{m.source} → {m.target} [{','.join(map(str, m.target_gpus))}]",
               f"{c.checkpoint_s:.0f}+{c.transfer_s:.0f}+{c.restore_s:.0f} s"]
        if lost:
            row.append(f"{c.lost_work_s:.0f}")
        t.add_row(*row, f"{c.total_s:.0f}", f"{c.gpu_s:.0f}")
    return t


def print_plan(state: ClusterState, p: Plan, *, explain: bool = False, maps: bool = True) -> None:
    """The plan as a table, the node that becomes whole, and the GPU maps before and after."""
    if not p.feasible:
        console.print(f"[bold red]no plan[/] for {escape(p.workload_id or p.request.label())}: {escape(p.reason)}")
        if explain:
            for line in p.explain:
                console.print(f"  {escape(line)}")
        return
    how = f"{p.solver}" + (", proven optimal" if p.optimal else "")
    if not p.moves:
        console.print(f"{escape(p.request.label())} fits now on {p.target_node}: nothing to move ({how})")
    else:
        console.print(moves_table(p))
        nodes = ", ".join(pl.node for pl in p.placements)
        console.print(f"[bold green]{nodes}[/] becomes able to host {escape(p.request.label())} after "
                      f"{len(p.moves)} move(s): {p.total_cost_s:.0f} s, {p.total_gpu_s:.0f} GPU-s ({how})")
        if p.evict_gpu_s is not None:
            console.print(f"evicting the same workloads instead would lose {p.evict_gpu_s:.0f} GPU-s")
    if explain:
        for line in p.explain:
            console.print(f"  {escape(line)}")
    if maps:
        after = placements_state(state, p, rid=p.workload_id or "request")
        touched = {m.source for m in p.moves} | {m.target for m in p.moves} | {pl.node for pl in p.placements}
        note = ""
        if len(state.nodes) > MAP_ALL_NODES_UP_TO:  # a big cluster: only the nodes the plan touches
            note = f" — the {len(touched)} nodes the plan touches, of {len(state.nodes)}"
            state, after = _focus(state, touched), _focus(after, touched)
        tags = workload_tags(state)
        after_tags = {**workload_tags(after), **tags}
        console.print(gpu_map(state, title=f"before{note}", tags=tags, highlight_nodes=touched))
        console.print(gpu_map(after, title=f"after (the request placed on {p.target_node}){note}", tags=after_tags,
                              highlight_nodes=[pl.node for pl in p.placements]))
        console.print(legend(after, after_tags))


MAP_ALL_NODES_UP_TO = 32


def _focus(state: ClusterState, names: set[str]) -> ClusterState:
    """The same cluster reduced to some nodes, for drawing only: workloads keep just their parts on those
    nodes (a multi-node job shows where it runs there), so this state is not validated and never planned on."""
    keep = [n for n in state.nodes if n.name in names]
    workloads = []
    for w in state.running:
        parts = tuple(pl for pl in w.placements if pl.node in names)
        if parts:
            workloads.append(dataclasses.replace(w, placements=parts))
    return ClusterState(tuple(keep), tuple(workloads), now=state.now, name=state.name)
