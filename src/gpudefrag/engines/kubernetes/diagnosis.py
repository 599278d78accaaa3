"""Kubernetes diagnosis: the core diagnosis of the computed picture, with the scheduler's (and the autoscaler's)
own messages beside it as evidence, and whether the two agree."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from ...core.diagnose import Diagnosis, diagnose_all
from .convert import KubeCluster
from .scheduler_messages import Reason, parse_message


@dataclass(frozen=True)
class KubeDiagnosis:
    diagnosis: Diagnosis
    message_source: str  # PodScheduled | FailedScheduling event | FailedCreate event | ""
    nodes_total: int | None
    reasons: tuple[Reason, ...]
    autoscaler: tuple[Reason, ...] = ()
    owner: str | None = None
    priority_class: str = ""

    @property
    def agreement(self) -> str:
        """`agrees` when the scheduler's reasons support the primary computed cause, `differs` when they support
        none of the computed causes, `partial` otherwise, `no-message` when the scheduler said nothing."""
        reasons = self.reasons + self.autoscaler
        if not reasons:
            return "no-message"
        supported = {c for r in reasons for c in r.supports}
        if self.diagnosis.primary.code in supported:
            return "agrees"
        if supported & set(self.diagnosis.codes):
            return "partial"
        return "differs"

    def confirmed(self) -> list[str]:
        supported = {c for r in self.reasons + self.autoscaler for c in r.supports}
        return [c.value for c in self.diagnosis.codes if c in supported]

    def as_dict(self) -> dict[str, object]:
        d = self.diagnosis.as_dict()
        d["kubernetes"] = {
            "owner": self.owner,
            "priority_class": self.priority_class,
            "message_source": self.message_source,
            "nodes_total": self.nodes_total,
            "scheduler_reasons": [r.as_dict() for r in self.reasons],
            "autoscaler_reasons": [r.as_dict() for r in self.autoscaler],
            "agreement": self.agreement,
            "confirmed_by_scheduler": self.confirmed(),
        }
        return d


def diagnose_kube(cluster: KubeCluster, ids: Iterable[str] | None = None) -> list[KubeDiagnosis]:
    """Diagnose every pending GPU pod (or those named), oldest first."""
    out = []
    for d in _diagnose_shapes(cluster, ids):
        info = cluster.pods.get(d.workload_id or "")
        total, reasons = parse_message(d.scheduler_reason)
        auto: list[Reason] = []
        if info and info.autoscaler_message:
            auto = parse_message(info.autoscaler_message)[1]
        out.append(KubeDiagnosis(
            d,
            info.scheduler_source if info else "",
            total,
            tuple(reasons),
            tuple(auto),
            f"{info.owner.kind}/{info.owner.name}" if info and info.owner else None,
            info.priority_class if info else "",
        ))
    return out


def _diagnose_shapes(cluster: KubeCluster, ids: Iterable[str] | None) -> list[Diagnosis]:
    """`diagnose_all`, computed once per (namespace, request shape): the pods of one Job or Deployment wait for
    the same reasons, and a large cluster may have hundreds of them pending."""
    state = cluster.state
    wanted = set(ids) if ids is not None else None
    pending = [w for w in state.pending if (wanted is None or w.id in wanted)
               and (w.request.gpus_per_node > 0 or w.request.mig_profile is not None)]
    first: dict[tuple[str, str], str] = {}
    for w in pending:
        first.setdefault((w.namespace, repr(w.request)), w.id)
    by_id = {d.workload_id: d for d in diagnose_all(state, list(first.values()))}
    out = []
    for w in pending:
        d = by_id[first[(w.namespace, repr(w.request))]]
        out.append(d if d.workload_id == w.id else
                   dataclasses.replace(d, workload_id=w.id, scheduler_reason=w.scheduler_reason))
    return out
