"""The cluster-autoscaler status ConfigMap (`kube-system/cluster-autoscaler-status`) → node groups.

Two formats exist: the structured YAML of cluster-autoscaler ≥ 1.30 (`autoscalerStatus:`, `nodeGroups:` with
`health.cloudProviderTarget/minSize/maxSize`) and the older free text (`Health: Healthy (ready=3 ...
cloudProviderTarget=3 (minSize=0, maxSize=3))`). Both are read; anything else gives no groups and a warning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import InputError
from ...fileio import parse_yaml

STATUS_NAMESPACE = "kube-system"
STATUS_NAME = "cluster-autoscaler-status"


@dataclass(frozen=True, slots=True)
class GroupStatus:
    name: str
    current: int  # cloudProviderTarget (else registered nodes)
    minimum: int
    maximum: int
    scale_up: str = ""  # NoActivity | InProgress | Backoff | ...


_LEGACY_NAME = re.compile(r"^\s*Name:\s*(\S+)\s*$")
_LEGACY_HEALTH = re.compile(
    r"^\s*Health:\s*\w+.*?registered=(\d+).*?cloudProviderTarget=(\d+)\s*\(minSize=(\d+),\s*maxSize=(\d+)\)")
_LEGACY_SCALEUP = re.compile(r"^\s*ScaleUp:\s*(\w+)")


def parse_status(text: str) -> list[GroupStatus] | None:
    """The node groups of a status text; None when the text is in neither known format."""
    if any(line.strip().startswith("autoscalerStatus:") for line in text.splitlines()):
        return _parse_yaml(text)
    if "NodeGroups:" in text or "Cluster-wide:" in text:
        return _parse_legacy(text)
    return None


def _int(v: object, default: int = 0) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _parse_yaml(text: str) -> list[GroupStatus] | None:
    try:  # the guarded parser: a deeply nested or alias-bombed status map is unreadable, not a RecursionError
        doc = parse_yaml(text, "cluster-autoscaler-status")
    except InputError:
        return None
    if not isinstance(doc, dict):
        return None
    out = []
    for g in doc.get("nodeGroups") or []:
        if not isinstance(g, dict) or not isinstance(g.get("name"), str):
            continue
        h = g.get("health") if isinstance(g.get("health"), dict) else {}
        counts = h.get("nodeCounts") if isinstance(h.get("nodeCounts"), dict) else {}
        reg = counts.get("registered") if isinstance(counts.get("registered"), dict) else {}
        target = h.get("cloudProviderTarget")
        current = _int(target, _int(reg.get("total")))
        up = g.get("scaleUp") if isinstance(g.get("scaleUp"), dict) else {}
        out.append(GroupStatus(g["name"], current, _int(h.get("minSize")), _int(h.get("maxSize")),
                               str(up.get("status") or "")))
    return out


def _parse_legacy(text: str) -> list[GroupStatus]:
    out: list[GroupStatus] = []
    name: str | None = None
    pending: GroupStatus | None = None
    in_groups = False
    for line in text.splitlines():
        if line.strip().startswith("NodeGroups:"):
            in_groups = True
            continue
        if not in_groups:
            continue
        m = _LEGACY_NAME.match(line)
        if m:
            if pending:
                out.append(pending)
            name, pending = m.group(1), None
            continue
        m = _LEGACY_HEALTH.match(line)
        if m and name:
            pending = GroupStatus(name, int(m.group(2)), int(m.group(3)), int(m.group(4)))
            continue
        m = _LEGACY_SCALEUP.match(line)
        if m and pending:
            pending = GroupStatus(pending.name, pending.current, pending.minimum, pending.maximum, m.group(1))
    if pending:
        out.append(pending)
    return out
