"""Read a live cluster with the official client (kubeconfig, or in-cluster when run as a pod).

Every list is made with `_preload_content=False`: the server's JSON is parsed as is (not the client's model
objects) and goes through the same converter as an offline dump, so both sources give the same `ClusterState`.
Optional parts (PDBs, the scheduling events, the autoscaler status ConfigMap, DRA) are skipped when forbidden
or not served; a warning says so. `read_live` lists everything once and converts it from scratch (`gpudefrag
diagnose --kube`); a long-lived process (the controller) keeps the same lists current with watches instead and
converts only what changed (watch.py, `WatchCache`; incremental.py, `LiveModel`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import InputError
from ...fileio import bulk_allocation
from .convert import KubeCluster, to_cluster
from .dump import objects_from_documents

# Events that carry scheduling evidence; listing only these keeps the read small on busy clusters.
EVENT_REASONS = ("FailedScheduling", "NotTriggerScaleUp", "FailedCreate")
AUTOSCALER_STATUS = ("kube-system", "cluster-autoscaler-status")


def api_client(context: str | None = None) -> Any:
    """An ApiClient from the in-cluster service account (when inside a pod and no context is named) or the
    kubeconfig. Raises InputError when neither works."""
    from kubernetes import client, config

    try:
        if context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
            return client.ApiClient()
        # $KUBECONFIG as it is now: the client reads it once, when it is imported
        return config.new_client_from_config(config_file=os.environ.get("KUBECONFIG") or None, context=context)
    except Exception as e:  # the client raises ConfigException, FileNotFoundError, ...
        raise InputError("kubeconfig", f"context {context}" if context else "", f"cannot load: {e}") from None


@dataclass(frozen=True)
class Source:
    """One list the live read makes. `fn` is the client's list function, which also watches (`watch=True`);
    `optional`: a 403/404 only skips it, with a warning."""

    name: str
    kind: str
    fn: Callable[..., Any]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    optional: bool = False


def sources(api: Any) -> list[Source]:
    """What a cycle reads, besides DRA (`dra_sources`) and the autoscaler's ConfigMap (`autoscaler_source`)."""
    from kubernetes import client

    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    apps, batch = client.AppsV1Api(api), client.BatchV1Api(api)
    return [
        Source("nodes", "Node", core.list_node),
        Source("pods", "Pod", core.list_pod_for_all_namespaces),
        Source("resourcequotas", "ResourceQuota", core.list_resource_quota_for_all_namespaces),
        Source("poddisruptionbudgets", "PodDisruptionBudget", policy.list_pod_disruption_budget_for_all_namespaces,
               optional=True),
        *(Source(f"events {r}", "Event", core.list_event_for_all_namespaces, {"field_selector": f"reason={r}"},
                 optional=True) for r in EVENT_REASONS),
        # the owners a FailedCreate event names: the event counts only while its owner exists and lacks pods
        Source("replicasets", "ReplicaSet", apps.list_replica_set_for_all_namespaces, optional=True),
        Source("jobs", "Job", batch.list_job_for_all_namespaces, optional=True),
    ]


def dra_sources(api: Any) -> list[tuple[Source, Source]]:
    """(resourceslices, resourceclaims) for each DRA API version the client knows, newest first: the first that
    the server answers is used."""
    from kubernetes import client

    out = []
    for version in ("ResourceV1Api", "ResourceV1beta1Api"):
        cls = getattr(client, version, None)
        if cls is not None:
            res = cls(api)
            out.append((Source("resourceslices", "ResourceSlice", res.list_resource_slice, optional=True),
                        Source("resourceclaims", "ResourceClaim", res.list_resource_claim_for_all_namespaces,
                               optional=True)))
    return out


class Caller:
    """Make API calls for one read: failures become one InputError naming the context and the call; an optional
    part that is absent or forbidden (403/404) gives None and a warning."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.warnings: list[str] = []
        self.notes: list[str] = []  # what is absent by design (no autoscaler): said once, not warned about

    def __call__(self, what: str, fn: Callable[[], Any], optional: bool = False, absent: str | None = None) -> Any:
        from kubernetes.client.rest import ApiException

        try:
            return fn()
        except ApiException as e:
            if optional and e.status == 404 and absent is not None:
                self.notes.append(absent)
                return None
            if optional and e.status in (403, 404):
                self.warnings.append(f"{what}: HTTP {e.status}; skipped")
                return None
            raise InputError("cluster", self.where, f"{what}: HTTP {e.status} {e.reason}") from None
        except Exception as e:  # urllib3 connection errors and the like
            raise InputError("cluster", self.where, f"{what}: {e}") from None

    def list(self, src: Source) -> tuple[list[dict[str, Any]], str] | None:
        """(items with their kind, the list's resourceVersion), or None for a skipped optional part. Parsed from
        the server's JSON: measured against a real API server, building the client's model objects and
        serialising them back cost ~8 s of CPU for 7,000 pods; json.loads costs a fraction of that."""
        resp = self(f"list {src.name}", lambda: src.fn(_preload_content=False, **src.kwargs), src.optional)
        if resp is None:
            return None
        with bulk_allocation():
            doc = json.loads(resp.data)
        items = list(doc.get("items") or [])
        for it in items:
            it.setdefault("kind", src.kind)  # list items carry no kind; a watch event's object does
        return items, str((doc.get("metadata") or {}).get("resourceVersion") or "")


def assemble(lists: list[tuple[Source, list[dict[str, Any]]]], call: Caller, now: float) -> KubeCluster:
    """The `KubeCluster` of what was read, converted from scratch."""
    docs: list[tuple[str, Any]] = [(s.name, {"apiVersion": "v1", "kind": "List", "items": items})
                                   for s, items in lists]
    objs = objects_from_documents(docs, f"cluster ({call.where})")
    objs.owners_listed = {"ReplicaSet", "Job"} <= {s.kind for s, _ in lists}
    if not objs.nodes:
        raise InputError("cluster", call.where, "the cluster reports no nodes")
    with bulk_allocation():  # as for a dump: measured, the collector's passes cost as much as the conversion
        cluster = to_cluster(objs, now=now, strict=False)
    notes = call.notes + absence_notes([(s.kind, items) for s, items in lists])
    if call.warnings or notes:
        cluster = dataclasses.replace(cluster, warnings=cluster.warnings + tuple(call.warnings),
                                      notes=tuple(dict.fromkeys(notes)))
    return cluster


def absence_notes(lists: list[tuple[str, Any]]) -> list[str]:
    """What is absent by design, from (kind, items) of what was listed: the autoscaler's status ConfigMap listed
    and not there means the cluster runs no cluster-autoscaler — a note, not a warning on every cycle."""
    ns, name = AUTOSCALER_STATUS
    if any(kind == "ConfigMap" and not items for kind, items in lists):
        return [f"no cluster-autoscaler (no {ns}/{name} ConfigMap): node groups are not known"]
    return []


def autoscaler_source(api: Any) -> Source:
    """The autoscaler's status ConfigMap as a list narrowed to its one name, which a watch can follow (RBAC
    grants list/watch on that one name: a request with the `metadata.name` field selector is authorised by it)."""
    from kubernetes import client

    ns, name = AUTOSCALER_STATUS
    return Source("configmap", "ConfigMap", client.CoreV1Api(api).list_namespaced_config_map,
                  {"namespace": ns, "field_selector": f"metadata.name={name}"}, optional=True)


def list_dra(api: Any, call: Caller) -> list[tuple[Source, list[dict[str, Any]], str]]:
    """The DRA kinds of the newest API version the server answers; [] when it serves none (yet)."""
    for slices, claims in dra_sources(api):
        got = call.list(slices)
        if got is None:
            continue
        out = [(slices, *got)]
        got = call.list(claims)
        if got is not None:
            out.append((claims, *got))
        return out
    return []


def list_all(api: Any, call: Caller, extra: list[Source] | None = None) -> list[tuple[Source, list[dict[str, Any]],
                                                                                    str]]:
    """List every source once: (source, items, resourceVersion); skipped optional parts are left out."""
    out = []
    for src in [*sources(api), *(extra or [])]:
        got = call.list(src)
        if got is not None:
            out.append((src, *got))
    return out + list_dra(api, call)


def where_of(context: str | None) -> str:
    return f"context {context}" if context else "current context"


def read_live(context: str | None = None, *, api: Any = None, now: Callable[[], float] = time.time) -> KubeCluster:
    """Observe the cluster now, with one list of each kind. Network/API failures become an InputError naming
    the context and the call."""
    api = api or api_client(context)
    call = Caller(where_of(context))
    lists = [(src, items) for src, items, _rv in list_all(api, call, [autoscaler_source(api)])]
    return assemble(lists, call, now())
