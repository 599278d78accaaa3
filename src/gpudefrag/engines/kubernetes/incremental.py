"""The live cluster model: the API objects the watches deliver, and their conversion kept current piece by piece.

A full conversion (convert.py `to_cluster`) of 5,000 nodes and 40,000 pods costs seconds; between two controller
cycles a handful of objects change. `LiveModel` holds each kind's objects as the watches last delivered them
(one store: the raw objects, which `PodInfo.raw` and `KubeCluster.raw_nodes` reference, not copy) and what each
converted to, and re-converts at the next `cluster()` only what a change can affect:

- a node: its own conversion — unless only what the conversion does not read changed (a heartbeat): then only
  the raw object is replaced; and the pods bound to it when what they read of it changed (`pods_read`: a pod's
  GPU indices are handed out in creation order among the pods of its node, and a pod takes its versions from
  its node), not when only its readiness, taints or labels did;
- a pod: the group of the node it is (or was) bound to, or itself when unbound; itself alone, keeping its GPUs,
  when what decides its GPUs did not change (`holding`: a readiness or container status change);
- DRA slices/claims: the nodes whose GPU inventory changed, the pods whose claims changed;
- scheduling events: the unbound pods whose newest event changed (bound pods do not read events);
- quotas, PDBs, the autoscaler's ConfigMap and the quota-refused controllers are small: rebuilt when changed.

Then the `ClusterState` is built from the converted nodes and workloads in the order a conversion from scratch
gives (nodes by name, pods by creation time and name): the same objects, not copies. tests/kubernetes/
test_incremental.py applies random churn and compares every cycle with `to_cluster` of the same objects.

Not thread-safe on its own: the watch cache (watch.py) serialises `apply`/`replace`/`cluster` under its lock.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ...core.model import ClusterState, Node, Workload
from ...errors import InputError
from ...fileio import bulk_allocation
from .access import At
from .convert import (
    EventInfo,
    KubeCluster,
    PodInfo,
    _Builder,
    _event,
    _owners,
    _OwnerState,
    _pod,
    finish,
    holding,
    latest_events,
    node_from,
    pod_order,
    pods_read,
)
from .dra import DraInventory, read_dra
from .dump import KubeObjects

_DONE = ("Succeeded", "Failed")


def key_of(obj: Mapping[str, Any]) -> str:
    """namespace/name: how a store keys an object (a list's etcd order is this key's order)."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def _bound_to(pod: Mapping[str, Any] | None) -> str | None:
    if pod is None:
        return None
    return (pod.get("spec") or {}).get("nodeName") or None


def _pod_signal(pod: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a pod can change a decision: where it runs, its phase, what the scheduler says about it."""
    status = pod.get("status") or {}
    sched = next((c for c in status.get("conditions") or [] if isinstance(c, dict)
                  and c.get("type") == "PodScheduled"), {})
    return (_bound_to(pod), status.get("phase"), sched.get("status"), sched.get("message"),
            (pod.get("metadata") or {}).get("deletionTimestamp"))


def node_ready(node: Mapping[str, Any]) -> Any:
    """The status of a Node object's Ready condition (None: it has none)."""
    return next((c.get("status") for c in (node.get("status") or {}).get("conditions") or []
                 if isinstance(c, dict) and c.get("type") == "Ready"), None)


def node_signal(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """Everything of a node its conversion reads (labels, spec, capacity, readiness, nodeInfo): not its
    heartbeats, which KWOK and kubelets write every few seconds on every node."""
    meta, status = node.get("metadata") or {}, node.get("status") or {}
    return (meta.get("labels"), node.get("spec"), status.get("capacity"), status.get("allocatable"),
            node_ready(node), status.get("nodeInfo"))


@dataclass(slots=True)
class _Converted:
    """One pod's conversion: its place in the conversion order, what it became, what it warned."""

    order: tuple[float, str, str]
    workload: Workload | None
    info: PodInfo | None
    warnings: tuple[str, ...]


class LiveModel:
    """See the module docstring. `feeds` are (feed name, kind) in the order a full read lists them; events may
    come from several feeds (one per reason)."""

    def __init__(self, where: str, feeds: Iterable[tuple[str, str]] = ()) -> None:
        self.where = where
        self.source = f"cluster ({where})"
        self.kinds: dict[str, str] = {}
        self.raw: dict[str, dict[str, dict[str, Any]]] = {}
        for name, kind in feeds:
            self.add_feed(name, kind)
        self._dra = DraInventory()
        self._latest: dict[tuple[str, str, str], EventInfo] = {}
        self._events: list[EventInfo] = []
        self._owners: dict[tuple[str, str, str], _OwnerState] | None = None
        self._event_conv: dict[tuple[str, str], tuple[dict[str, Any], EventInfo]] = {}
        self._nodes: dict[str, Node] = {}
        self._raw_nodes: dict[str, dict[str, Any]] = {}
        self._on: dict[str, set[str]] = {}  # node name -> keys of the pods bound to it
        self._claimers: set[str] = set()  # pods with DRA claims
        self._pods: dict[str, _Converted] = {}
        # the workloads in the conversion order (pods by creation time, name, key), kept sorted as pods come,
        # change and go, beside their (creation time, name, key): a rebuild of the ordered list of 40,000 every
        # cycle a pod changed was a third of a warm cycle at 5,000 nodes; the pod infos by workload id, and the
        # warnings of the (few) pods that warned, by key
        self._order: list[tuple[float, str, str]] = []
        self._workloads: list[Workload] = []
        self._infos: dict[str, PodInfo] = {}
        self._warned: dict[str, tuple[tuple[float, str, str], tuple[str, ...]]] = {}
        # the last state built: the next one carries its unchanged workloads' columns and filter verdicts over
        # (`ClusterState.build(previous=...)`) instead of gathering and checking 40,000 workloads again
        self._state: ClusterState | None = None
        self._dirty_nodes: set[str] = set()  # nodes to convert again
        self._dirty_groups: set[str] = set()  # nodes whose pods to convert again
        self._dirty_alone: set[str] = set()  # bound pods to convert again alone, keeping their GPUs
        self._dirty_pending: set[str] = set()
        self._dirty_kinds: set[str] = set()
        self.conversions = 0  # nodes and pods converted so far (what the property test and benchmark read)

    def add_feed(self, name: str, kind: str) -> None:
        """A kind the model follows from now on (DRA, when the API begins to serve it)."""
        if name not in self.raw:
            self.kinds[name] = kind
            self.raw[name] = {}

    def _feeds(self, kind: str) -> list[str]:
        return [n for n, k in self.kinds.items() if k == kind]

    # ------------------------------------------------------------------ changes
    def replace(self, feed: str, items: Iterable[dict[str, Any]]) -> bool:
        """A (re)list of one feed: its objects now. Applied as the changes against what it held; True when any
        of them matters to a decision."""
        new = {key_of(o): o for o in items}
        wake = False
        for k in [k for k in self.raw[feed] if k not in new]:
            wake |= self.apply(feed, "DELETED", self.raw[feed][k])
        for k, o in new.items():
            old = self.raw[feed].get(k)
            if old is None or (old is not o and _rv(old) != _rv(o)) or not _rv(o):
                wake |= self.apply(feed, "MODIFIED", o)
        return wake

    def apply(self, feed: str, typ: str, obj: dict[str, Any]) -> bool:
        """One watch event (ADDED / MODIFIED / DELETED). True when it can change a decision: a pod created,
        bound, finished or deleted, a node's capacity, labels, taints or readiness, any quota, PDB, DRA object,
        scheduling event or autoscaler status — not a node's heartbeat or a running pod's status details."""
        kind = self.kinds[feed]
        k = key_of(obj)
        store = self.raw[feed]
        old = store.get(k)
        new: dict[str, Any] | None
        if typ == "DELETED":
            store.pop(k, None)
            new = None
        else:
            store[k] = obj
            new = obj
        if kind == "Pod":
            return self._pod_changed(k, old, new)
        if kind == "Node":
            name = (obj.get("metadata") or {}).get("name") or ""
            if old is not None and new is not None and name in self._raw_nodes and name not in self._dirty_nodes \
                    and node_signal(old) == node_signal(new):
                self._raw_nodes[name] = new  # a heartbeat: the same conversion; only the raw object is newer
                return False
            self._dirty_nodes.add(name)
            return old is None or new is None or node_signal(old) != node_signal(new)
        if kind in ("ResourceSlice", "ResourceClaim"):
            self._dirty_kinds.add("dra")
        elif kind == "Event":
            self._dirty_kinds.add("events")
        elif kind in ("ReplicaSet", "Job"):
            self._dirty_kinds.add("owners")
        return True  # quotas, PDBs, the ConfigMap: rebuilt every cycle (few objects)

    def _pod_changed(self, k: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
        was, now = _bound_to(old), _bound_to(new)
        if old is not None and new is not None and was is not None and was == now and holding(old) == holding(new):
            self._dirty_alone.add(k)
            return _pod_signal(old) != _pod_signal(new)
        if was is not None:
            self._on.get(was, set()).discard(k)
            self._dirty_groups.add(was)
        if now is not None and new is not None:
            self._on.setdefault(now, set()).add(k)
            self._dirty_groups.add(now)
        if was is None or now is None:
            self._dirty_pending.add(k)
        if new is None:
            self._forget(k)
            self._claimers.discard(k)
        elif (new.get("spec") or {}).get("resourceClaims"):
            self._claimers.add(k)
        else:
            self._claimers.discard(k)
        if old is None or new is None:
            return True
        return _pod_signal(old) != _pod_signal(new)

    # ------------------------------------------------------------------ the cycle's read
    def _at(self, feed: str, k: str, obj: dict[str, Any]) -> At:
        return At(obj, feed, f"items[{k}]")

    def _ats(self, kind: str) -> list[At]:
        return [self._at(f, k, self.raw[f][k]) for f in self._feeds(kind) for k in sorted(self.raw[f])]

    def _refresh_dra(self) -> None:
        inv = read_dra(self._ats("ResourceSlice"), self._ats("ResourceClaim"))
        old = self._dra
        for attr in ("gpus_by_node", "mig_by_node", "product_by_node"):
            a, b = getattr(old, attr), getattr(inv, attr)
            self._dirty_nodes.update(n for n in a.keys() | b.keys() if a.get(n) != b.get(n))
        if inv.claim_gpus != old.claim_gpus:
            self._touch_pods(self._claimers)
        self._dra = inv

    def _touch_pods(self, keys: Iterable[str]) -> None:
        pods = self._feeds("Pod")
        for k in keys:
            obj = next((self.raw[f][k] for f in pods if k in self.raw[f]), None)
            node = _bound_to(obj)
            if node is not None:
                self._dirty_groups.add(node)
            elif obj is not None:
                self._dirty_pending.add(k)

    def _refresh_events(self) -> None:
        events: list[EventInfo] = []
        conv: dict[tuple[str, str], tuple[dict[str, Any], EventInfo]] = {}
        for f in self._feeds("Event"):
            store = self.raw[f]
            for k in sorted(store):
                obj = store[k]
                hit = self._event_conv.get((f, k))
                e = hit[1] if hit is not None and hit[0] is obj else _event(self._at(f, k, obj))
                conv[(f, k)] = (obj, e)
                events.append(e)
        latest = latest_events(events)
        old = self._latest
        self._touch_pods(key[0] for key in old.keys() | latest.keys()
                         if key[1] == "Pod" and old.get(key) != latest.get(key))
        self._events, self._event_conv, self._latest = events, conv, latest

    def _convert_pods(self, b: _Builder, keys: Iterable[str], nodes: Mapping[str, Node]) -> None:
        pods = self._feeds("Pod")
        parsed = []
        for k in keys:
            obj = next((self.raw[f][k] for f in pods if k in self.raw[f]), None)
            if obj is None:
                continue
            at = self._at("pods", k, obj)
            created, name, meta = pod_order(at)
            parsed.append((created, name, k, at, meta))
        parsed.sort(key=lambda t: (t[0], t[1], t[2]))
        for created, name, k, at, meta in parsed:
            before = len(b.warnings)
            w, info = _pod(b, at, meta, created, nodes, self._dra, self._latest)
            old = self._pods.get(k)
            if old is not None:
                self._unlist(old)
            c = self._pods[k] = _Converted((created, name, k), w, info, tuple(b.warnings[before:]))
            self._list(c)
            self.conversions += 1

    def _forget(self, k: str) -> None:
        """A pod gone: out of the converted pods and the ordered lists."""
        old = self._pods.pop(k, None)
        if old is not None:
            self._unlist(old)

    def _list(self, c: _Converted) -> None:
        """Into the ordered lists `cluster()` hands on."""
        if c.workload is not None and c.info is not None:
            i = bisect.bisect_left(self._order, c.order)
            self._order.insert(i, c.order)
            self._workloads.insert(i, c.workload)
            self._infos[c.workload.id] = c.info
        if c.warnings:
            self._warned[c.order[2]] = (c.order, c.warnings)

    def _unlist(self, c: _Converted) -> None:
        if c.workload is not None and c.info is not None:
            i = bisect.bisect_left(self._order, c.order)
            assert i < len(self._order) and self._order[i] == c.order, "the conversion order lost a pod"
            del self._order[i], self._workloads[i]
            self._infos.pop(c.workload.id, None)
        self._warned.pop(c.order[2], None)

    def _refresh_node(self, name: str) -> bool:
        """Convert one node again; True when its pods must be converted again too."""
        obj = next((self.raw[f][f"/{name}"] for f in self._feeds("Node") if f"/{name}" in self.raw[f]), None)
        before = self._nodes.get(name)
        if obj is None:
            self._nodes.pop(name, None)
            self._raw_nodes.pop(name, None)
        else:
            self._nodes[name] = node_from(self._at("nodes", f"/{name}", obj), self._dra)
            self._raw_nodes[name] = obj
            self.conversions += 1
        after = self._nodes.get(name)
        return before is None or after is None or pods_read(before) != pods_read(after)

    def _convert_group(self, name: str) -> None:
        """The pods bound to a node, in creation order, each handed its GPUs after the ones before it."""
        node = self._nodes.get(name)
        self._convert_pods(_Builder(None, strict=False), sorted(self._on.get(name, ())),  # type: ignore[arg-type]
                           {name: node} if node is not None else {})

    def _convert_alone(self, k: str, name: str) -> bool:
        """A pod bound to node `name` whose GPUs cannot have changed (`holding`), converted again alone and
        handed the GPUs it held; False when it must go with its node's group (it held none: skipped, finished)."""
        node, old = self._nodes.get(name), self._pods.get(k)
        if node is None or old is None or old.workload is None or not old.workload.placements:
            return False
        b = _Builder(None, strict=False)  # type: ignore[arg-type]
        b.used[name] = set(range(node.gpu_count)) - set(old.workload.placements[0].gpus)
        self._convert_pods(b, (k,), {name: node})
        return True

    def cluster(self, now: float, warnings: Iterable[str] = (), notes: Iterable[str] = ()) -> KubeCluster:
        """The `KubeCluster` now: what changed since the last call converted, the rest reused. A conversion
        error (a malformed object) raises `InputError` and leaves the change marked, so the next call tries
        again; the objects themselves stay as delivered."""
        with bulk_allocation():
            if "dra" in self._dirty_kinds:
                self._refresh_dra()
                self._dirty_kinds.discard("dra")
            if "events" in self._dirty_kinds:
                self._refresh_events()
                self._dirty_kinds.discard("events")
            if "owners" in self._dirty_kinds or self._owners is None:
                objs = KubeObjects(self.source, replicasets=self._ats("ReplicaSet"), jobs=self._ats("Job"),
                                   owners_listed={"ReplicaSet", "Job"} <= set(self.kinds.values()))
                self._owners = _owners(objs)
                self._dirty_kinds.discard("owners")
            for name in sorted(self._dirty_nodes):
                if self._refresh_node(name):
                    self._dirty_groups.add(name)
                self._dirty_nodes.discard(name)
            for k in sorted(self._dirty_alone):
                node = _bound_to(self._pod_raw(k))
                if node is not None and node not in self._dirty_groups and not self._convert_alone(k, node):
                    self._dirty_groups.add(node)
                self._dirty_alone.discard(k)
            for name in sorted(self._dirty_groups):
                self._convert_group(name)
                self._dirty_groups.discard(name)
            pending = [k for k in self._dirty_pending if _bound_to(self._pod_raw(k)) is None]
            for k in self._dirty_pending:
                if self._pod_raw(k) is None:
                    self._forget(k)
            self._convert_pods(_Builder(None, strict=False), pending, {})  # type: ignore[arg-type]
            self._dirty_pending.clear()
            if not self._nodes:
                raise InputError("cluster", self.where, "the cluster reports no nodes")
            # finish() copies what it adds to, so the lists stay the model's
            warned = [w for _, ws in sorted(self._warned.values()) for w in ws]
            nodes = [self._nodes[n] for n in sorted(self._nodes)]
            cluster = finish(self.source, nodes, self._workloads, self._infos, self._latest, self._ats("ResourceQuota"),
                             self._ats("PodDisruptionBudget"), self._ats("ConfigMap"), self._events, warned,
                             now=now, ignored={}, raw_nodes=self._raw_nodes, owners=self._owners,
                             previous=self._state)
            self._state = cluster.state
        extra, said = tuple(warnings), tuple(dict.fromkeys(notes))
        if extra or said:
            cluster = dataclasses.replace(cluster, warnings=cluster.warnings + extra, notes=said)
        return cluster

    def _pod_raw(self, k: str) -> dict[str, Any] | None:
        return next((self.raw[f][k] for f in self._feeds("Pod") if k in self.raw[f]), None)


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")
