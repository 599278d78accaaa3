"""A state built from a previous one (`ClusterState.build(previous=...)`, the live controller's every cycle)
carries over the columns, can-move flags and filter verdicts of the workloads it shares with it (the same
objects) — and must be exactly the state built from scratch: the same columns and rows, the same `may_move`
for filters asked before and not, the same verdict of validation (error and message included), whatever
changed between the two: workloads kept, replaced by equal or different ones, added, dropped, reordered, nodes
added, dropped, renamed or reordered."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudefrag.core.model import (
    CARRIED_FILTERS,
    ClusterState,
    ModelError,
    Node,
    Placement,
    Request,
    Workload,
    WorkloadState,
)


def _workload(draw, j: int, nodes: list[Node]) -> Workload:
    kind = draw(st.integers(0, 6))
    labels = {"team": draw(st.sampled_from(("a", "b")))}
    if draw(st.integers(0, 6)) == 0:
        labels["gpudefrag.io/movable"] = "false"
    if kind == 0 or not nodes:
        return Workload(f"w{j}", Request(draw(st.integers(0, 8))), state=WorkloadState.PENDING, labels=labels)
    on = draw(st.permutations(nodes))[: 2 if kind == 1 and len(nodes) > 1 else 1]
    milli = draw(st.sampled_from((250, 500, 1000)))
    k = 0 if kind == 2 else (1 if milli < 1000 else draw(st.integers(1, 3)))
    # any GPU indices, even ones out of range or shared past 1000 milli: validation must judge both states alike
    placements = tuple(Placement(nd.name, tuple(draw(st.lists(st.integers(0, 8), min_size=k, max_size=k,
                                                                unique=True))))
                       for nd in on)
    return Workload(f"w{j}", Request(k, len(on), milli if k else 1000, cpu_milli=draw(st.integers(0, 9)),
                                     memory_mib=draw(st.integers(0, 9))),
                    placements=placements, movable=draw(st.booleans()), labels=labels)


@st.composite
def pairs(draw) -> tuple[ClusterState, ClusterState]:
    nodes = [Node(f"n{i}", draw(st.sampled_from((0, 2, 8)))) for i in range(draw(st.integers(1, 4)))]
    first = [_workload(draw, j, nodes) for j in range(draw(st.integers(0, 12)))]
    # the next state's nodes: some renamed, dropped or added, reordered
    later = [nd if draw(st.integers(0, 4)) else Node(nd.name + "x", nd.gpu_count) for nd in nodes]
    later = [nd for nd in later if draw(st.integers(0, 6))] or later[:1]
    later += [Node(f"m{i}", draw(st.sampled_from((2, 8)))) for i in range(draw(st.integers(0, 2)))]
    later = draw(st.permutations(later))
    ws: list[Workload] = []
    for w in first:
        how = draw(st.integers(0, 5))
        if how <= 2:
            ws.append(w)  # the same object: carried
        elif how == 3:
            ws.append(Workload(w.id, w.request, w.state, labels=dict(w.labels), placements=w.placements,
                               movable=w.movable))  # equal, not the same object
        elif how == 4:
            ws.append(_workload(draw, int(w.id[1:]), later))  # the same id, changed
    ws += [_workload(draw, 100 + j, later) for j in range(draw(st.integers(0, 3)))]
    return ClusterState(tuple(nodes), tuple(first)), ClusterState(tuple(later), tuple(draw(st.permutations(ws))))


def team_a(w: Workload) -> bool:
    return w.labels.get("team") == "a"


def team_b(w: Workload) -> bool:
    return w.labels.get("team") == "b"


def _verdict(build) -> tuple[ClusterState | None, str]:
    try:
        return build(), ""
    except ModelError as e:
        return None, str(e)


@settings(max_examples=400, deadline=None)
@given(pairs(), st.booleans(), st.booleans())
def test_a_state_built_from_the_previous_one_is_the_state_built_from_scratch(
        pair: tuple[ClusterState, ClusterState], asked_before: bool, rows_before: bool) -> None:
    first, second = pair
    try:
        before = ClusterState.build(first.nodes, first.workloads)
    except ModelError:
        return  # only a validated state is carried from
    if asked_before:
        before.may_move(team_a)
    if rows_before:
        _ = before.running_rows
    kw = {"now": 5.0, "name": "later"}
    fresh, fresh_error = _verdict(lambda: ClusterState.build(second.nodes, second.workloads, **kw))
    derived, derived_error = _verdict(lambda: ClusterState.build(second.nodes, second.workloads, previous=before,
                                                                 **kw))
    assert derived_error == fresh_error
    if fresh is None or derived is None:
        return
    for name, a, b in zip(fresh._columns._fields, fresh._columns, derived._columns, strict=True):
        assert np.array_equal(a, b), name
    assert np.array_equal(fresh.running_rows, derived.running_rows)
    assert np.array_equal(fresh.used_milli, derived.used_milli)
    for flt in (team_a, team_b, None):
        assert np.array_equal(fresh.may_move(flt), derived.may_move(flt))
    # and on from a carried state that was asked nothing (its carried verdicts carried further)
    unasked = ClusterState.build(second.nodes, second.workloads, previous=before)
    third, _ = _verdict(lambda: ClusterState.build(second.nodes, second.workloads[1:], previous=unasked))
    if third is not None:
        again = ClusterState.build(second.nodes, second.workloads[1:])
        assert np.array_equal(third.may_move(team_a), again.may_move(team_a))
        assert np.array_equal(third.running_rows, again.running_rows)


def test_carried_verdicts_are_asked_only_of_new_workloads() -> None:
    """The point of carrying: a filter asked of 1,000 workloads is asked again only of the one that changed."""
    nodes = [Node("n0", 8)]
    ws = [Workload(f"w{i}", Request(0), placements=(Placement("n0", ()),)) for i in range(1000)]
    before = ClusterState.build(nodes, ws)
    asked: list[str] = []

    def movable(w: Workload) -> bool:
        asked.append(w.id)
        return True

    before.may_move(movable)
    assert len(asked) == 1000
    asked.clear()
    later = ClusterState.build(nodes, [*ws[:500], Workload("w500", Request(0), placements=(Placement("n0", ()),)),
                                       *ws[501:]], previous=before)
    assert later.may_move(movable).all()
    assert asked == ["w500"]


def test_a_state_that_was_never_validated_is_not_carried_from() -> None:
    """An unvalidated state may hold workloads no check has seen: nothing of it is trusted."""
    nodes = [Node("n0", 2)]
    bad = Workload("w", Request(1), placements=(Placement("n0", (7,)),))  # GPU 7 of a 2-GPU node
    unchecked = ClusterState(tuple(nodes), (bad,))
    _ = unchecked.running_rows
    with pytest.raises(ModelError, match="out of range"):
        ClusterState.build(nodes, [bad], previous=unchecked)


def test_only_the_last_few_filters_are_carried_on() -> None:
    """A caller that makes a new filter object every cycle (the controller, where wrappers come and go) must not
    make every later state carry the verdicts of all the filters it ever made."""
    nodes = [Node("n0", 8)]
    ws = [Workload(f"w{i}", Request(0), placements=(Placement("n0", ()),)) for i in range(10)]
    state = ClusterState.build(nodes, ws)
    for cycle in range(20):
        state.may_move(lambda w, k=cycle: int(w.id[1:]) % 2 == k % 2)
        state = ClusterState.build(nodes, ws, previous=state)
        carried = [k for k in state.memo if isinstance(k, tuple) and k[0] == "may_move.carried"]
        assert len(carried) <= CARRIED_FILTERS


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 2), st.sampled_from((250, 1000)), st.integers(0, 9),
                          st.integers(0, 9)), min_size=1, max_size=4),
       st.lists(st.integers(0, 3), min_size=0, max_size=40))
def test_columns_of_shared_requests_equal_those_of_one_request_each(shapes, picks) -> None:
    """Workloads that share Request objects (a snapshot's plain shapes: the columns then read each distinct one
    once) get the columns of the same workloads with a Request object each."""
    from gpudefrag.core.columns import gather

    shared = [Request(*s) for s in shapes]
    nodes = {"n0": 0, "n1": 1}
    run = [Workload(f"w{i}", shared[p % len(shared)]) for i, p in enumerate(picks)]
    own = [Workload(w.id, Request(*(getattr(w.request, f) for f in ("gpus_per_node", "node_count", "gpu_milli",
                                                                      "cpu_milli", "memory_mib"))))
           for w in run]
    a, b = gather(run, nodes), gather(own, nodes)
    assert a is not None and b is not None
    for name, x, y in zip(a._fields, a, b, strict=True):
        assert x.dtype == y.dtype and np.array_equal(x, y), name
