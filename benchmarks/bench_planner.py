"""Planner benchmarks: (a) heuristic quality against the exact optimum on random 16–64-node clusters,
(b) heuristic speed on 10,000 nodes × 8 GPUs with ~50,000 running jobs, (c) the largest cluster the exact solver
proves optimal within 5 s.

    ./scripts/bench.sh planner            # full: 200 clusters, 5 timed runs at 10k nodes
    ./scripts/bench.sh --quick planner    # smoke: 40 clusters, 3 runs (< 60 s)
"""

from __future__ import annotations

import random
import statistics
import time

from common import Row
from gpudefrag.core.model import ClusterState, Node, Placement, Request, Versions, Workload
from gpudefrag.core.planner import PlanOptions, plan_moves

GIB = 1 << 30
NOW = 1e9
_VERS = {"H100": Versions("H100", None, "550.54.15", "12.4", cpu_arch="x86_64"),
         "A100": Versions("A100", None, "535.129.03", "12.2", cpu_arch="x86_64")}


def random_cluster(rng: random.Random, n_nodes: int, *, gpus: int = 8, fill: float = 0.8,
                   models: tuple[str, ...] = ("H100",), frac_share: float = 0.1,
                   multi_share: float = 0.03) -> ClusterState:
    """Every node filled to about `fill` (at least one GPU busy) with 1/2/4-GPU jobs, some fractional, a few
    2-node; each job with a random checkpoint size and age. Most such clusters have no whole free node."""
    nodes = []
    for i in range(n_nodes):
        m = models[i % len(models)]
        v = _VERS.get(m, Versions(m))
        nodes.append(Node(f"n{i:05d}", gpus, m, cpu_milli=gpus * 16_000, memory_mib=gpus * 128_000,
                          driver_version=v.driver, cuda_version=v.cuda, cpu_arch="x86_64"))
    free = [[1000] * gpus for _ in range(n_nodes)]
    cpu = [gpus * 16_000] * n_nodes
    ws: list[Workload] = []
    for i in range(n_nodes):
        busy = min(gpus, max(1, round(rng.gauss(fill * gpus, 1.5))))
        tries = 0
        while sum(1 for f in free[i] if f < 1000) < busy and tries < 50:
            tries += 1
            if rng.random() < multi_share:
                j = rng.randrange(n_nodes)
                k = rng.choice((1, 2))
                gi = [g for g in range(gpus) if free[i][g] == 1000][:k]
                gj = [g for g in range(gpus) if free[j][g] == 1000][:k]
                if i == j or len(gi) < k or len(gj) < k:
                    continue
                for g in gi:
                    free[i][g] = 0
                for g in gj:
                    free[j][g] = 0
                ws.append(Workload(f"m{len(ws)}", Request(k, 2, cpu_milli=4000 * k),
                                   placements=(Placement(nodes[i].name, tuple(gi)),
                                               Placement(nodes[j].name, tuple(gj))),
                                   checkpoint_bytes=0, versions=_VERS.get(nodes[i].gpu_model or "", Versions())))
                continue
            frac = rng.random() < frac_share
            k = 1 if frac else rng.choice((1, 1, 1, 2, 2, 4))
            milli = rng.choice((250, 500)) if frac else 1000
            gl = [g for g in range(gpus) if free[i][g] >= milli]
            if frac:
                gl = sorted(gl, key=lambda g: free[i][g])[:1]
            gl = gl[:k]
            if len(gl) < k or cpu[i] < 4000 * k:
                continue
            for g in gl:
                free[i][g] -= milli
            cpu[i] -= 4000 * k
            m = nodes[i].gpu_model or ""
            ws.append(Workload(
                f"w{len(ws)}", Request(k, 1, milli, cpu_milli=4000 * k, memory_mib=64_000 * k, gpu_models=(m,)),
                placements=(Placement(nodes[i].name, tuple(gl)),),
                checkpoint_bytes=rng.randint(1, 160) * GIB * k // 2, last_checkpoint_at=NOW - rng.randint(0, 7200),
                started_at=NOW - 36_000, versions=_VERS.get(m, Versions(m)),
            ))
    return ClusterState.build(nodes, ws, now=NOW, name=f"random-{n_nodes}")


def needs_moves(state: ClusterState, request: Request) -> bool:
    from gpudefrag.core.fragmentation import fits_mask

    return not fits_mask(state, request).any()


def cp_sat_runs(plan) -> int:
    """How many per-node CP-SAT models the exact search ran (from its explain line; 1 for the full model)."""
    for line in plan.explain:
        if "CP-SAT on " in line:
            return int(line.split("CP-SAT on ")[1].split(";")[0])
        if "CP-SAT over all" in line:
            return 1
    return 0


def quality(n_clusters: int, seed: int = 7, *, fresh: bool = True, fill: tuple[float, float] = (0.7, 0.9),
            label: str = "") -> list[Row]:
    rng = random.Random(seed)
    gaps: list[float] = []
    unproven = 0
    both_infeasible = 0
    heur_missed = 0
    tried = 0
    exact_times: list[float] = []
    cp_runs = 0
    req = Request(8)
    while len(gaps) + both_infeasible + heur_missed < n_clusters and tried < n_clusters * 5:
        tried += 1
        state = random_cluster(rng, rng.randint(16, 64), fill=rng.uniform(*fill),
                               models=rng.choice((("H100",), ("H100", "A100"))))
        if not needs_moves(state, req):
            continue
        h = plan_moves(state, req, PlanOptions(solver="heuristic", fresh_checkpoint=fresh))
        t0 = time.perf_counter()
        e = plan_moves(state, req, PlanOptions(solver="exact", time_limit_s=10.0, fresh_checkpoint=fresh))
        exact_times.append(time.perf_counter() - t0)
        cp_runs += cp_sat_runs(e)
        if not e.optimal and e.feasible:
            unproven += 1
            continue  # no proven optimum to compare against
        if not e.feasible:
            both_infeasible += not h.feasible
            continue
        if not h.feasible:
            heur_missed += 1
            continue
        gaps.append((h.score - e.score) / e.score if e.score > 0 else 0.0)
    n = len(gaps)
    mean = 100 * statistics.fmean(gaps) if gaps else float("nan")
    worst = 100 * max(gaps) if gaps else float("nan")
    note = (f"{n} clusters with both plans, {heur_missed} where only the exact solver found one, "
            f"{both_infeasible} infeasible for both; exact median {statistics.median(exact_times):.2f} s, "
            f"{cp_runs} CP-SAT runs in all, {unproven} skipped (optimum not proven in 10 s)")
    return [
        Row("planner", f"heuristic vs exact: mean cost gap{label}", mean, "%", "<= 5 %", mean <= 5.0, "exact optimum",
            note),
        Row("planner", f"heuristic vs exact: worst cost gap{label}", worst, "%", "", None, "exact optimum"),
        Row("planner", f"heuristic found no plan where exact did{label}", 100 * heur_missed / max(1, n + heur_missed),
            "%"),
    ]


def big_cluster(n_nodes: int = 10_000, jobs: int = 50_000, seed: int = 3) -> ClusterState:
    """`n_nodes` × 8 H100 with `jobs` 1/2-GPU jobs (some fractional); every node has 1–3 free GPUs, so no
    8-GPU request fits without moves."""
    rng = random.Random(seed)
    nodes = [Node(f"node-{i:05d}", 8, "H100", cpu_milli=256_000, memory_mib=2_000_000,
                  driver_version="550.54.15", cuda_version="12.4", cpu_arch="x86_64") for i in range(n_nodes)]
    ws: list[Workload] = []
    per = jobs / n_nodes
    v = _VERS["H100"]
    for nd in nodes:
        busy = rng.randint(5, 7)
        g = 0
        k_jobs = 0
        while g < busy and (k_jobs < per + 1):
            k = min(rng.choice((1, 1, 1, 2)), busy - g)
            if rng.random() < 0.1 and k == 1:
                ws.append(Workload(f"j{len(ws)}", Request(1, 1, 500, cpu_milli=2000, memory_mib=16_000),
                                   placements=(Placement(nd.name, (g,)),), checkpoint_bytes=rng.randint(1, 40) * GIB,
                                   last_checkpoint_at=NOW - rng.randint(0, 3600), versions=v))
            else:
                ws.append(Workload(f"j{len(ws)}", Request(k, 1, cpu_milli=4000 * k, memory_mib=64_000 * k),
                                   placements=(Placement(nd.name, tuple(range(g, g + k))),),
                                   checkpoint_bytes=rng.randint(1, 80) * GIB * k,
                                   last_checkpoint_at=NOW - rng.randint(0, 3600), versions=v))
            g += k
            k_jobs += 1
        if g < busy:  # the rest in one job
            k = busy - g
            ws.append(Workload(f"j{len(ws)}", Request(k, 1, cpu_milli=4000 * k),
                               placements=(Placement(nd.name, tuple(range(g, busy))),),
                               checkpoint_bytes=rng.randint(1, 80) * GIB * k, versions=v))
    return ClusterState.build(nodes, ws, now=NOW, name="big")


def speed(repeat: int) -> list[Row]:
    state = big_cluster()
    req = Request(8)
    opts = PlanOptions(solver="heuristic")
    t0 = time.perf_counter()
    _ = state.free_milli  # the derived arrays are part of the observed state
    first = plan_moves(state, req, opts)
    cold = time.perf_counter() - t0
    times = []
    for _ in range(repeat):
        fresh = ClusterState(state.nodes, state.workloads, now=state.now)  # no cached arrays or masks
        _ = fresh.free_milli, fresh.cpu_free
        t0 = time.perf_counter()
        plan = plan_moves(fresh, req, opts)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    note = (f"{len(state.running)} jobs; plan: {len(plan.moves)} moves, feasible={plan.feasible}; "
            f"first call {cold:.2f} s")
    assert first.feasible
    return [Row("planner", "heuristic, 8-GPU request, 10k nodes × 8 GPUs", med, "s", "<= 0.5 s", med <= 0.5,
                "", note)]


def exact_scaling(limit_s: float = 5.0, quick: bool = False, request: Request | None = None,
                  sizes: tuple[int, ...] | None = None, what: str = "") -> list[Row]:
    """Grow the cluster until the exact solver no longer proves optimality within `limit_s` (wall time)."""
    rng = random.Random(11)
    largest = 0
    req = request or Request(8)
    sizes = sizes or ((16, 64, 256) if quick else (16, 64, 256, 1024, 2048, 4096, 10_000))
    detail = []
    for n in sizes:
        ok_all = True
        for _ in range(1 if quick else 2):
            while True:
                state = random_cluster(rng, n, fill=0.85)
                if needs_moves(state, req) and plan_moves(state, req, PlanOptions(solver="heuristic")).feasible:
                    break
            t0 = time.perf_counter()
            plan = plan_moves(state, req, PlanOptions(solver="exact", time_limit_s=limit_s, exact_max_vars=10**9))
            dt = time.perf_counter() - t0
            proven = plan.optimal and dt <= limit_s
            cp = next((x.split("CP-SAT on ")[1].split(";")[0] for x in plan.explain if "CP-SAT on " in x), "full")
            detail.append(f"{n}:{dt:.1f}s{'*' if proven else ''}(cp-sat {cp})")
            ok_all &= proven
        if not ok_all:
            break
        largest = n
    return [Row("planner", f"largest cluster the exact solver proves optimal in 5 s{what}", largest, "nodes", "",
                None, "", "tries (nodes:time, * = proven, CP-SAT runs) " + " ".join(detail))]


def exact_hard(quick: bool, limit_s: float = 5.0) -> list[Row]:
    """Like exact_scaling, but only on clusters where the bounds do not settle it and CP-SAT must run (very
    full clusters, heartbeat moves, found by trying up to 20 clusters per size)."""
    rng = random.Random(5)
    largest = 0
    detail = []
    for n in (16, 64) if quick else (16, 64, 256, 1024):
        hit = None
        for _ in range(20):
            state = random_cluster(rng, n, fill=rng.uniform(0.9, 0.97))
            if not needs_moves(state, Request(8)):
                continue
            t0 = time.perf_counter()
            plan = plan_moves(state, Request(8), PlanOptions(solver="exact", time_limit_s=limit_s,
                                                              fresh_checkpoint=False, exact_max_vars=10**9))
            dt = time.perf_counter() - t0
            if cp_sat_runs(plan) >= 1:
                hit = (dt, plan.optimal and dt <= limit_s, cp_sat_runs(plan))
                break
        if hit is None:
            detail.append(f"{n}: none of 20 clusters needed CP-SAT")
            continue
        detail.append(f"{n}: {hit[0]:.2f}s{'*' if hit[1] else ''} (cp-sat {hit[2]})")
        if hit[1]:
            largest = n
    return [Row("planner", "largest cluster proven optimal in 5 s where CP-SAT had to run", largest, "nodes", "",
                None, "", "; ".join(detail))]


def infeasible_full(repeat: int = 3) -> list[Row]:
    """Issue #12's case: 4 nodes × 8 GPUs, 15 jobs, 26 busy GPUs, an 8-GPU request. No node can be cleared
    (the other three nodes cannot hold a node's jobs); the counting proof settles it before any CP-SAT search
    (the exact solver alone took 13–55 s to prove it)."""
    sizes = ((2, 2, 2, 1), (2, 2, 2, 1), (2, 2, 1, 1), (2, 2, 2))
    nodes = [Node(f"n{i}", 8, "H100", driver_version="550.54.15", cuda_version="12.4", cpu_arch="x86_64")
             for i in range(4)]
    ws, k = [], 0
    for i, row in enumerate(sizes):
        for size in row:
            free = [g for g in range(8) if all(g not in p.gpus for w in ws for p in w.placements
                                               if p.node == nodes[i].name)][:size]
            ws.append(Workload(f"j{k}", Request(size), placements=(Placement(nodes[i].name, tuple(free)),),
                               checkpoint_bytes=5 * GIB, last_checkpoint_at=NOW, versions=_VERS["H100"]))
            k += 1
    state = ClusterState.build(nodes, ws, now=NOW, name="full")
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan = plan_moves(state, Request(8), PlanOptions(solver="exact", time_limit_s=60.0))
        times.append(time.perf_counter() - t0)
        assert not plan.feasible and "proven" in plan.reason
    med = statistics.median(times)
    return [Row("planner", "prove 'no node can be cleared' (4 nodes, 15 jobs, 26 busy GPUs)", med, "s", "<= 1 s",
                med <= 1.0, "", plan.reason.split("(proven: ")[-1].rstrip(")"))]


def sliver_cluster(n_nodes: int = 5_000) -> ClusterState:
    """Half the nodes 2-GPU T4, each GPU split between a T4-pinned share of 500 and an unpinned one of 450;
    half 8-GPU P100, one GPU in 16 free. A whole T4 GPU needs a chain: an unpinned share leaves for a P100, a
    pinned share takes its place, the GPU it left is freed by the same again (3 moves). The shape that made a
    replay's decisions take seconds (gpuspec25, every T4 GPU holding a sliver), at the issue's 5,000 nodes."""
    half = n_nodes // 2
    nodes = [Node(f"t{i:05d}", 2, "T4") for i in range(half)] + [Node(f"p{i:05d}", 8, "P100") for i in range(half)]
    ws: list[Workload] = []
    for nd in nodes[:half]:
        for g in range(2):
            ws.append(Workload(f"{nd.name}-{g}-pin", Request(1, gpu_milli=500, gpu_models=("T4",)),
                               placements=(Placement(nd.name, (g,)),), checkpoint_bytes=(g + 1) * GIB,
                               last_checkpoint_at=0.0))
            ws.append(Workload(f"{nd.name}-{g}-any", Request(1, gpu_milli=450), placements=(Placement(nd.name, (g,)),),
                               checkpoint_bytes=2 * GIB, last_checkpoint_at=0.0))
    for k, nd in enumerate(nodes[half:]):
        ws.extend(Workload(f"{nd.name}-{g}", Request(1), placements=(Placement(nd.name, (g,)),),
                           checkpoint_bytes=4 * GIB, last_checkpoint_at=0.0) for g in range(8) if (8 * k + g) % 16)
    return ClusterState.build(nodes, ws, now=1000.0)


def search_limit_rows(quick: bool) -> list[Row]:
    """One decision's time where the heuristic's search is long: with the planner's default `search_limit` and
    without a limit, side by side, for a request no plan helps (2 moves allowed) and one a 3-move chain helps."""
    state = sliver_cluster(1_000 if quick else 5_000)
    req = Request(1, gpu_models=("T4",))
    rows: list[Row] = []
    for moves, what in ((2, "no plan (2 moves allowed)"), (8, "a 3-move chain")):
        got = {}
        for label, limit in (("limit", PlanOptions.search_limit), ("none", 10**9)):
            t0 = time.process_time()
            plan = plan_moves(state, req, PlanOptions(solver="heuristic", max_moves=moves, search_limit=limit))
            got[label] = (time.process_time() - t0, plan)
        (t_lim, p_lim), (t_all, p_all) = got["limit"], got["none"]
        cut = any("search stopped" in e for e in p_lim.explain) or "search stopped" in p_lim.reason
        rows.append(Row("planner", f"1-GPU T4 request among pinned slivers, {len(state.nodes)} nodes: {what}, "
                        f"default search_limit", t_lim, "s", "", None, f"no limit: {t_all:.2f} s",
                        f"feasible {p_lim.feasible} ({len(p_lim.moves)} moves; no limit: {p_all.feasible}, "
                        f"{len(p_all.moves)} moves); search cut: {cut}; CPU time"))
    return rows


def run(quick: bool = False) -> list[Row]:
    rows = quality(40 if quick else 200)
    rows += quality(20 if quick else 200, seed=8, fresh=False, fill=(0.8, 0.95),
                    label=" (heartbeat moves, fuller clusters)")
    rows += speed(3 if quick else 5)
    rows += infeasible_full()
    rows += search_limit_rows(quick)
    rows += exact_scaling(quick=quick)
    rows += exact_hard(quick)
    rows += exact_scaling(quick=quick, request=Request(4, 2), sizes=(4, 8, 16) if quick else (4, 8, 16, 32, 64),
                          what=" (2-node 4-GPU request: one CP-SAT model over all nodes)")
    return rows
