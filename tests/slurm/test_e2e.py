"""End to end on real Slurm with real CRIU: a fragmented cluster, an 8-GPU job pending, the controller moves
the jobs of one node with their state, the 8-GPU job starts; and the same with the controller SIGKILLed right
after each journaled step and restarted. Dry run: the Slurm state before and after is identical."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import time

import pytest

from gpudefrag.control.journal import Journal

pytestmark = [pytest.mark.slurm, pytest.mark.criu, pytest.mark.slow]


def fragment(c, layout: dict[str, list[int]]) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Submit wrapper jobs `w-<node>-<i>` with the given GPU counts per node; wait until they all step."""
    jobs = {}
    for node, sizes in layout.items():
        for i, g in enumerate(sizes):
            jobs[f"w-{node}-{i}"] = c.submit(f"w-{node}-{i}", g, node)
    c.wait_running(*jobs.values())
    for name in jobs:
        c.wait_steps(name, 3)
    return jobs


def slurm_state(c) -> list[tuple]:  # type: ignore[no-untyped-def,type-arg]
    doc = json.loads(c.sh("squeue", "--json"))
    jobs = sorted((j["job_id"], j["job_state"], j["nodes"], tuple(j.get("gres_detail") or ()), j["required_nodes"],
                   j["excluded_nodes"], j["priority"], j["restart_cnt"]) for j in doc["jobs"])
    nodes = c.sh("sinfo", "-h", "-N", "-o", "%N %T %E")
    return [*jobs, nodes]


def test_controller_moves_one_node_and_the_8gpu_job_runs(cluster, record_property) -> None:  # type: ignore[no-untyped-def]
    c = cluster
    jobs = fragment(c, {n: [3, 2] for n in ("node1", "node2", "node3", "node4")})
    journal = c.root / "e2e.db"
    policy = c.write_policy(c.root / "e2e.yaml")
    t_submit = time.time()
    big = c.submit("big8", 8, wrapper=False)
    err = (c.root / "e2e-controller.err").open("w")
    ctl = subprocess.Popen(c.controller_cmd(policy, journal), env=c.env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        end = time.time() + 90
        while c.job_state(big)[0] != "RUNNING" and time.time() < end:
            time.sleep(0.2)
        t_start = time.time()
        state, freed = c.job_state(big)
        assert state == "RUNNING", (c.root / "e2e-controller.err").read_text()[-3000:]
        while Journal(journal).active() and time.time() < end:
            time.sleep(0.3)
    finally:
        ctl.send_signal(signal.SIGTERM)
        ctl.wait(20)
        err.close()
    waited = t_start - t_submit
    record_property("submit_to_start_s", round(waited, 1))
    print(f"\n8-GPU job: submitted -> running in {waited:.1f} s")
    every = Journal(journal).all()
    why = "\n".join(f"{m.workload_id} {m.source}->{m.target} {m.state.value}: {m.reason}" for m in every)
    print(why)
    migs = [m for m in every if m.state.value == "done"]
    # a checkpoint that fails (CRIU under a loaded CI machine) is rolled back with the job still running where it
    # was, and the next pass moves it again: that is the designed fallback, so it is allowed here, but only that
    for m in every:
        assert m.state.value in ("done", "rolled-back"), (why, (c.root / "e2e-controller.err").read_text()[-4000:])
        if m.state.value == "rolled-back":
            assert m.reason.startswith("checkpoint failed") and "the job kept running" in m.reason, why
            assert any(d.workload_id == m.workload_id and d.id > m.id for d in migs), why
    assert len(migs) == 2, why
    assert {m.source for m in migs} == {freed}
    moved = {m.workload_id: m for m in migs}
    for name, jid in jobs.items():
        c.wait_running(jid)
        log = c.root / f"{name}.log"
        c.wait_steps(name, 3 + 1)
        time.sleep(0.5)
        cont = c.check_continuity(log)
        assert cont["starts"] == 1 and cont["contiguous"] and cont["sha_ok"], (name, cont)
        assert len(c.workload_pids(log)) == 1, name
        if jid in moved:
            m = moved[jid]
            assert cont["nodes"] == [m.source, m.target], (name, cont)
            assert c.job_state(jid)[1] == m.target
            rows = [r for r in c.read_log(log) if "step" in r]
            gap = max(float(b["t"]) - float(a["t"]) for a, b in itertools.pairwise(rows))
            record_property(f"paused_{name}_s", round(gap, 1))
            print(f"{name}: paused {gap:.1f} s while moving {m.source} -> {m.target} (Slurm's requeue floor "
                  "is ~6 s of it)")
        else:
            assert len(cont["nodes"]) == 1  # never touched


CRASH_STATES = ["planned", "checkpointing", "checkpointed", "requeued-held", "pinned", "released", "restoring",
                "running-on-target", "done"]


def test_sigkill_at_every_journaled_step_then_restart(cluster) -> None:  # type: ignore[no-untyped-def]
    """One move (the only wrapper job, on node1; the other nodes hold 6-GPU fillers); the controller is killed
    right after each journaled transition, restarted, and the job still ends up running once, with its state."""
    c = cluster
    fill = [c.submit(f"fill-{n}", 6, n, wrapper=False) for n in ("node2", "node3", "node4")]
    jobs = fragment(c, {"node1": [2]})
    c.wait_running(*fill)
    journal = c.root / "kill.db"
    policy = c.write_policy(c.root / "kill.yaml")
    big = c.submit("big8", 8, wrapper=False)
    seen = []
    for st in CRASH_STATES:
        env = {**c.env, "GPUDEFRAG_CRASH_AT": st}
        p = subprocess.run(c.controller_cmd(policy, journal), env=env, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == -signal.SIGKILL, (st, p.returncode, p.stderr[-2000:])
        m = Journal(journal).all()
        assert len(m) == 1
        seen.append(m[0].state.value)
    assert seen == CRASH_STATES
    end = time.time() + 30
    while c.job_state(big)[0] != "RUNNING" and time.time() < end:
        time.sleep(0.2)
    assert c.job_state(big)[0] == "RUNNING"
    (name, jid), = jobs.items()
    m = Journal(journal).all()[0]
    assert m.state.value == "done" and c.job_state(jid) == ("RUNNING", m.target)
    c.wait_steps(name, 5)
    log = c.root / f"{name}.log"
    cont = c.check_continuity(log)
    assert cont["starts"] == 1 and cont["contiguous"] and cont["sha_ok"] and cont["nodes"] == ["node1", m.target]
    assert len(c.workload_pids(log)) == 1
    out = c.sh("scontrol", "show", "job", "-o", jid)
    assert "Restarts=1" in out  # requeued exactly once despite nine restarts of the controller


def test_dry_run_changes_nothing(cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster
    fill = [c.submit(f"fill-{n}", 6, n, wrapper=False) for n in ("node2", "node3", "node4")]
    fragment(c, {"node1": [2]})
    c.wait_running(*fill)
    c.submit("big8", 8, wrapper=False)
    time.sleep(1.5)
    journal = c.root / "dry.db"
    policy = c.write_policy(c.root / "dry.yaml")
    runs_before = sorted(str(p) for p in c.run_dir.rglob("*"))
    before = slurm_state(c)
    p = subprocess.run(c.controller_cmd(policy, journal, "--dry-run", "--once", "--json"), env=c.env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout.strip().splitlines()[-1])
    assert report["dry_run"] and any(d["kind"] == "dry-run" and "would move" in d["reason"]
                                     for d in report["decisions"])
    time.sleep(2)  # anything it had done would show by now
    assert slurm_state(c) == before
    assert not journal.exists()
    assert sorted(str(p) for p in c.run_dir.rglob("*")) == runs_before  # no request, ticket or status written
