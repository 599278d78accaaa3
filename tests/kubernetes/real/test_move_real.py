"""The move end to end against the real API: `gpudefrag controller --engine kubernetes --once` plans, creates
the pinned replacement, waits for the real scheduler to bind it and KWOK to make it Ready, hands it to the
Deployment's ReplicaSet or evicts the original through the Eviction API (the real PDB decides), and the pending
8-GPU pod is bound by the real scheduler. KWOK runs no processes, so the moved pods opt in to a move without
state (`gpudefrag.io/move: recreate`); the checkpoint step is covered by the CRIU tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpudefrag.engines.kubernetes import SimpleMove, build_move, load_kube

from .lab import REPO, KubeLab, gpu_node, gpu_pod, owner, pdb, ready

pytestmark = pytest.mark.kube

RECREATE = {"gpudefrag.io/move": "recreate"}
POLICY = """\
name: kube-test
trigger:
  pending: {longer_than_s: 0, min_gpus: 2}
  on_request: true
filter:
  accounts: [ml]
  exclude_labels: {gpudefrag.io/movable: "false"}
  max_gpus: 4
action: {kind: migrate, fallback: rollback}
budgets: {max_concurrent: 2, max_per_node: 2, max_moves_per_plan: 4, max_per_hour: 20}
"""


def by_app(lab: KubeLab, app: str, ns: str = "ml") -> list[dict[str, Any]]:
    return [p for p in lab.pods(ns) if (p["metadata"].get("labels") or {}).get("app") == app]


def fragmented(lab: KubeLab, before_pending: Callable[[KubeLab], None] | None = None) -> dict[str, str]:
    """Three 8-GPU nodes, 10 GPUs free but at most 4 on one node; an 8-GPU pod pending. Only gpu-node-1 can be
    emptied: a StatefulSet pod (never moved) sits on gpu-node-0 and a 6-GPU pod (over the policy) on gpu-node-2.
    `before_pending` adds to the cluster before the 8-GPU pod is created (a node added after it would be where
    the scheduler binds it). Returns the uid of every running pod by app."""
    lab.nodes(*(gpu_node(f"gpu-node-{i}") for i in range(3)))
    lab.namespaces("ml")
    lab.create(
        owner("StatefulSet", "finetune", 4, node="gpu-node-0"),
        owner("Deployment", "web-embed", 2, node="gpu-node-1", annotations=RECREATE),
        pdb("web-embed", "ml", {"app": "web-embed"}, min_available=1),
        gpu_pod("notebook", 2, node="gpu-node-1", annotations=RECREATE),
        owner("Deployment", "eval", 6, node="gpu-node-2", annotations=RECREATE),
    )
    apps = ["finetune", "web-embed", "notebook", "eval"]
    lab.wait("the workloads Running and Ready",
             lambda: all(len(by_app(lab, a)) == 1 and ready(by_app(lab, a)[0]) for a in apps),
             state=lambda: lab.pod_states("ml"))
    lab.wait("the PDB to count the healthy pod", lambda: lab.get("pdb", "web-embed", ns="ml")["status"]
             .get("currentHealthy") == 1)
    if before_pending is not None:
        before_pending(lab)
    lab.create(gpu_pod("train-8g", 8))
    lab.scheduled_or_refused("ml", ["train-8g"])
    return {a: by_app(lab, a)[0]["metadata"]["uid"] for a in apps}


def controller(lab: KubeLab, tmp: Path, *extra: str, env: dict[str, str] | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    e = {**lab.env, "PYTHONPATH": str(REPO / "src"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "gpudefrag.cli.main", "controller", "--policy", str(policy),
                           "--engine", "kubernetes", "--once", "--interval", "0.5", "--journal",
                           str(tmp / "journal.db"), *extra], env=e, capture_output=True, text=True, timeout=timeout)


def migrations(tmp: Path) -> list[dict[str, Any]]:
    p = subprocess.run([sys.executable, "-m", "gpudefrag.cli.main", "migrations", "--journal",
                        str(tmp / "journal.db"), "--json"], env={**os.environ, "PYTHONPATH": str(REPO / "src")},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["migrations"]


def test_controller_frees_a_node_and_the_real_scheduler_binds_the_pending_pod(kube: KubeLab, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    uids = fragmented(kube)
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    # the StatefulSet pod is refused before anything is touched
    seq = build_move(load_kube(live=True), SimpleMove("ml/finetune-0", "gpu-node-0", "gpu-node-2"))
    assert not seq.ok and "StatefulSet" in (seq.refused or "")

    p = controller(kube, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    done = migrations(tmp_path)
    names = sorted(m["workload_id"] for m in done)
    assert len(names) == 2 and names[0] == "ml/notebook" and names[1].startswith("ml/web-embed-"), done
    assert all(m["state"] == "done" for m in done), done

    # the 8-GPU pod is bound by the real scheduler to the node that was emptied, and KWOK runs it
    train = kube.wait("train-8g bound and Ready", lambda: (p := kube.get("pod", "train-8g", ns="ml")) and ready(p)
                      and p)
    assert train["spec"]["nodeName"] == "gpu-node-1"
    # the moved pods run elsewhere; their originals are gone
    for app in ("web-embed", "notebook"):
        pods = by_app(kube, app)
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        assert pods[0]["metadata"]["uid"] != uids[app] and "-mv-" in pods[0]["metadata"]["name"]
        assert pods[0]["spec"]["nodeName"] != "gpu-node-1" and ready(pods[0])
    # the Deployment's ReplicaSet adopted the replacement: it owns it, counts 1, and never made a pod of its own
    rs_pod = by_app(kube, "web-embed")[0]
    assert rs_pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    rs = kube.get("replicaset", rs_pod["metadata"]["ownerReferences"][0]["name"], ns="ml")
    assert rs["status"]["replicas"] == 1
    created = [e for e in kube.events("ml", "SuccessfulCreate") if e["involvedObject"]["kind"] == "ReplicaSet"
               and e["involvedObject"]["name"] == rs["metadata"]["name"]]
    assert len(created) == 1, [e["message"] for e in created]  # the original only
    # untouched: the StatefulSet pod and the 6-GPU pod
    assert by_app(kube, "finetune")[0]["metadata"]["uid"] == uids["finetune"]
    assert by_app(kube, "eval")[0]["metadata"]["uid"] == uids["eval"]
