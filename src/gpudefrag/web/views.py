"""What the dashboard shows, as plain JSON-ready dicts computed from a ClusterState.

Kept apart from the HTTP layer so the same numbers feed the pages, the JSON API, `/metrics` and the tests.
The map is sent compactly (one list per GPU of [workload id, milli] shares) because a 1,000-node cluster has
8,000+ cells; the page colours a cell by a hash of the workload id, so before/after maps agree on colours.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..core.diagnose import Diagnosis, diagnose_all
from ..core.fragmentation import fits_mask, frag_report, stranded, whole_free_counts, whole_free_node_mask
from ..core.model import MILLI, ClusterState, Request, Workload

SortKey = Literal["name", "free", "stranded", "used"]
Only = Literal["all", "stranded", "fits", "busy", "free"]


def largest_pending_request(state: ClusterState) -> Request | None:
    """The pending GPU request with the most GPUs (oldest first on ties): the one whose stranded GPUs the map
    highlights."""
    best: Request | None = None
    for w in state.pending:
        r = w.request
        if r.gpus_per_node == 0:
            continue
        if best is None or (r.gpus_per_node, r.gpus_total) > (best.gpus_per_node, best.gpus_total):
            best = r
    return best


def map_request(state: ClusterState, gpus: int | None = None) -> Request:
    """The request shape the map highlights stranded GPUs for: `gpus` if given, else the largest pending,
    else a whole node of the largest size."""
    if gpus is not None:
        return Request(gpus_per_node=gpus)
    return largest_pending_request(state) or Request(gpus_per_node=max(state.max_gpus, 1))


def workload_info(w: Workload) -> dict[str, Any]:
    r = w.request
    return {
        "id": w.id,
        "name": w.name or w.id,
        "namespace": w.namespace,
        "state": w.state.value,
        "gpus_per_node": r.gpus_per_node,
        "node_count": r.node_count,
        "gpu_milli": r.gpu_milli,
        "request": r.label(),
        "nodes": list(w.nodes()),
        "checkpoint_bytes": w.checkpoint_bytes,
        "last_checkpoint_at": w.last_checkpoint_at,
        "priority": w.priority,
    }


def summary(state: ClusterState, request: Request | None = None) -> dict[str, Any]:
    """The headline numbers: free GPUs, whole-free nodes, stranded GPUs and FGD for the highlighted request."""
    request = request or map_request(state)
    rep = frag_report(state, request)
    return {
        "cluster": state.name,
        "now": state.now,
        "nodes": rep.nodes,
        "gpus": rep.gpus,
        "free_gpus": rep.free_gpus,
        "free_gpu_share": rep.free_milli / MILLI,
        "whole_free_nodes": rep.whole_free_nodes,
        "request": request.label(),
        "request_gpus_per_node": request.gpus_per_node,
        "nodes_fitting_request": rep.nodes_fitting,
        "stranded_gpus": rep.stranded_gpus,
        "largest_placeable": rep.largest_placeable,
        "fgd_ratio": rep.fgd_ratio,
        "running": len(state.running),
        "pending": len(state.pending_gpu),  # GPU jobs only, as the pending list shows
        "models": sorted({n.gpu_model or "unknown" for n in state.nodes}),
    }


@dataclass(frozen=True)
class MapQuery:
    """Filter, sort and page the map rows (the page asks for a slice when the cluster is large)."""

    gpus: int | None = None  # request shape to highlight stranded GPUs for (default: largest pending)
    model: str | None = None
    q: str | None = None  # substring of a node name or of a workload id on the node
    only: Only = "all"
    sort: SortKey = "name"
    offset: int = 0
    limit: int = 500


def _cells(state: ClusterState, i: int, owners: dict[tuple[int, int], list[list[Any]]]) -> list[dict[str, Any]]:
    free = state.free_milli[i]
    out = []
    for g in range(state.nodes[i].gpu_count):
        f = int(free[g]) if g < free.shape[0] else -1
        out.append({"free_milli": f, "shares": owners.get((i, g), [])})
    return out


def _owners(state: ClusterState, rows: Iterable[int]) -> dict[tuple[int, int], list[list[Any]]]:
    wanted = set(rows)
    idx = state.node_index
    owners: dict[tuple[int, int], list[list[Any]]] = {}
    for w in state.running:
        for p in w.placements:
            i = idx[p.node]
            if i not in wanted:
                continue
            for g in p.gpus:
                owners.setdefault((i, g), []).append([w.id, w.request.gpu_milli])
    return owners


def node_rows(
    state: ClusterState, indices: Iterable[int], request: Request, fits: np.ndarray | None = None
) -> list[dict[str, Any]]:
    """One row per node: its GPUs (cells), free count and whether its free GPUs are stranded for `request`."""
    idx = list(indices)
    fits = fits_mask(state, request) if fits is None else fits
    whole = whole_free_counts(state)
    owners = _owners(state, idx)
    rows = []
    for i in idx:
        n = state.nodes[i]
        node_fits = bool(fits[i])
        rows.append(
            {
                "name": n.name,
                "model": n.gpu_model or "unknown",
                "gpus": n.gpu_count,
                "usable": n.usable_gpus,
                "schedulable": n.schedulable,
                "free_gpus": int(whole[i]),
                "fits": node_fits,
                "stranded_gpus": 0 if node_fits else int(whole[i]),
                "cells": _cells(state, i, owners),
            }
        )
    return rows


def gpu_map(state: ClusterState, query: MapQuery | None = None) -> dict[str, Any]:
    """The GPU map: rows grouped by GPU model, filtered, sorted and sliced as `query` asks."""
    query = query or MapQuery()
    request = map_request(state, query.gpus)
    fits = fits_mask(state, request)
    whole = whole_free_counts(state)
    stranded_per_node = np.where(fits, 0, whole)
    used = np.where(state.used_milli > 0, state.used_milli, 0).sum(axis=1)
    n = len(state.nodes)
    keep = np.ones(n, dtype=bool)
    models = np.array([nd.gpu_model or "unknown" for nd in state.nodes], dtype=object)
    if query.model:
        keep &= models == query.model
    if query.only == "stranded":
        keep &= stranded_per_node > 0
    elif query.only == "fits":
        keep &= fits
    elif query.only == "busy":
        keep &= used > 0
    elif query.only == "free":
        keep &= whole_free_node_mask(state)
    if query.q:
        needle = query.q.lower()
        hit = {i for i, nd in enumerate(state.nodes) if needle in nd.name.lower()}
        for w in state.running:
            if needle in w.id.lower() or needle in (w.name or "").lower():
                hit.update(state.node_index[nd] for nd in w.nodes())
        mask = np.zeros(n, dtype=bool)
        mask[list(hit)] = True
        keep &= mask
    chosen = np.flatnonzero(keep)
    names = [state.nodes[i].name for i in chosen]
    secondary: dict[str, Any] = {
        "name": lambda k: 0,
        "free": lambda k: -int(whole[chosen[k]]),
        "stranded": lambda k: -int(stranded_per_node[chosen[k]]),
        "used": lambda k: -int(used[chosen[k]]),
    }
    key2 = secondary[query.sort]
    order = sorted(range(len(chosen)), key=lambda k: (models[chosen[k]], key2(k), names[k]))
    total = len(order)
    page = [int(chosen[k]) for k in order[query.offset : query.offset + query.limit]]
    rows = node_rows(state, page, request, fits)
    groups: list[dict[str, Any]] = []
    for row in rows:
        if not groups or groups[-1]["model"] != row["model"]:
            groups.append({"model": row["model"], "rows": []})
        groups[-1]["rows"].append(row)
    on_page = {w for row in rows for cell in row["cells"] for w, _ in cell["shares"]}
    return {
        "request": request.label(),
        "request_gpus_per_node": request.gpus_per_node,
        "total_nodes": n,
        "matching_nodes": total,
        "offset": query.offset,
        "limit": query.limit,
        "groups": groups,
        "workloads": [workload_info(w) for w in state.running if w.id in on_page],
    }


def pending_view(state: ClusterState, diagnoses: list[Diagnosis] | None = None) -> list[dict[str, Any]]:
    """Every pending GPU request with its diagnosis (primary cause first)."""
    diags = diagnose_all(state) if diagnoses is None else diagnoses
    out = []
    for d in diags:
        w = state.workload(d.workload_id) if d.workload_id else None
        info = workload_info(w) if w is not None else {"id": d.workload_id, "name": d.workload_id}
        info["submitted_at"] = w.submitted_at if w is not None else None
        info["diagnosis"] = {
            "primary": d.primary.code.value,
            "is_fragmentation": d.is_fragmentation,
            "scheduler_reason": d.scheduler_reason,
            "causes": [
                {"code": c.code.value, "summary": c.summary, "evidence": jsonable(c.evidence)} for c in d.causes
            ],
        }
        out.append(info)
    return out


def stranded_by_shape(state: ClusterState) -> dict[str, int]:
    """Stranded whole GPUs for each distinct pending request shape (and a whole node of the largest size)."""
    shapes: dict[str, Request] = {}
    for w in state.pending:
        r = w.request
        if r.gpus_per_node == 0:
            continue
        shape = Request(gpus_per_node=r.gpus_per_node, node_count=r.node_count, gpu_milli=r.gpu_milli,
                        gpu_models=r.gpu_models)
        shapes.setdefault(shape.label(), shape)
    full = Request(gpus_per_node=max(state.max_gpus, 1))
    shapes.setdefault(full.label(), full)
    return {label: stranded(state, r)[0] for label, r in sorted(shapes.items())}


def jsonable(v: Any) -> Any:
    """A value as JSON can hold it (the dashboard's views and plan previews share it)."""
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple | set | frozenset):
        return [jsonable(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, str | int | float | bool) or v is None:
        return v
    return str(v)
