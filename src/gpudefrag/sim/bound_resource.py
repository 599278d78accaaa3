"""A lower bound on unallocated GPU % that keeps what blocks placement: per-node CPU and memory, GPU models.

The arc-flow bound (`sim.bound`) pools every GPU of the cluster and ignores CPU, memory and GPU models. This one
keeps them; it is the smallest of three valid upper bounds on the allocation — the arc-flow one and these two
(proofs: docs/simulator.md):

- Nodes are grouped into types (GPU model, GPU count, CPU, memory); pods into shapes (GPUs, share, CPU,
  memory, allowed models), with d_s pods of shape s arrived and w_s = GPUs × share milli-GPU each.
- The pooled LP: per type, one pool of its GPUs packed in arc-flow form, its CPU and its memory, pods only on
  types their models allow, plus per-node rounding cuts (dual-feasible functions). Any real placement, summed
  per type, is a feasible point, so its optimum bounds every real allocation.
- The configuration LP's Lagrangian bound. A *configuration* of type t is a multiset of shapes that fits one
  node of type t (models, whole pods on whole GPUs, sharing pods within 1000 milli per GPU, CPU, memory).
  Every real placement gives every node one configuration c_n, so for any prices π ≥ 0 on the shapes

      alloc = Σ_nodes v(c_n) ≤ Σ_nodes [v(c_n) − π·a(c_n)] + π·d ≤ Σ_t N_t · max(0, P_t(π)) + π·d =: L(π)

  where P_t(π) = max over configurations c of type t of Σ_s (w_s − π_s) a_s(c) (the pricing problem, CP-SAT;
  its proven objective bound when time runs out, which only makes L larger). Column generation (restricted
  master LP with HiGHS via `scipy.optimize.linprog`, duals as π) looks for good π; stopping early keeps the
  best L seen — never the restricted master's value, which is not a bound.

The unallocated share is then 100 × (1 − bound / capacity), with the same pods and capacity as `sim.bound`.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model
from scipy.optimize import linprog
from scipy.sparse import csc_matrix

from ..core.capacity import fits_one, model_allowed
from ..core.model import MILLI, NOT_TRACKED
from ..core.placement import Cluster, Pod, get_policy
from .bound import lower_bound

_log = logging.getLogger(__name__)
_SCALE = 1000  # pricing objective: reduced values × this, rounded up (rounding up keeps P_t an upper bound)


@dataclass(frozen=True, slots=True)
class NodeType:
    """Nodes that are interchangeable for placement. cpu/memory None = not tracked (no limit)."""

    model: str | None
    gpus: int
    cpu_milli: int | None
    memory_mib: int | None
    count: int

    def admits(self, shape: Pod) -> bool:
        """Whether one pod of `shape` fits an empty node of this type: core's fit and model rules on the type's
        capacities."""
        return model_allowed(shape.gpu_models, self.model) and fits_one(
            (MILLI,) * self.gpus, NOT_TRACKED if self.cpu_milli is None else self.cpu_milli,
            NOT_TRACKED if self.memory_mib is None else self.memory_mib, shape)


@dataclass(frozen=True)
class ResourceBound:
    gpus: int
    max_alloc_milli: float  # the smallest valid value (pooled LP, arc-flow, Lagrangian L(π)): ≥ any allocation
    pooled_alloc_milli: float  # the pooled LP's optimum (also valid, usually weaker)
    packed_alloc_milli: float  # a real offline placement's allocation: the optimum lies in [packed, max_alloc]
    master_alloc_milli: float  # restricted master LP value at the end (≤ the configuration LP optimum)
    converged: bool  # True when L met the master's value (the configuration LP is solved)
    iterations: int
    columns: int
    node_types: int
    shapes: int
    seconds: float
    arrived_milli: int

    @property
    def unallocated_pct(self) -> float:
        """Lower bound on unallocated GPU %."""
        return 100.0 * (1.0 - self.max_alloc_milli / (self.gpus * MILLI))

    def as_dict(self) -> dict[str, object]:
        return {
            "gpus": self.gpus, "resource_max_alloc_gpus": self.max_alloc_milli / MILLI,
            "pooled_lp_alloc_gpus": self.pooled_alloc_milli / MILLI,
            "offline_packing_unallocated_pct": 100.0 * (1.0 - self.packed_alloc_milli / (self.gpus * MILLI)),
            "resource_master_alloc_gpus": self.master_alloc_milli / MILLI, "resource_converged": self.converged,
            "resource_iterations": self.iterations, "resource_columns": self.columns,
            "node_types": self.node_types, "shapes": self.shapes, "resource_seconds": self.seconds,
            "resource_lower_bound_unallocated_pct": self.unallocated_pct,
        }


def node_types(cluster: Cluster) -> list[NodeType]:
    """The GPU nodes of an empty cluster, grouped into types. A CPU or memory capacity the cluster does not
    track (`Cluster.build` with 0) is None."""
    if not cluster.is_empty:
        raise ValueError("node_types needs an empty cluster (its free arrays are the capacities)")
    untracked = NOT_TRACKED // 2  # core's mark for an untracked capacity, read as Cluster.to_state reads memory
    cnt: Counter[tuple[str | None, int, int | None, int | None]] = Counter()
    for i in range(cluster.n):
        g = int(cluster.gpu_count[i])
        if g == 0:
            continue  # a CPU node holds no GPU allocation; dropping it only enlarges the feasible set
        cpu = int(cluster.cpu_free[i])
        mem = int(cluster.mem_free[i])
        cnt[(cluster.models[i], g, cpu if cpu < untracked else None, mem if mem < untracked else None)] += 1
    return [NodeType(m, g, c, mem, n) for (m, g, c, mem), n in sorted(cnt.items(), key=lambda kv: str(kv[0]))]


def _shapes(pods: Sequence[Pod]) -> Counter[Pod]:
    """GPU pods by shape, models as a sorted set so that one shape is one key (CPU-only pods add no allocation;
    leaving them out only enlarges the feasible set)."""
    return Counter(Pod(p.num_gpu, p.gpu_milli, p.cpu_milli, p.memory_mib, tuple(sorted(set(p.gpu_models))))
                   for p in pods if p.num_gpu > 0 and p.gpu_milli > 0)


def resource_bound(pods: Sequence[Pod], types: Sequence[NodeType], *, time_limit_s: float = 60.0,
                   pricing_time_s: float = 0.5, tol_milli: float = 1.0) -> ResourceBound:
    """Upper bound on the milli-GPU any placement of `pods` onto nodes of `types` can allocate (see module doc)."""
    t0 = time.monotonic()
    gpus = sum(t.gpus * t.count for t in types)
    arrived = sum(p.gpu_total for p in pods)
    demand = _shapes(pods)
    shapes = [s for s in demand if any(t.admits(s) for t in types)]  # the others fit no node: never placed
    d = np.array([demand[s] for s in shapes], dtype=float)
    w = np.array([s.gpu_total for s in shapes], dtype=float)
    n_t = np.array([t.count for t in types], dtype=float)
    if not shapes:
        return ResourceBound(gpus, 0.0, 0.0, 0.0, 0.0, True, 0, 0, len(types), 0, time.monotonic() - t0, arrived)
    pooled, pi_pooled, split = _compact_lp(types, shapes, d, w)
    # the arc-flow bound is an integer program and can beat the pooled LP by a hair: take the smaller
    arcflow = lower_bound(pods, gpus).max_alloc_milli
    pricers = [_Pricer(t, shapes, d, pricing_time_s) for t in types]
    step = math.gcd(*(int(x) for x in w))  # every real allocation is a multiple of this

    # start from the node configurations of a greedy packing, so the master's duals mean something at once
    cols, packed = _seed_columns(types, shapes, d, split)  # (type index, {shape index: count})
    seen = {(ti, tuple(sorted(col.items()))) for ti, col in cols}
    # pricing relaxes "distinct GPUs" for multi-GPU pods with a share below 1000 (none in the traces): its
    # columns are then not necessarily real nodes' contents
    real = all(s.num_gpu == 1 or s.gpu_milli >= MILLI for s in shapes)
    best_l = min(pooled, arcflow)
    center = pi_pooled  # the pooled LP's prices: a good first point for the Lagrangian and the stabilisation
    master, mu = 0.0, np.zeros(len(types))
    pi_lp = pi_pooled
    alpha = 1.0  # price at the centre first
    it = 0
    converged = False
    while True:
        it += 1
        master, pi_lp, mu, lam = _solve_master(cols, len(shapes), len(types), w, d, n_t)
        if real:  # ⌊λ⌋ nodes of each type take configuration j: a real placement (every column is one node's)
            packed = max(packed, int(sum(math.floor(lam[j] + 1e-9) * sum(w[s] * k for s, k in col.items())
                                         for j, (_, col) in enumerate(cols))))
        pi = pi_lp if alpha == 0.0 else alpha * center + (1.0 - alpha) * pi_lp
        total = float(pi @ d)
        new = 0
        for ti, pr in enumerate(pricers):
            ub, found = pr.price(w - pi)
            total += n_t[ti] * ub
            for col in found:
                key = (ti, tuple(sorted(col.items())))
                red = sum((w[s] - pi_lp[s]) * k for s, k in col.items())
                if key not in seen and red > mu[ti] + 1e-6:
                    seen.add(key)
                    cols.append((ti, col))
                    new += 1
        if total < best_l:
            best_l, center = total, pi.copy()
        _log.debug(f"it {it} cols {len(cols)} master {master / MILLI:.1f} L {total / MILLI:.1f} "
                  f"best {best_l / MILLI:.1f} pooled {pooled / MILLI:.1f} new {new} alpha {alpha} "
                  f"t {time.monotonic() - t0:.1f}")
        if _floor(best_l, step) - master <= tol_milli:
            converged = True
            break
        if new == 0 and alpha == 0.0:
            break  # priced at the master's own duals and nothing improves: pricing bounds are not tight
        alpha = 0.0 if new == 0 else 0.5  # no column at the smoothed point (mispricing): use the master's duals
        if time.monotonic() - t0 > time_limit_s:
            break
    bound = _floor(best_l, step)
    return ResourceBound(gpus, float(min(bound, arrived)), pooled, float(packed), master, converged, it, len(cols),
                         len(types), len(shapes), time.monotonic() - t0, arrived)


def _floor(value: float, step: int) -> float:
    """The largest multiple of `step` (every real allocation is one) not above `value`, after a 10⁻⁶ relative
    allowance for the LP solver's tolerances."""
    return float(math.floor((value * (1 + 1e-6) + 1e-3) / step) * step)


_DFF_K = 8  # dual-feasible functions u_1..u_8 per node type, for CPU and for memory


def _dff(size: int, cap: int, k: int) -> float:
    """Fekete and Schepers' dual-feasible function u_k at size/cap: sizes that fit one node (Σ ≤ cap) map to
    values with Σ ≤ 1, so Σ_s u_k(size_s / cap) · pods_s ≤ (nodes of the type) is valid for every placement."""
    if ((k + 1) * size) % cap == 0:
        return size / cap
    return ((k + 1) * size // cap) / k


def _compact_lp(types: Sequence[NodeType], shapes: Sequence[Pod], d: np.ndarray,
                w: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """The pooled relaxation: per node type, one pool of N_t·G_t GPUs packed in arc-flow form (Valério de
    Carvalho) with N_t·C_t CPU and N_t·M_t memory; pods only on types their models allow. Its LP optimum bounds
    every real allocation (each real placement, summed per type, is a feasible point). → (value, shape prices,
    pods of each shape on each type in the LP's solution)."""
    n_s = len(shapes)
    nv = 0
    c: list[float] = []
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    b: list[float] = [float(x) for x in d]  # rows 0..n_s-1: demand
    ub: list[float] = []

    def var(cost: float, upper: float) -> int:
        nonlocal nv
        c.append(cost)
        ub.append(upper)
        nv += 1
        return nv - 1

    def row(entries: list[tuple[int, float]], rhs: float) -> None:
        r = len(b)
        b.append(rhs)
        for j, a in entries:
            rows.append(r)
            cols.append(j)
            vals.append(a)

    xvar: dict[tuple[int, int], int] = {}
    for ti, t in enumerate(types):
        el = [i for i, s in enumerate(shapes) if t.admits(s)]
        if not el:
            continue
        x = {i: var(-w[i], np.inf) for i in el}  # no per-variable cap: the demand row carries it (and its price)
        xvar |= {(i, ti): j for i, j in x.items()}
        for i in el:
            rows.append(i)
            cols.append(x[i])
            vals.append(1.0)
        whole = [i for i in el if shapes[i].gpu_milli >= MILLI]
        sizes = sorted({shapes[i].gpu_milli for i in el if shapes[i].gpu_milli < MILLI}, reverse=True)
        gpu_row = [(x[i], float(shapes[i].num_gpu)) for i in whole]
        if sizes:
            step = math.gcd(MILLI, *sizes)
            cap = MILLI // step
            reach = np.zeros(cap + 1, dtype=bool)
            reach[0] = True
            arcs: list[tuple[int, int, int]] = []  # larger items first along a path (symmetry reduction)
            for q in sizes:
                for u_ in range(cap - q // step + 1):
                    if reach[u_]:
                        arcs.append((u_, u_ + q // step, q))
                        reach[u_ + q // step] = True
            arcs += [(u_, u_ + 1, 0) for u_ in range(cap)]
            f = [var(0.0, np.inf) for _ in arcs]
            z = var(0.0, np.inf)
            gpu_row.append((z, 1.0))
            node_in: dict[int, list[tuple[int, float]]] = {}
            for j, (tl, hd, _) in enumerate(arcs):
                node_in.setdefault(tl, []).append((f[j], 1.0))
                node_in.setdefault(hd, []).append((f[j], -1.0))
            node_in.setdefault(0, []).append((z, -1.0))
            node_in.setdefault(cap, []).append((z, 1.0))
            for ent in node_in.values():  # out − in ≤ 0 and in − out ≤ 0: conservation
                row(ent, 0.0)
                row([(j, -a) for j, a in ent], 0.0)
            for q in sizes:  # pods of share q ≤ slots of size q
                row([(x[i], float(shapes[i].num_gpu)) for i in el if shapes[i].gpu_milli == q]
                    + [(f[j], -1.0) for j, a in enumerate(arcs) if a[2] == q], 0.0)
        row(gpu_row, float(t.count * t.gpus))
        for cap_ in (t.cpu_milli, t.memory_mib):
            if cap_ is None:
                continue
            size = [shapes[i].cpu_milli if cap_ is t.cpu_milli else shapes[i].memory_mib for i in el]
            row([(x[i], float(z)) for i, z in zip(el, size, strict=True)], float(t.count * cap_))
            for k in range(1, _DFF_K + 1):  # per-node rounding: Σ u_k(size / cap) ≤ 1 on every node
                ent = [(x[i], f) for i, z in zip(el, size, strict=True) if (f := _dff(z, cap_, k)) > 0]
                if ent:
                    row(ent, float(t.count))
    a = csc_matrix((vals, (rows, cols)), shape=(len(b), nv))
    res = linprog(np.array(c), A_ub=a, b_ub=np.array(b), bounds=list(zip([0.0] * nv, ub, strict=True)),
                  method="highs")
    if res.status != 0:
        raise RuntimeError(f"pooled LP failed: {res.message}")
    split = np.zeros((n_s, len(types)))
    for (i, ti), j in xvar.items():
        split[i, ti] = res.x[j]
    return -float(res.fun), np.maximum(-np.asarray(res.ineqlin.marginals)[:n_s], 0.0), split


def _seed_columns(types: Sequence[NodeType], shapes: Sequence[Pod], d: np.ndarray,
                  split: np.ndarray) -> tuple[list[tuple[int, dict[int, int]]], int]:
    """Real placements by best-fit decreasing, three times: largest pods first; pods with the fewest allowed
    GPUs first; and each shape first on the node types where the pooled LP put it (rounded down), the rest
    after. → (every node's configuration in any of them, as starting columns for the master; the largest
    allocation — a placement that exists, so the true optimum lies between it and the bound)."""
    owner = np.array([ti for ti, t in enumerate(types) for _ in range(t.count)])
    reach = [sum(t.gpus * t.count for t in types if t.admits(s)) for s in shapes]
    by_size = sorted(range(len(shapes)), key=lambda i: (-shapes[i].gpu_total, -shapes[i].cpu_milli))
    plans: list[list[tuple[int, int, int | None]]] = [  # (shape, how many, node type or None = any)
        [(i, int(d[i]), None) for i in by_size],
        [(i, int(d[i]), None) for i in sorted(range(len(shapes)), key=lambda i: (reach[i], -shapes[i].gpu_total,
                                                                                -shapes[i].cpu_milli))],
        [(i, math.floor(split[i, ti] + 1e-6), ti) for i in by_size for ti in range(len(types))
         if split[i, ti] >= 1 - 1e-6],
    ]
    plans[2] += [(i, int(d[i]), None) for i in by_size]  # what is left, anywhere
    cols: set[tuple[int, tuple[tuple[int, int], ...]]] = set()
    best = 0
    policy = get_policy("bestfit")
    for plan in plans:
        cl = Cluster.build([f"n{i}" for i in range(len(owner))], [types[ti].gpus for ti in owner],
                           [types[ti].model for ti in owner], [types[ti].cpu_milli or 0 for ti in owner],
                           [types[ti].memory_mib or 0 for ti in owner])
        full = cl.copy()  # the same nodes, every one with its type, for restricted choices
        rng = np.random.default_rng(0)
        per_node: list[Counter[int]] = [Counter() for _ in owner]
        left = {i: int(d[i]) for i in range(len(shapes))}
        for i, n, ti in plan:
            pod = shapes[i]
            for _ in range(min(n, left[i])):
                if ti is None:
                    ch = policy.choose(cl, pod, rng)
                else:  # only nodes of type ti: hide the others' CPU for this choice
                    full.free[:], full.cpu_free[:], full.mem_free[:] = cl.free, cl.cpu_free, cl.mem_free
                    full.cpu_free[owner != ti] = -1
                    ch = policy.choose(full, pod, rng)
                if ch is None:
                    break  # identical pods: the next fails too
                cl.place(pod, ch)
                left[i] -= 1
                per_node[ch.node][i] += 1
        best = max(best, cl.allocated_milli)
        cols |= {(int(owner[n]), tuple(sorted(c.items()))) for n, c in enumerate(per_node) if c}
    return [(ti, dict(col)) for ti, col in sorted(cols)], best


def _solve_master(cols: list[tuple[int, dict[int, int]]], n_s: int, n_types: int, w: np.ndarray, d: np.ndarray,
                  n_t: np.ndarray) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """max Σ v_j λ_j s.t. Σ a_sj λ_j ≤ d_s, Σ_{j of type t} λ_j ≤ N_t, λ ≥ 0 → (value, shape prices π ≥ 0,
    node-type prices μ ≥ 0, λ)."""
    rows, cidx, vals = [], [], []
    c = np.empty(len(cols))
    for j, (ti, col) in enumerate(cols):
        c[j] = -sum(w[s] * k for s, k in col.items())
        for s, k in col.items():
            rows.append(s)
            cidx.append(j)
            vals.append(float(k))
        rows.append(n_s + ti)
        cidx.append(j)
        vals.append(1.0)
    a = csc_matrix((vals, (rows, cidx)), shape=(n_s + n_types, len(cols)))
    res = linprog(c, A_ub=a, b_ub=np.concatenate([d, n_t]), bounds=(0, None), method="highs")
    if res.status != 0:
        raise RuntimeError(f"master LP failed: {res.message}")
    duals = np.maximum(-np.asarray(res.ineqlin.marginals), 0.0)
    return -float(res.fun), duals[:n_s], duals[n_s:], np.asarray(res.x)


class _Pricer:
    """P_t(π) for one node type: the best configuration by reduced value, with CP-SAT.

    Variables: pods per eligible shape; per GPU g, whether a whole-GPU pod holds it (u_g) and how many sharing
    pods of each share it holds (y_mg). GPU g holds ≤ 1000 milli; the whole GPUs number Σ k_s z_s; CPU and memory
    fit the node. GPUs are interchangeable, so they are sorted (whole first, then by fill) to cut symmetry.
    """

    def __init__(self, t: NodeType, shapes: Sequence[Pod], d: np.ndarray, time_s: float) -> None:
        self.t, self.shapes, self.time_s = t, shapes, time_s
        self.eligible = [i for i, s in enumerate(shapes) if t.admits(s)]
        self.cap: dict[int, int] = {}
        for i in self.eligible:
            s = shapes[i]
            per_gpu = 1 if s.gpu_milli >= MILLI else MILLI // s.gpu_milli
            ub = min(int(d[i]), t.gpus * per_gpu // s.num_gpu)
            if t.cpu_milli is not None and s.cpu_milli > 0:
                ub = min(ub, t.cpu_milli // s.cpu_milli)
            if t.memory_mib is not None and s.memory_mib > 0:
                ub = min(ub, t.memory_mib // s.memory_mib)
            self.cap[i] = ub

    def price(self, reduced: np.ndarray) -> tuple[float, list[dict[int, int]]]:
        """(an upper bound on P_t at these reduced values, ≥ 0; configurations found on the way)."""
        use = [i for i in self.eligible if reduced[i] > 0 and self.cap[i] > 0]  # the others only cost room
        if not use:
            return 0.0, []
        t, sh = self.t, self.shapes
        m = cp_model.CpModel()
        x = {i: m.new_int_var(0, self.cap[i], f"x{i}") for i in use}
        whole = [i for i in use if sh[i].gpu_milli >= MILLI]
        shares = sorted({sh[i].gpu_milli for i in use if sh[i].gpu_milli < MILLI})
        u = [m.new_bool_var(f"u{g}") for g in range(t.gpus)]
        m.add(sum(u) == sum(sh[i].num_gpu * x[i] for i in whole))
        y = {(q, g): m.new_int_var(0, MILLI // q, f"y{q}_{g}") for q in shares for g in range(t.gpus)}
        for q in shares:
            # a multi-GPU pod with a share below 1000 counts k items of that share (distinct GPUs relaxed)
            m.add(sum(y[q, g] for g in range(t.gpus))
                  == sum(sh[i].num_gpu * x[i] for i in use if sh[i].gpu_milli == q))
        fill = [sum(q * y[q, g] for q in shares) + MILLI * u[g] for g in range(t.gpus)]
        for g in range(t.gpus):
            m.add(fill[g] <= MILLI)
            if g + 1 < t.gpus:
                m.add(u[g] >= u[g + 1])
                m.add(fill[g] >= fill[g + 1])
        # redundant, but gives the LP relaxation the GPU total at once
        m.add(sum(sh[i].gpu_total * x[i] for i in use) <= MILLI * t.gpus)
        if t.cpu_milli is not None:
            m.add(sum(sh[i].cpu_milli * x[i] for i in use) <= t.cpu_milli)
        if t.memory_mib is not None:
            m.add(sum(sh[i].memory_mib * x[i] for i in use) <= t.memory_mib)
        coef = {i: math.ceil(reduced[i] * _SCALE) for i in use}
        m.maximize(sum(coef[i] * x[i] for i in use))
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.max_deterministic_time = self.time_s  # the same answer on a busy machine
        cb = _Collect(x)
        status = solver.solve(m, cb)
        if status == cp_model.OPTIMAL:
            ub = solver.objective_value
        elif status == cp_model.FEASIBLE:
            ub = solver.best_objective_bound
        else:  # no answer in time: the trivial bound Σ reduced × cap (valid, weak)
            ub = float(sum(coef[i] * self.cap[i] for i in use))
        return max(0.0, ub / _SCALE), cb.found


class _Collect(cp_model.CpSolverSolutionCallback):
    def __init__(self, x: dict[int, cp_model.IntVar]) -> None:
        super().__init__()
        self.x = x
        self.found: list[dict[int, int]] = []

    def on_solution_callback(self) -> None:
        col = {i: int(self.value(v)) for i, v in self.x.items()}
        col = {i: k for i, k in col.items() if k}
        if col:
            self.found.append(col)
