"""Kubernetes moves through the migration journal (`gpudefrag.control.journal`): each operation is written
before it is taken, and a restarted controller recovers every unfinished Kubernetes move from the journal and
the live cluster — finishing it when the point of no return was being passed (eviction or adoption: both are
safe to repeat), rolling it back otherwise (the original never stopped; the replacement is deleted). A pod is
never lost and never left running twice.
"""

from __future__ import annotations

from typing import Any

from ..engines.kubernetes.executor import MoveResult, SequenceRunner, StepResult
from ..engines.kubernetes.moves import MoveSequence, Op, OpKind
from .journal import Journal, Migration, MigrationState

S = MigrationState
_STATE = {
    OpKind.VERIFY_TARGET: S.PLANNED, OpKind.CHECK_PDB: S.PLANNED,
    OpKind.AGENT_CHECKPOINT: S.CHECKPOINTING, OpKind.WAIT_AGENT_CHECKPOINT: S.CHECKPOINTING,
    OpKind.VERIFY_IMAGE: S.CHECKPOINTING,
    OpKind.REQUEST_APP_CHECKPOINT: S.CHECKPOINTING, OpKind.SIGNAL: S.CHECKPOINTING,
    OpKind.WAIT_AGENT_SIGNAL: S.CHECKPOINTING,
    OpKind.WAIT_APP_CHECKPOINT: S.CHECKPOINTING,
    OpKind.CREATE_REPLACEMENT: S.RESTORING, OpKind.WAIT_READY: S.RESTORING,
    OpKind.SET_DELETION_COST: S.RUNNING_ON_TARGET, OpKind.ADOPT_REPLACEMENT: S.RUNNING_ON_TARGET,
    OpKind.EVICT_ORIGINAL: S.RUNNING_ON_TARGET, OpKind.WAIT_DELETED: S.RUNNING_ON_TARGET,
}
ENGINE = "kubernetes"
_RECORDED = {OpKind.WAIT_AGENT_CHECKPOINT.value, OpKind.WAIT_AGENT_SIGNAL.value, OpKind.VERIFY_IMAGE.value}
_KINDS = {k.value for k in OpKind}


class JournaledMoves:
    def __init__(self, executor: SequenceRunner, journal: Journal) -> None:
        self.executor = executor
        self.journal = journal

    def run(self, seq: MoveSequence, versions: Any = None, *, reason: str = "") -> tuple[Migration, MoveResult]:
        m = self.journal.create(seq.workload_id, seq.source, seq.target, reason=reason, data={"engine": ENGINE})
        return self.run_planned(m.id, seq, versions)

    def run_planned(self, mid: int, seq: MoveSequence, versions: Any = None) -> tuple[Migration, MoveResult]:
        """Run a sequence for a migration already journaled as PLANNED (the controller's `submit`)."""
        m = self.journal.transition(mid, S.PLANNED, detail=f"sequence {seq.move_id} ({seq.strategy})",
                                    data={"move_id": seq.move_id, "sequence": seq.as_dict()})
        if not seq.ok:
            return self.journal.transition(m.id, S.ABORTED, reason=seq.refused or ""), self.executor.run(seq)
        committing = [False]
        # hooks already on the runner (a fault injected at a step, a progress report) still run, after the journal
        old, old_after = self.executor.before, self.executor.on_step

        def before(s: MoveSequence, i: int, op: Op) -> None:
            committing[0] = committing[0] or op.irreversible
            self.journal.transition(m.id, _STATE[op.kind], detail=f"{op.kind.value}: {op.detail}",
                                    data={"op": i, "committing": committing[0]})
            if old:
                old(s, i, op)

        def after(s: MoveSequence, step: StepResult) -> None:
            # what the agent made and what the image check decided (a cold start, a refused image) are facts
            # the journal must keep, beside the step that was about to be taken
            if step.op in _RECORDED or not step.ok:
                st = _STATE.get(OpKind(step.op), S.PLANNED) if step.op in _KINDS else S.ROLLING_BACK
                self.journal.transition(m.id, st, detail=f"{step.op} {'ok' if step.ok else 'failed'}: {step.detail}")
            if old_after:
                old_after(s, step)

        self.executor.before, self.executor.on_step = before, after
        try:
            res = self.executor.run(seq, versions)
        finally:
            self.executor.before, self.executor.on_step = old, old_after
        return self._close(m.id, res), res

    def _close(self, mid: int, res: MoveResult) -> Migration:
        if res.ok:
            return self.journal.transition(mid, S.DONE, detail="original removed; replacement Ready")
        if res.committed:  # past the point of no return: stays active, `recover` finishes it
            return self.journal.transition(mid, S.RUNNING_ON_TARGET, detail=f"unfinished: {res.error}")
        if res.rolled_back:
            return self.journal.transition(mid, S.ROLLED_BACK, reason=res.error, detail="replacement deleted")
        return self.journal.transition(mid, S.ABORTED, reason=res.error, detail="nothing was changed")

    def recover(self) -> list[Migration]:
        """Finish or roll back every active Kubernetes move of the journal (call once at start-up)."""
        out = []
        for m in self.journal.active():
            if m.data.get("engine") != ENGINE or "sequence" not in m.data:
                continue
            seq = MoveSequence.from_dict(m.data["sequence"])
            if m.data.get("committing"):
                self.journal.transition(m.id, S.RUNNING_ON_TARGET, detail="recovery: finishing the move")
                res = self.executor.finish(seq)
                if res.ok:
                    out.append(self.journal.transition(m.id, S.DONE, detail="recovered: finished"))
                elif res.steps and res.steps[-1].op == OpKind.EVICT_ORIGINAL.value and seq.strategy == "bare-pod":
                    # the eviction was refused (a PDB): the original still runs, so the replacement must go
                    self.journal.transition(m.id, S.ROLLING_BACK, detail=f"recovery: {res.error}")
                    self.executor.rollback(seq)
                    out.append(self.journal.transition(m.id, S.ROLLED_BACK, reason=res.error,
                                                       detail="recovered: replacement deleted, original kept"))
                else:
                    out.append(self.journal.transition(m.id, S.RUNNING_ON_TARGET,
                                                       detail=f"recovery unfinished: {res.error}"))
            else:
                self.journal.transition(m.id, S.ROLLING_BACK, detail="recovery: before the point of no return")
                self.executor.rollback(seq)
                out.append(self.journal.transition(m.id, S.ROLLED_BACK, reason="controller restarted mid-move",
                                                   detail="recovered: replacement deleted, original kept"))
        return out
