"""The snapshot format: a JSON (or YAML) file that describes a cluster and its jobs.

This is what users attach to bug reports, what `gpudefrag frag|diagnose|plan` read, and what the engines and the
simulator write. The pydantic models below are the format's single definition: the JSON Schema shipped in
`gpudefrag/schema/snapshot.schema.json` is generated from them (`python -m gpudefrag.snapshot --schema`).
Loading is strict (no type coercion, no unknown fields) so that a typo is an error, not a silent default.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from msgspec import Raw
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import fileio, typed_json
from .core.model import (
    IMMOVABLE_REASONS,
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
    mig_profile,
)
from .errors import InputError, loc_to_path
from .fileio import bulk_allocation, write_json_atomic

FORMAT_VERSION = 2  # 2: movable/movable_reason, checkpointer_version, scheduler, checked MIG profiles (1 still read)

# Every number has a bound the model can hold (issue 15: `cpu_milli: 10**30` overflowed NumPy, `now: 1e308` made
# `plan --json` print Infinity): sums over a million nodes still fit in int64, times are seconds within ±3,000 years.
NonNeg = Annotated[int, Field(ge=0, le=2**31 - 1)]  # counts: GPUs, MIG slices, quotas, group sizes
Amount = Annotated[int, Field(ge=0, le=MAX_AMOUNT)]  # per-object CPU millicores and memory MiB
Bytes = Annotated[int, Field(ge=0, le=2**53)]  # 8 PiB, exact as a float
Time = Annotated[float, Field(ge=-1e11, le=1e11, allow_inf_nan=False)]  # seconds (epoch or trace-relative)
# Kubernetes priorities are signed 32-bit, Slurm's unsigned 32-bit (its defaults sit near 4,294,901,758)
Priority = Annotated[int, Field(ge=-(2**31), le=2**32 - 1)]
Name = Annotated[str, Field(min_length=1, max_length=253)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


ImmovableReason = Literal[IMMOVABLE_REASONS]  # type: ignore[valid-type]


class TaintIn(_Strict):
    key: Name
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class TolerationIn(_Strict):
    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""


class VersionsIn(_Strict):
    gpu_model: str | None = None
    gpu_count: NonNeg | None = None
    driver: str | None = None
    cuda: str | None = None
    engine: str | None = None
    model: str | None = None
    cpu_arch: str | None = None
    kernel: str | None = None
    checkpointer: str | None = None

    def to_versions(self) -> Versions:
        """The model's versions (the checkpoint manifest's compatibility record reads its own through this)."""
        return Versions(self.gpu_model, self.gpu_count, self.driver, self.cuda, self.engine, self.model,
                        self.cpu_arch, self.kernel, self.checkpointer)


class NodeIn(_Strict):
    name: Name
    gpus: Annotated[int, Field(ge=0, le=1024)] = Field(description="GPUs on the node (capacity)")
    gpu_model: str | None = None
    gpu_allocatable: NonNeg | None = Field(
        None, description="GPUs the device plugin advertises; null = all; 0 = plugin not registered"
    )
    cpu_milli: Amount = 0
    memory_mib: Amount = 0
    driver_version: str | None = None
    cuda_version: str | None = None
    cpu_arch: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[TaintIn] = Field(default_factory=list)
    schedulable: bool = True
    mig_devices: dict[str, NonNeg] = Field(default_factory=dict, description="MIG profile (e.g. "
                                           "nvidia.com/mig-3g.40gb or 3g.40gb) -> slices the node exposes")
    node_group: str | None = None
    partitions: list[str] = Field(default_factory=list)
    checkpointer_version: str | None = Field(None, description="e.g. 'criu 4.1.1': what a restore here runs")
    kernel: str | None = Field(None, description="kernel release (uname -r), e.g. '6.1.0-18-amd64': a CRIU "
                               "checkpoint records its host's and restores only where the compatibility rule allows")

    @field_validator("mig_devices")
    @classmethod
    def _profiles(cls, v: dict[str, int]) -> dict[str, int]:
        out: dict[str, int] = {}
        for k, n in v.items():
            key = mig_profile(k)
            out[key] = out.get(key, 0) + n
        return out


class PlacementIn(_Strict):
    node: Name
    gpus: list[NonNeg] | None = Field(None, description="GPU indices on the node; null = assign the first free")


_NO_VERSIONS = Versions()


class WorkloadIn(_Strict):
    id: Name
    name: str = ""
    state: Literal["running", "pending"] = "running"
    gpus_per_node: Annotated[int, Field(ge=0, le=1024)]
    node_count: Annotated[int, Field(ge=1, le=100000)] = 1
    gpu_milli: Annotated[int, Field(ge=0, le=MILLI)] = MILLI
    cpu_milli: Amount = 0
    memory_mib: Amount = 0
    # what a request asks beyond its numbers: the workloads of one deployment or partition spell it alike (every
    # pod carries the two default tolerations), so the fast path decodes each distinct spelling once and shares
    # one Request per shape and spelling
    gpu_models: Annotated[list[str], typed_json.REPEATED] = Field(default_factory=list)
    node_selector: Annotated[dict[str, str], typed_json.REPEATED] = Field(default_factory=dict)
    tolerations: Annotated[list[TolerationIn], typed_json.REPEATED] = Field(default_factory=list)
    partition: str | None = None
    mig_profile: str | None = None
    namespace: str = "default"
    user: str = ""
    priority: Priority = 0
    labels: dict[str, str] = Field(default_factory=dict)
    placements: list[PlacementIn] = Field(default_factory=list)
    checkpoint_bytes: Bytes = 0
    last_checkpoint_at: Time | None = None
    submitted_at: Time | None = None
    started_at: Time | None = None
    expected_end_at: Time | None = None
    # a few distinct sets among thousands of workloads: the fast path decodes each distinct spelling once
    versions: Annotated[VersionsIn | None, typed_json.REPEATED] = None
    scheduler_reason: str = ""
    movable: bool = Field(True, description="false: no entry point ever moves it")
    movable_reason: ImmovableReason | None = Field(None, description="why it may not move")

    @field_validator("mig_profile")
    @classmethod
    def _profile(cls, v: str | None) -> str | None:
        return None if v is None else mig_profile(v)


class QuotaIn(_Strict):
    namespace: Name
    gpu_limit: NonNeg
    gpu_used: NonNeg | None = Field(None, description="GPUs the quota charges now (absent: summed from the "
                                    "workloads, as charged_at says)")
    charged_at: Literal["create", "start"] = Field(
        "start", description="create: charged when a workload is created (Kubernetes ResourceQuota), so gpu_used "
        "includes pending workloads and never holds back one that exists; start: charged when it starts (Slurm "
        "GrpTRES), so gpu_used counts running jobs and a pending job waits while used + request > limit")


class NodeGroupIn(_Strict):
    name: Name
    current: NonNeg
    maximum: NonNeg
    gpu_model: str | None = None
    gpus_per_node: NonNeg = 0


class Snapshot(_Strict):
    """A cluster at one instant."""

    # an integer in range, not Literal[1, 2]: a Literal compares by equality, so `1.0` and `true` read as 1
    version: Annotated[int, Field(ge=1, le=FORMAT_VERSION)] = FORMAT_VERSION
    name: str = "cluster"
    now: Time = 0.0
    scheduler: Literal["", "slurm", "kubernetes"] = Field("", description="whose pending reasons the workloads "
                                                          "carry (empty: told apart by their shape)")
    nodes: list[NodeIn]
    workloads: list[WorkloadIn] = Field(default_factory=list)
    quotas: list[QuotaIn] = Field(default_factory=list)
    node_groups: list[NodeGroupIn] = Field(default_factory=list)


# to_state builds these positionally (keyword parsing was a third of its time): their field order is part of
# what it relies on, checked once here so that a reordered struct fails at import, not as swapped values.
_POSITIONAL = {
    Node: "name gpu_count gpu_model gpu_allocatable cpu_milli memory_mib driver_version cuda_version cpu_arch labels "
          "taints schedulable mig_devices node_group partitions checkpointer_version kernel",
    Request: "gpus_per_node node_count gpu_milli cpu_milli memory_mib gpu_models node_selector tolerations partition "
             "mig_profile",
    Workload: "id request state name namespace user priority labels placements checkpoint_bytes last_checkpoint_at "
              "submitted_at started_at expected_end_at versions scheduler_reason movable movable_reason",
    Versions: "gpu_model gpu_count driver cuda engine model cpu_arch kernel checkpointer",
}
for _cls, _names in _POSITIONAL.items():
    if list(_cls.__struct_fields__) != _names.split():
        raise ImportError(f"snapshot.to_state builds {_cls.__name__} positionally; its fields changed: update both")

# The same format as a msgspec struct (derived, not written twice): the fast path of _load_snapshot.
_FAST_SNAPSHOT = typed_json.mirror(Snapshot)
# to_state reads each object of the file as the tuple of its fields (typed_json.reader: the model's defaults in
# place of what the file left out) and unpacks it by position, or hands it to the model's class of the same
# field order: checked here, so that a reordered model fails at import, not as swapped values.
_VERSIONS, _GPU_MODELS, _NODE_SELECTOR, _TOLERATIONS = (
    typed_json.REPEATED.decoder(WorkloadIn, f) for f in ("versions", "gpu_models", "node_selector", "tolerations"))
_READ = {m: typed_json.reader(m) for m in (Snapshot, NodeIn, TaintIn, TolerationIn, VersionsIn, PlacementIn,
                                           WorkloadIn, QuotaIn, NodeGroupIn)}
_READ_ORDER = {
    Snapshot: "version name now scheduler nodes workloads quotas node_groups",
    NodeIn: "name gpus gpu_model gpu_allocatable cpu_milli memory_mib driver_version cuda_version cpu_arch labels "
            "taints schedulable mig_devices node_group partitions checkpointer_version kernel",
    TaintIn: "key value effect",
    PlacementIn: "node gpus",
    WorkloadIn: "id name state gpus_per_node node_count gpu_milli cpu_milli memory_mib gpu_models node_selector "
                "tolerations partition mig_profile namespace user priority labels placements checkpoint_bytes "
                "last_checkpoint_at submitted_at started_at expected_end_at versions scheduler_reason movable "
                "movable_reason",
    VersionsIn: " ".join(Versions.__struct_fields__),
    TolerationIn: " ".join(Toleration.__struct_fields__),
    QuotaIn: " ".join(Quota.__struct_fields__),
    NodeGroupIn: " ".join(NodeGroup.__struct_fields__),
}
for _model, _names in _READ_ORDER.items():
    if list(_model.model_fields) != _names.split():
        raise ImportError(f"snapshot.to_state reads {_model.__name__} by position; its fields changed: update both")


# ---------------------------------------------------------------------------------------------- reading
def read_document(path: str | os.PathLike[str], kind: str = "snapshot") -> Any:
    """Parse a JSON or YAML file through the guarded reader (fileio): every problem is an InputError with a place."""
    return fileio.read_document(path, kind)


def parse_snapshot(doc: Any, source: str = "<snapshot>") -> Snapshot:
    try:
        return Snapshot.model_validate(doc)
    except ValidationError as e:
        raise _validation_error(e, source) from None


def _validation_error(e: ValidationError, source: str) -> InputError:
    err = e.errors(include_url=False)[0]
    more = f" (and {e.error_count() - 1} more error(s))" if e.error_count() > 1 else ""
    msg = err["msg"]
    msg = msg.removeprefix("Value error, ")
    if err["type"] in ("missing", "extra_forbidden"):
        msg = "required field is missing" if err["type"] == "missing" else "unknown field"
    return InputError(source, loc_to_path(err["loc"]), msg + more)


def to_state(snap: Snapshot, source: str = "<snapshot>") -> ClusterState:
    """Convert a validated snapshot to a ClusterState, assigning GPU indices where the file leaves them out.
    `snap` is the pydantic model or its msgspec mirror (typed_json), whose fields the file left out are ABSENT:
    each object is read through `typed_json.reader`, which puts the model's defaults in their place. A label
    dict is taken as it is (both decoders make a fresh one per object), an empty one replaced by a fresh {}
    (the reader's default is one shared dict)."""
    _, name, now, scheduler, node_docs, workload_docs, quota_docs, group_docs = _READ[Snapshot](snap)
    if not math.isfinite(now):
        raise InputError(source, "now", "must be a finite number")
    # Positional construction (field order of core.model's structs): keyword parsing of 18 arguments was a
    # third of the time of a 10,000-node snapshot's conversion.
    read_node, read_taint = _READ[NodeIn], _READ[TaintIn]
    nodes: list[Node] = []
    for n in node_docs:
        (node_name, gpus, gpu_model, gpu_allocatable, cpu_milli, memory_mib, driver_version, cuda_version, cpu_arch,
         labels, taints, schedulable, mig_devices, node_group, partitions, checkpointer_version, kernel) = read_node(n)
        nodes.append(Node(
            node_name, gpus, gpu_model, gpu_allocatable, cpu_milli, memory_mib, driver_version, cuda_version, cpu_arch,
            labels or {}, tuple(Taint(k, v, TaintEffect(e)) for k, v, e in map(read_taint, taints)) if taints else (),
            schedulable, _mig_devices(mig_devices) if mig_devices else {}, node_group, tuple(partitions),
            checkpointer_version, kernel))
    by_name: dict[str, Node] = {}  # filled when a placement leaves its GPUs out (most snapshots name them all)
    # GPU indices: explicit ones first, then fill the unassigned placements (first free / best-fit share). The
    # explicit ones are counted only when some placement leaves its GPUs out (most snapshots name them all).
    used: dict[tuple[str, int], int] | None = None
    workloads: list[Workload] = []
    states = {s.value: s for s in WorkloadState}
    # Requests and versions are frozen values: the workloads of one shape share one Request, and those of one set
    # of versions one Versions, as 50,000 jobs of a snapshot share a few dozen shapes and versions (one object
    # built instead of each). A shape is the request's numbers, partition and MIG profile, and on the fast path
    # the bytes the file spells its model list, node selector and tolerations with (typed_json.REPEATED: each
    # distinct spelling decoded once); on the careful path only plain shapes (none of those three) are shared.
    # The versions are keyed by the file's bytes on the fast path, by pydantic's frozen, hashable object on the
    # careful one.
    shapes: dict[tuple[object, ...], Request] = {}
    versions: dict[object, Versions] = {None: _NO_VERSIONS}
    read_workload, read_placement = _READ[WorkloadIn], _READ[PlacementIn]
    read_versions = _READ[VersionsIn]
    absent = typed_json.ABSENT
    for i, w in enumerate(workload_docs):
        (wid, wname, state, gpus_per_node, node_count, gpu_milli, cpu_milli, memory_mib, gpu_models, node_selector,
         tolerations, partition, mig, namespace, user, priority, labels, placement_docs, checkpoint_bytes,
         last_checkpoint_at, submitted_at, started_at, expected_end_at, v, scheduler_reason, movable,
         movable_reason) = read_workload(w)
        first = placement_docs[0].gpus if len(placement_docs) == 1 else None
        if first is not None and first is not absent:  # the common case: one placement, its GPUs named
            placements: tuple[Placement, ...] = (Placement(placement_docs[0].node, tuple(first)),)
        elif placement_docs:
            where = list(map(read_placement, placement_docs))
            if used is None and any(g is None for _, g in where):
                used = _explicit_gpus(workload_docs)
                by_name = {n.name: n for n in nodes}
            placements = _placements(where, i, gpus_per_node, gpu_milli, by_name, used, source)
        else:
            placements = ()
        if type(v) is Raw:  # the fast path leaves them as the file spells them (typed_json.REPEATED)
            v = bytes(v)
        wv = versions.get(v)
        if wv is None:
            given = _VERSIONS(v) if type(v) is bytes else v
            wv = versions[v] = _NO_VERSIONS if given is None else Versions(*read_versions(given))
        milli = gpu_milli if gpus_per_node else MILLI
        key: tuple[object, ...] | None = (gpus_per_node, node_count, milli, cpu_milli, memory_mib, partition, mig)
        if not (gpu_models or node_selector or tolerations):
            pass  # a plain shape
        elif type(gpu_models) is Raw or type(node_selector) is Raw or type(tolerations) is Raw:
            # the fast path: each given as the file spells it (typed_json.REPEATED), absent as the empty default
            gpu_models = bytes(gpu_models) if type(gpu_models) is Raw else None
            node_selector = bytes(node_selector) if type(node_selector) is Raw else None
            tolerations = bytes(tolerations) if type(tolerations) is Raw else None
            key = (gpus_per_node, node_count, milli, cpu_milli, memory_mib, partition, mig, gpu_models,
                   node_selector, tolerations)
        else:
            key = None  # the careful path: built for each workload
        request = shapes.get(key) if key is not None else None
        if request is None:
            request = _request(gpus_per_node, node_count, milli, cpu_milli, memory_mib, gpu_models, node_selector,
                               tolerations, partition, mig)
            if key is not None:
                shapes[key] = request
        workloads.append(Workload(
            wid, request, states[state], wname, namespace, user, priority, labels or {}, placements, checkpoint_bytes,
            last_checkpoint_at, submitted_at, started_at, expected_end_at, wv, scheduler_reason, movable,
            movable_reason or ("" if movable else "other")))
    try:
        return ClusterState.build(
            nodes,
            workloads,
            quotas=[Quota(*_READ[QuotaIn](q)) for q in quota_docs],
            node_groups=[NodeGroup(*_READ[NodeGroupIn](g)) for g in group_docs],
            now=now,
            name=name,
            scheduler=scheduler,
        )
    except ModelError as e:
        raise InputError(source, e.path, e.message) from None


def _request(gpus_per_node: int, node_count: int, milli: int, cpu_milli: int, memory_mib: int, gpu_models: Any,
             node_selector: Any, tolerations: Any, partition: str | None, mig: str | None) -> Request:
    """A workload's Request. `gpu_models`, `node_selector` and `tolerations` are the snapshot model's values
    (the careful path, or the empty defaults), or the bytes the file spells them with (the fast path:
    typed_json.REPEATED, decoded here), None where the file leaves one out."""
    if type(gpu_models) is bytes:
        gpu_models = _GPU_MODELS(gpu_models)
    if type(node_selector) is bytes:
        node_selector = _NODE_SELECTOR(node_selector)
    if type(tolerations) is bytes:
        tolerations = _TOLERATIONS(tolerations)
    read_toleration = _READ[TolerationIn]
    return Request(gpus_per_node, node_count, milli, cpu_milli, memory_mib, tuple(gpu_models or ()),
                   dict(node_selector or {}),
                   tuple(Toleration(*read_toleration(t)) for t in tolerations) if tolerations else (), partition,
                   None if mig is None else mig_profile(mig))


def _placements(where: list[tuple[str, list[int] | None]], i: int, k: int, milli: int, by_name: dict[str, Node],
                used: dict[tuple[str, int], int] | None, source: str) -> tuple[Placement, ...]:
    """The `i`-th workload's placements (`where`: node and GPUs of each), assigning GPU indices where the file
    leaves them out (`used`: what the explicit ones and earlier assignments take; given whenever some GPUs are
    left out; `k` GPUs per node of `milli` each)."""
    placements: list[Placement] = []
    for j, (node_name, gpus) in enumerate(where):
        if gpus is not None:
            placements.append(Placement(node_name, tuple(gpus)))
            continue
        node = by_name.get(node_name)
        if node is None:
            raise InputError(source, f"workloads[{i}].placements[{j}].node", f"unknown node {node_name!r}")
        assert used is not None
        chosen = _assign(node, k, milli, used)
        if chosen is None:
            raise InputError(source, f"workloads[{i}].placements[{j}]",
                             f"node {node_name!r} has no room for {k} GPU(s) of {milli} milli")
        placements.append(Placement(node_name, chosen))
    return tuple(placements)


def _explicit_gpus(workload_docs: list[Any]) -> dict[tuple[str, int], int]:
    """The share (milli) the running workloads' explicit GPU indices take, per (node, GPU)."""
    used: dict[tuple[str, int], int] = {}
    at = {f: i for i, f in enumerate(WorkloadIn.model_fields)}
    for doc in workload_docs:
        w = _READ[WorkloadIn](doc)
        if w[at["state"]] != "running":
            continue
        for node, gpus in map(_READ[PlacementIn], w[at["placements"]]):
            for g in gpus or ():
                used[(node, g)] = used.get((node, g), 0) + w[at["gpu_milli"]]
    return used


def _mig_devices(given: dict[str, int]) -> dict[str, int]:
    """The node's MIG slices by canonical profile (two spellings of one profile add up). The pydantic model's
    validator did this already on the careful path; the fast path's mirror has no validators, so the conversion
    both paths share does it (idempotent). An unknown profile raises ValueError: the fast path then reads the
    file the careful way, whose validator names the field."""
    out: dict[str, int] = {}
    for k, n in given.items():
        key = mig_profile(k)
        out[key] = out.get(key, 0) + n
    return out


def _assign(node: Node, k: int, milli: int, used: dict[tuple[str, int], int]) -> tuple[int, ...] | None:
    limit = node.usable_gpus
    if k == 0:
        return ()
    if milli >= MILLI or k > 1:
        free = [g for g in range(limit) if used.get((node.name, g), 0) == 0]
        if len(free) < k:
            return None
        chosen = tuple(free[:k])
    else:
        cands = [(MILLI - used.get((node.name, g), 0), g) for g in range(limit)]
        fit = [(f, g) for f, g in cands if f >= milli]
        if not fit:
            return None
        chosen = (min(fit)[1],)
    for g in chosen:
        used[(node.name, g)] = used.get((node.name, g), 0) + milli
    return chosen


def load_snapshot(path: str | os.PathLike[str]) -> ClusterState:
    with bulk_allocation():
        return _load_snapshot(path)


def _load_snapshot(path: str | os.PathLike[str]) -> ClusterState:
    """Read, validate and convert a snapshot file. Raises InputError naming the file and the field.

    JSON goes first through the msgspec mirror of the model (typed_json: faster than a bare json.loads of the
    file); whatever it refuses (a wrong field, malformed JSON, a repeated key) is read again the careful way:
    the guarded parse (duplicate keys, NaN, nesting, with line and column) and pydantic's validator, whose
    messages name the field. Both paths end in the same conversion, to_state."""
    src = str(path)
    p = Path(path)
    if p.suffix.lower() in (".yaml", ".yml"):
        return to_state(parse_snapshot(read_document(path), src), src)
    raw = fileio.drop_bom(fileio.read_input(path, "snapshot"))
    state = read_fast(raw, src)
    return state if state is not None else read_careful(raw, src)


def read_fast(raw: bytes, src: str) -> ClusterState | None:
    """The snapshot in `raw` through the msgspec mirror, or None where the careful reader must say what is wrong.
    An InputError of the conversion (an unknown node, an over-allocated GPU) is the careful reader's too."""
    fast = typed_json.decode(raw, _FAST_SNAPSHOT)
    if fast is None:
        return None
    try:
        return to_state(fast, src)
    except ValueError:  # an unknown MIG profile, a refused repeated field: the careful path names it
        return None


def read_careful(raw: bytes, src: str) -> ClusterState:
    """The guarded parse (duplicate keys, NaN, nesting, giant literals: line and column) and pydantic's strict
    validation, whose messages name the field."""
    fileio.parse_json(raw, src, check_only=True)  # duplicate keys, NaN, nesting: pydantic's parser lets them by
    try:
        snap = Snapshot.model_validate_json(raw)
    except ValidationError as e:
        raise _validation_error(e, src) from None
    return to_state(snap, src)


def load_snapshot_dict(doc: Any, source: str = "<snapshot>") -> ClusterState:
    with bulk_allocation():
        return to_state(parse_snapshot(doc, source), source)


# ---------------------------------------------------------------------------------------------- writing
def state_to_dict(state: ClusterState) -> dict[str, Any]:
    """The snapshot document for a ClusterState (round-trips through load_snapshot_dict)."""
    nodes = []
    for n in state.nodes:
        d: dict[str, Any] = {"name": n.name, "gpus": n.gpu_count}
        for k, v in (("gpu_model", n.gpu_model), ("gpu_allocatable", n.gpu_allocatable),
                     ("driver_version", n.driver_version), ("cuda_version", n.cuda_version),
                     ("cpu_arch", n.cpu_arch), ("node_group", n.node_group),
                     ("checkpointer_version", n.checkpointer_version), ("kernel", n.kernel)):
            if v is not None:
                d[k] = v
        if n.cpu_milli:
            d["cpu_milli"] = n.cpu_milli
        if n.memory_mib:
            d["memory_mib"] = n.memory_mib
        if n.labels:
            d["labels"] = dict(n.labels)
        if n.taints:
            d["taints"] = [{"key": t.key, "value": t.value, "effect": t.effect.value} for t in n.taints]
        if not n.schedulable:
            d["schedulable"] = False
        if n.mig_devices:
            d["mig_devices"] = dict(n.mig_devices)
        if n.partitions:
            d["partitions"] = list(n.partitions)
        nodes.append(d)
    workloads = []
    for w in state.workloads:
        r = w.request
        d = {"id": w.id, "state": w.state.value, "gpus_per_node": r.gpus_per_node}
        optional: dict[str, Any] = {
            "name": w.name, "node_count": r.node_count if r.node_count != 1 else None,
            "gpu_milli": r.gpu_milli if r.gpu_milli != MILLI else None,
            "cpu_milli": r.cpu_milli, "memory_mib": r.memory_mib, "gpu_models": list(r.gpu_models),
            "node_selector": dict(r.node_selector), "partition": r.partition, "mig_profile": r.mig_profile,
            "namespace": w.namespace if w.namespace != "default" else None, "user": w.user,
            "priority": w.priority, "labels": dict(w.labels), "checkpoint_bytes": w.checkpoint_bytes,
            "last_checkpoint_at": w.last_checkpoint_at, "submitted_at": w.submitted_at,
            "started_at": w.started_at, "expected_end_at": w.expected_end_at,
            "scheduler_reason": w.scheduler_reason,
        }
        d.update({k: v for k, v in optional.items() if v})
        if r.tolerations:
            d["tolerations"] = [{"key": t.key, "operator": t.operator, "value": t.value, "effect": t.effect}
                                for t in r.tolerations]
        if not w.movable:
            d["movable"] = False
            if w.movable_reason in IMMOVABLE_REASONS:
                d["movable_reason"] = w.movable_reason
        if w.placements:
            d["placements"] = [{"node": p.node, "gpus": list(p.gpus)} for p in w.placements]
        versions = {k: getattr(w.versions, k) for k in Versions.__struct_fields__ if getattr(w.versions, k) is not None}
        if versions:
            d["versions"] = versions
        workloads.append(d)
    doc: dict[str, Any] = {"version": FORMAT_VERSION, "name": state.name, "now": state.now, "nodes": nodes,
                           "workloads": workloads}
    if state.scheduler:
        doc["scheduler"] = state.scheduler
    if state.quotas:
        doc["quotas"] = [{"namespace": q.namespace, "gpu_limit": q.gpu_limit,
                          **({"gpu_used": q.gpu_used} if q.gpu_used is not None else {}),
                          **({"charged_at": q.charged_at} if q.charged_at != "start" else {})}
                         for q in state.quotas]
    if state.node_groups:
        doc["node_groups"] = [{"name": g.name, "current": g.current, "maximum": g.maximum,
                               **({"gpu_model": g.gpu_model} if g.gpu_model else {}),
                               "gpus_per_node": g.gpus_per_node} for g in state.node_groups]
    return doc


def save_snapshot(path: str | os.PathLike[str], state: ClusterState) -> None:
    write_json_atomic(path, state_to_dict(state))


SCHEMA_PATH = Path(__file__).parent / "schema" / "snapshot.schema.json"


def json_schema() -> dict[str, Any]:
    schema = Snapshot.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://gpudefrag.dev/schema/snapshot-v2.json"
    return schema


if __name__ == "__main__":  # regenerate the shipped schema
    if sys.argv[1:] == ["--schema"]:
        SCHEMA_PATH.write_text(json.dumps(json_schema(), indent=1, sort_keys=True) + "\n")
        print(SCHEMA_PATH)
