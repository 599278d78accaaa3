"""Property: the simulator's repacker and the planner work on one capacity model and one cost formula.

On random small clusters where a pod fits nowhere: whenever the simulator's repacker rescues it, its moves fit
the planner's capacity model (all moved pods stopped, then restored); when they can also be made one after
another (no two pods taking each other's room, which the simulator allows and the planner does not), they replay
through the planner's replay, their price by core.cost is what the simulator recorded, the exact planner finds
a plan too, and that plan costs no more (the same cost when it moves the same pods)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from gpudefrag.core.capacity import Capacity
from gpudefrag.core.cost import CostModel
from gpudefrag.core.model import MILLI, ClusterState, Node, Placement, Request, Workload
from gpudefrag.core.placement import Choice, Cluster, Pod, get_policy
from gpudefrag.core.planner import Move, MoveError, PlanOptions, apply_moves, fits_after, plan_moves
from gpudefrag.sim.costs import as_workload, checkpoint_bytes
from gpudefrag.sim.repack import ChainRepacker
from gpudefrag.sim.replay import MoveStats, Placed
from gpudefrag.sim.trace import fgd_mix

SHARES = (200, 300, 400, 500, 600, 700, 1000)


@st.composite
def saturated(draw) -> tuple[Cluster, Placed, Pod]:
    """2–3 nodes of 2–4 GPUs, every GPU filled with one whole pod or 1–3 sharing pods leaving less than 500
    milli free, and a pod of 500–1000 milli that therefore fits nowhere."""
    n = draw(st.integers(2, 3))
    counts = [draw(st.integers(2, 4)) for _ in range(n)]
    cl = Cluster.build([f"n{i}" for i in range(n)], counts, ["G"] * n, [64_000] * n, [0] * n,
                       fgd_mix([Pod(1, s) for s in (300, 500, 700, 1000)]))
    placed = Placed.for_cluster(cl)
    for i, k in enumerate(counts):
        for g in range(k):
            if draw(st.integers(0, 3)) == 0:
                pods = [MILLI]
            else:
                used = draw(st.sampled_from((600, 700, 800, 900)))
                cuts = sorted(draw(st.lists(st.sampled_from(range(100, used, 100)), max_size=2, unique=True)))
                pods = [b - a for a, b in zip([0, *cuts], [*cuts, used], strict=True)]
            for share in pods:
                pod = Pod(1, share, draw(st.sampled_from((1000, 4000))))
                cl.place(pod, Choice(i, (g,)))
                placed.add(pod, Choice(i, (g,)))
    want = Pod(1, draw(st.sampled_from((500, 700, MILLI))), 1000)
    assume(get_policy("bestfit").choose(cl, want, np.random.default_rng(0)) is None)
    return cl, placed, want


def as_state(cl: Cluster, placed: Placed) -> ClusterState:
    nodes = [Node(name, int(cl.gpu_count[i]), "G", cpu_milli=int(cl.cpu_cap[i])) for i, name in enumerate(cl.names)]
    ws = [Workload(f"pod-{pid}", as_workload(pod, 0).request, placements=(Placement(cl.names[ch.node], ch.gpus),),
                   checkpoint_bytes=int(checkpoint_bytes(pod, "G")))
          for pid, (pod, ch) in placed.pods.items()]
    return ClusterState(tuple(nodes), tuple(ws))


def in_order(state: ClusterState, moves: list[Move]) -> list[Move] | None:
    """An order in which each move finds its room when it is made (a chain's last hop first)."""
    done: list[Move] = []
    todo = list(moves)
    while todo:
        for m in todo:
            try:
                apply_moves(state, [*done, m])
            except MoveError:
                continue
            done.append(m)
            todo.remove(m)
            break
        else:
            return None
    return done


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(saturated())
def test_the_simulator_and_the_planner_agree_on_plans_and_their_cost(case):
    cl, placed, want = case
    state = as_state(cl, placed)
    ids = {pid: f"pod-{pid}" for pid in placed.pods}
    cm = CostModel()
    stats = MoveStats()
    # ejection chains (every hop into a hole that exists when it is made); CPU relief and swaps trade two pods
    # places at once, which the planner (one move after another) does not model
    sim = ChainRepacker(max_moves=4, budget=100, pool=0, cpu_relief=False, cpu_swaps=False, check_clearable=False)
    ch = sim.rescue(cl, want, placed, get_policy("bestfit"), np.random.default_rng(0), stats)
    request = Request(want.num_gpu, 1, want.gpu_milli, want.cpu_milli)
    plan = plan_moves(state, request, PlanOptions(max_moves=4, max_moves_per_node=100, solver="exact",
                                                  time_limit_s=10.0, cost_model=cm))
    if ch is None:
        event("the repacker found nothing" + (" (the planner did)" if plan.feasible else ""))
        return  # the repacker is a heuristic: it may miss a plan the planner finds
    assume(all(was.node != now.node for _, was, now in sim.last_moved))  # the planner never moves within a node
    w = {x.id: x for x in state.workloads}
    moves = [Move(ids[pid], cl.names[was.node], cl.names[now.node], now.gpus,
                  cm.move_cost(w[ids[pid]], cl.names[was.node], cl.names[now.node], state.now))
             for pid, was, now in sim.last_moved]
    # all at once (every moved pod stopped, then restored) they fit in the planner's capacity model
    cap = Capacity.of_state(state)
    for pid, was, _now in sim.last_moved:
        cap.give(was.node, was.gpus, placed.pods[pid][0])
    for pid, _was, now in sim.last_moved:
        cap.take(now.node, now.gpus, placed.pods[pid][0])
    cap.take(ch.node, ch.gpus, want)
    # one after another, as the planner moves, unless they form a cycle (two pods taking each other's room)
    ordered = in_order(state, moves)
    event("the repacker's moves form a cycle" if ordered is None else "compared")
    assume(ordered is not None)
    assert fits_after(state, ordered, request, (Placement(cl.names[ch.node], ch.gpus),))
    sim_cost = sum(m.cost.score for m in ordered)
    assert math.isclose(sim_cost, stats.moved_gpu_s, rel_tol=1e-9)
    assert plan.feasible, plan.reason
    assert plan.score <= sim_cost + 1e-6
    if plan.optimal and len(plan.moves) == len(ordered) and {m.workload_id for m in plan.moves} == {
            m.workload_id for m in ordered}:
        assert math.isclose(plan.score, sim_cost, rel_tol=1e-9)
    event("same cost" if math.isclose(plan.score, sim_cost, rel_tol=1e-9) else "the planner is cheaper")
