"""The FGD authors' descheduler in the replay: which pods it picks, its budget, and what re-placing them does."""

from __future__ import annotations

import numpy as np
import pytest

from gpudefrag.core.fragmentation import TaskShape, WorkloadMix
from gpudefrag.core.model import MILLI
from gpudefrag.core.placement import Choice, Cluster, Pod, get_policy
from gpudefrag.sim.deschedule import Descheduler, frag_without, node_frag
from gpudefrag.sim.replay import MoveStats, Placed, allocation_ok, replay

from .conftest import make_cluster

WHOLE = WorkloadMix.single(TaskShape(1, MILLI))
HALF = Pod(1, 500, 1000)


def _load(cl: Cluster, pods: list[tuple[Pod, Choice]]) -> Placed:
    placed = Placed.for_cluster(cl)
    for p, ch in pods:
        cl.place(p, ch)
        placed.add(p, ch)
    return placed


def _two_nodes() -> tuple[Cluster, Placed]:
    """node 0: two GPUs each half used (F = 1000 for a whole-GPU mix); node 1: a 700 pod beside a free GPU
    (F = 300). Removing a half pod from node 0 lowers its F by 500; removing the 700 pod from node 1 by 300."""
    cl = make_cluster([[MILLI, MILLI], [MILLI, MILLI]], mix=WHOLE)
    placed = _load(cl, [(HALF, Choice(0, (0,))), (HALF, Choice(0, (1,))), (Pod(1, 700, 1000), Choice(1, (0,)))])
    assert list(node_frag(cl)) == [1000.0, 300.0]
    return cl, placed


def test_frag_without_is_the_core_measure_of_the_node_without_the_pod():
    cl, placed = _two_nodes()
    after = frag_without(cl, 0, [placed.pods[0], placed.pods[1]])
    assert list(after) == [500.0, 500.0]
    cl.remove(*placed.pods[2])
    expect = float(node_frag(cl)[1])
    cl.place(*placed.pods[2])
    assert frag_without(cl, 1, [placed.pods[2]])[0] == expect == 0.0


def test_frag_one_pod_walks_the_most_fragmented_nodes_one_pod_each():
    cl, placed = _two_nodes()
    before = cl.free.copy()
    d = Descheduler(policy="fragOnePod")
    assert d.victims(cl, placed, 1) == [0]  # node 0 first (F 1000), its first pod among equals
    assert d.victims(cl, placed, 5) == [0, 2]  # then node 1; never a second pod of node 0
    assert (cl.free == before).all()  # choosing leaves the cluster as it was


def test_frag_multi_pod_returns_a_node_to_the_queue_with_its_new_fragmentation():
    cl, placed = _two_nodes()
    d = Descheduler(policy="fragMultiPod")
    # node 0 (1000) gives pod 0 → 500, still above node 1 (300): it gives pod 1 too (→ 0), then node 1
    assert d.victims(cl, placed, 2) == [0, 1]
    assert d.victims(cl, placed, 5) == [0, 1, 2]
    assert list(node_frag(cl)) == [1000.0, 300.0]


def test_no_victim_where_no_removal_lowers_fragmentation():
    cl = make_cluster([[MILLI, MILLI]], mix=WHOLE)
    placed = _load(cl, [(Pod(1, MILLI, 1000), Choice(0, (0,)))])  # F = 0: nothing to gain
    for policy in ("fragOnePod", "fragMultiPod"):
        assert Descheduler(policy=policy).victims(cl, placed, 3) == []


def test_cos_sim_picks_the_least_aligned_pod_on_cpu_starved_nodes():
    cl = make_cluster([[MILLI, MILLI], [MILLI]], cpu=[10_000, 64_000], mix=WHOLE)
    pods = [(Pod(1, 400, 8000), Choice(0, (0,))), (Pod(0, 0, 1000), Choice(0, ())), (Pod(1, 400, 0), Choice(0, (1,))),
            (Pod(1, 400, 0), Choice(1, (0,)))]
    placed = _load(cl, pods)
    assert cl.cpu_free[0] == 1000 and cl.cpu_free[1] == 64_000
    # node 0: < 2 cores free and a GPU with 600 free; removing pod 2 frees (1000 CPU, 1000 GPU) against its
    # (0, 400): cosine 0.71, the least; node 1 has CPU to spare and is not looked at
    assert Descheduler(policy="cosSim").victims(cl, placed, 5) == [2]


def test_a_pass_consolidates_and_the_failing_pod_then_fits():
    """Two half pods on two GPUs: the pass evicts one and FGD re-places it beside the other, freeing a GPU."""
    cl = make_cluster([[MILLI, MILLI], [MILLI]], mix=WHOLE)
    placed = _load(cl, [(HALF, Choice(0, (0,))), (HALF, Choice(0, (1,))), (Pod(1, 700, 1000), Choice(1, (0,)))])
    whole = Pod(1, MILLI, 1000)
    fgd = get_policy("fgd")
    rng = np.random.default_rng(0)
    assert fgd.choose(cl, whole, rng) is None
    stats = MoveStats()
    d = Descheduler(ratio=0.2, policy="fragOnePod")  # ⌈0.2 × 3⌉ = 1 pod
    choice = d.rescue(cl, whole, placed, fgd, rng, stats)
    assert choice == Choice(0, (0,))
    assert d.evicted == 1 and stats.moves == 1 and stats.evicted_lost == 0 and stats.moved_bytes > 0
    assert placed.pods[0][1] == Choice(0, (1,))  # the evicted pod now shares GPU 1
    assert cl.free[0].tolist() == [0, 0] and allocation_ok(cl)
    # one pass only: a second failure finds it spent
    assert d.rescue(cl, whole, placed, fgd, rng, stats) is None and d.passes == 1


def test_the_budget_is_a_ratio_of_the_pods_on_the_cluster():
    cl, placed = _two_nodes()
    stats = MoveStats()
    d = Descheduler(ratio=0.0, policy="fragMultiPod")
    d.rescue(cl, Pod(2, MILLI), placed, get_policy("fgd"), np.random.default_rng(0), stats)
    assert d.evicted == 0 and stats.moves == 0
    d = Descheduler(ratio=0.5, policy="fragMultiPod")  # ⌈1.5⌉ = 2 of 3 pods
    d.rescue(cl, Pod(2, MILLI), placed, get_policy("fgd"), np.random.default_rng(0), stats)
    assert d.evicted == 2 and stats.moves + stats.evicted_lost == 2


def test_repeat_runs_a_pass_at_later_failures_until_the_budget_is_spent():
    cl, placed = _two_nodes()
    d = Descheduler(ratio=1.0, policy="fragOnePod", repeat=True)  # ⌈1.0 × 3⌉ = 3 pods in all
    rng, stats, fgd, big = np.random.default_rng(0), MoveStats(), get_policy("fgd"), Pod(2, MILLI)
    assert d.rescue(cl, big, placed, fgd, rng, stats) is None
    assert (d.passes, d.evicted, d.budget) == (1, 2, 1)  # one pod of each node
    assert d.rescue(cl, big, placed, fgd, rng, stats) is None
    assert (d.passes, d.evicted, d.budget) == (2, 3, 0)
    assert d.rescue(cl, big, placed, fgd, rng, stats) is None and d.passes == 2  # spent: no third pass
    assert stats.moves == 3 and allocation_ok(cl)
    once = Descheduler(ratio=1.0, policy="fragOnePod")
    cl, placed = _two_nodes()
    once.rescue(cl, big, placed, fgd, rng, MoveStats())
    once.rescue(cl, big, placed, fgd, rng, MoveStats())
    assert once.passes == 1  # the authors' single pass


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_in_a_replay_the_descheduler_places_what_fgd_alone_fails_and_keeps_the_books(seed):
    """Shares that add up to exactly four GPUs: FGD alone strands one pod; one pass of two evictions,
    re-placed by FGD, fits all of them."""
    wl = [Pod(1, m) for m in (300, 500, 500, 300, 700, 700, 700, 300)]
    cl = make_cluster([[MILLI] * 2] * 2, mix=WorkloadMix.from_shapes(p.shape() for p in wl))
    plain = replay(cl, wl, "fgd", seed=seed, tune=0)
    d = Descheduler(ratio=0.5, policy="fragOnePod")
    moved = replay(cl, wl, "fgd", seed=seed, tune=0, defrag=d)
    assert plain.failed == 1 and plain.alloc_pct[-1] < 100
    assert moved.failed == 0 and moved.alloc_pct[-1] == pytest.approx(100.0)
    assert moved.stats.moves == d.evicted == 2 and moved.stats.evicted_lost == 0 and moved.stats.rescued == 1


@pytest.mark.parametrize("bad", [{"policy": "binPacking"}, {"ratio": 1.5}, {"ratio": -0.1}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        Descheduler(**bad)
