"""The offline packing is a real placement between the online start and the true optimum."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudefrag.core.model import MILLI
from gpudefrag.core.placement import Pod
from gpudefrag.sim.bound_resource import node_types, resource_bound
from gpudefrag.sim.offline_pack import offline_packing
from gpudefrag.sim.replay import allocation_ok
from gpudefrag.sim.trace import fgd_mix

from .test_bound_resource import _NODE, _POD, _cluster, exact_max_alloc


def _fgd_cluster(nodes, pods):
    """The test's cluster with the workload mix FGD scores against, as a trace's cluster has."""
    cl = _cluster(nodes)
    cl.mix = fgd_mix(pods)
    return cl


def _real(cluster, pods, pk) -> None:
    """Independently of the module's own check: the placement fits a fresh cluster and uses arrived pods."""
    cl = cluster.copy()
    used = Counter(p for p, _ in pk.placement)
    assert all(used[p] <= k for p, k in Counter(pods).items()) and set(used) <= set(pods)
    for p, ch in pk.placement:
        assert len(set(ch.gpus)) == p.num_gpu and (not p.gpu_models or cl.models[ch.node] in p.gpu_models)
        cl.place(p, ch)
    assert allocation_ok(cl) and cl.allocated_milli == pk.alloc_milli


def test_the_search_places_what_the_arrival_order_left_out():
    # one node, two GPUs; 800, 200, 600, then a whole GPU. FGD in arrival order spreads the first three over
    # both GPUs and the whole-GPU pod fails; 800 + 200 on one GPU and the whole pod on the other fills both
    nodes = [("A", 2, 64_000, 100_000)]
    pods = [Pod(1, 800, 1_000, 1_000), Pod(1, 200, 1_000, 1_000), Pod(1, 600, 1_000, 1_000),
            Pod(1, MILLI, 1_000, 1_000)]
    cl = _fgd_cluster(nodes, pods)
    pk = offline_packing(cl, pods, seed=1, rounds=5, start="fgd")
    _real(cl, pods, pk)
    assert pk.start_alloc_milli == 1_600  # the online start left the whole-GPU pod out ...
    assert pk.alloc_milli == 2 * MILLI == exact_max_alloc(pods, nodes)  # ... the search placed it
    assert pk.unallocated_pct == 0.0 and pk.improved >= 1
    busy = cl.copy()
    busy.place(pods[0], pk.placement[0][1])
    with pytest.raises(ValueError, match="empty cluster"):  # its free arrays would be taken for capacities
        offline_packing(busy, pods)


def test_cpu_only_pods_stay_placed_and_cpu_binds():
    # a CPU-only pod holds 6 of the node's 8 cores: of two whole-GPU pods of 2 cores only one fits beside it
    nodes = [("A", 2, 8_000, 100_000)]
    pods = [Pod(0, 0, 6_000, 1_000), Pod(1, MILLI, 2_000, 1_000), Pod(1, MILLI, 2_000, 1_000)]
    cl = _fgd_cluster(nodes, pods)
    pk = offline_packing(cl, pods, seed=3, rounds=3, start="fgd")
    _real(cl, pods, pk)
    assert Pod(0, 0, 6_000, 1_000) in [p for p, _ in pk.placement]
    assert pk.alloc_milli == MILLI


@settings(max_examples=25, deadline=None)
@given(nodes=st.lists(_NODE, min_size=1, max_size=3), raw=st.lists(_POD, min_size=1, max_size=8),
       start=st.sampled_from(["fgd", "repack"]), seed=st.integers(0, 9))
def test_the_packing_lies_between_its_start_and_the_optimum(nodes, raw, start, seed):
    pods = [Pod(k, milli, c, mm, models) for (k, milli), c, mm, models in raw]
    cl = _fgd_cluster(nodes, pods)
    pk = offline_packing(cl, pods, seed=seed, rounds=4, start=start)
    _real(cl, pods, pk)
    best = exact_max_alloc(pods, nodes)
    assert pk.start_alloc_milli <= pk.alloc_milli <= best
    assert resource_bound(pods, node_types(cl)).unallocated_pct <= pk.unallocated_pct + 1e-9
    again = offline_packing(cl, pods, seed=seed, rounds=4, start=start)
    assert again.placement == pk.placement  # deterministic: same arguments, same packing
