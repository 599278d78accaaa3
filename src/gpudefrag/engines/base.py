"""The Engine protocol: what the controller needs from a scheduler, whatever the scheduler is.

An engine observes the cluster as a pure `ClusterState` and performs the few job actions a migration is built
from (hold, release, requeue-and-hold, pin to nodes, signal). Every action is idempotent from the caller's view:
asking for what is already true succeeds, so a restarted controller can repeat the step it died in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from ..core.model import ClusterState
from ..errors import GpudefragError


class EngineError(GpudefragError):
    """A scheduler command failed (the command, its exit code and its message are in the text)."""

    exit_code = 3


class JobPhase(StrEnum):
    PENDING = "pending"  # waiting for resources (or for a scheduling pass)
    HELD = "held"  # pending and held: the scheduler will not start it until released
    RUNNING = "running"
    COMPLETING = "completing"  # ending or being requeued: still holds its nodes for a moment
    ENDED = "ended"  # completed, failed, cancelled, timed out
    GONE = "gone"  # the scheduler does not know it (any more)


@dataclass(frozen=True, slots=True)
class JobInfo:
    """The facts about one job a migration step needs."""

    job_id: str
    phase: JobPhase
    nodes: tuple[str, ...] = ()
    reason: str = ""
    restarts: int = 0
    required_nodes: tuple[str, ...] = ()
    excluded_nodes: tuple[str, ...] = ()

    @property
    def node(self) -> str | None:
        return self.nodes[0] if self.nodes else None


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    schedulable: bool  # False: drained, draining, down
    state: str = ""
    reason: str = ""


@runtime_checkable
class Engine(Protocol):
    """Observe a cluster and act on its jobs. Implemented by `engines.slurm`, `engines.sim`, `engines.kubernetes`."""

    name: str

    def observe(self) -> ClusterState:
        """The cluster now: nodes, running and pending workloads, with the scheduler's pending reasons."""
        ...

    def job(self, job_id: str) -> JobInfo:
        """One job's phase and nodes (phase GONE when the scheduler does not know it)."""
        ...

    def node(self, name: str) -> NodeInfo:
        ...

    def hold(self, job_id: str) -> None:
        ...

    def release(self, job_id: str) -> None:
        ...

    def requeue_hold(self, job_id: str) -> None:
        """Stop a running job and put it back in the queue, held (Slurm: `scontrol requeuehold`)."""
        ...

    def pin(self, job_id: str, nodes: Sequence[str], exclude: Sequence[str] = ()) -> None:
        """Restrict where a pending job may start (Slurm: ReqNodeList / ExcNodeList). Empty `nodes`: anywhere."""
        ...

    def signal(self, job_id: str, signal: str, *, batch: bool = True) -> None:
        """Send a signal to the job's batch step (the wrapper) or to all its steps."""
        ...


# ---------------------------------------------------------------------------------------------- agent messages
# What the executor and a job's wrapper say to each other (control.agent's FileAgent carries them in files, the
# simulated engine in memory). They live here, below both, so the engines never import control.

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
