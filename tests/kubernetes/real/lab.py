"""The real control plane the `kube` tests run against (tools/kubecluster/cluster.sh), and the objects they put
in it: fake GPU nodes that KWOK keeps Ready, GPU pods, owners, quotas, PDBs.

Nodes are cluster-wide, so every test starts from an empty cluster (`KubeLab.reset`) and builds its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

REPO = Path(__file__).resolve().parents[3]
TOOLS = REPO / "tools" / "kubecluster"
H100 = "NVIDIA-H100-80GB-HBM3"
GPU = "nvidia.com/gpu"
TEST_LABEL = "gpudefrag.io/test"  # on every namespace a test creates, so reset finds them
REAL_NODE_LABEL = "gpudefrag.io/kubenode"  # on real kubelet nodes (tools/kubenode): reset leaves them alone


def ready(obj: dict[str, Any]) -> bool:
    """A pod's or a node's Ready condition is True."""
    return any(c["type"] == "Ready" and c["status"] == "True" for c in obj["status"].get("conditions") or [])


def gpu_node(name: str, gpus: int = 8, *, product: str = H100, plugin: bool = True,
             taints: list[dict[str, str]] | None = None, unschedulable: bool = False,
             mig: dict[str, int] | None = None, full_gpus: int | None = None, pool: str = "gpu-h100",
             driver: str = "550.54.15", cuda: str = "12.4") -> dict[str, Any]:
    """A node as GPU feature discovery and the NVIDIA device plugin would leave it. `plugin=False`: the labels
    say `gpus` GPUs but the kubelet advertises none (the device plugin never registered)."""
    major, minor, rev = driver.split(".")
    labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "type": "kwok", "gpudefrag.io/pool": pool, "eks.amazonaws.com/nodegroup": pool,
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.family": "hopper",
        "nvidia.com/cuda.driver-version.full": driver, "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor, "nvidia.com/cuda.driver.rev": rev,
        "nvidia.com/cuda.runtime-version.full": cuda, "nvidia.com/cuda.runtime.major": cuda.split(".")[0],
        "nvidia.com/cuda.runtime.minor": cuda.split(".")[1],
        "nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "mixed" if mig else "none",
    }
    res = {"cpu": "192", "memory": "2048Gi", "pods": "110", "ephemeral-storage": "3500Gi"}
    if plugin:
        res[GPU] = str(gpus if full_gpus is None else full_gpus)
        for prof, c in (mig or {}).items():
            res[f"nvidia.com/mig-{prof}"] = str(c)
            labels[f"nvidia.com/mig-{prof}.count"] = str(c)
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": spec, "status": {"capacity": res, "allocatable": dict(res)}}


def pod_spec(gpus: int, *, node: str | None = None, mig: str | None = None, selector: dict[str, str] | None = None,
             tolerations: list[dict[str, Any]] | None = None, models: list[str] | None = None,
             restart: str = "Always") -> dict[str, Any]:
    limits = {GPU: str(gpus)} if gpus else {}
    if mig:
        limits = {f"nvidia.com/mig-{mig}": "1"}
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.local/gpu-app:1",
                        "resources": {"limits": limits, "requests": dict(limits, cpu="4", memory="32Gi")}}],
        "restartPolicy": restart, "terminationGracePeriodSeconds": 0, "automountServiceAccountToken": False,
    }
    if node:
        spec["nodeName"] = node
    if selector:
        spec["nodeSelector"] = selector
    if tolerations:
        spec["tolerations"] = tolerations
    if models:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": models}]}]}}}
    return spec


def gpu_pod(name: str, gpus: int, ns: str = "ml", *, labels: dict[str, str] | None = None,
            annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels or {"app": name},
                         "annotations": annotations or {}},
            "spec": pod_spec(gpus, **spec)}


def owner(kind: str, name: str, gpus: int, ns: str = "ml", *, replicas: int = 1, node: str | None = None,
          annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A Deployment, ReplicaSet or StatefulSet whose pods ask for `gpus` GPUs, bound straight to `node` when
    given (so a test decides the layout, not the scheduler)."""
    labels = {"app": name}
    tmpl = {"metadata": {"labels": labels, "annotations": annotations or {}}, "spec": pod_spec(gpus, node=node)}
    spec: dict[str, Any] = {"replicas": replicas, "selector": {"matchLabels": labels}, "template": tmpl}
    if kind == "StatefulSet":
        spec["serviceName"] = name
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "namespace": ns}, "spec": spec}


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {TEST_LABEL: "1"}}}


def quota(ns: str, gpus: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu-quota", "namespace": ns},
            "spec": {"hard": {f"requests.{GPU}": str(gpus)}}}


def pdb(name: str, ns: str, match: dict[str, str], *, min_available: int | None = None,
        max_unavailable: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {"matchLabels": match}}
    if min_available is not None:
        spec["minAvailable"] = min_available
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name, "namespace": ns},
            "spec": spec}


def start_lab(d: Path, require: Callable[[str, str], NoReturn]) -> KubeLab:
    """Start a control plane in `d` from the cached binaries (tools/kubecluster/build.sh, which
    `scripts/setup.sh all` runs; a build takes many minutes, so here it is only reused). What cannot start is
    `require("KUBE", why)`: a failure under GPUDEFRAG_REQUIRE_KUBE=1, else a loud skip."""
    build = subprocess.run([str(TOOLS / "build.sh")], capture_output=True, text=True,
                           env={**os.environ, "GPUDEFRAG_KUBE_NO_BUILD": "1"}, timeout=60)
    if build.returncode != 0:
        why = build.stderr.strip().splitlines()[-1] if build.stderr.strip() else "build.sh failed"
        require("KUBE", f"KUBERNETES CONTROL PLANE CANNOT RUN HERE ({why}); real-cluster tests are SKIPPED")
    p = subprocess.run([str(TOOLS / "cluster.sh"), "start", str(d)], capture_output=True, text=True, timeout=400)
    if p.returncode != 0:
        subprocess.run([str(TOOLS / "cluster.sh"), "stop", str(d)], capture_output=True, timeout=60)
        why = f"cluster.sh start failed: {p.stderr.strip()[-1500:]}"
        require("KUBE", f"KUBERNETES CONTROL PLANE CANNOT RUN HERE ({why}); real-cluster tests are SKIPPED")
    return KubeLab(d, Path(build.stdout.strip()))


def stop_lab(lab: KubeLab) -> None:
    subprocess.run([str(TOOLS / "cluster.sh"), "stop", str(lab.dir)], capture_output=True, timeout=60)


DUMP_KINDS = "nodes,pods,resourcequotas,poddisruptionbudgets,events,replicasets,jobs"


@dataclass
class KubeLab:
    dir: Path
    bin: Path

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    # ------------------------------------------------------------------ kubectl
    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120,
                kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([str(self.bin / "kubectl"), "--kubeconfig", str(kubeconfig or self.kubeconfig), *args],
                           input=input, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {p.stderr.strip()}")
        return p

    def token_kubeconfig(self, path: Path, token: str) -> Path:
        """A kubeconfig at PATH that speaks to this cluster with a ServiceAccount's TOKEN (and its CA): what a
        test needs to act as the controller or the node agent, never as the admin."""
        server = self.kubectl("config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}").stdout
        self.kubectl("config", "set-cluster", "local", f"--server={server}",
                     f"--certificate-authority={self.dir / 'pki' / 'ca.crt'}", "--embed-certs", kubeconfig=path)
        self.kubectl("config", "set-credentials", "sa", f"--token={token}", kubeconfig=path)
        self.kubectl("config", "set-context", "sa", "--cluster=local", "--user=sa", kubeconfig=path)
        self.kubectl("config", "use-context", "sa", kubeconfig=path)
        return path

    def create(self, *objs: dict[str, Any]) -> None:
        """`kubectl create` in order (namespaces and quotas before what they govern)."""
        self.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)}))

    def get(self, what: str, *names: str, ns: str | None = None) -> dict[str, Any]:
        args = ["get", what, *names, "-o", "json"]
        args += ["-n", ns] if ns else (["-A"] if not names else [])
        return json.loads(self.kubectl(*args).stdout)

    def pods(self, ns: str) -> list[dict[str, Any]]:
        return self.get("pods", ns=ns)["items"]

    def dump(self, path: Path) -> Path:
        """What the docs tell a user to run, by the real kubectl."""
        path.write_text(self.kubectl("get", DUMP_KINDS, "-A", "-o", "json").stdout)
        return path

    def client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(str(self.kubeconfig))

    # ------------------------------------------------------------------ waiting
    @staticmethod
    def wait(what: str, check: Callable[[], Any], timeout: float = 90, every: float = 0.3,
             state: Callable[[], str] | None = None) -> Any:
        """Poll `check` until it is truthy; on timeout say what was awaited and, given `state`, what there was."""
        end = time.monotonic() + timeout
        while True:
            got = check()
            if got:
                return got
            if time.monotonic() > end:
                seen = f"; instead: {state()}" if state else ""
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{seen}")
            time.sleep(every)

    def pod_states(self, ns: str) -> str:
        """Each pod in `ns` as name@node phase ready/deleting, for a timeout's message."""
        return ", ".join(
            f"{p['metadata']['name']}@{p['spec'].get('nodeName') or '-'} {p['status'].get('phase')}"
            f"{' ready' if ready(p) else ''}{' deleting' if p['metadata'].get('deletionTimestamp') else ''}"
            for p in self.pods(ns)) or "no pods"

    def namespaces(self, *names: str) -> None:
        """Create test namespaces and wait for their default ServiceAccount (pods are refused until it exists)."""
        self.create(*(namespace(n) for n in names))
        for n in names:
            self.wait(f"serviceaccount {n}/default", lambda n=n: self.kubectl(
                "-n", n, "get", "serviceaccount", "default", check=False).returncode == 0)

    def nodes(self, *nodes: dict[str, Any]) -> None:
        """Create nodes and wait until KWOK reports every one Ready, with the GPUs the test gave it."""
        self.create(*nodes)
        want = {n["metadata"]["name"]: n["status"]["allocatable"] for n in nodes}

        def all_ready() -> bool:
            items = {n["metadata"]["name"]: n for n in self.get("nodes")["items"]}
            for name, alloc in want.items():
                n = items.get(name)
                if n is None or not ready(n):
                    return False
                if n["status"].get("allocatable", {}).get(GPU) != alloc.get(GPU):
                    return False
            return True

        self.wait("nodes Ready", all_ready)

    def kubelet_gone(self, name: str, hold_s: float = 3.0) -> None:
        """The node's "kubelet" stops: KWOK lets go of it and its Ready condition turns False, and stays so.
        KWOK sets a node it still tends back to Ready at once, and it may see the annotation go only seconds
        later on a loaded machine (a CI flake), so the status is patched again until it holds for `hold_s`."""
        self.kubectl("annotate", "node", name, "kwok.x-k8s.io/node-")
        not_ready = json.dumps({"status": {"conditions": [{
            "type": "Ready", "status": "False", "reason": "KubeletNotReady",
            "message": "kubelet stopped posting node status"}]}})
        held_since: float | None = None
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if ready(self.get("node", name)):
                held_since = None
                self.kubectl("patch", "node", name, "--subresource=status", "-p", not_ready)
            elif held_since is None:
                held_since = time.monotonic()
            elif time.monotonic() - held_since >= hold_s:
                return
            time.sleep(0.3)
        raise AssertionError(f"{name} did not stay NotReady")

    def scheduled_or_refused(self, ns: str, names: Iterable[str], timeout: float = 90) -> None:
        """Wait until each pod is either Running and Ready, or has the scheduler's PodScheduled=False message."""
        def settled() -> bool:
            by = {p["metadata"]["name"]: p for p in self.pods(ns)}
            for n in names:
                p = by.get(n)
                if p is None:
                    return False
                conds = {c["type"]: c for c in p["status"].get("conditions") or []}
                ps = conds.get("PodScheduled")
                if ps and ps["status"] == "False" and ps.get("message"):
                    continue
                if conds.get("Ready", {}).get("status") != "True":
                    return False
            return True

        def seen() -> str:
            """Each awaited pod's node, phase and conditions: on a timeout, which of them did not settle and how."""
            by = {p["metadata"]["name"]: p for p in self.pods(ns)}
            out = []
            for n in names:
                p = by.get(n)
                if p is None:
                    out.append(f"{n}: absent")
                    continue
                conds = ",".join(f"{c['type']}={c['status']}" for c in p["status"].get("conditions") or [])
                out.append(f"{n}: node={p['spec'].get('nodeName')} phase={p['status'].get('phase')} [{conds}]")
            return "; ".join(out)

        self.wait(f"pods {list(names)} settled", settled, timeout, state=seen)

    def events(self, ns: str, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.get("events", ns=ns)["items"] if e.get("reason") == reason]

    def restart(self, component: str) -> None:
        """Stop one component of the control plane and start it again with its own command line (cluster.sh
        waits for an API server to answer /readyz)."""
        subprocess.run([str(TOOLS / "cluster.sh"), "restart", str(self.dir), component], check=True,
                       capture_output=True, timeout=180)

    # ------------------------------------------------------------------ isolation
    def reset(self) -> None:
        """Back to an empty cluster: the test namespaces (and so their pods) and every node go, then KWOK is
        restarted with no node leases left. KWOK queues its stages by namespace/name and deletes and patches by
        name alone, so a stage queued for the last test's `ml/notebook` could delete the next test's pod of that
        name (a CI flake on a loaded machine); a fresh KWOK holds nothing from before."""
        ns = [n["metadata"]["name"] for n in self.get("namespaces")["items"]
              if (n["metadata"].get("labels") or {}).get(TEST_LABEL)]
        if ns:
            for n in ns:
                self.kubectl("-n", n, "delete", "pods", "--all", "--force", "--grace-period=0", "--wait=false",
                             check=False)
            self.kubectl("delete", "namespace", *ns, "--wait=false", check=False)
        self.kubectl("delete", "nodes", "-l", f"!{REAL_NODE_LABEL}", "--wait=false", check=False)

        def empty() -> bool:
            left = [n for n in self.get("namespaces")["items"] if (n["metadata"].get("labels") or {}).get(TEST_LABEL)]
            return not left and not any(REAL_NODE_LABEL not in (n["metadata"].get("labels") or {})
                                        for n in self.get("nodes")["items"])

        self.wait("test namespaces and nodes to go", empty, timeout=180)
        self.restart("kwok")
        # the old KWOK's node leases: the new one (another holder) would wait out their 40 s before it took
        # a node of the same name. With no nodes left the new KWOK makes none until the test's nodes come.
        self.kubectl("-n", "kube-node-lease", "delete", "leases", "--all", "--wait=false")
        # a controller the last test left holding the leader-election Lease must not refuse this test's
        self.kubectl("-n", "default", "delete", "lease", "gpudefrag-controller", "--ignore-not-found")
