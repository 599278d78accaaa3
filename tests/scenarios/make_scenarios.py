"""Regenerate the acceptance scenarios: `python tests/scenarios/make_scenarios.py`.

One realistic small cluster per situation issue #12 lists (4 nodes × 8 H100 with their driver, CUDA and
checkpointer versions; jobs with checkpoint sizes and times). Where Kubernetes can express the situation, the
scenario is written first as the `kubectl get nodes,pods,resourcequotas,... -A -o json` dump (`NAME.kube.json`,
built with the official client's models by tests/kubernetes/fixtures/make_fixtures.py) and the snapshot
(`NAME.json`) is what gpudefrag reads from that dump, so both doors see one cluster. Slurm-only situations
(a QOS limit, shared GPUs, multi-node jobs) are written as snapshots directly.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
NOW = 1772357400.0  # 2026-03-01T09:30:00Z
GB = 10**9
H100 = "NVIDIA-H100-80GB-HBM3"
NODE_VERSIONS = {"gpu_model": H100, "driver_version": "550.54.15", "cuda_version": "12.4", "cpu_arch": "amd64",
                 "checkpointer_version": "criu 4.1.1"}
NODES = [f"gpu-node-{i}" for i in range(4)]


def _fixtures() -> Any:
    spec = importlib.util.spec_from_file_location("make_fixtures", ROOT / "tests/kubernetes/fixtures/make_fixtures.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fragmented_pods(f: Any, *, ann: dict[str, str] | None = None, owners: dict[str, tuple[str, str]] | None = None,
                    labels: dict[str, dict[str, str]] | None = None) -> list[dict[str, Any]]:
    """Every node holds 5 busy GPUs (4+1, 2+2+1, 4+1, 3+2): 12 GPUs free, no node with 8."""
    layout = {"gpu-node-0": [4, 1], "gpu-node-1": [2, 2, 1], "gpu-node-2": [4, 1], "gpu-node-3": [3, 2]}
    out = []
    for node, sizes in layout.items():
        for i, g in enumerate(sizes):
            name = f"{node[-1]}-job-{i}"
            size = {"checkpoint-bytes": str(g * (20 if node == "gpu-node-3" else 40) * GB)}
            out.append(f.pod(name, g, ns="ml", node_name=node, labels={"app": name, **(labels or {}).get(name, {})},
                             owner=(owners or {}).get(name), annotations={
                                 "gpudefrag.io/" + k: v for k, v in {**size, **(ann or {})}.items()}))
    return out


def pending(f: Any, name: str = "train-8g", gpus: int = 8, ns: str = "ml", **kw: Any) -> list[dict[str, Any]]:
    unsched = ("0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available: "
               "4 No preemption victims found for incoming pod.")
    p = f.pod(name, gpus, ns=ns, created="2026-03-01T09:00:00Z", message=unsched, labels={"app": name}, **kw)
    return [p, f.event(ns, "Pod", name, "FailedScheduling", unsched)]


def kube_scenarios(f: Any) -> dict[str, list[dict[str, Any]]]:
    nodes = [f.node(n) for n in NODES]
    s = {
        "plain-fragmentation": nodes + fragmented_pods(f) + pending(f),
        # a ResourceQuota never holds back a pod that exists (its `used` counts the pending one already): it
        # refuses to create the pods, and the ReplicaSet's FailedCreate event is all there is (as the real
        # admission says it, tests/kubernetes/real/test_causes_real.py)
        "quota-blocked": nodes + fragmented_pods(f) + [
            f.quota("team-a", 4, 0), f.controller_of("ReplicaSet", "team-a", "train-8g", 8),
            f.event("team-a", "ReplicaSet", "train-8g", "FailedCreate",
                    'Error creating: pods "train-8g-x7k2p" is forbidden: exceeded quota: gpu-quota, requested: '
                    "requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=4",
                    component="replicaset-controller")],
        # the cheapest node to clear holds a StatefulSet's pod: the plan must clear another one
        "non-movable": nodes + fragmented_pods(f, owners={"3-job-0": ("StatefulSet", "kv-cache"),
                                                         "3-job-1": ("StatefulSet", "kv-cache")}) + pending(f),
        "mig-unavailable": [f.node(n) for n in NODES[:3]]
        + [f.node("gpu-node-3", mig={"1g.10gb": 14}, full_gpus=6)] + fragmented_pods(f)[:7]
        + pending(f, "infer-mig", 0, mig="3g.40gb"),
    }
    return s


def to_snapshot(dump: Path) -> dict[str, Any]:
    from gpudefrag.engines.kubernetes import load_kube
    from gpudefrag.snapshot import state_to_dict

    doc = state_to_dict(load_kube(dump).state)
    doc["scheduler"] = "kubernetes"
    for n in doc["nodes"]:
        n["checkpointer_version"] = "criu 4.1.1"
    for w in doc["workloads"]:
        if w.get("labels", {}).get("gpudefrag.io/movable") == "false":
            w["movable"], w["movable_reason"] = False, "statefulset"
    return doc


def node(name: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "gpus": 8, **NODE_VERSIONS, **kw}


def job(wid: str, gpus: int, node_name: str | None, *, share: int = 1000, ckpt_gb: float = 40.0,
        **kw: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"id": wid, "name": wid.split("/")[-1], "gpus_per_node": gpus, "namespace": "ml",
                         "checkpoint_bytes": int(ckpt_gb * GB * max(gpus, 1)), "started_at": NOW - 36000,
                         "submitted_at": NOW - 36000,
                         "versions": {"gpu_model": H100, "gpu_count": gpus, "driver": "550.54.15", "cuda": "12.4",
                                      "cpu_arch": "amd64", "checkpointer": "criu 4.1.1",
                                      "engine": "pytorch 2.4.0"}}
    if share != 1000:
        d["gpu_milli"] = share
    if node_name is None:
        d.update(state="pending", submitted_at=NOW - 1800)
        del d["started_at"]
    else:
        d["placements"] = [{"node": node_name}]
    d.update(kw)
    return d


def fragmented_jobs(**kw: Any) -> list[dict[str, Any]]:
    layout = {"gpu-node-0": [4, 1], "gpu-node-1": [2, 2, 1], "gpu-node-2": [4, 1], "gpu-node-3": [3, 2]}
    return [job(f"ml/{n[-1]}-job-{i}", g, n, **{"ckpt_gb": 20 if n == "gpu-node-3" else 40, **kw})
            for n, sizes in layout.items() for i, g in enumerate(sizes)]


def snapshot_scenarios() -> dict[str, dict[str, Any]]:
    base = {"version": 2, "now": NOW, "nodes": [node(n) for n in NODES]}
    app_ckpt = {"gpudefrag.io/app-checkpoint-at": str(NOW - 120)}
    multi = [j for j in fragmented_jobs() if not j["id"].startswith(("ml/2-", "ml/3-"))]
    multi += [job("ml/2-job-0", 4, "gpu-node-2"), job("ml/3-job-0", 3, "gpu-node-3"),
              job("ml/mpi-pretrain", 1, None, node_count=2, state="running",
                  placements=[{"node": "gpu-node-2"}, {"node": "gpu-node-3"}])]
    for j in multi:
        if j["id"] == "ml/mpi-pretrain":
            j.pop("submitted_at", None)
            j["started_at"] = NOW - 36000
    shared = [job(f"ml/notebook-{n[-1]}{g}", 1, n, share=500, placements=[{"node": n, "gpus": [g]}], ckpt_gb=8)
              for n in NODES[:2] for g in range(8)]
    return {
        "slurm-qos-limit": {**base, "scheduler": "slurm", "workloads": [
            *fragmented_jobs(), job("ml/train-8g", 8, None, scheduler_reason="QOSMaxGRESPerUser")]},
        "slurm-assoc-limit": {**base, "scheduler": "slurm", "workloads": [
            *fragmented_jobs(), job("ml/train-8g", 8, None, scheduler_reason="AssocGrpGRES")]},
        "autoscaler-at-max": {**base, "nodes": [node(n, node_group="gpu-h100") for n in NODES],
                              "node_groups": [{"name": "gpu-h100", "current": 4, "maximum": 4, "gpu_model": H100,
                                               "gpus_per_node": 8}],
                              "workloads": [*fragmented_jobs(), job("ml/train-8g", 8, None)]},
        "partial-gpu": {**base, "nodes": [node(n) for n in NODES[:2]],
                        "workloads": [*shared, job("ml/train-1g", 1, None)]},
        "evict-cheaper": {**base, "workloads": [*fragmented_jobs(ckpt_gb=600, labels=app_ckpt),
                                                job("ml/train-8g", 8, None)]},
        "multi-node-present": {**base, "workloads": [*multi, job("ml/train-8g", 8, None)]},
    }


def main() -> None:
    sys.path.insert(0, str(ROOT / "src"))
    f = _fixtures()
    for name, items in kube_scenarios(f).items():
        dump = HERE / f"{name}.kube.json"
        dump.write_text(json.dumps(f.kube_list(items), indent=1, sort_keys=True) + "\n")
        (HERE / f"{name}.json").write_text(json.dumps(to_snapshot(dump), indent=1) + "\n")
    for name, doc in snapshot_scenarios().items():
        (HERE / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(list(HERE.glob('*.json')))} files to {HERE}")


if __name__ == "__main__":
    main()
