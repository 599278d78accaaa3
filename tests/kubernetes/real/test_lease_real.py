"""One controller per cluster on Kubernetes: leader election through a real `coordination.k8s.io/v1` Lease on
the test control plane. Two controllers on one cluster drove migrations twice or left them mid-way (their
journals on separate volumes cannot see each other's lock); the second now refuses with one line naming the
holder, takes over only when the holder gave the Lease back or stopped renewing it, and a holder that lost it
stops before acting again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpudefrag.engines.kubernetes.lease import LeaderLease, LeaseHeld

from .lab import REPO, KubeLab, gpu_node
from .test_move_real import POLICY, controller

pytestmark = pytest.mark.kube

NAME = "gpudefrag-controller"


def holder(kube: KubeLab) -> str | None:
    r = kube.kubectl("-n", "default", "get", "lease", NAME, "-o", "json", check=False)
    return json.loads(r.stdout)["spec"].get("holderIdentity") if r.returncode == 0 else None


def test_a_second_controller_refuses_while_the_lease_is_held_and_takes_over_when_it_is_free(
        kube: KubeLab, tmp_path: Path) -> None:
    kube.nodes(gpu_node("gpu-node-0"))
    first = LeaderLease(kube.client(), "default", identity="first-controller", duration_s=30)
    first.acquire()
    p = controller(kube, tmp_path, timeout=120)  # `controller --once`: a second controller on the same cluster
    assert p.returncode == 1, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "another controller is running" in lines[0] and "first-controller" in lines[0], lines
    assert not (tmp_path / "journal.db").exists()  # refused before it opened its journal or touched the cluster
    first.renew()  # still the leader
    first.release()  # a clean stop gives it back
    p = controller(kube, tmp_path, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert holder(kube) is None  # and that controller gave it back when it stopped


def test_an_expired_lease_is_taken_over_and_its_old_holder_stops(kube: KubeLab) -> None:
    api = kube.client()
    stale = LeaderLease(api, "default", identity="stale-controller", duration_s=1)
    stale.acquire()
    time.sleep(2.5)  # it stopped renewing (hung, partitioned)
    newer = LeaderLease(api, "default", identity="new-controller", duration_s=30)
    newer.acquire()
    with pytest.raises(LeaseHeld, match="lost to new-controller"):
        stale.renew()  # the old holder stops before it acts again
    racer = LeaderLease(api, "default", identity="racer", duration_s=30)
    with pytest.raises(LeaseHeld, match="new-controller"):
        racer.acquire()
    newer.release()
    # two controllers racing for a free Lease: the compare-and-swap on resourceVersion lets exactly one win
    a = LeaderLease(api, "default", identity="a", duration_s=30)
    b = LeaderLease(api, "default", identity="b", duration_s=30)
    doc_before = a._read()
    a.acquire()
    b._read = lambda: doc_before  # type: ignore[method-assign]  # b decided on what it read before a wrote
    with pytest.raises(LeaseHeld, match="took it first"):
        b.acquire()
    a.release()


def _long_running(kube: KubeLab, tmp_path: Path) -> subprocess.Popen[str]:
    """`gpudefrag controller` without --once, on a one-node cluster."""
    kube.nodes(gpu_node("gpu-node-0"))
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    env = {**kube.env, "PYTHONPATH": str(REPO / "src")}
    return subprocess.Popen([sys.executable, "-m", "gpudefrag.cli.main", "controller", "--policy", str(policy),
                             "--engine", "kubernetes", "--interval", "0.5", "--journal",
                             str(tmp_path / "journal.db")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_a_controller_stopped_with_sigterm_gives_its_lease_back(kube: KubeLab, tmp_path: Path) -> None:
    """The Deployment stops its pod with SIGTERM: the Lease is given back, so the next controller need not wait
    out its 60 s."""
    p = _long_running(kube, tmp_path)
    try:
        kube.wait("the controller to take the Lease", lambda: holder(kube), timeout=60)
        p.send_signal(signal.SIGTERM)  # at once: while it may still be setting up
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + signal.SIGTERM, err
    assert holder(kube) is None, err


def test_a_running_controller_that_loses_its_lease_stops_with_one_line(kube: KubeLab, tmp_path: Path) -> None:
    """A long-running controller (no --once) holds the Lease while it cycles; when somebody else holds it (an
    operator's takeover, a controller that judged it expired), it stops before its next cycle, one line."""
    p = _long_running(kube, tmp_path)
    try:
        mine = kube.wait("the controller to take the Lease", lambda: holder(kube), timeout=60)
        assert mine.startswith(f"{os.uname().nodename}:") and mine.endswith("journal.db"), mine
        assert p.poll() is None
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        kube.kubectl("-n", "default", "patch", "lease", NAME, "--type=merge", "-p",
                     json.dumps({"spec": {"holderIdentity": "thief", "renewTime": now}}))
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 1, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "lost to thief" in lines[0], lines
    assert holder(kube) == "thief"  # it did not give away what was no longer its own
