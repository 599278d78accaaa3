"""What the executor and a job's wrapper say to each other: checkpoint requests' outcomes, restore tickets, how
a start went. `control.agent.FileAgent` carries them in files, the simulated engine in memory; they live below
both (and below `engines/`), so neither side imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class CkptState(StrEnum):
    PENDING = "pending"  # asked, no answer yet
    OK = "ok"
    FAILED = "failed"


@dataclass(frozen=True)
class CkptStatus:
    state: CkptState
    ckpt_id: str | None = None
    reason: str = ""  # a stable checkpoint reason code when failed (checkpoint-failed, store-full, ...)
    detail: str = ""
    still_running: bool = True  # after a failure: is the workload still running where it was?


@dataclass(frozen=True)
class Ticket:
    """What the job must do at its next start: restore `ckpt_id` (None: no usable checkpoint) — and why.
    `compat`: the compatibility rule the move was planned under (`CompatRule.as_dict()`), so the restore's gate
    accepts what the planner accepted; None (a ticket written before the field existed): the default rule."""

    id: str
    ckpt_id: str | None
    reason: str = ""
    compat: dict[str, Any] | None = None


class RunPhase(StrEnum):
    STARTING = "starting"
    RESTORED = "restored"
    COLD_STARTED = "cold-started"  # started fresh although a restore was wanted; `reason` says why
    FRESH = "fresh"  # a first start, nothing to restore
    CHECKPOINTED = "checkpointed"  # stopped for a move, waiting to be requeued
    EXITED = "exited"


@dataclass(frozen=True)
class RunStatus:
    phase: RunPhase
    node: str = ""
    ticket_id: str | None = None  # the ticket this start handled
    ckpt_id: str | None = None  # what it restored
    reason: str = ""
    pid: int | None = None
    at: float = 0.0
