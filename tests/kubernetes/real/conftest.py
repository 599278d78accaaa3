"""A real Kubernetes control plane for the session (tools/kubecluster/cluster.sh): built once per machine by
tools/kubecluster/build.sh (scripts/setup.sh all runs it), started here, stopped at the end. Skipped loudly
when it cannot start — unless GPUDEFRAG_REQUIRE_KUBE=1 (CI), which makes that a failure."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NoReturn

import pytest

from .lab import KubeLab, start_lab, stop_lab


@pytest.fixture(scope="session")
def kube_lab(tmp_path_factory: pytest.TempPathFactory,
             require: Callable[[str, str], NoReturn]) -> Iterator[KubeLab]:
    lab = start_lab(tmp_path_factory.mktemp("kube"), require)
    try:
        yield lab
    finally:
        stop_lab(lab)


@pytest.fixture
def kube(kube_lab: KubeLab) -> Iterator[KubeLab]:
    """The control plane, emptied of the previous test's nodes and namespaces."""
    kube_lab.reset()
    yield kube_lab
