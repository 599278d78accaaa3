"""Why is a GPU request pending? Ordinary causes first, fragmentation last, each with its evidence.

Fragmentation is only the answer when nothing ordinary explains the wait: the scheduler does not name an
ordinary reason (Slurm QOS/association limits, a hold), the device plugin registered its GPUs, no quota or
autoscaler limit holds the request back, some node is big enough and of an allowed model (or offers the MIG
profile asked for), taints and selectors leave nodes to it, and enough GPU share is free in total — it is just
scattered, over nodes or over partly used GPUs. Every cause has a stable code (for alerts and dashboards), one
human sentence and the numbers behind it.

Each cause is one check function, registered in order with `@cause_check` (the descheduler's plugin registry):
a check sees the request, the per-state facts and the causes found so far, and returns its causes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from ..registry import Registry
from .capacity import Shape, gpus_fit, room_fits, share_counts
from .fragmentation import (
    capacity_fits,
    eligible_mask,
    selector_matches,
    state_model_mask,
    tolerated,
    whole_free_counts,
)
from .model import MILLI, NOT_TRACKED, ClusterState, Request, Workload, same_mig_profile
from .scheduler_reasons import SLURM_LIMITS, ReasonClass, classify, guess_scheduler, refused_by_quota, slurm_limit


class CauseCode(StrEnum):
    """Stable identifiers, in the order the report lists them (ordinary causes before fragmentation)."""

    NOT_ELIGIBLE = "not-eligible"
    DEVICE_PLUGIN_MISSING = "device-plugin-missing"
    QUOTA_EXCEEDED = "quota-exceeded"
    AUTOSCALER_AT_MAX = "autoscaler-at-max"
    NO_SUCH_GPU_MODEL = "no-such-gpu-model"
    MIG_PROFILE_UNAVAILABLE = "mig-profile-unavailable"
    REQUEST_TOO_LARGE = "request-too-large"
    TAINTS_OR_SELECTORS = "taints-or-selectors"
    NODES_UNSCHEDULABLE = "nodes-unschedulable"
    MIG_MIXED = "mig-mixed"
    CPU_OR_MEMORY = "cpu-or-memory"
    INSUFFICIENT_GPUS = "insufficient-gpus"
    FRAGMENTATION = "fragmentation"
    FRAGMENTATION_CPU_MEMORY = "fragmentation-cpu-memory"
    FITS_NOW = "fits-now"


_ORDER = {c: i for i, c in enumerate(CauseCode)}

# Fragmentation: what is free would hold the request, but not where it is. Of GPUs (scattered over nodes or
# partly used GPUs), or of CPU and memory (the GPUs are free on a node whose CPU or memory jobs the planner may
# move hold).
FRAGMENTED = frozenset({CauseCode.FRAGMENTATION, CauseCode.FRAGMENTATION_CPU_MEMORY})
# Causes that are not ordinary: a plan can help (fragmentation) or nothing is needed (fits-now).
NOT_BLOCKING = FRAGMENTED | {CauseCode.FITS_NOW}
# Causes that mean no node could ever hold the request as the cluster is built.
IMPOSSIBLE = frozenset({CauseCode.REQUEST_TOO_LARGE, CauseCode.NO_SUCH_GPU_MODEL, CauseCode.MIG_PROFILE_UNAVAILABLE})


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
        """Fragmentation (of GPUs, or of CPU and memory) is the cause and nothing ordinary stands in the way."""
        return bool(self.causes) and all(c in FRAGMENTED for c in self.codes)

    @property
    def blocking(self) -> tuple[Cause, ...]:
        """The ordinary causes: each one alone keeps the job waiting whatever is moved."""
        return tuple(c for c in self.causes if c.code not in NOT_BLOCKING)

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
    """Per-state values shared by many diagnoses: per namespace, and per request the masks of `Facts`."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.whole = whole_free_counts(state)
        self._masks: dict[int, tuple[Request, dict[str, Any]]] = {}
        self._used_by_ns: dict[str, int] | None = None
        self._charged_at_create: dict[str, int] | None = None
        self._mig_used: dict[tuple[str, str], int] | None = None

    def masks(self, r: Request) -> dict[str, Any]:
        """The masks computed so far for request `r` (by identity: the Request is held with them, so its id is
        not reused while the context lives)."""
        got = self._masks.get(id(r))
        if got is None:
            got = self._masks[id(r)] = (r, {})
        return got[1]

    def used_by_namespace(self) -> dict[str, int]:
        if self._used_by_ns is None:
            used: dict[str, int] = {}
            for w in self.state.running:
                used[w.namespace] = used.get(w.namespace, 0) + w.request.gpu_milli_total
            self._used_by_ns = used
        return self._used_by_ns

    def charged_by_namespace(self, at_create: bool) -> dict[str, int]:
        """GPU share a quota charges per namespace when it gives no `used`: running workloads, and for a quota
        that charges at creation every pending one that exists too."""
        if not at_create:
            return self.used_by_namespace()
        if self._charged_at_create is None:
            used = dict(self.used_by_namespace())
            for w in self.state.pending:
                if not refused_by_quota(w.scheduler_reason):
                    used[w.namespace] = used.get(w.namespace, 0) + w.request.gpu_milli_total
            self._charged_at_create = used
        return self._charged_at_create

    def mig_used(self, node: str, profile: str) -> int:
        """MIG slices of a profile running workloads hold on a node (one per part)."""
        if self._mig_used is None:
            used: dict[tuple[str, str], int] = {}
            for w in self.state.running:
                if w.request.mig_profile is not None:
                    for n in w.nodes():
                        used[(n, w.request.mig_profile)] = used.get((n, w.request.mig_profile), 0) + 1
            self._mig_used = used
        return sum(v for (n, p), v in self._mig_used.items() if n == node and same_mig_profile(p, profile))


def _share_counts(state: ClusterState, gpu_milli: int) -> np.ndarray:
    """capacity.share_counts of the state's free GPUs, once per state and share: diagnosing 200 pending jobs
    asked it 400 times of a 10,000 × 8 array (half of the diagnosis)."""
    key = ("diagnose.share_counts", gpu_milli)
    got = state.memo.get(key)
    if got is None:
        got = state.memo[key] = share_counts(state.free_milli, gpu_milli)
    return got  # type: ignore[return-value]


_UNSET = object()


class _PerRequest:
    """A `Facts` mask that reads only the state and the request: computed on first use, once per request and
    context, and shared by the Facts of every pending job with that request (a large snapshot's 200 pending
    jobs share a few Requests but differ in namespace and scheduler reason, so a diagnosis each)."""

    def __init__(self, fn: Callable[[Facts], Any]) -> None:
        self.fn = fn
        self.name = fn.__name__

    def __get__(self, facts: Facts | None, owner: type | None = None) -> Any:
        if facts is None:
            return self
        shared = facts.masks
        got = shared.get(self.name, _UNSET)
        if got is _UNSET:
            got = shared[self.name] = self.fn(facts)
        return got


class Facts:
    """What the checks read about one request on one state: masks computed once, on first use."""

    def __init__(self, state: ClusterState, r: Request, ctx: _Context, namespace: str | None,
                 scheduler_reason: str, movable: Callable[[Workload], bool] | None = None,
                 workload_id: str | None = None) -> None:
        self.state = state
        self.movable = movable  # the planner's filter: evidence counts only the jobs it may move
        self.r = r
        self.ctx = ctx
        self.namespace = namespace
        self.scheduler_reason = scheduler_reason
        self.exists = workload_id is not None and workload_id in state.workload_index
        self.masks = ctx.masks(r)
        # a workload the quota admission refused to create (Kubernetes FailedCreate on its owner): no pod exists
        self.refused_by_quota = refused_by_quota(scheduler_reason)
        self.counts = state.gpu_counts
        self.usable = state.usable_counts
        self.gpu_nodes = self.counts > 0

    @property
    def is_mig(self) -> bool:
        return self.r.mig_profile is not None

    @_PerRequest
    def models_ok(self) -> np.ndarray:
        return state_model_mask(self.state, self.r.gpu_models)

    @_PerRequest
    def model_nodes(self) -> np.ndarray:
        return self.gpu_nodes & self.models_ok

    @_PerRequest
    def eligible(self) -> np.ndarray:
        return eligible_mask(self.state, self.r)  # memoised on the state

    @_PerRequest
    def gpu_fit(self) -> np.ndarray:
        s = self.state
        return capacity_fits(s.free_milli, s.cpu_free, s.mem_free, self.r, _share_counts(s, self.r.gpu_milli))

    @_PerRequest
    def gpus_free(self) -> np.ndarray:
        """Eligible nodes where the GPUs fit now (CPU and memory aside)."""
        s, r = self.state, self.r
        return self.eligible & gpus_fit(s.free_milli, Shape.of(r), _share_counts(s, r.gpu_milli))

    @_PerRequest
    def big_enough(self) -> np.ndarray:
        return self.model_nodes & (self.usable >= self.r.gpus_per_node)

    @_PerRequest
    def fits(self) -> np.ndarray:
        return self.eligible & self.gpu_fit  # what fits_mask computes, from the masks already at hand

    @_PerRequest
    def any_fit(self) -> bool:
        return bool(self.fits.any())

    @_PerRequest
    def usable_here(self) -> np.ndarray:
        return self.eligible & self.big_enough


Check = Callable[[Facts, list[Cause]], Iterable[Cause]]

# The checks in the order they run, each under its cause code (`gpudefrag.registry`: the one registry shape);
# the last one (the capacity verdict) reads what the others found.
CAUSE_CHECKS: Registry[Check] = Registry("cause check")


def cause_check(code: CauseCode) -> Callable[[Check], Check]:
    """Register a cause check under its code, after those already registered."""
    return CAUSE_CHECKS.register(code.value)


# ---------------------------------------------------------------------------------------------- the checks
@cause_check(CauseCode.NOT_ELIGIBLE)
def _scheduler_says(f: Facts, _found: list[Cause]) -> Iterable[Cause]:
    """The scheduler's own reason, when it names an ordinary cause (Slurm QOS*/Assoc*/*Limit are quotas; on
    Kubernetes, the quota admission's refusal to create the pods) or says
    the job is not eligible at all (held, dependency). Capacity reasons ("Resources") leave it to the checks."""
    if not f.scheduler_reason:
        return ()
    cls, code = classify(f.scheduler_reason, f.state.scheduler)
    if cls is ReasonClass.INELIGIBLE:
        return (Cause(CauseCode.NOT_ELIGIBLE,
                      f"the scheduler does not consider the job at all ({f.scheduler_reason}): held, a dependency "
                      "or a begin time; no move can start it",
                      {"scheduler_reason": f.scheduler_reason, "source": "scheduler"}),)
    if cls is ReasonClass.ORDINARY and code is not None and f.refused_by_quota:
        return (Cause(CauseCode(code), f"the ResourceQuota admission refused to create its pods "
                      f"({f.scheduler_reason}): no pod exists to schedule until the quota has room",
                      {"scheduler_reason": f.scheduler_reason, "source": "quota admission"}),)
    if cls is ReasonClass.ORDINARY and code is not None:
        slurm = (f.state.scheduler or guess_scheduler(f.scheduler_reason)) == "slurm"
        limit = slurm_limit(f.scheduler_reason) if slurm else None
        evidence: dict[str, object] = {"scheduler_reason": f.scheduler_reason, "source": "scheduler"}
        if limit is not None:  # name the limit: PartitionTimeLimit, QOSMaxGRESPerUser...
            evidence["limit"] = limit
            what = SLURM_LIMITS.get(limit, "a Slurm limit")
            return (Cause(CauseCode(code), f"the scheduler says {f.scheduler_reason}: the {limit} limit holds it "
                          f"back ({what}), not the free GPUs", evidence),)
        return (Cause(CauseCode(code), f"the scheduler says {f.scheduler_reason}: {_SCHED_TEXT.get(code, code)}",
                      evidence),)
    return ()


_SCHED_TEXT = {
    "quota-exceeded": "a QOS, association or account limit holds it back, not the free GPUs",
    "nodes-unschedulable": "the nodes it asks for are down, drained or reserved",
    "request-too-large": "the partition cannot hold a request of this size",
    "taints-or-selectors": "the job may not use the partition or nodes it names",
    "autoscaler-at-max": "it waits for nodes to power up",
}


@cause_check(CauseCode.DEVICE_PLUGIN_MISSING)
def _device_plugin(f: Facts, _found: list[Cause]) -> Iterable[Cause]:
    """The node has GPUs but advertises none (or fewer): the device plugin / gres.conf never registered them."""
    if f.is_mig:
        return ()
    missing = f.gpu_nodes & (f.usable < f.counts) & ~f.state.mig_mask & f.models_ok & (f.counts >= f.r.gpus_per_node)
    if not missing.any():
        return ()
    lost = int((f.counts - f.usable)[missing].sum())
    return (Cause(
        CauseCode.DEVICE_PLUGIN_MISSING,
        f"{int(missing.sum())} node(s) have GPUs the scheduler cannot see (allocatable < capacity): "
        f"{lost} GPU(s) missing, e.g. {', '.join(_names(f.state, missing, 3))}; "
        "check the GPU device plugin / gres.conf on them",
        {"nodes": _names(f.state, missing, 20), "gpus_missing": lost},
    ),)


@cause_check(CauseCode.QUOTA_EXCEEDED)
def _quota(f: Facts, found: list[Cause]) -> Iterable[Cause]:
    """A quota that charges at start (Slurm GrpTRES) holds a pending job back while used + request > limit. One
    that charges at creation (Kubernetes ResourceQuota) has already charged every pod that exists, the pending
    one included, and never stops it being scheduled: it blocks only a workload whose pods it refused to create
    (`FailedCreate ... exceeded quota` on the owner), or a hypothetical request (a pod not created yet)."""
    ns, r = f.namespace, f.r
    if ns is None:
        return ()
    out = []
    for q in f.state.quotas:
        if q.namespace != ns:
            continue
        at_create = q.charged_at == "create"
        if at_create and f.exists and not f.refused_by_quota:
            continue  # charged already: `used` counts it, and the quota admission never unschedules a pod
        derived = f.ctx.charged_by_namespace(at_create).get(ns, 0)
        used = q.gpu_used * MILLI if q.gpu_used is not None else derived
        if used + r.gpu_milli_total > q.gpu_limit * MILLI:
            if at_create:
                what = (f"quota of {ns!r} allows {q.gpu_limit} GPU(s) and charges {_gpus(used)} already (every pod "
                        f"that exists, pending ones too); creating this workload's pods needs "
                        f"{_gpus(r.gpu_milli_total)} more, so the quota admission refuses them")
            else:
                what = (f"quota of {ns!r} allows {q.gpu_limit} GPU(s); {_gpus(used)} in use, "
                        f"the request needs {_gpus(r.gpu_milli_total)} more")
            out.append(Cause(
                CauseCode.QUOTA_EXCEEDED, what,
                {"namespace": ns, "limit": q.gpu_limit, "used": used / MILLI, "requested": r.gpu_milli_total / MILLI,
                 "charged_at": q.charged_at},
            ))
    return out


@cause_check(CauseCode.NO_SUCH_GPU_MODEL)
def _model_or_size(f: Facts, _found: list[Cause]) -> Iterable[Cause]:
    """No node of an allowed model, or none big enough (one node, or enough nodes for a multi-node request)."""
    r, nodes, counts = f.r, f.state.nodes, f.counts
    if f.is_mig:
        return ()
    largest_any = int(counts.max()) if len(counts) else 0
    largest_model = int(counts[f.model_nodes].max()) if f.model_nodes.any() else 0
    if r.gpu_models and not f.model_nodes.any():
        present = sorted({n.gpu_model or "?" for n in nodes if n.gpu_count})
        return (Cause(
            CauseCode.NO_SUCH_GPU_MODEL,
            f"no node has a GPU of model {' or '.join(r.gpu_models)}; models present: {', '.join(present) or 'none'}",
            {"wanted": list(r.gpu_models), "present": present},
        ),)
    if r.gpus_per_node > largest_model:
        where = f" of model {'/'.join(r.gpu_models)}" if r.gpu_models else ""
        return (Cause(
            CauseCode.REQUEST_TOO_LARGE,
            f"the request needs {r.gpus_per_node} GPUs on one node, but the largest node{where} has {largest_model}",
            {"gpus_per_node": r.gpus_per_node, "largest_node_gpus": largest_model,
             "largest_node_any_model": largest_any},
        ),)
    big = f.model_nodes & (counts >= r.gpus_per_node)
    enough = int(big.sum())
    if r.node_count > enough:
        return (Cause(
            CauseCode.REQUEST_TOO_LARGE,
            f"the request needs {r.node_count} nodes with {r.gpus_per_node} GPUs each; the cluster has {enough}",
            {"node_count": r.node_count, "nodes_big_enough": enough},
        ),)
    if r.gpus_per_node == 0:
        return ()
    # the GPUs exist, but does any node with enough of them have the CPU and memory the request asks for, with
    # nothing running on it? If not, no move and no wait ever starts it: a request larger than any node.
    cap_cpu, cap_mem = f.state.cpu_capacity, f.state.mem_capacity
    roomy = big & room_fits(cap_cpu, cap_mem, Shape(0, cpu_milli=r.cpu_milli, memory_mib=r.memory_mib))
    if int(roomy.sum()) >= r.node_count:
        return ()
    lacking = [what for what, shape in _per_resource(r) if int((big & room_fits(cap_cpu, cap_mem, shape)).sum())
               < r.node_count] or ["CPU and memory together"]
    where = f" of model {'/'.join(r.gpu_models)}" if r.gpu_models else ""
    largest_cpu, largest_mem = int(cap_cpu[big].max()), int(cap_mem[big].max())
    return (Cause(
        CauseCode.REQUEST_TOO_LARGE,
        f"the request needs {r.cpu_milli / 1000:g} cores and {r.memory_mib} MiB on a node with {r.gpus_per_node} "
        f"GPU(s){where}{'' if r.node_count == 1 else f' on each of {r.node_count} nodes'}, but "
        f"{'no such node has' if not roomy.any() else f'only {int(roomy.sum())} such node(s) have'} that much "
        f"{' and '.join(lacking)} even with nothing running (the largest: "
        f"{_amount(largest_cpu, 1000, 'cores')}, {_amount(largest_mem, 1, 'MiB')})",
        {"cpu_milli": r.cpu_milli, "memory_mib": r.memory_mib, "lacking": lacking,
         "largest_node_cpu_milli": largest_cpu if largest_cpu < NOT_TRACKED else None,
         "largest_node_memory_mib": largest_mem if largest_mem < NOT_TRACKED else None},
    ),)


def _amount(x: int, unit: int, name: str) -> str:
    """A node's capacity in words: 'not tracked' for a node that does not track the resource."""
    return f"{name} not tracked" if x >= NOT_TRACKED else f"{x / unit:g} {name}"


@cause_check(CauseCode.MIG_PROFILE_UNAVAILABLE)
def _mig_profile(f: Facts, _found: list[Cause]) -> Iterable[Cause]:
    """A request for MIG slices of a profile no node offers can never start (and is never 'fits-now')."""
    if not f.is_mig:
        return ()
    profile = f.r.mig_profile or ""
    offered = [n for n in f.state.nodes if n.mig_offered(profile) > 0]
    if offered:
        return ()
    present = sorted({p for n in f.state.nodes for p, v in n.mig_devices.items() if v > 0})
    return (Cause(
        CauseCode.MIG_PROFILE_UNAVAILABLE,
        f"no node offers MIG profile {profile}; profiles offered: {', '.join(present) or 'none'}",
        {"profile": profile, "offered_profiles": present},
    ),)


@cause_check(CauseCode.AUTOSCALER_AT_MAX)
def _autoscaler(f: Facts, _found: list[Cause]) -> Iterable[Cause]:
    """Every node group that could bring a fitting node is at its maximum size."""
    r = f.r
    groups = [g for g in f.state.node_groups
              if g.gpus_per_node >= r.gpus_per_node and (not r.gpu_models or g.gpu_model in r.gpu_models)]
    if not groups or any(g.current < g.maximum for g in groups):
        return ()
    return (Cause(
        CauseCode.AUTOSCALER_AT_MAX,
        "every node group that could add a fitting node is at its maximum size: "
        + ", ".join(f"{g.name} {g.current}/{g.maximum}" for g in groups),
        {"groups": [{"name": g.name, "current": g.current, "maximum": g.maximum} for g in groups]},
    ),)


@cause_check(CauseCode.TAINTS_OR_SELECTORS)
def _taints(f: Facts, _found: list[Cause]) -> Iterable[Cause]:
    """Taints, selectors or partitions exclude the nodes that would hold the request: a node with room that the
    request may not use, or — when the nodes it may use cannot hold it even if their jobs moved (too few free
    GPUs there in total) — any excluded node big enough with free GPUs. Names the taint or selector, the nodes it
    excludes and the room left on the nodes the request may use."""
    if f.is_mig:
        return ()
    r, nodes, state = f.r, f.state.nodes, f.state
    if f.any_fit:
        return ()
    whole = f.ctx.whole if r.gpu_milli >= MILLI else (state.free_milli > 0).sum(axis=1)
    big = f.big_enough & state.schedulable_mask & ~f.eligible
    with_room = big & f.gpu_fit
    allowed_free = int(np.where(f.usable_here, whole, 0).sum())
    allowed_block = int(np.where(f.usable_here, whole, 0).max()) if f.usable_here.any() else 0
    too_little = allowed_free < r.gpus_per_node * r.node_count
    excluded = with_room if with_room.any() else (big & (whole > 0) if too_little else big & False)
    if not excluded.any():
        return ()
    detail, why = [], {}
    for i in np.flatnonzero(excluded)[:5]:
        n = nodes[i]
        if not tolerated(n, r.tolerations):
            taint = ",".join(f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"
                             for t in n.taints if t.effect != "PreferNoSchedule")
            detail.append(f"{n.name}: untolerated taint {taint}")
            why.setdefault(f"untolerated taint {taint}", []).append(n.name)
        elif not selector_matches(n, r.node_selector):
            detail.append(f"{n.name}: node selector does not match")
            why.setdefault("node selector", []).append(n.name)
        elif r.partition and n.partitions and r.partition not in n.partitions:
            detail.append(f"{n.name}: not in partition {r.partition}")
            why.setdefault(f"partition {r.partition}", []).append(n.name)
    excl_free = int(np.where(excluded, whole, 0).sum())
    allowed = int(f.usable_here.sum())
    room = (f"the {allowed} node(s) it may use have {allowed_free} GPU(s) free (largest block {allowed_block})"
            if allowed else "no node it may use is big enough")
    names = "; ".join(f"{k} excludes {', '.join(v)}" for k, v in why.items())
    return (Cause(
        CauseCode.TAINTS_OR_SELECTORS,
        f"{int(excluded.sum())} node(s) with {excl_free} GPU(s) free are closed to the request ({names}); {room}",
        {"nodes": _names(f.state, excluded, 20), "detail": detail, "excluded_free_gpus": excl_free,
         "allowed_nodes": allowed, "allowed_free_gpus": allowed_free, "allowed_largest_block": allowed_block},
    ),)


@cause_check(CauseCode.NODES_UNSCHEDULABLE)
def _cordoned(f: Facts, _found: list[Cause]) -> Iterable[Cause]:
    if f.is_mig:
        return ()
    room = f.gpu_fit & f.big_enough & ~f.state.schedulable_mask
    if not room.any() or f.any_fit:
        return ()
    return (Cause(
        CauseCode.NODES_UNSCHEDULABLE,
        f"{int(room.sum())} node(s) with room are cordoned or drained: {', '.join(_names(f.state, room, 5))}",
        {"nodes": _names(f.state, room, 20)},
    ),)


@cause_check(CauseCode.MIG_MIXED)
def _mig_mixed(f: Facts, _found: list[Cause]) -> Iterable[Cause]:
    """Nodes that split GPUs into MIG slices advertise only their full GPUs to a whole-GPU request."""
    r, nodes = f.r, f.state.nodes
    if f.is_mig or r.gpus_per_node == 0:
        return ()
    mig = f.state.mig_mask & f.models_ok & (f.counts >= r.gpus_per_node) & (f.usable < r.gpus_per_node)
    if not mig.any() or f.any_fit:
        return ()
    mixed = [n for i, n in enumerate(nodes) if mig[i] and n.usable_gpus > 0]
    return (Cause(
        CauseCode.MIG_MIXED,
        f"{int(mig.sum())} node(s) big enough for the request have GPUs split into MIG slices "
        f"({len(mixed)} mix MIG slices and full GPUs); a whole-GPU request cannot use the slices: "
        f"{', '.join(_names(f.state, mig, 5))}",
        {"nodes": _names(f.state, mig, 20), "mixed": [n.name for n in mixed[:20]],
         "profiles": sorted({p for n in nodes for p in n.mig_devices})},
    ),)


def _gpu_only(f: Facts) -> bool:
    """The GPUs fit on enough eligible nodes (CPU and memory aside)."""
    return f.r.gpus_per_node > 0 and int(f.gpus_free.sum()) >= f.r.node_count


def _per_resource(r: Request, times: int = 1) -> tuple[tuple[str, Shape], ...]:
    """The request's CPU and its memory as two shapes of one resource each (what `capacity.room_fits` tests),
    to say which of the two is lacking."""
    return (("CPU", Shape(0, cpu_milli=r.cpu_milli * times)), ("memory", Shape(0, memory_mib=r.memory_mib * times)))


def _short_in_total(state: ClusterState, r: Request) -> list[str]:
    """Which of CPU and memory the schedulable nodes lack in total for the request's nodes: moves only carry
    free room from node to node, so whatever moves, the request then takes its CPU and memory out of this
    total. A node that does not track one of them (`model.NOT_TRACKED`) never lacks it."""
    sched = state.schedulable_mask

    def total(free: np.ndarray) -> int:
        have = free[sched]
        return NOT_TRACKED if (have >= NOT_TRACKED // 2).any() else int(have.clip(min=0).sum())

    cpu, mem = total(state.cpu_free), total(state.mem_free)
    return [what for what, shape in _per_resource(r, r.node_count) if not room_fits(cpu, mem, shape)]


@cause_check(CauseCode.CPU_OR_MEMORY)
def _cpu_memory(f: Facts, found: list[Cause]) -> Iterable[Cause]:
    """The GPUs are free on enough nodes, but those nodes lack the CPU or memory the request also asks for.
    Moving running jobs is the answer (fragmentation of CPU and memory, not an ordinary cause) when the jobs
    the planner may move would, by leaving, make room on enough nodes — the clearing count the GPU
    fragmentation evidence gives (`_moves_to_clear`, over GPUs, CPU and memory alike) — and the schedulable
    nodes have the CPU and memory free in total. Otherwise it is ordinary: no node could hold the request even
    after every job it may move left it (CPU-only pods the policy keeps, DaemonSets), or the cluster is short
    of CPU or memory, however the jobs are spread."""
    r, state = f.r, f.state
    n_fit = int(f.fits.sum())
    if f.is_mig or not _gpu_only(f) or n_fit >= r.node_count or any(c.code in IMPOSSIBLE for c in found):
        return ()
    gpus_free = f.gpus_free
    lacking = [what for what, shape in _per_resource(r)
               if (gpus_free & ~room_fits(state.cpu_free, state.mem_free, shape)).any()]
    asks = f"({r.cpu_milli / 1000:g} cores, {r.memory_mib} MiB per node)"
    evidence: dict[str, object] = {"cpu_milli": r.cpu_milli, "memory_mib": r.memory_mib,
                                   "nodes_with_gpus_free": int(gpus_free.sum()), "lacking": lacking,
                                   "nodes_fitting": n_fit}
    short = _short_in_total(state, r)
    clear: list[tuple[int, str]] = []
    if not short:  # the nodes the request may use whose movable jobs, by leaving, make room (GPUs, CPU, memory)
        candidates = f.usable_here & ~f.fits
        if r.gpu_milli < MILLI:  # a share: the clearing count weighs whole GPUs only, so the share must fit now
            candidates &= gpus_free
        clear = _moves_to_clear(state, r, candidates, f.ctx.whole, f.movable)
    if clear and n_fit + len(clear) >= r.node_count:
        k_min = clear[0][0]
        at_min = [name for k, name in clear if k == k_min]
        evidence.update({"min_moves_to_clear": k_min, "nodes_clearable_with_min_moves": len(at_min),
                         "clearable_nodes": [name for _, name in clear[:10]]})
        held = " and ".join(lacking) or "CPU or memory"
        return (Cause(
            CauseCode.FRAGMENTATION_CPU_MEMORY,
            f"the GPUs are free on {int(gpus_free.sum())} node(s), but not the {held} the request also asks for "
            f"{asks}: running jobs hold it there, and the cluster has enough free in total; {len(at_min)} node(s) "
            f"would each fit it by moving {k_min} job(s) (e.g. {', '.join(at_min[:3])})",
            evidence,
        ),)
    if short:
        evidence["short_in_total"] = short
        why = (f"; the schedulable nodes have less {' and '.join(short)} free in total than the request asks "
               "for, so no move makes room")
    else:
        why = "; no node could hold it even if every job the planner may move left it"
    return (Cause(
        CauseCode.CPU_OR_MEMORY,
        f"nodes with enough free GPUs lack the CPU or memory the request asks for {asks}{why}",
        evidence,
    ),)


@cause_check(CauseCode.FITS_NOW)
def _capacity(f: Facts, found: list[Cause]) -> Iterable[Cause]:
    """The verdict on free capacity: fits now, the cluster is full, or the free share is there but scattered
    (over nodes, or over partly used GPUs) — fragmentation."""
    if f.is_mig:
        return _mig_capacity(f, found)
    r, state = f.r, f.state
    free = state.free_milli
    codes = {c.code for c in found}
    if codes & IMPOSSIBLE or codes & {CauseCode.CPU_OR_MEMORY, CauseCode.FRAGMENTATION_CPU_MEMORY}:
        return ()  # no node could ever hold it, or the GPUs are there and CPU/memory is missing where they are
    n_fit = int(f.fits.sum())
    if n_fit >= r.node_count:
        return (Cause(
            CauseCode.FITS_NOW,
            f"the request fits now on {n_fit} node(s) (e.g. {', '.join(_names(state, f.fits, 3))}); "
            "the scheduler has not placed it yet (priority, backfill or a scheduling cycle)",
            {"nodes": _names(state, f.fits, 20)},
        ),)
    if r.gpus_per_node == 0:
        return ()
    here = f.usable_here
    share = np.where(here[:, None] & (free > 0), free, 0)
    share_total = int(share.sum())  # every free share, whole GPUs and the free parts of shared ones
    # only whole GPUs serve a whole-GPU request
    whole_total = int(np.where(here, f.ctx.whole, 0).sum()) * MILLI
    free_total = whole_total if r.gpu_milli >= MILLI else share_total
    partial = r.gpu_milli >= MILLI and free_total < r.gpu_milli_total <= share_total
    if free_total < r.gpu_milli_total and not partial:
        return (Cause(
            CauseCode.INSUFFICIENT_GPUS,
            f"only {_gpus(free_total)} GPU(s) free where the request may run; it needs "
            f"{_gpus(r.gpu_milli_total)}: "
            + ("the nodes it may use are full (taints or selectors close the others)"
               if CauseCode.TAINTS_OR_SELECTORS in codes else "the cluster is full, not fragmented"),
            {"free_gpus": free_total / MILLI, "free_share": share_total / MILLI,
             "requested": r.gpu_milli_total / MILLI},
        ),)
    if not here.any():
        return ()
    return (_fragmentation_cause(f, free_total, share_total, bool(found)),)


def _mig_capacity(f: Facts, found: list[Cause]) -> Iterable[Cause]:
    if any(c.code in IMPOSSIBLE for c in found):
        return ()
    profile = f.r.mig_profile or ""
    free_on = []
    for i, n in enumerate(f.state.nodes):
        if not f.eligible[i]:
            continue
        left = n.mig_offered(profile) - f.ctx.mig_used(n.name, profile)
        if left > 0:
            free_on.append(n.name)
    if len(free_on) >= f.r.node_count:
        return (Cause(CauseCode.FITS_NOW,
                      f"a {profile} MIG slice is free on {len(free_on)} node(s) (e.g. {', '.join(free_on[:3])}); "
                      "the scheduler has not placed it yet",
                      {"nodes": free_on[:20], "profile": profile}),)
    return (Cause(CauseCode.INSUFFICIENT_GPUS,
                  f"every {profile} MIG slice the request may use is taken: the cluster is full for it "
                  "(moving whole-GPU jobs does not create MIG slices)",
                  {"profile": profile, "free_slices": 0}),)


def _as_large(job: Request, r: Request) -> bool:
    return bool(_as_large_as(job.gpus_per_node, job.cpu_milli, job.memory_mib, r))


def _as_large_as(gpus_per_node: Any, cpu_milli: Any, memory_mib: Any, r: Request) -> Any:
    """Whether a job of this size (scalars, or arrays of many jobs) is at least as large as the whole-GPU
    request `r` in GPUs, CPU and memory: such a job could only go where `r` could go itself. A comparison of two
    sizes, not a fit (core/capacity.py)."""
    return (r.gpu_milli >= MILLI) & (gpus_per_node >= r.gpus_per_node) & (cpu_milli >= r.cpu_milli) \
        & (memory_mib >= r.memory_mib)


def _movable_rows(state: ClusterState) -> tuple[np.ndarray, ...]:
    """The placements of the single-node workloads any plan may move, one row each, ordered by node and within a
    node largest first (GPUs, then CPU, then memory): (node index, GPUs, CPU, memory, the job's GPUs per node,
    the workload's index in `state.running`). Once per state (memo): every pending request's diagnosis reads
    them."""
    key = ("diagnose.movable_rows",)
    got = state.memo.get(key)
    if got is None:
        idx = state.node_index
        rr = state.running_rows  # one pass over the workloads per state (the planner shares it)
        can = state.may_move()  # immovable, labelled so, or multi-node: not counted
        one = np.flatnonzero(can & (rr[:, 7] == 1))
        rows: list[tuple[int, int, int, int, int, int]] = []
        for i in np.flatnonzero(can & (rr[:, 7] > 1)).tolist():  # several placements, all on one node: rare
            w = state.running[i]
            r = w.request
            for p in w.placements:
                rows.append((idx[p.node], len(p.gpus), r.cpu_milli, r.memory_mib, r.gpus_per_node, i))
        a = np.vstack((np.column_stack((rr[one, 0], rr[one, 6], rr[one, 4], rr[one, 5], rr[one, 1], one)),
                       np.asarray(rows, dtype=np.int64).reshape(-1, 6))).astype(np.int64)
        order = np.lexsort((-a[:, 3], -a[:, 2], -a[:, 1], a[:, 0]))  # by node, then largest first
        a = a[order]
        got = state.memo[key] = (a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4], a[:, 5])
    return got  # type: ignore[return-value]


def _moves_to_clear(state: ClusterState, r: Request, candidates: np.ndarray, whole: np.ndarray,
                    may_move: Callable[[Workload], bool] | None) -> list[tuple[int, str]]:
    """For each candidate node (usable, the request does not fit now): how many of its movable single-node jobs,
    largest first, would have to leave for the request to fit there (GPUs, and the CPU and memory it also needs,
    ignoring where they go: the planner checks that) — (count, node name), fewest first. Largest first makes the
    count a set that suffices, not always the fewest. Jobs the planner may not move (`may_move` says no), and
    jobs at least as large as the request (they could only go where the request could go itself: nowhere), do
    not count. Vectorised over all placements at once (per node in Python it was most of a controller cycle at
    5,000 nodes: 0.2 s per pending request)."""
    node, gpus, job_cpu, job_mem, job_gpus, owner = _movable_rows(state)
    keep = candidates[node] if len(node) else np.zeros(0, dtype=bool)
    keep &= ~_as_large_as(job_gpus, job_cpu, job_mem, r)
    if may_move is not None and keep.any():
        keep &= state.may_move(may_move)[owner]
    rows = np.flatnonzero(keep)
    if not len(rows):
        return []
    nd = node[rows]
    whole_req = r.gpu_milli >= MILLI
    need = (np.where(whole_req, r.gpus_per_node - whole.astype(np.int64), 0),
            r.cpu_milli - state.cpu_free.astype(np.int64), r.memory_mib - state.mem_free.astype(np.int64))
    start = np.flatnonzero(np.r_[True, nd[1:] != nd[:-1]])  # first row of each node's group
    group = np.cumsum(np.r_[True, nd[1:] != nd[:-1]]) - 1
    ok = np.ones(len(rows), dtype=bool)
    for col, nneed in zip((gpus, job_cpu, job_mem), need, strict=True):
        c = np.cumsum(col[rows])
        base = np.where(start > 0, c[start - 1], 0)  # the sum before each group
        ok &= (c - base[group]) >= nneed[nd]
    if whole_req:  # a node that needs nothing moved is not one the moves clear
        ok &= ~((need[0] <= 0) & (need[1] <= 0) & (need[2] <= 0))[nd]
    hit = np.flatnonzero(ok)
    if not len(hit):
        return []
    first = hit[np.r_[True, nd[hit][1:] != nd[hit][:-1]]]  # the first sufficient prefix in each node
    k = first - start[group[first]] + 1
    names = state.nodes
    return sorted((int(kk), names[int(i)].name) for kk, i in zip(k, nd[first], strict=True))


def _fragmentation_cause(f: Facts, free_total: int, share_total: int, other_causes: bool) -> Cause:
    state, r, whole, fits = f.state, f.r, f.ctx.whole, f.fits
    usable_here = f.usable_here
    blocks = np.where(usable_here, whole, 0)
    best = int(np.argmax(blocks))
    best_name = state.nodes[best].name
    # the evidence says only what the planner could do: nodes its movable jobs could clear
    moves_needed = _moves_to_clear(state, r, usable_here & ~fits, whole, f.movable)
    moves_needed.sort()
    free = state.free_milli
    frac = usable_here[:, None] & (free > 0) & (free < MILLI)
    largest_share = int(np.where(usable_here[:, None], free, 0).max()) if usable_here.any() else 0
    evidence: dict[str, object] = {
        "free_gpus": free_total / MILLI,
        "free_share": share_total / MILLI,
        "largest_block": int(blocks[best]),
        "largest_block_node": best_name,
        "nodes_fitting": int(fits.sum()),
        "gpus_with_fractions": int(frac.sum()),
        "largest_free_share": largest_share / MILLI,
    }
    partial = r.gpu_milli >= MILLI and free_total < r.gpu_milli_total
    if moves_needed:
        k_min = moves_needed[0][0]
        at_min = [name for k, name in moves_needed if k == k_min]
        evidence.update({"min_moves_to_clear": k_min, "nodes_clearable_with_min_moves": len(at_min),
                         "clearable_nodes": [name for _, name in moves_needed[:10]]})
        tail = (f"; {len(at_min)} node(s) would each fit it by moving {k_min} job(s) "
                f"(e.g. {', '.join(at_min[:3])})")
    else:
        tail = "; no node can be cleared by moving the jobs the planner may move"
    if partial:
        evidence["partial_gpus"] = True
        head = (f"{_gpus(share_total)} GPUs of share free, but spread as fractions over {int(frac.sum())} partly used "
                f"GPU(s) (largest free share {largest_share / MILLI:.2f} of a GPU; {_gpus(free_total)} whole GPU(s) "
                f"free): packing the shared GPUs frees whole ones")
        tail = ""
    else:
        head = (f"{_gpus(free_total)} GPUs free, largest block {int(blocks[best])} on {best_name}: the free GPUs are "
                "scattered across nodes")
    return Cause(CauseCode.FRAGMENTATION, head + tail + (" (other causes also hold)" if other_causes else ""), evidence)


# ---------------------------------------------------------------------------------------------- entry points
def diagnose(state: ClusterState, workload: Workload, *, _ctx: _Context | None = None,
             movable: Callable[[Workload], bool] | None = None) -> Diagnosis:
    """Diagnose one pending workload; `movable`: the planner's filter, so the evidence names only nodes the
    planner could clear."""
    return diagnose_request(
        state,
        workload.request,
        namespace=workload.namespace,
        workload_id=workload.id,
        scheduler_reason=workload.scheduler_reason,
        _ctx=_ctx,
        movable=movable,
    )


def diagnose_all(state: ClusterState, ids: Iterable[str] | None = None, *,
                 movable: Callable[[Workload], bool] | None = None) -> list[Diagnosis]:
    """Diagnose every pending workload with a GPU request (or those named), oldest first.

    A diagnosis reads only the request, the namespace, the scheduler's reason and the state (`Facts`), so the
    pending workloads that share all of them (200 pending jobs of a large snapshot share a handful of Request
    objects) share one diagnosis, under each one's own id: the checks run once per distinct case."""
    ctx = _Context(state)
    wanted = set(ids) if ids is not None else None
    out = []
    seen: dict[tuple[int, str, str], Diagnosis] = {}
    for w in state.pending_gpu:
        if wanted is not None and w.id not in wanted:
            continue
        key = (id(w.request), w.namespace, w.scheduler_reason)  # the requests live as long as the state
        d = seen.get(key)
        if d is None:
            d = seen[key] = diagnose(state, w, _ctx=ctx, movable=movable)
        else:
            d = dataclasses.replace(d, workload_id=w.id)
        out.append(d)
    return out


def diagnose_request(
    state: ClusterState,
    r: Request,
    *,
    namespace: str | None = None,
    workload_id: str | None = None,
    scheduler_reason: str = "",
    _ctx: _Context | None = None,
    movable: Callable[[Workload], bool] | None = None,
) -> Diagnosis:
    """Run every registered check in order; the causes come out sorted by code (ordinary first)."""
    facts = Facts(state, r, _ctx or _Context(state), namespace, scheduler_reason, movable, workload_id)
    causes: list[Cause] = []
    for entry in CAUSE_CHECKS:
        causes.extend(entry.fn(facts, causes))
    if not causes:
        causes.append(Cause(CauseCode.INSUFFICIENT_GPUS, "no node may run this request", {"free_gpus": 0}))
    causes = _dedupe(causes)
    causes.sort(key=lambda c: _ORDER[c.code])
    return Diagnosis(workload_id, r, tuple(causes), scheduler_reason)


def _dedupe(causes: list[Cause]) -> list[Cause]:
    """A cause the scheduler named and a computed one of the same code: keep the computed one (its numbers)."""
    said = ("scheduler", "quota admission")
    computed = {c.code for c in causes if c.evidence.get("source") not in said}
    return [c for c in causes if c.evidence.get("source") not in said or c.code not in computed]
