"""`/metrics` parses with the Prometheus text parser, and its numbers are those of the snapshot, counted here
independently from the snapshot document."""

from __future__ import annotations

from typing import Any

import msgspec
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpudefrag.snapshot import load_snapshot_dict
from gpudefrag.web.app import create_app
from gpudefrag.web.source import MemorySource

from .conftest import TOKEN


def scrape(client: TestClient) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def one(m: dict[str, Any], name: str, **labels: str) -> float:
    return m[name][tuple(sorted(labels.items()))]


def free_per_node(doc: dict[str, Any]) -> dict[str, int]:
    free = {n["name"]: n["gpus"] for n in doc["nodes"]}
    for w in doc["workloads"]:
        if w.get("state", "running") == "running":
            for p in w["placements"]:
                free[p["node"]] -= w["gpus_per_node"]
    return free


def test_metrics_match_the_demo_snapshot(client: TestClient, demo_doc: dict[str, Any]) -> None:
    m = scrape(client)
    free = free_per_node(demo_doc)
    assert one(m, "gpudefrag_gpus") == sum(n["gpus"] for n in demo_doc["nodes"]) == 32
    assert one(m, "gpudefrag_free_gpus") == sum(free.values()) == 12
    assert one(m, "gpudefrag_whole_free_nodes") == sum(1 for n in demo_doc["nodes"] if free[n["name"]] == n["gpus"])
    # no node has 8 free, so every free GPU is stranded for the pending 8-GPU shape
    assert one(m, "gpudefrag_stranded_gpus", shape="8 GPU") == sum(v for v in free.values() if v < 8)
    assert one(m, "gpudefrag_pending_gpu_jobs", cause="fragmentation") == 1
    assert sum(m["gpudefrag_pending_gpu_jobs"].values()) == 1
    running = [w for w in demo_doc["workloads"] if w.get("state", "running") == "running"]
    assert one(m, "gpudefrag_running_jobs") == len(running)
    for w in running:
        assert one(m, "gpudefrag_checkpoint_age_seconds", workload=w["id"]) == demo_doc["now"] - w["last_checkpoint_at"]
    assert one(m, "gpudefrag_checkpoint_age_max_seconds") == max(demo_doc["now"] - w["last_checkpoint_at"]
                                                                  for w in running)
    assert one(m, "gpudefrag_move_duration_seconds_count") == 0
    assert m.get("gpudefrag_moves_total", {}) == {}


def test_metrics_count_applied_moves(client: TestClient) -> None:
    preview = client.get("/api/pending/pretrain-8gpu/plan").json()
    r = client.post("/api/pending/pretrain-8gpu/apply", params={"version": preview["version"]},
                    headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200
    moves = preview["plan"]["moves"]
    m = scrape(client)
    assert one(m, "gpudefrag_moves_total", outcome="done") == len(moves)
    assert one(m, "gpudefrag_move_duration_seconds_count") == len(moves)
    assert abs(one(m, "gpudefrag_move_duration_seconds_sum") - sum(x["cost"]["downtime_s"] for x in moves)) < 1e-6
    moving = sum(x["cost"]["downtime_s"] * x["cost"]["gpus"] for x in moves)
    assert abs(one(m, "gpudefrag_moving_gpu_seconds_total") - moving) < 1e-6
    lost = sum(x["cost"]["lost_work_s"] * x["cost"]["gpus"] for x in moves)
    assert abs(one(m, "gpudefrag_lost_work_gpu_seconds_total") - lost) < 1e-6
    assert one(m, "gpudefrag_whole_free_nodes") == 1
    assert one(m, "gpudefrag_pending_gpu_jobs", cause="fits-now") == 1


@st.composite
def clusters(draw: st.DrawFn) -> dict[str, Any]:
    """Small clusters of whole-GPU jobs placed at random, and sometimes a pending job."""
    n = draw(st.integers(1, 6))
    nodes = [{"name": f"n{i}", "gpus": draw(st.sampled_from([0, 1, 2, 4, 8]))} for i in range(n)]
    workloads: list[dict[str, Any]] = []
    for nd in nodes:
        left = nd["gpus"]
        while left and draw(st.booleans()):
            k = draw(st.integers(1, left))
            workloads.append({"id": f"j{len(workloads)}", "gpus_per_node": k, "placements": [{"node": nd["name"]}]})
            left -= k
    if draw(st.booleans()):
        workloads.append({"id": "wait", "state": "pending", "gpus_per_node": draw(st.integers(1, 8))})
    return {"version": 1, "nodes": nodes, "workloads": workloads}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=clusters())
def test_metrics_match_random_snapshots(doc: dict[str, Any]) -> None:
    c = TestClient(create_app(MemorySource(load_snapshot_dict(doc))))
    m = scrape(c)
    free = free_per_node(doc)
    gpus = {n["name"]: n["gpus"] for n in doc["nodes"]}
    assert one(m, "gpudefrag_free_gpus") == sum(free.values())
    assert one(m, "gpudefrag_whole_free_nodes") == sum(1 for k, v in free.items() if v == gpus[k] > 0)
    biggest = max(max(gpus.values()), 1)
    assert one(m, "gpudefrag_stranded_gpus", shape=f"{biggest} GPU") == sum(v for v in free.values() if v < biggest)
    pending = [w for w in doc["workloads"] if w.get("state") == "pending"]
    assert sum(m["gpudefrag_pending_gpu_jobs"].values()) == len(pending)
    if pending:
        k = pending[0]["gpus_per_node"]
        assert one(m, "gpudefrag_stranded_gpus", shape=f"{k} GPU") == sum(v for v in free.values() if v < k)
        fits = any(v >= k for v in free.values())
        assert (one(m, "gpudefrag_pending_gpu_jobs", cause="fits-now") == 1) is fits


def test_checkpoint_metrics_come_from_the_real_store(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 32: a live source reading the store (`serve --store`) reports the jobs' real checkpoints: not every
    job "never checkpointed" with age 0, and moves priced with their real checkpoint sizes."""
    import os

    from gpudefrag.checkpoint.keys import load_key
    from gpudefrag.checkpoint.store import CheckpointStore
    from gpudefrag.control.controller import enrich_from_store
    from gpudefrag.core.model import Versions
    from gpudefrag.demo import demo_state
    from gpudefrag.engines.sim import SimEngine
    from gpudefrag.web.source import EngineSource

    demo = demo_state()  # as a live engine reports it: no checkpoint known until the store is read
    state = demo.with_workloads([msgspec.structs.replace(w, last_checkpoint_at=None, checkpoint_bytes=0)
                                 for w in demo.workloads])
    load_key(tmp_path / "key", create=True)
    store = CheckpointStore(tmp_path / "store", tmp_path / "key")
    have = [w.id for w in state.running][:2]
    for wid in have:
        with store.create(wid) as p:
            (p.dir / "pages.img").write_bytes(os.urandom(4096))
            p.commit(backend="criu", mode="dump", compat=Versions())
    bare = scrape(TestClient(create_app(EngineSource(SimEngine(state), "sim"))))
    src = EngineSource(SimEngine(state), "sim", enrich=enrich_from_store(store))
    fed = scrape(TestClient(create_app(src)))
    never = "gpudefrag_never_checkpointed_jobs"
    assert one(bare, never) == len(state.running)
    assert one(fed, never) == len(state.running) - len(have)
    got = src.state()
    assert all(got.workload(w).checkpoint_bytes > 0 and got.workload(w).last_checkpoint_at for w in have)
