"""The live model (incremental.py) against a conversion from scratch: after any sequence of watch events of every
kind, and any relist, a cycle gives what `to_cluster` gives for the same objects — converting only what changed.
The real API server version of this property is tests/kubernetes/real/test_incremental_real.py (churn.py
there holds what both generate and compare)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudefrag.engines.kubernetes.incremental import LiveModel
from gpudefrag.engines.kubernetes.live import Caller, Source, assemble
from gpudefrag.errors import InputError

from .real.churn import FEEDS, NODES, change, comparable, node, pod

NOW = 1_780_000_100.0


def scratch(model: LiveModel) -> Any:
    """What `read_live` converts: every feed listed (in key order, as the server lists), converted from scratch
    by the same function (`assemble`: one `to_cluster`)."""
    lists = [(Source(f, model.kinds[f], lambda: None), [store[k] for k in sorted(store)])
             for f, store in model.raw.items()]
    return assemble(lists, Caller(model.where), NOW)


def outcome(fn: Any) -> Any:
    try:
        return comparable(fn())
    except InputError as e:
        return ("error", e.message)


def fresh() -> LiveModel:
    m = LiveModel("current context", FEEDS)
    for i, name in enumerate(NODES):
        m.apply("nodes", "ADDED", node(name, 8, i))
    return m


def loaded(mixed: bool = False) -> LiveModel:
    """A fresh model with 24 running pods, 8 on each node: 1 GPU each, or 1 and 2 in turn (`mixed`)."""
    m = fresh()
    for i in range(24):
        m.apply("pods", "ADDED", pod("ml", f"w{i}", 1 + (i % 2 if mixed else 0), NODES[i % 3], i, 0))
    return m


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(change(), min_size=1, max_size=8), min_size=1, max_size=10))
def test_every_cycle_equals_a_conversion_from_scratch(batches: list[list[tuple[str, str, dict[str, Any]]]]) -> None:
    m = fresh()
    for batch in batches:
        for feed, typ, obj in batch:
            m.apply(feed, typ, obj)
        assert outcome(lambda: m.cluster(NOW)) == outcome(lambda: scratch(m))


@settings(max_examples=60, deadline=None)
@given(st.lists(change(), min_size=1, max_size=12), st.lists(change(), max_size=12))
def test_a_relist_applies_the_difference(before: list[Any], after: list[Any]) -> None:
    """A 410 Gone relists a kind: the model applies what differs from what it held, and still equals scratch."""
    m = fresh()
    for feed, typ, obj in before:
        m.apply(feed, typ, obj)
    outcome(lambda: m.cluster(NOW))
    other = fresh()
    for feed, typ, obj in before + after:
        other.apply(feed, typ, obj)
    for feed in m.raw:
        m.replace(feed, list(other.raw[feed].values()))
    assert outcome(lambda: m.cluster(NOW)) == outcome(lambda: scratch(other))


def test_a_cycle_converts_only_what_changed() -> None:
    m = loaded()
    m.cluster(NOW)
    before = m.conversions
    m.apply("pods", "ADDED", pod("ml", "late", 2, None, 50, 1))
    m.apply("pods", "DELETED", pod("ml", "w3", 1, NODES[0], 3, 0))
    got = m.cluster(NOW)
    # the new pending pod and the 7 pods left on w3's node: not that node (it did not change), not the other 2
    # nodes and their 16 pods
    assert m.conversions - before == 1 + 7
    assert "ml/late" in {w.id for w in got.state.pending} and "ml/w3" not in got.pods
    assert comparable(got) == comparable(scratch(m))


def rewrite_status(m: LiveModel, key: str, ready: bool | None) -> tuple[str, str, dict[str, Any]] | None:
    """What a kubelet does on its own: the same pod with another Ready condition and container status."""
    obj = m.raw["pods"].get(key)
    if obj is None:
        return None
    new = copy.deepcopy(obj)
    new["status"]["conditions"] = [c for c in new["status"].get("conditions", []) if c["type"] != "Ready"]
    if ready is not None:
        new["status"]["conditions"].append({"type": "Ready", "status": str(ready)})
        new["status"]["containerStatuses"] = [{"name": "main", "ready": ready, "restartCount": int(not ready)}]
    new["metadata"]["resourceVersion"] += "'"
    return "pods", "MODIFIED", new


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(change(), max_size=10),
       st.lists(st.one_of(st.tuples(st.just("pod"), st.integers(0, 23), st.sampled_from([None, True, False])),
                          st.tuples(st.just("node"), st.sampled_from(NODES), st.integers(0, 7)), change()),
                min_size=1, max_size=16))
def test_status_rewrites_and_node_flips_equal_a_conversion_from_scratch(before: list[Any], after: list[Any]) -> None:
    """Pods converted alone (their Ready condition rewritten) and nodes converted without their pods (readiness,
    taints, cordon), mixed with any other churn: still what a conversion from scratch gives."""
    m = loaded(mixed=True)
    for ch in before:
        m.apply(*ch)
    outcome(lambda: m.cluster(NOW))
    for ch in after:
        if ch[0] == "pod":
            ch = rewrite_status(m, f"ml/w{ch[1]}", ch[2])
        elif ch[0] == "node":
            ch = ("nodes", "MODIFIED", node(ch[1], 8, ch[2]))
        if ch is not None:
            m.apply(*ch)
        assert outcome(lambda: m.cluster(NOW)) == outcome(lambda: scratch(m))


def test_a_status_rewrite_or_a_readiness_flip_converts_one_object() -> None:
    m = loaded()
    m.cluster(NOW)
    before = m.conversions
    m.apply(*rewrite_status(m, "ml/w3", False))  # type: ignore[misc]
    got = m.cluster(NOW)
    assert m.conversions - before == 1 and not got.pods["ml/w3"].ready  # the pod alone, not its 7 neighbours
    before = m.conversions
    m.apply("nodes", "MODIFIED", node(NODES[0], 8, 6))  # NotReady: its pods read nothing that changed
    got = m.cluster(NOW)
    assert m.conversions - before == 1 and not got.state.node(NODES[0]).schedulable
    before = m.conversions
    m.apply("nodes", "MODIFIED", node(NODES[0], 8, 1))  # another GPU model: every pod on it takes the new one
    got = m.cluster(NOW)
    assert m.conversions - before == 1 + 8
    assert comparable(got) == comparable(scratch(m))


def test_a_change_that_can_alter_a_decision_wakes_the_controller() -> None:
    m = fresh()
    assert m.apply("pods", "ADDED", pod("ml", "a", 2, None, 1, 0))  # a new pending pod
    bound = pod("ml", "a", 2, NODES[0], 1, 0)
    assert m.apply("pods", "MODIFIED", bound)  # bound
    same = pod("ml", "a", 2, NODES[0], 1, 0)
    same["status"]["containerStatuses"] = [{"name": "main", "ready": True}]
    assert not m.apply("pods", "MODIFIED", same)  # a running pod's container status: nothing to decide
    m.cluster(NOW)
    beat = node(NODES[0], 8, 0)
    beat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:00:00Z"
    before = m.conversions
    assert not m.apply("nodes", "MODIFIED", beat)  # a heartbeat: nothing to decide, nothing to convert again
    got = m.cluster(NOW)
    assert m.conversions == before and got.raw_nodes[NODES[0]] is beat
    assert comparable(got) == comparable(scratch(m))
    assert m.apply("nodes", "MODIFIED", node(NODES[0], 8, 5))  # cordoned
    assert m.apply("pods", "DELETED", same)  # GPUs freed


def test_a_malformed_object_fails_the_cycle_until_it_is_fixed() -> None:
    m = fresh()
    bad = pod("ml", "bad", 1, NODES[0], 1, 0)
    bad["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "lots"
    m.apply("pods", "ADDED", bad)
    with pytest.raises(InputError) as e:
        m.cluster(NOW)
    assert "items[ml/bad].spec.containers[0].resources.requests" in str(e.value)
    with pytest.raises(InputError):  # still marked: not silently dropped
        m.cluster(NOW)
    m.apply("pods", "MODIFIED", pod("ml", "bad", 1, NODES[0], 1, 0))
    assert m.cluster(NOW).state.workload("ml/bad").is_running
