"""The heuristic's chain search, made cheap for the replay in time (issue 28, item 5) without changing what it
finds: its answers kept per decision give the same plans as searching again, its plain-number fit test is the
capacity model's, the price order kept per problem is the one a fresh sort gives, and dropping trials that
cost as much as the best plan so far never leaves a worse plan."""

from __future__ import annotations

import dataclasses
import math
from itertools import combinations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpudefrag.core import planner_heuristic as ph
from gpudefrag.core.model import ClusterState, Node, Placement, Request, Workload
from gpudefrag.core.planner import Plan, PlanOptions, plan_moves
from gpudefrag.core.planner_problem import Part, Problem, Work, parts_of

from .test_property import assert_valid, options, problems


@st.composite
def crowded(draw) -> tuple[ClusterState, Request]:
    """4 to 9 four-GPU nodes with nearly every GPU held (one-GPU jobs, or one or two shares of 250 to 750), and a
    request of one, two or four GPUs or a share: most plans need chains, and several candidate nodes are
    cleared after a first plan is found (what `PRUNE_BY_BEST` acts on; the small clusters of `problems` rarely
    get there)."""
    def shares(kind: int) -> list[int]:
        return [] if kind == 0 else [1000] if kind <= 12 else draw(
            st.sampled_from(([500], [750], [250, 500], [500, 500], [250])))

    return _held(draw, draw(st.integers(4, 9)), 4, 24, shares,
                 (Request(1), Request(1), Request(2), Request(4), Request(1, gpu_milli=750)))


def _held(draw, n_nodes: int, n_gpus: int, kinds: int, shares, requests) -> tuple[ClusterState, Request]:
    """`n_nodes` H100 nodes of `n_gpus`; each GPU held by the one-GPU jobs `shares(kind)` gives (their milli
    each) for a kind drawn in 0..`kinds`; and one of `requests`."""
    nodes = [Node(f"n{i}", n_gpus, "H100") for i in range(n_nodes)]
    ws: list[Workload] = []
    for nd in nodes:
        for g in range(n_gpus):
            for k, m in enumerate(shares(draw(st.integers(0, kinds)))):
                ws.append(Workload(f"{nd.name}-{g}-{k}", Request(1, gpu_milli=m),
                                   placements=(Placement(nd.name, (g,)),),
                                   checkpoint_bytes=draw(st.integers(0, 40)) << 30,
                                   last_checkpoint_at=1000.0 - draw(st.integers(0, 900))))
    return ClusterState.build(nodes, ws, now=1000.0), draw(st.sampled_from(requests))


busy_options = st.builds(PlanOptions, max_moves=st.sampled_from((3, 6, 8)), max_moves_per_node=st.integers(2, 8),
                         fresh_checkpoint=st.booleans())
cases = st.one_of(st.tuples(problems(), options), st.tuples(crowded(), busy_options))


def _key(plan: Plan) -> tuple[object, ...]:
    return (plan.feasible, tuple((m.workload_id, m.target, tuple(m.target_gpus)) for m in plan.moves),
            tuple((pl.node, tuple(pl.gpus)) for pl in plan.placements), plan.score)


def _heuristic(state: ClusterState, request: Request, opts: PlanOptions) -> Plan:
    return plan_moves(state, request, dataclasses.replace(opts, solver="heuristic"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_kept_chain_answers_give_the_plans_a_fresh_search_gives(case):
    """The memo of `_chain` against searching every time (`_chain_search` called directly): the same moves,
    GPUs, landing and score."""
    (state, request), opts = case
    kept = _heuristic(state, request, opts)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ph, "_chain", lambda p, work, wi, forbid, depth, limit=math.inf:
                   ph._chain_search(p, work, wi, forbid, depth, limit))
        fresh = _heuristic(state, request, opts)
    assert _key(kept) == _key(fresh)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_dropping_trials_at_the_best_score_never_leaves_a_worse_plan(case):
    """With `PRUNE_BY_BEST` off, clear_node and the chains finish every trial; with it on (the default) a plan is
    found whenever one was, and it costs no more."""
    (state, request), opts = case
    pruned = _heuristic(state, request, opts)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ph, "PRUNE_BY_BEST", False)
        full = _heuristic(state, request, opts)
    assert pruned.feasible or not full.feasible
    if full.feasible:
        assert pruned.score <= full.score + 1e-6


def _crowded() -> tuple[Problem, Part]:
    """Every GPU busy: n0 and n1 with one-GPU jobs, n2 with a half-GPU job alone on each GPU, n3 with three
    one-GPU jobs and half a GPU free; a one-GPU request. It lands on n2 once one of its half-GPU jobs moves to
    n3, and a job displaced from n0 finds room only through such a chain (n3 or n2 after a half-GPU job moves)."""
    nodes = [Node(f"n{k}", 4, "H100") for k in range(4)]
    ws = [Workload(f"a{g}", Request(1), placements=(Placement("n0", (g,)),), checkpoint_bytes=(g + 1) << 30)
          for g in range(4)]
    ws += [Workload(f"b{g}", Request(1), placements=(Placement("n1", (g,)),), checkpoint_bytes=(g + 5) << 30)
           for g in range(4)]
    ws += [Workload(f"c{g}", Request(1, gpu_milli=500), placements=(Placement("n2", (g,)),),
                    checkpoint_bytes=(g + 1) << 29) for g in range(4)]
    ws += [Workload(f"d{g}", Request(1), placements=(Placement("n3", (g,)),)) for g in range(3)]
    ws += [Workload("d3", Request(1, gpu_milli=500), placements=(Placement("n3", (3,)),))]
    state = ClusterState.build(nodes, ws, now=1000.0)
    p = Problem(state, PlanOptions(max_moves=8, max_moves_per_node=8, solver="heuristic"))
    return p, parts_of(state, [Request(1)])[0]


def test_a_chain_search_asked_again_on_the_same_state_is_answered_from_the_memo(monkeypatch):
    """The second identical ask does not search; each answer is a copy of its own, carrying the asker's
    reservations, so changing one changes neither the memo nor the other."""
    p, part = _crowded()
    calls: list[int] = []
    search = ph._chain_search
    monkeypatch.setattr(ph, "_chain_search", lambda *a: calls.append(1) or search(*a))
    work = Work(p)
    wi = int(p.on_node(0)[0])
    work.release(wi)
    forbid = np.zeros(len(p.state.nodes), dtype=bool)
    forbid[0] = True
    first = ph._chain(p, work, wi, forbid, ph.CHAIN_DEPTH)
    assert first is not None and len(first.order) == 2  # a half-GPU job moved out of its way first
    again = work.clone()
    again.reserved.append((part, 0, (1, 2, 3)))
    second = ph._chain(p, again, wi, forbid, ph.CHAIN_DEPTH)
    assert len(calls) == 1
    assert second is not None and first.order == second.order and first.score == second.score
    assert np.array_equal(first.free, second.free)
    assert second.reserved == again.reserved and first.reserved == work.reserved
    second.free[:] = 0
    third = ph._chain(p, work, wi, forbid, ph.CHAIN_DEPTH)
    assert third is not None and np.array_equal(third.free, first.free)
    assert len(calls) == 1


def test_clear_node_under_a_limit_no_plan_can_meet_stops_without_trying(monkeypatch):
    """A caller whose best plan costs nothing: every set of the node's workloads costs more, so clear_node
    returns None at once, saying so, and places nothing; without the limit it finds a plan."""
    p, part = _crowded()
    forbid = np.zeros(len(p.state.nodes), dtype=bool)
    got, _ = ph.clear_node(p, Work(p), part, 2, forbid)
    assert got is not None and len(got.order) == 1
    placed: list[int] = []
    place = ph._place
    monkeypatch.setattr(ph, "_place", lambda *a, **k: placed.append(1) or place(*a, **k))
    got, why = ph.clear_node(p, Work(p), part, 2, forbid, limit=0.0)
    assert got is None and "best plan" in why and not placed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), options, st.data())
def test_the_price_order_less_moved_workloads_is_a_fresh_sort_of_the_rest(problem, opts, data):
    """`_price_order` is sorted once per problem; with some workloads moved, `lower_bounds` keeps the rest in
    that order, which must be exactly the order (and so the sums) a sort of the rest alone gives."""
    state, _ = problem
    p = Problem(state, opts)
    by_price, units, prices = ph._price_order(p, p.score)
    singles = [int(w) for w in np.flatnonzero(~p.multi)]
    moved = data.draw(st.sets(st.sampled_from(singles), max_size=4)) if singles else set()
    left = np.ones(len(p.ws), dtype=bool)
    left[list(moved)] = False
    kept = by_price[left[by_price]]
    idx = np.flatnonzero(~p.multi & left & (units > 0))
    assert np.array_equal(kept, idx[np.lexsort((prices[idx], p.src[idx]))])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), options)
def test_the_chain_fit_on_plain_numbers_is_the_capacity_models(problem, opts):
    """`_chain` tests each set of a node's workloads with `_frees`, `_without` and `fits_one` on the row as
    numbers; the capacity model's `Work.fits_without` must agree on every set of up to CHAIN_VICTIMS of them,
    for the request's shape and for each workload's own; and `_room_within` is False only when none fits."""
    from gpudefrag.core.capacity import fits_one

    state, request = problem
    p = Problem(state, opts)
    work = Work(p)
    shapes = [parts_of(state, [request])[0].shape, *(p.shape(int(w)) for w in np.flatnonzero(~p.multi))]
    for i in range(len(state.nodes)):
        items = [int(w) for w in p.on_node(i) if p.why_not_movable(int(w)) is None]
        row, cpu, mem = work.free[i].tolist(), int(work.cpu[i]), int(work.mem[i])
        frees = ph._frees(p, items)
        for shape in shapes[:4]:
            any_fit = False
            for k in range(1, min(ph.CHAIN_VICTIMS, len(items)) + 1):
                for sub in combinations(range(len(items)), k):
                    mine = fits_one(*ph._without(row, cpu, mem, frees, sub), shape)
                    assert mine == work.fits_without(i, [items[j] for j in sub], shape)
                    any_fit |= mine
            if any_fit:
                assert ph._room_within(row, cpu, mem, frees, min(ph.CHAIN_VICTIMS, len(items)), shape)


def _lower_bounds_fresh(p: Problem, work: Work, part: Part, allowed: np.ndarray) -> np.ndarray:
    """`lower_bounds` from its definition: every pass over what is left, every call, and each node's cover
    bought item by item in plain Python."""
    from gpudefrag.core.model import MILLI

    n = len(p.state.nodes)
    have = (work.free >= part.milli).sum(axis=1)
    need = np.maximum(part.gpus - have, 0)
    single = ~p.multi
    if work.moved:
        single = single.copy()
        single[list(work.moved)] = False
    src, gpus, score = p.src[single], p.gpus[single], p.score[single]
    ratio = np.where((p.milli[single] >= MILLI) & (gpus > 0), score / np.maximum(gpus, 1), score)
    min_ratio = np.full(n, np.inf)
    np.minimum.at(min_ratio, src, ratio)
    min_item = np.full(n, np.inf)
    np.minimum.at(min_item, src, score)
    capacity = np.zeros(n, dtype=np.int64)
    np.add.at(capacity, src, np.where(p.milli[single] >= MILLI, gpus, 0))
    shared = np.zeros(work.free.shape, dtype=bool)
    frac = (p.milli[single] < MILLI) & (p.gpu0[single] >= 0)
    shared[src[frac], p.gpu0[single][frac]] = True
    partly = (work.free > 0) & (work.free < MILLI)
    cap_ok = have + capacity + (shared | partly).sum(axis=1) >= part.gpus
    lb = np.maximum(min_item, need * np.where(np.isfinite(min_ratio), min_ratio, 0.0))
    whole = (p.milli >= MILLI) & (p.gpus > 0)
    prices = np.where(whole, p.score / np.maximum(p.gpus, 1), p.score)
    units = np.where(p.milli >= MILLI, p.gpus, 1)
    idx = np.flatnonzero(single & (units > 0))
    idx = idx[np.lexsort((prices[idx], p.src[idx]))]
    cover = np.zeros(n)
    for i in range(n):  # each node's items in price order, bought one by one, the last one in part
        left = int(need[i])
        for w in idx[p.src[idx] == i]:
            if left <= 0:
                break
            u = int(units[w])
            cover[i] += left * prices[w] if u >= left else u * prices[w]
            left = max(left - u, 0)
    lb = np.maximum(lb, cover)
    return np.where(allowed & cap_ok, lb, np.inf)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases, st.data())
def test_the_kept_bound_passes_give_the_fresh_bounds_to_the_bit(case, data):
    """`lower_bounds` keeps the bounds of the problem's state per shape and patches the nodes a working state
    changed; with any set of workloads moved (their room given back) and asked again, every node's bound is
    the one a fresh pass over what is left gives, to the last bit, for the request and for each workload's own
    shape; and the few lowest of them a chain search ranks its nodes by (`_lowest_bounds`, merged from the
    state's sorted order) are the lowest of the fresh ones, in the order a stable sort gives."""
    (state, request), opts = case
    p = Problem(state, opts)
    work = Work(p)
    parts = parts_of(state, [request])
    singles = [int(w) for w in np.flatnonzero(~p.multi)]
    shapes = [parts[0], *(Part(-1, p.ws[w].request, p.shape(w), parts[0].eligible) for w in singles[:3])]
    for _ in range(3):
        for part in shapes:
            allowed = data.draw(st.sampled_from((part.eligible, np.ones(len(state.nodes), dtype=bool))))
            got = ph.lower_bounds(p, work, part, allowed)
            want = _lower_bounds_fresh(p, work, part, allowed)
            assert np.array_equal(got, want)
            # the chain search's candidates: the lowest few of the same bounds, some nodes left out
            skipped = set(data.draw(st.sets(st.integers(0, len(state.nodes) - 1), max_size=3)))
            count = data.draw(st.integers(1, 5))
            fresh = _lower_bounds_fresh(p, work, part, allowed & ~np.isin(np.arange(len(state.nodes)), list(skipped)))
            finite = np.flatnonzero(np.isfinite(fresh))
            best = finite[np.argsort(fresh[finite], kind="stable")][:count]
            lowest = ph._lowest_bounds(p, work, part, allowed, lambda c, s=skipped: c in s, count)
            assert lowest == [(float(fresh[c]), int(c)) for c in best]
        left = [w for w in singles if w not in work.moved]
        if not left:
            break
        w = data.draw(st.sampled_from(left))
        work.release(w)
        work.moved[w] = (int(p.src[w]), ())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_the_chain_sets_are_the_fitting_ones_of_the_first_sets_in_cost_order(case):
    """`_chain_sets` hands the chain the sets of a node it would have found fitting among the first
    CHAIN_SUBSETS of `cheapest_subsets`, in that order, each with the dearest cost seen since the fitting set
    before it (where the chain's loop stops is decided by those costs); asked again it gives the kept answer,
    under the full key and under the short one of a node the working state left as it was."""
    from gpudefrag.core.capacity import fits_one

    (state, request), opts = case
    p = Problem(state, opts)
    work = Work(p)
    shapes = [parts_of(state, [request])[0].shape, *(p.shape(int(w)) for w in np.flatnonzero(~p.multi))][:4]
    for c in range(len(state.nodes)):
        items = ph._movers(p, c)
        assert items == sorted((int(v) for v in p.on_node(c) if p.why_not_movable(int(v)) is None),
                               key=lambda v: (p.score[v], v))
        costs = [float(p.score[v]) for v in items]
        row, cpu, mem = work.free[c].tolist(), int(work.cpu[c]), int(work.mem[c])
        frees = ph._frees(p, items)
        for shape in shapes:
            for max_size in range(1, min(ph.CHAIN_VICTIMS, len(items)) + 1):
                want, dearest = [], -math.inf
                for k, sub in enumerate(ph.cheapest_subsets(costs, max_size)):
                    if k >= ph.CHAIN_SUBSETS:
                        break
                    dearest = max(dearest, sum(costs[j] for j in sub))
                    if fits_one(*ph._without(row, cpu, mem, frees, sub), shape):
                        want.append((sub, dearest))
                        dearest = -math.inf
                got = ph._chain_sets(p, work, c, items, max_size, shape)
                assert list(got) == want
                assert ph._chain_sets(p, work, c, items, max_size, shape) is got
                # a node as the state has it, keyed by itself alone: the same answer, kept under its own key
                clean = ph._chain_sets(p, work, c, items, max_size, shape, clean=True)
                assert list(clean) == want
                assert ph._chain_sets(p, work, c, items, max_size, shape, clean=True) is clean


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases, st.integers(1, 6))
def test_the_search_limit_cuts_only_searches_that_reach_it(case, limit):
    """`PlanOptions.search_limit`: a search that needs fewer trials gives the plan an unbounded one gives, without
    a note; one that reaches it stops there, says so (in the notes of a plan it found, or in the reason when it
    found none), and any plan it keeps is still a valid one."""
    (state, request), opts = case
    free = dataclasses.replace(opts, solver="heuristic", search_limit=10**9)
    probe = Problem(state, free)
    ph.solve(probe, parts_of(state, [request]))
    event("cut" if probe.trials > limit else "not cut")
    bounded = dataclasses.replace(free, search_limit=limit)
    got = plan_moves(state, request, bounded)
    said = " ".join(got.explain) + " " + got.reason
    if probe.trials <= limit:
        assert _key(got) == _key(plan_moves(state, request, free))
        assert "search_limit" not in said
    else:
        assert f"limit of {limit} trials" in said
        p = Problem(state, bounded)
        ph.solve(p, parts_of(state, [request]))
        assert p.cut and p.trials == limit
        if got.feasible:
            assert_valid(state, got, bounded)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases, st.data())
def test_room_bound_with_every_set_at_once_is_the_walk_in_cost_order(case, data):
    """`room_bound` tests every set of a small node at once (`_room_bound_at_once`) instead of walking them in
    order of cost: on every node, for the request's shape and for a workload's own, with no bar and with a bar
    drawn among the set costs, it must give what the walk gives (the cheapest set that makes room, the first
    cost at the bar, or inf), up to a last-bit tie between two sets."""
    (state, request), opts = case
    p = Problem(state, opts)
    work = Work(p)
    part = parts_of(state, [request])[0]
    singles = [int(w) for w in np.flatnonzero(~p.multi)]
    shapes = [part, *(Part(-1, p.ws[w].request, p.shape(w), part.eligible) for w in singles[:2])]
    at_once = 0
    for shape in shapes:
        for i in range(len(state.nodes)):
            bar = data.draw(st.one_of(st.just(math.inf), st.floats(0, 50)))
            fast = ph.room_bound(p, work, shape, i, bar)
            saved = ph.FEW_ITEMS
            ph.FEW_ITEMS = 10**6  # the walk
            try:
                walk = ph.room_bound(p, work, shape, i, bar)
            finally:
                ph.FEW_ITEMS = saved
            assert math.isinf(fast) == math.isinf(walk)
            if not math.isinf(fast):
                assert fast == pytest.approx(walk, rel=1e-12, abs=1e-12)
            items = [w for w in p.on_node(i) if p.why_not_movable(int(w)) is None]
            at_once += len(items) >= ph.FEW_ITEMS
    event(f"nodes tested at once: {min(at_once, 3)}+")


@st.composite
def packed(draw) -> tuple[ClusterState, Request]:
    """5 to 10 eight-GPU nodes, nearly every GPU held by a whole-GPU job or two shares, and a request of two to
    eight GPUs: a plan moves several workloads, and chains look at nodes an earlier move of the same trial
    changed (where the heuristic's kept per-node answers must not be used)."""
    def shares(kind: int) -> list[int]:
        return [] if kind == 0 else [1000] if kind <= 6 else draw(
            st.sampled_from(([500, 500], [250, 750], [500], [250])))

    return _held(draw, draw(st.integers(5, 10)), 8, 9, shares,
                 (Request(2), Request(3), Request(4), Request(8), Request(1, gpu_milli=750)))


def _moved_some(p: Problem, work: Work, picks: list[tuple[int, int]]) -> Work:
    """`work` with some single-node workloads moved (each pick: a workload, a node counted among those it fits
    on), as a plan's first moves would leave it."""
    from gpudefrag.core.capacity import pick_gpus

    for w, k in picks:
        if w in work.moved or p.multi[w]:
            continue
        work.release(w)
        fit = [d for d in range(len(p.state.nodes)) if d != p.src[w] and work.cap.fits_on(d, p.shape(w))]
        if not fit:
            work.cap.take(int(p.src[w]), p.ws[w].placements[0].gpus, p.shape(w))
            continue
        d = fit[k % len(fit)]
        work.move(w, d, pick_gpus(work.free[d], p.shape(w)))
    return work


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(cases, st.tuples(packed(), busy_options)), st.data())
def test_the_shortcuts_for_nodes_a_state_left_alone_change_no_plan(case, data):
    """The heuristic reads a node the working state did not change from what it kept for the problem's state
    (bounds, best-fit ranks, a chain's sets under a short key) and computes only the changed ones (`Work.dirty`)
    afresh. After a first search has filled those caches, a search from a state where some workloads moved
    already must give what a search on a fresh problem with every node counted as changed gives: the same
    moves, GPUs, score and reason."""
    (state, request), opts = case
    n_ws = len(state.running)
    picks = data.draw(st.lists(st.tuples(st.integers(0, max(n_ws - 1, 0)), st.integers(0, 20)), max_size=6)) \
        if n_ws else []
    moves = _compare_shortcuts(state, request, opts, picks)
    event(f"moves: {min(moves, 4)}")


def test_a_chain_through_a_node_changed_by_an_earlier_move_reads_its_changed_row():
    """The shortcut comparison on a case it found: a 2-GPU request on five 4-GPU nodes after two shares moved
    (w0_1, w3_1). A chain then looks at n3, which w3_1 left: read as the state has it (all its movers, its sets
    kept under the short key), it would move w3_1 a second time."""
    nodes = [Node(f"n{i}", 4, "H100") for i in range(5)]

    def job(wid: str, node: str, gpus: tuple[int, ...], milli: int = 1000) -> Workload:
        return Workload(wid, Request(len(gpus), gpu_milli=milli), placements=(Placement(node, gpus),),
                        checkpoint_bytes=0, last_checkpoint_at=10000.0)

    ws = [job("w0_0", "n0", (0, 1)), job("w0_1", "n0", (2,), 250), job("w1_0", "n1", (0, 1)),
          job("w1_1", "n1", (2,), 250), job("w2_0", "n2", (0,), 250), job("w2_1", "n2", (1, 2, 3)),
          job("w3_0", "n3", (0, 1, 2)), job("w3_1", "n3", (3,), 250), job("w4_0", "n4", (0, 1, 2))]
    state = ClusterState.build(nodes, ws, now=10000.0)
    _compare_shortcuts(state, Request(2), PlanOptions(max_moves=6, max_moves_per_node=4, fresh_checkpoint=False),
                       [(1, 0), (7, 0)])


def _compare_shortcuts(state: ClusterState, request: Request, opts: PlanOptions,
                       picks: list[tuple[int, int]]) -> int:
    """Search from the state `picks` leave (`_moved_some`) on a problem whose caches a first search filled, and
    on a fresh problem where every node counts as changed; assert the outcomes are the same. Returns the plan's
    move count (-1: no plan)."""
    parts = parts_of(state, [request])
    p = Problem(state, opts)
    ph.solve(p, parts)  # fills the caches from the state's rows
    p.trials, p.cut = 0, False  # a fresh search limit for the search compared
    got = ph.solve(p, parts, _moved_some(p, Work(p), picks))
    q = Problem(state, opts)
    every = Work(q)
    every.dirty = set(range(len(state.nodes)))
    want = ph.solve(q, parts, _moved_some(q, every, picks))
    assert (got.work is None) == (want.work is None)
    assert got.reason == want.reason
    if got.work is None or want.work is None:
        return -1
    assert got.work.order == want.work.order
    assert got.work.moved == want.work.moved
    assert [(i, g) for _, i, g in got.work.reserved] == [(i, g) for _, i, g in want.work.reserved]
    assert got.work.score == want.work.score
    return len(got.work.order)
