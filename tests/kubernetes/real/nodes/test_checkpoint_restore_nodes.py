"""The platform the with-state move stands on, for real: a GPU pod on node A is checkpointed through its
kubelet's API, the archive becomes a checkpoint image in the lab registry, and a pod on node B runs from it and
keeps counting where A's left off — no "started" line, so a restore, not a restart."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from ..lab import ready
from .lab import COUNTER, KubeNodes, counter_pod, counts

pytestmark = pytest.mark.kube


def test_two_real_nodes_advertise_fake_gpus_with_gfd_labels(kube_nodes: KubeNodes) -> None:
    assert sorted(kube_nodes.nodes) == ["real-a", "real-b"]
    ips = set()
    for name, node in kube_nodes.nodes.items():
        n = kube_nodes.lab.get("nodes", name)
        assert ready(n), n["status"]["conditions"]
        assert n["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        labels = n["metadata"]["labels"]
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert labels["nvidia.com/gpu.count"] == "8"
        assert labels["nvidia.com/cuda.driver-version.full"] == "550.54.15"
        addrs = {a["type"]: a["address"] for a in n["status"]["addresses"]}
        assert addrs["InternalIP"] == node.ip
        ips.add(node.ip)
        # each node its own containerd: no container state shared
        assert node.env["CONTAINERD_ADDRESS"].startswith(str(node.dir))
    assert len(ips) == 2


def test_checkpoint_on_node_a_restores_on_node_b_and_keeps_counting(kube_nodes: KubeNodes, tmp_path: Path) -> None:
    lab = kube_nodes.lab
    ns = "stateful"
    lab.namespaces(ns)
    original = counter_pod("counter", "real-a", 2, kube_nodes.image(COUNTER))
    original["metadata"]["namespace"] = ns
    lab.create(original)
    lab.wait("the counter pod Running on real-a", lambda: ready(lab.get("pods", "counter", ns=ns)), timeout=120,
             state=lambda: lab.pod_states(ns))
    assert lab.get("pods", "counter", ns=ns)["spec"]["nodeName"] == "real-a"
    lab.wait("the counter to count past 5", lambda: len(counts(kube_nodes.logs(ns, "counter"))) > 5, timeout=60)

    before = counts(kube_nodes.logs(ns, "counter"))[-1]
    archive = kube_nodes.checkpoint("real-a", ns, "counter", "main")
    after = counts(kube_nodes.logs(ns, "counter"))[-1]
    assert archive.is_file() and archive.stat().st_size > 0
    assert str(archive).startswith(str(kube_nodes.nodes["real-a"].dir))  # node A's own kubelet root
    # the original keeps running through the checkpoint
    lab.wait("the original to keep counting", lambda: counts(kube_nodes.logs(ns, "counter"))[-1] > after, timeout=30)
    started = [ln for ln in kube_nodes.logs(ns, "counter").splitlines() if ln.startswith("started ")]
    assert len(started) == 1

    image = kube_nodes.push_checkpoint_image(archive, "main", "gpudefrag/checkpoints/counter:t1", tmp_path / "ck.tar")
    archive.unlink()  # it holds the container's memory; the package's later tests count real-a's archives
    restored = counter_pod("restored", "real-b", 2, image)
    restored["metadata"]["namespace"] = ns
    lab.create(restored)
    lab.wait("the restored pod Running on real-b", lambda: ready(lab.get("pods", "restored", ns=ns)), timeout=120,
             state=lambda: lab.pod_states(ns))
    assert lab.get("pods", "restored", ns=ns)["spec"]["nodeName"] == "real-b"
    lab.wait("the restored counter to count on", lambda: counts(kube_nodes.logs(ns, "restored"))[-1] > after + 3,
             timeout=60)
    log_b = kube_nodes.logs(ns, "restored")
    got = counts(log_b)
    # The restored container's log starts with the original's (the archive carries it) and goes on from the
    # checkpointed count: one "started" line, the original's (a restart would print its own and count from 0),
    # and no count ever goes back (a checkpointed value may print twice: once before, once after the restore).
    assert [ln for ln in log_b.splitlines() if ln.startswith("started ")] == started, log_b[:300]
    assert got[0] == 0 and all(b - a in (0, 1) for a, b in itertools.pairwise(got)), got
    assert before in got and got[-1] > after


def test_the_gpudefrag_image_from_the_containerfile_runs_on_a_real_node(kube_nodes: KubeNodes) -> None:
    lab = kube_nodes.lab
    ns = "image"
    lab.namespaces(ns)
    lab.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cli", "namespace": ns},
                "spec": {"nodeSelector": {"kubernetes.io/hostname": "real-b"}, "restartPolicy": "Never",
                         "automountServiceAccountToken": False,
                         "containers": [{"name": "main", "image": kube_nodes.push_gpudefrag_image(),
                                         "args": ["frag", "--help"]}]}})
    lab.wait("the gpudefrag pod to finish", lambda: lab.get("pods", "cli", ns=ns)["status"].get("phase")
             in ("Succeeded", "Failed"), timeout=300, state=lambda: lab.pod_states(ns))
    pod = lab.get("pods", "cli", ns=ns)
    log = kube_nodes.logs(ns, "cli")
    assert pod["status"]["phase"] == "Succeeded", log[-2000:]
    assert "Usage: gpudefrag frag" in log
