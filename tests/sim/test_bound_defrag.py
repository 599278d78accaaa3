"""The lower bound is valid and exact on small cases; defrag moves make room without losing a pod."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudefrag.core.model import MILLI
from gpudefrag.core.placement import Choice, Pod, get_policy
from gpudefrag.sim.bound import arrived_prefix, best_fit_decreasing, lower_bound
from gpudefrag.sim.defrag import ArrayDefragmenter
from gpudefrag.sim.replay import MoveStats, Placed, allocation_ok, replay
from gpudefrag.sim.trace import fgd_mix

from .conftest import make_cluster


def test_bound_small_exact_cases():
    # two 600-milli pods and one GPU: only one fits
    b = lower_bound([Pod(1, 600), Pod(1, 600)], gpus=1)
    assert b.max_alloc_milli == 600 and b.optimal
    assert b.unallocated_pct == pytest.approx(40.0)
    # 600 + 400 fill a GPU exactly; a whole-GPU pod takes the other
    b = lower_bound([Pod(1, 600), Pod(1, 400), Pod(1, MILLI)], gpus=2)
    assert b.unallocated_pct == pytest.approx(0.0)
    # whole-GPU items beyond the GPUs count only up to capacity
    assert lower_bound([Pod(4, MILLI)], gpus=2).unallocated_pct == pytest.approx(0.0)


def test_arrived_prefix_stops_at_the_percentage():
    pods = [Pod(1, MILLI)] * 10
    assert len(arrived_prefix(pods, 4 * MILLI, 100)) == 4
    assert len(arrived_prefix(pods, 4 * MILLI, 50)) == 2


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.sampled_from([(1, 230), (1, 470), (1, 810), (1, 650), (1, MILLI), (2, MILLI), (4, MILLI)]),
                      min_size=1, max_size=40),
       policy=st.sampled_from(["bestfit", "fgd", "gpupacking", "random"]))
def test_no_policy_beats_the_bound(sizes, policy):
    pods = [Pod(k, m, 0) for k, m in sizes]
    cl = make_cluster([[MILLI] * 4, [MILLI] * 2, [MILLI] * 2], mix=fgd_mix(pods))
    r = replay(cl, pods, policy, seed=1)
    b = lower_bound(pods, gpus=8)
    assert 100.0 - r.alloc_pct[-1] >= b.unallocated_pct - 1e-9
    assert best_fit_decreasing(pods, 8) >= b.unallocated_pct - 1e-9


def _setup(rows, pods_at):
    """Cluster with the given free GPUs, and a Placed registry of (pod, choice) already on it."""
    cl = make_cluster(rows, mix=fgd_mix([Pod(1, MILLI)]))
    full = make_cluster([[MILLI] * len(r) for r in rows])
    cl.free = full.free.copy()
    placed = Placed.for_cluster(cl)
    for pod, ch in pods_at:
        cl.place(pod, ch)
        placed.add(pod, ch)
    return cl, placed


def test_migrate_frees_a_gpu_with_one_move():
    # node 0: GPU0 holds a 300 pod, GPU1 a 600 pod (400 free). A whole-GPU pod fits nowhere;
    # moving the 300 pod onto GPU1 (or elsewhere) frees GPU0.
    small, mid = Pod(1, 300, 0), Pod(1, 600, 0)
    cl, placed = _setup([[MILLI, MILLI]], [(small, Choice(0, (0,))), (mid, Choice(0, (1,)))])
    want = Pod(1, MILLI, 0)
    pol = get_policy("bestfit")
    rng = np.random.default_rng(0)
    assert pol.choose(cl, want, rng) is None
    stats = MoveStats()
    d = ArrayDefragmenter("migrate", max_moves=2, budget=10)
    ch = d.rescue(cl, want, placed, pol, rng, stats)
    assert ch == Choice(0, (0,))
    assert stats.moves == 1 and stats.moved_milli == 300 and stats.moved_bytes > 0 and stats.move_seconds > 10
    assert list(cl.free[0]) == [0, 100]  # pod placed; the 300 pod sits with the 600 one
    assert allocation_ok(cl) and len(placed.pods) == 2  # the rescued pod itself is registered by the replay


def test_migrate_does_nothing_when_a_victim_has_nowhere_to_go():
    a, b = Pod(1, 300, 0), Pod(1, 800, 0)
    cl, placed = _setup([[MILLI, MILLI]], [(a, Choice(0, (0,))), (b, Choice(0, (1,)))])
    before = cl.free.copy()
    d = ArrayDefragmenter("migrate", max_moves=4, budget=10)
    assert d.rescue(cl, Pod(1, MILLI, 0), placed, get_policy("fgd"), np.random.default_rng(0), MoveStats()) is None
    assert (cl.free == before).all() and len(placed.pods) == 2


def test_evict_loses_the_victims_that_find_no_room():
    a, b = Pod(1, 300, 0), Pod(1, 800, 0)
    cl, placed = _setup([[MILLI, MILLI]], [(a, Choice(0, (0,))), (b, Choice(0, (1,)))])
    stats = MoveStats()
    d = ArrayDefragmenter("evict", max_moves=4, budget=10)
    ch = d.rescue(cl, Pod(1, MILLI, 0), placed, get_policy("fgd"), np.random.default_rng(0), stats)
    assert ch is not None and stats.evictions == 1 and stats.evicted_lost == 1 and stats.evicted_lost_milli == 300
    assert len(placed.pods) == 1 and allocation_ok(cl)


def test_the_move_budget_is_respected():
    small, mid = Pod(1, 300, 0), Pod(1, 600, 0)
    cl, placed = _setup([[MILLI, MILLI]], [(small, Choice(0, (0,))), (mid, Choice(0, (1,)))])
    d = ArrayDefragmenter("migrate", max_moves=2, budget=0.1)  # 0.1 × 2 placed pods < 1 move
    assert d.rescue(cl, Pod(1, MILLI, 0), placed, get_policy("fgd"), np.random.default_rng(0), MoveStats()) is None
