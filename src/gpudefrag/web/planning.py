"""The dashboard's bridge to the planner (`gpudefrag.core.planner`), written against its contract.

The planner is imported lazily so the dashboard still serves the map and the diagnoses on a tree where the
planner is missing or broken: the plan view then says why there is no plan instead of failing the page.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from ..core.model import ClusterState
from .views import _jsonable, node_rows, summary


class PlannerUnavailable(RuntimeError):
    """The planner module is missing or failed to import."""


def _planner() -> Any:
    try:
        return importlib.import_module("gpudefrag.core.planner")
    except ImportError as e:  # the planner lands in another change; say so rather than crash
        raise PlannerUnavailable(f"the planner is not available: {e}") from None


def planner_available() -> bool:
    try:
        _planner()
    except PlannerUnavailable:
        return False
    return True


def make_plan(state: ClusterState, workload_id: str) -> Any:
    """The planner's Plan for one pending workload (raises PlannerUnavailable, KeyError)."""
    planner = _planner()
    w = state.workload(workload_id)
    return planner.plan_moves(state, w.request, planner.PlanOptions())


def apply_plan(state: ClusterState, plan: Any) -> ClusterState:
    """The state after the plan's moves (validated by the planner's apply_moves)."""
    return _planner().apply_moves(state, plan.moves)


def _cost_dict(cost: Any) -> dict[str, Any]:
    if cost is None:
        return {}
    if hasattr(cost, "as_dict"):
        return _jsonable(cost.as_dict())
    if dataclasses.is_dataclass(cost) and not isinstance(cost, type):
        return _jsonable(dataclasses.asdict(cost))
    return {"value": _jsonable(cost)}


def _num(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def plan_dict(state: ClusterState, plan: Any) -> dict[str, Any]:
    """The plan in the shape the page and the API promise (independent of the planner's own as_dict)."""
    moves = []
    for m in plan.moves:
        w = state.workload(m.workload_id) if m.workload_id in state.workload_index else None
        moves.append(
            {
                "workload_id": m.workload_id,
                "workload_name": (w.name or w.id) if w is not None else m.workload_id,
                "gpus": w.request.gpus_per_node if w is not None else len(m.target_gpus),
                "source": m.source,
                "target": m.target,
                "target_gpus": [int(g) for g in m.target_gpus],
                "cost": _cost_dict(getattr(m, "cost", None)),
            }
        )
    return {
        "feasible": bool(plan.feasible),
        "reason": str(getattr(plan, "reason", "") or ""),
        "target_node": plan.target_node,
        "solver": str(getattr(plan, "solver", "")),
        "optimal": bool(getattr(plan, "optimal", False)),
        "total_cost_s": _num(getattr(plan, "total_cost_s", None)),
        "total_gpu_s": _num(getattr(plan, "total_gpu_s", None)),
        "explain": [str(x) for x in getattr(plan, "explain", ())],
        "moves": moves,
    }


def preview(state: ClusterState, workload_id: str, plan: Any | None = None) -> dict[str, Any]:
    """The plan for a pending workload with the map rows of the nodes it touches, before and after."""
    if plan is None:
        try:
            plan = make_plan(state, workload_id)
        except PlannerUnavailable as e:
            return {"available": False, "message": str(e), "plan": None, "before": [], "after": [],
                    "after_summary": None}
    body = plan_dict(state, plan)
    touched: list[str] = []
    for m in body["moves"]:
        touched.extend([m["source"], m["target"]])
    if body["target_node"]:
        touched.append(body["target_node"])
    names = [n for n in dict.fromkeys(touched) if n in state.node_index]
    request = state.workload(workload_id).request
    idx = [state.node_index[n] for n in names]
    before = node_rows(state, idx, request)
    after: list[dict[str, Any]] = []
    after_summary = None
    message = ""
    if body["feasible"] and plan.moves:
        try:
            after_state = apply_plan(state, plan)
        except Exception as e:  # a plan the planner itself cannot apply is a planner bug: show it, don't 500
            message = f"the plan does not apply cleanly: {e}"
        else:
            after = node_rows(after_state, idx, request)
            after_summary = summary(after_state, request)
    return {"available": True, "message": message, "plan": body, "before": before, "after": after,
            "after_summary": after_summary}
