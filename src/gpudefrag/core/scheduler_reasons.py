"""The schedulers' own pending reasons, mapped onto gpudefrag's diagnosis causes (a pure table).

Slurm says *that* a job waits ("Resources", "Priority"); gpudefrag's diagnosis says *why* (fragmentation or a
full cluster). So capacity reasons map to None (the diagnosis decides), ordinary reasons map to the cause they
are, and reasons that mean the job is not even eligible (held, dependency, begin time) are INELIGIBLE: no
amount of defragmentation starts such a job. Kubernetes reasons are messages ("0/4 nodes are available: ...")
with their own few ordinary cases; Slurm's rules are never applied to them. It lives in core so that a
snapshot's reasons are diagnosed without core importing an engine; the engines use it too.
"""

from __future__ import annotations

import re
from enum import StrEnum


class ReasonClass(StrEnum):
    CAPACITY = "capacity"  # waits for GPUs: diagnose decides (fragmentation / insufficient-gpus / fits-now)
    ORDINARY = "ordinary"  # an ordinary cause the scheduler already names
    INELIGIBLE = "ineligible"  # held, dependency, begin time...: not waiting for resources at all


# Cause codes as strings (the CauseCode values of core.diagnose, which imports this module).
QUOTA = "quota-exceeded"
UNSCHEDULABLE = "nodes-unschedulable"
TOO_LARGE = "request-too-large"
SELECTORS = "taints-or-selectors"
AUTOSCALER = "autoscaler-at-max"

SLURM_CAPACITY = frozenset({"Resources", "Priority", "None", "", "ReqNodeNotAvail, Reserved for maintenance"})

SLURM_INELIGIBLE = frozenset({
    "JobHeldUser", "JobHeldAdmin", "Dependency", "DependencyNeverSatisfied", "BeginTime", "Reservation",
    "InvalidAccount", "InvalidQOS", "JobArrayTaskLimit", "FrontEndDown", "Licenses", "BadConstraints",
    "SchedDefer", "Prolog", "Cleaning", "JobLaunchFailure", "NonZeroExitCode", "SystemFailure", "Requeued",
    "RequeuedHold",
})

SLURM_ORDINARY: dict[str, str] = {
    "ReqNodeNotAvail": UNSCHEDULABLE,
    "NodeDown": UNSCHEDULABLE,
    "PartitionDown": UNSCHEDULABLE,
    "PartitionInactive": UNSCHEDULABLE,
    "PartitionNodeLimit": TOO_LARGE,
    "PartitionConfig": TOO_LARGE,
    "InvalidNodeName": SELECTORS,
    "AccountNotAllowed": SELECTORS,
    "QOSNotAllowed": SELECTORS,
    "PowerDown": AUTOSCALER,
    "PowerUp": AUTOSCALER,
}

# Kubernetes: the PodScheduled condition's reason/message, or a FailedScheduling event's message.
KUBE_RULES: tuple[tuple[re.Pattern[str], ReasonClass, str | None], ...] = (
    (re.compile(r"exceeded quota|forbidden: exceeded", re.I), ReasonClass.ORDINARY, QUOTA),
    (re.compile(r"^SchedulingGated$|scheduling gates", re.I), ReasonClass.INELIGIBLE, None),
)

_QUOTA_REFUSAL = re.compile(r"exceeded quota|forbidden: exceeded", re.I)


def refused_by_quota(reason: str) -> bool:
    """Kubernetes: the ResourceQuota admission refused to create the workload's pods (`FailedCreate ... exceeded
    quota` on its Job/ReplicaSet). A pod that exists is never refused by a quota, only one being created."""
    return bool(_QUOTA_REFUSAL.search(reason))


_SLURM_TOKEN = re.compile(r"^[A-Z][A-Za-z]*(,.*)?$")


# What a Slurm limit reason means, named in the diagnosis (every `*Limit` reason is a quota/limit cause; these are
# the ones an admin meets most, the rest are named by their token alone).
SLURM_LIMITS: dict[str, str] = {
    "PartitionTimeLimit": "the job's time limit is longer than the partition's MaxTime",
    "PartitionNodeLimit": "the job asks for more nodes than the partition allows",
    "AssocGrpGRES": "the association's group GRES (GPU) limit is reached",
    "AssocMaxJobsLimit": "the association's maximum number of running jobs is reached",
    "QOSMaxGRESPerUser": "the QOS limit on GPUs per user is reached",
    "QOSGrpGRES": "the QOS group GRES (GPU) limit is reached",
}


def slurm_limit(reason: str) -> str | None:
    """The limit a Slurm reason names (`PartitionTimeLimit`, `QOSMaxGRESPerUser`...), or None for a reason that
    is not a limit."""
    head = reason.split(",", 1)[0].strip()
    cls, code = classify_slurm(head)
    if cls is not ReasonClass.ORDINARY or code != QUOTA:
        return None
    return head


def guess_scheduler(reason: str) -> str:
    """'slurm' for a Slurm reason token (`QOSMaxGRESPerUser`, `ReqNodeNotAvail, ...`), else 'kubernetes'."""
    r = reason.strip()
    return "slurm" if not r or _SLURM_TOKEN.match(r) else "kubernetes"


def classify_slurm(reason: str) -> tuple[ReasonClass, str | None]:
    """(class, cause code) for a Slurm pending reason. Limits (Assoc*/QOS* ...Limit, GrpTRES) are quotas."""
    r = reason.strip()
    if r in SLURM_CAPACITY:
        return ReasonClass.CAPACITY, None
    if r in SLURM_INELIGIBLE:
        return ReasonClass.INELIGIBLE, None
    head = r.split(",", 1)[0].strip()
    if head in SLURM_ORDINARY:
        return ReasonClass.ORDINARY, SLURM_ORDINARY[head]
    if head.startswith(("Assoc", "QOS", "MaxGRES", "MaxCpu", "MaxNode")) or "Limit" in head or "GRES" in head:
        return ReasonClass.ORDINARY, QUOTA
    return ReasonClass.CAPACITY, None


def classify_kube(reason: str) -> tuple[ReasonClass, str | None]:
    for pattern, cls, code in KUBE_RULES:
        if pattern.search(reason):
            return cls, code
    return ReasonClass.CAPACITY, None


def classify(reason: str, scheduler: str = "") -> tuple[ReasonClass, str | None]:
    """(class, cause code) for a pending reason of `scheduler` ("slurm", "kubernetes"; "" = guess from the
    reason's shape)."""
    kind = scheduler or guess_scheduler(reason)
    return classify_slurm(reason) if kind == "slurm" else classify_kube(reason)


def waits_for_resources(reason: str, scheduler: str = "") -> bool:
    """True when starting the job only needs GPUs to be free (the only case a defrag move can help)."""
    return classify(reason, scheduler)[0] is ReasonClass.CAPACITY
