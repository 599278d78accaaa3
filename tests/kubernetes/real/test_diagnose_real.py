"""Diagnosis against the real scheduler and admission: each pending cause is built in a real control plane (KWOK
nodes, the real kube-scheduler, the real ResourceQuota admission), then `gpudefrag kube diagnose --kube` on the
live cluster and on a real `kubectl get ... -o json` dump of it must give the same causes, and the scheduler's
own message must agree with the computed primary cause."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpudefrag.core.diagnose import CauseCode as C

from .lab import KubeLab, gpu_node, gpu_pod, owner, quota

pytestmark = pytest.mark.kube

NODES4 = [f"gpu-node-{i}" for i in range(4)]
TAINT = {"key": "dedicated", "value": "inference", "effect": "NoSchedule"}


def busy(node: str, sizes: list[int], ns: str = "ml") -> list[dict[str, Any]]:
    """Running bare pods of the given GPU counts, bound to `node`."""
    return [gpu_pod(f"{node}-job-{i}", g, ns, node=node) for i, g in enumerate(sizes)]


def pending(lab: KubeLab, name: str, gpus: int, ns: str = "ml", **kw: Any) -> str:
    """Create a pod the scheduler cannot place and wait for its real PodScheduled=False message."""
    lab.create(gpu_pod(name, gpus, ns, **kw))
    lab.scheduled_or_refused(ns, [name])
    return f"{ns}/{name}"


def settle(lab: KubeLab, ns: str, pods: list[dict[str, Any]]) -> None:
    lab.create(*pods)
    lab.scheduled_or_refused(ns, [p["metadata"]["name"] for p in pods])


def device_plugin_missing(lab: KubeLab) -> tuple[str, C]:
    lab.nodes(*(gpu_node(n) for n in NODES4[:3]), gpu_node("gpu-node-3", plugin=False))
    lab.namespaces("ml")
    settle(lab, "ml", busy("gpu-node-0", [8]) + busy("gpu-node-1", [4, 4]) + busy("gpu-node-2", [8]))
    return pending(lab, "train-8g", 8), C.DEVICE_PLUGIN_MISSING


def taint(lab: KubeLab) -> tuple[str, C]:
    lab.nodes(*(gpu_node(n) for n in NODES4[:2]), *(gpu_node(n, taints=[TAINT]) for n in NODES4[2:]))
    lab.namespaces("ml")
    settle(lab, "ml", busy("gpu-node-0", [8]) + busy("gpu-node-1", [4, 2]))
    return pending(lab, "train-8g", 8), C.TAINTS_OR_SELECTORS


def cordoned(lab: KubeLab) -> tuple[str, C]:
    lab.nodes(*(gpu_node(n) for n in NODES4[:2]), *(gpu_node(n, unschedulable=True) for n in NODES4[2:]))
    lab.namespaces("ml")
    settle(lab, "ml", busy("gpu-node-0", [8]) + busy("gpu-node-1", [4, 2]))
    return pending(lab, "train-8g", 8), C.NODES_UNSCHEDULABLE


def oversize(lab: KubeLab) -> tuple[str, C]:
    lab.nodes(*(gpu_node(n) for n in NODES4))
    lab.namespaces("ml")
    settle(lab, "ml", busy("gpu-node-0", [2]))
    return pending(lab, "train-16g", 16), C.REQUEST_TOO_LARGE


def gpu_model_selector(lab: KubeLab) -> tuple[str, C]:
    lab.nodes(*(gpu_node(n) for n in NODES4))
    lab.namespaces("ml")
    settle(lab, "ml", busy("gpu-node-0", [4]))
    return pending(lab, "train-b200", 8, models=["NVIDIA-B200"]), C.NO_SUCH_GPU_MODEL


def mig_mixed(lab: KubeLab) -> tuple[str, C]:
    mig = {"1g.10gb": 28}
    lab.nodes(*(gpu_node(n) for n in NODES4[:2]), *(gpu_node(n, mig=mig, full_gpus=4) for n in NODES4[2:]))
    lab.namespaces("ml")
    settle(lab, "ml", busy("gpu-node-0", [8]) + busy("gpu-node-1", [8])
           + [gpu_pod("infer-mig-0", 0, "ml", node="gpu-node-2", mig="1g.10gb")])
    return pending(lab, "train-8g", 8), C.MIG_MIXED


def fragmentation(lab: KubeLab) -> tuple[str, C]:
    """10 GPUs free, at most 3 on any node."""
    lab.nodes(*(gpu_node(n) for n in NODES4))
    lab.namespaces("ml")
    settle(lab, "ml", busy("gpu-node-0", [2, 4]) + busy("gpu-node-1", [4, 1]) + busy("gpu-node-2", [6])
           + busy("gpu-node-3", [3, 2]))
    return pending(lab, "train-8g", 8), C.FRAGMENTATION


def quota_job(lab: KubeLab) -> tuple[str, C]:
    """The real ResourceQuota admission refuses the Job's pod: only the job controller's FailedCreate tells."""
    lab.nodes(*(gpu_node(n) for n in NODES4))
    lab.namespaces("team-a")
    lab.create(quota("team-a", 8))
    lab.wait("quota status", lambda: lab.get("resourcequota", "gpu-quota", ns="team-a")["status"].get("hard"))
    settle(lab, "team-a", busy("gpu-node-0", [8], ns="team-a"))
    lab.wait("quota used", lambda: lab.get("resourcequota", "gpu-quota", ns="team-a")["status"]
             .get("used", {}).get("requests.nvidia.com/gpu") == "8")
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train-big", "namespace": "team-a"},
           "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"app": "train-big"}},
                                                    "spec": {**gpu_pod("x", 4)["spec"], "restartPolicy": "Never"}}}}
    lab.create(job)
    lab.wait("the job controller's FailedCreate", lambda: lab.events("team-a", "FailedCreate"))
    return "team-a/job/train-big", C.QUOTA_EXCEEDED


def quota_replicaset(lab: KubeLab) -> tuple[str, C]:
    lab.nodes(*(gpu_node(n) for n in NODES4))
    lab.namespaces("team-b")
    lab.create(quota("team-b", 4))
    lab.wait("quota status", lambda: lab.get("resourcequota", "gpu-quota", ns="team-b")["status"].get("hard"))
    lab.create(owner("ReplicaSet", "serve", 4, "team-b", replicas=2))
    lab.wait("the replicaset controller's FailedCreate", lambda: lab.events("team-b", "FailedCreate"))
    return "team-b/replicaset/serve", C.QUOTA_EXCEEDED


SCENARIOS: dict[str, Callable[[KubeLab], tuple[str, C]]] = {
    "device-plugin-missing": device_plugin_missing, "taint": taint, "cordoned": cordoned, "oversize": oversize,
    "gpu-model-selector": gpu_model_selector, "mig-mixed": mig_mixed, "fragmentation": fragmentation,
    "quota-job": quota_job, "quota-replicaset": quota_replicaset,
}


def diagnoses(cli: Any, *args: str) -> dict[str, dict[str, Any]]:
    code, out, err = cli("kube", "diagnose", *args, "--json")
    assert code == 0, err
    return {d["workload"]: d for d in json.loads(out)["diagnoses"]}


def causes(d: dict[str, Any]) -> list[str]:
    return [c["code"] for c in d["causes"]]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_live_and_dump_agree_with_the_real_scheduler(kube: KubeLab, cli: Any, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    wid, code = SCENARIOS[name](kube)
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    live = diagnoses(cli, "--kube")
    dump = diagnoses(cli, str(kube.dump(tmp_path / "dump.json")))
    assert wid in live, sorted(live)
    d = live[wid]
    assert causes(d)[0] == code.value, d
    assert d["kubernetes"]["agreement"] == "agrees", d["kubernetes"]
    assert d["kubernetes"]["confirmed_by_scheduler"], d["kubernetes"]
    # the same cluster read two ways gives the same answer
    assert {w: causes(x) for w, x in dump.items()} == {w: causes(x) for w, x in live.items()}
    assert {w: x["kubernetes"]["agreement"] for w, x in dump.items()} == \
        {w: x["kubernetes"]["agreement"] for w, x in live.items()}


def test_scheduler_message_is_the_real_one(kube: KubeLab, cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reasons come from the real scheduler's PodScheduled condition, split with their node counts."""
    wid, _ = taint(kube)
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    k = diagnoses(cli, "--kube")[wid]["kubernetes"]
    assert k["message_source"] == "PodScheduled" and k["nodes_total"] == 4
    texts = {r["text"]: r["nodes"] for r in k["scheduler_reasons"]}
    # v1.35 no longer names the taint, and DRA's post-filter note ("no new claims to deallocate,") is not a reason
    assert texts == {"Insufficient nvidia.com/gpu": 2, "node(s) had untolerated taint(s)": 2}
    # and the event the scheduler wrote says the same
    ev = kube.events("ml", "FailedScheduling")
    assert ev and "untolerated taint(s)" in ev[-1]["message"]


def test_core_diagnose_reads_the_live_cluster(kube: KubeLab, cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    wid, code = fragmentation(kube)
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    rc, out, err = cli("diagnose", "--kube", "--json")
    assert rc == 0, err
    d = {x["workload"]: x for x in json.loads(out)["diagnoses"]}[wid]
    assert d["causes"][0]["code"] == code.value

