"""Property: for random clusters, any plan returned replays move by move without exceeding a capacity, the
request fits at the end, its cost is the sum of its moves, and no rule (multi-node, filter, budgets, no double
move) is broken. And the exact solver, when it proves optimality, is never beaten by the heuristic."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudefrag.core.model import ClusterState, Node, Placement, Request, Versions, Workload, WorkloadState
from gpudefrag.core.planner import Plan, PlanOptions, apply_moves, plan_all_pending, plan_moves

MODELS = ("H100", "A100")
NOW = 10_000.0


@st.composite
def clusters(draw) -> ClusterState:
    """2–5 nodes, each filled with whole and shared-GPU jobs up to a drawn level; a few 2-node jobs; mostly
    one GPU model and driver, so that moves are usually allowed (and sometimes refused by the gate)."""
    n = draw(st.integers(2, 5))
    size = draw(st.sampled_from((4, 8)))
    nodes = [Node(f"n{i}", size, draw(st.sampled_from(("H100", "H100", "H100", "A100"))),
                  cpu_milli=draw(st.sampled_from((0, 64_000))),
                  driver_version=draw(st.sampled_from(("550", "550", "550", "535"))), cuda_version="12.4")
             for i in range(n)]
    used = {(nd.name, g): 0 for nd in nodes for g in range(nd.gpu_count)}
    cpu = {nd.name: nd.cpu_milli for nd in nodes}
    ws: list[Workload] = []

    def add(jid: str, k: int, milli: int, count: int, on: list[Node], c: int) -> None:
        placements = []
        for nd in on:
            gl = [g for g in range(nd.gpu_count) if used[(nd.name, g)] + milli <= 1000][:k]
            if len(gl) < k or (nd.cpu_milli and cpu[nd.name] < c):
                return
            placements.append(Placement(nd.name, tuple(gl)))
        for p in placements:
            for g in p.gpus:
                used[(p.node, g)] += milli
            cpu[p.node] -= c
        rec = Versions(gpu_model=on[0].gpu_model, driver=on[0].driver_version if draw(st.booleans()) else None)
        ws.append(Workload(jid, Request(k, count, milli, cpu_milli=c), placements=tuple(placements),
                           checkpoint_bytes=draw(st.integers(0, 50)) << 30,
                           last_checkpoint_at=NOW - draw(st.integers(0, 3600)), versions=rec,
                           labels={"pinned": "yes"} if draw(st.integers(0, 7)) == 0 else {}))

    if n > 2 and draw(st.booleans()):
        a, b = draw(st.permutations(nodes))[:2]
        add("multi", draw(st.integers(1, 2)), 1000, 2, [a, b], 0)
    for i, nd in enumerate(nodes):
        fill = draw(st.integers(size // 4, size))
        for j in range(size):
            if sum(1 for g in range(size) if used[(nd.name, g)] > 0) >= fill:
                break
            frac = draw(st.integers(0, 3)) == 0
            add(f"w{i}_{j}", 1 if frac else draw(st.integers(1, 3)),
                draw(st.sampled_from((250, 500, 750))) if frac else 1000, 1, [nd], draw(st.sampled_from((0, 8000))))
    return ClusterState.build(nodes, ws, now=NOW)


@st.composite
def requests(draw, sizes: tuple[int, ...] = (4, 8)) -> Request:
    """Mostly a whole node's worth (what fragmentation blocks), sometimes half, a share, or two nodes."""
    size = draw(st.sampled_from(sizes))
    kind = draw(st.integers(0, 5))
    if kind <= 2:
        return Request(size, gpu_models=draw(st.sampled_from(((), ("H100",)))))
    if kind == 3:
        return Request(size // 2)
    if kind == 4:
        return Request(1, gpu_milli=draw(st.sampled_from((250, 500, 1000))))
    return Request(size // 2, 2)


@st.composite
def problems(draw) -> tuple[ClusterState, Request]:
    state = draw(clusters())
    return state, draw(requests((state.max_gpus,)))


def not_pinned(w: Workload) -> bool:
    return w.labels.get("pinned") != "yes"


options = st.builds(
    PlanOptions,
    max_moves=st.sampled_from((0, 1, 3, 6, 6, 8)),
    max_moves_per_node=st.integers(1, 8),
    movable=st.sampled_from((None, not_pinned)),
    fresh_checkpoint=st.booleans(),
)


def assert_valid(state: ClusterState, plan: Plan, opts: PlanOptions) -> None:
    after = apply_moves(state, plan.moves)  # raises MoveError if any step exceeds a capacity
    assert after.cpu_free.min(initial=0) >= 0 or all(nd.cpu_milli == 0 for nd in after.nodes)
    ids = [m.workload_id for m in plan.moves]
    assert len(ids) == len(set(ids)) and len(ids) <= opts.max_moves
    per_node: dict[str, int] = {}
    for m in plan.moves:
        w = state.workload(m.workload_id)
        assert not w.is_multi_node
        assert opts.movable is None or opts.movable(w)
        assert not w.request.gpu_models or after.node(m.target).gpu_model in w.request.gpu_models
        per_node[m.source] = per_node.get(m.source, 0) + 1
        per_node[m.target] = per_node.get(m.target, 0) + 1
    assert max(per_node.values(), default=0) <= opts.max_moves_per_node
    # the request placed where the plan says: a valid state (no GPU over-allocated), CPU not exceeded
    r = plan.request
    placed = after.with_workloads([*after.workloads, Workload("the-request", r, WorkloadState.RUNNING,
                                                              placements=plan.placements)])
    for p in plan.placements:
        nd = placed.node(p.node)
        assert not r.gpu_models or nd.gpu_model in r.gpu_models
        assert nd.cpu_milli == 0 or placed.cpu_free[placed.node_index[p.node]] >= 0
    assert math.isclose(plan.total_cost_s, sum(m.cost.total_s for m in plan.moves), abs_tol=1e-6)
    assert math.isclose(plan.total_gpu_s, sum(m.cost.gpu_s for m in plan.moves), abs_tol=1e-6)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), options)
def test_every_plan_replays_and_costs_the_sum_of_its_moves(problem, opts):
    state, request = problem
    heur = plan_moves(state, request, dataclasses.replace(opts, solver="heuristic"))
    exact = plan_moves(state, request, dataclasses.replace(opts, solver="exact", time_limit_s=5.0))
    for plan in (heur, exact):
        if plan.feasible:
            assert_valid(state, plan, opts)
        else:
            assert plan.reason and not plan.moves
    if exact.optimal:
        assert exact.feasible
        if heur.feasible:
            assert exact.score <= heur.score + 1e-6
    if heur.feasible and exact.solver == "exact" and not exact.feasible:
        raise AssertionError(f"exact solver says infeasible but the heuristic found {heur.moves}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.lists(requests(), min_size=1, max_size=3))
def test_all_pending_plans_move_each_workload_once_and_fit_together(state, reqs):
    pend = [Workload(f"p{i}", r, WorkloadState.PENDING, submitted_at=float(i)) for i, r in enumerate(reqs)]
    state = state.with_workloads([*state.workloads, *pend])
    plans = plan_all_pending(state, PlanOptions(max_moves=4))
    assert [p.workload_id for p in plans] == [w.id for w in pend]
    moved = [m.workload_id for p in plans for m in p.moves]
    assert len(moved) == len(set(moved))
    current = state
    for p in plans:
        if not p.feasible:
            continue
        current = apply_moves(current, p.moves)
        old = current.workload(p.workload_id)
        current = current.with_workloads(
            [w if w.id != old.id else Workload(w.id, w.request, WorkloadState.RUNNING, placements=p.placements)
             for w in current.workloads])
