"""The simulator's checkpoint-size model: how many bytes a move writes, sends and restores; what a move costs
comes from the one cost formula, `gpudefrag.core.cost.CostModel.move_cost`, as for the planner.

A pod's checkpoint = its share of each GPU's memory (the share it asked for × the GPU model's memory: a
sharing pod at 470 milli on a 32 GiB GPU checkpoints 15 GB of GPU state) + its host-memory request (the CPU
side: process memory, pinned buffers), both assumed fully in use — an upper bound that makes moves look
expensive rather than cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.cost import CostModel, MoveCost
from ..core.model import MILLI, Request, Workload
from ..core.placement import Choice, Cluster, Pod

if TYPE_CHECKING:
    from .replay import MoveStats

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


def request_of(pod: Pod) -> Request:
    """The pod's shape as the planner's request (one node)."""
    return Request(pod.num_gpu, 1, pod.gpu_milli, pod.cpu_milli, pod.memory_mib, pod.gpu_models)


def as_workload(pod: Pod, nbytes: float, pid: int = 0, **fields: Any) -> Workload:
    """The pod as the planner sees a running workload (its shape and checkpoint size; `fields`: more of the
    Workload's fields, e.g. its placement and start time)."""
    return Workload(f"pod-{pid}", request_of(pod), checkpoint_bytes=int(nbytes), **fields)


def move_cost(pod: Pod, gpu_model: str | None, source: str = "", target: str = "",
              model: CostModel | None = None) -> MoveCost:
    """A fresh-checkpoint move of the pod, priced by core.cost (its `score` is what the planner minimises)."""
    w = as_workload(pod, checkpoint_bytes(pod, gpu_model))
    return (model or CostModel()).move_cost(w, source, target, 0.0)


def move_seconds(nbytes: float, model: CostModel | None = None) -> float:
    """Downtime of one fresh-checkpoint move of `nbytes` (core.cost's formula)."""
    w = Workload("pod", Request(0, 1, 0), checkpoint_bytes=int(nbytes))
    return (model or CostModel()).move_cost(w, "", "", 0.0).downtime_s


def record_move(stats: MoveStats, pod: Pod, cl: Cluster, was: Choice, now: Choice,
                model: CostModel | None = None) -> None:
    """Count one move in a replay's MoveStats: share, checkpoint bytes, downtime and the planner's score."""
    b = checkpoint_bytes(pod, cl.models[was.node])
    mc = (model or CostModel()).move_cost(as_workload(pod, b), cl.names[was.node], cl.names[now.node], 0.0)
    stats.moved_milli += pod.gpu_total
    stats.moved_bytes += b
    stats.move_seconds += mc.downtime_s
    stats.moved_gpu_s += mc.score
