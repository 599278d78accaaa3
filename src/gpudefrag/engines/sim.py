"""An in-memory engine with Slurm's job semantics and a simulated job wrapper, for tests and fault schedules.

It behaves like the Slurm lab where it matters to the executor: `requeue_hold` stops a job, which stays
COMPLETING for `requeue_delay_s` and then waits HELD; a released job starts at the next `advance()` on the
first node allowed by its pin where the one capacity model says it fits (GPU model, GPUs or share, CPU,
memory). Each running job has a process with a step counter; the simulated wrapper answers checkpoint requests
(a move's checkpoint stops the process) and, when the job starts again, restores its ticket's checkpoint or
cold-starts with a reason. Faults are injected per workload (`checkpoint-fail`, `store-full`, `corrupt`,
`restore-fail`) or by draining nodes. Processes are
counted globally, so a workload running twice is visible, not assumed away.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from msgspec.structs import replace

from ..core.capacity import Capacity, Shape
from ..core.fragmentation import eligible_mask
from ..core.model import ClusterState, Placement, Workload, WorkloadState
from ..core.scheduler_reasons import waits_for_resources
from ..jobside.messages import CkptState, CkptStatus, RunPhase, RunStatus, Ticket
from .base import EngineError, JobInfo, JobPhase, NodeInfo

FAULTS = frozenset({"checkpoint-fail", "store-full", "corrupt", "restore-fail"})


@dataclass
class SimProcess:
    workload_id: str
    node: str
    counter: int
    alive: bool = True


@dataclass
class SimCheckpoint:
    id: str
    workload_id: str
    counter: int
    corrupt: bool = False
    seq: int = 0


@dataclass
class SimStart:
    """One start of a workload's process: how (fresh/restored/cold-started), from what, and why."""

    at: float
    workload_id: str
    node: str
    how: RunPhase
    counter: int
    ckpt_id: str | None = None
    reason: str = ""


@dataclass
class SimJob:
    workload: Workload
    phase: JobPhase
    nodes: tuple[str, ...] = ()
    gpus: tuple[int, ...] = ()
    required: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    restarts: int = 0
    ready_at: float = 0.0  # COMPLETING -> PENDING/HELD at this time
    hold_after: bool = False
    process: SimProcess | None = None
    requests: dict[str, bool] = field(default_factory=dict)  # request id -> stop
    responses: dict[str, CkptStatus] = field(default_factory=dict)
    ticket: Ticket | None = None
    handled_tickets: set[str] = field(default_factory=set)
    status: RunStatus | None = None
    view: Workload | None = None  # the Workload observe() reports, cached until phase/nodes/gpus change
    view_key: tuple[object, ...] | None = None
    parts: tuple[Placement, ...] = ()  # a multi-node job's placements (it never moves)


class SimEngine:
    """Engine + Agent over a ClusterState, driven by `advance()`."""

    name = "sim"

    def __init__(self, state: ClusterState, *, requeue_delay_s: float = 6.0) -> None:
        self.nodes = {n.name: n for n in state.nodes}
        self.quotas = state.quotas  # kept, so the diagnosis sees the same quotas, groups and reasons
        self.node_groups = state.node_groups
        self.scheduler = state.scheduler
        self.node_order = [n.name for n in state.nodes]
        self.drained: set[str] = {n.name for n in state.nodes if not n.schedulable}
        self.now = state.now
        self.requeue_delay_s = requeue_delay_s
        self.jobs: dict[str, SimJob] = {}
        self.processes: list[SimProcess] = []
        self.checkpoints: dict[str, SimCheckpoint] = {}
        self.starts: list[SimStart] = []
        self.faults: dict[str, set[str]] = {}
        self.calls: list[tuple[str, str]] = []  # (action, job) for tests of idempotence
        self._seq = 0
        for w in state.workloads:
            if w.is_running:
                p = w.placements[0]
                proc = SimProcess(w.id, p.node, 0)
                self.processes.append(proc)
                self.jobs[w.id] = SimJob(w, JobPhase.RUNNING, w.nodes(), p.gpus, process=proc,
                                         status=RunStatus(RunPhase.FRESH, p.node, at=self.now),
                                         parts=w.placements if w.is_multi_node else ())
                self.starts.append(SimStart(self.now, w.id, p.node, RunPhase.FRESH, 0))
            else:
                self.jobs[w.id] = SimJob(w, JobPhase.PENDING)

    # ------------------------------------------------------------------ Engine
    def observe(self) -> ClusterState:
        """The state now (validated). Each job's view is rebuilt only when its phase or place changed."""
        nodes = [n if (n.name in self.drained) != n.schedulable else replace(n, schedulable=n.name not in self.drained)
                 for n in (self.nodes[x] for x in self.node_order)]
        wls = []
        for j in self.jobs.values():
            key = (j.phase, j.nodes, j.gpus)
            if j.view_key != key:
                j.view_key, j.view = key, self._view(j)
            if j.view is not None:
                wls.append(j.view)
        return ClusterState.build(nodes, wls, quotas=self.quotas, node_groups=self.node_groups, now=self.now,
                                  name="sim", scheduler=self.scheduler)

    @staticmethod
    def _view(j: SimJob) -> Workload | None:
        if j.phase in (JobPhase.RUNNING, JobPhase.COMPLETING) and j.nodes:
            parts = j.parts or (Placement(j.nodes[0], j.gpus),)
            return replace(j.workload, state=WorkloadState.RUNNING, placements=parts)
        if j.phase in (JobPhase.PENDING, JobPhase.HELD):
            reason = "JobHeldUser" if j.phase is JobPhase.HELD else (j.workload.scheduler_reason or "Resources")
            return replace(j.workload, state=WorkloadState.PENDING, placements=(), scheduler_reason=reason)
        return None

    def _job(self, job_id: str) -> SimJob:
        j = self.jobs.get(job_id)
        if j is None:
            raise EngineError(f"sim: no job {job_id}")
        return j

    def job(self, job_id: str) -> JobInfo:
        j = self.jobs.get(job_id)
        if j is None:
            return JobInfo(job_id, JobPhase.GONE)
        return JobInfo(job_id, j.phase, j.nodes if j.phase in (JobPhase.RUNNING, JobPhase.COMPLETING) else (),
                       "", j.restarts, j.required, j.excluded)

    def node(self, name: str) -> NodeInfo:
        if name not in self.nodes:
            return NodeInfo(name, False, "UNKNOWN", "no such node")
        d = name in self.drained
        return NodeInfo(name, not d, "DRAIN" if d else "IDLE")

    def hold(self, job_id: str) -> None:
        j = self._job(job_id)
        self.calls.append(("hold", job_id))
        if j.phase is JobPhase.PENDING:
            j.phase = JobPhase.HELD
        elif j.phase is JobPhase.COMPLETING:
            j.hold_after = True

    def release(self, job_id: str) -> None:
        j = self._job(job_id)
        self.calls.append(("release", job_id))
        if j.phase is JobPhase.HELD:
            j.phase = JobPhase.PENDING
        elif j.phase is JobPhase.COMPLETING:
            j.hold_after = False

    def requeue_hold(self, job_id: str) -> None:
        j = self._job(job_id)
        self.calls.append(("requeue_hold", job_id))
        if j.phase is JobPhase.RUNNING:
            self._kill(j)
            j.phase = JobPhase.COMPLETING
            j.ready_at = self.now + self.requeue_delay_s
            j.hold_after = True
            j.restarts += 1
        elif j.phase is JobPhase.PENDING:
            j.phase = JobPhase.HELD
        elif j.phase in (JobPhase.ENDED, JobPhase.GONE):
            raise EngineError(f"sim: job {job_id} cannot be requeued: {j.phase.value}")

    def pin(self, job_id: str, nodes: Sequence[str], exclude: Sequence[str] = ()) -> None:
        j = self._job(job_id)
        self.calls.append(("pin", job_id))
        if tuple(nodes) == j.required and tuple(exclude) == j.excluded:
            return
        if j.phase not in (JobPhase.PENDING, JobPhase.HELD):
            raise EngineError(f"sim: job {job_id} cannot be pinned: {j.phase.value}")
        j.required, j.excluded = tuple(nodes), tuple(exclude)

    def signal(self, job_id: str, signal: str, *, batch: bool = True) -> None:
        self.calls.append((f"signal:{signal}", job_id))

    def drain(self, node: str) -> None:
        self.drained.add(node)

    def resume(self, node: str) -> None:
        self.drained.discard(node)

    # ------------------------------------------------------------------ Agent (the simulated wrapper)
    def request_checkpoint(self, workload_id: str, request_id: str, *, stop: bool) -> None:
        j = self._job(workload_id)
        if request_id not in j.responses:
            j.requests.setdefault(request_id, stop)

    def checkpoint_status(self, workload_id: str, request_id: str) -> CkptStatus:
        return self._job(workload_id).responses.get(request_id, CkptStatus(CkptState.PENDING))

    def cancel_checkpoint(self, workload_id: str, request_id: str) -> None:
        self._job(workload_id).requests.pop(request_id, None)

    def verify(self, ckpt_id: str) -> tuple[bool, str]:
        c = self.checkpoints.get(ckpt_id)
        if c is None:
            return False, "not-found"
        return (False, "hash-mismatch") if c.corrupt else (True, "ok")

    def set_ticket(self, workload_id: str, ticket: Ticket) -> None:
        self._job(workload_id).ticket = ticket

    def run_status(self, workload_id: str) -> RunStatus | None:
        return self._job(workload_id).status

    # ------------------------------------------------------------------ time
    def inject(self, workload_id: str, *faults: str) -> None:
        bad = set(faults) - FAULTS
        if bad:
            raise ValueError(f"unknown fault(s) {sorted(bad)}; known: {sorted(FAULTS)}")
        self.faults.setdefault(workload_id, set()).update(faults)

    def advance(self, dt: float = 1.0) -> None:
        """Time passes: processes step, the wrapper answers requests, requeued jobs settle, the scheduler runs."""
        self.now += dt
        for p in self.processes:
            if p.alive:
                p.counter += 1
        for j in self.jobs.values():
            if j.phase is JobPhase.RUNNING and j.requests:
                self._answer(j)
            if j.phase is JobPhase.COMPLETING and self.now >= j.ready_at:
                j.phase = JobPhase.HELD if j.hold_after else JobPhase.PENDING
                j.nodes, j.gpus = (), ()
        self._schedule()

    def _answer(self, j: SimJob) -> None:
        wid = j.workload.id
        faults = self.faults.get(wid, set())
        for rid, stop in list(j.requests.items()):
            del j.requests[rid]
            if rid in j.responses or j.process is None or not j.process.alive:
                continue
            if "store-full" in faults:
                j.responses[rid] = CkptStatus(CkptState.FAILED, None, "store-full", "no space left on device")
                continue
            if "checkpoint-fail" in faults:
                j.responses[rid] = CkptStatus(CkptState.FAILED, None, "checkpoint-failed", "criu dump failed")
                continue
            self._seq += 1
            cid = f"{wid}-c{self._seq}"
            self.checkpoints[cid] = SimCheckpoint(cid, wid, j.process.counter, corrupt="corrupt" in faults,
                                                seq=self._seq)
            if stop:
                j.process.alive = False  # CRIU dump without --leave-running: the tree is gone
                j.status = RunStatus(RunPhase.CHECKPOINTED, j.nodes[0], ckpt_id=cid, at=self.now)
            j.responses[rid] = CkptStatus(CkptState.OK, cid)

    def _schedule(self) -> None:
        """Start what fits, oldest first, through the one capacity model (`core.capacity`): a node the request
        may use (`fragmentation.eligible_mask`: schedulable, GPU model, selector, taints, partition) where its
        GPUs or share, CPU and memory are free (`Capacity.fits`), the first such node in the cluster's order
        that its pin allows; its GPUs are the ones `Capacity.pick` gives (lowest wholly free indices; a share
        goes to the fullest GPU it fits)."""
        # like the real scheduler: a job its own reason holds back (a QOS limit, a dependency) does not start,
        # and this simple scheduler starts single-node jobs only
        pending = [j for j in self.jobs.values() if j.phase is JobPhase.PENDING and j.workload.request.node_count == 1
                   and waits_for_resources(j.workload.scheduler_reason, self.scheduler)
                   and not self._over_quota(j.workload)]
        if not pending:
            return
        pending.sort(key=lambda j: (j.workload.submitted_at or 0.0, j.workload.id))
        state = self.observe()
        cap = Capacity.of_state(state)
        for j in pending:
            r = j.workload.request
            shape = Shape.of(r)
            for i in np.flatnonzero(eligible_mask(state, r) & cap.fits(shape)):
                n = state.nodes[int(i)].name
                if (j.required and n not in j.required) or n in j.excluded:
                    continue
                gpus = cap.pick(int(i), shape)
                if gpus is None:
                    continue
                cap.take(int(i), gpus, shape)
                self._start(j, n, gpus)
                break

    def _over_quota(self, w: Workload) -> bool:
        q = next((q for q in self.quotas if q.namespace == w.namespace), None)
        if q is None:
            return False
        used = q.gpu_used if q.gpu_used is not None else sum(
            x.workload.request.gpus_total for x in self.jobs.values()
            if x.phase in (JobPhase.RUNNING, JobPhase.COMPLETING) and x.workload.namespace == w.namespace)
        return used + w.request.gpus_total > q.gpu_limit

    def _start(self, j: SimJob, node: str, gpus: tuple[int, ...]) -> None:
        """The job starts on `node`; its wrapper restores or starts fresh."""
        wid = j.workload.id
        j.phase, j.nodes, j.gpus = JobPhase.RUNNING, (node,), gpus
        t = j.ticket if j.ticket is not None and j.ticket.id not in j.handled_tickets else None
        how, counter, ckpt, reason = RunPhase.FRESH, 0, None, ""
        if t is not None:
            j.handled_tickets.add(t.id)
            cand = t.ckpt_id or self._latest_verified(wid)
            ok, code = self.verify(cand) if cand else (False, "no checkpoint")
            alt = self._latest_verified(wid) if cand and not ok else None  # the wrapper's fallback
            if ok and "restore-fail" not in self.faults.get(wid, set()):
                how, counter, ckpt = RunPhase.RESTORED, self.checkpoints[str(cand)].counter, cand
            elif alt and alt != cand and "restore-fail" not in self.faults.get(wid, set()):
                how, counter, ckpt = RunPhase.RESTORED, self.checkpoints[alt].counter, alt
                reason = (f"the move's checkpoint was refused, fell back to the newest verified checkpoint {alt} "
                          f"(skipped {cand}: {code})")
            else:
                code = code if not ok else "restore-failed"
                why = f"{t.reason}; restore of {cand or '-'} refused: {code}".lstrip("; ")
                how, reason = RunPhase.COLD_STARTED, why
        elif j.restarts > 0:
            cand = self._latest_verified(wid)
            if cand:
                how, counter, ckpt = RunPhase.RESTORED, self.checkpoints[cand].counter, cand
            else:
                how, reason = RunPhase.COLD_STARTED, "restarted without a usable checkpoint"
        proc = SimProcess(wid, node, counter)
        self.processes.append(proc)
        j.process = proc
        j.status = RunStatus(how, node, t.id if t else None, ckpt, reason, at=self.now)
        self.starts.append(SimStart(self.now, wid, node, how, counter, ckpt, reason))

    def _latest_verified(self, wid: str) -> str | None:
        for c in sorted(self.checkpoints.values(), key=lambda c: c.seq, reverse=True):
            if c.workload_id == wid and not c.corrupt:
                return c.id
        return None

    def _kill(self, j: SimJob) -> None:
        if j.process is not None:
            j.process.alive = False
            j.process = None

    # ------------------------------------------------------------------ invariants
    def alive(self, workload_id: str) -> list[SimProcess]:
        return [p for p in self.processes if p.alive and p.workload_id == workload_id]

    def workloads(self) -> Iterable[str]:
        return self.jobs.keys()
