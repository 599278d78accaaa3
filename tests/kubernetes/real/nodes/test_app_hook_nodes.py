"""The application hook, for real: a pod annotated `gpudefrag.io/checkpoint: app` on real-a is asked through the
API (the request annotations); the node agent of real-a (a `gpudefrag node-agent` process inside real-a's mount
namespace, with its ServiceAccount's own token) runs `kill -USR1 1` in its container through real-a's containerd
(CRI ExecSync on the runtime's socket: no `pods/exec` anywhere); the application writes its own state to shared
storage and says so on its pod; the replacement on real-b starts with GPUDEFRAG_RESTORE_FROM and goes on from
that state; the original is evicted only after. A pod that did not opt in is refused by the agent, with the
reason where the executor reads its answer, and never signalled.

The application here is two containers: `main` (busybox sh from the counter image: it counts, and on SIGUSR1
writes its count where it is told) and `hook`, a sidecar with the Kubernetes client (the gpudefrag image's
Python) that reads the request from its pod and writes `gpudefrag.io/checkpoint-done` once `main` has written.
The lab has no kube-proxy and its API server listens on 127.0.0.1 only, so the test relays the nodes' bridge
address to it; the sidecar checks the server's certificate under its name `kubernetes.default.svc`. The shared
storage is a PersistentVolumeClaim on a hostPath PersistentVolume (both nodes are this machine): the replacement
copies the claim, never a hostPath, which the controller's admission refuses."""

from __future__ import annotations

import contextlib
import itertools
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpudefrag.checkpoint.keys import load_key
from gpudefrag.control.journal import Journal, MigrationState
from gpudefrag.control.kube_journaled import JournaledMoves
from gpudefrag.engines.kubernetes import MoveOptions, SimpleMove, build_move, load_kube
from gpudefrag.engines.kubernetes.executor import ClientKubeApi, SequenceRunner
from gpudefrag.engines.kubernetes.moves import ANN_AGENT_RESULT

from ..lab import ready
from .lab import COUNTER, KubeNodes, agent_rbac, counter_pod, counts, ensure_namespace, start_agent

pytestmark = pytest.mark.kube

NS = "ml"

MAIN = r"""
n=0
if [ -n "$GPUDEFRAG_RESTORE_FROM" ]; then
  until [ -s "$GPUDEFRAG_RESTORE_FROM/state" ]; do echo "waiting for $GPUDEFRAG_RESTORE_FROM/state"; sleep 1; done
  n=$(cat "$GPUDEFRAG_RESTORE_FROM/state")
  echo "restored from $GPUDEFRAG_RESTORE_FROM at count $n"
else
  echo "started"
fi
ckpt() {
  until [ -s /hook/dest ]; do sleep 0.1; done
  d=$(cat /hook/dest)
  mkdir -p "$d" && echo "$n" > "$d/state.tmp" && mv "$d/state.tmp" "$d/state"
  echo "checkpointed count $n to $d"
  cp /hook/request /hook/done
}
trap ckpt USR1
while true; do echo "count $n"; n=$((n+1)); sleep 0.2; done
"""

HOOK = r"""
import os, time
from kubernetes import client
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
c = client.Configuration()
c.host = "https://" + os.environ["HOST_IP"] + ":" + os.environ["API_PORT"]
c.ssl_ca_cert = sa + "/ca.crt"
c.tls_server_name = "kubernetes.default.svc"
api = client.CoreV1Api(client.ApiClient(c))
ns, name = os.environ["POD_NAMESPACE"], os.environ["POD_NAME"]
print("hook watching", ns, name, flush=True)
answered = None
while True:
    c.api_key = {"authorization": "Bearer " + open(sa + "/token").read().strip()}
    try:
        ann = api.read_namespaced_pod(name, ns).metadata.annotations or {}
        req = ann.get("gpudefrag.io/checkpoint-request")
        if req and req != answered:
            if not os.path.exists("/hook/dest"):
                open("/hook/request.tmp", "w").write(req)
                os.rename("/hook/request.tmp", "/hook/request")
                open("/hook/dest.tmp", "w").write(ann["gpudefrag.io/checkpoint-dest"])
                os.rename("/hook/dest.tmp", "/hook/dest")
                print("asked", req, flush=True)
            if os.path.exists("/hook/done") and open("/hook/done").read() == req:
                api.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {
                    "gpudefrag.io/checkpoint-done": req}}})
                answered = req
                print("answered", req, flush=True)
    except Exception as e:
        print("hook:", e, flush=True)
    time.sleep(0.2)
"""


@pytest.fixture
def api_relay(kube_nodes: KubeNodes) -> Iterator[int]:
    """The API server (127.0.0.1 only) reached from pods at each node's bridge address, one port for all."""
    host, port = re.match(r"https://([^:/]+):(\d+)", kube_nodes.lab.client().configuration.host).groups()  # type: ignore[union-attr]
    servers: list[socket.socket] = []
    relay_port = 0
    for node in kube_nodes.nodes.values():
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((node.ip, relay_port))
        relay_port = s.getsockname()[1]
        s.listen(16)
        servers.append(s)

    def pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for x in (a, b):
                with contextlib.suppress(OSError):
                    x.shutdown(socket.SHUT_RDWR)

    def serve(s: socket.socket) -> None:
        while True:
            try:
                conn, _ = s.accept()
            except OSError:
                return
            up = socket.create_connection((host, int(port)))
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    for s in servers:
        threading.Thread(target=serve, args=(s,), daemon=True).start()
    yield relay_port
    for s in servers:
        s.close()


def app_pod(counter_image: str, hook_image: str, api_port: int) -> dict[str, Any]:
    env_ref = [{"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
               {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
               {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
               {"name": "API_PORT", "value": str(api_port)}]
    gpus = {"nvidia.com/gpu": "2"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "app-counter", "namespace": NS, "labels": {"app": "app-counter"},
        "annotations": {"gpudefrag.io/checkpoint": "app"}},
        "spec": {"nodeName": "real-a", "serviceAccountName": "app-hook", "terminationGracePeriodSeconds": 0,
                 "restartPolicy": "Never", "enableServiceLinks": False,
                 "containers": [
                     {"name": "main", "image": counter_image, "command": ["/bin/sh", "-c", MAIN],
                      "resources": {"limits": gpus, "requests": {"cpu": "10m", "memory": "16Mi", **gpus}},
                      "volumeMounts": [{"name": "hook", "mountPath": "/hook"},
                                       {"name": "checkpoints", "mountPath": "/checkpoints"}]},
                     {"name": "hook", "image": hook_image, "command": ["/opt/gpudefrag/bin/python3", "-c", HOOK],
                      "env": env_ref, "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                      "volumeMounts": [{"name": "hook", "mountPath": "/hook"}]}],
                 "volumes": [{"name": "hook", "emptyDir": {}},
                             {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "checkpoints"}}]}}


def shared_storage(kube_nodes: KubeNodes, where: Path) -> None:
    where.mkdir(mode=0o777, exist_ok=True)
    lab = kube_nodes.lab
    lab.create(
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "app-hook-checkpoints"},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "manual",
                  "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(where),
                                                                          "type": "Directory"}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "checkpoints", "namespace": NS},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "manual", "volumeName": "app-hook-checkpoints",
                  "resources": {"requests": {"storage": "1Gi"}}}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "app-hook", "namespace": NS}},
        # the application answers on its own pod: it reads the request and writes checkpoint-done
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "app-hook", "namespace": NS},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "app-hook", "namespace": NS},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "app-hook"},
         "subjects": [{"kind": "ServiceAccount", "name": "app-hook", "namespace": NS}]})


@pytest.fixture
def agent_a(kube_nodes: KubeNodes, tmp_path: Path) -> Iterator[Path]:
    """The node agent of real-a, with its RBAC from the manifests; yields its log file."""
    agent_rbac(kube_nodes)
    key = tmp_path / "ckpt.key"
    load_key(key, create=True)
    agent = start_agent(kube_nodes, "real-a", key, tmp_path)
    log = tmp_path / "agent-real-a.log"
    try:
        kube_nodes.lab.wait("the agent on real-a started", lambda: "node-agent on real-a" in log.read_text(),
                            timeout=60)
        yield log
    finally:
        agent.terminate()
        agent.wait(timeout=30)


def test_the_app_hook_moves_a_pod_with_its_own_state_through_the_node_agent(
        kube_nodes: KubeNodes, api_relay: int, agent_a: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    lab = kube_nodes.lab
    ensure_namespace(lab, NS)
    shared = tmp_path / "checkpoints"
    shared_storage(kube_nodes, shared)
    hook_image = kube_nodes.push_gpudefrag_image()
    lab.create(app_pod(kube_nodes.image(COUNTER), hook_image, api_relay))
    lab.wait("app-counter Running on real-a", lambda: ready(lab.get("pods", "app-counter", ns=NS)), timeout=180,
             state=lambda: lab.pod_states(NS))
    lab.wait("the hook watching its pod", lambda: "hook watching" in kube_nodes.logs(NS, "app-counter", "hook"),
             timeout=60)
    lab.wait("the counter past 5", lambda: len(counts(kube_nodes.logs(NS, "app-counter"))) > 5, timeout=60)
    # the agent reached real-a's containerd through its CRI socket
    assert "runtime containerd v2." in " ".join(agent_a.read_text().split()), agent_a.read_text()[-2000:]

    monkeypatch.setenv("KUBECONFIG", str(lab.kubeconfig))
    cluster = load_kube(live=True)
    seq = build_move(cluster, SimpleMove(f"{NS}/app-counter", "real-a", "real-b"))
    assert seq.ok and seq.checkpoint_mode == "app", seq.refused
    assert not any(o.path.endswith("/exec") for o in seq.ops)
    ex = SequenceRunner(ClientKubeApi(lab.client()), poll_s=0.3)
    with Journal(tmp_path / "journal.db") as j:
        m, res = JournaledMoves(ex, j).run(seq, cluster.state.workload(f"{NS}/app-counter").versions)
        steps = [s["detail"] for s in j.steps(m.id)]
    hook_log = ""
    if not res.ok:
        hook_log = lab.kubectl("-n", NS, "logs", "app-counter", "-c", "hook", check=False).stdout
    assert res.ok, f"{res.error}\n{steps}\nhook:\n{hook_log[-2000:]}\nagent:\n{agent_a.read_text()[-2000:]}"
    assert m.state is MigrationState.DONE
    kinds = [s.split(" ", 1)[0].rstrip(":") for s in steps]
    assert kinds.index("signal") < kinds.index("wait-agent-signal") < kinds.index("wait-app-checkpoint") \
        < kinds.index("create-replacement") < kinds.index("wait-ready") < kinds.index("evict-original"), kinds
    endpoint = "unix://" + kube_nodes.nodes["real-a"].env["CONTAINERD_ADDRESS"]
    assert f"wait-agent-signal ok: kill -USR1 1 in main through {endpoint}" in steps, steps

    # what the application wrote, on the shared storage, and the replacement going on from it
    written = list(shared.glob(f"{NS}/app-counter/*/state"))
    assert len(written) == 1, list(shared.rglob("*"))
    saved = int(written[0].read_text())
    repl = lab.get("pods", seq.replacement, ns=NS)
    assert repl["spec"]["nodeName"] == "real-b" and ready(repl)
    assert lab.kubectl("-n", NS, "get", "pod", "app-counter", check=False).returncode != 0  # the original is gone
    lab.wait("the replacement to count on", lambda: (counts(kube_nodes.logs(NS, seq.replacement)) or [0])[-1]
             > saved + 3, timeout=60)
    log_b = kube_nodes.logs(NS, seq.replacement)
    assert f"restored from {written[0].parent.as_posix().replace(str(shared), '/checkpoints')} at count {saved}" \
        in log_b, log_b[:500]
    assert "started" not in log_b.splitlines()
    got = counts(log_b)
    assert got[0] == saved and all(b - a == 1 for a, b in itertools.pairwise(got)), got[:20]


def test_the_agent_refuses_the_hook_for_a_pod_that_did_not_opt_in(
        kube_nodes: KubeNodes, agent_a: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller forced to the app hook for a pod without `gpudefrag.io/checkpoint: app`: the agent runs
    nothing in it and answers why; the executor fails the step with that reason, rolls back and leaves the
    original running, never restarted."""
    lab = kube_nodes.lab
    ensure_namespace(lab, NS)
    pod = counter_pod("plain-counter", "real-a", 2, kube_nodes.image(COUNTER))
    pod["metadata"]["namespace"] = NS
    pod["spec"].pop("nodeSelector")
    pod["spec"]["nodeName"] = "real-a"
    lab.create(pod)
    lab.wait("plain-counter Running on real-a", lambda: ready(lab.get("pods", "plain-counter", ns=NS)),
             timeout=120, state=lambda: lab.pod_states(NS))
    monkeypatch.setenv("KUBECONFIG", str(lab.kubeconfig))
    cluster = load_kube(live=True)
    seq = build_move(cluster, SimpleMove(f"{NS}/plain-counter", "real-a", "real-b"), MoveOptions(checkpoint="app"))
    assert seq.ok and seq.checkpoint_mode == "app", seq.refused
    ex = SequenceRunner(ClientKubeApi(lab.client()), poll_s=0.3)
    with Journal(tmp_path / "journal.db") as j:
        m, res = JournaledMoves(ex, j).run(seq, cluster.state.workload(f"{NS}/plain-counter").versions)
        steps = [s["detail"] for s in j.steps(m.id)]
    why = f"pod {NS}/plain-counter did not opt in to the application hook (gpudefrag.io/checkpoint: app)"
    assert not res.ok and res.rolled_back, steps
    assert res.error.startswith(f"wait-agent-signal: node agent: {why}"), res.error
    assert m.state is not MigrationState.DONE
    assert any(why in s for s in steps), steps
    assert why in " ".join(agent_a.read_text().split())  # the agent's console wraps its lines
    # the original runs on, never signalled or restarted; the replacement was never created
    now = lab.get("pods", "plain-counter", ns=NS)
    assert ready(now) and now["spec"]["nodeName"] == "real-a"
    assert now["status"]["containerStatuses"][0]["restartCount"] == 0
    assert lab.kubectl("-n", NS, "get", "pod", seq.replacement, check=False).returncode != 0
    before = counts(kube_nodes.logs(NS, "plain-counter"))[-1]
    lab.wait("the original to count on", lambda: counts(kube_nodes.logs(NS, "plain-counter"))[-1] > before + 2,
             timeout=30)
    # the rollback withdrew the request and the agent's answer
    assert ANN_AGENT_RESULT not in (now["metadata"].get("annotations") or {})
