"""Read an offline dump: what `kubectl get nodes,pods,resourcequotas,poddisruptionbudgets,events,replicasets,jobs
-A -o json` prints (a `List`), one such file or a folder of them (`*.json`, `*.yaml`), into the API objects
grouped by kind.

The live reader produces the same `KubeObjects`, so both sources go through one converter (`convert.py`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import InputError
from ...snapshot import read_document
from .access import At

# kind -> field of KubeObjects. Other kinds in a dump (Services, Deployments, ...) are ignored.
KINDS = {
    "Node": "nodes",
    "Pod": "pods",
    "ResourceQuota": "quotas",
    "PodDisruptionBudget": "pdbs",
    "Event": "events",
    "ConfigMap": "configmaps",
    "ResourceSlice": "resource_slices",
    "ResourceClaim": "resource_claims",
    "ReplicaSet": "replicasets",
    "Job": "jobs",
}
DUMP_SUFFIXES = (".json", ".yaml", ".yml")


@dataclass
class KubeObjects:
    """The API objects of one cluster, each with its file and JSON path (for error messages)."""

    source: str
    nodes: list[At] = field(default_factory=list)
    pods: list[At] = field(default_factory=list)
    quotas: list[At] = field(default_factory=list)
    pdbs: list[At] = field(default_factory=list)
    events: list[At] = field(default_factory=list)
    configmaps: list[At] = field(default_factory=list)
    resource_slices: list[At] = field(default_factory=list)
    resource_claims: list[At] = field(default_factory=list)
    replicasets: list[At] = field(default_factory=list)
    jobs: list[At] = field(default_factory=list)
    ignored: dict[str, int] = field(default_factory=dict)
    # the owners (ReplicaSets, Jobs) were listed, even if none exist: a `FailedCreate` event then counts only
    # while its owner exists and still lacks pods. A dump that holds neither kind cannot say, and is trusted.
    owners_listed: bool = False

    @property
    def owners_known(self) -> bool:
        return self.owners_listed or bool(self.replicasets or self.jobs)

    def add(self, item: At) -> None:
        kind = item.text("kind")
        if not kind:
            raise item.error("required field is missing", "kind")
        name = KINDS.get(kind)
        if name is None:
            self.ignored[kind] = self.ignored.get(kind, 0) + 1
            return
        getattr(self, name).append(item)


def is_kube_document(doc: Any) -> bool:
    """A Kubernetes List (`kind: List` or `NodeList`, ... with `items`) or a single API object."""
    if not isinstance(doc, dict):
        return False
    kind = doc.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and "items" in doc:
        return True
    return isinstance(kind, str) and "apiVersion" in doc and kind in KINDS


def is_kube_dump(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a folder or a file holding a Kubernetes List: the hook `gpudefrag diagnose` uses."""
    p = Path(path)
    if p.is_dir():
        return True
    if not p.is_file():
        return False
    try:
        doc = read_document(p)
    except InputError:
        return False
    return is_kube_document(doc)


def add_document(objs: KubeObjects, doc: Any, source: str) -> None:
    """Add one decoded document: a List of objects or a single object."""
    top = At(doc, source, "")
    if not isinstance(doc, dict):
        raise InputError(source, "(document)", "expected a Kubernetes List or object (kubectl get ... -o json)")
    kind = top.text("kind")
    if not kind:
        raise InputError(source, "kind", "required field is missing: not a Kubernetes List or object")
    if kind.endswith("List"):
        items = top.objects("items", required=True)
        item_kind = kind[: -len("List")]
        for it in items:
            if item_kind and "kind" not in it.value:
                it.value["kind"] = item_kind  # typed lists (NodeList) may omit the item kind
            objs.add(it)
    else:
        objs.add(top)


def load_objects(path: str | os.PathLike[str]) -> KubeObjects:
    """Read a dump file or folder. Raises InputError naming the file and the JSON path."""
    p = Path(path)
    objs = KubeObjects(source=str(path))
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in DUMP_SUFFIXES)
        if not files:
            raise InputError(str(path), "", "folder holds no .json/.yaml dump files")
        for f in files:
            add_document(objs, read_document(f), str(f))
    else:
        add_document(objs, read_document(p), str(path))
    if not objs.nodes:
        raise InputError(str(path), "items", "holds no Node objects; dump with `kubectl get nodes,pods,resourcequotas,"
                         "poddisruptionbudgets,events,replicasets,jobs -A -o json`")
    return objs


def objects_from_documents(docs: list[tuple[str, Any]], source: str) -> KubeObjects:
    """Group already-decoded documents (the live reader's lists, or a test's dicts)."""
    objs = KubeObjects(source=source)
    for src, doc in docs:
        add_document(objs, doc, src)
    return objs
