"""The Kubernetes move with state, end to end, by the *deployed* controller (`scripts/e2e-kube-stateful.sh`;
tests/kubernetes/real/nodes/test_e2e_stateful_nodes.py runs the same `scenario`).

A control plane (tools/kubecluster) with two real kubelet nodes (tools/kubenode: real-a, real-b) and a KWOK
node; the gpudefrag image built from the Containerfile and pushed to the lab registry; `kubectl apply -k` of an
overlay of deploy/kubernetes (through deploy/kubernetes-no-storageclass: the lab has no StorageClass; the lab's
registry and image, a trigger that fires at once, and — because the lab
has no kube-proxy, so pods reach the API server and the registry only on the host's network — hostNetwork for
the controller and the agent). Then a counter pod (2 GPUs) on real-a, 6 GPUs taken on real-b by a pod the policy
may not move, the KWOK node full, and an 8-GPU pod pending: only moving the counter to real-b frees a whole node.
The deployed controller does it (its node agent on real-a checkpoints, the image restores on real-b) and the
8-GPU pod is bound to real-a. Prints one JSON line.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SH = REPO / "tools/kubecluster/cluster.sh"
NODE_SH = REPO / "tools/kubenode/node.sh"
COUNT = re.compile(r"^count (\d+)$", re.M)
POLICY = """\
name: e2e-stateful
trigger:
  pending: {longer_than_s: 0, min_gpus: 2}
  on_request: true
filter:
  accounts: [ml, research]
  exclude_labels: {gpudefrag.io/movable: "false"}
  max_gpus: 4
action: {kind: migrate, fallback: rollback}
budgets: {max_concurrent: 1, max_per_node: 1, max_moves_per_plan: 2, max_per_hour: 20}
"""


def log(msg: str) -> None:
    print(f"[e2e] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


class Lab:
    def __init__(self, d: Path) -> None:
        self.dir = d
        env = read_env(d / "env")
        self.kubectl_bin = Path(env["KUBE_BIN"]) / "kubectl"
        self.api = env["KUBE_API"]
        self.registry = read_env(d / "registry" / "env")["REGISTRY"]

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([str(self.kubectl_bin), "--kubeconfig", str(self.dir / "admin.kubeconfig"), *args],
                           input=input, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {p.stderr.strip()}")
        return p

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, *objs: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)}))


class Broken(Exception):
    """A part that will not come right by waiting (a crash-looping controller or agent): stop at once, saying why."""


def wait(what: str, check: Callable[[], Any], timeout: float, every: float = 0.5) -> Any:
    end = time.monotonic() + timeout
    while True:
        try:
            got = check()
        except (RuntimeError, KeyError, IndexError, ValueError):
            got = None
        if got:
            return got
        if time.monotonic() > end:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


def ready(obj: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (obj.get("status") or {}).get("conditions")
               or [])


def pod(name: str, ns: str, gpus: int, image: str, *, node: str | None = None,
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0, "automountServiceAccountToken": False, "enableServiceLinks": False,
        "restartPolicy": "Always",
        "containers": [{"name": "main", "image": image, "imagePullPolicy": "IfNotPresent",
                        "resources": {"limits": limits, "requests": {"cpu": "10m", "memory": "16Mi", **limits}}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": {"app": name},
                                                           "annotations": annotations or {}}, "spec": spec}


def kwok_node(name: str, gpus: int = 8) -> dict[str, Any]:
    res = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": {
        "kwok.x-k8s.io/node": "fake"}, "labels": {"kubernetes.io/hostname": name, "type": "kwok",
                                                  "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                                  "nvidia.com/gpu.count": str(gpus)}},
            "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]},
            "status": {"capacity": res, "allocatable": dict(res)}}


def build_image(lab: Lab) -> str:
    """The gpudefrag image from the repository's Containerfile (tools/kubenode/images.sh, cached), pushed to
    the lab registry; its name."""
    subprocess.run([str(REPO / "tools/kubenode/images.sh"), "push-gpudefrag", lab.registry], check=True,
                   timeout=3600, stdout=sys.stderr)
    return f"{lab.registry}/gpudefrag/gpudefrag:dev"


def overlay(lab: Lab, work: Path, image: str) -> Path:
    """deploy/kubernetes, adapted to the lab only where the lab differs from a cluster."""
    d = work / "overlay"
    d.mkdir(parents=True, exist_ok=True)
    host, port = re.match(r"https?://([^:/]+):(\d+)", lab.api).groups()  # type: ignore[union-attr]
    api_env = [{"name": "KUBERNETES_SERVICE_HOST", "value": host}, {"name": "KUBERNETES_SERVICE_PORT", "value": port}]
    real = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpudefrag.io/kubenode", "operator": "Exists"}]}]}}}
    host_net = {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet", "affinity": real}
    patches = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "gpudefrag-controller",
                                                                     "namespace": "gpudefrag"},
         "spec": {"template": {"spec": {**host_net, "containers": [{"name": "controller", "env": api_env,
                                                                     "imagePullPolicy": "Always"}]}}}},
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "gpudefrag-node-agent",
                                                                    "namespace": "gpudefrag-node"},
         "spec": {"template": {"spec": {**host_net, "containers": [{"name": "agent", "env": api_env,
                                                                     "imagePullPolicy": "Always"}]}}}},
        # hostNetwork is the lab's way to the API server (no kube-proxy): the namespace must allow it here
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpudefrag", "labels": {
            "pod-security.kubernetes.io/enforce": "privileged"}}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gpudefrag-policy", "namespace": "gpudefrag"},
         "data": {"policy.yaml": POLICY}},
    ]
    for i, p in enumerate(patches):
        (d / f"patch-{i}.json").write_text(json.dumps(p))
    # the lab has no StorageClass: the journal in an emptyDir (deploy/kubernetes-no-storageclass, on the base)
    base = os.path.relpath(REPO / "deploy" / "kubernetes-no-storageclass", d)
    name, _, tag = image.rpartition(":")
    k = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": [base],
         "patches": [{"path": f"patch-{i}.json"} for i in range(len(patches))],
         "images": [{"name": "ghcr.io/gpudefrag/gpudefrag", "newName": name, "newTag": tag}],
         "configMapGenerator": [{"name": "gpudefrag-registry", "namespace": ns, "behavior": "merge",
                                 "literals": [f"url=http://{lab.registry}", f"name={lab.registry}"]}
                                for ns in ("gpudefrag", "gpudefrag-node")]}
    (d / "kustomization.yaml").write_text(json.dumps(k, indent=1))
    return d


def counts(text: str) -> list[int]:
    return [int(m) for m in COUNT.findall(text)]


def install_key(lab: Lab, work: Path) -> Path:
    """The namespaces the deployment and the scenario use, and a fresh checkpoint signing key (WORK/checkpoint.key)
    as the Secret both the controller's and the node agent's namespaces mount (replaced if one is left)."""
    for ns in ("gpudefrag", "gpudefrag-node", "ml", "research", "other"):
        lab.kubectl("create", "namespace", ns, check=False)
    key = work / "checkpoint.key"
    subprocess.run([sys.executable, "-m", "gpudefrag.cli.main", "keys", "init", "--key", str(key)], check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")}, timeout=60)
    for ns in ("gpudefrag", "gpudefrag-node"):
        lab.kubectl("-n", ns, "delete", "secret", "gpudefrag-checkpoint-key", "--ignore-not-found")
        lab.kubectl("-n", ns, "create", "secret", "generic", "gpudefrag-checkpoint-key",
                    f"--from-file=checkpoint.key={key}")
    return key


def scenario(lab: Lab, work: Path, image: str) -> dict[str, Any]:
    """From a cluster with its real nodes up to the JSON line (raises on any failure)."""
    counter_image = f"{lab.registry}/gpudefrag/counter:dev"
    install_key(lab, work)
    # the layout: real-a holds the counter (2 of 8 GPUs), real-b 6 GPUs the policy may not move (namespace
    # `other`), the KWOK node is full; an 8-GPU pod waits: 8 GPUs free in all, at most 6 on one node
    lab.apply(kwok_node("kwok-0"))
    filler_kwok = pod("kwok-filler", "other", 8, counter_image, node="kwok-0")
    filler_kwok["spec"]["tolerations"] = [{"operator": "Exists"}]
    lab.apply(filler_kwok, pod("b-filler", "other", 6, counter_image, node="real-b"),
              pod("counter", "ml", 2, counter_image, node="real-a"))
    wait("the counter counting on real-a", lambda: len(counts(lab.kubectl("-n", "ml", "logs", "counter").stdout)) > 5,
         180)
    wait("b-filler running", lambda: ready(lab.get("-n", "other", "pod", "b-filler")), 180)
    log("deploying gpudefrag: kubectl apply -k (deploy/kubernetes + the lab overlay)")
    lab.kubectl("apply", "-k", str(overlay(lab, work, image)), timeout=180)
    wait("the controller Running", lambda: crashing(lab) or next(
        (p for p in lab.get("-n", "gpudefrag", "pods")["items"] if ready(p)), None), 300)
    wait("the node agent Running on real-a", lambda: any(
        ready(p) and p["spec"].get("nodeName") == "real-a" for p in lab.get("-n", "gpudefrag-node", "pods")["items"]),
        300)
    # the deployed agent's start line names the container runtime it reached through the DaemonSet's hostPath
    # (/run/containerd on the node): the application hook's way into its node's containers
    try:
        agent_runtime = wait("the node agent on real-a naming its runtime", lambda: agent_runtime_of(lab, "real-a"),
                             60)
    except RuntimeError as e:
        raise RuntimeError(f"{e}; its log: {agent_log(lab, 'real-a')[-2000:]!r}") from None
    before_uid = lab.get("-n", "ml", "pod", "counter")["metadata"]["uid"]
    # the original's count, the last one read on real-a before its replacement appeared
    seen = {"before": counts(lab.kubectl("-n", "ml", "logs", "counter").stdout)[-1]}
    lab.apply(pod("train-8g", "ml", 8, counter_image))
    log("the 8-GPU pod is pending; waiting for the deployed controller to move the counter")

    def moved() -> dict[str, Any] | None:
        crashing(lab)
        pods = lab.get("-n", "ml", "pods")["items"]
        for p in pods:
            ann = p["metadata"].get("annotations") or {}
            if ann.get("gpudefrag.io/migrated-from") == "ml/counter" and ready(p):
                return p
        if not any((p["metadata"].get("annotations") or {}).get("gpudefrag.io/migrated-from") for p in pods):
            got = counts(lab.kubectl("-n", "ml", "logs", "counter", check=False).stdout)
            seen["before"] = got[-1] if got else seen["before"]
        return None

    repl = wait("the counter's replacement Ready", moved, 600)
    n_before = seen["before"]
    wait("the original gone", lambda: lab.kubectl("-n", "ml", "get", "pod", "counter", check=False).returncode != 0,
         300)
    bound = wait("train-8g bound", lambda: lab.get("-n", "ml", "pod", "train-8g")["spec"].get("nodeName"), 300)
    name = repl["metadata"]["name"]
    first = lab.kubectl("-n", "ml", "logs", name).stdout
    wait("the replacement counting on", lambda: counts(lab.kubectl("-n", "ml", "logs", name).stdout)[-1]
         > counts(first)[-1] + 5, 60)
    text = lab.kubectl("-n", "ml", "logs", name).stdout
    got = counts(text)
    started = [ln for ln in text.splitlines() if ln.startswith("started ")]
    # the controller pod that did it: its log says so (not merely the first one seen Ready)
    ctl = None
    for p in lab.get("-n", "gpudefrag", "pods")["items"]:
        text = lab.kubectl("-n", "gpudefrag", "logs", p["metadata"]["name"], check=False).stdout
        if re.search(r"migration \d+ of ml/counter: done", text):
            ctl = p
    if ctl is None:
        raise RuntimeError("no controller pod's log says it moved ml/counter")
    downtime = downtime_s(lab, ctl["metadata"]["name"])
    # one "started" line (the original's, its log carried in the checkpoint): a restart prints its own and counts
    # from 0 again; and no count ever goes back
    ok = (len(started) == 1 and n_before in got and got[-1] > n_before
          and all(b - a in (0, 1) for a, b in itertools.pairwise(got))
          and repl["spec"]["nodeName"] == "real-b" and bound == "real-a"
          and repl["metadata"]["uid"] != before_uid)
    return {"moved": ok, "by": ctl["metadata"]["name"], "counter_before": n_before, "counter_after": got[-1],
            "node_freed": "real-a", "pending_pod_bound_to": bound, "downtime_s": downtime,
            "agent_runtime": agent_runtime}


def agent_log(lab: Lab, node: str) -> str:
    """The deployed node agent's log on `node` ("" before its pod exists)."""
    for p in lab.get("-n", "gpudefrag-node", "pods")["items"]:
        if p["spec"].get("nodeName") == node:
            got = lab.kubectl("-n", "gpudefrag-node", "logs", p["metadata"]["name"], check=False)
            return got.stdout + got.stderr
    return ""


def agent_runtime_of(lab: Lab, node: str) -> str | None:
    """What the deployed node agent on `node` said at start of its container runtime ("containerd v2.2.9 (CRI v1)
    at unix:///host/run/containerd/containerd.sock", or "none (why; …)"), once its log has the line (one line:
    the agent never wraps its log)."""
    m = re.search(rf"node-agent on {re.escape(node)}: .*?, runtime (.*?), pid \d+", agent_log(lab, node))
    return m.group(1) if m else None


def crashing(lab: Lab) -> None:
    """Raise Broken when a gpudefrag container has restarted twice (a crash loop does not end by waiting), with
    its last words."""
    for ns in ("gpudefrag", "gpudefrag-node"):
        for p in lab.get("-n", ns, "pods")["items"]:
            for c in (p.get("status") or {}).get("containerStatuses") or []:
                if c.get("restartCount", 0) >= 2:
                    last = lab.kubectl("-n", ns, "logs", p["metadata"]["name"], "--previous", check=False)
                    raise Broken(f"{ns}/{p['metadata']['name']} restarted {c['restartCount']} times: "
                                 f"{(last.stdout + last.stderr).strip()[-2000:]}")


def downtime_s(lab: Lab, ctl_pod: str) -> float | None:
    """From the journal in the controller's pod: the checkpoint request to the replacement's Ready (the
    workload's state is frozen at the checkpoint; it goes on from it once the replacement runs)."""
    p = lab.kubectl("-n", "gpudefrag", "exec", ctl_pod, "--", "gpudefrag", "migrations", "--journal",
                    "/var/lib/gpudefrag/journal.db", "--json", check=False)
    if p.returncode != 0:
        return None
    for m in json.loads(p.stdout).get("migrations", []):
        steps = m.get("steps") or []
        t0 = next((s["at"] for s in steps if str(s.get("detail", "")).startswith("agent-checkpoint:")), None)
        t1 = next((s["at"] for s in steps if str(s.get("detail", "")).startswith("evict-original:")), None)
        if t0 is not None and t1 is not None:
            return round(t1 - t0, 2)
    return None


def main() -> int:
    if os.geteuid() != 0:
        print("e2e-kube-stateful: run as root (it starts kubelets and containerd)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gpudefrag-e2e-"))
    d = work / "lab"
    d.mkdir()
    out: dict[str, Any] = {"moved": False}
    try:
        subprocess.run([str(REPO / "tools/kubecluster/build.sh")], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([str(REPO / "tools/kubenode/build.sh")], check=True, stdout=subprocess.DEVNULL)
        log("control plane")
        subprocess.run([str(CLUSTER_SH), "start", str(d)], check=True, stdout=sys.stderr, timeout=600)
        log("two real nodes and the registry")
        subprocess.run([str(NODE_SH), "lab-up", str(d), "2"], check=True, stdout=sys.stderr, timeout=900)
        lab = Lab(d)
        log("the gpudefrag image (Containerfile)")
        image = build_image(lab)
        out = scenario(lab, work, image)
    finally:
        subprocess.run([str(NODE_SH), "lab-down", str(d)], stdout=sys.stderr, stderr=sys.stderr, timeout=600)
        subprocess.run([str(CLUSTER_SH), "stop", str(d)], stdout=sys.stderr, stderr=sys.stderr, timeout=120)
        if out["moved"]:
            shutil.rmtree(work, ignore_errors=True)  # ~1 GB: nodes' roots, images, the registry
        else:
            log(f"kept for a look: {work} (the nodes' and the control plane's logs)")
    print(json.dumps(out), flush=True)
    return 0 if out["moved"] else 1


if __name__ == "__main__":
    sys.exit(main())
