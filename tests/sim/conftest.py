"""Small hand-made clusters and trace files for the simulator's tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from gpudefrag.core.fragmentation import TaskShape, WorkloadMix
from gpudefrag.core.model import MILLI
from gpudefrag.core.placement import Cluster

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
              "scheduled_time")


def make_cluster(free_rows: Sequence[Sequence[int]], *, cpu: Sequence[int] | None = None,
                 models: Sequence[str | None] | None = None, mix: WorkloadMix | None = None) -> Cluster:
    """A cluster whose GPUs have the given free milli-GPU (rows may differ in length: fewer GPUs)."""
    n = len(free_rows)
    g = max(len(r) for r in free_rows)
    cl = Cluster.build([f"n{i}" for i in range(n)], [len(r) for r in free_rows],
                       list(models) if models else ["G"] * n, list(cpu) if cpu else [64_000] * n, [0] * n,
                       mix or WorkloadMix.single(TaskShape(1, MILLI)))
    free = np.full((n, g), -1, dtype=np.int32)
    for i, r in enumerate(free_rows):
        free[i, : len(r)] = r
    cl.free = free
    cl._fgd = None
    return cl


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def write_trace(tmp: Path, nodes: Sequence[str], pods: Sequence[str]) -> tuple[Path, Path]:
    n = tmp / "nodes.csv"
    p = tmp / "pods.csv"
    n.write_text("\n".join([NODE_HEADER, *nodes]) + "\n")
    p.write_text("\n".join([POD_HEADER, *pods]) + "\n")
    return n, p


def pod_row(i: int, cpu: int, k: int, milli: int, spec: str = "") -> str:
    return f"p{i},{cpu},1024,{k},{milli},{spec},LS,Running,{i},{i + 100},{i}"
