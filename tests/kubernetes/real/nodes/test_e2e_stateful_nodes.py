"""The acceptance path of issue 26 in the test suite: scripts/e2e_kube_stateful.py's `scenario` — gpudefrag
built from the Containerfile, deployed with `kubectl apply -k`, the *deployed* controller moving a counter pod
with its state from real-a to real-b so that a pending 8-GPU pod gets real-a — on this package's real nodes; the
deployed node agent reaches its node's container runtime through the DaemonSet's hostPath."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from ..lab import REPO
from .lab import KubeNodes

pytestmark = pytest.mark.kube


def _e2e():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("e2e_kube_stateful", REPO / "scripts" / "e2e_kube_stateful.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_deployed_controller_moves_a_pod_with_its_state(kube_nodes: KubeNodes, tmp_path: Path) -> None:
    e2e = _e2e()
    lab = e2e.Lab(kube_nodes.lab.dir)
    image = kube_nodes.push_gpudefrag_image()
    try:
        out = e2e.scenario(lab, tmp_path, image)
    finally:
        # the package's other tests share these nodes: no deployed controller or agents left to act on them
        if (tmp_path / "overlay").is_dir():
            lab.kubectl("delete", "-k", str(tmp_path / "overlay"), "--wait=false", "--ignore-not-found", check=False)
        for ns in ("ml", "other"):
            lab.kubectl("-n", ns, "delete", "pods", "--all", "--grace-period=0", "--wait=false", check=False)
        lab.kubectl("delete", "node", "kwok-0", "--ignore-not-found", check=False)
        # gone, not going: the next test applies the agent's namespace again
        e2e.wait("namespaces gpudefrag, gpudefrag-node gone", lambda: all(lab.kubectl(
            "get", "namespace", n, check=False).returncode != 0 for n in ("gpudefrag", "gpudefrag-node")), 180)
    print(json.dumps(out))
    assert out["moved"], out
    assert out["by"].startswith("gpudefrag-controller-")
    assert out["counter_after"] > out["counter_before"]
    assert out["node_freed"] == out["pending_pod_bound_to"] == "real-a"
    assert out["downtime_s"] is not None and out["downtime_s"] > 0
    # the deployed agent reaches its node's containerd where the DaemonSet mounts it (the application hook's way)
    assert out["agent_runtime"].startswith("containerd v2."), out
    assert out["agent_runtime"].endswith(" at unix:///host/run/containerd/containerd.sock"), out
