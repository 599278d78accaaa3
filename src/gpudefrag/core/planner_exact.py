"""The exact planner: one CP-SAT model over every movable workload, node and GPU.

Variables: x[w,n] (workload w ends on node n ≠ its source), y[p,n] (part p of the request lands on n), z[w,n,g]
(a shared-GPU arrival takes GPU g of n) and a[n,g] (GPU g of n goes to a whole-GPU arrival). Per GPU, what stays
+ what arrives ≤ 1000 milli; per node, CPU and memory likewise, and the move budgets. Because staying workloads
keep their GPUs and arrivals are given explicit GPUs, the model's answer is a concrete final placement; chains
(a displaced workload going where another one left) come out naturally. The objective is the plans' score
(GPU-seconds, see core.cost) with ties broken by fewer moves and then by the target node with most GPUs free.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from .capacity import fits
from .model import MILLI, NOT_TRACKED
from .planner_heuristic import cheapest_subsets, clear_node, lower_bounds, room_bound
from .planner_problem import Part, Problem, Work


@dataclass(frozen=True)
class Exact:
    """What the exact search settled: a plan's working state (`optimal` when proven), or `infeasible` (proven:
    no plan exists), or neither (nothing better found in the time budget). planner.py turns it into a Plan."""

    work: Work | None = None
    optimal: bool = False
    infeasible: bool = False
    reason: str = ""
    method: str = ""


@dataclass
class Answer:
    status: str  # "optimal" | "feasible" | "infeasible" | "unknown" | "unorderable"
    work: Work | None = None
    wall_s: float = 0.0


def solve_exact(p: Problem, parts: list[Part], hint: Work | None) -> Exact:
    """An exact plan (`optimal` when proven), a proof that no plan exists, or neither when the solver found
    nothing better within its time budget.

    A single-node request is decomposed by target node: the cheapest set of a node's own workloads whose
    departure makes room is a lower bound on any plan landing there (moves elsewhere only add cost), so the
    nodes are visited in bound order, each with CP-SAT and the target fixed, until the bound reaches the best
    plan found — often at once, when the heuristic's plan meets the smallest bound."""
    opts = p.opts
    if len(parts) != 1:
        ans = cp_sat(p, parts, hint)
        if ans.status == "infeasible":
            return Exact(infeasible=True, reason=_NO_PLAN.format(opts.max_moves, opts.max_moves_per_node))
        if ans.work is None:
            return Exact()
        return Exact(ans.work, ans.status == "optimal", method="CP-SAT over all nodes and parts at once")
    part = parts[0]
    base = Work(p)
    if hint is not None and not hint.order:  # it fits without moves: nothing is cheaper
        return Exact(hint, True)
    extra: dict[int, float] = {}
    best = hint
    best_score = hint.score if hint is not None else float("inf")
    # the vectorised bound rules most nodes out at once; the tighter per-node bound is for the rest
    coarse = lower_bounds(p, base, part, part.eligible, p.score_lb)
    open_nodes = np.flatnonzero(coarse < best_score - 1e-9)
    bounds = [(tight_bound(p, base, part, int(i), extra), int(i)) for i in open_nodes]
    have = (p.state.free_milli >= part.milli).sum(axis=1)
    bounds = sorted((b, -int(have[i]), i) for b, i in bounds if np.isfinite(b))
    proven = True
    improved = 0
    visited = 0
    by_bound = 0
    budget = opts.time_limit_s
    forbid = np.zeros(len(p.state.nodes), dtype=bool)
    for b, _h, i in bounds:
        if b >= best_score - 1e-9:
            break
        if budget <= 0:
            proven = False
            break
        local, _why = clear_node(p, base, part, i, forbid)  # the heuristic on this node alone
        if local is not None and local.score < best_score - 1e-9:
            best, best_score = local, local.score
            improved += 1
        if local is not None and local.score <= b + 1e-6:
            by_bound += 1
            continue  # it meets this node's bound: optimal for this node without a solver
        ans = cp_sat(p, parts, local, only_node=i,
                     upper=None if best is None else best_score, time_limit=budget,
                     bystander_max=best_score - b + 1e-6)
        budget -= ans.wall_s
        visited += 1
        if ans.work is not None and ans.work.score < best_score - 1e-9:
            best, best_score = ans.work, ans.work.score
            improved += 1
        if ans.status not in ("optimal", "infeasible"):
            proven = False
    if best is None:
        if proven:
            return Exact(infeasible=True, reason=_NO_PLAN.format(opts.max_moves, opts.max_moves_per_node))
        return Exact()
    how = (f"exact search: {int(part.eligible.sum()) - len(open_nodes)} nodes ruled out by the vectorised bound, "
           f"tighter bounds on {len(open_nodes)}, {by_bound} settled by meeting their "
           f"bound, CP-SAT on {visited}; " + ("improved on the heuristic's plan" if improved
                                               else "the heuristic's plan was already the cheapest"))
    return Exact(best, proven, method=how)


def tight_bound(p: Problem, base: Work, part: Part, i: int, extra: dict[int, float]) -> float:
    """A lower bound on any plan landing `part` on node i: over the sets of i's workloads that make room (in
    order of cost), the set's cost plus, for a workload of it that fits on no other node as things stand,
    the cheapest room any other node could make for it (a chain it cannot avoid)."""
    items = [int(wi) for wi in p.on_node(i) if p.why_not_movable(int(wi)) is None]
    items.sort(key=lambda wi: (p.score_lb[wi], wi))
    costs = [float(p.score_lb[wi]) for wi in items]
    max_size = min(p.opts.max_moves, p.opts.max_moves_per_node, len(items))
    best = np.inf
    for k, sub in enumerate(cheapest_subsets(costs, max_size)):
        c = sum(costs[j] for j in sub)
        if c >= best or k >= 4000:
            return min(best, c)
        if not base.fits_without(i, [items[j] for j in sub], part.shape):
            continue
        best = min(best, c + max(_chain_floor(p, base, items[j], extra) for j in sub))
    return float(best)


def _chain_floor(p: Problem, base: Work, wi: int, cache: dict[int, float]) -> float:
    """0 if the workload fits on another node as things stand, else the least any node could charge to make
    room for it (the cheapest set of that node's own workloads whose departure does)."""
    got = cache.get(wi)
    if got is not None:
        return got
    w = p.ws[wi]
    mask = p.targets_mask(wi).copy()
    mask[int(p.src[wi])] = False
    shape = Part(-1, w.request, p.shape(wi), mask)
    fit = mask & fits(base.free, base.cpu, base.mem, shape.shape)
    got = 0.0 if fit.any() else min((room_bound(p, base, shape, int(d)) for d in np.flatnonzero(mask)),
                                     default=np.inf)
    cache[wi] = got
    return got


_NO_PLAN = ("no set of at most {} moves (at most {} per node) frees room for the request "
            "(proven by the exact solver)")


def cp_sat(p: Problem, parts: list[Part], hint: Work | None, *, only_node: int | None = None,
           upper: float | None = None, time_limit: float | None = None, bystander_max: float = np.inf) -> Answer:
    """Solve the model; `only_node` fixes where the (single) part lands, `upper` cuts plans scoring more, and
    workloads off `only_node` whose move alone costs `bystander_max` or more stay put (they cannot be part of
    a plan under `upper`)."""
    st = p.state
    nn = len(st.nodes)
    opts = p.opts
    free = st.free_milli
    usable = st.usable_counts
    cap_cpu = np.array([nd.cpu_milli for nd in st.nodes])
    cap_mem = np.array([nd.memory_mib for nd in st.nodes])
    m = cp_model.CpModel()

    movable = [
        wi for wi in range(len(p.ws))
        if not p.multi[wi] and p.why_not_movable(wi) is None
        and (only_node is None or p.src[wi] == only_node or p.score_lb[wi] < bystander_max)
    ]
    x: dict[tuple[int, int], cp_model.IntVar] = {}
    arrivals: dict[int, list[int]] = defaultdict(list)
    leaving: dict[int, list[int]] = defaultdict(list)
    outs_of: dict[int, list[cp_model.IntVar]] = defaultdict(list)
    for wi in movable:
        src = int(p.src[wi])
        mask = p.targets_mask(wi).copy()
        mask[src] = False
        mask &= (cap_cpu == 0) | (cap_cpu >= p.cpu[wi])
        mask &= (cap_mem == 0) | (cap_mem >= p.mem[wi])
        for n in np.flatnonzero(mask):
            n = int(n)
            x[wi, n] = m.NewBoolVar(f"x{wi}_{n}")
            outs_of[wi].append(x[wi, n])
            arrivals[n].append(wi)
        leaving[src].append(wi)
    moved: dict[int, cp_model.LinearExpr] = {}
    for wi in movable:
        outs = outs_of[wi]
        if outs:
            m.Add(sum(outs) <= 1)
        moved[wi] = sum(outs) if outs else 0

    y: dict[tuple[int, int], cp_model.IntVar] = {}
    for k, part in enumerate(parts):
        el = part.eligible & ((cap_cpu == 0) | (cap_cpu >= part.cpu)) & ((cap_mem == 0) | (cap_mem >= part.mem))
        cands = [int(n) for n in np.flatnonzero(el) if only_node is None or n == only_node]
        if not cands:
            return Answer("infeasible")
        for n in cands:
            y[k, n] = m.NewBoolVar(f"y{k}_{n}")
        m.AddExactlyOne(y[k, n] for n in cands)
    by_req: dict[int, list[int]] = defaultdict(list)
    for k, part in enumerate(parts):
        by_req[part.req].append(k)
    for ks in by_req.values():
        if len(ks) > 1:
            for n in range(nn):
                vs = [y[k, n] for k in ks if (k, n) in y]
                if len(vs) > 1:
                    m.AddAtMostOne(vs)
    part_nodes: dict[int, list[int]] = defaultdict(list)
    for k, n in y:
        part_nodes[n].append(k)

    # GPU capacity, per node and GPU
    z: dict[tuple[object, int, int], cp_model.IntVar] = {}  # (("w", wi) | ("p", k), n, g)
    a: dict[tuple[int, int], cp_model.IntVar] = {}
    stay_load: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)  # (n,g) -> [(wi, milli)]
    movable_set = set(movable)
    fixed = st.used_milli.astype(np.int64).copy()
    for wi in movable:
        src = int(p.src[wi])
        for g in p.ws[wi].placements[0].gpus:
            stay_load[src, g].append((wi, int(p.milli[wi])))
            fixed[src, g] -= int(p.milli[wi])
    for n in set(arrivals) | set(part_nodes):
        gs = range(int(usable[n]))
        whole_terms: list[cp_model.LinearExpr] = []
        frac_terms: dict[int, list[cp_model.LinearExpr]] = defaultdict(list)
        for wi in arrivals[n]:
            g_need, milli = int(p.gpus[wi]), int(p.milli[wi])
            if g_need == 0:
                continue
            if milli >= MILLI:
                whole_terms.append(g_need * x[wi, n])
            else:
                vs = []
                for g in gs:
                    v = z[("w", wi), n, g] = m.NewBoolVar(f"z{wi}_{n}_{g}")
                    frac_terms[g].append(milli * v)
                    vs.append(v)
                m.Add(sum(vs) == x[wi, n])
        for k in part_nodes[n]:
            part = parts[k]
            if part.gpus == 0:
                continue
            if part.milli >= MILLI:
                whole_terms.append(part.gpus * y[k, n])
            else:
                vs = []
                for g in gs:
                    v = z[("p", k), n, g] = m.NewBoolVar(f"zp{k}_{n}_{g}")
                    frac_terms[g].append(part.milli * v)
                    vs.append(v)
                m.Add(sum(vs) == y[k, n])
        if whole_terms:
            for g in gs:
                a[n, g] = m.NewBoolVar(f"a{n}_{g}")
            m.Add(sum(a[n, g] for g in gs) == sum(whole_terms))
        for g in gs:
            if (n, g) not in a and not frac_terms[g]:
                continue
            stay = [milli * (1 - moved[wi]) for wi, milli in stay_load[n, g]]
            arrive = list(frac_terms[g]) + ([MILLI * a[n, g]] if (n, g) in a else [])
            m.Add(int(fixed[n, g]) + sum(stay) + sum(arrive) <= MILLI)

    # CPU and memory, per node (only where the node tracks them)
    for n in set(arrivals) | set(part_nodes):
        for free_arr, attr in ((st.cpu_free, "cpu"), (st.mem_free, "mem")):
            if free_arr[n] >= NOT_TRACKED // 2:
                continue
            need = getattr(p, attr)
            terms = [int(need[wi]) * x[wi, n] for wi in arrivals[n] if need[wi]]
            terms += [int(getattr(parts[k], attr)) * y[k, n] for k in part_nodes[n] if getattr(parts[k], attr)]
            terms += [-int(need[wi]) * moved[wi] for wi in leaving[n] if need[wi]]
            if terms:
                m.Add(sum(terms) <= int(free_arr[n]))

    # budgets
    if x:
        m.Add(sum(x.values()) <= opts.max_moves)
    for n in set(arrivals) | set(leaving):
        terms = [moved[wi] for wi in leaving[n]] + [x[wi, n] for wi in arrivals[n]]
        if len(terms) > opts.max_moves_per_node:
            m.Add(sum(terms) <= opts.max_moves_per_node)

    # objective: score in milli-GPU-seconds, then fewer moves, then the most-free target
    whole_now = (free >= MILLI).sum(axis=1)
    tie_max = opts.max_moves + sum(int(usable.max(initial=0)) for _ in parts) + 1
    weight = 10 * tie_max
    obj = []
    cost_terms = []
    for (wi, n), v in x.items():
        c = round(p.move_cost(wi, int(p.src[wi]), n).score * 1000)
        obj.append((c * weight + 1) * v)
        cost_terms.append(c * v)
    if upper is not None and cost_terms:
        m.Add(sum(cost_terms) <= round(upper * 1000))
    for (_k, n), v in y.items():
        busy = int(usable[n] - whole_now[n])
        if busy:
            obj.append(busy * v)
    m.Minimize(sum(obj))

    if hint is not None:
        for (wi, n), v in x.items():
            m.AddHint(v, 1 if hint.moved.get(wi, (-1,))[0] == n else 0)
        chosen = {(k, i) for k, (_part, i, _g) in enumerate(hint.reserved)}
        for key, v in y.items():
            m.AddHint(v, 1 if key in chosen else 0)

    solver = cp_model.CpSolver()
    limit = time_limit or opts.time_limit_s
    solver.parameters.num_workers = max(1, opts.workers)
    solver.parameters.random_seed = 1
    literals = [*x.values(), *z.values(), *a.values(), *y.values()]
    wall = 0.0
    for _try in range(_ORDER_TRIES):
        solver.parameters.max_time_in_seconds = max(limit - wall, 0.01)
        status = solver.Solve(m)
        wall += solver.WallTime()
        if status == cp_model.INFEASIBLE:  # (the assignments cut off below could not be ordered: still a proof)
            return Answer("infeasible", None, wall)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return Answer("unknown", None, wall)
        got = _read(p, parts, solver, x, z, a, y)
        if got is not None:
            assert movable_set.issuperset(got[1])
            return Answer("optimal" if status == cp_model.OPTIMAL else "feasible", got[0], wall)
        # two moves take each other's room (a cycle no order can execute): exclude exactly this assignment
        # and solve again; a larger set of moves that breaks the cycle stays allowed
        m.AddBoolOr([v.Not() if solver.Value(v) else v for v in literals])
        if wall >= limit:
            break
    return Answer("unorderable", None, wall)


_ORDER_TRIES = 50  # re-solves after an assignment whose moves cannot be ordered


def _read(p: Problem, parts: list[Part], solver: cp_model.CpSolver, x: dict, z: dict, a: dict,
          y: dict) -> tuple[Work, dict[int, int]] | None:
    """The answer as a working state with its moves in an executable order, or None if they form a cycle."""
    dest: dict[int, int] = {wi: n for (wi, n), v in x.items() if solver.Value(v)}
    gpus_of: dict[object, tuple[int, ...]] = {}
    for (who, _n, g), v in z.items():
        if solver.Value(v):
            gpus_of[who] = (g,)
    pool: dict[int, list[int]] = defaultdict(list)
    for (n, g), v in a.items():
        if solver.Value(v):
            pool[n].append(g)
    for wi in sorted(dest):
        n = dest[wi]
        if p.gpus[wi] == 0:
            gpus_of[("w", wi)] = ()
        elif p.milli[wi] >= MILLI:
            gpus_of[("w", wi)] = tuple(sorted(pool[n][: p.gpus[wi]]))
            del pool[n][: p.gpus[wi]]
    place: dict[int, int] = {k: n for (k, n), v in y.items() if solver.Value(v)}
    for k, n in place.items():
        if parts[k].gpus == 0:
            gpus_of[("p", k)] = ()
        elif parts[k].milli >= MILLI:
            gpus_of[("p", k)] = tuple(sorted(pool[n][: parts[k].gpus]))
            del pool[n][: parts[k].gpus]
    work = _sequence(p, dest, gpus_of)
    if work is None:
        return None
    for k in range(len(parts)):
        work.reserve(parts[k], place[k], gpus_of[("p", k)])
    return work, dest


def _sequence(p: Problem, dest: dict[int, int], gpus_of: dict[object, tuple[int, ...]]) -> Work | None:
    """An order in which every move finds its GPUs free when it is made (a target's occupants leave first);
    None if the moves form a cycle that no order can execute."""
    work = Work(p)
    todo = sorted(dest)
    while todo:
        progressed = False
        for wi in list(todo):
            n = dest[wi]
            gp = gpus_of[("w", wi)]
            ok = all(work.free[n, g] >= p.milli[wi] for g in gp)
            ok = ok and work.cpu[n] >= p.cpu[wi] and work.mem[n] >= p.mem[wi]
            if ok:
                work.release(wi)
                work.move(wi, n, gp)
                todo.remove(wi)
                progressed = True
        if not progressed:
            return None
    return work
