"""The resource bound (per-node CPU, memory, GPU models) never claims more allocation than the true optimum
allows, and is tighter than the arc-flow bound where CPU or models bind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model

from gpudefrag.core.model import MILLI
from gpudefrag.core.placement import Cluster, Pod
from gpudefrag.sim.bound import lower_bound
from gpudefrag.sim.bound_resource import node_types, resource_bound

from .conftest import pod_row, write_trace


def _cluster(nodes: list[tuple[str, int, int, int]]) -> Cluster:
    """nodes: (model, GPUs, CPU milli, memory MiB)."""
    return Cluster.build([f"n{i}" for i in range(len(nodes))], [g for _, g, _, _ in nodes],
                         [m for m, _, _, _ in nodes], [c for _, _, c, _ in nodes], [mem for *_, mem in nodes])


def exact_max_alloc(pods: list[Pod], nodes: list[tuple[str, int, int, int]]) -> int:
    """The true optimum by CP-SAT: place a subset of the pods (each on one node, each GPU ≤ 1000 milli, a
    multi-GPU pod on distinct GPUs, CPU and memory per node, allowed models) to maximise allocated milli-GPU."""
    m = cp_model.CpModel()
    load: dict[tuple[int, int], list] = {}
    cpu: dict[int, list] = {}
    mem: dict[int, list] = {}
    obj = []
    for p in pods:
        on = []
        for n_i, (model, g, _, _) in enumerate(nodes):
            if p.num_gpu > g or (p.gpu_models and model not in p.gpu_models):
                continue
            a = m.new_bool_var("")
            on.append(a)
            gs = [m.new_bool_var("") for _ in range(g)]
            m.add(sum(gs) == p.num_gpu * a)
            for g_i, v in enumerate(gs):
                load.setdefault((n_i, g_i), []).append(p.gpu_milli * v)
            cpu.setdefault(n_i, []).append(p.cpu_milli * a)
            mem.setdefault(n_i, []).append(p.memory_mib * a)
            obj.append(p.gpu_total * a)
        if on:
            m.add(sum(on) <= 1)
    for terms in load.values():
        m.add(sum(terms) <= MILLI)
    for n_i, (_, _, c, mm) in enumerate(nodes):
        if n_i in cpu:
            m.add(sum(cpu[n_i]) <= c)
            m.add(sum(mem[n_i]) <= mm)
    m.maximize(sum(obj))
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    assert s.solve(m) == cp_model.OPTIMAL
    return round(s.objective_value)


def _pct(alloc: float, gpus: int) -> float:
    return 100.0 * (1.0 - alloc / (gpus * MILLI))


def test_cpu_binds_where_the_arc_flow_bound_cannot_see_it():
    # one node, 2 GPUs, 8 cores; two whole-GPU pods of 6 cores each: only one fits
    nodes = [("A", 2, 8_000, 100_000)]
    pods = [Pod(1, MILLI, 6_000, 1_000)] * 2
    rb = resource_bound(pods, node_types(_cluster(nodes)))
    assert lower_bound(pods, 2).unallocated_pct == pytest.approx(0.0)
    assert rb.unallocated_pct == pytest.approx(50.0)
    assert rb.unallocated_pct <= _pct(exact_max_alloc(pods, nodes), 2) + 1e-9


def test_gpu_models_bind():
    # two 1-GPU nodes of models A and B; three pods that only run on A
    nodes = [("A", 1, 64_000, 100_000), ("B", 1, 64_000, 100_000)]
    pods = [Pod(1, 600, 1_000, 1_000, ("A",)), Pod(1, 600, 1_000, 1_000, ("A",)), Pod(1, 300, 1_000, 1_000, ("A",))]
    rb = resource_bound(pods, node_types(_cluster(nodes)))
    assert lower_bound(pods, 2).unallocated_pct == pytest.approx(25.0)  # 600+300, 600: models ignored
    exact = _pct(exact_max_alloc(pods, nodes), 2)
    assert exact == pytest.approx(55.0)
    assert rb.unallocated_pct == pytest.approx(55.0)


def test_memory_per_node_binds():
    # two nodes of 2 GPUs and 10 GiB; pods of 1 GPU and 6 GiB: one per node, though the pool has 20 GiB
    nodes = [("A", 2, 64_000, 10_240)] * 2
    pods = [Pod(1, MILLI, 1_000, 6_144)] * 3
    rb = resource_bound(pods, node_types(_cluster(nodes)))
    assert rb.pooled_alloc_milli == pytest.approx(2 * MILLI)  # the per-node rounding cut (u_1) sees it
    assert rb.unallocated_pct == pytest.approx(50.0)
    assert rb.packed_alloc_milli == 2 * MILLI


def test_only_the_node_configurations_see_two_resources_at_once():
    # one node of 3 GPUs, 10 cores, 10,000 MiB; any two of the three pods fit, all three do not (CPU and memory
    # both 11,100): no single-resource cut sees it, the configuration LP's Lagrangian bound does
    nodes = [("A", 3, 10_000, 10_000)]
    pods = [Pod(1, MILLI, 6_100, 1_100), Pod(1, MILLI, 1_100, 6_100), Pod(1, MILLI, 3_900, 3_900)]
    rb = resource_bound(pods, node_types(_cluster(nodes)))
    assert lower_bound(pods, 3).unallocated_pct == pytest.approx(0.0)
    assert rb.pooled_alloc_milli > 2 * MILLI + 100  # the pooled LP takes a fraction of the third pod
    assert rb.converged and rb.max_alloc_milli == 2 * MILLI == exact_max_alloc(pods, nodes)


_POD = st.tuples(st.sampled_from([(1, 250), (1, 500), (1, 700), (1, MILLI), (2, MILLI), (4, MILLI)]),
                 st.sampled_from([1_000, 4_000, 9_000]), st.sampled_from([1_024, 8_192]),
                 st.sampled_from([(), ("A",), ("B",), ("A", "B")]))
_NODE = st.tuples(st.sampled_from(["A", "B"]), st.sampled_from([1, 2, 4]), st.sampled_from([8_000, 16_000]),
                  st.sampled_from([8_192, 32_768]))


@settings(max_examples=30, deadline=None)
@given(nodes=st.lists(_NODE, min_size=1, max_size=3), raw=st.lists(_POD, min_size=1, max_size=8))
def test_bound_never_exceeds_the_true_optimum(nodes, raw):
    pods = [Pod(k, milli, c, mm, models) for (k, milli), c, mm, models in raw]
    gpus = sum(g for _, g, _, _ in nodes)
    rb = resource_bound(pods, node_types(_cluster(nodes)))
    best = exact_max_alloc(pods, nodes)
    assert rb.max_alloc_milli >= best - 1e-6  # a lower bound on unallocated %: never below the optimum's
    assert rb.pooled_alloc_milli >= best - 1e-6
    assert rb.packed_alloc_milli <= best  # the offline packing is a real placement
    assert rb.unallocated_pct <= _pct(best, gpus) + 1e-9


def test_the_bound_command_reports_both_bounds(tmp_path: Path):
    # one 2-GPU node with 8 cores; two whole-GPU pods of 6 cores: arc-flow says 0 %, the resource bound 50 %
    n, p = write_trace(tmp_path, ["n0,8000,262144,2,G2"], [pod_row(i, 6000, 1, MILLI) for i in range(2)])
    run = [sys.executable, "-m", "gpudefrag.cli.main", "simulate", "bound", "--nodes", str(n), "--pods", str(p),
           "--seeds", "1", "--json"]
    r = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)[0]
    assert row["lower_bound_unallocated_pct"] == pytest.approx(0.0)
    assert row["resource_lower_bound_unallocated_pct"] == pytest.approx(50.0)
    r = subprocess.run([*run, "--kind", "resource"], capture_output=True, text=True, timeout=300)
    assert "lower_bound_unallocated_pct" not in json.loads(r.stdout)[0]
    r = subprocess.run([*run, "--kind", "magic"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--kind" in r.stderr
    # with the offline packing the limit is pinned: a placement that leaves 50 % exists, and no better one
    r = subprocess.run([*run, "--kind", "both,packing", "--pack-rounds", "3"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)[0]
    assert row["packing_unallocated_pct"] == pytest.approx(50.0) == row["resource_lower_bound_unallocated_pct"]
    r = subprocess.run([*run, "--kind", "packing", "--pack-rounds", "-1"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "--pack-rounds" in r.stderr
