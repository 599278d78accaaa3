"""The Kubernetes engine: read a live cluster or a `kubectl get ... -o json` dump into a `ClusterState`,
diagnose pending GPU pods with the scheduler's own messages as evidence, and move pods with their state as a
checked list of API operations. See docs/kubernetes.md."""

from __future__ import annotations

from .convert import KubeCluster, PdbInfo, PodInfo, to_cluster
from .diagnosis import KubeDiagnosis, diagnose_kube
from .dump import KubeObjects, is_kube_document, is_kube_dump, load_objects
from .engine import KubernetesEngine
from .executor import ApiError, ClientKubeApi, KubeApi, MoveResult, SequenceRunner
from .load import load_cluster_state, load_dump, load_kube
from .memory_api import InMemoryApi
from .moves import MoveOptions, MoveSequence, Op, OpKind, SimpleMove, build_move, build_moves

__all__ = [
    "ApiError",
    "ClientKubeApi",
    "InMemoryApi",
    "KubeApi",
    "KubeCluster",
    "KubeDiagnosis",
    "KubeObjects",
    "KubernetesEngine",
    "MoveOptions",
    "MoveResult",
    "MoveSequence",
    "Op",
    "OpKind",
    "PdbInfo",
    "PodInfo",
    "SequenceRunner",
    "SimpleMove",
    "build_move",
    "build_moves",
    "diagnose_kube",
    "is_kube_document",
    "is_kube_dump",
    "load_cluster_state",
    "load_dump",
    "load_kube",
    "load_objects",
    "to_cluster",
]
