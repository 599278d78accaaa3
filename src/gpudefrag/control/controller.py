"""The controller loop: observe → trigger → filter → plan → execute, one `cycle()` at a time.

Each cycle advances the migrations already in flight, then evaluates the policy's triggers on a fresh
observation; for each trigger that fires it plans (only workloads the policy's filter allows may move, none
already moving) and hands the moves to the executor, which journals them and applies the disruption budget.
Every decision is logged with its reason, and journaled when not a dry run. A dry run plans and reports but
never calls an engine action and never writes the journal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ..core.cost import CostModel
from ..core.decision import MOVE, Decision, decide
from ..core.model import ClusterState, Request, Workload
from ..core.planner import Plan, PlanOptions
from ..engines.base import Engine
from ..policy.models import Policy
from ..policy.options import PlanInputs, plan_options
from ..policy.triggers import Target, TriggerContext, evaluate, pending_due
from .executor import Executor
from .plans import MADE, OpenPlan, PlannedMove, new_plan_id, open_plans, outcome


@dataclass
class CycleEvent:
    """One thing a cycle did, or chose not to do, and why (a row of its report). Not `core.decision.Decision`,
    the decision for one pending job, which a cycle's `plan`/`skip`/`alternative` events report on."""

    # trigger | skip | plan | submit | defer | dry-run | error | progress | alternative, and for a started plan
    # (gpudefrag.control.plans): plan-started | plan-waiting | plan-finished | plan-stopped | plan-not-started
    kind: str
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "reason": self.reason, **self.detail}


@dataclass
class CycleReport:
    at: float
    nodes: int
    running: int
    pending: int
    decisions: list[CycleEvent]
    plans: list[Plan]
    in_flight: int
    duration_s: float
    dry_run: bool
    open_plans: list[dict[str, Any]] = field(default_factory=list)  # started plans not yet finished or stopped

    def as_dict(self) -> dict[str, Any]:
        return {"at": self.at, "nodes": self.nodes, "running": self.running, "pending": self.pending,
                "in_flight": self.in_flight, "duration_s": round(self.duration_s, 4), "dry_run": self.dry_run,
                "open_plans": self.open_plans,
                "decisions": [d.as_dict() for d in self.decisions], "plans": [p.as_dict() for p in self.plans]}


SETTLE_S = 60.0  # after a plan finished, its pending workload is left to the scheduler this long before replanning


class Controller:
    def __init__(self, engine: Engine, policy: Policy, executor: Executor | None, *, dry_run: bool = False,
                 clock: Callable[[], float] = time.time, log: Callable[[str], None] | None = None,
                 enrich: Callable[[ClusterState], ClusterState] | None = None,
                 request_file: Path | None = None,
                 can_checkpoint: Callable[[Workload], bool] | None = None,
                 costs: CostModel | None = None, plan_anyway: bool = False) -> None:
        if executor is None and not dry_run:
            raise ValueError("a controller that acts needs an executor")
        self.engine = engine
        self.policy = policy
        self.executor = executor
        self.dry_run = dry_run
        self.clock = clock
        self.log = log or (lambda _m: None)
        self.enrich = enrich
        self.request_file = request_file
        self.can_checkpoint = can_checkpoint  # e.g. "runs under the wrapper": only such jobs can be moved
        self.plan_anyway = plan_anyway  # `--plan-anyway`: move even for a job a hold or a limit keeps waiting
        self.inputs = PlanInputs(policy, costs or CostModel())  # the same PlanOptions builder as `plan`
        self._requested = False
        self._last_cron: float | None = None
        self._last_keys: set[tuple[str, str, str]] = set()
        # started plans carried across cycles until every move is made (or one fails); a restarted controller
        # takes up the ones its predecessor left from the journal
        self.plans: dict[str, OpenPlan] = {}
        self._finished: dict[str, float] = {}  # pending workload -> when the plan for it finished
        if executor is not None and not dry_run:
            self.plans = {p.id: p for p in open_plans(executor.journal, now=clock())}
        self.next_due: float | None = None  # when a pending job becomes old enough for the trigger (clock time)
        self._options: dict[frozenset[str], PlanOptions] = {}  # this cycle's options, by busy set (see options)

    def request(self) -> None:
        """An explicit request (`controller --once`, a `--request-file` appearing): the next cycle evaluates the
        policy as if a trigger fired."""
        self._requested = True

    # ------------------------------------------------------------------ one cycle
    def cycle(self, *, plan_new: bool = True) -> CycleReport:
        """One cycle. `plan_new=False` only advances what is started (migrations in flight, started plans):
        what `controller --once` runs after its one cycle until the plan it started is finished or stopped."""
        t0 = time.perf_counter()
        decisions: list[CycleEvent] = []
        plans: list[Plan] = []
        if self.can_checkpoint is not None or len(self._options) > 8:
            self._options = {}  # a new cycle: the wrappers may have changed (the busy jobs are the key)
        if self.executor is not None and not self.dry_run:
            for m in self.executor.tick():
                decisions.append(CycleEvent("progress", f"migration {m.id} of {m.workload_id}: {m.state.value}",
                                          {"migration": m.id, "state": m.state.value, "why": m.reason}))
        state = self.observe()
        now = self.clock()
        self._carry(state, decisions)
        targets = self.triggers(state, now, decisions) if plan_new else []
        if targets and self.policy.action.kind == "never":
            decisions.append(CycleEvent("skip", "policy action is 'never': diagnosis and plans are reported only"))
        busy = self.executor.busy_workloads() if self.executor is not None else set()
        busy |= {m.workload_id for p in self.plans.values() for m in p.remaining()}
        planned_for = self._in_flight_for()
        started = 0  # plans started (or, dry run, that would be): the targets after the budget's are left
        # the asks (`Target.ask`) that found no feasible plan this cycle: a later target asking the same gets the
        # same answer, so it is not planned again; many pending jobs of one shape would otherwise spend the
        # cycle's tries on one question
        no_plan: list[tuple[Request, bool]] = []
        for t in targets:
            if started >= self.policy.budgets.max_plans_per_cycle:
                break
            if t.workload_id is not None and t.workload_id in planned_for:
                decisions.append(CycleEvent("skip", f"moves for {t.workload_id} are already in flight",
                                          {"workload": t.workload_id}))
                continue
            since = now - self._finished.get(t.workload_id or "", -SETTLE_S)
            if t.workload_id is not None and since < SETTLE_S:
                decisions.append(CycleEvent("skip", f"the plan for {t.workload_id} finished {since:.0f} s ago: the "
                                          "scheduler has the freed node to place it; no new plan before "
                                          f"{SETTLE_S:g} s", {"workload": t.workload_id}))
                continue
            if t.ask in no_plan:
                decisions.append(CycleEvent("skip", f"{t.why}: no plan this cycle for the same request "
                                          f"({t.request.label()})", {"workload": t.workload_id}))
                continue
            choice = self.decide(state, t, busy)
            if choice.plan is None:
                decisions.append(CycleEvent("skip", f"{t.why}: {choice.reason}", {"workload": t.workload_id}))
                continue
            plan = choice.plan
            plans.append(plan)
            if not plan.feasible:
                no_plan.append(t.ask)
                decisions.append(CycleEvent("plan", f"no plan for {t.why}: {plan.reason}",
                                          {"workload": t.workload_id, "feasible": False}))
                continue
            if choice.chosen not in (MOVE, "none"):
                decisions.append(CycleEvent("alternative", f"{t.why}: {choice.reason}; nothing moved",
                                          {"workload": t.workload_id, "chosen": choice.chosen,
                                           "options": [o.as_dict() for o in choice.options]}))
                continue
            moves = [f"{m.workload_id} {m.source}->{m.target}" for m in plan.moves]
            decisions.append(CycleEvent("plan", f"{t.why}: {len(plan.moves)} move(s) free {plan.target_node} "
                                      f"({plan.total_cost_s:.0f} s, {plan.solver})",
                                      {"workload": t.workload_id, "moves": moves, "target_node": plan.target_node}))
            if self.policy.action.kind == "never":
                continue
            started += 1
            if self.dry_run:
                decisions.append(CycleEvent("dry-run", f"would move {', '.join(moves) or 'nothing'}",
                                          {"workload": t.workload_id, "moves": moves}))
                continue
            self._start(plan, t.workload_id, t.why, busy, decisions)
        report = CycleReport(now, len(state.nodes), len(state.running), len(state.pending), decisions, plans,
                             len(self.executor.active()) if self.executor is not None else 0,
                             time.perf_counter() - t0, self.dry_run, [p.as_dict() for p in self.plans.values()])
        # log and journal a decision when it is new, not every cycle it repeats (a job pending for an hour would
        # otherwise write "trigger ... / skip: in flight" every few seconds)
        keys = set()
        for d in decisions:
            key = (d.kind, str(d.detail.get("workload") or d.detail.get("migration") or d.reason),
                   str(d.detail.get("state", "")))
            keys.add(key)
            if key in self._last_keys:
                continue
            self.log(f"{d.kind}: {d.reason}")
            if self.executor is not None and not self.dry_run and d.kind != "progress":
                self.executor.journal.event(d.kind, d.as_dict())
        self._last_keys = keys
        return report

    # ------------------------------------------------------------------ started plans
    def _start(self, plan: Plan, for_workload: str | None, why: str, busy: set[str],
               decisions: list[CycleEvent]) -> None:
        """Start a plan, or do not: a plan the hourly budget cannot finish is not started; otherwise its first
        moves are journaled (as many as the budget admits now, in the plan's order) and the rest carried."""
        assert self.executor is not None
        moves = [PlannedMove.of(m) for m in plan.moves]
        cfg = self.executor.config
        if cfg.max_per_hour is not None:
            left = cfg.max_per_hour - self.executor.journal.started_since(self.clock() - 3600)
            if len(moves) > left:
                decisions.append(CycleEvent("plan-not-started", f"plan for {for_workload or plan.target_node} not "
                                          f"started: it needs {len(moves)} move(s) and the budget allows "
                                          f"{max(left, 0)} more this hour (max_per_hour {cfg.max_per_hour})",
                                          {"workload": for_workload}))
                return
        op = OpenPlan(new_plan_id(), for_workload, plan.target_node, why, tuple(moves), self.inputs.compat.as_dict())
        admitted, why_not = self._submit(op, decisions)
        if not admitted:
            decisions.append(CycleEvent("plan-not-started", f"plan for {for_workload or plan.target_node} not "
                                      f"started: {why_not}; planned again next cycle", {"workload": for_workload}))
            return
        busy |= set(op.migrations)
        self.plans[op.id] = op
        n, k = len(op.moves), len(op.migrations)
        rest = (f", {n - k} more in following cycles as the budget allows ({why_not})" if k < n else "")
        decisions.append(CycleEvent("plan-started", f"{op.name}: {k} of {n} move(s) started{rest}; it frees "
                                  f"{op.target_node}", {"workload": for_workload, "plan": op.id}))

    def _submit(self, op: OpenPlan, decisions: list[CycleEvent]) -> tuple[int, str]:
        """Journal the plan's next moves, in order, until the budget defers one. Returns how many were
        admitted and why the next one was not (\"\" when none is left)."""
        assert self.executor is not None
        n = 0
        for mv in op.remaining():
            adm = self.executor.submit([mv], reason=op.reason, plan=op.meta(), compat=op.compat)
            if not adm.admitted:
                why = adm.deferred[0][1] if adm.deferred else "not admitted"
                return n, f"{mv.label()}: {why}"
            m = adm.admitted[0]
            op.migrations[mv.workload_id] = m.id
            n += 1
            decisions.append(CycleEvent("submit", f"migration {m.id}: {m.workload_id} {m.source} -> {m.target} "
                                      f"({op.name}, move {op.moves.index(mv) + 1} of {len(op.moves)})",
                                      {"migration": m.id, "workload": m.workload_id, "plan": op.id}))
        return n, ""

    def _carry(self, state: ClusterState, decisions: list[CycleEvent]) -> None:
        """Take each started plan a step further: drop moves no longer needed, submit the next ones the
        budget admits, and say when a plan is finished or stopped."""
        if self.executor is None or self.dry_run:
            return
        for pid, op in list(self.plans.items()):
            for mv in op.remaining():
                w = state.workload(mv.workload_id) if mv.workload_id in state.workload_index else None
                if w is None or not w.is_running or mv.source not in w.nodes():
                    op.dropped.append(mv.workload_id)  # it left the source by itself: its GPUs are free anyway
            ms = [self.executor.journal.get(mid) for mid in op.migrations.values()]
            pend = state.workload(op.for_workload) if op.for_workload in state.workload_index else None
            where = "" if op.for_workload is None or (pend is not None and not pend.is_running) else \
                (f"{op.for_workload} is running on {','.join(pend.nodes())}" if pend is not None
                 else f"{op.for_workload} is gone")
            end = outcome(op, ms)
            if end is None and where and all(m.terminal for m in ms):
                made = sum(1 for m in ms if m.state in MADE)
                end = ("finished", f"{op.name} finished: {where} after {made} of {len(op.moves)} move(s); the rest "
                       "are not needed")
            elif end is not None and end[0] == "finished" and where:
                end = (end[0], f"{end[1]}; {where}")
            if end is not None:
                del self.plans[pid]
                if end[0] == "finished" and op.for_workload:
                    self._finished[op.for_workload] = self.clock()
                decisions.append(CycleEvent(f"plan-{end[0]}", end[1], {"workload": op.for_workload, "plan": pid}))
                continue
            if not op.remaining():
                continue
            _, why_not = self._submit(op, decisions)
            if why_not:
                k = len(op.migrations) + len(op.dropped)
                decisions.append(CycleEvent("plan-waiting", f"{op.name}: {k} of {len(op.moves)} move(s) started; "
                                          f"next {why_not}", {"workload": op.for_workload, "plan": pid}))

    def observe(self) -> ClusterState:
        """The cluster as this controller plans on it: the engine's observation, enriched (checkpoint sizes)."""
        state = self.engine.observe()
        return self.enrich(state) if self.enrich is not None else state

    def _in_flight_for(self) -> set[str]:
        if self.executor is None:
            return set()
        out = {p.for_workload for p in self.plans.values() if p.for_workload}
        for m in self.executor.active():
            plan = m.data.get("plan") or {}
            if plan.get("for"):
                out.add(str(plan["for"]))
        return out

    # ------------------------------------------------------------------ triggers
    def triggers(self, state: ClusterState, now: float, decisions: list[CycleEvent]) -> list[Target]:
        """The policy's registered triggers (gpudefrag.policy.triggers), in order; their notes become decisions."""
        tr = self.policy.trigger
        requested = self._requested or self._consume_request_file()
        self._requested = False
        cron = tr.cron_due(self._last_cron, now)
        if tr.cron is not None:
            self._last_cron = now if self._last_cron is None or cron else self._last_cron
        busy = self.executor.busy_workloads() if self.executor is not None else set()
        ctx = TriggerContext(state, now, tr, self.policy.budgets.tries_per_cycle,
                             self.policy.budgets.jobs_per_cycle, requested=requested,
                             cron_due=cron, plan_anyway=self.plan_anyway, movable=self.options(busy).movable)
        targets = evaluate(ctx)
        self.next_due = pending_due(state, now, tr)
        decisions.extend(CycleEvent(kind, reason, detail) for kind, reason, detail in ctx.notes)
        return targets

    def _consume_request_file(self) -> bool:
        if self.request_file is None or not self.request_file.exists():
            return False
        self.request_file.unlink(missing_ok=True)
        return True

    # ------------------------------------------------------------------ planning
    def options(self, busy: set[str]) -> PlanOptions:
        """The shared builder's options (policy, costs, compatibility rule), minus busy and wrapper-less jobs.

        One object per busy set: the state caches "which running jobs may move" per filter object
        (`ClusterState.may_move`), so the trigger's diagnosis and the decision's share one pass over every running
        job instead of making one each (at 5,000 nodes, ~40,000 filter calls a pass). Without a wrapper check the
        filter reads the workload alone, so the object is kept from cycle to cycle too, and a state built from
        the one before (the live model's) asks it only of the workloads that changed. With one (wrappers come
        and go) it is built again each cycle."""
        key = frozenset(busy)
        got = self._options.get(key)
        if got is None:
            got = self._options[key] = self._build_options(key)
        return got

    def _build_options(self, busy: frozenset[str]) -> PlanOptions:
        can = self.can_checkpoint

        def exclude(w: Workload) -> str | None:  # named, so "nothing may move" says which filter and how many
            if w.id in busy:
                return "already moving"
            if can is not None and not can(w):
                return "not running under `gpudefrag run` (no wrapper to checkpoint it)"
            return None

        return plan_options(self.inputs, exclude=exclude)

    def decide(self, state: ClusterState, t: Target, busy: set[str]) -> Decision:
        """The one decision for a target. A pending workload is planned for only when fragmentation alone keeps
        it waiting; a cron / threshold / explicit request to free a whole node is planned for as asked."""
        opts = self.options(busy)
        if t.workload_id is not None and t.workload_id in state.workload_index:
            return decide(state, state.workload(t.workload_id), opts, plan_anyway=t.plan_anyway)
        return decide(state, t.request, opts, plan_anyway=True)


def enrich_from_store(store: Any) -> Callable[[ClusterState], ClusterState]:
    """Fill each workload's checkpoint size and time from the store's newest checkpoint of it (for the
    filter's max_checkpoint_size and the planner's costs)."""

    def enrich(state: ClusterState) -> ClusterState:
        try:
            rows = store.list()
        except Exception:
            return state
        newest: dict[str, dict[str, Any]] = {}
        for r in rows:
            if r.get("signed") and r["workload_id"] not in newest:
                newest[r["workload_id"]] = r
        if not newest:
            return state
        wls = []
        for w in state.workloads:
            r = newest.get(w.id)
            wls.append(msgspec.structs.replace(w, checkpoint_bytes=int(r["bytes"]),
                                           last_checkpoint_at=float(r["created_unix"])) if r else w)
        return state.with_workloads(wls)

    return enrich
