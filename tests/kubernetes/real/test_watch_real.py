"""The controller's watch cache against the real API server: after one list it follows pods created, bound and
deleted, a node going NotReady, an expired resourceVersion (the real 410 Gone) and an API server restart — and
a cycle read from it gives the same ClusterState and diagnosis as a fresh full list."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes.watch.watch import iter_resp_lines

from gpudefrag.engines.kubernetes import KubeCluster, KubernetesEngine, diagnose_kube
from gpudefrag.engines.kubernetes.live import read_live
from gpudefrag.engines.kubernetes.watch import WatchCache
from gpudefrag.engines.registry import make_engine
from gpudefrag.snapshot import state_to_dict

from .lab import KubeLab, gpu_node, gpu_pod

pytestmark = pytest.mark.kube


def fragmented(lab: KubeLab) -> None:
    """Two nodes with 4 GPUs busy each and an 8-GPU pod the real scheduler refuses (with its event)."""
    lab.nodes(gpu_node("gpu-node-0"), gpu_node("gpu-node-1"))
    lab.namespaces("ml")
    lab.create(gpu_pod("a", 4, node="gpu-node-0"), gpu_pod("b", 4, node="gpu-node-1"), gpu_pod("big", 8))
    lab.scheduled_or_refused("ml", ["a", "b", "big"])
    lab.wait("the FailedScheduling event", lambda: lab.events("ml", "FailedScheduling"))


@pytest.fixture
def cache(kube: KubeLab) -> Iterator[tuple[KubeLab, WatchCache]]:
    fragmented(kube)
    c = WatchCache(kube.client(), retry_s=0.3).start()
    try:
        yield kube, c
    finally:
        c.stop()


def comparable(cluster: KubeCluster) -> tuple[dict[str, Any], list[Any]]:
    d = state_to_dict(cluster.state)
    d.pop("now"), d.pop("name")
    return d, [k.as_dict() for k in diagnose_kube(cluster)]


def same_as_a_fresh_list(lab: KubeLab, c: WatchCache) -> KubeCluster:
    """Cycles from the cache until it equals a fresh full list of the real server (the watches deliver within
    moments, not within the same call): the equality, not the timing, is what is checked."""
    got: list[KubeCluster] = []

    def equal() -> bool:  # both read again each time: controllers (node lifecycle, KWOK) may still be writing
        got[:] = [c.cluster()]
        return comparable(got[0]) == comparable(read_live(api=lab.client()))

    lab.wait("the cache to equal a fresh list", equal, timeout=30)
    return got[0]


def until(lab: KubeLab, c: WatchCache, what: str, check: Callable[[KubeCluster], bool]) -> KubeCluster:
    got: list[KubeCluster] = []
    lab.wait(what, lambda: check(got.__setitem__(slice(None), [c.cluster()]) or got[0]), timeout=30)
    return got[0]


def test_the_cache_follows_pods_and_nodes_and_equals_a_fresh_list(cache: tuple[KubeLab, WatchCache]) -> None:
    lab, c = cache
    first = c.cluster()
    assert set(first.pods) == {"ml/a", "ml/b", "ml/big"} and not first.pods["ml/big"].node
    assert "Insufficient nvidia.com/gpu" in first.state.workload("ml/big").scheduler_reason
    same_as_a_fresh_list(lab, c)
    relists = {n: f.relists for n, f in c.feeds.items()}

    # created after the list and bound by the real scheduler; a pod deleted; the refused pod now fits
    lab.create(gpu_pod("late", 2))
    lab.kubectl("-n", "ml", "delete", "pod", "a", "--grace-period=0", "--force")
    lab.scheduled_or_refused("ml", ["late"])
    got = until(lab, c, "late bound, a gone", lambda k: "ml/a" not in k.pods and bool(
        k.pods.get("ml/late") and k.pods["ml/late"].node and k.pods["ml/late"].ready))
    assert got.state.workload("ml/late").placements[0].node == lab.get("pod", "late", ns="ml")["spec"]["nodeName"]

    # a node whose kubelet stops reporting: NotReady in the cache
    lab.kubelet_gone("gpu-node-1")
    until(lab, c, "gpu-node-1 NotReady", lambda k: not k.state.node("gpu-node-1").schedulable)
    same_as_a_fresh_list(lab, c)
    assert {n: f.relists for n, f in c.feeds.items()} == relists, "followed by watching, not by listing again"
    assert all(f.connected for f in c.feeds.values())


def restart_api_server(lab: KubeLab) -> None:
    pidfile = lab.dir / "pids" / "kube-apiserver"
    os.kill(int(pidfile.read_text()), signal.SIGKILL)
    lab.restart("kube-apiserver")


def test_an_expired_resource_version_relists_and_recovers(cache: tuple[KubeLab, WatchCache]) -> None:
    """The pods watch is resumed from a resourceVersion the server no longer keeps (one from before an API
    server restart: the new server's watch cache begins later): the real server answers 410 Gone ("too old
    resource version"), the feed lists pods again and then follows the changes made after."""
    lab, c = cache
    feed = c.feeds["pods"]
    lab.wait("the pods watch", lambda: feed.connected)
    old = feed.rv
    lab.create(gpu_pod("marker", 1, node="gpu-node-0"))  # a write after `old`: the restarted server starts later
    lab.wait("the marker in the cache", lambda: feed.rv != old and "ml/marker" in c.cluster().pods)
    restart_api_server(lab)
    lab.wait("the pods watch back", lambda: feed.connected, timeout=60)

    def expired() -> bool:  # the server's watch cache is up and no longer holds `old` (before that it may serve
        resp = feed.src.fn(watch=True, resource_version=old, timeout_seconds=1, _preload_content=False)  # etcd's)
        first = json.loads(next(iter_resp_lines(resp), "{}"))
        resp.release_conn()
        return first.get("type") == "ERROR" and first["object"].get("code") == 410

    lab.wait(f"the real server to answer 410 Gone for resourceVersion {old}", expired, timeout=120, every=1)
    before = feed.relists
    feed.rv = old
    c._close(feed)  # the stream breaks; the thread resumes the watch from the expired resourceVersion
    lab.wait("the pods relist", lambda: feed.relists > before, timeout=30)
    lab.kubectl("-n", "ml", "delete", "pod", "b", "--grace-period=0", "--force")
    lab.create(gpu_pod("after", 1, node="gpu-node-0"))
    got = same_as_a_fresh_list(lab, c)
    assert "ml/b" not in got.pods and "ml/after" in got.pods
    assert feed.connected
    # A server that keeps expiring the watch is not listed in a loop: each relist within a minute of the last
    # waits first, twice as long each time (retry_s, 2 x retry_s, ... up to 30 s). The API server's restart
    # above may itself have expired the watch (a relist already paced), so the series starts from the pause
    # the last relist took, whatever it was.
    start = max(2 * feed.backoff, c.retry_s)
    waited = []
    for _ in range(2):
        before, last = feed.relists, feed.last_relist
        lab.wait("the watch connected", lambda: feed.connected)
        feed.rv = old
        c._close(feed)
        lab.wait("the pods relist again", lambda: feed.relists > before, timeout=30)  # noqa: B023
        waited.append((feed.backoff, feed.last_relist - last))
    assert [b for b, _ in waited] == [start, 2 * start], waited
    assert all(gap >= b for b, gap in waited), waited
    assert "ml/after" in same_as_a_fresh_list(lab, c).pods


def test_the_cache_survives_an_api_server_restart(cache: tuple[KubeLab, WatchCache]) -> None:
    """The API server is killed and started again: each watch is resumed (from its resourceVersion, or by a
    relist where the new server answers 410 Gone) and the cache shows what changed meanwhile. While the server
    is down the store still answers, and says which feeds may be stale."""
    lab, c = cache
    c.stale_after_s = 0.5
    assert not [w for w in c.cluster().warnings if "stale" in w]
    pidfile = lab.dir / "pids" / "kube-apiserver"
    os.kill(int(pidfile.read_text()), signal.SIGKILL)
    try:
        lab.wait("the watches to notice", lambda: not any(f.connected for f in c.feeds.values()), timeout=30)
        time.sleep(0.6)
        down = c.cluster()
        assert set(down.pods) == {"ml/a", "ml/b", "ml/big"}
        assert any("watch pods: not connected" in w and "stale" in w for w in down.warnings), down.warnings
    finally:
        lab.restart("kube-apiserver")
    lab.kubectl("-n", "ml", "delete", "pod", "a", "--grace-period=0", "--force")
    lab.create(gpu_pod("after", 1, node="gpu-node-1"))
    lab.wait("the watches back", lambda: all(f.connected for f in c.feeds.values()), timeout=60)
    got = same_as_a_fresh_list(lab, c)
    assert "ml/a" not in got.pods and "ml/after" in got.pods
    assert not [w for w in got.warnings if "stale" in w]


def test_the_controllers_engine_keeps_one_cache(kube: KubeLab, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine `controller --engine kubernetes` builds (the registry's): one cache for its life; each
    observe() reads it."""
    fragmented(kube)
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    eng = make_engine("kubernetes")
    assert isinstance(eng, KubernetesEngine)
    try:
        assert "ml/big" in {w.id for w in eng.observe().pending}
        cache = eng._cache
        kube.kubectl("-n", "ml", "delete", "pod", "big", "--grace-period=0", "--force")
        kube.wait("big gone", lambda: "ml/big" not in {w.id for w in eng.observe().workloads}, timeout=30)
        assert eng._cache is cache
    finally:
        eng.close()
