"""The core commands end to end (in-process through the real Typer app)."""

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


def test_frag_json(demo_file, cli):
    code, out, _ = cli(["frag", str(demo_file), "--gpus", "8", "--json"])
    assert code == 0
    d = json.loads(out)
    assert d["free_gpus"] == 12 and d["stranded_gpus"] == 12 and d["whole_free_nodes"] == 0
    assert d["largest_placeable"] == 3 and d["free_gpus_per_node_histogram"] == {"3": 4}


def test_frag_text(demo_file, cli):
    code, out, _ = cli(["frag", str(demo_file), "--gpus", "3"])
    assert code == 0 and "fits on 4 node(s)" in out and "stranded for it" in out


def test_diagnose_json_and_job_filter(demo_file, cli):
    code, out, _ = cli(["diagnose", str(demo_file), "--job", "pretrain-8gpu", "--json"])
    assert code == 0
    (d,) = json.loads(out)["diagnoses"]
    assert d["workload"] == "pretrain-8gpu" and [c["code"] for c in d["causes"]] == ["fragmentation"]


def test_diagnose_unknown_or_running_job(demo_file, cli):
    code, _, err = cli(["diagnose", str(demo_file), "--job", "nope"])
    assert code == 2 and "no workload with id 'nope'" in err
    code, _, err = cli(["diagnose", str(demo_file), "--job", "rl-agent"])
    assert code == 2 and "running, not pending" in err


def test_demo_runs_offline(cli):
    code, out, _ = cli(["demo"])
    assert code == 0
    for name in ("gpu-node-a", "gpu-node-d", "pretrain-8gpu", "fragmentation"):
        assert name in out


def test_demo_json(cli):
    code, out, _ = cli(["demo", "--json"])
    assert code == 0
    d = json.loads(out)
    assert d["diagnosis"]["causes"][0]["code"] == "fragmentation"
