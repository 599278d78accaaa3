"""The fast planner for large clusters: rank target nodes by a lower bound on the cost to clear them (a
fractional-knapsack bound, NumPy over all nodes), then for the most promising ones find the cheapest set of their
workloads whose departure makes room (subsets enumerated in order of cost) and check that set fits elsewhere by
best-fit-decreasing, with chains (up to CHAIN_VICTIMS workloads of another node moved out of the way first, one
more level below that) when a displaced workload fits nowhere directly.

Requests with several parts (multi-node requests, several pending requests) are planned one part after another
on the working state, so no workload moves twice and no two parts of one request share a node.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from .capacity import Shape, fits, fits_one, pick_gpus, share_counts
from .model import MILLI
from .planner_problem import Part, Problem, Work

SUBSET_LIMIT = 400  # subsets examined per candidate node
PLACE_ATTEMPTS = 6  # fitting subsets whose placement elsewhere is tried per candidate node
CHAIN_DEPTH = 2  # a displaced workload's victims may themselves need one more chain
CHAIN_NODES = 16  # nodes examined for a chain per displaced workload (CHAIN_NODES_INNER one level down)
CHAIN_NODES_INNER = 4
CHAIN_VICTIMS = 3  # workloads moved out of the way on one node
CHAIN_SUBSETS = 32
BOUND_FACTOR = 4  # nodes whose exact room bound is checked, per node cleared in full (candidate_limit)
SMALL_NODE = 12  # room_bound checks every set of at most this many workloads at once (2**12 sets)
FEW_ITEMS = 5  # ... from this many on (fewer: walking the sets in Python is as quick)
PRUNE_BY_BEST = True  # clear_node and the chains stop a trial once it costs as much as the best plan so far


@dataclass
class Outcome:
    work: Work | None
    reason: str = ""
    notes: tuple[str, ...] = ()


def cheapest_subsets(costs: list[float], max_size: int) -> Iterator[tuple[int, ...]]:
    """Every non-empty subset of items (indices into `costs`, sorted ascending) in non-decreasing total cost,
    up to `max_size` items each."""
    k = len(costs)
    if k == 0 or max_size <= 0:
        return
    heap: list[tuple[float, int, tuple[int, ...]]] = [(costs[0], 0, (0,))]
    while heap:
        s, last, sub = heapq.heappop(heap)
        yield sub
        if last + 1 < k:
            if len(sub) < max_size:
                heapq.heappush(heap, (s + costs[last + 1], last + 1, (*sub, last + 1)))
            heapq.heappush(heap, (s - costs[last] + costs[last + 1], last + 1, (*sub[:-1], last + 1)))


def room_bound(p: Problem, work: Work, part: Part, i: int, bar: float = float("inf")) -> float:
    """A lower bound on the score of any plan that lands `part` on node i: the cheapest set of i's movable
    workloads (by their cheapest possible move) whose departure makes room. inf: no such set. Stops early,
    returning a value >= `bar`, once every set left costs at least `bar`. Plain Python on one node's row.

    Room only grows as workloads leave, so when even all of them together do not make room no set does: inf at
    once, without enumerating (a node of many small workloads has thousands of sets, and the replay in time asks
    this of hundreds of nodes per decision)."""
    items = [int(wi) for wi in p.on_node(i) if int(wi) not in work.moved and p.why_not_movable(int(wi)) is None]
    items.sort(key=lambda wi: (p.score_lb[wi], wi))
    costs = [float(p.score_lb[wi]) for wi in items]
    max_size = min(work.moves_left(), p.opts.max_moves_per_node - int(work.touched[i]), len(items))
    base = [int(x) for x in work.free[i]]
    cpu0, mem0 = int(work.cpu[i]), int(work.mem[i])
    frees = _frees(p, items)
    if not _room_within(base, cpu0, mem0, frees, max_size, part.shape):
        return float("inf")  # e.g. a node whose CPU twenty small CPU-only pods hold, and a budget of 8 moves
    if len(items) >= FEW_ITEMS and _every_set_at_once(len(items), max_size):
        return _room_bound_at_once(base, cpu0, mem0, frees, costs, max_size, part.shape, bar)
    if bar == float("inf") and not _some_set_makes_room(base, cpu0, mem0, frees, max_size, part.shape):
        return float("inf")
    for k, sub in enumerate(cheapest_subsets(costs, max_size)):
        c = sum(costs[j] for j in sub)
        if c >= bar or k >= SUBSET_LIMIT * 10:
            return c  # every cheaper set was tried and does not make room
        if fits_one(*_without(base, cpu0, mem0, frees, sub), part.shape):
            return c
    return float("inf")


def _every_set_at_once(k: int, max_size: int) -> bool:
    """Whether one node's sets of at most `max_size` of its k workloads are few enough to test all at once
    (`_sets_of`): at most SMALL_NODE workloads, and no more sets than `room_bound` would walk."""
    return k <= SMALL_NODE and sum(math.comb(k, j) for j in range(1, max_size + 1)) <= SUBSET_LIMIT * 10


def _room_bound_at_once(base: list[int], cpu: int, mem: int, frees: list[tuple[tuple[int, ...], int, int, int]],
                        costs: list[float], max_size: int, shape: Shape, bar: float) -> float:
    """`room_bound` with every set tested at once, one row per set: the cheapest set that makes room when it
    costs less than `bar`; else the cheapest cost at or above `bar` (finite: the node is dearer than the bar);
    else inf (no set makes room). What the walk in order of cost returns, since it stops at the first set that
    fits or reaches the bar and the sets come cheapest first; each set's cost is summed in the walk's order
    (item by item, ascending), so the sums are the walk's to the bit; the walk's order is by running sums
    kept in its heap, which can put two sets whose costs differ in the last bit the other way round, so in
    such a tie the two can differ by that bit. The walk was a fifth of the replay in time's decisions, in
    Python, over up to thousands of sets per node."""
    sets, ok = _set_fits(base, cpu, mem, frees, max_size, shape)
    cost = np.zeros(len(sets))
    for j, c in enumerate(costs):
        cost = cost + np.where(sets[:, j] == 1, c, 0.0)
    fit_cost = float(cost[ok].min()) if ok.any() else math.inf
    if fit_cost < bar:
        return fit_cost
    dear = cost[cost >= bar]
    return float(dear.min()) if len(dear) else math.inf


def room_possible(p: Problem, work: Work, part: Part) -> np.ndarray:
    """Per node: whether `room_bound` can be finite there, i.e. False only where even the departure of every
    workload that might move (every one the flags, and the filter when the diagnosis asked it already, allow:
    a superset of `room_bound`'s movers, so the answer is never wrongly False) leaves no room for `part`, or
    where the move budget allows no move. The same fit, vectorised over all nodes: the replay in time asks
    `room_bound` of ~250 nodes per decision, each a Python walk over the node's workloads, and 99 % of them are
    inf for that reason.

    A GPU counts as having room when its free share plus what the departing shared workloads hold on it
    suffices, or when a departing whole-GPU workload holds it (counted by that workload's GPU count: only its
    first GPU's index is in the rows)."""
    n = len(p.state.nodes)
    known = p.state.may_move_known(p.opts.movable)
    leave = (known if known is not None else p.state.may_move()) & ~p.multi
    if work.moved:
        leave[list(work.moved)] = False
    src, milli, gpus = p.src[leave], p.milli[leave], p.gpus[leave]
    cpu = work.cpu + np.bincount(src, weights=p.cpu[leave], minlength=n).astype(np.int64)
    mem = work.mem + np.bincount(src, weights=p.mem[leave], minlength=n).astype(np.int64)
    ok = work.budget_ok() if work.moves_left() > 0 else np.zeros(n, dtype=bool)
    if part.gpus == 0:
        return ok & fits(work.free, cpu, mem, part.shape)
    shared = (milli < MILLI) & (gpus > 0)
    gain = np.zeros(work.free.shape, dtype=np.int64)
    np.add.at(gain, (src[shared], p.gpu0[leave][shared]), milli[shared])
    whole = np.bincount(src[~shared], weights=gpus[~shared], minlength=n).astype(np.int64)
    counts = share_counts(work.free + gain, part.milli) + whole
    return ok & fits(work.free, cpu, mem, part.shape, counts=counts)


def _frees(p: Problem, items: list[int]) -> list[tuple[tuple[int, ...], int, int, int]]:
    """What each of one node's workloads `items` gives back when it leaves: its GPUs there, its share of each,
    its CPU and memory (the rows `_without` adds up)."""
    return [(p.ws[wi].placements[0].gpus, int(p.milli[wi]), int(p.cpu[wi]), int(p.mem[wi])) for wi in items]


def _room_within(base: list[int], cpu: int, mem: int, frees: list[tuple[tuple[int, ...], int, int, int]],
                 max_size: int, shape: Shape) -> bool:
    """False only when no set of at most `max_size` of one node's workloads (`frees`) makes room for `shape` by
    leaving: not even all of them together do (room only grows as workloads leave), or more of them than
    `max_size` must leave (`fewest_to_leave`). Two sums instead of walking the sets one by one, which is what
    `room_bound` and `_chain` would otherwise do to find none."""
    if max_size <= 0 or not fits_one(*_without(base, cpu, mem, frees, range(len(frees))), shape):
        return False
    return max_size >= len(frees) or fewest_to_leave(base, cpu, mem, frees, shape) <= max_size


def _some_set_makes_room(base: list[int], cpu: int, mem: int, frees: list[tuple[tuple[int, ...], int, int, int]],
                         max_size: int, shape: Shape) -> bool:
    """Whether some set of at most `max_size` of one node's workloads (`frees`, as `room_bound` lists them) makes
    room for `shape` when it leaves, every set at once (`_set_fits`). False only when `room_bound`'s
    enumeration would find no such set and end without a bound; True otherwise (also where the sets are too
    many to test at once), and the enumeration decides. The replay in time sends ~1,800 nodes a run here that
    no set clears (8-GPU requests, nodes whose CPU small jobs hold), each one walking up to a thousand sets in
    Python."""
    if not _every_set_at_once(len(frees), max_size):
        return True
    return bool(_set_fits(base, cpu, mem, frees, max_size, shape)[1].any())


def _set_fits(base: list[int], cpu: int, mem: int, frees: list[tuple[tuple[int, ...], int, int, int]],
              max_size: int, shape: Shape) -> tuple[np.ndarray, np.ndarray]:
    """Every set of at most `max_size` of one node's workloads (`_sets_of`, one 0/1 row per set) and whether its
    departure makes room for `shape`: the one fit (`fits`) on the node's row plus what each set gives back."""
    k = len(frees)
    gives = np.zeros((k, len(base) + 2), dtype=np.int64)  # per workload: its share on each GPU, its CPU, memory
    for j, (gs, m, c, mm) in enumerate(frees):
        gives[j, list(gs)] = m
        gives[j, -2:] = (c, mm)
    sets = _sets_of(k, max_size)
    after = sets @ gives + np.array([*base, cpu, mem], dtype=np.int64)
    return sets, fits(after[:, :-2], after[:, -2], after[:, -1], shape)


@functools.cache
def _sets_of(k: int, max_size: int) -> np.ndarray:
    """Every non-empty set of at most `max_size` of k items, one 0/1 row each (k <= SMALL_NODE)."""
    rows = (np.arange(1, 2**k)[:, None] >> np.arange(k)[None, :]) & 1
    return rows[rows.sum(axis=1) <= max_size].astype(np.int64)


def fewest_to_leave(base: list[int], cpu: int, mem: int, frees: list[tuple[tuple[int, ...], int, int, int]],
                    shape: Shape) -> int:
    """A lower bound on how many of one node's workloads (`frees`, as `room_bound` lists them) must leave it for
    `shape` to fit, from what is missing of each resource: the fewest workloads whose largest contributions
    cover it (a workload turns at most its own GPUs into ones with room). Sound, not tight: when it exceeds the
    move budget no set within the budget makes room, and `room_bound` need not enumerate thousands of sets to
    find that out (the replay in time asks it of hundreds of nodes per decision)."""
    have = sum(1 for x in base if x >= shape.gpu_milli) if shape.num_gpu else 0
    fewest = 0
    for missing, gives in ((shape.cpu_milli - cpu, [c for _, _, c, _ in frees]),
                           (shape.memory_mib - mem, [m for _, _, _, m in frees]),
                           (shape.num_gpu - have, [len(g) for g, _, _, _ in frees])):
        if missing <= 0:
            continue
        gives.sort(reverse=True)
        total, k = 0, 0
        while total < missing and k < len(gives):
            total += gives[k]
            k += 1
        fewest = max(fewest, k if total >= missing else len(gives) + 1)
    return fewest


def _without(base: list[int], cpu: int, mem: int, frees: list[tuple[tuple[int, ...], int, int, int]],
             sub: Iterable[int]) -> tuple[list[int], int, int]:
    """One node's free row, CPU and memory once the workloads `sub` (indices into `frees`) have left it."""
    row = list(base)
    for j in sub:
        gs, m, dc, dm = frees[j]
        for g in gs:
            row[g] += m
        cpu += dc
        mem += dm
    return row, cpu, mem


def lower_bounds(p: Problem, work: Work, part: Part, allowed: np.ndarray,
                 scores: np.ndarray | None = None) -> np.ndarray:
    """Per node, a lower bound on the score of clearing room for `part` there (inf: impossible or not allowed).

    Each GPU that must be freed needs at least one workload moved: a whole-GPU workload frees its GPUs at
    score/GPUs each, a shared one at most one GPU for its whole score. The bound is the cheapest fractional
    cover of the missing GPUs by those prices (a fractional knapsack), and at least the node's cheapest single
    move.

    A node's bound reads only that node: its free row and which of its workloads moved already. So the bounds
    of the problem's own state are made once per part shape and score vector (`_bounds_on` over every node),
    and a working state patches only the nodes it changed (`Work.dirty`): a chain search asks this hundreds of
    times per decision, and a pass over every node and workload was most of a decision's time on 5,000 nodes
    (issue 27). Patched or not, a node's bound is the same function of the same numbers, to the last bit."""
    sc = p.score if scores is None else scores
    lb = _state_bounds(p, sc, part)
    if work.dirty:
        lb = lb.copy()
        nodes = np.fromiter(work.dirty, dtype=np.int64, count=len(work.dirty))
        lb[nodes] = _bounds_on(p, _bound_base(p, sc), part, nodes, work.free[nodes], work.moved)
    return np.where(allowed, lb, np.inf)


def _state_bounds(p: Problem, sc: np.ndarray, part: Part) -> np.ndarray:
    """`lower_bounds` on the problem's own state, every node: kept per score vector and part shape."""
    key = ("bounds", id(sc), part.gpus, part.milli)
    kept = p.memo.get(key)
    if kept is None or kept[0] is not sc:
        every = np.arange(len(p.state.nodes))
        kept = p.memo[key] = (sc, _bounds_on(p, _bound_base(p, sc), part, every, p.state.free_milli, frozenset()))
    return kept[1]  # type: ignore[no-any-return]


def _lowest_bounds(p: Problem, work: Work, part: Part, targets: np.ndarray, skip: Callable[[int], bool],
                   count: int) -> list[tuple[float, int]]:
    """The `count` nodes of `targets` with the lowest finite `lower_bounds` for `part` in the working state,
    lowest first (ties: node number), leaving out the nodes `skip` names: what a chain search ranks its
    candidate nodes by. The nodes the state left as they were come in the order of the problem's state, sorted
    once per targets mask and shape; only the nodes it changed are bounded afresh and merged in. A chain
    search ran a bound over every node and a sort of them for its 16 best: most of its time at 5,000 nodes."""
    key = ("bound_order", id(targets), part.gpus, part.milli)
    kept = p.memo.get(key)
    if kept is None or kept[0] is not targets:
        lb = _state_bounds(p, p.score, part)
        idx = np.flatnonzero(targets & np.isfinite(lb))
        idx = idx[np.argsort(lb[idx], kind="stable")]
        kept = p.memo[key] = (targets, list(zip(lb[idx].tolist(), idx.tolist(), strict=True)))
    dirty = work.dirty
    out: list[tuple[float, int]] = []
    for v, c in kept[1]:
        if len(out) >= count:
            break
        if c not in dirty and not skip(c):
            out.append((v, c))
    mine = [c for c in dirty if targets[c] and not skip(c)]
    if mine:
        nodes = np.array(mine, dtype=np.int64)
        got = _bounds_on(p, _bound_base(p, p.score), part, nodes, work.free[nodes], work.moved)
        out.extend((float(v), c) for v, c in zip(got.tolist(), mine, strict=True) if math.isfinite(v))
        out.sort()
    return out[:count]


def _bounds_on(p: Problem, b: _BoundBase, part: Part, nodes: np.ndarray, free: np.ndarray,
               moved: Container[int]) -> np.ndarray:
    """`lower_bounds` on the nodes `nodes`, whose free rows are `free`, with the workloads `moved` gone from
    them. One formula for the whole cluster and for the few nodes a working state changed."""
    if len(nodes) == len(p.state.nodes) and not moved:
        min_ratio, min_item, capacity, shared = b.min_ratio, b.min_item, b.capacity, b.shared
        seg = np.arange(len(b.src))  # the price order of every node, whole
        starts, ends = b.starts, b.ends
    else:
        ws = [int(v) for c in nodes.tolist() for v in p.on_node(c).tolist() if int(v) not in moved]
        min_ratio, min_item, capacity, shared = _node_stats(p, b.ratio, b.item, b.holds, b.frac,
                                                            np.array(ws, dtype=np.int64), nodes)
        seg = np.concatenate([np.arange(b.starts[c], b.ends[c]) for c in nodes.tolist()] or [np.zeros(0, int)])
        lens = b.ends[nodes] - b.starts[nodes]
        ends = np.cumsum(lens)
        starts = ends - lens
    units, unit_cost = b.units[seg], b.unit_cost[seg]
    if moved:
        gone = np.fromiter((v in moved for v in b.order[seg].tolist()), dtype=bool, count=len(seg))
        units = np.where(gone, 0, units)
        unit_cost = np.where(gone, 0.0, unit_cost)
    have = (free >= part.milli).sum(axis=1)
    need = np.maximum(part.gpus - have, 0)
    partly = (free > 0) & (free < MILLI)
    cap_ok = have + capacity + (shared | partly).sum(axis=1) >= part.gpus
    lb = np.maximum(min_item, need * np.where(np.isfinite(min_ratio), min_ratio, 0.0))
    lb = np.maximum(lb, _cover_cost(units, unit_cost, b.price[seg], starts, ends, need))
    return np.where(cap_ok, lb, np.inf)


@dataclass(frozen=True)
class _BoundBase:
    """What `lower_bounds` reads of the workloads alone, for one problem and score vector: per workload its price
    per GPU freed (`ratio`), its score (`item`, inf for a multi-node one), the GPUs it holds whole (`holds`),
    whether it shares a GPU it could vacate (`frac`); per node the minima and sums of those over its single-node
    workloads (`_node_stats`); and the single-node workloads that can free a GPU in price order
    (`_price_order`: `order`) with their nodes, units, units × price and price, and where each node's run of
    them starts and ends."""

    ratio: np.ndarray
    item: np.ndarray
    holds: np.ndarray
    frac: np.ndarray
    min_ratio: np.ndarray
    min_item: np.ndarray
    capacity: np.ndarray
    shared: np.ndarray
    order: np.ndarray
    src: np.ndarray
    units: np.ndarray
    unit_cost: np.ndarray
    price: np.ndarray
    starts: np.ndarray
    ends: np.ndarray


def _bound_base(p: Problem, scores: np.ndarray) -> _BoundBase:
    key = ("bound_base", id(scores))
    got = p.memo.get(key)
    if got is not None and got[0] is scores:
        return got[1]  # type: ignore[no-any-return]
    n = len(p.state.nodes)
    single = ~p.multi
    by_price, units, ratio = _price_order(p, scores)  # ratio: every workload's price per GPU freed
    item = np.where(single, scores, np.inf)
    holds = np.where(single & (p.milli >= MILLI), p.gpus, 0)
    frac = single & (p.milli < MILLI) & (p.gpu0 >= 0)
    s_src = p.src[by_price]
    base = _BoundBase(ratio, item, holds, frac,
                      *_node_stats(p, ratio, item, holds, frac, np.flatnonzero(single), np.arange(n)),
                      by_price, s_src, units[by_price], units[by_price] * ratio[by_price], ratio[by_price],
                      np.searchsorted(s_src, np.arange(n)), np.searchsorted(s_src, np.arange(n), side="right"))
    p.memo[key] = (scores, base)
    return base


def _node_stats(p: Problem, ratio: np.ndarray, item: np.ndarray, holds: np.ndarray, frac: np.ndarray,
                ws: np.ndarray, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per node of `nodes`, over the single-node workloads `ws` (all of them on those nodes): the cheapest price
    per GPU freed and move, the GPUs held whole, and which GPUs a shared workload could vacate (from the per
    workload `ratio`, `item`, `holds` and `frac` of `_BoundBase`)."""
    local = np.full(len(p.state.nodes), -1, dtype=np.int64) if len(nodes) < len(p.state.nodes) else None
    if local is not None:
        local[nodes] = np.arange(len(nodes))
        at = local[p.src[ws]]
    else:
        at = p.src[ws]
    m = len(nodes)
    min_ratio = np.full(m, np.inf)
    np.minimum.at(min_ratio, at, ratio[ws])
    min_item = np.full(m, np.inf)
    np.minimum.at(min_item, at, item[ws])
    capacity = np.zeros(m, dtype=np.int64)
    np.add.at(capacity, at, holds[ws])
    shared = np.zeros((m, p.state.free_milli.shape[1]), dtype=bool)
    fr = frac[ws]
    shared[at[fr], p.gpu0[ws][fr]] = True
    return min_ratio, min_item, capacity, shared


def _price_order(p: Problem, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The single-node workloads that can free a GPU, by node and then by price per GPU freed (ties: workload
    number), with every workload's units (GPUs it frees) and price: what `_cover_cost` buys from. Made once per
    problem and score vector, inside `_bound_base`. Leaving out the workloads moved already keeps the order of
    the rest (the sort is stable and the keys are per workload)."""
    whole = (p.milli >= MILLI) & (p.gpus > 0)
    prices = np.where(whole, scores / np.maximum(p.gpus, 1), scores)
    units = np.where(p.milli >= MILLI, p.gpus, 1)
    idx = np.flatnonzero(~p.multi & (units > 0))
    return idx[np.lexsort((prices[idx], p.src[idx]))], units, prices


def _cover_cost(units: np.ndarray, unit_cost: np.ndarray, price: np.ndarray, starts: np.ndarray,
                ends: np.ndarray, need: np.ndarray) -> np.ndarray:
    """Per node, the cheapest way to buy `need` units from that node's items (its run `starts:ends` of the
    items, in price order; each `units` at `price` per unit, the last one bought fractionally; a moved one has
    0 units at 0 cost); 0 where nothing is needed, and the whole stock where it is too small (the capacity
    check rules those nodes out). Summed item by item along each node's run, all nodes at once: as many steps
    as the most items one node needs (a handful; each frees at least one GPU), and each node's sum is the same
    to the bit whichever nodes are summed beside it."""
    cost = np.zeros(len(need))
    left = need.astype(np.int64)
    at = starts.copy()
    while True:
        go = np.flatnonzero((left > 0) & (at < ends))
        if not len(go):
            return cost
        k = at[go]
        u = units[k]
        last = u >= left[go]
        cost[go] += np.where(last, left[go] * price[k], unit_cost[k])
        left[go] = np.where(last, 0, left[go] - u)
        at[go] += 1


def _best_fit(p: Problem, work: Work, wi: int, forbid: np.ndarray) -> int | None:
    """The node a released workload moves to directly: of the nodes it may go to (its targets, not forbidden,
    within the move budget, not its own) where it fits, the fullest (fewest whole GPUs left after it, then the
    least room; ties: node number). The nodes the working state left as they were rank as on the problem's
    state, kept once per targets and shape (`_fit_order`); only the ones it changed are ranked afresh. A
    decision places thousands of workloads, and a pass over every node each time was a third of a decision's
    time on 5,000 nodes."""
    if p.opts.max_moves_per_node <= 0:
        return None
    shape = p.shape(wi)
    targets = p.targets_mask(wi)
    order, left, tie = _fit_order(p, targets, shape)
    src = int(p.src[wi])
    dirty = work.dirty
    best: tuple[int, int, int] | None = None
    for k, i in enumerate(order):
        if i not in dirty and i != src and not forbid[i]:
            best = (left[k], tie[k], i)
            break
    cand = [c for c in dirty if targets[c] and not forbid[c] and c != src
            and work.touched[c] < p.opts.max_moves_per_node]
    if cand:
        idx = np.array(cand, dtype=np.int64)
        idx = idx[fits(work.free[idx], work.cpu[idx], work.mem[idx], shape)]
        if len(idx):
            lf, ti = _fit_rank(work.free[idx], shape)
            k = int(np.lexsort((idx, ti, lf))[0])
            mine = (int(lf[k]), int(ti[k]), int(idx[k]))
            best = mine if best is None or mine < best else best
    return None if best is None else best[2]


def _fit_order(p: Problem, targets: np.ndarray, shape: Shape) -> tuple[list[int], list[int], list[int]]:
    """The nodes of `targets` where `shape` fits on the problem's state, in `_best_fit`'s order, with their
    ranks; made once per problem, targets mask and shape."""
    key = ("fit_order", id(targets), shape)
    got = p.memo.get(key)
    if got is None or got[0] is not targets:
        st = p.state
        idx = np.flatnonzero(targets)
        idx = idx[fits(st.free_milli[idx], st.cpu_free[idx], st.mem_free[idx], shape)]
        lf, ti = _fit_rank(st.free_milli[idx], shape)
        by = np.lexsort((idx, ti, lf))
        got = p.memo[key] = (targets, (idx[by].tolist(), lf[by].tolist(), ti[by].tolist()))
    return got[1]  # type: ignore[no-any-return]


def _fit_rank(rows: np.ndarray, shape: Shape) -> tuple[np.ndarray, np.ndarray]:
    """`_best_fit`'s rank of nodes with these free rows (lower is fuller): a share goes to the GPU it leaves the
    least on, keeping whole GPUs whole; whole GPUs to the node left with the fewest fitting GPUs, then the least
    room."""
    milli = shape.gpu_milli
    if shape.num_gpu == 1 and milli < MILLI:
        return np.where(rows >= milli, rows - milli, MILLI + 1).min(axis=1), (rows >= MILLI).sum(axis=1)
    return (rows >= milli).sum(axis=1) - shape.num_gpu, np.where(rows > 0, rows, 0).sum(axis=1)


def _place(p: Problem, work: Work, wi: int, forbid: np.ndarray, depth: int = CHAIN_DEPTH,
           limit: float = math.inf) -> bool:
    """Move a released workload to its best-fitting node, or through a chain (move some of another node's
    workloads away first, themselves placed the same way one level down). False: it fits nowhere, or only
    through chains that leave the score at `limit` or above (see `_chain`)."""
    dst = _best_fit(p, work, wi, forbid)
    if dst is not None:
        gp = pick_gpus(work.free[dst], p.shape(wi))
        assert gp is not None
        work.move(wi, dst, gp)
        return True
    if depth <= 0 or work.moves_left() < 2:
        return False
    best = _chain(p, work, wi, forbid, depth, limit)
    if best is None:
        return False
    work.assign(best)
    return True


def _chain(p: Problem, work: Work, wi: int, forbid: np.ndarray, depth: int,
           limit: float = math.inf) -> Work | None:
    """The cheapest way found to make room for `wi` on some node C by moving up to CHAIN_VICTIMS of C's
    workloads elsewhere first. Returns the working state with all those moves made, or None.

    `limit`: a score at or above which no plan is of use to the caller (the best plan so far, less the
    planner's tolerance). Move scores are never negative, so a trial whose score reaches it stays there: the
    search drops it, and skips every node and set whose lower bound reaches it, as it does for its own best.
    Whenever the search without a limit finds a chain scoring below it, this one finds the same chain (every
    trial of that chain stays below the limit, so no step of it is dropped, and every cheaper trial the search
    compares it with was tried by both); otherwise it returns None where that one returned a chain of no use.

    The search is a function of the working state it reads (free arrays, move counts, the moves so far and the
    score) and of `wi`, `forbid` and `depth`, nothing else: one decision asks the same search again and again
    (clear_node's two orders, sets of one node that displace the same workload first, the same victim of
    several chains; a third of the searches on the replay in time), so each answer is kept for the decision's
    problem, keyed by all of that, and handed out as a copy carrying the asker's own reservations."""
    key = (_state_key(work), tuple(work.moved.items()), work.score, wi, forbid.tobytes(), depth, limit)
    memo: dict[tuple[object, ...], Work | None] = p.memo.setdefault(("chain",), {})
    if key in memo:
        kept = memo[key]
        if kept is None:
            return None
        out = kept.clone()
        out.reserved = list(work.reserved)
        return out
    best = _chain_search(p, work, wi, forbid, depth, limit)
    memo[key] = None if best is None else best.clone()
    return best


def _state_key(work: Work) -> tuple[object, ...]:
    """The working state's arrays as a key: the rows (free GPUs, CPU, memory, moves) of the nodes it changed;
    every other row is the problem's. Finer than the arrays themselves (a node changed and changed back keys
    apart), which costs a kept answer now and then, never a wrong one, and a tenth of copying every row."""
    nodes = sorted(work.dirty)
    return (tuple(nodes), work.free[nodes].tobytes(), work.cpu[nodes].tobytes(), work.mem[nodes].tobytes(),
            work.touched[nodes].tobytes())


def _chain_search(p: Problem, work: Work, wi: int, forbid: np.ndarray, depth: int, limit: float) -> Work | None:
    """`_chain` without the memo."""
    w = p.ws[wi]
    budget = p.opts.max_moves_per_node
    own = float(p.score[wi])
    if budget < 2 or work.score + own >= limit:
        return None  # no node can take two more moves, or its own move alone takes the score to the limit
    wshape = p.shape(wi)
    targets = p.targets_mask(wi)
    src, touched = int(p.src[wi]), work.touched

    def skip(c: int) -> bool:
        return c == src or bool(forbid[c]) or int(touched[c]) + 2 > budget

    order = _lowest_bounds(p, work, Part(-1, w.request, wshape, targets), targets, skip,
                           CHAIN_NODES if depth == CHAIN_DEPTH else CHAIN_NODES_INNER)
    best: Work | None = None
    f2 = forbid.copy()
    moves_left = work.moves_left()
    for lb_c, c in order:
        if work.score + lb_c + own >= _bar(best, limit):
            break
        # a node the working state left as it was: nothing moved off or onto it, and `wi` is not its own
        clean = c not in work.dirty
        items = _movers(p, c) if clean else [v for v in _movers(p, c) if v != wi and v not in work.moved]
        max_size = min(CHAIN_VICTIMS, moves_left - 1, budget - 1 - int(work.touched[c]), len(items))
        if max_size <= 0 or work.score + float(p.score[items[0]]) + own >= _bar(best, limit):
            continue  # no set, or even the cheapest one (the first tried) costs too much: the loop below ends at once
        tries = 0
        for sub, dearest in _chain_sets(p, work, c, items, max_size, wshape, clean):
            if tries >= 2 or work.score + dearest + own >= _bar(best, limit):
                break
            if not p.spend():
                break
            victims = [items[j] for j in sub]
            tries += 1
            trial = work.clone()
            for v in victims:
                trial.release(v)
            f2[c] = True
            placing = sorted(victims, key=lambda v: (-p.gpus[v], -p.milli[v], v))
            rests = _still_to_move(p, placing, own)
            ok = all(trial.moves_left() >= 2 and _place(p, trial, v, f2, depth - 1, limit - rest)
                     and trial.score < limit - rest for v, rest in zip(placing, rests, strict=True))
            f2[c] = forbid[c]
            gp = pick_gpus(trial.free[c], wshape) if ok else None
            if gp is None or trial.moves_left() < 1 or trial.touched[c] + 1 > budget:
                continue
            trial.move(wi, c, gp)
            if trial.score < _bar(best, limit):
                best = trial
        if p.cut:
            break
    return best


def _movers(p: Problem, c: int) -> list[int]:
    """Node c's movable workloads, cheapest first (ties: workload number), on the problem's state: what a chain
    may move out of the way, less the ones moved already. Made once per problem."""
    key = ("movers", c)
    got = p.memo.get(key)
    if got is None:
        got = p.memo[key] = sorted((int(v) for v in p.on_node(c) if p.why_not_movable(int(v)) is None),
                                   key=lambda v: (p.score[v], v))
    return got  # type: ignore[no-any-return]


def _chain_sets(p: Problem, work: Work, c: int, items: list[int], max_size: int,
                shape: Shape, clean: bool = False) -> tuple[tuple[tuple[int, ...], float], ...]:
    """The sets of node c's `items` (indices, cheapest first) a chain tries to move out of the way for `shape`:
    of the first CHAIN_SUBSETS sets of at most `max_size` in order of cost (`cheapest_subsets`), the ones whose
    departure makes room on c's row of `work`, in that order, each with the dearest cost of the sets up to it
    since the one before (the chain stops at the first set, fitting or not, that costs too much: those costs
    decide where, to the bit). A function of c's row, CPU and memory, the items, `max_size` and `shape`, kept
    per decision: the chains of one decision ask the same node the same question hundreds of times (the replay
    in time spent a third of its decisions enumerating and testing these sets in Python). `clean`: c is as
    the problem's state has it (not in `Work.dirty`) and `items` are all its movers, so c, `max_size` and
    `shape` are the whole key (most nodes a chain looks at: building the full key was a tenth of a decision)."""
    row = work.free[c]
    key = (("chain_sets", c, max_size, shape) if clean
           else ("chain_sets", c, max_size, shape, tuple(items), row.tobytes(), int(work.cpu[c]), int(work.mem[c])))
    got = p.memo.get(key)
    if got is not None:
        return got  # type: ignore[no-any-return]
    cpu0, mem0 = int(work.cpu[c]), int(work.mem[c])
    out: list[tuple[tuple[int, ...], float]] = []
    frees = _frees(p, items)
    base = row.tolist()
    if _room_within(base, cpu0, mem0, frees, max_size, shape):
        dearest = -math.inf
        for sub, cost in _first_sets(p, items, max_size):
            dearest = max(dearest, cost)
            if fits_one(*_without(base, cpu0, mem0, frees, sub), shape):
                out.append((sub, dearest))
                dearest = -math.inf
    got = p.memo[key] = tuple(out)
    return got


def _first_sets(p: Problem, items: list[int], max_size: int) -> list[tuple[tuple[int, ...], float]]:
    """The first CHAIN_SUBSETS sets of at most `max_size` of `items` in order of cost (`cheapest_subsets` on
    their scores), each with its cost summed as the chain sums it; kept per problem (a node's movers are the
    same while its row changes)."""
    key = ("first_sets", tuple(items), max_size)
    got = p.memo.get(key)
    if got is None:
        costs = [float(p.score[v]) for v in items]
        got = p.memo[key] = [(sub, sum(costs[j] for j in sub))
                             for sub in itertools.islice(cheapest_subsets(costs, max_size), CHAIN_SUBSETS)]
    return got  # type: ignore[no-any-return]


def _still_to_move(p: Problem, order: list[int], then: float = 0.0) -> list[float]:
    """Per workload of `order` (placed one after another), the least the ones after it add to the score (each
    moves at least at its own price), plus `then`: a trial placing that workload is of no use once its score
    reaches the limit less this."""
    out: list[float] = []
    rest = then
    for wi in reversed(order):
        out.append(rest)
        rest += float(p.score[wi])
    return out[::-1]


def _bar(best: Work | None, limit: float) -> float:
    """The score a trial must stay below to be of use: under the best so far by more than the planner's
    tolerance, and under the caller's limit."""
    return limit if best is None else min(limit, best.score - 1e-9)


def clear_node(p: Problem, work: Work, part: Part, i: int, forbid: np.ndarray,
               limit: float = math.inf) -> tuple[Work | None, str]:
    """The cheapest way found to make room for `part` on node i: (new working state, "") or (None, why not).

    `limit`: the caller holds a plan already and wants one scoring below this (see `_chain`). A trial that
    reaches it is dropped at once, as one that fails. Where the search without a limit would have stopped after
    such a trial (it succeeded, at a score of no use), this one goes on to the other order, which can only add
    a cheaper plan; every plan below the limit that search finds, this one finds."""
    cheaper = "" if limit == math.inf else " at a score below the best plan's"
    items: list[int] = []
    blocked: list[str] = []
    for wi in p.on_node(i):
        wi = int(wi)
        if wi in work.moved:
            continue
        why = p.why_not_movable(wi)
        if why is None:
            items.append(wi)
        else:
            blocked.append(f"{p.label(wi)}: {why}")
    items.sort(key=lambda wi: (p.score[wi], wi))
    costs = [float(p.score[wi]) for wi in items]
    max_size = min(work.moves_left(), p.opts.max_moves_per_node - int(work.touched[i]), len(items))
    attempts = 0
    reason = "no set of its movable workloads makes room"
    best: Work | None = None
    # the node's row once, as numbers, and each set's fit on it in plain Python (`_without`, `fits_one`: the
    # capacity model's fit, without a release and rollback per set)
    row, cpu0, mem0 = work.free[i].tolist(), int(work.cpu[i]), int(work.mem[i])
    frees = _frees(p, items)
    for k, sub in enumerate(cheapest_subsets(costs, max_size)):
        if k >= SUBSET_LIMIT or attempts >= PLACE_ATTEMPTS:
            break
        cost = sum(costs[j] for j in sub)
        if best is not None and cost >= best.score - work.score - 1e-9:
            break  # the sets only get dearer: a chain in the best so far cannot be beaten any more
        if work.score + cost >= limit:
            if not attempts:
                reason = "no set of its workloads cheaper than the best plan so far makes room"
            break
        if not fits_one(*_without(row, cpu0, mem0, frees, sub), part.shape):
            continue
        chosen = [items[j] for j in sub]
        attempts += 1
        f2 = forbid.copy()
        f2[i] = True
        decreasing = sorted(chosen, key=lambda w: (-p.gpus[w], -p.milli[w], -p.cpu[w], w))
        # best-fit decreasing first; if a displaced workload is left without room, the reverse order (small
        # ones first, so the big one's chain does not take the room they needed)
        for order in (decreasing, decreasing[::-1]):
            if not p.spend():
                break
            trial = work.clone()
            for wi in chosen:
                trial.release(wi)
            gp = pick_gpus(trial.free[i], part.shape)
            assert gp is not None
            trial.reserve(part, i, gp)
            ok = True
            for wi, rest in zip(order, _still_to_move(p, order), strict=True):
                if (trial.moves_left() < 1 or not _place(p, trial, wi, f2, limit=limit - rest)
                        or trial.score >= limit - rest):
                    ok = False
                    reason = f"{p.label(wi)} fits on no other node{cheaper}"
                    refused = p.excluded_by_compat(wi, limit=1)
                    if refused:
                        reason += f" (the compatibility gate refuses some: {refused[0]})"
                    if trial.moves_left() < 1:
                        reason = f"more than {p.opts.max_moves} moves needed"
                    break
            if ok and (best is None or trial.score < best.score - 1e-9):
                best = trial
            if ok or len(order) < 2:
                break
        if p.cut:
            break
    if best is not None:
        return best, ""
    if not items:
        reason = "nothing on it may move" + (f" ({'; '.join(blocked[:3])})" if blocked else "")
    elif max_size <= 0:
        reason = "its move budget is spent"
    return None, reason


def plan_part(p: Problem, work: Work, part: Part, same_request_nodes: set[int]) -> Outcome:
    """Room for one part: reuse free room if it fits already, else clear the cheapest candidate node."""
    allowed = part.eligible.copy()
    if same_request_nodes:
        allowed[list(same_request_nodes)] = False
    fit = allowed & fits(work.free, work.cpu, work.mem, part.shape)
    if fit.any():
        idx = np.flatnonzero(fit)
        left = (work.free[idx] >= part.milli).sum(axis=1)
        i = int(idx[np.lexsort((idx, left))[0]])
        gp = pick_gpus(work.free[i], part.shape)
        assert gp is not None
        work = work.clone()
        work.reserve(part, i, gp)
        return Outcome(work, notes=(f"{part.request.label()} fits on {p.name(i)} without moves",))
    if not allowed.any():
        return Outcome(None, "no node is eligible for the request (GPU model, selector, taints, size)")
    lb = lower_bounds(p, work, part, allowed)
    finite = np.flatnonzero(np.isfinite(lb))
    if len(finite) == 0:
        return Outcome(None, "no node can be cleared: every candidate holds too many unmovable GPUs "
                             "(multi-node or filtered workloads)")
    have = (work.free[finite] >= part.milli).sum(axis=1)
    order = finite[np.lexsort((finite, -have, lb[finite]))][: p.opts.candidate_limit * BOUND_FACTOR]
    best: Work | None = None
    reasons: list[str] = []
    forbid = np.zeros(len(p.state.nodes), dtype=bool)
    possible = room_possible(p, work, part)
    # trials are dropped at the best plan's score only where the default prices are lower bounds of every move
    # (no link faster than the default one), so that the lower bounds the searches compare with it hold
    prune = PRUNE_BY_BEST and p.score_lb is p.score
    cleared = 0
    for i in order:
        if p.cut:
            break
        i = int(i)
        bar = np.inf if best is None else best.score - work.score
        limit = math.inf if best is None or not prune else best.score - 1e-9
        if lb[i] >= bar or cleared >= p.opts.candidate_limit:
            break
        rb = room_bound(p, work, part, i, bar) if possible[i] else np.inf
        if rb >= bar:
            if not np.isfinite(rb):
                reasons.append(f"{p.name(i)}: no set of at most "
                               f"{min(work.moves_left(), p.opts.max_moves_per_node)} of its movable workloads "
                               "makes room")
            continue  # even its cheapest way to make room costs more than the best plan so far
        cleared += 1
        trial, why = clear_node(p, work, part, i, forbid, limit)
        if trial is None:
            reasons.append(f"{p.name(i)}: {why}")
            continue
        if best is None or trial.score < best.score - 1e-9:
            best = trial
    if best is None:
        head = "no node can be cleared"
        return Outcome(None, f"{head}: " + "; ".join(reasons[:4]) + ("; ..." if len(reasons) > 4 else ""),
                       tuple(reasons))
    return Outcome(best, notes=tuple(reasons))


def solve(p: Problem, parts: list[Part], work: Work | None = None) -> Outcome:
    work = work or Work(p)
    used: dict[int, set[int]] = {}
    notes: list[str] = []
    for part in parts:
        out = plan_part(p, work, part, used.setdefault(part.req, set()))
        if out.work is None:
            reason = out.reason + (f" ({_cut(p)})" if p.cut else "")
            return Outcome(None, reason, tuple(notes) + out.notes)
        work = out.work
        used[part.req].add(work.reserved[-1][1])
        notes.extend(out.notes)
    if p.cut:
        notes.append(f"{_cut(p)}: a cheaper plan may exist")
    return Outcome(work, notes=tuple(notes))


def _cut(p: Problem) -> str:
    return f"the search stopped at its limit of {p.opts.search_limit} trials (planner search_limit)"
