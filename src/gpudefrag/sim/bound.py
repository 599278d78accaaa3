"""A lower bound on the unallocated GPU % any placement can reach for the pods that have arrived.

Method (a relaxation, so the bound is valid): forget node boundaries, CPU, memory and GPU-model constraints;
keep that each GPU holds at most 1000 milli and that a GPU-sharing pod sits on one GPU. A whole-GPU pod of k
GPUs becomes k whole-GPU items. Every real placement is feasible in this relaxation, so the relaxation's best
allocation is ≥ the best real one, and 100 − it is a lower bound on unallocated GPU %.

The relaxation is solved exactly. Whole-GPU items go first (a GPU filled by one is worth 1000 milli, as much as
any fill of sharing pods, so an exchange argument shows some optimum uses min(W, G) GPUs for them); the other
GPUs take sharing pods, packed by an integer program over GPU fill patterns in arc-flow form (Valério de
Carvalho, 1999): nodes 0..1000 milli in steps of the sizes' gcd, one arc per (start, pod size), one "waste"
arc per step; a unit of flow from 0 to 1000 is one GPU's fill pattern. Maximise the packed milli subject to at
most n_s arcs of size s and at most R units of flow. Solved with HiGHS (scipy.optimize.milp); if the time limit
stops it, the solver's dual bound is used (still valid). The LP relaxation value is reported too.

Also here: an offline best-fit-decreasing packing of the same items (ignoring nodes and CPU), for reference.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from ..core.model import MILLI
from ..core.placement import Pod


@dataclass(frozen=True)
class BoundResult:
    gpus: int
    whole_items: int  # whole-GPU items (Σ k of whole-GPU pods)
    sharing_items: int
    max_alloc_milli: float  # best allocation in the relaxation (an upper bound on any real allocation)
    lp_alloc_milli: float
    optimal: bool
    arrived_milli: int

    @property
    def unallocated_pct(self) -> float:
        """Lower bound on unallocated GPU %."""
        return 100.0 * (1.0 - self.max_alloc_milli / (self.gpus * MILLI))

    @property
    def ideal_pct(self) -> float:
        """max(0, 100 − arrived %): what a perfect packing of divisible work would leave."""
        return max(0.0, 100.0 - 100.0 * self.arrived_milli / (self.gpus * MILLI))

    def as_dict(self) -> dict[str, object]:
        return {
            "gpus": self.gpus, "whole_gpu_items": self.whole_items, "sharing_items": self.sharing_items,
            "max_alloc_gpus": self.max_alloc_milli / MILLI, "lp_alloc_gpus": self.lp_alloc_milli / MILLI,
            "optimal": self.optimal, "lower_bound_unallocated_pct": self.unallocated_pct,
            "ideal_unallocated_pct": self.ideal_pct,
        }


def arrived_prefix(workload: Sequence[Pod], capacity_milli: int, pct: float = 100.0) -> list[Pod]:
    """The pods submitted by the time the arrived workload reaches `pct` % of capacity."""
    out, req = [], 0
    for p in workload:
        if req + p.gpu_total > pct / 100.0 * capacity_milli:
            break
        req += p.gpu_total
        out.append(p)
    return out


def lower_bound(pods: Sequence[Pod], gpus: int, time_limit_s: float = 20.0) -> BoundResult:
    whole = sum(p.num_gpu for p in pods if p.num_gpu and not p.is_sharing)
    sizes = Counter(p.gpu_milli for p in pods if p.is_sharing)
    arrived = sum(p.gpu_total for p in pods)
    used_whole = min(whole, gpus)
    rest = gpus - used_whole
    if rest == 0 or not sizes:
        alloc = used_whole * MILLI + min(sum(s * n for s, n in sizes.items()), rest * MILLI)
        return BoundResult(gpus, whole, sum(sizes.values()), float(alloc), float(alloc), True, arrived)
    packed, lp, optimal = _pack_sharing(dict(sizes), rest, time_limit_s)
    return BoundResult(gpus, whole, sum(sizes.values()), used_whole * MILLI + packed, used_whole * MILLI + lp,
                       optimal, arrived)


def _arc_flow(sizes: dict[int, int], bins: int) -> tuple[np.ndarray, list[LinearConstraint], Bounds]:
    """The arc-flow program for packing `sizes` (milli → count) into `bins` GPUs: (objective, constraints,
    bounds) with the objective minimising −packed milli."""
    step = math.gcd(MILLI, *sizes)
    cap = MILLI // step
    kinds = sorted(sizes, reverse=True)
    # arcs: item arcs only from positions reachable by larger-or-equal items first (symmetry reduction)
    arcs: list[tuple[int, int, int]] = []  # (tail, head, kind index or -1 for waste)
    reach = np.zeros(cap + 1, dtype=bool)
    reach[0] = True
    for ki, s in enumerate(kinds):
        w = s // step
        for u in range(cap - w + 1):  # ascending, so items of one size stack on each other
            if reach[u]:
                arcs.append((u, u + w, ki))
                reach[u + w] = True
    for u in range(cap):
        arcs.append((u, u + 1, -1))
    nv = len(arcs) + 1  # + z (number of GPUs used)
    z = len(arcs)
    rows, cols, vals = [], [], []
    # flow conservation at 1..cap-1; at 0: out = z; at cap: in = z
    for j, (t, h, _) in enumerate(arcs):
        rows.append(t)
        cols.append(j)
        vals.append(-1.0)
        rows.append(h)
        cols.append(j)
        vals.append(1.0)
    rows.append(0)
    cols.append(z)
    vals.append(1.0)
    rows.append(cap)
    cols.append(z)
    vals.append(-1.0)
    a_flow = coo_matrix((vals, (rows, cols)), shape=(cap + 1, nv)).tocsr()
    a_kind = np.zeros((len(kinds), nv))
    for j, (_, _, k) in enumerate(arcs):
        if k >= 0:
            a_kind[k, j] = 1.0
    c = np.zeros(nv)
    for j, (_, _, k) in enumerate(arcs):
        if k >= 0:
            c[j] = -kinds[k]
    ub = np.full(nv, np.inf)
    ub[z] = bins
    cons = [
        LinearConstraint(a_flow, 0, 0),
        LinearConstraint(a_kind, 0, np.array([sizes[s] for s in kinds], dtype=float)),
    ]
    return c, cons, Bounds(0, ub)


def shares_may_fit(sizes: dict[int, int], bins: int) -> bool:
    """False only when items of these shares (milli → count) provably cannot all go into `bins` GPUs: the
    arc-flow LP relaxation — an upper bound on the milli any packing holds — packs less than their total."""
    if not sizes:
        return True
    c, cons, bounds = _arc_flow(sizes, bins)
    lp = milp(c, constraints=cons, bounds=bounds, integrality=np.zeros(len(c)))
    return not lp.success or -float(lp.fun) >= sum(s * n for s, n in sizes.items()) - 0.5


def _pack_sharing(sizes: dict[int, int], bins: int, time_limit_s: float) -> tuple[float, float, bool]:
    """Max milli of sharing items packed into `bins` GPUs (arc-flow ILP): (ILP value or dual bound, LP value,
    proven optimal)."""
    c, cons, bounds = _arc_flow(sizes, bins)
    lp = milp(c, constraints=cons, bounds=bounds, integrality=np.zeros(len(c)))
    res = milp(c, constraints=cons, bounds=bounds, integrality=np.ones(len(c)),
               options={"time_limit": time_limit_s, "mip_rel_gap": 1e-6})
    lp_val = -float(lp.fun) if lp.success else float(sum(s * n for s, n in sizes.items()))
    if res.status == 0:
        return -float(res.fun), lp_val, True
    dual = getattr(res, "mip_dual_bound", None)
    best = -float(dual) if dual is not None and np.isfinite(dual) else lp_val
    return min(best, lp_val), lp_val, False


def best_fit_decreasing(pods: Sequence[Pod], gpus: int) -> float:
    """Unallocated GPU % of an offline best-fit-decreasing packing into `gpus` GPUs, ignoring nodes and CPU
    (whole-GPU items first, then sharing pods largest first, each on the fullest GPU it fits)."""
    whole = sum(p.num_gpu for p in pods if p.num_gpu and not p.is_sharing)
    used = min(whole, gpus)
    free = np.full(gpus - used, MILLI, dtype=np.int64)
    alloc = used * MILLI
    for s in sorted((p.gpu_milli for p in pods if p.is_sharing), reverse=True):
        cand = np.where(free >= s, free, MILLI + 1)
        i = int(np.argmin(cand)) if len(cand) else -1
        if i < 0 or cand[i] > MILLI:
            continue
        free[i] -= s
        alloc += s
    return 100.0 * (1.0 - alloc / (gpus * MILLI))
