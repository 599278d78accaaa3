"""Pool repacking: an exact repack of a few dozen partly used GPUs, to make room for one failing pod.

When FGD has saturated a cluster its sharing GPUs hold pairs such as 470 + 320 (210 milli free), 650 + 230 (120),
550 + 320 (130), 590 + 230 (180): no hole is big enough for any pod, so single moves and ejection chains (which
only push smaller pods into holes) find nothing, yet the same pods packed differently leave whole GPUs free
(470 + 470 | 650 + 320 | 320 + 320 + 230 ...). `pool_repack` takes `pool` partly used GPUs with the most share
free, of as many different contents as possible (twenty 590 + 230 GPUs can never free one; a mix often can),
and asks CP-SAT for an assignment of their pods plus the failing pod to those GPUs that respects every GPU's
1000 milli, every node's memory and every pod's GPU models, with the fewest pods changing GPU (at most the
search's move limit). The failing pod is one GPU: a sharing pod, or a
whole one-GPU pod (size 1000, so its GPU must be emptied). Pools whose shares provably cannot pack (the arc-flow
LP) are refused before CP-SAT, and CP-SAT runs on deterministic time only, so a replay is reproducible.

CPU is what blocks most repacks: the GPUs with the most share free are free *because* their nodes' CPU is
exhausted. So a node may go over its CPU budget by a deficit that CPU relief (`sim/cpu_relief.py`: moving
CPU-only pods away, trading heavy pods for lighter twins elsewhere) can plausibly cover; each core of deficit
costs a quarter move in the objective. The relief runs first; a node whose relief falls short is re-solved
without a deficit (three tries). Everything is applied through `Search`, so the caller's move accounting and
exact undo apply.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
from ortools.sat.python import cp_model

from ..core.model import MILLI
from ..core.placement import Choice, Pod
from .bound import shares_may_fit
from .costs import GIB, checkpoint_bytes
from .cpu_relief import make_room, relief_potential, twins_of

if TYPE_CHECKING:
    from .search import Search


def covered(dims: tuple[int, ...], failed) -> bool:
    """Is a pod of these (share, CPU, memory) at least as large as one that already failed on the same state?
    Then it fails too, and is not searched again."""
    return any(all(a >= b for a, b in zip(dims, f, strict=True)) for f in failed)


def bins_needed(sizes: list[int], cap: int = MILLI) -> int:
    """Martello and Toth's L2 lower bound on the GPUs (bins of `cap`) that items of these shares need. For each
    threshold K ≤ cap/2: items above cap − K need a GPU each and share it with nothing of size ≥ K; items in
    (cap/2, cap − K] need a GPU each too; items in [K, cap/2] fill the room those leave, then whole GPUs."""
    half = cap / 2
    best = 0
    for k in {0, *(w for w in sizes if w <= half)}:
        big = sum(1 for w in sizes if w > cap - k)
        mid = [w for w in sizes if half < w <= cap - k]
        small = sum(w for w in sizes if k <= w <= half)
        room = len(mid) * cap - sum(mid)
        best = max(best, big + len(mid) + max(0, -(-(small - room) // cap)))
    return best


@lru_cache(maxsize=4096)
def shares_fit(sizes: tuple[int, ...], bins: int) -> bool:
    """False when items of these shares provably cannot all go into `bins` GPUs, whatever CPU, memory or the move
    limit allow: Martello and Toth's L2 first (counting), then the arc-flow LP (sim/bound.py). About two thirds
    of the pools CP-SAT was asked to repack in a saturated replay fail this way, and CP-SAT, unable to prove
    it in its time limit, spent its whole limit on each. A pure function of the multiset of shares: cached."""
    return bins_needed(list(sizes)) <= bins and shares_may_fit(dict(Counter(sizes)), bins)


def pool_gpus(s: Search, pool: int) -> list[tuple[int, int]]:
    """Partly used GPUs with the most share free (a tie: the node with the most CPU free), one of each content
    in turn, leaving out a GPU whose single pod sits beside a piece under 200 milli (an 810-milli pod and its
    190: nothing in such a GPU can go anywhere, and late in a saturated run they would fill every pool)."""
    cl = s.cl
    free = cl.free
    ok = (free > 0) & (free < MILLI) & ~((s.placed.npods == 1) & (free < 200))
    rows, cols = np.nonzero(ok)
    if len(rows) == 0:
        return []
    order = np.lexsort((-cl.cpu_free[rows], -free[rows, cols]))
    # round robin over GPU contents (the multiset of shares): a pool of twenty (590 + 230) GPUs can never free
    # one, a mixed pool often can
    classes: dict[tuple[int, ...], list[int]] = {}
    for i in order[: 64 * pool]:
        n, g = int(rows[i]), int(cols[i])
        key = s.placed.content(n, g)
        classes.setdefault(key, []).append(int(i))
        if len(classes) >= pool:
            break  # the first GPU of each of `pool` contents already fills the pool: the rest is not read
    picked: list[int] = []
    queues = list(classes.values())
    depth = 0
    while len(picked) < pool and any(depth < len(q) for q in queues):
        picked.extend(q[depth] for q in queues if depth < len(q))
        depth += 1
    return [(int(rows[i]), int(cols[i])) for i in picked[:pool]]


def pool_repack(s: Search, pod: Pod, pool: int, dtime: float, movable: Callable[[Pod], bool] | None = None,
                memo: dict | None = None, gib_cap: float = 0.0) -> Choice | None:
    """Place the one-GPU `pod` by repacking the pool's sharing pods; None (nothing changed) if CP-SAT finds no
    assignment within the move limit and `dtime` of CP-SAT's deterministic time (≈ seconds on a quiet core, the
    same work on a busy one). `memo` remembers the pools that failed: a pod at least as large (share, CPU,
    memory) is not tried again on an unchanged pool (the saturated tail of a replay fails thousands of pods on the
    same pool). `gib_cap` > 0 (a move price): the moved pods' checkpoints may total at most that many GiB, and
    the repack moving the fewest bytes (not the fewest pods) is sought."""
    if pod.num_gpu != 1:
        return None
    cl = s.cl
    bins = pool_gpus(s, pool)
    if len(bins) < 2:
        return None
    key = None
    dims = (pod.gpu_milli, pod.cpu_milli, pod.memory_mib)
    if memo is not None:
        nodes_ = sorted({n for n, _ in bins})
        key = (tuple(bins), tuple(int(cl.free[n, g]) for n, g in bins), tuple(int(cl.cpu_free[n]) for n in nodes_),
               pod.gpu_models, s.limit - len(s.orig), gib_cap)
        if covered(dims, memo.get(key, ())):
            return None
    ch = _pool_repack(s, pod, bins, dtime, movable, gib_cap)
    if ch is None and memo is not None:
        if len(memo) > 4096:
            memo.clear()
        memo.setdefault(key, []).append(dims)
    return ch


def _pool_repack(s: Search, pod: Pod, bins: list[tuple[int, int]], dtime: float,
                 movable: Callable[[Pod], bool] | None, gib_cap: float) -> Choice | None:
    cl = s.cl
    items: list[int] = []  # pids
    cur: list[int] = []
    for k, (n, g) in enumerate(bins):
        for pid in s.placed.on(n, g):
            if pid in s.limbo:
                continue
            if movable is not None and not movable(s.placed.pods[pid][0]):
                return None  # keep it simple: a pool holding an unmovable pod is not repacked
            items.append(pid)
            cur.append(k)
    nodes = sorted({n for n, _ in bins})
    cpu_budget = {n: int(cl.cpu_free[n]) for n in nodes}
    mem_budget = {n: int(cl.mem_free[n]) for n in nodes}
    for pid in items:
        p, ch = s.placed.pods[pid]
        cpu_budget[ch.node] += p.cpu_milli
        mem_budget[ch.node] += p.memory_mib
    pods = [s.placed.pods[pid][0] for pid in items] + [pod]
    if not shares_fit(tuple(sorted(p.gpu_milli for p in pods)), len(bins)):
        return None  # the shares alone do not pack into the pool's GPUs: no CP-SAT needed to say so
    twins = twins_of(s)
    mine = {n: {g for nn, g in bins if nn == n} for n in nodes}  # each node's pool GPUs: relief leaves them be
    potential = {n: relief_potential(s, n, mine[n], frozenset(nodes), twins) for n in nodes}
    no_deficit: set[int] = set()
    for _ in range(3):
        sol = _solve(s, bins, items, cur, pods, nodes, cpu_budget, mem_budget, potential, no_deficit, dtime,
                     gib_cap)
        if sol is None:
            return None
        dest, deficit = sol
        # CPU the plan needs beyond a node's budget is freed first, by CPU relief (moves and same-shape swaps
        # off the node, never touching the pool)
        m = s.mark()
        ok = True
        for n in deficit:
            use = sum(pods[i].cpu_milli for i in range(len(pods)) if bins[dest[i]][0] == n)
            here = sum(pods[i].cpu_milli for i in range(len(items)) if bins[cur[i]][0] == n)
            if not make_room(s, n, use - here, 0, mine[n], twins, frozenset(nodes), movable, gib_cap > 0):
                no_deficit.add(n)
                ok = False
                break
        if ok:
            break
        s.undo(m)
        twins = twins_of(s)  # the relief's swaps were undone
    else:
        return None
    moving = [i for i in range(len(items)) if dest[i] != cur[i]]
    for i in moving:
        s.eject(items[i])
    for i in moving:
        n, g = bins[dest[i]]
        s.put(items[i], Choice(n, (g,)))
    n, g = bins[dest[-1]]
    ch = Choice(n, (g,))
    s.put_new(pod, ch)
    return ch


def _solve(s: Search, bins, items, cur, pods, nodes, cpu_budget, mem_budget, potential: dict[int, int],
           no_deficit: set[int], dtime: float, gib_cap: float = 0.0) -> tuple[list[int], dict[int, int]] | None:
    """CP-SAT: every pod on one pool GPU, GPUs within 1000 milli, memory within each node's, CPU within each
    node's plus a deficit (CPU relief must free it; each core of it costs a quarter move), fewest moves; with a
    `gib_cap`, moved checkpoints within it and fewest bytes (a core of deficit costs 2.5 GiB)."""
    cl = s.cl
    m = cp_model.CpModel()
    x: dict[tuple[int, int], cp_model.IntVar] = {}
    for i, p in enumerate(pods):
        for k, (n, _) in enumerate(bins):
            if p.gpu_models and cl.models[n] not in p.gpu_models:
                continue
            if p.memory_mib > mem_budget[n] or p.cpu_milli > int(cl.cpu_cap[n]):
                continue
            x[i, k] = m.new_bool_var(f"x{i}_{k}")
    for i in range(len(pods)):
        opts = [x[i, k] for k in range(len(bins)) if (i, k) in x]
        if not opts:
            return None
        m.add_exactly_one(opts)
    unit = 10 if all(p.gpu_milli % 10 == 0 for p in pods) else 1
    for k in range(len(bins)):
        terms = [(x[i, k], pods[i].gpu_milli // unit) for i in range(len(pods)) if (i, k) in x]
        m.add(sum(v * c for v, c in terms) <= MILLI // unit)
    deficit: dict[int, cp_model.IntVar] = {}
    for n in nodes:
        ks = [k for k, (nn, _) in enumerate(bins) if nn == n]
        cpu_terms = [x[i, k] * pods[i].cpu_milli for i in range(len(pods)) for k in ks if (i, k) in x]
        mem_terms = [x[i, k] * pods[i].memory_mib for i in range(len(pods)) for k in ks if (i, k) in x]
        hi = 0 if n in no_deficit else min(potential[n], max(int(cl.cpu_cap[n]) - cpu_budget[n], 0))
        deficit[n] = m.new_int_var(0, hi, f"d{n}")
        m.add(sum(cpu_terms) <= cpu_budget[n] + deficit[n])
        m.add(sum(mem_terms) <= mem_budget[n])
    stay = [x[i, cur[i]] for i in range(len(items)) if (i, cur[i]) in x]
    limit = s.limit - len(s.orig)
    m.add(sum(stay) >= len(items) - limit)
    if gib_cap > 0:
        # tenths of a GiB; 40 per tenth makes a core of deficit (1000) worth 2.5 GiB
        tenths = [round(10 * checkpoint_bytes(pods[i], cl.models[bins[cur[i]][0]]) / GIB)
                  for i in range(len(items))]
        moved = [(1 - x[i, cur[i]]) if (i, cur[i]) in x else 1 for i in range(len(items))]
        m.add(sum(t * v for t, v in zip(tenths, moved, strict=True)) <= int(10 * gib_cap))
        m.minimize(40 * sum(t * v for t, v in zip(tenths, moved, strict=True)) + sum(deficit.values()))
    else:
        m.minimize(4000 * (len(items) - sum(stay)) + sum(deficit.values()))
    for i in range(len(items)):
        if (i, cur[i]) in x:
            m.add_hint(x[i, cur[i]], 1)
    solver = cp_model.CpSolver()
    # deterministic work units only, no wall-clock cap, one worker, a fixed seed: the same replay gives the same
    # moves on a quiet or a loaded machine (a wall cap cut calls short under load and changed results)
    solver.parameters.max_deterministic_time = dtime
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    # no LP relaxation: on these small packing models it costs more than it prunes. On the 186 pools of a
    # saturated replay (seed 42) the same 0.15 units found a repack for 96 instead of 74, a better one for 35
    # of the 64 both found (worse for 10), in 22 s of CP-SAT instead of 39 (docs/simulator.md, "Speed")
    solver.parameters.linearization_level = 0
    st = solver.solve(m)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    dest = [next(k for k in range(len(bins)) if (i, k) in x and solver.value(x[i, k])) for i in range(len(pods))]
    return dest, {n: int(solver.value(v)) for n, v in deficit.items() if solver.value(v) > 0}
