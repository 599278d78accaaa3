"""Each recorded-shape dump is diagnosed with the cause it was built for, and the scheduler's message agrees."""

from __future__ import annotations

import json
from pathlib import Path

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
    w2 = dataclasses.replace(w, scheduler_reason="0/4 nodes are available: 4 node(s) had untolerated taint {a: b}.")
    c2 = dataclasses.replace(c, state=c.state.with_workloads([w2 if x.id == w.id else x for x in c.state.workloads]))
    assert diagnose_kube(c2)[0].agreement == "differs"
