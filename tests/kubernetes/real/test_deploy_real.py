"""The deployment manifests applied for real: `kubectl apply -k deploy/kubernetes` on the test control plane,
then the controller with the ServiceAccount's own token — the RBAC the manifests grant must suffice for a whole
move, and what they do not grant must be refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from .lab import REPO, KubeLab
from .test_move_real import controller, fragmented, migrations

pytestmark = pytest.mark.kube


def test_deployment_manifests_apply_and_rbac_suffices(kube: KubeLab, tmp_path: Path) -> None:
    """`kubectl apply -k deploy/kubernetes`, then the controller runs with the ServiceAccount's own token: the
    move succeeds with exactly the RBAC the manifests grant, and what they do not grant is refused."""
    kube.kubectl("apply", "-k", str(REPO / "deploy" / "kubernetes"))
    try:
        token = kube.kubectl("-n", "gpudefrag", "create", "token", "gpudefrag-controller").stdout.strip()
        sa = tmp_path / "sa.kubeconfig"
        server = kube.kubectl("config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}").stdout
        kube.kubectl("config", "set-cluster", "local", f"--server={server}",
                     f"--certificate-authority={kube.dir / 'pki' / 'ca.crt'}", "--embed-certs", kubeconfig=sa)
        kube.kubectl("config", "set-credentials", "sa", f"--token={token}", kubeconfig=sa)
        kube.kubectl("config", "set-context", "sa", "--cluster=local", "--user=sa", kubeconfig=sa)
        kube.kubectl("config", "use-context", "sa", kubeconfig=sa)
        fragmented(kube)
        # outside the grant: reading secrets, deleting a node
        for args in (["get", "secrets", "-A"], ["delete", "node", "gpu-node-2"]):
            r = kube.kubectl(*args, kubeconfig=sa, check=False)
            assert r.returncode != 0 and "forbidden" in r.stderr.lower(), (args, r.stderr)
        env = {"KUBECONFIG": str(sa)}
        p = controller(kube, tmp_path, env=env)
        assert p.returncode == 0, p.stdout + p.stderr
        assert [m["state"] for m in migrations(tmp_path)] == ["done", "done"]
        kube.wait("train-8g bound", lambda: kube.get("pod", "train-8g", ns="ml")["spec"].get("nodeName"))
    finally:
        kube.kubectl("delete", "-k", str(REPO / "deploy" / "kubernetes"), "--wait=false", check=False)
        kube.wait("namespace gpudefrag gone", lambda: kube.kubectl(
            "get", "namespace", "gpudefrag", check=False).returncode != 0, timeout=120)



def test_without_a_default_storageclass_the_overlay_runs_the_controller(kube: KubeLab) -> None:
    """The test control plane has no StorageClass, like many a fresh cluster: the base's journal claim stays
    Pending and so does the controller; `deploy/kubernetes-no-storageclass` puts the journal in an emptyDir and
    the controller's pod is scheduled. And `--dry-run=server` before the namespace exists says so, object by
    object (docs/kubernetes.md shows it)."""
    from .lab import gpu_node

    kube.nodes(gpu_node("gpu-node-0"))
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
        kube.wait("namespace gpudefrag gone", lambda: kube.kubectl(
            "get", "namespace", "gpudefrag", check=False).returncode != 0, timeout=120)
        kube.kubectl("apply", "-k", str(overlay))
        kube.wait("the controller pod scheduled with its journal in an emptyDir", lambda: (
            p := kube.get("pods", ns="gpudefrag")["items"]) and p[0]["spec"].get("nodeName") == "gpu-node-0")
        assert kube.kubectl("-n", "gpudefrag", "get", "pvc", "-o", "name").stdout.strip() == ""
    finally:
        kube.kubectl("delete", "-k", str(base), "--wait=false", check=False)
        kube.kubectl("delete", "namespace", "gpudefrag", "--wait=false", check=False)
        kube.wait("namespace gpudefrag gone", lambda: kube.kubectl(
            "get", "namespace", "gpudefrag", check=False).returncode != 0, timeout=120)
