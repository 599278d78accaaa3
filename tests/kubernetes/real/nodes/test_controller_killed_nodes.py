"""The controller SIGKILLed at each step of a move with state between the real nodes, and started again.

A real `gpudefrag controller --engine kubernetes --once` (a process on the host, the admin's kubeconfig) plans
the move that frees real-a for a pending 8-GPU pod — the counter, 2 GPUs, to real-b — and its journal's crash
hook (GPUDEFRAG_CRASH_AT, control/executor.py) kills it right after one step is durable: the agent asked, the
image answered, the replacement created, the replacement Ready (before the eviction), the original evicted. The
pending pod is then withdrawn (the restarted controller has nothing new to plan: what is left is its own
recovery) and the controller started again. Each ends with the counter running exactly once — the original,
never restarted, or the replacement counting on from the checkpoint — the journal's terminal state saying
which and why, and nothing left behind: no other copy, no request or answer annotation, no archive on real-a."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpudefrag.checkpoint.keys import load_key
from gpudefrag.control.journal import Journal
from gpudefrag.engines.kubernetes.moves import ANN_AGENT_REQUEST, ANN_AGENT_RESULT, ANN_MOVE_ID

from ..lab import REPO, ready
from .lab import (
    COUNTER,
    KubeNodes,
    agent_rbac,
    archives,
    counter_pod,
    counts,
    ensure_namespace,
    only_the_original_runs,
    start_agent,
)

pytestmark = pytest.mark.kube

NS = "killed"
POLICY = f"""\
name: killed-at-a-step
trigger:
  pending: {{longer_than_s: 0, min_gpus: 2}}
  on_request: false  # `--once` is no request to plan: the restart only recovers
filter:
  accounts: [{NS}]
  max_gpus: 4
action: {{kind: migrate, fallback: rollback}}
budgets: {{max_concurrent: 1, max_per_node: 1, max_moves_per_plan: 2, max_per_hour: 100}}
"""
ASKED = "checkpointing:wait-agent-checkpoint"
# the step the controller is killed after (GPUDEFRAG_CRASH_AT) -> how its restart ends the move
POINTS = {
    ASKED: "rolled-back",  # the agent asked (it may still be checkpointing)
    "checkpointing:verify-checkpoint-image": "rolled-back",  # the image pushed and answered, not yet checked
    "restoring:wait-ready": "rolled-back",  # the replacement created on real-b, restoring
    "running-on-target:evict-original": "done",  # the replacement Ready; the point of no return not yet passed
    "running-on-target:wait-deleted": "done",  # the original evicted
}


def _kwok_node(name: str) -> dict[str, Any]:
    res = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
        "labels": {"kubernetes.io/hostname": name, "type": "kwok", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                   "nvidia.com/gpu.count": "8"}},
            "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]},
            "status": {"capacity": res, "allocatable": dict(res)}}


@pytest.fixture(scope="module")
def layout(kube_nodes: KubeNodes) -> Iterator[None]:
    """For the module: the KWOK node full and 6 of real-b's 8 GPUs taken, by pods in `default` (outside the
    policy, and left alone by the package's cleanup between tests): an 8-GPU pod fits nowhere until the counter
    (2 GPUs on real-a) moves to real-b."""
    lab = kube_nodes.lab
    image = kube_nodes.image(COUNTER)
    lab.kubectl("apply", "-f", "-", input=json.dumps(_kwok_node("kwok-0")))
    fill_kwok = counter_pod("kill-kwok-filler", "kwok-0", 8, image)
    fill_kwok["spec"]["tolerations"] = [{"operator": "Exists"}]
    fill_b = counter_pod("kill-b-filler", "real-b", 6, image)
    for p in (fill_kwok, fill_b):
        p["metadata"]["namespace"] = "default"
        p["spec"]["nodeName"] = p["spec"].pop("nodeSelector")["kubernetes.io/hostname"]
        lab.create(p)
    lab.wait("the fillers Running", lambda: all(ready(lab.get("pods", n, ns="default"))
                                                for n in ("kill-kwok-filler", "kill-b-filler")), timeout=120,
             state=lambda: lab.pod_states("default"))
    try:
        yield
    finally:
        lab.kubectl("-n", "default", "delete", "pod", "kill-kwok-filler", "kill-b-filler", "--grace-period=0",
                    "--timeout=120s", check=False, timeout=180)
        lab.kubectl("delete", "node", "kwok-0", "--ignore-not-found", check=False)


def controller(kube_nodes: KubeNodes, tmp: Path, key: Path,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    # an abort says where (Python's stacks on stderr; glibc's own message there, not on a terminal)
    e = {**kube_nodes.lab.env, "PYTHONPATH": str(REPO / "src"), "PYTHONFAULTHANDLER": "1", "LIBC_FATAL_STDERR_": "1",
         **(env or {})}
    return subprocess.run([sys.executable, "-m", "gpudefrag.cli.main", "controller", "--policy", str(policy),
                           "--engine", "kubernetes", "--once", "--interval", "0.5", "--journal",
                           str(tmp / "journal.db"), "--registry", f"http://{kube_nodes.registry}", "--key", str(key)],
                          env=e, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("point", list(POINTS))
def test_the_controller_killed_at_a_step_and_started_again(kube_nodes: KubeNodes, layout: None, tmp_path: Path,
                                                           point: str) -> None:
    lab = kube_nodes.lab
    ensure_namespace(lab, NS)
    agent_rbac(kube_nodes)
    key = tmp_path / "ckpt.key"
    load_key(key, create=True)
    pod = counter_pod("ctr", "real-a", 2, kube_nodes.image(COUNTER))
    pod["metadata"]["namespace"] = NS
    pod["spec"]["nodeName"] = pod["spec"].pop("nodeSelector")["kubernetes.io/hostname"]
    lab.create(pod)
    lab.wait("ctr counting on real-a", lambda: ready(lab.get("pods", "ctr", ns=NS))
             and len(counts(kube_nodes.logs(NS, "ctr"))) > 3, timeout=120, state=lambda: lab.pod_states(NS))
    uid = lab.get("pods", "ctr", ns=NS)["metadata"]["uid"]
    agent = start_agent(kube_nodes, "real-a", key, tmp_path)
    agent_log = tmp_path / "agent-real-a.log"
    paused = point == ASKED
    try:
        if paused:
            # the agent, watching, paused: the request reaches it only after the restarted controller withdrew
            # it — an agent slower than the recovery, every time (it answers in half a second otherwise)
            lab.wait("the agent watching", lambda: agent_log.exists() and "node-agent on real-a" in
                     agent_log.read_text(), timeout=60)
            time.sleep(3)  # its first sweep done and its watch open
            agent.send_signal(signal.SIGSTOP)
        big = counter_pod("train-8g", "real-a", 8, kube_nodes.image(COUNTER))
        big["metadata"]["namespace"] = NS
        big["spec"].pop("nodeSelector")
        lab.create(big)
        before = counts(kube_nodes.logs(NS, "ctr"))[-1]
        p = controller(kube_nodes, tmp_path, key, {"GPUDEFRAG_CRASH_AT": point})
        assert p.returncode == -9, f"not killed at {point}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        with Journal(tmp_path / "journal.db", readonly=True) as j:
            (m,) = j.all()
        assert m.workload_id == f"{NS}/ctr" and not m.terminal, m
        seq = m.data["sequence"]
        # nothing more to plan for the restarted controller: only its recovery is left
        lab.kubectl("-n", NS, "delete", "pod", "train-8g", "--grace-period=0", "--timeout=60s", timeout=120)
        again = controller(kube_nodes, tmp_path, key)
        assert again.returncode == 0, f"{again.stdout[-3000:]}\n{again.stderr[-3000:]}"
        if paused:
            agent.send_signal(signal.SIGCONT)
            paused = False
            # it takes the request it was sent (checkpoint, image, push) and answers too late: dropped, not
            # written on the original
            lab.wait("the agent's late answer", lambda: f"{seq['move_id']}:therequestwaswithdrawnmeanwhile" in
                     "".join(agent_log.read_text().split()), timeout=120)
            assert "answerdropped" in "".join(agent_log.read_text().split())
    finally:
        if paused:
            agent.send_signal(signal.SIGCONT)
        agent.terminate()
        agent.wait(timeout=30)
    with Journal(tmp_path / "journal.db", readonly=True) as j:
        got = j.all()
        assert len(got) == 1, (got, again.stdout[-4000:])
        m = got[0]
        steps = [s["detail"] for s in j.steps(m.id)]
    assert m.state.value == POINTS[point], (m, steps)
    repl = seq["replacement"]
    if POINTS[point] == "rolled-back":
        assert m.reason == "controller restarted mid-move" and steps[-2:] == [
            "recovery: before the point of no return", "recovered: replacement deleted, original kept"], steps
        lab.wait(f"{repl} gone", lambda: lab.kubectl("-n", NS, "get", "pod", repl, check=False).returncode != 0,
                 timeout=120, state=lambda: lab.pod_states(NS))
        only_the_original_runs(kube_nodes, NS, "ctr", repl)
        assert lab.get("pods", "ctr", ns=NS)["metadata"]["uid"] == uid
    else:
        assert steps[-2:] == ["recovery: finishing the move", "recovered: finished"], steps
        assert lab.kubectl("-n", NS, "get", "pod", "ctr", check=False).returncode != 0  # the original gone
        pods = [p for p in lab.pods(NS) if not p["metadata"].get("deletionTimestamp")]
        assert [p["metadata"]["name"] for p in pods] == [repl], lab.pod_states(NS)
        r = pods[0]
        assert r["spec"]["nodeName"] == "real-b" and ready(r)
        ann = r["metadata"].get("annotations") or {}
        assert ann.get(ANN_MOVE_ID) == seq["move_id"] and ANN_AGENT_REQUEST not in ann and ANN_AGENT_RESULT not in ann
        lab.wait(f"{repl} counting on", lambda: counts(kube_nodes.logs(NS, repl))[-1] > before + 3, timeout=60)
        log_b = kube_nodes.logs(NS, repl)
        got = counts(log_b)
        # the state carried over: the original's "started" line only (a restart prints its own and counts from
        # 0 again), the count seen before the kill among them, never going back
        assert len([ln for ln in log_b.splitlines() if ln.startswith("started ")]) == 1, log_b[:300]
        assert before in got and all(b - a in (0, 1) for a, b in itertools.pairwise(got)), got
    assert archives(kube_nodes, NS, "ctr") == []
