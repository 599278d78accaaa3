"""A move with state between two real kubelet nodes, through the product's own path: the executor asks the node
agent on real-a (a `gpudefrag node-agent` process inside real-a's mount namespace, with its ServiceAccount's own
token and RBAC: `nodes/checkpoint`, never `nodes/proxy`), the agent checkpoints through the kubelet, pushes a
signed OCI checkpoint image, the executor verifies it (digest, signature, compatibility record against real-b),
creates the replacement on real-b from it by digest, waits until it runs, and evicts the original. The counter
goes on from where it was; the archive is gone from real-a; the journal says each step."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from gpudefrag.checkpoint.keys import load_key
from gpudefrag.checkpoint.oci_registry import Registry, image_verifier
from gpudefrag.control.journal import Journal, MigrationState
from gpudefrag.control.kube_journaled import JournaledMoves
from gpudefrag.engines.kubernetes import SimpleMove, build_move, load_kube
from gpudefrag.engines.kubernetes.executor import ClientKubeApi, SequenceRunner

from ..lab import ready
from .lab import COUNTER, KubeNodes, agent_rbac, counter_pod, counts, ensure_namespace, start_agent

pytestmark = pytest.mark.kube

NS = "ml"


def test_the_executor_moves_a_counter_with_its_state_through_the_node_agent(
        kube_nodes: KubeNodes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = kube_nodes.lab
    ensure_namespace(lab, NS)
    agent_rbac(kube_nodes)
    key_path = tmp_path / "ckpt.key"
    key = load_key(key_path, create=True)
    pod = counter_pod("counter", "real-a", 2, kube_nodes.image(COUNTER))
    pod["metadata"]["namespace"] = NS
    pod["spec"].pop("nodeSelector")  # placed by nodeName: the replacement is pinned by affinity to real-b
    pod["spec"]["nodeName"] = "real-a"
    lab.create(pod)
    lab.wait("the counter Running on real-a", lambda: ready(lab.get("pods", "counter", ns=NS)), timeout=120,
             state=lambda: lab.pod_states(NS))
    lab.wait("the counter to count past 5", lambda: len(counts(kube_nodes.logs(NS, "counter"))) > 5, timeout=60)
    agent = start_agent(kube_nodes, "real-a", key_path, tmp_path)
    try:
        monkeypatch.setenv("KUBECONFIG", str(lab.kubeconfig))
        cluster = load_kube(live=True)
        seq = build_move(cluster, SimpleMove(f"{NS}/counter", "real-a", "real-b"))
        assert seq.ok and seq.checkpoint_mode == "kubelet", seq.refused
        before = counts(kube_nodes.logs(NS, "counter"))[-1]
        ex = SequenceRunner(ClientKubeApi(lab.client()), poll_s=0.3,
                      verify_image=image_verifier(Registry(f"http://{kube_nodes.registry}"), key))
        with Journal(tmp_path / "journal.db") as j:
            m, res = JournaledMoves(ex, j).run(seq, cluster.state.workload(f"{NS}/counter").versions)
            steps = [s["detail"] for s in j.steps(m.id)]
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    agent_log = (tmp_path / "agent-real-a.log").read_text()
    assert res.ok, f"{res.error}\n{steps}\nagent:\n{agent_log[-3000:]}"
    assert m.state is MigrationState.DONE
    # the original is evicted only after its replacement runs, and the image was verified before it was created
    kinds = [s.split(" ", 1)[0].rstrip(":") for s in steps]
    assert kinds.index("verify-checkpoint-image") < kinds.index("create-replacement") \
        < kinds.index("wait-ready") < kinds.index("evict-original"), kinds
    image = next(s for s in steps if s.startswith("wait-agent-checkpoint ok:")).split("main: ", 1)[1]
    assert image.startswith(f"{kube_nodes.registry}/gpudefrag/checkpoints/ml-counter-main@sha256:")
    assert any(s.startswith("verify-checkpoint-image ok: 1 image(s) signed and compatible with real-b")
               for s in steps), steps
    repl = lab.get("pods", seq.replacement, ns=NS)
    assert repl["spec"]["nodeName"] == "real-b" and ready(repl)
    assert repl["spec"]["containers"][0]["image"] == image
    assert lab.kubectl("-n", NS, "get", "pod", "counter", check=False).returncode != 0  # the original is gone
    lab.wait("the replacement to count on", lambda: counts(kube_nodes.logs(NS, seq.replacement))[-1] > before + 3,
             timeout=60)
    log_b = kube_nodes.logs(NS, seq.replacement)
    got = counts(log_b)
    # one "started" line (the original's, carried in the checkpoint): a restart would print its own and count
    # from 0 again; no count ever goes back
    assert len([ln for ln in log_b.splitlines() if ln.startswith("started ")]) == 1, log_b[:300]
    assert all(b - a in (0, 1) for a, b in itertools.pairwise(got)) and before in got, got
    # the archive does not outlive the request on real-a
    ckdir = kube_nodes.nodes["real-a"].dir / "kubelet" / "checkpoints"
    assert not list(ckdir.glob("*.tar")), list(ckdir.iterdir())
