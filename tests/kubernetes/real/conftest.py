"""A real Kubernetes control plane for the session (tools/kubecluster/cluster.sh): built once per machine by
tools/kubecluster/build.sh (scripts/setup.sh all runs it), started here, stopped at the end. Skipped loudly
when it cannot start — unless GPUDEFRAG_REQUIRE_KUBE=1 (CI), which makes that a failure."""

from __future__ import annotations

import os
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from .lab import TOOLS, KubeLab


def _unavailable(msg: str) -> None:
    msg = f"KUBERNETES CONTROL PLANE CANNOT RUN HERE ({msg}); real-cluster tests are SKIPPED"
    if os.environ.get("GPUDEFRAG_REQUIRE_KUBE") == "1":
        pytest.fail(msg)
    warnings.warn(msg, stacklevel=1)
    print(f"\n*** {msg} ***")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def kube_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeLab]:
    d = tmp_path_factory.mktemp("kube")
    # the binaries: built by `scripts/setup.sh all`; here only reused (a build takes many minutes)
    build = subprocess.run([str(TOOLS / "build.sh")], capture_output=True, text=True,
                           env={**os.environ, "GPUDEFRAG_KUBE_NO_BUILD": "1"}, timeout=60)
    if build.returncode != 0:
        _unavailable(build.stderr.strip().splitlines()[-1] if build.stderr.strip() else "build.sh failed")
    p = subprocess.run([str(TOOLS / "cluster.sh"), "start", str(d)], capture_output=True, text=True, timeout=400)
    if p.returncode != 0:
        subprocess.run([str(TOOLS / "cluster.sh"), "stop", str(d)], capture_output=True, timeout=60)
        _unavailable(f"cluster.sh start failed: {p.stderr.strip()[-1500:]}")
    lab = KubeLab(d, Path(build.stdout.strip()))
    try:
        yield lab
    finally:
        subprocess.run([str(TOOLS / "cluster.sh"), "stop", str(d)], capture_output=True, timeout=60)


@pytest.fixture
def kube(kube_lab: KubeLab) -> Iterator[KubeLab]:
    """The control plane, emptied of the previous test's nodes and namespaces."""
    kube_lab.reset()
    yield kube_lab
