"""The job wrapper (`gpudefrag run`) on its own, with real CRIU and no scheduler: heartbeat checkpoints while
the workload runs, a request file answered (USR2 hurries it), restore by ticket after a stop, and a refused
ticket cold-starting with its reason recorded."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudefrag.checkpoint.store import CheckpointStore
from gpudefrag.control.agent import FileAgent, JobDir, Ticket

HERE = Path(__file__).parent
GPUDEFRAG = str(Path(sys.executable).parent / "gpudefrag")
pytestmark = [pytest.mark.criu]


@pytest.fixture
def env(tmp_path: Path):  # type: ignore[no-untyped-def]
    if os.geteuid() != 0 or shutil.which("criu") is None:
        pytest.skip("needs root and CRIU")
    d = {"GPUDEFRAG_RUN_DIR": str(tmp_path / "run"), "GPUDEFRAG_STORE": str(tmp_path / "store"),
         "GPUDEFRAG_KEY": str(tmp_path / "key"), "SLURMD_NODENAME": "nodeA"}
    return {**os.environ, **d}


def start(env: dict[str, str], wid: str, log: Path, *extra: str, node: str = "nodeA") -> subprocess.Popen[str]:
    return subprocess.Popen([GPUDEFRAG, "run", "--workload-id", wid, *extra, "--", sys.executable,
                             str(HERE / "workload.py"), "--log", str(log), "--period", "0.1"],
                            env={**env, "SLURMD_NODENAME": node}, stderr=subprocess.PIPE, text=True)


def steps(log: Path) -> list[int]:
    return [int(t.split("=")[1]) for ln in log.read_text().splitlines() for t in ln.split()[:1]
            if t.startswith("step=")] if log.exists() else []


def wait(cond, timeout: float = 20) -> None:  # type: ignore[no-untyped-def]
    end = time.time() + timeout
    while not cond():
        if time.time() > end:
            raise AssertionError("timed out")
        time.sleep(0.1)


def stop(p: subprocess.Popen[str]) -> str:
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=20)
    return err


def test_heartbeat_checkpoints_keep_the_workload_running(env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "hb.log"
    policy = tmp_path / "policy.yaml"
    policy.write_text("action:\n  heartbeat: {every_s: 1, keep: 3}\n")  # the schedule comes from the policy
    p = start(env, "hb", log, "--policy", str(policy), "--json")
    try:
        store = CheckpointStore(Path(env["GPUDEFRAG_STORE"]), Path(env["GPUDEFRAG_KEY"]))
        wait(lambda: len(store.list("hb")) >= 2)
        n = len(steps(log))
        wait(lambda: len(steps(log)) >= n + 5)
        assert all(store.verify(r["id"]).ok for r in store.list("hb"))
        wait(lambda: len(store.list("hb")) >= 3)
        time.sleep(2.5)  # two more heartbeats: retention keeps the newest 3
        assert 3 <= len(store.list("hb")) <= 4  # (4 while one is being written)
        s = steps(log)
        assert s == list(range(1, len(s) + 1))  # leave-running dumps: nothing lost, nothing repeated
    finally:
        err = stop(p)
    assert p.returncode == 143, err
    events = [json.loads(line)["event"] for line in err.splitlines() if line.startswith("{")]
    assert events[0].startswith("started") and any(e.startswith("heartbeat checkpoint") for e in events)
    time.sleep(0.3)
    assert live_with(log) == []  # the wrapper took its workload with it


def live_with(log: Path) -> list[int]:
    out = []
    for q in Path("/proc").iterdir():
        try:
            if q.name.isdigit() and str(log).encode() in (q / "cmdline").read_bytes() \
                    and (q / "stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX":
                out.append(int(q.name))
        except OSError:
            continue
    return out


def test_request_stop_restore_by_ticket_and_refused_ticket(env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "mv.log"
    run_dir = Path(env["GPUDEFRAG_RUN_DIR"])
    store = CheckpointStore(Path(env["GPUDEFRAG_STORE"]), Path(env["GPUDEFRAG_KEY"]))
    agent = FileAgent(run_dir, store)
    p = start(env, "mv", log)
    wait(lambda: len(steps(log)) >= 5)
    agent.request_checkpoint("mv", "r1", stop=False)
    p.send_signal(signal.SIGUSR2)
    wait(lambda: agent.checkpoint_status("mv", "r1").state.value != "pending")
    st = agent.checkpoint_status("mv", "r1")
    assert st.state.value == "ok" and st.still_running
    agent.request_checkpoint("mv", "r2", stop=True)
    wait(lambda: agent.checkpoint_status("mv", "r2").state.value != "pending")
    st2 = agent.checkpoint_status("mv", "r2")
    assert st2.state.value == "ok" and agent.verify(str(st2.ckpt_id)) == (True, "ok")
    assert agent.run_status("mv").phase.value == "checkpointed"
    at_dump = len(steps(log))
    time.sleep(0.5)
    assert len(steps(log)) == at_dump  # stopped: no step after the dump
    assert p.poll() is None  # the wrapper waits to be requeued, it does not end the job
    stop(p)
    # the job starts again "on another node" with a ticket naming the checkpoint
    agent.set_ticket("mv", Ticket("t1", st2.ckpt_id, "move"))
    p2 = start(env, "mv", log, node="nodeB")
    try:
        wait(lambda: len(steps(log)) >= at_dump + 5)
        rs = agent.run_status("mv")
        assert rs is not None and rs.phase.value == "restored" and rs.ticket_id == "t1" and rs.node == "nodeB"
        s = steps(log)
        assert s == list(range(1, len(s) + 1))  # continued from the dump, not from zero
        assert "node=nodeB" in log.read_text().splitlines()[-1]  # the node file, not the stale environment
        assert log.read_text().count("START") == 1
    finally:
        stop(p2)
    # a ticket whose checkpoint does not verify: cold start, and why
    bad = Ticket("t2", "mv-19700101T000000000000Z-000000", "move")
    agent.set_ticket("mv", bad)
    p3 = start(env, "mv", log, node="nodeC")
    try:
        wait(lambda: (agent.run_status("mv") or rs).ticket_id == "t2"
             and (agent.run_status("mv") or rs).phase.value != "starting")
        rs3 = agent.run_status("mv")
        assert rs3 is not None and rs3.phase.value == "cold-started" and "refused" in rs3.reason
        assert "not-found" in rs3.reason
        wait(lambda: log.read_text().count("START") == 2)
    finally:
        stop(p3)
    handled = json.loads((JobDir(run_dir, "mv").root / "handled.json").read_text())["tickets"]
    assert handled == ["t1", "t2"]
