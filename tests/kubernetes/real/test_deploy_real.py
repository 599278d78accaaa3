"""The deployment manifests applied for real: `kubectl apply -k deploy/kubernetes` on the test control plane,
then requests with the ServiceAccounts' own tokens — the RBAC and admission the manifests grant must suffice for
a whole move, and what they do not grant must be refused, by the real API server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .lab import REPO, KubeLab, gpu_pod
from .test_move_real import controller, fragmented, migrations

pytestmark = pytest.mark.kube

CONTROLLER = "system:serviceaccount:gpudefrag:gpudefrag-controller"
AGENT = "system:serviceaccount:gpudefrag-node:gpudefrag-node-agent"


def refused(kube: KubeLab, kc: Path, *args: str, input: str | None = None, why: str = "forbidden") -> str:
    r = kube.kubectl(*args, kubeconfig=kc, check=False, input=input)
    assert r.returncode != 0 and why in r.stderr.lower(), (args, r.stdout, r.stderr)
    return r.stderr


def can(kube: KubeLab, who: str, *args: str) -> bool:
    return kube.kubectl("auth", "can-i", *args, f"--as={who}", check=False).stdout.strip() == "yes"


def test_deployment_manifests_apply_and_rbac_suffices(kube: KubeLab, tmp_path: Path) -> None:
    """`kubectl apply -k deploy/kubernetes`, then the controller runs with the ServiceAccount's own token: the
    move succeeds with exactly the RBAC and admission the manifests grant; what they do not grant is refused."""
    # the policy's namespaces exist before the manifests bind roles in them (ml: the workloads, research: empty)
    fragmented(kube)
    kube.namespaces("research", "other")
    # the admission API the manifests use is served, as v1 (GA)
    assert "validatingadmissionpolicies" in kube.kubectl("api-resources", "--api-group=admissionregistration.k8s.io",
                                                         "-o", "name").stdout
    kube.kubectl("apply", "-k", str(REPO / "deploy" / "kubernetes"))
    try:
        kube.wait("both admission policies ready", lambda: all(
            (p.get("status") or {}).get("observedGeneration") for p in kube.get(
                "validatingadmissionpolicies")["items"] if p["metadata"]["name"].startswith("gpudefrag-")))
        token = kube.kubectl("-n", "gpudefrag", "create", "token", "gpudefrag-controller").stdout.strip()
        sa = kube.token_kubeconfig(tmp_path / "sa.kubeconfig", token)
        # RBAC, as the API server answers it
        assert can(kube, CONTROLLER, "create", "pods", "-n", "ml")
        assert can(kube, CONTROLLER, "create", "pods", "--subresource=eviction", "-n", "ml")
        # no exec anywhere, not even in the policy's namespaces: the application hook's signal is the node agent's
        # (through its node's container runtime), so nothing the controller holds runs a command in a pod
        for args in (["get", "secrets", "-n", "gpudefrag"], ["create", "pods", "-n", "other"],
                     ["delete", "pods", "-n", "other"], ["create", "pods", "--subresource=exec", "-n", "other"],
                     ["create", "pods", "--subresource=exec", "-n", "ml"],
                     ["create", "pods", "--subresource=exec", "-n", "research"],
                     ["create", "pods", "--subresource=exec", "-A"], ["get", "pods", "--subresource=exec", "-n", "ml"],
                     ["create", "pods", "--subresource=attach", "-n", "ml"],
                     ["create", "nodes", "--subresource=proxy"], ["get", "nodes", "--subresource=proxy"],
                     ["create", "nodes", "--subresource=checkpoint"], ["create", "pods", "-n", "kube-system"],
                     ["delete", "nodes"]):
            assert not can(kube, CONTROLLER, *args), args
        assert can(kube, AGENT, "create", "nodes", "--subresource=checkpoint")
        for args in (["create", "nodes", "--subresource=proxy"], ["get", "nodes", "--subresource=proxy"],
                     ["create", "pods", "--subresource=exec", "-n", "ml"],
                     ["create", "pods", "--subresource=exec", "-A"], ["get", "secrets", "-A"],
                     ["delete", "pods", "-n", "ml"], ["create", "pods", "-n", "ml"]):
            assert not can(kube, AGENT, *args), args

        # real requests with the controller's token: refused by RBAC ...
        kube.create(gpu_pod("bystander", 0, "other", node="gpu-node-2"))
        refused(kube, sa, "get", "secrets", "-A")
        refused(kube, sa, "delete", "node", "gpu-node-2")
        refused(kube, sa, "-n", "other", "delete", "pod", "bystander")
        refused(kube, sa, "-n", "other", "exec", "bystander", "--", "true")
        # ... exec also into a pod it manages, in a namespace its policy moves pods in (notebook: a move candidate)
        refused(kube, sa, "-n", "ml", "exec", "notebook", "--", "true")
        refused(kube, sa, "get", "--raw", "/api/v1/nodes/gpu-node-2/proxy/pods")
        # ... and, inside a namespace it may write in, by admission: no pod that is not a replacement, no
        # replacement with host access, no delete of a pod that is not its replacement, no spec or label change
        plain = gpu_pod("not-a-replacement", 0, "ml", node="gpu-node-2")
        refused(kube, sa, "create", "-f", "-", input=json.dumps(plain), why="creates only replacement pods")
        sneaky = gpu_pod("sneaky", 0, "ml", node="gpu-node-2", annotations={
            "gpudefrag.io/move-id": "x", "gpudefrag.io/migrated-from": "ml/notebook"})
        sneaky["spec"]["hostNetwork"] = True
        refused(kube, sa, "create", "-f", "-", input=json.dumps(sneaky), why="host access")
        elsewhere = gpu_pod("elsewhere", 0, "ml", node="gpu-node-2", annotations={
            "gpudefrag.io/move-id": "x", "gpudefrag.io/migrated-from": "other/bystander"})
        refused(kube, sa, "create", "-f", "-", input=json.dumps(elsewhere), why="creates only replacement pods")
        refused(kube, sa, "-n", "ml", "delete", "pod", "notebook", why="deletes only its own replacement")
        refused(kube, sa, "-n", "ml", "label", "pod", "notebook", "app=hijacked", "--overwrite",
                why="changes only")
        refused(kube, sa, "-n", "ml", "annotate", "pod", "notebook", "example.com/x=1", why="changes only")
        # nor can it opt a pod in to the application hook (the node agent signals only a pod that asked for it)
        refused(kube, sa, "-n", "ml", "annotate", "pod", "notebook", "gpudefrag.io/checkpoint=app",
                why="never changes a pod's opt-ins")
        refused(kube, sa, "-n", "ml", "annotate", "pod", "notebook", "gpudefrag.io/move-",  # its owner's choice
                why="never changes a pod's opt-ins")

        # the node agent's token is bound to its own pod, on a node: it may answer on that node's pods only
        agent = kube.wait("a node agent pod on gpu-node-1", lambda: next(
            (p["metadata"]["name"] for p in kube.pods("gpudefrag-node") if p["spec"].get("nodeName") == "gpu-node-1"),
            None))
        atok = kube.kubectl("-n", "gpudefrag-node", "create", "token", "gpudefrag-node-agent", "--bound-object-kind",
                            "Pod", "--bound-object-name", agent).stdout.strip()
        akc = kube.token_kubeconfig(tmp_path / "agent.kubeconfig", atok)
        answer = "gpudefrag.io/agent-checkpoint-result={}"
        kube.kubectl("-n", "ml", "annotate", "pod", "notebook", answer, kubeconfig=akc)  # notebook is on gpu-node-1
        refused(kube, akc, "-n", "other", "annotate", "pod", "bystander", answer, why="own node")
        refused(kube, akc, "-n", "ml", "annotate", "pod", "notebook", "gpudefrag.io/move-id=x", why="own node")
        refused(kube, akc, "-n", "ml", "delete", "pod", "notebook")

        # and with exactly these grants the controller makes the moves
        kube.kubectl("-n", "other", "delete", "pod", "bystander", "--wait=false")
        # its Lease in its own namespace, where the manifests grant it (as the Deployment's POD_NAMESPACE says)
        p = controller(kube, tmp_path, env={"KUBECONFIG": str(sa), "POD_NAMESPACE": "gpudefrag"})
        assert p.returncode == 0, p.stdout + p.stderr
        assert [m["state"] for m in migrations(tmp_path)] == ["done", "done"]
        kube.wait("train-8g bound", lambda: kube.get("pod", "train-8g", ns="ml")["spec"].get("nodeName"))
    finally:
        kube.kubectl("delete", "-k", str(REPO / "deploy" / "kubernetes"), "--wait=false", check=False)
        kube.wait("namespaces gpudefrag, gpudefrag-node gone", lambda: all(kube.kubectl(
            "get", "namespace", n, check=False).returncode != 0 for n in ("gpudefrag", "gpudefrag-node")),
            timeout=120)



def test_without_a_default_storageclass_the_overlay_runs_the_controller(kube: KubeLab) -> None:
    """The test control plane has no StorageClass, like many a fresh cluster: the base's journal claim stays
    Pending and so does the controller; `deploy/kubernetes-no-storageclass` puts the journal in an emptyDir and
    the controller's pod is scheduled. And `--dry-run=server` before the namespace exists says so, object by
    object (docs/kubernetes.md shows it)."""
    from .lab import gpu_node

    kube.nodes(gpu_node("gpu-node-0"))
    kube.namespaces("ml", "research")  # the policy's namespaces, where the controller's writes are bound
    base, overlay = REPO / "deploy" / "kubernetes", REPO / "deploy" / "kubernetes-no-storageclass"
    assert not kube.get("storageclass")["items"]
    dry = kube.kubectl("apply", "-k", str(base), "--dry-run=server", check=False)
    assert dry.returncode != 0 and 'namespaces "gpudefrag" not found' in dry.stderr, dry.stdout + dry.stderr
    assert "namespace/gpudefrag created (server dry run)" in dry.stdout, dry.stdout
    try:
        kube.kubectl("apply", "-k", str(base))

        def phase() -> str:
            pods = kube.get("pods", ns="gpudefrag")["items"]
            return pods[0]["status"].get("phase", "") if pods else ""

        kube.wait("the controller pod", phase)
        pvc = kube.get("pvc", "gpudefrag-state", ns="gpudefrag")
        assert pvc["status"]["phase"] == "Pending" and phase() == "Pending"
        kube.kubectl("delete", "-k", str(base), "--wait=true", check=False)
        kube.wait("namespaces gpudefrag, gpudefrag-node gone", lambda: all(kube.kubectl(
            "get", "namespace", n, check=False).returncode != 0 for n in ("gpudefrag", "gpudefrag-node")),
            timeout=120)
        kube.kubectl("apply", "-k", str(overlay))
        kube.wait("the controller pod scheduled with its journal in an emptyDir", lambda: (
            p := kube.get("pods", ns="gpudefrag")["items"]) and p[0]["spec"].get("nodeName") == "gpu-node-0")
        assert kube.kubectl("-n", "gpudefrag", "get", "pvc", "-o", "name").stdout.strip() == ""
    finally:
        kube.kubectl("delete", "-k", str(base), "--wait=false", check=False)
        kube.kubectl("delete", "namespace", "gpudefrag", "gpudefrag-node", "--wait=false", check=False)
        kube.wait("namespaces gpudefrag, gpudefrag-node gone", lambda: all(kube.kubectl(
            "get", "namespace", n, check=False).returncode != 0 for n in ("gpudefrag", "gpudefrag-node")),
            timeout=120)
