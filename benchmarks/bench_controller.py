"""Controller benchmark: one cycle (observe + trigger/diagnose + plan) on a 10,000-node simulated cluster.

    ./scripts/bench.sh controller            # 5 timed cycles
    ./scripts/bench.sh --quick controller    # 3 timed cycles

The cluster: 10,000 nodes x 8 GPUs, each 4-7 GPUs busy with 1/2/4-GPU jobs (no node has 8 free), 150 small
pending jobs that fit now and 50 pending 8-GPU jobs, the oldest of them submitted first; behind the in-memory
engine. The cycle is a dry run (observe, find the oldest 8-GPU job blocked by fragmentation alone, plan the
moves that free a node for it; no execution), so every cycle does the same work.
"""

from __future__ import annotations

import random
import time

from common import Row, median_time
from gpudefrag.control.controller import Controller
from gpudefrag.core.model import ClusterState, Node, Placement, Request, Workload, WorkloadState
from gpudefrag.engines.sim import SimEngine
from gpudefrag.policy import parse_policy

GIB = 1 << 30


def fragmented_cluster(n_nodes: int = 10_000, seed: int = 3) -> ClusterState:
    rng = random.Random(seed)
    nodes = [Node(f"n{i:05d}", 8, "H100", partitions=("gpu",)) for i in range(n_nodes)]
    wls: list[Workload] = []
    for nd in nodes:
        busy_target = rng.randint(4, 7)
        g = 0
        while g < busy_target:
            k = min(rng.choice([1, 1, 2, 2, 4]), busy_target - g)
            wls.append(Workload(f"r{len(wls)}", Request(k, partition="gpu"), name=f"train-{len(wls)}",
                                placements=(Placement(nd.name, tuple(range(g, g + k))),),
                                checkpoint_bytes=rng.randint(1, 80) * GIB, last_checkpoint_at=-rng.random() * 3600,
                                submitted_at=-7200.0, started_at=-3600.0))
            g += k
    for p in range(200):
        big = p % 4 == 0
        wls.append(Workload(f"p{p}", Request(8 if big else rng.choice([1, 2]), partition="gpu"),
                            state=WorkloadState.PENDING, submitted_at=float(p), scheduler_reason="Resources"))
    return ClusterState.build(nodes, wls, now=0.0)


def run(quick: bool) -> list[Row]:
    state = fragmented_cluster()
    sim = SimEngine(state)
    sim.now = 3600.0
    policy = parse_policy({"trigger": {"pending": {"longer_than_s": 60, "min_gpus": 1}}})
    ctl = Controller(sim, policy, None, dry_run=True, clock=lambda: sim.now)
    first = ctl.cycle()
    plan = first.plans[0] if first.plans else None
    cycle = median_time(ctl.cycle, repeat=3 if quick else 5)
    t_obs = median_time(sim.observe, repeat=3)
    note = (f"{len(state.nodes)} nodes, {len(state.running)} running, {len(state.pending)} pending; plan for "
            f"{plan.workload_id if plan else '-'}: {len(plan.moves) if plan else 0} move(s), "
            f"{plan.solver if plan else '-'}; dry run")
    rows = [
        Row("controller", "one cycle, 10k nodes (observe + diagnose + plan)", cycle, "s", "<= 1 s", cycle <= 1.0,
            note=note),
        Row("controller", "observe alone (sim engine, validated state), 10k nodes", t_obs, "s"),
    ]
    t0 = time.perf_counter()
    ctl.cycle()
    rows.append(Row("controller", "cycle (single, after warm-up)", time.perf_counter() - t0, "s"))
    return rows
