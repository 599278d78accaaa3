"""The compatibility gate: exact GPU model, driver/CUDA per rule, mismatches named."""

from __future__ import annotations

import pytest

from gpudefrag.core.compat import CompatRule, VersionMatch, check, describe, version_ok
from gpudefrag.core.model import Node, Versions

REC = Versions(gpu_model="H100", gpu_count=4, driver="550.54.15", cuda="12.4", cpu_arch="x86_64")


def nd(**kw) -> Node:
    base = {"name": "n1", "gpu_count": 8, "gpu_model": "H100", "driver_version": "550.54.15",
            "cuda_version": "12.4", "cpu_arch": "x86_64"}
    return Node(**{**base, **kw})


def test_identical_stack_is_compatible():
    assert check(REC, nd()) == []


@pytest.mark.parametrize(("field", "kw"), [
    ("gpu_model", {"gpu_model": "A100"}),
    ("driver", {"driver_version": "550.54.14"}),
    ("cuda", {"cuda_version": "12.2"}),
    ("cpu_arch", {"cpu_arch": "aarch64"}),
    ("gpu_count", {"gpu_count": 2}),
])
def test_each_mismatch_is_named(field, kw):
    assert check(REC, nd(**kw)) == [field]
    assert describe(REC, nd(**kw))[0].startswith(f"{field}:")


def test_driver_rule_is_configurable():
    node = nd(driver_version="550.90.07")
    assert check(REC, node) == ["driver"]
    assert check(REC, node, CompatRule(driver=VersionMatch.MAJOR)) == []
    assert check(REC, node, CompatRule(driver=VersionMatch.MINOR)) == ["driver"]
    assert check(REC, nd(driver_version="560.1"), CompatRule(driver=VersionMatch.AT_LEAST)) == []
    assert check(REC, nd(driver_version="535.1"), CompatRule(driver=VersionMatch.AT_LEAST)) == ["driver"]


def test_unknown_node_versions_pass_unless_strict():
    node = nd(driver_version=None)
    assert check(REC, node) == []
    assert check(REC, node, CompatRule(strict=True)) == ["driver"]


@pytest.mark.parametrize(("rec", "offered", "match", "ok"), [
    ("12.4", "12.4.1", VersionMatch.MINOR, True),
    ("12.4", "12.10", VersionMatch.AT_LEAST, True),
    ("12.10", "12.4", VersionMatch.AT_LEAST, False),
    ("12.4", "11.8", VersionMatch.ANY, True),
])
def test_version_rules(rec, offered, match, ok):
    assert version_ok(rec, offered, match) is ok
