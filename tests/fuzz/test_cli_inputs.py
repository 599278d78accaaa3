"""Through the real console script: a representative subset of hostile inputs, one per reader and command.
Each ends in one line naming the file, exit 2, no traceback, within the time limit and a 3 GiB address space."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from .conftest import (
    NODES_CSV,
    PODS_CSV,
    assert_one_line_error,
    cost_doc,
    dump_doc,
    policy_doc,
    run_cli,
    snapshot_doc,
    special_files,
    with_token,
)

pytestmark = pytest.mark.timeout(180)

DEEP = "[" * 100_000 + "]" * 100_000


def _snapshot_with(tmp: Path, name: str, mutate) -> Path:  # type: ignore[no-untyped-def]
    doc = snapshot_doc()
    mutate(doc)
    f = tmp / name
    f.write_text(json.dumps(doc))
    return f


@pytest.mark.parametrize("command", [["snapshot", "validate"], ["frag"], ["diagnose"], ["plan"], ["plan", "--json"]])
@pytest.mark.parametrize(("case", "mutate", "words"), [
    ("cpu-10e30", lambda d: d["nodes"][0].__setitem__("cpu_milli", 10**30), "nodes[0].cpu_milli"),
    ("now-1e308", lambda d: d.__setitem__("now", 1e308), "now"),
    ("end-infinity", lambda d: d["workloads"][0].__setitem__("expected_end_at", float("inf")),
     "workloads[0].expected_end_at"),
])
def test_out_of_range_snapshot_numbers(command: list[str], case: str, mutate, words: str,  # type: ignore[no-untyped-def]
                                       tmp_path: Path) -> None:
    """Before issue 15: OverflowError tracebacks (cpu_milli), or accepted, and `plan --json` printed Infinity."""
    f = _snapshot_with(tmp_path, f"{case}.json", mutate)
    p = run_cli(*command, f, cwd=tmp_path)
    assert_one_line_error(p, f.name)
    assert words in p.stderr


@pytest.mark.parametrize(("name", "text", "words"), [
    ("deep.json", DEEP, "nested too deeply"),
    ("deep.yaml", DEEP, "nested deeper than 100"),
    ("dup.json", json.dumps(snapshot_doc())[:-1] + ', "now": 5}', "now: duplicate key"),
    ("nan.json", with_token(snapshot_doc(), ("now",), "NaN"), "now: NaN is not a number"),
    ("big.json", with_token(snapshot_doc(), ("nodes", 0, "gpus"), "9" * 5000), "nodes[0].gpus"),
    ("utf8.json", "{\"name\": \"\xff\"}", "UTF-8"),
])
def test_hostile_snapshot_documents(name: str, text: str, words: str, tmp_path: Path) -> None:
    f = tmp_path / name
    f.write_bytes(text.encode("latin-1") if name == "utf8.json" else text.encode())
    for command in (["snapshot", "validate"], ["diagnose"]):
        p = run_cli(*command, f, cwd=tmp_path)
        assert_one_line_error(p, name)
        assert words in p.stderr, p.stderr


@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link", "directory"])
def test_special_files_to_every_command(kind: str, tmp_path: Path) -> None:
    """A FIFO hung every reader; /dev/zero behind a link read until memory ran out."""
    f = special_files(tmp_path)[kind]
    (tmp_path / "n.csv").write_text(NODES_CSV)
    good_snapshot = tmp_path / "good.json"
    good_snapshot.write_text(json.dumps(snapshot_doc()))
    for args in (["snapshot", "validate", f], ["frag", f], ["diagnose", f], ["kube", "diagnose", f],
                 ["plan", good_snapshot, "--costs", f],
                 ["simulate", "static", "--pods", f, "--nodes", tmp_path / "n.csv", "--out", tmp_path / "out"],
                 ["serve", "--check", "--snapshot", f],
                 ["serve", "--check", "--snapshot", good_snapshot, "--enable-actions", "--token-file", f],
                 ["controller", "--policy", f, "--engine", "sim", "--snapshot", good_snapshot, "--once"]):
        p = run_cli(*args, cwd=tmp_path, timeout=60)
        assert_one_line_error(p, f.name)
        if kind == "directory" and args[0] in ("kube", "diagnose"):
            assert "folder holds no" in p.stderr  # to these a folder is a dump folder (kubectl get -o json > dir/)
            continue
        assert "not a regular file" in p.stderr, (args, p.stderr)


def test_hostile_dump_policy_csv_and_cost_file(tmp_path: Path) -> None:
    dump = dump_doc()
    node = next(i for i in dump["items"] if i["kind"] == "Node")
    node["status"]["allocatable"]["nvidia.com/gpu"] = "9" * 5000
    (tmp_path / "dump.json").write_text(json.dumps(dump))
    pol = policy_doc()
    pol.setdefault("filter", {})["max_priority"] = "__X__"
    (tmp_path / "pol.yaml").write_text(yaml.safe_dump(pol).replace("'__X__'", "9" * 5000))
    pol["filter"]["max_priority"] = 1
    pol["filter"]["max_checkpoint_size"] = "9" * 500 + "GiB"
    (tmp_path / "size.yaml").write_text(yaml.safe_dump(pol))
    (tmp_path / "pods.csv").write_text(PODS_CSV.replace("p1,8000", "p1," + "9" * 5000))
    (tmp_path / "nodes.csv").write_text(NODES_CSV)
    (tmp_path / "costs.json").write_text(with_token(cost_doc(), ("checkpoint_gbps",), "1e999"))
    snap = tmp_path / "good.json"
    snap.write_text(json.dumps(snapshot_doc()))
    cases = [
        (["diagnose", "dump.json"], "dump.json", 'items[0].status.allocatable["nvidia.com/gpu"]'),
        (["kube", "diagnose", "dump.json"], "dump.json", "out of range"),
        (["controller", "--policy", "pol.yaml", "--engine", "sim", "--snapshot", snap, "--once", "--dry-run"],
         "pol.yaml", "filter.max_priority"),
        (["controller", "--policy", "size.yaml", "--engine", "sim", "--snapshot", snap, "--once", "--dry-run"],
         "size.yaml", "filter.max_checkpoint_size"),
        (["simulate", "static", "--pods", "pods.csv", "--nodes", "nodes.csv", "--out", tmp_path / "out"], "pods.csv",
         "cpu_milli"),
        (["plan", snap, "--costs", "costs.json"], "costs.json", "checkpoint_gbps"),
    ]
    for args, name, words in cases:
        p = run_cli(*args, cwd=tmp_path)
        assert_one_line_error(p, name)
        assert words in p.stderr, (args, p.stderr)
