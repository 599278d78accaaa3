"""Fragmentation metrics against hand-computed values, and the FGD measure against its definition."""

from __future__ import annotations

import csv
import random
from collections import Counter

import numpy as np
import pytest

from gpudefrag.core.fragmentation import (
    TaskShape,
    WorkloadMix,
    frag_report,
    node_fragmentation,
)
from gpudefrag.core.model import MILLI, ClusterState, Node, Placement, Request, Workload
from gpudefrag.snapshot import load_snapshot_dict


def small() -> ClusterState:
    # a: GPUs free 1000, 1000, 500, 0   b: GPUs free 1000, 300
    return load_snapshot_dict({
        "nodes": [{"name": "a", "gpus": 4, "gpu_model": "X"}, {"name": "b", "gpus": 2, "gpu_model": "X"}],
        "workloads": [
            {"id": "half", "gpus_per_node": 1, "gpu_milli": 500, "placements": [{"node": "a", "gpus": [2]}]},
            {"id": "whole", "gpus_per_node": 1, "placements": [{"node": "a", "gpus": [3]}]},
            {"id": "s7", "gpus_per_node": 1, "gpu_milli": 700, "placements": [{"node": "b", "gpus": [1]}]},
        ],
    })


def test_free_arrays():
    s = small()
    assert s.free_milli.tolist() == [[1000, 1000, 500, 0], [1000, 300, -1, -1]]


def test_operator_metrics_hand_computed():
    r = frag_report(small(), Request(gpus_per_node=2),
                    WorkloadMix((TaskShape(1, 500), TaskShape(2)), (0.5, 0.5)))
    assert r.free_gpus == 3
    assert r.free_milli == 3800
    assert r.whole_free_nodes == 0
    assert r.nodes_fitting == 1
    assert r.stranded_gpus == 1  # b's one whole GPU: the 2-GPU request cannot use it
    assert r.stranded_milli == 500 + 1300  # a's half GPU + everything free on b
    assert (r.largest_placeable, r.largest_node) == (2, "a")
    assert r.histogram == {1: 1, 2: 1}
    # F_a = .5*0 + .5*500 ; F_b = .5*300 + .5*1300
    assert r.fgd_milli == pytest.approx(250 + 800)


def test_whole_free_node_counted():
    s = load_snapshot_dict({"nodes": [{"name": "a", "gpus": 8}, {"name": "b", "gpus": 8}],
                            "workloads": [{"id": "j", "gpus_per_node": 1, "placements": [{"node": "a"}]}]})
    r = frag_report(s, Request(gpus_per_node=8))
    assert (r.whole_free_nodes, r.nodes_fitting, r.stranded_gpus, r.largest_placeable) == (1, 1, 7, 8)


def test_gpu_model_and_cpu_make_everything_fragment():
    s = small()
    free, cpu = s.free_milli, np.array([1000, 1000])
    nodes = s.nodes
    wrong_model = node_fragmentation(free, cpu, nodes, WorkloadMix.single(TaskShape(1, 100, 0, ("Y",))))
    assert wrong_model.tolist() == [2500, 1300]
    too_much_cpu = node_fragmentation(free, cpu, nodes, WorkloadMix.single(TaskShape(1, 100, 2000)))
    assert too_much_cpu.tolist() == [2500, 1300]
    cpu_only = node_fragmentation(free, cpu, nodes, WorkloadMix.single(TaskShape(0, 0, 100)))
    assert cpu_only.tolist() == [2500, 1300]


def test_mix_keeps_shapes_one_at_a_time_until_95_percent():
    shapes = [TaskShape(1, 100 + i) for i in range(25) for _ in range(4)]  # 25 shapes × 4 = 100 tasks
    shapes += [TaskShape(1, 999)] * 400  # one dominant shape: 80 % of 500 tasks, the others 0.8 % each
    mix = WorkloadMix.from_shapes(shapes)
    # 80 % + 19 × 0.8 % = 95.2 % ≥ 95 %: 20 shapes; ties (all 0.8 %) go largest share first, as upstream sorts
    assert len(mix.shapes) == 20
    assert mix.shapes[1] == TaskShape(1, 124) and mix.shapes[-1] == TaskShape(1, 106)
    assert mix.weights[0] == pytest.approx(400 / 476)


def test_mix_can_keep_shapes_ten_at_a_time():
    shapes = [TaskShape(1, 100 + i) for i in range(25) for _ in range(4)]
    shapes += [TaskShape(1, 999)] * 400
    mix = WorkloadMix.from_shapes(shapes, step=10)
    # the first 10 shapes cover 80 + 9 × 0.8 = 87.2 %; the next 10 reach 95.2 % ≥ 95 %: 20 shapes kept
    assert len(mix.shapes) == 20
    assert mix.shapes[0] == TaskShape(1, 999)
    assert sum(mix.weights) == pytest.approx(1.0)
    assert mix.weights[0] == pytest.approx(400 / 476)


# ------------------------------------------------------------------------------ the definition, on real nodes
def fgd_by_definition(node_free: list[int], node_cpu_free: int, node_model: str,
                      mix: list[tuple[float, int, int, int, tuple[str, ...]]]) -> float:
    """Weng et al.'s F_n(M), written from the paper's words, one node at a time, no NumPy."""
    total = 0.0
    free_sum = sum(f for f in node_free if f > 0)
    for p, k, d, c, models in mix:
        if k == 0:
            f = free_sum
        else:
            ok_model = not models or node_model in models
            fitting = sum(1 for f in node_free if f >= min(d, MILLI))
            if ok_model and node_cpu_free >= c and fitting >= k:
                f = sum(x for x in node_free if 0 < x < min(d, MILLI))
            else:
                f = free_sum
        total += p * f
    return total


@pytest.mark.trace
def test_fgd_matches_definition_on_alibaba_nodes(alibaba_trace):
    with open(alibaba_trace / "openb_node_list_gpu_node.csv") as f:
        rows = list(csv.DictReader(f))
    with open(alibaba_trace / "openb_pod_list_default.csv") as f:
        pods = list(csv.DictReader(f))
    nodes = [Node(r["sn"], int(r["gpu"]), r["model"] or None, cpu_milli=int(r["cpu_milli"]),
                  memory_mib=int(r["memory_mib"])) for r in rows]
    shapes = [TaskShape(int(p["num_gpu"]), int(p["gpu_milli"]), int(p["cpu_milli"]),
                        tuple(x for x in p["gpu_spec"].split("|") if x)) for p in pods]
    mix = WorkloadMix.from_shapes(shapes)
    assert sum(Counter(shapes)[s] for s in mix.shapes) / len(shapes) >= 0.95
    # fill the cluster at random with trace pods (first GPUs that fit), to get a realistic fragmented state
    rng = random.Random(7)
    free = {n.name: [MILLI] * n.gpu_count for n in nodes}
    cpu = {n.name: n.cpu_milli for n in nodes}
    workloads = []
    for i, p in enumerate(rng.sample(pods, 6000)):
        k, d, c = int(p["num_gpu"]), int(p["gpu_milli"]), int(p["cpu_milli"])
        if k == 0:
            continue
        n = rng.choice(nodes)
        gpus = [g for g, fr in enumerate(free[n.name]) if fr >= d][:k]
        if len(gpus) < k or cpu[n.name] < c:
            continue
        for g in gpus:
            free[n.name][g] -= d
        cpu[n.name] -= c
        workloads.append(Workload(f"p{i}", Request(k, 1, d, c), placements=(Placement(n.name, tuple(gpus)),)))
    state = ClusterState.build(nodes, workloads)
    got = node_fragmentation(state.free_milli, state.cpu_free, state.nodes, mix)
    pairs = zip(mix.shapes, mix.weights, strict=True)
    plain = [(p, s.num_gpu, s.gpu_milli, s.cpu_milli, s.gpu_models) for s, p in pairs]
    want = [fgd_by_definition(free[n.name], cpu[n.name], n.gpu_model or "", plain) for n in nodes]
    assert len(workloads) > 3000
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)
    # and the cluster total is what the paper sums
    assert got.sum() == pytest.approx(sum(want))
