"""The planner and the restore gate agree (issue #29): a move between two nodes whose kernels differ, or of a job
whose engine and model versions the target cannot vouch for, is refused by both or accepted by both.

The planner sees only the snapshot (`decide` on it); the restore gate sees what a checkpoint taken on the source
node records (`checkpoint.compat.host_versions` there: CPU architecture, kernel release, checkpointer, GPUs, and the
job's own engine and model) and the restoring host's facts, and applies `checkpoint.operations.check_compat`'s
comparison. The two sides share no code path but the rule itself, so a fact the model dropped shows up here as a
disagreement.
"""

from __future__ import annotations

import pytest

from gpudefrag.checkpoint.compat import DEFAULT_FIELDS, mismatches
from gpudefrag.core.compat import CompatRule, VersionMatch
from gpudefrag.core.decision import decide
from gpudefrag.core.model import ClusterState, Node, Versions
from gpudefrag.core.planner_types import PlanOptions

OLD, NEW = "6.1.0-18-amd64", "6.12.9-amd64"
STACK = {"driver_version": "550.54.15", "cuda_version": "12.4", "cpu_arch": "x86_64",
         "checkpointer_version": "criu 4.1.1"}


def cluster(pb, k1: str, k2: str, versions: dict[str, str] | None = None) -> ClusterState:  # type: ignore[no-untyped-def]
    """Two 8-GPU nodes, a 4-GPU job on each, an 8-GPU job waiting: it lands only if one of them moves across."""
    nodes = [pb.node("n1", kernel=k1, **STACK), pb.node("n2", kernel=k2, **STACK)]
    own = {"versions": versions} if versions is not None else {}
    jobs = [pb.job("a", 4, "n1", gib=1, **own), pb.job("b", 4, "n2", gib=40, **own), pb.job("p", 8)]
    return pb.build(nodes, jobs)


def taken_on(node: Node, job: Versions) -> Versions:
    """What a checkpoint of `job` taken on `node` records: the host's facts (as the node describes the host) and
    what the job itself runs (engine, model)."""
    return Versions(gpu_model=node.gpu_model, gpu_count=4, driver=node.driver_version, cuda=node.cuda_version,
                    cpu_arch=node.cpu_arch, kernel=node.kernel, checkpointer=node.checkpointer_version,
                    engine=job.engine, model=job.model)


def restoring_host(node: Node) -> Versions:
    """The host the restore runs on, exactly as its node described it (it knows no engine or model version)."""
    return Versions(gpu_model=node.gpu_model, gpu_count=node.usable_gpus, driver=node.driver_version,
                    cuda=node.cuda_version, cpu_arch=node.cpu_arch, kernel=node.kernel,
                    checkpointer=node.checkpointer_version)


def gate(state: ClusterState, wid: str, src: str, dst: str, rule: CompatRule) -> list[str]:
    rec = taken_on(state.node(src), state.workload(wid).versions)
    return mismatches(rec, restoring_host(state.node(dst)), DEFAULT_FIELDS, rule)


def agree(state: ClusterState, rule: CompatRule) -> bool:
    """Assert planner and gate agree; return whether the move was accepted."""
    d = decide(state, state.workload("p"), PlanOptions(compat=rule, solver="exact"))
    crossing = [("a", "n1", "n2"), ("b", "n2", "n1")]
    if d.feasible:
        assert d.plan is not None and d.plan.moves
        for m in d.plan.moves:  # every move the planner chose passes the gate
            assert gate(state, m.workload_id, m.source, m.target, rule) == [], (m, rule)
        return True
    # the planner found nothing: the gate refuses every move that would have made room
    assert all(gate(state, *mv, rule) for mv in crossing), (d.reason, rule)
    return False


def test_different_kernels_both_refuse_under_the_default_rule(pb) -> None:  # type: ignore[no-untyped-def]
    state = cluster(pb, OLD, NEW)
    assert agree(state, CompatRule()) is False
    assert gate(state, "a", "n1", "n2", CompatRule()) == [f"kernel: checkpoint={OLD}, here={NEW}"]


def test_different_kernels_both_accept_under_a_rule_that_allows_it(pb) -> None:  # type: ignore[no-untyped-def]
    state = cluster(pb, OLD, NEW)
    assert agree(state, CompatRule(kernel=VersionMatch.MAJOR)) is True
    assert agree(state, CompatRule(kernel=VersionMatch.AT_LEAST)) is True  # a (cheap) move from 6.1 to 6.12


def test_equal_kernels_move(pb) -> None:  # type: ignore[no-untyped-def]
    assert agree(cluster(pb, OLD, OLD), CompatRule()) is True


@pytest.mark.parametrize(("rule", "accepted"), [
    (CompatRule(), True),  # not reported by the target: passes unless strict, on both sides
    (CompatRule(strict=True), False),  # strict: an engine and model the target does not vouch for refuse both
    (CompatRule(strict=True, engine=VersionMatch.ANY, model=VersionMatch.ANY), True),
])
def test_engine_and_model_versions(pb, rule: CompatRule, accepted: bool) -> None:  # type: ignore[no-untyped-def]
    state = cluster(pb, OLD, OLD, {"gpu_model": "H100", "engine": "vllm 0.6.3", "model": "llama-3-8b@rev3"})
    assert agree(state, rule) is accepted
