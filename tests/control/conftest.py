"""Fixtures for the executor and controller tests: a fragmented simulated cluster and a crash-and-restart harness."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpudefrag.control.agent import RunPhase
from gpudefrag.control.executor import Executor, ExecutorConfig
from gpudefrag.control.journal import Journal, Migration, MigrationState
from gpudefrag.core.model import ClusterState, Node, Placement, Request, Workload, WorkloadState
from gpudefrag.engines.sim import SimEngine


def fragmented_state(nodes: int = 4, gpus: int = 8) -> ClusterState:
    """Every node runs a 3-GPU and a 2-GPU job (5 of 8 used); an 8-GPU job waits."""
    ns = [Node(f"node{i}", gpus, partitions=("gpu",)) for i in range(1, nodes + 1)]
    wl = []
    for i, n in enumerate(ns):
        wl.append(Workload(f"a{i + 1}", Request(3, partition="gpu"), name=f"a-{n.name}", submitted_at=1.0 + i,
                           placements=(Placement(n.name, (0, 1, 2)),)))
        wl.append(Workload(f"b{i + 1}", Request(2, partition="gpu"), name=f"b-{n.name}", submitted_at=1.5 + i,
                           placements=(Placement(n.name, (3, 4)),)))
    wl.append(Workload("big", Request(8, partition="gpu"), state=WorkloadState.PENDING, name="big8",
                       submitted_at=100.0))
    return ClusterState.build(ns, wl, now=1000.0)


@pytest.fixture
def state() -> ClusterState:
    return fragmented_state()


class Crash(Exception):
    """Stands for SIGKILL of the controller: nothing after the raise point happens."""


@dataclass
class Move:
    workload_id: str
    source: str
    target: str
    target_gpus: tuple[int, ...] = ()


class CrashyEngine:
    """Wraps the sim engine; after an action took effect, the controller may 'die' before it records more."""

    ACTIONS = ("hold", "release", "requeue_hold", "pin", "request_checkpoint", "set_ticket", "cancel_checkpoint")

    def __init__(self, sim: SimEngine, should_crash: Callable[[str], bool]) -> None:
        self.sim = sim
        self.should_crash = should_crash
        self.name = "sim"

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        attr = getattr(self.sim, name)
        if name not in self.ACTIONS:
            return attr

        def act(*a, **kw):  # type: ignore[no-untyped-def]
            out = attr(*a, **kw)
            if self.should_crash(f"after-{name}"):
                raise Crash(f"after {name}")
            return out

        return act


@dataclass
class Outcome:
    sim: SimEngine
    migrations: list[Migration]
    crashes: int
    max_active: int
    violations: list[str] = field(default_factory=list)
    faults: dict[str, str] = field(default_factory=dict)
    drained: str | None = None


def run_schedule(seed: int, journal_path: Path, *, moves: list[Move] | None = None, crash_p: float = 0.15,
                 fault_p: float = 0.5, drain_p: float = 0.2, max_crashes: int = 6) -> Outcome:
    """One randomised fault schedule: faults per moved job, maybe a drained target, controller crashes at random
    journal writes and after random actions, each followed by a restart from the journal."""
    rng = random.Random(seed)
    sim = SimEngine(fragmented_state(), requeue_delay_s=rng.choice([1.0, 3.0, 6.0]))
    moves = moves or [Move("a1", "node1", "node2"), Move("b1", "node1", "node3")]
    faults: dict[str, str] = {}
    for mv in moves:
        if rng.random() < fault_p:
            f = rng.choice(["checkpoint-fail", "store-full", "corrupt", "restore-fail"])
            sim.inject(mv.workload_id, f)
            faults[mv.workload_id] = f
    drain_at = rng.randint(1, 25) if rng.random() < drain_p else None
    drain_node = rng.choice([mv.target for mv in moves]) if drain_at else None
    config = ExecutorConfig(max_concurrent=rng.choice([1, 2]), max_per_node=rng.choice([1, 2]),
                            checkpoint_timeout_s=60, restore_timeout_s=60,
                            fallback=rng.choice(["rollback", "rollback", "evict"]))
    state = {"crashes": 0}

    def should_crash(_where: str) -> bool:
        if state["crashes"] < max_crashes and rng.random() < crash_p:
            state["crashes"] += 1
            return True
        return False

    def on_write(_m: Migration) -> None:
        if should_crash("journal"):
            raise Crash("after journal write")

    def new_executor() -> tuple[Executor, Journal]:
        j = Journal(journal_path, clock=lambda: sim.now, on_write=on_write)
        return Executor(CrashyEngine(sim, should_crash), CrashyEngine(sim, should_crash), j, config,  # type: ignore[arg-type]
                        clock=lambda: sim.now), j

    ex, journal = new_executor()
    violations: list[str] = []
    max_active = 0
    pending_moves = list(moves)
    for t in range(400):
        try:
            if pending_moves:
                adm = ex.submit(pending_moves, reason="test")
                admitted = {m.workload_id for m in adm.admitted}
                pending_moves = [mv for mv in pending_moves if mv.workload_id not in admitted
                                 and not any(w == mv.workload_id and "already" in why for w, why in adm.deferred)]
            ex.tick()
        except Crash:
            journal.close()
            ex, journal = new_executor()
            # a restarted controller re-plans: moves already journaled are "already being moved"
        active = journal.active()
        max_active = max(max_active, len(active))
        if drain_at is not None and t == drain_at and drain_node:
            sim.drain(drain_node)
        sim.advance(1.0)
        for wid in sim.workloads():
            if len(sim.alive(wid)) > 1:
                violations.append(f"t={t}: {wid} runs {len(sim.alive(wid))} times")
        if not pending_moves and not active and t > 5:
            break
    for _ in range(10):
        sim.advance(1.0)
    journal.on_write = None
    migrations = journal.all()
    journal.close()
    out = Outcome(sim, migrations, state["crashes"], max_active, violations, faults, drain_node)
    out.violations += check_invariants(out, config)
    return out


@pytest.fixture
def schedule_runner() -> Callable[..., Outcome]:
    return run_schedule


def check_invariants(o: Outcome, config: ExecutorConfig) -> list[str]:
    v: list[str] = []
    sim = o.sim
    for m in o.migrations:
        if not m.terminal:
            v.append(f"migration {m.id} ({m.workload_id}) stuck in {m.state.value}")
    if o.max_active > config.max_concurrent:
        v.append(f"{o.max_active} migrations in flight, budget {config.max_concurrent}")
    for wid, job in sim.jobs.items():
        if wid == "big":
            continue
        alive = sim.alive(wid)
        if len(alive) != 1:
            v.append(f"{wid}: {len(alive)} live processes at the end (job {job.phase.value})")
        starts = [s for s in sim.starts if s.workload_id == wid]
        for s in starts[1:]:
            if s.how is RunPhase.FRESH:
                v.append(f"{wid}: restarted from zero without a reason at t={s.at}")
            if s.how is RunPhase.COLD_STARTED and not s.reason:
                v.append(f"{wid}: cold start without a recorded reason")
            if s.how is RunPhase.RESTORED:
                c = sim.checkpoints[str(s.ckpt_id)]
                if c.corrupt or s.counter != c.counter:
                    v.append(f"{wid}: restored from a bad checkpoint {s.ckpt_id}")
        mine = [m for m in o.migrations if m.workload_id == wid]
        last = starts[-1]
        for m in mine:
            if m.state is MigrationState.DONE and (job.nodes != (m.target,) or last.how is not RunPhase.RESTORED):
                v.append(f"{wid}: migration {m.id} done but the job runs on {job.nodes} ({last.how.value})")
            if m.state is MigrationState.COLD_STARTED:
                if not m.reason:
                    v.append(f"{wid}: migration {m.id} cold-started without a reason")
                if last.how is not RunPhase.COLD_STARTED:
                    v.append(f"{wid}: migration {m.id} says cold-started but the job {last.how.value}")
            if m.state is MigrationState.ROLLED_BACK and len(starts) == 1 and job.nodes != (m.source,):
                v.append(f"{wid}: rolled back without a restart but runs on {job.nodes}")
        if not mine and len(starts) != 1:
            v.append(f"{wid}: never moved but started {len(starts)} times")
    return v
