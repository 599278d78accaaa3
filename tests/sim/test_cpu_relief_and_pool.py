"""CPU relief and pool repacking: rescues that neither single moves nor ejection chains find."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudefrag.core.model import MILLI
from gpudefrag.core.placement import Choice, Pod, get_policy
from gpudefrag.sim.pool_repack import bins_needed, shares_fit
from gpudefrag.sim.repack import ChainRepacker
from gpudefrag.sim.replay import MoveStats, replay
from gpudefrag.sim.trace import fgd_mix

from .conftest import make_cluster
from .test_repack import _consistent, _setup, _snapshot

POL = get_policy("bestfit")


def _rescue(d: ChainRepacker, cl, want, placed):
    stats = MoveStats()
    ch = d.rescue(cl, want, placed, POL, np.random.default_rng(0), stats)
    return ch, stats


def test_a_cpu_only_pod_leaves_a_node_whose_gpu_is_free_but_whose_cpu_is_not():
    # node 0: 2 GPUs, 16 cores; a CPU-only pod holds 14 of them; node 1: 1 GPU busy, 32 cores free
    cpu_only, busy = Pod(0, 0, 14_000), Pod(1, MILLI, 0)
    cl, placed = _setup([[MILLI] * 2, [MILLI]], [(cpu_only, Choice(0, ())), (busy, Choice(1, (0,)))],
                        cpu=[16_000, 32_000])
    want = Pod(1, MILLI, 8_000)
    assert POL.choose(cl, want, np.random.default_rng(0)) is None
    ch, stats = _rescue(ChainRepacker(budget=10, pool=0, depth=0), cl, want, placed)
    assert ch is not None and ch.node == 0 and stats.moves == 1
    assert placed.pods[0][1] == Choice(1, ())  # the CPU-only pod now runs on node 1
    assert list(cl.cpu_free) == [8_000, 18_000]
    assert _consistent(cl, placed, [(want, ch)])


def test_a_heavy_pod_trades_places_with_a_light_twin_so_its_node_gets_the_cpu():
    # node 0: 2 GPUs, 16 cores; H (1 GPU, 14 cores) on GPU0, GPU1 free, 2 cores left.
    # node 1: 1 GPU, 32 cores; L (1 GPU, 2 cores), 30 cores free. No free GPU has the CPU for P (10 cores);
    # swapping H and L moves 12 cores to node 0 and keeps every GPU as full as it was.
    h, light = Pod(1, MILLI, 14_000), Pod(1, MILLI, 2_000)
    cl, placed = _setup([[MILLI] * 2, [MILLI]], [(h, Choice(0, (0,))), (light, Choice(1, (0,)))],
                        cpu=[16_000, 32_000])
    want = Pod(1, MILLI, 10_000)
    ch, stats = _rescue(ChainRepacker(budget=10, pool=0, cpu_swaps=False, depth=0), cl, want, placed)
    assert ch == Choice(0, (1,)) and stats.moves == 2
    assert placed.pods[0][1] == Choice(1, (0,)) and placed.pods[1][1] == Choice(0, (0,))
    assert list(cl.cpu_free) == [4_000, 18_000]
    assert _consistent(cl, placed, [(want, ch)])


def test_relief_does_not_move_more_than_allowed():
    cpu_only = [Pod(0, 0, 4_000) for _ in range(4)]
    cl, placed = _setup([[MILLI] * 2, [MILLI]], [(p, Choice(0, ())) for p in cpu_only], cpu=[16_000, 64_000])
    want = Pod(1, MILLI, 16_000)  # needs all four CPU-only pods gone
    ch, _ = _rescue(ChainRepacker(max_moves=3, budget=10, pool=0, depth=0), cl, want, placed)
    assert ch is None and all(ch.node == 0 for _, ch in placed.pods.values())
    ch, stats = _rescue(ChainRepacker(max_moves=4, budget=10, pool=0, depth=0), cl, want, placed)
    assert ch is not None and stats.moves == 4 and _consistent(cl, placed, [(want, ch)])


# one node, 3 GPUs: G0 = 500 + 300, G1 = 500 + 300, G2 = 400. A whole GPU is free only after a repack
# (500 + 500 | 300 + 300 + 400 | -): every hole is 200 or 600 milli and ejecting smaller pods into holes (the
# chains) leads nowhere; the pool repack moves three pods.
POOL = [(Pod(1, 500), Choice(0, (0,))), (Pod(1, 300), Choice(0, (0,))), (Pod(1, 500), Choice(0, (1,))),
        (Pod(1, 300), Choice(0, (1,))), (Pod(1, 400), Choice(0, (2,)))]


def test_a_pool_repack_frees_a_gpu_where_chains_cannot():
    want = Pod(1, MILLI)
    cl, placed = _setup([[MILLI] * 3], POOL)
    assert _rescue(ChainRepacker(budget=10, pool=0), cl, want, placed)[0] is None
    d = ChainRepacker(budget=10, pool=8)
    ch, stats = _rescue(d, cl, want, placed)
    assert ch is not None and stats.moves == 3
    assert sorted(int(x) for x in cl.free[0]) == [0, 0, 0]
    assert _consistent(cl, placed, [(want, ch)])
    # every GPU within 1000 milli, nothing lost: the five pods and the new one
    assert len(placed.pods) == 5 and sum(p.gpu_milli for p, _ in placed.pods.values()) == 2000


def test_a_pool_repack_respects_the_move_limit_and_cpu():
    want = Pod(1, MILLI)
    cl, placed = _setup([[MILLI] * 3], POOL)
    before = _snapshot(cl, placed)
    assert _rescue(ChainRepacker(max_moves=2, budget=10, pool=8), cl, want, placed)[0] is None
    assert all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
               for a, b in zip(before, _snapshot(cl, placed), strict=True))
    # the same pods split over two nodes whose CPU is full: the repack would need CPU that nothing can free
    rows = [[MILLI] * 2, [MILLI]]
    pods = [(Pod(1, 500, 8_000), Choice(0, (0,))), (Pod(1, 300, 8_000), Choice(0, (0,))),
            (Pod(1, 500, 8_000), Choice(0, (1,))), (Pod(1, 300, 8_000), Choice(0, (1,))),
            (Pod(1, 400, 8_000), Choice(1, (0,)))]
    cl, placed = _setup(rows, pods, cpu=[32_000, 8_000])
    assert _rescue(ChainRepacker(budget=10, pool=8), cl, Pod(1, MILLI), placed)[0] is None
    assert _consistent(cl, placed)


def test_a_pool_that_failed_is_not_solved_again_for_a_pod_at_least_as_large(monkeypatch):
    import gpudefrag.sim.pool_repack as pr

    calls = []
    real = pr._solve
    monkeypatch.setattr(pr, "_solve", lambda *a, **k: calls.append(1) or real(*a, **k))
    # as the pool test, but with only two moves allowed: the pool cannot be repacked
    cl, placed = _setup([[MILLI] * 3], POOL)
    d = ChainRepacker(max_moves=2, budget=10, pool=8)
    assert _rescue(d, cl, Pod(1, MILLI, 1_000), placed)[0] is None
    first = len(calls)
    assert first >= 1
    d._state = (-1, -1, -1)  # forget the chain memo, keep the pool memo
    assert _rescue(d, cl, Pod(1, MILLI, 2_000), placed)[0] is None
    assert len(calls) == first
    assert _rescue(ChainRepacker(max_moves=2, budget=10, pool=8), cl, Pod(1, MILLI, 2_000), placed)[0] is None
    assert len(calls) > first  # a fresh repacker solves again


def _fewest_bins(sizes: list[int], cap: int = MILLI) -> int:
    """Exact bin packing by search (tiny inputs only)."""
    def fits(items: list[int], bins: list[int]) -> bool:
        if not items:
            return True
        w, rest = items[0], items[1:]
        seen = set()
        for i, load in enumerate(bins):
            if load + w <= cap and load not in seen:
                seen.add(load)
                bins[i] += w
                if fits(rest, bins):
                    return True
                bins[i] -= w
        return False

    items = sorted(sizes, reverse=True)
    return next(b for b in range(len(items) + 1) if fits(items, [0] * b))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 10).map(lambda k: 100 * k), min_size=1, max_size=7))
def test_the_pool_bin_bound_never_exceeds_the_fewest_gpus(sizes):
    assert bins_needed(sizes) <= _fewest_bins(sizes)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([230, 320, 370, 460, 470, 550, 590, 650, 810, MILLI]), min_size=1, max_size=8))
def test_the_pool_pre_check_never_refuses_shares_that_fit(sizes):
    # the pre-check that spares CP-SAT is sound: whenever the shares pack into b GPUs it says they may
    fewest = _fewest_bins(sizes)
    assert shares_fit(tuple(sorted(sizes)), fewest)


def test_the_pool_pre_check_sees_what_counting_does_not():
    # L2 says 3 GPUs, but 4 are needed (beside each 650 fits one 320 or 230, leaving ≥ 1010 milli for the
    # third GPU): the arc-flow LP proves it, so CP-SAT is not asked
    sizes = [230, 320, 320, 320, 460, 650, 650]
    assert bins_needed(sizes) == 3 == _fewest_bins(sizes) - 1
    assert not shares_fit(tuple(sorted(sizes)), 3) and shares_fit(tuple(sorted(sizes)), 4)


def test_the_pool_bin_bound_sees_what_total_share_does_not():
    # 4 × 510 milli: the total (2040) says 3 GPUs, but no two share one: 4
    assert bins_needed([600, 600, 600, 400, 400, 400]) == 3
    assert bins_needed([600, 600, 600, 500]) == 4
    assert bins_needed([510] * 4) == 4


def test_pool_repacks_give_the_same_moves_every_time_and_read_no_clock(monkeypatch):
    # a small saturated replay whose rescues need pool repacks: run twice, the same moves in the same order; and
    # no solve has a wall-clock limit (which a loaded machine would hit first, changing the result)
    import gpudefrag.sim.pool_repack as pr

    params, found = [], []
    real_solve = pr.cp_model.CpSolver.solve

    def solve(self, model, *a):
        params.append(self.parameters)
        st = real_solve(self, model, *a)
        found.append(st in (pr.cp_model.OPTIMAL, pr.cp_model.FEASIBLE))
        return st

    monkeypatch.setattr(pr.cp_model.CpSolver, "solve", solve)
    rng = np.random.default_rng(3)
    sizes = [230, 320, 470, 650, 590, MILLI]
    pods = [Pod(1, int(sizes[i]), int(rng.integers(1, 6)) * 1000) for i in rng.integers(len(sizes), size=120)]

    def run():
        d = ChainRepacker(budget=0.5, cpu_relief=False, depth=0)
        moves = []
        orig = d._commit

        def commit(*a):
            orig(*a)
            moves.extend(d.last_moved)

        d._commit = commit
        res = replay(make_cluster([[MILLI] * 4] * 6, cpu=[24_000] * 6, mix=fgd_mix(pods)), pods, "fgd", seed=3,
                     defrag=d)
        return moves, res.placed.tolist(), res.alloc_pct.tolist()

    first = run()
    assert any(found) and first[0]  # the pool stage rescued pods
    assert run() == first
    assert all(p.max_time_in_seconds == pr.cp_model.CpSolver().parameters.max_time_in_seconds
               and p.max_deterministic_time > 0 and p.num_workers == 1 for p in params)


def test_a_priced_pool_repack_moves_the_cheapest_checkpoints_or_nothing():
    # the pool above, with G1's 500-milli pod holding 100 GiB of host memory: every 3-move repack either moves it
    # (≥ 116 GiB; the fewest-moves repack does) or moves the other 500 and both 300s (16 + 9.6 + 9.6 = 35.2 GiB
    # on the default 32 GiB GPU)
    pods = list(POOL)
    pods[2] = (Pod(1, 500, 0, 100 * 1024), POOL[2][1])
    cl, placed = _setup([[MILLI] * 3], pods)
    ch, stats = _rescue(ChainRepacker(budget=10, pool=8, gib_per_gpu=40), cl, Pod(1, MILLI), placed)
    assert ch is not None and stats.moves == 3 and placed.pods[2][1] == POOL[2][1]  # the heavy pod stayed
    assert stats.moved_bytes / 2**30 == pytest.approx(35.2)
    assert _consistent(cl, placed, [(Pod(1, MILLI), ch)])
    cl, placed = _setup([[MILLI] * 3], pods)
    before = _snapshot(cl, placed)
    assert _rescue(ChainRepacker(budget=10, pool=8, gib_per_gpu=30), cl, Pod(1, MILLI), placed)[0] is None
    assert all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
               for a, b in zip(before, _snapshot(cl, placed), strict=True))
