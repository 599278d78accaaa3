"""Property: the simulator's repacker and the planner work on one capacity model and one cost formula.

On random small clusters where a pod fits nowhere: whenever the simulator's repacker rescues it, its moves fit
the planner's capacity model (all moved pods stopped, then restored); when they can also be made one after
another (no two pods taking each other's room, which the simulator allows and the planner does not), they replay
through the planner's replay, their price by core.cost is what the simulator recorded, the exact planner finds
a plan too, and that plan costs no more (the same cost when it moves the same pods).

The dynamic simulator's migrate action asks the product's one decision (`core.decision.decide`, options from
`policy.options`) exactly as `gpudefrag plan` does: on random fragmented clusters, written to a snapshot file
and planned through the CLI, both doors give the same decision, the same moves and the same cost, and the
simulator's arrays end where the plan puts every job."""

from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from gpudefrag.core.capacity import Capacity
from gpudefrag.core.cost import CostModel
from gpudefrag.core.model import MILLI, ClusterState, Node, Placement, Request, Workload
from gpudefrag.core.placement import Choice, Cluster, Pod, get_policy
from gpudefrag.core.planner import Move, MoveError, PlanOptions, apply_moves, fits_after, plan_moves
from gpudefrag.sim.costs import as_workload, checkpoint_bytes
from gpudefrag.sim.dynamic import Decider, DynamicConfig, migrate_options
from gpudefrag.sim.repack import ChainRepacker
from gpudefrag.sim.replay import MoveStats, Placed
from gpudefrag.sim.trace import fgd_mix
from gpudefrag.snapshot import save_snapshot

SHARES = (200, 300, 400, 500, 600, 700, 1000)


@st.composite
def saturated(draw) -> tuple[Cluster, Placed, Pod]:
    """2–3 nodes of 2–4 GPUs, every GPU filled with one whole pod or 1–3 sharing pods leaving less than 500
    milli free, and a pod of 500–1000 milli that therefore fits nowhere."""
    n = draw(st.integers(2, 3))
    counts = [draw(st.integers(2, 4)) for _ in range(n)]
    cl = Cluster.build([f"n{i}" for i in range(n)], counts, ["G"] * n, [64_000] * n, [0] * n,
                       fgd_mix([Pod(1, s) for s in (300, 500, 700, 1000)]))
    placed = Placed.for_cluster(cl)
    for i, k in enumerate(counts):
        for g in range(k):
            if draw(st.integers(0, 3)) == 0:
                pods = [MILLI]
            else:
                used = draw(st.sampled_from((600, 700, 800, 900)))
                cuts = sorted(draw(st.lists(st.sampled_from(range(100, used, 100)), max_size=2, unique=True)))
                pods = [b - a for a, b in zip([0, *cuts], [*cuts, used], strict=True)]
            for share in pods:
                pod = Pod(1, share, draw(st.sampled_from((1000, 4000))))
                cl.place(pod, Choice(i, (g,)))
                placed.add(pod, Choice(i, (g,)))
    want = Pod(1, draw(st.sampled_from((500, 700, MILLI))), 1000)
    assume(get_policy("bestfit").choose(cl, want, np.random.default_rng(0)) is None)
    return cl, placed, want


def as_state(cl: Cluster, placed: Placed) -> ClusterState:
    nodes = [Node(name, int(cl.gpu_count[i]), "G", cpu_milli=int(cl.cpu_cap[i])) for i, name in enumerate(cl.names)]
    ws = [Workload(f"pod-{pid}", as_workload(pod, 0).request, placements=(Placement(cl.names[ch.node], ch.gpus),),
                   checkpoint_bytes=int(checkpoint_bytes(pod, "G")))
          for pid, (pod, ch) in placed.pods.items()]
    return ClusterState(tuple(nodes), tuple(ws))


def in_order(state: ClusterState, moves: list[Move]) -> list[Move] | None:
    """An order in which each move finds its room when it is made (a chain's last hop first)."""
    done: list[Move] = []
    todo = list(moves)
    while todo:
        for m in todo:
            try:
                apply_moves(state, [*done, m])
            except MoveError:
                continue
            done.append(m)
            todo.remove(m)
            break
        else:
            return None
    return done


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(saturated())
def test_the_simulator_and_the_planner_agree_on_plans_and_their_cost(case):
    cl, placed, want = case
    state = as_state(cl, placed)
    ids = {pid: f"pod-{pid}" for pid in placed.pods}
    cm = CostModel()
    stats = MoveStats()
    # ejection chains (every hop into a hole that exists when it is made); CPU relief and swaps trade two pods
    # places at once, which the planner (one move after another) does not model
    sim = ChainRepacker(max_moves=4, budget=100, pool=0, cpu_relief=False, cpu_swaps=False, check_clearable=False)
    ch = sim.rescue(cl, want, placed, get_policy("bestfit"), np.random.default_rng(0), stats)
    request = Request(want.num_gpu, 1, want.gpu_milli, want.cpu_milli)
    plan = plan_moves(state, request, PlanOptions(max_moves=4, max_moves_per_node=100, solver="exact",
                                                  time_limit_s=10.0, cost_model=cm))
    if ch is None:
        event("the repacker found nothing" + (" (the planner did)" if plan.feasible else ""))
        return  # the repacker is a heuristic: it may miss a plan the planner finds
    assume(all(was.node != now.node for _, was, now in sim.last_moved))  # the planner never moves within a node
    w = {x.id: x for x in state.workloads}
    moves = [Move(ids[pid], cl.names[was.node], cl.names[now.node], now.gpus,
                  cm.move_cost(w[ids[pid]], cl.names[was.node], cl.names[now.node], state.now))
             for pid, was, now in sim.last_moved]
    # all at once (every moved pod stopped, then restored) they fit in the planner's capacity model
    cap = Capacity.of_state(state)
    for pid, was, _now in sim.last_moved:
        cap.give(was.node, was.gpus, placed.pods[pid][0])
    for pid, _was, now in sim.last_moved:
        cap.take(now.node, now.gpus, placed.pods[pid][0])
    cap.take(ch.node, ch.gpus, want)
    # one after another, as the planner moves, unless they form a cycle (two pods taking each other's room)
    ordered = in_order(state, moves)
    event("the repacker's moves form a cycle" if ordered is None else "compared")
    assume(ordered is not None)
    assert fits_after(state, ordered, request, (Placement(cl.names[ch.node], ch.gpus),))
    sim_cost = sum(m.cost.score for m in ordered)
    assert math.isclose(sim_cost, stats.moved_gpu_s, rel_tol=1e-9)
    assert plan.feasible, plan.reason
    assert plan.score <= sim_cost + 1e-6
    if plan.optimal and len(plan.moves) == len(ordered) and {m.workload_id for m in plan.moves} == {
            m.workload_id for m in ordered}:
        assert math.isclose(plan.score, sim_cost, rel_tol=1e-9)
    event("same cost" if math.isclose(plan.score, sim_cost, rel_tol=1e-9) else "the planner is cheaper")


@st.composite
def fragmented(draw) -> tuple[Cluster, Placed, Pod, dict[int, float]]:
    """3–4 nodes of 4 or 8 GPUs holding whole-GPU jobs of 1, 2 or 4 GPUs (some sharing pods too) with holes
    between them, each job started at its own time, and a pending job of 2, 4 or 8 whole GPUs that fits on no
    node as the cluster stands although enough whole GPUs are free."""
    n = draw(st.integers(3, 4))
    counts = [draw(st.sampled_from((4, 8))) for _ in range(n)]
    cl = Cluster.build([f"n{i}" for i in range(n)], counts, ["G"] * n, [128_000] * n, [0] * n,
                       fgd_mix([Pod(1, MILLI), Pod(2, MILLI), Pod(4, MILLI)]))
    placed = Placed.for_cluster(cl)
    started: dict[int, float] = {}
    for i, k in enumerate(counts):
        g = 0
        while g < k:
            size = draw(st.sampled_from((0, 0, 1, 1, 2, 4)))  # 0: leave a hole
            if size == 0:
                g += 1
                continue
            size = min(size, k - g)
            share = MILLI if size > 1 or draw(st.booleans()) else draw(st.sampled_from((300, 500)))
            pod = Pod(size, share, draw(st.sampled_from((2000, 8000))))
            ch = Choice(i, tuple(range(g, g + size)))
            cl.place(pod, ch)
            started[placed.add(pod, ch)] = float(draw(st.integers(0, 9_000)))
            g += size
    want = Pod(draw(st.sampled_from((2, 4, 8))), MILLI, 4000)
    assume(want.num_gpu <= max(counts))
    assume(int((cl.free == MILLI).sum()) >= want.num_gpu)  # enough whole GPUs, scattered
    assume(get_policy("bestfit").choose(cl, want, np.random.default_rng(0)) is None)
    return cl, placed, want, started


@settings(max_examples=30, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])
@given(case=fragmented())
def test_the_dynamic_simulators_migrate_and_plan_agree(case, cli, tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    """The dynamic simulator's migrate action and `gpudefrag plan` on the same cluster, written to a snapshot
    file: the same decision, the same moves at the same cost, and the simulator's arrays end exactly where
    the plan puts every job (issue #12: the simulator's defrag and the planner find plans of the same cost)."""
    cl, placed, want, started = case
    cfg = DynamicConfig(policy="bestfit", defrag="migrate", max_moves=6, movable_max_gpus=4)
    decider = Decider(cl, placed, migrate_options(cfg, CostModel()), cfg.check_every_s)
    now, queued = 10_000.0, 9_000.0
    state, head = decider.state(0, want, queued, started, now)
    folder = tmp_path_factory.mktemp("door")
    save_snapshot(folder / "snap.json", state)
    (folder / "policy.yaml").write_text(
        f"name: dynamic-migrate\nfilter:\n  max_gpus: {cfg.movable_max_gpus}\n"
        f"budgets:\n  max_moves_per_plan: {cfg.max_moves}\n")
    code, out, err = cli(["plan", str(folder / "snap.json"), "--job", head.id, "--policy",
                          str(folder / "policy.yaml"), "--solver", "heuristic", "--json"])
    assert code in (0, 1), err
    door = json.loads(out)["decision"]
    before = cl.free.copy()
    choice = decider.rescue(0, want, queued, started, now, version=0)
    d = decider.last
    assert d is not None
    assert d.chosen == door["chosen"]
    assert [c.code.value for c in d.causes] == [c["code"] for c in door["causes"]]
    if choice is None:
        event(f"no move ({d.chosen}: {','.join(c.code.value for c in d.causes)})")
        assert (cl.free == before).all()  # nothing applied
        assert not (door["chosen"] == "move" and door["plan"]["feasible"])
        return
    event("moved")
    plan = door["plan"]
    assert plan["feasible"] and door["chosen"] == "move"
    ids = {f"pod-{pid}": pid for pid in placed.pods}
    sim_moves = [(f"pod-{pid}", cl.names[was.node], cl.names[new.node], list(new.gpus))
                 for pid, was, new, _, _ in decider.last_moved]
    assert sim_moves == [(m["workload"], m["source"], m["target"], m["target_gpus"]) for m in plan["moves"]]
    assert math.isclose(sum(down for *_, down, _lost in decider.last_moved),
                        sum(m["cost"]["downtime_s"] for m in plan["moves"]), rel_tol=1e-9)
    assert d.plan is not None and math.isclose(d.plan.total_cost_s, plan["total_cost_s"], rel_tol=1e-9)
    assert [cl.names[choice.node], list(choice.gpus)] == [plan["placements"][0]["node"],
                                                           plan["placements"][0]["gpus"]]
    for m in plan["moves"]:  # every moved job sits where the plan put it, in the arrays and the bookkeeping
        assert placed.pods[ids[m["workload"]]][1] == Choice(cl.names.index(m["target"]), tuple(m["target_gpus"]))
    after = Cluster.from_state(apply_moves(state, [Move(m["workload"], m["source"], m["target"],
                                                        tuple(m["target_gpus"]), d.plan.moves[i].cost)
                                                   for i, m in enumerate(plan["moves"])]))
    after.place(want, Choice(after.names.index(cl.names[choice.node]), choice.gpus))
    assert (after.free == cl.free).all()
