"""Real kubelet nodes beside the control plane (tools/kubenode/node.sh): each a kubelet + containerd + runc +
CRIU in its own mount namespace, advertising fake `nvidia.com/gpu` through the project's device plugin, pulling
from the lab registry on 127.0.0.1. What a test needs to reach them: the kubelet API (with the cluster CA and a
client certificate), paths inside a node translated to the host, the registry, the images."""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpudefrag.engines.kubernetes.moves import ANN_AGENT_REQUEST, ANN_AGENT_RESULT

from ..lab import REPO, KubeLab, ready

NODE_TOOLS = REPO / "tools" / "kubenode"
NODE_SH = NODE_TOOLS / "node.sh"
COUNTER = "gpudefrag/counter:dev"   # tools/kubenode/images.sh pushes it
COUNT = re.compile(r"^count (\d+)$", re.M)


def read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


@dataclass
class RealNode:
    """One node as node.sh wrote it down in DIR/nodes/NAME/env."""

    name: str
    dir: Path
    env: dict[str, str]

    @property
    def ip(self) -> str:
        return self.env["NODE_IP"]

    @property
    def kubelet_url(self) -> str:
        return f"https://{self.ip}:{self.env['KUBELET_PORT']}"

    def host_path(self, in_node: str) -> Path:
        """A path the kubelet reports (its root is /var/lib/kubelet inside the node's mount namespace) on the host."""
        root = self.env["KUBELET_ROOT_IN_NODE"]
        if not in_node.startswith(root + "/"):
            raise ValueError(f"{in_node} is not under the kubelet root {root}")
        return Path(self.env["KUBELET_ROOT"]) / in_node[len(root) + 1:]


@dataclass
class KubeNodes:
    lab: KubeLab
    nodes: dict[str, RealNode]
    registry: str          # 127.0.0.1:PORT, plain HTTP

    def image(self, repo_tag: str) -> str:
        """An image in the lab registry by its loopback name. Not the registry.gpudefrag.test alias: a restore
        pulls the checkpoint's base image (recorded as the original pod named it) with containerd's default
        resolver, which ignores the nodes' hosts.toml and speaks plain HTTP to loopback registries only."""
        return f"{self.registry}/{repo_tag}"

    @classmethod
    def read(cls, lab: KubeLab) -> KubeNodes:
        nodes = {}
        for env in sorted((lab.dir / "nodes").glob("*/env")):
            e = read_env(env)
            nodes[e["NODE_NAME"]] = RealNode(e["NODE_NAME"], env.parent, e)
        return cls(lab, nodes, read_env(lab.dir / "registry" / "env")["REGISTRY"])

    def ssl_context(self) -> ssl.SSLContext:
        """The admin's client certificate (system:masters: the kubelet's webhook authorizer lets it checkpoint),
        the cluster CA verifying the kubelet's serving certificate."""
        pki = self.lab.dir / "pki"
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return ctx

    def kubelet(self, node: str, method: str, path: str, timeout: float = 120) -> Any:
        req = urllib.request.Request(self.nodes[node].kubelet_url + path, method=method)
        with urllib.request.urlopen(req, context=self.ssl_context(), timeout=timeout) as r:
            return json.loads(r.read() or b"null")

    def checkpoint(self, node: str, ns: str, pod: str, container: str) -> Path:
        """The kubelet's checkpoint API; returns the archive's path on the host."""
        got = self.kubelet(node, "POST", f"/checkpoint/{ns}/{pod}/{container}")
        return self.nodes[node].host_path(got["items"][0])

    def push_checkpoint_image(self, archive: Path, container: str, repo_tag: str, out: Path) -> str:
        """The archive as the single layer of an OCI image whose manifest names the container (what containerd
        restores from); pushed to the lab registry. Returns the image name the nodes pull."""
        subprocess.run(["python3", str(NODE_TOOLS / "oci.py"), "build", str(out), "--ref",
                        self.image(repo_tag), "--layer-tar", str(archive),
                        "--annotation", f"org.criu.checkpoint.container.name={container}"],
                       check=True, capture_output=True, timeout=300)
        subprocess.run(["python3", str(NODE_TOOLS / "oci.py"), "push", str(out), self.registry, repo_tag],
                       check=True, capture_output=True, timeout=300)
        return self.image(repo_tag)

    def push_gpudefrag_image(self) -> str:
        """The repository's Containerfile built here (tools/kubenode/images.sh; cached) and pushed; its name."""
        p = subprocess.run([str(NODE_TOOLS / "images.sh"), "push-gpudefrag", self.registry], capture_output=True,
                           text=True, timeout=1800)
        if p.returncode != 0:
            raise AssertionError(f"images.sh push-gpudefrag: {p.stderr.strip()[-2000:]}")
        return self.image("gpudefrag/gpudefrag:dev")

    def logs(self, ns: str, pod: str, container: str = "main") -> str:
        return self.lab.kubectl("-n", ns, "logs", pod, "-c", container).stdout


def counts(log: str) -> list[int]:
    return [int(m) for m in COUNT.findall(log)]


def counter_pod(name: str, node: str, gpus: int, image: str, *, hold_mib: int = 0) -> dict[str, Any]:
    """The counter workload pinned to a real node by its hostname label (the scheduler still places it: GPUs)."""
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "counter"}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 0,
                     "automountServiceAccountToken": False, "restartPolicy": "Never", "enableServiceLinks": False,
                     "containers": [{"name": "main", "image": image, "imagePullPolicy": "IfNotPresent",
                                     "env": [{"name": "HOLD_MIB", "value": str(hold_mib)}],
                                     "resources": {"limits": limits,
                                                   "requests": {"cpu": "10m", "memory": "16Mi", **limits}}}]}}


def agent_rbac(kube_nodes: KubeNodes) -> None:
    """The agent's namespace, ServiceAccount and RBAC from the deployment manifests (not its DaemonSet: here the
    agent runs as a process inside the node, the same program)."""
    docs = [d for d in yaml.safe_load_all((REPO / "deploy/kubernetes/node-agent.yaml").read_text())
            if d and d["kind"] != "DaemonSet"]
    kube_nodes.lab.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


def start_agent(kube_nodes: KubeNodes, node: str, key: Path, tmp: Path,
                registry: str | None = None) -> subprocess.Popen[bytes]:
    """`gpudefrag node-agent` for `node`, inside the node's mount namespace (the process is the agent itself:
    nsenter execs it, so killing it is killing the agent), with its ServiceAccount's own token and its node's
    containerd as the CRI endpoint; log in TMP/agent-NODE.log."""
    lab = kube_nodes.lab
    token = lab.kubectl("-n", "gpudefrag-node", "create", "token", "gpudefrag-node-agent").stdout.strip()
    (tmp / "token").write_text(token)
    kc = lab.token_kubeconfig(tmp / "agent.kubeconfig", token)
    env = {**os.environ, "KUBECONFIG": str(kc), "PYTHONPATH": str(REPO / "src")}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.Popen(
        [str(NODE_SH), "exec", str(lab.dir), node, sys.executable, "-m", "gpudefrag.cli.main", "node-agent",
         "--node", node, "--registry", registry or f"http://{kube_nodes.registry}", "--key", str(key),
         "--token-file", str(tmp / "token"), "--kubelet-ca", str(lab.dir / "pki" / "ca.crt"),
         "--runtime-endpoint", "unix://" + kube_nodes.nodes[node].env["CONTAINERD_ADDRESS"]],
        env=env, stdout=open(tmp / f"agent-{node}.log", "wb"), stderr=subprocess.STDOUT)


def ensure_namespace(lab: KubeLab, ns: str) -> None:
    """The tests of this package share one control plane: a namespace an earlier test made is reused."""
    if lab.kubectl("get", "namespace", ns, check=False).returncode != 0:
        lab.namespaces(ns)


def only_the_original_runs(kube_nodes: KubeNodes, ns: str, name: str, replacement: str) -> None:
    """Exactly once: the original on real-a, Running and still counting, with neither the agent's request nor its
    answer left on it, never restarted; no replacement, and no other pod in `ns`."""
    lab = kube_nodes.lab
    pods = lab.pods(ns)
    assert [p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")] == [name], \
        lab.pod_states(ns)
    assert lab.kubectl("-n", ns, "get", "pod", replacement, check=False).returncode != 0
    orig = lab.get("pods", name, ns=ns)
    assert ready(orig) and orig["spec"]["nodeName"] == "real-a"
    ann = orig["metadata"].get("annotations") or {}
    assert ANN_AGENT_REQUEST not in ann and ANN_AGENT_RESULT not in ann, ann
    n = counts(kube_nodes.logs(ns, name))[-1]
    lab.wait(f"{name} counting on", lambda: counts(kube_nodes.logs(ns, name))[-1] > n, timeout=30)
    started = [ln for ln in kube_nodes.logs(ns, name).splitlines() if ln.startswith("started ")]
    assert len(started) == 1  # never restarted


def archives(kube_nodes: KubeNodes, ns: str, pod: str) -> list[str]:
    """The kubelet's checkpoint archives of `pod` on real-a (they hold the container's memory)."""
    ckdir = kube_nodes.nodes["real-a"].dir / "kubelet" / "checkpoints"
    return sorted(p.name for p in ckdir.glob(f"checkpoint-{pod}_{ns}-*.tar")) if ckdir.is_dir() else []
