"""A move as a list of Kubernetes API operations, built before anything is touched.

For a pod on node A that should run on node B: check the target node's compatibility labels and the PDBs,
checkpoint (through the node agent on A — an annotation the agent answers with a signed, digest-pinned OCI
checkpoint image; the controller itself never reaches a kubelet — or through the application's own hook: an
annotation, and a signal the same node agent sends through its node's container runtime, so the controller
needs no `pods/exec`), check the image's signature and compatibility record against B, create a replacement
pinned to B by node affinity that restores from the checkpoint, wait until it is Ready, and only then remove
the original — through the Eviction API, so the API
server itself enforces the PodDisruptionBudgets. Until that point a failure deletes the replacement and leaves
the original running; nothing after the point of no return is ever rolled back.

Owners: a bare pod is replaced as above. A ReplicaSet (Deployment) pod's replacement starts outside the
ReplicaSet (without `pod-template-hash`), and once Ready the original gets the lowest
`controller.kubernetes.io/pod-deletion-cost` and the replacement is adopted, so the ReplicaSet keeps its count
and removes the original. Job and StatefulSet pods are refused: a Job controller counts an adopted duplicate as
surplus and may delete the replacement, and a StatefulSet pod's name cannot exist twice. DaemonSet pods belong to
their node.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from ...core.compat import CompatRule, checkpoint_record, describe
from ...core.model import Node
from ...policy.options import ExecutorConfig, PlanInputs
from .convert import KubeCluster, PdbInfo, PodInfo

ANN_MIGRATED_FROM = "gpudefrag.io/migrated-from"
ANN_MOVE_ID = "gpudefrag.io/move-id"
ANN_RESTORE_FROM = "gpudefrag.io/restore-from"
ANN_CKPT_REQUEST = "gpudefrag.io/checkpoint-request"
ANN_CKPT_DEST = "gpudefrag.io/checkpoint-dest"
ANN_CKPT_DONE = "gpudefrag.io/checkpoint-done"
# the node agent protocol (gpudefrag.control.node_agent): the controller writes the request on the pod, the
# agent on the pod's node answers on the same pod (both JSON, keyed by the move id)
ANN_AGENT_REQUEST = "gpudefrag.io/agent-checkpoint"
ANN_AGENT_RESULT = "gpudefrag.io/agent-checkpoint-result"
ANN_CKPT_MODE = "gpudefrag.io/checkpoint"  # on a pod: "app" or "kubelet" chooses how it is checkpointed
# the signals the node agent sends for the application hook (`kill -SIG 1` in the container); never one that
# stops or kills it
HOOK_SIGNALS = ("USR1", "USR2")
# on a pod: "recreate" = stateless (e.g. an inference replica): moved without a checkpoint, the replacement starts
# fresh from the pod's own image. Only the pod's owner can opt in; no option turns it on for other pods.
ANN_MOVE = "gpudefrag.io/move"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
HOSTNAME = "kubernetes.io/hostname"
_STRIP_META = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "ownerReferences", "generateName",
               "deletionTimestamp", "deletionGracePeriodSeconds", "generation", "selfLink")


class OpKind(StrEnum):
    VERIFY_TARGET = "verify-target"
    CHECK_PDB = "check-pdb"
    AGENT_CHECKPOINT = "agent-checkpoint"
    WAIT_AGENT_CHECKPOINT = "wait-agent-checkpoint"
    VERIFY_IMAGE = "verify-checkpoint-image"
    REQUEST_APP_CHECKPOINT = "request-app-checkpoint"
    SIGNAL = "signal"
    WAIT_AGENT_SIGNAL = "wait-agent-signal"
    WAIT_APP_CHECKPOINT = "wait-app-checkpoint"
    CREATE_REPLACEMENT = "create-replacement"
    WAIT_READY = "wait-ready"
    SET_DELETION_COST = "set-deletion-cost"
    ADOPT_REPLACEMENT = "adopt-replacement"
    EVICT_ORIGINAL = "evict-original"
    WAIT_DELETED = "wait-deleted"
    DELETE_REPLACEMENT = "delete-replacement"
    CLEAR_REQUEST = "clear-checkpoint-request"
    CLEAR_AGENT_REQUEST = "clear-agent-request"


@dataclass(frozen=True)
class Op:
    """One API operation (or, for `verify-checkpoint-image`, one registry read). `irreversible`: once it succeeds the
    move is committed and is finished rather than rolled back."""

    kind: OpKind
    verb: str  # GET, POST, PATCH, DELETE, or AGENT
    path: str
    body: Mapping[str, Any] | None = None
    detail: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    irreversible: bool = False

    @property
    def mutating(self) -> bool:
        return self.verb in ("POST", "PATCH", "DELETE")

    def as_dict(self) -> dict[str, object]:
        return {"op": self.kind.value, "verb": self.verb, "path": self.path, "detail": self.detail,
                "params": dict(self.params), "body": self.body, "irreversible": self.irreversible}


@dataclass(frozen=True)
class MoveSequence:
    workload_id: str
    source: str
    target: str
    move_id: str
    strategy: str  # bare-pod | replicaset | refused
    checkpoint_mode: str  # kubelet | app | recreate (the pod opted in to a move without state)
    ops: tuple[Op, ...] = ()
    rollback: tuple[Op, ...] = ()
    refused: str | None = None  # why no sequence was built (nothing will be touched)
    replacement: str | None = None
    pdbs: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.refused is None

    def kinds(self) -> list[str]:
        return [o.kind.value for o in self.ops]

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> MoveSequence:
        """Back from `as_dict` (the journal keeps the sequence it ran, for recovery after a crash)."""

        def op(o: Mapping[str, Any]) -> Op:
            return Op(OpKind(o["op"]), o["verb"], o["path"], o.get("body"), o.get("detail", ""),
                      dict(o.get("params") or {}), bool(o.get("irreversible")))

        return MoveSequence(d["workload"], d["source"], d["target"], d["move_id"], d["strategy"], d["checkpoint"],
                            tuple(op(o) for o in d.get("ops") or ()), tuple(op(o) for o in d.get("rollback") or ()),
                            d.get("refused"), d.get("replacement"), tuple(d.get("pdbs") or ()))

    def as_dict(self) -> dict[str, object]:
        return {"workload": self.workload_id, "source": self.source, "target": self.target, "move_id": self.move_id,
                "strategy": self.strategy, "checkpoint": self.checkpoint_mode, "refused": self.refused,
                "replacement": self.replacement, "pdbs": list(self.pdbs),
                "ops": [o.as_dict() for o in self.ops], "rollback": [o.as_dict() for o in self.rollback]}


class MoveLike(Protocol):
    """What the builder reads of a planner `Move` (gpudefrag.core.planner.Move)."""

    @property
    def workload_id(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def target(self) -> str: ...


@dataclass(frozen=True)
class SimpleMove:
    workload_id: str
    source: str
    target: str
    target_gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class MoveOptions:
    checkpoint: str = "auto"  # auto (the pod's gpudefrag.io/checkpoint annotation, else kubelet) | kubelet | app
    # a checkpoint image whose compatibility record the target does not satisfy: refuse the move, or
    # "cold-start" (the policy's `fallback: evict`): the replacement starts fresh from the pod's own image
    on_incompatible: str = "refuse"
    checkpoint_root: str = "/checkpoints"  # app hook: where the application writes (shared storage)
    signal: str = "USR1"  # the application hook's signal, one of HOOK_SIGNALS (the node agent sends no other)
    # the policy's budgets (defaults: the default policy's, from `policy.options.ExecutorConfig`)
    ready_timeout_s: float = ExecutorConfig.restore_timeout_s
    checkpoint_timeout_s: float = ExecutorConfig.checkpoint_timeout_s  # the agent's checkpoint + push
    compat: CompatRule | None = None

    @staticmethod
    def from_inputs(inputs: PlanInputs, **kw: Any) -> MoveOptions:
        """The move options the policy gives (the one projection, `policy.options`): its restore and checkpoint
        timeouts, its compatibility rule, and `fallback: evict` as a cold start of an image the target cannot
        restore; `kw` sets the rest (`checkpoint`, `signal`, ...)."""
        cfg = inputs.executor
        return MoveOptions(ready_timeout_s=cfg.restore_timeout_s, checkpoint_timeout_s=cfg.checkpoint_timeout_s,
                           compat=inputs.compat, on_incompatible="cold-start" if cfg.fallback == "evict" else "refuse",
                           **kw)


def move_id_for(workload_id: str, source: str, target: str) -> str:
    """Deterministic: the same move of the same pod gets the same id (names and journal entries line up)."""
    return hashlib.sha256(f"{workload_id}|{source}|{target}".encode()).hexdigest()[:10]


def pdb_after_replacement(pdb: PdbInfo) -> tuple[int, str]:
    """(disruptions the PDB will allow once the Ready replacement counts as healthy, why not when < 1)."""
    if pdb.max_unavailable in ("0", "0%"):
        return 0, f"PDB {pdb.key} has maxUnavailable {pdb.max_unavailable}: no voluntary disruption is allowed"
    if pdb.min_available == "100%":
        return 0, f"PDB {pdb.key} has minAvailable 100%: no voluntary disruption is allowed"
    allowed = max(pdb.disruptions_allowed, pdb.current_healthy + 1 - pdb.desired_healthy)
    if allowed < 1:
        return allowed, (f"PDB {pdb.key} would allow no disruption even with the replacement Ready "
                         f"(healthy {pdb.current_healthy}+1, desired {pdb.desired_healthy})")
    return allowed, ""


def _pod_path(ns: str, name: str, sub: str = "") -> str:
    return f"/api/v1/namespaces/{ns}/pods/{name}" + (f"/{sub}" if sub else "")


def replacement_manifest(info: PodInfo, target: str, move_id: str, *, name: str, mode: str, strategy: str,
                         options: MoveOptions) -> dict[str, Any]:
    """The replacement pod: the original's spec, pinned to `target` by required node affinity, restoring from
    the checkpoint (kubelet mode: each container's checkpoint image; app mode: GPUDEFRAG_RESTORE_FROM;
    recreate mode: nothing to restore, the pod's own image)."""
    raw = copy.deepcopy(dict(info.raw))
    meta = raw.get("metadata") or {}
    for k in _STRIP_META:
        meta.pop(k, None)
    meta["name"] = name
    meta["namespace"] = info.namespace
    labels = dict(meta.get("labels") or {})
    if strategy == "replicaset":
        labels.pop("pod-template-hash", None)  # outside the ReplicaSet until adopted
    meta["labels"] = labels
    ann = {k: v for k, v in (meta.get("annotations") or {}).items()
           if k not in ("kubectl.kubernetes.io/last-applied-configuration", DELETION_COST)}
    dest = f"{options.checkpoint_root}/{info.namespace}/{info.name}/{move_id}"
    ann.update({ANN_MIGRATED_FROM: f"{info.namespace}/{info.name}", ANN_MOVE_ID: move_id})
    if mode != "recreate":
        ann[ANN_RESTORE_FROM] = dest if mode == "app" else "kubelet-checkpoint-image"
    meta["annotations"] = ann
    spec = raw.get("spec") or {}
    spec.pop("nodeName", None)
    # the service-account volume is injected again by admission; a copied one would clash on name
    vols = [v for v in spec.get("volumes") or [] if not str(v.get("name", "")).startswith("kube-api-access")]
    if vols:
        spec["volumes"] = vols
    else:
        spec.pop("volumes", None)
    for c in spec.get("containers") or []:
        mounts = [m for m in c.get("volumeMounts") or [] if not str(m.get("name", "")).startswith("kube-api-access")]
        if mounts:
            c["volumeMounts"] = mounts
        else:
            c.pop("volumeMounts", None)
        if mode == "app":
            env = [e for e in c.get("env") or [] if e.get("name") != "GPUDEFRAG_RESTORE_FROM"]
            env.append({"name": "GPUDEFRAG_RESTORE_FROM", "value": dest})
            c["env"] = env
    pin = {"key": HOSTNAME, "operator": "In", "values": [target]}
    aff = spec.setdefault("affinity", {}) or {}
    spec["affinity"] = aff
    na = aff.setdefault("nodeAffinity", {}) or {}
    aff["nodeAffinity"] = na
    req = na.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = req.get("nodeSelectorTerms") or [{}]
    for t in terms:  # terms are ORed: the pin must hold in each
        exprs = [e for e in t.get("matchExpressions") or [] if e.get("key") != HOSTNAME]
        t["matchExpressions"] = [*exprs, pin]
    na["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _refuse(info_id: str, move: MoveLike, mid: str, mode: str, why: str) -> MoveSequence:
    return MoveSequence(info_id, move.source, move.target, mid, "refused", mode, refused=why)


def build_move(cluster: KubeCluster, move: MoveLike, options: MoveOptions | None = None) -> MoveSequence:
    """The operations for one move, or a refused sequence saying why (nothing is touched either way)."""
    options = options or MoveOptions()
    wid = move.workload_id
    mid = move_id_for(wid, move.source, move.target)
    info = cluster.pods.get(wid)
    mode = options.checkpoint
    if info is not None and mode == "auto":
        mode = "app" if info.annotations.get(ANN_CKPT_MODE) == "app" else "kubelet"
    if mode not in ("kubelet", "app"):
        mode = "kubelet"
    if info is not None and info.annotations.get(ANN_MOVE) == "recreate":
        mode = "recreate"
    if info is None or info.synthetic:
        return _refuse(wid, move, mid, mode, f"no running pod {wid!r} in the cluster")
    if info.node != move.source:
        return _refuse(wid, move, mid, mode, f"pod {wid} runs on {info.node!r}, not on {move.source!r}")
    if move.target == move.source:
        return _refuse(wid, move, mid, mode, "source and target are the same node")
    owner = info.owner
    if owner is None:
        strategy = "bare-pod"
    elif owner.kind == "ReplicaSet" and info.labels.get("pod-template-hash"):
        strategy = "replicaset"
    elif owner.kind == "ReplicaSet":
        # found against a real API server: a ReplicaSet not made by a Deployment has no pod-template-hash in its
        # selector, so the replacement (same labels) is adopted the moment it is created and the ReplicaSet
        # deletes one pod at once — the not-yet-Ready replacement first, or the original before it is replaced
        return _refuse(wid, move, mid, mode, f"owned by ReplicaSet {owner.name}, which no Deployment manages (its "
                       "pods carry no pod-template-hash): it would adopt the replacement before it is Ready; "
                       "not moved")
    else:
        why = {
            "Job": f"owned by Job {owner.name}: the Job controller would treat an adopted replacement as surplus "
                   "and could delete it; Job pods are not moved",
            "StatefulSet": f"owned by StatefulSet {owner.name}: its pod name cannot exist twice, so no replacement "
                           "can start before the original stops; not moved",
            "DaemonSet": "a DaemonSet pod belongs to its node; not moved",
        }.get(owner.kind, f"owned by {owner.kind} {owner.name}: gpudefrag does not know how that controller "
                          "replaces pods; not moved")
        return _refuse(wid, move, mid, mode, why)
    # compatibility of the target node, before anything is touched
    state = cluster.state
    if move.target not in state.node_index:
        return _refuse(wid, move, mid, mode, f"target node {move.target!r} is not in the cluster")
    target: Node = state.node(move.target)
    if not target.schedulable:
        return _refuse(wid, move, mid, mode, f"target node {move.target} is cordoned or not ready")
    mismatch = describe(checkpoint_record(state, state.workload(wid)), target, options.compat)
    if mismatch:
        return _refuse(wid, move, mid, mode, "target incompatible: " + "; ".join(mismatch))
    pdbs = cluster.pdbs_for(wid)
    for p in pdbs:
        allowed, why = pdb_after_replacement(p)
        if allowed < 1:
            return _refuse(wid, move, mid, mode, why)

    ns, pod = info.namespace, info.name
    repl = f"{pod[:46]}-mv-{mid[:6]}"
    ops: list[Op] = [Op(OpKind.VERIFY_TARGET, "GET", f"/api/v1/nodes/{move.target}",
                        detail=f"target {move.target} exists, schedulable, compatible labels; {pod} still runs "
                               f"on {move.source}",
                        params={"node": move.target, "workload": wid,
                                "gpus": state.workload(wid).request.gpus_per_node,
                                "namespace": ns, "pod": pod, "uid": info.uid, "source": move.source})]
    ops += [Op(OpKind.CHECK_PDB, "GET", f"/apis/policy/v1/namespaces/{p.namespace}/poddisruptionbudgets/{p.name}",
               detail=f"PDB {p.key} will allow the eviction once the replacement is Ready",
               params={"namespace": p.namespace, "name": p.name}) for p in pdbs]
    if mode == "kubelet":
        req = {"move_id": mid, "containers": list(info.containers)}
        ops.append(Op(OpKind.AGENT_CHECKPOINT, "PATCH", _pod_path(ns, pod),
                      body={"metadata": {"annotations": {ANN_AGENT_REQUEST: json.dumps(req, sort_keys=True)}}},
                      detail=f"ask the node agent on {info.node} to checkpoint {', '.join(info.containers)} "
                             "(kubelet + CRIU) into a signed checkpoint image",
                      params={"namespace": ns, "pod": pod, "node": info.node}))
        ops.append(Op(OpKind.WAIT_AGENT_CHECKPOINT, "GET", _pod_path(ns, pod),
                      detail=f"wait for the agent's answer ({ANN_AGENT_RESULT})",
                      params={"namespace": ns, "pod": pod, "move_id": mid, "containers": list(info.containers),
                              "timeout_s": options.checkpoint_timeout_s}))
        ops.append(Op(OpKind.VERIFY_IMAGE, "GET", "registry",
                      detail=f"check each image's digest, signature and compatibility record against {move.target}",
                      params={"node": move.target, "on_incompatible": options.on_incompatible}))
    elif mode == "app":
        dest = f"{options.checkpoint_root}/{ns}/{pod}/{mid}"
        ops.append(Op(OpKind.REQUEST_APP_CHECKPOINT, "PATCH", _pod_path(ns, pod),
                      body={"metadata": {"annotations": {ANN_CKPT_REQUEST: mid, ANN_CKPT_DEST: dest}}},
                      detail=f"ask the application to checkpoint to {dest}", params={"namespace": ns, "pod": pod}))
        hook = {"move_id": mid, "hook": {"container": info.containers[0], "signal": options.signal}}
        ops.append(Op(OpKind.SIGNAL, "PATCH", _pod_path(ns, pod),
                      body={"metadata": {"annotations": {ANN_AGENT_REQUEST: json.dumps(hook, sort_keys=True)}}},
                      detail=f"ask the node agent on {info.node} to send SIG{options.signal} to PID 1 of "
                             f"{info.containers[0]} through its container runtime",
                      params={"namespace": ns, "pod": pod, "node": info.node}))
        ops.append(Op(OpKind.WAIT_AGENT_SIGNAL, "GET", _pod_path(ns, pod),
                      detail=f"wait for the agent's answer ({ANN_AGENT_RESULT})",
                      params={"namespace": ns, "pod": pod, "move_id": mid, "container": info.containers[0],
                              "timeout_s": options.checkpoint_timeout_s}))
        ops.append(Op(OpKind.WAIT_APP_CHECKPOINT, "GET", _pod_path(ns, pod),
                      detail=f"wait for annotation {ANN_CKPT_DONE}={mid}",
                      params={"namespace": ns, "pod": pod, "move_id": mid, "timeout_s": options.ready_timeout_s}))
    body = replacement_manifest(info, move.target, mid, name=repl, mode=mode, strategy=strategy, options=options)
    ops.append(Op(OpKind.CREATE_REPLACEMENT, "POST", f"/api/v1/namespaces/{ns}/pods", body=body,
                  detail=f"create {repl} pinned to {move.target}, "
                  + ("started fresh (the pod opted in to a move without state)" if mode == "recreate"
                     else "restoring from the checkpoint"),
                  params={"namespace": ns, "pod": repl}))
    ops.append(Op(OpKind.WAIT_READY, "GET", _pod_path(ns, repl), detail=f"wait until {repl} is Ready",
                  params={"namespace": ns, "pod": repl, "timeout_s": options.ready_timeout_s}))
    if strategy == "replicaset":
        hash_ = info.labels.get("pod-template-hash", "")
        ops.append(Op(OpKind.SET_DELETION_COST, "PATCH", _pod_path(ns, pod),
                      body={"metadata": {"annotations": {DELETION_COST: "-2147483648"}}},
                      detail="make the original the ReplicaSet's first choice to remove",
                      params={"namespace": ns, "pod": pod}))
        ops.append(Op(OpKind.ADOPT_REPLACEMENT, "PATCH", _pod_path(ns, repl),
                      body={"metadata": {"labels": {"pod-template-hash": hash_}}},
                      detail=f"let ReplicaSet {owner.name if owner else '?'} adopt {repl}",
                      params={"namespace": ns, "pod": repl}, irreversible=True))
    ops.append(Op(OpKind.EVICT_ORIGINAL, "POST", _pod_path(ns, pod, "eviction"),
                  body={"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": ns},
                        # the API server evicts only the pod that was planned, never a namesake made since
                        **({"deleteOptions": {"preconditions": {"uid": info.uid}}} if info.uid else {})},
                  detail=f"evict {pod} (the API server enforces its PDBs)",
                  params={"namespace": ns, "pod": pod, "uid": info.uid, "missing_ok": strategy == "replicaset"},
                  irreversible=True))
    ops.append(Op(OpKind.WAIT_DELETED, "GET", _pod_path(ns, pod), detail=f"wait until {pod} is gone",
                  params={"namespace": ns, "pod": pod, "uid": info.uid, "timeout_s": options.ready_timeout_s}))
    rollback = [Op(OpKind.DELETE_REPLACEMENT, "DELETE", _pod_path(ns, repl), detail=f"delete {repl}",
                   params={"namespace": ns, "pod": repl})]
    if mode == "kubelet":
        rollback.append(Op(OpKind.CLEAR_AGENT_REQUEST, "PATCH", _pod_path(ns, pod),
                           body={"metadata": {"annotations": {ANN_AGENT_REQUEST: None, ANN_AGENT_RESULT: None}}},
                           detail="withdraw the agent request", params={"namespace": ns, "pod": pod}))
    if mode == "app":
        rollback.append(Op(OpKind.CLEAR_REQUEST, "PATCH", _pod_path(ns, pod),
                           body={"metadata": {"annotations": {ANN_CKPT_REQUEST: None, ANN_CKPT_DEST: None,
                                                              ANN_AGENT_REQUEST: None, ANN_AGENT_RESULT: None}}},
                           detail="withdraw the checkpoint and agent requests", params={"namespace": ns, "pod": pod}))
    if strategy == "replicaset":
        rollback.append(Op(OpKind.SET_DELETION_COST, "PATCH", _pod_path(ns, pod),
                           body={"metadata": {"annotations": {DELETION_COST: None}}},
                           detail="restore the original's deletion cost", params={"namespace": ns, "pod": pod}))
    return MoveSequence(wid, move.source, move.target, mid, strategy, mode, tuple(ops), tuple(rollback), None, repl,
                        tuple(p.key for p in pdbs))


def build_moves(cluster: KubeCluster, moves: list[Any], options: MoveOptions | None = None,
                budget: int | None = None) -> list[MoveSequence]:
    """Sequences for a plan's moves, in order. `budget` (the policy's disruption budget): moves beyond it are
    refused. If any move is refused the plan cannot free its node: callers must not execute the others."""
    out = []
    for i, m in enumerate(moves):
        if budget is not None and i >= budget:
            mid = move_id_for(m.workload_id, m.source, m.target)
            out.append(MoveSequence(m.workload_id, m.source, m.target, mid, "refused", options.checkpoint
                                    if options else "auto", refused=f"over the policy's disruption budget of {budget}"))
            continue
        out.append(build_move(cluster, m, options))
    return out
