"""The capacity model (core/capacity.py): statements roll back exactly, and the planner's counting proof
settles "no node can be cleared" before any CP-SAT search, never wrongly."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudefrag.core.capacity import Capacity, Shape, fits, pick_gpus
from gpudefrag.core.model import ClusterState
from gpudefrag.core.planner import PlanOptions, plan_moves
from gpudefrag.core.planner_exact import solve_exact
from gpudefrag.core.planner_problem import Problem, capacity_proof, parts_of

from .test_property import options, problems


def test_a_statement_rolls_back_exactly_and_nests():
    cap = Capacity(np.array([[1000, 1000, 300], [1000, -1, -1]]), np.array([8000, 4000]), np.array([100, 50]))
    before = (cap.free.copy(), cap.cpu_free.copy(), cap.mem_free.copy())
    seen: list[str] = []
    outer = cap.mark()
    cap.take(0, (0, 1), Shape(2, 1000, 2000, 10))
    cap.note(lambda: seen.append("outer"))
    inner = cap.mark()
    cap.give(0, (2,), Shape(1, 700, 0, 0))
    cap.take(1, (0,), Shape(1, 500, 1000, 5))
    cap.note(lambda: seen.append("inner"))
    assert cap.free.tolist() == [[0, 0, 1000], [500, -1, -1]]
    cap.rollback(inner)
    assert seen == ["inner"] and cap.free.tolist() == [[0, 0, 300], [1000, -1, -1]]
    cap.rollback(outer)
    assert seen == ["inner", "outer"]
    for a, b in zip(before, (cap.free, cap.cpu_free, cap.mem_free), strict=True):
        assert (a == b).all()
    cap.commit()
    cap.take(0, (2,), Shape(1, 300))  # outside a statement nothing is logged, so nothing rolls back
    cap.rollback()
    assert cap.free[0, 2] == 0


def test_a_change_that_does_not_fit_is_refused_whole():
    cap = Capacity(np.array([[1000, 400]]), np.array([1000]), np.array([10]))
    with pytest.raises(ValueError, match="GPU 1 of node 0"):
        cap.take(0, (0, 1), Shape(2, 1000))
    with pytest.raises(ValueError, match="CPU or memory"):
        cap.take(0, (0,), Shape(1, 1000, 2000))
    with pytest.raises(ValueError, match="distinct"):
        cap.take(0, (0, 0), Shape(2, 300))
    assert cap.free.tolist() == [[1000, 400]] and cap.cpu_free[0] == 1000


def test_one_fit_and_one_picker():
    free = np.array([[1000, 200, 600, -1], [1000, 1000, 0, 0]])
    ok = fits(free, np.array([10, 10]), np.array([0, 0]), Shape(2, 1000))
    assert ok.tolist() == [False, True]
    assert pick_gpus(free[0], Shape(1, 500)) == (2,)  # the fullest GPU that fits
    assert pick_gpus(free[0], Shape(1, 500), "empty") == (0,)
    assert pick_gpus(free[1], Shape(2, 1000)) == (0, 1)
    assert pick_gpus(free[0], Shape(2, 1000)) is None


def full_cluster(pb, sizes: tuple[tuple[int, ...], ...]):
    """4 nodes of 8 GPUs; node i holds whole-GPU jobs of the given sizes."""
    jobs = [pb.job(f"j{i}_{k}", s, f"n{i}", gib=5.0) for i, row in enumerate(sizes) for k, s in enumerate(row)]
    return pb.build([pb.node(f"n{i}") for i in range(4)], jobs)


BUSY_26 = ((2, 2, 2, 1), (2, 2, 2, 1), (2, 2, 1, 1), (2, 2, 2))  # 15 jobs, 26 busy GPUs
BUSY_22 = ((2, 2, 1, 1), (2, 2, 1, 1), (2, 2, 1, 1), (2, 1, 1))  # 15 jobs, 22 busy GPUs


def test_more_busy_gpus_than_three_nodes_hold_is_proven_infeasible_by_counting(pb):
    # 15 jobs on 4 × 8 GPUs: 26 busy GPUs, so the other three nodes cannot take a cleared node's jobs
    state = full_cluster(pb, BUSY_26)
    assert len(state.running) == 15 and int((state.free_milli < 1000).sum()) == 26
    request = pb.build([pb.node("x")], [pb.job("p", 8)]).workload("p").request
    p = Problem(state, PlanOptions())
    assert "need at least 34 GPUs" in capacity_proof(p, parts_of(state, [request]))
    plan = plan_moves(state, request, PlanOptions(solver="exact", time_limit_s=60.0))
    assert not plan.feasible and plan.solver == "exact"
    assert "need at least 34 GPUs, and the cluster can offer 32" in plan.reason


def test_the_proof_stays_silent_when_a_plan_exists(pb):
    state = full_cluster(pb, BUSY_22)  # 22 + 8 <= 32 GPUs: n3's three jobs fit elsewhere
    request = pb.build([pb.node("x")], [pb.job("p", 8)]).workload("p").request
    assert capacity_proof(Problem(state, PlanOptions()), parts_of(state, [request])) == ""
    plan = plan_moves(state, request, PlanOptions())
    assert plan.feasible and len(plan.moves) == 3


def test_the_move_budget_is_counted_per_target_node(pb):
    state = full_cluster(pb, BUSY_22)  # clearing any node needs at least 3 departures
    request = pb.build([pb.node("x")], [pb.job("p", 8)]).workload("p").request
    why = capacity_proof(Problem(state, PlanOptions(max_moves=2)), parts_of(state, [request]))
    assert "more than 2 moves" in why
    assert not plan_moves(state, request, PlanOptions(max_moves=2)).feasible


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), options)
def test_the_counting_proof_is_never_wrong(problem, opts):
    """Whenever the proof says no plan exists, CP-SAT over every node finds none either."""
    state, request = problem
    opts = dataclasses.replace(opts, time_limit_s=5.0)
    p = Problem(state, opts)
    parts = parts_of(state, [request])
    if capacity_proof(p, parts):
        ex = solve_exact(p, parts, None)
        assert ex.work is None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), options)
def test_room_bound_is_the_cheapest_set_that_makes_room_and_inf_when_none_does(problem, opts):
    """`room_bound` (the heuristic's per-node bound) against every set of a node's movable workloads: inf when
    no set of at most the move budget makes room (at once, when even all of them together do not: the replay in
    time asks this of hundreds of nodes per decision), else the cost of the cheapest set that does."""
    from itertools import combinations

    from gpudefrag.core.capacity import fits_one
    from gpudefrag.core.planner_heuristic import room_bound
    from gpudefrag.core.planner_problem import Work

    state, request = problem
    p = Problem(state, opts)
    work = Work(p)
    part = parts_of(state, [request])[0]
    for i in range(len(state.nodes)):
        items = [int(w) for w in p.on_node(i) if p.why_not_movable(int(w)) is None]
        max_size = min(work.moves_left(), opts.max_moves_per_node, len(items))
        best = float("inf")
        for k in range(1, max_size + 1):
            for sub in combinations(items, k):
                row = [int(x) for x in work.free[i]]
                cpu, mem = int(work.cpu[i]), int(work.mem[i])
                for w in sub:
                    for g in p.ws[w].placements[0].gpus:
                        row[g] += int(p.milli[w])
                    cpu += int(p.cpu[w])
                    mem += int(p.mem[w])
                if fits_one(row, cpu, mem, part.shape):
                    best = min(best, sum(float(p.score_lb[w]) for w in sub))
        got = room_bound(p, work, part, i)
        assert got == pytest.approx(best) if np.isfinite(best) else got == float("inf")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), options, st.booleans())
def test_room_possible_is_false_only_where_room_bound_is_inf(problem, opts, diagnosed):
    """`room_possible` (the heuristic's vectorised pre-test: may any set of a node's movable workloads make
    room?) never rules out a node that `room_bound` would give a finite bound: with the filter's verdicts known
    (a diagnosis asked them first) or not, and after a move was made on the working state."""
    from gpudefrag.core.planner_heuristic import room_bound, room_possible
    from gpudefrag.core.planner_problem import Work

    state, request = problem
    if diagnosed:
        state.may_move(opts.movable)
    p = Problem(state, opts)
    part = parts_of(state, [request])[0]
    works = [Work(p)]
    movers = [int(w) for w in np.flatnonzero(~p.multi) if p.why_not_movable(int(w)) is None]
    if movers and opts.max_moves > 0:  # one workload released from its node and put back there (a moved one)
        w = Work(p)
        wi = movers[0]
        w.release(wi)
        w.move(wi, int(p.src[wi]), p.ws[wi].placements[0].gpus)
        works.append(w)
    for work in works:
        possible = room_possible(p, work, part)
        for i in range(len(state.nodes)):
            if not possible[i]:
                assert room_bound(p, work, part, i) == float("inf"), i


def test_room_bound_of_a_node_that_no_set_can_clear_is_inf_without_trying_thousands():
    """28 quarter-GPU jobs on seven GPUs and an immovable job on the eighth: no set of moves frees the node for an
    8-GPU request. The bound is inf (it used to give up after 4,000 of the sets and return the cost reached,
    a finite bound that sent the planner to clear a node that cannot be cleared)."""
    from gpudefrag.core.model import Node, Placement, Request, Workload
    from gpudefrag.core.planner_heuristic import room_bound
    from gpudefrag.core.planner_problem import Work

    ws = [Workload("pinned", Request(1), placements=(Placement("n0", (0,)),), movable=False)]
    ws += [Workload(f"q{g}-{k}", Request(1, gpu_milli=250), placements=(Placement("n0", (g,)),))
           for g in range(1, 8) for k in range(4)]
    state = ClusterState.build([Node("n0", 8, "H100"), Node("n1", 8, "H100")], ws)
    p = Problem(state, PlanOptions(max_moves=8, max_moves_per_node=8))
    assert room_bound(p, Work(p), parts_of(state, [Request(8)])[0], 0) == float("inf")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), options)
def test_fewest_to_leave_never_exceeds_the_smallest_set_that_makes_room(problem, opts):
    """`fewest_to_leave` (the count bound that lets `room_bound` answer inf without enumerating sets) is a lower
    bound: no set of a node's movable workloads smaller than it makes room, whatever the node and request."""
    from itertools import combinations

    from gpudefrag.core.capacity import fits_one
    from gpudefrag.core.planner_heuristic import fewest_to_leave
    from gpudefrag.core.planner_problem import Work

    state, request = problem
    p = Problem(state, opts)
    work = Work(p)
    part = parts_of(state, [request])[0]
    for i in range(len(state.nodes)):
        items = [int(w) for w in p.on_node(i) if p.why_not_movable(int(w)) is None][:10]
        base = [int(x) for x in work.free[i]]
        cpu0, mem0 = int(work.cpu[i]), int(work.mem[i])
        frees = [(p.ws[w].placements[0].gpus, int(p.milli[w]), int(p.cpu[w]), int(p.mem[w])) for w in items]
        bound = fewest_to_leave(base, cpu0, mem0, frees, part.shape)
        for k in range(0, min(bound, len(frees) + 1)):  # every set smaller than the bound leaves no room
            for sub in combinations(range(len(frees)), k):
                row, cpu, mem = list(base), cpu0, mem0
                for j in sub:
                    for g in frees[j][0]:
                        row[g] += frees[j][1]
                    cpu += frees[j][2]
                    mem += frees[j][3]
                assert not fits_one(row, cpu, mem, part.shape), (i, sub, bound)


def test_room_bound_of_a_node_whose_cpu_many_small_pods_hold_is_inf_within_the_budget():
    """Twelve 1-core CPU-only pods hold the CPU of a node with 8 free GPUs; an 8-GPU request asks for 10 cores:
    all twelve leaving makes room, no 8 of them do (the budget): inf, from the count bound alone."""
    from gpudefrag.core.model import Node, Placement, Request, Workload
    from gpudefrag.core.planner_heuristic import fewest_to_leave, room_bound
    from gpudefrag.core.planner_problem import Work

    ws = [Workload(f"c{k}", Request(0, cpu_milli=1000), placements=(Placement("n0", ()),)) for k in range(12)]
    state = ClusterState.build([Node("n0", 8, "H100", cpu_milli=12_000), Node("n1", 8, "H100", cpu_milli=64_000)],
                               ws)
    p = Problem(state, PlanOptions(max_moves=8, max_moves_per_node=8))
    part = parts_of(state, [Request(8, cpu_milli=10_000)])[0]
    frees = [((), 0, 1000, 0)] * 12
    assert fewest_to_leave([1000] * 8, 0, 0, frees, part.shape) == 10
    assert room_bound(p, Work(p), part, 0) == float("inf")
