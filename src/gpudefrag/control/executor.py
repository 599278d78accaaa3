"""The migration state machine.

    planned → checkpointing → checkpointed (verified) → requeued-held → pinned → released → restoring
            → running-on-target → done
    failures: checkpoint failed (job still running) → rolled-back; checkpoint unusable, target drained, restore
    timed out → rolling-back (requeued to the source, restored there or cold-started) → rolled-back | cold-started

Every transition is written to the journal *before* it is acted on, and every state's handler is an "ensure":
it looks at the scheduler and the wrapper, does only what is still missing, and moves on when its condition
holds. So a controller killed anywhere and restarted repeats at most one idempotent action per migration.
`tick()` never blocks: the controller calls it every cycle.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..core.fragmentation import fits_mask
from ..engines.base import Engine, EngineError, JobPhase
from ..jobside.messages import CkptState, RunPhase, Ticket
from ..policy.options import ExecutorConfig
from .agent import Agent
from .journal import Journal, Migration
from .journal import MigrationState as S

MAX_ROLLBACK_TRIES = 3  # rollbacks that each found a node with room and ran out of time: then any node
TAKEN_GRACE_S = 5.0  # a requeued job's node may still look busy this long after its release


def once_deadline_s(config: ExecutorConfig) -> float:
    """The longest a migration can stay in flight when every step runs into its timeout: the checkpoint, the
    restore on the target, each rollback try and the final wait queued for any node (plus slack for Slurm's own
    requeue passes). `controller --once` never waits longer."""
    return config.checkpoint_timeout_s + (MAX_ROLLBACK_TRIES + 2) * config.restore_timeout_s + 120.0


class MoveLike(Protocol):
    """What the executor needs of a planned move (`gpudefrag.core.planner.Move` has it)."""

    workload_id: str
    source: str
    target: str


@dataclass(frozen=True)
class Admission:
    admitted: tuple[Migration, ...]
    deferred: tuple[tuple[str, str], ...]  # (workload id, why)


def crash_hook_from_env() -> Callable[[Migration], None] | None:
    """Fault injection for the kill tests: GPUDEFRAG_CRASH_AT=point[,point...] makes this process SIGKILL itself
    right after the journal made a transition into one of those points durable (before acting on it). A point is
    a state (`restoring`), or, for a Kubernetes move whose state spans several operations, a state and the
    operation about to be taken (`checkpointing:wait-agent-checkpoint`: the agent's request is written, its answer
    not yet read; `restoring:wait-ready`: the replacement exists) — the kinds in the journaled sequence."""
    spec = os.environ.get("GPUDEFRAG_CRASH_AT", "").strip()
    if not spec:
        return None
    points = {s.strip() for s in spec.split(",") if s.strip()}

    def hook(m: Migration) -> None:
        ops = (m.data.get("sequence") or {}).get("ops") or []
        i = m.data.get("op")
        op = ops[i].get("op") if isinstance(i, int) and 0 <= i < len(ops) else None
        if m.state.value in points or f"{m.state.value}:{op}" in points:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def admit(journal: Journal, config: ExecutorConfig, moves: Iterable[MoveLike], *, now: float, reason: str,
          data: Callable[[MoveLike], dict[str, Any]]) -> Admission:
    """The disruption budget, shared by every engine's executor: journal (PLANNED) the moves that fit under
    it — one migration per workload, at most `max_concurrent` in flight, `max_per_node` per node (source or
    target), `max_per_hour` started — and defer the rest, each with why."""
    active = journal.active()
    per_node: dict[str, int] = {}
    for m in active:
        for n in {m.source, m.target}:
            per_node[n] = per_node.get(n, 0) + 1
    busy = {m.workload_id for m in active}
    started_hour = journal.started_since(now - 3600) if config.max_per_hour is not None else 0
    admitted: list[Migration] = []
    deferred: list[tuple[str, str]] = []
    for mv in moves:
        nodes = {mv.source, mv.target}
        if mv.workload_id in busy:
            deferred.append((mv.workload_id, "already being moved"))
        elif len(active) + len(admitted) >= config.max_concurrent:
            deferred.append((mv.workload_id, f"budget: {config.max_concurrent} moves in flight"))
        elif any(per_node.get(n, 0) >= config.max_per_node for n in nodes):
            full = "/".join(sorted(n for n in nodes if per_node.get(n, 0) >= config.max_per_node))
            deferred.append((mv.workload_id, f"budget: {config.max_per_node} move(s) per node in flight on {full}"))
        elif config.max_per_hour is not None and started_hour + len(admitted) >= config.max_per_hour:
            deferred.append((mv.workload_id, f"budget: {config.max_per_hour} moves per hour"))
        else:
            m = journal.create(mv.workload_id, mv.source, mv.target, reason=reason, data=data(mv))
            admitted.append(m)
            busy.add(mv.workload_id)
            for n in nodes:
                per_node[n] = per_node.get(n, 0) + 1
    return Admission(tuple(admitted), tuple(deferred))


class BudgetedExecutor:
    """What every engine's executor shares: the journal, the disruption budget (`admit`), and what is in
    flight. An engine's executor says only what each journaled move carries (`move_data`) and how it runs."""

    def __init__(self, journal: Journal, config: ExecutorConfig | None, *, clock: Callable[[], float],
                 log: Callable[[str], None] | None) -> None:
        self.journal = journal
        self.config = config or ExecutorConfig()
        self.clock = clock
        self.log = log or (lambda _msg: None)

    def active(self) -> list[Migration]:
        return self.journal.active()

    def busy_workloads(self) -> set[str]:
        return {m.workload_id for m in self.active()}

    def move_data(self, mv: MoveLike, plan: dict[str, Any] | None, compat: dict[str, Any] | None) -> dict[str, Any]:
        """What the journal keeps with an admitted move: the plan, and the compatibility rule it was planned
        under (the restore, or the replacement's node choice, checks what the planner checked)."""
        d: dict[str, Any] = {}
        if plan:
            d["plan"] = plan
        if compat is not None:
            d["compat"] = compat
        return d

    def submit(self, moves: Iterable[MoveLike], *, reason: str, plan: dict[str, Any] | None = None,
               compat: dict[str, Any] | None = None) -> Admission:
        """Journal the moves the budget allows (PLANNED); the rest are deferred, each with why. `compat`: the
        compatibility rule the moves were planned under (`CompatRule.as_dict()`)."""
        admission = admit(self.journal, self.config, moves, now=self.clock(), reason=reason,
                          data=lambda mv: self.move_data(mv, plan, compat))
        for m in admission.admitted:
            self.log(f"migration {m.id}: {m.workload_id} {m.source} -> {m.target} planned ({reason})")
        return admission


class Executor(BudgetedExecutor):
    """Slurm (and the simulator): checkpoint on the source through the job's agent, restore on the target."""

    def __init__(self, engine: Engine, agent: Agent, journal: Journal, config: ExecutorConfig | None = None, *,
                 clock: Callable[[], float] = time.time, log: Callable[[str], None] | None = None) -> None:
        super().__init__(journal, config, clock=clock, log=log)
        self.engine = engine
        self.agent = agent

    def move_data(self, mv: MoveLike, plan: dict[str, Any] | None, compat: dict[str, Any] | None) -> dict[str, Any]:
        return {"target_gpus": list(getattr(mv, "target_gpus", ()) or ()), **super().move_data(mv, plan, compat)}

    # ------------------------------------------------------------------ driving
    def tick(self) -> list[Migration]:
        """Advance every in-flight migration as far as it can go without waiting. Returns those that moved."""
        moved = []
        for m in self.active():
            before = m.state
            try:
                m = self._advance(m)
            except EngineError as e:
                self.log(f"migration {m.id}: {e} (will retry)")
                continue
            if m.state is not before:
                moved.append(m)
        return moved

    def _advance(self, m: Migration, limit: int = 16) -> Migration:
        for _ in range(limit):
            nxt = self._step(m)
            if nxt is None or nxt.terminal:
                return nxt or m
            if nxt.state is m.state and nxt.updated_at == m.updated_at:
                return nxt
            m = nxt
        return m

    def run_until_idle(self, timeout_s: float, *, sleep: Callable[[float], None] = time.sleep,
                       period_s: float = 0.5) -> bool:
        end = self.clock() + timeout_s
        while self.active():
            self.tick()
            if not self.active():
                break
            if self.clock() >= end:
                return False
            sleep(period_s)
        return True

    def _go(self, m: Migration, state: S, detail: str = "", *, reason: str | None = None,
            **data: Any) -> Migration:
        m2 = self.journal.transition(m.id, state, detail=detail, reason=reason, data=data or None)
        self.log(f"migration {m.id}: {m.workload_id} -> {state.value}" + (f" ({detail})" if detail else ""))
        return m2

    def _since(self, m: Migration) -> float:
        return self.clock() - m.updated_at

    # ------------------------------------------------------------------ the states
    def _step(self, m: Migration) -> Migration | None:
        w = m.workload_id
        req = f"m{m.id}"
        if m.state is S.PLANNED:
            job = self.engine.job(w)
            if job.phase is not JobPhase.RUNNING or m.source not in job.nodes:
                return self._go(m, S.ABORTED, reason=f"job is {job.phase.value} on {','.join(job.nodes) or '-'}, "
                                f"not running on {m.source}: nothing was changed")
            if not self.engine.node(m.target).schedulable:
                return self._go(m, S.ABORTED, reason=f"target {m.target} is not schedulable: nothing was changed")
            return self._go(m, S.CHECKPOINTING, f"asking the wrapper for a checkpoint ({req})")

        if m.state is S.CHECKPOINTING:
            self.agent.request_checkpoint(w, req, stop=True)
            st = self.agent.checkpoint_status(w, req)
            if st.state is CkptState.PENDING:
                if self._since(m) > self.config.checkpoint_timeout_s:
                    self.agent.cancel_checkpoint(w, req)
                    st2 = self.agent.checkpoint_status(w, req)  # it may have answered meanwhile
                    if st2.state is CkptState.PENDING:
                        return self._go(m, S.ROLLED_BACK, reason="the wrapper did not answer the checkpoint request "
                                        f"within {self.config.checkpoint_timeout_s:g} s; the job kept running")
                    st = st2
                else:
                    return None
            if st.state is CkptState.FAILED:
                why = f"checkpoint failed ({st.reason}: {st.detail})".replace(": )", ")")
                if st.still_running and self.config.fallback != "evict":
                    return self._go(m, S.ROLLED_BACK, reason=f"{why}; the job kept running on {m.source}")
                return self._go(m, S.REQUEUED_HELD, why, reason=why, ckpt_id=None,
                                ticket={"id": f"{req}.0", "ckpt_id": None,
                                        "reason": f"evicted: {why}" if st.still_running else why})
            return self._go(m, S.CHECKPOINTED, f"checkpoint {st.ckpt_id}", ckpt_id=st.ckpt_id)

        if m.state is S.CHECKPOINTED:
            ckpt = m.data.get("ckpt_id")
            ok, code = self.agent.verify(str(ckpt))
            if ok:
                return self._go(m, S.REQUEUED_HELD, f"{ckpt} verified",
                                ticket={"id": f"{req}.0", "ckpt_id": ckpt, "reason": "move"})
            why = f"checkpoint {ckpt} failed verification ({code})"
            return self._go(m, S.ROLLING_BACK, why, reason=why, ckpt_id=None)

        if m.state is S.REQUEUED_HELD:
            job = self.engine.job(w)
            if job.phase is JobPhase.RUNNING:
                self.engine.requeue_hold(w)
                return None
            if job.phase is JobPhase.PENDING:
                self.engine.hold(w)
                return None
            if job.phase is JobPhase.COMPLETING:
                return None
            if job.phase is JobPhase.HELD:
                return self._go(m, S.PINNED, f"held; pinning to {m.dest}" if m.dest else "held; any node")
            return self._go(m, S.ABORTED, reason=f"the job {job.phase.value} during the move")

        if m.state is S.PINNED:
            if m.dest == m.target and not self.engine.node(m.target).schedulable:
                return self._go(m, S.ROLLING_BACK, f"target {m.target} became unschedulable",
                                reason=f"target {m.target} drained during the move")
            if m.dest:
                self.engine.pin(w, [m.dest])
            else:  # rolling back and no node has room: no node named, nothing excluded, any node may take it
                self.engine.pin(w, [], exclude=[])
            t = m.data.get("ticket") or {}
            self.agent.set_ticket(w, Ticket(t.get("id", f"{req}.0"), t.get("ckpt_id"), t.get("reason", ""),
                                            m.data.get("compat")))
            return self._go(m, S.RELEASED, f"releasing onto {m.dest}" if m.dest else "releasing to any node")

        if m.state is S.RELEASED:
            job = self.engine.job(w)
            if job.phase is JobPhase.HELD:
                self.engine.release(w)
                return None
            if job.phase in (JobPhase.PENDING, JobPhase.RUNNING):
                return self._go(m, S.RESTORING, f"waiting for the job to start on {m.dest or 'any node'}")
            if job.phase is JobPhase.COMPLETING:
                return None
            return self._go(m, S.ABORTED, reason=f"the job {job.phase.value} during the move")

        if m.state is S.RESTORING:
            return self._restoring(m)

        if m.state is S.RUNNING_ON_TARGET:
            return self._go(m, S.DONE, reason=m.reason or f"moved {m.source} -> {m.target} with its state")

        if m.state is S.ROLLING_BACK:
            t = m.data.get("ticket") or {}
            n = int(str(t.get("id", f"{req}.0")).rsplit(".", 1)[-1]) + 1
            ckpt = m.data.get("ckpt_id")
            dest, where = self._rollback_dest(m)
            return self._go(m, S.REQUEUED_HELD, where, dest=dest, rollback=int(m.data.get("rollback", 0)) + 1,
                            ticket={"id": f"{req}.{n}", "ckpt_id": ckpt,
                                    "reason": f"rollback: {m.reason}" if m.reason else "rollback"})
        return None

    def _rollback_dest(self, m: Migration) -> tuple[str, str]:
        """Where a rollback sends the job, from a fresh look at the cluster: its source if it has room (or the
        job still holds it), else the target or any other schedulable node with room now, else "" — no node
        named, the job queued where any node can take it. After `MAX_ROLLBACK_TRIES` tries that each ran out
        of time, always "": a node someone else keeps taking is not chased."""
        if int(m.data.get("rollback", 0)) >= MAX_ROLLBACK_TRIES:
            return "", f"queued for any node (no node took it after {MAX_ROLLBACK_TRIES} rollback tries)"
        state = self.engine.observe()
        if m.workload_id not in state.workload_index:
            return "", "queued for any node (the job is not in the queue listing)"
        w = state.workload(m.workload_id)
        if w.is_running and m.source in w.nodes():
            return m.source, f"back to {m.source}"
        room = [state.nodes[i].name for i in np.flatnonzero(fits_mask(state, w.request))]
        for node in (m.source, m.target, *room):
            if node in room:
                label = "back to" if node == m.source else f"{m.source} is taken: to"
                return node, f"{label} {node}, which has room now"
        return "", f"no node has room for it now ({m.source} is taken): queued for any node"

    def _room_on(self, workload_id: str, node: str) -> bool:
        """Does the (pending) job fit on `node` now, by the one capacity rule?"""
        state = self.engine.observe()
        if workload_id not in state.workload_index or node not in state.node_index:
            return False
        ok = fits_mask(state, state.workload(workload_id).request)
        return bool(ok[state.node_index[node]])

    def _restoring(self, m: Migration) -> Migration | None:
        w = m.workload_id
        job = self.engine.job(w)
        ticket = m.data.get("ticket") or {}
        if job.phase in (JobPhase.PENDING, JobPhase.HELD):
            if (m.data.get("rollback") and m.dest and self._since(m) > TAKEN_GRACE_S
                    and not self._room_on(w, m.dest)):
                # rolling back to a node someone else took meanwhile: choose again now, not after the timeout
                self.engine.hold(w)
                return self._go(m, S.ROLLING_BACK, f"{m.dest} was taken meanwhile", reason=m.reason)
            if m.dest == m.target and not self.engine.node(m.target).schedulable:
                self.engine.hold(w)
                return self._go(m, S.ROLLING_BACK, f"target {m.target} became unschedulable",
                                reason=f"target {m.target} drained during the move")
            if job.phase is JobPhase.HELD:  # someone held it again: our step is to release
                self.engine.release(w)
            if self._since(m) > self.config.restore_timeout_s:
                if not m.dest:  # queued for any node: Slurm starts it when one has room, the ticket restores it
                    t = ticket.get("ckpt_id") or "its newest verified checkpoint"
                    return self._go(m, S.ROLLED_BACK, "left queued for any node",
                                    reason=f"{m.reason}; no node had room within {self.config.restore_timeout_s:g} "
                                           f"s: left queued for any node, it restores {t} when it starts"
                                           .lstrip("; "))
                # not started in time where it was sent (the target, or a node someone else took meanwhile):
                # re-read the cluster and send it where there is room (or leave it queued for any node)
                self.engine.hold(w)
                return self._go(m, S.ROLLING_BACK, "not started in time",
                                reason=m.reason if m.data.get("rollback") else
                                f"the job did not start on {m.dest} within {self.config.restore_timeout_s:g} s")
            return None
        if job.phase is JobPhase.RUNNING:
            rs = self.agent.run_status(w)
            if rs is None or rs.ticket_id != ticket.get("id") or rs.phase is RunPhase.STARTING:
                return None
            where = job.node or rs.node
            if rs.phase is RunPhase.RESTORED:
                note = f" ({rs.reason})" if rs.reason else ""  # e.g. a fallback to an older verified checkpoint
                if m.data.get("rollback") or m.dest != m.target:
                    return self._go(m, S.ROLLED_BACK, f"restored {rs.ckpt_id} on {where}{note}",
                                    reason=f"{m.reason}; restored on {where} from {rs.ckpt_id}{note}".lstrip("; "))
                if rs.reason:
                    return self._go(m, S.RUNNING_ON_TARGET, f"restored {rs.ckpt_id} on {where}{note}",
                                    reason=f"moved {m.source} -> {m.target} from {rs.ckpt_id}{note}")
                return self._go(m, S.RUNNING_ON_TARGET, f"restored {rs.ckpt_id} on {where}")
            return self._go(m, S.COLD_STARTED, f"started fresh on {where}",
                            reason=f"cold start on {where}: {rs.reason or m.reason or 'no usable checkpoint'}")
        if job.phase is JobPhase.COMPLETING:
            return None
        return self._go(m, S.ABORTED, reason=f"the job {job.phase.value} while being restored")
