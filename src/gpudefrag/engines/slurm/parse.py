"""Slurm's JSON and `-o` text, turned into the core model.

Two JSON dialects are read: Slurm 22.05 (Debian 12, openapi v0.0.38: `sinfo --json` has `nodes`, job states are
strings, numbers are plain) and Slurm 24.11 (Debian 13, data_parser v0.0.41+: `sinfo --json` has `sinfo` entries
per node and partition, job states are lists of flags, numbers are `{set, infinite, number}`). Both come out
as the same Nodes and Workloads. `squeue --json` ignores filters and lists recently ended jobs: we filter here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from ...core.model import Node, Placement, Request, Workload, WorkloadState
from ..base import JobInfo, JobPhase
from .hostlist import expand, expand_indices

_UNSCHEDULABLE = {"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING", "NOT_RESPONDING", "INVALID",
                  "FUTURE", "POWERED_DOWN", "POWER_DOWN", "POWERING_DOWN", "MAINTENANCE", "REBOOT_REQUESTED",
                  "REBOOT_ISSUED", "UNKNOWN", "NO_RESPOND"}
_ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
          "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT"}
_GRES_ITEM = re.compile(r"^gpu(?::(?P<model>[^:(]+))?:(?P<count>\d+)(?:\((?P<detail>[^)]*)\))?$")
_TRES_GPU = re.compile(r"gres[:/]gpu(?::(?P<model>[^:=,]+))?[:=](?P<count>\d+)")


def unwrap(v: Any) -> Any:
    """24.11 wraps numbers as {set, infinite, number}; unset or infinite become None."""
    if isinstance(v, Mapping) and "number" in v:
        if not v.get("set", True) or v.get("infinite", False):
            return None
        return v["number"]
    return v


def _str(v: Any) -> str:
    v = unwrap(v)
    if v is None:
        return ""
    if isinstance(v, Mapping):  # 24.11 comment: {"job": ..., "administrator": ..., "system": ...}
        return _str(v.get("job"))
    return str(v)


def _states(v: Any) -> list[str]:
    if isinstance(v, list):
        return [str(s).upper() for s in v]
    if not v:
        return []
    return [s.upper() for s in re.split(r"[+,\s]+", str(v)) if s]


def parse_gres_gpus(gres: str) -> tuple[int, str | None, list[int] | None]:
    """`gpu:8`, `gpu:a100:4(S:0-1)`, `gpu:3(IDX:0-2)`, `tmpsize:7T,gpu:l40s:1(IDX:0)` -> (count, model, indices)."""
    count, model, idx = 0, None, None
    for item in re.split(r",(?![^(]*\))", gres or ""):
        m = _GRES_ITEM.match(item.strip())
        if not m:
            continue
        count += int(m.group("count"))
        model = m.group("model") or model
        detail = m.group("detail") or ""
        if detail.startswith("IDX:"):
            idx = (idx or []) + expand_indices(detail[4:])
    return count, model, idx


def slurm_version(doc: Mapping[str, Any]) -> str:
    meta = doc.get("meta") or {}
    slurm = meta.get("Slurm") or meta.get("slurm") or {}
    rel = slurm.get("release")
    if rel:
        return str(rel)
    v = slurm.get("version") or {}
    return f"{v.get('major', '?')}.{v.get('minor', '?')}.{v.get('micro', '?')}"


# ---------------------------------------------------------------------------------------------- nodes
def parse_nodes(doc: Mapping[str, Any]) -> list[Node]:
    """Nodes from `sinfo --json` (either dialect), in name order of first appearance."""
    if "sinfo" in doc:
        return _nodes_v41(doc["sinfo"])
    return [_node_v38(n) for n in doc.get("nodes", [])]


def kernel_release(operating_system: str) -> str | None:
    """The kernel release from a node's `OS` as slurmd reports it ("Linux 6.1.0-18-amd64 #1 SMP ..." →
    "6.1.0-18-amd64"); None when it says nothing usable."""
    parts = operating_system.split()
    return parts[1] if len(parts) > 1 and parts[0] == "Linux" else None


def node_kernels(doc: Mapping[str, Any]) -> dict[str, str]:
    """Node name → kernel release, from `scontrol show nodes --json` (24.x's `sinfo --json` leaves the OS out)."""
    out: dict[str, str] = {}
    for n in doc.get("nodes") or []:
        k = kernel_release(_str(n.get("operating_system")))
        if k and n.get("name"):
            out[str(n["name"])] = k
    return out


def _labels(features: str) -> dict[str, str]:
    return {f: "true" for f in (features or "").split(",") if f}


def _node_v38(n: Mapping[str, Any]) -> Node:
    states = _states(n.get("state")) + _states(n.get("state_flags"))
    count, model, _ = parse_gres_gpus(_str(n.get("gres")))
    return Node(
        name=str(n["name"]),
        gpu_count=count,
        gpu_model=model,
        cpu_milli=int(unwrap(n.get("cpus")) or 0) * 1000,
        labels=_labels(_str(n.get("active_features"))),
        schedulable=not (set(states) & _UNSCHEDULABLE),
        partitions=tuple(n.get("partitions") or ()),
        kernel=kernel_release(_str(n.get("operating_system"))),
    )


def _nodes_v41(entries: Iterable[Mapping[str, Any]]) -> list[Node]:
    by: dict[str, Node] = {}
    for e in entries:
        names = (e.get("nodes") or {}).get("nodes") or []
        states = _states((e.get("node") or {}).get("state"))
        gres = e.get("gres") or {}
        count, model, _ = parse_gres_gpus(_str(gres.get("total") if isinstance(gres, Mapping) else gres))
        part = (e.get("partition") or {}).get("name")
        cpus = e.get("cpus") or {}
        cpu_total = unwrap(cpus.get("total") if isinstance(cpus, Mapping) else cpus) or 0
        per_node_cpu = int(cpu_total) // max(len(names), 1)
        feats = e.get("features") or {}
        for name in names:
            prev = by.get(name)
            parts = (prev.partitions if prev else ()) + ((part,) if part and (not prev or part not in prev.partitions)
                                                        else ())
            by[name] = Node(
                name=name,
                gpu_count=count,
                gpu_model=model,
                cpu_milli=per_node_cpu * 1000,
                labels=_labels(_str(feats.get("active") if isinstance(feats, Mapping) else feats)),
                schedulable=not (set(states) & _UNSCHEDULABLE),
                partitions=parts,
            )
    return list(by.values())


# ---------------------------------------------------------------------------------------------- jobs
def job_phase(states: list[str], reason: str, priority: Any, hold: Any) -> JobPhase:
    s = set(states)
    if s & {"COMPLETING", "REQUEUED", "STAGE_OUT"} and not s & {"PENDING"}:
        return JobPhase.COMPLETING
    if "PENDING" in s or "REQUEUE_HOLD" in s:
        held = hold is True or reason.startswith("JobHeld") or "REQUEUE_HOLD" in s or unwrap(priority) == 0
        return JobPhase.HELD if held else JobPhase.PENDING
    if s & {"RUNNING", "SUSPENDED", "CONFIGURING"}:
        return JobPhase.RUNNING
    if s & _ENDED:
        return JobPhase.ENDED
    return JobPhase.GONE


def parse_labels(comment: str) -> dict[str, str]:
    """A job comment like `team=nlp,gpudefrag.movable=true` gives labels; any comment is also `slurm.comment`."""
    labels: dict[str, str] = {}
    for part in re.split(r"[,;\s]+", comment.strip()):
        if "=" in part:
            k, v = part.split("=", 1)
            if k:
                labels[k] = v
    if comment:
        labels["slurm.comment"] = comment
    return labels


def _gpus_per_node(j: Mapping[str, Any], node_count: int) -> tuple[int, str | None]:
    for key in ("tres_per_node", "tres_per_job", "tres_req_str"):
        s = _str(j.get(key))
        m = _TRES_GPU.search(s)
        if m:
            n = int(m.group("count"))
            if key != "tres_per_node":
                n //= max(node_count, 1)
            return n, m.group("model")
    return 0, None


def parse_jobs(doc: Mapping[str, Any], nodes: Iterable[Node] = ()) -> tuple[list[Workload], list[JobInfo]]:
    """Running and pending jobs as Workloads (ended jobs dropped), and every job's JobInfo."""
    gpu_counts = {n.name: n.gpu_count for n in nodes}
    workloads: list[Workload] = []
    infos: list[JobInfo] = []
    missing_idx: list[tuple[int, int]] = []  # (workload index, placement index) without GPU indices
    for j in doc.get("jobs", []):
        jid = str(unwrap(j.get("job_id")))
        states = _states(j.get("job_state"))
        reason = _str(j.get("state_reason"))
        phase = job_phase(states, reason, j.get("priority"), j.get("hold"))
        node_names = expand(_str(j.get("nodes")))
        info = JobInfo(
            job_id=jid,
            phase=phase,
            nodes=tuple(node_names),
            reason=reason,
            restarts=int(unwrap(j.get("restart_cnt")) or 0),
            required_nodes=tuple(expand(_str(j.get("required_nodes")))),
            excluded_nodes=tuple(expand(_str(j.get("excluded_nodes")))),
        )
        infos.append(info)
        if phase in (JobPhase.ENDED, JobPhase.GONE):
            continue
        running = phase in (JobPhase.RUNNING, JobPhase.COMPLETING) and bool(node_names)
        if phase is JobPhase.COMPLETING and not node_names:
            continue
        node_count = len(node_names) if running else int(unwrap(j.get("node_count")) or 1)
        per_node, model = _gpus_per_node(j, node_count)
        detail = [parse_gres_gpus(d) for d in (j.get("gres_detail") or [])]
        cpus = int(unwrap(j.get("cpus")) or 0)
        placements: list[Placement] = []
        if running:
            for i, name in enumerate(node_names):
                idx = detail[i][2] if i < len(detail) else None
                if per_node == 0 and i < len(detail):
                    per_node = detail[i][0]
                if idx is None or len(idx) != per_node:
                    missing_idx.append((len(workloads), i))
                    idx = []
                placements.append(Placement(name, tuple(idx)))
        comment = _str(j.get("comment"))
        workloads.append(
            Workload(
                id=jid,
                request=Request(
                    gpus_per_node=per_node,
                    node_count=max(node_count, 1),
                    gpu_models=(model,) if model else (),
                    cpu_milli=(cpus * 1000) // max(node_count, 1),
                    partition=_str(j.get("partition")) or None,
                ),
                state=WorkloadState.RUNNING if running else WorkloadState.PENDING,
                name=_str(j.get("name")),
                namespace=_str(j.get("account")) or "default",
                user=_str(j.get("user_name")),
                priority=int(unwrap(j.get("priority")) or 0),
                labels=parse_labels(comment),
                placements=tuple(placements),
                submitted_at=_time(j.get("submit_time")),
                started_at=_time(j.get("start_time")) if running else None,
                scheduler_reason=reason if not running else "",
            )
        )
    if missing_idx:
        workloads = _fill_indices(workloads, missing_idx, gpu_counts)
    return workloads, infos


def _time(v: Any) -> float | None:
    v = unwrap(v)
    return float(v) if v else None


def _fill_indices(
    workloads: list[Workload], missing: list[tuple[int, int]], gpu_counts: Mapping[str, int]
) -> list[Workload]:
    """Jobs whose GPU indices Slurm did not report get the lowest GPU indices still free on their node."""
    used: dict[str, set[int]] = {}
    for w in workloads:
        for p in w.placements:
            used.setdefault(p.node, set()).update(p.gpus)
    out = list(workloads)
    for wi, pi in missing:
        w = out[wi]
        p = w.placements[pi]
        taken = used.setdefault(p.node, set())
        free = [g for g in range(gpu_counts.get(p.node, 0)) if g not in taken][: w.request.gpus_per_node]
        taken.update(free)
        pls = list(w.placements)
        pls[pi] = Placement(p.node, tuple(free))
        out[wi] = msgspec.structs.replace(w, placements=tuple(pls))
    return out


# ---------------------------------------------------------------------------------------------- scontrol -o
_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w:/]*)=")


def parse_scontrol_record(line: str) -> dict[str, str]:
    """One `scontrol show job|node -o` line -> {key: value}; a value runs to the next ` Key=`."""
    keys = list(_KEY.finditer(line))
    out: dict[str, str] = {}
    for k, nxt in zip(keys, [*keys[1:], None], strict=True):
        end = nxt.start() if nxt else len(line)
        out[k.group(1)] = line[k.end() : end].strip()
    return out


def job_info_from_scontrol(rec: Mapping[str, str]) -> JobInfo:
    states = _states(rec.get("JobState", ""))
    reason = rec.get("Reason", "")
    prio = rec.get("Priority", "")
    phase = job_phase(states, reason, int(prio) if prio.isdigit() else None, None)

    def nodes(key: str) -> tuple[str, ...]:
        return tuple(expand(rec.get(key, "")))

    return JobInfo(
        job_id=rec.get("JobId", ""),
        phase=phase,
        nodes=nodes("NodeList") if phase in (JobPhase.RUNNING, JobPhase.COMPLETING) else (),
        reason=reason,
        restarts=int(rec.get("Restarts", "0") or 0),
        required_nodes=nodes("ReqNodeList"),
        excluded_nodes=nodes("ExcNodeList"),
    )
