"""One entry point for every Kubernetes source: a dump file, a dump folder, or the live cluster."""

from __future__ import annotations

import os
from pathlib import Path

from ...core.model import ClusterState
from ...errors import InputError
from ...fileio import bulk_allocation
from ...snapshot import load_snapshot_dict, read_document
from .convert import KubeCluster, to_cluster
from .dump import KubeObjects as _Objs
from .dump import add_document, is_kube_document, load_objects


def load_dump(path: str | os.PathLike[str]) -> KubeCluster:
    """A `kubectl get ... -o json` dump (file or folder). Raises InputError naming the file and JSON path."""
    with bulk_allocation():
        return to_cluster(load_objects(path), strict=True)


def load_kube(source: str | os.PathLike[str] | None = None, *, live: bool = False,
              context: str | None = None) -> KubeCluster:
    """The live cluster when `live` (or a context is named), else the dump at `source`."""
    if live or context is not None:
        from .live import read_live

        return read_live(context)
    if source is None:
        raise InputError("(arguments)", "", "give a dump file or folder, or --kube for the live cluster")
    return load_dump(source)


def load_cluster_state(path: str | os.PathLike[str] | None, *, kube: bool = False,
                       context: str | None = None) -> ClusterState:
    """What `gpudefrag diagnose` reads: a gpudefrag snapshot, a Kubernetes dump (a `List` or a folder), or with
    `kube` the live cluster. The file is decoded once and dispatched on its shape."""
    if kube or context is not None:
        return load_kube(live=True, context=context).state
    if path is None:
        raise InputError("(arguments)", "", "give a snapshot or dump file, or --kube for the live cluster")
    p = Path(path)
    if p.is_dir():
        return load_dump(p).state
    with bulk_allocation():
        doc = read_document(p)
    if is_kube_document(doc):
        objs = _Objs(source=str(path))
        add_document(objs, doc, str(path))
        if not objs.nodes:
            raise InputError(str(path), "items", "holds no Node objects; dump with `kubectl get nodes,pods,"
                             "resourcequotas,poddisruptionbudgets,events,replicasets,jobs -A -o json`")
        with bulk_allocation():
            return to_cluster(objs, strict=True).state
    return load_snapshot_dict(doc, str(path))
