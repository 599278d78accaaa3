"""Repacking defragmentation for the replay: CPU relief, ejection chains, and exact pool repacks.

Once FGD saturates a cluster the free GPU sits in pieces (< 200 milli beside 810-milli pods, < 100 milli beside
470 + 470 pairs) and the larger free pieces sit on nodes whose CPU is exhausted: to free a GPU for a failing
pod, its sharing pods must go somewhere, and no hole is big enough for any of them (`sim/defrag.py`'s single
moves find nothing). `ChainRepacker` tries three things in turn, cheapest first:

0. **CPU relief** (`sim/cpu_relief.py`). The pod's GPUs fit a node whose CPU or memory does not: move CPU-only
   pods off it, or trade a heavy pod of it for a lighter pod of the same GPU shape elsewhere.
1. **Target.** For the failing pod, the GPUs to free: a whole-GPU pod of k GPUs takes the node whose k cheapest
   GPUs (fewest pods, then least share) hold only sharing pods; a sharing pod of share s takes a GPU with some
   share free where ejecting a few of its pods (each smaller than s) leaves s free. CPU-only pods of the node
   are ejected too when CPU or memory is short. The pod is placed, then its victims must be re-placed.
2. **Chains.** A victim goes where the placement policy puts it; when it fits nowhere, it ejects, in turn, a
   few pods smaller than itself from a GPU whose free piece plus theirs fits it, and those are re-placed the
   same way, up to `depth` levels, trying the `breadth` cheapest GPUs at each level. Every ejected pod is
   strictly smaller than the one that ejected it, so a chain ends; small pods sink into the small holes and
   the large free pieces merge. A whole one-GPU victim (ejected for its CPU) that fits nowhere takes the GPU
   of a whole one-GPU pod asking for less CPU on a node with CPU to spare, and that pod is re-placed in turn
   (`cpu_swaps`): when saturated, the free GPUs sit on CPU-poor nodes and the free CPU on GPU-full ones.
3. **Pool repack** (`sim/pool_repack.py`, one-GPU pods). CP-SAT repacks the `pool` partly used GPUs with the
   most share free, with CPU relief for the nodes that need CPU, fewest moves first.
4. **All or nothing.** Every change is made inside one statement of the capacity model (core/capacity.py,
   `mark` / `rollback` / `commit`); a rescue whose victims cannot all be re-placed, or that would move more pods
   than allowed, is rolled back exactly. A pod moved (its node or GPU changed) counts once per rescue,
   however often it was touched; a pod that ends where it started is not a move.

A global budget (`budget` moves per placed pod, default 0.1) and `max_moves` per rescued pod bound it.
`saturated` keeps that budget for the rescues that count when pods never leave (the static replay): a pod is
rescued only once the nodes of its GPU models are that full, since room made in a pool with room to spare is
filled by later arrivals anyway, and a pod bound to a few GPU models fails long before the cluster fills. A move
price (`gib_per_gpu`) makes it weigh what the moves cost: a rescue may write at most that many GiB of checkpoints
(sim/costs.py's size model) per GPU it places; a dearer one is undone and the next stage (or target) tried,
and relief and the pool repack then look for the rescue that writes the fewest bytes, not the fewest moves. A run
budget (`gib_budget`, the checkpoint traffic an operator allows) caps the GiB all rescues together may write.
Moves are priced by core.cost, as the planner prices them. Multi-GPU
pods that fail are checked once more with unlimited moves (not applied) and counted in
`MoveStats.multi_gpu_failed_clearable` when relief or a repack within the rescue's limits (moves, budget, price)
could have placed them, in `multi_gpu_failed_over_budget` when only more than the limits (or before
`saturated`) allow could have.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..core.capacity import room_fits
from ..core.cost import CostModel
from ..core.model import MILLI
from ..core.placement import Choice, Cluster, PlacementPolicy, Pod
from .costs import GIB, record_move
from .cpu_relief import relieve
from .pool_repack import covered, pool_repack
from .replay import MoveStats, Placed
from .search import Abort, Search, attempt

BIG = 1 << 30


def _kind(pod: Pod) -> int:
    """Ejection order for CPU: CPU-only pods (easiest to re-place), sharing pods, whole-GPU pods."""
    return 0 if pod.num_gpu == 0 else 1 if pod.is_sharing else 2


@dataclass
class ChainRepacker:
    """`Defragmenter` for `sim.replay.replay`: rescue a failing pod by local repacking (ejection chains)."""

    max_moves: int = 16  # per rescued pod
    budget: float = 0.1  # moves per placed pod, over the whole run
    depth: int = 3  # chain levels below the failing pod's victims
    breadth: int = 3  # GPUs (or nodes) tried per level
    whole_moves: bool = False  # a one-GPU pod may take the GPU of a whole-GPU pod that fits elsewhere
    cpu_swaps: bool = True  # a whole one-GPU victim may displace a whole one-GPU pod that asks for less CPU
    swaps: bool = False  # also eject pods of the same share that ask for less CPU (chains that free CPU)
    targets: int = 6  # nodes (or GPUs) tried for the failing pod itself
    cpu_relief: bool = True  # first try freeing CPU on a node whose GPUs fit (sim/cpu_relief.py)
    pool: int = 16  # last, an exact repack of this many partly used GPUs (sim/pool_repack.py); 0 = off
    pool_dtime: float = 0.15  # CP-SAT work limit per pool repack, deterministic time units (no wall clock)
    scan: int = 400  # GPUs examined per level for pods to eject (those with the most share free first)
    movable: Callable[[Pod], bool] | None = None
    cost_model: CostModel | None = None
    gib_per_gpu: float = 0.0  # the move price: a rescue may move at most this many GiB per GPU placed; 0 = free
    gib_budget: float = 0.0  # checkpoint GiB the whole run may write (an operator's traffic cap); 0 = no cap
    moves_per_gpu: float = 0.0  # a rescue may move at most this many pods per GPU it places; 0 = max_moves only
    saturated: float = 0.0  # rescue only once the pod's pool (nodes of its GPU models) is this allocated; 0 = always
    check_clearable: bool = True  # count multi-GPU failures that unlimited moves would have rescued
    last_moved: list[tuple[int, Choice, Choice]] = field(default_factory=list)
    _failed: dict[tuple[int, tuple[str, ...]], list[tuple[int, int, int]]] = field(default_factory=dict, repr=False)
    _priced: set[tuple[tuple[int, tuple[str, ...]], tuple[int, int, int]]] = field(default_factory=set, repr=False)
    _state: tuple[int, int, int] = (-1, -1, -1)
    _pool_memo: dict = field(default_factory=dict, repr=False)
    _priced_out: bool = field(default=False, repr=False)
    _gib_left: float = field(default=math.inf, repr=False)  # of gib_budget, when this rescue began

    # ------------------------------------------------------------------ entry point
    def rescue(self, cl: Cluster, pod: Pod, placed: Placed, policy: PlacementPolicy, rng: np.random.Generator,
               stats: MoveStats) -> Choice | None:
        self.last_moved = []
        if pod.num_gpu == 0:
            return None
        room = int(self.budget * max(len(placed.pods), 1)) - stats.moves
        limit = min(self.max_moves, room)
        if self.moves_per_gpu > 0:  # a scarce moves budget goes to the rescues that place the most per move
            limit = min(limit, int(self.moves_per_gpu * pod.gpu_total / MILLI))
        self._gib_left = self.gib_budget - stats.moved_bytes / GIB if self.gib_budget > 0 else math.inf
        if self._gib_left <= 0:
            limit = 0
        if self.saturated > 0 and cl.allocated_share(pod.gpu_models) < self.saturated:
            limit = 0  # its pool still has room: what moves would make, later arrivals would take anyway
        # a pod at least as large as one that found no repack on this very cluster state is not searched again
        state = (cl.allocated_milli, int(cl.cpu_free.sum()), limit)
        if state != self._state:
            self._state, self._failed, self._priced = state, {}, set()
        key = (pod.num_gpu, pod.gpu_models)
        dims = (pod.gpu_milli, pod.cpu_milli, pod.memory_mib)
        # and a pod of the very same shape that was priced out here would be priced out again (its cap is the same)
        known = covered(dims, self._failed.get(key, ())) or (key, dims) in self._priced
        if limit > 0 and not known:
            s = Search(cl, placed, policy, rng, limit)
            self._priced_out = False
            stages = ((self._relieve,) if self.cpu_relief else ()) + (self._try,) + ((self._pool,) if self.pool else ())
            for stage in stages:
                choice = stage(s, pod)
                if choice is None:
                    continue
                if self._worth_it(s, pod):
                    self._commit(cl, placed, stats, s)
                    return choice
                self._priced_out = True
                s.undo()  # found, but it moves more than it is worth: the next stage may do it cheaper
            if not self._priced_out:  # (a priced-out pod proves nothing about a larger one)
                self._failed.setdefault(key, []).append(dims)
            else:
                self._priced.add((key, dims))
        if self.check_clearable and pod.num_gpu > 1:
            s = Search(cl, placed, policy, rng, BIG)
            if ((self.cpu_relief and self._relieve(s, pod, priced=False) is not None)
                    or self._try(s, pod, priced=False) is not None):
                if len(s.moved()) <= limit and self._worth_it(s, pod):
                    stats.multi_gpu_failed_clearable += 1  # within its limits: the search missed it
                else:
                    stats.multi_gpu_failed_over_budget += 1  # only more moves or bytes than allowed would do
            s.undo()
        return None

    def _relieve(self, s: Search, pod: Pod, priced: bool = True) -> Choice | None:
        cap = self._gib_cap(pod) if priced else 0.0
        return attempt(s, lambda: relieve(s, pod, self.targets, self.movable, cap))

    def _pool(self, s: Search, pod: Pod) -> Choice | None:
        return attempt(s, lambda: pool_repack(s, pod, self.pool, self.pool_dtime, self.movable, self._pool_memo,
                                               self._gib_cap(pod)))

    def _gib_cap(self, pod: Pod) -> float:
        """The checkpoint GiB a rescue of `pod` may write: its price (`gib_per_gpu` per GPU placed) and what is
        left of the run's `gib_budget`, whichever is less; 0 when neither is set (moves are free)."""
        cap = min(self.gib_per_gpu * pod.gpu_total / MILLI if self.gib_per_gpu > 0 else math.inf, self._gib_left)
        return 0.0 if cap == math.inf else cap

    def _try(self, s: Search, pod: Pod, priced: bool = True) -> Choice | None:
        try:
            for n, gpus in self._targets(s, pod):
                m = s.mark()
                ch = self._take(s, pod, n, gpus, self.depth)
                if ch is not None and (not priced or self._worth_it(s, pod)):
                    return ch
                self._priced_out |= ch is not None
                s.undo(m)
        except Abort:
            pass
        s.undo()
        return None

    def _worth_it(self, s: Search, pod: Pod) -> bool:
        """Is placing `pod` worth the moves: within its price and what is left of the run's GiB budget."""
        cap = self._gib_cap(pod)
        return cap <= 0 or s.moved_gib() <= cap

    # ------------------------------------------------------------------ targets
    def _movable(self, s: Search, pid: int) -> bool:
        return self.movable is None or self.movable(s.placed.pods[pid][0])

    def _targets(self, s: Search, pod: Pod) -> list[tuple[int, tuple[int, ...]]]:
        """(node, GPUs) to free for the failing pod, cheapest first."""
        cl = s.cl
        ok_node = cl.model_mask(pod.gpu_models) & (cl.gpu_count >= pod.num_gpu) & (cl.cpu_cap >= pod.cpu_milli)
        free = cl.free
        if pod.is_sharing:
            return self._share_targets(s, pod, ok_node)
        # whole GPUs: a GPU holding a whole-GPU pod has 0 free; one with free > 0 holds only sharing pods
        npods = s.placed.npods
        cost = np.where(free == MILLI, 0, np.where(free > 0, npods, BIG)).astype(np.int64)
        if self.whole_moves and pod.num_gpu == 1:
            # a GPU held by one whole-GPU pod: that pod may fit a free GPU on a node whose CPU this pod lacks
            cost = np.where((free == 0) & (npods == 1), 1, cost)
        used = np.where(free > 0, MILLI - free, np.where(free == 0, MILLI, BIG))
        key = cost * (2 * MILLI) + np.minimum(used, 2 * MILLI - 1)
        k = pod.num_gpu
        if k > free.shape[1]:
            return []
        sel = np.argsort(key, axis=1, kind="stable")[:, :k]
        node_cost = np.take_along_axis(cost, sel, axis=1).sum(axis=1)
        node_used = np.take_along_axis(np.where(cost > 0, used, 0), sel, axis=1).sum(axis=1)
        short = np.maximum(pod.cpu_milli - cl.cpu_free, 0)
        node_cost = node_cost + ~room_fits(cl.cpu_free, cl.mem_free, pod)
        nodes = np.flatnonzero(ok_node & (node_cost < BIG) & (node_cost <= s.limit) & (node_cost > 0))
        order = np.lexsort((node_used[nodes], short[nodes], node_cost[nodes]))
        return [(int(n), tuple(sorted(int(g) for g in sel[n]))) for n in nodes[order][: self.targets]]

    def _share_targets(self, s: Search, pod: Pod, ok_node: np.ndarray) -> list[tuple[int, tuple[int, ...]]]:
        """GPUs with some share free where ejecting a few pods smaller than `pod` makes room."""
        return [(n, (g,)) for n, g, _ in self._ejectable(s, pod, ok_node, pod.gpu_milli)][: self.targets]

    def _ejectable(self, s: Search, pod: Pod, ok_node: np.ndarray, size: int) -> list[tuple[int, int, list[int]]]:
        """(node, GPU, pods to eject) where ejecting sharing pods smaller than `size` frees `size` on the GPU,
        cheapest (fewest pods, then least share) first; at most `scan` GPUs are examined."""
        cl = s.cl
        free = cl.free
        ok = (free > 0) & (free < size) & ok_node[:, None]
        rows, cols = np.nonzero(ok)
        if len(rows) == 0:
            return []
        order = np.argsort(-free[rows, cols], kind="stable")[: self.scan]
        # only GPUs whose ejectable pods (smaller ones, not already ejected) hold enough share: one vectorised
        # pass over all sharing pods instead of a Python look at each GPU's pods
        pods = s.placed.sharing_rows()
        live = pods[:, 3] == 1
        if s.limbo:
            live[list(s.limbo)] = False
        small = live & ((pods[:, 2] < size) | (self.swaps & (pods[:, 2] == size)))
        width = free.shape[1]
        held = np.bincount(pods[small, 0] * width + pods[small, 1], weights=pods[small, 2], minlength=free.size)
        r, c = rows[order], cols[order]
        order = order[held[r * width + c] >= size - free[r, c]]
        out: list[tuple[int, int, list[int], int]] = []
        for i in order:
            if len(out) >= 4 * self.breadth:
                break
            n, g = int(rows[i]), int(cols[i])
            need = size - int(free[n, g])
            cands = [p for p in s.items(n, g) if self._smaller(s.placed.pods[p][0], pod, size) and self._movable(s, p)]
            if sum(s.placed.pods[p][0].gpu_milli for p in cands) < need:
                continue
            cands.sort(key=lambda p: s.placed.pods[p][0].gpu_milli)
            one = next((p for p in cands if s.placed.pods[p][0].gpu_milli >= need), None)
            if one is not None:
                pick = [one]  # the smallest single pod that is enough
            else:
                pick, got = [], 0
                for p in reversed(cands):
                    pick.append(p)
                    got += s.placed.pods[p][0].gpu_milli
                    if got >= need:
                        break
            out.append((n, g, pick, sum(s.placed.pods[p][0].gpu_milli for p in pick)))
        out.sort(key=lambda t: (len(t[2]), t[3]))
        return [(n, g, pick) for n, g, pick, _ in out]

    def _smaller(self, q: Pod, pod: Pod, size: int) -> bool:
        """May `q` be ejected to make room for `pod`: a smaller share, or (`swaps`) the same share and less CPU."""
        return q.gpu_milli < size or (self.swaps and q.gpu_milli == size and q.cpu_milli < pod.cpu_milli)

    # ------------------------------------------------------------------ one step
    def _take(self, s: Search, pod: Pod, n: int, gpus: tuple[int, ...], depth: int) -> Choice | None:
        """Free `gpus` of node n for the (not yet placed) pod, place it, and re-place its victims."""
        cl = s.cl
        if pod.is_sharing:
            g = gpus[0]
            need = pod.gpu_milli - int(cl.free[n, g])
            victims = []
            if need > 0:
                cands = sorted((p for p in s.items(n, g) if s.placed.pods[p][0].gpu_milli < pod.gpu_milli),
                               key=lambda p: s.placed.pods[p][0].gpu_milli)
                one = next((p for p in cands if s.placed.pods[p][0].gpu_milli >= need), None)
                if one is not None:
                    victims = [one]
                else:
                    got = 0
                    for p in reversed(cands):
                        victims.append(p)
                        got += s.placed.pods[p][0].gpu_milli
                        if got >= need:
                            break
        else:
            victims = sorted({p for g in gpus for p in s.placed.on(n, g) if p not in s.limbo})
        if not all(self._movable(s, v) for v in victims):
            return None
        for v in victims:
            s.eject(v)
        if any(cl.free[n, g] < pod.gpu_milli for g in gpus):
            return None
        # CPU or memory short: eject other pods of the node: CPU-only pods, then sharing pods, then whole-GPU pods
        # of its other GPUs (the most CPU first within each kind); they are re-placed like the victims
        if not cl.room_on(n, pod):
            mine = set(gpus)
            others = [i for i in s.placed.on(n) if i not in s.limbo and self._movable(s, i)
                      and not set(s.placed.pods[i][1].gpus) & mine]
            others.sort(key=lambda i: (_kind(s.placed.pods[i][0]), -s.placed.pods[i][0].cpu_milli))
            for p in others:
                if cl.room_on(n, pod):
                    break
                s.eject(p)
                victims.append(p)
            if not cl.room_on(n, pod):
                return None
        ch = Choice(n, gpus)
        s.put_new(pod, ch)
        for v in sorted(victims, key=lambda i: -s.placed.pods[i][0].gpu_total):
            if not self._insert(s, v, depth):
                return None
        return ch

    def _insert(self, s: Search, pid: int, depth: int) -> bool:
        """Re-place an ejected pod: where the policy puts it, else by ejecting smaller pods (a chain)."""
        pod = s.placed.pods[pid][0]
        ch = s.policy.choose(s.cl, pod, s.rng)
        if ch is not None:
            s.put(pid, ch)
            return True
        if depth <= 0:
            return False
        if not pod.is_sharing:
            return self.cpu_swaps and pod.num_gpu == 1 and self._insert_whole(s, pid, depth)
        cl = s.cl
        ok_node = cl.model_mask(pod.gpu_models)
        if not self.swaps:
            ok_node = ok_node & room_fits(cl.cpu_free, cl.mem_free, pod)
        tried = 0
        for n, g, pick in self._ejectable(s, pod, ok_node, pod.gpu_milli):
            if pick and all(p in s.orig and s.placed.pods[p][1] != s.orig[p] for p in pick):
                continue  # do not bounce pods that already moved in this rescue
            m = s.mark()
            for p in pick:
                s.eject(p)
            if cl.fits_at(n, (g,), pod):
                s.put(pid, Choice(n, (g,)))
                pick.sort(key=lambda i: -s.placed.pods[i][0].gpu_milli)
                if all(self._insert(s, p, depth - 1) for p in pick):
                    return True
            s.undo(m)
            tried += 1
            if tried >= self.breadth:
                break
        return False

    def _insert_whole(self, s: Search, pid: int, depth: int) -> bool:
        """A one-GPU whole pod that fits nowhere takes the GPU of a whole one-GPU pod asking for less CPU on a
        node with CPU to spare (the CPU-rich nodes have no free GPU, the free GPUs sit on CPU-poor nodes); that
        pod is re-placed in turn (a free GPU where its smaller CPU fits, or the same swap one level down)."""
        pod = s.placed.pods[pid][0]
        cl = s.cl
        ok = (cl.free == 0) & (s.placed.npods == 1) & cl.model_mask(pod.gpu_models)[:, None]
        ok &= (cl.cpu_free > 0)[:, None]
        rows, cols = np.nonzero(ok)
        order = np.argsort(-cl.cpu_free[rows], kind="stable")[: self.scan]
        tried = 0
        for i in order:
            n, g = int(rows[i]), int(cols[i])
            held = [p for p in s.placed.on(n, g) if p not in s.limbo]
            if len(held) != 1:
                continue
            w = held[0]
            q = s.placed.pods[w][0]
            if (q.num_gpu != 1 or q.is_sharing or q.cpu_milli >= pod.cpu_milli or not self._movable(s, w)
                    or cl.cpu_free[n] + q.cpu_milli < pod.cpu_milli or cl.mem_free[n] + q.memory_mib < pod.memory_mib
                    or (w in s.orig and s.placed.pods[w][1] != s.orig[w])):
                continue
            m = s.mark()
            s.eject(w)
            s.put(pid, Choice(n, (g,)))
            if self._insert(s, w, depth - 1):
                return True
            s.undo(m)
            tried += 1
            if tried >= self.breadth:
                break
        return False

    # ------------------------------------------------------------------ commit
    def _commit(self, cl: Cluster, placed: Placed, stats: MoveStats, s: Search) -> None:
        cl.commit()
        for pid in s.moved():
            p, now = placed.pods[pid]
            was = s.orig[pid]
            self.last_moved.append((pid, was, now))
            stats.moves += 1
            record_move(stats, p, cl, was, now, self.cost_model)
