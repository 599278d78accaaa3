"""Sweeps on local processes and on Ray's own local cluster: the same results, retries, failures named."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gpudefrag.sim.experiments import run_many, static_runs
from gpudefrag.sim.sweep import SweepError, run_tasks
from gpudefrag.sim.timed import ReplaySpec, run_arm, runs_for

from .conftest import pod_row, write_trace
from .test_timed_replay import FRAGMENTING, files


def _flaky(path: str) -> str:
    """Fails the first time it is called for a path (a marker file remembers), then succeeds."""
    marker = Path(path)
    if not marker.exists():
        marker.write_text("failed once")
        raise RuntimeError("first try fails")
    return marker.read_text()


def _always(x: int) -> int:
    raise ValueError(f"broken run {x}")


def _fields(r):  # type: ignore[no-untyped-def]
    return (r.run.label, r.run.spec.seed, r.metrics, r.wait.tolist(), r.alloc.tolist())


@pytest.fixture(scope="module")
def ray_cluster(require) -> Iterator[object]:  # type: ignore[no-untyped-def]
    try:
        import ray
    except ImportError:
        require("RAY", "RAY ABSENT: pip install 'gpudefrag[ray]' (or the dev extra); Ray sweep tests are SKIPPED")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def test_local_retries_and_names_failures(tmp_path: Path) -> None:
    seen: list[str] = []
    got = run_tasks(_flaky, [str(tmp_path / "a"), str(tmp_path / "b")], workers=2,
                    on_done=lambda it, res: seen.append(it))
    assert got == ["failed once", "failed once"] and len(seen) == 2
    with pytest.raises(SweepError, match="broken run 7") as e:
        run_tasks(_always, [7], workers=1, retries=2)
    assert "3 tries" in str(e.value) and "7" in str(e.value)
    with pytest.raises(SweepError, match=r"run ([12]) of 2 failed after 1 tries: ([34]): ValueError: broken run \2"):
        run_tasks(_always, [3, 4], workers=2, retries=0)


def test_replay_sweep_same_on_ray_and_processes(tmp_path: Path, ray_cluster: object) -> None:
    n, p = files(tmp_path, FRAGMENTING + [f"{r}" for r in (
        "x1,2000,1024,1,500,,LS,Running,20,300,20", "x2,2000,1024,2,1000,,LS,Running,30,4000,30")])
    runs = runs_for([ReplaySpec(str(n), str(p), 0.9, s) for s in (42, 43)], ["fgd", "spread"], trigger_s=100)
    done: list[str] = []
    local = run_tasks(run_arm, runs, workers=2)
    on_ray = run_tasks(run_arm, runs, ray="local", on_done=lambda it, res: done.append(it.label))
    assert len(done) == len(runs)  # the progress callback moved once per run
    assert [_fields(r) for r in local] == [_fields(r) for r in on_ray]
    assert {r.run.label for r in on_ray} == {"fgd", "fgd+gpudefrag", "fgd+deschedule", "fgd+evict", "pooled",
                                             "spread", "spread+gpudefrag", "spread+deschedule", "spread+evict"}


def test_static_sweep_same_on_ray_and_processes(tmp_path: Path, ray_cluster: object) -> None:
    nodes, pods = write_trace(tmp_path, ["a,64000,262144,4,G", "b,64000,262144,8,G"],
                              [pod_row(i, 4000, k, m) for i, (k, m) in enumerate(
                                  [(1, 500), (2, 1000), (1, 1000), (4, 1000), (1, 250), (0, 0)] * 3)])
    runs = static_runs(str(nodes), str(pods), ["fgd", "bestfit"], [1, 2], tune=1.3)
    local = run_many(runs, workers=1)
    on_ray = run_many(runs, ray="local")
    for a, b in zip(local, on_ray, strict=True):
        assert (a.policy, a.seed) == (b.policy, b.seed)
        assert np.array_equal(a.placed, b.placed) and np.allclose(a.alloc_pct, b.alloc_pct)


def test_ray_retries_a_failed_task_and_names_one_that_keeps_failing(tmp_path: Path, ray_cluster: object) -> None:
    assert run_tasks(_flaky, [str(tmp_path / "r")], ray="local", retries=1) == ["failed once"]
    with pytest.raises(SweepError, match="failed on Ray after 2 tries") as e:
        run_tasks(_always, [5], ray="local", retries=1)
    assert "broken run 5" in str(e.value)


def test_cli_static_and_replay_on_ray(tmp_path: Path, cli, ray_cluster: object) -> None:  # type: ignore[no-untyped-def]
    n, p = files(tmp_path, FRAGMENTING)
    args = ["simulate", "replay", "--nodes", str(n), "--pods", str(p), "--load", "0", "--trigger", "100", "--json"]
    code, so_local, err = cli([*args, "--out", str(tmp_path / "a"), "--workers", "1"])
    assert code == 0, err
    code, so_ray, err = cli([*args, "--out", str(tmp_path / "b"), "--ray", "local"])
    assert code == 0, err
    assert so_local == so_ray
    assert os.path.isfile(tmp_path / "b" / "report.md") and "Ray (local)" in (tmp_path / "b" / "report.md").read_text()
