"""tools/kubecluster/cluster.sh as the first hour uses it (issue 31): `nodes` adds KWOK GPU nodes that gpudefrag
reads as GPU nodes (count, GPUs, product, MIG, taints); `start` on the folder of the running cluster refuses and
leaves it alone (an old folder and bad options: tests/kubernetes/test_cluster_script.py, no control plane needed)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .lab import TOOLS, KubeLab, ready

pytestmark = pytest.mark.kube

SCRIPT = str(TOOLS / "cluster.sh")


def script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=120)


def test_nodes_are_gpu_nodes_gpudefrag_reads(kube: KubeLab, cli: Any, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    p = script("nodes", str(kube.dir), "--count", "2", "--start", "5", "--gpus", "8",
               "--product", "NVIDIA-A100-SXM4-80GB", "--mig", "1g.10gb=7", "--taint", "dedicated=train:NoSchedule")
    assert p.returncode == 0, p.stderr
    names = ["gpu-node-5", "gpu-node-6"]
    # Ready, and the node lifecycle controller has taken its not-ready taint off again (a moment later)
    kube.wait("the script's nodes Ready, without the not-ready taint", lambda: all(
        ready(n) and not any(t["key"] == "node.kubernetes.io/not-ready" for t in n["spec"].get("taints") or [])
        for n in kube.get("nodes")["items"] if n["metadata"]["name"] in names)
        and {n["metadata"]["name"] for n in kube.get("nodes")["items"]} >= set(names))
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    code, _, err = cli("kube", "snapshot", "--kube", "--out", str(tmp_path / "snap.json"))
    assert code == 0, err
    nodes = {n["name"]: n for n in json.loads((tmp_path / "snap.json").read_text())["nodes"]}
    assert sorted(nodes) == names
    for n in nodes.values():
        assert n["gpus"] == 8 and n["gpu_model"] == "NVIDIA-A100-SXM4-80GB", n
        assert n["mig_devices"] == {"1g.10gb": 7}, n
        assert n["taints"] == [{"key": "dedicated", "value": "train", "effect": "NoSchedule"}], n


def test_start_refuses_the_folder_of_a_running_cluster(kube: KubeLab) -> None:
    running = script("start", str(kube.dir))
    assert running.returncode == 2 and "the cluster is running" in running.stderr, running.stderr
    assert kube.kubectl("get", "namespaces").returncode == 0  # untouched, same CA
