"""`gpudefrag plan`: the cheapest moves that let a pending job land, with each move's cost and a before/after
GPU map. Exit code 1 when no plan exists (with the reason), 2 for bad input."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import msgspec
import typer
from rich.markup import escape
from rich.table import Table

from ..core.compat import VersionMatch
from ..core.decision import MOVE, Decision, decide, decide_pending
from ..core.model import MILLI, ClusterState, Request, Workload
from ..core.planner import Plan, PlanOptions, placements_state
from ..policy.options import load_inputs, plan_options
from ..render import gpu_map, legend, workload_tags
from ..snapshot import load_snapshot
from .common import CostsOpt, JsonOpt, KeyOpt, PolicyOpt, StoreOpt, console, emit_json, fail
from .slurm_cmds import RunDirOpt, live_slurm


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)


def _pick_request(state: ClusterState, file: Path, job: str | None, gpus: int | None, model: str | None,
                  share: int) -> Workload | Request:
    if job is not None:
        if job not in state.workload_index:
            raise fail(f"{file}: no workload with id {job!r}")
        w = state.workload(job)
        if w.is_running:
            raise fail(f"{file}: workload {job!r} is running, not pending")
        return w
    if gpus is not None:
        if gpus < 1:
            raise fail(f"--gpus must be >= 1, got {gpus}")
        if not 1 <= share <= MILLI or (share < MILLI and gpus != 1):
            raise fail(f"--share must be in 1..{MILLI} (a share below {MILLI} needs --gpus 1)")
        return Request(gpus_per_node=gpus, gpu_milli=share, gpu_models=(model,) if model else ())
    pending = [w for w in state.pending if w.request.gpus_per_node > 0 or w.request.mig_profile is not None]
    if not pending:
        raise fail(f"{file}: no pending GPU workload; name one with --job or a shape with --gpus")
    return pending[0]


def build_options(policy: Path | None, costs: Path | None, *, max_moves: int | None = None,
                  max_moves_per_node: int | None = None, solver: str | None = None, time_limit: float | None = None,
                  heartbeat: bool = False, driver_rule: str | None = None, cuda_rule: str | None = None) -> PlanOptions:
    """The plan command's PlanOptions: the shared builder (policy, costs, compatibility rule) plus its flags."""
    if solver is not None and solver not in ("auto", "exact", "heuristic"):
        raise fail(f"--solver must be auto, exact or heuristic, not {solver!r}")
    if time_limit is not None and not time_limit > 0:
        raise fail("--time-limit must be > 0")
    inputs = load_inputs(policy, costs)
    rule = inputs.compat
    try:
        if driver_rule is not None:
            rule = dataclasses.replace(rule, driver=VersionMatch(driver_rule))
        if cuda_rule is not None:
            rule = dataclasses.replace(rule, cuda=VersionMatch(cuda_rule))
    except ValueError as e:
        raise fail(f"--driver-rule/--cuda-rule: {e}") from None
    return plan_options(inputs, max_moves=max_moves, max_moves_per_node=max_moves_per_node, solver=solver,
                        time_limit_s=time_limit, fresh_checkpoint=False if heartbeat else None, compat=rule)


def plan(
    file: Path = typer.Argument(None, help="Snapshot file (or --slurm)"),
    job: str = typer.Option(None, "--job", help="Plan for this pending workload (default: the oldest pending)"),
    gpus: int = typer.Option(None, "--gpus", help="Plan for a hypothetical request of this many GPUs (>= 1)"),
    model: str = typer.Option(None, "--model", help="GPU model of the hypothetical request"),
    share: int = typer.Option(MILLI, "--share", help="Per-GPU share of the hypothetical request, milli-GPU"),
    policy: Path = PolicyOpt,
    costs: Path = CostsOpt,
    plan_anyway: bool = typer.Option(False, "--plan-anyway", help="Plan even when an ordinary cause (quota, "
                                     "hold, limit...) keeps the job waiting"),
    max_moves: int = typer.Option(None, "--max-moves", min=0, help="At most this many moves (default: policy, 8)"),
    max_moves_per_node: int = typer.Option(None, "--max-moves-per-node", min=0, help="Moves touching one node"),
    all_pending: bool = typer.Option(False, "--all-pending", help="Plan for the K oldest pending jobs together"),
    k: int = typer.Option(None, "--k", min=1, help="With --all-pending: how many (default: all)"),
    solver: str = typer.Option(None, "--solver", help="auto | exact | heuristic (default auto)"),
    time_limit: float = typer.Option(None, "--time-limit", help="Exact solver time limit, seconds (default: "
                                     "the policy's planner_time_limit_s, 2)"),
    heartbeat: bool = typer.Option(False, "--heartbeat", help="Move from the last heartbeat checkpoint "
                                   "(loses the work since) instead of taking a fresh one"),
    driver_rule: str = typer.Option(None, "--driver-rule", help="exact | minor | major | at-least | any "
                                    "(overrides the policy's compat.driver)"),
    cuda_rule: str = typer.Option(None, "--cuda-rule", help="exact | minor | major | at-least | any "
                                  "(overrides the policy's compat.cuda)"),
    explain: bool = typer.Option(False, "--explain", help="Say why: excluded targets, rejected nodes, "
                                 "the alternatives (evict, drain, wait)"),
    slurm: bool = typer.Option(False, "--slurm", help="Plan on the live Slurm cluster (SLURM_CONF) with the "
                               "controller's options: its policy filter, only jobs under `gpudefrag run`"),
    run_dir: Path = RunDirOpt,
    store: Path = StoreOpt,
    key: Path = KeyOpt,
    json_out: bool = JsonOpt,
) -> None:
    """The cheapest moves that free room for a pending job: each move with its cost, the totals, the node
    that becomes whole, and the GPU map before and after. The diagnosis comes first: when an ordinary cause
    (a quota, a QOS limit, a hold) keeps the job waiting, no move can start it — exit 1 naming the cause
    (`--plan-anyway` plans regardless). Exit 1 with the reason when there is no plan."""
    if slurm == (file is not None):
        raise fail("give a snapshot file, or --slurm for the live Slurm cluster (not both)")
    opts = build_options(policy, costs, max_moves=max_moves, max_moves_per_node=max_moves_per_node, solver=solver,
                         time_limit=time_limit, heartbeat=heartbeat, driver_rule=driver_rule, cuda_rule=cuda_rule)
    if slurm:  # the controller's view and filter (wrapper-less jobs excluded, sizes from the store)
        live = live_slurm(policy, run_dir, store, key, costs)
        state = live.state
        opts = dataclasses.replace(opts, movable=live.options.movable, excluded_by=live.options.excluded_by)
        plan_anyway = plan_anyway or live.plan_anyway
        file = Path("slurm:" + os.environ.get("SLURM_CONF", "(default)"))
    else:
        state = load_snapshot(file)
    if all_pending:
        _plan_all(state, file, opts, k, plan_anyway, explain, json_out)
        return
    target = _pick_request(state, file, job, gpus, model, share)
    d = decide(state, target, opts, plan_anyway=plan_anyway)
    if json_out:
        emit_json({"file": str(file), "plan": d.plan.as_dict() if d.plan is not None else None,
                   "decision": d.as_dict()})
    else:
        print_decision(state, d, explain=explain)
    if not d.feasible:
        raise typer.Exit(1)


def _plan_all(state: ClusterState, file: Path, opts: PlanOptions, k: int | None, plan_anyway: bool, explain: bool,
              json_out: bool) -> None:
    """Decisions for the K oldest pending jobs together (`decision.decide_pending`): jobs an ordinary cause
    blocks are reported, not planned (unless --plan-anyway), and no room is reserved for them; each plan is
    shown with its priced alternatives."""
    decisions = decide_pending(state, opts, k=k, plan_anyway=plan_anyway)
    if not decisions:
        raise fail(f"{file}: no pending GPU workload", 1)
    if json_out:
        emit_json({"file": str(file), "decisions": [d.as_dict() for d in decisions],
                   "plans": [d.plan.as_dict() for d in decisions if d.plan is not None],
                   "blocked": [d.as_dict() for d in decisions if d.blocked]})
    else:
        for d in decisions:
            console.rule(f"[bold]{escape(d.workload_id or 'request')}[/]")
            print_decision(state, d, explain=explain, maps=False)
    if not all(d.feasible for d in decisions):
        raise typer.Exit(1)


def print_decision(state: ClusterState, d: Decision, *, explain: bool = False, maps: bool = True) -> None:
    """The decision: blocked (the causes), or the plan with its priced alternatives and the one chosen."""
    who = escape(d.workload_id or d.request.label())
    if d.blocked:
        console.print(f"[bold red]no plan[/] for {who}: {escape(d.reason)}")
        for i, c in enumerate(d.causes, 1):
            console.print(f"  {i}. [cyan]{c.code.value}[/]: {escape(c.summary)}")
        console.print("  moving jobs cannot start it; --plan-anyway plans regardless")
        return
    if d.planned_anyway:
        codes = ", ".join(c.code.value for c in d.blocked_by)
        console.print(f"[yellow]planned anyway[/]: {codes} still keep(s) {who} waiting after these moves")
    assert d.plan is not None
    print_plan(state, d.plan, explain=explain, maps=maps)
    if d.options:
        console.print("options: " + "; ".join(
            f"{'[bold green]' if o.cheapest else ''}{o.kind} {o.gpu_s:.0f} GPU-s"
            f"{' (cheapest)[/]' if o.cheapest else ''}" if o.known else f"{o.kind} unknown ({escape(o.detail)})"
            for o in d.options))
        if d.chosen != MOVE:
            console.print(f"[bold]chosen: {d.chosen}[/] — {escape(d.reason)}")


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
            workloads.append(msgspec.structs.replace(w, placements=parts))
    return ClusterState(tuple(keep), tuple(workloads), now=state.now, name=state.name)
