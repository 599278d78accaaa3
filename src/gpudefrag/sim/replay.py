"""The static replay of the FGD study (Weng et al., ATC '23), on NumPy arrays.

Method, as the authors' released experiments run it: shuffle the trace's pods with the seed; resample with
replacement (appending) until the GPU request reaches `tune` × cluster capacity (or drop random pods when it is
already above); schedule the pods one at a time; a pod never leaves; a pod that fits nowhere fails and the run
goes on. After each pod the run records the *arrived workload* x = Σ GPU request of the pods submitted so far /
capacity and the *GPU allocation rate* = allocated milli-GPU / capacity (unallocated GPU % = 100 − rate).
The per-percent curve takes, for each integer k, the mean allocation over the pods whose arrived workload
rounds to k (the authors' "discrete" tables); FGD fragmentation is recorded at the end of each such bucket.

A `Defragmenter` may be attached: when a pod fits nowhere, it may move placed pods (migrations) or evict
them (they re-enter the queue) to make room; the run counts what that costs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from ..core.model import MILLI
from ..core.placement import Choice, Cluster, PlacementPolicy, Pod, get_policy

CURVE_MAX = 130  # percent of capacity: the study's x axis


def percentile_curve(curves: np.ndarray | Sequence[np.ndarray], q: float = 50.0) -> np.ndarray:
    """The q-th percentile (the median by default) over runs (axis 0) of curves indexed by arrived %, ignoring
    NaN. A point no run reached (a short pod list never arrives at 130 %) stays NaN, without numpy's all-NaN
    warning: that is the answer."""
    a = np.asarray(curves, dtype=float)
    out = np.full(a.shape[1:], np.nan)
    reached = ~np.isnan(a).all(axis=0)
    out[reached] = np.nanpercentile(a[:, reached], q, axis=0)
    return out


def build_workload(pods: Sequence[Pod], capacity_milli: int, seed: int, tune: float = 1.3) -> list[Pod]:
    """Shuffle with the seed, then resample with replacement until Σ GPU request ≥ tune × capacity (or drop
    random pods while it is above)."""
    rng = np.random.default_rng(seed)
    order = [pods[i] for i in rng.permutation(len(pods))]
    target = tune * capacity_milli
    total = sum(p.gpu_total for p in order)
    if tune <= 0:
        return order
    if total < target:
        reqs = np.fromiter((p.gpu_total for p in pods), dtype=np.int64, count=len(pods))
        if reqs.sum() <= 0:
            raise ValueError("the trace asks for no GPU at all; it cannot be tuned to a GPU load")
        while total < target:
            batch = rng.integers(len(pods), size=1024)
            for i in batch:
                order.append(pods[i])
                total += int(reqs[i])
                if total >= target:
                    break
    else:
        while total > target and order:
            j = int(rng.integers(len(order)))
            total -= order.pop(j).gpu_total
    return order


@dataclass
class MoveStats:
    moves: int = 0
    evictions: int = 0
    moved_milli: int = 0  # GPU share moved (milli-GPU)
    moved_bytes: float = 0.0  # checkpoint bytes moved (see sim/costs.py)
    move_seconds: float = 0.0  # downtime of the moves (core.cost)
    moved_gpu_s: float = 0.0  # the moves' score as the planner prices them (core.cost: GPU-seconds)
    rescued: int = 0  # pods placed only thanks to moves
    evicted_lost: int = 0  # evicted pods that found no room again (their work and their place are lost)
    evicted_lost_milli: int = 0
    multi_gpu_failed_clearable: int = 0  # multi-GPU pods that failed although moves could have cleared a node
    multi_gpu_failed_over_budget: int = 0  # ... but only with more moves or bytes than the rescue's limits allow


class Defragmenter(Protocol):
    """Called when `pod` fits nowhere; may move or evict placed pods (updating `placed`, the cluster and
    `stats`), then places the pod itself and returns where, or returns None with the cluster unchanged
    (an eviction may still have happened)."""

    def rescue(self, cl: Cluster, pod: Pod, placed: Placed, policy: PlacementPolicy, rng: np.random.Generator,
               stats: MoveStats) -> Choice | None: ...


@dataclass
class Placed:
    """The pods on the cluster: id → (pod, choice), the ids per node and per GPU, the pod count per GPU, and
    per pod id its node, first GPU and share as arrays (`sharing_rows`), and per GPU pod its GPU shape, node, CPU
    and memory (`gpu_rows`), for the repacker's vectorised scans."""

    npods: np.ndarray  # nodes × GPUs
    pods: dict[int, tuple[Pod, Choice]] = field(default_factory=dict)
    by_node: dict[int, set[int]] = field(default_factory=dict)
    by_gpu: dict[tuple[int, int], set[int]] = field(default_factory=dict)
    next_id: int = 0
    _where: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), dtype=np.int64))  # node, GPU, share, on
    _gpu: np.ndarray = field(default_factory=lambda: np.zeros((0, 5), dtype=np.int64))  # shape, node, CPU, mem, on
    _shapes: dict[tuple[int, int, tuple[str, ...]], int] = field(default_factory=dict)  # GPU shape → its number
    _content: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)  # (node, GPU) → its shares
    _stamp: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # bumped per add, move, drop

    @staticmethod
    def for_cluster(cl: Cluster) -> Placed:
        return Placed(np.zeros(cl.free.shape, dtype=np.int32))

    def _index(self, pid: int, pod: Pod, choice: Choice, delta: int) -> None:
        n = choice.node
        self._stamp[pid] += 1
        if delta > 0:
            self.by_node.setdefault(n, set()).add(pid)
        else:
            self.by_node[n].discard(pid)
        for g in choice.gpus:
            self.npods[n, g] += delta
            if delta > 0:
                here = self.by_gpu.setdefault((n, g), set())
                here.add(pid)
            else:
                here = self.by_gpu[(n, g)]
                here.discard(pid)
            self._content[(n, g)] = tuple(sorted(self.pods[p][0].gpu_milli for p in here))
        if pod.is_sharing:
            self._where[pid] = (n, choice.gpus[0], pod.gpu_milli, 1 if delta > 0 else 0)
        if pod.num_gpu > 0:
            shape = self._shapes.setdefault(gpu_shape(pod), len(self._shapes))
            self._gpu[pid] = (shape, n, pod.cpu_milli, pod.memory_mib, 1 if delta > 0 else 0)

    def add(self, pod: Pod, choice: Choice) -> int:
        pid = self.next_id
        self.next_id += 1
        if pid >= len(self._where):
            rows = max(1024, 2 * len(self._where))
            self._where = np.concatenate([self._where, np.zeros((rows - len(self._where), 4), dtype=np.int64)])
            self._gpu = np.concatenate([self._gpu, np.zeros((rows - len(self._gpu), 5), dtype=np.int64)])
            self._stamp = np.concatenate([self._stamp, np.zeros(rows - len(self._stamp), dtype=np.int64)])
        self.pods[pid] = (pod, choice)
        self._index(pid, pod, choice, 1)
        return pid

    def move(self, pid: int, choice: Choice) -> None:
        pod, old = self.pods[pid]
        self._index(pid, pod, old, -1)
        self.pods[pid] = (pod, choice)
        self._index(pid, pod, choice, 1)

    def drop(self, pid: int) -> tuple[Pod, Choice]:
        pod, ch = self.pods.pop(pid)
        self._index(pid, pod, ch, -1)
        return pod, ch

    def on(self, node: int, gpu: int | None = None) -> list[int]:
        """Pod ids on the node (or on one GPU of it), in id order."""
        if gpu is None:
            return sorted(self.by_node.get(node, ()))
        return sorted(self.by_gpu.get((node, gpu), ()))

    def content(self, node: int, gpu: int) -> tuple[int, ...]:
        """The shares of the pods on one GPU, ascending (what the pool repacker tells GPUs apart by)."""
        return self._content.get((node, gpu), ())

    def sharing_rows(self) -> np.ndarray:
        """Per pod id (rows up to next_id): node, GPU, share, 1 if a placed sharing pod (else 0)."""
        return self._where[: self.next_id]

    def stamps(self) -> np.ndarray:
        """Per pod id (up to next_id): a count bumped whenever the pod is placed, moved or dropped, so a caller
        that keeps something per pod between calls (the replay's decision input) finds the pods that changed
        with one comparison instead of a walk over every placed pod."""
        return self._stamp[: self.next_id]

    def gpu_rows(self) -> tuple[np.ndarray, list[tuple[int, int, tuple[str, ...]]]]:
        """Per pod id (rows up to next_id): GPU shape number, node, CPU, memory, 1 if a placed GPU pod (else 0);
        and the shapes by number."""
        return self._gpu[: self.next_id], list(self._shapes)


def gpu_shape(pod: Pod) -> tuple[int, int, tuple[str, ...]]:
    """What a pod asks of GPUs: pods of one shape can trade places (the repacker's swaps)."""
    return (pod.num_gpu, pod.gpu_milli, pod.gpu_models)


@dataclass
class ReplayResult:
    policy: str
    seed: int
    tune: float
    capacity_milli: int
    arrived_pct: np.ndarray  # after each submitted pod
    alloc_pct: np.ndarray  # allocation rate after each submitted pod
    placed: np.ndarray  # bool per submitted pod
    curve: np.ndarray  # allocation % per arrived-workload percent 0..CURVE_MAX (nan where no pod)
    frag_curve: np.ndarray  # FGD fragmentation, % of capacity, at the end of each percent bucket
    seconds: float
    stats: MoveStats
    requeued: int = 0
    stats_at_100: MoveStats | None = None  # the moves made by the end of the 100 % arrived bucket
    placement: Placed | None = None  # the pods on the cluster at the end (with `keep_placement`)

    @property
    def moves_at_100(self) -> MoveStats:
        """What moving cost up to the study's headline point (100 % arrived), which only those moves shaped."""
        return self.stats_at_100 if self.stats_at_100 is not None else self.stats

    def moves_per_placed_pod(self, upto_100: bool = False) -> float:
        """Moves per placed pod over the run, or up to the end of the 100 % arrived bucket."""
        if not upto_100:
            return self.stats.moves / max(int(self.placed.sum()), 1)
        n = int((self.arrived_pct < 100.5).sum())
        return self.moves_at_100.moves / max(int(self.placed[:n].sum()), 1)

    @property
    def unallocated_curve(self) -> np.ndarray:
        return 100.0 - self.curve

    def unallocated_at(self, pct: int) -> float:
        return float(100.0 - self.curve[pct])

    @property
    def pods(self) -> int:
        return len(self.placed)

    @property
    def failed(self) -> int:
        return int((~self.placed).sum())


def replay(
    cluster: Cluster,
    workload: Sequence[Pod],
    policy: PlacementPolicy | str,
    *,
    seed: int = 42,
    tune: float = 1.3,
    defrag: Defragmenter | None = None,
    record_frag: bool = True,
    tie_break: str = "order",
    progress: Callable[[int, int], None] | None = None,
    keep_placement: bool = False,
) -> ReplayResult:
    """Schedule `workload` in order on (a copy of) `cluster`. Nothing leaves; failures are recorded."""
    t0 = time.perf_counter()
    pol = get_policy(policy) if isinstance(policy, str) else policy
    cl = cluster.copy()
    rng = np.random.default_rng(seed + 1_000_003)
    if tie_break == "order":
        cl.rank = np.random.default_rng(seed + 7).permutation(cl.n)
    elif tie_break == "random":
        cl.rank = None
    cap = cl.capacity_milli
    n = len(workload)
    arrived = np.zeros(n)
    alloc = np.zeros(n)
    ok = np.zeros(n, dtype=bool)
    frag_curve = np.full(CURVE_MAX + 1, np.nan)
    placed = Placed.for_cluster(cl)
    stats = MoveStats()
    req = 0
    allocated = cl.allocated_milli
    bucket = 0
    stats100: MoveStats | None = None
    for j, pod in enumerate(workload):
        req += pod.gpu_total
        x = 100.0 * req / cap
        b = int(np.floor(x + 0.5))
        if record_frag and b != bucket and bucket <= CURVE_MAX:
            frag_curve[bucket] = 100.0 * float(cl._fgd_cache().frag.sum()) / cap
        bucket = b
        if stats100 is None and x >= 100.5:  # the 100 % bucket is over: what moving cost up to there
            stats100 = replace(stats)
        choice = pol.choose(cl, pod, rng)
        if choice is not None:
            cl.place(pod, choice)
        elif defrag is not None:
            choice = defrag.rescue(cl, pod, placed, pol, rng, stats)  # places the pod itself
            if choice is not None:
                stats.rescued += 1
            # evictions may have lost pods; the pod itself is counted below only when it was placed
            allocated = cl.allocated_milli - (pod.gpu_total if choice is not None else 0)
        if choice is not None:
            placed.add(pod, choice)
            allocated += pod.gpu_total
            ok[j] = True
        arrived[j] = x
        alloc[j] = 100.0 * allocated / cap
        if progress is not None and (j % 256 == 0 or j == n - 1):
            progress(j + 1, n)
    if record_frag and bucket <= CURVE_MAX:
        frag_curve[bucket] = 100.0 * float(cl._fgd_cache().frag.sum()) / cap
    return ReplayResult(
        policy=pol.name, seed=seed, tune=tune, capacity_milli=cap, arrived_pct=arrived, alloc_pct=alloc,
        placed=ok, curve=bucket_means(arrived, alloc), frag_curve=frag_curve,
        seconds=time.perf_counter() - t0, stats=stats, stats_at_100=stats100 or replace(stats),
        placement=placed if keep_placement else None,
    )


def bucket_means(arrived: np.ndarray, alloc: np.ndarray, top: int = CURVE_MAX) -> np.ndarray:
    """Mean of `alloc` over the records whose `arrived` rounds to each integer 0..top (nan if none)."""
    b = np.floor(arrived + 0.5).astype(np.int64)
    keep = (b >= 0) & (b <= top)
    sums = np.bincount(b[keep], weights=alloc[keep], minlength=top + 1)
    cnts = np.bincount(b[keep], minlength=top + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = sums / cnts
    out[cnts == 0] = np.nan
    return out


def allocation_ok(cl: Cluster) -> bool:
    """The bookkeeping invariant: no GPU, CPU or memory over capacity."""
    valid = cl.free >= 0
    return bool(((cl.free <= MILLI) | ~valid).all() and (cl.free[valid] >= 0).all()
                and (cl.cpu_free >= 0).all() and (cl.mem_free >= 0).all())
