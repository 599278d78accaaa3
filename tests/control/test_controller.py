"""The controller loop on the simulated engine: trigger → filter → plan → execute, dry run, and policy gates."""

from __future__ import annotations

from pathlib import Path

import msgspec

from gpudefrag.control.agent import RunPhase
from gpudefrag.control.controller import Controller
from gpudefrag.control.executor import Executor, ExecutorConfig
from gpudefrag.control.journal import Journal
from gpudefrag.engines.base import JobPhase
from gpudefrag.engines.sim import SimEngine
from gpudefrag.policy import parse_policy
from gpudefrag.snapshot import state_to_dict


def setup(state, tmp_path: Path, policy: dict, *, dry_run: bool = False):  # type: ignore[no-untyped-def]
    sim = SimEngine(state, requeue_delay_s=2.0)
    pol = parse_policy(policy)
    j = Journal(tmp_path / "j.db", clock=lambda: sim.now)
    ex = Executor(sim, sim, j, ExecutorConfig.from_policy(pol), clock=lambda: sim.now)
    c = Controller(sim, pol, None if dry_run else ex, dry_run=dry_run, clock=lambda: sim.now)
    return sim, c, j


POLICY = {"trigger": {"pending": {"longer_than_s": 10}}, "budgets": {"max_concurrent": 4, "max_per_node": 2}}


def test_pending_fragmented_job_gets_a_node(state, tmp_path: Path) -> None:
    sim, c, j = setup(state, tmp_path, POLICY)
    reports = []
    for _ in range(60):
        reports.append(c.cycle())
        sim.advance(1.0)
        if sim.jobs["big"].phase is JobPhase.RUNNING and not j.active():
            break
    assert sim.jobs["big"].phase is JobPhase.RUNNING
    kinds = [d.kind for r in reports for d in r.decisions]
    assert "trigger" in kinds and "submit" in kinds
    # not before the job had waited longer_than_s
    first = next(r for r in reports if any(d.kind == "trigger" for d in r.decisions))
    assert first.at - 100.0 >= 10
    moved = [m for m in j.all()]
    assert moved and all(m.state.value == "done" for m in moved)
    freed = sim.jobs["big"].nodes[0]
    for m in moved:
        assert m.source == freed
        last = [s for s in sim.starts if s.workload_id == m.workload_id][-1]
        assert last.how is RunPhase.RESTORED and sim.jobs[m.workload_id].nodes == (m.target,)
    assert any(e["kind"] == "submit" for e in j.events())


def test_dry_run_changes_nothing(state, tmp_path: Path) -> None:
    sim, c, j = setup(state, tmp_path, POLICY, dry_run=True)
    sim.now = 1000.0
    before = state_to_dict(sim.observe())
    r = c.cycle()
    assert any(d.kind == "dry-run" and "would move" in d.reason for d in r.decisions)
    assert r.plans and r.plans[0].feasible
    assert sim.calls == [] and j.all() == [] and j.events() == []
    assert state_to_dict(sim.observe()) == before


def test_filter_excludes_jobs_and_never_acts(state, tmp_path: Path) -> None:
    pol = {**POLICY, "filter": {"names": ["nothing-*"]}}
    sim, c, j = setup(state, tmp_path, pol)
    r = c.cycle()
    assert r.plans and not r.plans[0].feasible
    assert j.all() == [] and sim.calls == []
    sim2, c2, j2 = setup(state, tmp_path / "n", {**POLICY, "action": {"kind": "never"}})
    r = c2.cycle()
    assert any(d.kind == "skip" and "never" in d.reason for d in r.decisions)
    assert j2.all() == [] and sim2.calls == []


def test_young_or_non_fragmented_pending_jobs_do_not_trigger(state, tmp_path: Path) -> None:
    sim, c, _ = setup(state, tmp_path, {"trigger": {"pending": {"longer_than_s": 10_000}}})
    assert not any(d.kind == "trigger" for d in c.cycle().decisions)
    sim2, c2, _ = setup(state, tmp_path / "2", {"trigger": {"pending": {"longer_than_s": 0, "min_gpus": 9}}})
    assert not any(d.kind == "trigger" for d in c2.cycle().decisions)
    assert sim.calls == [] and sim2.calls == []


def test_explicit_request_frees_a_whole_node(state, tmp_path: Path) -> None:
    _sim, c, j = setup(state, tmp_path, {"trigger": {"pending": None, "on_request": True},
                                        "budgets": {"max_concurrent": 4, "max_per_node": 2}})
    assert not any(d.kind == "trigger" for d in c.cycle().decisions)
    c.request()
    r = c.cycle()
    assert any(d.kind == "trigger" and "explicit request" in d.reason for d in r.decisions)
    assert len(j.active()) == 2


def test_repeated_decisions_are_journaled_once(state, tmp_path: Path) -> None:
    sim, c, j = setup(state, tmp_path, POLICY)
    sim.now = 1000.0
    c.cycle()  # trigger, plan, submit
    n = len(j.events(1000))
    assert n >= 3
    for _ in range(3):  # nothing new happens without time passing: the same decisions repeat
        c.cycle()
    assert len(j.events(1000)) <= n + 2  # at most the "already in flight" skip, once
    kinds = [e["kind"] for e in j.events(1000)]
    assert kinds.count("skip") <= 1


def test_fragmentation_threshold_trigger(state, tmp_path: Path) -> None:
    from gpudefrag.core.fragmentation import frag_report

    ratio = frag_report(state).fgd_ratio
    assert 0 < ratio < 1
    _, low, j = setup(state, tmp_path / "lo", {"trigger": {"pending": None, "fragmentation_above": ratio / 2},
                                               "budgets": {"max_concurrent": 4, "max_per_node": 2}})
    r = low.cycle()
    assert any(d.kind == "trigger" and "fragmentation" in d.reason and "whole node" in d.reason
               for d in r.decisions)
    assert r.plans[0].feasible and len(j.active()) == len(r.plans[0].moves)
    _, high, j2 = setup(state, tmp_path / "hi", {"trigger": {"pending": None, "fragmentation_above": 0.99}})
    assert not any(d.kind == "trigger" for d in high.cycle().decisions) and j2.all() == []


def test_cron_trigger_fires_after_its_time(state, tmp_path: Path) -> None:
    sim, c, j = setup(state, tmp_path, {"trigger": {"pending": None, "cron": "*/5 * * * *"},
                                        "budgets": {"max_concurrent": 4, "max_per_node": 2}})
    sim.now = 0.0
    assert not any(d.kind == "trigger" for d in c.cycle().decisions)  # arms the schedule
    sim.now = 100.0
    assert not any(d.kind == "trigger" for d in c.cycle().decisions)  # next fire time 300 s not reached
    sim.now = 301.0
    r = c.cycle()
    assert any(d.kind == "trigger" and "cron" in d.reason for d in r.decisions) and j.active()


def test_only_jobs_under_the_wrapper_are_planned_to_move(state, tmp_path: Path) -> None:
    from gpudefrag.control.agent import FileAgent, JobDir
    from gpudefrag.control.controller import Controller
    from gpudefrag.fileio import write_json_atomic

    agent = FileAgent(tmp_path / "run", store=None)
    assert not agent.has_wrapper("a1")
    write_json_atomic(JobDir(tmp_path / "run", "a1").status, {"phase": "fresh", "node": "node1"})
    write_json_atomic(JobDir(tmp_path / "run", "b1").status, {"phase": "checkpointed", "node": "node1"})
    assert agent.has_wrapper("a1") and not agent.has_wrapper("b1")
    sim = SimEngine(state)
    pol = parse_policy(POLICY)
    none = Controller(sim, pol, None, dry_run=True, clock=lambda: sim.now, can_checkpoint=lambda w: False)
    assert not none.cycle().plans[0].feasible
    some = Controller(sim, pol, None, dry_run=True, clock=lambda: sim.now,
                      can_checkpoint=lambda w: w.id in {"a1", "b1", "a2", "b2"})
    plan = some.cycle().plans[0]
    assert plan.feasible and {m.workload_id for m in plan.moves} <= {"a1", "b1", "a2", "b2"}


# ---------------------------------------------------------------------------------------------- started plans
ONE_PER_NODE = {"trigger": {"pending": {"longer_than_s": 10}}, "budgets": {"max_concurrent": 4, "max_per_node": 1}}


def _run(sim, c, cycles: int = 80):  # type: ignore[no-untyped-def]
    reports = []
    for _ in range(cycles):
        reports.append(c.cycle())
        sim.advance(1.0)
        if any(d.kind in ("plan-finished", "plan-stopped") for d in reports[-1].decisions):
            break
    return reports


def test_a_plan_the_budget_splits_is_carried_to_its_end(state, tmp_path: Path) -> None:
    """max_per_node: 1 admits one of the plan's two moves off the node; the second follows in a later cycle, the
    same node is freed, and the output says the plan started with 1 of 2 and then finished."""
    sim, c, j = setup(state, tmp_path, ONE_PER_NODE)
    reports = _run(sim, c)
    kinds = [d.kind for r in reports for d in r.decisions]
    started = next(d for r in reports for d in r.decisions if d.kind == "plan-started")
    assert "1 of 2 move(s) started, 1 more in following cycles" in started.reason
    assert "1 move(s) per node in flight" in started.reason
    assert "plan-waiting" in kinds  # the second move waited while the first was in flight
    fin = next(d for r in reports for d in r.decisions if d.kind == "plan-finished")
    assert "2 of 2 move(s) made" in fin.reason and fin.detail["plan"] == started.detail["plan"]
    moved = j.all()
    assert len(moved) == 2 and all(m.state.value == "done" for m in moved)
    assert len({m.source for m in moved}) == 1 and moved[0].id < moved[1].id
    assert moved[1].created_at >= moved[0].updated_at  # one at a time on the node, as the budget says
    assert {m.data["plan"]["id"] for m in moved} == {started.detail["plan"]}
    for _ in range(20):
        if sim.jobs["big"].phase is JobPhase.RUNNING:
            break
        sim.advance(1.0)
    assert sim.jobs["big"].nodes == (moved[0].source,)
    assert reports[-1].open_plans == []


def test_a_restarted_controller_takes_up_a_started_plan_from_the_journal(state, tmp_path: Path) -> None:
    sim, c, j = setup(state, tmp_path, ONE_PER_NODE)
    sim.now = 1000.0
    first = c.cycle()
    assert any(d.kind == "plan-started" for d in first.decisions) and len(j.all()) == 1
    pid = first.open_plans[0]["id"]
    # the controller dies; a new one over the same journal finishes the plan instead of making another
    c2 = Controller(sim, parse_policy(ONE_PER_NODE), Executor(sim, sim, j, ExecutorConfig(4, 1), clock=lambda: sim.now),
                    clock=lambda: sim.now)
    assert list(c2.plans) == [pid] and [m.label() for m in c2.plans[pid].remaining()] == \
        [f"{m['workload']} {m['source']}->{m['target']}" for m in j.all()[0].data["plan"]["moves"][1:]]
    reports = _run(sim, c2)
    assert any(d.kind == "plan-finished" and d.detail["plan"] == pid for d in reports[-1].decisions)
    assert len(j.all()) == 2 and {m.data["plan"]["id"] for m in j.all()} == {pid}


def test_a_plan_the_hourly_budget_cannot_finish_is_not_started(state, tmp_path: Path) -> None:
    pol = {**ONE_PER_NODE, "budgets": {"max_concurrent": 4, "max_per_node": 2, "max_per_hour": 1}}
    sim, c, j = setup(state, tmp_path, pol)
    sim.now = 1000.0
    r = c.cycle()
    d = next(d for d in r.decisions if d.kind == "plan-not-started")
    assert "needs 2 move(s) and the budget allows 1 more this hour" in d.reason
    assert j.all() == [] and r.open_plans == []


def test_a_plan_whose_move_fails_is_stopped_and_says_so(state, tmp_path: Path) -> None:
    sim, c, j = setup(state, tmp_path, ONE_PER_NODE)
    sim.now = 1000.0
    r = c.cycle()
    first = j.all()[0]
    assert any(d.kind == "plan-started" for d in r.decisions)
    sim.inject(first.workload_id, "checkpoint-fail")
    reports = _run(sim, c)
    stop = next(d for d in reports[-1].decisions if d.kind == "plan-stopped")
    assert f"stopped after 0 of 2 move(s): migration {first.id} of {first.workload_id} rolled-back" in stop.reason
    assert "is not freed" in stop.reason
    # the plan's second move was never started (the pending job may get a new plan of its own)
    assert [m.id for m in j.all() if m.data["plan"]["id"] == stop.detail["plan"]] == [first.id]


def test_controller_once_carries_the_plan_to_its_end(state, tmp_path: Path) -> None:
    """`controller --once` with max_per_node: 1 makes both moves of the plan and says the plan finished."""
    import subprocess
    import sys

    import yaml

    from gpudefrag.snapshot import save_snapshot

    snap, pol = tmp_path / "snap.json", tmp_path / "pol.yaml"
    save_snapshot(snap, state)
    pol.write_text(yaml.safe_dump({"trigger": {"pending": {"longer_than_s": 10}, "on_request": True},
                                   "budgets": {"max_concurrent": 4, "max_per_node": 1}}))
    p = subprocess.run([sys.executable, "-m", "gpudefrag.cli.main", "controller", "--engine", "sim", "--snapshot",
                        str(snap), "--policy", str(pol), "--journal", str(tmp_path / "j.db"), "--once"],
                       capture_output=True, text=True, timeout=120, env={"COLUMNS": "200", "PATH": "/usr/bin"})
    assert p.returncode == 0, p.stdout + p.stderr
    out = " ".join(p.stdout.split())
    assert "1 of 2 move(s) started, 1 more in following cycles" in out, out
    assert "finished: 2 of 2 move(s) made" in out, out
    moved = Journal(tmp_path / "j.db", readonly=True).all()
    assert len(moved) == 2 and all(m.state.value == "done" for m in moved)


def test_controller_log_lines_stay_whole_on_a_narrow_pipe(state, tmp_path: Path) -> None:
    """A log line is one line whatever the console's width (a container's stdout is a pipe, 80 columns to Rich):
    each starts with its time, and the long ones are not broken where `kubectl logs | grep` would miss them."""
    import re
    import subprocess
    import sys

    import yaml

    from gpudefrag.snapshot import save_snapshot

    snap, pol = tmp_path / "snap.json", tmp_path / "pol.yaml"
    save_snapshot(snap, state)
    pol.write_text(yaml.safe_dump({"trigger": {"pending": {"longer_than_s": 10}, "on_request": True},
                                   "budgets": {"max_concurrent": 4, "max_per_node": 1}}))
    p = subprocess.run([sys.executable, "-m", "gpudefrag.cli.main", "controller", "--engine", "sim", "--snapshot",
                        str(snap), "--policy", str(pol), "--journal", str(tmp_path / "j.db"), "--once"],
                       capture_output=True, text=True, timeout=120, env={"COLUMNS": "40", "PATH": "/usr/bin"})
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    assert lines and all(re.match(r"\d\d:\d\d:\d\d ", ln) for ln in lines), p.stdout
    assert any(len(ln) > 40 and "finished: 2 of 2 move(s) made" in ln for ln in lines), p.stdout


def _held(state):  # type: ignore[no-untyped-def]

    return state.with_workloads([msgspec.structs.replace(w, scheduler_reason="JobHeldAdmin") if w.id == "big" else w
                                 for w in state.workloads])


def test_a_held_job_gets_no_moves_from_any_door_unless_asked_in_so_many_words(state, tmp_path: Path) -> None:
    """Issue 32: with the pending job held (JobHeldAdmin), neither the pending trigger nor an explicit request
    ("free a whole node") moves anything, and the skip names the job and its cause; --plan-anyway does."""
    held = _held(state)
    pol = {"trigger": {"pending": {"longer_than_s": 0}, "on_request": True},
           "budgets": {"max_concurrent": 4, "max_per_node": 2}}
    sim, c, j = setup(held, tmp_path, pol)
    c.request()
    r = c.cycle()
    assert j.all() == [] and sim.calls == [], [d.as_dict() for d in r.decisions]
    skips = [d.reason for d in r.decisions if d.kind == "skip"]
    assert any("big" in s and "not-eligible" in s and "JobHeldAdmin" in s and "--plan-anyway" in s for s in skips)
    _sim2, c2, j2 = setup(held, tmp_path / "anyway", {**pol, "trigger": {**pol["trigger"], "plan_anyway": True}})
    r2 = c2.cycle()
    assert j2.all(), [d.as_dict() for d in r2.decisions]
    assert any(d.kind == "trigger" and "planned anyway" in d.reason for d in r2.decisions)
    sim3 = SimEngine(held, requeue_delay_s=2.0)
    p3 = parse_policy({**pol, "trigger": {"pending": None, "on_request": True}})
    j3 = Journal(tmp_path / "j3.db", clock=lambda: sim3.now)
    c3 = Controller(sim3, p3, Executor(sim3, sim3, j3, ExecutorConfig.from_policy(p3), clock=lambda: sim3.now),
                    clock=lambda: sim3.now, plan_anyway=True)
    c3.request()
    r3 = c3.cycle()
    assert any(d.kind == "trigger" and "explicit request" in d.reason for d in r3.decisions) and j3.all()


def test_a_filter_that_excludes_every_job_is_named_with_its_count(state, tmp_path: Path) -> None:
    """The docs' `max_priority: 10000` under Slurm's default priorities (~4.29e9): the no-plan decision says
    which filter excluded how many jobs instead of only "no set of its movable workloads makes room"."""

    slurmish = state.with_workloads([msgspec.structs.replace(w, priority=4_294_901_758) for w in state.workloads])
    _sim, c, j = setup(slurmish, tmp_path, {**POLICY, "filter": {"max_priority": 10000}})
    _sim.now = 1000.0
    r = c.cycle()
    no_plan = [d.reason for d in r.decisions if d.kind == "plan" and "no plan" in d.reason]
    assert no_plan and "0 of 8 running jobs may move (excluded: 8 by filter.max_priority <= 10000)" in no_plan[0]
    assert j.all() == []

def test_migrations_finds_the_journal_the_controller_kept(state, tmp_path: Path) -> None:
    """`migrations` without --journal reads the journal the last controller run here kept (not only the default
    path); with none, one error line saying where it looked and what to pass."""
    import json
    import subprocess
    import sys

    import yaml

    from gpudefrag.snapshot import save_snapshot

    env = {"PATH": "/usr/bin", "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state"),
           "GPUDEFRAG_STATE_DIR": str(tmp_path / "nowhere")}
    cmd = [sys.executable, "-m", "gpudefrag.cli.main"]
    p = subprocess.run([*cmd, "migrations"], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2 and "pass --journal PATH" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    snap, pol = tmp_path / "snap.json", tmp_path / "pol.yaml"
    save_snapshot(snap, state)
    pol.write_text(yaml.safe_dump({"trigger": {"pending": {"longer_than_s": 10}, "on_request": True}}))
    p = subprocess.run([*cmd, "controller", "--engine", "sim", "--snapshot", str(snap), "--policy", str(pol),
                        "--journal", str(tmp_path / "elsewhere" / "j.db"), "--once"], capture_output=True,
                       text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([*cmd, "migrations", "--json"], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["journal"] == str(tmp_path / "elsewhere" / "j.db") and len(doc["migrations"]) == 2


def test_migrations_history_keeps_ids_whole_and_fits_80_columns(tmp_path: Path) -> None:
    """Issue 32: `gpudefrag migrations` in an 80-column terminal: the steps and the reason wrap inside their
    columns, and a checkpoint id in the reason is folded, never cut with an ellipsis."""
    import os
    import subprocess
    import sys

    from gpudefrag.control.journal import MigrationState as S

    j = Journal(tmp_path / "j.db")
    m = j.create("12345", "node1", "node2", reason="test")
    ckpt = "12345-20261204T184912141343Z-6c8b3b"
    why = f"checkpoint {ckpt} failed verification (hash-mismatch)"
    for st in (S.CHECKPOINTING, S.CHECKPOINTED, S.ROLLING_BACK, S.REQUEUED_HELD, S.PINNED, S.RELEASED,
               S.RESTORING, S.ROLLING_BACK, S.REQUEUED_HELD, S.PINNED, S.RELEASED, S.RESTORING, S.ROLLED_BACK):
        m = j.transition(m.id, st, detail=why, reason=why)
    p = subprocess.run([sys.executable, "-m", "gpudefrag.cli.main", "migrations", "--journal", str(tmp_path / "j.db")],
                       capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"}, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert all(len(x) <= 80 for x in lines) and "…" not in p.stdout, p.stdout
    assert p.stdout.count("rolling-back") == 2 and "rolled-back" in p.stdout


def _cpu_held():  # type: ignore[no-untyped-def]
    """node1: 8 GPUs free, 12 of 16 cores held by the CPU-only job cpu1; node2: its 8 GPUs held by a pinned job,
    14 cores free; big (8 GPUs, 8 cores) waits."""
    from gpudefrag.core.model import ClusterState, Node, Placement, Request, Workload, WorkloadState

    ns = [Node(f"node{i}", 8, cpu_milli=16_000, partitions=("gpu",)) for i in (1, 2)]
    wl = [Workload("cpu1", Request(0, cpu_milli=12_000, partition="gpu"), name="cpu-cache", submitted_at=1.0,
                   placements=(Placement("node1", ()),)),
          Workload("x", Request(8, cpu_milli=2_000, partition="gpu"), name="pinned", submitted_at=2.0,
                   placements=(Placement("node2", tuple(range(8))),), movable=False, movable_reason="pinned"),
          Workload("big", Request(8, cpu_milli=8_000, partition="gpu"), state=WorkloadState.PENDING, name="big8",
                   submitted_at=100.0)]
    return ClusterState.build(ns, wl, now=1000.0)


def test_cpu_held_by_a_job_the_filter_lets_move_is_moved_and_one_it_keeps_is_a_skip(tmp_path: Path) -> None:
    """The pending trigger diagnoses with the controller's own filter, as the decision does: the CPU-only job
    that holds the CPU where the GPUs are free is moved when the filter lets it (fragmentation-cpu-memory), and
    when the filter keeps it the job is skipped as blocked by cpu-or-memory, nothing planned."""
    sim, c, j = setup(_cpu_held(), tmp_path, POLICY)
    for _ in range(60):
        c.cycle()
        sim.advance(1.0)
        if sim.jobs["big"].phase is JobPhase.RUNNING and not j.active():
            break
    assert sim.jobs["big"].phase is JobPhase.RUNNING and sim.jobs["big"].nodes == ("node1",)
    assert [(m.workload_id, m.source, m.target) for m in j.all()] == [("cpu1", "node1", "node2")]
    sim2, c2, j2 = setup(_cpu_held(), tmp_path / "kept", {**POLICY, "filter": {"names": ["big*", "pinned"]}})
    r = c2.cycle()
    assert not any(d.kind == "trigger" for d in r.decisions) and not r.plans
    assert any(d.kind == "skip" and "cpu-or-memory" in d.reason for d in r.decisions), r.decisions
    assert j2.all() == [] and sim2.calls == []


def test_a_job_no_plan_can_help_does_not_keep_the_next_waiting(tmp_path: Path) -> None:
    """The oldest pending job (8 GPUs) needs two moves, the policy allows one per plan: no plan helps it. The
    next two (4 GPUs) need one each. With `max_tries_per_cycle` 1 the cycle stops at the first job, as the trigger
    once did (oldest only); by default it goes on to the second, and starts `max_plans_per_cycle` plans."""
    from gpudefrag.core.model import ClusterState, Request, Workload, WorkloadState

    from .conftest import fragmented_state

    base = fragmented_state()
    young = [Workload(f"four{k}", Request(4, partition="gpu"), state=WorkloadState.PENDING, name=f"four{k}",
                      submitted_at=200.0 + k) for k in range(2)]
    state = ClusterState.build(base.nodes, (*base.workloads, *young), now=1000.0)
    pol = {**POLICY, "budgets": {**POLICY["budgets"], "max_moves_per_plan": 1}}
    _sim, c, _ = setup(state, tmp_path / "one", {**pol, "budgets": {**pol["budgets"], "max_tries_per_cycle": 1}},
                       dry_run=True)
    r = c.cycle()
    assert [p.feasible for p in r.plans] == [False] and not any(d.kind == "dry-run" for d in r.decisions)
    _sim, c, _ = setup(state, tmp_path / "four", pol, dry_run=True)
    r = c.cycle()
    assert [p.feasible for p in r.plans] == [False, True]  # the third is not planned: one plan a cycle
    assert [d.detail["workload"] for d in r.decisions if d.kind == "dry-run"] == ["four0"]
    _sim, c, _ = setup(state, tmp_path / "two", {**pol, "budgets": {**pol["budgets"], "max_plans_per_cycle": 2}},
                       dry_run=True)
    r = c.cycle()
    assert [d.detail["workload"] for d in r.decisions if d.kind == "dry-run"] == ["four0", "four1"]


def test_jobs_of_a_request_with_no_plan_this_cycle_are_not_planned_again(tmp_path: Path) -> None:
    """Two 8-GPU jobs of one request that no plan can help (one move a plan, two needed), then a 4-GPU job one
    move helps: the second 8-GPU job gets the first one's answer without a second planner run, so the cycle's
    tries reach the 4-GPU job even with `max_tries_per_cycle` 2. A different request is still planned."""
    from gpudefrag.core.model import ClusterState, Request, Workload, WorkloadState

    from .conftest import fragmented_state

    base = fragmented_state()
    more = [Workload("big2", Request(8, partition="gpu"), state=WorkloadState.PENDING, name="big8b",
                     submitted_at=150.0),
            Workload("four", Request(4, partition="gpu"), state=WorkloadState.PENDING, name="four",
                     submitted_at=200.0)]
    state = ClusterState.build(base.nodes, (*base.workloads, *more), now=1000.0)
    pol = {**POLICY, "budgets": {**POLICY["budgets"], "max_moves_per_plan": 1, "max_tries_per_cycle": 2}}
    _sim, c, _ = setup(state, tmp_path, pol, dry_run=True)
    r = c.cycle()
    assert [p.feasible for p in r.plans] == [False, True]
    same = [d for d in r.decisions if d.kind == "skip" and "same request" in d.reason]
    assert [d.detail["workload"] for d in same] == ["big2"]
    assert [d.detail["workload"] for d in r.decisions if d.kind == "dry-run"] == ["four"]
