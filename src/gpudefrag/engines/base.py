"""The Engine protocol: what the controller needs from a scheduler, whatever the scheduler is.

An engine observes the cluster as a pure `ClusterState` and performs the few job actions a migration is built
from (hold, release, requeue-and-hold, pin to nodes, signal). Every action is idempotent from the caller's view:
asking for what is already true succeeds, so a restarted controller can repeat the step it died in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

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
