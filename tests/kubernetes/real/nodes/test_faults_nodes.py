"""Faults of the move with state on the real nodes, each ending with the workload running exactly once (the
original, or the replacement — never both, never none) and the journal saying what happened: the registry down
while the agent pushes, the registry answering but refusing the push, a checkpoint image tampered with in the
registry, the node agent killed mid-checkpoint (and started again), the target's kubelet stopped after the
replacement was created."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpudefrag.checkpoint.keys import load_key
from gpudefrag.checkpoint.oci_registry import Registry, image_verifier
from gpudefrag.control.journal import Journal, MigrationState
from gpudefrag.control.kube_journaled import JournaledMoves
from gpudefrag.engines.kubernetes import SimpleMove, build_move, load_kube
from gpudefrag.engines.kubernetes.executor import ClientKubeApi, SequenceRunner
from gpudefrag.engines.kubernetes.moves import (
    ANN_AGENT_RESULT,
    MoveOptions,
    MoveSequence,
    Op,
    OpKind,
)

from ..lab import ready
from .lab import (
    COUNTER,
    NODE_SH,
    KubeNodes,
    agent_rbac,
    archives,
    counter_pod,
    counts,
    ensure_namespace,
    only_the_original_runs,
    start_agent,
)

pytestmark = pytest.mark.kube

NS = "faults"


@pytest.fixture
def setup(kube_nodes: KubeNodes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    lab = kube_nodes.lab
    ensure_namespace(lab, NS)
    agent_rbac(kube_nodes)
    monkeypatch.setenv("KUBECONFIG", str(lab.kubeconfig))
    key = tmp_path / "ckpt.key"
    load_key(key, create=True)
    yield key
    lab.kubectl("-n", NS, "delete", "pods", "--all", "--grace-period=0", "--wait=false", check=False)


def counting(kube_nodes: KubeNodes, name: str, hold_mib: int = 0) -> None:
    lab = kube_nodes.lab
    pod = counter_pod(name, "real-a", 1, kube_nodes.image(COUNTER), hold_mib=hold_mib)
    pod["metadata"]["namespace"] = NS
    pod["spec"].pop("nodeSelector")
    pod["spec"]["nodeName"] = "real-a"
    lab.create(pod)
    lab.wait(f"{name} Running on real-a", lambda: ready(lab.get("pods", name, ns=NS)), timeout=120,
             state=lambda: lab.pod_states(NS))
    lab.wait(f"{name} counting", lambda: len(counts(kube_nodes.logs(NS, name))) > 3, timeout=60)


def move(kube_nodes: KubeNodes, name: str, key: Path, tmp: Path,
         fault: Callable[[MoveSequence, int, Op], None] | None = None,
         options: MoveOptions | None = None) -> tuple[Any, Any, list[str], MoveSequence]:
    cluster = load_kube(live=True)
    seq = build_move(cluster, SimpleMove(f"{NS}/{name}", "real-a", "real-b"), options)
    assert seq.ok and seq.checkpoint_mode == "kubelet", seq.refused
    ex = SequenceRunner(ClientKubeApi(kube_nodes.lab.client()), poll_s=0.3,
                        verify_image=image_verifier(Registry(f"http://{kube_nodes.registry}"), load_key(key)))
    ex.before = fault
    with Journal(tmp / "journal.db") as j:
        m, res = JournaledMoves(ex, j).run(seq, cluster.state.workload(f"{NS}/{name}").versions)
        steps = [s["detail"] for s in j.steps(m.id)]
    return m, res, steps, seq


def test_registry_down_while_the_agent_pushes_leaves_the_original(kube_nodes: KubeNodes, setup: Path,
                                                                  tmp_path: Path) -> None:
    counting(kube_nodes, "reg-down")
    agent = start_agent(kube_nodes, "real-a", setup, tmp_path)
    lab_dir = str(kube_nodes.lab.dir)
    try:
        subprocess.run([str(NODE_SH), "registry-down", lab_dir], check=True, capture_output=True, timeout=60)
        m, res, steps, seq = move(kube_nodes, "reg-down", setup, tmp_path)
    finally:
        subprocess.run([str(NODE_SH), "registry-up", lab_dir], check=True, capture_output=True, timeout=300)
        agent.terminate()
        agent.wait(timeout=30)
    assert not res.ok and res.rolled_back, res
    assert m.state is MigrationState.ROLLED_BACK, m
    failed = next(s for s in steps if s.startswith("wait-agent-checkpoint failed:"))
    assert "refused" in failed or "onnection" in failed, failed  # the push could not reach the registry
    only_the_original_runs(kube_nodes, NS, "reg-down", seq.replacement)
    assert archives(kube_nodes, NS, "reg-down") == []


def test_the_registry_refusing_the_push_leaves_the_original(kube_nodes: KubeNodes, setup: Path, tmp_path: Path,
                                                            read_only_registry: Any) -> None:
    """The registry answers but will not store: a real docker-registry in its read-only maintenance mode (what a
    registry under maintenance, or one whose storage went read-only, does). The agent answers with the
    registry's refusal — which push, where, the status — the executor rolls back before anything is created, no
    image exists to name, and the archive is gone from real-a."""
    ro = read_only_registry
    counting(kube_nodes, "push-refused")
    agent = start_agent(kube_nodes, "real-a", setup, tmp_path, registry=ro.url)
    try:
        m, res, steps, seq = move(kube_nodes, "push-refused", setup, tmp_path)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    assert not res.ok and res.rolled_back, res
    assert m.state is MigrationState.ROLLED_BACK and "the registry refused it (HTTP 4" in m.reason, m
    failed = next(s for s in steps if s.startswith("wait-agent-checkpoint failed:"))
    assert f"push of gpudefrag/checkpoints/{NS}-push-refused-main:{seq.move_id} to {ro.url}: the registry " \
        "refused it (HTTP 4" in failed and "start upload" in failed, failed
    kinds = [s.split(" ", 1)[0].rstrip(":") for s in steps]
    assert "verify-checkpoint-image" not in kinds and "create-replacement" not in kinds, kinds
    assert not list((ro.root / "docker").rglob("_manifests")), "the read-only registry stored a manifest"
    only_the_original_runs(kube_nodes, NS, "push-refused", seq.replacement)
    assert archives(kube_nodes, NS, "push-refused") == []


def test_a_tampered_checkpoint_image_is_refused_before_anything_is_created(kube_nodes: KubeNodes, setup: Path,
                                                                           tmp_path: Path) -> None:
    counting(kube_nodes, "tampered")
    agent = start_agent(kube_nodes, "real-a", setup, tmp_path)
    lab = kube_nodes.lab
    tampered: list[str] = []

    def tamper(seq: MoveSequence, i: int, op: Op) -> None:
        """Between the agent's push and the check: one byte of the stored manifest changed in the registry's
        own storage (same length), as an attacker with write access to the registry would."""
        if op.kind is not OpKind.VERIFY_IMAGE:
            return
        ann = lab.get("pods", "tampered", ns=NS)["metadata"]["annotations"]
        image = json.loads(ann[ANN_AGENT_RESULT])["images"]["main"]
        digest = image.split("@sha256:", 1)[1]
        blob = next((lab.dir / "registry").rglob(f"blobs/sha256/{digest[:2]}/{digest}/data"))
        body = blob.read_bytes()
        mid = seq.move_id.encode()
        assert mid in body
        blob.write_bytes(body.replace(mid, (b"f" if mid[:1] != b"f" else b"e") + mid[1:], 1))
        tampered.append(digest)

    try:
        m, res, steps, seq = move(kube_nodes, "tampered", setup, tmp_path, fault=tamper)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    assert tampered, steps
    assert not res.ok and m.state is MigrationState.ROLLED_BACK, (res, steps)
    failed = next(s for s in steps if s.startswith("verify-checkpoint-image failed:"))
    assert "bad-manifest: manifest bytes hash to" in failed, failed
    kinds = [s.split(" ", 1)[0].rstrip(":") for s in steps]
    assert "create-replacement" not in kinds, kinds  # nothing was created from it
    only_the_original_runs(kube_nodes, NS, "tampered", seq.replacement)


def test_the_node_agent_killed_mid_checkpoint_and_started_again_finishes_the_move(
        kube_nodes: KubeNodes, setup: Path, tmp_path: Path) -> None:
    """The agent dies while the kubelet's archive exists (checkpointed, not yet pushed: 300 MiB take a while);
    the request stays on the pod, unanswered; the agent started again sweeps, takes it from the start, removes
    the dead try's archive with its own, and the move ends on real-b — the workload running once."""
    lab = kube_nodes.lab
    counting(kube_nodes, "agent-killed", hold_mib=300)
    agents = [start_agent(kube_nodes, "real-a", setup, tmp_path)]
    killed: list[str] = []

    def kill_mid_checkpoint(_: MoveSequence, i: int, op: Op) -> None:
        if op.kind is not OpKind.WAIT_AGENT_CHECKPOINT or killed:
            return
        end = time.monotonic() + 60
        while not archives(kube_nodes, NS, "agent-killed"):
            assert time.monotonic() < end, "no archive appeared on real-a"
            time.sleep(0.02)
        agents[0].send_signal(signal.SIGKILL)
        agents[0].wait(timeout=30)
        ann = lab.get("pods", "agent-killed", ns=NS)["metadata"].get("annotations") or {}
        assert ANN_AGENT_RESULT not in ann, "the agent answered before it was killed"
        time.sleep(3)  # the kubelet finishes (or drops) the archive of the dead agent's request
        killed.extend(archives(kube_nodes, NS, "agent-killed") or ["(the kubelet dropped it)"])
        agents.append(start_agent(kube_nodes, "real-a", setup, tmp_path / "again"))

    (tmp_path / "again").mkdir()
    try:
        m, res, steps, seq = move(kube_nodes, "agent-killed", setup, tmp_path, fault=kill_mid_checkpoint,
                                  options=MoveOptions(checkpoint_timeout_s=240))
    finally:
        for a in agents:
            if a.poll() is None:
                a.terminate()
                a.wait(timeout=30)
    assert killed, steps
    again = (tmp_path / "again" / "agent-real-a.log").read_text()
    assert res.ok and m.state is MigrationState.DONE, f"{res.error}\n{steps}\n{again[-2000:]}"
    flat = "".join(again.split())  # the agent's log wraps at 80 columns
    for name in killed:  # the dead try's archive, if the kubelet kept it, removed by the agent started again
        assert name.startswith("(") or f"removed{name},leftbyanearliertry" in flat, (killed, again[-2000:])
    assert archives(kube_nodes, NS, "agent-killed") == []
    # exactly once: the replacement on real-b, counting on from the checkpoint; the original gone
    assert lab.kubectl("-n", NS, "get", "pod", "agent-killed", check=False).returncode != 0
    repl = lab.get("pods", seq.replacement, ns=NS)
    assert repl["spec"]["nodeName"] == "real-b" and ready(repl)
    log_b = kube_nodes.logs(NS, seq.replacement)
    assert len([ln for ln in log_b.splitlines() if ln.startswith("started ")]) == 1, log_b[:300]


def test_the_target_kubelet_stopped_after_the_replacement_was_created_rolls_back(
        kube_nodes: KubeNodes, setup: Path, tmp_path: Path) -> None:
    """real-b's kubelet is stopped right after the replacement is created: it never runs there, the wait for it
    times out, the rollback deletes it; once the kubelet is back it removes what it holds. The original never
    stopped counting on real-a; in the end it is the only copy."""
    lab = kube_nodes.lab
    lab_dir = str(lab.dir)
    counting(kube_nodes, "target-down")
    agent = start_agent(kube_nodes, "real-a", setup, tmp_path)
    stopped: list[bool] = []

    def stop_target(_: MoveSequence, i: int, op: Op) -> None:
        if op.kind is OpKind.WAIT_READY and not stopped:
            subprocess.run([str(NODE_SH), "stop", lab_dir, "real-b", "kubelet"], check=True, capture_output=True,
                           timeout=60)
            stopped.append(True)

    try:
        m, res, steps, seq = move(kube_nodes, "target-down", setup, tmp_path, fault=stop_target,
                                  options=MoveOptions(ready_timeout_s=45))
    finally:
        agent.terminate()
        agent.wait(timeout=30)
        # the device plugin registers with a kubelet once: a new kubelet needs it started again for its GPUs
        for c in ("kubelet", "fakegpu-plugin"):
            subprocess.run([str(NODE_SH), "restart", lab_dir, "real-b", c], check=True, capture_output=True,
                           timeout=120)
        lab.wait("real-b Ready again with its 8 GPUs", lambda: (n := lab.get("nodes", "real-b")) and ready(n)
                 and n["status"].get("allocatable", {}).get("nvidia.com/gpu") == "8", timeout=120)
    assert stopped, steps
    assert not res.ok and m.state is MigrationState.ROLLED_BACK, (res, steps)
    assert any(s.startswith("wait-ready failed:") for s in steps), steps
    lab.wait("the replacement gone once real-b's kubelet is back", lambda: lab.kubectl(
        "-n", NS, "get", "pod", seq.replacement, check=False).returncode != 0, timeout=120,
        state=lambda: lab.pod_states(NS))
    only_the_original_runs(kube_nodes, NS, "target-down", seq.replacement)
