"""Issue 32 on the real Slurm lab, as an HPC admin meets it: `diagnose --slurm` / `plan --slurm` / `slurm snapshot`
on the live cluster; a rollback whose source node the pending job takes ends, bounded, with the job running once
from its newest verified checkpoint; a corrupt newest heartbeat is skipped with a logged reason; `--once` with
`max_per_node: 1` frees the node or moves nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudefrag.checkpoint.store import CheckpointStore
from gpudefrag.control.agent import FileAgent
from gpudefrag.control.executor import Executor, ExecutorConfig
from gpudefrag.control.journal import Journal, Migration
from gpudefrag.engines.slurm import SlurmEngine

pytestmark = [pytest.mark.slurm, pytest.mark.criu, pytest.mark.slow]

NODES = ("node1", "node2", "node3", "node4")
GPUDEFRAG = str(Path(sys.executable).parent / "gpudefrag")


def cli(c, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    p = subprocess.run([GPUDEFRAG, *args], env=c.env, capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"gpudefrag {' '.join(args)}: exit {p.returncode}: {p.stderr[-2000:]}")
    return p


def reason_of(c, jid: str) -> str:  # type: ignore[no-untyped-def]
    out = c.sh("scontrol", "show", "job", "-o", jid)
    return next((t.split("=", 1)[1] for t in out.split() if t.startswith("Reason=")), "")


def wait_for(cond, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    end = time.time() + timeout
    while not cond():
        if time.time() > end:
            raise AssertionError(f"timed out after {timeout} s: {what}")
        time.sleep(0.3)


def ckpts(c, jid: str) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    return CheckpointStore(c.store, c.key).list(jid)


def flip_a_byte(store: CheckpointStore, ckpt_id: str) -> None:
    d = store.path(ckpt_id)
    img = max((p for p in d.rglob("*.img")), key=lambda p: p.stat().st_size)
    data = bytearray(img.read_bytes())
    data[len(data) // 2] ^= 0xFF
    img.write_bytes(bytes(data))


def test_diagnose_plan_and_snapshot_of_the_live_cluster(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`diagnose --slurm --json`: fragmentation alone for the job that waits for it, `not-eligible` first for a
    held job (JobHeldAdmin), the partition limit by name; `plan --slurm` moves only wrapper jobs the policy
    allows; `slurm snapshot` validates (Slurm's default priorities, ~4.29e9, included)."""
    c = cluster
    jobs = {}
    for n in NODES:  # node1: two wrapper jobs; the others: one wrapper job and one that cannot move
        jobs[f"w-{n}-0"] = c.submit(f"w-{n}-0", 3, n)
        if n == "node1":
            jobs[f"w-{n}-1"] = c.submit(f"w-{n}-1", 2, n)
        else:
            jobs[f"x-{n}-1"] = c.submit(f"x-{n}-1", 2, n, wrapper=False)  # not under the wrapper
    c.wait_running(*jobs.values())
    big = c.submit("big8", 8, wrapper=False)
    held = c.submit("held8", 8, wrapper=False)
    c.sh("scontrol", "hold", held)  # as root: JobHeldAdmin
    c.sh("scontrol", "update", "PartitionName=gpu", "MaxTime=60")
    try:
        limited = c.submit("long8", 8, wrapper=False, sbatch=("--time=120",))
        wait_for(lambda: reason_of(c, limited) == "PartitionTimeLimit", 30, "long8 pending on PartitionTimeLimit")
        assert reason_of(c, held) == "JobHeldAdmin"
        for name in jobs:
            if name.startswith("w-"):
                c.wait_steps(name, 2)
        policy = c.write_policy(c.root / "admin.yaml")
        base = ("--policy", str(policy), "--run-dir", str(c.run_dir))
        out = json.loads(cli(c, "diagnose", "--slurm", "--json", *base).stdout)
        diags = {d["workload"]: d for d in out["diagnoses"]}
        codes = {jid: [x["code"] for x in d["causes"]] for jid, d in diags.items()}
        assert codes[big] == ["fragmentation"], diags[big]
        ev = diags[big]["causes"][0]["evidence"]
        assert ev["free_gpus"] == 12 and ev["min_moves_to_clear"] == 2
        assert ev["clearable_nodes"] == ["node1"]  # only the node whose jobs the planner may move
        assert codes[held][0] == "not-eligible" and "JobHeldAdmin" in diags[held]["causes"][0]["summary"]
        lim = diags[limited]["causes"][0]
        assert lim["code"] == "quota-exceeded" and lim["evidence"]["limit"] == "PartitionTimeLimit"
        assert "PartitionTimeLimit" in lim["summary"]
        # the x- jobs (no wrapper) are outside what the controller may move: the plan moves only w- jobs
        p = cli(c, "plan", "--slurm", "--job", big, "--json", *base)
        plan = json.loads(p.stdout)["plan"]
        assert plan["feasible"] and plan["moves"]
        moved = {m["workload"] for m in plan["moves"]}
        assert moved <= {jid for name, jid in jobs.items() if name.startswith("w-")}, plan
        # a held job gets no plan from the plan door either, unless asked for in so many words
        p = cli(c, "plan", "--slurm", "--job", held, "--json", *base, check=False)
        assert p.returncode == 1 and json.loads(p.stdout)["decision"]["blocked_by"] == ["not-eligible"]
        # docs/policies.md's old `max_priority: 10000` under Slurm's default priorities: the controller says which
        # filter excluded how many jobs (a dry run: nothing is touched)
        strict = c.write_policy(c.root / "strict.yaml", filter={"names": ["w-*"], "max_priority": 10000})
        p = subprocess.run(c.controller_cmd(strict, c.root / "strict.db", "--dry-run", "--once"),
                           env={**c.env, "COLUMNS": "300"}, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        said = p.stdout
        assert "0 of 8 running jobs may move (excluded:" in said and "by filter.max_priority <= 10000" in said, said
        snap = tmp_path / "slurm.json"
        cli(c, "slurm", "snapshot", str(snap))
        doc = json.loads(snap.read_text())
        assert max(w.get("priority", 0) for w in doc["workloads"]) > 2**31 - 1  # Slurm's defaults, held by the model
        v = json.loads(cli(c, "snapshot", "validate", str(snap), "--json").stdout)
        assert v["valid"] and v["nodes"] == 4 and v["pending"] == 3
    finally:
        c.sh("scontrol", "update", "PartitionName=gpu", "MaxTime=INFINITE")


def test_rollback_whose_source_is_taken_ends_bounded_from_the_newest_verified_checkpoint(cluster) -> None:  # type: ignore[no-untyped-def]
    """The move's checkpoint fails verification; the rollback requeues the job and the pending 8-GPU job takes
    its source node. The rollback re-reads the cluster and sends the job to the node with room; it ends within a
    bounded time, running once, restored from its newest verified (heartbeat) checkpoint, the skipped one
    logged in the job's output and the journal."""
    c = cluster
    jid = c.submit("w-rb", 2, "node1", run_args="--heartbeat-every 2")
    fill = [c.submit("f-node2", 4, "node2", wrapper=False), c.submit("f-node3", 8, "node3", wrapper=False),
            c.submit("f-node4", 8, "node4", wrapper=False)]
    c.wait_running(jid, *fill)
    c.wait_steps("w-rb", 3)
    wait_for(lambda: len(ckpts(c, jid)) >= 1, 60, "a heartbeat checkpoint")
    big = c.submit("big8", 8, wrapper=False)
    store = CheckpointStore(c.store, c.key)
    corrupted: list[str] = []

    def corrupt(m: Migration) -> None:  # the move's checkpoint, after it was written and before it is verified
        if m.state.value == "checkpointed" and not corrupted:
            corrupted.append(str(m.data["ckpt_id"]))
            flip_a_byte(store, corrupted[0])

    eng = SlurmEngine()
    journal = Journal(c.root / "rollback.db", on_write=corrupt)
    ex = Executor(eng, FileAgent(c.run_dir, store, signal=lambda w: eng.signal(w, "USR2")), journal,
                  ExecutorConfig(checkpoint_timeout_s=30, restore_timeout_s=30))

    class Mv:
        workload_id, source, target = jid, "node1", "node2"

    ex.submit([Mv()], reason="issue 32 fault test")
    t0 = time.time()
    assert ex.run_until_idle(150, period_s=0.3), [m.as_dict() for m in ex.active()]
    took = time.time() - t0
    m = journal.all()[0]
    steps = journal.steps(m.id)
    assert m.state.value == "rolled-back", (m.as_dict(), steps)
    assert took < 150
    assert c.job_state(big) == ("RUNNING", "node1")  # it took the source
    assert c.job_state(jid) == ("RUNNING", "node2")  # the node with room, not the taken source
    details = " | ".join(s["detail"] for s in steps)
    assert "node1 was taken meanwhile" in details and "to node2, which has room now" in details, details
    assert "pinning to  " not in details + " " and "pinning to |" not in details
    c.wait_steps("w-rb", c.check_continuity(c.root / "w-rb.log")["last"] + 3)
    cont = c.check_continuity(c.root / "w-rb.log")
    assert cont["starts"] == 1 and cont["sha_ok"]  # restored with its state, never from step 1
    assert len(c.workload_pids(c.root / "w-rb.log")) == 1
    status = json.loads((c.run_dir / jid / "status.json").read_text())
    assert status["phase"] == "restored" and status["ckpt_id"] != corrupted[0]
    assert any(s.startswith(corrupted[0]) for s in status["skipped"]), status
    out = (c.root / "w-rb.out").read_text()
    assert f"skipped checkpoint {corrupted[0]}" in out and "hash-mismatch" in out
    assert "fell back to the newest verified checkpoint" in m.reason, m.reason


def test_corrupt_newest_heartbeat_is_skipped_with_a_logged_reason(cluster) -> None:  # type: ignore[no-untyped-def]
    """Slurm requeues a job by itself; its newest heartbeat is corrupt: the wrapper restores the one before,
    and says in the job's output and status.json which one it skipped and why."""
    c = cluster
    jid = c.submit("w-hb", 2, "node1", run_args="--heartbeat-every 2")
    c.wait_running(jid)
    wait_for(lambda: len(ckpts(c, jid)) >= 2, 60, "two heartbeat checkpoints")
    out_file = c.root / "w-hb.out"
    wait_for(lambda: "retention removed checkpoint" in out_file.read_text(), 60, "retention at work")
    assert "older than the newest 2 verified" in out_file.read_text()  # retention says what it removed, and why
    store = CheckpointStore(c.store, c.key)
    newest = ckpts(c, jid)[0]["id"]
    flip_a_byte(store, newest)
    c.sh("scontrol", "requeue", jid)
    wait_for(lambda: (json.loads((c.run_dir / jid / "status.json").read_text()).get("restarts", 0) >= 1
                      and json.loads((c.run_dir / jid / "status.json").read_text())["phase"] in
                      ("restored", "cold-started")), 60, "the requeued job restarted")
    status = json.loads((c.run_dir / jid / "status.json").read_text())
    assert status["phase"] == "restored" and status["ckpt_id"] != newest, status
    skipped = [s for s in status["skipped"] if s.startswith(newest)]
    assert skipped and "hash-mismatch" in skipped[0], status
    out = (c.root / "w-hb.out").read_text()
    assert f"skipped checkpoint {newest}" in out and "hash-mismatch" in out
    assert len(c.workload_pids(c.root / "w-hb.log")) == 1
    # the corrupt one never counts as kept: the next heartbeats' retention removes it, saying why
    wait_for(lambda: f"retention removed checkpoint {newest}: failed verification" in out_file.read_text(), 60,
             "retention removes the corrupt checkpoint with its reason")


def test_once_with_max_per_node_1_frees_the_node_or_moves_nothing(cluster) -> None:  # type: ignore[no-untyped-def]
    """`controller --once` with the documented `max_per_node: 1`: the plan's two moves off one node run one after
    the other and the node is freed (the 8-GPU job starts), or nothing moves; never a node half freed."""
    c = cluster
    jobs = {}
    for n in NODES:
        for i, g in enumerate((3, 2)):
            jobs[f"w-{n}-{i}"] = c.submit(f"w-{n}-{i}", g, n)
    c.wait_running(*jobs.values())
    for name in jobs:
        c.wait_steps(name, 2)
    big = c.submit("big8", 8, wrapper=False)
    policy = c.write_policy(c.root / "once.yaml", budgets={"max_concurrent": 2, "max_per_node": 1,
                                                           "checkpoint_timeout_s": 60, "restore_timeout_s": 60})
    journal = c.root / "once.db"
    t0 = time.time()
    p = subprocess.run(c.controller_cmd(policy, journal, "--once"), env={**c.env, "COLUMNS": "200"},
                       capture_output=True, text=True, timeout=600)
    took = time.time() - t0
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    ms = Journal(journal).all()
    assert ms, p.stdout  # a fragmented cluster and a pending 8-GPU job: this is the case that moves
    assert all(m.state.value == "done" for m in ms), [m.as_dict() for m in ms]
    sources = {m.source for m in ms}
    assert len(sources) == 1 and len(ms) == 2, [m.as_dict() for m in ms]  # both jobs of one node
    assert "finished: 2 of 2 move(s) made" in p.stdout, p.stdout[-3000:]
    freed = sources.pop()
    wait_for(lambda: c.job_state(big)[0] == "RUNNING", 60, "the 8-GPU job starts")
    assert c.job_state(big) == ("RUNNING", freed)
    for m in ms:  # each moved job runs once, with its state
        name = next(k for k, v in jobs.items() if v == m.workload_id)
        cont = c.check_continuity(c.root / f"{name}.log")
        assert cont["starts"] == 1 and cont["sha_ok"] and cont["nodes"][-1] == m.target
        assert len(c.workload_pids(c.root / f"{name}.log")) == 1
    assert took < 600


def test_a_rollback_to_any_node_clears_the_pin(cluster) -> None:  # type: ignore[no-untyped-def]
    """No node has room: the rollback names no node and excludes none (`ReqNodeList=` and `ExcNodeList=` cleared
    on the real scheduler), so any node that frees up can take the job."""
    c = cluster
    jid = c.submit("x-pin", 2, wrapper=False, sbatch=("--hold",))
    eng = SlurmEngine()
    eng.pin(jid, ["node3"], exclude=["node1"])
    info = eng.job(jid)
    assert info.required_nodes == ("node3",) and info.excluded_nodes == ("node1",)
    eng.pin(jid, [], exclude=[])
    info = eng.job(jid)
    assert info.required_nodes == () and info.excluded_nodes == (), info
    eng.release(jid)
    c.wait_running(jid)


def test_once_moves_nothing_for_a_held_job(cluster) -> None:  # type: ignore[no-untyped-def]
    """The pending 8-GPU job is held (JobHeldAdmin): `controller --once` (an explicit request to free a whole
    node) moves nothing and says why, naming the job and its cause; Slurm's state is unchanged."""
    c = cluster
    jobs = {}
    for n in NODES:
        for i, g in enumerate((3, 2)):
            jobs[f"w-{n}-{i}"] = c.submit(f"w-{n}-{i}", g, n)
    c.wait_running(*jobs.values())
    held = c.submit("held8", 8, wrapper=False)
    c.sh("scontrol", "hold", held)
    wait_for(lambda: reason_of(c, held) == "JobHeldAdmin", 20, "held8 held by the admin")
    policy = c.write_policy(c.root / "held.yaml")
    journal = c.root / "held.db"
    p = subprocess.run(c.controller_cmd(policy, journal, "--once"), env={**c.env, "COLUMNS": "300"},
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert Journal(journal).all() == [], p.stdout
    assert f"{held} (not-eligible: JobHeldAdmin)" in p.stdout and "--plan-anyway" in p.stdout, p.stdout[-3000:]
    for jid in jobs.values():
        assert "Restarts=0" in c.sh("scontrol", "show", "job", "-o", jid)
