"""The static replay's bookkeeping: capacity never exceeded, arrived workload as defined, tuning, curves."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudefrag.core.model import MILLI
from gpudefrag.core.placement import Choice, Pod
from gpudefrag.sim.replay import (
    Placed,
    allocation_ok,
    bucket_means,
    build_workload,
    gpu_shape,
    percentile_curve,
    replay,
)
from gpudefrag.sim.report import max_abs_diff

from .conftest import make_cluster

PODS = [Pod(1, 500, 1000), Pod(1, MILLI, 2000), Pod(2, MILLI, 4000), Pod(0, 0, 8000), Pod(1, 250, 500),
        Pod(4, MILLI, 1000)]


def test_tuning_reaches_the_target_and_stops_there():
    cap = 16 * MILLI
    wl = build_workload(PODS, cap, seed=5, tune=1.3)
    total = sum(p.gpu_total for p in wl)
    assert total >= 1.3 * cap
    # the last pod with a GPU request is the one that crossed the target
    last_gpu = max(i for i, p in enumerate(wl) if p.gpu_total)
    assert total - wl[last_gpu].gpu_total < 1.3 * cap
    assert set(wl) <= set(PODS)
    assert build_workload(PODS, cap, 5, 1.3) == wl  # seeded
    assert build_workload(PODS, cap, 6, 1.3) != wl


def test_tuning_drops_pods_when_above_the_target():
    wl = build_workload(PODS * 10, 4 * MILLI, seed=1, tune=1.0)
    assert sum(p.gpu_total for p in wl) <= 4 * MILLI


@pytest.mark.parametrize("policy", ["random", "dotproduct", "gpuclustering", "gpupacking", "bestfit", "fgd",
                                    "firstfit", "spread"])
def test_replay_bookkeeping(policy):
    cl = make_cluster([[MILLI] * 8, [MILLI] * 8, [MILLI] * 4, [MILLI] * 2], cpu=[40_000, 40_000, 20_000, 8000])
    cl.mix = None
    from gpudefrag.sim.trace import fgd_mix

    cl.mix = fgd_mix(PODS)
    wl = build_workload(PODS, cl.capacity_milli, seed=3, tune=1.3)
    r = replay(cl, wl, policy, seed=3)
    # arrived workload = Σ GPU request of the pods submitted so far / capacity, after each pod
    expected = 100.0 * np.cumsum([p.gpu_total for p in wl]) / cl.capacity_milli
    assert np.allclose(r.arrived_pct, expected)
    # allocation never exceeds capacity, never exceeds what arrived, and only grows (nothing leaves)
    assert (r.alloc_pct <= 100.0 + 1e-9).all()
    assert (r.alloc_pct <= r.arrived_pct + 1e-9).all()
    assert (np.diff(r.alloc_pct) >= -1e-9).all()
    placed = sum(p.gpu_total for p, ok in zip(wl, r.placed, strict=True) if ok)
    assert r.alloc_pct[-1] == pytest.approx(100.0 * placed / cl.capacity_milli)
    assert r.failed == int((~r.placed).sum()) > 0  # 130 % cannot all fit
    # the input cluster is untouched (the replay works on a copy)
    assert (cl.free[cl.free >= 0] == MILLI).all() and allocation_ok(cl)


def test_replay_is_deterministic_per_seed():
    from gpudefrag.sim.trace import fgd_mix

    cl = make_cluster([[MILLI] * 8] * 3, mix=fgd_mix(PODS))
    wl = build_workload(PODS, cl.capacity_milli, seed=9, tune=1.2)
    a, b = replay(cl, wl, "fgd", seed=9), replay(cl, wl, "fgd", seed=9)
    assert np.array_equal(a.placed, b.placed) and np.array_equal(a.alloc_pct, b.alloc_pct)


def test_bucket_means_round_to_the_nearest_percent():
    arrived = np.array([0.2, 0.4, 0.6, 1.4, 2.6])
    alloc = np.array([0.2, 0.4, 0.5, 1.0, 2.0])
    m = bucket_means(arrived, alloc, top=3)
    assert m[0] == pytest.approx(0.3)
    assert m[1] == pytest.approx(0.75)
    assert np.isnan(m[2])
    assert m[3] == pytest.approx(2.0)


def test_curves_of_a_short_pod_list_keep_nan_where_no_run_arrived_and_say_nothing():
    """A pod list that never reaches 130 % leaves NaN at the points no run reached: the median and quartiles
    there are NaN (not a number made up, not numpy's all-NaN warning on the user's terminal), elsewhere the
    ordinary ones; the check against the authors' curve only looks where both have a value."""
    runs = np.array([[1.0, 2.0, np.nan, np.nan], [3.0, np.nan, np.nan, np.nan], [5.0, 4.0, 7.0, np.nan]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        med = percentile_curve(runs)
        q1 = percentile_curve(list(runs), 25)
        d = max_abs_diff(med, np.array([0.0, 0.0, 0.0, 9.0]), lo=0, hi=3)
        none = max_abs_diff(np.full(4, np.nan), np.zeros(4), lo=0, hi=3)
    np.testing.assert_array_equal(med, [3.0, 3.0, 7.0, np.nan])
    np.testing.assert_array_equal(q1, [2.0, 2.5, 7.0, np.nan])
    assert d == 7.0 and np.isnan(none)


@st.composite
def _placements(draw) -> list[tuple[str, int, Pod, Choice]]:
    """A random history of adds, moves and drops on 3 nodes × 4 GPUs (the index does not check capacity)."""
    ops: list[tuple[str, int, Pod, Choice]] = []
    live: list[int] = []
    nid = 0
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["add", "move", "drop"] if live else ["add"]))
        k = draw(st.integers(0, 2))
        pod = Pod(k, draw(st.sampled_from([100, 250, 500, MILLI])) if k == 1 else MILLI * (k > 0),
                  draw(st.integers(0, 8000)), draw(st.integers(0, 4096)), draw(st.sampled_from([(), ("A",)])))
        ch = Choice(draw(st.integers(0, 2)), tuple(draw(st.permutations(range(4)))[:k]))
        if kind == "add":
            ops.append(("add", nid, pod, ch))
            live.append(nid)
            nid += 1
        else:
            pid = draw(st.sampled_from(live))
            ops.append((kind, pid, pod, ch))
            if kind == "drop":
                live.remove(pid)
    return ops


@given(_placements())
@settings(max_examples=150, deadline=None)
def test_the_arrays_placed_keeps_agree_with_its_pods(ops):
    # the repacker's scans read gpu_rows and content instead of walking the pods: they must say the same
    placed = Placed(np.zeros((3, 4), dtype=np.int32))
    for kind, pid, pod, ch in ops:
        if kind == "add":
            assert placed.add(pod, ch) == pid
        elif kind == "move":
            old = placed.pods[pid][0]
            placed.move(pid, Choice(ch.node, ch.gpus[: old.num_gpu] if len(ch.gpus) >= old.num_gpu
                                    else tuple(range(old.num_gpu))))
        else:
            placed.drop(pid)
        rows, shapes = placed.gpu_rows()
        for q in range(placed.next_id):
            here = placed.pods.get(q)
            if here is None or here[0].num_gpu == 0:
                assert rows[q, 4] == 0
            else:
                p, c = here
                assert (shapes[rows[q, 0]], *rows[q, 1:]) == (gpu_shape(p), c.node, p.cpu_milli, p.memory_mib, 1)
        for n in range(3):
            for g in range(4):
                want = sorted(placed.pods[q][0].gpu_milli for q in placed.on(n, g))
                assert placed.content(n, g) == tuple(want)
