"""What `gpudefrag controller --engine kubernetes` needs: an executor with the surface of
`gpudefrag.control.executor.Executor` (`submit`, `tick`, `active`, `busy_workloads`, `journal`) that runs
Kubernetes moves as `MoveSequence`s through the journal, under the policy's disruption budget.

`submit` journals the moves the budget admits (PLANNED); `tick` recovers what a previous process left
unfinished (once), then builds each admitted move's sequence from a fresh observation and runs it to the end
(synchronously: a tick may take as long as the replacement takes to become Ready).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from ...control.executor import Admission, ExecutorConfig, MoveLike
from ...control.journal import Journal, Migration, MigrationState
from .engine import KubernetesEngine
from .executor import Executor, Publisher
from .journaled import ENGINE, JournaledMoves
from .moves import MoveOptions, SimpleMove, build_move


class KubeMoveExecutor:
    def __init__(self, engine: KubernetesEngine, journal: Journal, config: ExecutorConfig | None = None, *,
                 options: MoveOptions | None = None, publish: Publisher | None = None,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 log: Callable[[str], None] | None = None) -> None:
        self.engine = engine
        self.journal = journal
        self.config = config or ExecutorConfig()
        self.options = options or MoveOptions(ready_timeout_s=self.config.restore_timeout_s)
        self.clock = clock
        self.log = log or (lambda _m: None)
        self.moves = JournaledMoves(Executor(engine.api, publish=publish, compat=self.options.compat, sleep=sleep),
                                    journal)
        self._recovered = False

    def active(self) -> list[Migration]:
        return self.journal.active()

    def busy_workloads(self) -> set[str]:
        return {m.workload_id for m in self.active()}

    def submit(self, moves: Iterable[MoveLike], *, reason: str, plan: dict[str, Any] | None = None) -> Admission:
        """Journal the moves the budget allows; the rest are deferred with why (same rules as the Slurm side)."""
        active = self.active()
        per_node: dict[str, int] = {}
        for m in active:
            for n in {m.source, m.target}:
                per_node[n] = per_node.get(n, 0) + 1
        busy = {m.workload_id for m in active}
        hour = self.journal.started_since(self.clock() - 3600) if self.config.max_per_hour is not None else 0
        admitted: list[Migration] = []
        deferred: list[tuple[str, str]] = []
        for mv in moves:
            nodes = {mv.source, mv.target}
            if mv.workload_id in busy:
                deferred.append((mv.workload_id, "already being moved"))
            elif len(active) + len(admitted) >= self.config.max_concurrent:
                deferred.append((mv.workload_id, f"budget: {self.config.max_concurrent} moves in flight"))
            elif any(per_node.get(n, 0) >= self.config.max_per_node for n in nodes):
                deferred.append((mv.workload_id, f"budget: {self.config.max_per_node} move(s) per node in flight"))
            elif self.config.max_per_hour is not None and hour + len(admitted) >= self.config.max_per_hour:
                deferred.append((mv.workload_id, f"budget: {self.config.max_per_hour} moves per hour"))
            else:
                m = self.journal.create(mv.workload_id, mv.source, mv.target, reason=reason,
                                        data={"engine": ENGINE, "plan": plan or {}})
                admitted.append(m)
                busy.add(mv.workload_id)
                for n in nodes:
                    per_node[n] = per_node.get(n, 0) + 1
        return Admission(tuple(admitted), tuple(deferred))

    def tick(self) -> list[Migration]:
        out: list[Migration] = []
        if not self._recovered:
            self._recovered = True
            out += self.moves.recover()
        planned = [m for m in self.active() if m.state is MigrationState.PLANNED and "sequence" not in m.data
                   and m.data.get("engine") == ENGINE]
        if not planned:
            return out
        cluster = self.engine.cluster()
        for m in planned:
            seq = build_move(cluster, SimpleMove(m.workload_id, m.source, m.target), self.options)
            versions = cluster.state.workload(m.workload_id).versions if seq.ok else None
            done, res = self.moves.run_planned(m.id, seq, versions)
            self.log(f"migration {m.id} of {m.workload_id}: {done.state.value}"
                     + (f" ({res.error})" if res.error else ""))
            out.append(done)
        return out
