"""Kubernetes: a generated 1,000-node `kubectl get nodes,pods,... -A -o json` dump loads and diagnoses in < 2 s;
and the controller's cycle (list + diagnose + plan) against a real API server holding the same cluster (the
control plane of tools/kubecluster, KWOK nodes): cold (every kind listed), and as the controller runs it, from
its watch cache after a few pods came and went — beside the same cycle on a real `kubectl` dump of it.

The dump has the recorded shape of tests/kubernetes/fixtures (GFD labels, managedFields, default tolerations,
scheduler events): 1,000 8-GPU nodes, 3 GPU pods and 4 DaemonSet pods per node, 50 pending GPU pods (5 Jobs of
10 pods, 5 shapes) with their FailedScheduling events, and a quota. Timed: read + parse + convert to
ClusterState + diagnose every pending pod with the scheduler's messages (`gpudefrag kube diagnose`), and the
`gpudefrag diagnose DUMP` path.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import Row
from gpudefrag.core.diagnose import diagnose_all
from gpudefrag.engines.kubernetes import diagnose_kube, load_cluster_state, load_dump
from gpudefrag.engines.kubernetes.convert import holding
from gpudefrag.engines.kubernetes.incremental import key_of, node_ready, node_signal

TOOLS = Path(__file__).resolve().parents[1] / "tools" / "kubecluster"

T0 = "2026-03-01T08:00:00Z"
MF = [{"apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {".": {}}},
       "f:spec": {"f:containers": {}}}, "manager": "kube-controller-manager", "operation": "Update", "time": T0},
      {"apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}}},
       "manager": "kubelet", "operation": "Update", "subresource": "status", "time": T0}]
TOL = [{"effect": "NoExecute", "key": "node.kubernetes.io/not-ready", "operator": "Exists", "tolerationSeconds": 300},
       {"effect": "NoExecute", "key": "node.kubernetes.io/unreachable", "operator": "Exists",
        "tolerationSeconds": 300}]


def _node(i: int) -> dict[str, Any]:
    name = f"gpu-{i:04d}"
    res = {"cpu": "192", "memory": "2097152Mi", "nvidia.com/gpu": "8", "pods": "110", "ephemeral-storage": "3749946Mi"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "uid": f"uid-{name}", "resourceVersion": "1", "creationTimestamp": T0, "managedFields": MF,
        "labels": {"kubernetes.io/hostname": name, "kubernetes.io/arch": "amd64",
                   "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
                   "nvidia.com/cuda.driver.major": "550", "nvidia.com/cuda.driver.minor": "54",
                   "nvidia.com/cuda.driver.rev": "15", "nvidia.com/cuda.runtime.major": "12",
                   "nvidia.com/cuda.runtime.minor": "4", "eks.amazonaws.com/nodegroup": f"pool-{i % 10}"}},
        "spec": {"providerID": f"aws:///us-east-1a/i-{i:017d}"},
        "status": {"capacity": res, "allocatable": dict(res, cpu="191450m", memory="2070000Mi"),
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "lastHeartbeatTime": T0, "lastTransitionTime": T0}],
                   "nodeInfo": {"architecture": "amd64", "kubeletVersion": "v1.34.2",
                                "containerRuntimeVersion": "containerd://1.7.27"}}}


def _pod(ns: str, name: str, gpus: int, node: str | None, owner: str | None, msg: str = "") -> dict[str, Any]:
    req: dict[str, str] = {"cpu": "4" if gpus else "100m", "memory": "32Gi" if gpus else "128Mi"}
    lim: dict[str, str] = {}
    if gpus:
        req["nvidia.com/gpu"] = lim["nvidia.com/gpu"] = str(gpus)
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}", "resourceVersion": "2",
                            "creationTimestamp": T0, "labels": {"app": name.rsplit("-", 1)[0]}, "managedFields": MF}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner, "name": name.rsplit("-", 1)[0],
                                    "uid": "uid-owner", "controller": True, "blockOwnerDeletion": True}]
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                            "resources": {"requests": req, "limits": lim or None}}],
                            "schedulerName": "default-scheduler", "tolerations": TOL, "priority": 0,
                            "restartPolicy": "Always", "serviceAccountName": "default"}
    status: dict[str, Any] = {"phase": "Running" if node else "Pending", "qosClass": "Burstable"}
    if node:
        spec["nodeName"] = node
        status["conditions"] = [{"type": "Ready", "status": "True", "lastTransitionTime": T0}]
    else:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                 "message": msg, "lastTransitionTime": T0}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def generate(n_nodes: int, seed: int = 7) -> dict[str, Any]:
    rng = random.Random(seed)
    items = [_node(i) for i in range(n_nodes)]
    for i in range(n_nodes):
        node = f"gpu-{i:04d}"
        left = 8
        for j in range(3):
            g = rng.choice((1, 2, 2, 4)) if left > 0 else 0
            g = min(g, left)
            left -= g
            if g:
                items.append(_pod("ml", f"job{i}x{j}-{rng.randrange(10**5):05d}", g, node, "ReplicaSet"))
        for ds in ("nvidia-device-plugin", "gpu-feature-discovery", "node-exporter", "kube-proxy"):
            items.append(_pod("kube-system", f"{ds}-{i:05d}", 0, node, "DaemonSet"))
    msg = f"0/{n_nodes} nodes are available: {n_nodes} Insufficient nvidia.com/gpu. preemption: 0/{n_nodes} " \
          f"nodes are available: {n_nodes} No preemption victims found for incoming pod."
    for k in range(50):  # 5 Jobs of 10 pods each, of 5 shapes (8, 6, 4, 3, 2 GPUs)
        items.append(_pod("ml", f"pending-{k}", (8, 6, 4, 3, 2)[k // 10], None, None, msg))
        items.append({"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"pending-{k}.1", "namespace": "ml",
                      "creationTimestamp": T0}, "involvedObject": {"kind": "Pod", "name": f"pending-{k}",
                      "namespace": "ml"}, "reason": "FailedScheduling", "message": msg, "type": "Warning",
                      "eventTime": "2026-03-01T09:59:30.000000Z", "reportingComponent": "default-scheduler"})
    items.append({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu", "namespace": "ml"},
                  "spec": {"hard": {"requests.nvidia.com/gpu": str(8 * n_nodes)}}})
    return {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}}


def _times(fn: Any, repeat: int) -> tuple[float, float, float]:
    """(best wall, median wall, best CPU) seconds. The machines are shared: the best of several runs is the
    least disturbed estimate of the wall time, and CPU time does not count other processes at all."""
    walls, cpus = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    walls.sort()
    return walls[0], walls[len(walls) // 2], min(cpus)


def _for_api(obj: dict[str, Any]) -> dict[str, Any]:
    """A generated object as one would create it: no server-set metadata, no owners (the garbage collector
    would delete pods whose owner does not exist), pods without status; nodes keep their capacity."""
    meta = {k: v for k, v in obj["metadata"].items() if k in ("name", "namespace", "labels", "annotations")}
    out = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": meta, "spec": obj.get("spec", {})}
    if obj["kind"] == "Node":
        out["status"] = {k: obj["status"][k] for k in ("capacity", "allocatable")}
        meta["annotations"] = {"kwok.x-k8s.io/node": "fake"}  # KWOK keeps it Ready
    if obj["kind"] == "Pod":
        out["spec"] = dict(obj["spec"], terminationGracePeriodSeconds=0, automountServiceAccountToken=False)
        out["spec"].pop("serviceAccountName", None)
    return out


def _cycle(cluster: Any) -> tuple[int, bool]:
    """diagnose + plan, as the controller's cycle does after its read: (pending diagnosed, plan feasible)."""
    from gpudefrag.core.planner import PlanOptions, plan_for

    diags = diagnose_kube(cluster)
    frag = [d for d in diags if d.diagnosis.is_fragmentation]
    feasible = False
    if frag:
        feasible = plan_for(cluster.state, frag[0].diagnosis.workload_id or "", PlanOptions(max_moves=8)).feasible
    return len(diags), feasible


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


READ_KINDS = ("nodes", "pods", "resourcequotas", "poddisruptionbudgets", "events", "configmaps", "resourceslices",
              "resourceclaims")


def _list_get(kubectl: Path, kc: str) -> int:
    """LIST + GET requests the API server has answered so far for the kinds the controller reads (its own
    `apiserver_request_total`); leases, bindings and the /metrics scrape itself are other resources."""
    text = subprocess.run([str(kubectl), "--kubeconfig", kc, "get", "--raw", "/metrics"], check=True,
                          capture_output=True, text=True).stdout
    total = 0
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.rindex("}")].split(",") if "=" in kv)
        verb, res = labels.get("verb", "").strip('"'), labels.get("resource", "").strip('"')
        if verb in ("LIST", "GET") and res in READ_KINDS:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


CONTROLLER_USER = "gpudefrag-bench-controller"
READS_SCHEMA, WATCH_SCHEMA = "gpudefrag-bench-controller-reads", "gpudefrag-bench-controller-watches"


def _controller_identity(kubectl: Path, kc: str) -> None:
    """Give the controller a user of its own and FlowSchemas that classify its requests: its LIST/GET (resource
    and non-resource, discovery included) in one, its WATCHes in another. API Priority and Fairness counts every
    request it dispatches by FlowSchema (`apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}`), so
    the controller's own reads are counted apart from the scheduler's, KWOK's and the controllers' — which
    `apiserver_request_total` (no client label) cannot do. The bench's client impersonates the user (admin may),
    and the impersonated user is what APF classifies."""
    def schema(name: str, precedence: int, verbs: list[str], non_resource: bool) -> dict[str, Any]:
        rule: dict[str, Any] = {
            "subjects": [{"kind": "User", "user": {"name": CONTROLLER_USER}}],
            "resourceRules": [{"verbs": verbs, "apiGroups": ["*"], "resources": ["*"], "clusterScope": True,
                               "namespaces": ["*"]}]}
        if non_resource:
            rule["nonResourceRules"] = [{"verbs": verbs, "nonResourceURLs": ["*"]}]
        return {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": name},
                "spec": {"priorityLevelConfiguration": {"name": "workload-low"}, "matchingPrecedence": precedence,
                         "distinguisherMethod": {"type": "ByUser"}, "rules": [rule]}}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": CONTROLLER_USER},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": CONTROLLER_USER}]}
    doc = {"apiVersion": "v1", "kind": "List", "items": [
        binding, schema(READS_SCHEMA, 500, ["get", "list"], True), schema(WATCH_SCHEMA, 501, ["watch"], False)]}
    subprocess.run([str(kubectl), "--kubeconfig", kc, "apply", "-f", "-"], input=json.dumps(doc), text=True,
                   check=True, capture_output=True)


def _dispatched(kubectl: Path, kc: str) -> dict[str, int]:
    """Requests API Priority and Fairness has dispatched so far, by FlowSchema."""
    text = subprocess.run([str(kubectl), "--kubeconfig", kc, "get", "--raw", "/metrics"], check=True,
                          capture_output=True, text=True).stdout
    out: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("apiserver_flowcontrol_dispatched_requests_total{"):
            labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.rindex("}")].split(",") if "=" in kv)
            fs = labels.get("flow_schema", "").strip('"')
            out[fs] = out.get(fs, 0) + int(float(line.rsplit(" ", 1)[1]))
    return out


def _scale_items(n: int) -> list[dict[str, Any]]:
    """The generated cluster as one would create it, with 8 pods on every node (a fifth DaemonSet, CPU-only pods
    where its GPU pods are fewer than 3), MIG slices on every 10th node, DRA GPUs (a ResourceSlice) on every
    20th, the autoscaler's status and a PDB."""
    doc = generate(n)
    items = [_for_api(o) for o in doc["items"] if o["kind"] in ("Node", "Pod", "ResourceQuota")]
    for o in items:
        if o["kind"] == "Node":
            i = int(o["metadata"]["name"].rsplit("-", 1)[1])
            if i % 10 == 5:
                for part in ("capacity", "allocatable"):
                    o["status"][part] = dict(o["status"][part], **{"nvidia.com/gpu": "6",
                                                                     "nvidia.com/mig-1g.10gb": "14"})
    for i in range(n):
        items.append(_for_api(_pod("kube-system", f"dcgm-exporter-{i:05d}", 0, f"gpu-{i:04d}", None)))
    # 8 pods on every node (the issue's >= 40,000 at 5,000 nodes): where the first GPU pods took all 8 GPUs the
    # node has fewer, so a CPU-only pod per missing one
    bound = Counter(o["spec"].get("nodeName") for o in items if o["kind"] == "Pod")
    for i in range(n):
        for j in range(8 - bound[f"gpu-{i:04d}"]):
            items.append(_for_api(_pod("ml", f"sidecar-{i:05d}-{j}", 0, f"gpu-{i:04d}", None)))
    for i in range(0, n, 20):
        devices = [{"name": f"gpu-{g}", "attributes": {"type": {"string": "gpu"},
                                                        "productName": {"string": "NVIDIA H100 80GB HBM3"}}}
                   for g in range(8)]
        items.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                      "metadata": {"name": f"gpu-{i:04d}-gpus"},
                      "spec": {"driver": "gpu.nvidia.com", "nodeName": f"gpu-{i:04d}",
                               "pool": {"name": f"gpu-{i:04d}", "generation": 1, "resourceSliceCount": 1},
                               "devices": devices}})
    status = "autoscalerStatus: Running\nnodeGroups:\n" + "".join(
        f"- name: pool-{g}\n  health:\n    status: Healthy\n    cloudProviderTarget: {n // 10}\n"
        f"    minSize: 0\n    maxSize: {n // 5}\n" for g in range(10))
    items.append({"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "cluster-autoscaler-status", "namespace": "kube-system"},
                  "data": {"status": status}})
    items.append({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                  "metadata": {"name": "jobs", "namespace": "ml"},
                  "spec": {"selector": {"matchLabels": {"app": "job0x0"}}, "maxUnavailable": 1}})
    return items


def _create(api: Any, items: list[dict[str, Any]]) -> None:
    from kubernetes import client, utils

    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "ml"}})

    def one(o: dict[str, Any]) -> None:
        kind, ns = o["kind"], o["metadata"].get("namespace")
        if kind == "Node":
            core.create_node(o)
        elif kind == "Pod":
            core.create_namespaced_pod(ns, o)
        else:
            utils.create_from_dict(api, o)

    with ThreadPoolExecutor(8) as pool:
        for kinds in (("Node",), ("ResourceQuota", "ConfigMap", "PodDisruptionBudget", "ResourceSlice"), ("Pod",)):
            list(pool.map(one, [o for o in items if o["kind"] in kinds]))


def _live(n: int, repeat: int) -> list[Row]:
    """The controller against the real API server holding the generated cluster: one full LIST beside the
    controller's cold start, its warm cycle after churn, creation → decision, its LIST/GET requests in a
    steady minute with churn, and its memory."""
    import threading

    from gpudefrag.cli.controller_cmd import pause_until_change
    from gpudefrag.control.controller import Controller
    from gpudefrag.engines.kubernetes import KubernetesEngine
    from gpudefrag.policy import parse_policy

    build = subprocess.run([str(TOOLS / "build.sh")], capture_output=True, text=True,
                           env={**os.environ, "GPUDEFRAG_KUBE_NO_BUILD": "1"})
    if build.returncode != 0:
        return [Row("kubernetes", "controller against a real API server", float("nan"), "s",
                    note="skipped: the control plane is not built (tools/kubecluster/build.sh)")]
    kubectl = Path(build.stdout.strip()) / "kubectl"
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([str(TOOLS / "cluster.sh"), "start", d], check=True, capture_output=True)
        try:
            from kubernetes import client, config

            kc = str(Path(d) / "admin.kubeconfig")
            api = config.new_client_from_config(kc)
            core = client.CoreV1Api(api)
            items = _scale_items(n)
            pods = sum(1 for o in items if o["kind"] == "Pod")
            t0 = time.perf_counter()
            _create(api, items)
            del items
            load_s = time.perf_counter() - t0

            def settled() -> bool:  # the scheduler has placed, or said why not, every unbound pod
                got = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=")
                return all(any(c.type == "PodScheduled" and c.status == "False" and c.message
                               for c in p.status.conditions or []) for p in got.items)

            end = time.monotonic() + 900
            while not settled() and time.monotonic() < end:
                time.sleep(2)

            def steady() -> bool:  # KWOK has marked every bound pod Running: its status writes are done
                # unpaged: a page of a field-selected list carries a continue token while pods remain to scan,
                # however few match (at 5,000 nodes, with 15 pending, the paged form never said steady)
                got = core.list_pod_for_all_namespaces(field_selector="status.phase=Pending")
                return all(not p.spec.node_name for p in got.items)

            # at 5,000 nodes KWOK may still be writing pods' status (Pending -> Running) long after the load:
            # every cycle then re-converts those pods and the API server's watch stream runs behind; the timed
            # part is meant for the steady state, so wait for it (and say how long it took)
            t_steady = time.perf_counter()
            end = time.monotonic() + 1800
            while not steady() and time.monotonic() < end:
                time.sleep(5)
            steady_s = time.perf_counter() - t_steady

            def full_list() -> None:  # what a controller that lists pays each time
                out = subprocess.run([str(kubectl), "--kubeconfig", kc, "get", "nodes,pods", "-A", "-o", "json"],
                                     check=True, capture_output=True).stdout
                json.loads(out)

            list_best, list_med, _ = _times(full_list, 3)
            rss0 = _rss_mib()
            pol = parse_policy({"trigger": {"pending": {"longer_than_s": 0}}})
            _controller_identity(kubectl, kc)
            own = config.new_client_from_config(kc)  # the controller's client: its requests are its user's
            own.set_default_header("Impersonate-User", CONTROLLER_USER)
            d0 = _dispatched(kubectl, kc)
            eng = KubernetesEngine(api_client=own, watch=True)
            ctl = Controller(eng, pol, None, dry_run=True)
            w, c = time.perf_counter(), time.process_time()
            first = ctl.cycle()  # the cold start: every kind listed, converted, diagnosed, planned
            cold_s, cold_cpu = time.perf_counter() - w, time.process_time() - c
            d1 = _dispatched(kubectl, kc)
            cold_reads = d1.get(READS_SCHEMA, 0) - d0.get(READS_SCHEMA, 0)  # > 0: the attribution works
            cache = eng._cache
            assert cache is not None
            churn = iter(range(10**6))

            def between() -> None:  # a few pods come and go; the watches deliver them (not timed)
                gen = cache.generation
                made = []
                for _ in range(3):
                    k = next(churn)
                    pod = _for_api(_pod("ml", f"churn-{k}", 0, f"gpu-{k % n:04d}", None))
                    core.create_namespaced_pod("ml", pod)
                    made.append(pod["metadata"]["name"])
                for name in made[:2]:
                    core.delete_namespaced_pod(name, "ml", grace_period_seconds=0)
                end = time.monotonic() + 30
                while cache.generation < gen + 5 and time.monotonic() < end:
                    time.sleep(0.05)

            walls, cpus, converted = [], [], []
            for _ in range(repeat):
                between()
                before = cache.model.conversions
                wb, cb = time.perf_counter(), time.process_time()
                ctl.cycle()
                walls.append(time.perf_counter() - wb)
                cpus.append(time.process_time() - cb)
                converted.append(cache.model.conversions - before)
            walls.sort()
            warm_best, warm_med = walls[0], walls[len(walls) // 2]
            # equal to a fresh full conversion of the same objects: every kind listed at exactly the
            # resourceVersion its watch had reached when the model was taken
            t_eq = time.monotonic()
            same, differ = _same_as_fresh(cache)
            eq_s = time.monotonic() - t_eq
            # the pods pending from the start come first in the pending trigger's queue (oldest first): gone, so
            # that each new pod's own decision is what is timed
            for p in core.list_pod_for_all_namespaces(field_selector="spec.nodeName=").items:
                core.delete_namespaced_pod(p.metadata.name, p.metadata.namespace, grace_period_seconds=0)

            # the controller's own loop in a thread, woken by the watches: creation -> decision
            stop = threading.Event()
            seen: dict[str, float] = {}

            cycles: list[tuple[float, float]] = []  # (start, end) of each cycle of the loop

            def loop() -> None:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    report = ctl.cycle()
                    t = time.perf_counter()
                    cycles.append((t0, t))
                    for dec in report.decisions:
                        wid = dec.detail.get("workload")
                        if isinstance(wid, str) and wid not in seen:
                            seen[wid] = t
                    pause_until_change(eng, 30.0)

            # when each pod's ADDED event reached the model (the watch thread, under the cache's lock), and what
            # the watch events from here on were (what a warm cycle has to convert follows from them)
            arrived: dict[str, float] = {}
            kinds: Counter[str] = Counter()
            model_apply = cache.model.apply
            t_events = time.monotonic()

            def timed_apply(feed: str, typ: str, obj: dict[str, Any]) -> bool:
                if typ == "ADDED" and feed == "pods":
                    meta = obj.get("metadata") or {}
                    arrived.setdefault(f"{meta.get('namespace')}/{meta.get('name')}", time.perf_counter())
                kinds[_event_kind(feed, typ, cache.model.raw[feed].get(key_of(obj)), obj)] += 1
                return model_apply(feed, typ, obj)

            cache.model.apply = timed_apply  # type: ignore[method-assign]
            th = threading.Thread(target=loop, daemon=True)
            th.start()
            lat = []
            wall = time.time() - time.perf_counter()  # perf_counter -> wall clock (the audit log's times)
            # where each latency went: the create call, its ADDED event reaching the model after the call
            # returned, the cycle that decided beginning after that, and that cycle's own time
            split: list[tuple[float, float, float, float]] = []
            for k in range(5):
                name = f"late-{k}"
                t = time.perf_counter()
                core.create_namespaced_pod("ml", _for_api(_pod("ml", name, 8, None, None)))
                t_made = time.perf_counter()
                end = time.monotonic() + 60
                while f"ml/{name}" not in seen and time.monotonic() < end:
                    time.sleep(0.01)
                lat.append(seen.get(f"ml/{name}", float("inf")) - t)
                deciding = next(((a, b) for a, b in cycles if b == seen.get(f"ml/{name}")), None)
                got = arrived.get(f"ml/{name}", float("nan"))
                if deciding is not None:
                    split.append((t_made - t, got - t_made, deciding[0] - got, deciding[1] - deciding[0]))
                core.delete_namespaced_pod(name, "ml", grace_period_seconds=0)  # the next one is the oldest
                time.sleep(1)
            # from the API server's receipt of each create (its audit log): the pod exists no earlier, so this
            # bounds creation -> decision from above without the client's side of the call (in this process,
            # beside the controller's thread); from the call's start (`lat`) it is said beside
            received = _audit_received(Path(d) / "logs" / "audit.log", "ml", [f"late-{k}" for k in range(5)])
            server = sorted(seen.get(f"ml/late-{k}", float("inf")) + wall - received.get(f"late-{k}", float("-inf"))
                            for k in range(5))
            lat.sort()
            # a steady minute with churn: the controller's loop runs, pods come and go every 2 s
            before, t_req = _list_get(kubectl, kc), time.monotonic()
            own0 = _dispatched(kubectl, kc)
            relists0 = sum(f.relists for f in cache.feeds.values())
            while time.monotonic() - t_req < 60:
                between()
                time.sleep(2)
            req = _list_get(kubectl, kc) - before
            own1 = _dispatched(kubectl, kc)
            own_reads = own1.get(READS_SCHEMA, 0) - own0.get(READS_SCHEMA, 0)
            own_watches = own1.get(WATCH_SCHEMA, 0) - own0.get(WATCH_SCHEMA, 0)
            minute = time.monotonic() - t_req
            relists = sum(f.relists for f in cache.feeds.values()) - relists0
            events_min = time.monotonic() - t_events
            stop.set()
            cache._wake.set()
            th.join(timeout=60)
            rss = _rss_mib()
            eng.close()
            # the same minute without the controller (what the scheduler, KWOK and the controllers list/get)
            before, t_req = _list_get(kubectl, kc), time.monotonic()
            while time.monotonic() - t_req < 60:
                between_plain(core, churn, n)
                time.sleep(2)
            others = _list_get(kubectl, kc) - before
        finally:
            subprocess.run([str(TOOLS / "cluster.sh"), "stop", d], capture_output=True)
    note = (f"{n} KWOK nodes, {pods} pods (+ {n // 20} ResourceSlices, MIG on every 10th node) in kube-apiserver "
            f"v1.35, loaded in {load_s:.0f} s, every bound pod Running {steady_s:.0f} s later; {first.pending} pending")
    ratio_warm, ratio_cold = warm_best / list_best, cold_s / list_best
    return [
        Row("kubernetes", f"one full LIST: kubectl get nodes,pods -A -o json + json.loads ({n} nodes), best of 3",
            list_best, "s", note=f"median {list_med:.2f} s; {note}"),
        Row("kubernetes", f"controller cold start (list every kind + convert + diagnose + plan), {n} nodes",
            cold_s, "s", "<= 1.5 x LIST", ratio_cold <= 1.5,
            note=f"{ratio_cold:.2f} x LIST; CPU {cold_cpu:.2f} s"),
        Row("kubernetes", f"warm cycle after churn (convert what changed + diagnose + plan), best of {repeat}",
            warm_best, "s", "<= 0.1 x LIST", ratio_warm <= 0.1,
            note=f"{ratio_warm:.3f} x LIST; median {warm_med:.3f} s, CPU {min(cpus):.3f} s; objects converted "
            f"per cycle {min(converted)}-{max(converted)}; equal to a fresh full conversion of the same objects "
            f"(each kind listed at the resourceVersion its watch had reached): {same} ({eq_s:.0f} s to list)"
            + (f"; {differ}" if differ else "")),
        Row("kubernetes", "creation -> decision (pending trigger longer_than_s 0), median of 5: from the API "
            "server's receipt of the create (audit log)", server[2], "s", "<= 2 s + trigger",
            server[2] <= 2.0 and server[-1] <= 2.0,
            note=f"all: {', '.join(f'{x:.2f}' for x in server)} s; from the client's call start: "
            f"{', '.join(f'{x:.2f}' for x in lat)} s; per pod (in creation order) create call / its "
            f"ADDED event reached the model after / the deciding cycle began after that / took: "
            f"{', '.join('/'.join(f'{x:.2f}' for x in row) for row in split)} s; watch events per minute while the "
            f"loop ran: " + ", ".join(f"{k} {v * 60 / events_min:.0f}" for k, v in kinds.most_common(8))),
        Row("kubernetes", "the controller's own LIST+GET in a steady minute with churn (its FlowSchema)",
            own_reads * 60 / minute, "/min", "0", own_reads == 0 and cold_reads > 0,
            note=f"apiserver_flowcontrol_dispatched_requests_total{{flow_schema={READS_SCHEMA}}}: the controller's "
            f"user's get/list, discovery included; its cold start made {cold_reads} (the attribution works); its "
            f"watches started in the minute: {own_watches}; relists {relists}"),
        Row("kubernetes", "LIST+GET of every component in the same minute", req * 60 / minute, "/min",
            note=f"apiserver_request_total, verbs LIST/GET on the kinds the controller reads; the same minute "
            f"without the controller: {others} (scheduler, KWOK, controllers)"),
        Row("kubernetes", "bench process RSS with the controller's model (steady state)", rss, "MiB", "<= 2 GiB",
            rss <= 2048, note=f"{rss - rss0:.0f} MiB more than before the controller started"),
    ]


def _audit_received(log: Path, namespace: str, names: list[str]) -> dict[str, float]:
    """When the API server received the create of each named pod (wall clock, from its audit log's
    requestReceivedTimestamp, microseconds): the first successful create of that name."""
    from datetime import datetime

    got: dict[str, float] = {}
    want = set(names)
    for line in log.read_text().splitlines():
        ev = json.loads(line)
        ref = ev.get("objectRef") or {}
        name = ref.get("name")
        if (ev.get("verb") == "create" and ref.get("resource") == "pods" and ref.get("namespace") == namespace
                and name in want and name not in got and (ev.get("responseStatus") or {}).get("code") == 201):
            got[name] = datetime.fromisoformat(ev["requestReceivedTimestamp"]).timestamp()
    return got


def _event_kind(feed: str, typ: str, old: dict[str, Any] | None, new: dict[str, Any]) -> str:
    """A watch event by what it makes the live model convert: a node's readiness flip or other change (the node
    alone unless its GPUs or versions changed), a heartbeat (nothing), a pod's status rewrite (the pod alone), a
    pod created, bound or deleted (its node's pods)."""
    if typ != "MODIFIED" or old is None:
        return f"{feed} {typ.lower()}"
    if feed == "nodes":
        if node_ready(old) != node_ready(new):
            return "node readiness"
        return "node heartbeat" if node_signal(old) == node_signal(new) else "node spec/labels/capacity"
    if feed == "pods":
        return "pod status rewrite" if holding(old) == holding(new) else "pod spec/binding"
    return f"{feed} modified"


def between_plain(core: Any, churn: Any, n: int) -> None:
    """Churn without a watch to wait on: 3 pods created, 2 deleted."""
    made = []
    for _ in range(3):
        k = next(churn)
        pod = _for_api(_pod("ml", f"churn-{k}", 0, f"gpu-{k % n:04d}", None))
        core.create_namespaced_pod("ml", pod)
        made.append(pod["metadata"]["name"])
    for name in made[:2]:
        core.delete_namespaced_pod(name, "ml", grace_period_seconds=0)


def _same_as_fresh(cache: Any) -> tuple[bool, str]:
    """(whether the watch-fed model equals a conversion from scratch of the same objects, what differs). With
    the watches paused (the cache's lock held), the model is taken together with the resourceVersion each
    watch had reached; each kind is then listed at exactly that resourceVersion (`resourceVersionMatch=Exact`,
    served from etcd's history), so writes made meanwhile (KWOK's for 5,000 nodes, the scheduler's) do not
    count against it. A full LIST takes ~100 s at 5,000 nodes: comparing with a list of *now* never settled."""
    from gpudefrag.engines.kubernetes.live import Caller, assemble

    now = time.time()
    with cache.lock:
        feeds = [(f.src, f.rv) for f in cache.feeds.values()]
        model = cache.model.cluster(now)
    lists = []
    for src, rv in feeds:
        resp = src.fn(_preload_content=False, resource_version=rv, resource_version_match="Exact", **src.kwargs)
        items = list(json.loads(resp.data).get("items") or [])
        for it in items:
            it.setdefault("kind", src.kind)
        lists.append((src, items))
    fresh = assemble(lists, Caller(cache.where), now)
    a, b = _comparable(model), _comparable(fresh)
    if a == b:
        return True, ""
    (sa, da), (sb, db) = a, b
    wa = {w["id"]: w for w in sa.get("workloads", [])}
    wb = {w["id"]: w for w in sb.get("workloads", [])}
    na = {n["name"]: n for n in sa.get("nodes", [])}
    nb = {n["name"]: n for n in sb.get("nodes", [])}
    diff = [k for k in wa.keys() | wb.keys() if wa.get(k) != wb.get(k)]
    ndiff = [k for k in na.keys() | nb.keys() if na.get(k) != nb.get(k)]
    other = [k for k in sa.keys() | sb.keys() if k not in ("workloads", "nodes") and sa.get(k) != sb.get(k)]
    return False, (f"workloads differing {len(diff)} (e.g. {sorted(diff)[:3]}), nodes {len(ndiff)} "
                   f"(e.g. {sorted(ndiff)[:3]}), other fields {other}, diagnoses equal {da == db}")


def _comparable(cluster: Any) -> tuple[Any, Any]:
    from gpudefrag.snapshot import state_to_dict

    d = state_to_dict(cluster.state)
    d.pop("now"), d.pop("name")
    return d, [k.as_dict() for k in diagnose_kube(cluster)]


def run(quick: bool) -> list[Row]:
    """GPUDEFRAG_BENCH_KUBE_NODES: the real-cluster sizes, comma-separated (default 1000; 5000 takes long)."""
    rows = _dump(quick) + _model_cycle(quick)
    sizes = [200] if quick else [int(x) for x in os.environ.get("GPUDEFRAG_BENCH_KUBE_NODES", "1000").split(",")]
    for n in sizes:
        rows += _live(n, 3 if quick else 5)
    return rows


def _model_cycle(quick: bool) -> list[Row]:
    """The controller's warm cycle in process, over the live model (no API server): 5,000 generated nodes with
    8 pods each fed to a `LiveModel` as watch events, then per cycle the churn of the 5,000-node runs (3 pods
    created, 2 deleted, 12 node readiness flips, the pending 8-GPU pod replaced by a new one) and one dry-run
    cycle with the pending trigger at 0 s. Beside it, in the same run, the same cycle with the state built
    without the previous one (every workload's columns gathered, checked and asked of the filter again), as
    before `ClusterState.build(previous=...)`: what carrying the unchanged workloads saves."""
    import copy

    from gpudefrag.control.controller import Controller
    from gpudefrag.engines.kubernetes.incremental import LiveModel
    from gpudefrag.policy import parse_policy

    n = 500 if quick else 5000
    items = [o for o in generate(n)["items"] if not o["metadata"]["name"].startswith("pending-")]
    items += [_pod("kube-system", f"dcgm-exporter-{i:05d}", 0, f"gpu-{i:04d}", None) for i in range(n)]
    rv = iter(range(10, 10**9))
    for o in items:
        o["metadata"]["resourceVersion"] = str(next(rv))
    feeds = {"Node": "nodes", "Pod": "pods", "ResourceQuota": "resourcequotas", "Event": "events"}
    model = LiveModel("bench", [(f, k) for k, f in feeds.items()])
    for kind, feed in feeds.items():
        model.replace(feed, [o for o in items if o["kind"] == kind])
    pods = sum(1 for o in items if o["kind"] == "Pod")
    nodes = [o for o in items if o["kind"] == "Node"]
    del items

    class Engine:  # the live model behind the controller, as KubernetesEngine.observe reads it
        name = "kubernetes"

        def observe(self) -> Any:
            return model.cluster(time.time()).state

    ctl = Controller(Engine(), parse_policy({"trigger": {"pending": {"longer_than_s": 0}}}), None,  # type: ignore[arg-type]
                     dry_run=True)
    ctl.cycle()
    rng = random.Random(5)
    churn = iter(range(10**6))

    def change() -> None:
        k = next(churn)
        for j in range(3):
            p = _pod("ml", f"churn-{k}-{j}", 0, f"gpu-{(k * 3 + j) % n:04d}", None)
            p["metadata"]["resourceVersion"] = str(next(rv))
            model.apply("pods", "ADDED", p)
        for j in range(2 if k else 0):
            model.apply("pods", "DELETED", model.raw["pods"][f"ml/churn-{k - 1}-{j}"])
        for _ in range(12):
            node = copy.deepcopy(rng.choice(nodes))
            node["metadata"]["resourceVersion"] = str(next(rv))
            node["status"]["conditions"][0]["status"] = rng.choice(("True", "Unknown"))
            model.apply("nodes", "MODIFIED", node)
        if k:
            model.apply("pods", "DELETED", model.raw["pods"][f"ml/late-{k - 1}"])
        late = _pod("ml", f"late-{k}", 8, None, None)
        late["metadata"]["resourceVersion"] = str(next(rv))
        model.apply("pods", "ADDED", late)

    carried, scratch = [], []
    reps = 3 if quick else 7
    for _ in range(reps):  # interleaved: a load spike falls on both
        for out, keep in ((carried, True), (scratch, False)):
            change()
            if keep:
                ctl.cycle()  # the state before: as the controller's previous cycle left it
                change()
            else:
                model._state = None  # the state is built from scratch, as before carrying
            t0 = time.process_time()
            ctl.cycle()
            out.append(time.process_time() - t0)
    best, base = min(carried), min(scratch)
    return [Row("kubernetes", f"warm controller cycle over the live model in process ({n} nodes, {pods} pods), CPU "
                f"best of {reps}", best, "s", baseline=f"the state built without the previous one {base:.3f} s",
                note=f"{base / best:.1f}x less; churn per cycle: 3 pods created, 2 deleted, 12 node readiness "
                f"flips, the pending 8-GPU pod replaced; dry run, pending trigger 0 s; all runs carried "
                f"{', '.join(f'{x:.3f}' for x in carried)} s, from scratch {', '.join(f'{x:.3f}' for x in scratch)} s")]


def _dump(quick: bool) -> list[Row]:
    n = 200 if quick else 1000
    repeat = 3 if quick else 5
    doc = generate(n)
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "dump.json"
        f.write_text(json.dumps(doc, indent=4))
        size_mb = f.stat().st_size / 1e6
        pods = sum(1 for i in doc["items"] if i["kind"] == "Pod")
        diags: list[Any] = []

        def kube() -> None:
            diags[:] = diagnose_kube(load_dump(f))

        k_best, k_med, k_cpu = _times(kube, repeat)
        c_best, c_med, c_cpu = _times(lambda: diagnose_all(load_cluster_state(f)), repeat)
        l_best, _, l_cpu = _times(lambda: load_dump(f), repeat)
    frag = sum(1 for x in diags if x.diagnosis.is_fragmentation)
    note = f"{n} nodes, {pods} pods, {size_mb:.0f} MB JSON; {len(diags)} pending diagnosed ({frag} fragmentation)"
    target = "< 2 s" if not quick else ""

    def ok(v: float) -> bool | None:
        return (v < 2.0) if not quick else None

    return [
        Row("kubernetes", f"kube diagnose DUMP, wall best of {repeat} ({n} nodes)", k_best, "s", target, ok(k_best),
            note=f"{note}; median {k_med:.2f} s"),
        Row("kubernetes", f"kube diagnose DUMP, CPU ({n} nodes)", k_cpu, "s", target, ok(k_cpu)),
        Row("kubernetes", f"diagnose DUMP (core path), wall best of {repeat}", c_best, "s", target, ok(c_best),
            note=f"median {c_med:.2f} s; CPU {c_cpu:.2f} s; diagnoses every pending pod separately"),
        Row("kubernetes", f"dump load only ({n} nodes), wall best / CPU", l_best, "s", note=f"CPU {l_cpu:.2f} s"),
    ]
