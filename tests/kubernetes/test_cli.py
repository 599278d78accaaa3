"""`gpudefrag kube diagnose|snapshot|plan` and `gpudefrag diagnose DUMP` end to end, in-process."""

from __future__ import annotations

import json
from pathlib import Path

from gpudefrag.snapshot import load_snapshot

FIXTURES = Path(__file__).parent / "fixtures"
FRAG = str(FIXTURES / "fragmentation.json")


def test_kube_diagnose_json(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli("kube", "diagnose", str(FIXTURES / "taint.json"), "--json")
    assert code == 0
    d = json.loads(out)["diagnoses"][0]
    assert d["workload"] == "ml/train-8g" and d["causes"][0]["code"] == "taints-or-selectors"
    assert d["kubernetes"]["agreement"] == "agrees"
    assert d["kubernetes"]["scheduler_reasons"][1]["nodes"] == 2


def test_kube_diagnose_text(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli("kube", "diagnose", str(FIXTURES / "quota.json"))
    assert code == 0 and "quota-exceeded" in out and "owner Job/train-big" in out


def test_core_diagnose_reads_dumps_files_and_folders(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli("diagnose", str(FIXTURES / "mig-mixed.json"), "--json")
    assert code == 0 and json.loads(out)["diagnoses"][0]["causes"][0]["code"] == "mig-mixed"
    (tmp_path / "all.json").write_text((FIXTURES / "oversize.json").read_text())
    code, out, _ = cli("diagnose", str(tmp_path), "--json")
    assert code == 0 and json.loads(out)["diagnoses"][0]["causes"][0]["code"] == "request-too-large"


def test_core_diagnose_still_reads_snapshots(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    snap = tmp_path / "snap.json"
    code, _, _ = cli("kube", "snapshot", FRAG, "--out", str(snap))
    assert code == 0
    s = load_snapshot(snap)
    assert len(s.nodes) == 4 and [w.id for w in s.pending] == ["ml/train-8g"]
    code, out, _ = cli("diagnose", str(snap), "--json")
    assert code == 0 and json.loads(out)["diagnoses"][0]["causes"][0]["code"] == "fragmentation"


def test_kube_plan_uses_the_planner_and_only_movable_pods(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli("kube", "plan", FRAG, "--json", "--dry-run")
    assert code == 0, out
    d = json.loads(out)
    assert d["plan"]["feasible"]
    moved = {m["workload"] for m in d["moves"]}
    assert moved and not moved & {"ml/finetune-0", "ml/train-small-q8x2z"}  # StatefulSet / Job never planned
    assert all(m["ops"][-1]["op"] == "wait-deleted" for m in d["moves"])
    assert all(r["ok"] for r in d["dry_run"])


def test_kube_plan_explicit_refused_move_exits_1(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli("kube", "plan", FRAG, "--move", "ml/finetune-0=gpu-node-3")
    assert code == 1 and "refused" in out and "StatefulSet" in out


def test_kube_plan_with_policy(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The deployment's policy ConfigMap drives the planner: its filter and its disruption budget."""
    import yaml

    cm = yaml.safe_load((Path(__file__).parents[2] / "deploy/kubernetes/configmap.yaml").read_text())
    pol = tmp_path / "policy.yaml"
    pol.write_text(cm["data"]["policy.yaml"])
    code, out, _ = cli("kube", "plan", FRAG, "--policy", str(pol), "--json")
    assert code == 0 and len(json.loads(out)["moves"]) == 2
    tight = tmp_path / "tight.yaml"
    tight.write_text(cm["data"]["policy.yaml"].replace("max_moves_per_plan: 4", "max_moves_per_plan: 1"))
    code, out, _ = cli("kube", "plan", FRAG, "--policy", str(tight), "--json")
    d = json.loads(out)
    assert code == 1 and not d["plan"]["feasible"] and d["moves"] == []


def test_bad_dump_is_one_line_exit_2(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(Path(FRAG).read_text())
    doc["items"][2]["status"]["capacity"]["nvidia.com/gpu"] = "eight"
    f = tmp_path / "dump.json"
    f.write_text(json.dumps(doc))
    for argv in (("kube", "diagnose", str(f)), ("diagnose", str(f)), ("kube", "plan", str(f))):
        code, out, err = cli(*argv)
        assert code == 2 and out == ""
        assert err.strip().count("\n") == 0
        assert 'items[2].status.capacity["nvidia.com/gpu"]' in err and str(f) in err


def test_no_source_is_exit_2(cli) -> None:  # type: ignore[no-untyped-def]
    code, _, err = cli("kube", "diagnose")
    assert code == 2 and "--kube" in err


def test_live_without_kubeconfig_is_exit_2(cli, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, _, err = cli("diagnose", "--kube", "--context", "nowhere")
    assert code == 2 and "kubeconfig" in err


def test_kube_plan_text_names_the_pod_the_node_and_the_dry_run_steps(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli("kube", "plan", FRAG, "--dry-run")
    assert code == 0
    text = " ".join(out.split())
    assert "plan for ml/train-8g (8 GPU): 2 move(s) free gpu-node-3" in text, text
    # the dry run's steps, as --json gives them, without --json
    assert "dry run ml/batch-infer-1: ok" in text and "create-replacement ok batch-infer-1-mv-" in text, text
    assert "evict-original ok batch-infer-1 evicted" in text


def test_kube_plan_does_not_call_a_recreate_move_a_restore(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(Path(FRAG).read_text())
    for it in doc["items"]:
        if it["kind"] == "Pod" and it["metadata"]["name"].startswith("batch-infer"):
            it["metadata"].setdefault("annotations", {})["gpudefrag.io/move"] = "recreate"
    f = tmp_path / "dump.json"
    f.write_text(json.dumps(doc))
    code, out, _ = cli("kube", "plan", str(f), "--json")
    assert code == 0
    details = [o["detail"] for m in json.loads(out)["moves"] for o in m["ops"] if o["op"] == "create-replacement"]
    assert details and all("started fresh" in d and "checkpoint" not in d for d in details), details
