"""The defrag planner: the cheapest moves that let a pending request be placed, and a replay that proves them.

`plan_moves` runs the fast heuristic (planner_heuristic), then (solver "auto" when the model is small enough,
or "exact") the exact search (planner_exact: lower bounds per target node, CP-SAT where they do not settle
it), starting from the heuristic's plan; the exact plan is used whenever it is found within the time budget, and
the plan says which solver produced it and whether it is proven optimal. Every plan is replayed move by move
(`replay`) before it is returned, so a plan that exceeds any capacity at any step is never handed out.
Pure: no clocks, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from operator import attrgetter

import msgspec
import numpy as np

from .capacity import Capacity, Shape
from .cost import AltCost
from .fragmentation import eligible_mask
from .model import MILLI, ClusterState, Placement, Request, Workload, WorkloadState
from .planner_heuristic import solve as solve_heuristic
from .planner_problem import RESERVATION_LABEL, Part, Problem, Work, capacity_proof, parts_of
from .planner_types import Move, Plan, PlanOptions, Solver

__all__ = [
    "Move",
    "MoveError",
    "Plan",
    "PlanOptions",
    "Solver",
    "apply_moves",
    "fits_after",
    "placements_state",
    "plan_all_pending",
    "plan_for",
    "plan_moves",
    "plans_in_turn",
    "replay",
    "with_reservation",
]


class MoveError(ValueError):
    """A move that cannot be applied to the state (unknown workload, wrong source, no room)."""


# ---------------------------------------------------------------------------------------------- replay
def apply_moves(state: ClusterState, moves: Iterable[Move]) -> ClusterState:
    """The state after the moves, applied one by one. Raises MoveError naming the first move that is invalid
    or would exceed a GPU, CPU or memory capacity at the moment it is made."""
    current, _free, _cpu, _mem = replay(state, moves)
    return state.with_workloads(current.values())


def replay(
    state: ClusterState, moves: Iterable[Move]
) -> tuple[dict[str, Workload], np.ndarray, np.ndarray, np.ndarray]:
    """Apply the moves one by one to the capacity model, checking each; returns the workloads after and the
    free GPU, CPU and memory arrays (without building a new ClusterState, which large clusters pay for)."""
    moved, free, cpu, mem, _cap = _replay(state, moves)
    return {w.id: moved.get(w.id, w) for w in state.workloads}, free, cpu, mem


def _replay(state: ClusterState, moves: Iterable[Move]) -> tuple[dict[str, Workload], np.ndarray, np.ndarray,
                                                                  np.ndarray, Capacity]:
    """The moves applied to the capacity model, each checked: (the moved workloads as they are after, by id,
    the free arrays, the capacity model)."""
    cap = Capacity.of_state(state)
    moved: dict[str, Workload] = {}
    index = state.workload_index
    seen: set[str] = set()
    for k, m in enumerate(moves):
        where = f"move {k + 1} ({m.workload_id} {m.source} -> {m.target})"
        i = index.get(m.workload_id)
        w = None if i is None else state.workloads[i]
        if w is None or not w.is_running:
            raise MoveError(f"{where}: no running workload {m.workload_id!r}")
        if m.workload_id in seen:
            raise MoveError(f"{where}: moves a workload twice")
        seen.add(m.workload_id)
        if w.is_multi_node:
            raise MoveError(f"{where}: multi-node workloads never move")
        if w.placements[0].node != m.source:
            raise MoveError(f"{where}: it runs on {w.placements[0].node}, not {m.source}")
        if m.target not in state.node_index or m.target == m.source:
            raise MoveError(f"{where}: bad target node {m.target!r}")
        r = w.request
        shape = Shape.of(r)
        s, t = state.node_index[m.source], state.node_index[m.target]
        gpus = tuple(m.target_gpus)
        if len(gpus) != r.gpus_per_node or len(set(gpus)) != len(gpus):
            raise MoveError(f"{where}: needs {r.gpus_per_node} distinct GPUs, got {list(gpus)}")
        cap.give(s, w.placements[0].gpus, shape)
        for g in gpus:
            if not cap.fits_at(t, (g,), Shape(1, r.gpu_milli)):
                raise MoveError(f"{where}: GPU {g} of {m.target} has no room for {r.gpu_milli} milli")
        if not cap.room_on(t, shape):
            raise MoveError(f"{where}: {m.target} has not enough CPU or memory")
        cap.take(t, gpus, shape)
        moved[w.id] = msgspec.structs.replace(w, placements=(Placement(m.target, gpus),))
    return moved, cap.free, cap.cpu_free, cap.mem_free, cap


def with_reservation(state: ClusterState, rid: str, request: Request, placements: Sequence[Placement]) -> ClusterState:
    """The state with a request placed (as a running workload named `rid`), for planning the next request."""
    res = Workload(id=rid, request=request, state=WorkloadState.RUNNING, placements=tuple(placements),
                   labels={RESERVATION_LABEL: "true"})
    if rid in state.workload_index:  # the pending workload itself: it starts running there
        old = state.workload(rid)
        res = msgspec.structs.replace(old, state=WorkloadState.RUNNING, placements=tuple(placements))
        return state.with_workloads(res if w.id == rid else w for w in state.workloads)
    return state.with_workloads([*state.workloads, res])


def fits_after(state: ClusterState, moves: Sequence[Move], request: Request,
               placements: Sequence[Placement]) -> bool:
    """Whether, after the moves (each checked as it is made), the request fits on `placements`: one distinct
    eligible node per part, its GPUs with room for the share, and its CPU and memory."""
    cap = _replay(state, moves)[4]
    if len(placements) != request.node_count or len({p.node for p in placements}) != len(placements):
        return False
    eligible = eligible_mask(state, request)
    shape = Shape.of(request)
    for p in placements:
        i = state.node_index.get(p.node)
        if i is None or not eligible[i]:
            return False
        try:
            cap.take(i, tuple(p.gpus), shape)
        except ValueError:
            return False
    return True


# ---------------------------------------------------------------------------------------------- building plans
def _infeasible(request: Request, reason: str, solver: str, explain: Sequence[str] = ()) -> Plan:
    return Plan(request, (), None, False, reason, solver, False, 0.0, 0.0, tuple(explain))


def plan_from_work(p: Problem, work: Work, request: Request, solver: str, optimal: bool,
                   notes: Sequence[str] = (), method: str = "") -> Plan:
    """Turn a solver's working state into a Plan, replaying it to prove it."""
    moves: list[Move] = []
    for wi in work.order:
        dst, gpus = work.moved[wi]
        src = int(p.src[wi])
        ev, dr = p.alternatives(wi)
        moves.append(Move(p.label(wi), p.name(src), p.name(dst), gpus, p.move_cost(wi, src, dst), ev, dr))
    placements = tuple(Placement(p.name(i), g) for _part, i, g in work.reserved)
    if not fits_after(p.state, moves, request, placements):  # pragma: no cover - a solver bug, not user error
        raise AssertionError(f"{solver} produced a plan after which {request.label()} does not fit")
    return _finish(p, request, tuple(moves), placements, solver, optimal, notes, method)


def _finish(p: Problem, request: Request, moves: tuple[Move, ...], placements: tuple[Placement, ...],
            solver: str, optimal: bool, notes: Sequence[str], method: str) -> Plan:
    total_s = sum(m.cost.total_s for m in moves)
    total_gpu_s = sum(m.cost.gpu_s for m in moves)
    evict = sum(m.evict.gpu_s for m in moves if m.evict) if moves else None
    drain = max((m.drain.seconds for m in moves if m.drain), default=0.0) if moves else None
    explain: list[str] = [f"solver: {solver}" + (" (proven optimal)" if optimal else "")]
    if method:
        explain.append(method)
    target = placements[0].node if placements else None
    if target is not None:
        i = p.state.node_index[target]
        whole = int((p.state.free_milli[i] >= MILLI).sum())
        explain.append(f"{request.label()} lands on {', '.join(pl.node for pl in placements)} "
                       f"({whole}/{p.state.nodes[i].usable_gpus} GPUs of {target} free before the plan)")
    order = list(map(attrgetter("id"), p.ws)) if moves else []  # a few moves: found at C speed, no dict of all
    for m in moves:
        wi = order.index(m.workload_id)
        alt = _alt_text(m.evict, m.drain)
        explain.append(f"move {m.workload_id} {m.source} -> {m.target}: {m.cost.total_s:.0f} s, "
                       f"{m.cost.gpu_s:.0f} GPU-s ({alt})")
        refused = p.excluded_by_compat(wi)
        if refused:
            explain.append(f"  {m.workload_id}: excluded targets: " + "; ".join(refused))
    explain.extend(f"not chosen: {n}" for n in notes)
    return Plan(request, moves, target, True, "", solver, optimal, total_s, total_gpu_s, tuple(explain),
                placements=placements, evict_gpu_s=evict, drain_s=drain)


def _alt_text(ev: AltCost | None, dr: AltCost | None) -> str:
    parts = []
    if ev is not None:
        parts.append(f"evicting instead: {ev.gpu_s:.0f} GPU-s")
    if dr is not None:
        parts.append(f"draining: {dr.seconds:.0f} s" if dr.known else "draining: end unknown")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------- entry points
def plan_moves(state: ClusterState, request: Request, options: PlanOptions | None = None) -> Plan:
    """The cheapest moves found that let `request` be placed (one plan for all its nodes)."""
    return _plan_parts(state, [request], options or PlanOptions())[0]


def plan_for(state: ClusterState, workload_id: str, options: PlanOptions | None = None) -> Plan:
    """`plan_moves` for a pending workload of the state, by id."""
    w = state.workload(workload_id)
    plan = plan_moves(state, w.request, options)
    return dataclasses.replace(plan, workload_id=workload_id)


def _plan_parts(state: ClusterState, requests: list[Request], opts: PlanOptions) -> list[Plan]:
    p = Problem(state, opts)
    parts = parts_of(state, requests)
    heur = solve_heuristic(p, parts)
    exact_plan = None
    request = requests[0]
    if opts.solver != "heuristic" and heur.work is None:
        proof = capacity_proof(p, parts)  # counting: no node can be cleared, before any CP-SAT search
        if proof:
            return [_infeasible(request, f"{heur.reason} (proven: {proof})", "exact", heur.notes)]
    if opts.solver != "heuristic":
        from .planner_exact import solve_exact  # OR-Tools is imported only when the exact solver runs

        if opts.solver == "exact" or _exact_size(p, parts) <= opts.exact_max_vars:
            ex = solve_exact(p, parts, heur.work)
            if ex.infeasible:
                exact_plan = _infeasible(request, ex.reason, "exact")
            elif ex.work is not None:
                exact_plan = plan_from_work(p, ex.work, request, "exact", ex.optimal, method=ex.method)
    if (
        exact_plan is not None
        and exact_plan.feasible
        and (heur.work is None or exact_plan.optimal or exact_plan.score <= heur.work.score + 1e-6)
    ):
        return [exact_plan]
    if heur.work is None:
        if exact_plan is not None and not exact_plan.feasible:  # proven: keep the heuristic's specific reason
            proof = " (no plan within the move budgets exists: proven by the exact solver)"
            reason = heur.reason + (proof if heur.reason.startswith("no node can be cleared") else "")
            return [_infeasible(request, reason, "exact", heur.notes)]
        return [_infeasible(request, heur.reason, "heuristic", heur.notes)]
    return [plan_from_work(p, heur.work, request, "heuristic", False, heur.notes)]


def _exact_size(p: Problem, parts: list[Part]) -> int:
    """A rough measure of the exact model's size (movable workloads × nodes); a request with several parts
    gets one CP-SAT model over all nodes at once, which is far harder to prove, so it weighs 30 times more."""
    n = len(p.state.nodes)
    size = int((~p.multi).sum()) * n + len(parts) * n
    return size if len(parts) == 1 else 30 * size


def plans_in_turn(state: ClusterState, pending: Iterable[Workload],
                  options: PlanOptions | None = None) -> Iterator[tuple[ClusterState, Plan]]:
    """A plan for each workload in turn, each on the state the previous ones leave (their moves made and their
    requests placed), so no workload moves twice and the moves of all plans together leave room for every
    feasible request at once. Yields (the state the plan was made on, the plan); `max_moves` bounds each."""
    opts = options or PlanOptions()
    moved: set[str] = set()
    current = state
    base_filter = opts.movable
    for w in pending:
        def movable(x: Workload, _f=base_filter) -> bool:
            if x.id in moved or x.labels.get(RESERVATION_LABEL) == "true":
                return False
            return _f is None or _f(x)

        plan = plan_moves(current, w.request, dataclasses.replace(opts, movable=movable))
        plan = dataclasses.replace(plan, workload_id=w.id)
        yield current, plan
        if plan.feasible:
            current = apply_moves(current, plan.moves)
            moved.update(m.workload_id for m in plan.moves)
            current = with_reservation(current, f"reserved:{w.id}", w.request, plan.placements)


def plan_all_pending(state: ClusterState, options: PlanOptions | None = None, k: int | None = None) -> list[Plan]:
    """Plans for the k oldest pending GPU requests (all when k is None), in turn (`plans_in_turn`): the plans
    alone, without the diagnosis or the priced alternatives (`decision.decide_pending` adds both)."""
    pending = [w for w in state.pending if w.request.gpus_per_node > 0]
    return [p for _, p in plans_in_turn(state, pending[:k] if k is not None else pending, options)]


def placements_state(state: ClusterState, plan: Plan, rid: str = "request") -> ClusterState:
    """The state after the plan with the request itself placed (for the after-map)."""
    after = apply_moves(state, plan.moves)
    if not plan.placements:
        return after
    return with_reservation(after, rid, plan.request, plan.placements)
