"""The official client's side of the engine over real HTTP: a local server answers with recorded API JSON, so
the live reader and ClientKubeApi are exercised down to methods, paths, query strings, bodies and status codes
(no API server can run here; this is the next best thing to one)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlparse

import pytest

from gpudefrag.engines.base import EngineError, JobPhase
from gpudefrag.engines.kubernetes import ApiError, ClientKubeApi, KubernetesEngine, load_dump
from gpudefrag.engines.kubernetes.live import read_live
from gpudefrag.errors import InputError
from gpudefrag.snapshot import state_to_dict
from kubernetes import client

DOC = json.loads((Path(__file__).parent / "fixtures" / "fragmentation.json").read_text())


def _typed_list(kind: str) -> dict[str, Any]:
    """What the API server returns for a list: typed, items without kind/apiVersion."""
    items = []
    for it in DOC["items"]:
        if it["kind"] == kind:
            d = dict(it)
            d.pop("kind"), d.pop("apiVersion")
            items.append(d)
    return {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {"resourceVersion": "12345"}, "items": items}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class Api(BaseHTTPRequestHandler):
    calls: ClassVar[list[tuple[str, str, dict[str, list[str]], Any, str]]] = []
    evict_status = 201

    def log_message(self, *a: Any) -> None:
        pass

    def _send(self, code: int, doc: Any) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self, method: str) -> None:
        u = urlparse(self.path)
        q = parse_qs(u.query)
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n)) if n else None
        self.calls.append((method, u.path, q, body, self.headers.get("Content-Type", "")))
        p = u.path
        lists = {"/api/v1/nodes": "Node", "/api/v1/pods": "Pod", "/api/v1/resourcequotas": "ResourceQuota",
                 "/apis/policy/v1/poddisruptionbudgets": "PodDisruptionBudget"}
        if method == "GET" and p == "/api/v1/pods" and q.get("fieldSelector"):
            node = q["fieldSelector"][0].removeprefix("spec.nodeName=")
            pods = _typed_list("Pod")
            pods["items"] = [i for i in pods["items"] if i["spec"].get("nodeName") == node]
            return self._send(200, pods)
        if method == "GET" and p in lists:
            return self._send(200, _typed_list(lists[p]))
        if method == "GET" and p == "/api/v1/events":
            ev = _typed_list("Event")
            reason = q.get("fieldSelector", [""])[0].removeprefix("reason=")
            ev["items"] = [e for e in ev["items"] if e["reason"] == reason]
            return self._send(200, ev)
        if method == "GET" and p.startswith("/api/v1/namespaces/") and "/pods/" in p:
            name = p.rsplit("/", 1)[1]
            if name == "busy":
                return self._send(500, _status(500, "InternalError", "etcdserver: request timed out"))
            pod = next((i for i in DOC["items"] if i["kind"] == "Pod" and i["metadata"]["name"] == name), None)
            return self._send(200, pod) if pod else self._send(404, _status(404, "NotFound", f'pods "{name}" '
                                                                             "not found"))
        if method == "POST" and "/proxy/checkpoint/" in p:
            ns, pod, c = p.split("/proxy/checkpoint/")[1].split("/")
            if c == "broken":
                return self._send(500, _status(500, "InternalError", "checkpointing the container failed"))
            return self._send(200, {"items": [f"/var/lib/kubelet/checkpoints/checkpoint-{pod}_{ns}-{c}-1.tar"]})
        if method == "POST" and p.endswith("/eviction"):
            if self.evict_status == 429:
                return self._send(429, _status(429, "TooManyRequests", "Cannot evict pod as it would violate the "
                                                                        "pod's disruption budget."))
            return self._send(201, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
        if method == "POST" and p.endswith("/pods"):
            return self._send(201, dict(body, status={"phase": "Pending"}))
        if method == "PATCH":
            return self._send(200, {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": p.rsplit("/", 1)[1]}})
        if method == "DELETE":
            return self._send(200, {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": p.rsplit("/", 1)[1]}})
        return self._send(404, _status(404, "NotFound", "the server could not find the requested resource"))

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")


@pytest.fixture
def server() -> Iterator[tuple[Any, type[Api]]]:
    Api.calls = []
    Api.evict_status = 201
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    cfg = client.Configuration(host=f"http://127.0.0.1:{srv.server_address[1]}")
    api = client.ApiClient(cfg)
    try:
        yield api, Api
    finally:
        api.close()
        srv.shutdown()
        srv.server_close()
        t.join(timeout=5)


def test_live_reader_gives_the_same_state_as_the_dump(server) -> None:  # type: ignore[no-untyped-def]
    api, handler = server
    live = read_live(api=api, now=lambda: 0.0)
    dump = load_dump(Path(__file__).parent / "fixtures" / "fragmentation.json")
    a, b = state_to_dict(live.state), state_to_dict(dump.state)
    for d in (a, b):
        d.pop("name"), d.pop("now")
    assert a == b
    assert [w.id for w in live.state.pending] == ["ml/train-8g"]
    paths = [(m, p, q.get("fieldSelector", [""])[0]) for m, p, q, _, _ in handler.calls]
    assert ("GET", "/api/v1/events", "reason=FailedScheduling") in paths
    # the autoscaler's status: a list narrowed to its one name (what a watch can follow), not a GET
    assert ("GET", "/api/v1/namespaces/kube-system/configmaps", "metadata.name=cluster-autoscaler-status") in paths
    assert any("not found" in w or "HTTP 404" in w for w in live.warnings)  # optional parts: skipped, said so


def test_client_api_calls(server) -> None:  # type: ignore[no-untyped-def]
    api, handler = server
    k = ClientKubeApi(api)
    assert k.read_pod("ml", "notebook-ana")["metadata"]["name"] == "notebook-ana"  # type: ignore[index]
    assert k.read_pod("ml", "nope") is None
    k.create_pod("ml", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "r"}, "spec": {"containers": []}})
    k.patch_pod("ml", "r", {"metadata": {"annotations": {"a": None}}})
    k.evict_pod("ml", "notebook-ana", {"apiVersion": "policy/v1", "kind": "Eviction",
                                       "metadata": {"name": "notebook-ana", "namespace": "ml"}})
    k.delete_pod("ml", "r")
    got = [(m, p) for m, p, *_ in handler.calls]
    assert got == [
        ("GET", "/api/v1/namespaces/ml/pods/notebook-ana"),
        ("GET", "/api/v1/namespaces/ml/pods/nope"),
        ("POST", "/api/v1/namespaces/ml/pods"),
        ("PATCH", "/api/v1/namespaces/ml/pods/r"),
        ("POST", "/api/v1/namespaces/ml/pods/notebook-ana/eviction"),
        ("DELETE", "/api/v1/namespaces/ml/pods/r"),
    ]
    patch = handler.calls[3]
    assert patch[3] == {"metadata": {"annotations": {"a": None}}} and "merge-patch" in patch[4]
    assert handler.calls[4][3]["kind"] == "Eviction"


def test_pods_on_node_by_field_selector(server) -> None:  # type: ignore[no-untyped-def]
    api, handler = server
    pods = ClientKubeApi(api).list_pods_on_node("gpu-node-3")
    assert sorted(p["metadata"]["name"] for p in pods) == ["batch-infer-1", "batch-infer-2"]
    assert handler.calls[-1][2]["fieldSelector"] == ["spec.nodeName=gpu-node-3"]


def test_refused_eviction_is_429(server) -> None:  # type: ignore[no-untyped-def]
    api, handler = server
    handler.evict_status = 429
    with pytest.raises(ApiError) as ei:
        ClientKubeApi(api).evict_pod("ml", "notebook-ana", {"kind": "Eviction"})
    assert ei.value.status == 429


def test_unreachable_cluster_is_one_input_error() -> None:
    api = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
    try:
        with pytest.raises(InputError) as ei:
            read_live(api=api)
    finally:
        api.close()
    assert ei.value.source == "cluster" and "list nodes" in ei.value.message


def test_only_a_404_reads_as_a_vanished_pod(server) -> None:  # type: ignore[no-untyped-def]
    """The executor aborts a move whose job is gone; a busy or unreachable API server must instead raise
    EngineError, which it retries, or a move could be given up half way."""
    api, _ = server
    e = KubernetesEngine(api=ClientKubeApi(api))
    assert e.job("ml/notebook-ana").phase is JobPhase.RUNNING
    assert e.job("ml/no-such-pod").phase is JobPhase.GONE
    with pytest.raises(EngineError, match="HTTP 500"):
        e.job("ml/busy")
    dead = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
    try:
        with pytest.raises(EngineError, match="unreachable"):
            KubernetesEngine(api=ClientKubeApi(dead)).job("ml/notebook-ana")
    finally:
        dead.close()
