"""The live model on the real control plane: random churn made through the real API server (pods created
pending or bound, deleted, nodes cordoned and relabelled, quotas, PDBs, the autoscaler's status ConfigMap, DRA
ResourceSlices and ResourceClaims created, changed and deleted); after each batch the model the watches keep
(converting only what changed) must equal a conversion from scratch of a fresh full list — the same state,
pods, PDBs, events, node groups and warnings. It fails when an update is lost or misapplied: the two never
become equal and the wait times out."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gpudefrag.engines.kubernetes.live import read_live
from gpudefrag.engines.kubernetes.watch import WatchCache

from .churn import comparable
from .lab import KubeLab, gpu_node, gpu_pod, pdb, quota

pytestmark = pytest.mark.kube

NODES = ["gpu-a", "gpu-b", "gpu-c"]
NAMES = [f"p{i}" for i in range(5)]


def status_cm(target: int) -> dict[str, Any]:
    text = ("autoscalerStatus: Running\nnodeGroups:\n- name: gpu-h100\n  health:\n    status: Healthy\n"
            f"    cloudProviderTarget: {target}\n    minSize: 0\n    maxSize: 6\n")
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cluster-autoscaler-status", "namespace": "kube-system"}, "data": {"status": text}}


def dra_slice(node: str, gpus: int) -> dict[str, Any]:
    devices = [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA H200"}}}
               for i in range(gpus)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpus"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                          "resourceSliceCount": 1},
                     "devices": devices}}


def dra_claim(name: str, count: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                           "allocationMode": "ExactCount",
                                                                           "count": count}}]}}}


CHANGE = st.one_of(
    st.tuples(st.just("pod"), st.sampled_from(NAMES), st.integers(0, 4), st.sampled_from([None, *NODES])),
    st.tuples(st.just("delete pod"), st.sampled_from(NAMES)),
    st.tuples(st.just("cordon"), st.sampled_from(NODES), st.booleans()),
    st.tuples(st.just("label"), st.sampled_from(NODES), st.sampled_from(["a", "b"])),
    st.tuples(st.just("quota"), st.integers(0, 16)),
    st.tuples(st.just("pdb"), st.sampled_from(NAMES)),
    st.tuples(st.just("autoscaler"), st.integers(1, 6)),
    st.tuples(st.just("slice"), st.sampled_from(NODES), st.integers(0, 3)),
    st.tuples(st.just("claim"), st.sampled_from(NAMES), st.integers(1, 2)),
)


def apply(lab: KubeLab, change: tuple[Any, ...]) -> None:
    what = change[0]
    if what == "pod":
        _, name, gpus, node = change
        lab.kubectl("-n", "ml", "delete", "pod", name, "--grace-period=0", "--force", "--ignore-not-found")
        spec = gpu_pod(name, gpus, node=node)
        if gpus == 0 and name in ("p3", "p4"):  # a DRA claim instead of the device plugin's resource
            spec["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"claim-{name}"}]
        p = lab.kubectl("create", "-f", "-", input=json.dumps(spec), check=False)
        # an earlier change may have set the namespace's quota below this pod: the API server refuses it, so the
        # pod never exists — for the model and for a fresh read alike. Any other refusal is the test's error.
        assert p.returncode == 0 or "exceeded quota" in p.stderr, f"kubectl create {name}: {p.stderr.strip()}"
    elif what == "delete pod":
        lab.kubectl("-n", "ml", "delete", "pod", change[1], "--grace-period=0", "--force", "--ignore-not-found")
    elif what == "cordon":
        lab.kubectl("cordon" if change[2] else "uncordon", change[1])
    elif what == "label":
        lab.kubectl("label", "node", change[1], f"gpudefrag.io/team={change[2]}", "--overwrite")
    elif what == "quota":
        lab.kubectl("apply", "-f", "-", input=json.dumps(quota("ml", change[1])))
    elif what == "pdb":
        lab.kubectl("apply", "-f", "-", input=json.dumps(pdb("keep", "ml", {"app": change[1]}, min_available=1)))
    elif what == "autoscaler":
        lab.kubectl("apply", "-f", "-", input=json.dumps(status_cm(change[1])))
    elif what == "slice":
        _, node, gpus = change
        if gpus:
            lab.kubectl("apply", "-f", "-", input=json.dumps(dra_slice(node, gpus)))
        else:
            lab.kubectl("delete", "resourceslice", f"{node}-gpus", "--ignore-not-found")
    elif what == "claim":
        _, name, count = change
        lab.kubectl("-n", "ml", "delete", "resourceclaim", f"claim-{name}", "--ignore-not-found")
        lab.kubectl("apply", "-f", "-", input=json.dumps(dra_claim(f"claim-{name}", count)))


@pytest.fixture
def model(kube: KubeLab) -> Iterator[tuple[KubeLab, WatchCache]]:
    kube.nodes(*(gpu_node(n) for n in NODES))
    kube.namespaces("ml")
    c = WatchCache(kube.client(), retry_s=0.3).start()
    try:
        yield kube, c
    finally:
        c.stop()
        # cluster-wide or outside the test namespace: what the next test must not find
        kube.kubectl("-n", "kube-system", "delete", "configmap", "cluster-autoscaler-status", "--ignore-not-found")
        kube.kubectl("delete", "resourceslice", *(f"{n}-gpus" for n in NODES), "--ignore-not-found")


def test_random_churn_through_the_api_equals_a_conversion_from_scratch(model: tuple[KubeLab, WatchCache]) -> None:
    lab, c = model
    kinds = {f.src.kind for f in c.feeds.values()}
    assert {"Node", "Pod", "ResourceQuota", "PodDisruptionBudget", "Event", "ConfigMap", "ResourceSlice",
            "ResourceClaim"} <= kinds, kinds
    relists = {n: f.relists for n, f in c.feeds.items()}
    converted: list[int] = []

    # no shrinking: each try waits for equality, so a failure is reported as generated, with what differed
    @settings(max_examples=6, deadline=None, database=None, phases=(Phase.explicit, Phase.generate),
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(st.lists(CHANGE, min_size=1, max_size=6))
    def churn(changes: list[tuple[Any, ...]]) -> None:
        for ch in changes:
            apply(lab, ch)
        before = c.model.conversions
        got: list[Any] = []

        def equal() -> bool:  # both read again each time: the scheduler and KWOK may still be writing
            got[:] = [comparable(c.cluster()), comparable(read_live(api=lab.client()))]
            for g in got:
                g["state"].pop("now", None)
                g["raw_nodes"] = sorted(g["raw_nodes"])  # heartbeats: the same nodes, not the same bytes
                g["pods"] = {k: v[:-1] for k, v in g["pods"].items()}  # status details KWOK rewrites
            return got[0] == got[1]

        def differs() -> str:
            return f"after {changes}: " + "; ".join(f"{k}: model {got[0][k]!r:.1500} / fresh {got[1][k]!r:.1500}"
                                                    for k in got[0] if got[0][k] != got[1][k])

        lab.wait("the model to equal a conversion from scratch", equal, timeout=60, every=0.5, state=differs)
        converted.append(c.model.conversions - before)

    churn()
    assert {n: f.relists for n, f in c.feeds.items()} == relists, "followed by watching, not by listing again"
    # each cycle converted a few objects, never the whole cluster again
    assert converted and max(converted) < 3 + 30, converted


def _role(name: str, rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
             "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "ml"}]}]


def test_dra_kinds_are_followed_from_when_the_server_serves_them(kube: KubeLab) -> None:
    """The controller starts while it cannot read DRA (here: RBAC forbids it; an API server without the
    resource.k8s.io group answers 404 the same way): the kinds are skipped with a warning, looked for again,
    and followed once readable — a ResourceSlice made after that gives its node GPUs in the next cycle."""
    import copy

    from kubernetes import client

    kube.nodes(gpu_node("gpu-dra", plugin=False))  # the labels say 8 GPUs; no device plugin advertises them
    kube.namespaces("ml")
    verbs = ["list", "watch"]
    kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader", "namespace": "ml"}},
        *_role("gpudefrag-test-reader", [
            {"apiGroups": [""], "resources": ["nodes", "pods", "resourcequotas", "events", "configmaps"],
             "verbs": verbs},
            {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": verbs}])]}))
    token = kube.kubectl("-n", "ml", "create", "token", "reader").stdout.strip()
    admin = kube.client()
    cfg = copy.copy(admin.configuration)
    cfg.cert_file = cfg.key_file = None
    cfg.api_key = {"authorization": f"Bearer {token}"}
    c = WatchCache(client.ApiClient(cfg), retry_s=0.3)
    c.dra_probe_s = (0.5, 2.0)
    c.start()
    try:
        first = c.cluster()
        assert "resourceslices" not in c.feeds
        assert any("resourceslices" in w and "403" in w for w in first.warnings), first.warnings
        assert first.state.node("gpu-dra").usable_gpus == 0
        kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": _role(
            "gpudefrag-test-dra", [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices",
                                                                                "resourceclaims"], "verbs": verbs}])}))
        kube.wait("the DRA kinds followed", lambda: "resourceslices" in c.feeds, timeout=60)
        kube.kubectl("apply", "-f", "-", input=json.dumps(dra_slice("gpu-dra", 8)))
        kube.wait("the slice's GPUs on gpu-dra",
                  lambda: c.cluster().state.node("gpu-dra").usable_gpus == 8, timeout=30)
    finally:
        c.stop()
        kube.kubectl("delete", "clusterrolebinding,clusterrole", "gpudefrag-test-reader", "gpudefrag-test-dra",
                     "--ignore-not-found")
        kube.kubectl("delete", "resourceslice", "gpu-dra-gpus", "--ignore-not-found")
