"""`gpudefrag plan` and the demo's plan, end to end through the real Typer app."""

from __future__ import annotations

import json

import pytest

from gpudefrag.demo import demo_document
from gpudefrag.snapshot import write_json_atomic


@pytest.fixture
def demo_file(tmp_path):
    p = tmp_path / "demo.json"
    write_json_atomic(p, demo_document())
    return p


def test_plan_json_for_the_oldest_pending_job(demo_file, cli):
    code, out, _ = cli(["plan", str(demo_file), "--json"])
    assert code == 0
    plan = json.loads(out)["plan"]
    assert plan["feasible"] and plan["workload"] == "pretrain-8gpu"
    assert plan["solver"] == "exact" and plan["optimal"]
    # every node holds 5 busy GPUs; clearing one means moving its jobs into the 3 free GPUs of the others
    sources = {m["source"] for m in plan["moves"]}
    assert sources == {plan["target_node"]}
    assert plan["total_gpu_s"] == pytest.approx(sum(m["cost"]["gpu_s"] for m in plan["moves"]))


def test_plan_text_shows_table_whole_node_and_maps(demo_file, cli):
    code, out, _ = cli(["plan", str(demo_file), "--explain"])
    assert code == 0
    assert "becomes able to host 8 GPU" in out and "GPU-s" in out
    assert "before" in out and "after" in out
    assert "solver: exact (proven optimal)" in out
    assert "evicting instead" in out


def test_heartbeat_moves_pick_another_node(demo_file, cli):
    _, fresh, _ = cli(["plan", str(demo_file), "--json"])
    _, beat, _ = cli(["plan", str(demo_file), "--json", "--heartbeat"])
    fresh_plan, beat_plan = json.loads(fresh)["plan"], json.loads(beat)["plan"]
    assert all(m["cost"]["lost_work_s"] > 0 for m in beat_plan["moves"])
    assert fresh_plan["target_node"] != beat_plan["target_node"]  # stale checkpoints change the cheapest node


def test_infeasible_plan_exits_1_with_the_reason(tmp_path, cli, pb):
    doc = {"nodes": [pb.node("a", gpus=4), pb.node("b", gpus=4)],
           "workloads": [pb.job("mn", 2, ["a", "b"]), pb.job("p", 4)], "now": pb.NOW}
    f = tmp_path / "blocked.json"
    write_json_atomic(f, doc)
    code, out, _ = cli(["plan", str(f), "--solver", "heuristic"])
    assert code == 1
    assert "no plan" in out and "multi-node" in out
    code, out, _ = cli(["plan", str(f), "--json"])
    assert code == 1 and json.loads(out)["plan"]["reason"]


def test_hypothetical_request_and_max_moves(demo_file, cli):
    code, out, _ = cli(["plan", str(demo_file), "--gpus", "8", "--max-moves", "1", "--json"])
    assert code == 1  # every node needs at least two moves to be cleared
    assert "no set of at most 1 of its movable workloads makes room" in json.loads(out)["plan"]["reason"]
    code, out, _ = cli(["plan", str(demo_file), "--gpus", "1", "--share", "500", "--json"])
    assert code == 0 and json.loads(out)["plan"]["moves"] == []


def test_all_pending(demo_file, cli):
    code, out, _ = cli(["plan", str(demo_file), "--all-pending", "--json"])
    assert code == 0
    plans = json.loads(out)["plans"]
    assert [p["workload"] for p in plans] == ["pretrain-8gpu"]
    decisions = json.loads(out)["decisions"]  # with the priced alternatives, as `plan --job` shows them
    assert [d["workload"] for d in decisions] == ["pretrain-8gpu"] and decisions[0]["options"]


@pytest.mark.parametrize("argv", [
    ["--job", "nope"], ["--job", "train-resnet"], ["--solver", "magic"], ["--driver-rule", "loose"],
    ["--gpus", "2", "--share", "500"],
])
def test_bad_options_exit_2(demo_file, cli, argv):
    code, _, err = cli(["plan", str(demo_file), *argv])
    assert code == 2 and "error" in err


def test_bad_snapshot_exits_2(tmp_path, cli):
    f = tmp_path / "bad.json"
    f.write_text('{"nodes": [{"name": "a", "gpus": -1}]}')
    code, _, err = cli(["plan", str(f)])
    assert code == 2 and "bad.json" in err


def test_demo_shows_the_plan(cli):
    code, out, _ = cli(["demo", "--json"])
    assert code == 0
    d = json.loads(out)
    assert d["plan"]["feasible"] and d["plan"]["moves"]
    code, out, _ = cli(["demo"])
    assert code == 0
    assert "becomes able to host" in out and "after" in out


def test_big_cluster_maps_show_only_the_touched_nodes(tmp_path, cli, pb):
    nodes = [pb.node(f"n{i:02d}") for i in range(40)]
    jobs = [pb.job("j00", 2, "n00", gib=1)] + [pb.job(f"j{i:02d}", 5, f"n{i:02d}", gib=50) for i in range(1, 40)]
    f = tmp_path / "forty.json"
    write_json_atomic(f, {"nodes": nodes, "workloads": jobs, "now": pb.NOW})
    code, out, _ = cli(["plan", str(f), "--gpus", "8"])
    assert code == 0
    text = " ".join(out.split())  # titles may wrap
    assert "the 2 nodes the plan touches, of 40" in text  # j00 (the cheap one) moves to a node with 3 free
    assert "n00" in out and "n39" not in out.split("before")[1]
