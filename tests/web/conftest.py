"""Dashboard fixtures: the app in-process (TestClient), and the real `gpudefrag serve` in a subprocess."""

from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpudefrag.demo import demo_document
from gpudefrag.snapshot import load_snapshot_dict, write_json_atomic
from gpudefrag.web.app import create_app
from gpudefrag.web.source import MemorySource

TOKEN = "test-token-0123456789abcdef"
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "web"
XSS_NAME = "<script>alert(1)</script>"
XSS_PENDING = "<img src=x onerror=alert(2)>"


def xss_document() -> dict:
    """The demo with hostile names on a running job, a pending job and a node label."""
    doc = copy.deepcopy(demo_document())
    for w in doc["workloads"]:
        if w["id"] == "notebook-ana":
            w["name"] = XSS_NAME
        if w["id"] == "pretrain-8gpu":
            w["name"] = XSS_PENDING
            w["scheduler_reason"] = "<b onmouseover=alert(3)>Resources</b>"
    return doc


def big_cluster(n: int = 1200) -> dict[str, Any]:
    models = ["A100-40GB", "H100-80GB", "L40S"]
    nodes = [{"name": f"n{i:05d}", "gpus": 8 if i % 3 else 4, "gpu_model": models[i % 3]} for i in range(n)]
    workloads = [
        {"id": f"job-{i}", "gpus_per_node": (i % 4) + 1, "placements": [{"node": f"n{i:05d}"}]}
        for i in range(0, n, 2)
    ]
    # two workloads sharing one GPU of node 1 (odd nodes are otherwise empty)
    workloads += [
        {"id": "frac-a", "gpus_per_node": 1, "gpu_milli": 500, "placements": [{"node": "n00001", "gpus": [0]}]},
        {"id": "frac-b", "gpus_per_node": 1, "gpu_milli": 250, "placements": [{"node": "n00001", "gpus": [0]}]},
    ]
    workloads.append({"id": "big", "state": "pending", "gpus_per_node": 8})
    return {"version": 1, "name": "big", "nodes": nodes, "workloads": workloads}


@pytest.fixture
def demo_doc() -> dict:
    return demo_document()


@pytest.fixture
def source() -> MemorySource:
    return MemorySource(load_snapshot_dict(demo_document(), "<demo>"))


@pytest.fixture
def client(source: MemorySource) -> Iterator[TestClient]:
    with TestClient(create_app(source, token=TOKEN)) as c:
        yield c


@pytest.fixture
def readonly_client(source: MemorySource) -> Iterator[TestClient]:
    with TestClient(create_app(source, token=None)) as c:
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_cmd(*args: str) -> list[str]:
    return [sys.executable, "-c", "from gpudefrag.cli.main import run; run()", "serve", *args]


class LiveServer:
    """`gpudefrag serve` in a subprocess on `host` (127.0.0.1), stopped (SIGINT, then kill) when the test ends."""

    def __init__(self, tmp: Path, snapshot: dict | None, token: str | None, host: str = "127.0.0.1",
                 journal: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        args = ["--host", host, "--port", str(self.port)]
        if journal is not None:
            args += ["--journal", str(journal)]
        if snapshot is not None:
            snap = tmp / "snapshot.json"
            write_json_atomic(snap, snapshot)
            args += ["--snapshot", str(snap)]
        if token is not None:
            tf = tmp / "token"
            tf.write_text(token + "\n")
            tf.chmod(0o600)
            args += ["--enable-actions", "--token-file", str(tf)]
        self.log = (tmp / "server.log").open("w+")
        self.proc = subprocess.Popen(serve_cmd(*args), stdout=self.log, stderr=subprocess.STDOUT, cwd=tmp,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                self.log.seek(0)
                raise RuntimeError(f"dashboard did not start: {self.log.read()[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[LiveServer]:
    """The embedded demo cluster, actions enabled with TOKEN."""
    srv = LiveServer(tmp_path, None, TOKEN)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def big_server(tmp_path: Path) -> Iterator[LiveServer]:
    srv = LiveServer(tmp_path, big_cluster(), TOKEN)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def xss_server(tmp_path: Path) -> Iterator[LiveServer]:
    srv = LiveServer(tmp_path, xss_document(), TOKEN)
    try:
        yield srv
    finally:
        srv.stop()


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():  # type: ignore[no-untyped-def]
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/setup.sh all (installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):  # type: ignore[no-untyped-def]
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    pg.set_default_timeout(20_000)
    try:
        yield pg
    finally:
        ctx.close()
