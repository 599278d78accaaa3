"""Fragmentation: what the free GPUs are worth to the requests that wait.

Two views. The operator's (free GPUs, whole-free nodes, stranded GPUs for one request shape, the largest request
placeable now) and the FGD measure of Weng et al. (ATC '23): for a workload mix M of task shapes with
popularities p_m, node fragmentation F_n(M) = Σ_m p_m · F_n(m), where F_n(m) is the free GPU on n that task m
cannot use — all of it when m does not fit on n (GPU type, CPU, or GPU count) or asks for no GPU, else the
free pieces of GPUs whose free share is below min(d_m, 1).
All functions are vectorised over nodes with NumPy and take the arrays of a ClusterState.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .capacity import Shape, fits
from .model import MILLI, ClusterState, Node, Request, Toleration


def TaskShape(num_gpu: int, gpu_milli: int = MILLI, cpu_milli: int = 0,
              gpu_models: tuple[str, ...] = ()) -> Shape:
    """One entry of a workload mix (what the FGD measure calls a task type): the one request shape
    (core/capacity.Shape) with no memory, which the measure does not look at."""
    return Shape(num_gpu, gpu_milli, cpu_milli, 0, gpu_models)


def task_shape(request: Request) -> Shape:
    """A request's task type for the FGD measure."""
    return TaskShape(request.gpus_per_node, request.gpu_milli, request.cpu_milli, request.gpu_models)


@dataclass(frozen=True)
class WorkloadMix:
    """Task shapes and their popularities (summing to 1)."""

    shapes: tuple[Shape, ...]
    weights: tuple[float, ...]

    @staticmethod
    def from_shapes(
        shapes: Iterable[Shape], *, coverage: float = 0.95, step: int = 1, include_cpu_only: bool = True
    ) -> WorkloadMix:
        """Popularity of each distinct shape; the most frequent shapes are kept `step` at a time until they
        cover `coverage` of all tasks, then renormalised. This is the FGD authors' construction with the
        settings of their experiments (95 %, one shape at a time; equally popular shapes ordered by CPU, GPU
        share, GPU count and GPU type, largest first, as their reversed sort does)."""
        counts = Counter(s for s in shapes if include_cpu_only or s.num_gpu > 0)
        total = sum(counts.values())
        if total == 0:
            raise ValueError("a workload mix needs at least one task shape")
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], _shape_key(kv[0])), reverse=True)
        kept = 0
        covered = 0
        while kept < len(ranked) and covered < coverage * total:
            chunk = ranked[kept : kept + step]
            covered += sum(c for _, c in chunk)
            kept += len(chunk)
        chosen = ranked[:kept]
        s = sum(c for _, c in chosen)
        return WorkloadMix(tuple(k for k, _ in chosen), tuple(c / s for _, c in chosen))

    @staticmethod
    def single(shape: Shape) -> WorkloadMix:
        return WorkloadMix((shape,), (1.0,))


def _shape_key(s: Shape) -> tuple[int, int, int, str]:
    return (s.cpu_milli, s.gpu_milli, s.num_gpu, "|".join(s.gpu_models))


# ---------------------------------------------------------------------------------------------- fitting
def model_mask(nodes: Sequence[Node], models: Sequence[str]) -> np.ndarray:
    """Nodes whose GPU model is allowed (all nodes when `models` is empty)."""
    if not models:
        return np.ones(len(nodes), dtype=bool)
    allowed = set(models)
    return np.fromiter((n.gpu_model in allowed for n in nodes), dtype=bool, count=len(nodes))


def state_model_mask(state: ClusterState, models: Sequence[str]) -> np.ndarray:
    """model_mask, memoised on the state."""
    key = ("model", tuple(models))
    m = state.memo.get(key)
    if m is None:
        m = state.memo[key] = model_mask(state.nodes, models)
    return m  # type: ignore[return-value]


def tolerated(node: Node, tolerations: Sequence[Toleration]) -> bool:
    """Whether every NoSchedule/NoExecute taint of the node is tolerated."""
    return all(
        t.effect == "PreferNoSchedule" or any(tol.tolerates(t) for tol in tolerations) for t in node.taints
    )


def selector_matches(node: Node, selector: dict[str, str] | object) -> bool:
    sel = dict(selector)  # type: ignore[call-overload]
    return all(node.labels.get(k) == v for k, v in sel.items())


def eligible_mask(state: ClusterState, request: Request) -> np.ndarray:
    """Nodes the request may use at all, whatever is free on them: schedulable, allowed GPU model, node
    selector, tolerated taints and partition. (A MIG node advertises only its full GPUs as allocatable.)"""
    key = ("eligible", request.gpu_models, tuple(sorted(request.node_selector.items())), request.tolerations,
           request.partition)
    cached = state.memo.get(key)
    if cached is not None:
        return cached  # type: ignore[return-value]
    nodes = state.nodes
    mask = state.schedulable_mask & state_model_mask(state, request.gpu_models)
    if state.memo.setdefault("constrained", any(n.taints or n.partitions for n in nodes)) or request.node_selector:
        extra = np.fromiter(
            (
                selector_matches(n, request.node_selector)
                and tolerated(n, request.tolerations)
                and (not request.partition or not n.partitions or request.partition in n.partitions)
                for n in nodes
            ),
            dtype=bool,
            count=len(nodes),
        )
        mask &= extra
    state.memo[key] = mask
    return mask


def capacity_fits(
    free: np.ndarray, cpu_free: np.ndarray, mem_free: np.ndarray, request: Request,
    counts: np.ndarray | None = None,
) -> np.ndarray:
    """Nodes where one node's part of the request fits by free capacity alone (the capacity model's fit).
    `counts`: capacity.share_counts for the request's share, when the caller memoises it."""
    return fits(free, cpu_free, mem_free, Shape.of(request), counts)


def fits_mask(state: ClusterState, request: Request) -> np.ndarray:
    """Nodes where one node's part of the request can be placed now."""
    return eligible_mask(state, request) & capacity_fits(
        state.free_milli, state.cpu_free, state.mem_free, request
    )


# ---------------------------------------------------------------------------------------------- FGD measure
def task_fragment(
    free: np.ndarray,
    cpu_free: np.ndarray,
    allowed: np.ndarray,
    shape: Shape,
) -> np.ndarray:
    """F_n(m) in milli-GPU for every node: the free GPU on n that a task of this shape cannot use.

    `free` is (nodes × GPUs) with -1 for missing GPUs; `allowed` marks nodes of an allowed GPU model.
    """
    valid = free > 0
    total_free = np.where(valid, free, 0).sum(axis=1)
    if shape.num_gpu == 0:
        return total_free
    need = min(shape.gpu_milli, MILLI)
    fits = allowed & (cpu_free >= shape.cpu_milli) & ((free >= need).sum(axis=1) >= shape.num_gpu)
    small = np.where(valid & (free < need), free, 0).sum(axis=1)
    return np.where(fits, small, total_free)


def node_fragmentation(
    free: np.ndarray,
    cpu_free: np.ndarray,
    nodes: Sequence[Node],
    mix: WorkloadMix,
) -> np.ndarray:
    """F_n(M) = Σ_m p_m · F_n(m) in milli-GPU, per node (float64)."""
    out = np.zeros(free.shape[0], dtype=np.float64)
    masks: dict[tuple[str, ...], np.ndarray] = {}
    for shape, p in zip(mix.shapes, mix.weights, strict=True):
        allowed = masks.get(shape.gpu_models)
        if allowed is None:
            allowed = masks[shape.gpu_models] = model_mask(nodes, shape.gpu_models)
        out += p * task_fragment(free, cpu_free, allowed, shape)
    return out


def default_mix(state: ClusterState) -> WorkloadMix:
    """The mix of the workloads in the snapshot (running and pending); one whole GPU if there are none."""
    shapes = [task_shape(w.request) for w in state.workloads]
    if not shapes:
        return WorkloadMix.single(TaskShape(1))
    return WorkloadMix.from_shapes(shapes)


# ---------------------------------------------------------------------------------------------- operator view
@dataclass(frozen=True)
class FragReport:
    """The numbers `gpudefrag frag` prints. GPU amounts in whole GPUs unless named milli."""

    nodes: int
    gpus: int
    free_gpus: int  # wholly free GPUs
    free_milli: int  # all free share, partial GPUs included
    whole_free_nodes: int
    request: Request
    nodes_fitting: int
    stranded_gpus: int  # wholly free GPUs on nodes where the request cannot fit
    stranded_milli: int  # Σ F_n(request): all free share the request cannot use
    largest_placeable: int  # most whole GPUs one node can give now
    largest_node: str | None
    largest_by_model: dict[str, int]
    histogram: dict[int, int]  # wholly-free-GPU count -> number of nodes
    fgd_milli: float
    fgd_ratio: float  # FGD fragment / free share
    mix_size: int

    def as_dict(self) -> dict[str, object]:
        return {
            "nodes": self.nodes,
            "gpus": self.gpus,
            "free_gpus": self.free_gpus,
            "free_gpu_share": self.free_milli / MILLI,
            "whole_free_nodes": self.whole_free_nodes,
            "request": {
                "gpus_per_node": self.request.gpus_per_node,
                "node_count": self.request.node_count,
                "gpu_milli": self.request.gpu_milli,
                "gpu_models": list(self.request.gpu_models),
            },
            "nodes_fitting_request": self.nodes_fitting,
            "stranded_gpus": self.stranded_gpus,
            "stranded_gpu_share": self.stranded_milli / MILLI,
            "largest_placeable": self.largest_placeable,
            "largest_node": self.largest_node,
            "largest_placeable_by_model": self.largest_by_model,
            "free_gpus_per_node_histogram": {str(k): v for k, v in sorted(self.histogram.items())},
            "fgd_fragmentation_gpus": self.fgd_milli / MILLI,
            "fgd_fragmentation_ratio": self.fgd_ratio,
            "workload_mix_shapes": self.mix_size,
        }


def whole_free_counts(state: ClusterState) -> np.ndarray:
    """Wholly free GPUs per node."""
    return (state.free_milli == MILLI).sum(axis=1)


def whole_free_node_mask(state: ClusterState) -> np.ndarray:
    counts = whole_free_counts(state)
    return (state.usable_counts > 0) & (counts == state.usable_counts)


def stranded(state: ClusterState, request: Request, fits: np.ndarray | None = None) -> tuple[int, int]:
    """(stranded whole GPUs, stranded milli) for a request shape."""
    if fits is None:
        fits = fits_mask(state, request)
    whole = whole_free_counts(state)
    if request.node_count > 1 and int(fits.sum()) < request.node_count:
        fits = np.zeros_like(fits)
    gpus = int(whole[~fits].sum())
    if request.gpus_per_node == 0:
        return gpus, int(np.where(state.free_milli > 0, state.free_milli, 0).sum())
    # F_n(request): nodes the request cannot use contribute all their free share, the others their small pieces
    frag = task_fragment(state.free_milli, state.cpu_free, eligible_mask(state, request), task_shape(request))
    milli = int(frag.sum())
    return gpus, milli


def frag_report(state: ClusterState, request: Request | None = None, mix: WorkloadMix | None = None) -> FragReport:
    request = request or Request(gpus_per_node=max(state.max_gpus, 1))
    mix = mix or default_mix(state)
    free = state.free_milli
    whole = whole_free_counts(state)
    sched = state.schedulable_mask
    fits = fits_mask(state, request)
    s_gpus, s_milli = stranded(state, request, fits)
    placeable = np.where(sched, whole, 0)
    best = int(np.argmax(placeable)) if len(placeable) else -1
    by_model: dict[str, int] = {}
    for i, n in enumerate(state.nodes):
        key = n.gpu_model or "unknown"
        by_model[key] = max(by_model.get(key, 0), int(placeable[i]))
    hist_vals, hist_counts = np.unique(whole[state.gpu_counts > 0], return_counts=True)
    fgd = float(node_fragmentation(free, state.cpu_free, state.nodes, mix).sum())
    free_total = int(np.where(free > 0, free, 0).sum())
    return FragReport(
        nodes=len(state.nodes),
        gpus=int(state.gpu_counts.sum()),
        free_gpus=int(whole.sum()),
        free_milli=free_total,
        whole_free_nodes=int(whole_free_node_mask(state).sum()),
        request=request,
        nodes_fitting=int(fits.sum()),
        stranded_gpus=s_gpus,
        stranded_milli=s_milli,
        largest_placeable=int(placeable[best]) if best >= 0 else 0,
        largest_node=state.nodes[best].name if best >= 0 and placeable[best] > 0 else None,
        largest_by_model=by_model,
        histogram={int(k): int(v) for k, v in zip(hist_vals, hist_counts, strict=True)},
        fgd_milli=fgd,
        fgd_ratio=fgd / free_total if free_total else 0.0,
        mix_size=len(mix.shapes),
    )
