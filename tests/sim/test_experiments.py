"""The authors' cached results as per-seed runs, and the check that tells seed noise from a method difference."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from gpudefrag.sim.experiments import author_curves, author_runs, authors_for, same_distribution_p


def _write_cached(folder, rows):
    """An `analysis_allo_discrete.csv` in the authors' layout: allocation rate % per arrived % 0…130."""
    d = folder / "fgd-expected-results"
    d.mkdir(parents=True)
    with (d / "analysis_allo_discrete.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["workload", "sc_policy", "tune", "seed", "total_gpus", *map(str, range(131))])
        for workload, policy, seed, alloc in rows:
            w.writerow([workload, policy, 1.3, seed, 6212, *([alloc] * 131)])


def test_author_runs_keep_every_seed_and_the_curves_are_their_median(tmp_path):
    _write_cached(tmp_path, [("openb_pod_list_multigpu20", "04-GpuPacking", 42, 94.0),
                             ("openb_pod_list_multigpu20", "04-GpuPacking", 43, 93.0),
                             ("openb_pod_list_multigpu20", "04-GpuPacking", 44, 90.0),
                             ("openb_pod_list_default", "04-GpuPacking", 42, 50.0),
                             ("openb_pod_list_multigpu20", "99-Unknown", 42, 10.0)])
    runs = author_runs(tmp_path, "openb_pod_list_multigpu20")
    assert list(runs) == ["gpupacking"]
    assert runs["gpupacking"].shape == (3, 131)
    assert sorted(runs["gpupacking"][:, 100]) == [6.0, 7.0, 10.0]  # unallocated = 100 − allocation rate
    assert author_curves(tmp_path, "openb_pod_list_multigpu20")["gpupacking"][100] == pytest.approx(7.0)
    au = authors_for(tmp_path / "openb_pod_list_multigpu20.csv")
    assert au.runs["gpupacking"].shape == (3, 131) and au.curves["gpupacking"][100] == pytest.approx(7.0)


def test_seed_noise_is_not_called_a_difference_but_a_shift_is():
    rng = np.random.default_rng(1)
    # one simulator, two sets of ten seeds, spread like GpuPacking on multigpu20 (sd ≈ 0.5 pp): the two
    # medians can differ by half a point, yet the samples are one distribution
    a = 6.6 + 0.5 * rng.standard_normal(10)
    b = 6.6 + 0.5 * rng.standard_normal(10)
    assert same_distribution_p(a, b) > 0.05
    assert same_distribution_p(a, b + 2.0) < 0.01  # a method that leaves 2 pp more unallocated
    assert np.isnan(same_distribution_p([], b))
