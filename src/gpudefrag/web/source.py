"""Where the dashboard's cluster comes from, and what it remembers between requests.

Two kinds: an in-memory cluster (a snapshot file, the demo, or the `sim` engine) that the dashboard may change
itself when actions are enabled (apply a plan, record a checkpoint), and a live engine (Slurm, Kubernetes) that
is observed, at most once per `ttl_s`, and never changed from here (the controller moves jobs, not the page).
Every observation appends one sample to a small in-memory time series (fragmentation and stranded GPUs over time).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.fragmentation import frag_report
from ..core.model import MILLI, ClusterState
from .views import map_request

MAX_SAMPLES = 1440


@dataclasses.dataclass(frozen=True)
class Sample:
    at: float  # wall clock, seconds since the epoch
    free_gpus: int
    whole_free_nodes: int
    stranded_gpus: int
    request: str
    fgd_ratio: float
    pending: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def sample_of(state: ClusterState, at: float) -> Sample:
    request = map_request(state)
    rep = frag_report(state, request)
    return Sample(at, rep.free_gpus, rep.whole_free_nodes, rep.stranded_gpus, request.label(), rep.fgd_ratio,
                  len(state.pending_gpu))


@dataclasses.dataclass
class MoveRecord:
    """A move the dashboard applied to an in-memory cluster, in the journal's history shape plus its cost."""

    id: str
    workload_id: str
    source: str
    target: str
    state: str
    reason: str
    created_at: float
    updated_at: float
    steps: list[dict[str, Any]]
    gpus: int = 0
    duration_s: float = 0.0  # the cost model's estimate (nothing really moved)
    gpu_s: float = 0.0
    lost_work_gpu_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ClusterSource:
    """Holds the current ClusterState, a version that changes with it, the samples and the applied moves."""

    def __init__(self, engine_name: str, *, mutable: bool, clock: Callable[[], float] = time.time) -> None:
        self.engine_name = engine_name
        self.mutable = mutable
        self.clock = clock
        self.version = 0
        self.samples: deque[Sample] = deque(maxlen=MAX_SAMPLES)
        self.moves: list[MoveRecord] = []
        self.checkpoints: dict[str, float] = {}  # workload id -> wall time a checkpoint was triggered here
        self._plans: dict[tuple[int, str], Any] = {}  # (version, workload id) -> the plan previewed
        self.lock = threading.RLock()

    def state(self) -> ClusterState:
        raise NotImplementedError

    def close(self) -> None:
        """Release what observing holds (a live engine's watch threads). Nothing for a fixed state."""

    def plan_for(self, version: int, workload_id: str, make: Callable[[], Any]) -> Any:
        """The plan previewed for this workload at this version, made once: applying a preview applies exactly
        the moves that were shown (the solver may break ties differently on a second run)."""
        key = (version, workload_id)
        with self.lock:
            if key in self._plans:
                return self._plans[key]
        plan = make()  # outside the lock: planning may take seconds, the page keeps refreshing meanwhile
        with self.lock:
            if version != self.version:  # the cluster moved on while planning: do not cache
                return plan
            for stale in [k for k in self._plans if k[0] != self.version]:
                del self._plans[stale]
            if len(self._plans) >= 64:
                self._plans.clear()
            return self._plans.setdefault(key, plan)

    def _record(self, state: ClusterState) -> None:
        self.samples.append(sample_of(state, self.clock()))


class MemorySource(ClusterSource):
    """A cluster held in memory (snapshot, demo, sim engine): actions change it in place."""

    def __init__(self, state: ClusterState, engine_name: str = "sim", *,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(engine_name, mutable=True, clock=clock)
        self._state = state
        self._record(state)

    def state(self) -> ClusterState:
        with self.lock:
            return self._state

    def replace(self, new: ClusterState, moves: list[MoveRecord] | None = None) -> int:
        """Swap in a new state (after a plan or a checkpoint), bump the version, take a sample."""
        with self.lock:
            self._state = new
            self.version += 1
            if moves:
                self.moves.extend(moves)
            self._record(new)
            return self.version


class EngineSource(ClusterSource):
    """A live engine observed at most once per `ttl_s`; read-only from the dashboard."""

    def __init__(self, engine: Any, engine_name: str, *, ttl_s: float = 5.0,
                 clock: Callable[[], float] = time.time,
                 enrich: Callable[[ClusterState], ClusterState] | None = None) -> None:
        super().__init__(engine_name, mutable=False, clock=clock)
        self.engine = engine
        self.enrich = enrich  # e.g. checkpoint sizes and times from the store (metrics, move prices)
        self.ttl_s = ttl_s
        self._state: ClusterState | None = None
        self._at = 0.0

    def state(self) -> ClusterState:
        with self.lock:
            now = self.clock()
            if self._state is None or now - self._at >= self.ttl_s:
                new = self.engine.observe()
                if self.enrich is not None:
                    new = self.enrich(new)
                if self._state is None or new is not self._state:
                    self.version += 1
                self._state, self._at = new, now
                self._record(new)
            return self._state

    def close(self) -> None:
        """End the engine's watches: a watch thread still reading from the API server when the interpreter
        finalizes can take the process down with SIGABRT instead of a clean exit."""
        close = getattr(self.engine, "close", None)
        if callable(close):
            close()


def make_engine(name: str) -> Any:
    """Construct a live engine by name with its defaults (Slurm: the CLI tools on PATH; Kubernetes: the current
    kubeconfig context), from the one engine registry."""
    from ..engines.registry import make_engine as build

    return build(name)


def move_records(state: ClusterState, plan: Any, at: float, reason: str) -> list[MoveRecord]:
    """Journal-shaped records for the moves of a plan applied to an in-memory cluster."""
    out = []
    for m in plan.moves:
        w = state.workload(m.workload_id)
        cost = getattr(m, "cost", None)  # core.cost.MoveCost: seconds by component, GPUs held
        gpus = float(getattr(cost, "gpus", w.request.gpus_total * w.request.gpu_milli / MILLI))
        seconds = float(getattr(cost, "downtime_s", 0.0))
        lost = float(getattr(cost, "lost_work_s", 0.0)) * gpus
        steps = [{"state": s, "at": at, "detail": d} for s, d in (
            ("planned", f"{m.source} -> {m.target}"),
            ("done", "applied to the in-memory cluster from the dashboard"),
        )]
        out.append(MoveRecord(
            id=uuid.uuid4().hex[:12], workload_id=m.workload_id, source=m.source, target=m.target, state="done",
            reason=reason, created_at=at, updated_at=at, steps=steps, gpus=w.request.gpus_total,
            duration_s=seconds, gpu_s=seconds * gpus, lost_work_gpu_s=lost,
        ))
    return out


def read_journal(path: Path | None, limit: int = 100) -> tuple[list[dict[str, Any]], str]:
    """The journal's migration history, or ([], why not) when there is no journal to read."""
    if path is None:
        return [], "no journal configured (serve --journal FILE)"
    if not path.exists():
        return [], f"journal {path} does not exist yet"
    from ..control.journal import Journal

    try:
        j = Journal(path, readonly=True)  # the dashboard never writes (or creates) the journal
        try:
            rows = j.history(limit=limit)
        finally:
            close = getattr(j, "close", None)
            if callable(close):
                close()
    except Exception as e:  # a corrupt or locked journal must not take the page down
        return [], f"cannot read journal {path}: {e}"
    return [dict(r) for r in rows], ""
