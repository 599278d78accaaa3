"""The migration state machine against the simulated engine: the happy path, each failure, the budget, and
>= 1,000 randomised fault schedules with controller crashes (real SQLite journal, restarted from disk)."""

from __future__ import annotations

import collections
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpudefrag.control.agent import RunPhase
from gpudefrag.control.executor import Executor, ExecutorConfig
from gpudefrag.control.journal import Journal, MigrationState
from gpudefrag.engines.base import JobPhase
from gpudefrag.engines.sim import SimEngine

S = MigrationState


@dataclass
class Move:
    workload_id: str
    source: str
    target: str


def drive(ex: Executor, sim: SimEngine, steps: int = 80) -> None:
    for _ in range(steps):
        ex.tick()
        if not ex.active():
            return
        sim.advance(1.0)
    raise AssertionError(f"migrations still active: {[(m.id, m.state.value) for m in ex.active()]}")


def make(state, tmp_path: Path, **cfg) -> tuple[SimEngine, Executor, Journal]:  # type: ignore[no-untyped-def]
    sim = SimEngine(state, requeue_delay_s=3.0)
    j = Journal(tmp_path / "journal.db", clock=lambda: sim.now)
    return sim, Executor(sim, sim, j, ExecutorConfig(**cfg), clock=lambda: sim.now), j


def test_happy_path_moves_with_state_through_every_state(state, tmp_path: Path) -> None:
    sim, ex, j = make(state, tmp_path)
    for _ in range(5):
        sim.advance(1.0)  # the job makes progress before the move
    adm = ex.submit([Move("a1", "node1", "node2")], reason="test")
    assert len(adm.admitted) == 1
    drive(ex, sim)
    m = j.all()[0]
    assert m.state is S.DONE
    states = [s["state"] for s in j.steps(m.id)]
    assert states == ["planned", "checkpointing", "checkpointed", "requeued-held", "pinned", "released",
                      "restoring", "running-on-target", "done"]
    job = sim.jobs["a1"]
    assert job.nodes == ("node2",)
    last = [s for s in sim.starts if s.workload_id == "a1"][-1]
    assert last.how is RunPhase.RESTORED
    ckpt = sim.checkpoints[str(last.ckpt_id)]
    assert ckpt.counter >= 5 and last.counter == ckpt.counter  # continued, not from zero
    assert len(sim.alive("a1")) == 1


def test_history_matches_the_dashboard_contract(state, tmp_path: Path) -> None:
    sim, ex, _j = make(state, tmp_path)
    ex.submit([Move("a1", "node1", "node2"), Move("a3", "node3", "node4")], reason="test")
    drive(ex, sim)
    h = Journal(tmp_path / "journal.db").history(limit=1)
    assert len(h) == 1 and h[0]["workload_id"] == "a3"  # newest first
    assert set(h[0]) == {"id", "workload_id", "source", "target", "state", "reason", "created_at", "updated_at",
                         "steps"}
    assert all(set(s) == {"state", "at", "detail"} for s in h[0]["steps"])
    assert h[0]["steps"][-1]["state"] == "done"


@pytest.mark.parametrize("fault", ["checkpoint-fail", "store-full"])
def test_failed_checkpoint_leaves_the_job_running_where_it_was(state, tmp_path: Path, fault: str) -> None:
    sim, ex, j = make(state, tmp_path)
    sim.inject("a1", fault)
    ex.submit([Move("a1", "node1", "node2")], reason="test")
    drive(ex, sim)
    m = j.all()[0]
    assert m.state is S.ROLLED_BACK
    assert fault.replace("-fail", "-failed") in m.reason or fault in m.reason
    assert sim.jobs["a1"].nodes == ("node1",) and len([s for s in sim.starts if s.workload_id == "a1"]) == 1
    assert ("requeue_hold", "a1") not in sim.calls


def test_evict_fallback_restarts_on_target_with_reason(state, tmp_path: Path) -> None:
    sim, ex, j = make(state, tmp_path, fallback="evict")
    sim.inject("a1", "checkpoint-fail")
    ex.submit([Move("a1", "node1", "node2")], reason="test")
    drive(ex, sim)
    m = j.all()[0]
    assert m.state is S.COLD_STARTED and "evicted" in m.reason
    assert sim.jobs["a1"].nodes == ("node2",)


def test_corrupt_checkpoint_rolls_back_to_source_cold(state, tmp_path: Path) -> None:
    sim, ex, j = make(state, tmp_path)
    sim.inject("a1", "corrupt")
    ex.submit([Move("a1", "node1", "node2")], reason="test")
    drive(ex, sim)
    m = j.all()[0]
    assert m.state is S.COLD_STARTED
    assert "verification" in m.reason and "hash-mismatch" in m.reason
    assert sim.jobs["a1"].nodes == ("node1",)
    assert "rolling-back" in [s["state"] for s in j.steps(m.id)]


def test_restore_failure_cold_starts_on_target_with_reason(state, tmp_path: Path) -> None:
    sim, ex, j = make(state, tmp_path)
    sim.inject("a1", "restore-fail")
    ex.submit([Move("a1", "node1", "node2")], reason="test")
    drive(ex, sim)
    m = j.all()[0]
    assert m.state is S.COLD_STARTED and "restore-failed" in m.reason
    assert sim.jobs["a1"].nodes == ("node2",)


def test_target_drained_mid_move_rolls_back_with_state(state, tmp_path: Path) -> None:
    sim, ex, j = make(state, tmp_path)
    ex.submit([Move("a1", "node1", "node2")], reason="test")
    for _ in range(40):
        ex.tick()
        m = j.all()[0]
        if m.state is S.REQUEUED_HELD:
            sim.drain("node2")
        if m.terminal:
            break
        sim.advance(1.0)
    m = j.all()[0]
    assert m.state is S.ROLLED_BACK and "drained" in m.reason
    assert sim.jobs["a1"].nodes == ("node1",)
    last = [s for s in sim.starts if s.workload_id == "a1"][-1]
    assert last.how is RunPhase.RESTORED


def test_budget_defers_with_reason(state, tmp_path: Path) -> None:
    _sim, ex, _j = make(state, tmp_path, max_concurrent=1)
    adm = ex.submit([Move("a1", "node1", "node2"), Move("a3", "node3", "node4")], reason="test")
    assert [m.workload_id for m in adm.admitted] == ["a1"]
    assert adm.deferred == (("a3", "budget: 1 moves in flight"),)
    _sim2, ex2, _ = make(state, tmp_path / "2", max_per_node=1, max_concurrent=5)
    adm = ex2.submit([Move("a1", "node1", "node2"), Move("b1", "node1", "node3")], reason="test")
    assert [m.workload_id for m in adm.admitted] == ["a1"]
    assert "per node" in adm.deferred[0][1] and "node1" in adm.deferred[0][1]


def test_vanished_job_aborts_without_action(state, tmp_path: Path) -> None:
    sim, ex, j = make(state, tmp_path)
    ex.submit([Move("zz", "node1", "node2")], reason="test")
    drive(ex, sim)
    m = j.all()[0]
    assert m.state is S.ABORTED and "gone" in m.reason
    assert sim.calls == []


@pytest.mark.parametrize("crash_state", [s.value for s in S if s.value not in
                                         ("done", "rolled-back", "cold-started", "aborted", "rolling-back")])
def test_crash_right_after_each_journaled_step_resumes(state, tmp_path: Path, crash_state: str) -> None:
    """The controller dies right after a transition became durable (before acting); a new one resumes."""
    sim = SimEngine(state, requeue_delay_s=2.0)
    crashed = []

    def hook(m):  # type: ignore[no-untyped-def]
        if m.state.value == crash_state and not crashed:
            crashed.append(m.id)
            raise RuntimeError("SIGKILL")

    j = Journal(tmp_path / "j.db", clock=lambda: sim.now, on_write=hook)
    ex = Executor(sim, sim, j, clock=lambda: sim.now)
    for _ in range(3):
        sim.advance(1.0)
    with pytest.raises(RuntimeError):
        ex.submit([Move("a1", "node1", "node2")], reason="test")
        for _ in range(60):
            ex.tick()
            sim.advance(1.0)
    assert crashed
    j.close()
    j2 = Journal(tmp_path / "j.db", clock=lambda: sim.now)
    ex2 = Executor(sim, sim, j2, clock=lambda: sim.now)
    assert [m.state.value for m in ex2.active()] == [crash_state]
    drive(ex2, sim)
    m = j2.all()[0]
    assert m.state is S.DONE
    assert sim.jobs["a1"].nodes == ("node2",) and len(sim.alive("a1")) == 1
    assert sum(1 for c in sim.calls if c == ("requeue_hold", "a1")) == 1


def test_randomised_fault_schedules(tmp_path: Path, schedule_runner) -> None:  # type: ignore[no-untyped-def]
    """>= 1,000 schedules: random faults, drained targets and controller crashes; every job ends up running
    exactly once with its state (or cold-started with a recorded reason), and no migration is left open."""
    n = 1000
    shm = Path("/dev/shm")
    if shm.is_dir():  # the same SQLite WAL journal, on tmpfs: 1,000 x ~20 fsyncs would dominate the run time
        tmp_path = Path(tempfile.mkdtemp(dir=shm, prefix="gpudefrag-sched-"))
    outcomes: collections.Counter[str] = collections.Counter()
    crashes = 0
    bad: list[str] = []
    for seed in range(n):
        o = schedule_runner(seed, tmp_path / f"s{seed}.db")
        crashes += o.crashes
        for m in o.migrations:
            outcomes[m.state.value] += 1
        if o.violations:
            bad.append(f"seed {seed} faults={o.faults} drained={o.drained}: {o.violations}")
        (tmp_path / f"s{seed}.db").unlink()
        for extra in ("-wal", "-shm"):
            (tmp_path / f"s{seed}.db{extra}").unlink(missing_ok=True)
    if str(tmp_path).startswith("/dev/shm/"):
        shutil.rmtree(tmp_path, ignore_errors=True)
    print(f"\n{n} randomised fault schedules, {crashes} controller crashes, outcomes {dict(outcomes)}")
    assert not bad, "\n".join(bad[:10])
    # the schedules exercised every ending
    assert {"done", "rolled-back", "cold-started"} <= set(outcomes)
    assert crashes > n


def test_rollback_whose_source_is_taken_goes_where_there_is_room(tmp_path: Path) -> None:
    """Issue 32: the move's checkpoint fails verification, the rollback requeues the job, and the pending 8-GPU
    job takes its source in the same breath. The rollback re-reads the cluster and sends the job to the node
    with room (here the target) instead of waiting on the taken source: it ends, bounded, running once."""
    from gpudefrag.core.model import ClusterState, Node, Placement, Request, Workload, WorkloadState

    nodes = [Node("node1", 8), Node("node2", 8)]
    wl = [Workload("a1", Request(2), placements=(Placement("node1", (0, 1)),), submitted_at=1.0),
          Workload("b2", Request(4), placements=(Placement("node2", (0, 1, 2, 3)),), submitted_at=2.0),
          Workload("big", Request(8), state=WorkloadState.PENDING, submitted_at=3.0)]
    sim, ex, j = make(ClusterState.build(nodes, wl, now=1000.0), tmp_path, restore_timeout_s=30)
    sim.inject("a1", "corrupt")
    ex.submit([Move("a1", "node1", "node2")], reason="test")
    drive(ex, sim, steps=60)  # well inside one restore timeout per try
    m = j.all()[0]
    assert m.state is S.COLD_STARTED or m.state is S.ROLLED_BACK, m.as_dict()
    assert sim.jobs["big"].nodes == ("node1",) and sim.jobs["a1"].nodes == ("node2",)
    assert len(sim.alive("a1")) == 1
    details = [s["detail"] for s in j.steps(m.id)]
    assert any("node1 was taken meanwhile" in d for d in details), details
    assert any("to node2, which has room now" in d for d in details), details
    assert all("pinning to " not in d or d.strip() != "held; pinning to" for d in details)


def test_rollback_with_no_room_anywhere_is_left_queued_for_any_node(tmp_path: Path) -> None:
    """No node has room for the rolled-back job: no node is named or excluded, and the migration ends after
    the restore timeout with the job queued where any node can take it (never an endless wait)."""
    from gpudefrag.core.model import ClusterState, Node, Placement, Request, Workload, WorkloadState

    nodes = [Node("node1", 8), Node("node2", 8)]
    wl = [Workload("a1", Request(2), placements=(Placement("node1", (0, 1)),), submitted_at=1.0),
          Workload("b2", Request(7), placements=(Placement("node2", tuple(range(7))),), submitted_at=2.0),
          Workload("big", Request(8), state=WorkloadState.PENDING, submitted_at=3.0)]
    sim, ex, j = make(ClusterState.build(nodes, wl, now=1000.0), tmp_path, restore_timeout_s=20)
    sim.inject("a1", "corrupt")
    ex.submit([Move("a1", "node1", "node2")], reason="test")
    drive(ex, sim, steps=120)
    m = j.all()[0]
    assert m.state is S.ROLLED_BACK and "left queued for any node" in m.reason, m.as_dict()
    assert sim.jobs["a1"].phase is JobPhase.PENDING
    assert sim.jobs["a1"].required == () and sim.jobs["a1"].excluded == ()


def test_a_move_checkpoint_corrupt_at_restore_falls_back_to_the_newest_verified(state, tmp_path: Path) -> None:
    """Issue 32: the move's checkpoint verified, then turned corrupt before the restore; a heartbeat checkpoint
    exists: the job restores the heartbeat (not a cold start from step 1), and the journal says so."""
    sim, ex, j = make(state, tmp_path)
    sim.request_checkpoint("a1", "hb1", stop=False)  # a heartbeat: --leave-running
    sim.advance(1.0)
    hb = sim.checkpoint_status("a1", "hb1").ckpt_id
    assert hb is not None and sim.alive("a1")
    ex.submit([Move("a1", "node1", "node2")], reason="test")
    for _ in range(80):
        ex.tick()
        m = j.all()[0]
        if m.state is S.RELEASED and m.data.get("ckpt_id"):
            sim.checkpoints[str(m.data["ckpt_id"])].corrupt = True  # after verification, before the restore
        if m.terminal:
            break
        sim.advance(1.0)
    m = j.all()[0]
    assert m.state is S.DONE and "fell back to the newest verified checkpoint" in m.reason and hb in m.reason
    last = [s for s in sim.starts if s.workload_id == "a1"][-1]
    assert last.how is RunPhase.RESTORED and last.ckpt_id == hb
    assert sim.jobs["a1"].nodes == ("node2",) and len(sim.alive("a1")) == 1
