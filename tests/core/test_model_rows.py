"""`ClusterState.running_rows` is built from the placement columns at once; it must be exactly the row walk
(`model.workload_row` per running workload), which the replay and the placement keep per workload."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudefrag.core.model import ClusterState, Node, Placement, Request, Workload, WorkloadState, workload_row


@st.composite
def states(draw) -> ClusterState:
    """Nodes of 0-8 GPUs; running jobs with whole or shared GPUs, CPU-only jobs (a placement without GPUs),
    jobs on two nodes, jobs without placements, immovable ones; pending jobs in between."""
    nodes = [Node(f"n{i}", draw(st.sampled_from((0, 2, 8)))) for i in range(draw(st.integers(1, 4)))]
    used = {(nd.name, g): 0 for nd in nodes for g in range(nd.gpu_count)}
    ws: list[Workload] = []
    for j in range(draw(st.integers(0, 14))):
        kind = draw(st.integers(0, 5))
        if kind == 0:
            ws.append(Workload(f"p{j}", Request(draw(st.integers(0, 8))), state=WorkloadState.PENDING))
            continue
        on = draw(st.permutations(nodes))[: 2 if kind == 1 and len(nodes) > 1 else 1]
        milli = draw(st.sampled_from((250, 1000)))
        k = 0 if kind == 2 else (1 if milli < 1000 else draw(st.integers(1, 2)))
        placements = []
        for nd in on:
            free = [g for g in range(nd.gpu_count) if used[(nd.name, g)] + milli <= 1000][:k]
            if len(free) < k:
                break
            placements.append(Placement(nd.name, tuple(free)))
        if len(placements) < len(on):
            continue
        for p in placements:
            for g in p.gpus:
                used[(p.node, g)] += milli
        if kind == 3 and draw(st.booleans()):
            placements = []  # running, not placed (yet): the row says so with -1s and 0s
        ws.append(Workload(f"r{j}", Request(k, len(on), milli if k else 1000, cpu_milli=draw(st.integers(0, 9)),
                                            memory_mib=draw(st.integers(0, 9))),
                           placements=tuple(placements), movable=draw(st.booleans()),
                           labels={"gpudefrag.io/movable": "false"} if draw(st.integers(0, 5)) == 0 else {}))
    return ClusterState(tuple(nodes), tuple(ws))


@settings(max_examples=300, deadline=None)
@given(states())
def test_running_rows_are_the_row_walk(state: ClusterState) -> None:
    want = np.array([workload_row(w, state.node_index) for w in state.running], dtype=np.int64).reshape(-1, 9)
    assert np.array_equal(state.running_rows, want)
    if any(not w.placements for w in state.running):
        return  # validate refuses a running job without placements; the rows above still cover it
    # and through validate, which leaves its placement columns behind for the rows
    built = ClusterState.build(state.nodes, state.workloads)
    assert "_columns" in built.__dict__
    assert np.array_equal(built.running_rows, want)
