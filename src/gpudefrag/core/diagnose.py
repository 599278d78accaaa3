"""Why is a GPU request pending? Ordinary causes first, fragmentation last, each with its evidence.

Fragmentation is only the answer when nothing ordinary explains the wait: the device plugin registered its GPUs,
no quota or autoscaler limit holds the request back, some node is big enough and of an allowed model, taints and
selectors leave nodes to it, and enough GPUs are free in total — they are just scattered. Every cause has a stable
code (for alerts and dashboards), one human sentence and the numbers behind it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from .fragmentation import (
    capacity_fits,
    eligible_mask,
    selector_matches,
    state_model_mask,
    tolerated,
    whole_free_counts,
)
from .model import MILLI, ClusterState, Request, Workload


class CauseCode(StrEnum):
    """Stable identifiers, in the order the report lists them (ordinary causes before fragmentation)."""

    DEVICE_PLUGIN_MISSING = "device-plugin-missing"
    QUOTA_EXCEEDED = "quota-exceeded"
    AUTOSCALER_AT_MAX = "autoscaler-at-max"
    NO_SUCH_GPU_MODEL = "no-such-gpu-model"
    REQUEST_TOO_LARGE = "request-too-large"
    TAINTS_OR_SELECTORS = "taints-or-selectors"
    NODES_UNSCHEDULABLE = "nodes-unschedulable"
    MIG_MIXED = "mig-mixed"
    CPU_OR_MEMORY = "cpu-or-memory"
    INSUFFICIENT_GPUS = "insufficient-gpus"
    FRAGMENTATION = "fragmentation"
    FITS_NOW = "fits-now"


_ORDER = {c: i for i, c in enumerate(CauseCode)}


@dataclass(frozen=True)
class Cause:
    code: CauseCode
    summary: str
    evidence: dict[str, object] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {"code": self.code.value, "summary": self.summary, "evidence": self.evidence}


@dataclass(frozen=True)
class Diagnosis:
    workload_id: str | None
    request: Request
    causes: tuple[Cause, ...]
    scheduler_reason: str = ""

    @property
    def primary(self) -> Cause:
        return self.causes[0]

    @property
    def codes(self) -> tuple[CauseCode, ...]:
        return tuple(c.code for c in self.causes)

    @property
    def is_fragmentation(self) -> bool:
        """Fragmentation is the cause and nothing ordinary stands in the way."""
        return self.codes == (CauseCode.FRAGMENTATION,)

    def as_dict(self) -> dict[str, object]:
        return {
            "workload": self.workload_id,
            "request": self.request.label(),
            "scheduler_reason": self.scheduler_reason,
            "causes": [c.as_dict() for c in self.causes],
        }


def _names(state: ClusterState, mask: np.ndarray, limit: int = 5) -> list[str]:
    idx = np.flatnonzero(mask)
    return [state.nodes[i].name for i in idx[:limit]]


def _gpus(milli: int | float) -> str:
    v = milli / MILLI
    return f"{v:g}" if float(v).is_integer() else f"{v:.2f}"


class _Context:
    """Per-state values shared by many diagnoses (request masks are memoised on the state itself)."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.whole = whole_free_counts(state)
        self._used_by_ns: dict[str, int] | None = None

    def used_by_namespace(self) -> dict[str, int]:
        if self._used_by_ns is None:
            used: dict[str, int] = {}
            for w in self.state.running:
                used[w.namespace] = used.get(w.namespace, 0) + w.request.gpu_milli_total
            self._used_by_ns = used
        return self._used_by_ns


def diagnose(state: ClusterState, workload: Workload, *, _ctx: _Context | None = None) -> Diagnosis:
    """Diagnose one pending workload."""
    return diagnose_request(
        state,
        workload.request,
        namespace=workload.namespace,
        workload_id=workload.id,
        scheduler_reason=workload.scheduler_reason,
        _ctx=_ctx,
    )


def diagnose_all(state: ClusterState, ids: Iterable[str] | None = None) -> list[Diagnosis]:
    """Diagnose every pending workload with a GPU request (or those named), oldest first."""
    ctx = _Context(state)
    wanted = set(ids) if ids is not None else None
    out = []
    for w in state.pending:
        if wanted is not None and w.id not in wanted:
            continue
        if w.request.gpus_per_node == 0 and w.request.mig_profile is None:
            continue
        out.append(diagnose(state, w, _ctx=ctx))
    return out


def diagnose_request(
    state: ClusterState,
    r: Request,
    *,
    namespace: str | None = None,
    workload_id: str | None = None,
    scheduler_reason: str = "",
    _ctx: _Context | None = None,
) -> Diagnosis:
    ctx = _ctx or _Context(state)
    nodes = state.nodes
    causes: list[Cause] = []
    counts = state.gpu_counts
    usable = state.usable_counts
    models_ok = state_model_mask(state, r.gpu_models)
    gpu_nodes = counts > 0

    has_mig = state.mig_mask

    # 1. device plugin never registered: the node has GPUs but advertises none (or fewer)
    missing = gpu_nodes & (usable < counts) & ~has_mig & models_ok & (counts >= r.gpus_per_node)
    if missing.any():
        lost = int((counts - usable)[missing].sum())
        causes.append(
            Cause(
                CauseCode.DEVICE_PLUGIN_MISSING,
                f"{int(missing.sum())} node(s) have GPUs the scheduler cannot see (allocatable < capacity): "
                f"{lost} GPU(s) missing, e.g. {', '.join(_names(state, missing, 3))}; "
                "check the GPU device plugin / gres.conf on them",
                {"nodes": _names(state, missing, 20), "gpus_missing": lost},
            )
        )

    # 2. quota
    if namespace is not None:
        for q in state.quotas:
            if q.namespace != namespace:
                continue
            used = q.gpu_used * MILLI if q.gpu_used is not None else ctx.used_by_namespace().get(namespace, 0)
            if used + r.gpu_milli_total > q.gpu_limit * MILLI:
                causes.append(
                    Cause(
                        CauseCode.QUOTA_EXCEEDED,
                        f"quota of {namespace!r} allows {q.gpu_limit} GPU(s); {_gpus(used)} in use, "
                        f"the request needs {_gpus(r.gpu_milli_total)} more",
                        {"namespace": namespace, "limit": q.gpu_limit, "used": used / MILLI,
                         "requested": r.gpu_milli_total / MILLI},
                    )
                )

    # 3. request larger than any node (of an allowed model), or no node of that model at all
    model_nodes = gpu_nodes & models_ok
    largest_any = int(counts.max()) if len(counts) else 0
    largest_model = int(counts[model_nodes].max()) if model_nodes.any() else 0
    groups_fit = [
        g for g in state.node_groups
        if g.gpus_per_node >= r.gpus_per_node and (not r.gpu_models or g.gpu_model in r.gpu_models)
    ]
    if r.gpu_models and not model_nodes.any():
        causes.append(
            Cause(
                CauseCode.NO_SUCH_GPU_MODEL,
                f"no node has a GPU of model {' or '.join(r.gpu_models)}; models present: "
                f"{', '.join(sorted({n.gpu_model or '?' for n in nodes if n.gpu_count})) or 'none'}",
                {"wanted": list(r.gpu_models),
                 "present": sorted({n.gpu_model or "?" for n in nodes if n.gpu_count})},
            )
        )
    elif r.gpus_per_node > largest_model:
        where = f" of model {'/'.join(r.gpu_models)}" if r.gpu_models else ""
        causes.append(
            Cause(
                CauseCode.REQUEST_TOO_LARGE,
                f"the request needs {r.gpus_per_node} GPUs on one node, but the largest node{where} has "
                f"{largest_model}",
                {"gpus_per_node": r.gpus_per_node, "largest_node_gpus": largest_model,
                 "largest_node_any_model": largest_any},
            )
        )
    elif r.node_count > int((model_nodes & (counts >= r.gpus_per_node)).sum()):
        causes.append(
            Cause(
                CauseCode.REQUEST_TOO_LARGE,
                f"the request needs {r.node_count} nodes with {r.gpus_per_node} GPUs each; the cluster has "
                f"{int((model_nodes & (counts >= r.gpus_per_node)).sum())}",
                {"node_count": r.node_count,
                 "nodes_big_enough": int((model_nodes & (counts >= r.gpus_per_node)).sum())},
            )
        )

    # 4. autoscaler at its limit: the groups that could bring a fitting node cannot grow
    if groups_fit and all(g.current >= g.maximum for g in groups_fit):
        causes.append(
            Cause(
                CauseCode.AUTOSCALER_AT_MAX,
                "every node group that could add a fitting node is at its maximum size: "
                + ", ".join(f"{g.name} {g.current}/{g.maximum}" for g in groups_fit),
                {"groups": [{"name": g.name, "current": g.current, "maximum": g.maximum} for g in groups_fit]},
            )
        )

    eligible = eligible_mask(state, r)  # memoised on the state
    gpu_fit = capacity_fits(state.free_milli, state.cpu_free, state.mem_free, r)
    big_enough = model_nodes & (usable >= r.gpus_per_node)

    # 5. taints / selectors / partitions exclude the nodes that have room
    excluded_room = gpu_fit & big_enough & state.schedulable_mask & ~eligible
    if excluded_room.any() and not (gpu_fit & eligible).any():
        detail = []
        for i in np.flatnonzero(excluded_room)[:5]:
            n = nodes[i]
            if not tolerated(n, r.tolerations):
                detail.append(f"{n.name}: untolerated taint "
                              + ",".join(f"{t.key}={t.value}:{t.effect}" for t in n.taints))
            elif not selector_matches(n, r.node_selector):
                detail.append(f"{n.name}: node selector does not match")
            elif r.partition and n.partitions and r.partition not in n.partitions:
                detail.append(f"{n.name}: not in partition {r.partition}")
        causes.append(
            Cause(
                CauseCode.TAINTS_OR_SELECTORS,
                f"{int(excluded_room.sum())} node(s) have room but the request may not use them "
                f"({'; '.join(detail)})",
                {"nodes": _names(state, excluded_room, 20), "detail": detail},
            )
        )

    # 6. nodes with room are cordoned / drained
    unsched_room = gpu_fit & big_enough & ~state.schedulable_mask
    if unsched_room.any() and not (gpu_fit & eligible).any():
        causes.append(
            Cause(
                CauseCode.NODES_UNSCHEDULABLE,
                f"{int(unsched_room.sum())} node(s) with room are cordoned or drained: "
                f"{', '.join(_names(state, unsched_room, 5))}",
                {"nodes": _names(state, unsched_room, 20)},
            )
        )

    # 7. MIG: nodes that mix MIG slices and full GPUs advertise only their full GPUs to a whole-GPU request
    if r.mig_profile is None and r.gpus_per_node > 0:
        mig = has_mig & models_ok & (counts >= r.gpus_per_node) & (usable < r.gpus_per_node)
        if mig.any() and not (gpu_fit & eligible).any():
            mixed = [n for i, n in enumerate(nodes) if mig[i] and n.usable_gpus > 0]
            causes.append(
                Cause(
                    CauseCode.MIG_MIXED,
                    f"{int(mig.sum())} node(s) big enough for the request have GPUs split into MIG slices "
                    f"({len(mixed)} mix MIG slices and full GPUs); a whole-GPU request cannot use the slices: "
                    f"{', '.join(_names(state, mig, 5))}",
                    {"nodes": _names(state, mig, 20), "mixed": [n.name for n in mixed[:20]],
                     "profiles": sorted({p for n in nodes for p in n.mig_devices})},
                )
            )

    # 8. the GPUs fit somewhere but CPU or memory do not
    gpu_ok = eligible & (((state.free_milli >= r.gpu_milli).sum(axis=1)) >= r.gpus_per_node)
    gpu_only = r.gpus_per_node > 0 and int(gpu_ok.sum()) >= r.node_count
    fits = eligible & gpu_fit  # what fits_mask computes, from the masks already at hand
    n_fit = int(fits.sum())
    if gpu_only and n_fit < r.node_count:
        causes.append(
            Cause(
                CauseCode.CPU_OR_MEMORY,
                "nodes with enough free GPUs lack the CPU or memory the request asks for "
                f"({r.cpu_milli / 1000:g} cores, {r.memory_mib} MiB per node)",
                {"cpu_milli": r.cpu_milli, "memory_mib": r.memory_mib},
            )
        )

    # 9/10. enough free GPU in total? then it is fragmentation; else the cluster is simply full
    usable_here = eligible & big_enough
    free = state.free_milli
    if r.gpu_milli >= MILLI:
        per_node_free = np.where(usable_here, ctx.whole, 0)
        free_total = int(per_node_free.sum()) * MILLI
    else:
        per_node_free = np.where(usable_here[:, None] & (free > 0), free, 0).sum(axis=1)
        free_total = int(per_node_free.sum())
    ordinary = bool(causes)
    impossible = any(c.code in (CauseCode.REQUEST_TOO_LARGE, CauseCode.NO_SUCH_GPU_MODEL) for c in causes)
    impossible |= gpu_only and n_fit < r.node_count  # the GPUs are there; CPU or memory is what is missing
    if impossible:
        pass  # no node could ever hold it: free capacity is beside the point
    elif n_fit >= r.node_count:
        causes.append(
            Cause(
                CauseCode.FITS_NOW,
                f"the request fits now on {n_fit} node(s) (e.g. {', '.join(_names(state, fits, 3))}); "
                "the scheduler has not placed it yet (priority, backfill or a scheduling cycle)",
                {"nodes": _names(state, fits, 20)},
            )
        )
    elif r.gpus_per_node > 0 and free_total < r.gpu_milli_total:
        causes.append(
            Cause(
                CauseCode.INSUFFICIENT_GPUS,
                f"only {_gpus(free_total)} GPU(s) free where the request may run; it needs "
                f"{_gpus(r.gpu_milli_total)}: the cluster is full, not fragmented",
                {"free_gpus": free_total / MILLI, "requested": r.gpu_milli_total / MILLI},
            )
        )
    elif r.gpus_per_node > 0 and usable_here.any():
        causes.append(_fragmentation_cause(state, r, usable_here, fits, ctx, free_total, ordinary))

    if not causes:
        causes.append(
            Cause(CauseCode.INSUFFICIENT_GPUS, "no node may run this request", {"free_gpus": 0})
        )
    causes.sort(key=lambda c: _ORDER[c.code])
    return Diagnosis(workload_id, r, tuple(causes), scheduler_reason)


def _fragmentation_cause(
    state: ClusterState,
    r: Request,
    usable_here: np.ndarray,
    fits: np.ndarray,
    ctx: _Context,
    free_total: int,
    other_causes: bool,
) -> Cause:
    whole = ctx.whole
    blocks = np.where(usable_here, whole, 0)
    best = int(np.argmax(blocks))
    best_name = state.nodes[best].name
    # How many single-node jobs would have to leave each candidate node for the request to fit there
    # (ignoring where they go: the planner checks that). Multi-node jobs never move.
    moves_needed: list[tuple[int, str]] = []
    for i in np.flatnonzero(usable_here & ~fits):
        n = state.nodes[i]
        need = r.gpus_per_node - int(whole[i]) if r.gpu_milli >= MILLI else 1
        movable = sorted(
            (len(p.gpus) for w in state.workloads_on[n.name] if not w.is_multi_node for p in w.placements
             if p.node == n.name),
            reverse=True,
        )
        if r.gpu_milli < MILLI:
            moves_needed.append((1, n.name)) if movable else None
            continue
        got, k = 0, 0
        for g in movable:
            if got >= need:
                break
            got += g
            k += 1
        if got >= need:
            moves_needed.append((k, n.name))
    moves_needed.sort()
    evidence: dict[str, object] = {
        "free_gpus": free_total / MILLI,
        "largest_block": int(blocks[best]),
        "largest_block_node": best_name,
        "nodes_fitting": int(fits.sum()),
    }
    if moves_needed:
        k_min = moves_needed[0][0]
        at_min = [name for k, name in moves_needed if k == k_min]
        evidence.update({"min_moves_to_clear": k_min, "nodes_clearable_with_min_moves": len(at_min),
                         "clearable_nodes": [name for _, name in moves_needed[:10]]})
        tail = (f"; {len(at_min)} node(s) would each fit it by moving {k_min} job(s) "
                f"(e.g. {', '.join(at_min[:3])})")
    else:
        tail = "; no node can be cleared by moving single-node jobs"
    return Cause(
        CauseCode.FRAGMENTATION,
        f"{_gpus(free_total)} GPUs free, largest block {int(blocks[best])} on {best_name}: the free GPUs are "
        f"scattered across nodes{tail}"
        + (" (other causes also hold)" if other_causes else ""),
        evidence,
    )
