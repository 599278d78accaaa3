"""The first hour of issue 31 on the real control plane: what a platform engineer reads from `kube plan`, the
dashboard and `migrations`, and what `controller --once` does when the budget allows one move per node per cycle.

The cluster is test_move_real's (three 8-GPU nodes, 10 GPUs free but at most 4 on one node, an 8-GPU pod
pending; only gpu-node-1 can be emptied), plus what misled before: a fourth node that one running 8-GPU pod fills
(no move can clear it for an 8-GPU request: the pod could only go where the request could go itself), and a
pending pod that asks for no GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .lab import REPO, KubeLab, gpu_node, gpu_pod, ready
from .test_move_real import POLICY, by_app, fragmented

pytestmark = pytest.mark.kube


def full_node(kube: KubeLab) -> None:
    """gpu-node-3, filled by one running 8-GPU pod, and a pending pod that asks for no GPU."""
    kube.nodes(gpu_node("gpu-node-3"))
    kube.create(gpu_pod("big-8g", 8, node="gpu-node-3"),
                # CPU only, and no node carries its label: Pending, but not a GPU job
                gpu_pod("web-cpu", 0, selector={"pool": "cpu-only"}))
    kube.wait("big-8g Running and Ready", lambda: ready(by_app(kube, "big-8g")[0]))
    kube.scheduled_or_refused("ml", ["web-cpu"])
    assert kube.get("pod", "web-cpu", ns="ml")["status"]["phase"] == "Pending"


def gpudefrag(kube: KubeLab, tmp: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it: its own process, the lab's kubeconfig, a home of its own (so `migrations`
    finds only what a controller run in this home recorded), wide output."""
    env = {**kube.env, "PYTHONPATH": str(REPO / "src"), "HOME": str(tmp / "home"),
           "XDG_STATE_HOME": str(tmp / "home" / "state"), "GPUDEFRAG_STATE_DIR": str(tmp / "default-state"),
           "COLUMNS": "250", "NO_COLOR": "1"}
    env.pop("GPUDEFRAG_JOURNAL", None)
    return subprocess.run([sys.executable, "-m", "gpudefrag.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=tmp)


def test_plan_text_dashboard_and_a_plan_carried_across_cycles(kube: KubeLab, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    fragmented(kube, full_node)

    # kube plan (text, no --json): the pod it is for, the node it frees, the dry run's steps, and a recreate
    # move called a fresh start, never a restore from a checkpoint
    p = gpudefrag(kube, tmp_path, "kube", "plan", "--kube", "--job", "ml/train-8g", "--dry-run")
    assert p.returncode == 0, p.stdout + p.stderr
    text = " ".join(p.stdout.split())
    assert "plan for ml/train-8g (8 GPU): 2 move(s) free gpu-node-1" in text, text
    assert "dry run ml/notebook: ok" in text and "create-replacement ok" in text, text
    assert "started fresh" in text and "restor" not in text.lower(), text

    # diagnose: the 8-GPU node is not one that 'would fit it by moving 1 job'
    p = gpudefrag(kube, tmp_path, "kube", "diagnose", "--kube", "--json")
    assert p.returncode == 0, p.stderr
    diags = {d["workload"]: d for d in json.loads(p.stdout)["diagnoses"]}
    assert set(diags) == {"ml/train-8g"}, p.stdout[:4000]  # web-cpu asks for no GPU
    frag = diags["ml/train-8g"]["causes"][0]
    assert frag["code"] == "fragmentation", frag
    assert "gpu-node-3" not in frag["evidence"]["clearable_nodes"] and "gpu-node-3" not in frag["summary"], frag
    assert "gpu-node-1" in frag["evidence"]["clearable_nodes"], frag

    # the dashboard on the live cluster: one pending GPU job (not web-cpu), the same evidence
    from fastapi.testclient import TestClient

    from gpudefrag.web.app import create_app
    from gpudefrag.web.source import EngineSource, make_engine

    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    source = EngineSource(make_engine("kubernetes"), "kubernetes")
    try:
        web = TestClient(create_app(source))
        assert web.get("/api/summary").json()["pending"] == 1
        (job,) = web.get("/api/pending").json()
    finally:
        source.close()  # its watches end here, not with the test process
    assert job["id"] == "ml/train-8g", job
    cause = job["diagnosis"]["causes"][0]
    assert cause["code"] == "fragmentation" and "gpu-node-3" not in cause["summary"], cause

    # controller --once with max_per_node 1: both moves leave gpu-node-1, one per cycle; the plan started is
    # carried to its end, and the output says so
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.replace("max_per_node: 2", "max_per_node: 1"))
    journal = tmp_path / "elsewhere" / "journal.db"
    p = gpudefrag(kube, tmp_path, "controller", "--policy", str(policy), "--engine", "kubernetes", "--once",
                  "--interval", "0.5", "--journal", str(journal))
    assert p.returncode == 0, p.stdout + p.stderr
    out = " ".join(p.stdout.split())
    assert "finished: 2 of 2 move(s) made" in out, out
    train = kube.wait("train-8g bound and Ready", lambda: (x := kube.get("pod", "train-8g", ns="ml")) and ready(x)
                      and x)
    assert train["spec"]["nodeName"] == "gpu-node-1"

    # migrations without --journal: the journal this controller kept, elsewhere than the default
    p = gpudefrag(kube, tmp_path, "migrations", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["journal"] == str(journal), doc
    moved = sorted(m["workload_id"] for m in doc["migrations"])
    assert len(moved) == 2 and moved[0] == "ml/notebook" and moved[1].startswith("ml/web-embed-"), doc
    assert all(m["state"] == "done" for m in doc["migrations"]), doc
    # and the dashboard shows that history without being told where it is
    p = gpudefrag(kube, tmp_path, "serve", "--engine", "kubernetes", "--check", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["journal"] == str(journal)
    assert os.path.exists(journal)
