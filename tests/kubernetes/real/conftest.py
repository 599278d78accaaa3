"""A real Kubernetes control plane for the session (tools/kubecluster/cluster.sh): built once per machine by
tools/kubecluster/build.sh (scripts/setup.sh all runs it), started here, stopped at the end. Skipped loudly
when it cannot start — unless GPUDEFRAG_REQUIRE_KUBE=1 (CI), which makes that a failure."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from .lab import TOOLS, KubeLab


@pytest.fixture(scope="session")
def kube_lab(tmp_path_factory: pytest.TempPathFactory,
             require: Callable[[str, str], NoReturn]) -> Iterator[KubeLab]:
    d = tmp_path_factory.mktemp("kube")
    # the binaries: built by `scripts/setup.sh all`; here only reused (a build takes many minutes)
    build = subprocess.run([str(TOOLS / "build.sh")], capture_output=True, text=True,
                           env={**os.environ, "GPUDEFRAG_KUBE_NO_BUILD": "1"}, timeout=60)
    if build.returncode != 0:
        why = build.stderr.strip().splitlines()[-1] if build.stderr.strip() else "build.sh failed"
        require("KUBE", f"KUBERNETES CONTROL PLANE CANNOT RUN HERE ({why}); real-cluster tests are SKIPPED")
    p = subprocess.run([str(TOOLS / "cluster.sh"), "start", str(d)], capture_output=True, text=True, timeout=400)
    if p.returncode != 0:
        subprocess.run([str(TOOLS / "cluster.sh"), "stop", str(d)], capture_output=True, timeout=60)
        why = f"cluster.sh start failed: {p.stderr.strip()[-1500:]}"
        require("KUBE", f"KUBERNETES CONTROL PLANE CANNOT RUN HERE ({why}); real-cluster tests are SKIPPED")
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
