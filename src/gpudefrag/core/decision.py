"""The one decision: for a pending request, why it waits and what (if anything) to do about it.

`decide` is what every entry point calls (`gpudefrag plan` and `diagnose`, the controller with every engine, the
dashboard's plan preview, `kube plan`), so the same cluster gets the same answer whichever door it comes in by:

1. the diagnosis, ordinary causes first, each with its evidence;
2. only when fragmentation is the sole cause (or the request fits already), or when the caller explicitly asks to
   plan anyway, the cheapest plan of moves — moving jobs cannot start a job a quota or a hold keeps waiting;
3. the priced alternatives to those moves (evict the same jobs, drain the node, wait for their known end), the
   cheapest one flagged and chosen: when evicting a job that would lose minutes of work is cheaper than moving
   its 600 GB checkpoint, the decision says so and chooses the eviction.

Workloads marked immovable (the snapshot's `movable: false`, the `gpudefrag.io/movable: "false"` label,
multi-node jobs) never move, whatever filter the caller passes: the planner itself refuses them
(`planner_problem.Problem.why_not_movable`). Pure: no clocks, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .cost import AltCost, CostModel, alternatives, gpu_equivalents
from .diagnose import Cause, Diagnosis, diagnose, diagnose_all, diagnose_request
from .model import ClusterState, Request, Workload
from .planner import Plan, PlanOptions, plan_moves, plans_in_turn

MOVE = "move"


@dataclass(frozen=True)
class Option:
    """One way to make room: move (the plan), evict, drain or wait, with its price in GPU-seconds."""

    kind: str
    gpu_s: float
    seconds: float
    known: bool = True
    detail: str = ""
    cheapest: bool = False

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "gpu_s": self.gpu_s if self.known else None,
                "seconds": self.seconds if self.known else None, "known": self.known, "detail": self.detail,
                "cheapest": self.cheapest}


@dataclass(frozen=True)
class Decision:
    """The diagnosis, the plan (None when an ordinary cause blocks and nobody asked to plan anyway), the priced
    options and the one chosen ("move", "evict", "drain", "wait"; "none" when nothing is to be done or nothing
    can help). `blocked_by` lists the ordinary causes that keep the job waiting whatever moves."""

    diagnosis: Diagnosis
    plan: Plan | None
    options: tuple[Option, ...] = ()
    chosen: str = "none"
    planned_anyway: bool = False

    @property
    def workload_id(self) -> str | None:
        return self.diagnosis.workload_id

    @property
    def request(self) -> Request:
        return self.diagnosis.request

    @property
    def causes(self) -> tuple[Cause, ...]:
        return self.diagnosis.causes

    @property
    def blocked_by(self) -> tuple[Cause, ...]:
        return self.diagnosis.blocking

    @property
    def blocked(self) -> bool:
        """An ordinary cause keeps the job waiting and no plan was asked for regardless."""
        return bool(self.blocked_by) and self.plan is None

    @property
    def feasible(self) -> bool:
        return self.plan is not None and self.plan.feasible

    @property
    def reason(self) -> str:
        """One sentence: why there is no plan, or what is chosen."""
        if self.blocked:
            c = self.blocked_by[0]
            return f"blocked by {c.code.value}: {c.summary}"
        if self.plan is None:
            return "nothing to plan"
        if not self.plan.feasible:
            return self.plan.reason
        if self.chosen not in (MOVE, "none"):
            best = next(o for o in self.options if o.kind == self.chosen)
            move = next(o for o in self.options if o.kind == MOVE)
            return (f"{self.chosen} is cheaper than moving: {best.gpu_s:.0f} GPU-s against {move.gpu_s:.0f} GPU-s "
                    f"({best.detail})")
        return ""

    def as_dict(self) -> dict[str, object]:
        return {
            "workload": self.workload_id,
            "request": self.request.label(),
            "causes": [c.as_dict() for c in self.causes],
            "blocked_by": [c.code.value for c in self.blocked_by],
            "planned_anyway": self.planned_anyway,
            "chosen": self.chosen,
            "reason": self.reason,
            "options": [o.as_dict() for o in self.options],
            "plan": self.plan.as_dict() if self.plan is not None else None,
        }


def should_plan(d: Diagnosis, plan_anyway: bool = False) -> bool:
    """Plan only when fragmentation is the sole blocker or the request fits already — or when asked to."""
    return plan_anyway or not d.blocking


def decide(
    state: ClusterState,
    target: Workload | Request,
    options: PlanOptions | None = None,
    *,
    plan_anyway: bool = False,
    diagnosis: Diagnosis | None = None,
    plan: bool = True,
) -> Decision:
    """The decision for a pending workload (or a hypothetical request): causes, then maybe a plan and its priced
    alternatives, the cheapest chosen. `diagnosis` may be passed when the caller has it already; `plan=False`
    stops after the diagnosis."""
    opts = options or PlanOptions()
    if diagnosis is None:  # evidence counts only what the planner may move (its filter)
        diagnosis = (diagnose(state, target, movable=opts.movable) if isinstance(target, Workload)
                     else diagnose_request(state, target, movable=opts.movable))
    request = target.request if isinstance(target, Workload) else target
    if not plan or not should_plan(diagnosis, plan_anyway):
        return Decision(diagnosis, None)
    return _planned(state, target, request, opts, diagnosis)


def _planned(state: ClusterState, target: Workload | Request, request: Request, opts: PlanOptions,
             diagnosis: Diagnosis) -> Decision:
    if request.mig_profile is not None:
        plan = Plan(request, (), None, False, "MIG slices are not planned: moving whole-GPU jobs does not free a "
                    "MIG slice", "none", False, 0.0, 0.0)
    else:
        plan = plan_moves(state, request, opts)
    if isinstance(target, Workload):
        plan = dataclasses.replace(plan, workload_id=target.id)
    return _priced_decision(state, request, plan, opts, diagnosis)


def _priced_decision(state: ClusterState, request: Request, plan: Plan, opts: PlanOptions,
                     diagnosis: Diagnosis) -> Decision:
    """The decision for a plan made on `state`: its moves priced against evicting, draining and waiting."""
    planned_anyway = bool(diagnosis.blocking)
    if not plan.feasible:
        excluded = exclusions(state, opts)
        if excluded:  # say which filter kept how many jobs from moving
            plan = dataclasses.replace(plan, reason=f"{plan.reason}; {excluded}")
    if not plan.feasible or not plan.moves:
        return Decision(diagnosis, plan, (), "none", planned_anyway)
    moved = [state.workload(m.workload_id) for m in plan.moves]
    cost = opts.cost_model or CostModel()
    alts = alternatives(gpu_equivalents_of(request), moved, state.now, cost)
    options_ = _priced(plan, alts)
    chosen = next(o.kind for o in options_ if o.cheapest)
    return Decision(diagnosis, plan, options_, chosen, planned_anyway)


def exclusions(state: ClusterState, opts: PlanOptions) -> str:
    """Which of the running jobs may not move, and why, counted: "0 of 5 running jobs may move (excluded: 5 by
    filter.max_priority <= 10000)"; "" when every running job may move."""
    why: dict[str, int] = {}
    running = state.running
    allowed = state.may_move(opts.movable)
    for i in np.flatnonzero(~allowed).tolist():  # the excluded ones only (a replay has 4,000 running jobs)
        w = running[i]
        if w.is_multi_node:
            reason: str | None = "multi-node (never moved)"
        elif not w.can_move:
            reason = "marked not movable"
        else:
            reason = (opts.excluded_by(w) if opts.excluded_by is not None else None) or "the policy filter"
        why[reason] = why.get(reason, 0) + 1
    if not why:
        return ""
    parts = ", ".join(f"{n} by {r}" for r, n in sorted(why.items(), key=lambda x: (-x[1], x[0])))
    return f"{len(running) - sum(why.values())} of {len(running)} running jobs may move (excluded: {parts})"


def decide_all(state: ClusterState, ids: Iterable[str] | None = None, options: PlanOptions | None = None, *,
               plan: bool = True, plan_anyway: bool = False) -> list[Decision]:
    """Decisions for every pending GPU workload (or those named), oldest first; `plan=False` stops after the
    diagnosis (what `gpudefrag diagnose` shows), sharing one diagnosis context over all of them."""
    out = []
    for d in diagnose_all(state, ids, movable=options.movable if options is not None else None):
        if not plan:
            out.append(Decision(d, None))
            continue
        assert d.workload_id is not None
        out.append(decide(state, state.workload(d.workload_id), options, plan_anyway=plan_anyway, diagnosis=d))
    return out


def decide_pending(state: ClusterState, options: PlanOptions | None = None, *, k: int | None = None,
                   plan_anyway: bool = False) -> list[Decision]:
    """Decisions for the k oldest pending GPU workloads together (all when k is None), oldest first: each
    diagnosed once; those an ordinary cause blocks are not planned (unless `plan_anyway`) and get no room; the
    others are planned in turn (`planner.plans_in_turn`: each on the state the earlier plans leave, no
    workload moved twice), and each plan is priced against its alternatives as `decide` prices one."""
    opts = options or PlanOptions()
    diagnoses = [d for d in diagnose_all(state) if d.request.gpus_per_node > 0]
    if k is not None:
        diagnoses = diagnoses[:k]
    by_id = {d.workload_id: d for d in diagnoses}
    out: dict[str | None, Decision] = {d.workload_id: Decision(d, None) for d in diagnoses
                                       if not should_plan(d, plan_anyway)}
    todo = [state.workload(str(d.workload_id)) for d in diagnoses if d.workload_id not in out]
    for before, plan in plans_in_turn(state, todo, opts):
        d = by_id[plan.workload_id]
        out[d.workload_id] = _priced_decision(before, d.request, plan, opts, d)
    return [out[d.workload_id] for d in diagnoses]


def gpu_equivalents_of(r: Request) -> float:
    """The GPUs a request would hold (a share counted as its fraction)."""
    return gpu_equivalents(Workload(id="request", request=r))


def _priced(plan: Plan, alts: tuple[AltCost, ...]) -> tuple[Option, ...]:
    """The move and its alternatives; the cheapest known one flagged (a tie goes to the move, listed first)."""
    opts = [Option(MOVE, plan.total_gpu_s, plan.total_cost_s, True,
                   f"{len(plan.moves)} move(s) with their state")]
    opts += [Option(a.kind, a.gpu_s, a.seconds, a.known, a.detail) for a in alts]
    best = min((o for o in opts if o.known), key=lambda o: o.gpu_s)
    return tuple(dataclasses.replace(o, cheapest=o is best) for o in opts)

