"""Two real kubelet nodes (tools/kubenode/node.sh lab-up) beside their own control plane, for this package.

Its own control plane, not the `kube` tests' one: those reset the cluster (every KWOK node, every test
namespace) between tests and count nodes; these nodes must live through the package. Package-scoped, so the
kubelets, containerds and their pods are gone before the next package runs. A part that cannot run here
(the binaries, CRIU, the nodes) is `require("KUBE_NODES", why)`: a failure under GPUDEFRAG_REQUIRE_KUBE_NODES=1
(scripts/test.sh sets it), else a loud skip."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from typing import NoReturn

import pytest

from ..lab import ready, start_lab, stop_lab
from .lab import NODE_SH, NODE_TOOLS, KubeNodes


@pytest.fixture(scope="package")
def kube_nodes(tmp_path_factory: pytest.TempPathFactory,
               require: Callable[[str, str], NoReturn]) -> Iterator[KubeNodes]:
    why = None
    if os.geteuid() != 0:
        why = "not root"
    elif not shutil.which("criu"):
        why = "no criu (scripts/install-criu.sh)"
    else:
        b = subprocess.run([str(NODE_TOOLS / "build.sh")], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "GPUDEFRAG_KUBE_NO_BUILD": "1"})
        if b.returncode != 0:
            why = (b.stderr.strip().splitlines() or ["tools/kubenode/build.sh failed"])[-1]
    if why:
        require("KUBE_NODES", f"REAL KUBERNETES NODES CANNOT RUN HERE ({why}); real-node tests are SKIPPED")
    lab = start_lab(tmp_path_factory.mktemp("kubenodes"), require)
    try:
        p = subprocess.run([str(NODE_SH), "lab-up", str(lab.dir), "2"], capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            require("KUBE_NODES", "REAL KUBERNETES NODES DID NOT COME UP (node.sh lab-up: "
                    f"{p.stderr.strip()[-2000:]}); real-node tests are SKIPPED")
        yield KubeNodes.read(lab)
    finally:
        subprocess.run([str(NODE_SH), "lab-down", str(lab.dir)], capture_output=True, timeout=300)
        stop_lab(lab)


SYSTEM_NAMESPACES = {"default", "kube-system", "kube-public", "kube-node-lease", "gpudefrag", "gpudefrag-node"}


@pytest.fixture(autouse=True)
def _pods_gone_after_each_test(kube_nodes: KubeNodes) -> Iterator[None]:
    """The package's tests share two nodes of 8 GPUs each: what one test left running (a replacement on real-b)
    would keep the next one's pods from fitting. Its pods go, and are gone from the kubelets, before the next.
    Before each test both nodes are Ready and advertise their GPUs again: a test that stopped a kubelet (the
    NotReady target) starts it again, but its device plugin registers a moment later, and a move planned in
    that moment sees a target with 0 GPUs."""
    lab = kube_nodes.lab

    def whole() -> bool:
        got = {n["metadata"]["name"]: n for n in lab.get("nodes")["items"]}
        return all(name in got and ready(got[name]) and
                   int(got[name]["status"].get("allocatable", {}).get("nvidia.com/gpu", "0")) > 0
                   for name in kube_nodes.nodes)

    lab.wait("both real nodes Ready with their GPUs advertised", whole, timeout=180)
    yield
    lab = kube_nodes.lab
    for ns in lab.get("namespaces")["items"]:
        name = ns["metadata"]["name"]
        if name not in SYSTEM_NAMESPACES and not ns["metadata"].get("deletionTimestamp"):
            lab.kubectl("-n", name, "delete", "pods", "--all", "--grace-period=0", "--timeout=120s", check=False,
                        timeout=180)
