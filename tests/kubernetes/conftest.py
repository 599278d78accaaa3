"""Fixtures for the Kubernetes tests: the recorded-shape dumps in fixtures/ (see fixtures/make_fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudefrag.engines.kubernetes import KubeCluster, load_dump

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def frag_cluster() -> KubeCluster:
    return load_dump(FIXTURES / "fragmentation.json")


@pytest.fixture
def cli(cli):  # type: ignore[no-untyped-def]
    """The suite's in-process CLI runner (tests/conftest.py), called with the arguments spread: cli("kube", ...)."""
    return lambda *argv: cli(list(argv))
