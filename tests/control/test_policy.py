"""Policy files: the examples load, each malformed field is one error naming it (exit 2 from the CLI, the
controller never starts), arbitrary input never crashes the loader, and the filter means what it says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudefrag.core.model import Placement, Request, Workload
from gpudefrag.errors import InputError
from gpudefrag.policy import Filter, Heartbeat, Policy, Trigger, load_policy, parse_policy, parse_size

EXAMPLES = Path(__file__).parents[2] / "examples" / "policies"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_load(path: Path) -> None:
    assert isinstance(load_policy(path), Policy)


@pytest.mark.parametrize(("doc", "where", "words"), [
    ({"filter": {"max_gpus": 0}}, "filter.max_gpus", "greater than"),
    ({"filter": {"max_checkpoint_size": "lots"}}, "filter.max_checkpoint_size", "not a size"),
    ({"trigger": {"cron": "every day"}}, "trigger.cron", "cron"),
    ({"trigger": {"pending": {"longer_than_s": -1}}}, "trigger.pending.longer_than_s", "greater than"),
    ({"trigger": {"fragmentation_above": 1.5}}, "trigger.fragmentation_above", "less than"),
    ({"action": {"kind": "evict"}}, "action.kind", "migrate"),
    ({"action": {"heartbeat": {"every_s": 60, "cron": "* * * * *"}}}, "action.heartbeat", "not both"),
    ({"budgets": {"max_concurrent": 0}}, "budgets.max_concurrent", "greater than"),
    ({"budgets": {"max_concurent": 2}}, "budgets.max_concurent", "unknown field"),
    ({"filters": {}}, "filters", "unknown field"),
])
def test_malformed_field_is_named(tmp_path: Path, doc: dict, where: str, words: str) -> None:  # type: ignore[type-arg]
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError) as e:
        load_policy(f)
    assert e.value.source == str(f) and e.value.where == where and words in e.value.message


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("trigger:\n  pending: {longer_than_s: 5\nfilter: [\n")
    with pytest.raises(InputError) as e:
        load_policy(f)
    assert e.value.where.startswith("line ")


def test_cli_malformed_policy_exits_2_and_starts_nothing(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("budgets:\n  max_per_node: -1\n")
    journal = tmp_path / "j.db"
    p = subprocess.run([sys.executable, "-m", "gpudefrag.cli.main", "controller", "--engine", "slurm",
                        "--policy", str(f), "--journal", str(journal)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert str(f) in p.stderr and "budgets.max_per_node" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not journal.exists()


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True),
                      st.text(max_size=8))
json_doc = st.recursive(json_leaf, lambda c: st.one_of(st.lists(c, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), c, max_size=3)),
                        max_leaves=12)
keys = st.sampled_from(["trigger", "filter", "action", "budgets", "name", "pending", "cron", "max_gpus",
                        "labels", "kind", "heartbeat", "every_s", "max_concurrent"])


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_doc, st.dictionaries(keys, json_doc, max_size=4)))
def test_any_document_is_a_policy_or_one_input_error(doc: object) -> None:
    try:
        p = parse_policy(doc, "x.yaml")
    except InputError as e:
        assert e.source == "x.yaml" and e.message
    else:
        assert isinstance(p, Policy)


@settings(max_examples=100, deadline=None)
@given(max_gpus=st.integers(1, 16), users=st.lists(st.sampled_from(["ann", "bob", "cy"]), max_size=2),
       size=st.integers(0, 2**40), every=st.floats(1, 10**5))
def test_valid_policies_roundtrip_through_yaml(tmp_path_factory, max_gpus: int, users: list[str],  # type: ignore[no-untyped-def]
                                               size: int, every: float) -> None:
    doc = {"filter": {"max_gpus": max_gpus, "users": users, "max_checkpoint_size": size},
           "action": {"heartbeat": {"every_s": every}}}
    f = tmp_path_factory.mktemp("p") / "p.yaml"
    f.write_text(yaml.safe_dump(doc))
    p = load_policy(f)
    assert p.filter.max_gpus == max_gpus and p.filter.users == users and p.filter.max_checkpoint_size == size
    assert p.action.heartbeat is not None and p.action.heartbeat.every_s == every


def _w(**kw: object) -> Workload:
    base: dict[str, object] = {"id": "1", "request": Request(2, partition="gpu"), "name": "train-x", "user": "ann",
                               "namespace": "nlp", "priority": 10, "labels": {"slurm.comment": "team=nlp"},
                               "placements": (Placement("n1", (0, 1)),), "checkpoint_bytes": 10 << 30}
    base.update(kw)
    return Workload(**base)  # type: ignore[arg-type]


def test_filter_fields() -> None:
    w = _w()
    assert Filter().matches(w)
    assert Filter(partitions=["gpu"], users=["ann"], accounts=["nlp"], names=["train-*"],
                  comments=["team=*"], max_priority=10, max_gpus=2, max_checkpoint_size=parse_size("10GiB")).matches(w)
    assert not Filter(partitions=["cpu"]).matches(w)
    assert not Filter(users=["bob"]).matches(w)
    assert not Filter(accounts=["cv"]).matches(w)
    assert not Filter(names=["eval-*"]).matches(w)
    assert not Filter(comments=["team=cv"]).matches(w)
    assert not Filter(labels={"gpudefrag": "movable"}).matches(w)
    assert Filter(labels={"gpudefrag": "movable"}).matches(_w(labels={"gpudefrag": "movable"}))
    assert not Filter(exclude_labels={"slurm.comment": "team=nlp"}).matches(w)
    assert not Filter(max_priority=9).matches(w)
    assert not Filter(max_gpus=1).matches(w)
    assert not Filter(max_checkpoint_size=parse_size("9GiB")).matches(w)
    two_nodes = _w(request=Request(1, node_count=2), placements=(Placement("a", (0,)), Placement("b", (0,))))
    assert not Filter().matches(two_nodes)


def test_sizes_and_schedules() -> None:
    assert parse_size("64GiB") == 64 << 30 and parse_size("500MB") == 500_000_000 and parse_size(7) == 7
    with pytest.raises(ValueError):
        parse_size("-1GB")
    hb = Heartbeat(every_s=60)
    assert not hb.due(None, 30, started=0) and hb.due(None, 60, started=0) and not hb.due(100, 150, started=0)
    t = Trigger(cron="*/5 * * * *")
    assert not t.cron_due(None, 1000.0)  # the first look only arms it
    assert t.cron_due(0.0, 301.0) and not t.cron_due(0.0, 299.0)
    assert not t.cron_due(600.0, 601.0)
