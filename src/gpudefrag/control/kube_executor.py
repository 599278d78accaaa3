"""What `gpudefrag controller --engine kubernetes` needs: an executor with the surface of
`gpudefrag.control.executor.Executor` (`submit`, `tick`, `active`, `busy_workloads`, `journal`) that runs
Kubernetes moves as `MoveSequence`s through the journal, under the policy's disruption budget.

`submit` journals the moves the budget admits (PLANNED); `tick` recovers what a previous process left
unfinished (once), then builds each admitted move's sequence from a fresh observation and runs it to the end
(synchronously: a tick may take as long as the replacement takes to become Ready).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..core.compat import checkpoint_record
from ..engines.kubernetes.engine import KubernetesEngine
from ..engines.kubernetes.executor import ImageVerifier, SequenceRunner
from ..engines.kubernetes.moves import MoveOptions, SimpleMove, build_move
from .executor import BudgetedExecutor, ExecutorConfig, MoveLike
from .journal import Journal, Migration, MigrationState
from .kube_journaled import ENGINE, JournaledMoves


class KubeMoveExecutor(BudgetedExecutor):
    def __init__(self, engine: KubernetesEngine, journal: Journal, config: ExecutorConfig | None = None, *,
                 options: MoveOptions | None = None, verify_image: ImageVerifier | None = None,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 log: Callable[[str], None] | None = None) -> None:
        super().__init__(journal, config, clock=clock, log=log)
        self.engine = engine
        self.options = options or MoveOptions(ready_timeout_s=self.config.restore_timeout_s,
                                              checkpoint_timeout_s=self.config.checkpoint_timeout_s)
        self.moves = JournaledMoves(SequenceRunner(engine.api, verify_image=verify_image, compat=self.options.compat,
                                             sleep=sleep),
                                    journal)
        self._recovered = False

    def move_data(self, mv: MoveLike, plan: dict[str, Any] | None, compat: dict[str, Any] | None) -> dict[str, Any]:
        """The engine's tag, so recovery picks up only pod moves (a pod move checks `compat` when it picks
        the replacement's node)."""
        return {"engine": ENGINE, "plan": plan or {}, **({"compat": compat} if compat else {})}

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
            versions = checkpoint_record(cluster.state, cluster.state.workload(m.workload_id)) if seq.ok else None
            done, res = self.moves.run_planned(m.id, seq, versions)
            self.log(f"migration {m.id} of {m.workload_id}: {done.state.value}"
                     + (f" ({res.error})" if res.error else ""))
            out.append(done)
        return out
