"""Generate large, realistic snapshot documents for benchmarks (seeded, deterministic)."""

from __future__ import annotations

import random
from typing import Any

GIB = 1 << 30


def big_cluster_doc(nodes: int = 10_000, gpus_per_node: int = 8, target_jobs: int = 50_000, pending: int = 200,
                    seed: int = 1) -> dict[str, Any]:
    """`nodes` × `gpus_per_node` GPUs filled to ~85 % with 1/2/4/8-GPU and fractional jobs; `pending` waiting."""
    rng = random.Random(seed)
    node_docs = []
    models = ["H100", "A100", "L40S"]
    for i in range(nodes):
        node_docs.append({
            "name": f"node-{i:05d}", "gpus": gpus_per_node, "gpu_model": models[i % 3],
            "cpu_milli": 192_000, "memory_mib": 2_000_000, "driver_version": "550.54.15", "cuda_version": "12.4",
            "labels": {"pool": f"p{i % 16}"},
        })
    free = [[1000] * gpus_per_node for _ in range(nodes)]
    workloads: list[dict[str, Any]] = []
    sizes = [1] * 60 + [2] * 20 + [4] * 10 + [8] * 3
    jid = 0
    attempts = 0
    while len(workloads) < target_jobs and attempts < target_jobs * 4:
        attempts += 1
        i = rng.randrange(nodes)
        frac = rng.random() < 0.15
        k = 1 if frac else rng.choice(sizes)
        milli = rng.choice([250, 500]) if frac else 1000
        gpus = [g for g in range(gpus_per_node) if free[i][g] >= milli][:k]
        if len(gpus) < k:
            continue
        for g in gpus:
            free[i][g] -= milli
        workloads.append({
            "id": f"job-{jid}", "gpus_per_node": k, "gpu_milli": milli, "cpu_milli": 4000 * k,
            "memory_mib": 32_000 * k, "namespace": f"team-{jid % 40}", "priority": rng.choice([0, 0, 10, 100]),
            "placements": [{"node": f"node-{i:05d}", "gpus": gpus}],
            "checkpoint_bytes": rng.randint(1, 80) * GIB * k // 4, "last_checkpoint_at": 1e9 - rng.randint(0, 7200),
            "versions": {"gpu_model": models[i % 3], "driver": "550.54.15", "cuda": "12.4"},
        })
        jid += 1
    for p in range(pending):
        workloads.append({"id": f"pending-{p}", "state": "pending", "gpus_per_node": rng.choice([2, 4, 8, 8]),
                          "namespace": f"team-{p % 40}", "submitted_at": 1e9 - p})
    return {"version": 1, "name": f"bench-{nodes}", "now": 1e9, "nodes": node_docs, "workloads": workloads}
