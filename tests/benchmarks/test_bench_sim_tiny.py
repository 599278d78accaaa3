"""`./scripts/bench.sh sim` end to end on a tiny hand-made trace: the benchmark's glue (the study's reproduction,
the variants beside the authors' cached numbers, the moves comparison) runs and fills every row. The real run
takes hours and stays out of the suite; a change of a result's shape once broke it only there."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import pytest

from gpudefrag.sim.trace import NODE_COLUMNS, POD_COLUMNS

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
AUTHORS = ("01-Random", "02-DotProd", "03-GpuClustering", "04-GpuPacking", "05-BestFit", "06-FGD")


def _pods(path: Path) -> None:
    # no pod above 1 % of the 160 GPUs, so every point of the arrived-% curve is reached
    shapes = [(1, 1000), (1, 500), (1, 300), (1, 700), (0, 0), (1, 250), (1, 100)]
    rows = [f"p{i},{4000 + 1000 * (i % 5)},8192,{k},{m}" for i, (k, m) in enumerate(shapes * 30)]
    path.write_text("\n".join([",".join(POD_COLUMNS), *rows]) + "\n")  # the five columns every list has


def _authors(folder: Path, workload: str) -> None:
    folder.mkdir(parents=True)
    with (folder / "analysis_allo_discrete.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["workload", "sc_policy", "tune", "seed", "total_gpus", *range(131)])
        for i, pol in enumerate(AUTHORS):
            w.writerow([workload, pol, 1.3, 42, 160, *(min(k, 100 - 2 * i) for k in range(131))])


@pytest.fixture
def tiny_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    t = tmp_path / "trace"
    (t / "variants").mkdir(parents=True)
    nodes = [f"n{i},48000,131072,8,{'V100' if i % 2 else 'T4'}" for i in range(20)]
    (t / "openb_node_list_gpu_node.csv").write_text("\n".join([",".join(NODE_COLUMNS), *nodes]) + "\n")
    _pods(t / "openb_pod_list_default.csv")
    _pods(t / "variants" / "openb_pod_list_multigpu20.csv")
    _authors(t / "fgd-expected-results", "openb_pod_list_default")
    _authors(t / "variants" / "fgd-expected-results", "openb_pod_list_multigpu20")
    monkeypatch.setenv("GPUDEFRAG_TRACE_DIR", str(t))
    monkeypatch.syspath_prepend(str(BENCH))
    for m in ("bench_sim", "reproduce_fgd", "reproduce_variants", "common"):
        sys.modules.pop(m, None)
    return t


def test_the_simulator_benchmark_runs_whole_on_a_tiny_trace(tiny_trace: Path) -> None:
    import bench_sim

    rows = bench_sim._static(True) + bench_sim._variants(True) + bench_sim._moves(True)
    names = [r.name for r in rows]
    assert not any("SKIPPED" in (r.note or "") for r in rows)
    # the variant with the authors' numbers is compared policy by policy, with the same-distribution p
    mg = [r for r in rows if r.name.startswith("multigpu20 ")]
    assert len(mg) == 6 and all(math.isfinite(r.value) and "same-distribution p" in r.note for r in mg)
    # a variant without them says so instead of running
    assert any(r.name == "gpuspec25: the authors' numbers" and "no cached results" in r.note for r in rows)
    # the moves comparison fills its four rows for the default list
    for part in ("FGD+repack at equal moved pods", "share of the FGD→bound gap closed",
                 "multi-GPU pods failed that relief or a repack could have placed", "priced"):
        assert any(n.startswith("default: ") and part in n for n in names), part
    assert all(math.isfinite(r.value) for r in rows if r.name.startswith("default: "))
