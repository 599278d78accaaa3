"""Slurm's pending reasons, mapped onto gpudefrag's diagnosis causes.

Slurm says *that* a job waits ("Resources", "Priority"); gpudefrag's diagnosis says *why* (fragmentation or a
full cluster). So capacity reasons map to None (the diagnosis decides), ordinary reasons map to the cause they
are, and reasons that mean the job is not even eligible (held, dependency, begin time) map to INELIGIBLE: no
amount of defragmentation starts such a job, so they never trigger a move.
"""

from __future__ import annotations

from enum import StrEnum

from ...core.diagnose import CauseCode


class ReasonClass(StrEnum):
    CAPACITY = "capacity"  # waits for GPUs: diagnose decides (fragmentation / insufficient-gpus / fits-now)
    ORDINARY = "ordinary"  # an ordinary cause Slurm already names
    INELIGIBLE = "ineligible"  # held, dependency, begin time...: not waiting for resources at all


CAPACITY_REASONS = frozenset({"Resources", "Priority", "None", "", "ReqNodeNotAvail, Reserved for maintenance"})

INELIGIBLE_REASONS = frozenset({
    "JobHeldUser", "JobHeldAdmin", "Dependency", "DependencyNeverSatisfied", "BeginTime", "Reservation",
    "InvalidAccount", "InvalidQOS", "JobArrayTaskLimit", "FrontEndDown", "Licenses", "BadConstraints",
    "SchedDefer", "Prolog", "Cleaning", "JobLaunchFailure", "NonZeroExitCode", "SystemFailure", "Requeued",
    "RequeuedHold",
})

_ORDINARY: dict[str, CauseCode] = {
    "ReqNodeNotAvail": CauseCode.NODES_UNSCHEDULABLE,
    "NodeDown": CauseCode.NODES_UNSCHEDULABLE,
    "PartitionDown": CauseCode.NODES_UNSCHEDULABLE,
    "PartitionInactive": CauseCode.NODES_UNSCHEDULABLE,
    "PartitionNodeLimit": CauseCode.REQUEST_TOO_LARGE,
    "PartitionConfig": CauseCode.REQUEST_TOO_LARGE,
    "InvalidNodeName": CauseCode.TAINTS_OR_SELECTORS,
    "PartitionTimeLimit": CauseCode.TAINTS_OR_SELECTORS,
    "AccountNotAllowed": CauseCode.TAINTS_OR_SELECTORS,
    "QOSNotAllowed": CauseCode.TAINTS_OR_SELECTORS,
    "PowerDown": CauseCode.AUTOSCALER_AT_MAX,
    "PowerUp": CauseCode.AUTOSCALER_AT_MAX,
}


def classify(reason: str) -> tuple[ReasonClass, CauseCode | None]:
    """(class, cause) for a Slurm pending reason. Limits (Assoc*/QOS* ...Limit, GrpTRES) are quota causes."""
    r = reason.strip()
    if r in CAPACITY_REASONS:
        return ReasonClass.CAPACITY, None
    if r in INELIGIBLE_REASONS:
        return ReasonClass.INELIGIBLE, None
    head = r.split(",", 1)[0].strip()
    if head in _ORDINARY:
        return ReasonClass.ORDINARY, _ORDINARY[head]
    if head.startswith(("Assoc", "QOS", "MaxGRES", "MaxCpu", "MaxNode")) or "Limit" in head or "GRES" in head:
        return ReasonClass.ORDINARY, CauseCode.QUOTA_EXCEEDED
    return ReasonClass.CAPACITY, None


def map_reason(reason: str) -> CauseCode | None:
    """The diagnosis cause a Slurm reason names, or None when gpudefrag's own diagnosis must decide."""
    return classify(reason)[1]


def waits_for_resources(reason: str) -> bool:
    """True when starting the job only needs GPUs to be free (the only case a defrag move can help)."""
    return classify(reason)[0] is ReasonClass.CAPACITY
