"""The node agent's CRI client (engines/kubernetes/cri.py) against a real containerd — the one the real-node lab
runs (tools/kubenode/build.sh, cached), started here alone on a socket of its own: the gRPC call (grpcio, with
the messages made from their descriptors) is understood (Version answers), a gRPC error is told from an answer
and carries the runtime's own reason (ExecSync in no container), and a socket with nobody behind it is said so.
The ExecSync that signals a running container is the real-node app-hook test's
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


def test_the_grpc_call_reaches_containerds_cri(containerd: Runtime, tmp_path: Path) -> None:
    assert containerd.version() == "containerd v2.2.9 (CRI v1)"
    with pytest.raises(CriError, match=r"refused ExecSync in no-such-cont: NOT_FOUND: .*no-such-container") as e:
        containerd.exec_sync("no-such-container", ["kill", "-USR1", "1"], timeout_s=5)
    print(e.value)
    # containerd got the very call (container id and all) and said why it refused it
    assert 'ExecSync for \\"no-such-container\\" failed' in (tmp_path / "containerd.log").read_text()


def test_a_socket_with_nobody_behind_it_is_said_so(tmp_path: Path) -> None:
    with pytest.raises(CriError, match=r"container runtime at unix://.*/none.sock unreachable"):
        Runtime(f"unix://{tmp_path}/none.sock").version()


def test_the_agent_runs_the_hook_only_for_a_running_container_of_a_pod_that_opted_in(containerd: Runtime) -> None:
    """Every refusal comes before the runtime is called, with its reason; an allowed request reaches the runtime
    (this containerd has no such container, so it refuses, and the agent says so)."""
    from gpudefrag.control.node_agent import AgentError, NodeAgent

    agent = NodeAgent(core=None, node="real-a", kubelet=None, registry=None, key=b"", runtime=containerd)  # type: ignore[arg-type]

    def pod(annotations: dict[str, str], running: bool = True) -> dict:  # type: ignore[type-arg]
        status = {"name": "main", "containerID": "containerd://abc123", "state": {"running": {}} if running else {
            "terminated": {"exitCode": 0}}}
        return {"metadata": {"namespace": "ml", "name": "p", "annotations": annotations},
                "spec": {"nodeName": "real-a", "containers": [{"name": "main"}]},
                "status": {"containerStatuses": [status]}}

    app = {"gpudefrag.io/checkpoint": "app"}
    for p, hook, why in [
        (pod({}), {"container": "main", "signal": "USR1"}, "pod ml/p did not opt in to the application hook"),
        (pod({"gpudefrag.io/checkpoint": "kubelet"}), {"container": "main", "signal": "USR1"}, "did not opt in"),
        (pod(app), {"container": "main", "signal": "KILL"}, "signal 'KILL' is not a hook signal (USR1, USR2)"),
        (pod(app), {"container": "sidecar", "signal": "USR1"}, "container 'sidecar' is not one of pod ml/p's"),
        (pod(app), ["main", "USR1"], "the hook request is not an object"),
        (pod(app, running=False), {"container": "main", "signal": "USR1"}, "container main of pod ml/p is not running"),
        (pod(app), {"container": "main", "signal": "USR1"}, "the container runtime refused ExecSync in abc123"),
    ]:
        with pytest.raises(AgentError) as e:
            agent._hook(p, hook)
        assert why in str(e.value), (hook, str(e.value))
