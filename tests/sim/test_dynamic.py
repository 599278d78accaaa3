"""Dynamic simulation bookkeeping on a small synthetic workload."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpudefrag.core.decision import decide
from gpudefrag.core.model import (
    MILLI,
    ClusterState,
    ModelError,
    Node,
    Placement,
    Request,
    WorkloadState,
    workload_row,
)
from gpudefrag.core.model import Workload as ModelWorkload
from gpudefrag.core.placement import Choice, Cluster, Pod, get_policy
from gpudefrag.core.planner import PlanOptions
from gpudefrag.sim.costs import checkpoint_bytes
from gpudefrag.sim.dynamic import Decider, DynamicConfig, simulate
from gpudefrag.sim.replay import Placed
from gpudefrag.sim.report import gap_closed
from gpudefrag.sim.synthetic import Job, Workload, WorkloadSpec, generate

SPEC = WorkloadSpec(nodes=4, jobs=300, load=0.95, seed=3, duration_median_s=600)


def test_workload_is_seeded_and_documented_mix_holds():
    a, b = generate(SPEC), generate(SPEC)
    assert [j.submit for j in a.jobs] == [j.submit for j in b.jobs]
    assert SPEC.eight_gpu_demand_share() >= 0.30
    sub = np.array([j.submit for j in a.jobs])
    assert (np.diff(sub) >= 0).all()


def test_every_job_runs_once_and_utilisation_stays_within_capacity():
    wl = generate(SPEC)
    for cfg in (DynamicConfig(policy="bestfit"), DynamicConfig(policy="fgd", defrag="migrate", trigger_s=60),
                DynamicConfig(policy="fgd", defrag="evict", trigger_s=60), DynamicConfig(pooled=True)):
        r = simulate(wl, cfg)
        assert np.isfinite(r.waited).all() and (r.waited >= -1e-9).all(), cfg
        assert (r.util <= 1.0 + 1e-9).all() and (r.util >= 0).all()
        assert (r.end >= r.submit).all()
        if cfg.defrag == "evict":
            assert r.lost_gpu_s >= 0 and r.moves == 0
        if cfg.defrag == "migrate":
            assert r.evictions == 0 and r.move_gpu_s >= 0


def test_gap_closed_is_computed_from_the_three_configs():
    wl = generate(SPEC)
    rs = [simulate(wl, c) for c in (DynamicConfig(policy="fgd"), DynamicConfig(policy="fgd", defrag="migrate"),
                                    DynamicConfig(pooled=True))]
    g = gap_closed(rs)
    assert g is None or g <= 1.5


# ---------------------------------------------------------------------------------------------- the one decision
GIB_MIB = 1024


def _scenario(a_mib: int = 64 * GIB_MIB, d_mib: int = 1024) -> tuple[Workload, Cluster]:
    """Two nodes of two GPUs, first fit: A (large checkpoint) and a short job fill node a, D takes b/0; when the
    short job ends, the 2-GPU job C fits on neither node until one of A or D moves."""
    spec = WorkloadSpec(nodes=2, gpus_per_node=2, jobs=4)
    jobs = (Job(0, Pod(1, 1000, 8000, a_mib), 0.0, 10_000.0),  # A
            Job(1, Pod(1, 1000, 8000, 1024), 0.0, 100.0),  # leaves at 100
            Job(2, Pod(1, 1000, 8000, d_mib), 1.0, 10_000.0),  # D
            Job(3, Pod(2, 1000, 16000, 2048), 200.0, 1_000.0))  # C
    return Workload(spec, jobs), Cluster.build(["a", "b"], [2, 2], ["G2", "G2"], [64_000, 64_000], [0, 0])


def _options(cfg: DynamicConfig) -> PlanOptions:
    return PlanOptions(max_moves=cfg.max_moves, solver="heuristic",
                       movable=lambda w: w.request.gpus_per_node <= cfg.movable_max_gpus)


def _running(wid: str, pod: Pod, node: str, gpus: tuple[int, ...], started: float) -> ModelWorkload:
    return ModelWorkload(wid, Request(pod.num_gpu, 1, pod.gpu_milli, pod.cpu_milli, pod.memory_mib),
                         placements=(Placement(node, gpus),), started_at=started,
                         checkpoint_bytes=int(checkpoint_bytes(pod, "G2")))


def test_migrate_applies_exactly_the_plan_of_the_one_decision():
    wl, cl = _scenario()
    cfg = DynamicConfig(policy="firstfit", defrag="migrate", trigger_s=60, check_every_s=60)
    r = simulate(wl, cfg, cl)
    # the state at the first check after C waited 60 s (t = 300), written by hand: A on a/0, D on b/0
    a, d, c = wl.jobs[0].pod, wl.jobs[2].pod, wl.jobs[3].pod
    state = ClusterState.build(
        [Node("a", 2, "G2", cpu_milli=64_000), Node("b", 2, "G2", cpu_milli=64_000)],
        [_running("pod-0", a, "a", (0,), 0.0), _running("pod-2", d, "b", (0,), 1.0),
         ModelWorkload("job-3", Request(2, 1, 1000, c.cpu_milli, c.memory_mib), WorkloadState.PENDING,
                       submitted_at=200.0)], now=300.0)
    dec = decide(state, state.workload("job-3"), _options(cfg))
    assert dec.chosen == "move" and dec.feasible
    assert r.move_log == [(300.0, m.workload_id, m.source, m.target, m.target_gpus) for m in dec.plan.moves]
    assert [m.workload_id for m in dec.plan.moves] == ["pod-2"]  # D: the smaller checkpoint, not A
    assert r.moves == 1 and r.start[3] == 300.0 and r.waited[3] == 100.0
    # D stopped for exactly the move's downtime as the plan priced it
    assert r.end[2] == pytest.approx(1.0 + 10_000.0 + dec.plan.moves[0].cost.downtime_s)


def test_a_pod_no_node_could_ever_hold_does_not_block_the_queue_head():
    """E (2 GPUs and 100 cores, on nodes of 64) arrives before C: it never starts, and it never becomes the head
    pod that every arm acts for — C is moved for as in the scenario without E (at 300 s, one move), and the
    decision is not asked for E at every check until the replay ends (a gpuspec list asked it 213,323 times)."""
    wl, cl = _scenario()
    e_id, c_id = 3, 4  # E arrives before C
    with_e = Workload(wl.spec, (*wl.jobs[:3], Job(e_id, Pod(2, 1000, 100_000, 2048), 150.0, 1_000.0),
                                dataclasses.replace(wl.jobs[3], id=c_id)))
    cfg = DynamicConfig(policy="firstfit", defrag="migrate", trigger_s=60, check_every_s=60)
    r = simulate(with_e, cfg, cl)
    base = simulate(wl, cfg, cl)
    assert np.isnan(r.first_start[e_id]) and np.isnan(r.waited[e_id])
    assert r.moves == base.moves == 1 and r.start[c_id] == base.start[3] == 300.0
    assert r.decisions == base.decisions
    evict = simulate(with_e, dataclasses.replace(cfg, defrag="evict"), cl)
    assert evict.start[c_id] == 300.0 and evict.evictions >= 1


def test_migrate_does_nothing_when_the_decision_prefers_eviction():
    wl, cl = _scenario(a_mib=200 * GIB_MIB, d_mib=200 * GIB_MIB)
    cfg = DynamicConfig(policy="firstfit", defrag="migrate", trigger_s=60, check_every_s=60)
    sim_cl = cl.copy()
    placed = Placed.for_cluster(sim_cl)
    # A on a/0, D on b/0, both with a 232 GiB checkpoint, both started at 250 s; C pending: at 300 s evicting
    # either (50 s of work + a 300 s cold start) is cheaper than moving it (~460 s of downtime)
    for j, ch in ((wl.jobs[0], Choice(0, (0,))), (wl.jobs[2], Choice(1, (0,)))):
        sim_cl.place(j.pod, ch)
        placed.add(j.pod, ch)
    free = sim_cl.free.copy()
    decider = Decider(sim_cl, placed, _options(cfg), cfg.check_every_s)
    c = wl.jobs[3].pod
    assert decider.rescue(3, c, 200.0, {0: 250.0, 1: 250.0}, 300.0, version=1) is None
    assert decider.last is not None and decider.last.chosen == "evict"
    assert (sim_cl.free == free).all() and placed.pods[1][1] == Choice(1, (0,))
    assert decider.rescue(3, c, 200.0, {0: 250.0, 1: 250.0}, 330.0, version=1) is None
    assert decider.asked == 1  # nothing changed within the check interval: not asked again
    # later the same move is cheaper than the work an eviction would lose: it is made
    got = decider.rescue(3, c, 200.0, {0: 250.0, 1: 250.0}, 900.0, version=2)
    assert decider.last.chosen == "move" and got is not None
    assert [(f"pod-{p}", new) for p, _, new, _, _ in decider.last_moved] == [
        (m.workload_id, Choice(["a", "b"].index(m.target), m.target_gpus)) for m in decider.last.plan.moves]
    assert (sim_cl.free[got.node, list(got.gpus)] == 0).all()


def test_cluster_to_state_keeps_the_arrays_and_the_background_immovable():
    snap = ClusterState.build(
        [Node("n0", 4, "G2", cpu_milli=32_000), Node("n1", 2, "G2"), Node("n2", 2, "G2", schedulable=False)],
        [ModelWorkload("bg", Request(1, 1, 300, 2000), placements=(Placement("n0", (1,)),))])
    cl = Cluster.from_state(snap)
    pod = Pod(2, 1000, 4000, 0)
    cl.place(pod, Choice(0, (2, 3)))
    mine = ModelWorkload("pod-0", Request(2, 1, 1000, 4000), placements=(Placement("n0", (2, 3)),))
    state = cl.to_state([mine])
    np.testing.assert_array_equal(state.free_milli, cl.free)
    np.testing.assert_array_equal(state.cpu_free, cl.cpu_free)
    bg = [w for w in state.workloads if w.id.startswith("background-")]
    assert bg and not any(w.can_move for w in bg)
    assert state.workload("pod-0").can_move


def test_to_state_totals_equal_a_fresh_build_and_a_bad_total_is_refused():
    """`Cluster.to_state` hands the state its usage totals (`ClusterState.from_totals`) instead of summing every
    workload again: on random placements (shares, whole GPUs, CPU-only pods, CPU and memory tracked or not, a
    background load) every array equals the one `ClusterState.build` computes from the same workloads."""
    rng = np.random.default_rng(5)
    best = get_policy("bestfit")
    for trial in range(30):
        nodes = [Node(f"n{i}", int(rng.choice([2, 4, 8])), "G2", cpu_milli=int(rng.choice([0, 64_000])),
                      memory_mib=int(rng.choice([0, 256_000]))) for i in range(6)]
        bg = [ModelWorkload("bg", Request(1, 1, 300, 2000), placements=(Placement("n0", (1,)),))]
        cl = Cluster.from_state(ClusterState.build(nodes, bg))
        mine = []
        for k in range(40):
            gpus = int(rng.choice([0, 1, 1, 2]))
            share = int(rng.choice([250, 500, 1000])) if gpus == 1 else MILLI
            pod = Pod(gpus, share if gpus else 0, int(rng.integers(0, 8000)), int(rng.integers(0, 30_000)))
            ch = best.choose(cl, pod, rng)
            if ch is None:
                continue
            cl.place(pod, ch)
            mine.append(ModelWorkload(f"pod-{k}", Request(gpus, 1, share, pod.cpu_milli, pod.memory_mib),
                                      placements=(Placement(f"n{ch.node}", ch.gpus),)))
        idx = {f"n{i}": i for i in range(6)}
        rows = [workload_row(w, idx) for w in mine]
        held = np.full((len(mine), cl.free.shape[1]), -1, dtype=np.int64)  # the GPUs of each, -1 padded
        for k, w in enumerate(mine):
            held[k, : len(w.placements[0].gpus)] = w.placements[0].gpus
        state = cl.to_state(mine, now=5.0, known_rows=rows)
        summed = cl.to_state(mine, now=5.0, known_rows=np.array(rows).reshape(-1, 9), known_gpus=held)
        fresh = ClusterState.build(state.nodes, state.workloads, now=5.0)
        for attr in ("free_milli", "used_milli", "cpu_free", "mem_free", "gpu_counts", "usable_counts",
                     "running_rows"):  # the rows the caller kept, the background's added, are the state's own
            np.testing.assert_array_equal(getattr(state, attr), getattr(fresh, attr), err_msg=f"{trial} {attr}")
            np.testing.assert_array_equal(getattr(summed, attr), getattr(fresh, attr), err_msg=f"{trial} {attr}")
        np.testing.assert_array_equal(state.free_milli, cl.free)
        assert summed.workloads == fresh.workloads
    with pytest.raises(ModelError):  # totals that overfill a GPU are refused, not trusted
        ClusterState.from_totals(state.nodes, state.workloads, state.used_milli + MILLI, np.zeros(6), np.zeros(6))
    with pytest.raises(ModelError, match="running_rows"):  # rows that do not match the running workloads
        ClusterState.from_totals(state.nodes, state.workloads, state.used_milli, np.zeros(6), np.zeros(6),
                                 running_rows=np.zeros((1, 9), dtype=np.int64))
    with pytest.raises(ModelError, match="verdicts"):  # a filter's verdicts that do not match them either
        ClusterState.from_totals(state.nodes, state.workloads, state.used_milli, np.zeros(6), np.zeros(6),
                                 verdicts=(bool, np.ones(1, dtype=bool)))


def test_decider_state_kept_between_decisions_equals_one_built_afresh():
    """The decision's input is kept per pod between decisions (only the pods placed, moved or dropped since, and
    those whose heartbeat passed, are made again): after random starts, ends and moves on a cluster with a
    background load, at times that cross heartbeats, it equals the state built from every placed pod anew
    (workloads in pod order, rows, free arrays, and the filter's verdicts)."""
    from gpudefrag.core.capacity import pick_gpus
    from gpudefrag.sim.costs import as_workload, request_of

    rng = np.random.default_rng(11)
    nodes = [Node(f"n{i}", int(rng.choice([2, 4, 8])), "G2", cpu_milli=64_000, memory_mib=256_000)
             for i in range(6)]
    bg = [ModelWorkload("bg", Request(1, 1, 300, 2000), placements=(Placement("n0", (1,)),), movable=False)]
    cl = Cluster.from_state(ClusterState.build(nodes, bg))
    placed = Placed.for_cluster(cl)
    best = get_policy("bestfit")
    opts = _options(DynamicConfig(movable_max_gpus=1))
    decider = Decider(cl, placed, opts, 60.0, heartbeat_s=100.0)
    started: dict[int, float] = {}
    now, moved, ended = 0.0, 0, 0
    for step in range(40):
        now += float(rng.choice([5.0, 40.0, 100.0, 250.0]))
        for _ in range(int(rng.integers(0, 4))):  # starts
            gpus = int(rng.choice([0, 1, 1, 2, 4]))
            share = int(rng.choice([250, 500, 1000])) if gpus == 1 else MILLI
            pod = Pod(gpus, share if gpus else 0, int(rng.integers(0, 8000)), int(rng.integers(0, 30_000)))
            ch = best.choose(cl, pod, rng)
            if ch is not None:
                cl.place(pod, ch)
                started[placed.add(pod, ch)] = now
        pids = list(placed.pods)
        for pid in rng.permutation(pids)[: int(rng.integers(0, 3))].tolist():  # ends
            cl.remove(*placed.drop(pid))
            del started[pid]
            ended += 1
        for pid in rng.permutation(list(placed.pods))[: int(rng.integers(0, 3))].tolist():  # moves elsewhere
            pod, was = placed.pods[pid]
            fit = cl.fits(pod)
            fit[was.node] = False
            if fit.any():
                node = int(rng.choice(np.flatnonzero(fit)))
                cl.remove(pod, was)
                ch = Choice(node, pick_gpus(cl.free[node], pod))
                cl.place(pod, ch)
                placed.move(pid, ch)
                moved += 1
        head = Pod(2, 1000, 4000, 0)
        got, _ = decider.state(99, head, now - 10.0, started, now)
        mine = []
        for pid, (p, ch) in placed.pods.items():
            t0 = started[pid]
            ck = t0 + ((now - t0) // 100.0) * 100.0 if now - t0 >= 100.0 else None
            mine.append(as_workload(p, checkpoint_bytes(p, "G2"), pid, placements=(Placement(f"n{ch.node}", ch.gpus),),
                                    started_at=t0, last_checkpoint_at=ck))
        want = cl.to_state(mine, (ModelWorkload("job-99", request_of(head), WorkloadState.PENDING,
                                                submitted_at=now - 10.0),), now=now, name="dynamic")
        assert got.workloads == want.workloads, step
        for attr in ("free_milli", "cpu_free", "mem_free", "running_rows"):
            np.testing.assert_array_equal(getattr(got, attr), getattr(want, attr), err_msg=f"{step} {attr}")
        np.testing.assert_array_equal(got.may_move(decider.options.movable), want.may_move(opts.movable))
    assert moved > 10 and ended > 10


def test_decider_after_no_plan_asks_again_only_when_room_came_back():
    """With no feasible plan, a start (the cluster version moves, the room version does not) cannot make one:
    the decision is not asked again until a job ends or moves (room version), the head changes, or the check
    interval passes; a caller that does not count room (freed None) is asked on every version, as before. The
    answer holds for every queued job of the same shape, not for another shape."""
    cl = Cluster.build(["a", "b"], [2, 2], ["G2", "G2"], [64_000, 64_000], [0, 0])
    placed = Placed.for_cluster(cl)
    big, one = Pod(2, 1000, 8000, 1024), Pod(1, 1000, 8000, 1024)
    for pod, ch in ((big, Choice(0, (0, 1))), (one, Choice(1, (0,)))):
        cl.place(pod, ch)
        placed.add(pod, ch)
    decider = Decider(cl, placed, _options(DynamicConfig()), 60.0)
    started = {0: 0.0, 1: 0.0}
    assert decider.rescue(7, big, 100.0, started, 300.0, version=1, freed=1) is None
    assert decider.last is not None and not decider.last.feasible and decider.asked == 1
    assert decider.rescue(7, big, 100.0, started, 310.0, version=2, freed=1) is None
    assert decider.asked == 1  # only a start since: still no plan, not asked
    assert decider.rescue(8, big, 100.0, started, 311.0, version=2, freed=1) is None
    assert decider.asked == 1  # another job of the same shape: the same state gives it the same "no plan"
    bigger = Pod(2, 1000, 9000, 1024)
    assert decider.rescue(9, bigger, 100.0, started, 311.0, version=2, freed=1) is None
    assert decider.asked == 2  # another shape is asked
    assert decider.rescue(8, big, 100.0, started, 320.0, version=3, freed=2) is None
    assert decider.asked == 3  # room came back: asked
    assert decider.rescue(8, big, 100.0, started, 330.0, version=4, freed=2) is None
    assert decider.asked == 3
    assert decider.rescue(8, big, 100.0, started, 381.0, version=4, freed=2) is None
    assert decider.asked == 4  # the check interval passed
    assert decider.rescue(8, big, 100.0, started, 390.0, version=5) is None
    assert decider.asked == 5  # no room count: every change asks


def test_decider_moves_the_cpu_only_pod_that_holds_the_cpu_where_the_gpus_are_free():
    """A 2-GPU pod whose GPUs are free on a but whose CPU a CPU-only pod holds: moving that pod makes room, so the
    decision calls it fragmentation of CPU and memory (not the ordinary cause cpu-or-memory it was) and moves
    it to b; the pod starts on a. With a filter that lets nothing move, it stays cpu-or-memory and nothing is
    planned, unless the policy's `trigger.plan_anyway` asks for a plan anyway (a replayed policy file is
    replayed as written): then a plan is made, and it is infeasible."""
    def setup() -> tuple[Cluster, Placed]:
        cl = Cluster.build(["a", "b"], [2, 2], ["G2", "G2"], [16_000, 16_000], [0, 0])
        placed = Placed.for_cluster(cl)
        for pod, ch in ((Pod(0, 0, 12_000, 0), Choice(0, ())), (Pod(2, 1000, 2_000, 0), Choice(1, (0, 1)))):
            cl.place(pod, ch)
            placed.add(pod, ch)
        return cl, placed

    big = Pod(2, 1000, 8_000, 0)
    cl, placed = setup()
    plain = Decider(cl, placed, _options(DynamicConfig()), 60.0)
    got = plain.rescue(9, big, 0.0, {0: 0.0, 1: 0.0}, 400.0, version=1, freed=1)
    assert [c.code.value for c in plain.last.causes] == ["fragmentation-cpu-memory"] and not plain.last.blocked_by
    assert got == Choice(0, (0, 1)) and [p for p, *_ in plain.last_moved] == [0]
    assert placed.pods[0][1].node == 1
    still = dataclasses.replace(_options(DynamicConfig()), movable=lambda w: False)
    for anyway in (False, True):
        cl, placed = setup()
        kept = Decider(cl, placed, still, 60.0, plan_anyway=anyway)
        assert kept.rescue(9, big, 0.0, {0: 0.0, 1: 0.0}, 400.0, version=1, freed=1) is None
        assert [c.code.value for c in kept.last.blocked_by] == ["cpu-or-memory"]
        assert kept.last.planned_anyway is anyway and (kept.last.plan is not None) is anyway
        assert not kept.last.feasible and placed.pods[0][1].node == 0


def _with_budgets(spec: WorkloadSpec, jobs: tuple[Job, ...], cl: Cluster, budgets):  # type: ignore[no-untyped-def]
    """The migrate arm with a 60 s pending trigger, a filter that keeps checkpoints over 100 GiB from moving, and
    `budgets`."""
    from gpudefrag.policy.models import Filter, PendingTrigger, Policy, Trigger

    product = Policy(trigger=Trigger(pending=PendingTrigger(longer_than_s=60)),
                     filter=Filter(max_checkpoint_size=100 * 2**30), budgets=budgets)
    return simulate(Workload(spec, jobs), DynamicConfig(policy="firstfit", defrag="migrate", product=product,
                                                        check_every_s=60), cl)


def test_a_head_no_plan_can_help_does_not_keep_the_next_pod_waiting():
    """H, at the head of the queue, fits only node a (its CPU), where A runs with a checkpoint the policy's filter
    keeps from moving: no plan helps H. C behind it needs one small move. The pending trigger tries the queued
    pods oldest first (`budgets.max_tries_per_cycle`, as the controller does): C is moved for at the first check
    past the trigger; with one try a cycle it waits behind H until A ends."""
    from gpudefrag.policy.models import Budgets

    spec = WorkloadSpec(nodes=3, gpus_per_node=2, jobs=8)
    small = Pod(1, 1000, 8000, 1024)
    jobs = (Job(0, Pod(1, 1000, 8000, 200 * GIB_MIB), 0.0, 10_000.0),  # A on a/0
            Job(1, small, 0.1, 100.0),  # a/1 until 100
            Job(2, small, 1.0, 10_000.0),  # D on b/0
            Job(3, small, 1.1, 100.0),  # b/1 until 100
            Job(4, small, 2.0, 10_000.0),  # F on c/0
            Job(5, small, 2.1, 100.0),  # c/1 until 100
            Job(6, Pod(2, 1000, 100_000, 1024), 150.0, 1_000.0),  # H: 100 cores, only node a has them
            Job(7, Pod(2, 1000, 16_000, 1024), 200.0, 1_000.0))  # C
    cl = Cluster.build(["a", "b", "c"], [2, 2, 2], ["G2"] * 3, [200_000, 64_000, 64_000], [0, 0, 0])

    r = _with_budgets(spec, jobs, cl, Budgets())
    assert [log[1:3] for log in r.move_log][:1] in ([("pod-2", "b")], [("pod-4", "c")])  # D or F made room
    assert r.start[7] < 400 and r.start[7] >= 260  # C: at a decision point past its trigger
    assert r.start[6] >= 10_000  # H: only once A ended
    one = _with_budgets(spec, jobs, cl, Budgets(max_tries_per_cycle=1))
    assert one.start[7] >= 10_000 and all(t >= 10_000 for t, *_ in one.move_log)


def test_pods_of_a_shape_already_asked_ride_along_and_use_no_try():
    """Two pods of H's shape (no plan helps either) at the head of the queue, C behind them: with two tries a
    cycle, the second H rides along on the first one's answer (the controller's trigger counts distinct
    requests), so C is the second try and is moved for at the first check past the trigger."""
    from gpudefrag.policy.models import Budgets

    spec = WorkloadSpec(nodes=3, gpus_per_node=2, jobs=9)
    small, h = Pod(1, 1000, 8000, 1024), Pod(2, 1000, 100_000, 1024)
    jobs = (Job(0, Pod(1, 1000, 8000, 200 * GIB_MIB), 0.0, 10_000.0), Job(1, small, 0.1, 100.0),
            Job(2, small, 1.0, 10_000.0), Job(3, small, 1.1, 100.0), Job(4, small, 2.0, 10_000.0),
            Job(5, small, 2.1, 100.0), Job(6, h, 150.0, 1_000.0), Job(7, h, 160.0, 1_000.0),
            Job(8, Pod(2, 1000, 16_000, 1024), 200.0, 1_000.0))
    cl = Cluster.build(["a", "b", "c"], [2, 2, 2], ["G2"] * 3, [200_000, 64_000, 64_000], [0, 0, 0])

    two = _with_budgets(spec, jobs, cl, Budgets(max_tries_per_cycle=2))
    assert 260 <= two.start[8] < 400 and two.start[6] >= 10_000 and two.start[7] >= 10_000
    one = _with_budgets(spec, jobs, cl, Budgets(max_tries_per_cycle=1))
    assert one.start[8] >= 10_000


@pytest.mark.parametrize(("tries", "plans"), [(4, 1), (2, 6), (1, 1)])
def test_the_replay_counts_a_cycle_by_the_policys_budgets(tries: int, plans: int):
    """The replay's decision point reads its tries, plans and jobs per cycle from the policy's `Budgets`, where
    the controller reads them: a replay cannot count a cycle differently from the product it stands for."""
    from gpudefrag.policy.models import Budgets

    budgets = Budgets(max_tries_per_cycle=tries, max_plans_per_cycle=plans)
    cl = Cluster.build(["a"], [2], ["G2"], [64_000], [0])
    decider = Decider(cl, Placed.for_cluster(cl), _options(DynamicConfig()), 60.0, budgets=budgets)
    assert (decider.max_tries, decider.max_plans, decider.max_jobs) == (
        budgets.tries_per_cycle, budgets.max_plans_per_cycle, budgets.jobs_per_cycle)
    assert decider.max_tries == max(tries, plans) and decider.max_jobs == 8 * max(tries, plans)
    default = Decider(cl, Placed.for_cluster(cl), _options(DynamicConfig()), 60.0)
    assert (default.max_tries, default.max_plans, default.max_jobs) == (
        Budgets().tries_per_cycle, Budgets().max_plans_per_cycle, Budgets().jobs_per_cycle)
