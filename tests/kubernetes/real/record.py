"""Quota situations recorded from the real control plane, not written by hand (issue 31).

A ResourceQuota's `status.used` is what the real quota controller says: every pod that exists, a pending one
included; a pod the quota admission refused does not exist, and only its owner's `FailedCreate` event tells. A
hand-written fixture once encoded the other meaning (`used` without the pending pod), and the diagnosis followed
it. So the quota fixture is the real `kubectl get ... -o json` of the situation built here, and
test_recorded_real.py checks that a fresh recording still says what the stored one says.

Regenerate (needs the control plane's cached binaries, `tools/kubecluster/build.sh`; one real cluster at a time):

    flock /tmp/gpudefrag-kube.lock python -m tests.kubernetes.real.record
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn

from .lab import DUMP_KINDS, REPO, KubeLab, gpu_node, gpu_pod, pod_spec, quota, start_lab, stop_lab

FIXTURES = REPO / "tests" / "kubernetes" / "fixtures"
SCENARIOS = REPO / "tests" / "scenarios"


def job(name: str, gpus: int, ns: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns},
            "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0,
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": pod_spec(gpus, restart="Never")}}}


def replicaset(name: str, gpus: int, ns: str) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": pod_spec(gpus)}}}


def used(lab: KubeLab, ns: str) -> str | None:
    return (lab.get("resourcequota", "gpu-quota", ns=ns)["status"].get("used") or {}).get("requests.nvidia.com/gpu")


def refused(lab: KubeLab, ns: str, name: str) -> bool:
    return any(e["involvedObject"]["name"] == name for e in lab.events(ns, "FailedCreate"))


def build_quota(lab: KubeLab) -> list[str]:
    """tests/kubernetes/fixtures/quota.json: team-a's quota of 8 GPUs is used by its running 8-GPU pod, so the
    job-controller cannot create train-big's 4-GPU pod; 22 GPUs stay free on the 4 nodes. Returns the
    namespaces the situation lives in."""
    lab.nodes(*(gpu_node(f"gpu-node-{i}") for i in range(4)))
    lab.namespaces("team-a", "ml")
    lab.create(quota("team-a", 8))
    lab.wait("the quota's status", lambda: lab.get("resourcequota", "gpu-quota", ns="team-a")["status"].get("hard"))
    lab.create(gpu_pod("gpu-node-0-job-0", 8, "team-a", node="gpu-node-0"),
               gpu_pod("gpu-node-1-job-0", 2, "ml", node="gpu-node-1"))
    lab.wait("the quota controller to charge the running pod", lambda: used(lab, "team-a") == "8")
    lab.create(job("train-big", 4, "team-a"))
    lab.wait("the job-controller's FailedCreate for train-big", lambda: refused(lab, "team-a", "train-big"))
    return ["team-a", "ml"]


def build_quota_blocked(lab: KubeLab) -> list[str]:
    """The quota part of tests/scenarios/quota-blocked.kube.json: a ReplicaSet of one 8-GPU pod in team-a under a
    4-GPU quota that nothing uses; the replicaset-controller's pod is refused at creation."""
    lab.nodes(*(gpu_node(f"gpu-node-{i}") for i in range(4)))
    lab.namespaces("team-a")
    lab.create(quota("team-a", 4))
    lab.wait("the quota's status", lambda: used(lab, "team-a") == "0")
    lab.create(replicaset("train-8g", 8, "team-a"))
    lab.wait("the replicaset-controller's FailedCreate", lambda: refused(lab, "team-a", "train-8g"))
    return ["team-a"]


def recording(lab: KubeLab, namespaces: list[str]) -> dict[str, Any]:
    """What `kubectl get nodes,pods,resourcequotas,poddisruptionbudgets,events,replicasets,jobs -A -o json`
    prints, kept to the nodes and the situation's namespaces (the lab's other namespaces hold nothing of it)."""
    doc = json.loads(lab.kubectl("get", DUMP_KINDS, "-A", "-o", "json").stdout)
    doc["items"] = [i for i in doc["items"]
                    if i["kind"] == "Node" or i["metadata"].get("namespace") in namespaces]
    return doc


_SUFFIX = re.compile(r'"([a-z0-9-]+?)-[a-z0-9]{5}"')


def gist(doc: dict[str, Any], namespaces: list[str] | None = None) -> dict[str, Any]:
    """What a quota situation says, without what differs between two recordings of it (uids, times, the random
    suffix of a refused pod's name, how often the controller retried): the quotas' hard and used, the pods and
    where they run, the owners and how many pods they have, and each refusal's reason, source and message."""
    items = [i for i in doc["items"] if namespaces is None or i["metadata"].get("namespace") in namespaces]
    out: dict[str, Any] = {"nodes": {}, "quotas": {}, "pods": {}, "owners": {}, "events": set()}
    for i in doc["items"]:
        if i["kind"] == "Node":
            out["nodes"][i["metadata"]["name"]] = (i["status"].get("allocatable") or {}).get("nvidia.com/gpu")
    for i in items:
        m, kind = i["metadata"], i["kind"]
        key = f"{m.get('namespace')}/{m['name']}"
        st = i.get("status") or {}
        if kind == "ResourceQuota":
            out["quotas"][key] = (i["spec"]["hard"], st.get("hard"), st.get("used"))
        elif kind == "Pod":
            res = [c["resources"].get("requests") for c in i["spec"]["containers"]]
            out["pods"][key] = (i["spec"].get("nodeName"), res, st.get("phase"))
        elif kind in ("ReplicaSet", "Job"):
            out["owners"][key] = (kind, st.get("replicas", st.get("active", 0)) or 0)
        elif kind == "Event" and i.get("type") == "Warning":
            io = i["involvedObject"]
            msg = _SUFFIX.sub(r'"\1-xxxxx"', i.get("message") or "")
            comp = (i.get("source") or {}).get("component") or i.get("reportingComponent")
            out["events"].add((io["kind"], io["name"], i["reason"], comp, msg))
    return out


SITUATIONS = {
    "quota": (build_quota, FIXTURES / "quota.json"),
}


def main() -> None:
    def cannot(part: str, why: str) -> NoReturn:
        sys.exit(why)

    with tempfile.TemporaryDirectory(prefix="gpudefrag-record-") as d:
        lab = start_lab(Path(d), cannot)
        try:
            for name, (build, path) in SITUATIONS.items():
                lab.reset()
                doc = recording(lab, build(lab))
                path.write_text(json.dumps(doc, indent=4, sort_keys=True) + "\n")
                print(f"recorded {name}: {path.relative_to(REPO)} ({len(doc['items'])} objects)")
        finally:
            stop_lab(lab)


if __name__ == "__main__":
    main()
