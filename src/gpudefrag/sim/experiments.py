"""Experiments: many (policy, seed) replays in parallel processes, medians, and the authors' numbers beside.

A worker process loads the trace once (cached per process) and runs the replays it is given; results come
back as plain arrays. The authors' cached results (`fgd-expected-results/analysis_allo_discrete.csv`, shipped
with the trace, not with the product) are read when present.
"""

from __future__ import annotations

import csv
import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..core.placement import FGD_STUDY_POLICIES, Cluster
from .replay import CURVE_MAX, ReplayResult, build_workload, percentile_curve, replay
from .sweep import run_tasks
from .trace import Trace, TraceNode, TracePod, cluster_from_snapshot, fgd_mix, load_pods, load_trace

AUTHOR_NAMES = {
    "01-Random": "random", "02-DotProd": "dotproduct", "03-GpuClustering": "gpuclustering",
    "04-GpuPacking": "gpupacking", "05-BestFit": "bestfit", "06-FGD": "fgd",
}
PAPER_AT_100 = {"random": 13.75, "dotproduct": 9.45, "gpuclustering": 8.42, "gpupacking": 8.20,
                "bestfit": 7.09, "fgd": 4.77}
DEFAULT_SEEDS = tuple(range(42, 52))
DEFAULT_WORKLOAD = "openb_pod_list_default"


@dataclass(frozen=True)
class StaticRun:
    """One static replay to run: which trace, policy, seed, tune, and whether to defragment."""

    nodes: str
    pods: str
    policy: str
    seed: int
    tune: float = 1.3
    defrag: str = "none"  # "none" | "migrate" | "evict" | "repack" | "deschedule"
    max_moves: int = 8
    snapshot: str = ""  # a gpudefrag snapshot to take the cluster from instead of `nodes`
    gib_per_gpu: float = 0.0  # repack's move price: GiB of checkpoints a rescue may move per GPU placed (0 = free)
    deschedule_ratio: float = 0.05  # the authors' descheduler: its budget, a ratio of the pods on the cluster
    deschedule_policy: str = "fragOnePod"
    deschedule_repeat: bool = False  # a pass at every failure while its budget lasts (the authors': one pass)
    move_budget: float = 0.1  # migrate / evict / repack: moves per placed pod the whole run may make
    gib_budget: float = 0.0  # repack: checkpoint GiB the whole run may write (0 = no cap)
    moves_per_gpu: float = 0.0  # repack: pods a rescue may move per GPU it places (0 = only --max-moves)
    saturated: float = 0.0  # repack: rescue only once the nodes of the pod's GPU models are this allocated (0 = always)


@lru_cache(maxsize=4)
def _trace(nodes: str, pods: str) -> Trace:
    return load_trace(nodes, pods)


@lru_cache(maxsize=4)
def _pods(pods: str) -> tuple[TracePod, ...]:
    return load_pods(pods)


@lru_cache(maxsize=4)
def _snapshot_cluster(snapshot: str, pods: str) -> Cluster:
    return cluster_from_snapshot(snapshot, fgd_mix([p.pod for p in _pods(pods)]))


def run_one(run: StaticRun) -> ReplayResult:
    if run.snapshot:
        trace = Trace((), _pods(run.pods))
        cluster = _snapshot_cluster(run.snapshot, run.pods)
    else:
        trace = _trace(run.nodes, run.pods)
        cluster = trace.cluster()
    workload = build_workload([p.pod for p in trace.pods], cluster.capacity_milli, run.seed, run.tune)
    defrag = None
    if run.defrag != "none":
        if run.defrag == "repack":
            from .repack import ChainRepacker

            defrag = ChainRepacker(max_moves=run.max_moves, budget=run.move_budget, gib_per_gpu=run.gib_per_gpu,
                                   gib_budget=run.gib_budget, moves_per_gpu=run.moves_per_gpu,
                                   saturated=run.saturated)
        elif run.defrag == "deschedule":
            from .deschedule import Descheduler

            defrag = Descheduler(ratio=run.deschedule_ratio, policy=run.deschedule_policy,
                                 repeat=run.deschedule_repeat)
        else:
            from .defrag import make_defragmenter

            defrag = make_defragmenter(run.defrag, max_moves=run.max_moves, budget=run.move_budget)
    result = replay(cluster, workload, run.policy, seed=run.seed, tune=run.tune, defrag=defrag)
    if run.defrag != "none":
        result.policy = f"{run.policy}+{run.defrag}"
    return result


def run_many(
    runs: Sequence[StaticRun],
    workers: int | None = None,
    on_done: Callable[[StaticRun, ReplayResult], None] | None = None,
    ray: str | None = None,
) -> list[ReplayResult]:
    """Run the replays in `workers` processes (default: the CPU count), or as Ray tasks (`ray`: an address or
    "local"; see `sim/sweep.py`); results in the order of `runs`."""
    return run_tasks(run_one, runs, workers=workers, ray=ray, on_done=on_done)


def median_curves(results: Sequence[ReplayResult]) -> dict[str, np.ndarray]:
    """Per policy: the median over seeds of the unallocated-GPU % curve (index = arrived %)."""
    by: dict[str, list[np.ndarray]] = {}
    for r in results:
        by.setdefault(r.policy, []).append(r.unallocated_curve)
    return {k: percentile_curve(v) for k, v in by.items()}


def author_runs(trace_dir: str | os.PathLike[str], workload: str = DEFAULT_WORKLOAD) -> dict[str, np.ndarray]:
    """The authors' unallocated-GPU % curves for `workload`, one row per seed they ran (seeds × arrived %), if
    their cached results sit in `trace_dir/fgd-expected-results/` (empty when the file or the rows are absent)."""
    path = Path(trace_dir) / "fgd-expected-results" / "analysis_allo_discrete.csv"
    if not path.is_file():
        return {}
    by: dict[str, list[np.ndarray]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            if row.get("workload") != workload:
                continue
            name = AUTHOR_NAMES.get(row.get("sc_policy", ""))
            if name is None:
                continue
            curve = np.array([float(row[str(k)]) if row.get(str(k)) not in (None, "") else np.nan
                              for k in range(CURVE_MAX + 1)])
            by.setdefault(name, []).append(100.0 - curve)
    return {k: np.stack(v) for k, v in by.items()}


def author_curves(trace_dir: str | os.PathLike[str], workload: str = DEFAULT_WORKLOAD) -> dict[str, np.ndarray]:
    """The authors' median unallocated-GPU % curves for `workload` (see `author_runs`)."""
    return {k: percentile_curve(v) for k, v in author_runs(trace_dir, workload).items()}


def same_distribution_p(ours: Sequence[float], theirs: Sequence[float]) -> float:
    """Two-sided Mann–Whitney U p-value that our per-seed values and the authors' come from one distribution.

    The acceptance compares two medians of ten seeds each, and one seed's result spreads over 1–2 pp for the
    banded policies, so two medians of the *same* simulator differ by more than 0.5 pp several percent of the
    time; a small p (say < 0.05) is what says the difference is in the method rather than in the seeds."""
    from scipy.stats import mannwhitneyu

    a = np.asarray(ours, dtype=float)
    b = np.asarray(theirs, dtype=float)
    a, b = a[~np.isnan(a)], b[~np.isnan(b)]
    if len(a) == 0 or len(b) == 0:
        return float("nan")
    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


@dataclass(frozen=True)
class AuthorResults:
    """The authors' numbers for the workload a replay ran: median curves per policy (empty when they have
    none), the paper's figures at 100 % (the default list only), a line saying where they came from, and the
    per-seed curves behind the medians (for `same_distribution_p`)."""

    workload: str
    curves: dict[str, np.ndarray]
    paper_at_100: dict[str, float]
    source: str
    runs: dict[str, np.ndarray] = field(default_factory=dict)  # per policy: seeds × arrived %


# the authors ran every list on the 1,213 GPU nodes (6,212 GPUs) of openb_node_list_gpu_node.csv: the digest of
# those nodes' (CPU, memory, GPUs, model), sorted, so a copy under other names or in another order still counts
AUTHORS_CLUSTER = "1058ee62e2b755365bfc18026238d81b75db23534918f0aa2b9a6fb2e05537b9"


def is_authors_cluster(nodes: Sequence[TraceNode]) -> bool:
    """Are these the nodes the authors' results were measured on? On any other cluster (their list plus CPU-only
    nodes, a subset, a custom one) the same pod list gives other numbers, and a comparison would mislead."""
    rows = sorted(f"{n.cpu_milli},{n.memory_mib},{n.gpus},{n.model or ''}" for n in nodes)
    return hashlib.sha256("\n".join(rows).encode()).hexdigest() == AUTHORS_CLUSTER


def authors_for(pods: str | os.PathLike[str], folder: str | os.PathLike[str] | None = None) -> AuthorResults:
    """The authors' cached results for the pod list `pods` (its file name without .csv is their `workload`),
    looked up in `folder` (default: the pod list's folder) and in its `variants/` subfolder."""
    workload = Path(pods).stem
    base = Path(folder) if folder else Path(pods).parent
    tried = [base, base / "variants"]
    paper = dict(PAPER_AT_100) if workload == DEFAULT_WORKLOAD else {}
    for d in tried:
        runs = author_runs(d, workload)
        if runs:
            curves = {k: percentile_curve(v) for k, v in runs.items()}
            return AuthorResults(workload, curves, paper,
                                 f"{d / 'fgd-expected-results' / 'analysis_allo_discrete.csv'} ({workload})", runs)
    where = " or ".join(str(d / "fgd-expected-results") for d in tried)
    return AuthorResults(workload, {}, paper, f"none: the authors have no cached results for {workload} in {where}")


def static_runs(nodes: str, pods: str, policies: Sequence[str] = FGD_STUDY_POLICIES,
                seeds: Sequence[int] = DEFAULT_SEEDS, tune: float = 1.3, defrag: Sequence[str] = ("none",),
                max_moves: int = 8, snapshot: str = "", gib_per_gpu: float = 0.0, deschedule_ratio: float = 0.05,
                deschedule_policy: str = "fragOnePod", deschedule_repeat: bool = False, move_budget: float = 0.1,
                gib_budget: float = 0.0, moves_per_gpu: float = 0.0, saturated: float = 0.0) -> list[StaticRun]:
    return [StaticRun(str(nodes), str(pods), p, s, tune, d, max_moves, str(snapshot or ""), gib_per_gpu,
                      deschedule_ratio, deschedule_policy, deschedule_repeat, move_budget, gib_budget, moves_per_gpu,
                      saturated)
            for d in defrag for p in policies for s in seeds]


def tighter_bound(trace: Trace, seeds: Sequence[int], tune: float = 1.3, time_limit_s: float = 10.0) -> float:
    """The tighter lower bound on unallocated % at 100 % arrived (`sim/bound_resource.py`: per-node CPU, memory
    and GPU models, never below the arc-flow bound), median over the seeds' workloads."""
    from .bound import arrived_prefix
    from .bound_resource import node_types, resource_bound  # OR-Tools and SciPy: only when a bound is asked for

    cl = trace.cluster()
    types = node_types(cl)
    pods = [p.pod for p in trace.pods]
    return float(np.median([
        resource_bound(arrived_prefix(build_workload(pods, cl.capacity_milli, s, tune), cl.capacity_milli), types,
                       time_limit_s=time_limit_s).unallocated_pct for s in seeds]))
