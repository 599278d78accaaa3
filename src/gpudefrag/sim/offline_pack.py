"""An offline packing of the arrived pods: a real placement, the other side of the lower bounds.

The bounds (`sim/bound.py`, `sim/bound_resource.py`) say no placement of the pods arrived by X % can leave less
than b % unallocated; a placement that exists says the best one leaves at most p %. Between the two lies the
true limit, and a policy's distance from it. The packing starts from the product's own online path on those
pods (FGD placing them in arrival order, the repacker rescuing failures, `sim.replay`), then improves it by
large-neighbourhood search: take a few nodes of one GPU model, their pods and a sample of the pods still
unplaced, and let CP-SAT re-place them to allocate the most GPU (every GPU ≤ 1000 milli, whole pods on whole
GPUs of one node, the node's CPU and memory, allowed GPU models). A round is kept only when it allocates more,
so the result never gets worse; it is checked against a fresh cluster before it is returned.

Unlike the replay, the search may place a pod that failed when it arrived and leave out one that was placed:
it answers "how much of these pods can be placed at once", the question the bounds bound. CPU-only pods stay
placed (on the nodes of their neighbourhood). CP-SAT runs on deterministic time with one worker and a fixed
seed, so the same arguments give the same packing.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from ..core.capacity import model_allowed
from ..core.model import MILLI, NOT_TRACKED
from ..core.placement import Choice, Cluster, Pod
from .repack import ChainRepacker
from .replay import allocation_ok, replay

_SAMPLE = 150  # unplaced pods offered to one neighbourhood


@dataclass(frozen=True)
class Packing:
    """A placement of a subset of `pods` (node, GPUs per placed pod) and what it allocates."""

    gpus: int
    alloc_milli: int
    start_alloc_milli: int  # the online replay's, where the search began
    rounds: int
    improved: int
    seconds: float
    placement: tuple[tuple[Pod, Choice], ...]

    @property
    def unallocated_pct(self) -> float:
        """An upper bound on the least unallocated GPU % any placement of these pods reaches."""
        return 100.0 * (1.0 - self.alloc_milli / (self.gpus * MILLI))

    @property
    def start_pct(self) -> float:
        return 100.0 * (1.0 - self.start_alloc_milli / (self.gpus * MILLI))

    def as_dict(self) -> dict[str, object]:
        return {"packing_unallocated_pct": self.unallocated_pct, "packing_start_pct": self.start_pct,
                "packing_rounds": self.rounds, "packing_improved": self.improved,
                "packing_seconds": self.seconds}


def offline_packing(cluster: Cluster, pods: Sequence[Pod], *, seed: int = 42, rounds: int = 200,
                    nodes_per_round: int = 6, start: str = "repack", dtime: float = 1.0) -> Packing:
    """Place as much of `pods` on the empty `cluster` as the search finds in `rounds` rounds (module doc).
    `start` is the online path it begins from: "repack" (FGD + the repacker) or "fgd"."""
    if start not in ("repack", "fgd"):
        raise ValueError(f"start must be 'repack' or 'fgd', got {start!r}")
    if not cluster.is_empty:
        raise ValueError("offline_packing needs an empty cluster (its free arrays are the capacities)")
    t0 = time.monotonic()
    res = replay(cluster, pods, "fgd", seed=seed, defrag=ChainRepacker() if start == "repack" else None,
                 record_frag=False, keep_placement=True)
    assert res.placement is not None
    state = _State(cluster, res.placement.pods.values(), pods)
    start_alloc = state.alloc
    rng = np.random.default_rng(seed)
    improved = 0
    for r in range(rounds):
        improved += state.improve(rng, nodes_per_round, dtime, seed + r)
    placement = state.placement()
    _check(cluster, pods, placement, state.alloc)
    return Packing(int(cluster.gpu_count.sum()), state.alloc, start_alloc, rounds, improved,
                   time.monotonic() - t0, placement)


class _State:
    """Who is where, per node, and who is left out."""

    def __init__(self, cluster: Cluster, placed, pods: Sequence[Pod]) -> None:
        self.empty = cluster  # empty: its fit is the static one (GPUs, CPU, memory, models of each node)
        self._fit: dict[Pod, np.ndarray] = {}
        self.gpus = np.asarray(cluster.gpu_count)
        self.cpu = np.asarray(cluster.cpu_free)  # an empty cluster: its free arrays are the capacities
        self.mem = np.asarray(cluster.mem_free)
        self.models = cluster.models
        self.on: dict[int, list[tuple[Pod, tuple[int, ...]]]] = {n: [] for n in range(cluster.n)}
        left = Counter(pods)
        for pod, ch in placed:
            self.on[ch.node].append((pod, ch.gpus))
            left[pod] -= 1
        self.unplaced = [p for p, k in left.items() for _ in range(k) if p.num_gpu > 0]
        self.alloc = sum(p.gpu_total for lst in self.on.values() for p, _ in lst)
        self.gpu_nodes = np.flatnonzero(self.gpus > 0)

    def fits(self, p: Pod, n: int) -> bool:
        """Could `p` sit on node `n` alone (core's fit on the empty cluster, once per shape)?"""
        ok = self._fit.get(p)
        if ok is None:
            ok = self._fit[p] = self.empty.fits(p)
        return bool(ok[n])

    def _neighbourhood(self, rng: np.random.Generator, k: int) -> list[int]:
        used = np.array([sum(p.gpu_total for p, _ in self.on[int(n)]) for n in self.gpu_nodes])
        holes = self.gpu_nodes[used < self.gpus[self.gpu_nodes] * MILLI]
        if not len(holes):
            return []
        first = int(rng.choice(holes))
        model = self.models[first]
        same = [int(n) for n in holes if self.models[n] == model and n != first]
        if len(same) < k - 1:  # fill up with full nodes of the model: their pods may swap into the holes
            have = set(same)
            same += [int(n) for n in self.gpu_nodes if self.models[n] == model and n != first and n not in have]
        return [first, *(int(v) for v in rng.choice(same, size=min(k - 1, len(same)), replace=False))]

    def improve(self, rng: np.random.Generator, k: int, dtime: float, seed: int) -> int:
        """One round: 1 when it placed more GPU, else 0 (nothing changed)."""
        nodes = self._neighbourhood(rng, k)
        if not nodes:
            return 0
        cur = [(p, n, g) for n in nodes for p, g in self.on[n]]
        offer = [p for p in self.unplaced if any(self.fits(p, n) for n in nodes)]
        if len(offer) > _SAMPLE:
            offer = [offer[i] for i in sorted(rng.choice(len(offer), _SAMPLE, replace=False))]
        items: list[tuple[Pod, int | None, tuple[int, ...]]] = [*cur, *((p, None, ()) for p in offer)]
        m = cp_model.CpModel()
        where: dict[tuple[int, int], tuple[cp_model.IntVar, list[cp_model.IntVar]]] = {}
        gpu_use: dict[tuple[int, int], list[tuple[int, cp_model.IntVar]]] = {}
        cpu_use: dict[int, list[tuple[int, cp_model.IntVar]]] = {n: [] for n in nodes}
        mem_use: dict[int, list[tuple[int, cp_model.IntVar]]] = {n: [] for n in nodes}
        value = []
        for i, (p, n0, g0) in enumerate(items):
            ys = []
            for n in nodes:
                if not self.fits(p, n):
                    continue
                y = m.new_bool_var(f"y{i}_{n}")
                m.add_hint(y, n == n0)
                ys.append(y)
                cpu_use[n].append((p.cpu_milli, y))
                mem_use[n].append((p.memory_mib, y))
                zs = []
                for g in range(int(self.gpus[n]) if p.num_gpu else 0):
                    z = m.new_bool_var(f"z{i}_{n}_{g}")
                    m.add_hint(z, n == n0 and g in g0)
                    gpu_use.setdefault((n, g), []).append((p.gpu_milli, z))
                    zs.append(z)
                if p.num_gpu:
                    m.add(sum(zs) == p.num_gpu * y)
                    value.append((p.gpu_total, y))
                where[(i, n)] = (y, zs)
            if n0 is not None and p.num_gpu == 0:
                m.add(sum(ys) == 1)  # CPU-only pods stay placed
            elif ys:
                m.add(sum(ys) <= 1)
        for terms in gpu_use.values():
            m.add(sum(a * v for a, v in terms) <= MILLI)
        for cap, use in ((self.cpu, cpu_use), (self.mem, mem_use)):
            for n, terms in use.items():
                if terms and cap[n] < NOT_TRACKED:
                    m.add(sum(a * v for a, v in terms) <= int(cap[n]))
        before = sum(p.gpu_total for p, _, _ in cur)
        m.maximize(sum(a * v for a, v in value))
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.max_deterministic_time = dtime
        solver.parameters.random_seed = seed % (2**31)
        if solver.solve(m) not in (cp_model.OPTIMAL, cp_model.FEASIBLE) or solver.objective_value < before + 1:
            return 0
        new: dict[int, list[tuple[Pod, tuple[int, ...]]]] = {n: [] for n in nodes}
        taken = set()
        for (i, n), (y, zs) in where.items():
            if solver.boolean_value(y):
                new[n].append((items[i][0], tuple(g for g, z in enumerate(zs) if solver.boolean_value(z))))
                taken.add(i)
        self.on.update(new)
        for i, (p, n0, _) in enumerate(items):
            if n0 is not None and i not in taken:
                self.unplaced.append(p)
            elif n0 is None and i in taken:
                self.unplaced.remove(p)
        self.alloc += round(solver.objective_value) - before
        return 1

    def placement(self) -> tuple[tuple[Pod, Choice], ...]:
        return tuple((p, Choice(n, g)) for n, lst in self.on.items() for p, g in lst)


def _check(cluster: Cluster, pods: Sequence[Pod], placement: Sequence[tuple[Pod, Choice]], alloc: int) -> None:
    """The packing is real: on a fresh copy of the cluster nothing goes over capacity, every pod sits on GPUs
    and a node it may use, and no pod is placed more often than it arrived."""
    cl = cluster.copy()
    left = Counter(pods)
    for pod, ch in placement:
        left[pod] -= 1
        if left[pod] < 0 or len(set(ch.gpus)) != pod.num_gpu or any(g >= cl.gpu_count[ch.node] for g in ch.gpus):
            raise AssertionError(f"offline packing placed {pod} wrongly: {ch}")
        if not model_allowed(pod.gpu_models, cl.models[ch.node]):
            raise AssertionError(f"offline packing put {pod} on a {cl.models[ch.node]} node")
        cl.place(pod, ch)
    if not allocation_ok(cl) or cl.allocated_milli != alloc:
        raise AssertionError("offline packing over capacity or miscounted")
