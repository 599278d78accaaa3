"""A seeded synthetic workload for the dynamic simulation: arrivals, job sizes, durations, checkpoint sizes.

Parameters (all in `WorkloadSpec`, defaults below):
- Cluster: `nodes` × `gpus_per_node` GPUs (32 × 8 = 256), `cpu_per_node` milli-cores, GPU model `gpu_model`.
- Job-size mix `sizes`: (GPUs, share per GPU in milli, probability). Default: half-GPU 15 %, 1 GPU 45 %, 2 GPUs
  15 %, 4 GPUs 10 %, 8 GPUs 15 %. With equal mean durations, 8-GPU jobs carry 1.2 / 2.425 = 49 % of the GPU
  demand (the acceptance asks ≥ 30 %).
- Durations: log-normal, median `duration_median_s` (1,800 s), σ `duration_sigma` (1.0), capped at
  `duration_cap_s` (12 h); the same for every size, so size and duration are independent.
- Arrivals: Poisson with the rate that makes the offered load ρ = λ · E[GPUs × duration] / GPUs equal
  `load` (0.9).
- CPU per job: `cpu_per_gpu` (8,000 milli-cores) per GPU-equivalent, at least 2,000.
- Checkpoint size: see `sim/costs.py` (share of the GPU's memory + host memory `mem_per_gpu_mib` per GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core.model import MILLI
from ..core.placement import Cluster, Pod


@dataclass(frozen=True)
class WorkloadSpec:
    nodes: int = 32
    gpus_per_node: int = 8
    cpu_per_node: int = 128_000
    gpu_model: str = "G2"
    sizes: tuple[tuple[int, int, float], ...] = ((1, 500, 0.15), (1, 1000, 0.45), (2, 1000, 0.15),
                                                 (4, 1000, 0.10), (8, 1000, 0.15))
    duration_median_s: float = 1800.0
    duration_sigma: float = 1.0
    duration_cap_s: float = 12 * 3600.0
    load: float = 0.9
    jobs: int = 3000
    cpu_per_gpu: int = 8000
    mem_per_gpu_mib: int = 32768
    seed: int = 1

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def mean_gpu_equiv(self) -> float:
        ps = np.array([p for _, _, p in self.sizes])
        g = np.array([k * m / MILLI for k, m, _ in self.sizes])
        return float((ps * g).sum() / ps.sum())

    def eight_gpu_demand_share(self) -> float:
        ps = np.array([p for _, _, p in self.sizes])
        g = np.array([k * m / MILLI for k, m, _ in self.sizes])
        big = np.array([k >= 8 for k, _, _ in self.sizes])
        return float((ps * g)[big].sum() / (ps * g).sum())


@dataclass(frozen=True)
class Job:
    id: int
    pod: Pod
    submit: float
    duration: float

    @property
    def size_class(self) -> str:
        return "share" if self.pod.is_sharing else f"{self.pod.num_gpu}-gpu"

    @property
    def gpu_equiv(self) -> float:
        return self.pod.gpu_total / MILLI


@dataclass(frozen=True)
class Workload:
    spec: WorkloadSpec
    jobs: tuple[Job, ...] = field(default=())


def generate(spec: WorkloadSpec) -> Workload:
    rng = np.random.default_rng(spec.seed)
    probs = np.array([p for _, _, p in spec.sizes], dtype=float)
    probs /= probs.sum()
    kinds = rng.choice(len(spec.sizes), size=spec.jobs, p=probs)
    dur = np.minimum(spec.duration_median_s * np.exp(spec.duration_sigma * rng.standard_normal(spec.jobs)),
                     spec.duration_cap_s)
    # E[duration] of the capped log-normal, estimated from a large seeded sample (so `load` is met closely)
    sample = np.minimum(spec.duration_median_s * np.exp(spec.duration_sigma *
                                                        np.random.default_rng(12345).standard_normal(200_000)),
                        spec.duration_cap_s)
    rate = spec.load * spec.gpus / (spec.mean_gpu_equiv() * float(sample.mean()))
    t = np.cumsum(rng.exponential(1.0 / rate, size=spec.jobs))
    pods = []
    for k, m, _ in spec.sizes:
        g = k * m / MILLI
        pods.append(Pod(k, m, max(2000, int(spec.cpu_per_gpu * g)), int(spec.mem_per_gpu_mib * g)))
    jobs = tuple(Job(i, pods[int(kinds[i])], float(t[i]), float(dur[i])) for i in range(spec.jobs))
    return Workload(spec, jobs)


def synthetic_cluster(spec: WorkloadSpec, pooled: bool = False) -> Cluster:
    """`nodes` × `gpus_per_node`, or (pooled) one imaginary node holding every GPU, CPU and memory."""
    from .trace import fgd_mix

    mix = fgd_mix([p for _, p in _shape_pods(spec)])
    if pooled:
        return Cluster.build(["pooled"], [spec.gpus], [spec.gpu_model], [spec.cpu_per_node * spec.nodes], [0], mix)
    return Cluster.build([f"node-{i:03d}" for i in range(spec.nodes)], [spec.gpus_per_node] * spec.nodes,
                         [spec.gpu_model] * spec.nodes, [spec.cpu_per_node] * spec.nodes, [0] * spec.nodes, mix)


def _shape_pods(spec: WorkloadSpec) -> list[tuple[float, Pod]]:
    """The mix's shapes with weights in proportion to their probabilities (100 copies per percent)."""
    out = []
    for k, m, p in spec.sizes:
        g = k * m / MILLI
        pod = Pod(k, m, max(2000, int(spec.cpu_per_gpu * g)), int(spec.mem_per_gpu_mib * g))
        out.extend([(p, pod)] * max(1, round(p * 1000)))
    return out
