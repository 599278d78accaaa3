"""The chain repacker: rescues that need more than one hop, exact undo, and the bookkeeping of moves."""

from __future__ import annotations

import numpy as np
import pytest

from gpudefrag.core.model import MILLI
from gpudefrag.core.placement import Choice, Cluster, Pod, get_policy
from gpudefrag.sim.defrag import ArrayDefragmenter
from gpudefrag.sim.experiments import run_one, static_runs
from gpudefrag.sim.repack import ChainRepacker
from gpudefrag.sim.replay import MoveStats, Placed, allocation_ok, build_workload, replay
from gpudefrag.sim.trace import fgd_mix, load_trace

from .conftest import make_cluster, pod_row, write_trace


def _setup(rows, pods_at, cpu=None):
    cl = make_cluster([[MILLI] * len(r) for r in rows], cpu=cpu, mix=fgd_mix([Pod(1, MILLI)]))
    placed = Placed.for_cluster(cl)
    for pod, ch in pods_at:
        cl.place(pod, ch)
        placed.add(pod, ch)
    return cl, placed


def _snapshot(cl: Cluster, placed: Placed):
    return (cl.free.copy(), cl.cpu_free.copy(), cl.mem_free.copy(), cl.tags.copy(), placed.npods.copy(),
            dict(placed.pods))


def _consistent(cl: Cluster, placed: Placed, extra=()) -> bool:
    """The cluster's arrays are exactly what the registered pods (plus `extra`) use: each pod once."""
    free = np.where(cl.free >= 0, MILLI, -1)
    cpu = cl.cpu_cap.copy()
    for pod, ch in list(placed.pods.values()) + list(extra):
        for g in ch.gpus:
            free[ch.node, g] -= pod.gpu_milli
        cpu[ch.node] -= pod.cpu_milli
    npods = np.zeros_like(placed.npods)
    for _, ch in placed.pods.values():
        for g in ch.gpus:
            npods[ch.node, g] += 1
    return (np.array_equal(free, cl.free) and np.array_equal(cpu, cl.cpu_free)
            and np.array_equal(npods, placed.npods) and allocation_ok(cl))


# node 0: GPU0 = A 400 (600 free), GPU1 = B 600 + C 200 (200 free); node 1: GPU0 = D 800 (200 free),
# GPU1 = E 900 (100 free). A whole-GPU pod fits nowhere, and no single move frees a GPU (A fits in no hole);
# the chain A → node 0 GPU1 (after ejecting C), C → node 1 GPU0 does.
A, B, C, D, E = Pod(1, 400), Pod(1, 600), Pod(1, 200), Pod(1, 800), Pod(1, 900)
CHAIN = [(A, Choice(0, (0,))), (B, Choice(0, (1,))), (C, Choice(0, (1,))), (D, Choice(1, (0,))), (E, Choice(1, (1,)))]


def test_a_two_hop_chain_frees_a_gpu_where_single_moves_cannot():
    want = Pod(1, MILLI)
    pol = get_policy("bestfit")
    cl, placed = _setup([[MILLI] * 2] * 2, CHAIN)
    assert pol.choose(cl, want, np.random.default_rng(0)) is None
    assert ArrayDefragmenter("migrate", max_moves=8, budget=10).rescue(
        cl, want, placed, pol, np.random.default_rng(0), MoveStats()) is None
    stats = MoveStats()
    d = ChainRepacker(max_moves=8, budget=10)
    ch = d.rescue(cl, want, placed, pol, np.random.default_rng(0), stats)
    assert ch == Choice(0, (0,))
    assert stats.moves == 2 and stats.moved_milli == 600 and stats.moved_bytes > 0 and stats.move_seconds > 20
    assert {(placed.pods[p][0], now) for p, _, now in d.last_moved} == {(A, Choice(0, (1,))), (C, Choice(1, (0,)))}
    assert all(was != now for _, was, now in d.last_moved)
    assert list(cl.free[0]) == [0, 0] and list(cl.free[1]) == [0, 100]
    assert len(placed.pods) == 5 and _consistent(cl, placed, [(want, ch)])


def test_a_rescue_over_the_move_limit_is_undone_exactly():
    want = Pod(1, MILLI)
    pol = get_policy("bestfit")
    cl, placed = _setup([[MILLI] * 2] * 2, CHAIN)
    before = _snapshot(cl, placed)
    stats = MoveStats()
    assert ChainRepacker(max_moves=1, budget=10).rescue(cl, want, placed, pol, np.random.default_rng(0), stats) is None
    after = _snapshot(cl, placed)
    assert all(np.array_equal(a, b) for a, b in zip(before[:5], after[:5], strict=True))
    assert before[5] == after[5] and stats.moves == 0 and _consistent(cl, placed)


def test_the_global_budget_stops_moves():
    cl, placed = _setup([[MILLI] * 2] * 2, CHAIN)
    stats = MoveStats()
    # 5 placed pods × 0.2 = 1 move allowed: the two-move chain is not made
    assert ChainRepacker(budget=0.2).rescue(cl, Pod(1, MILLI), placed, get_policy("bestfit"),
                                            np.random.default_rng(0), stats) is None
    assert stats.moves == 0


def test_a_sharing_pod_gets_room_by_ejecting_smaller_pods():
    # node 0: GPU0 = 300 + 250 (450 free), GPU1 = 650 (350 free); node 1: 740 (260 free). An 800 pod fits
    # nowhere and no single move makes room; a chain of smaller pods does.
    p300, p250, p650, p740 = Pod(1, 300), Pod(1, 250), Pod(1, 650), Pod(1, 740)
    cl, placed = _setup([[MILLI] * 2, [MILLI]], [(p300, Choice(0, (0,))), (p250, Choice(0, (0,))),
                                                (p650, Choice(0, (1,))), (p740, Choice(1, (0,)))])
    want = Pod(1, 800)
    pol = get_policy("bestfit")
    assert ArrayDefragmenter("migrate", max_moves=8, budget=10).rescue(
        cl, want, placed, pol, np.random.default_rng(0), MoveStats()) is None
    stats = MoveStats()
    d = ChainRepacker(budget=10)
    ch = d.rescue(cl, want, placed, pol, np.random.default_rng(0), stats)
    assert ch is not None and ch.node == 0
    assert 2 <= stats.moves <= 3 and stats.moves == len(d.last_moved)
    assert int(cl.free[cl.free >= 0].sum()) == 3 * MILLI - 300 - 250 - 650 - 740 - 800
    assert _consistent(cl, placed, [(want, ch)])


def test_cpu_short_node_sheds_a_cpu_only_pod():
    # node 0 has a free GPU but a CPU-only pod holds its CPU; node 1 has CPU but no free GPU
    hog, full = Pod(0, 0, 60_000), Pod(2, MILLI, 1_000)
    cl, placed = _setup([[MILLI], [MILLI] * 2], [(hog, Choice(0, ())), (full, Choice(1, (0, 1)))])
    want = Pod(1, MILLI, 8_000)
    stats = MoveStats()
    ch = ChainRepacker(budget=10).rescue(cl, want, placed, get_policy("bestfit"), np.random.default_rng(0), stats)
    assert ch == Choice(0, (0,)) and stats.moves == 1
    assert placed.pods[0][1] == Choice(1, ())
    assert _consistent(cl, placed, [(want, ch)])


def test_multi_gpu_pod_clearable_is_counted_as_over_budget_when_no_budget():
    # a 2-GPU pod needs node 0 cleared (two small pods that fit on node 1); no budget: not done, but counted as
    # a failure that only more moves than allowed would have avoided (not a miss of the search)
    s1, s2 = Pod(1, 100), Pod(1, 150)
    cl, placed = _setup([[MILLI] * 2, [MILLI]], [(s1, Choice(0, (0,))), (s2, Choice(0, (1,)))])
    before = _snapshot(cl, placed)
    stats = MoveStats()
    d = ChainRepacker(budget=0.0)
    assert d.rescue(cl, Pod(2, MILLI), placed, get_policy("bestfit"), np.random.default_rng(0), stats) is None
    assert stats.multi_gpu_failed_over_budget == 1 and stats.multi_gpu_failed_clearable == 0 and stats.moves == 0
    assert all(np.array_equal(a, b) for a, b in zip(before[:5], _snapshot(cl, placed)[:5], strict=True))
    # with one move per rescue allowed the search still needs two: over budget again
    assert ChainRepacker(budget=10, max_moves=1).rescue(cl, Pod(2, MILLI), placed, get_policy("bestfit"),
                                                        np.random.default_rng(0), stats) is None
    assert stats.multi_gpu_failed_over_budget == 2 and stats.multi_gpu_failed_clearable == 0


@pytest.mark.parametrize("seed", range(6))
def test_bookkeeping_over_random_replays(seed):
    rng = np.random.default_rng(seed)
    sizes = [(1, 230), (1, 320), (1, 470), (1, 650), (1, 810), (1, MILLI), (2, MILLI), (0, 0)]
    pods = [Pod(k, m if k else 0, int(rng.integers(0, 9)) * 1000)
            for k, m in (sizes[i] for i in rng.integers(len(sizes), size=80))]
    cl = make_cluster([[MILLI] * 4, [MILLI] * 4, [MILLI] * 2, [MILLI] * 2], cpu=[32_000] * 4, mix=fgd_mix(pods))
    pol = get_policy("fgd")
    placed = Placed.for_cluster(cl)
    stats = MoveStats()
    d = ChainRepacker(max_moves=6, budget=0.5)
    r = np.random.default_rng(seed)
    moved = 0
    for pod in pods:
        ch = pol.choose(cl, pod, r)
        if ch is not None:
            cl.place(pod, ch)
        else:
            ch = d.rescue(cl, pod, placed, pol, r, stats)
            if ch is not None:
                moved += len(d.last_moved)
                assert all(was != now for _, was, now in d.last_moved)
                assert len(d.last_moved) <= 6
        if ch is not None:
            placed.add(pod, ch)
        assert _consistent(cl, placed)
    assert stats.moves == moved <= 0.5 * len(placed.pods) + 1
    # and through the replay itself
    res = replay(make_cluster([[MILLI] * 4] * 3, mix=fgd_mix(pods)), pods, "fgd", seed=seed,
                 defrag=ChainRepacker(budget=0.5))
    assert (np.diff(res.alloc_pct) >= -1e-9).all() and res.alloc_pct[-1] <= 100.0


def test_a_whole_pod_swaps_with_one_asking_less_cpu():
    # node 0: 2 GPUs, 16 cores; W1 (1 GPU, 12 cores) on GPU0, GPU1 free but only 4 cores left.
    # node 1: 1 GPU, 16 cores; W2 (1 GPU, 2 cores) on it, 14 cores free. P (1 GPU, 10 cores) fits nowhere.
    # Rescue: P takes node 0 GPU1 after W1 leaves; W1 (12 cores) takes node 1's GPU; W2 (2 cores) goes to node 0 GPU0.
    w1, w2 = Pod(1, MILLI, 12_000), Pod(1, MILLI, 2_000)
    cl, placed = _setup([[MILLI] * 2, [MILLI]], [(w1, Choice(0, (0,))), (w2, Choice(1, (0,)))], cpu=[16_000, 16_000])
    want = Pod(1, MILLI, 10_000)
    pol = get_policy("bestfit")
    assert pol.choose(cl, want, np.random.default_rng(0)) is None
    assert ChainRepacker(budget=10, cpu_swaps=False, cpu_relief=False, pool=0).rescue(
        cl, want, placed, pol, np.random.default_rng(0), MoveStats()) is None
    stats = MoveStats()
    ch = ChainRepacker(budget=10, cpu_relief=False, pool=0).rescue(cl, want, placed, pol, np.random.default_rng(0),
                                                                    stats)
    assert ch is not None and ch.node == 0 and stats.moves == 2
    assert placed.pods[0][1].node == 1 and placed.pods[1][1].node == 0
    assert list(cl.cpu_free) == [4_000, 4_000]
    assert _consistent(cl, placed, [(want, ch)])


def test_static_run_selects_the_repacker(tmp_path):
    nodes = [f"n{i},32000,262144,2,T4" for i in range(3)]
    pods = [pod_row(i, 4000, 1, m) for i, m in enumerate([470, 650, 320, 810, 230, 470, 650, 1000, 1000, 1000])]
    n, p = write_trace(tmp_path, nodes, pods)
    (run,) = static_runs(str(n), str(p), ["fgd"], [1], defrag=["repack"], max_moves=4)
    res = run_one(run)
    assert res.policy == "fgd+repack" and res.stats.evictions == 0
    assert res.alloc_pct.max() <= 100.0


@pytest.mark.parametrize(("gib_per_gpu", "rescued"), [(15.0, False), (20.0, True), (0.0, True)])
def test_the_move_price_refuses_a_rescue_that_moves_more_than_it_is_worth(gib_per_gpu, rescued):
    # the two-hop chain moves A (400 milli of a 32 GiB GPU: 12.8 GiB) and C (6.4 GiB) = 19.2 GiB for one GPU;
    # no cheaper rescue exists, so at 15 GiB per GPU the pod stays pending and nothing moves
    want = Pod(1, MILLI)
    pol = get_policy("bestfit")
    cl, placed = _setup([[MILLI] * 2] * 2, CHAIN)
    before = _snapshot(cl, placed)
    stats = MoveStats()
    d = ChainRepacker(max_moves=8, budget=10, gib_per_gpu=gib_per_gpu)
    ch = d.rescue(cl, want, placed, pol, np.random.default_rng(0), stats)
    if rescued:
        assert ch == Choice(0, (0,)) and stats.moves == 2
        assert stats.moved_bytes / 2**30 == pytest.approx(19.2)
        assert _consistent(cl, placed, [(want, ch)])
    else:
        assert ch is None and stats.moves == 0 and stats.moved_bytes == 0
        after = _snapshot(cl, placed)
        assert all(np.array_equal(a, b) for a, b in zip(before[:5], after[:5], strict=True))
        assert before[5] == after[5]


def test_the_runs_gib_budget_caps_what_all_rescues_write_together(tmp_path):
    # a saturated replay that rescues with free moves; the same replay under a budget of half those bytes
    # writes at most the budget, and one with no bytes left rescues nothing
    nodes = [f"n{i},32000,262144,2,T4" for i in range(5)]
    shares = [410, 320, 590, 230, 320, 320, 230, 1000, 230, 590, 470, 590, 320, 410, 650, 590, 320, 410, 410, 590]
    pods = [pod_row(i, 2000, 1, m) for i, m in enumerate(shares)]
    n, p = write_trace(tmp_path, nodes, pods)

    def moved(budget: float) -> tuple[float, int]:
        (run,) = static_runs(str(n), str(p), ["fgd"], [2], defrag=["repack"], max_moves=8, move_budget=10,
                             gib_budget=budget)
        res = run_one(run)
        return res.stats.moved_bytes / 2**30, res.stats.moves

    free_gib, free_moves = moved(0.0)
    assert free_moves >= 3, "the fixture must need several rescues for the budget to mean anything"
    half = free_gib / 2
    capped_gib, capped_moves = moved(half)
    assert 0 < capped_gib <= half + 1e-9 and 0 < capped_moves < free_moves
    assert moved(1e-9) == (0.0, 0)


def test_the_moves_up_to_the_100_percent_point_are_those_of_the_run_cut_there(tmp_path):
    # the run cut after the 100 % bucket makes exactly the moves the whole run made by then (replay is
    # deterministic); here rescues happen before the bucket, inside it and after it
    nodes = [f"n{i},32000,262144,2,T4" for i in range(12)]
    shares = [230, 650, 410, 810, 320, 650, 590, 230, 650, 810, 650, 230, 320, 320, 320, 110, 320, 810, 320, 810, 590,
              320, 1000, 1000, 320, 110, 110, 230, 1000, 320, 650, 410, 410, 110, 470, 410, 470, 1000, 410, 590, 470,
              1000, 650, 320, 110, 590, 810, 1000]
    n, p = write_trace(tmp_path, nodes, [pod_row(i, 2000, 1, m) for i, m in enumerate(shares)])
    tr = load_trace(n, p)
    wl = build_workload([x.pod for x in tr.pods], tr.cluster().capacity_milli, 1, 1.3)

    def run(k: int):
        return replay(tr.cluster(), wl[:k], "fgd", seed=1, defrag=ChainRepacker(max_moves=16, budget=10))

    whole = run(len(wl))
    part = run(int((whole.arrived_pct < 100.5).sum()))
    before = run(int((whole.arrived_pct < 99.5).sum()))
    assert 0 < before.stats.moves < part.stats.moves < whole.stats.moves
    assert whole.moves_at_100 == part.stats
    assert whole.moves_per_placed_pod(True) == part.moves_per_placed_pod()


@pytest.mark.parametrize(("moves_per_gpu", "rescued"), [(1.0, False), (2.0, True), (0.0, True)])
def test_the_moves_per_gpu_cap_refuses_a_rescue_that_moves_too_many_pods_for_what_it_places(moves_per_gpu, rescued):
    # the two-hop chain moves two pods to place one GPU: allowed at 2 moves per GPU, refused at 1
    want = Pod(1, MILLI)
    cl, placed = _setup([[MILLI] * 2] * 2, CHAIN)
    before = _snapshot(cl, placed)
    stats = MoveStats()
    d = ChainRepacker(max_moves=8, budget=10, moves_per_gpu=moves_per_gpu)
    ch = d.rescue(cl, want, placed, get_policy("bestfit"), np.random.default_rng(0), stats)
    if rescued:
        assert ch == Choice(0, (0,)) and stats.moves == 2
    else:
        assert ch is None and stats.moves == 0
        after = _snapshot(cl, placed)
        assert all(np.array_equal(a, b) for a, b in zip(before[:5], after[:5], strict=True))


@pytest.mark.parametrize(("saturated", "rescued"), [(0.7, True), (0.8, False), (0.0, True)])
def test_a_pod_is_rescued_only_once_the_pool_of_its_gpu_models_is_as_full_as_asked(saturated, rescued):
    # the chain's two nodes (model G) are 72.5 % allocated; an idle node of model H brings the cluster to 48 %:
    # a pod bound to G is judged by G's pool, not by the cluster
    g_pod = Pod(1, MILLI, gpu_models=("G",))
    cl = make_cluster([[MILLI] * 2] * 3, models=["G", "G", "H"], mix=fgd_mix([Pod(1, MILLI)]))
    placed = Placed.for_cluster(cl)
    for pod, ch in CHAIN:
        cl.place(pod, ch)
        placed.add(pod, ch)
    assert cl.allocated_share(("G",)) == pytest.approx(0.725)
    assert cl.allocated_share() == pytest.approx(2900 / 6000)
    assert cl.allocated_share(("H",)) == 0.0
    before = _snapshot(cl, placed)
    stats = MoveStats()
    d = ChainRepacker(max_moves=8, budget=10, saturated=saturated, check_clearable=False)
    ch = d.rescue(cl, g_pod, placed, get_policy("bestfit"), np.random.default_rng(0), stats)
    if rescued:
        assert ch is not None and cl.models[ch.node] == "G" and stats.moves >= 1
        assert _consistent(cl, placed, [(g_pod, ch)])
    else:
        assert ch is None and stats.moves == 0
        after = _snapshot(cl, placed)
        assert all(np.array_equal(a, b) for a, b in zip(before[:5], after[:5], strict=True))


@pytest.mark.parametrize(("saturated", "rescued"), [(0.99, False), (0.0, True)])
def test_a_multi_gpu_pod_held_back_by_the_saturation_rule_is_counted_as_over_the_limits(saturated, rescued):
    # node 2 holds 400 and 200 milli pods that fit the holes of node 0: two moves free it for a 2-GPU pod; the
    # cluster is 58 % allocated, so a 99 % rule holds the rescue back and says more than its limits was needed
    x, y = Pod(1, 400), Pod(1, 200)
    cl, placed = _setup([[MILLI] * 2] * 3, [*CHAIN, (x, Choice(2, (0,))), (y, Choice(2, (1,)))])
    stats = MoveStats()
    d = ChainRepacker(max_moves=8, budget=10, saturated=saturated)
    ch = d.rescue(cl, Pod(2, MILLI), placed, get_policy("bestfit"), np.random.default_rng(0), stats)
    assert stats.multi_gpu_failed_clearable == 0
    if rescued:
        assert ch == Choice(2, (0, 1)) and stats.moves == 2 and stats.multi_gpu_failed_over_budget == 0
    else:
        assert ch is None and stats.moves == 0 and stats.multi_gpu_failed_over_budget == 1
