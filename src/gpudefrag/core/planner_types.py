"""The planner's vocabulary: options, a move, a plan. Imported by every planner module and re-exported by
`gpudefrag.core.planner`, which is where callers should import them from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from .compat import CompatRule
from .cost import AltCost, CostModel, MoveCost
from .model import Placement, Request, Workload

Solver = Literal["auto", "exact", "heuristic"]


@dataclass(frozen=True)
class PlanOptions:
    """What the planner may do. `max_moves_per_node` counts every move that leaves or enters a node (a
    disruption budget). `movable` is the policy filter: a workload it rejects never moves.
    `candidate_limit` caps how many target nodes the heuristic examines in full (largest clusters);
    `exact_max_vars` is the model size above which `auto` does not try the exact solver. `search_limit` bounds
    the heuristic's trials per plan (working states it makes to try a set of moves): when spent, it keeps the
    best plan found and says so in the plan's notes (or its reason, when it found none)."""

    max_moves: int = 8
    max_moves_per_node: int = 8
    movable: Callable[[Workload], bool] | None = None
    cost_model: CostModel | None = None
    compat: CompatRule | None = None
    solver: Solver = "auto"
    time_limit_s: float = 2.0
    fresh_checkpoint: bool = True
    candidate_limit: int = 64
    exact_max_vars: int = 150_000
    search_limit: int = 2048
    workers: int = 2  # CP-SAT search workers
    # why `movable` rejects a workload ("filter.max_priority <= 10000", "not running under `gpudefrag run`"), so
    # that a plan that finds nothing to move says which filter excluded how many jobs; None: "the policy filter"
    excluded_by: Callable[[Workload], str | None] | None = None

    def __post_init__(self) -> None:
        if self.max_moves < 0 or self.max_moves_per_node < 0:
            raise ValueError("max_moves and max_moves_per_node must be >= 0")
        if self.solver not in ("auto", "exact", "heuristic"):
            raise ValueError(f"solver must be auto, exact or heuristic, not {self.solver!r}")
        if not self.time_limit_s > 0:
            raise ValueError("time_limit_s must be > 0")
        if self.search_limit < 1:
            raise ValueError("search_limit must be >= 1")


@dataclass(frozen=True, slots=True)
class Move:
    """Move one running single-node workload from `source` to the GPUs `target_gpus` of `target`."""

    workload_id: str
    source: str
    target: str
    target_gpus: tuple[int, ...]
    cost: MoveCost
    evict: AltCost | None = None  # what evicting it instead would cost
    drain: AltCost | None = None  # what waiting for it to end would cost

    def as_dict(self) -> dict[str, object]:
        return {
            "workload": self.workload_id,
            "source": self.source,
            "target": self.target,
            "target_gpus": list(self.target_gpus),
            "cost": self.cost.as_dict(),
            "evict": self.evict.as_dict() if self.evict else None,
            "drain": self.drain.as_dict() if self.drain else None,
        }


@dataclass(frozen=True)
class Plan:
    """The cheapest moves found that let `request` be placed, in the order to execute them.

    `target_node` is the node the request lands on (the first, for a multi-node request; all of them in
    `placements`). `optimal` is True only when the exact solver proved it. An infeasible plan has no moves
    and says why in `reason`.
    """

    request: Request
    moves: tuple[Move, ...]
    target_node: str | None
    feasible: bool
    reason: str
    solver: str
    optimal: bool
    total_cost_s: float
    total_gpu_s: float
    explain: tuple[str, ...] = ()
    workload_id: str | None = None  # the pending workload planned for, if any
    placements: tuple[Placement, ...] = ()  # where the request lands after the moves
    evict_gpu_s: float | None = None  # the same workloads evicted instead (None: nothing moves)
    drain_s: float | None = None  # waiting for them all to end instead (inf: some end unknown)
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def score(self) -> float:
        return sum(m.cost.score for m in self.moves)

    def as_dict(self) -> dict[str, object]:
        return {
            "workload": self.workload_id,
            "request": self.request.label(),
            "feasible": self.feasible,
            "reason": self.reason,
            "solver": self.solver,
            "optimal": self.optimal,
            "target_node": self.target_node,
            "placements": [{"node": p.node, "gpus": list(p.gpus)} for p in self.placements],
            "moves": [m.as_dict() for m in self.moves],
            "total_cost_s": self.total_cost_s,
            "total_gpu_s": self.total_gpu_s,
            "evict_instead_gpu_s": self.evict_gpu_s,
            "drain_instead_s": None if self.drain_s is None or self.drain_s == float("inf") else self.drain_s,
            "explain": list(self.explain),
            **self.extra,
        }
