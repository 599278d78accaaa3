"""`simulate replay`: the trace in time — times, load scaling, windows, drawn times, the arms, the report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudefrag.errors import InputError
from gpudefrag.sim.timed import (
    ArmRun,
    ReplaySpec,
    build,
    config_for,
    drawn_times,
    load_factor,
    own_times,
    parse_window,
    peak_demand,
    run_arm,
    runs_for,
)
from gpudefrag.sim.trace import load_pods

from .conftest import NODE_HEADER, POD_HEADER

NODES = ["n0,64000,262144,4,G", "n1,64000,262144,4,G"]


def row(name: str, k: int, milli: int, created: float, deleted: float | str, scheduled: float | str = "",
        phase: str = "Running") -> str:
    sched = created if scheduled == "" and phase != "Pending" else scheduled
    return f"{name},4000,1024,{k},{milli},,LS,{phase},{created},{deleted},{sched}"


def files(tmp: Path, pods: list[str], nodes: list[str] = NODES, header: str = POD_HEADER) -> tuple[Path, Path]:
    n, p = tmp / "nodes.csv", tmp / "pods.csv"
    n.write_text("\n".join([NODE_HEADER, *nodes]) + "\n")
    p.write_text("\n".join([header, *pods]) + "\n")
    return n, p


# a cluster of two 4-GPU nodes; `spread` puts the four 1-GPU pods two on each node, so the 4-GPU pod that comes
# next fits on no node until one of them ends (10,000 s later) unless two of them move
FRAGMENTING = [row(f"one{i}", 1, 1000, i, 10_000 + i) for i in range(4)] + [row("four", 4, 1000, 10, 1010)]


def test_own_times_rules(tmp_path: Path) -> None:
    _, p = files(tmp_path, [
        row("a", 1, 1000, 0, 100, 40),  # ran from its scheduling to its deletion: 60 s
        row("b", 1, 500, 10, 50, "", "Pending"),  # never scheduled: its request lived 40 s
        row("c", 1, 1000, 20, "", 20),  # no deletion: runs until the trace's last time stamp (100)
        row("d", 2, 1000, 30, 90, 30, "Failed"),  # failed: its own 60 s like any other
        row("e", 1, 1000, 5, 5, 5),  # zero: at least one second
    ])
    t = own_times(load_pods(p, times=True))
    assert t[:, 0].tolist() == [0, 10, 20, 30, 5]
    assert t[:, 1].tolist() == [60, 40, 80, 60, 1]


def test_load_scaling_reaches_the_peak_and_keeps_order_and_durations(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    arrival = np.sort(rng.uniform(0, 1e6, 200))
    duration = rng.uniform(10, 5000, 200)
    gpus = rng.choice([0.5, 1, 2, 4, 8], 200).astype(float)
    for load in (0.2, 0.5, 0.9):
        f = load_factor(arrival, duration, gpus, 64, load)
        peak = peak_demand(arrival / f, duration, gpus)
        assert load * 64 <= peak <= load * 64 + gpus.max()  # reached, by at most one pod more
        assert peak_demand(arrival / (f * 0.99), duration, gpus) < load * 64 or f < 1e-20  # the least factor
    with pytest.raises(InputError, match="out of reach"):
        load_factor(arrival, duration, gpus, 64, 100.0)
    n, p = files(tmp_path, [row(f"p{i}", 1, 1000, 1000 * i, 1000 * i + 500) for i in range(8)])
    tw = build(ReplaySpec(str(n), str(p), 0.5))
    sub = [j.submit for j in tw.workload.jobs]
    assert sub == sorted(sub) and [j.duration for j in tw.workload.jobs] == [500.0] * 8
    assert math.isclose(tw.peak_load, 0.5) and tw.factor > 1  # four of eight GPUs at once: compressed
    assert [p.name for p in tw.trace.pods] == [f"p{i}" for i in range(8)]


def test_window(tmp_path: Path) -> None:
    n, p = files(tmp_path, [row(f"p{i}", 1, 1000, 100 * i, 100 * i + 50) for i in range(10)])
    tw = build(ReplaySpec(str(n), str(p), 0, window="300:700"))
    assert [x.name for x in tw.trace.pods] == ["p3", "p4", "p5", "p6"]
    assert [j.submit for j in tw.workload.jobs] == [0.0, 100.0, 200.0, 300.0]  # from the first, unscaled
    assert parse_window("5:") == (5.0, math.inf)
    for bad in ("x", "7:3", "1:2:3", "-1:"):
        with pytest.raises(InputError, match="--window"):
            parse_window(bad)
    with pytest.raises(InputError, match="no pod"):
        build(ReplaySpec(str(n), str(p), 0, window="5000:"))


def test_lists_without_times_draw_from_the_same_gpu_count(tmp_path: Path) -> None:
    src = [row(f"s{i}", 1, 1000, 10 * i, 10 * i + 7) for i in range(5)]
    src += [row(f"e{i}", 4, 1000, 1000 + 100 * i, 1000 + 100 * i + 9000) for i in range(3)]
    n, s = files(tmp_path, src)
    five = tmp_path / "five.csv"
    five.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                    + "".join(f"v{i},4000,1024,{4 if i % 3 == 0 else 1},1000\n" for i in range(12)))
    pods, source = load_pods(five), load_pods(s, times=True)
    a = drawn_times(pods, source, 42)
    assert (a == drawn_times(pods, source, 42)).all() and not (a == drawn_times(pods, source, 43)).all()
    for i, p in enumerate(pods):
        assert a[i, 1] == (9000 if p.pod.num_gpu == 4 else 7)  # a duration of the same GPU count
    assert (np.diff(a[:, 0]) >= 0).all()
    tw = build(ReplaySpec(str(n), str(five), 0, times_from=str(s)))
    assert "drawn (seed 42)" in tw.times and str(s) in tw.times
    with pytest.raises(InputError, match="--times-from"):
        build(ReplaySpec(str(n), str(five), 0))  # no default list beside it


def test_arms_on_a_fragmenting_trace(tmp_path: Path) -> None:
    n, p = files(tmp_path, FRAGMENTING)
    spec = ReplaySpec(str(n), str(p), 0)
    got = {a: run_arm(ArmRun(spec, a, "spread", trigger_s=100)) for a in
           ("fgd", "fgd+gpudefrag", "fgd+evict", "pooled")}
    four = {a: float(r.wait[r.num_gpu == 4][0]) for a, r in got.items()}
    assert four["fgd"] == pytest.approx(10_000 - 10 + 0, abs=5)  # until the first 1-GPU pod ends
    assert four["pooled"] == 0
    assert 100 <= four["fgd+gpudefrag"] <= 200  # after the trigger, two pods moved
    g = got["fgd+gpudefrag"]
    assert g.moves == 2 and g.gpu_hours_lost == 0 and g.gpu_hours_moving > 0 and g.gib_moved > 0
    assert g.metrics["gpu_hours_total"] == pytest.approx((4 * 10_000 + 4 * 1000) / 3600)
    assert got["fgd+evict"].evictions >= 1 and got["fgd+evict"].gpu_hours_lost > 0  # evicted: work lost
    assert not any(r.never_started.any() for r in got.values())


def test_cli_json_and_report(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    n, p = files(tmp_path, FRAGMENTING)
    out = tmp_path / "rep"
    code, so, err = cli(["simulate", "replay", "--nodes", str(n), "--pods", str(p), "--load", "0", "--seeds", "42,43",
                         "--out", str(out), "--workers", "1", "--trigger", "100", "--json"])
    assert code == 0, err
    doc = json.loads(so)
    assert list(doc) == ["arms"]
    assert set(doc["arms"]) == {"fgd", "fgd+gpudefrag", "fgd+deschedule", "fgd+evict", "pooled"}
    for arm in doc["arms"].values():
        assert set(arm["p95_wait_s"]) == {"fractional", "1", "2", "4", "8"}
        for k in ("gap_closed_p95_multi", "moves_per_placed_pod", "gib_moved", "gpu_hours_total",
                  "gpu_hours_moving", "gpu_hours_lost"):
            assert k in arm
    assert doc["arms"]["pooled"]["p95_wait_s"]["4"] == 0 and doc["arms"]["fgd+gpudefrag"]["gpu_hours_lost"] == 0
    for f in ("report.md", "summary.csv", "runs.csv", "waits.csv", "allocation.csv", "waits_cdf.png",
              "allocation.png"):
        assert (out / f).is_file(), f
    assert "own creation" in (out / "report.md").read_text()


@pytest.mark.parametrize("bad, where", [
    (row("x", 1, 1000, 0, 10).replace(",4000,", ",4k,"), "line 3, column 3 (cpu_milli)"),
    (row("x", 1, 1000, 0, 10).replace(",0,10,", ",zero,10,"), "(creation_time)"),
    (row("x", 1, 1000, 50, 10), "(deletion_time)"),
    (row("x", 1, 1000, "", 10), "(creation_time): empty creation time"),
])
def test_malformed_pod_list_is_one_line_exit_2(tmp_path: Path, cli, bad: str, where: str) -> None:  # type: ignore[no-untyped-def]
    n, p = files(tmp_path, [row("ok", 1, 1000, 0, 10), bad])
    code, so, err = cli(["simulate", "replay", "--nodes", str(n), "--pods", str(p), "--out", str(tmp_path / "o")])
    assert code == 2 and so == ""
    assert err.count("\n") == 1 and str(p) in err and where in err, err
    assert not (tmp_path / "o").exists()


def test_malformed_times_from_is_one_line_exit_2(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    n, _ = files(tmp_path, [row("ok", 1, 1000, 0, 10)])
    five = tmp_path / "five.csv"
    five.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nv0,4000,1024,1,1000\n")
    src = tmp_path / "times.csv"
    src.write_text(POD_HEADER + "\n" + row("s", 1, 1000, 0, 10) + "\n" + row("t", 1, 1000, 5, "1e") + "\n")
    code, _, err = cli(["simulate", "replay", "--nodes", str(n), "--pods", str(five), "--times-from", str(src),
                        "--out", str(tmp_path / "o")])
    assert code == 2 and err.count("\n") == 1 and str(src) in err and "line 3, column" in err, err


FIELDS = st.lists(st.tuples(st.integers(0, 2), st.sampled_from([250, 1000]), st.integers(0, 10**6),
                            st.integers(0, 10**5)), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(FIELDS, st.integers(0, 11), st.sampled_from(["cpu", "created", "deleted", "none"]))
def test_loader_property(tmp_path: Path, pods: list[tuple[int, int, int, int]], which: int, corrupt: str) -> None:
    """Valid rows load with their times; one corrupted field is an InputError naming that line and column."""
    rows = []
    for i, (k, milli, c, d) in enumerate(pods):
        milli = 0 if k == 0 else (1000 if k > 1 else milli)
        rows.append(f"p{i},4000,1024,{k},{milli},,LS,Running,{c},{c + d},{c}")
    which %= len(rows)
    cols = rows[which].split(",")
    idx = {"cpu": 1, "created": 8, "deleted": 9}.get(corrupt)
    if idx is not None:
        cols[idx] = "x" + cols[idx]
        rows[which] = ",".join(cols)
    path = tmp_path / f"prop-{corrupt}.csv"
    path.write_text(POD_HEADER + "\n" + "\n".join(rows) + "\n")
    if idx is None:
        t = own_times(load_pods(path, times=True))
        assert t[:, 0].tolist() == [float(c) for _, _, c, _ in pods]
        assert t[:, 1].tolist() == [float(max(d, 1)) for *_, d in pods]
        return
    column = 1 + sum(len(x) + 1 for x in cols[:idx])
    with pytest.raises(InputError) as e:
        load_pods(path, times=True)
    assert e.value.source == str(path) and e.value.where.startswith(f"line {which + 2}, column {column} (")


def test_real_trace_times(alibaba_trace: Path) -> None:
    """The default list replays on its own times; a multigpu variant draws them from the default list."""
    nodes = str(alibaba_trace / "openb_node_list_gpu_node.csv")
    tw = build(ReplaySpec(nodes, str(alibaba_trace / "openb_pod_list_default.csv"), 0.9))
    assert len(tw.workload.jobs) == 8152 and math.isclose(tw.peak_load, 0.9, rel_tol=1e-3)
    assert "own creation" in tw.times and tw.factor > 1000  # 149 days of a sample: compressed
    var = build(ReplaySpec(nodes, str(alibaba_trace / "variants" / "openb_pod_list_multigpu20.csv"), 0.9, 43))
    assert "drawn (seed 43)" in var.times and "openb_pod_list_default.csv" in var.times
    assert math.isclose(var.peak_load, 0.9, rel_tol=1e-3)


def test_deschedule_arm_evicts_and_the_evicted_pod_loses_its_work(tmp_path: Path) -> None:
    """Two 1-GPU nodes; once the 800-milli pod leaves, the 250 and 200 shares sit alone on the two GPUs and the
    whole-GPU pod fits nowhere: the authors' descheduler evicts a share (its elapsed work lost), FGD re-places it
    beside the other, and the whole-GPU pod starts."""
    n, p = files(tmp_path, [row("a", 1, 250, 0, 100_000), row("w", 1, 800, 1, 20), row("b", 1, 200, 2, 100_000),
                            row("c", 1, 1000, 30, 1030)], nodes=["n0,64000,262144,1,G", "n1,64000,262144,1,G"])
    spec = ReplaySpec(str(n), str(p), 0)
    plain = run_arm(ArmRun(spec, "fgd", trigger_s=100))
    assert plain.wait[-1] > 90_000  # c waits for a share to end
    r = run_arm(ArmRun(spec, "fgd+deschedule", trigger_s=100))
    assert r.evictions == 1 and r.moves == 0
    assert 100 <= r.wait[-1] <= 200 and not r.never_started.any()
    assert r.gpu_hours_lost * 3600 == pytest.approx(0.25 * 130, abs=0.25 * 70)  # a's ~130 s, or b's ~128 s


def test_pooled_bound_keeps_the_gpu_model_a_pod_names(tmp_path: Path) -> None:
    """Pods that name a GPU model (the gpuspec lists) run only on that model: the pooled bound pools each model's
    GPUs apart (one node of no model started none of them, and every such pod 'waited' to the end); a pod that
    names none still uses any GPU."""
    nodes = ["n0,64000,262144,2,G1", "n1,64000,262144,2,G2", "n2,64000,262144,2,G2"]
    g2 = [row("a", 1, 1000, 0, 5000), row("b", 1, 1000, 1, 5001), row("c", 2, 1000, 5, 105)]
    pods = [r.replace(",,LS", ",G2,LS") for r in g2] + [row("d", 2, 1000, 6, 106)]
    n, p = files(tmp_path, pods, nodes=nodes)
    spec = ReplaySpec(str(n), str(p), 0)
    pooled = run_arm(ArmRun(spec, "pooled"))
    assert not pooled.never_started.any() and pooled.wait.max() == 0
    spread = run_arm(ArmRun(spec, "fgd"))
    assert not spread.never_started.any()


def test_deschedule_passes_keep_a_minimum_interval_whatever_the_trigger(tmp_path: Path) -> None:
    """A 4-GPU pod waits 1,000 s behind two 4-GPU pods that hold every GPU, while 300 short CPU-only pods come
    and go (two events a second). At trigger 0 the descheduler made a pass at every event (617 here, with no
    interval); now its passes (`decisions`) are at least 60 s apart (`DynamicConfig.deschedule_min_interval_s`),
    and at a trigger above that interval one per trigger, as before."""
    hold = [row("h0", 4, 1000, 0, 1000), row("h1", 4, 1000, 0, 1000), row("w", 4, 1000, 1, 1100)]
    churn = [f"c{i},100,64,0,0,,LS,Running,{2 + i},{3 + i},{2 + i}" for i in range(300)]
    n, p = files(tmp_path, hold + churn)
    spec = ReplaySpec(str(n), str(p), 0)
    r = run_arm(ArmRun(spec, "fgd+deschedule", trigger_s=0))
    assert r.wait[2] == pytest.approx(999, abs=1)  # nothing to evict helps it: it waits for the holders
    assert 1 <= r.decisions <= math.ceil(1000 / 60) + 1
    slow = run_arm(ArmRun(spec, "fgd+deschedule", trigger_s=200))
    assert 1 <= slow.decisions <= math.ceil(800 / 200) + 1


def test_the_default_trigger_is_the_product_default_policys() -> None:
    """Every arm waits as long as the product's default policy before acting, unless told otherwise: the replay
    keeps no trigger of its own (it once acted at 300 s where the product acts at 60)."""
    from gpudefrag.policy.models import Policy

    spec = ReplaySpec("n.csv", "p.csv")
    product = Policy().trigger.pending
    assert product is not None
    for arm in ("fgd+gpudefrag", "fgd+deschedule", "fgd+evict"):
        assert config_for(ArmRun(spec, arm)).trigger == product.longer_than_s
    assert {r.trigger_s for r in runs_for([spec], ["fgd"])} == {product.longer_than_s}
    # and `simulate dynamic`'s configurations, which kept a private 300 s longer still
    from gpudefrag.sim.dynamic import STANDARD, DynamicConfig

    assert DynamicConfig().trigger_s == product.longer_than_s
    assert {c.trigger_s for c in STANDARD} == {product.longer_than_s}
