"""apply_moves: every move is checked as it is made; a bad move is named, and nothing is half-applied."""

from __future__ import annotations

import dataclasses

import pytest

from gpudefrag.core.cost import CostModel
from gpudefrag.core.model import Request
from gpudefrag.core.planner import Move, MoveError, PlanOptions, apply_moves, plan_all_pending, plan_moves


@pytest.fixture
def state(pb):
    return pb.build(
        [pb.node("a"), pb.node("b"), pb.node("c")],
        [pb.job("a1", 2, "a"), pb.job("b1", 4, "b"), pb.job("c1", 6, "c"), pb.job("mn", 1, ["a", "b"])],
    )


def mv(state, wid, source, target, gpus):
    w = state.workload(wid)
    return Move(wid, source, target, gpus, CostModel().move_cost(w, source, target, state.now))


def test_valid_moves_give_the_new_state(state):
    after = apply_moves(state, [mv(state, "a1", "a", "b", (5, 6))])
    assert after.workload("a1").placements[0].node == "b"
    assert after.free_gpus_on("a") == [g for g in range(8) if g != 2]  # mn keeps GPU 2 of a
    assert state.workload("a1").placements[0].node == "a"  # the input is untouched


@pytest.mark.parametrize(("moves", "message"), [
    ([("a1", "a", "c", (5, 6))], "GPU 5 of c has no room"),
    ([("a1", "b", "c", (6, 7))], "it runs on a, not b"),
    ([("mn", "a", "c", (6,))], "multi-node workloads never move"),
    ([("a1", "a", "b", (5,))], "needs 2 distinct GPUs"),
    ([("a1", "a", "b", (5, 6)), ("a1", "b", "a", (0, 1))], "moves a workload twice"),
    ([("nope", "a", "b", (5,))], "no running workload 'nope'"),
    ([("a1", "a", "a", (5, 6))], "bad target node 'a'"),
])
def test_bad_moves_are_named(state, moves, message):
    ms = [Move(w, s, t, g, CostModel().move_cost(state.workloads[0], s, t, 0)) for w, s, t, g in moves]
    with pytest.raises(MoveError, match=message):
        apply_moves(state, ms)


def test_order_matters_a_target_must_be_freed_first(pb):
    # b1 must leave b before a1 can take its GPUs
    state = pb.build([pb.node("a", gpus=4), pb.node("b", gpus=4), pb.node("c", gpus=4)],
                     [pb.job("a1", 4, "a"), pb.job("b1", 4, "b")])
    good = [mv(state, "b1", "b", "c", (0, 1, 2, 3)), mv(state, "a1", "a", "b", (0, 1, 2, 3))]
    apply_moves(state, good)
    with pytest.raises(MoveError, match="move 1"):
        apply_moves(state, good[::-1])


def test_all_pending_plans_do_not_reuse_a_workload(pb):
    # two 8-GPU jobs wait; a and b can each be cleared by moving their small jobs onto c and d
    state = pb.build(
        [pb.node("a"), pb.node("b"), pb.node("c"), pb.node("d")],
        [pb.job("a1", 2, "a", gib=1), pb.job("b1", 2, "b", gib=1), pb.job("c1", 4, "c", gib=90),
         pb.job("d1", 4, "d", gib=90), pb.job("p1", 8, submitted_at=1.0), pb.job("p2", 8, submitted_at=2.0)],
    )
    plans = plan_all_pending(state, PlanOptions())
    assert [p.workload_id for p in plans] == ["p1", "p2"]
    assert all(p.feasible for p in plans)
    assert {p.target_node for p in plans} == {"a", "b"}
    moved = [m.workload_id for p in plans for m in p.moves]
    assert sorted(moved) == ["a1", "b1"]
    one = plan_all_pending(state, PlanOptions(), k=1)
    assert [p.workload_id for p in one] == ["p1"]


def test_plan_json_is_complete(state):
    plan = plan_moves(state, Request(8), PlanOptions())
    d = plan.as_dict()
    assert d["feasible"] and d["solver"] in ("exact", "heuristic") and d["moves"]
    m = d["moves"][0]
    assert set(m["cost"]) >= {"checkpoint_s", "transfer_s", "restore_s", "lost_work_s", "total_s", "gpu_s"}
    assert m["evict"]["kind"] == "evict" and m["drain"]["kind"] == "drain"
    assert d["total_gpu_s"] == pytest.approx(sum(x["cost"]["gpu_s"] for x in d["moves"]))
    assert dataclasses.asdict(plan.moves[0].cost)  # plain dataclass, serialisable


def test_decide_pending_plans_each_job_once_and_prices_it(pb, monkeypatch):
    """`plan --all-pending`'s batch entry: one diagnosis and one plan per job (not a `decide` to find the blocked
    ones and a second plan), the same plans as planning in turn, and each with its priced alternatives."""
    import gpudefrag.core.planner as planner
    from gpudefrag.core.decision import MOVE, decide_pending

    state = pb.build(
        [pb.node("a"), pb.node("b"), pb.node("c"), pb.node("d")],
        [pb.job("a1", 2, "a", gib=1), pb.job("b1", 2, "b", gib=1), pb.job("c1", 4, "c", gib=90),
         pb.job("d1", 4, "d", gib=90), pb.job("p1", 8, submitted_at=1.0), pb.job("p2", 8, submitted_at=2.0),
         pb.job("held", 8, submitted_at=3.0, scheduler_reason="JobHeldUser")],
    )
    calls: list[str] = []
    real = planner.plan_moves

    def counted(st, request, options):  # type: ignore[no-untyped-def]
        calls.append(request.label())
        return real(st, request, options)

    monkeypatch.setattr(planner, "plan_moves", counted)
    ds = decide_pending(state, PlanOptions())
    assert [d.workload_id for d in ds] == ["p1", "p2", "held"]
    assert len(calls) == 2  # the held job is diagnosed, not planned; the others once each
    assert ds[2].blocked and ds[2].plan is None
    monkeypatch.setattr(planner, "plan_moves", real)
    assert [d.plan for d in ds[:2]] == plan_all_pending(state.with_workloads(
        [w for w in state.workloads if w.id != "held"]), PlanOptions())
    for d in ds[:2]:
        assert d.feasible and d.options and d.options[0].kind == MOVE and any(o.cheapest for o in d.options)
        assert {o.kind for o in d.options} >= {MOVE, "evict"}
