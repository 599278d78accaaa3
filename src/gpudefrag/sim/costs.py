"""The simulator's checkpoint-size model: how many bytes a move writes, sends and restores.

A pod's checkpoint = its share of each GPU's memory (the share it asked for × the GPU model's memory: a
sharing pod at 470 milli on a 32 GiB GPU checkpoints 15 GB of GPU state) + its host-memory request (the CPU
side: process memory, pinned buffers), both assumed fully in use — an upper bound that makes moves look
expensive rather than cheap. Time per move follows `gpudefrag.core.cost.CostModel`'s bandwidths (checkpoint
2 GB/s, transfer 1.25 GB/s, restore 2 GB/s, 10 s overhead by default).
"""

from __future__ import annotations

from ..core.cost import CostModel
from ..core.model import MILLI
from ..core.placement import Pod

GIB = 1024**3
MIB = 1024**2

# GPU memory per model, GiB. G1–G3 are undisclosed in the Alibaba trace: taken as 32 GiB (a V100M32-class
# card); unknown models default to the same.
GPU_MEMORY_GIB: dict[str, float] = {
    "T4": 16, "P100": 16, "V100M16": 16, "V100M32": 32, "A10": 24, "A100": 80, "H100": 80,
    "G1": 32, "G2": 32, "G3": 32,
}
DEFAULT_GPU_MEMORY_GIB = 32.0


def checkpoint_bytes(pod: Pod, gpu_model: str | None) -> float:
    gpu_mem = GPU_MEMORY_GIB.get(gpu_model or "", DEFAULT_GPU_MEMORY_GIB) * GIB
    gpu_part = pod.num_gpu * (pod.gpu_milli / MILLI) * gpu_mem if pod.num_gpu else 0.0
    return gpu_part + pod.memory_mib * MIB


def move_seconds(nbytes: float, model: CostModel | None = None) -> float:
    """Downtime of one fresh-checkpoint move of `nbytes`."""
    m = model or CostModel()
    return nbytes / m.checkpoint_bps + nbytes / m.transfer_bps + nbytes / m.restore_bps + m.overhead_s
