"""The controller loop: observe → trigger → filter → plan → execute, one `cycle()` at a time.

Each cycle advances the migrations already in flight, then evaluates the policy's triggers on a fresh
observation; for each trigger that fires it plans (only workloads the policy's filter allows may move, none
already moving) and hands the moves to the executor, which journals them and applies the disruption budget.
Every decision is logged with its reason, and journaled when not a dry run. A dry run plans and reports but
never calls an engine action and never writes the journal.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.cost import CostModel
from ..core.decision import MOVE, decide
from ..core.decision import Decision as Choice
from ..core.model import ClusterState, Workload
from ..core.planner import Plan, PlanOptions
from ..engines.base import Engine
from ..policy.models import Policy
from ..policy.options import PlanInputs, plan_options
from ..policy.triggers import Target, TriggerContext, evaluate
from .executor import Executor


@dataclass
class Decision:
    kind: str  # trigger | skip | plan | submit | defer | dry-run | error
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
    decisions: list[Decision]
    plans: list[Plan]
    in_flight: int
    duration_s: float
    dry_run: bool

    def as_dict(self) -> dict[str, Any]:
        return {"at": self.at, "nodes": self.nodes, "running": self.running, "pending": self.pending,
                "in_flight": self.in_flight, "duration_s": round(self.duration_s, 4), "dry_run": self.dry_run,
                "decisions": [d.as_dict() for d in self.decisions], "plans": [p.as_dict() for p in self.plans]}


class Controller:
    def __init__(self, engine: Engine, policy: Policy, executor: Executor | None, *, dry_run: bool = False,
                 clock: Callable[[], float] = time.time, log: Callable[[str], None] | None = None,
                 enrich: Callable[[ClusterState], ClusterState] | None = None,
                 request_file: Path | None = None,
                 can_checkpoint: Callable[[Workload], bool] | None = None,
                 costs: CostModel | None = None) -> None:
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
        self.inputs = PlanInputs(policy, costs or CostModel())  # the same PlanOptions builder as `plan`
        self._requested = False
        self._last_cron: float | None = None
        self._last_keys: set[tuple[str, str, str]] = set()

    def request(self) -> None:
        """An explicit request (CLI/API): the next cycle evaluates the policy as if a trigger fired."""
        self._requested = True

    # ------------------------------------------------------------------ one cycle
    def cycle(self) -> CycleReport:
        t0 = time.perf_counter()
        decisions: list[Decision] = []
        plans: list[Plan] = []
        if self.executor is not None and not self.dry_run:
            for m in self.executor.tick():
                decisions.append(Decision("progress", f"migration {m.id} of {m.workload_id}: {m.state.value}",
                                          {"migration": m.id, "state": m.state.value, "why": m.reason}))
        state = self.engine.observe()
        if self.enrich is not None:
            state = self.enrich(state)
        now = self.clock()
        targets = self.triggers(state, now, decisions)
        if targets and self.policy.action.kind == "never":
            decisions.append(Decision("skip", "policy action is 'never': diagnosis and plans are reported only"))
        busy = self.executor.busy_workloads() if self.executor is not None else set()
        planned_for = self._in_flight_for()
        for t in targets:
            if t.workload_id is not None and t.workload_id in planned_for:
                decisions.append(Decision("skip", f"moves for {t.workload_id} are already in flight",
                                          {"workload": t.workload_id}))
                continue
            choice = self.decide(state, t, busy)
            if choice.plan is None:
                decisions.append(Decision("skip", f"{t.why}: {choice.reason}", {"workload": t.workload_id}))
                continue
            plan = choice.plan
            plans.append(plan)
            if not plan.feasible:
                decisions.append(Decision("plan", f"no plan for {t.why}: {plan.reason}",
                                          {"workload": t.workload_id, "feasible": False}))
                continue
            if choice.chosen not in (MOVE, "none"):
                decisions.append(Decision("alternative", f"{t.why}: {choice.reason}; nothing moved",
                                          {"workload": t.workload_id, "chosen": choice.chosen,
                                           "options": [o.as_dict() for o in choice.options]}))
                continue
            moves = [f"{m.workload_id} {m.source}->{m.target}" for m in plan.moves]
            decisions.append(Decision("plan", f"{t.why}: {len(plan.moves)} move(s) free {plan.target_node} "
                                      f"({plan.total_cost_s:.0f} s, {plan.solver})",
                                      {"workload": t.workload_id, "moves": moves, "target_node": plan.target_node}))
            if self.policy.action.kind == "never":
                continue
            if self.dry_run:
                decisions.append(Decision("dry-run", f"would move {', '.join(moves) or 'nothing'}",
                                          {"workload": t.workload_id, "moves": moves}))
                continue
            assert self.executor is not None
            adm = self.executor.submit(plan.moves, reason=t.why,
                                       plan={"for": t.workload_id, "target_node": plan.target_node},
                                       compat=self.inputs.compat.as_dict())
            for m in adm.admitted:
                busy.add(m.workload_id)
                decisions.append(Decision("submit", f"migration {m.id}: {m.workload_id} {m.source} -> {m.target}",
                                          {"migration": m.id, "workload": m.workload_id}))
            for wid, why in adm.deferred:
                decisions.append(Decision("defer", f"{wid}: {why}", {"workload": wid}))
        report = CycleReport(now, len(state.nodes), len(state.running), len(state.pending), decisions, plans,
                             len(self.executor.active()) if self.executor is not None else 0,
                             time.perf_counter() - t0, self.dry_run)
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

    def _in_flight_for(self) -> set[str]:
        if self.executor is None:
            return set()
        out = set()
        for m in self.executor.active():
            plan = m.data.get("plan") or {}
            if plan.get("for"):
                out.add(str(plan["for"]))
        return out

    # ------------------------------------------------------------------ triggers
    def triggers(self, state: ClusterState, now: float, decisions: list[Decision]) -> list[Target]:
        """The policy's registered triggers (gpudefrag.policy.triggers), in order; their notes become decisions."""
        tr = self.policy.trigger
        requested = self._requested or self._consume_request_file()
        self._requested = False
        cron = tr.cron_due(self._last_cron, now)
        if tr.cron is not None:
            self._last_cron = now if self._last_cron is None or cron else self._last_cron
        ctx = TriggerContext(state, now, self.policy, requested=requested, cron_due=cron)
        targets = evaluate(ctx)
        decisions.extend(Decision(kind, reason, detail) for kind, reason, detail in ctx.notes)
        return targets

    def _consume_request_file(self) -> bool:
        if self.request_file is None or not self.request_file.exists():
            return False
        self.request_file.unlink(missing_ok=True)
        return True

    # ------------------------------------------------------------------ planning
    def options(self, busy: set[str]) -> PlanOptions:
        """The shared builder's options (policy, costs, compatibility rule), minus busy and wrapper-less jobs."""
        can = self.can_checkpoint

        def movable(w: Workload) -> bool:
            return w.id not in busy and (can is None or can(w))

        return plan_options(self.inputs, movable=movable)

    def decide(self, state: ClusterState, t: Target, busy: set[str]) -> Choice:
        """The one decision for a target. A pending workload is planned for only when fragmentation alone keeps
        it waiting; a cron / threshold / explicit request to free a whole node is planned for as asked."""
        opts = self.options(busy)
        if t.workload_id is not None and t.workload_id in state.workload_index:
            return decide(state, state.workload(t.workload_id), opts)
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
            wls.append(dataclasses.replace(w, checkpoint_bytes=int(r["bytes"]),
                                           last_checkpoint_at=float(r["created_unix"])) if r else w)
        return state.with_workloads(wls)

    return enrich
