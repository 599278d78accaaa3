"""Kubernetes API objects → `ClusterState`, plus what moves need and the model does not hold (owners, PDBs,
containers, the raw pod spec): a `KubeCluster`.

Mapping (documented in docs/kubernetes.md):
- Node: GPUs = max(capacity `nvidia.com/gpu`, GFD label `nvidia.com/gpu.count`, DRA GPU devices); allocatable
  `nvidia.com/gpu` is what the device plugin advertises (0 while it is missing, only the full GPUs on a MIG-mixed
  node); `nvidia.com/mig-<profile>` are MIG slices; GFD labels give product, driver and CUDA; `spec.unschedulable`
  or a NotReady condition makes the node unschedulable.
- Pod: bound to a node (and not finished) = running, unbound `Pending` = pending. GPUs = the largest of the sum
  over containers and any init container (requests, else limits), plus GPUs of its DRA claims.
- ResourceQuota `requests.nvidia.com/gpu` → Quota charged at creation (`status.used` counts every pod that
  exists, Pending ones too; a quota never holds back a pod that exists); the autoscaler status ConfigMap → NodeGroups.
- A Job/ReplicaSet whose pods the quota admission refused leaves no pod, only `FailedCreate ... exceeded quota`
  events: each becomes a pending workload `namespace/kind/name` with the GPUs the event says were requested —
  while that owner exists (same uid, created before the event) and still lacks pods, when the owners were
  listed; an event outlives its object by an hour, and a ghost must not stay pending.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from itertools import compress
from types import MappingProxyType
from typing import Any

from ...core.model import (
    MAX_AMOUNT,
    MILLI,
    ClusterState,
    ModelError,
    Node,
    NodeGroup,
    Placement,
    Quota,
    Request,
    Taint,
    TaintEffect,
    Toleration,
    Versions,
    Workload,
    WorkloadState,
    running_mask,
)
from ...errors import InputError
from .access import At
from .autoscaler import STATUS_NAME, STATUS_NAMESPACE, GroupStatus, parse_status
from .dra import DraInventory, read_dra
from .dump import KubeObjects
from .selectors import GPU_PRODUCT_LABEL, LabelSelector, node_selection

GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
QUOTA_KEYS = ("requests.nvidia.com/gpu", "nvidia.com/gpu")
ANN = "gpudefrag.io/"  # annotations a workload may carry: versions and checkpoint facts
NODE_GROUP_LABELS = (
    "gpudefrag.io/node-group",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "alpha.eksctl.io/nodegroup-name",
    "karpenter.sh/nodepool",
    "kubernetes.azure.com/agentpool",
    "agentpool",
)
_QUOTA_REQ = re.compile(r"requested: [^\n]*?requests\.nvidia\.com/gpu=(\d+)")
_DONE_PHASES = ("Succeeded", "Failed")
MAX_GPUS_PER_NODE = 1024


def _cpu_milli(q: Decimal | None) -> int:
    return int(q * 1000) if q is not None else 0


def _memory_mib(q: Decimal | None) -> int:
    return int(q / (1 << 20)) if q is not None else 0


def _implausible(key: str, q: Decimal | None) -> str | None:
    """Why a CPU or memory quantity is more than the model holds (core.model.MAX_AMOUNT millicores or MiB per node
    or request), or None. The converter refuses it at the dump's own field: the model's check would name only the
    model's path (`nodes[0].cpu_milli`), not the file's."""
    if key == "cpu" and _cpu_milli(q) > MAX_AMOUNT:
        return f"{q} CPUs is not plausible (at most {MAX_AMOUNT // 1000})"
    if key == "memory" and _memory_mib(q) > MAX_AMOUNT:
        return f"{q} bytes of memory is not plausible (at most {MAX_AMOUNT} MiB)"
    return None


@dataclass(frozen=True, slots=True)
class Owner:
    kind: str
    name: str
    uid: str = ""


@dataclass(frozen=True)
class PodInfo:
    """What a move needs to know about a pod beyond the model: identity, owner, containers and the raw object."""

    workload_id: str
    namespace: str
    name: str
    uid: str
    node: str | None
    phase: str
    ready: bool
    owner: Owner | None
    priority_class: str
    containers: tuple[str, ...]
    raw: Mapping[str, Any]
    scheduler_source: str = ""  # PodScheduled | FailedScheduling event | FailedCreate event
    autoscaler_message: str = ""  # the autoscaler's NotTriggerScaleUp event, if any
    synthetic: bool = False  # stands for pods the quota refused to create (no Pod object exists)

    @property
    def labels(self) -> Mapping[str, str]:
        return self.raw.get("metadata", {}).get("labels") or {}

    @property
    def annotations(self) -> Mapping[str, str]:
        return self.raw.get("metadata", {}).get("annotations") or {}


@dataclass(frozen=True)
class PdbInfo:
    namespace: str
    name: str
    selector: LabelSelector
    disruptions_allowed: int
    current_healthy: int
    desired_healthy: int
    expected_pods: int
    min_available: str | None
    max_unavailable: str | None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def covers(self, pod: PodInfo) -> bool:
        return pod.namespace == self.namespace and self.selector.matches(pod.labels)

    def as_dict(self) -> dict[str, object]:
        return {"name": self.key, "disruptions_allowed": self.disruptions_allowed,
                "current_healthy": self.current_healthy, "desired_healthy": self.desired_healthy,
                "min_available": self.min_available, "max_unavailable": self.max_unavailable}


@dataclass(frozen=True)
class EventInfo:
    namespace: str
    kind: str
    name: str
    reason: str
    message: str
    at: float | None
    component: str
    uid: str = ""  # the involved object's uid: an event of a deleted object that was recreated is not its own


@dataclass(frozen=True)
class KubeCluster:
    """A `ClusterState` together with the Kubernetes facts moves and diagnosis need."""

    state: ClusterState
    pods: Mapping[str, PodInfo]  # workload id -> info
    pdbs: tuple[PdbInfo, ...] = ()
    events: tuple[EventInfo, ...] = ()
    groups: tuple[GroupStatus, ...] = ()
    warnings: tuple[str, ...] = ()
    source: str = ""
    ignored_kinds: Mapping[str, int] = field(default_factory=dict)
    raw_nodes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    raw_pdbs: tuple[Mapping[str, Any], ...] = ()
    notes: tuple[str, ...] = ()  # absent by design (no autoscaler): said once, quietly

    def pdbs_for(self, workload_id: str) -> list[PdbInfo]:
        pod = self.pods.get(workload_id)
        return [p for p in self.pdbs if pod is not None and p.covers(pod)]


# ---------------------------------------------------------------------------------------------- nodes
def _gfd_version(labels: Mapping[str, str], full: str, parts: tuple[str, ...]) -> str | None:
    if labels.get(full):
        return labels[full]
    vals = [labels.get(p) for p in parts]
    if vals[0] is None:
        return None
    return ".".join(v for v in vals if v is not None)


def node_from(at: At, dra: DraInventory) -> Node:
    """One Kubernetes Node object as the model's node (also read by the move executor to check a target)."""
    meta = at.obj("metadata", required=True)
    name = meta.req_str("name")
    labels = meta.str_map("labels")
    spec, status = at.obj("spec"), at.obj("status")
    cap, alloc = status.obj("capacity"), status.obj("allocatable")
    gpu_cap = cap.count(GPU)
    gpu_alloc = alloc.count(GPU)
    label_count = 0
    if "nvidia.com/gpu.count" in labels:
        try:
            label_count = int(labels["nvidia.com/gpu.count"])
        except ValueError:
            raise meta.obj("labels").error("expected an integer", "nvidia.com/gpu.count") from None
    mig = {k[len(MIG_PREFIX):]: n for k in alloc.value if k.startswith(MIG_PREFIX) and (n := alloc.count(k))}
    mig.update(dra.mig_by_node.get(name, {}))
    dra_gpus = dra.gpus_by_node.get(name, 0)
    for where, v in ((cap, gpu_cap), (alloc, gpu_alloc), (meta.obj("labels"), label_count)):
        if v is not None and v > MAX_GPUS_PER_NODE:  # the model keeps a nodes × GPUs array: refuse nonsense
            key = "nvidia.com/gpu.count" if where.key == "labels" else GPU
            raise where.error(f"{v} GPUs on one node is not plausible (at most {MAX_GPUS_PER_NODE})", key)
    count = max(gpu_cap or 0, label_count, gpu_alloc or 0, dra_gpus)
    allocatable: int | None = (gpu_alloc or 0) + dra_gpus
    if allocatable == count:
        allocatable = None
    taints = []
    for t in spec.objects("taints"):
        eff = t.req_str("effect")
        try:
            effect = TaintEffect(eff)
        except ValueError:
            raise t.error(f"unknown taint effect {eff!r}", "effect") from None
        taints.append(Taint(t.req_str("key"), t.text("value", "") or "", effect))
    ready = True
    for c in status.objects("conditions"):
        if c.text("type") == "Ready":
            ready = c.text("status") == "True"
    cpu = alloc.quantity("cpu")
    mem = alloc.quantity("memory")
    for key, q in (("cpu", cpu), ("memory", mem)):
        if why := _implausible(key, q):
            raise alloc.error(why, key)
    group = next((labels[k] for k in NODE_GROUP_LABELS if labels.get(k)), None)
    model = labels.get(GPU_PRODUCT_LABEL) or dra.product_by_node.get(name)
    return Node(
        name=name,
        gpu_count=count,
        gpu_model=model,
        gpu_allocatable=allocatable,
        cpu_milli=_cpu_milli(cpu),
        memory_mib=_memory_mib(mem),
        driver_version=_gfd_version(labels, "nvidia.com/cuda.driver-version.full",
                                    ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor",
                                     "nvidia.com/cuda.driver.rev")),
        cuda_version=_gfd_version(labels, "nvidia.com/cuda.runtime-version.full",
                                  ("nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor")),
        cpu_arch=labels.get("kubernetes.io/arch") or status.obj("nodeInfo").text("architecture"),
        kernel=status.obj("nodeInfo").text("kernelVersion") or None,
        labels=labels,
        taints=tuple(taints),
        schedulable=not spec.flag("unschedulable") and ready,
        mig_devices=mig,
        node_group=group,
    )


# ---------------------------------------------------------------------------------------------- pods
def pod_resources(spec: At) -> dict[str, Decimal]:
    """Effective pod requests for the resources we model: max(sum over containers, each init container)."""

    def one(c: At) -> dict[str, Decimal]:
        res = c.obj("resources")
        req, lim = res.obj("requests"), res.obj("limits")
        out: dict[str, Decimal] = {}
        for k in set(req.value) | set(lim.value):
            if k in ("cpu", "memory", GPU) or k.startswith(MIG_PREFIX):
                where = req if k in req.value else lim
                q = where.quantity(k)
                if why := _implausible(k, q):
                    raise where.error(why, k)
                if q is not None:
                    out[k] = q
        return out

    total: dict[str, Decimal] = {}
    for c in spec.objects("containers", required=True):
        for k, v in one(c).items():
            total[k] = total.get(k, Decimal(0)) + v
    for c in spec.objects("initContainers"):
        for k, v in one(c).items():
            total[k] = max(total.get(k, Decimal(0)), v)
    for k in ("cpu", "memory"):
        if why := _implausible(k, total.get(k)):
            raise spec.error(f"the containers' {k} requests add up to {why}", "containers")
    return total


def _owner(meta: At) -> Owner | None:
    for ref in meta.objects("ownerReferences"):
        if ref.flag("controller"):
            return Owner(ref.req_str("kind"), ref.req_str("name"), ref.text("uid", "") or "")
    return None


def _tolerations(spec: At) -> tuple[Toleration, ...]:
    return tuple(
        Toleration(t.text("key", "") or "", t.text("operator", "Equal") or "Equal", t.text("value", "") or "",
                   t.text("effect", "") or "")
        for t in spec.objects("tolerations")
    )


def _ann_float(ann: Mapping[str, str], key: str, at: At) -> float | None:
    v = ann.get(ANN + key)
    if v is None:
        return None
    holder = At(ann, at.source, at.path)
    if key.endswith("-at"):
        return holder.time(ANN + key)
    try:
        return float(v)
    except ValueError:
        raise holder.error(f"expected a number, got {v!r}", ANN + key) from None


MOVABLE_LABEL = "gpudefrag.io/movable"
MOVABLE_OWNERS = (None, "ReplicaSet")  # what moves.py knows how to replace (bare pods, ReplicaSet pods)


def _workload_labels(meta: At) -> dict[str, str]:
    """The pod's labels, plus `gpudefrag.io/movable: "false"` when its owner is one moves.py refuses (Job,
    StatefulSet, DaemonSet, operators), so a policy's `exclude_labels` keeps the planner off it. A pod may set
    the label itself to opt out."""
    labels = meta.str_map("labels")
    owner = _owner(meta)
    if owner is not None and owner.kind not in MOVABLE_OWNERS:
        return {**labels, MOVABLE_LABEL: "false"}
    return labels


class _Builder:
    def __init__(self, objs: KubeObjects, strict: bool) -> None:
        self.objs = objs
        self.strict = strict
        self.warnings: list[str] = []
        self.used: dict[str, set[int]] = {}

    def warn_or_fail(self, at: At, key: str | None, message: str) -> None:
        if self.strict:
            raise at.error(message, key)
        self.warnings.append(f"{at.source}: {at.path}: {message}; skipped")

    def assign(self, node: Node, k: int) -> tuple[int, ...] | None:
        """GPU indices for a running pod: usable GPUs first (Kubernetes does not publish which it holds)."""
        taken = self.used.setdefault(node.name, set())
        free = [g for g in range(node.gpu_count) if g not in taken]
        usable = node.usable_gpus
        free.sort(key=lambda g: g >= usable)
        if len(free) < k:
            return None
        chosen = tuple(sorted(free[:k]))
        taken.update(chosen)
        return chosen


def to_cluster(objs: KubeObjects, *, now: float | None = None, strict: bool = True) -> KubeCluster:
    """Convert grouped API objects. `strict` (dumps): a pod on an unknown node or with more GPUs than its node
    holds is an InputError; otherwise (live reads race with the cluster) it is skipped with a warning.

    The live controller converts the same objects piece by piece as watches deliver them (incremental.py); both
    go through the functions below, so a cycle from the watches gives what a conversion from scratch gives."""
    b = _Builder(objs, strict)
    dra = read_dra(objs.resource_slices, objs.resource_claims)
    nodes: list[Node] = []
    seen: dict[str, At] = {}
    for at in objs.nodes:
        n = node_from(at, dra)
        if n.name in seen:
            raise at.error(f"duplicate Node {n.name!r} (also at {seen[n.name].source}: {seen[n.name].path})",
                           "metadata")
        seen[n.name] = at
        nodes.append(n)
    by_name = {n.name: n for n in nodes}
    times: list[float] = []

    # events first: pods read their scheduling messages from them
    events = [_event(e) for e in objs.events]
    times.extend(e.at for e in events if e.at is not None)
    latest = latest_events(events)

    # pods in creation order, so that GPU indices are assigned as the scheduler would have handed them out
    parsed = []
    for at in objs.pods:
        created, name, meta = pod_order(at)
        if created != float("inf"):
            times.append(created)
        parsed.append((created, name, at, meta))
    parsed.sort(key=lambda t: (t[0], t[1]))
    workloads: list[Workload] = []
    infos: dict[str, PodInfo] = {}
    for created, _, at, meta in parsed:
        w, info = _pod(b, at, meta, created, by_name, dra, latest)
        if w is None or info is None:
            continue
        if w.id in infos:
            raise at.error(f"duplicate Pod {w.id!r}", "metadata")
        workloads.append(w)
        infos[w.id] = info
    return finish(objs.source, nodes, workloads, infos, latest, objs.quotas, objs.pdbs, objs.configmaps, events,
                  b.warnings, now=now if now is not None else max(times, default=0.0), ignored=objs.ignored,
                  raw_nodes={n.name: at.value for n, at in zip(nodes, objs.nodes, strict=True)},
                  owners=_owners(objs))


def latest_events(events: list[EventInfo]) -> dict[tuple[str, str, str], EventInfo]:
    """The newest scheduling event of each (namespace/name, kind, reason): what pods read their messages from."""
    latest: dict[tuple[str, str, str], EventInfo] = {}
    for e in events:
        if e.reason in ("FailedScheduling", "NotTriggerScaleUp", "FailedCreate"):
            k = (f"{e.namespace}/{e.name}", e.kind, e.reason)
            old = latest.get(k)
            if old is None or (e.at or 0) >= (old.at or 0):
                latest[k] = e
    return latest


def pod_order(at: At) -> tuple[float, str, At]:
    """(creation time, name, metadata): pods are converted in this order (GPU indices are handed out in it)."""
    meta = at.obj("metadata", required=True)
    created = meta.time("creationTimestamp")
    return (created if created is not None else float("inf")), meta.req_str("name"), meta


def finish(source: str, nodes: list[Node], workloads: list[Workload], infos: dict[str, PodInfo],
           latest: Mapping[tuple[str, str, str], EventInfo], quotas: list[At], pdbs: list[At],
           configmaps: list[At], events: list[EventInfo], warnings: list[str], *, now: float,
           ignored: Mapping[str, int], raw_nodes: Mapping[str, Mapping[str, Any]],
           owners: Mapping[tuple[str, str, str], _OwnerState] | None,
           previous: ClusterState | None = None) -> KubeCluster:
    """The `KubeCluster` of converted nodes and pods (in conversion order) and the cluster-wide objects: pending
    workloads for controllers whose pods the quota refused (checked against `owners`, the ReplicaSets and Jobs,
    when they were listed: `_owners`), quotas, PDBs, node groups, the validated state (`previous`: the state
    before, whose unchanged workloads' columns and verdicts carry over: `ClusterState.build`)."""
    waiting = compress(workloads, (~running_mask(workloads)).tolist())
    owners_pending = {(i.namespace, i.owner.kind, i.owner.name) for w in waiting if (i := infos[w.id]).owner}
    workloads = list(workloads)
    infos = dict(infos)
    for (_key, kind, reason), e in sorted(latest.items()):
        if reason != "FailedCreate" or "exceeded quota" not in e.message:
            continue
        m = _QUOTA_REQ.search(e.message)
        if not m or (e.namespace, kind, e.name) in owners_pending:
            continue
        if owners is not None and not _refusal_current(e, owners.get((e.namespace, kind, e.name))):
            continue  # a ghost: its owner is gone, replaced, or has all its pods now
        wid = f"{e.namespace}/{kind.lower()}/{e.name}"
        if wid in infos:
            continue
        workloads.append(Workload(id=wid, request=Request(gpus_per_node=int(m.group(1))),
                                  state=WorkloadState.PENDING, name=e.name, namespace=e.namespace,
                                  submitted_at=e.at, scheduler_reason=e.message))
        infos[wid] = PodInfo(wid, e.namespace, e.name, "", None, "NotCreated", False, Owner(kind, e.name), "",
                             (), MappingProxyType({}), "FailedCreate event", synthetic=True)
    warnings = list(warnings)
    if owners is None and any(r == "FailedCreate" for (_k, _kind, r) in latest):
        warnings.append(f"{source}: holds no ReplicaSets or Jobs: FailedCreate events are counted without "
                        "checking that their owner still exists (dump with `kubectl get nodes,pods,"
                        "resourcequotas,poddisruptionbudgets,events,replicasets,jobs -A -o json`)")
    qs = [q for at in quotas if (q := _quota(at)) is not None]
    pdb_infos = tuple(pdb_info(at) for at in pdbs)
    groups, group_warn = _groups(configmaps)
    warnings.extend(group_warn)
    node_groups = _node_groups(groups, nodes)
    try:
        state = ClusterState.build(nodes, workloads, quotas=qs, node_groups=node_groups, now=now, name=source,
                                   previous=previous)
    except ModelError as e:
        raise InputError(source, e.path, e.message) from None
    return KubeCluster(state, MappingProxyType(infos), pdb_infos, tuple(events), tuple(groups), tuple(warnings),
                       source, MappingProxyType(dict(ignored)), MappingProxyType(dict(raw_nodes)),
                       tuple(at.value for at in pdbs))


def pods_read(node: Node) -> tuple[Any, ...]:
    """What of its node a pod's conversion (`_pod`, `_cpu_pod`: beside their existence) reads: the GPUs `assign`
    hands out and the versions a running pod takes. A node change that leaves this the same (readiness, taints,
    labels, a heartbeat) leaves its pods' conversions the same, so the live model converts only the node again."""
    return (node.gpu_count, node.usable_gpus, node.gpu_model, node.driver_version, node.cuda_version, node.cpu_arch)


def holding(pod: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a Pod object decides the GPUs it is handed among its node's pods (`_Builder.assign` in creation
    order): its spec (node, requests, claims), creation time, whether it finished, its claims' names. A change that
    leaves this the same (readiness, container statuses, conditions, annotations) leaves every other pod's GPUs
    the same: the live model converts that pod alone again, keeping the GPUs it held."""
    status = pod.get("status") or {}
    return (pod.get("spec"), (pod.get("metadata") or {}).get("creationTimestamp"),
            status.get("phase") in _DONE_PHASES, status.get("resourceClaimStatuses"))


def _pod(
    b: _Builder, at: At, meta: At, created: float, nodes: Mapping[str, Node], dra: DraInventory,
    latest: Mapping[tuple[str, str, str], EventInfo],
) -> tuple[Workload | None, PodInfo | None]:
    """One Pod → (Workload, PodInfo); (None, None) for finished pods or ones skipped with a warning."""
    name = meta.req_str("name")
    ns = meta.text("namespace") or "default"
    spec, status = at.obj("spec", required=True), at.obj("status")
    phase = status.text("phase") or "Pending"
    if phase in _DONE_PHASES:
        return None, None
    res = pod_resources(spec)
    gpus_dec = res.get(GPU, Decimal(0))
    if gpus_dec != gpus_dec.to_integral_value():
        raise spec.error(f"a pod's {GPU} request must be a whole number, got {gpus_dec}", "containers")
    gpus = int(gpus_dec)
    for c in spec.objects("resourceClaims"):
        claim = c.text("resourceClaimName")
        if claim is None:
            for s in status.objects("resourceClaimStatuses"):
                if s.text("name") == c.text("name"):
                    claim = s.text("resourceClaimName")
        if claim:
            gpus += dra.claim_gpus.get((ns, claim), 0)
    mig = sorted(k[len(MIG_PREFIX):] for k, v in res.items() if k.startswith(MIG_PREFIX) and v > 0)
    cpu, mem = res.get("cpu"), res.get("memory")
    node_name = spec.text("nodeName")
    if node_name and not gpus and not mig:
        return _cpu_pod(b, at, meta, spec, name, ns, phase, node_name, nodes, cpu, mem, created)
    sel = node_selection(spec)
    if sel.other_terms and not node_name:
        b.warnings.append(f"{at.source}: {spec.path}.affinity: pod {ns}/{name} has {sel.other_terms} required "
                          "node-affinity expression(s) the diagnosis does not model (only nodeSelector, In on "
                          "nvidia.com/gpu.product, single-value In); it ignores them")
    request = Request(
        gpus_per_node=gpus,
        gpu_milli=MILLI,
        cpu_milli=_cpu_milli(cpu),
        memory_mib=_memory_mib(mem),
        gpu_models=sel.gpu_models,
        node_selector=sel.selector,
        tolerations=_tolerations(spec),
        mig_profile=mig[0] if mig else None,
    )
    wid = f"{ns}/{name}"
    ann = meta.str_map("annotations")
    labels = _workload_labels(meta)
    placements: tuple[Placement, ...] = ()
    versions = Versions(engine=ann.get(ANN + "engine"), model=ann.get(ANN + "model"),
                        checkpointer=ann.get(ANN + "checkpointer"))
    if node_name:
        node = nodes.get(node_name)
        if node is None:
            b.warn_or_fail(spec, "nodeName", f"pod {wid} is bound to node {node_name!r}, which the dump does not hold")
            return None, None
        idx = b.assign(node, gpus)
        if idx is None:
            b.warn_or_fail(spec, "nodeName", f"pod {wid} holds {gpus} GPU(s) on {node_name!r}, which has no room "
                           f"left for them ({node.gpu_count} GPUs)")
            return None, None
        placements = (Placement(node_name, idx),)
        versions = Versions(gpu_model=node.gpu_model, gpu_count=gpus or None, driver=node.driver_version,
                            cuda=node.cuda_version, cpu_arch=node.cpu_arch, engine=versions.engine,
                            model=versions.model, checkpointer=versions.checkpointer)
    reason, source = "", ""
    conditions = status.objects("conditions")
    for c in conditions:
        if c.text("type") == "PodScheduled" and c.text("status") == "False":
            reason, source = c.text("message") or c.text("reason") or "", "PodScheduled"
    uid = meta.text("uid", "") or ""
    if not node_name and not reason:
        ev = latest.get((wid, "Pod", "FailedScheduling"))
        if ev and (not ev.uid or not uid or ev.uid == uid):  # not the events of a deleted pod of the same name
            reason, source = ev.message, "FailedScheduling event"
    auto = latest.get((wid, "Pod", "NotTriggerScaleUp"))
    if auto and auto.uid and uid and auto.uid != uid:
        auto = None
    ready = any(c.text("type") == "Ready" and c.text("status") == "True" for c in conditions)
    containers = tuple(c.req_str("name") for c in spec.objects("containers"))
    w = Workload(
        id=wid,
        request=request,
        state=WorkloadState.RUNNING if node_name else WorkloadState.PENDING,
        name=name,
        namespace=ns,
        user=ann.get(ANN + "user", ""),
        priority=spec.integer("priority", 0) or 0,
        labels=labels,
        placements=placements,
        checkpoint_bytes=int(_ann_float(ann, "checkpoint-bytes", meta.obj("annotations")) or 0),
        last_checkpoint_at=_ann_float(ann, "last-checkpoint-at", meta.obj("annotations")),
        submitted_at=None if created == float("inf") else created,
        started_at=status.time("startTime"),
        versions=versions,
        scheduler_reason=reason,
    )
    info = PodInfo(wid, ns, name, meta.text("uid", "") or "", node_name, phase, ready, _owner(meta),
                   spec.text("priorityClassName", "") or "", containers, MappingProxyType(at.value), source,
                   auto.message if auto and not node_name else "")
    return w, info


def _cpu_pod(
    b: _Builder, at: At, meta: At, spec: At, name: str, ns: str, phase: str, node_name: str,
    nodes: Mapping[str, Node], cpu: Decimal | None, mem: Decimal | None, created: float,
) -> tuple[Workload | None, PodInfo | None]:
    """A running pod without GPUs (DaemonSets, system pods): only the CPU and memory it holds matter to us,
    so only those are read — most pods of a GPU cluster are of this kind."""
    wid = f"{ns}/{name}"
    if node_name not in nodes:
        b.warn_or_fail(spec, "nodeName", f"pod {wid} is bound to node {node_name!r}, which the dump does not hold")
        return None, None
    w = Workload(
        id=wid,
        request=Request(gpus_per_node=0, cpu_milli=_cpu_milli(cpu), memory_mib=_memory_mib(mem)),
        name=name,
        namespace=ns,
        priority=spec.integer("priority", 0) or 0,
        labels=_workload_labels(meta),
        placements=(Placement(node_name, ()),),
        submitted_at=None if created == float("inf") else created,
    )
    containers = tuple(c.req_str("name") for c in spec.objects("containers"))
    info = PodInfo(wid, ns, name, meta.text("uid", "") or "", node_name, phase, phase == "Running", _owner(meta),
                   spec.text("priorityClassName", "") or "", containers, MappingProxyType(at.value))
    return w, info


# ---------------------------------------------------------------------------------------------- the rest
def _event(at: At) -> EventInfo:
    obj = at.obj("involvedObject") if "involvedObject" in at.value else at.obj("regarding")
    meta = at.obj("metadata")
    when = (at.time("lastTimestamp") or at.time("eventTime") or at.time("deprecatedLastTimestamp")
            or at.time("firstTimestamp") or meta.time("creationTimestamp"))
    comp = at.obj("source").text("component") or at.text("reportingComponent") or at.text("reportingController")
    return EventInfo(
        namespace=obj.text("namespace") or meta.text("namespace") or "default",
        kind=obj.text("kind") or "",
        name=obj.text("name") or "",
        reason=at.text("reason") or "",
        message=at.text("message") or at.text("note") or "",
        at=when,
        component=comp or "",
        uid=obj.text("uid") or "",
    )


@dataclass(frozen=True)
class _OwnerState:
    uid: str
    created: float | None
    lacks_pods: bool  # it wants more pods than it has: a quota refusal may still hold it back


def _owners(objs: KubeObjects) -> dict[tuple[str, str, str], _OwnerState] | None:
    """The ReplicaSets and Jobs by (namespace, kind, name), or None when the source did not list them."""
    if not objs.owners_known:
        return None
    out: dict[tuple[str, str, str], _OwnerState] = {}
    for kind, items in (("ReplicaSet", objs.replicasets), ("Job", objs.jobs)):
        for at in items:
            meta, spec, status = at.obj("metadata"), at.obj("spec"), at.obj("status")
            if kind == "ReplicaSet":
                lacks = (status.integer("replicas", 0) or 0) < (spec.integer("replicas", 1) or 0)
            else:
                done = any(c.text("type") in ("Complete", "Failed") and c.text("status") == "True"
                           for c in status.objects("conditions"))
                want = spec.integer("parallelism", 1) or 0
                left = (spec.integer("completions", want) or 0) - (status.integer("succeeded", 0) or 0)
                lacks = not done and (status.integer("active", 0) or 0) < min(want, left)
            out[(meta.text("namespace") or "default", kind, meta.text("name") or "")] = _OwnerState(
                meta.text("uid", "") or "", meta.time("creationTimestamp"), lacks)
    return out


def _refusal_current(e: EventInfo, owner: _OwnerState | None) -> bool:
    """A FailedCreate event counts only while its object exists (the same one: uid, and not older than it) and
    still lacks pods."""
    if owner is None or not owner.lacks_pods:
        return False
    if e.uid and owner.uid and e.uid != owner.uid:
        return False
    return not (e.at is not None and owner.created is not None and e.at < owner.created)


def _quota(at: At) -> Quota | None:
    meta = at.obj("metadata", required=True)
    hard, used = at.obj("spec").obj("hard"), at.obj("status").obj("used")
    for k in QUOTA_KEYS:
        limit = hard.count(k)
        if limit is not None:
            # a ResourceQuota charges pods when they are created: `used` includes the Pending ones
            return Quota(meta.text("namespace") or "default", limit, used.count(k), charged_at="create")
    return None


def pdb_info(at: At) -> PdbInfo:
    """One PodDisruptionBudget as the planner and the move executor read it."""
    meta = at.obj("metadata", required=True)
    spec, status = at.obj("spec"), at.obj("status")

    def intstr(key: str) -> str | None:
        v = spec.value.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | str):
            raise spec.error("expected an integer or a percentage", key)
        return str(v)

    return PdbInfo(
        namespace=meta.text("namespace") or "default",
        name=meta.req_str("name"),
        selector=LabelSelector.parse(spec.obj("selector")),
        disruptions_allowed=status.integer("disruptionsAllowed", 0) or 0,
        current_healthy=status.integer("currentHealthy", 0) or 0,
        desired_healthy=status.integer("desiredHealthy", 0) or 0,
        expected_pods=status.integer("expectedPods", 0) or 0,
        min_available=intstr("minAvailable"),
        max_unavailable=intstr("maxUnavailable"),
    )


def _groups(configmaps: list[At]) -> tuple[list[GroupStatus], list[str]]:
    for cm in configmaps:
        meta = cm.obj("metadata")
        if meta.text("name") != STATUS_NAME or (meta.text("namespace") or STATUS_NAMESPACE) != STATUS_NAMESPACE:
            continue
        text = cm.obj("data").text("status") or ""
        groups = parse_status(text)
        if groups is None:
            return [], [f"{cm.source}: {cm.path}.data.status: not a cluster-autoscaler status; node groups unknown"]
        return groups, []
    return [], []


def _node_groups(groups: list[GroupStatus], nodes: list[Node]) -> list[NodeGroup]:
    """Join autoscaler groups with the nodes that belong to them (by node-pool label: equal, or contained in the
    group's name, as cloud providers prefix it) to learn each group's GPU model and GPUs per node."""
    out = []
    for g in groups:
        members = [n for n in nodes if n.node_group and (n.node_group == g.name or n.node_group in g.name)]
        gpu_nodes = [n for n in members if n.gpu_count]
        models = sorted({n.gpu_model for n in gpu_nodes if n.gpu_model})
        out.append(NodeGroup(g.name, g.current, g.maximum, models[0] if len(models) == 1 else None,
                             max((n.gpu_count for n in gpu_nodes), default=0)))
    return out


def as_dict_info(info: PodInfo) -> dict[str, object]:
    return {"workload": info.workload_id, "node": info.node, "phase": info.phase, "ready": info.ready,
            "owner": f"{info.owner.kind}/{info.owner.name}" if info.owner else None,
            "priority_class": info.priority_class, "containers": list(info.containers)}
