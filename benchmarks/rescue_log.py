"""Where FGD + repack spends its moves: every rescue of one replay, summed by how full the cluster was.

    .venv/bin/python benchmarks/rescue_log.py --pods $T/variants/openb_pod_list_gpuspec20.csv --seed 43 \
        [--nodes N.csv] [--move-budget 0.05] [--max-moves 16]

A static replay submits pods until the cluster saturates, and only the state at 100 % arrived is scored, so a
rescue made while the cluster still has room mostly makes room that later arrivals would have taken anyway. The
table shows, per band of allocated GPU %, the rescue calls, the pods placed by moves, their GPUs and the moves
spent; docs/simulator.md ("Where the budget goes on the gpuspec lists") reads it.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from gpudefrag.core.model import MILLI
from gpudefrag.sim.experiments import StaticRun
from gpudefrag.sim.repack import ChainRepacker
from gpudefrag.sim.replay import build_workload, replay
from gpudefrag.sim.trace import load_trace
from reproduce_fgd import trace_dir

BANDS = (0, 60, 70, 80, 90, 94, 101)


@dataclass
class Rescue:
    allocated_pct: float  # of the cluster's GPUs, when the pod failed
    placed: bool
    gpus: float
    moves: int


@dataclass
class LoggingRepacker(ChainRepacker):
    """The repacker, recording every rescue it is asked for."""

    log: list[Rescue] = field(default_factory=list)

    def rescue(self, cl, pod, placed, policy, rng, stats):  # type: ignore[no-untyped-def,override]
        before, pct = stats.moves, 100.0 * cl.allocated_milli / cl.capacity_milli
        choice = super().rescue(cl, pod, placed, policy, rng, stats)
        self.log.append(Rescue(pct, choice is not None, pod.gpu_total / MILLI, stats.moves - before))
        return choice


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", help="node list (default: the trace's GPU nodes, as reproduce_fgd.py finds it)")
    ap.add_argument("--pods", required=True)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--move-budget", type=float, default=0.05)
    ap.add_argument("--max-moves", type=int, default=16)
    args = ap.parse_args(argv)
    found = trace_dir()
    if args.nodes is None and found is None:
        ap.error("no --nodes and no trace: pass --nodes or set GPUDEFRAG_TRACE_DIR")
    trace = load_trace(args.nodes or found / "openb_node_list_gpu_node.csv", args.pods)
    cluster = trace.cluster()
    tune = StaticRun.tune  # the study's workload, as every static run builds it
    workload = build_workload([p.pod for p in trace.pods], cluster.capacity_milli, args.seed, tune)
    rp = LoggingRepacker(max_moves=args.max_moves, budget=args.move_budget)
    result = replay(cluster, workload, "fgd", seed=args.seed, tune=tune, defrag=rp)
    print(f"{Path(args.pods).name} seed {args.seed}: unallocated at 100 % {100 - result.curve[100]:.2f} %, "
          f"{result.stats.moves} moves")
    print(f"{'allocated %':>12} {'calls':>6} {'placed':>7} {'GPUs':>7} {'moves':>6}")
    for lo, hi in pairwise(BANDS):
        band = [r for r in rp.log if lo <= r.allocated_pct < hi]
        ok = [r for r in band if r.placed]
        print(f"{f'{lo}–{hi}':>12} {len(band):>6} {len(ok):>7} {sum(r.gpus for r in ok):>7.1f} "
              f"{sum(r.moves for r in ok):>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
