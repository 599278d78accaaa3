"""The Slurm engine against the real cluster: what it observes, and that every action is idempotent."""

from __future__ import annotations

import platform
import re
import socket
import time
from pathlib import Path

import pytest

from gpudefrag.core.diagnose import CauseCode, diagnose
from gpudefrag.engines.base import Engine, EngineError, JobPhase
from gpudefrag.engines.slurm import SlurmEngine, waits_for_resources

pytestmark = pytest.mark.slurm


def test_observe_sees_nodes_jobs_gpu_indices_and_reasons(cluster) -> None:  # type: ignore[no-untyped-def]
    a = cluster.submit("obs-a", 3, "node1", wrapper=False)
    b = cluster.submit("obs-b", 2, "node1", wrapper=False)
    fill = [cluster.submit(f"obs-f{i}", 5, f"node{i}", wrapper=False) for i in (2, 3, 4)]
    cluster.wait_running(a, b, *fill)
    big = cluster.submit("obs-big", 8, wrapper=False)
    held = cluster.sh("sbatch", "--parsable", "--hold", "--gres=gpu:1", "-J", "obs-held", "-o", "/dev/null",
                      "--wrap", "sleep 60").strip()
    time.sleep(1.5)
    e = SlurmEngine()
    assert isinstance(e, Engine)
    s = e.observe()
    assert e.version.startswith(("22.05", "23.", "24.", "25."))
    assert [n.name for n in s.nodes] == ["node1", "node2", "node3", "node4"]
    assert all(n.gpu_count == 8 and n.schedulable and n.partitions == ("gpu",) for n in s.nodes)
    # every slurmd of the lab runs on this host: its kernel is what the compatibility rule checks
    assert {n.kernel for n in s.nodes} == {platform.release()}
    wa, wb = s.workload(a), s.workload(b)
    assert wa.is_running and wa.placements[0].node == "node1" and len(wa.placements[0].gpus) == 3
    assert set(wa.placements[0].gpus).isdisjoint(wb.placements[0].gpus)
    assert wa.name == "obs-a" and wa.request.partition == "gpu"
    assert s.free_gpus_on("node1") and len(s.free_gpus_on("node1")) == 3
    wbig = s.workload(big)
    assert not wbig.is_running and wbig.request.gpus_per_node == 8
    assert wbig.scheduler_reason in ("Resources", "Priority") and waits_for_resources(wbig.scheduler_reason)
    assert diagnose(s, wbig).codes == (CauseCode.FRAGMENTATION,)
    wh = s.workload(held)
    assert wh.scheduler_reason == "JobHeldUser" and not waits_for_resources(wh.scheduler_reason)
    assert e.job(held).phase is JobPhase.HELD and e.job("999999").phase is JobPhase.GONE


def test_actions_are_idempotent_and_pin_moves_a_job(cluster) -> None:  # type: ignore[no-untyped-def]
    e = SlurmEngine()
    j = cluster.submit("act", 2, "node1", wrapper=False)
    cluster.wait_running(j)
    e.requeue_hold(j)
    e.requeue_hold(j)  # again while COMPLETING or HELD: no error, nothing more happens
    end = time.time() + 15
    while e.job(j).phase is not JobPhase.HELD and time.time() < end:
        time.sleep(0.2)
    info = e.job(j)
    assert info.phase is JobPhase.HELD and info.restarts == 1
    e.pin(j, ["node3"])
    e.pin(j, ["node3"])
    assert e.job(j).required_nodes == ("node3",)
    e.release(j)
    e.release(j)
    end = time.time() + 20
    while e.job(j).phase is not JobPhase.RUNNING and time.time() < end:
        time.sleep(0.2)
    info = e.job(j)
    assert info.phase is JobPhase.RUNNING and info.nodes == ("node3",)
    e.hold(j)  # a running job: hold is a no-op, not an error
    e.signal(j, "USR2")
    assert e.job(j).phase is JobPhase.RUNNING


def test_drained_node_is_unschedulable_and_reason_maps(cluster) -> None:  # type: ignore[no-untyped-def]
    e = SlurmEngine()
    e.drain("node4", "gpudefrag test")
    try:
        assert not e.node("node4").schedulable and e.node("node3").schedulable
        j = cluster.submit("drained", 1, "node4", wrapper=False)
        time.sleep(1.5)
        s = e.observe()
        assert not s.node("node4").schedulable
        w = s.workload(j)
        assert w.scheduler_reason.startswith("ReqNodeNotAvail")
        from gpudefrag.engines.slurm import map_reason

        assert map_reason(w.scheduler_reason) is CauseCode.NODES_UNSCHEDULABLE
    finally:
        e.resume("node4")
    end = time.time() + 15  # slurmctld pings the node again first (IDLE+NOT_RESPONDING for ~1 s)
    while not e.node("node4").schedulable and time.time() < end:
        time.sleep(0.2)
    assert e.node("node4").schedulable


def test_an_unreachable_controller_is_an_error_not_a_vanished_job(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Only Slurm's own "no such job/node" answer reads as gone. A controller that does not answer must raise
    EngineError (the executor retries the step): read as "gone", it aborted a move half way once, leaving the job
    held (a CI run saw a move give up this way)."""
    e = SlurmEngine()
    assert e.job("999999").phase is JobPhase.GONE
    gone = e.node("node99")
    assert not gone.schedulable and gone.reason == "no such node"
    conf = Path(cluster.env["SLURM_CONF"])
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    text = re.sub(r"(?m)^SlurmctldPort=\d+$", f"SlurmctldPort={port}", conf.read_text())
    (tmp_path / "slurm.conf").write_text(re.sub(r"(?m)^MessageTimeout=.*$", "", text) + "MessageTimeout=2\n")
    for f in conf.parent.iterdir():  # gres.conf and friends beside it
        if f.name != "slurm.conf" and f.is_file():
            (tmp_path / f.name).write_bytes(f.read_bytes())
    dead = SlurmEngine(env={"SLURM_CONF": str(tmp_path / "slurm.conf")}, timeout_s=60)
    with pytest.raises(EngineError):
        dead.job("1")
    with pytest.raises(EngineError):
        dead.node("node1")
