"""Move downtime on Kubernetes with state, beside the Slurm path's CRIU move of the same bytes (issue 26).

Kubernetes: the lab of scripts/e2e-kube-stateful.sh (a control plane, two real kubelet nodes with containerd,
runc and CRIU, the lab registry on 127.0.0.1), the node agent deployed as its DaemonSet by `kubectl apply -k`
(the controller scaled to 0: this process is the executor), a counter pod holding N MiB (HOLD_MIB: touched,
resident) on real-a, moved to real-b: agent checkpoint through the kubelet → signed OCI checkpoint image pushed
→ digest/signature/compatibility checked → replacement created from it on real-b → Ready → original evicted.
Downtime is what the workload saw: the largest gap between two consecutive counts in the replacement's log
(`kubectl logs --timestamps`; the log up to the checkpoint is the original's, carried in the checkpoint).

Slurm path: `bench_checkpoint.move_downtime(..., "plain", disk)`: a probe job holding the same MiB dumped by
CRIU to one folder, copied to another, restored (what a Slurm move does between nodes sharing storage, without
the store's hashing); its largest step gap. Same machine, same run, one after the other.

Needs root and the builds of `./scripts/test.sh` (tools/kubecluster, tools/kubenode, the gpudefrag image);
without them one row says why. Sizes: 100 MiB (`--quick`), and 1 GiB.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench_checkpoint import PLACES, move_downtime
from common import Row

REPO = Path(__file__).resolve().parents[1]
AREA = "kubernetes-move"
CLUSTER_SH = REPO / "tools/kubecluster/cluster.sh"
NODE_SH = REPO / "tools/kubenode/node.sh"


def _e2e() -> Any:
    """scripts/e2e_kube_stateful.py: the lab, its overlay of deploy/kubernetes and its pods, not copied."""
    spec = importlib.util.spec_from_file_location("e2e_kube_stateful", REPO / "scripts" / "e2e_kube_stateful.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (kubelets, containerd)"
    if not shutil.which("criu"):
        return "no criu (scripts/install-criu.sh)"
    for b in (REPO / "tools/kubecluster/build.sh", REPO / "tools/kubenode/build.sh"):
        p = subprocess.run([str(b)], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "GPUDEFRAG_KUBE_NO_BUILD": "1"})
        if p.returncode != 0:
            return f"{b.relative_to(REPO)}: not built ({(p.stderr.strip().splitlines() or ['?'])[-1]})"
    return None


def largest_count_gap(log: str) -> float:
    """The largest time between two consecutive `count N` lines of `kubectl logs --timestamps`."""
    times = []
    for line in log.splitlines():
        ts, _, text = line.partition(" ")
        if text.startswith("count "):
            times.append(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp())
    return max((b - a for a, b in itertools.pairwise(times)), default=float("nan"))


def _deploy_agent(e2e: Any, lab: Any, work: Path) -> Path:
    """The node agent by `kubectl apply -k` (the e2e overlay), the controller scaled to 0; returns the key."""
    key = e2e.install_key(lab, work)
    image = e2e.build_image(lab)
    lab.kubectl("apply", "-k", str(e2e.overlay(lab, work, image)), timeout=180)
    lab.kubectl("-n", "gpudefrag", "scale", "deployment", "gpudefrag-controller", "--replicas=0")
    e2e.wait("the node agent Running on real-a", lambda: any(
        e2e.ready(p) and p["spec"].get("nodeName") == "real-a"
        for p in lab.get("-n", "gpudefrag-node", "pods")["items"]), 300)
    return key


def _kube_move(e2e: Any, lab: Any, key: Path, mb: int) -> dict[str, float]:
    from gpudefrag.checkpoint.keys import load_key
    from gpudefrag.checkpoint.oci_registry import Registry, image_verifier
    from gpudefrag.engines.kubernetes import SimpleMove, build_move, load_kube
    from gpudefrag.engines.kubernetes.executor import ClientKubeApi, SequenceRunner, StepResult
    from kubernetes import config

    name = f"hold-{mb}"
    pod = e2e.pod(name, "ml", 1, f"{lab.registry}/gpudefrag/counter:dev", node="real-a")
    pod["spec"]["restartPolicy"] = "Never"
    pod["spec"]["containers"][0]["env"] = [{"name": "HOLD_MIB", "value": str(mb)}]
    lab.apply(pod)
    e2e.wait(f"{name} counting", lambda: len(e2e.counts(lab.kubectl("-n", "ml", "logs", name).stdout)) > 5, 600)
    os.environ["KUBECONFIG"] = str(lab.dir / "admin.kubeconfig")
    cluster = load_kube(live=True)
    seq = build_move(cluster, SimpleMove(f"ml/{name}", "real-a", "real-b"))
    if not seq.ok:
        raise RuntimeError(f"move refused: {seq.refused}")
    marks: dict[str, float] = {}

    def step(_: Any, s: StepResult) -> None:
        marks[s.op] = time.perf_counter()

    runner = SequenceRunner(ClientKubeApi(config.new_client_from_config(os.environ["KUBECONFIG"])), poll_s=0.1,
                            verify_image=image_verifier(Registry(f"http://{lab.registry}"), load_key(key)))
    runner.on_step = step
    t0 = time.perf_counter()
    res = runner.run(seq, cluster.state.workload(f"ml/{name}").versions)
    if not res.ok:
        raise RuntimeError(f"the move failed: {res.error}")
    e2e.wait("the replacement counting on", lambda: len(e2e.counts(lab.kubectl(
        "-n", "ml", "logs", seq.replacement).stdout)) > 10, 120)
    log = lab.kubectl("-n", "ml", "logs", "--timestamps", seq.replacement).stdout
    text = lab.kubectl("-n", "ml", "logs", seq.replacement).stdout
    started = sum(1 for ln in text.splitlines() if ln.startswith("started "))
    lab.kubectl("-n", "ml", "delete", "pod", seq.replacement, "--grace-period=0", "--wait=false")
    return {"downtime": largest_count_gap(log), "restored": float(started == 1),
            "checkpoint_push": marks["wait-agent-checkpoint"] - t0,
            "verify": marks["verify-checkpoint-image"] - marks["wait-agent-checkpoint"],
            "create_ready": marks["wait-ready"] - marks["verify-checkpoint-image"],
            "total": marks["wait-deleted"] - t0}


def run(quick: bool) -> list[Row]:
    why = _unavailable()
    if why:
        return [Row(AREA, "kubernetes move downtime", float("nan"), "s", note=f"not measured: {why}")]
    from gpudefrag.checkpoint.criu import CriuBackend

    e2e = _e2e()
    sizes = [100] if quick else [100, 1024]
    work = Path(tempfile.mkdtemp(prefix="gpudefrag-bench-kube-", dir="/var/tmp"))
    d = work / "lab"
    d.mkdir()
    kube: dict[int, dict[str, float]] = {}
    try:
        subprocess.run([str(CLUSTER_SH), "start", str(d)], check=True, capture_output=True, timeout=600)
        subprocess.run([str(NODE_SH), "lab-up", str(d), "2"], check=True, capture_output=True, timeout=900)
        lab = e2e.Lab(d)
        key = _deploy_agent(e2e, lab, work)
        for mb in sizes:
            kube[mb] = _kube_move(e2e, lab, key, mb)
    finally:
        subprocess.run([str(NODE_SH), "lab-down", str(d)], capture_output=True, timeout=600)
        subprocess.run([str(CLUSTER_SH), "stop", str(d)], capture_output=True, timeout=120)
        shutil.rmtree(work, ignore_errors=True)
    be = CriuBackend(log_dir=Path(tempfile.gettempdir()) / "gpudefrag-bench-logs")
    PLACES["disk"].mkdir(parents=True, exist_ok=True, mode=0o700)
    rows: list[Row] = []
    try:
        for mb in sizes:
            ok, criu_gap = move_downtime(be, mb, "plain", PLACES["disk"])
            k = kube[mb]
            fail = "" if ok and k["restored"] == 1.0 else "FAIL: a restore did not verify; "
            rows += [
                Row(AREA, f"kubernetes move downtime {mb} MiB", k["downtime"], "s", note=fail + (
                    f"workload's largest count gap; checkpoint+push {k['checkpoint_push']:.2f} s, verify "
                    f"{k['verify']:.2f} s, create->Ready {k['create_ready']:.2f} s, whole move {k['total']:.2f} s")),
                Row(AREA, f"CRIU move downtime (Slurm path, plain) {mb} MiB", criu_gap, "s", note=fail),
                Row(AREA, f"kubernetes/CRIU downtime {mb} MiB", k["downtime"] / criu_gap, "ratio",
                    baseline="the same MiB moved by CRIU dump-copy-restore on the same machine",
                    note=json.dumps({x: round(v, 3) for x, v in k.items()})),
            ]
    finally:
        shutil.rmtree(PLACES["disk"], ignore_errors=True)
    return rows
