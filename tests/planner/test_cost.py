"""The cost model: phases follow bytes and bandwidths, heartbeat moves lose work, alternatives are priced."""

from __future__ import annotations

import pytest

from gpudefrag.core.cost import APP_CHECKPOINT_LABEL, CostModel, TransferSample, gpu_equivalents
from gpudefrag.core.model import Placement, Request, Workload

GB = 1e9


def wl(gpus: int = 2, milli: int = 1000, nbytes: float = 10 * GB, last: float | None = 900.0, **kw) -> Workload:
    return Workload("w", Request(gpus, gpu_milli=milli), placements=(Placement("a", tuple(range(gpus))),),
                    checkpoint_bytes=int(nbytes), last_checkpoint_at=last, **kw)


def test_fresh_move_phases_follow_bytes_and_bandwidths():
    cm = CostModel(checkpoint_bps=2 * GB, transfer_bps=1 * GB, restore_bps=4 * GB, overhead_s=5)
    c = cm.move_cost(wl(nbytes=8 * GB), "a", "b", now=1000.0)
    assert (c.checkpoint_s, c.transfer_s, c.restore_s, c.lost_work_s) == (4.0, 8.0, 2.0, 0.0)
    assert c.total_s == 4 + 8 + 2 + 5
    assert c.gpu_s == c.total_s * 2


def test_heartbeat_move_loses_the_work_since_the_last_checkpoint():
    cm = CostModel(overhead_s=0)
    c = cm.move_cost(wl(last=400.0), "a", "b", now=1000.0, fresh_checkpoint=False)
    assert c.checkpoint_s == 0 and c.lost_work_s == 600.0 and not c.fresh_checkpoint
    never = cm.move_cost(wl(last=None), "a", "b", now=1000.0, fresh_checkpoint=False)
    assert never.fresh_checkpoint and never.lost_work_s == 0 and never.checkpoint_s > 0


def test_per_pair_link_and_shared_storage():
    cm = CostModel(transfer_bps=1 * GB, link_bps={("a", "fast"): 10 * GB})
    assert cm.move_cost(wl(), "a", "fast", 1000).transfer_s == pytest.approx(1.0)
    assert cm.move_cost(wl(), "a", "slow", 1000).transfer_s == pytest.approx(10.0)
    assert CostModel(shared_storage=True).move_cost(wl(), "a", "b", 1000).transfer_s == 0


def test_fractional_share_counts_as_a_fraction_of_a_gpu():
    w = wl(gpus=1, milli=250)
    assert gpu_equivalents(w) == 0.25
    c = CostModel().move_cost(w, "a", "b", 1000)
    assert c.gpu_s == pytest.approx(0.25 * c.total_s)


def test_from_history_takes_median_bandwidths_per_pair():
    samples = [TransferSample("a", "b", int(10 * GB), 5.0, 10.0, 2.0),
               TransferSample("a", "b", int(10 * GB), 5.0, 2.0, 2.0),
               TransferSample("a", "b", int(10 * GB), 5.0, 4.0, 2.0)]
    cm = CostModel().from_history(samples)
    assert cm.checkpoint_bps == pytest.approx(2 * GB)
    assert cm.restore_bps == pytest.approx(5 * GB)
    assert cm.bandwidth("a", "b") == pytest.approx(2.5 * GB)  # median of 1, 5, 2.5 GB/s
    assert cm.bandwidth("b", "a") == cm.transfer_bps


def test_evict_and_drain_alternatives():
    cm = CostModel(cold_start_s=100)
    w = wl(started_at=0.0, expected_end_at=5000.0)
    ev = cm.eviction_cost(w, now=1000.0)
    assert ev.seconds == 1000 + 100 and ev.gpu_s == 2 * 1100
    with_app = wl(started_at=0.0, labels={APP_CHECKPOINT_LABEL: "800"})
    assert cm.eviction_cost(with_app, now=1000.0).seconds == 200 + 100
    dr = cm.drain_cost(w, now=1000.0)
    assert dr.known and dr.seconds == 4000
    assert not cm.drain_cost(wl(), now=1000.0).known


def test_bad_bandwidth_rejected():
    with pytest.raises(ValueError, match="transfer_bps"):
        CostModel(transfer_bps=0)
