"""Issue 15, dashboard: every page carries the CSP and frame headers and loads nothing from elsewhere (FastAPI's
CDN-backed /docs and /redoc are off), and `--host 127.0.0.2` serves under the address it was told to bind."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpudefrag.web.app import CSP, STATIC, create_app
from gpudefrag.web.server import LOOPBACK_HOSTS, allowed_hosts
from gpudefrag.web.source import MemorySource

from .conftest import TOKEN, LiveServer

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/docs/oauth2-redirect", "/openapi.json", "/", "/api-docs",
                                  "/no-such-page", "/api/workloads/nope/plan"])
def test_every_answer_carries_the_csp_and_frame_headers(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.headers.get("content-security-policy") == CSP, (path, r.status_code)
    assert r.headers.get("x-frame-options") == "DENY"
    assert r.headers.get("x-content-type-options") == "nosniff"


def test_cdn_pages_are_gone_and_the_schema_stays(client: TestClient) -> None:
    """Before: /docs and /redoc answered 200 with <script src="https://cdn.jsdelivr.net/..."> and no CSP."""
    for path in ("/docs", "/redoc"):
        assert client.get(path).status_code == 404
    schema = client.get("/openapi.json")
    assert schema.status_code == 200 and schema.json()["info"]["title"] == "gpudefrag dashboard"


def test_no_page_loads_anything_from_another_origin() -> None:
    """Every src/href in the shipped pages and scripts is same-origin (the CSP would block the rest anyway)."""
    for f in STATIC.iterdir():
        text = f.read_text()
        refs = re.findall(r"(?:src|href)\s*=\s*[\"']([^\"']+)", text) + re.findall(r"url\(([^)]+)\)", text)
        assert not [r for r in refs if re.match(r"\W*(https?:)?//", r)], (f.name, refs)
        assert not re.search(r"\bimport\s*\(|@import", text), f.name  # no module or stylesheet pulled in


def test_the_bind_address_is_an_allowed_host() -> None:
    assert allowed_hosts("127.0.0.2", allow_remote=False) == [*LOOPBACK_HOSTS, "127.0.0.2"]
    assert allowed_hosts("::1", allow_remote=False) == LOOPBACK_HOSTS
    assert "[::2]" in (allowed_hosts("::2", allow_remote=False) or [])
    assert allowed_hosts("0.0.0.0", allow_remote=True) is None


def test_a_127_0_0_2_app_answers_its_own_host_and_refuses_others(source: MemorySource) -> None:
    app = create_app(source, allowed_hosts=allowed_hosts("127.0.0.2", allow_remote=False))
    assert TestClient(app, base_url="http://127.0.0.2:8765").get("/api/config").status_code == 200
    assert TestClient(app, base_url="http://rebind.example:8765").get("/api/config").status_code == 400


def test_serve_on_127_0_0_2_works_end_to_end(tmp_path: Path) -> None:
    """Before: the server bound 127.0.0.2 but answered every request 'Invalid host header' (400)."""
    srv = LiveServer(tmp_path, None, TOKEN, host="127.0.0.2")
    try:
        with urllib.request.urlopen(srv.url + "/api/config", timeout=10) as r:
            assert r.status == 200 and json.load(r)["actions_enabled"] is True
        req = urllib.request.Request(srv.url + "/api/config", headers={"Host": "rebind.example"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 400
    finally:
        srv.stop()
