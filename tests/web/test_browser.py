"""The dashboard in real headless Chromium (Debian's package) against `gpudefrag serve` on 127.0.0.1.

Screenshots land in artifacts/web/ (git-ignored) for a human to look at.
"""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from gpudefrag.demo import demo_document

from .conftest import ARTIFACTS, TOKEN, XSS_NAME, XSS_PENDING, LiveServer, big_cluster

pytestmark = pytest.mark.browser


def demo_free_per_node() -> dict[str, int]:
    doc = demo_document()
    free = {n["name"]: n["gpus"] for n in doc["nodes"]}
    for w in doc["workloads"]:
        for p in w.get("placements", []):
            free[p["node"]] -= w["gpus_per_node"]
    return free


def open_dashboard(page: Any, server: LiveServer, dialogs: list[str]) -> None:
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(server.url + "/")
    page.wait_for_selector("body[data-ready='1']")


def test_demo_map_plan_and_apply(page: Any, live_server: LiveServer) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    dialogs: list[str] = []
    errors: list[str] = []
    requests: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda req: requests.append(req.url))
    open_dashboard(page, live_server, dialogs)
    doc = demo_document()

    # the map shows every node, and every GPU of each node
    for n in doc["nodes"]:
        row = page.locator(f"#map .node-row[data-node='{n['name']}']")
        assert row.count() == 1
        assert row.locator(".cell").count() == n["gpus"]
    free = demo_free_per_node()
    assert page.locator("#map .cell.free").count() == sum(free.values())
    # nobody can fit 8 GPUs: every free GPU is stranded for the pending 8-GPU job
    assert page.locator("#map .cell.free.stranded").count() == sum(v for v in free.values() if v < 8)
    owned = sum(w["gpus_per_node"] for w in doc["workloads"] if w.get("state", "running") == "running")
    assert page.locator("#map .cell.owned").count() == owned
    page.screenshot(path=str(ARTIFACTS / "dashboard-demo.png"), full_page=True)

    # clicking the pending 8-GPU job shows its diagnosis and its plan
    page.click("#pending li[data-job='pretrain-8gpu']")
    page.wait_for_selector("[data-testid='diagnosis'] .cause.fragmentation")
    page.wait_for_selector("[data-testid='moves'] tbody tr")
    target = page.inner_text("[data-testid='target-node']")
    assert target in free
    moves = page.locator("[data-testid='moves'] tbody tr")
    assert moves.count() >= 1
    shown = sorted(moves.nth(i).get_attribute("data-move") + "->" + moves.nth(i).locator("td").nth(3).inner_text()
                   for i in range(moves.count()))
    moved_gpus = sum(int(moves.nth(i).locator("td").nth(1).inner_text()) for i in range(moves.count()))
    assert free[target] + moved_gpus == 8
    after_target = page.locator(f"[data-testid='plan-after'] .node-row[data-node='{target}']")
    assert after_target.locator(".cell.free").count() == 8
    page.screenshot(path=str(ARTIFACTS / "dashboard-plan.png"), full_page=True)

    # applying without the token fails and changes nothing
    page.click("[data-testid='apply-plan']")
    page.wait_for_selector("#status.error")
    assert "401" in page.inner_text("#status")
    assert page.locator(f"#map .node-row[data-node='{target}'] .cell.free").count() == free[target]

    # with the token, the map updates: the target node is whole and free, and the job now fits
    page.fill("[data-testid='token']", TOKEN)
    page.click("[data-testid='apply-plan']")
    expect(page.locator("#status")).to_contain_text("applied")
    page.wait_for_selector(f"#map .node-row.fits[data-node='{target}']")
    row = page.locator(f"#map .node-row[data-node='{target}']")
    assert row.locator(".cell.free").count() == 8
    assert row.locator(".cell.stranded").count() == 0
    assert page.inner_text("[data-stat='whole-free nodes'] b") == "1"
    hist = page.locator("#history tbody tr[data-history]")
    expect(hist).to_have_count(len(shown))
    applied = sorted(hist.nth(i).get_attribute("data-history") + "->" + hist.nth(i).locator("td").nth(3).inner_text()
                     for i in range(hist.count()))
    assert applied == shown  # exactly the moves the preview showed
    assert page.locator("#map .cell.owned").count() == owned  # moved, not evicted
    page.set_viewport_size({"width": 640, "height": 900})  # issue 32: the history keeps to a narrow page
    assert page.evaluate("() => { const t = document.querySelector('#history'); "
                         "return t.getBoundingClientRect().right <= document.documentElement.clientWidth + 1; }")
    page.set_viewport_size({"width": 1280, "height": 900})
    page.screenshot(path=str(ARTIFACTS / "dashboard-after-apply.png"), full_page=True)
    assert dialogs == [] and errors == []
    assert requests and all(u.startswith(live_server.url) for u in requests)  # offline: no CDN, nothing else


def test_hostile_names_render_as_text(page: Any, xss_server: LiveServer) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    dialogs: list[str] = []
    open_dashboard(page, xss_server, dialogs)
    legend = page.locator("#workload-legend .item[data-workload='notebook-ana'] .wname")
    assert legend.inner_text() == XSS_NAME
    assert page.locator("#pending li[data-job='pretrain-8gpu'] .jname").inner_text() == XSS_PENDING
    page.click("#pending li[data-job='pretrain-8gpu']")
    page.wait_for_selector("[data-testid='diagnosis']")
    assert "<b onmouseover=alert(3)>Resources</b>" in page.inner_text("#plan")
    cell = page.locator("#map .cell[data-workload='notebook-ana']").first
    assert XSS_NAME in (cell.get_attribute("title") or "")
    cell.click()
    assert page.inner_text("[data-testid='workload-name']") == XSS_NAME
    page.hover("#plan")
    # nothing the data carried became markup: only our own script, no injected img/b elements
    assert page.locator("script").count() == 1
    assert page.locator("img").count() == 0 and page.locator("#plan b[onmouseover]").count() == 0
    assert dialogs == []
    page.screenshot(path=str(ARTIFACTS / "dashboard-xss.png"), full_page=True)


def test_large_cluster_is_grouped_paged_and_filtered(page: Any, big_server: LiveServer) -> None:
    doc = big_cluster()
    open_dashboard(page, big_server, [])
    rows = page.locator("#map .node-row")
    assert rows.count() == 500  # one page
    groups = page.locator("#map .group")
    models = [groups.nth(i).get_attribute("data-model") for i in range(groups.count())]
    assert models == sorted(models)
    seen = {rows.nth(i).get_attribute("data-node") for i in range(rows.count())}
    page.click("#page-next")
    expect(page.locator("#page-info")).to_contain_text("501–1000")
    seen |= {rows.nth(i).get_attribute("data-node") for i in range(rows.count())}
    page.click("#page-next")
    expect(page.locator("#page-info")).to_contain_text(f"1001–{len(doc['nodes'])}")
    seen |= {rows.nth(i).get_attribute("data-node") for i in range(rows.count())}
    assert seen == {n["name"] for n in doc["nodes"]}
    page.select_option("#f-model", "L40S")
    l40 = sum(1 for n in doc["nodes"] if n["gpu_model"] == "L40S")
    expect(page.locator("#page-info")).to_contain_text(f"of {l40} ")
    assert {groups.nth(i).get_attribute("data-model") for i in range(groups.count())} == {"L40S"}
    page.select_option("#f-model", "")
    page.fill("#f-q", "n00003")
    expect(page.locator("#map .node-row[data-node='n00003']")).to_have_count(1)
    expect(page.locator("#map .node-row")).to_have_count(1)
    assert page.locator("#map .node-row").get_attribute("data-node") == "n00003"
    assert page.locator("#map .node-row .cell").count() == 4  # node 3 of the cluster has 4 GPUs
    page.fill("#f-q", "n00001")
    expect(page.locator("#map .node-row[data-node='n00001']")).to_have_count(1)
    shared = page.locator("#map .node-row[data-node='n00001'] .cell").first
    assert shared.locator(".share").count() == 2  # one bar per workload on the shared GPU
    widths = [shared.locator(".share").nth(i).evaluate("e => e.style.width") for i in range(2)]
    assert widths == ["50%", "25%"]
    assert "frac-a (0.50 GPU), frac-b (0.25 GPU), 0.25 GPU free" in (shared.get_attribute("title") or "")
    page.screenshot(path=str(ARTIFACTS / "dashboard-large.png"))


def test_checkpoint_button_records_a_fresh_checkpoint(page: Any, live_server: LiveServer) -> None:
    open_dashboard(page, live_server, [])
    page.fill("[data-testid='token']", TOKEN)
    page.click("#workload-legend .item[data-workload='train-gpt-small']")
    expect(page.locator("#workload-detail")).to_contain_text("last checkpoint 7,200 s ago")
    page.click("[data-testid='checkpoint']")
    expect(page.locator("#status")).to_contain_text("checkpoint recorded for train-gpt-small")
    # the status line comes after the page re-read the state, and the open panel shows it without a click
    assert "last checkpoint 0 s ago" in page.inner_text("#workload-detail")


def test_an_action_during_a_refresh_is_followed_by_a_fresh_one(page: Any, live_server: LiveServer) -> None:
    """A refresh in flight when the checkpoint lands reads the map from before it; the checkpoint's own refresh
    used to be dropped as busy, leaving "checkpoint recorded" beside the old state until the next 15 s tick."""
    open_dashboard(page, live_server, [])
    page.fill("[data-testid='token']", TOKEN)
    page.click("#workload-legend .item[data-workload='train-gpt-small']")
    expect(page.locator("#workload-detail")).to_contain_text("last checkpoint 7,200 s ago")
    held: list[Any] = []  # (route, the map as it was before the checkpoint)

    def hold_the_first(route: Any) -> None:
        if held:
            route.continue_()
        else:
            held.append((route, route.fetch()))

    page.route("**/api/map?*", hold_the_first)
    page.evaluate("() => { refresh(); }")
    for _ in range(250):
        if held:
            break
        page.wait_for_timeout(20)
    assert held, "the refresh never asked for the map"
    with page.expect_response("**/api/workloads/train-gpt-small/checkpoint") as posted:
        page.click("[data-testid='checkpoint']")
    assert posted.value.ok
    route, before = held[0]
    route.fulfill(response=before)  # the refresh in flight ends on the old state
    expect(page.locator("#status")).to_contain_text("checkpoint recorded for train-gpt-small")
    expect(page.locator("#workload-detail")).to_contain_text("last checkpoint 0 s ago")
    expect(page.locator("#map .cell.selected")).to_have_count(3)  # its GPUs stay highlighted on the new map


def test_offline_api_reference_lists_every_operation(page: Any, live_server: LiveServer) -> None:
    import json
    import urllib.request

    with urllib.request.urlopen(live_server.url + "/openapi.json", timeout=10) as r:
        spec = json.load(r)
    want = {f"{m.upper()} {p}" for p, ops in spec["paths"].items() for m in ops}
    requests: list[str] = []
    page.on("request", lambda req: requests.append(req.url))
    page.goto(live_server.url + "/api-docs")
    expect(page.locator(".op[data-op]")).to_have_count(len(want))
    got = {page.locator(".op[data-op]").nth(i).get_attribute("data-op") for i in range(len(want))}
    assert got == want
    assert all(u.startswith(live_server.url) for u in requests)  # nothing from a CDN


def test_a_long_history_keeps_to_a_narrow_page(page: Any, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 32: a real rollback's history (a dozen steps, a reason with checkpoint ids and paths) stays inside the
    page: the steps and reason columns wrap in their cells instead of running off to the right."""
    from gpudefrag.control.journal import Journal
    from gpudefrag.control.journal import MigrationState as S

    j = Journal(tmp_path / "journal.db")
    m = j.create("12345", "node1", "node2", reason="issue 32: free node1")
    ckpt = "12345-20261204T184912141343Z-6c8b3b"
    why = (f"checkpoint {ckpt} failed verification (hash-mismatch: /shared/gpudefrag/store/{ckpt}/pages-1.img: "
           "SHA-256 differs from the manifest)")
    for st in (S.CHECKPOINTING, S.CHECKPOINTED, S.ROLLING_BACK, S.REQUEUED_HELD, S.PINNED, S.RELEASED, S.RESTORING,
               S.ROLLING_BACK, S.REQUEUED_HELD, S.PINNED, S.RELEASED, S.RESTORING, S.ROLLED_BACK):
        m = j.transition(m.id, st, detail=why, reason=why)
    j.close() if hasattr(j, "close") else None
    srv = LiveServer(tmp_path, None, None, journal=tmp_path / "journal.db")
    try:
        page.set_viewport_size({"width": 800, "height": 900})
        page.goto(srv.url + "/")
        page.wait_for_selector("#history tbody tr[data-history='12345']")
        right, width, scroll = page.evaluate(
            "() => [document.querySelector('#history').getBoundingClientRect().right, "
            "document.documentElement.clientWidth, document.documentElement.scrollWidth]")
        page.screenshot(path=str(ARTIFACTS / "dashboard-long-history.png"), full_page=True)
        assert right <= width + 1 and scroll <= width + 1, (right, width, scroll)
    finally:
        srv.stop()
