"""Defragmentation inside the replay: when a pod fits nowhere, move (or evict) a few placed pods to make room.

Why not `gpudefrag.core.planner.plan_moves` here: the planner works on an immutable `ClusterState`, and the
replay would have to rebuild one with ~8,000 running workloads for each of the ~2,500 pods that fail in a run
(the state alone takes about a second to build and validate; the planner's heuristic then ranks every
workload), which would turn a 10-second run into hours. This module is the same idea on the replay's arrays:

1. For every node of an allowed GPU model, estimate the moves needed: for a whole-GPU pod of k GPUs, the pods
   on the k cheapest GPUs to empty (fewest pods); for a sharing pod, the pods on the one cheapest GPU to free
   enough share. Nodes whose estimate is within `max_moves` are tried, cheapest first.
2. Try a node: take its victims off, place the pod on the freed GPUs, then re-place each victim with the
   placement policy (largest first). If one victim finds no room, undo everything and try the next node.
   A plan is applied only when every victim has a place — a move never loses a pod.
3. `evict` (the descheduler/KAI way) instead takes the victims off without checking that they fit elsewhere:
   they re-enter the queue at once and any that find no room are lost, with their work.

A global budget (`budget` moves per placed pod, default 0.1) stops moving when it would be exceeded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..core.capacity import room_fits
from ..core.cost import CostModel
from ..core.model import MILLI
from ..core.placement import Choice, Cluster, PlacementPolicy, Pod
from .costs import record_move
from .replay import MoveStats, Placed

BIG = 1 << 30


@dataclass
class ArrayDefragmenter:
    action: str = "migrate"  # "migrate" | "evict"
    max_moves: int = 8  # per rescued pod
    budget: float = 0.1  # moves (or evictions) per placed pod, over the whole run
    candidates: int = 8  # nodes tried per rescue
    movable: Callable[[Pod], bool] | None = None  # which pods may move (default: all)
    cost_model: CostModel | None = None
    requeue_evicted: bool = False  # evict: hand the victims back (dynamic sim) instead of re-placing them now
    last_moved: list[tuple[int, Choice, Choice]] = field(default_factory=list)  # the last rescue's moves
    last_evicted: list[int] = field(default_factory=list)  # the last rescue's evictions (pids, when requeued)

    def __post_init__(self) -> None:
        if self.action not in ("migrate", "evict"):
            raise ValueError(f"unknown defrag action {self.action!r} (migrate | evict)")

    # ------------------------------------------------------------------------------------ entry point
    def rescue(self, cl: Cluster, pod: Pod, placed: Placed, policy: PlacementPolicy, rng: np.random.Generator,
               stats: MoveStats) -> Choice | None:
        self.last_moved, self.last_evicted = [], []
        if pod.num_gpu == 0:
            return None
        room = int(self.budget * max(len(placed.pods), 1)) - (stats.moves + stats.evictions)
        limit = min(self.max_moves, room)
        choice = None
        if limit > 0:
            for n in self._candidates(cl, pod, placed, limit):
                choice = self._attempt(cl, pod, placed, policy, rng, stats, int(n), limit, commit=True)
                if choice is not None:
                    break
        if choice is None and pod.num_gpu > 1 and self.action == "migrate":
            # would moves (any number) have cleared a node for this multi-GPU pod? (reported, not done)
            for n in self._candidates(cl, pod, placed, BIG - 1)[:3]:
                if self._attempt(cl, pod, placed, policy, rng, stats, int(n), BIG, commit=False) is not None:
                    stats.multi_gpu_failed_clearable += 1
                    break
        return choice

    # ------------------------------------------------------------------------------------ candidates
    def _gpu_costs(self, cl: Cluster, pod: Pod, placed: Placed) -> np.ndarray:
        """Per GPU: pods to move off it so it can take (its part of) the pod; BIG where it cannot."""
        free = cl.free
        # a used GPU with no pod we know of holds background load (e.g. a snapshot's workloads): never cleared
        busy = np.where(placed.npods > 0, placed.npods, BIG)
        need = pod.gpu_milli if pod.is_sharing else MILLI
        cost = np.where(free >= need, 0, busy)
        if pod.num_gpu == 1:
            # emptying a full GPU for a one-GPU pod only moves the problem: its pods need as much room elsewhere
            cost = np.where((free == 0) & (cost > 0), BIG, cost)
        return np.where(free < 0, BIG, cost).astype(np.int64)

    def _candidates(self, cl: Cluster, pod: Pod, placed: Placed, limit: int) -> np.ndarray:
        cost_g = self._gpu_costs(cl, pod, placed)
        k = pod.num_gpu
        if k > cost_g.shape[1]:
            return np.zeros(0, dtype=np.int64)
        # GPU-pods to move, then (a tie-breaker) the share they hold: small pods find a hole elsewhere
        used = np.where(cl.free >= 0, MILLI - cl.free, 0)
        key = cost_g * (2 * MILLI) + np.where(cost_g > 0, used, 0)
        sel = np.argpartition(key, k - 1, axis=1)[:, :k]
        node_cost = np.take_along_axis(cost_g, sel, axis=1).sum(axis=1)
        node_milli = np.take_along_axis(np.where(cost_g > 0, used, 0), sel, axis=1).sum(axis=1)
        # a node short of CPU or memory needs at least one more pod moved off (CPU-only pods first)
        short = ~room_fits(cl.cpu_free, cl.mem_free, pod)
        node_cost = node_cost + short
        ok = cl.model_mask(pod.gpu_models) & (cl.gpu_count >= k) & (node_cost <= limit) & (node_cost > 0)
        ok &= (cl.cpu_cap >= pod.cpu_milli)
        nodes = np.flatnonzero(ok)
        if len(nodes) == 0:
            return nodes
        # fewest moves first; among equals the least share to move (so the moved pods fit in holes elsewhere)
        order = np.lexsort((node_milli[nodes], node_cost[nodes]))
        return nodes[order][: self.candidates]

    def _victims(self, cl: Cluster, pod: Pod, placed: Placed, n: int) -> tuple[list[int], tuple[int, ...]]:
        """The pods to take off node n, and the GPUs the pod will use there: those that free the GPUs, then,
        if CPU or memory is still short, more pods of the node (CPU-only pods first, the largest first)."""
        victims, gpus = self._gpu_victims(cl, pod, placed, n)
        cpu = cl.cpu_free[n] + sum(placed.pods[v][0].cpu_milli for v in victims)
        mem = cl.mem_free[n] + sum(placed.pods[v][0].memory_mib for v in victims)
        if not room_fits(cpu, mem, pod):
            taken = set(victims)
            rest = [i for i in placed.on(n) if i not in taken]
            rest.sort(key=lambda i: (placed.pods[i][0].num_gpu > 0, -placed.pods[i][0].cpu_milli))
            for i in rest:
                if room_fits(cpu, mem, pod):
                    break
                p = placed.pods[i][0]
                victims.append(i)
                cpu += p.cpu_milli
                mem += p.memory_mib
        return victims, gpus

    def _gpu_victims(self, cl: Cluster, pod: Pod, placed: Placed, n: int) -> tuple[list[int], tuple[int, ...]]:
        free = cl.free[n]
        busy = np.where(placed.npods[n] > 0, placed.npods[n], BIG)
        if pod.is_sharing:
            cost = np.where(free >= pod.gpu_milli, 0, busy)
            cost = np.where((free < 0) | ((free == 0) & (cost > 0)), BIG, cost)
            g = int(np.lexsort((-free, cost))[0])  # fewest pods to move, then the most share free
            victims: list[int] = []
            got = int(free[g])
            for pid in sorted(placed.on(n, g), key=lambda i: -placed.pods[i][0].gpu_milli):
                if got >= pod.gpu_milli:
                    break
                victims.append(pid)
                got += placed.pods[pid][0].gpu_milli
            return victims, (g,)
        cost = np.where(free == MILLI, 0, busy)
        if pod.num_gpu == 1:
            cost = np.where((free == 0) & (cost > 0), BIG, cost)
        cost = np.where(free < 0, BIG, cost)
        gpus = tuple(int(g) for g in np.lexsort((-free, cost))[: pod.num_gpu])  # fewest pods, least share
        vs: set[int] = set()
        for g in gpus:
            vs.update(placed.on(n, g))
        return sorted(vs, key=lambda i: -placed.pods[i][0].gpu_total), gpus

    # ------------------------------------------------------------------------------------ one try
    def _attempt(self, cl: Cluster, pod: Pod, placed: Placed, policy: PlacementPolicy, rng: np.random.Generator,
                 stats: MoveStats, n: int, limit: int, *, commit: bool) -> Choice | None:
        victims, gpus = self._victims(cl, pod, placed, n)
        if not victims or len(victims) > limit:
            return None
        if self.movable is not None and not all(self.movable(placed.pods[v][0]) for v in victims):
            return None
        cpu = cl.cpu_free[n] + sum(placed.pods[v][0].cpu_milli for v in victims)
        mem = cl.mem_free[n] + sum(placed.pods[v][0].memory_mib for v in victims)
        if not room_fits(cpu, mem, pod):
            return None
        old = {v: placed.pods[v] for v in victims}
        cl.mark()  # one statement of the capacity model: everything below is rolled back unless committed
        for v in victims:
            cl.remove(*old[v])
        gpus = cl.pick(n, pod) or () if not pod.is_sharing else gpus
        if len(gpus) != pod.num_gpu or any(cl.free[n, g] < pod.gpu_milli for g in gpus):
            cl.rollback()  # the estimate was wrong (should not happen): put everything back
            cl.commit()
            return None
        mine = Choice(n, gpus)
        cl.place(pod, mine)
        new: dict[int, Choice] = {}
        lost: list[int] = []
        if self.action == "evict" and self.requeue_evicted and commit:
            cl.commit()
            for v in victims:
                placed.drop(v)
                stats.evictions += 1
            self.last_evicted = list(victims)
            return mine
        for v in victims:
            ch = policy.choose(cl, old[v][0], rng)
            if ch is None:
                if self.action == "migrate" or not commit:
                    break
                lost.append(v)
                continue
            cl.place(old[v][0], ch)
            new[v] = ch
        else:
            if commit:
                cl.commit()
                self._commit(cl, placed, stats, old, new, lost)
                return mine
        cl.rollback()  # a migration that cannot re-place every victim is not made
        cl.commit()
        return mine if (not commit and len(new) == len(victims)) else None

    def _commit(self, cl: Cluster, placed: Placed, stats: MoveStats, old: dict[int, tuple[Pod, Choice]],
                new: dict[int, Choice], lost: list[int]) -> None:
        for v, ch in new.items():
            p, was = old[v]
            placed.move(v, ch)
            self.last_moved.append((v, was, ch))
            if self.action == "migrate":
                stats.moves += 1
                record_move(stats, p, cl, was, ch, self.cost_model)
            else:
                stats.evictions += 1
        for v in lost:
            p, _ = placed.drop(v)
            stats.evictions += 1
            stats.evicted_lost += 1
            stats.evicted_lost_milli += p.gpu_total


def make_defragmenter(action: str, *, max_moves: int = 8, budget: float = 0.1) -> ArrayDefragmenter:
    return ArrayDefragmenter(action=action, max_moves=max_moves, budget=budget)
