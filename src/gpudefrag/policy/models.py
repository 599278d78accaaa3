"""A policy: when to act (trigger), on which jobs (filter), what to do (action), and how much at once (budgets).

One YAML file is the operator's whole mental model of the controller (the descheduler's lesson). Models are
strict: an unknown key is a typo and an error, never a silently ignored setting. The `trigger:` section is made
of each trigger's own settings, which live beside the trigger in `policy.triggers`.
"""

from __future__ import annotations

import fnmatch
import re
from datetime import datetime
from typing import Annotated, Literal

from croniter import croniter
from pydantic import Field, field_validator, model_validator

from ..core.model import Workload
from ..core.planner_types import PlanOptions
from .base import PosSeconds, Strict, cron_expression
from .triggers import PendingTrigger, Trigger

__all__ = ["Action", "Budgets", "Compat", "Filter", "Heartbeat", "PendingTrigger", "Policy", "PosSeconds", "Strict",
           "Trigger", "parse_size"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "M": 1000**2, "MB": 1000**2, "G": 1000**3, "GB": 1000**3,
          "T": 1000**4, "TB": 1000**4, "P": 1000**5, "PB": 1000**5, "KI": 1024, "KIB": 1024, "MI": 1024**2,
          "MIB": 1024**2, "GI": 1024**3, "GIB": 1024**3, "TI": 1024**4, "TIB": 1024**4, "PI": 1024**5,
          "PIB": 1024**5}


def parse_size(v: object) -> int:
    """64GiB / 500MB / 1.5T / 1048576 -> bytes."""
    if isinstance(v, bool):
        raise ValueError("a size is a number of bytes or a string like '64GiB'")
    if isinstance(v, int):
        if not 0 <= v < 2**63:
            raise ValueError("a size must be in 0..2**63-1 bytes")
        return v
    if not isinstance(v, str):
        raise ValueError("a size is a number of bytes or a string like '64GiB'")
    m = _SIZE.match(v)
    if not m or (m.group(2) or "").upper() not in _UNITS:
        raise ValueError(f"not a size: {v!r} (use e.g. 64GiB, 500MB, 1048576)")
    n = float(m.group(1)) * _UNITS[(m.group(2) or "").upper()]
    if not n < 2**63:  # also inf, from a 400-digit number
        raise ValueError(f"size {v[:24]!r} is out of range (at most 2**63-1 bytes)")
    return int(n)


class Filter(Strict):
    """Which running jobs may be moved. Every set field must match; an empty list means 'any'."""

    partitions: list[str] = Field(default_factory=list)
    users: list[str] = Field(default_factory=list)
    accounts: list[str] = Field(default_factory=list)  # Slurm account / Kubernetes namespace
    names: list[str] = Field(default_factory=list)  # glob patterns on the job name
    comments: list[str] = Field(default_factory=list)  # glob patterns on the Slurm comment (label `slurm.comment`)
    labels: dict[str, str] = Field(default_factory=dict)  # all must be present with these values
    exclude_labels: dict[str, str] = Field(default_factory=dict)  # any present with this value excludes the job
    max_priority: int | None = None  # only jobs whose priority is <= this
    max_gpus: Annotated[int, Field(ge=1)] | None = None
    max_checkpoint_size: int | None = None  # bytes; YAML may say "64GiB"
    single_node_only: bool = True

    @field_validator("max_checkpoint_size", mode="before")
    @classmethod
    def _size(cls, v: object) -> int | None:
        return None if v is None else parse_size(v)

    def matches(self, w: Workload) -> bool:
        """May this workload be moved under this policy?"""
        return self.why_not(w) is None

    def why_not(self, w: Workload) -> str | None:
        """None when the workload passes, else the first field that excludes it, named as in the policy file
        (`filter.max_priority <= 10000`), so that "nothing may move" can say which filter excluded how many."""
        if self.single_node_only and w.is_multi_node:
            return "filter.single_node_only"
        if self.partitions and (w.request.partition or "") not in self.partitions:
            return f"filter.partitions {self.partitions}"
        if self.users and w.user not in self.users:
            return f"filter.users {self.users}"
        if self.accounts and w.namespace not in self.accounts:
            return f"filter.accounts {self.accounts}"
        if self.names and not any(fnmatch.fnmatchcase(w.name, p) for p in self.names):
            return f"filter.names {self.names}"
        if self.comments and not any(fnmatch.fnmatchcase(w.labels.get("slurm.comment", ""), p)
                                     for p in self.comments):
            return f"filter.comments {self.comments}"
        if self.labels and any(w.labels.get(k) != v for k, v in self.labels.items()):
            return f"filter.labels {self.labels}"
        if self.exclude_labels and any(w.labels.get(k) == v for k, v in self.exclude_labels.items()):
            return f"filter.exclude_labels {self.exclude_labels}"
        if self.max_priority is not None and w.priority > self.max_priority:
            return f"filter.max_priority <= {self.max_priority}"
        if self.max_gpus is not None and w.request.gpus_total > self.max_gpus:
            return f"filter.max_gpus <= {self.max_gpus}"
        if self.max_checkpoint_size is not None and w.checkpoint_bytes > self.max_checkpoint_size:
            return f"filter.max_checkpoint_size <= {self.max_checkpoint_size} bytes"
        return None


class Heartbeat(Strict):
    """Scheduled checkpoints so that a later move (or a crash) loses little work."""

    every_s: PosSeconds | None = None
    cron: str | None = None
    keep: Annotated[int, Field(ge=1)] = 2

    @field_validator("cron")
    @classmethod
    def _cron_ok(cls, v: str | None) -> str | None:
        return cron_expression(v)

    @model_validator(mode="after")
    def _one(self) -> Heartbeat:
        if self.every_s is not None and self.cron is not None:
            raise ValueError("give either every_s or cron, not both")
        return self

    def due(self, last: float | None, now: float, started: float) -> bool:
        since = last if last is not None else started
        if self.every_s is not None:
            return now - since >= self.every_s
        if self.cron is not None:
            return croniter(self.cron, datetime.fromtimestamp(since)).get_next(float) <= now
        return False


class Action(Strict):
    """`migrate`: checkpoint, move, restore. `never`: observe and report only. `fallback: evict` lets a move
    whose checkpoint fails go on as an eviction (the job restarts on the target from its last good checkpoint
    or from zero, with the reason recorded) instead of rolling back; it must be asked for explicitly."""

    kind: Literal["migrate", "never"] = "migrate"
    fallback: Literal["rollback", "evict"] = "rollback"
    heartbeat: Heartbeat | None = None
    backend: Literal["criu", "cuda", "app"] = "criu"


class Budgets(Strict):
    """The disruption budget."""

    max_concurrent: Annotated[int, Field(ge=1)] = 2  # migrations in flight, cluster-wide
    max_per_node: Annotated[int, Field(ge=1)] = 1  # migrations in flight touching one node (source or target)
    max_moves_per_plan: Annotated[int, Field(ge=1)] = PlanOptions.max_moves  # the planner's default
    max_plans_per_cycle: Annotated[int, Field(ge=1)] = 1  # plans started per cycle, for pending jobs oldest first
    # pending jobs (fragmented, past the trigger) the decision is asked for per cycle, oldest first, until
    # max_plans_per_cycle plans are found: a job no plan can help (no node can be cleared for it) does not keep
    # the jobs behind it from being helped. Each try is one planner run
    max_tries_per_cycle: Annotated[int, Field(ge=1)] = 4
    max_per_hour: Annotated[int, Field(ge=0)] | None = None
    checkpoint_timeout_s: PosSeconds = 300.0
    restore_timeout_s: PosSeconds = 300.0

    @property
    def tries_per_cycle(self) -> int:
        """Pending jobs asked the decision per cycle: `max_tries_per_cycle`, but never fewer than the plans a cycle
        may start. The controller and the replay both read it here."""
        return max(self.max_tries_per_cycle, self.max_plans_per_cycle)

    @property
    def jobs_per_cycle(self) -> int:
        """Pending jobs looked at per cycle at most: the tries count distinct requests (jobs asking what an
        earlier job of the cycle asked get its answer), and the jobs that ride along on a request already asked
        are bounded too, so that a queue of a thousand jobs of one shape costs a cycle no more than this."""
        return 8 * self.tries_per_cycle


Rule = Literal["exact", "minor", "major", "at-least", "any"]


class Compat(Strict):
    """The one compatibility rule (`gpudefrag.core.compat`): how each version a checkpoint records must relate
    to what the target node offers. The planner and the restore path both apply it."""

    gpu_model: Rule = "exact"
    driver: Rule = "exact"
    cuda: Rule = "exact"
    checkpointer: Rule = "exact"
    engine: Rule = "exact"
    model: Rule = "exact"
    cpu_arch: Rule = "exact"
    kernel: Rule = "exact"
    strict: bool = False


class Policy(Strict):
    name: str = "default"
    trigger: Trigger = Trigger()
    filter: Filter = Filter()
    action: Action = Action()
    budgets: Budgets = Budgets()
    compat: Compat = Compat()
    planner_time_limit_s: PosSeconds = PlanOptions.time_limit_s  # the planner's default
    # the heuristic's trials per plan: bounds one decision's time on any cluster (the planner's default)
    planner_search_limit: Annotated[int, Field(ge=1)] = PlanOptions.search_limit
