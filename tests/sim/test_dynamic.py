"""Dynamic simulation bookkeeping on a small synthetic workload."""

from __future__ import annotations

import numpy as np

from gpudefrag.sim.dynamic import DynamicConfig, simulate
from gpudefrag.sim.report import gap_closed
from gpudefrag.sim.synthetic import WorkloadSpec, generate

SPEC = WorkloadSpec(nodes=4, jobs=300, load=0.95, seed=3, duration_median_s=600)


def test_workload_is_seeded_and_documented_mix_holds():
    a, b = generate(SPEC), generate(SPEC)
    assert [j.submit for j in a.jobs] == [j.submit for j in b.jobs]
    assert SPEC.eight_gpu_demand_share() >= 0.30
    sub = np.array([j.submit for j in a.jobs])
    assert (np.diff(sub) >= 0).all()


def test_every_job_runs_once_and_utilisation_stays_within_capacity():
    wl = generate(SPEC)
    for cfg in (DynamicConfig(policy="bestfit"), DynamicConfig(policy="fgd", defrag="migrate", trigger_s=60),
                DynamicConfig(policy="fgd", defrag="evict", trigger_s=60), DynamicConfig(pooled=True)):
        r = simulate(wl, cfg)
        assert np.isfinite(r.waited).all() and (r.waited >= -1e-9).all(), cfg
        assert (r.util <= 1.0 + 1e-9).all() and (r.util >= 0).all()
        assert (r.end >= r.submit).all()
        if cfg.defrag == "evict":
            assert r.lost_gpu_s >= 0 and r.moves == 0
        if cfg.defrag == "migrate":
            assert r.evictions == 0 and r.move_gpu_s >= 0


def test_gap_closed_is_computed_from_the_three_configs():
    wl = generate(SPEC)
    rs = [simulate(wl, c) for c in (DynamicConfig(policy="fgd"), DynamicConfig(policy="fgd", defrag="migrate"),
                                    DynamicConfig(pooled=True))]
    g = gap_closed(rs)
    assert g is None or g <= 1.5
