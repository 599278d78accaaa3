"""The one decision: causes first, a plan only for fragmentation (or when asked), priced alternatives."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudefrag.core.decision import decide, decide_all
from gpudefrag.core.diagnose import CauseCode as C
from gpudefrag.core.diagnose import diagnose_request
from gpudefrag.core.model import MOVABLE_LABEL, Request, mig_profile
from gpudefrag.core.planner import PlanOptions
from gpudefrag.core.scheduler_reasons import ReasonClass, classify
from gpudefrag.errors import InputError
from gpudefrag.snapshot import load_snapshot_dict, state_to_dict

NOW = 100_000.0
GB = 10**9


def node(name: str, gpus: int = 8, **kw: Any) -> dict[str, Any]:
    return {"name": name, "gpus": gpus, "gpu_model": "H100", **kw}


def run(wid: str, gpus: int, on: str, **kw: Any) -> dict[str, Any]:
    return {"id": wid, "gpus_per_node": gpus, "placements": [{"node": on}], "checkpoint_bytes": 10 * GB,
            "started_at": NOW - 3600, **kw}


def fragmented(**kw: Any) -> list[dict[str, Any]]:
    """Two 8-GPU nodes with 5 busy each (6 free, none whole-node)."""
    return [run("a1", 4, "a", **kw), run("a2", 1, "a", **kw), run("b1", 3, "b", **kw), run("b2", 2, "b", **kw)]


def state(workloads: list[dict[str, Any]], **top: Any) -> Any:
    return load_snapshot_dict({"now": NOW, "nodes": [node("a"), node("b")], "workloads": workloads, **top})


def test_fragmentation_alone_gets_a_plan_with_priced_options() -> None:
    s = state([*fragmented(), {"id": "p", "state": "pending", "gpus_per_node": 4}])
    d = decide(s, s.workload("p"))
    assert d.diagnosis.codes == (C.FRAGMENTATION,) and not d.blocked_by
    assert d.feasible and d.plan is not None and d.plan.moves
    kinds = [o.kind for o in d.options]
    assert kinds == ["move", "evict", "drain", "wait"] and sum(o.cheapest for o in d.options) == 1
    assert d.chosen == "move"  # 10 GB checkpoints against an hour of work lost


def test_a_quota_blocks_the_plan_unless_asked() -> None:
    s = state([*fragmented(), {"id": "p", "state": "pending", "gpus_per_node": 4, "namespace": "t"}],
              quotas=[{"namespace": "t", "gpu_limit": 2}])
    d = decide(s, s.workload("p"))
    assert d.blocked and d.plan is None and [c.code for c in d.blocked_by] == [C.QUOTA_EXCEEDED]
    assert d.reason.startswith("blocked by quota-exceeded")
    anyway = decide(s, s.workload("p"), plan_anyway=True)
    assert anyway.planned_anyway and anyway.feasible and not anyway.blocked


def test_evicting_is_chosen_when_cheaper_than_moving() -> None:
    fresh = {"gpudefrag.io/app-checkpoint-at": str(NOW - 60)}
    s = state([*fragmented(checkpoint_bytes=600 * GB, labels=fresh),
               {"id": "p", "state": "pending", "gpus_per_node": 4}])
    d = decide(s, s.workload("p"))
    best = next(o for o in d.options if o.cheapest)
    move = next(o for o in d.options if o.kind == "move")
    assert d.chosen == "evict" == best.kind and best.gpu_s < move.gpu_s
    assert "evict is cheaper than moving" in d.reason


def test_immovable_workloads_never_move_whatever_the_filter() -> None:
    wl = [*fragmented(), {"id": "p", "state": "pending", "gpus_per_node": 4}]
    free = decide(state(wl), state(wl).workload("p"))
    assert free.plan is not None
    moved = {m.workload_id for m in free.plan.moves}
    for w in wl:
        if w["id"] in moved:
            w.update(movable=False, movable_reason="pinned")
    s = state(wl)
    d = decide(s, s.workload("p"), PlanOptions(movable=lambda w: True))
    assert d.plan is not None and not ({m.workload_id for m in d.plan.moves} & moved)
    labelled = state([{**w, "movable": True, "labels": {MOVABLE_LABEL: "false"}} if w["id"] in moved else w
                      for w in wl])
    d2 = decide(labelled, labelled.workload("p"))
    assert d2.plan is not None and not ({m.workload_id for m in d2.plan.moves} & moved)


def test_partial_gpu_fragmentation_is_not_a_full_cluster() -> None:
    shared = [run(f"s{g}", 1, "a", gpu_milli=500, placements=[{"node": "a", "gpus": [g]}]) for g in range(8)]
    s = load_snapshot_dict({"now": NOW, "nodes": [node("a"), node("b", gpus=0)],
                            "workloads": [*shared[:4], *[{**w, "id": f"t{i}"} for i, w in enumerate(shared[:4])],
                                          *shared[4:], {"id": "p", "state": "pending", "gpus_per_node": 1}]})
    # GPUs 0-3 are full (two halves each), 4-7 hold one half: 2 GPUs of share free, no whole GPU
    d = decide(s, s.workload("p"))
    ev = d.diagnosis.primary.evidence
    assert d.diagnosis.codes == (C.FRAGMENTATION,)
    assert ev["gpus_with_fractions"] == 4 and ev["largest_free_share"] == 0.5 and ev["free_gpus"] == 0


def test_a_full_cluster_of_shares_stays_insufficient() -> None:
    s = load_snapshot_dict({"now": NOW, "nodes": [node("a", gpus=2)], "workloads": [
        run("x", 1, "a", gpu_milli=700, placements=[{"node": "a", "gpus": [0]}]),
        run("y", 1, "a", gpu_milli=700, placements=[{"node": "a", "gpus": [1]}]),
        {"id": "p", "state": "pending", "gpus_per_node": 1}]})
    assert diagnose_request(s, Request(1)).codes == (C.INSUFFICIENT_GPUS,)  # 0.6 GPU of share < 1


def test_a_mig_profile_nobody_offers_is_never_fits_now() -> None:
    s = load_snapshot_dict({"now": NOW, "nodes": [node("a", mig_devices={"mig-1g.10gb": 7})], "workloads": [
        {"id": "m", "state": "pending", "gpus_per_node": 0, "mig_profile": "nvidia.com/mig-3g.40gb"},
        {"id": "ok", "state": "pending", "gpus_per_node": 0, "mig_profile": "1g.10gb"}]})
    m, ok = decide_all(s, plan=False)
    assert m.diagnosis.codes == (C.MIG_PROFILE_UNAVAILABLE,) and m.blocked
    assert ok.diagnosis.codes == (C.FITS_NOW,)
    d = decide(s, s.workload("m"), plan_anyway=True)
    assert d.plan is not None and not d.plan.feasible and "MIG" in d.plan.reason


@pytest.mark.parametrize(("reason", "scheduler", "cls", "code"), [
    ("QOSMaxGRESPerUser", "slurm", ReasonClass.ORDINARY, "quota-exceeded"),
    ("AssocGrpGRES", "", ReasonClass.ORDINARY, "quota-exceeded"),
    ("Resources", "", ReasonClass.CAPACITY, None),
    ("Dependency", "slurm", ReasonClass.INELIGIBLE, None),
    # Slurm's "...Limit is a quota" rule must not be applied to a Kubernetes message
    ("0/4 nodes are available: 4 node(s) exceeded max volume count Limit.", "kubernetes", ReasonClass.CAPACITY, None),
    ("pods \"x\" is forbidden: exceeded quota: gpu", "kubernetes", ReasonClass.ORDINARY, "quota-exceeded"),
    ("SchedulingGated", "kubernetes", ReasonClass.INELIGIBLE, None),
])
def test_scheduler_reasons(reason: str, scheduler: str, cls: ReasonClass, code: str | None) -> None:
    assert classify(reason, scheduler) == (cls, code)


def test_a_slurm_hold_is_diagnosed_not_eligible() -> None:
    s = state([*fragmented(), {"id": "p", "state": "pending", "gpus_per_node": 4, "scheduler_reason": "JobHeldUser"}],
              scheduler="slurm")
    d = decide(s, s.workload("p"))
    assert d.diagnosis.codes[0] is C.NOT_ELIGIBLE and d.blocked


def test_version_1_snapshots_still_load() -> None:
    s = load_snapshot_dict({"version": 1, "nodes": [node("a")], "workloads": [run("x", 2, "a")]})
    assert s.workload("x").movable and state_to_dict(s)["version"] == 2


profiles = st.builds(lambda c, g, pre: f"{pre}{c}g.{g}gb", st.integers(1, 7), st.integers(5, 180),
                     st.sampled_from(["", "mig-", "nvidia.com/mig-"]))


@settings(max_examples=100, deadline=None)
@given(profile=profiles, movable=st.booleans(), reason=st.sampled_from(["pinned", "gang-member", "statefulset"]),
       slices=st.integers(0, 7))
def test_snapshot_v2_fields_round_trip(profile: str, movable: bool, reason: str, slices: int) -> None:
    doc = {"version": 2, "scheduler": "slurm", "nodes": [node("a", mig_devices={profile: slices},
                                                              checkpointer_version="criu 4.1.1")],
           "workloads": [run("x", 1, "a", movable=movable, **({} if movable else {"movable_reason": reason})),
                         {"id": "m", "state": "pending", "gpus_per_node": 0, "mig_profile": profile}]}
    s = load_snapshot_dict(doc)
    again = load_snapshot_dict(state_to_dict(s))
    assert again.workload("x").movable is movable and again.workload("x").can_move is movable
    assert again.workload("x").movable_reason == ("" if movable else reason)
    assert again.workload("m").request.mig_profile == mig_profile(profile)
    assert again.nodes[0].mig_offered(profile) == slices and again.scheduler == "slurm"


@settings(max_examples=100, deadline=None)
@given(bad=st.one_of(st.text(min_size=1, max_size=12), st.integers(), st.none()))
def test_bad_movable_or_profile_is_an_input_error(bad: Any) -> None:
    for field, value in (("movable", bad), ("mig_profile", bad)):
        if field == "movable" and isinstance(value, bool):
            continue
        if field == "mig_profile" and (value is None or (isinstance(value, str) and _is_profile(value))):
            continue
        with pytest.raises(InputError) as e:
            load_snapshot_dict({"nodes": [node("a")], "workloads": [
                {"id": "w", "state": "pending", "gpus_per_node": 1, field: value}]}, "s.json")
        assert f"workloads[0].{field}" in str(e.value) and "\n" not in str(e.value)


def _is_profile(v: str) -> bool:
    try:
        mig_profile(v)
    except ValueError:
        return False
    return True


# ------------------------------------------------------------------ CPU and memory held where the GPUs are free
def cpu_node(name: str, gpus: int = 8, cpu_milli: int = 16_000) -> dict[str, Any]:
    return node(name, gpus, cpu_milli=cpu_milli)


def cpu_held(**cpu_pod: Any) -> Any:
    """a: 8 GPUs free, 12 of its 16 cores held by the CPU-only pod c; b: its 8 GPUs held by x (pinned), 14 cores
    free; the pending p asks for 8 GPUs and 8 cores: only a has the GPUs, only b the cores."""
    return load_snapshot_dict({"now": NOW, "nodes": [cpu_node("a"), cpu_node("b")], "workloads": [
        run("c", 0, "a", cpu_milli=12_000, **cpu_pod),
        run("x", 8, "b", cpu_milli=2_000, movable=False, movable_reason="pinned"),
        {"id": "p", "state": "pending", "gpus_per_node": 8, "cpu_milli": 8_000}]})


def test_cpu_a_movable_cpu_only_pod_holds_is_fragmentation_and_the_plan_moves_it() -> None:
    """Moving the CPU-only pod to b makes room on a: not an ordinary cause (moves fix it), so the one decision
    plans, and the plan moves c off a (was: blocked by cpu-or-memory, no plan)."""
    s = cpu_held()
    d = decide(s, s.workload("p"))
    assert d.diagnosis.codes == (C.FRAGMENTATION_CPU_MEMORY,) and d.diagnosis.is_fragmentation and not d.blocked_by
    ev = d.diagnosis.primary.evidence
    assert ev["lacking"] == ["CPU"] and ev["min_moves_to_clear"] == 1 and ev["clearable_nodes"] == ["a"]
    assert d.feasible and d.plan is not None and d.chosen == "move"
    assert [(m.workload_id, m.source, m.target) for m in d.plan.moves] == [("c", "a", "b")]


def test_cpu_an_unmovable_pod_holds_stays_an_ordinary_cause() -> None:
    """The same CPU held by a pod no plan may move (marked so, or kept by the policy's filter): no node could
    hold p even after every movable job left it, so cpu-or-memory blocks, and says why."""
    for s, opts in ((cpu_held(movable=False, movable_reason="pinned"), None),
                    (cpu_held(), PlanOptions(movable=lambda w: w.id != "c"))):
        d = decide(s, s.workload("p"), opts)
        assert d.diagnosis.codes == (C.CPU_OR_MEMORY,) and d.blocked and d.plan is None
        assert "no node could hold it even if every job the planner may move left it" in d.reason
        anyway = decide(s, s.workload("p"), opts, plan_anyway=True)
        assert not anyway.feasible


def test_cpu_short_in_total_stays_an_ordinary_cause() -> None:
    """b has only 3 cores free: c (12 cores) could leave a, but the cluster has 7 free cores in all and p asks
    for 8 — no spreading of the jobs starts it."""
    s = load_snapshot_dict({"now": NOW, "nodes": [cpu_node("a"), cpu_node("b")], "workloads": [
        run("c", 0, "a", cpu_milli=12_000), run("x", 8, "b", cpu_milli=13_000),
        {"id": "p", "state": "pending", "gpus_per_node": 8, "cpu_milli": 8_000}]})
    d = decide(s, s.workload("p"))
    assert d.diagnosis.codes == (C.CPU_OR_MEMORY,) and d.blocked
    assert d.diagnosis.primary.evidence["short_in_total"] == ["CPU"]
    assert "less CPU free in total" in d.reason


@st.composite
def cpu_clusters(draw: st.DrawFn) -> tuple[Any, Request]:
    """2-3 nodes of 4 GPUs and 8 or 16 cores, running jobs of 0-4 GPUs and 1-12 cores (some not movable)
    placed where they fit, and a pending request of 1-4 GPUs and 1-12 cores."""
    n = draw(st.integers(2, 3))
    cpus = [draw(st.sampled_from([8_000, 16_000])) for _ in range(n)]
    gpus_left, cpu_left, wl = [4] * n, list(cpus), []
    for i in range(draw(st.integers(0, 7))):
        on, g, c = draw(st.integers(0, n - 1)), draw(st.integers(0, 4)), draw(st.integers(1, 12)) * 1000
        if g <= gpus_left[on] and c <= cpu_left[on]:
            gpus_left[on] -= g
            cpu_left[on] -= c
            wl.append(run(f"j{i}", g, f"n{on}", cpu_milli=c, movable=draw(st.booleans())))
    r = Request(gpus_per_node=draw(st.integers(1, 4)), cpu_milli=draw(st.integers(1, 12)) * 1000)
    wl.append({"id": "p", "state": "pending", "gpus_per_node": r.gpus_per_node, "cpu_milli": r.cpu_milli})
    nodes = [cpu_node(f"n{i}", 4, cpus[i]) for i in range(n)]
    return load_snapshot_dict({"now": NOW, "nodes": nodes, "workloads": wl}), r


@settings(max_examples=150, deadline=None)
@given(cpu_clusters())
def test_an_ordinary_cause_is_one_no_move_fixes(case: tuple[Any, Request]) -> None:
    """Whenever the planner, asked to plan anyway, finds moves that start the job, the decision had not called
    it blocked (an ordinary cause is one moving running jobs cannot fix: `cpu-or-memory` included); and a CPU
    or memory shortage reported as fragmentation is planned for."""
    s, _ = case
    d = decide(s, s.workload("p"))
    anyway = decide(s, s.workload("p"), plan_anyway=True)
    if anyway.feasible and anyway.plan is not None and anyway.plan.moves:
        assert not d.blocked, d.diagnosis.as_dict()
    if C.CPU_OR_MEMORY in d.diagnosis.codes:
        assert not anyway.feasible, d.diagnosis.as_dict()
    if d.diagnosis.codes == (C.FRAGMENTATION_CPU_MEMORY,):
        assert d.plan is not None
