"""Builders for small hand-made clusters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpudefrag.core.model import ClusterState
from gpudefrag.snapshot import load_snapshot_dict


def node(name: str, gpus: int = 8, **kw: Any) -> dict[str, Any]:
    return {"name": name, "gpus": gpus, "gpu_model": kw.pop("gpu_model", "H100"), **kw}


def job(jid: str, gpus: int, on: str | None = None, **kw: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"id": jid, "gpus_per_node": gpus, **kw}
    if on is None:
        d["state"] = "pending"
    else:
        d["placements"] = [{"node": on}]
    return d


def build(nodes: list[dict[str, Any]], workloads: list[dict[str, Any]], **extra: Any) -> ClusterState:
    return load_snapshot_dict({"nodes": nodes, "workloads": workloads, **extra}, "<test>")


@pytest.fixture
def make() -> Callable[..., ClusterState]:
    return build
