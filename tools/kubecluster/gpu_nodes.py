"""Print KWOK GPU nodes as a Kubernetes List (`cluster.sh nodes` pipes it into `kubectl apply -f -`).

Each node carries what GPU feature discovery and the NVIDIA device plugin put on a real one: the `nvidia.com/`
labels gpudefrag reads (product, count, driver, CUDA, MIG strategy) and `nvidia.com/gpu` (and
`nvidia.com/mig-<profile>`) in capacity and allocatable; the `kwok.x-k8s.io/node: fake` annotation makes KWOK
keep it Ready and run its pods. One bad option: one line naming it, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def node(name: str, gpus: int, product: str, mig: dict[str, int], taints: list[dict[str, str]]) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "type": "kwok",
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/cuda.driver-version.full": "550.54.15", "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.driver.minor": "54", "nvidia.com/cuda.driver.rev": "15",
        "nvidia.com/cuda.runtime-version.full": "12.4", "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "4", "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "mixed" if mig else "none",
    }
    res = {"cpu": "192", "memory": "2048Gi", "pods": "110", "ephemeral-storage": "3500Gi",
           "nvidia.com/gpu": str(gpus - 1 if mig else gpus)}
    for prof, n in mig.items():
        res[f"nvidia.com/mig-{prof}"] = str(n)
        labels[f"nvidia.com/mig-{prof}.count"] = str(n)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": {"taints": taints} if taints else {},
            "status": {"capacity": res, "allocatable": dict(res)}}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="cluster.sh nodes DIR")
    p.add_argument("--count", type=int, default=4)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--product", default="NVIDIA-H100-80GB-HBM3")
    p.add_argument("--mig", default="", help="PROFILE=N[,PROFILE=N]: slices on one GPU of each node")
    p.add_argument("--prefix", default="gpu-node")
    p.add_argument("--start", type=int, default=0, help="first node number")
    p.add_argument("--taint", action="append", default=[], help="KEY=VALUE:EFFECT")
    a = p.parse_args(argv)
    if a.count < 1 or a.gpus < 1 or (a.mig and a.gpus < 2):
        print("cluster.sh nodes: --count and --gpus must be >= 1 (>= 2 with --mig)", file=sys.stderr)
        return 2
    mig: dict[str, int] = {}
    for part in filter(None, a.mig.split(",")):
        prof, sep, n = part.partition("=")
        if not sep or not n.isdigit():
            print(f"cluster.sh nodes: --mig {part!r}: expected PROFILE=N (e.g. 1g.10gb=7)", file=sys.stderr)
            return 2
        mig[prof] = int(n)
    taints = []
    for t in a.taint:
        kv, sep, effect = t.rpartition(":")
        key, _, value = kv.partition("=")
        if not sep or not key or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            print(f"cluster.sh nodes: --taint {t!r}: expected KEY=VALUE:NoSchedule|PreferNoSchedule|NoExecute",
                  file=sys.stderr)
            return 2
        taints.append({"key": key, "value": value, "effect": effect})
    items = [node(f"{a.prefix}-{i}", a.gpus, a.product, mig, taints) for i in range(a.start, a.start + a.count)]
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
