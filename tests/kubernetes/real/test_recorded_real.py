"""The quota fixtures say what the real control plane says (issue 31): each situation is built again in the
real cluster and its recording must agree with the stored file in every fact the diagnosis reads — the quota's
hard and used, the pods, the owners and their refusals — and the diagnosis of both must be the same. A fixture
edited by hand into another meaning of `used` fails here; `python -m tests.kubernetes.real.record` records
tests/kubernetes/fixtures/quota.json again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .lab import KubeLab
from .record import FIXTURES, SCENARIOS, build_quota, build_quota_blocked, gist, recording

pytestmark = pytest.mark.kube


def causes(cli: Any, path: Path) -> dict[str, list[str]]:
    code, out, err = cli("kube", "diagnose", str(path), "--json")
    assert code == 0, err
    return {d["workload"]: [c["code"] for c in d["causes"]] for d in json.loads(out)["diagnoses"]}


def test_the_quota_fixture_is_what_the_real_cluster_records(kube: KubeLab, cli: Any, tmp_path: Path) -> None:
    stored = FIXTURES / "quota.json"
    fresh = recording(kube, build_quota(kube))
    assert gist(fresh) == gist(json.loads(stored.read_text()))
    (tmp_path / "fresh.json").write_text(json.dumps(fresh))
    got = causes(cli, tmp_path / "fresh.json")
    assert got == causes(cli, stored) and got["team-a/job/train-big"][0] == "quota-exceeded", got


def test_the_quota_blocked_scenario_is_what_the_real_cluster_records(kube: KubeLab) -> None:
    """The scenario's cluster is larger (the doors' shared fragmented layout); its quota part — team-a's quota,
    the ReplicaSet and the refusal — is compared with the real one."""
    ns = build_quota_blocked(kube)
    stored = json.loads((SCENARIOS / "quota-blocked.kube.json").read_text())
    fresh, want = gist(recording(kube, ns), ns), gist(stored, ns)
    fresh.pop("nodes"), want.pop("nodes")
    assert fresh == want
