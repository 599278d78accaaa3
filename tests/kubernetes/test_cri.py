"""The node agent's CRI client (engines/kubernetes/cri.py) against a real containerd — the one the real-node lab
runs (tools/kubenode/build.sh, cached), started here alone on a socket of its own: the gRPC call it hand-builds
is understood (Version answers), a gRPC error is told from an answer (ExecSync in no container), and a socket
with nobody behind it is said so. The ExecSync that signals a running container is the real-node app-hook test's
(tests/kubernetes/real/nodes/test_app_hook_nodes.py)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from gpudefrag.engines.kubernetes.cri import CriError, Runtime

REPO = Path(__file__).parents[2]


@pytest.fixture
def containerd(tmp_path: Path, require: Callable[[str, str], NoReturn]) -> Iterator[Runtime]:
    b = subprocess.run([str(REPO / "tools/kubenode/build.sh")], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "GPUDEFRAG_KUBE_NO_BUILD": "1"})
    if os.geteuid() != 0 or b.returncode != 0:
        require("KUBE_NODES", "CONTAINERD CANNOT RUN HERE (" + ("not root" if os.geteuid() != 0 else
                (b.stderr.strip().splitlines() or ["tools/kubenode/build.sh failed"])[-1]) + "); SKIPPED")
    sock = tmp_path / "c.sock"
    (tmp_path / "config.toml").write_text(f"""version = 3
root = "{tmp_path}/root"
state = "{tmp_path}/state"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins]
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.internal.v1.opt']
    path = "{tmp_path}/opt"
""")
    with open(tmp_path / "containerd.log", "wb") as log:
        p = subprocess.Popen([f"{b.stdout.strip()}/containerd", "--config", str(tmp_path / "config.toml")],
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 30
        while not sock.exists():
            assert p.poll() is None and time.monotonic() < end, (tmp_path / "containerd.log").read_text()[-2000:]
            time.sleep(0.1)
        yield Runtime(f"unix://{sock}")
    finally:
        p.terminate()
        p.wait(timeout=30)


def test_the_hand_built_grpc_call_reaches_containerds_cri(containerd: Runtime, tmp_path: Path) -> None:
    assert containerd.version() == "containerd v2.2.9 (CRI v1)"
    with pytest.raises(CriError, match="refused ExecSync in no-such-cont"):
        containerd.exec_sync("no-such-container", ["kill", "-USR1", "1"], timeout_s=5)
    # containerd got the very call (container id and all) and said why it refused it
    assert 'ExecSync for \\"no-such-container\\" failed' in (tmp_path / "containerd.log").read_text()


def test_a_socket_with_nobody_behind_it_is_said_so(tmp_path: Path) -> None:
    with pytest.raises(CriError, match=r"container runtime at unix://.*/none.sock unreachable"):
        Runtime(f"unix://{tmp_path}/none.sock").version()
