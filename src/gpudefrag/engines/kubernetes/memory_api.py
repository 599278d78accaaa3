"""An in-memory Kubernetes API over a dump, for dry runs of a move (`gpudefrag kube plan --dry-run`) and tests.

No API server can run on the machines this is built on, so the executor is exercised against this model of the
server-side behaviour it relies on: pods start Pending and turn Ready after a few reads; the Eviction API refuses
(429) what a PodDisruptionBudget forbids; a ReplicaSet adopts an orphan pod whose labels match it and removes
its surplus pod of lowest `pod-deletion-cost`; the node agent answers a checkpoint request with a checkpoint
image per container and a hook request (for a pod that opted in) with the signal, which the application answers
by writing its annotation; and `verify_image` vouches for
the images it made (carrying the workload's compatibility record).
Faults are injected by name (`fail`), so the tests can prove that no original is ever deleted when the
replacement fails. Every call is logged in `calls` as (verb, path).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from typing import Any

from ...core.model import Versions
from .convert import KubeCluster
from .executor import ApiError, is_ready
from .moves import (
    ANN_AGENT_REQUEST,
    ANN_AGENT_RESULT,
    ANN_CKPT_DONE,
    ANN_CKPT_MODE,
    ANN_CKPT_REQUEST,
    DELETION_COST,
    HOOK_SIGNALS,
)


class InMemoryApi:
    FAULTS = ("checkpoint", "image", "create", "ready", "evict", "signal", "adopt")

    def __init__(self, cluster: KubeCluster, *, ready_after: int = 2, fail: frozenset[str] = frozenset()) -> None:
        unknown = set(fail) - set(self.FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {self.FAULTS}")
        self.nodes = {k: copy.deepcopy(dict(v)) for k, v in cluster.raw_nodes.items()}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        for info in cluster.pods.values():
            if not info.synthetic:
                self.pods[(info.namespace, info.name)] = copy.deepcopy(dict(info.raw))
        self.pdbs = {(p["metadata"].get("namespace", "default"), p["metadata"]["name"]): copy.deepcopy(dict(p))
                     for p in cluster.raw_pdbs}
        self.ready_after = ready_after
        self.fail = frozenset(fail)
        self.calls: list[tuple[str, str]] = []
        self._reads: dict[tuple[str, str], int] = {}
        self._uid = itertools.count(1)
        state = cluster.state
        self._versions = {(i.namespace, i.name): state.workload(i.workload_id).versions
                          for i in cluster.pods.values() if not i.synthetic and i.workload_id in state.workload_index}
        self._images: dict[str, Versions] = {}

    # ------------------------------------------------------------------ helpers
    def _log(self, verb: str, path: str) -> None:
        self.calls.append((verb, path))

    def _matches(self, sel: dict[str, Any], labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in (sel.get("matchLabels") or {}).items())

    # ------------------------------------------------------------------ KubeApi
    def read_node(self, name: str) -> dict[str, Any]:
        self._log("GET", f"/api/v1/nodes/{name}")
        if name not in self.nodes:
            raise ApiError(404, f"nodes {name!r} not found")
        return copy.deepcopy(self.nodes[name])

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._log("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        key = (namespace, name)
        pod = self.pods.get(key)
        if pod is None:
            return None
        if key in self._reads:  # a pod we created: advance its lifecycle
            self._reads[key] += 1
            if self._reads[key] >= self.ready_after and pod["status"]["phase"] == "Pending":
                if "ready" in self.fail:
                    pod["status"] = {"phase": "Failed", "reason": "RestoreFailed",
                                     "message": "container restore from checkpoint failed"}
                else:
                    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
                    pod["spec"]["nodeName"] = self._pinned(pod)
        return copy.deepcopy(pod)

    @staticmethod
    def _pinned(pod: dict[str, Any]) -> str | None:
        """The scheduler's choice for a pod pinned by required affinity on kubernetes.io/hostname."""
        req = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution") or {}
        for t in req.get("nodeSelectorTerms") or []:
            for e in t.get("matchExpressions") or []:
                if e.get("key") == "kubernetes.io/hostname" and e.get("operator") == "In" and e.get("values"):
                    return str(e["values"][0])
        return None

    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        self._log("GET", f"/api/v1/pods?fieldSelector=spec.nodeName={node}")
        return [copy.deepcopy(p) for p in self.pods.values() if (p.get("spec") or {}).get("nodeName") == node]

    def read_pdb(self, namespace: str, name: str) -> dict[str, Any]:
        self._log("GET", f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/{name}")
        if (namespace, name) not in self.pdbs:
            raise ApiError(404, f"poddisruptionbudgets {name!r} not found")
        return copy.deepcopy(self.pdbs[(namespace, name)])

    def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self._log("POST", f"/api/v1/namespaces/{namespace}/pods")
        name = body["metadata"]["name"]
        if "create" in self.fail:
            raise ApiError(422, f'Pod "{name}" is invalid')
        if (namespace, name) in self.pods:
            raise ApiError(409, f'pods "{name}" already exists')
        pod = copy.deepcopy(body)
        pod["metadata"]["uid"] = f"mem-{next(self._uid)}"
        pod["status"] = {"phase": "Pending"}
        self.pods[(namespace, name)] = pod
        self._reads[(namespace, name)] = 0
        return copy.deepcopy(pod)

    def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self._log("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}")
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise ApiError(404, f'pods "{name}" not found')
        meta = pod.setdefault("metadata", {})
        for part in ("labels", "annotations"):
            for k, v in ((patch.get("metadata") or {}).get(part) or {}).items():
                d = meta.setdefault(part, {}) or {}
                meta[part] = d
                if v is None:
                    d.pop(k, None)
                else:
                    d[k] = v
        req = ((patch.get("metadata") or {}).get("annotations") or {}).get(ANN_AGENT_REQUEST)
        if req:
            meta["annotations"][ANN_AGENT_RESULT] = self._agent(namespace, name, json.loads(req))
        if "pod-template-hash" in ((patch.get("metadata") or {}).get("labels") or {}):
            if "adopt" in self.fail:
                raise ApiError(500, "adoption failed")
            self._adopt(namespace, name)
        return copy.deepcopy(pod)

    def _agent(self, namespace: str, name: str, req: dict[str, Any]) -> str:
        """The node agent's answer: an image per container, or the kubelet's failure; for a hook request, the
        signal (and the application's answer on its pod), or the agent's refusal."""
        if "hook" in req:
            return json.dumps(self._hook(namespace, name, req))
        if "checkpoint" in self.fail:
            return json.dumps({"move_id": req["move_id"], "error": "checkpointing the container failed: CRIU not "
                               "available"})
        images = {}
        for c in req["containers"]:
            digest = hashlib.sha256(f"{namespace}/{name}/{c}/{req['move_id']}".encode()).hexdigest()
            ref = f"registry.local/gpudefrag/checkpoints/{namespace}-{name}-{c}@sha256:{digest}"
            self._images[ref] = self._versions.get((namespace, name), Versions())
            images[c] = ref
        return json.dumps({"move_id": req["move_id"], "images": images})

    def _hook(self, namespace: str, name: str, req: dict[str, Any]) -> dict[str, Any]:
        pod = self.pods[(namespace, name)]
        ann = pod["metadata"]["annotations"]
        hook = req["hook"]
        if ann.get(ANN_CKPT_MODE) != "app":
            return {"move_id": req["move_id"], "error": f"pod {namespace}/{name} did not opt in to the application "
                    f"hook ({ANN_CKPT_MODE}: app); nothing was run in it"}
        if "signal" in self.fail or hook.get("signal") not in HOOK_SIGNALS:
            return {"move_id": req["move_id"], "error": f"kill -{hook.get('signal')} 1 failed"}
        if ANN_CKPT_REQUEST in ann:  # the application hook answers
            ann[ANN_CKPT_DONE] = ann[ANN_CKPT_REQUEST]
        return {"move_id": req["move_id"], "hook": {"container": hook["container"], "signal": hook["signal"],
                                                    "command": ["kill", f"-{hook['signal']}", "1"],
                                                    "runtime": "memory"}}

    def verify_image(self, ref: str) -> Versions:
        """The compatibility record of an image the agent made here (the executor's `verify_image`)."""
        if "image" in self.fail or ref not in self._images:
            raise ValueError(f"bad-signature: {ref} is not signed with the store's key")
        return self._images[ref]

    def _adopt(self, namespace: str, name: str) -> None:
        """The ReplicaSet controller: adopt the orphan, then remove its surplus pod of lowest deletion cost."""
        pod = self.pods[(namespace, name)]
        h = pod["metadata"]["labels"]["pod-template-hash"]
        siblings = [p for (ns, _), p in self.pods.items() if ns == namespace and p is not pod
                    and (p["metadata"].get("labels") or {}).get("pod-template-hash") == h
                    and any(r.get("kind") == "ReplicaSet" for r in p["metadata"].get("ownerReferences") or [])]
        if not siblings:
            return
        pod["metadata"]["ownerReferences"] = copy.deepcopy(siblings[0]["metadata"]["ownerReferences"])
        members = [*siblings, pod]
        replicas = len(siblings)  # the count before adoption is the ReplicaSet's spec.replicas
        members.sort(key=lambda p: (not is_ready(p),
                                    -int(((p["metadata"].get("annotations") or {}).get(DELETION_COST)) or 0)))
        for victim in members[replicas:]:
            self.pods.pop((namespace, victim["metadata"]["name"]), None)

    def evict_pod(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self._log("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction")
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise ApiError(404, f'pods "{name}" not found')
        want = ((body.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
        if want and want != pod["metadata"].get("uid"):
            raise ApiError(409, f"Precondition failed: UID in precondition: {want}, UID in object meta: "
                           f"{pod['metadata'].get('uid')}")
        if "evict" in self.fail:
            raise ApiError(429, "Cannot evict pod as it would violate the pod's disruption budget.")
        labels = pod["metadata"].get("labels") or {}
        for (ns, _), pdb in self.pdbs.items():
            spec = pdb.get("spec") or {}
            if ns != namespace or not self._matches(spec.get("selector") or {}, labels):
                continue
            healthy = sum(1 for (pns, _), p in self.pods.items() if pns == ns and is_ready(p)
                          and self._matches(spec.get("selector") or {}, p["metadata"].get("labels") or {}))
            mu, ma = spec.get("maxUnavailable"), spec.get("minAvailable")
            if mu in (0, "0", "0%") or ma == "100%" or (isinstance(ma, int) and healthy - 1 < ma):
                raise ApiError(429, "Cannot evict pod as it would violate the pod's disruption budget.")
        del self.pods[(namespace, name)]

    def delete_pod(self, namespace: str, name: str) -> None:
        self._log("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
        if self.pods.pop((namespace, name), None) is None:
            raise ApiError(404, f'pods "{name}" not found')
