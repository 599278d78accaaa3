"""Faults during a move, against the real API: the controller killed at each journaled step and restarted, the
PDB tightened so the real Eviction API refuses, a 409 name clash on create, the API server restarted mid-move,
the target node going away. After each: no pod lost, none duplicated, the ReplicaSet never above its count."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpudefrag.engines.kubernetes import ClientKubeApi, OpKind, SequenceRunner, SimpleMove, build_move, load_kube
from gpudefrag.engines.kubernetes.moves import MoveSequence, Op

from .lab import KubeLab, gpu_node, gpu_pod, pdb, ready
from .test_move_real import RECREATE, by_app, controller, fragmented, migrations

pytestmark = pytest.mark.kube

BARE = SimpleMove("ml/notebook", "gpu-node-1", "gpu-node-0")


def two_nodes(lab: KubeLab) -> None:
    """A bare pod (under a PDB) on gpu-node-1 that opted in to a stateless move; gpu-node-0 empty."""
    lab.nodes(gpu_node("gpu-node-0"), gpu_node("gpu-node-1"))
    lab.namespaces("ml")
    lab.create(gpu_pod("notebook", 2, node="gpu-node-1", annotations=RECREATE),
               pdb("notebook", "ml", {"app": "notebook"}, min_available=1))
    lab.wait("notebook Ready", lambda: any(ready(p) for p in by_app(lab, "notebook")),
             state=lambda: lab.pod_states("ml"))
    lab.wait("the PDB", lambda: lab.get("pdb", "notebook", ns="ml")["status"].get("currentHealthy") == 1)


def run_move(lab: KubeLab, move: SimpleMove, before: Any = None, timeout: float = 60,
             evict_retry_s: float = 60) -> tuple[MoveSequence, Any]:
    cluster = load_kube(live=True)
    seq = build_move(cluster, move)
    assert seq.ok, seq.refused
    seq = dataclasses.replace(seq, ops=tuple(  # shorter waits than a production move
        dataclasses.replace(o, params={**o.params, "timeout_s": timeout}) if "timeout_s" in o.params else o
        for o in seq.ops))
    ex = SequenceRunner(ClientKubeApi(lab.client()), poll_s=0.3, before=before, evict_retry_s=evict_retry_s)
    return seq, ex.run(seq, cluster.state.workload(move.workload_id).versions)


def only_original(lab: KubeLab, app: str, uid: str) -> None:
    pods = by_app(lab, app)
    assert [p["metadata"]["uid"] for p in pods] == [uid], [p["metadata"]["name"] for p in pods]
    assert ready(pods[0])


@pytest.fixture
def live(kube: KubeLab, monkeypatch: pytest.MonkeyPatch) -> KubeLab:
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    return kube


def test_pdb_tightened_mid_move_real_eviction_refuses_and_replacement_goes(live: KubeLab) -> None:
    two_nodes(live)
    uid = live.get("pod", "notebook", ns="ml")["metadata"]["uid"]

    def before(_seq: MoveSequence, _i: int, op: Op) -> None:
        if op.kind is OpKind.EVICT_ORIGINAL:  # someone forbids disruptions after our check
            live.kubectl("-n", "ml", "patch", "pdb", "notebook", "--type=merge", "-p",
                         '{"spec": {"minAvailable": 2}}')
            live.wait("the PDB to count both pods", lambda: live.get("pdb", "notebook", ns="ml")["status"]
                      .get("desiredHealthy") == 2)

    _, res = run_move(live, BARE, before, evict_retry_s=8)
    assert not res.ok and res.rolled_back and "PodDisruptionBudget" in res.error, res.as_dict()
    live.wait("the replacement deleted", lambda: len(by_app(live, "notebook")) == 1)
    only_original(live, "notebook", uid)


def test_409_name_clash_rolls_back_without_touching_the_other_pod(live: KubeLab) -> None:
    two_nodes(live)
    uid = live.get("pod", "notebook", ns="ml")["metadata"]["uid"]
    seq = build_move(load_kube(live=True), BARE)
    live.create(gpu_pod(seq.replacement or "", 1, node="gpu-node-0", labels={"app": "squatter"}))
    _, res = run_move(live, BARE)
    assert not res.ok and "409" in res.error and res.rolled_back, res.as_dict()
    assert by_app(live, "squatter"), "the rollback deleted a pod that was not its replacement"
    only_original(live, "notebook", uid)


def test_api_server_restarted_while_waiting_for_the_replacement(live: KubeLab) -> None:
    two_nodes(live)
    threads: list[threading.Thread] = []

    pidfile = live.dir / "pids" / "kube-apiserver"
    old_pid = int(pidfile.read_text())

    def before(_seq: MoveSequence, _i: int, op: Op) -> None:
        if op.kind is OpKind.WAIT_READY:  # down now, back in a few seconds: the move polls an absent server
            os.kill(old_pid, signal.SIGKILL)
            t = threading.Thread(target=lambda: (time.sleep(3), live.restart("kube-apiserver")), daemon=True)
            t.start()
            threads.append(t)

    _, res = run_move(live, BARE, before, timeout=180)
    for t in threads:
        t.join(180)
    assert threads and int(pidfile.read_text()) != old_pid
    assert res.ok, res.as_dict()
    pods = by_app(live, "notebook")
    assert len(pods) == 1 and pods[0]["spec"]["nodeName"] == "gpu-node-0" and ready(pods[0])


def test_target_node_lost_mid_move_rolls_back(live: KubeLab) -> None:
    """The target disappears after it was checked (a NotReady node being removed): the replacement never gets
    Ready, the move times out before the eviction and rolls back; the original keeps running."""
    two_nodes(live)
    uid = live.get("pod", "notebook", ns="ml")["metadata"]["uid"]

    def before(_seq: MoveSequence, _i: int, op: Op) -> None:
        if op.kind is OpKind.CREATE_REPLACEMENT:
            live.kubectl("delete", "node", "gpu-node-0")

    _, res = run_move(live, BARE, before, timeout=8)
    assert not res.ok and res.rolled_back and not res.committed, res.as_dict()
    live.wait("the replacement deleted", lambda: len(by_app(live, "notebook")) == 1)
    only_original(live, "notebook", uid)


def test_target_node_not_ready_mid_move_rolls_back(live: KubeLab) -> None:
    """The target's kubelet goes silent after the target was checked: KWOK stops tending it and its Ready
    condition turns False. The replacement is never Ready on a Ready node; the move rolls back before the
    eviction."""
    two_nodes(live)
    uid = live.get("pod", "notebook", ns="ml")["metadata"]["uid"]

    def before(_seq: MoveSequence, _i: int, op: Op) -> None:
        if op.kind is OpKind.CREATE_REPLACEMENT:
            live.kubelet_gone("gpu-node-0")

    _, res = run_move(live, BARE, before, timeout=8)
    assert not res.ok and res.rolled_back and not res.committed, res.as_dict()
    assert "Ready" in res.error, res.error
    # the replacement is deleted (on a node without a kubelet it may stay Terminating); the original runs on
    live.wait("the replacement deleted", lambda: all(
        p["metadata"]["uid"] == uid or p["metadata"].get("deletionTimestamp") for p in by_app(live, "notebook")))
    original = live.get("pod", "notebook", ns="ml")
    assert original["metadata"]["uid"] == uid and ready(original) and not original["metadata"].get("deletionTimestamp")


@pytest.mark.parametrize("state", ["planned", "restoring", "running-on-target", "done"])
def test_controller_killed_at_a_step_and_restarted(kube: KubeLab, tmp_path: Path, state: str) -> None:
    """SIGKILL right after the journal made the step durable; the restarted controller finishes or rolls back.
    Either way every workload runs exactly once and the ReplicaSet is never above its count afterwards."""
    fragmented(kube)
    p = controller(kube, tmp_path, env={"GPUDEFRAG_CRASH_AT": state})
    assert p.returncode == -9, p.stdout + p.stderr
    p = controller(kube, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    states = {m["state"] for m in migrations(tmp_path)}
    assert states <= {"done", "rolled-back"}, states
    for app in ("web-embed", "notebook", "finetune", "eval"):
        kube.wait(f"{app}: one pod", lambda a=app: len(by_app(kube, a)) == 1)
        assert ready(by_app(kube, app)[0])
    for rs in kube.get("replicasets", ns="ml")["items"]:
        assert rs["status"]["replicas"] <= rs["spec"]["replicas"], rs["metadata"]["name"]
    if "done" in states:
        kube.wait("train-8g bound", lambda: kube.get("pod", "train-8g", ns="ml")["spec"].get("nodeName"))
