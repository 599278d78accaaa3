"""The real controller loop (gpudefrag.control.Controller) driving Kubernetes moves: KubernetesEngine over a
recorded dump and the in-memory API, KubeMoveExecutor, the SQLite journal, the deployment's policy."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import yaml

from gpudefrag.control.controller import Controller
from gpudefrag.control.executor import ExecutorConfig
from gpudefrag.control.journal import Journal, MigrationState
from gpudefrag.control.kube_executor import KubeMoveExecutor
from gpudefrag.engines.kubernetes import InMemoryApi, KubernetesEngine, load_dump
from gpudefrag.policy.loader import parse_policy

HERE = Path(__file__).parent
FRAG = HERE / "fixtures" / "fragmentation.json"
NOW = datetime.fromisoformat("2026-03-01T10:00:00+00:00").timestamp()


def test_controller_moves_pods_under_the_policy(tmp_path: Path) -> None:
    cm = yaml.safe_load((HERE.parents[1] / "deploy/kubernetes/configmap.yaml").read_text())
    policy = parse_policy(yaml.safe_load(cm["data"]["policy.yaml"]), "configmap.yaml")
    api = InMemoryApi(load_dump(FRAG))
    engine = KubernetesEngine(dump=FRAG, api=api)
    with Journal(tmp_path / "journal.db", clock=lambda: NOW) as journal:
        ex = KubeMoveExecutor(engine, journal, ExecutorConfig.from_policy(policy), verify_image=api.verify_image,
                              clock=lambda: NOW, sleep=lambda s: None)
        ctl = Controller(engine, policy, ex, clock=lambda: NOW)  # type: ignore[arg-type]
        first = ctl.cycle()
        kinds = [d.kind for d in first.decisions]
        assert "trigger" in kinds and "plan" in kinds and "submit" in kinds
        # two moves off gpu-node-3; the policy allows one move per node in flight: the plan starts with the first
        # and carries the second to the following cycles
        started = next(d for d in first.decisions if d.kind == "plan-started")
        assert "1 of 2 move(s) started, 1 more in following cycles" in started.reason, started.reason
        assert first.open_plans and first.open_plans[0]["id"] == started.detail["plan"]
        submitted = [m for m in journal.all()]
        assert len(submitted) == 1 and submitted[0].state is MigrationState.PLANNED
        second = ctl.cycle()
        done = journal.get(submitted[0].id)
        assert done.state is MigrationState.DONE, journal.steps(done.id)
        assert any(d.kind == "progress" and "done" in d.reason for d in second.decisions)
        # the second move is journaled in the same cycle the first one ended, under the same plan
        assert len(journal.all()) == 2 and journal.all()[1].data["plan"]["id"] == started.detail["plan"]
        third = ctl.cycle()
        assert all(m.state is MigrationState.DONE for m in journal.all())
        fin = [d for d in third.decisions if d.kind == "plan-finished"]
        assert fin and "2 of 2 move(s) made" in fin[0].reason and "gpu-node-3 is freed" in fin[0].reason
        assert third.open_plans == []
        # the pod is left to the scheduler for a while (the in-memory API binds nothing): no second plan
        fourth = ctl.cycle()
        assert any(d.kind == "skip" and "finished 0 s ago" in d.reason for d in fourth.decisions)
        assert len(journal.all()) == 2
    ns, name = done.workload_id.split("/")
    assert (ns, name) not in api.pods
    assert any(p["metadata"].get("annotations", {}).get("gpudefrag.io/migrated-from") == done.workload_id
               for p in api.pods.values())
    # never a Job's or StatefulSet's pod
    assert done.workload_id not in ("ml/finetune-0", "ml/train-small-q8x2z")
