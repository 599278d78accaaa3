"""The Slurm engine: observe with `sinfo --json` / `squeue --json`, act with `scontrol` and `scancel`.

Commands run with the caller's environment (SLURM_CONF selects the cluster). Every action checks the job first
and does nothing when the wanted state already holds, so a restarted controller can repeat any step.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ...core.model import ClusterState
from ..base import EngineError, JobInfo, JobPhase, NodeInfo
from .parse import (
    job_info_from_scontrol,
    node_kernels,
    parse_jobs,
    parse_nodes,
    parse_scontrol_record,
    slurm_version,
)


class SlurmEngine:
    """One Slurm cluster, driven through its command-line tools."""

    name = "slurm"

    def __init__(self, *, env: Mapping[str, str] | None = None, timeout_s: float = 30.0,
                 cluster_name: str = "slurm") -> None:
        self.env = {**os.environ, **(env or {})}
        self.timeout_s = timeout_s
        self.cluster_name = cluster_name
        self.version = ""

    # ------------------------------------------------------------------ plumbing
    def _run(self, *args: str, missing: str = "") -> str:
        """stdout of a Slurm command; "" when it exits 1 saying `missing` (Slurm's own answer that the job or
        node asked about does not exist). Any other failure — the controller busy or unreachable, a timeout —
        is an EngineError, which the executor retries: a transient error must never read as "the job is gone"."""
        try:
            p = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=self.timeout_s,
                               check=False)
        except FileNotFoundError as e:
            raise EngineError(f"{args[0]}: not installed (is Slurm's client on PATH?)") from e
        except subprocess.TimeoutExpired as e:
            raise EngineError(f"{' '.join(args)}: no answer after {self.timeout_s:g} s") from e
        if p.returncode == 0:
            return p.stdout
        if missing and p.returncode == 1 and missing.lower() in (p.stderr + p.stdout).lower():
            return ""
        msg = (p.stderr or p.stdout).strip().splitlines()
        raise EngineError(f"{' '.join(args)}: exit {p.returncode}: {msg[-1] if msg else 'no message'}")

    def _json(self, *args: str) -> dict[str, Any]:
        out = self._run(*args)
        try:
            doc = json.loads(out)
        except json.JSONDecodeError as e:
            raise EngineError(f"{' '.join(args)}: output is not JSON ({e})") from e
        if doc.get("errors"):
            raise EngineError(f"{' '.join(args)}: {doc['errors']}")
        return doc

    # ------------------------------------------------------------------ observe
    def observe(self) -> ClusterState:
        nodes_doc = self._json("sinfo", "-N", "--json")
        jobs_doc = self._json("squeue", "--json")
        self.version = slurm_version(nodes_doc)
        nodes = parse_nodes(nodes_doc)
        if any(n.kernel is None for n in nodes):  # the kernel the compatibility rule checks (CRIU records it)
            kernels = node_kernels(self._json("scontrol", "show", "nodes", "--json"))
            nodes = [msgspec.structs.replace(n, kernel=kernels.get(n.name)) if n.kernel is None else n for n in nodes]
        workloads, _ = parse_jobs(jobs_doc, nodes)
        known = {n.name for n in nodes}
        workloads = [w for w in workloads if all(p.node in known for p in w.placements)]
        return ClusterState.build(nodes, workloads, now=time.time(), name=self.cluster_name,
                                  scheduler="slurm")  # its reasons are Slurm's (core.scheduler_reasons)

    def jobs(self) -> list[JobInfo]:
        _, infos = parse_jobs(self._json("squeue", "--json"))
        return infos

    def job(self, job_id: str) -> JobInfo:
        out = self._run("scontrol", "show", "job", "-o", str(job_id), missing="Invalid job id")
        line = out.strip().splitlines()[0] if out.strip() else ""
        if not line.startswith("JobId="):
            return JobInfo(job_id=str(job_id), phase=JobPhase.GONE)
        return job_info_from_scontrol(parse_scontrol_record(line))

    def node(self, name: str) -> NodeInfo:
        out = self._run("scontrol", "show", "node", "-o", name, missing="not found")
        rec = parse_scontrol_record(out.strip().splitlines()[0]) if out.strip() else {}
        if rec.get("NodeName") != name:
            return NodeInfo(name=name, schedulable=False, state="UNKNOWN", reason="no such node")
        state = rec.get("State", "")
        flags = set(state.upper().replace("*", "").split("+"))
        bad = {"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "NOT_RESPONDING", "FUTURE", "MAINT", "INVALID_REG"}
        return NodeInfo(name=name, schedulable=not (flags & bad), state=state, reason=rec.get("Reason", ""))

    # ------------------------------------------------------------------ act
    def hold(self, job_id: str) -> None:
        info = self.job(job_id)
        if info.phase is JobPhase.PENDING:
            self._run("scontrol", "hold", str(job_id))

    def release(self, job_id: str) -> None:
        if self.job(job_id).phase is JobPhase.HELD:
            self._run("scontrol", "release", str(job_id))

    def requeue_hold(self, job_id: str) -> None:
        info = self.job(job_id)
        if info.phase is JobPhase.RUNNING:
            self._run("scontrol", "requeuehold", str(job_id))
        elif info.phase is JobPhase.PENDING:
            self._run("scontrol", "hold", str(job_id))
        elif info.phase in (JobPhase.ENDED, JobPhase.GONE):
            raise EngineError(f"job {job_id} cannot be requeued: it is {info.phase.value}")

    def pin(self, job_id: str, nodes: Sequence[str], exclude: Sequence[str] = ()) -> None:
        info = self.job(job_id)
        if tuple(nodes) == info.required_nodes and tuple(exclude) == info.excluded_nodes:
            return
        if info.phase not in (JobPhase.PENDING, JobPhase.HELD):
            raise EngineError(f"job {job_id} cannot be pinned: it is {info.phase.value}, not pending")
        self._run("scontrol", "update", f"JobId={job_id}", f"ReqNodeList={','.join(nodes)}",
                  f"ExcNodeList={','.join(exclude)}")

    def signal(self, job_id: str, signal: str, *, batch: bool = True) -> None:
        args = ["scancel", f"--signal={signal}"]
        if batch:
            args.append("--batch")
        self._run(*args, str(job_id))

    def cancel(self, job_id: str) -> None:
        self._run("scancel", str(job_id))

    def drain(self, node: str, reason: str) -> None:
        self._run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def resume(self, node: str) -> None:
        self._run("scontrol", "update", f"NodeName={node}", "State=RESUME")
