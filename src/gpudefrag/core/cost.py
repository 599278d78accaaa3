"""What moving a running workload costs, and what the alternatives (evict, drain) would cost instead.

A move = checkpoint (write the workload's state) + transfer (to the target node) + restore, each following the
checkpoint's bytes and a bandwidth, plus a fixed overhead (stop, requeue, start). When the move reuses the last
heartbeat checkpoint instead of taking a fresh one, the work done since that checkpoint is lost too. Every cost
is reported in seconds (wall time the workload does not progress) and GPU-seconds (that, times the GPUs it
holds), because GPU-seconds are what a cluster pays. Pure: `now` always comes from the ClusterState.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np

from .model import MILLI, Workload

GB = 1e9

# A CPU-only workload (0 GPUs) costs this many score units per second of its move, so moving it is not free.
SECONDS_WEIGHT = 1e-3


def gpu_equivalents(w: Workload) -> float:
    """GPUs a workload holds, fractional shares counted as fractions (a 0.5-GPU share is 0.5)."""
    r = w.request
    return r.gpus_per_node * r.node_count * min(r.gpu_milli, MILLI) / MILLI


@dataclass(frozen=True, slots=True)
class MoveCost:
    """One move's cost, by component. `total_s` = downtime + lost work; `gpu_s` = total_s × GPUs held."""

    checkpoint_s: float
    transfer_s: float
    restore_s: float
    overhead_s: float
    lost_work_s: float
    gpus: float
    fresh_checkpoint: bool

    @property
    def downtime_s(self) -> float:
        """Wall time the workload is not running."""
        return self.checkpoint_s + self.transfer_s + self.restore_s + self.overhead_s

    @property
    def total_s(self) -> float:
        return self.downtime_s + self.lost_work_s

    @property
    def gpu_s(self) -> float:
        return self.total_s * self.gpus

    @property
    def score(self) -> float:
        """What the planner minimises: GPU-seconds (seconds × SECONDS_WEIGHT for a CPU-only workload)."""
        return self.gpu_s if self.gpus > 0 else SECONDS_WEIGHT * self.total_s

    def as_dict(self) -> dict[str, float | bool]:
        return {
            "checkpoint_s": self.checkpoint_s,
            "transfer_s": self.transfer_s,
            "restore_s": self.restore_s,
            "overhead_s": self.overhead_s,
            "lost_work_s": self.lost_work_s,
            "downtime_s": self.downtime_s,
            "total_s": self.total_s,
            "gpus": self.gpus,
            "gpu_s": self.gpu_s,
            "fresh_checkpoint": self.fresh_checkpoint,
        }


@dataclass(frozen=True, slots=True)
class AltCost:
    """The cost of an alternative to moving (evict or drain). `known` is False when it cannot be estimated
    (a drain of a workload with no expected end); then seconds and gpu_s are infinite."""

    kind: str  # "evict" | "drain"
    seconds: float
    gpu_s: float
    known: bool = True
    detail: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "seconds": self.seconds if self.known else None,
            "gpu_s": self.gpu_s if self.known else None,
            "known": self.known,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class TransferSample:
    """One measured migration (from the journal): bytes moved and how long each phase took."""

    source: str
    target: str
    bytes: int
    checkpoint_s: float
    transfer_s: float
    restore_s: float


# Label a workload may carry with the time (snapshot clock) of its last *application* checkpoint, which is
# what an eviction restarts from. Without it an eviction restarts from scratch (all work since start is lost).
APP_CHECKPOINT_LABEL = "gpudefrag.io/app-checkpoint-at"


@dataclass(frozen=True)
class CostModel:
    """Bandwidths and fixed times. Defaults (documented in docs/planner.md): checkpoint written at 2 GB/s
    (local NVMe), sent at 1.25 GB/s (10 Gb/s link), restored at 2 GB/s, 10 s fixed overhead per move, 300 s
    cold start after an eviction. `link_bps` overrides the transfer bandwidth per (source, target) node pair."""

    checkpoint_bps: float = 2 * GB
    transfer_bps: float = 1.25 * GB
    restore_bps: float = 2 * GB
    overhead_s: float = 10.0
    cold_start_s: float = 300.0
    shared_storage: bool = False  # checkpoints land on storage both nodes read: no transfer step
    link_bps: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("checkpoint_bps", "transfer_bps", "restore_bps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"CostModel.{name} must be > 0")
        if any(not v > 0 for v in self.link_bps.values()):
            raise ValueError("CostModel.link_bps values must be > 0")
        object.__setattr__(self, "link_bps", MappingProxyType(dict(self.link_bps)))

    # ------------------------------------------------------------------ construction
    def from_history(self, samples: Iterable[TransferSample]) -> CostModel:
        """A model whose bandwidths are the medians measured in past migrations (per node pair for the
        transfer); phases with no sample keep this model's value."""
        ck: list[float] = []
        rs: list[float] = []
        tx: list[float] = []
        pairs: dict[tuple[str, str], list[float]] = {}
        for s in samples:
            if s.bytes <= 0:
                continue
            if s.checkpoint_s > 0:
                ck.append(s.bytes / s.checkpoint_s)
            if s.restore_s > 0:
                rs.append(s.bytes / s.restore_s)
            if s.transfer_s > 0:
                tx.append(s.bytes / s.transfer_s)
                pairs.setdefault((s.source, s.target), []).append(s.bytes / s.transfer_s)
        links = dict(self.link_bps)
        links.update({k: statistics.median(v) for k, v in pairs.items()})
        return replace(
            self,
            checkpoint_bps=statistics.median(ck) if ck else self.checkpoint_bps,
            restore_bps=statistics.median(rs) if rs else self.restore_bps,
            transfer_bps=statistics.median(tx) if tx else self.transfer_bps,
            link_bps=links,
        )

    # ------------------------------------------------------------------ one move
    def bandwidth(self, source: str, target: str) -> float:
        return self.link_bps.get((source, target), self.transfer_bps)

    def move_cost(
        self, w: Workload, source: str, target: str, now: float, *, fresh_checkpoint: bool = True
    ) -> MoveCost:
        """Cost of moving `w` from `source` to `target`. Without a fresh checkpoint the last heartbeat
        checkpoint is restored and the work since it is lost; a workload that was never checkpointed always
        gets a fresh one."""
        fresh = fresh_checkpoint or w.last_checkpoint_at is None
        b = float(w.checkpoint_bytes)
        transfer = 0.0 if self.shared_storage else b / self.bandwidth(source, target)
        return MoveCost(
            checkpoint_s=b / self.checkpoint_bps if fresh else 0.0,
            transfer_s=transfer,
            restore_s=b / self.restore_bps,
            overhead_s=self.overhead_s,
            lost_work_s=0.0 if fresh else max(0.0, now - float(w.last_checkpoint_at or now)),
            gpus=gpu_equivalents(w),
            fresh_checkpoint=fresh,
        )

    def score_vector(
        self, ckpt_bytes: np.ndarray, ckpt_age_s: np.ndarray, gpus: np.ndarray, *, fresh_checkpoint: bool = True
    ) -> np.ndarray:
        """`MoveCost.score` for many workloads at once with the default link (for ranking candidates).
        `ckpt_age_s` is NaN where a workload was never checkpointed."""
        b = ckpt_bytes.astype(np.float64)
        never = np.isnan(ckpt_age_s)
        fresh = np.full(b.shape, fresh_checkpoint) | never
        transfer = 0.0 if self.shared_storage else b / self.transfer_bps
        total = (
            np.where(fresh, b / self.checkpoint_bps, 0.0)
            + transfer
            + b / self.restore_bps
            + self.overhead_s
            + np.where(fresh, 0.0, np.maximum(np.nan_to_num(ckpt_age_s), 0.0))
        )
        return np.where(gpus > 0, total * gpus, SECONDS_WEIGHT * total)

    # ------------------------------------------------------------------ alternatives
    def eviction_cost(self, w: Workload, now: float) -> AltCost:
        """Stop it; it restarts from its last application checkpoint (label APP_CHECKPOINT_LABEL) or from
        scratch, plus a cold start."""
        raw = w.labels.get(APP_CHECKPOINT_LABEL)
        since: float | None
        try:
            since = float(raw) if raw is not None else w.started_at
        except ValueError:
            since = w.started_at
        lost = max(0.0, now - since) if since is not None else 0.0
        seconds = lost + self.cold_start_s
        detail = f"{lost:.0f} s of work lost" + ("" if raw is not None else " (no application checkpoint)")
        detail += f" + {self.cold_start_s:.0f} s cold start"
        return AltCost("evict", seconds, seconds * gpu_equivalents(w), True, detail)

    def drain_cost(self, w: Workload, now: float) -> AltCost:
        """Wait for it to finish: its remaining time, if the scheduler knows the expected end. The GPU-seconds
        are those its node is held back from the waiting request (its GPUs × the wait)."""
        if w.expected_end_at is None:
            return AltCost("drain", float("inf"), float("inf"), False, "no expected end time")
        remaining = max(0.0, w.expected_end_at - now)
        return AltCost("drain", remaining, remaining * gpu_equivalents(w), True, f"{remaining:.0f} s remaining")


def alternatives(request_gpus: float, workloads: Sequence[Workload], now: float,
                 model: CostModel) -> tuple[AltCost, ...]:
    """What the other ways to free the same room cost, beside moving `workloads` (the jobs a plan moves):

    - evict: stop them; each restarts from its last application checkpoint (or from zero) after a cold start;
    - drain: cordon the node and wait for them all to end — the waiting request loses its GPUs × the longest
      remaining time, and GPUs freed earlier sit idle until the last one ends;
    - wait: do nothing until their known end — the request's GPUs × the longest remaining time, not guaranteed
      (another job may take the GPUs first).
    A drain or wait is unknown (infinite) when some workload has no expected end."""
    evicts = [model.eviction_cost(w, now) for w in workloads]
    evict = AltCost("evict", max((e.seconds for e in evicts), default=0.0), sum(e.gpu_s for e in evicts), True,
                    "; ".join(f"{w.id}: {e.detail}" for w, e in zip(workloads, evicts, strict=True)))
    ends = [w.expected_end_at for w in workloads]
    if any(e is None for e in ends):
        unknown = [w.id for w in workloads if w.expected_end_at is None]
        why = f"no expected end time for {', '.join(unknown[:3])}"
        inf = float("inf")
        return evict, AltCost("drain", inf, inf, False, why), AltCost("wait", inf, inf, False, why)
    remaining = [max(0.0, float(e) - now) for e in ends if e is not None]
    longest = max(remaining, default=0.0)
    idle = sum((longest - r) * gpu_equivalents(w) for w, r in zip(workloads, remaining, strict=True))
    waiting = longest * request_gpus
    drain = AltCost("drain", longest, waiting + idle, True,
                    f"cordon and wait {longest:.0f} s for the last to end; {idle:.0f} GPU-s idle meanwhile")
    wait = AltCost("wait", longest, waiting, True,
                   f"wait {longest:.0f} s for their known end (not guaranteed: other jobs may take the GPUs)")
    return evict, drain, wait
