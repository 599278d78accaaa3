"""The FGD authors' own consolidation: the descheduler of their simulator, as a rival to our moves.

Their simulator (`hkust-adsl/kubernetes-scheduler-simulator`, `pkg/simulator/deschedule.go` and
`deschedule_utils.go`, with the measure of `pkg/utils/frag.go`; read, not copied) has a descheduler that no
published run switched on. After the workload is scheduled, one pass evicts up to ⌈ratio × pods on the
cluster⌉ pods and hands them back to the normal scheduler; any that find no room are lost. Three policies:

- `fragOnePod`: walk the nodes from the most fragmented by the FGD measure F_n(M) (their
  `FragAmountSumExceptQ3`, the same quantity), and on each evict the one pod whose removal lowers F_n(M) the
  most (⌊F_n − F_n'⌋ milli-GPU, strictly positive; none when no removal lowers it). One pod per node.
- `fragMultiPod`: the same, but the nodes sit in a priority queue by F_n(M); a node that gave up a pod goes
  back in with its new F_n(M), so a node may give up several; one that has no such pod leaves the queue.
- `cosSim`: nodes with under 2 cores free and some GPU with more than 500 milli free, the most free GPU
  first; on each, evict the pod least aligned (cosine similarity of (free CPU, free GPU) after its removal
  with (its CPU, its GPU)) with what its removal would free.

In the replay (where pods keep arriving) the pass runs once, when the first pod fails to place: that is when
the cluster is full and what the descheduler frees can serve the pods still to come. The evicted pods are
re-placed first, in eviction order, by the replay's placement policy, then the failing pod is tried again.
With `repeat`, a pass runs at every failure until the budget (fixed at the first pass) is spent or a pass
finds nothing to evict — more chances than the authors' single pass gives it.
The measure is `core.fragmentation.task_fragment` over the cluster's workload mix; nothing here scores
placements.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from ..core.cost import CostModel
from ..core.fragmentation import task_fragment
from ..core.placement import Choice, Cluster, PlacementPolicy, Pod
from .costs import checkpoint_bytes, move_seconds
from .replay import MoveStats, Placed

DESCHEDULE_POLICIES = ("fragOnePod", "fragMultiPod", "cosSim")
COS_CPU_BAR = 2000  # milli-cores: cosSim looks only at nodes with less CPU free (their hard-coded bar)
COS_GPU_BAR = 500  # milli-GPU: ... and with some GPU more free than this


def frag_without(cl: Cluster, node: int, pods: list[tuple[Pod, Choice]]) -> np.ndarray:
    """F_n(M) of `node` (milli-GPU) with each of `pods` taken off it, one at a time: one value per pod."""
    free = np.repeat(cl.free[node][None, :].astype(np.int64), len(pods), axis=0)
    cpu = np.full(len(pods), int(cl.cpu_free[node]), dtype=np.int64)
    for i, (p, ch) in enumerate(pods):
        for g in ch.gpus:
            free[i, g] += p.gpu_milli
        cpu[i] += p.cpu_milli
    return _frag(cl, np.full(len(pods), node), free, cpu)


def node_frag(cl: Cluster) -> np.ndarray:
    """F_n(M) of every node as it is (milli-GPU)."""
    return _frag(cl, np.arange(cl.n), cl.free.astype(np.int64), cl.cpu_free)


def _frag(cl: Cluster, nodes: np.ndarray, free: np.ndarray, cpu: np.ndarray) -> np.ndarray:
    if cl.mix is None:
        raise ValueError("the descheduler needs the cluster's workload mix (Cluster.mix)")
    out = np.zeros(len(nodes), dtype=np.float64)
    for shape, p in zip(cl.mix.shapes, cl.mix.weights, strict=True):
        out += p * task_fragment(free, cpu, cl.model_mask(shape.gpu_models)[nodes], shape)
    return out


@dataclass
class Descheduler:
    """A `Defragmenter` for the replay: the authors' one-pass descheduler (see the module docstring)."""

    ratio: float = 0.05  # of the pods on the cluster when it first runs
    policy: str = "fragOnePod"
    repeat: bool = False  # a pass at every failure while budget is left (and the last pass evicted something)
    cost_model: CostModel | None = None
    budget: int | None = None  # pods it may still evict; set at the first pass
    evicted: int = 0  # pods evicted so far (re-placed ones count as moves in the stats, the others as lost)
    passes: int = 0

    def __post_init__(self) -> None:
        if self.policy not in DESCHEDULE_POLICIES:
            raise ValueError(f"unknown deschedule policy {self.policy!r} ({' | '.join(DESCHEDULE_POLICIES)})")
        if not 0 <= self.ratio <= 1:
            raise ValueError(f"the deschedule ratio must be in 0..1, got {self.ratio}")

    def rescue(self, cl: Cluster, pod: Pod, placed: Placed, policy: PlacementPolicy, rng: np.random.Generator,
               stats: MoveStats) -> Choice | None:
        if self.budget is None:
            self.budget = math.ceil(self.ratio * len(placed.pods))
        elif not self.repeat or self.budget <= 0:
            return None
        if self.deschedule(cl, placed, policy, rng, stats) == 0:
            self.budget = 0  # nothing to evict now: later passes would find the same
        choice = policy.choose(cl, pod, rng)
        if choice is not None:
            cl.place(pod, choice)
        return choice

    def deschedule(self, cl: Cluster, placed: Placed, policy: PlacementPolicy, rng: np.random.Generator,
                   stats: MoveStats) -> int:
        """One pass: choose and evict the victims (within the budget left), then re-place them through
        `policy`; returns how many it evicted."""
        if self.budget is None:
            self.budget = math.ceil(self.ratio * len(placed.pods))
        victims = self.victims(cl, placed, self.budget)
        self.budget -= len(victims)
        self.evicted += len(victims)
        self.passes += 1
        for pid in victims:  # take them all off first, as the authors delete before they re-schedule
            cl.remove(*placed.pods[pid])
        for pid in victims:
            p, was = placed.pods[pid]
            ch = policy.choose(cl, p, rng)
            if ch is None:
                placed.drop(pid)
                stats.evictions += 1
                stats.evicted_lost += 1
                stats.evicted_lost_milli += p.gpu_total
                continue
            cl.place(p, ch)
            placed.move(pid, ch)
            stats.moves += 1
            b = checkpoint_bytes(p, cl.models[was.node])
            stats.moved_milli += p.gpu_total
            stats.moved_bytes += b
            stats.move_seconds += move_seconds(b, self.cost_model)
        return len(victims)

    # ------------------------------------------------------------------------------------ victims
    def victims(self, cl: Cluster, placed: Placed, budget: int) -> list[int]:
        """The pods to evict, in order (the cluster is left as it was)."""
        if budget <= 0:
            return []
        if self.policy == "cosSim":
            return self._cos_sim(cl, placed, budget)
        rank = cl.rank if cl.rank is not None else np.arange(cl.n)
        frag = node_frag(cl)
        if self.policy == "fragOnePod":
            out = []
            for n in np.lexsort((rank, -frag)):
                if len(out) >= budget or frag[n] < 1:  # F_n' ≥ 0: below one milli-GPU nothing can gain
                    break
                v = self._frag_victim(cl, placed, int(n), float(frag[n]), set())
                if v is not None:
                    out.append(v[0])
            return out
        # fragMultiPod: a node that gave up a pod is scored again with what it has left
        heap = [(-float(frag[n]), int(rank[n]), int(n)) for n in range(cl.n)]
        heapq.heapify(heap)
        out, gone = [], set()
        try:
            while heap and len(out) < budget:
                f, r, n = heapq.heappop(heap)
                if -f < 1:
                    break
                v = self._frag_victim(cl, placed, n, -f, gone)
                if v is None:
                    continue
                out.append(v[0])
                gone.add(v[0])
                cl.remove(*placed.pods[v[0]])  # the node as it is after this eviction
                heapq.heappush(heap, (-v[1], r, n))
        finally:
            for pid in gone:
                cl.place(*placed.pods[pid])
        return out

    def _frag_victim(self, cl: Cluster, placed: Placed, n: int, f_now: float,
                     gone: set[int]) -> tuple[int, float] | None:
        """The pod of node n whose removal lowers F_n(M) by the most whole milli-GPU (> 0), and F_n after."""
        ids = [i for i in placed.on(n) if i not in gone]
        if not ids:
            return None
        after = frag_without(cl, n, [placed.pods[i] for i in ids])
        gain = np.trunc(f_now - after)  # their score is an int64 conversion of the difference
        best = int(np.argmax(gain))  # the first pod among equals, as their strict '>' keeps the first
        if gain[best] <= 0:
            return None
        return ids[best], float(after[best])

    def _cos_sim(self, cl: Cluster, placed: Placed, budget: int) -> list[int]:
        left = cl.gpu_left
        ok = (cl.cpu_free < COS_CPU_BAR) & (np.where(cl.free >= 0, cl.free, 0) > COS_GPU_BAR).any(axis=1)
        names = np.array(cl.names)
        out: list[int] = []
        for n in np.lexsort((names, -left)):
            if len(out) >= budget:
                break
            if not ok[n]:
                continue
            best, best_sim = None, 1.0
            for i in placed.on(int(n)):
                p, _ = placed.pods[i]
                free = np.array([cl.cpu_free[n] + p.cpu_milli, left[n] + p.gpu_total], dtype=np.float64)
                req = np.array([p.cpu_milli, p.gpu_total], dtype=np.float64)
                norm = float(np.linalg.norm(free) * np.linalg.norm(req))
                if norm == 0:
                    continue
                sim = float(free @ req) / norm
                if 0 <= sim < best_sim:
                    best, best_sim = i, sim
            if best is not None:
                out.append(best)
        return out
