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
def cli(capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """Run the real CLI in-process: (exit code, stdout, stderr)."""
    from gpudefrag.cli.main import run

    def call(*argv: str) -> tuple[int, str, str]:
        try:
            run(list(argv))
            code = 0
        except SystemExit as e:
            code = int(e.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return call
