"""Builders for hand-made planner clusters: nodes, jobs with checkpoint sizes in GiB (the CLI runner is the
suite's `cli` fixture)."""

from __future__ import annotations

from typing import Any

import pytest

from gpudefrag.core.model import ClusterState
from gpudefrag.snapshot import load_snapshot_dict

GIB = 1 << 30
NOW = 1_000_000.0
H100 = {"gpu_model": "H100", "driver": "550.54.15", "cuda": "12.4", "cpu_arch": "x86_64"}


def node(name: str, gpus: int = 8, **kw: Any) -> dict[str, Any]:
    return {"name": name, "gpus": gpus, "gpu_model": "H100", "driver_version": "550.54.15",
            "cuda_version": "12.4", "cpu_arch": "x86_64", **kw}


def job(jid: str, gpus: int, on: str | list[str] | None = None, *, gib: float = 1.0, age: float = 0.0,
        **kw: Any) -> dict[str, Any]:
    """A running job on `on` (several nodes: a multi-node job) with a checkpoint of `gib` GiB taken `age`
    seconds ago; a pending one when `on` is None."""
    d: dict[str, Any] = {"id": jid, "gpus_per_node": gpus, "checkpoint_bytes": int(gib * GIB),
                         "last_checkpoint_at": NOW - age, "started_at": NOW - 36_000, "versions": dict(H100), **kw}
    if on is None:
        d["state"] = "pending"
        d.pop("last_checkpoint_at")
    elif isinstance(on, list):
        d["node_count"] = len(on)
        d["placements"] = [{"node": n} for n in on]
    else:
        d["placements"] = [{"node": on}]
    return d


def build(nodes: list[dict[str, Any]], workloads: list[dict[str, Any]]) -> ClusterState:
    return load_snapshot_dict({"nodes": nodes, "workloads": workloads, "now": NOW}, "<test>")


class Builders:
    """The helpers above, handed to tests as the `pb` fixture (test modules cannot import conftest)."""

    GIB = GIB
    NOW = NOW
    node = staticmethod(node)
    job = staticmethod(job)
    build = staticmethod(build)


@pytest.fixture
def pb() -> type[Builders]:
    return Builders
