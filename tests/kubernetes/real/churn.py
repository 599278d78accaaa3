"""Random cluster churn for the live model's property tests: API objects of every kind the model follows (GPU
nodes with GFD labels, MIG and DRA; GPU, CPU, DRA, finished and misbound pods; scheduling events; quotas; PDBs;
the autoscaler status), and what makes two conversions comparable."""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

from hypothesis import strategies as st

from gpudefrag.engines.kubernetes.convert import KubeCluster, as_dict_info
from gpudefrag.snapshot import state_to_dict

T0 = 1_780_000_000
NODES = [f"gpu-{i}" for i in range(3)]
PODS = [f"p{i}" for i in range(6)]
NAMESPACES = ["ml", "team"]


def stamp(s: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(T0 + s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, gpus: int, variant: int) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, "nvidia.com/gpu.count": str(gpus),
              "nvidia.com/gpu.product": ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB")[variant % 2],
              "nvidia.com/cuda.driver.major": "550", "nvidia.com/cuda.driver.minor": str(54 + variant % 3),
              "gpudefrag.io/node-group": f"pool-{variant % 2}"}
    alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus - (2 if variant == 3 else 0))}
    if variant == 3:  # MIG-mixed: two GPUs split into slices
        alloc["nvidia.com/mig-1g.10gb"] = "14"
    spec: dict[str, Any] = {}
    if variant == 4:
        spec["taints"] = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
    if variant == 5:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "resourceVersion": str(variant), "labels": labels},
            "spec": spec,
            "status": {"capacity": alloc, "allocatable": alloc,
                       "conditions": [{"type": "Ready", "status": "False" if variant == 6 else "True"}]}}


def pod(ns: str, name: str, gpus: int, node_name: str | None, created: int, variant: int,
        ready: bool | None = None) -> dict[str, Any]:
    """`ready`: a bound pod's Ready condition (None: none yet) — what a kubelet rewrites on its own."""
    req: dict[str, str] = {"cpu": "1", "memory": "1Gi"}
    if gpus:
        req["nvidia.com/gpu"] = str(gpus)
    if variant == 3 and not gpus:
        req["nvidia.com/mig-1g.10gb"] = "1"
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"requests": req}}], "priority": variant}
    if node_name:
        spec["nodeName"] = node_name
    if variant == 4:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"claim-{name}"}]
    if variant == 5:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
    phase = "Succeeded" if variant == 6 else ("Running" if node_name else "Pending")
    status: dict[str, Any] = {"phase": phase}
    if not node_name and variant % 2:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                 "message": f"0/5 nodes are available: {variant} Insufficient nvidia.com/gpu."}]
    if node_name and ready is not None:
        status["conditions"] = [{"type": "Ready", "status": str(ready)}]
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"u-{ns}-{name}", "resourceVersion": str(variant),
                            "creationTimestamp": stamp(created), "labels": {"app": name}}
    if variant == 2:
        meta["ownerReferences"] = [{"kind": "ReplicaSet", "name": "rs", "uid": "rs", "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def event(ns: str, pod_name: str, reason: str, at: int, variant: int) -> dict[str, Any]:
    kind, name = ("Pod", pod_name) if reason != "FailedCreate" else ("Job", f"job-{pod_name}")
    msg = (f"pods \"{name}-x\" is forbidden: exceeded quota: gpu, requested: requests.nvidia.com/gpu={variant + 1}"
           if reason == "FailedCreate" else f"0/5 nodes are available: {variant} Insufficient nvidia.com/gpu.")
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{pod_name}.{reason}.{variant % 2}", "namespace": ns},
            "involvedObject": {"kind": kind, "name": name, "namespace": ns}, "reason": reason, "message": msg,
            "lastTimestamp": stamp(at), "source": {"component": "default-scheduler"}}


def other(kind: str, ns: str, variant: int) -> dict[str, Any]:
    if kind == "ResourceQuota":
        return {"apiVersion": "v1", "kind": kind, "metadata": {"name": "gpu", "namespace": ns},
                "spec": {"hard": {"requests.nvidia.com/gpu": str(4 * variant)}},
                "status": {"used": {"requests.nvidia.com/gpu": str(variant)}}}
    if kind == "PodDisruptionBudget":
        return {"apiVersion": "policy/v1", "kind": kind, "metadata": {"name": "pdb", "namespace": ns},
                "spec": {"selector": {"matchLabels": {"app": f"p{variant}"}}, "minAvailable": 1},
                "status": {"disruptionsAllowed": variant % 2, "currentHealthy": 1, "desiredHealthy": 1}}
    if kind == "ResourceSlice":
        devices = [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"},
                                                      "productName": {"string": "NVIDIA H200"}}}
                   for i in range(variant % 4)]
        return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": {"name": f"slice-{ns}"},
                "spec": {"driver": "gpu.nvidia.com", "nodeName": ns, "devices": devices}}
    if kind == "ResourceClaim":
        return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": {"name": ns, "namespace": "ml"},
                "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                          "count": variant % 3 + 1}}]}}}
    if kind == "Job":
        return {"apiVersion": "batch/v1", "kind": kind,
                "metadata": {"name": f"job-{ns}", "namespace": "ml", "uid": f"job-{ns}-{variant % 2}",
                             "creationTimestamp": stamp(variant)},
                "spec": {"parallelism": variant % 3, "completions": 2}, "status": {"active": variant % 2}}
    status = ("autoscalerStatus: Running\nnodeGroups:\n- name: pool-0\n  health:\n    status: Healthy\n"
              f"    cloudProviderTarget: {variant}\n    minSize: 0\n    maxSize: 8\n") if variant else "garbage"
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cluster-autoscaler-status", "namespace": "kube-system"}, "data": {"status": status}}


FEEDS = [("nodes", "Node"), ("pods", "Pod"), ("resourcequotas", "ResourceQuota"),
         ("poddisruptionbudgets", "PodDisruptionBudget"), ("events FailedScheduling", "Event"),
         ("events NotTriggerScaleUp", "Event"), ("events FailedCreate", "Event"), ("configmap", "ConfigMap"),
         ("resourceslices", "ResourceSlice"), ("resourceclaims", "ResourceClaim"), ("jobs", "Job")]


@st.composite
def change(draw: st.DrawFn) -> tuple[str, str, dict[str, Any]]:
    """(feed, ADDED/MODIFIED/DELETED, object): one watch event of some kind."""
    feed, kind = draw(st.sampled_from(FEEDS[1:2] * 8 + FEEDS[:1] * 2 + FEEDS[2:]))  # mostly pods
    variant = draw(st.integers(0, 7))
    typ = draw(st.sampled_from(["ADDED", "MODIFIED", "MODIFIED", "DELETED"]))
    if kind == "Node":
        obj = node(draw(st.sampled_from(NODES)), draw(st.sampled_from([4, 8])), variant)
        obj["status"]["conditions"][0]["lastHeartbeatTime"] = stamp(draw(st.integers(0, 3)))  # heartbeats too
    elif kind == "Pod":
        where = draw(st.one_of(st.none(), st.sampled_from([*NODES, "gone-node"])))
        obj = pod(draw(st.sampled_from(NAMESPACES)), draw(st.sampled_from(PODS)), draw(st.integers(0, 4)), where,
                  draw(st.integers(0, 3)), variant, draw(st.sampled_from([None, True, False])))
    elif kind == "Event":
        reason = feed.split()[1]
        obj = event(draw(st.sampled_from(NAMESPACES)), draw(st.sampled_from(PODS)), reason, draw(st.integers(0, 9)),
                    variant)
    elif kind in ("ResourceSlice",):
        obj = other(kind, draw(st.sampled_from(NODES)), variant)
    elif kind == "ResourceClaim":
        obj = other(kind, f"claim-{draw(st.sampled_from(PODS))}", variant)
    elif kind == "Job":  # the owner a FailedCreate event names (job-<pod>)
        obj = other(kind, draw(st.sampled_from(PODS)), variant)
    else:
        obj = other(kind, draw(st.sampled_from(NAMESPACES)), variant)
    # as the API server's: another resourceVersion whenever the object changed (a relist compares by it)
    obj["metadata"]["resourceVersion"] = str(zlib.crc32(json.dumps(obj, sort_keys=True).encode()))
    return feed, typ, obj


_LOCATION = re.compile(r"items\[[^\]]*\]")


def comparable(cluster: KubeCluster) -> dict[str, Any]:
    """Everything a cycle reads from a KubeCluster, in a form two conversions can be compared by; warnings name
    the object by its place in a list (a conversion from scratch) or by its key (the model), so not by that, and
    raw objects are compared without their apiVersion (a watch event's object has it, a list's item not)."""
    def raw(obj: Any) -> dict[str, Any]:  # a watch event's object names its apiVersion, a list's item does not
        return {k: v for k, v in obj.items() if k != "apiVersion"}

    d = state_to_dict(cluster.state)
    d.pop("name", None)
    return {
        "state": d,
        "order": [w.id for w in cluster.state.workloads],
        "pods": {k: (as_dict_info(v), v.uid, v.scheduler_source, v.autoscaler_message, v.synthetic, raw(v.raw))
                 for k, v in cluster.pods.items()},
        "pdbs": [p.as_dict() for p in cluster.pdbs],
        "events": list(cluster.events),
        "groups": list(cluster.groups),
        "warnings": [_LOCATION.sub("items[]", w) for w in cluster.warnings],
        "raw_nodes": {k: raw(v) for k, v in cluster.raw_nodes.items()},
        "raw_pdbs": [raw(p) for p in cluster.raw_pdbs],
    }
