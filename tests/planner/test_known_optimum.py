"""Hand-made clusters whose cheapest plan is known, including the traps a greedy planner falls into.
Every case runs with both solvers; the exact one must also say it proved optimality."""

from __future__ import annotations

import pytest

from gpudefrag.core.compat import CompatRule, VersionMatch
from gpudefrag.core.cost import CostModel
from gpudefrag.core.model import Request
from gpudefrag.core.planner import PlanOptions, apply_moves, fits_after, plan_for, plan_moves

SOLVERS = ["heuristic", "exact"]


def moved(plan) -> dict[str, tuple[str, str]]:
    return {m.workload_id: (m.source, m.target) for m in plan.moves}


def check_plan(state, plan, solver):
    assert plan.feasible, plan.reason
    assert fits_after(state, plan.moves, plan.request, plan.placements)
    apply_moves(state, plan.moves)  # raises if any step exceeds a capacity
    if solver == "exact":
        assert plan.solver == "exact" and plan.optimal


@pytest.mark.parametrize("solver", SOLVERS)
def test_most_free_node_is_not_the_cheapest_to_clear(pb, solver):
    # a has 6 free GPUs but holds a 2-GPU job with a 400 GiB checkpoint; b has 4 free and two small jobs
    state = pb.build(
        [pb.node("a"), pb.node("b"), pb.node("c")],
        [pb.job("big", 2, "a", gib=400), pb.job("s1", 2, "b", gib=1), pb.job("s2", 2, "b", gib=2),
         pb.job("c1", 4, "c", gib=50)],
    )
    plan = plan_moves(state, Request(8), PlanOptions(solver=solver))
    check_plan(state, plan, solver)
    assert plan.target_node == "b"
    assert set(moved(plan)) == {"s1", "s2"}


@pytest.mark.parametrize("solver", SOLVERS)
def test_cheap_workload_that_fits_nowhere_else(pb, solver):
    # a's only job is by far the cheapest to move, but the one node it could run on (c: same driver) is full,
    # and b runs another driver; so the plan must clear b, whose jobs (recording no driver) fit on a
    anywhere = {"versions": {}}
    state = pb.build(
        [pb.node("a"), pb.node("b", driver_version="535.129.03"), pb.node("c")],
        [pb.job("cheap4", 4, "a", gib=1), pb.job("b1", 2, "b", gib=30, **anywhere),
         pb.job("b2", 2, "b", gib=30, **anywhere), pb.job("c1", 8, "c", gib=1)],
    )
    plan = plan_moves(state, Request(8), PlanOptions(solver=solver))
    check_plan(state, plan, solver)
    assert plan.target_node == "b"
    assert moved(plan) == {"b1": ("b", "a"), "b2": ("b", "a")}


@pytest.mark.parametrize("solver", SOLVERS)
def test_chain_the_displaced_job_goes_where_a_third_one_left(pb, solver):
    # clear a: a1 (4 GPUs) fits nowhere directly (b has 2 free, c has 3); moving b1 from b to c makes room on b
    state = pb.build(
        [pb.node("a"), pb.node("b"), pb.node("c")],
        [pb.job("a1", 4, "a", gib=10), pb.job("b1", 2, "b", gib=5), pb.job("b2", 4, "b", gib=900),
         pb.job("c1", 5, "c", gib=900)],
    )
    plan = plan_moves(state, Request(8), PlanOptions(solver=solver))
    check_plan(state, plan, solver)
    assert plan.target_node == "a"
    assert [(m.workload_id, m.source, m.target) for m in plan.moves] == [("b1", "b", "c"), ("a1", "a", "b")]


@pytest.mark.parametrize("solver", SOLVERS)
def test_multi_node_workloads_never_move(pb, solver):
    # a would be cheapest (6 free, the blocker is a tiny multi-node part) but multi-node jobs never move
    state = pb.build(
        [pb.node("a"), pb.node("b"), pb.node("c"), pb.node("d")],
        [pb.job("mn", 2, ["a", "d"], gib=0.1), pb.job("b1", 2, "b", gib=30), pb.job("b2", 2, "b", gib=30),
         pb.job("c1", 4, "c", gib=60), pb.job("d1", 4, "d", gib=60)],
    )
    plan = plan_moves(state, Request(8), PlanOptions(solver=solver))
    check_plan(state, plan, solver)
    assert "mn" not in moved(plan)
    assert plan.target_node == "b"


@pytest.mark.parametrize("solver", SOLVERS)
def test_policy_filter_excludes_workloads(pb, solver):
    state = pb.build(
        [pb.node("a"), pb.node("b"), pb.node("c")],
        [pb.job("prod", 2, "a", gib=1, labels={"tier": "prod"}), pb.job("b1", 2, "b", gib=30),
         pb.job("b2", 2, "b", gib=30), pb.job("c1", 4, "c", gib=60)],
    )
    free_plan = plan_moves(state, Request(8), PlanOptions(solver=solver))
    assert moved(free_plan) and set(moved(free_plan)) == {"prod"}  # without the filter: the cheap prod job
    opts = PlanOptions(solver=solver, movable=lambda w: w.labels.get("tier") != "prod")
    plan = plan_moves(state, Request(8), opts)
    check_plan(state, plan, solver)
    assert "prod" not in moved(plan) and plan.target_node == "b"


@pytest.mark.parametrize("solver", SOLVERS)
def test_only_multi_node_blockers_gives_a_reason(pb, solver):
    state = pb.build(
        [pb.node("a", gpus=4), pb.node("b", gpus=4)],
        [pb.job("mn", 2, ["a", "b"])],
    )
    plan = plan_moves(state, Request(4), PlanOptions(solver=solver))
    assert not plan.feasible and not plan.moves
    assert plan.reason
    if solver == "heuristic":
        assert "multi-node" in plan.reason


@pytest.mark.parametrize("solver", SOLVERS)
def test_incompatible_targets_are_excluded_with_their_reason(pb, solver):
    # a1 must leave a; c has the most room but another driver, so a1 goes to b and --explain says why not c
    c_versions = {"versions": {"gpu_model": "H100", "driver": "535.129.03", "cuda": "12.4"}}
    state = pb.build(
        [pb.node("a"), pb.node("b"), pb.node("c", driver_version="535.129.03")],
        [pb.job("a1", 4, "a", gib=10), pb.job("b1", 4, "b", gib=500), pb.job("c1", 2, "c", gib=500, **c_versions)],
    )
    plan = plan_moves(state, Request(8), PlanOptions(solver=solver))
    check_plan(state, plan, solver)
    assert moved(plan) == {"a1": ("a", "b")}
    assert any("driver: checkpoint 550.54.15, node c has 535.129.03 (rule: exact)" in line for line in plan.explain)


@pytest.mark.parametrize("solver", SOLVERS)
def test_compat_rule_can_allow_another_driver(pb, solver):
    c_versions = {"versions": {"gpu_model": "H100", "driver": "550.90.07", "cuda": "12.4"}}
    state = pb.build(
        [pb.node("a"), pb.node("c", driver_version="550.90.07")],
        [pb.job("a1", 2, "a", gib=10), pb.job("c1", 4, "c", gib=10, **c_versions)],
    )
    strict = plan_moves(state, Request(8), PlanOptions(solver=solver))
    assert not strict.feasible and strict.reason
    relaxed = plan_moves(state, Request(8), PlanOptions(solver=solver, compat=CompatRule(driver=VersionMatch.MAJOR)))
    check_plan(state, relaxed, solver)
    assert moved(relaxed) == {"a1": ("a", "c")}


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("insists", [True, False])
def test_gpu_model_constraint_of_the_moved_workload_holds(pb, solver, insists):
    # a1 records no GPU model; only its request may pin it to H100. b is an empty A100 node; c has 1 GPU free
    a1 = pb.job("a1", 2, "a", gib=1, **({"gpu_models": ["H100"]} if insists else {}))
    a1["versions"] = {}
    state = pb.build(
        [pb.node("a"), pb.node("b", gpu_model="A100"), pb.node("c")],
        [a1, pb.job("c1", 4, "c", gib=50), pb.job("c2", 3, "c", gib=50)],
    )
    plan = plan_moves(state, Request(8, gpu_models=("H100",)), PlanOptions(solver=solver))
    if insists:
        assert not plan.feasible  # a1 fits on no other H100 node; c's jobs record H100 and fit only on a
    else:
        check_plan(state, plan, solver)
        assert moved(plan) == {"a1": ("a", "b")}


@pytest.mark.parametrize("solver", SOLVERS)
def test_fractional_request_is_plannable(pb, solver):
    # every GPU is more than half used; a 0.5-GPU request needs one quarter-GPU job moved off a GPU
    work = []
    for n in ("a", "b"):
        for g in range(2):
            work.append(pb.job(f"{n}{g}x", 1, None, gpu_milli=500) | {"state": "running",
                        "placements": [{"node": n, "gpus": [g]}], "last_checkpoint_at": pb.NOW})
            work.append(pb.job(f"{n}{g}y", 1, None, gpu_milli=250, gib=1 + g) | {
                "state": "running", "placements": [{"node": n, "gpus": [g]}], "last_checkpoint_at": pb.NOW})
    work.append(pb.job("c0", 1, "c", gib=10, gpu_milli=600))
    state = pb.build([pb.node("a", gpus=2), pb.node("b", gpus=2), pb.node("c", gpus=1)], work)
    plan = plan_moves(state, Request(1, gpu_milli=500), PlanOptions(solver=solver))
    check_plan(state, plan, solver)
    assert len(plan.moves) == 1
    assert plan.moves[0].workload_id in {"a0y", "b0y"}  # the cheapest quarter-GPU job
    assert plan.placements[0].node == plan.moves[0].source


@pytest.mark.parametrize("solver", SOLVERS)
def test_move_budgets(pb, solver):
    state = pb.build(
        [pb.node("a"), pb.node("b"), pb.node("c")],
        [pb.job("a1", 1, "a", gib=1), pb.job("a2", 1, "a", gib=1), pb.job("a3", 1, "a", gib=1),
         pb.job("b1", 3, "b", gib=100), pb.job("c1", 4, "c", gib=1)],
    )
    best = plan_moves(state, Request(8), PlanOptions(solver=solver))
    assert set(moved(best)) == {"a1", "a2", "a3"}
    one = plan_moves(state, Request(8), PlanOptions(solver=solver, max_moves=1))
    check_plan(state, one, solver)
    assert set(moved(one)) == {"c1"}
    per_node = plan_moves(state, Request(8), PlanOptions(solver=solver, max_moves_per_node=2))
    assert set(moved(per_node)) == {"c1"}
    none = plan_moves(state, Request(8), PlanOptions(solver=solver, max_moves=0))
    assert not none.feasible and none.reason


@pytest.mark.parametrize("solver", SOLVERS)
def test_ties_prefer_the_node_with_most_gpus_free(pb, solver):
    # without a fixed overhead, a1 (1 GPU, 20 GiB) and b1 (2 GPUs, 10 GiB) cost exactly the same GPU-seconds;
    # a already has 7 GPUs free, b only 6, so a is the one to clear
    state = pb.build(
        [pb.node("a"), pb.node("b"), pb.node("c")],
        [pb.job("a1", 1, "a", gib=20), pb.job("b1", 2, "b", gib=10), pb.job("c1", 4, "c", gib=100)],
    )
    plan = plan_moves(state, Request(8), PlanOptions(solver=solver, cost_model=CostModel(overhead_s=0)))
    check_plan(state, plan, solver)
    assert plan.target_node == "a" and set(moved(plan)) == {"a1"}


def test_request_that_fits_now_needs_no_moves(pb):
    state = pb.build([pb.node("a"), pb.node("b")], [pb.job("a1", 4, "a"), pb.job("p", 4)])
    plan = plan_for(state, "p")
    # best fit: a has exactly the 4 GPUs, b stays whole
    assert plan.feasible and not plan.moves and plan.target_node == "a" and plan.workload_id == "p"
    assert plan.total_cost_s == 0


@pytest.mark.parametrize("solver", SOLVERS)
def test_multi_node_request_clears_two_distinct_nodes(pb, solver):
    # a 2 × 8-GPU job: a and b are the two cheapest to clear (tiny jobs), c and d take them
    state = pb.build(
        [pb.node("a"), pb.node("b"), pb.node("c"), pb.node("d")],
        [pb.job("a1", 2, "a", gib=1), pb.job("b1", 2, "b", gib=2), pb.job("c1", 4, "c", gib=300),
         pb.job("d1", 4, "d", gib=300)],
    )
    plan = plan_moves(state, Request(8, node_count=2), PlanOptions(solver=solver))
    check_plan(state, plan, solver)
    assert sorted(p.node for p in plan.placements) == ["a", "b"]
    assert set(moved(plan)) == {"a1", "b1"}
    assert all(m.target in ("c", "d") for m in plan.moves)


def test_exact_finds_the_chain_when_a_cheaper_answer_is_a_cycle(pb):
    # landing 700 milli on b0 needs g (300) off it; g fits only where d (200) leaves a0-2, and d only where j
    # (100) leaves b2, which j may do into a0-2: the chain j, d, g. Cheaper answers of the model trade places in
    # a cycle no order can execute; the exact solver must cut them and still prove the chain optimal.
    def share(jid, on, gpu, milli):
        return pb.job(jid, 1, None, gpu_milli=milli, gib=32 * milli / 1000) | {
            "state": "running", "placements": [{"node": on, "gpus": [gpu]}], "last_checkpoint_at": pb.NOW}

    work = [pb.job("a0", 1, "a", gib=32), pb.job("a1", 1, "a", gib=32), share("c", "a", 2, 600),
            share("d", "a", 2, 200), share("e", "b", 0, 200), share("f", "b", 0, 100), share("g", "b", 0, 300),
            pb.job("h", 1, "b", gib=32), share("i", "b", 2, 800), share("j", "b", 2, 100),
            pb.job("k", 2, "c", gib=64)]
    state = pb.build([pb.node("a", gpus=3), pb.node("b", gpus=3), pb.node("c", gpus=2)], work)
    plan = plan_moves(state, Request(1, gpu_milli=700), PlanOptions(solver="exact", max_moves=4))
    check_plan(state, plan, "exact")
    assert [m.workload_id for m in plan.moves] == ["j", "d", "g"]
    assert plan.placements[0].node == "b"
