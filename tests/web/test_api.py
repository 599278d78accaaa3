"""The JSON API behind every view, checked against the snapshot it serves (not against its own functions)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from gpudefrag.core.model import MILLI
from gpudefrag.snapshot import load_snapshot_dict
from gpudefrag.web.app import create_app
from gpudefrag.web.source import MemorySource

from .conftest import TOKEN, big_cluster

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def rows(m: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in m["groups"] for r in g["rows"]]


def expected_cells(doc: dict[str, Any]) -> dict[str, dict[int, list[list[Any]]]]:
    """Per node, per GPU, the (workload, milli) shares — straight from the snapshot document (the demo
    leaves GPU indices to the loader, which hands out the first free ones in document order)."""
    nxt: dict[str, int] = {}
    out: dict[str, dict[int, list[list[Any]]]] = {n["name"]: {} for n in doc["nodes"]}
    for w in doc["workloads"]:
        if w.get("state", "running") != "running":
            continue
        for p in w["placements"]:
            start = nxt.get(p["node"], 0)
            for g in range(start, start + w["gpus_per_node"]):
                out[p["node"]].setdefault(g, []).append([w["id"], MILLI])
            nxt[p["node"]] = start + w["gpus_per_node"]
    return out


def test_map_shows_every_node_and_gpu_with_its_owner(client: TestClient, demo_doc: dict[str, Any]) -> None:
    m = client.get("/api/map").json()
    got = {r["name"]: r for r in rows(m)}
    assert set(got) == {n["name"] for n in demo_doc["nodes"]}
    want = expected_cells(demo_doc)
    for n in demo_doc["nodes"]:
        r = got[n["name"]]
        assert len(r["cells"]) == n["gpus"]
        for g, cell in enumerate(r["cells"]):
            assert cell["shares"] == want[n["name"]].get(g, [])
            assert cell["free_milli"] == (MILLI if not want[n["name"]].get(g) else 0)
    running = {w["id"] for w in demo_doc["workloads"] if w.get("state", "running") == "running"}
    assert {w["id"] for w in m["workloads"]} == running


def test_stranded_gpus_are_marked_for_the_largest_pending_request(client: TestClient, demo_doc) -> None:
    m = client.get("/api/map").json()
    assert m["request_gpus_per_node"] == 8  # the pending 8-GPU job is the largest
    used = {n["name"]: 0 for n in demo_doc["nodes"]}
    for w in demo_doc["workloads"]:
        for p in w.get("placements", []):
            used[p["node"]] += w["gpus_per_node"]
    for r in rows(m):
        free = 8 - used[r["name"]]
        assert r["free_gpus"] == free
        assert r["fits"] is (free >= 8)
        assert r["stranded_gpus"] == (0 if free >= 8 else free)
    # a smaller request shape: 3 free GPUs fit on nodes a and d, so only b and c strand theirs
    m3 = client.get("/api/map", params={"gpus": 3}).json()
    assert {r["name"] for r in rows(m3) if r["stranded_gpus"]} == {
        n for n, u in used.items() if 8 - u < 3
    }


def test_map_scales_groups_filters_sorts_and_pages() -> None:
    doc = big_cluster()
    c = TestClient(create_app(MemorySource(load_snapshot_dict(doc))))
    seen: list[str] = []
    offset = 0
    while True:
        m = c.get("/api/map", params={"offset": offset, "limit": 500}).json()
        assert m["total_nodes"] == len(doc["nodes"]) == m["matching_nodes"]
        page = rows(m)
        if not page:
            break
        models = [g["model"] for g in m["groups"]]
        assert models == sorted(models) and len(set(models)) == len(models)  # grouped by model, in order
        seen.extend(r["name"] for r in page)
        offset += 500
    assert sorted(seen) == sorted(n["name"] for n in doc["nodes"])  # every node exactly once
    assert len(seen) == len(set(seen))

    l40 = c.get("/api/map", params={"model": "L40S", "limit": 5000}).json()
    assert {r["model"] for r in rows(l40)} == {"L40S"}
    assert l40["matching_nodes"] == sum(1 for n in doc["nodes"] if n["gpu_model"] == "L40S")

    by_free = rows(c.get("/api/map", params={"model": "H100-80GB", "sort": "free", "limit": 5000}).json())
    frees = [r["free_gpus"] for r in by_free]
    assert frees == sorted(frees, reverse=True)

    hit = rows(c.get("/api/map", params={"q": "job-10"}).json())
    # job-10 and job-100..job-1098 (even ids) live on their own node each
    expected = {f"n{i:05d}" for i in range(0, 1200, 2) if f"job-{i}".startswith("job-10")}
    assert {r["name"] for r in hit} == expected

    stranded = rows(c.get("/api/map", params={"only": "stranded", "limit": 5000}).json())
    assert stranded and all(r["stranded_gpus"] > 0 and not r["fits"] for r in stranded)


def test_fractional_shares_are_visible_per_gpu() -> None:
    c = TestClient(create_app(MemorySource(load_snapshot_dict(big_cluster()))))
    row = rows(c.get("/api/map", params={"q": "n00001"}).json())[0]
    assert row["name"] == "n00001"
    assert row["cells"][0] == {"free_milli": 250, "shares": [["frac-a", 500], ["frac-b", 250]]}
    assert row["free_gpus"] == 7  # the shared GPU is not wholly free


def test_pending_job_has_its_diagnosis(client: TestClient) -> None:
    jobs = client.get("/api/pending").json()
    assert [j["id"] for j in jobs] == ["pretrain-8gpu"]
    d = jobs[0]["diagnosis"]
    # 12 GPUs free, none of the 8-GPU nodes has 8: fragmentation and nothing ordinary
    assert d["primary"] == "fragmentation" and d["is_fragmentation"]
    assert d["causes"][0]["evidence"]["free_gpus"] == 12
    assert d["scheduler_reason"] == "Resources"


def test_plan_preview_frees_the_target_node(client: TestClient) -> None:
    p = client.get("/api/pending/pretrain-8gpu/plan").json()
    assert p["available"], p["message"]
    plan = p["plan"]
    assert plan["feasible"] and plan["moves"]
    target = plan["target_node"]
    assert all(m["source"] == target and m["target"] != target for m in plan["moves"])
    before = {r["name"]: r for r in p["before"]}
    after = {r["name"]: r for r in p["after"]}
    assert before[target]["free_gpus"] < 8 and after[target]["free_gpus"] == 8 and after[target]["fits"]
    moved = sum(m["gpus"] for m in plan["moves"])
    assert before[target]["free_gpus"] + moved == 8
    assert p["after_summary"]["whole_free_nodes"] == 1
    assert all(m["cost"]["total_s"] >= 0 for m in plan["moves"])


def test_apply_plan_with_token_changes_the_cluster(client: TestClient) -> None:
    v0 = client.get("/api/config").json()["version"]
    preview = client.get("/api/pending/pretrain-8gpu/plan").json()
    r = client.post("/api/pending/pretrain-8gpu/apply", params={"version": preview["version"]}, headers=AUTH)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["version"] == v0 + 1 and body["moves"] == len(preview["plan"]["moves"])
    target = preview["plan"]["target_node"]
    row = next(x for x in rows(client.get("/api/map").json()) if x["name"] == target)
    assert row["free_gpus"] == 8 and all(c["shares"] == [] for c in row["cells"])
    assert client.get("/api/summary").json()["whole_free_nodes"] == 1
    assert client.get("/api/pending").json()[0]["diagnosis"]["primary"] == "fits-now"
    hist = client.get("/api/history").json()["moves"]
    # exactly the previewed moves were applied (not a re-plan that may break ties differently)
    shown = sorted((m["workload_id"], m["source"], m["target"]) for m in preview["plan"]["moves"])
    assert sorted((h["workload_id"], h["source"], h["target"]) for h in hist) == shown
    assert sorted((m["workload_id"], m["source"], m["target"]) for m in body["plan"]["moves"]) == shown
    assert all(h["origin"] == "dashboard" and h["state"] == "done" for h in hist)
    samples = client.get("/api/timeseries").json()
    assert [s["whole_free_nodes"] for s in samples] == [0, 1]
    # the preview is stale now: applying it again is refused
    again = client.post("/api/pending/pretrain-8gpu/apply", params={"version": preview["version"]}, headers=AUTH)
    assert again.status_code == 409


def test_mutations_without_the_token_answer_401_and_change_nothing(client: TestClient) -> None:
    before = (client.get("/api/map").json(), client.get("/api/config").json()["version"])
    bad = [{}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": f"Basic {TOKEN}"},
           {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": TOKEN}]
    for headers in bad:
        for url in ("/api/pending/pretrain-8gpu/apply", "/api/workloads/train-resnet/checkpoint"):
            r = client.post(url, headers=headers)
            assert r.status_code == 401, (url, headers, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
    after = (client.get("/api/map").json(), client.get("/api/config").json()["version"])
    assert after == before
    assert client.get("/api/history").json()["moves"] == []


def test_actions_are_off_unless_enabled(readonly_client: TestClient) -> None:
    cfg = readonly_client.get("/api/config").json()
    assert cfg["actions_enabled"] is cfg["can_apply"] is cfg["can_checkpoint"] is False
    r = readonly_client.post("/api/pending/pretrain-8gpu/apply", headers=AUTH)
    assert r.status_code == 403
    assert readonly_client.get("/api/summary").json()["whole_free_nodes"] == 0


def test_checkpoint_action_refreshes_the_checkpoint(client: TestClient, demo_doc: dict[str, Any]) -> None:
    now = demo_doc["now"]
    r = client.post("/api/workloads/train-gpt-small/checkpoint", headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["last_checkpoint_at"] == now and r.json()["mode"] == "recorded"
    assert client.get("/api/workloads/train-gpt-small").json()["last_checkpoint_at"] == now
    assert client.post("/api/workloads/pretrain-8gpu/checkpoint", headers=AUTH).status_code == 409
    assert client.post("/api/workloads/nope/checkpoint", headers=AUTH).status_code == 404


def test_unknown_and_running_jobs_have_no_plan(client: TestClient) -> None:
    assert client.get("/api/pending/nope/plan").status_code == 404
    assert client.get("/api/pending/train-resnet/plan").status_code == 409


def test_history_without_a_journal_is_empty_and_says_why(client: TestClient) -> None:
    h = client.get("/api/history").json()
    assert h == {"moves": [], "note": "no journal configured (serve --journal FILE)"}


def test_page_is_served_with_a_strict_content_security_policy(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert client.get("/static/app.js").status_code == 200


def test_loopback_server_rejects_foreign_host_headers(source: MemorySource) -> None:
    c = TestClient(create_app(source, allowed_hosts=["127.0.0.1", "localhost"]), base_url="http://127.0.0.1")
    assert c.get("/api/summary").status_code == 200
    assert c.get("/api/summary", headers={"Host": "attacker.example"}).status_code == 400


def test_history_and_metrics_read_the_real_journal(source: MemorySource, tmp_path) -> None:
    from gpudefrag.control.journal import Journal, MigrationState

    clock = iter([100.0, 130.0, 200.0, 205.0, 300.0]).__next__  # one reading per create/transition
    path = tmp_path / "journal.sqlite"
    with Journal(path, clock=clock) as j:
        a = j.create("train-resnet", "gpu-node-a", "gpu-node-b", reason="make room for pretrain-8gpu")
        j.transition(a.id, MigrationState.DONE, detail="restored")
        b = j.create("rl-agent", "gpu-node-d", "gpu-node-c", reason="make room")
        j.transition(b.id, MigrationState.ROLLED_BACK, detail="restore refused: incompatible", reason="incompatible")
        j.create("eval-harness", "gpu-node-c", "gpu-node-a")
    c = TestClient(create_app(source, journal=path))
    h = c.get("/api/history").json()
    assert h["note"] == ""
    got = [(m["workload_id"], m["state"], m["origin"], [s["state"] for s in m["steps"]]) for m in h["moves"]]
    assert got == [
        ("eval-harness", "planned", "journal", ["planned"]),
        ("rl-agent", "rolled-back", "journal", ["planned", "rolled-back"]),
        ("train-resnet", "done", "journal", ["planned", "done"]),
    ]
    assert h["moves"][1]["reason"] == "incompatible"
    from .test_metrics import one, scrape

    m = scrape(c)
    assert {k[0][1]: v for k, v in m["gpudefrag_moves_total"].items()} == {"done": 1, "rolled-back": 1, "planned": 1}
    assert one(m, "gpudefrag_move_duration_seconds_count") == 2  # the planned one has not finished
    assert one(m, "gpudefrag_move_duration_seconds_sum") == 30 + 5
    # GPU-seconds moving: train-resnet holds 3 GPUs for 30 s, rl-agent 2 for 5 s, eval-harness 1 for 0 s
    assert one(m, "gpudefrag_moving_gpu_seconds_total") == 3 * 30 + 2 * 5


def test_a_live_engine_is_observed_and_read_only() -> None:
    from gpudefrag.demo import demo_state
    from gpudefrag.engines.sim import SimEngine
    from gpudefrag.web.source import EngineSource

    now = [0.0]
    engine = SimEngine(demo_state())
    src = EngineSource(engine, "sim-engine", ttl_s=5.0, clock=lambda: now[0])
    c = TestClient(create_app(src, token=TOKEN))
    cfg = c.get("/api/config").json()
    assert cfg["engine"] == "sim-engine" and not cfg["mutable"]
    assert cfg["can_checkpoint"] and not cfg["can_apply"]
    assert c.get("/api/summary").json()["free_gpus"] == 12
    assert len(c.get("/api/timeseries").json()) == 1  # observed once within the TTL
    now[0] = 6.0
    assert len(c.get("/api/timeseries").json()) == 2  # the TTL passed: observed again, one more sample
    r = c.post("/api/pending/pretrain-8gpu/apply", headers=AUTH)
    assert r.status_code == 409 and "read-only" in r.json()["detail"]
    assert c.get("/api/summary").json()["whole_free_nodes"] == 0
    # a checkpoint on a live engine is a USR2 to the job's wrapper (gpudefrag run checkpoints on it)
    assert c.post("/api/workloads/train-resnet/checkpoint").status_code == 401
    assert engine.calls == []
    r = c.post("/api/workloads/train-resnet/checkpoint", headers=AUTH)
    assert r.status_code == 200 and r.json()["mode"] == "signalled"
    assert engine.calls == [("signal:USR2", "train-resnet")]
    assert c.post("/api/workloads/pretrain-8gpu/checkpoint", headers=AUTH).status_code == 409


def test_pending_counts_gpu_jobs_and_would_fit_names_only_clearable_nodes() -> None:
    """A pending CPU-only pod is not a pending GPU job; a node that holds one job as large as the request is not
    one that 'would fit it by moving 1 job' (that job could only go where the request could go itself)."""
    nodes = [{"name": n, "gpus": 8} for n in ("a", "b", "c", "d")]
    doc = {"nodes": nodes, "workloads": [
        {"id": "ml/big-a", "gpus_per_node": 8, "placements": [{"node": "a"}]},
        {"id": "ml/x", "gpus_per_node": 4, "placements": [{"node": "b"}]},
        {"id": "ml/y", "gpus_per_node": 2, "placements": [{"node": "b"}]},
        {"id": "ml/z", "gpus_per_node": 3, "placements": [{"node": "c"}]},
        {"id": "ml/w", "gpus_per_node": 4, "placements": [{"node": "d"}]},
        {"id": "ml/train-8g", "gpus_per_node": 8, "state": "pending", "submitted_at": 1.0},
        {"id": "ml/web-cpu", "gpus_per_node": 0, "cpu_milli": 500, "state": "pending", "submitted_at": 2.0}]}
    c = TestClient(create_app(MemorySource(load_snapshot_dict(doc))))
    assert c.get("/api/summary").json()["pending"] == 1
    (job,) = c.get("/api/pending").json()
    frag = job["diagnosis"]["causes"][0]
    assert frag["code"] == "fragmentation"
    assert "a" not in frag["evidence"]["clearable_nodes"] and "(e.g. a" not in frag["summary"], frag
