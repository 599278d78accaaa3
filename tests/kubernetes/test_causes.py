"""Each recorded-shape dump is diagnosed with the cause it was built for, and the scheduler's message agrees."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from gpudefrag.core.diagnose import CauseCode
from gpudefrag.engines.kubernetes import diagnose_kube, load_dump

EXPECTED = {
    "device-plugin-missing": ("ml/train-8g", CauseCode.DEVICE_PLUGIN_MISSING),
    "quota": ("team-a/job/train-big", CauseCode.QUOTA_EXCEEDED),
    "taint": ("ml/train-8g", CauseCode.TAINTS_OR_SELECTORS),
    "oversize": ("ml/train-16g", CauseCode.REQUEST_TOO_LARGE),
    "gpu-model-selector": ("ml/train-b200", CauseCode.NO_SUCH_GPU_MODEL),
    "mig-mixed": ("ml/train-8g", CauseCode.MIG_MIXED),
    "autoscaler-at-max": ("ml/train-8g", CauseCode.AUTOSCALER_AT_MAX),
    "fragmentation": ("ml/train-8g", CauseCode.FRAGMENTATION),
}

FIXTURES = Path(__file__).parent / "fixtures"
CAUSE_FIXTURES = sorted(p.stem for p in FIXTURES.glob("*.json"))


def fixture_path(name: str) -> Path:
    return FIXTURES / f"{name}.json"


def fixture_doc(name: str) -> dict:
    return json.loads(fixture_path(name).read_text())



def test_every_fixture_has_an_expectation() -> None:
    assert set(CAUSE_FIXTURES) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_pending_cause_is_diagnosed(name: str) -> None:
    wid, code = EXPECTED[name]
    diags = diagnose_kube(load_dump(fixture_path(name)))
    assert [d.diagnosis.workload_id for d in diags] == [wid]
    d = diags[0]
    assert d.diagnosis.primary.code is code
    assert d.agreement == "agrees", d.as_dict()
    # fragmentation is only reported when nothing ordinary stands in the way, and only then
    assert d.diagnosis.is_fragmentation == (code is CauseCode.FRAGMENTATION)


def test_scheduler_reasons_are_split_with_their_node_counts() -> None:
    d = diagnose_kube(load_dump(fixture_path("taint")))[0]
    assert d.nodes_total == 4
    assert [(r.nodes, r.text) for r in d.reasons] == [
        (2, "Insufficient nvidia.com/gpu"), (2, "node(s) had untolerated taint(s)")]
    assert CauseCode.TAINTS_OR_SELECTORS in d.reasons[1].supports
    assert d.message_source == "PodScheduled"


def test_autoscaler_event_is_evidence() -> None:
    d = diagnose_kube(load_dump(fixture_path("autoscaler-at-max")))[0]
    assert [r.text for r in d.autoscaler] == ["max node group size reached"]
    assert "autoscaler-at-max" in d.confirmed()
    doc = d.as_dict()["kubernetes"]
    assert doc["agreement"] == "agrees"  # type: ignore[index]


def test_disagreement_is_reported() -> None:
    """A scheduler message that supports none of the computed causes is flagged, not hidden."""
    import dataclasses

    c = load_dump(fixture_path("oversize"))
    w = c.state.workload("ml/train-16g")
    w2 = msgspec.structs.replace(w, scheduler_reason="0/4 nodes are available: 4 node(s) had untolerated taint {a: b}.")
    c2 = dataclasses.replace(c, state=c.state.with_workloads([w2 if x.id == w.id else x for x in c.state.workloads]))
    assert diagnose_kube(c2)[0].agreement == "differs"


def _cpu_held_dump(tmp_path: Path, owner_kind: str) -> Path:
    """Two of the fragmentation fixture's nodes: gpu-node-0 with its 8 GPUs free but 186 of its 191.45 cores held
    by a CPU-only pod (owned by `owner_kind`), gpu-node-1 full with a StatefulSet's 8-GPU pod (never moved); the
    pending train-8g (8 GPUs, 8 cores) and the scheduler's message for it."""
    import copy

    doc = fixture_doc("fragmentation")
    nodes = [i for i in doc["items"] if i["kind"] == "Node"][:2]
    pods = {i["metadata"]["name"]: i for i in doc["items"] if i["kind"] == "Pod"}

    def running(name: str, node: str, kind: str, requests: dict[str, str]) -> dict:
        p = copy.deepcopy(pods["web-embed-7d9c5b6f4-abcde"])
        p["metadata"].update(name=name, uid=f"uid-{name}")
        p["metadata"]["ownerReferences"][0].update(kind=kind, name=f"{name}-owner")
        p["spec"]["nodeName"] = node
        p["spec"]["containers"][0]["resources"] = {"requests": requests, "limits": {
            k: v for k, v in requests.items() if k == "nvidia.com/gpu"}}
        return p

    pending = copy.deepcopy(pods["train-8g"])
    pending["status"]["conditions"][0]["message"] = (
        "0/2 nodes are available: 1 Insufficient cpu, 1 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are "
        "available: 2 No preemption victims found for incoming pod.")
    doc["items"] = [*nodes, running("cache-a", "gpu-node-0", owner_kind, {"cpu": "186", "memory": "64Gi"}),
                    running("train-full-0", "gpu-node-1", "StatefulSet",
                            {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "8"}),
                    pending]
    path = tmp_path / f"cpu-held-{owner_kind}.json"
    path.write_text(json.dumps(doc))
    return path


def test_cpu_a_movable_pod_holds_where_the_gpus_are_free_is_fragmentation(tmp_path: Path) -> None:
    """The CPU-only pod of a ReplicaSet (which moves.py can replace) holds the CPU of the node with the free GPUs:
    moving it makes room, so the cause is fragmentation-cpu-memory, and the scheduler's 'Insufficient cpu' agrees
    with it; a DaemonSet's pod (never moved) leaves cpu-or-memory, an ordinary cause, also agreeing."""
    (d,) = diagnose_kube(load_dump(_cpu_held_dump(tmp_path, "ReplicaSet")))
    assert d.diagnosis.codes == (CauseCode.FRAGMENTATION_CPU_MEMORY,) and d.diagnosis.is_fragmentation
    assert d.diagnosis.primary.evidence["clearable_nodes"] == ["gpu-node-0"]
    assert d.agreement == "agrees", d.as_dict()
    (d,) = diagnose_kube(load_dump(_cpu_held_dump(tmp_path, "DaemonSet")))
    assert d.diagnosis.codes == (CauseCode.CPU_OR_MEMORY,) and not d.diagnosis.is_fragmentation
    assert "even if every job the planner may move left it" in d.diagnosis.primary.summary
    assert d.agreement == "agrees", d.as_dict()
