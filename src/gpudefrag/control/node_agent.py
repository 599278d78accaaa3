"""`gpudefrag node-agent`: the one component with host access, one per node (a DaemonSet).

The controller never reaches a kubelet (it holds no `nodes/proxy`): it writes a request on the pod
(`gpudefrag.io/agent-checkpoint`, JSON `{"move_id", "containers"}`); the agent on the pod's node, watching the
pods bound to its node, then
1. has its kubelet checkpoint each container (`POST /checkpoint/{ns}/{pod}/{container}`, with the agent's own
   ServiceAccount token, which RBAC lets do `nodes/checkpoint` and nothing else on a node) — the container keeps
   running;
2. checks the archive the kubelet wrote (a complete checkpoint, nothing that leaves the archive);
3. turns it into an OCI checkpoint image (`gpudefrag.checkpoint.oci_image`) annotated with the compatibility
   record of the pod where it runs (the converter's own Versions, plus the kernel) and signed with the store's key;
4. pushes it to the registry and answers on the pod (`gpudefrag.io/agent-checkpoint-result`, JSON
   `{"move_id", "images": {container: "host/repo@sha256:..."}}` or `{"move_id", "error"}`);
5. deletes the archive (it holds the container's memory) whether or not the push worked.

The application hook goes the same way (`{"move_id", "hook": {"container", "signal"}}`): the agent sends the
signal to PID 1 of that container by running `kill -SIG 1` inside it through its node's container runtime (CRI
`ExecSync` on the runtime's socket, `engines.kubernetes.cri`) and answers `{"move_id", "hook": {...}}`. It does so
only for a pod of its own node that opted in to the hook itself (`gpudefrag.io/checkpoint: app`, which the
controller's admission forbids it to set), only with a hook signal (USR1, USR2), and refuses anything else with
the reason in its answer: the controller holds no `pods/exec`, and the agent no cluster-wide exec either.

A request already answered for its move id is not taken again, so a restarted agent or a resync is harmless.
"""

from __future__ import annotations

import json
import re
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checkpoint.oci_image import POD_ANN, build_image
from ..checkpoint.oci_registry import Registry, repository_name
from ..core.compat import checkpoint_record
from ..core.model import Versions
from ..engines.kubernetes.access import At
from ..engines.kubernetes.convert import to_cluster
from ..engines.kubernetes.cri import CriError, Runtime
from ..engines.kubernetes.dump import KubeObjects
from ..engines.kubernetes.moves import ANN_AGENT_REQUEST, ANN_AGENT_RESULT, ANN_CKPT_MODE, HOOK_SIGNALS

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class AgentError(Exception):
    """A step of the checkpoint failed; the message is what the controller journals."""


@dataclass(frozen=True)
class Kubelet:
    """The node's own kubelet API, reached directly (never through the API server's node proxy)."""

    url: str  # https://<node ip>:<port>
    token: Callable[[], str] | None = None  # bearer token (the agent's ServiceAccount), read at each call
    ca_file: str | None = None
    insecure: bool = False  # skip verifying the kubelet's serving certificate (self-signed kubelets)
    client_cert: tuple[str, str] | None = None  # or a client certificate (cert, key) from the cluster CA
    timeout_s: float = 600.0

    def _ctx(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.client_cert:
            ctx.load_cert_chain(*self.client_cert)
        return ctx

    def checkpoint(self, namespace: str, pod: str, container: str) -> list[str]:
        """The archive paths (on the node) the kubelet wrote; AgentError with the kubelet's answer otherwise."""
        req = urllib.request.Request(f"{self.url}/checkpoint/{namespace}/{pod}/{container}", method="POST",
                                     headers={"Accept": "application/json"})
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token()}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=self._ctx()) as resp:
                body = resp.read()
        except urllib.error.HTTPError as e:
            msg = e.read()[:300].decode("utf-8", "replace").strip()
            raise AgentError(f"kubelet checkpoint of {namespace}/{pod}/{container}: HTTP {e.code} {msg}") from None
        except (OSError, ssl.SSLError) as e:
            raise AgentError(f"kubelet at {self.url} unreachable: {e}") from None
        try:
            items = json.loads(body).get("items") or []
        except (ValueError, AttributeError):
            raise AgentError("the kubelet's checkpoint answer is not JSON with items") from None
        if not items:
            raise AgentError("the kubelet returned no checkpoint archive")
        return [str(x) for x in items]


def kubelet_url(node: dict[str, Any]) -> str:
    """https://InternalIP:port from the Node object (the port the kubelet itself reports)."""
    st = node.get("status") or {}
    port = (((st.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")) or 10250
    addrs = {a.get("type"): a.get("address") for a in st.get("addresses") or []}
    ip = addrs.get("InternalIP") or addrs.get("Hostname")
    if not ip:
        raise AgentError(f"node {node.get('metadata', {}).get('name')} reports no InternalIP")
    return f"https://{ip}:{port}"


def compat_record(node: dict[str, Any], pod: dict[str, Any]) -> Versions:
    """What the checkpoint needs of the node it is restored on: the record the planner already checked
    (`core.compat.checkpoint_record`: the pod's Versions as the one converter reads them — GPU model, count,
    driver, CUDA from the node's labels; engine, model, checkpointer from the pod's annotations — plus its
    node's architecture, kernel and checkpointer)."""
    objs = KubeObjects("node-agent")
    objs.nodes.append(At(node, "node-agent", "node"))
    objs.pods.append(At(pod, "node-agent", "pod"))
    cluster = to_cluster(objs, strict=False)
    meta = pod.get("metadata") or {}
    wid = f"{meta.get('namespace')}/{meta.get('name')}"
    if wid not in cluster.state.workload_index:
        raise AgentError(f"pod {wid} is not a running workload on {(node.get('metadata') or {}).get('name')}")
    return checkpoint_record(cluster.state, cluster.state.workload(wid))


@dataclass
class NodeAgent:
    """Answers checkpoint requests for the pods on `node`. `core` is a kubernetes CoreV1Api."""

    core: Any
    node: str
    kubelet: Kubelet
    registry: Registry
    key: bytes
    host_root: Path = Path("/")  # where the node's filesystem is mounted in the agent's container
    repo_prefix: str = "gpudefrag/checkpoints"
    runtime: Runtime | None = None  # the node's CRI socket: the application hook's signal goes through it
    log: Callable[[str], None] = print
    # pod uid -> the move id this process answered: events queued before its own answer still show the request
    # unanswered; forgotten once the request is withdrawn (a rolled-back move may ask again with the same id)
    done: dict[str, str] = field(default_factory=dict)

    def _node(self) -> dict[str, Any]:
        return self.core.api_client.sanitize_for_serialization(self.core.read_node(self.node))  # type: ignore[no-any-return]

    def pending(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        """The pod's request, if it is for this node and not answered yet."""
        meta = pod.get("metadata") or {}
        ann = meta.get("annotations") or {}
        raw = ann.get(ANN_AGENT_REQUEST)
        if not raw:
            self.done.pop(meta.get("uid", ""), None)
            return None
        if (pod.get("spec") or {}).get("nodeName") != self.node or meta.get("deletionTimestamp"):
            return None
        try:
            req = json.loads(raw)
        except ValueError:
            return {"move_id": "?", "containers": [], "error": f"{ANN_AGENT_REQUEST} is not JSON"}
        if not isinstance(req, dict) or not isinstance(req.get("move_id"), str):
            return {"move_id": "?", "containers": [], "error": f"{ANN_AGENT_REQUEST} has no move_id"}
        try:
            answered = json.loads(ann.get(ANN_AGENT_RESULT) or "{}").get("move_id")
        except (ValueError, AttributeError):
            answered = None
        if answered == req["move_id"] or self.done.get(meta.get("uid", "")) == req["move_id"]:
            return None
        return req

    def handle(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        """Take a pending request on `pod` to its end and answer on the pod; returns the answer."""
        req = self.pending(pod)
        if req is None:
            return None
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        t0 = time.monotonic()
        try:
            if req.get("error"):
                raise AgentError(req["error"])
            answer: dict[str, Any] = {"move_id": req["move_id"]}
            if "hook" in req:
                answer["hook"] = self._hook(pod, req["hook"])
            else:
                names = {c.get("name") for c in (pod.get("spec") or {}).get("containers") or []}
                containers = req.get("containers") or []
                if not containers or not all(isinstance(c, str) and c in names for c in containers):
                    raise AgentError(f"containers {containers!r} are not the pod's ({sorted(names)})")
                record = compat_record(self._node(), pod)
                answer["images"] = {c: self._image(ns, name, c, req["move_id"], record) for c in containers}
            answer.update(seconds=round(time.monotonic() - t0, 3), node=self.node)
        except Exception as e:  # every failure is answered: the controller must not wait out its timeout
            answer = {"move_id": req["move_id"], "error": str(e) or type(e).__name__, "node": self.node}
        self.log(f"{ns}/{name} move {req['move_id']}: {json.dumps(answer, sort_keys=True)}")
        self.done[meta.get("uid", "")] = req["move_id"]
        if not self._answer(ns, name, meta, answer):
            self.log(f"{ns}/{name} move {req['move_id']}: the request was withdrawn meanwhile (the move rolled "
                     "back); answer dropped")
        return answer

    def _answer(self, ns: str, name: str, meta: dict[str, Any], answer: dict[str, Any]) -> bool:
        """Write the answer only while the request it answers still stands on that very pod (one JSON patch with
        a test: atomic on the API server). A controller that rolled the move back meanwhile (a restarted one
        recovering, a timeout) withdrew the request and any answer; an answer written after that would stay
        on the original for good. False: withdrawn, nothing written."""
        key = ANN_AGENT_REQUEST.replace("~", "~0").replace("/", "~1")
        res = ANN_AGENT_RESULT.replace("~", "~0").replace("/", "~1")
        patch = [{"op": "test", "path": "/metadata/uid", "value": meta.get("uid")},
                 {"op": "test", "path": f"/metadata/annotations/{key}",
                  "value": (meta.get("annotations") or {}).get(ANN_AGENT_REQUEST)},
                 {"op": "add", "path": f"/metadata/annotations/{res}", "value": json.dumps(answer, sort_keys=True)}]
        try:
            self.core.patch_namespaced_pod(name, ns, patch, _content_type="application/json-patch+json")
            return True
        except Exception as e:
            # a failed test (422), or the pod gone (404): look again; only a request still standing is an error
            if getattr(e, "status", None) not in (404, 409, 422):
                raise
            try:
                now = self.core.api_client.sanitize_for_serialization(self.core.read_namespaced_pod(name, ns))
            except Exception as again:
                if getattr(again, "status", None) == 404:
                    return False
                raise
            now_meta = now.get("metadata") or {}
            if now_meta.get("uid") != meta.get("uid") or (now_meta.get("annotations") or {}).get(
                    ANN_AGENT_REQUEST) != (meta.get("annotations") or {}).get(ANN_AGENT_REQUEST):
                return False
            raise

    def _hook(self, pod: dict[str, Any], hook: Any) -> dict[str, Any]:
        """The application hook: `kill -SIG 1` in the container, through the node's runtime — only in a pod that
        asked for it. Everything refused here is refused before the runtime is called."""
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        wid = f"{meta.get('namespace')}/{meta.get('name')}"
        if (meta.get("annotations") or {}).get(ANN_CKPT_MODE) != "app":
            raise AgentError(f"pod {wid} did not opt in to the application hook ({ANN_CKPT_MODE}: app); nothing "
                             "was run in it")
        if not isinstance(hook, dict):
            raise AgentError("the hook request is not an object")
        container, sig = hook.get("container"), hook.get("signal")
        names = [c.get("name") for c in spec.get("containers") or []]
        if container not in names:
            raise AgentError(f"container {container!r} is not one of pod {wid}'s ({names})")
        if sig not in HOOK_SIGNALS:
            raise AgentError(f"signal {sig!r} is not a hook signal ({', '.join(HOOK_SIGNALS)}); nothing was sent")
        status = next((c for c in (pod.get("status") or {}).get("containerStatuses") or []
                       if c.get("name") == container), {})
        cid = str(status.get("containerID") or "")
        if "running" not in (status.get("state") or {}) or "://" not in cid:
            raise AgentError(f"container {container} of pod {wid} is not running")
        if self.runtime is None:
            raise AgentError("this agent has no container runtime endpoint (--runtime-endpoint)")
        cmd = ["kill", f"-{sig}", "1"]
        try:
            res = self.runtime.exec_sync(cid.split("://", 1)[1], cmd)
        except CriError as e:
            raise AgentError(str(e)) from None
        if res.exit_code != 0:
            raise AgentError(f"{' '.join(cmd)} in {wid}/{container} exited {res.exit_code}: "
                             f"{res.stderr.decode('utf-8', 'replace').strip()[:300]}")
        return {"container": container, "signal": sig, "command": cmd, "runtime": self.runtime.endpoint}

    def _image(self, ns: str, pod: str, container: str, move_id: str, record: Versions) -> str:
        paths = self.kubelet.checkpoint(ns, pod, container)
        archive = self.host_root / paths[0].lstrip("/")
        # an agent killed during an earlier try of this request left its archive behind (the kubelet writes it,
        # the agent removes it): the container's memory must not outlive the request, so those go too
        stale = re.compile(re.escape(f"checkpoint-{pod}_{ns}-{container}-") + r"\d{4}-\d\d-\d\dT.*\.tar$")
        for old in archive.parent.iterdir():
            if old != archive and stale.match(old.name):
                old.unlink(missing_ok=True)
                self.log(f"{ns}/{pod}/{container}: removed {old.name}, left by an earlier try")
        try:
            img = build_image(archive, container, record, self.key,
                              extra={POD_ANN: f"{ns}/{pod}/{container}", "gpudefrag.io/move-id": move_id})
            repo = repository_name(f"{self.repo_prefix}/{ns}-{pod}-{container}")
            return self.registry.push(repo, img, tag=move_id)
        finally:
            for p in paths:  # the archive holds the container's memory: it never outlives the request
                (self.host_root / p.lstrip("/")).unlink(missing_ok=True)

    def sweep(self) -> int:
        """Answer every pending request on this node (start-up, and after a watch ends)."""
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}")
        n = 0
        for p in pods.items:
            if self.handle(self.core.api_client.sanitize_for_serialization(p)) is not None:
                n += 1
        return n

    def run(self, *, stop: Callable[[], bool] = lambda: False, watch_s: int = 60) -> None:
        """Sweep, then follow the node's pods by watch; a broken watch only costs a new sweep."""
        from kubernetes import watch

        while not stop():
            try:
                self.sweep()
                w = watch.Watch()
                for ev in w.stream(self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={self.node}",
                                   timeout_seconds=watch_s):
                    if ev.get("type") in ("ADDED", "MODIFIED"):
                        self.handle(self.core.api_client.sanitize_for_serialization(ev["object"]))
                    if stop():
                        return
            except Exception as e:  # the API server restarting, a network blip: log, wait, sweep again
                self.log(f"watch failed: {e}; retrying")
                time.sleep(2)
