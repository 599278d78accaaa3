"""The scheduler's own words as evidence: `0/10 nodes are available: 2 Insufficient nvidia.com/gpu, 8 node(s) had
untolerated taint {dedicated: inference}. preemption: ...` split into its per-reason node counts, each mapped
onto the core diagnosis causes it can support.

The scheduler cannot tell a full cluster from a fragmented one, or a missing device plugin from either (all read
`Insufficient nvidia.com/gpu`): such reasons support several causes, and the computed picture decides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...core.diagnose import CauseCode as C

_HEAD = re.compile(r"(\d+)/(\d+) nodes are available:\s*(.*)", re.S)
_SPLIT = re.compile(r",\s+(?=\d+\s)")
_ITEM = re.compile(r"^(\d+)\s+(.*)$", re.S)
_END = re.compile(r"\.\s+")

# (pattern, causes it supports); first match wins
_RULES: tuple[tuple[re.Pattern[str], tuple[C, ...]], ...] = (
    (re.compile(r"Insufficient nvidia\.com/mig-"), (C.MIG_MIXED, C.INSUFFICIENT_GPUS, C.FRAGMENTATION)),
    (re.compile(r"Insufficient nvidia\.com/gpu"),
     (C.INSUFFICIENT_GPUS, C.FRAGMENTATION, C.DEVICE_PLUGIN_MISSING, C.MIG_MIXED, C.REQUEST_TOO_LARGE)),
    (re.compile(r"Insufficient (cpu|memory)"), (C.CPU_OR_MEMORY, C.FRAGMENTATION_CPU_MEMORY)),
    (re.compile(r"Insufficient (ephemeral-storage|pods|hugepages)"), (C.CPU_OR_MEMORY,)),
    (re.compile(r"node\.kubernetes\.io/(unschedulable|not-ready|unreachable)"), (C.NODES_UNSCHEDULABLE,)),
    (re.compile(r"were unschedulable"), (C.NODES_UNSCHEDULABLE,)),
    (re.compile(r"untolerated taint|had taint .*didn't tolerate"), (C.TAINTS_OR_SELECTORS,)),
    (re.compile(r"didn't match (Pod's )?node (affinity|selector)|node affinity/selector"),
     (C.TAINTS_OR_SELECTORS, C.NO_SUCH_GPU_MODEL)),
    (re.compile(r"exceeded quota"), (C.QUOTA_EXCEEDED,)),
    (re.compile(r"max node group size reached|max cluster (size|cores|memory).* reached|max limit reached"),
     (C.AUTOSCALER_AT_MAX,)),
    (re.compile(r"cannot allocate all claims|resourceclaim", re.I), (C.INSUFFICIENT_GPUS, C.FRAGMENTATION)),
)
_INFO = re.compile(r"Preemption is not helpful|No preemption victims|preemption:", re.I)


@dataclass(frozen=True, slots=True)
class Reason:
    nodes: int | None  # how many nodes gave this reason (None: the message has no count)
    text: str
    supports: tuple[C, ...]

    def as_dict(self) -> dict[str, object]:
        return {"nodes": self.nodes, "text": self.text, "supports": [c.value for c in self.supports]}


def classify(text: str) -> tuple[C, ...]:
    for pat, codes in _RULES:
        if pat.search(text):
            return codes
    return ()


def parse_message(message: str) -> tuple[int | None, list[Reason]]:
    """(nodes in the cluster, reasons). Preemption's own sentence is dropped: it restates the same nodes."""
    if not message:
        return None, []
    main = re.split(r"\.?\s*preemption:", message, maxsplit=1)[0]
    m = _HEAD.search(main)
    if m is None:
        # FailedCreate (quota), NotTriggerScaleUp (autoscaler) or a plugin's own text: one reason, no counts
        sub = re.search(r"pod didn't trigger scale-up:\s*(.*)", main)
        if sub:
            return None, [_reason(part) for part in _SPLIT.split(sub.group(1).rstrip(". "))]
        return None, [Reason(None, main.strip(), classify(main))]
    total = int(m.group(2))
    # the reasons end at the first sentence end; what follows before "preemption:" is a post-filter plugin's
    # own note (a real v1.35 scheduler adds DRA's "no new claims to deallocate,")
    reasons = _END.split(m.group(3).strip(), maxsplit=1)[0]
    return total, [_reason(part) for part in _SPLIT.split(reasons.strip().rstrip("."))
                   if part.strip() and not _INFO.search(part)]


def _reason(part: str) -> Reason:
    part = part.strip().rstrip(".")
    m = _ITEM.match(part)
    if m:
        return Reason(int(m.group(1)), m.group(2), classify(m.group(2)))
    return Reason(None, part, classify(part))
