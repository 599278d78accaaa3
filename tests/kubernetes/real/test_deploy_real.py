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

