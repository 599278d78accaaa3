"""Prometheus `/metrics`: computed from the current cluster and the move history at scrape time.

A custom collector (not counters bumped in request handlers) so the numbers are always those of the state the
dashboard shows: free GPUs, stranded GPUs per request shape, whole-free nodes, pending GPU jobs by diagnosed
cause, moves by outcome, move duration, GPU-seconds spent moving, lost work and checkpoint age.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ..core.diagnose import CauseCode, diagnose_all
from ..core.fragmentation import frag_report
from ..core.model import MILLI, ClusterState
from .source import ClusterSource
from .views import map_request, stranded_by_shape

DURATION_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
PREFIX = "gpudefrag"
FINISHED = frozenset({"done", "rolled-back", "cold-started", "aborted"})  # the journal's terminal states


def _ts(v: Any) -> float | None:
    """Journal times may be epoch seconds or ISO-8601 strings."""
    if isinstance(v, int | float) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            pass
        try:
            t = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError:
            return None
        return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).timestamp()
    return None


def move_stats(state: ClusterState, source: ClusterSource, journal: list[dict[str, Any]]) -> dict[str, Any]:
    """Outcomes, durations, GPU-seconds moving and lost work over the dashboard's own and the journal's moves."""
    outcomes: Counter[str] = Counter()
    durations: list[float] = []
    gpu_s = 0.0
    lost = 0.0
    for m in source.moves:
        outcomes[m.state] += 1
        durations.append(m.duration_s)
        gpu_s += m.gpu_s or m.duration_s * m.gpus
        lost += m.lost_work_gpu_s
    for row in journal:
        state_name = str(row.get("state", "unknown"))
        outcomes[state_name] += 1
        start, end = _ts(row.get("created_at")), _ts(row.get("updated_at"))
        if start is None or end is None or end < start:
            continue
        if state_name in FINISHED:  # a move still in flight has no duration yet
            durations.append(end - start)
        wid = row.get("workload_id")
        gpus = 0
        if isinstance(wid, str) and wid in state.workload_index:
            r = state.workload(wid).request
            gpus = r.gpus_total * r.gpu_milli / MILLI
        gpu_s += (end - start) * gpus
    return {"outcomes": outcomes, "durations": durations, "gpu_s": gpu_s, "lost_gpu_s": lost}


class DashboardCollector(Collector):
    def __init__(self, source: ClusterSource, journal: Callable[[], list[dict[str, Any]]]) -> None:
        self.source = source
        self.journal = journal

    def collect(self) -> Iterator[Metric]:
        state = self.source.state()
        request = map_request(state)
        rep = frag_report(state, request)

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)

        yield gauge("gpus", "GPUs in the cluster (capacity).", rep.gpus)
        yield gauge("free_gpus", "Wholly free GPUs.", rep.free_gpus)
        yield gauge("free_gpu_share", "Free GPU share in GPUs, partially used GPUs included.", rep.free_milli / MILLI)
        yield gauge("whole_free_nodes", "Nodes whose every usable GPU is free.", rep.whole_free_nodes)
        yield gauge("fgd_fragmentation_ratio", "FGD fragmentation as a share of the free GPU share.", rep.fgd_ratio)
        yield gauge("running_jobs", "Running workloads.", len(state.running))
        stranded = GaugeMetricFamily(f"{PREFIX}_stranded_gpus",
                                     "Free GPUs a request of this shape cannot use (too few free on their node).",
                                     labels=["shape"])
        for shape, n in stranded_by_shape(state).items():
            stranded.add_metric([shape], n)
        yield stranded
        by_cause: Counter[str] = Counter(d.primary.code.value for d in diagnose_all(state))
        pending = GaugeMetricFamily(f"{PREFIX}_pending_gpu_jobs", "Pending GPU jobs by primary diagnosed cause.",
                                    labels=["cause"])
        for code in CauseCode:
            pending.add_metric([code.value], by_cause.get(code.value, 0))
        yield pending

        stats = move_stats(state, self.source, self.journal())
        moves = CounterMetricFamily(f"{PREFIX}_moves", "Moves by outcome (journal and dashboard).",
                                    labels=["outcome"])
        for outcome, n in sorted(stats["outcomes"].items()):
            moves.add_metric([outcome], n)
        yield moves
        durations: list[float] = stats["durations"]
        buckets = [(str(b), float(sum(1 for d in durations if d <= b))) for b in DURATION_BUCKETS]
        buckets.append(("+Inf", float(len(durations))))
        yield HistogramMetricFamily(f"{PREFIX}_move_duration_seconds", "Duration of a move (checkpoint to restore).",
                                    buckets=buckets, sum_value=float(sum(durations)))
        yield CounterMetricFamily(f"{PREFIX}_moving_gpu_seconds", "GPU-seconds spent moving workloads.",
                                  value=stats["gpu_s"])
        yield CounterMetricFamily(f"{PREFIX}_lost_work_gpu_seconds",
                                  "GPU-seconds of work lost by moves (work since the last checkpoint).",
                                  value=stats["lost_gpu_s"])
        age = GaugeMetricFamily(f"{PREFIX}_checkpoint_age_seconds",
                                "Seconds since each running workload's last checkpoint (cluster clock).",
                                labels=["workload"])
        oldest = 0.0
        for w in state.running:
            if w.last_checkpoint_at is None:
                continue
            a = max(0.0, state.now - w.last_checkpoint_at)
            oldest = max(oldest, a)
            age.add_metric([w.id], a)
        yield age
        yield gauge("checkpoint_age_max_seconds", "Oldest last checkpoint among running workloads.", oldest)
        yield gauge("never_checkpointed_jobs", "Running workloads with no checkpoint at all.",
                    sum(1 for w in state.running if w.last_checkpoint_at is None))


def metrics_registry(source: ClusterSource, journal: Callable[[], list[dict[str, Any]]]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DashboardCollector(source, journal))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
