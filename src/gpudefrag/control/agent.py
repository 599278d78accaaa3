"""The executor's channel to the job wrapper inside each job: ask for a checkpoint, read its outcome, leave a
restore ticket for the job's next start, read how that start went.

`FileAgent` is the real one (files under a shared run directory, plus the signed checkpoint store); the
simulated engine implements the same protocol in memory. Every call is idempotent: a request id asked twice is
answered once.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..errors import InputError
from ..fileio import write_json_atomic
from ..jobside.jobdir import JobDir, read_json
from ..jobside.messages import CkptState, CkptStatus, RunPhase, RunStatus, Ticket

__all__ = ["Agent", "CkptState", "CkptStatus", "FileAgent", "JobDir", "RunPhase", "RunStatus", "Ticket", "read_json"]


_LIVE = frozenset({RunPhase.STARTING, RunPhase.FRESH, RunPhase.RESTORED, RunPhase.COLD_STARTED})


@runtime_checkable
class Agent(Protocol):
    def request_checkpoint(self, workload_id: str, request_id: str, *, stop: bool) -> None: ...

    def checkpoint_status(self, workload_id: str, request_id: str) -> CkptStatus: ...

    def cancel_checkpoint(self, workload_id: str, request_id: str) -> None: ...

    def verify(self, ckpt_id: str) -> tuple[bool, str]:
        """(ok, reason code) from the signed store."""
        ...

    def set_ticket(self, workload_id: str, ticket: Ticket) -> None: ...

    def run_status(self, workload_id: str) -> RunStatus | None: ...


class FileAgent:
    """The agent for wrapper jobs (`gpudefrag run`): request files, response files, a ticket and a status file
    in a directory both sides see, checkpoints verified in the signed store. `signal` (optional) wakes the
    wrapper at once (Slurm: `scancel --signal=USR2 --batch`); without it the wrapper finds the file on its own."""

    def __init__(self, run_dir: str | Path, store: Any, *, signal: Any = None) -> None:
        self.run_dir = Path(run_dir)
        self.store = store
        self.signal = signal

    def request_checkpoint(self, workload_id: str, request_id: str, *, stop: bool) -> None:
        jd = JobDir(self.run_dir, workload_id)
        if jd.request(request_id).exists() or jd.response(request_id).exists():
            return
        jd.ensure()  # never into a job folder someone else could write
        write_json_atomic(jd.request(request_id), {"id": request_id, "stop": stop, "at": time.time()})
        status = read_json(jd.status) or {}
        # USR2 kills a wrapper that has not installed its handler yet, so signal only a wrapper whose current
        # start has reported (a stale status from before a requeue says "checkpointed" or "exited")
        if self.signal is not None and status.get("phase") in _LIVE:
            with contextlib.suppress(Exception):  # the file is the request; the signal only hurries it
                self.signal(workload_id)

    def has_wrapper(self, workload_id: str) -> bool:
        """Does this job run under `gpudefrag run` (its current start reported a live phase)? Only such jobs can
        answer a checkpoint request; the controller never plans to move the others."""
        try:
            status = read_json(JobDir(self.run_dir, workload_id).status) or {}
        except InputError:  # no wrapper can have run under such an id
            return False
        return status.get("phase") in _LIVE

    def checkpoint_status(self, workload_id: str, request_id: str) -> CkptStatus:
        doc = read_json(JobDir(self.run_dir, workload_id).response(request_id))
        if doc is None:
            return CkptStatus(CkptState.PENDING)
        return CkptStatus(CkptState(doc["state"]), doc.get("ckpt_id"), doc.get("reason", ""),
                          doc.get("detail", ""), bool(doc.get("still_running", True)))

    def cancel_checkpoint(self, workload_id: str, request_id: str) -> None:
        JobDir(self.run_dir, workload_id).request(request_id).unlink(missing_ok=True)

    def verify(self, ckpt_id: str) -> tuple[bool, str]:
        v = self.store.verify(ckpt_id)
        return bool(v.ok), str(v.reason)

    def set_ticket(self, workload_id: str, ticket: Ticket) -> None:
        jd = JobDir(self.run_dir, workload_id)
        jd.ensure()  # never into a job folder someone else could write
        write_json_atomic(jd.ticket, asdict(ticket))

    def run_status(self, workload_id: str) -> RunStatus | None:
        doc = read_json(JobDir(self.run_dir, workload_id).status)
        if doc is None:
            return None
        return RunStatus(RunPhase(doc["phase"]), doc.get("node", ""), doc.get("ticket_id"), doc.get("ckpt_id"),
                         doc.get("reason", ""), doc.get("pid"), float(doc.get("at", 0.0)))
