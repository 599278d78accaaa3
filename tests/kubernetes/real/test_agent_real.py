"""The controller ↔ node agent protocol against the real API server: the executor asks through the pod, the
agent (watching its node's pods) answers on the pod, and a failed checkpoint leaves the original untouched with
the request withdrawn and the journal saying why. KWOK nodes have no kubelet, so the kubelet here cannot be
reached — the fault path; the checkpoint itself runs on the real nodes (tests/kubernetes/real/nodes)."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from gpudefrag.checkpoint.keys import load_key
from gpudefrag.checkpoint.oci_registry import Registry, image_verifier
from gpudefrag.control.journal import Journal, MigrationState
from gpudefrag.control.kube_journaled import JournaledMoves
from gpudefrag.control.node_agent import Kubelet, NodeAgent, compat_record
from gpudefrag.engines.kubernetes import SimpleMove, build_move, load_kube
from gpudefrag.engines.kubernetes.executor import ClientKubeApi, SequenceRunner
from gpudefrag.engines.kubernetes.moves import ANN_AGENT_REQUEST, ANN_AGENT_RESULT

from .lab import H100, KubeLab, gpu_node, gpu_pod, ready

pytestmark = pytest.mark.kube


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_agent_failure_is_answered_and_the_move_rolls_back(kube: KubeLab, oci_registry, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes import client

    kube.nodes(gpu_node("gpu-node-0"), gpu_node("gpu-node-1"))
    kube.namespaces("ml")
    kube.create(gpu_pod("trainer", 2, node="gpu-node-0", annotations={"gpudefrag.io/engine": "pytorch 2.4.0"}))
    kube.wait("trainer Ready", lambda: ready(kube.get("pod", "trainer", ns="ml")))
    uid = kube.get("pod", "trainer", ns="ml")["metadata"]["uid"]
    key = load_key(tmp_path / "ckpt.key", create=True)
    api_client = kube.client()
    core = client.CoreV1Api(api_client)

    # what the agent records is what the converter reads: the node's GFD labels, the pod's annotations
    node = api_client.sanitize_for_serialization(core.read_node("gpu-node-0"))
    pod = api_client.sanitize_for_serialization(core.read_namespaced_pod("trainer", "ml"))
    rec = compat_record(node, pod)
    assert (rec.gpu_model, rec.gpu_count, rec.driver, rec.cuda, rec.engine) == (H100, 2, "550.54.15", "12.4",
                                                                                 "pytorch 2.4.0")

    logs: list[str] = []
    agent = NodeAgent(core, "gpu-node-0", Kubelet(f"https://127.0.0.1:{closed_port()}", timeout_s=5),
                      Registry(oci_registry.url), key, log=logs.append)
    stop = threading.Event()
    t = threading.Thread(target=agent.run, kwargs={"stop": stop.is_set, "watch_s": 2}, daemon=True)
    t.start()
    try:
        monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
        cluster = load_kube(live=True)
        seq = build_move(cluster, SimpleMove("ml/trainer", "gpu-node-0", "gpu-node-1"))
        assert seq.ok and seq.checkpoint_mode == "kubelet", seq.refused
        ex = SequenceRunner(ClientKubeApi(api_client), verify_image=image_verifier(Registry(oci_registry.url), key),
                      poll_s=0.3)
        with Journal(tmp_path / "journal.db") as j:
            m, res = JournaledMoves(ex, j).run(seq, cluster.state.workload("ml/trainer").versions)
            steps = [s["detail"] for s in j.steps(m.id)]
    finally:
        stop.set()
        t.join(timeout=30)
    assert not res.ok and res.rolled_back and "node agent: kubelet at https://127.0.0.1:" in res.error, res.error
    assert m.state is MigrationState.ROLLED_BACK and "unreachable" in m.reason
    assert any(s.startswith("wait-agent-checkpoint failed: node agent: kubelet") for s in steps), steps
    # the agent answered this move (it did not leave the controller to time out)
    assert any(seq.move_id in line and "unreachable" in line for line in logs), logs
    # the original is the same pod, still running, its request and answer withdrawn; no replacement was made
    after = kube.get("pod", "trainer", ns="ml")
    assert after["metadata"]["uid"] == uid and ready(after)
    ann = after["metadata"].get("annotations") or {}
    assert ANN_AGENT_REQUEST not in ann and ANN_AGENT_RESULT not in ann
    assert [p["metadata"]["name"] for p in kube.pods("ml")] == ["trainer"]


def test_agent_answers_only_its_own_node_and_only_once(kube: KubeLab, oci_registry, tmp_path: Path) -> None:
    from kubernetes import client

    kube.nodes(gpu_node("gpu-node-0"), gpu_node("gpu-node-1"))
    kube.namespaces("ml")
    req = json.dumps({"move_id": "m1", "containers": ["main"]})
    kube.create(gpu_pod("here", 1, node="gpu-node-0", annotations={ANN_AGENT_REQUEST: req}),
                gpu_pod("there", 1, node="gpu-node-1", annotations={ANN_AGENT_REQUEST: req}))
    core = client.CoreV1Api(kube.client())
    agent = NodeAgent(core, "gpu-node-0", Kubelet(f"https://127.0.0.1:{closed_port()}", timeout_s=5),
                      Registry(oci_registry.url), load_key(tmp_path / "k", create=True), log=lambda m: None)
    assert agent.sweep() == 1
    here = kube.get("pod", "here", ns="ml")["metadata"]["annotations"]
    assert json.loads(here[ANN_AGENT_RESULT])["move_id"] == "m1"
    assert ANN_AGENT_RESULT not in kube.get("pod", "there", ns="ml")["metadata"]["annotations"]
    assert agent.sweep() == 0  # answered: a resync or a restarted agent does not checkpoint again
    assert NodeAgent(core, "gpu-node-0", agent.kubelet, agent.registry, agent.key, log=lambda m: None).sweep() == 0


def test_an_answer_to_a_request_withdrawn_meanwhile_is_dropped(kube: KubeLab, oci_registry, tmp_path: Path) -> None:
    """The controller rolled the move back (a restarted controller recovering, a timeout) while the agent was
    still checkpointing: the request and any answer are withdrawn; the agent's late answer must not land on the
    original (it would stay there for good). The same answer to a request still standing lands."""
    from kubernetes import client

    kube.nodes(gpu_node("gpu-node-0"))
    kube.namespaces("ml")
    req = json.dumps({"move_id": "m1", "containers": ["main"]})
    kube.create(gpu_pod("late", 1, node="gpu-node-0", annotations={ANN_AGENT_REQUEST: req}),
                gpu_pod("standing", 1, node="gpu-node-0", annotations={ANN_AGENT_REQUEST: req}))
    api_client = kube.client()
    core = client.CoreV1Api(api_client)
    logs: list[str] = []
    agent = NodeAgent(core, "gpu-node-0", Kubelet(f"https://127.0.0.1:{closed_port()}", timeout_s=5),
                      Registry(oci_registry.url), load_key(tmp_path / "k", create=True), log=logs.append)
    seen = {n: api_client.sanitize_for_serialization(core.read_namespaced_pod(n, "ml")) for n in ("late", "standing")}
    # the rollback's own patch, between the agent reading the request and answering it
    kube.kubectl("-n", "ml", "annotate", "pod", "late", f"{ANN_AGENT_REQUEST}-")
    assert agent.handle(seen["late"]) is not None
    assert ANN_AGENT_RESULT not in (kube.get("pod", "late", ns="ml")["metadata"].get("annotations") or {})
    assert any("withdrawn meanwhile" in line and "answer dropped" in line for line in logs), logs
    assert agent.handle(seen["standing"]) is not None
    got = kube.get("pod", "standing", ns="ml")["metadata"]["annotations"]
    assert json.loads(got[ANN_AGENT_RESULT])["move_id"] == "m1" and "unreachable" in got[ANN_AGENT_RESULT]
