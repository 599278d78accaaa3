"""Kubernetes moves through the real SQLite journal: every operation is journaled before it is taken, and a
controller killed at any operation recovers to exactly one running copy of the pod."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudefrag.control.journal import Journal, MigrationState
from gpudefrag.control.kube_journaled import JournaledMoves
from gpudefrag.engines.kubernetes import InMemoryApi, KubeCluster, SequenceRunner, SimpleMove, build_move
from gpudefrag.engines.kubernetes.moves import Op

BARE = SimpleMove("ml/notebook-ana", "gpu-node-1", "gpu-node-3")
RS = SimpleMove("ml/web-embed-7d9c5b6f4-abcde", "gpu-node-0", "gpu-node-3")


class Crash(BaseException):
    """The controller dies (not an error the executor handles)."""


def _executor(api: InMemoryApi) -> SequenceRunner:
    return SequenceRunner(api, verify_image=api.verify_image, sleep=lambda s: None)


def test_every_operation_is_journaled_before_it_is_taken(frag_cluster: KubeCluster, tmp_path: Path) -> None:
    api = InMemoryApi(frag_cluster)
    seq = build_move(frag_cluster, BARE)
    seen: list[tuple[int, int]] = []  # (journal steps so far, API calls so far) when each op starts
    with Journal(tmp_path / "j.db") as j:
        jm = JournaledMoves(_executor(api), j)
        ex = jm.executor
        ex.on_step = lambda s, r: None
        orig_do = ex._do

        def spy(op: Op, *a, **kw):  # type: ignore[no-untyped-def]
            seen.append((len(j.steps(1)), len(api.calls)))
            return orig_do(op, *a, **kw)

        ex._do = spy  # type: ignore[method-assign]
        m, res = jm.run(seq, frag_cluster.state.workload(BARE.workload_id).versions, reason="test")
        steps = j.steps(m.id)
    assert res.ok and m.state is MigrationState.DONE
    assert steps[1]["detail"].startswith(f"sequence {seq.move_id}")
    # after the agent's answer and the image check, their outcome is journaled too (what image, or why not)
    outcomes = [s for s in steps[2:-1] if s["detail"].split(":")[0].endswith((" ok", " failed"))]
    assert [s["detail"].split(":")[0] for s in outcomes] == ["wait-agent-checkpoint ok", "verify-checkpoint-image ok"]
    assert "@sha256:" in outcomes[0]["detail"]
    details = [s["detail"].split(":")[0] for s in steps[2:-1] if s not in outcomes]
    assert details == seq.kinds()
    # before op k is taken, the journal already holds its step (planned, sequence, then k + 1 steps, plus the
    # outcomes recorded for the ops before it)
    recorded = {"wait-agent-checkpoint", "verify-checkpoint-image"}
    want = [3 + k + sum(o in recorded for o in seq.kinds()[:k]) for k in range(len(seq.ops))]
    assert [n for n, _ in seen] == want
    assert [s["state"] for s in steps if s not in outcomes] == [
        "planned", "planned", "planned", "checkpointing", "checkpointing", "checkpointing", "restoring", "restoring",
        "running-on-target", "running-on-target", "done"]


def test_refused_move_is_aborted_in_the_journal(frag_cluster: KubeCluster, tmp_path: Path) -> None:
    seq = build_move(frag_cluster, SimpleMove("ml/finetune-0", "gpu-node-0", "gpu-node-3"))
    with Journal(tmp_path / "j.db") as j:
        m, res = JournaledMoves(_executor(InMemoryApi(frag_cluster)), j).run(seq)
    assert m.state is MigrationState.ABORTED and "StatefulSet" in m.reason and not res.ok


@pytest.mark.parametrize("move", [BARE, RS], ids=["bare", "replicaset"])
def test_crash_at_any_operation_recovers_to_one_copy(frag_cluster: KubeCluster, tmp_path: Path,
                                                     move: SimpleMove) -> None:
    """Kill the controller right after op k is journaled (before it is taken), for every k; a new controller
    recovers from the same journal and cluster."""
    seq = build_move(frag_cluster, move)
    ns, name = move.workload_id.split("/")
    for k in range(len(seq.ops)):
        api = InMemoryApi(frag_cluster)

        def die(m, k=k):  # type: ignore[no-untyped-def]
            if m.data.get("op") == k and not m.terminal:
                raise Crash

        with Journal(tmp_path / f"j{k}.db", on_write=die) as j, pytest.raises(Crash):
            JournaledMoves(_executor(api), j).run(seq, frag_cluster.state.workload(move.workload_id).versions)
        with Journal(tmp_path / f"j{k}.db") as j:  # a new controller process: same journal, same cluster
            recovered = JournaledMoves(_executor(api), j).recover()
            assert len(recovered) == 1 and j.active() == []
        original = (ns, name) in api.pods
        replacement = (ns, seq.replacement) in api.pods
        assert original != replacement, f"crash before op {k} ({seq.ops[k].kind}): exactly one copy must run"
        committing = any(o.irreversible for o in seq.ops[: k + 1])
        assert replacement == committing, f"crash before op {k}: committed={committing}"
        assert (recovered[0].state is MigrationState.DONE) == committing
        assert recovered[0].state in (MigrationState.DONE, MigrationState.ROLLED_BACK)


def test_every_operation_kind_has_its_journal_state() -> None:
    """A new operation without a state would stop every move that takes it (found on the real nodes: the
    app hook's wait-agent-signal)."""
    from gpudefrag.control.kube_journaled import _STATE
    from gpudefrag.engines.kubernetes.moves import OpKind

    rollback_only = {OpKind.DELETE_REPLACEMENT, OpKind.CLEAR_REQUEST, OpKind.CLEAR_AGENT_REQUEST}
    assert set(OpKind) - rollback_only == set(_STATE)


def test_the_app_hooks_signal_is_journaled_with_what_the_agent_ran(frag_cluster: KubeCluster, tmp_path: Path) -> None:
    import dataclasses
    from types import MappingProxyType

    info = frag_cluster.pods[BARE.workload_id]
    raw = {**info.raw, "metadata": {**info.raw["metadata"], "annotations": {
        **(info.raw["metadata"].get("annotations") or {}), "gpudefrag.io/checkpoint": "app"}}}
    c = dataclasses.replace(frag_cluster, pods=MappingProxyType(
        {**frag_cluster.pods, BARE.workload_id: dataclasses.replace(info, raw=MappingProxyType(raw))}))
    seq = build_move(c, BARE)
    with Journal(tmp_path / "j.db") as j:
        m, res = JournaledMoves(_executor(InMemoryApi(c)), j).run(seq, c.state.workload(BARE.workload_id).versions)
        details = [s["detail"] for s in j.steps(m.id)]
    assert res.ok and m.state is MigrationState.DONE, res.error
    assert "wait-agent-signal ok: kill -USR1 1 in trainer through memory" in details, details
