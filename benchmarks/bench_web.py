"""Dashboard: API latency on large clusters, in-process through the ASGI app (routing, views, JSON encoding).

Targets (issue 8: the map "scales to 1,000+ nodes"): one map page (500 nodes) under 1 s and a /metrics scrape
under 2 s on a 10,000-node / 80,000-GPU cluster on the 2-core machine. Baseline in the same run: frag_report
alone on the same state, the core work every view builds on.
"""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from common import Row
from gen_cluster import big_cluster_doc
from gpudefrag.core.fragmentation import frag_report
from gpudefrag.snapshot import load_snapshot_dict
from gpudefrag.web.app import create_app
from gpudefrag.web.source import MemorySource
from gpudefrag.web.views import map_request


def _best(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _get(client: TestClient, url: str) -> None:
    r = client.get(url)
    if r.status_code != 200:
        raise RuntimeError(f"{url}: {r.status_code} {r.text[:200]}")


def run(quick: bool) -> list[Row]:
    rows: list[Row] = []
    sizes = (1_000, 2_000) if quick else (1_000, 10_000)
    repeat = 2 if quick else 3
    for n in sizes:
        doc = big_cluster_doc(nodes=n, target_jobs=n * 5, pending=min(200, n // 50))
        state = load_snapshot_dict(doc, f"<{n} nodes>")
        client = TestClient(create_app(MemorySource(state)))
        base = _best(lambda s=state: frag_report(s, map_request(s)), repeat)
        note = f"{n} nodes, {len(state.workloads)} jobs"
        t_page = _best(lambda c=client: _get(c, "/api/map?limit=500"), repeat)
        big = n >= 10_000
        rows.append(Row("web", f"GET /api/map (500 of {n} nodes)", t_page, "s", "<= 1 s" if big else "",
                        (t_page <= 1.0) if big else None, f"frag_report alone {base:.3f} s", note))
        t_all = _best(lambda c=client, k=n: _get(c, f"/api/map?limit={k}"), repeat)
        rows.append(Row("web", f"GET /api/map (all {n} nodes)", t_all, "s", "", None, "", note))
        t_filter = _best(lambda c=client: _get(c, "/api/map?model=A100&only=stranded&sort=free&q=node-0"), repeat)
        rows.append(Row("web", f"GET /api/map filtered ({n} nodes)", t_filter, "s", "", None, "", note))
        t_metrics = _best(lambda c=client: _get(c, "/metrics"), repeat)
        rows.append(Row("web", f"GET /metrics ({n} nodes)", t_metrics, "s", "<= 2 s" if big else "",
                        (t_metrics <= 2.0) if big else None, f"frag_report alone {base:.3f} s", note))
        t_pending = _best(lambda c=client: _get(c, "/api/pending"), repeat)
        rows.append(Row("web", f"GET /api/pending ({n} nodes)", t_pending, "s", "", None, "", note))
    return rows
