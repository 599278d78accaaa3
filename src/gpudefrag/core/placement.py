"""Placement policies: where the next pod lands, chosen with NumPy over every node at once.

The six policies of Weng et al. (ATC '23) as their released simulator implements them (random, dotproduct,
gpuclustering, gpupacking, bestfit, fgd), plus the operators' everyday first-fit and spread. Each policy scores
the nodes a pod fits on, keeps the best integer score (the Kubernetes scheduler framework's 0–100 scale, so the
same ties arise) and breaks ties uniformly at random among the best nodes, as kube-scheduler's selectHost does.
A GPU-sharing pod (one GPU, share < 1000 milli) also gets a GPU inside the node: the policy's own choice for FGD
(least fragmentation) and random (any fitting GPU), best fit (the fullest GPU that fits) for the others.
Whole-GPU pods take the first wholly free GPUs by index.

`Cluster` holds the mutable arrays the policies read (free milli-GPU per GPU, free CPU and memory, GPU model,
pod tags per node for GPU clustering, and the FGD per-shape caches); `Cluster.place` / `Cluster.remove` keep
them consistent. The static and dynamic simulators and the live engines share this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .capacity import Capacity, Shape, model_allowed
from .fragmentation import WorkloadMix
from .model import MILLI, NOT_TRACKED, ClusterState, Node, Placement, Request, Workload, workload_row

MAX_SPEC_CPU = 128_000  # milli-cores: the normaliser of the authors' dot-product and best-fit scores
MAX_SPEC_GPU = 8_000  # milli-GPU: likewise (an 8-GPU node)
MAX_SCORE = 100
N_TAGS = 9  # GPU-clustering tags: 0 = share-gpu, k = k-gpu (1..8)


Pod = Shape  # the placement policies' name for the one request shape (core/capacity.py)


@dataclass(frozen=True, slots=True)
class Choice:
    node: int
    gpus: tuple[int, ...]


@dataclass(eq=False)
class Cluster(Capacity):
    """The policies' view of a cluster: the capacity model (`free`, `cpu_free`, `mem_free`, see
    core/capacity.py) plus per node its name, GPU model, CPU capacity, pod tags for GPU clustering and the FGD
    per-shape cache, which `take` / `give` (and a rollback) keep current."""

    names: tuple[str, ...]
    models: tuple[str | None, ...]
    free: np.ndarray
    cpu_free: np.ndarray
    mem_free: np.ndarray
    cpu_cap: np.ndarray
    mix: WorkloadMix | None = None
    rank: np.ndarray | None = None  # tie-break order of the nodes (lowest first); None = uniformly at random
    tags: np.ndarray = field(init=False)
    _model_masks: dict[tuple[str, ...], np.ndarray] = field(init=False, default_factory=dict)
    _fgd: _FgdCache | None = field(init=False, default=None)
    _dirty: set[int] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        Capacity.__init__(self, self.free, self.cpu_free, self.mem_free)
        self.cpu_cap = np.asarray(self.cpu_cap, dtype=np.int64).copy()
        self.tags = np.zeros((len(self.names), N_TAGS), dtype=np.int32)
        self.gpu_count = (self.free >= 0).sum(axis=1).astype(np.int32)

    # ------------------------------------------------------------------------------------ construction
    @staticmethod
    def build(
        names: Sequence[str],
        gpu_counts: Sequence[int],
        models: Sequence[str | None],
        cpu_milli: Sequence[int],
        memory_mib: Sequence[int],
        mix: WorkloadMix | None = None,
    ) -> Cluster:
        """An empty cluster. A CPU or memory capacity of 0 means 'not tracked' (never a limit)."""
        counts = np.asarray(gpu_counts, dtype=np.int32)
        g = max(int(counts.max(initial=0)), 1)
        free = np.where(np.arange(g)[None, :] < counts[:, None], MILLI, -1)
        cpu = np.asarray(cpu_milli, dtype=np.int64)
        mem = np.asarray(memory_mib, dtype=np.int64)
        return Cluster(
            tuple(names), tuple(models), free,
            np.where(cpu > 0, cpu, NOT_TRACKED), np.where(mem > 0, mem, NOT_TRACKED),
            np.where(cpu > 0, cpu, NOT_TRACKED), mix,
        )

    @staticmethod
    def from_state(state: ClusterState, mix: WorkloadMix | None = None) -> Cluster:
        """The arrays of a snapshot, running workloads included (unschedulable nodes get no free GPU)."""
        free = np.where(state.schedulable_mask[:, None] | (state.free_milli < 0), state.free_milli, 0)
        cpu_cap = np.fromiter((n.cpu_milli for n in state.nodes), dtype=np.int64, count=len(state.nodes))
        cl = Cluster(
            tuple(n.name for n in state.nodes), tuple(n.gpu_model for n in state.nodes), free,
            state.cpu_free, state.mem_free, np.where(cpu_cap > 0, cpu_cap, NOT_TRACKED), mix,
        )
        idx = state.node_index
        for w in state.running:
            tag = Shape.of(w.request).tag
            if tag >= 0:
                for p in w.placements:
                    cl.tags[idx[p.node], tag] += 1
        return cl

    def to_state(self, running: Iterable[Workload], pending: Iterable[Workload] = (), *, now: float = 0.0,
                 name: str = "cluster", known_rows: np.ndarray | Sequence[tuple[int, ...]] | None = None,
                 known_gpus: np.ndarray | None = None,
                 known_verdicts: tuple[Callable[[Workload], bool], np.ndarray] | None = None) -> ClusterState:
        """The reverse of `from_state`: these arrays as a snapshot, so the one decision (`core.decision`) can
        judge a simulated cluster. `running` are the workloads the caller knows (placed on these nodes by
        name); whatever else the arrays hold (a snapshot's background load, an unschedulable node's GPUs, CPU
        and memory not accounted for) becomes immovable `background-…` workloads, so the state's free arrays
        equal these. CPU or memory not tracked here (`NOT_TRACKED`) is not tracked there either.

        `known_rows`: `model.workload_row` of each of `running`, when the caller keeps them between calls (the
        replay, which asks this at every decision); with `known_gpus` too (per workload the GPU indices it
        holds, padded with -1) and every workload on one node, the known workloads' use is summed from those
        arrays instead of a walk over their placements (4,000 jobs per decision). `known_verdicts`: a filter and
        its verdict on each of `running` (`ClusterState.from_totals`; the background may never move)."""
        run = tuple(running)
        n, g = self.free.shape
        idx = self._name_index()
        rows = None if known_rows is None else np.asarray(known_rows, dtype=np.int64).reshape(-1, 9)
        if rows is not None and known_gpus is not None and bool((rows[:, 7] == 1).all()):
            used, cpu_used, mem_used = _use_of_rows(rows, known_gpus, n, g)
        else:
            used, cpu_used, mem_used = _use_of(run, idx, n, g)
        cpu_tracked = self.cpu_cap < NOT_TRACKED
        mem_tracked = self.mem_free < NOT_TRACKED // 2
        # memory capacity is not kept: what is free plus what the known workloads hold
        mem_cap = np.where(mem_tracked, self.mem_free + mem_used, 0)
        cpu_cap = np.where(cpu_tracked, self.cpu_cap, 0)
        rest_gpu = np.where(self.free >= 0, MILLI - self.free - used, 0)
        rest_cpu = np.where(cpu_tracked, self.cpu_cap - self.cpu_free - cpu_used, 0)
        nodes = self._state_nodes(cpu_cap, mem_cap)
        bg: list[Workload] = []
        for i, gi in zip(*np.nonzero(rest_gpu > 0), strict=True):
            bg.append(Workload(f"background-{self.names[i]}-gpu{gi}", Request(1, 1, int(rest_gpu[i, gi])),
                               placements=(Placement(self.names[i], (int(gi),)),), movable=False,
                               movable_reason="other"))
        for i in np.flatnonzero(rest_cpu > 0):
            bg.append(Workload(f"background-{self.names[i]}-cpu", Request(0, 1, MILLI, int(rest_cpu[i])),
                               placements=(Placement(self.names[i], ()),), movable=False, movable_reason="other"))
        # the totals, background included, are what the arrays hold: the state takes them instead of summing again
        gpu_total = used + np.maximum(rest_gpu, 0)
        cpu_total = cpu_used + np.maximum(rest_cpu, 0)
        running_rows = None
        if rows is not None:  # the caller's `workload_row`s of `running`, kept between calls; the background's added
            running_rows = np.concatenate([rows, np.array([workload_row(b, idx) for b in bg],
                                                          dtype=np.int64).reshape(-1, 9)])
        verdicts = None
        if known_verdicts is not None:
            verdicts = (known_verdicts[0], np.concatenate([known_verdicts[1], np.zeros(len(bg), dtype=bool)]))
        return ClusterState.from_totals(nodes, (*run, *bg, *pending), gpu_total, cpu_total, mem_used, now=now,
                                        name=name, running_rows=running_rows, verdicts=verdicts)

    def _name_index(self) -> dict[str, int]:
        got = self.__dict__.get("_names_at")
        if got is None or got[0] is not self.names:
            got = self.__dict__["_names_at"] = (self.names, {nm: i for i, nm in enumerate(self.names)})
        return got[1]

    def _state_nodes(self, cpu_cap: np.ndarray, mem_cap: np.ndarray) -> tuple[Node, ...]:
        """The state's nodes (name, GPUs, model, CPU and memory capacity), made again only when a capacity
        differs from the last call's (in a replay: never)."""
        got = self.__dict__.get("_nodes_at")
        if got is not None and np.array_equal(got[0], cpu_cap) and np.array_equal(got[1], mem_cap):
            return got[2]  # type: ignore[no-any-return]
        nodes = tuple(Node(self.names[i], int(self.gpu_count[i]), self.models[i], cpu_milli=int(cpu_cap[i]),
                           memory_mib=int(mem_cap[i])) for i in range(len(self.names)))
        self.__dict__["_nodes_at"] = (cpu_cap.copy(), mem_cap.copy(), nodes)
        return nodes

    def copy(self) -> Cluster:  # type: ignore[override]
        c = Cluster(self.names, self.models, self.free, self.cpu_free, self.mem_free, self.cpu_cap, self.mix,
                    None if self.rank is None else self.rank.copy())
        c.tags = self.tags.copy()
        c._model_masks = self._model_masks
        return c

    # ------------------------------------------------------------------------------------ queries
    def model_mask(self, models: tuple[str, ...]) -> np.ndarray:
        m = self._model_masks.get(models)
        if m is None:
            allowed = frozenset(models)
            m = np.fromiter((model_allowed(allowed, x) for x in self.models), dtype=bool, count=self.n)
            self._model_masks[models] = m
        return m

    def fits(self, pod: Pod) -> np.ndarray:
        """Nodes where the pod can be placed now: the capacity model's fit and the pod's GPU models."""
        ok = Capacity.fits(self, pod)
        if pod.num_gpu > 0 and pod.gpu_models:
            ok &= self.model_mask(pod.gpu_models)
        return ok

    @property
    def is_empty(self) -> bool:
        """No GPU share and no CPU taken (memory keeps no capacity of its own to compare with): then the free
        arrays are the capacities, which the offline bounds and packing read."""
        return bool(((self.free == MILLI) | (self.free < 0)).all() and (self.cpu_free == self.cpu_cap).all())

    @property
    def capacity_milli(self) -> int:
        return int(self.gpu_count.sum()) * MILLI

    @property
    def allocated_milli(self) -> int:
        return self.capacity_milli - int(self.gpu_left.sum())

    def allocated_share(self, models: tuple[str, ...] = ()) -> float:
        """The share of the GPU capacity in use on the nodes of `models` (every node when empty): how full the
        pool is that a pod naming those models may use."""
        mask = self.model_mask(models)
        cap = int(self.gpu_count[mask].sum()) * MILLI
        return 1.0 - int(self.gpu_left[mask].sum()) / cap if cap else 1.0

    def fragmentation(self) -> np.ndarray:
        """F_n(M) per node in milli-GPU for the cluster's workload mix."""
        return self._fgd_cache().frag.copy()

    # ------------------------------------------------------------------------------------ mutation
    def place(self, pod: Pod, choice: Choice) -> None:
        self.take(choice.node, choice.gpus, pod)

    def remove(self, pod: Pod, choice: Choice) -> None:
        """Undo `place` (a pod leaves, is moved away or evicted)."""
        self.give(choice.node, choice.gpus, pod)

    def _change(self, node: int, gpus: tuple[int, ...], shape: Shape, sign: int) -> None:
        Capacity._change(self, node, gpus, shape, sign)
        tag = shape.tag
        if tag >= 0:
            self.tags[node, tag] -= sign

    def _changed(self, node: int) -> None:
        if self._fgd is not None:
            self._dirty.add(node)  # refreshed when the measure is next read (a search changes rows many times)

    def _fgd_cache(self) -> _FgdCache:
        if self._fgd is None:
            if self.mix is None:
                raise ValueError("the FGD measure needs a workload mix (Cluster.mix)")
            self._fgd = _FgdCache(self, self.mix)
            self._dirty.clear()
        elif self._dirty:
            self._fgd.refresh(self, np.fromiter(self._dirty, dtype=np.int64, count=len(self._dirty)))
            self._dirty.clear()
        return self._fgd


# ---------------------------------------------------------------------------------------------- FGD
class _FgdCache:
    """Per node and mix shape: GPUs with enough share free, the too-small free pieces, and F_n(M).

    Placing a pod changes one node, so only that row is recomputed; a candidate placement is evaluated in O(M)
    from the row (no copy of the node), for every candidate node and GPU at once.
    """

    def __init__(self, cl: Cluster, mix: WorkloadMix) -> None:
        shapes = mix.shapes
        self.k = np.array([s.num_gpu for s in shapes], dtype=np.int64)
        self.d = np.array([min(s.gpu_milli, MILLI) if s.num_gpu else 0 for s in shapes], dtype=np.int64)
        self.c = np.array([s.cpu_milli for s in shapes], dtype=np.int64)
        self.p = np.array(mix.weights, dtype=np.float64)
        self.gpu_task = self.k > 0
        self.allowed = np.stack([cl.model_mask(s.gpu_models) for s in shapes], axis=1)  # N × M
        n, m = cl.n, len(shapes)
        self.cnt = np.zeros((n, m), dtype=np.int64)
        self.small = np.zeros((n, m), dtype=np.int64)
        self.frag = np.zeros(n, dtype=np.float64)
        self.refresh(cl, np.arange(n))

    def refresh(self, cl: Cluster, rows: np.ndarray) -> None:
        f = cl.free[rows].astype(np.int64)[:, :, None]  # R × G × 1
        d = self.d[None, None, :]
        self.cnt[rows] = ((f >= d) & (f >= 0)).sum(axis=1)
        self.small[rows] = np.where((f >= 0) & (f < d), f, 0).sum(axis=1)
        total = np.where(cl.free[rows] > 0, cl.free[rows], 0).sum(axis=1).astype(np.int64)
        self.frag[rows] = self._frag(rows, self.cnt[rows], self.small[rows], total, cl.cpu_free[rows])

    def _frag(self, rows: np.ndarray, cnt: np.ndarray, small: np.ndarray, total: np.ndarray,
              cpu: np.ndarray) -> np.ndarray:
        fits = self.allowed[rows] & (cpu[:, None] >= self.c[None, :]) & (cnt >= self.k[None, :]) & self.gpu_task
        per = np.where(fits, small, total[:, None])
        return per.astype(np.float64) @ self.p

    def after(self, cl: Cluster, rows: np.ndarray, f_old: np.ndarray, pod: Pod) -> np.ndarray:
        """F_n(M) after placing `pod` on node rows[i] using `num_gpu` GPUs that each had f_old[i] free."""
        k = pod.num_gpu
        d = self.d[None, :]
        fo = f_old.astype(np.int64)[:, None]
        fn = fo - pod.gpu_milli if k else fo
        cnt = self.cnt[rows] + k * (((fn >= d).astype(np.int64)) - (fo >= d))
        small = self.small[rows] + k * (np.where(fn < d, fn, 0) - np.where(fo < d, fo, 0))
        total = np.where(cl.free[rows] > 0, cl.free[rows], 0).sum(axis=1).astype(np.int64) - pod.gpu_total
        return self._frag(rows, cnt, small, total, cl.cpu_free[rows] - pod.cpu_milli)


def fgd_score(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """The authors' integer node score: int(100 · sigmoid((F_n − F_n')/1000)), F in milli-GPU."""
    x = np.clip((before - after) / 1000.0, -50, 50)
    return np.floor(MAX_SCORE / (1.0 + np.exp(-x)) + 1e-9).astype(np.int64)


# ---------------------------------------------------------------------------------------------- helpers
def _pick(nodes: np.ndarray, scores: np.ndarray, rng: np.random.Generator, rank: np.ndarray | None = None) -> int:
    """The best-scored node; ties go to the lowest `rank` when given, else uniformly at random."""
    best = np.flatnonzero(scores == scores.max())
    if len(best) == 1:
        return int(nodes[best[0]])
    if rank is not None:
        return int(nodes[best[np.argmin(rank[nodes[best]])]])
    return int(nodes[best[rng.integers(len(best))]])


def gpus_for(cl: Cluster, node: int, pod: Pod, how: str, rng: np.random.Generator) -> tuple[int, ...]:
    """The GPUs a pod that fits `node` takes there: the capacity model's picker (core/capacity.pick_gpus)."""
    got = cl.pick(node, pod, how, rng)
    assert got is not None, "gpus_for is only asked about a node the pod fits"
    return got


class PlacementPolicy(Protocol):
    name: str

    def choose(self, cl: Cluster, pod: Pod, rng: np.random.Generator) -> Choice | None: ...


class _Scored:
    """A policy that gives every fitting node an integer score; the highest wins, ties at random."""

    name = "scored"
    gpu_choice = "best"

    def scores(self, cl: Cluster, pod: Pod, nodes: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def choose(self, cl: Cluster, pod: Pod, rng: np.random.Generator) -> Choice | None:
        nodes = np.flatnonzero(cl.fits(pod))
        if len(nodes) == 0:
            return None
        node = _pick(nodes, self.scores(cl, pod, nodes), rng, cl.rank)
        return Choice(node, gpus_for(cl, node, pod, self.gpu_choice, rng))


class RandomPolicy:
    """Any fitting node, any fitting GPU, uniformly at random."""

    name = "random"

    def choose(self, cl: Cluster, pod: Pod, rng: np.random.Generator) -> Choice | None:
        nodes = np.flatnonzero(cl.fits(pod))
        if len(nodes) == 0:
            return None
        node = int(nodes[rng.integers(len(nodes))])
        return Choice(node, gpus_for(cl, node, pod, "random", rng))


class DotProductPolicy(_Scored):
    """Tetris alignment: the smallest dot product of (free CPU, free GPU) and the request, both over the max
    node spec; score int(100 · (1 − dot/2))."""

    name = "dotproduct"

    def scores(self, cl: Cluster, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        dot = (cl.cpu_free[nodes] / MAX_SPEC_CPU) * (pod.cpu_milli / MAX_SPEC_CPU)
        dot = dot + (cl.gpu_left[nodes] / MAX_SPEC_GPU) * (pod.gpu_total / MAX_SPEC_GPU)
        return np.floor(MAX_SCORE * (1.0 - dot / 2.0) + 1e-9).astype(np.int64)


class BestFitPolicy(_Scored):
    """The least leftover: 0.5 · (free CPU − c)/128 cores + 0.5 · (free GPU − request)/8 GPUs."""

    name = "bestfit"

    def scores(self, cl: Cluster, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        left = 0.5 * (cl.cpu_free[nodes] - pod.cpu_milli) / MAX_SPEC_CPU
        left = left + 0.5 * (cl.gpu_left[nodes] - pod.gpu_total) / MAX_SPEC_GPU
        return np.floor((1.0 - left) * MAX_SCORE + 1e-9).astype(np.int64)


class GpuPackingPolicy(_Scored):
    """Three bands: fit on partly used GPUs (fuller is better), else break fresh GPUs on a used node (fewer is
    better), else an idle node (smaller is better). CPU-only pods score 0 everywhere."""

    name = "gpupacking"

    def scores(self, cl: Cluster, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        if pod.num_gpu == 0:
            return np.zeros(len(nodes), dtype=np.int64)
        free = cl.free[nodes].astype(np.int64)
        whole = (free == MILLI).sum(axis=1)
        idle = whole == cl.gpu_count[nodes]
        s_idle = np.maximum(MAX_SCORE // 3 - whole, whole)
        if pod.is_sharing:
            # the single GPU used is the least-free one that fits
            cand = np.where(free >= pod.gpu_milli, free, MILLI + 1)
            left = cand.min(axis=1)
            s_used = np.where(left == MILLI, MAX_SCORE // 2 - 1,
                              np.maximum(MAX_SCORE - (left * 100 // MILLI) // 10, MAX_SCORE // 2))
        else:
            s_used = np.full(len(nodes), max(MAX_SCORE // 2 - pod.num_gpu, MAX_SCORE // 3), dtype=np.int64)
        return np.where(idle, s_idle, s_used)


class GpuClusteringPolicy(_Scored):
    """Pods of one kind together: nodes running only this pod's tag, then mixed nodes with it, then empty
    nodes, then nodes with only other tags; within a band, fuller nodes first."""

    name = "gpuclustering"

    def scores(self, cl: Cluster, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        if pod.tag < 0:
            return np.zeros(len(nodes), dtype=np.int64)
        tags = cl.tags[nodes]
        kinds = (tags > 0).sum(axis=1)
        mine = tags[:, pod.tag] > 0
        band = np.where(mine, np.where(kinds == 1, 75, 50), np.where(kinds == 0, 25, 0))
        fill = (MAX_SCORE // 4) * (MAX_SPEC_GPU - cl.gpu_left[nodes].astype(np.int64)) // MAX_SPEC_GPU
        return fill + band


class FirstFitPolicy:
    """The first fitting node by index; GPUs best fit."""

    name = "firstfit"

    def choose(self, cl: Cluster, pod: Pod, rng: np.random.Generator) -> Choice | None:
        nodes = np.flatnonzero(cl.fits(pod))
        if len(nodes) == 0:
            return None
        node = int(nodes[0])
        return Choice(node, gpus_for(cl, node, pod, "best", rng))


class SpreadPolicy(_Scored):
    """The node with the most free GPU (then CPU): spreads load, the opposite of packing."""

    name = "spread"

    def scores(self, cl: Cluster, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        return cl.gpu_left[nodes].astype(np.int64) * MAX_SPEC_CPU * 2 + cl.cpu_free[nodes] // 1

    def choose(self, cl: Cluster, pod: Pod, rng: np.random.Generator) -> Choice | None:
        nodes = np.flatnonzero(cl.fits(pod))
        if len(nodes) == 0:
            return None
        node = _pick(nodes, self.scores(cl, pod, nodes), rng, cl.rank)
        return Choice(node, gpus_for(cl, node, pod, "empty", rng))  # the emptiest GPU: the opposite of best fit


class FgdPolicy:
    """Fragmentation gradient descent: the node (and, for a sharing pod, the GPU) whose placement increases the
    expected fragmentation F_n(M) the least; needs `Cluster.mix`."""

    name = "fgd"

    def choose(self, cl: Cluster, pod: Pod, rng: np.random.Generator) -> Choice | None:
        nodes = np.flatnonzero(cl.fits(pod))
        if len(nodes) == 0:
            return None
        cache = cl._fgd_cache()
        if not pod.is_sharing:
            f_old = np.full(len(nodes), MILLI if pod.num_gpu else 0, dtype=np.int64)
            score = fgd_score(cache.frag[nodes], cache.after(cl, nodes, f_old, pod))
            node = _pick(nodes, score, rng, cl.rank)
            return Choice(node, gpus_for(cl, node, pod, "best", rng))
        # candidate (node, GPU) pairs: each distinct free value once per node, at its first GPU index
        free = cl.free[nodes]
        g = free.shape[1]
        same_before = (free[:, :, None] == free[:, None, :]) & np.tril(np.ones((g, g), dtype=bool), -1)[None]
        first = ~same_before.any(axis=2)
        rows, gpus = np.nonzero(first & (free >= pod.gpu_milli))
        cand_nodes = nodes[rows]
        score = fgd_score(cache.frag[cand_nodes], cache.after(cl, cand_nodes, free[rows, gpus], pod))
        # per node: best score, then the lowest GPU index; then the best node, ties at random
        order = np.lexsort((gpus, -score, rows))
        head = order[np.r_[True, rows[order][1:] != rows[order][:-1]]]
        best = head[score[head] == score[head].max()]
        if len(best) == 1:
            pick = best[0]
        elif cl.rank is not None:
            pick = best[np.argmin(cl.rank[cand_nodes[best]])]
        else:
            pick = best[rng.integers(len(best))]
        return Choice(int(cand_nodes[pick]), (int(gpus[pick]),))


POLICIES: dict[str, PlacementPolicy] = {
    p.name: p
    for p in (
        RandomPolicy(), DotProductPolicy(), GpuClusteringPolicy(), GpuPackingPolicy(), BestFitPolicy(),
        FgdPolicy(), FirstFitPolicy(), SpreadPolicy(),
    )
}
FGD_STUDY_POLICIES = ("random", "dotproduct", "gpuclustering", "gpupacking", "bestfit", "fgd")


def get_policy(name: str) -> PlacementPolicy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown placement policy {name!r}; choose from {', '.join(POLICIES)}") from None


def _use_of(run: Sequence[Workload], idx: dict[str, int], n: int, g: int) -> tuple[np.ndarray, ...]:
    """What the workloads `run` use: milli-GPU per node and GPU (n × g), CPU and memory per node, summed over
    every placement."""
    rows: list[int] = []
    cols: list[int] = []
    shares: list[int] = []
    at: list[int] = []
    cpus: list[int] = []
    mems: list[int] = []
    for w in run:
        r = w.request
        for p in w.placements:
            i = idx[p.node]
            at.append(i)
            cpus.append(r.cpu_milli)
            mems.append(r.memory_mib)
            rows.extend([i] * len(p.gpus))
            cols.extend(p.gpus)
            shares.extend([r.gpu_milli] * len(p.gpus))
    return _summed(np.asarray(rows, dtype=np.int64) * g + np.asarray(cols, dtype=np.int64),
                   np.asarray(shares, dtype=np.int64), np.asarray(at, dtype=np.int64),
                   np.asarray(cpus, dtype=np.int64), np.asarray(mems, dtype=np.int64), n, g)


def _use_of_rows(rows: np.ndarray, gpus: np.ndarray, n: int, g: int) -> tuple[np.ndarray, ...]:
    """`_use_of` from arrays, for workloads on one node each: their `workload_row`s (node, share, CPU and memory
    columns) and per workload the GPU indices it holds, padded with -1."""
    node = rows[:, 0]
    held = gpus >= 0
    return _summed((node[:, None] * g + gpus)[held], np.broadcast_to(rows[:, 3:4], gpus.shape)[held], node,
                   rows[:, 4], rows[:, 5], n, g)


def _summed(cell: np.ndarray, share: np.ndarray, at: np.ndarray, cpu: np.ndarray, mem: np.ndarray, n: int,
            g: int) -> tuple[np.ndarray, ...]:
    """Per GPU cell (node × g + GPU) the shares, per node the CPU and memory, summed: (used, cpu, mem)."""
    used = np.bincount(cell, weights=share.astype(np.float64), minlength=n * g).astype(np.int64).reshape(n, g)
    cpu_used = np.bincount(at, weights=cpu.astype(np.float64), minlength=n).astype(np.int64)
    mem_used = np.bincount(at, weights=mem.astype(np.float64), minlength=n).astype(np.int64)
    return used, cpu_used, mem_used
