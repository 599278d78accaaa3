"""The mapping from API objects to the model: nodes, pods, quotas, autoscaler groups, DRA; file vs folder vs
the live reader's shape give the same ClusterState."""

from __future__ import annotations

import json
from pathlib import Path

from gpudefrag.core.model import TaintEffect, WorkloadState
from gpudefrag.engines.kubernetes import load_dump, to_cluster
from gpudefrag.engines.kubernetes.autoscaler import parse_status
from gpudefrag.engines.kubernetes.dump import objects_from_documents
from gpudefrag.snapshot import load_snapshot_dict, state_to_dict
from kubernetes import client as k

FIXTURES = Path(__file__).parent / "fixtures"
CAUSE_FIXTURES = sorted(p.stem for p in FIXTURES.glob("*.json"))


def fixture_path(name: str) -> Path:
    return FIXTURES / f"{name}.json"


def fixture_doc(name: str) -> dict:
    return json.loads(fixture_path(name).read_text())



def test_gfd_labels_and_capacity() -> None:
    s = load_dump(fixture_path("fragmentation")).state
    n = s.node("gpu-node-0")
    assert (n.gpu_count, n.usable_gpus, n.gpu_model) == (8, 8, "NVIDIA-H100-80GB-HBM3")
    assert (n.driver_version, n.cuda_version, n.cpu_arch) == ("550.54.15", "12.4", "amd64")
    assert n.kernel == "6.1.0-31-cloud-amd64"  # status.nodeInfo.kernelVersion: what the compatibility rule checks
    assert n.cpu_milli == 191450 and n.memory_mib == 2070000
    assert n.node_group == "gpu-h100"


def test_device_plugin_missing_node_advertises_nothing() -> None:
    n = load_dump(fixture_path("device-plugin-missing")).state.node("gpu-node-3")
    assert n.gpu_count == 8 and n.usable_gpus == 0


def test_mig_mixed_node() -> None:
    n = load_dump(fixture_path("mig-mixed")).state.node("gpu-node-2")
    assert (n.gpu_count, n.usable_gpus, dict(n.mig_devices)) == (8, 4, {"1g.10gb": 28})


def test_taints_and_cordon() -> None:
    s = load_dump(fixture_path("taint")).state
    assert s.node("gpu-node-2").taints[0].effect is TaintEffect.NO_SCHEDULE
    doc = fixture_doc("taint")
    doc["items"][0]["spec"]["unschedulable"] = True
    assert not to_cluster(objects_from_documents([("x", doc)], "x")).state.node("gpu-node-0").schedulable


def test_pods_requests_owner_and_reason(frag_cluster) -> None:  # type: ignore[no-untyped-def]
    s = frag_cluster.state
    w = s.workload("ml/web-embed-7d9c5b6f4-abcde")
    assert w.is_running and w.request.gpus_per_node == 2 and w.request.cpu_milli == 8000
    assert w.request.memory_mib == 64 * 1024 and w.checkpoint_bytes == 4_000_000_000
    assert w.versions.engine == "vllm 0.6.3" and w.versions.driver == "550.54.15"
    info = frag_cluster.pods[w.id]
    assert (info.owner.kind, info.owner.name) == ("ReplicaSet", "web-embed-7d9c5b6f4")
    p = s.workload("ml/train-8g")
    assert p.state is WorkloadState.PENDING and p.scheduler_reason.startswith("0/4 nodes are available")
    assert frag_cluster.pods[p.id].priority_class == "training-high" and p.priority == 1000
    # GPU indices are disjoint per node and within range
    used = [(pl.node, g) for x in s.running for pl in x.placements for g in pl.gpus]
    assert len(used) == len(set(used)) == 22


def test_gpu_model_affinity_becomes_allowed_models() -> None:
    w = load_dump(fixture_path("gpu-model-selector")).state.workload("ml/train-b200")
    assert w.request.gpu_models == ("NVIDIA-B200",)
    assert "nvidia.com/gpu.product" not in w.request.node_selector


def test_quota_and_refused_job() -> None:
    c = load_dump(fixture_path("quota"))
    q = c.state.quotas[0]
    assert (q.namespace, q.gpu_limit, q.gpu_used) == ("team-a", 8, 8)
    w = c.state.workload("team-a/job/train-big")
    assert w.request.gpus_per_node == 4 and c.pods[w.id].synthetic


def test_autoscaler_groups_joined_with_nodes() -> None:
    g = load_dump(fixture_path("autoscaler-at-max")).state.node_groups[0]
    assert (g.name, g.current, g.maximum, g.gpu_model, g.gpus_per_node) == (
        "eks-gpu-h100-20260301", 4, 4, "NVIDIA-H100-80GB-HBM3", 8)


def test_autoscaler_legacy_text() -> None:
    text = """Cluster-autoscaler status at 2026-03-01 09:59:50 +0000 UTC:
Cluster-wide:
  Health:      Healthy (ready=4 unready=0 notStarted=0 longNotStarted=0 registered=4 longUnregistered=0)
  ScaleUp:     NoActivity (ready=4 registered=4)
NodeGroups:
  Name:        gpu-pool
  Health:      Healthy (ready=4 unready=0 (resourceUnready=0) notStarted=0 longNotStarted=0 registered=4 longUnregistered=0 cloudProviderTarget=4 (minSize=1, maxSize=4))
  ScaleUp:     NoActivity (ready=4 cloudProviderTarget=4)
  Name:        cpu-pool
  Health:      Healthy (ready=2 unready=0 notStarted=0 longNotStarted=0 registered=2 longUnregistered=0 cloudProviderTarget=2 (minSize=0, maxSize=10))
"""  # noqa: E501
    groups = parse_status(text)
    assert groups is not None
    assert [(g.name, g.current, g.minimum, g.maximum) for g in groups] == [("gpu-pool", 4, 1, 4),
                                                                          ("cpu-pool", 2, 0, 10)]
    assert groups[0].scale_up == "NoActivity"
    assert parse_status("something else entirely") is None


def test_folder_equals_file(tmp_path: Path) -> None:
    doc = fixture_doc("fragmentation")
    by_kind: dict[str, list[dict]] = {}
    for it in doc["items"]:
        by_kind.setdefault(it["kind"], []).append(it)
    for kind, items in by_kind.items():
        (tmp_path / f"{kind.lower()}s.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                                                                      "items": items}))
    a = state_to_dict(load_dump(fixture_path("fragmentation")).state)
    b = state_to_dict(load_dump(tmp_path).state)
    a.pop("name"), b.pop("name")
    assert a == b


def test_live_shape_equals_dump() -> None:
    """What the live reader builds (typed lists from the client's models, items without `kind`) converts to the
    same state as the kubectl dump."""
    api = k.ApiClient()
    doc = fixture_doc("fragmentation")
    docs = []
    for kind, model in (("Node", "V1Node"), ("Pod", "V1Pod"), ("PodDisruptionBudget", "V1PodDisruptionBudget"),
                        ("ResourceQuota", "V1ResourceQuota"), ("Event", "CoreV1Event")):
        items = []
        for it in (i for i in doc["items"] if i["kind"] == kind):
            obj = api._ApiClient__deserialize(it, model)  # the client's own decoder, as a list call uses
            d = api.sanitize_for_serialization(obj)
            d.pop("kind", None)
            items.append(d)
        docs.append((kind, {"apiVersion": "v1", "kind": f"{kind}List", "items": items}))
    live = to_cluster(objects_from_documents(docs, "live"))
    a, b = state_to_dict(load_dump(fixture_path("fragmentation")).state), state_to_dict(live.state)
    a.pop("name"), b.pop("name")
    assert a == b


def test_state_round_trips_through_a_snapshot(frag_cluster) -> None:  # type: ignore[no-untyped-def]
    d = state_to_dict(frag_cluster.state)
    assert state_to_dict(load_snapshot_dict(d)) == d


def test_dra_slices_and_claims() -> None:
    doc = fixture_doc("oversize")
    node = doc["items"][0]
    for key in ("capacity", "allocatable"):
        node["status"][key].pop("nvidia.com/gpu")
    node["metadata"]["labels"].pop("nvidia.com/gpu.count")
    doc["items"].append({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "gpu-node-0-gpu.nvidia.com-x"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "gpu-node-0", "pool": {"name": "gpu-node-0",
                 "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"},
                              "productName": {"string": "NVIDIA H100 80GB HBM3"}}} for i in range(4)]}})
    doc["items"].append({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "train-claim", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                      "count": 2}}]}}})
    pending = next(i for i in doc["items"] if i["kind"] == "Pod" and i["metadata"]["name"] == "train-16g")
    pending["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "train-claim"}]
    s = to_cluster(objects_from_documents([("x", doc)], "x"), strict=False).state
    assert s.node("gpu-node-0").gpu_count == 4
    assert s.workload("ml/train-16g").request.gpus_per_node == 16 + 2


def test_pods_gpudefrag_cannot_move_are_labelled(frag_cluster) -> None:  # type: ignore[no-untyped-def]
    s = frag_cluster.state
    flags = {w.id: w.labels.get("gpudefrag.io/movable") for w in s.running}
    assert flags["ml/finetune-0"] == "false" and flags["ml/train-small-q8x2z"] == "false"  # StatefulSet, Job
    assert flags["ml/notebook-ana"] is None and flags["ml/web-embed-7d9c5b6f4-abcde"] is None  # bare, ReplicaSet
    # the pod's own labels (used for the replacement) are untouched
    assert "gpudefrag.io/movable" not in frag_cluster.pods["ml/finetune-0"].labels


def test_mig_single_strategy_is_seen_as_the_scheduler_sees_it() -> None:
    """With GFD's 'single' MIG strategy every slice is advertised as one `nvidia.com/gpu` and the product label
    names the profile: gpudefrag counts what the scheduler counts, and only same-profile nodes are compatible."""
    doc = fixture_doc("oversize")
    node = doc["items"][0]
    for key in ("capacity", "allocatable"):
        node["status"][key]["nvidia.com/gpu"] = "56"
    node["metadata"]["labels"].update({"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.count": "56",
                                       "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"})
    n = to_cluster(objects_from_documents([("x", doc)], "x")).state.node("gpu-node-0")
    assert (n.gpu_count, n.usable_gpus, n.gpu_model) == (56, 56, "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb")


def test_unmodelled_affinity_is_reported() -> None:
    doc = fixture_doc("oversize")
    pod = next(i for i in doc["items"] if i["kind"] == "Pod" and i["metadata"]["name"] == "train-16g")
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}]}}}
    c = to_cluster(objects_from_documents([("x", doc)], "x"))
    assert any("ml/train-16g" in w and "does not model" in w for w in c.warnings)
    assert not load_dump(fixture_path("oversize")).warnings
