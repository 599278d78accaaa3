"""Started plans, carried to their end across controller cycles.

A plan frees a node only when all of its moves are made. The disruption budget (`max_per_node: 1`, say) may
admit only some of them in one cycle; without a record of the rest, the controller would stop with the node half
freed (`controller --once`) or plan afresh next cycle and perhaps free a different node. So every started plan is
an `OpenPlan`: its moves, in the planner's order, and the migration journaled for each so far. Each cycle the
controller submits the next moves the budget admits and says how the plan stands; a plan ends *finished* (every
move made, or the pending workload started meanwhile) or *stopped* (a move failed or rolled back; what was done
is said). The plan's id and full move list travel in each migration's journal record, so a restarted controller
picks a started plan up again from the journal (`open_plans`).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .journal import Journal, Migration
from .journal import MigrationState as S

MADE = frozenset({S.DONE, S.COLD_STARTED})  # the workload left the source (with or without its state)
FAILED = frozenset({S.ROLLED_BACK, S.ABORTED})  # the workload stayed (or went nowhere): the node is not freed


@dataclass(frozen=True)
class PlannedMove:
    """One move of a started plan, as the executors take it (`MoveLike`, plus the Slurm target GPUs)."""

    workload_id: str
    source: str
    target: str
    target_gpus: tuple[int, ...] = ()

    def label(self) -> str:
        return f"{self.workload_id} {self.source}->{self.target}"

    def as_dict(self) -> dict[str, Any]:
        return {"workload": self.workload_id, "source": self.source, "target": self.target,
                "target_gpus": list(self.target_gpus)}

    @staticmethod
    def of(m: Any) -> PlannedMove:
        return PlannedMove(str(m.workload_id), str(m.source), str(m.target),
                           tuple(int(g) for g in (getattr(m, "target_gpus", ()) or ())))


@dataclass
class OpenPlan:
    """A started plan: what it is for, its moves in order, and the migration journaled for each so far."""

    id: str
    for_workload: str | None
    target_node: str | None
    reason: str
    moves: tuple[PlannedMove, ...]
    compat: dict[str, Any] | None = None
    migrations: dict[str, int] = field(default_factory=dict)  # workload id -> migration id
    dropped: list[str] = field(default_factory=list)  # moves no longer needed (the workload left by itself)

    @property
    def name(self) -> str:
        return f"plan {self.id}" + (f" for {self.for_workload}" if self.for_workload else "")

    def meta(self) -> dict[str, Any]:
        """What each of the plan's migrations carries in the journal (`plan`)."""
        return {"id": self.id, "for": self.for_workload, "target_node": self.target_node,
                "moves": [m.as_dict() for m in self.moves]}

    def remaining(self) -> list[PlannedMove]:
        """The moves not yet journaled nor dropped, in the plan's order."""
        return [m for m in self.moves if m.workload_id not in self.migrations
                and m.workload_id not in self.dropped]

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "for": self.for_workload, "target_node": self.target_node,
                "moves": [m.label() for m in self.moves], "migrations": dict(self.migrations),
                "dropped": list(self.dropped)}


def new_plan_id() -> str:
    """A short random name: it must be unique in the journal before the plan's first move is journaled."""
    return secrets.token_hex(4)


def open_plans(journal: Journal, *, now: float, max_age_s: float = 3600.0) -> list[OpenPlan]:
    """The plans a previous controller started and did not finish, from the journal: those with a move not yet
    journaled, none failed, and a migration created within `max_age_s` (an older half-made plan is stale: the
    cluster it was made for has changed; its pending workload is planned for afresh)."""
    by_id: dict[str, list[Migration]] = {}
    for m in journal.all():
        p = m.data.get("plan") or {}
        if p.get("id") and p.get("moves"):
            by_id.setdefault(str(p["id"]), []).append(m)
    out = []
    for pid, ms in by_id.items():
        if max(m.created_at for m in ms) < now - max_age_s or any(m.state in FAILED for m in ms):
            continue
        p = ms[0].data["plan"]
        moves = tuple(PlannedMove(str(d["workload"]), str(d["source"]), str(d["target"]),
                                  tuple(int(g) for g in d.get("target_gpus") or ())) for d in p["moves"])
        op = OpenPlan(pid, p.get("for"), p.get("target_node"), ms[0].reason, moves, ms[0].data.get("compat"),
                      {m.workload_id: m.id for m in ms})
        if op.remaining() or any(not m.terminal for m in ms):
            out.append(op)
    return out


def outcome(plan: OpenPlan, migrations: Iterable[Migration]) -> tuple[str, str] | None:
    """How a started plan stands once none of its migrations is in flight: ("stopped", why) when a move failed,
    ("finished", what) when every move was made; None while it goes on."""
    ms = list(migrations)
    failed = [m for m in ms if m.state in FAILED]
    made = [m for m in ms if m.state in MADE]
    n = len(plan.moves)
    if failed:
        f = failed[0]
        return ("stopped", f"{plan.name} stopped after {len(made)} of {n} move(s): migration {f.id} of "
                f"{f.workload_id} {f.state.value} ({f.reason or 'no reason recorded'}); "
                f"{plan.target_node or 'the node'} is not freed")
    if any(not m.terminal for m in ms) or plan.remaining():
        return None
    dropped = f" ({len(plan.dropped)} not needed: {', '.join(plan.dropped)} left by itself)" if plan.dropped else ""
    return ("finished", f"{plan.name} finished: {len(made)} of {n} move(s) made{dropped}; "
            f"{plan.target_node or 'the node'} is freed")
