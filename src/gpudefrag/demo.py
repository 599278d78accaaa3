"""The embedded demo cluster: 4 nodes × 8 H100, every node 5 of 8 GPUs busy, one 8-GPU job pending.

12 GPUs are free, yet the 8-GPU job waits: the textbook fragmentation case. The running jobs differ in
checkpoint size and checkpoint age, so the cheapest node to clear is not simply the one with the fewest jobs.
"""

from __future__ import annotations

from .core.model import ClusterState
from .snapshot import load_snapshot_dict

GIB = 1 << 30
NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z: the demo's clock (the core never reads a clock)

_VERSIONS = {"gpu_model": "H100-80GB", "driver": "550.54.15", "cuda": "12.4", "cpu_arch": "x86_64"}


def _job(jid: str, gpus: int, node: str, ckpt_gib: float, ckpt_age_s: float, **extra: object) -> dict[str, object]:
    return {
        "id": jid,
        "name": jid,
        "gpus_per_node": gpus,
        "cpu_milli": gpus * 8000,
        "memory_mib": gpus * 64 * 1024,
        "namespace": "research",
        "placements": [{"node": node}],
        "checkpoint_bytes": int(ckpt_gib * GIB),
        "last_checkpoint_at": NOW - ckpt_age_s,
        "started_at": NOW - 6 * 3600,
        "versions": {**_VERSIONS, "gpu_count": gpus, "engine": "pytorch 2.4.0", "model": f"{jid}@1"},
        **extra,
    }


def demo_document() -> dict[str, object]:
    nodes = [
        {
            "name": f"gpu-node-{c}",
            "gpus": 8,
            "gpu_model": "H100-80GB",
            "cpu_milli": 128_000,
            "memory_mib": 1024 * 1024,
            "driver_version": "550.54.15",
            "cuda_version": "12.4",
            "cpu_arch": "x86_64",
            "labels": {"nvidia.com/gpu.product": "H100-80GB"},
            "partitions": ["gpu"],
        }
        for c in "abcd"
    ]
    workloads = [
        # node a: one 3-GPU and one 2-GPU job, both with fresh heartbeat checkpoints (cheap to move)
        _job("train-resnet", 3, "gpu-node-a", 24, 120),
        _job("finetune-bert", 2, "gpu-node-a", 12, 300),
        # node b: 2+2+1, small checkpoints but three moves
        _job("sweep-lr-1", 2, "gpu-node-b", 6, 900),
        _job("sweep-lr-2", 2, "gpu-node-b", 6, 900),
        _job("notebook-ana", 1, "gpu-node-b", 3, 3600),
        # node c: a 4-GPU LLM server with a huge KV cache + 1
        _job("serve-llama-70b", 4, "gpu-node-c", 180, 60, labels={"app": "inference"}),
        _job("eval-harness", 1, "gpu-node-c", 8, 600),
        # node d: 3+2, stale checkpoints (much work lost if moved without a fresh checkpoint)
        _job("train-gpt-small", 3, "gpu-node-d", 40, 7200),
        _job("rl-agent", 2, "gpu-node-d", 10, 5400),
        {
            "id": "pretrain-8gpu",
            "name": "pretrain-8gpu",
            "state": "pending",
            "gpus_per_node": 8,
            "cpu_milli": 64_000,
            "memory_mib": 512 * 1024,
            "namespace": "research",
            "submitted_at": NOW - 1800,
            "scheduler_reason": "Resources",
        },
    ]
    return {"version": 1, "name": "demo", "now": NOW, "nodes": nodes, "workloads": workloads}


def demo_state() -> ClusterState:
    return load_snapshot_dict(demo_document(), "<embedded demo>")
