"""The dashboard's bridge to the one decision (`gpudefrag.core.decision.decide`): the plan preview shows the
same causes and the same plan `gpudefrag plan` gives for the same cluster and the same `--policy`/`--costs`."""

from __future__ import annotations

from typing import Any

from ..core.decision import Decision, decide
from ..core.model import ClusterState
from ..core.planner import Plan, PlanOptions, apply_moves
from .views import jsonable, node_rows, summary


def make_decision(state: ClusterState, workload_id: str, options: PlanOptions | None = None) -> Decision:
    """The decision for one pending workload (raises KeyError for an unknown id)."""
    return decide(state, state.workload(workload_id), options)


def apply_plan(state: ClusterState, plan: Plan) -> ClusterState:
    """The state after the plan's moves (validated by the planner's apply_moves)."""
    return apply_moves(state, plan.moves)


def plan_dict(state: ClusterState, plan: Plan) -> dict[str, Any]:
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
                "cost": jsonable(m.cost.as_dict()),
            }
        )
    return {
        "feasible": plan.feasible,
        "reason": plan.reason,
        "target_node": plan.target_node,
        "solver": plan.solver,
        "optimal": plan.optimal,
        "total_cost_s": plan.total_cost_s,
        "total_gpu_s": plan.total_gpu_s,
        "explain": list(plan.explain),
        "moves": moves,
    }


def preview(state: ClusterState, workload_id: str, decision: Decision | None = None,
            options: PlanOptions | None = None) -> dict[str, Any]:
    """The decision for a pending workload: when an ordinary cause blocks it, that cause and no plan; else the
    plan with the map rows of the nodes it touches, before and after, and the priced alternatives."""
    if decision is None:
        decision = make_decision(state, workload_id, options)
    info = jsonable(decision.as_dict())
    plan = decision.plan
    if plan is None:
        return {"available": False, "message": decision.reason, "plan": None, "before": [], "after": [],
                "after_summary": None, "decision": info}
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
    if decision.chosen not in ("move", "none"):
        message = (message + "; " if message else "") + decision.reason
    return {"available": True, "message": message, "plan": body, "before": before, "after": after,
            "after_summary": after_summary, "decision": info}
