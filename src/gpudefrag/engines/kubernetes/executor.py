"""Run a `MoveSequence` against the API, step by step, stopping at the first failure.

Before the point of no return (the eviction, or the ReplicaSet's adoption of the replacement) a failure runs the
rollback (delete the replacement, withdraw requests) and the original keeps running: no delete ever follows a
replacement that failed. After it, the executor only finishes (waits for the original to go).
`KubeApi` is the small surface used; `ClientKubeApi` implements it with the official client,
`memory_api.InMemoryApi` over a dump (dry runs and tests: no API server runs on the build machines).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import urllib3

from ...core.compat import CompatRule, describe
from ...core.model import Versions
from .access import At
from .convert import GPU, node_from, pdb_info, pod_resources
from .dra import DraInventory
from .moves import (
    ANN_AGENT_RESULT,
    ANN_CKPT_DONE,
    ANN_MOVE_ID,
    ANN_RESTORE_FROM,
    MoveSequence,
    Op,
    OpKind,
    pdb_after_replacement,
)


class ApiError(Exception):
    """An API call failed: `status` is the HTTP status (429: eviction refused by a PDB; 404: not found; 0: the
    request never reached the API server — it could not be connected to — so it is safe to send again)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class KubeApi(Protocol):
    def read_node(self, name: str) -> dict[str, Any]: ...
    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]: ...
    def read_pdb(self, namespace: str, name: str) -> dict[str, Any]: ...
    def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...
    def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]: ...
    def evict_pod(self, namespace: str, name: str, body: dict[str, Any]) -> None: ...
    def delete_pod(self, namespace: str, name: str) -> None: ...


_T = TypeVar("_T")
# A checkpoint image reference (`host/repo@sha256:...`) -> the compatibility record its signed manifest carries.
# Raises (any exception, its message is the reason) when the image cannot be trusted: not found, not the digest,
# not signed with the store's key. Built from gpudefrag.checkpoint by the controller (a lower layer may not).
ImageVerifier = Callable[[str], Versions]


@dataclass
class StepResult:
    op: str
    ok: bool
    detail: str = ""

    def as_dict(self) -> dict[str, object]:
        return {"op": self.op, "ok": self.ok, "detail": self.detail}


@dataclass
class MoveResult:
    move_id: str
    workload_id: str
    ok: bool
    committed: bool = False  # the point of no return was passed
    rolled_back: bool = False
    error: str = ""
    steps: list[StepResult] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"move_id": self.move_id, "workload": self.workload_id, "ok": self.ok, "committed": self.committed,
                "rolled_back": self.rolled_back, "error": self.error, "steps": [s.as_dict() for s in self.steps]}


class StepFailed(Exception):
    pass


def is_ready(obj: dict[str, Any]) -> bool:
    """A pod's or a node's Ready condition is True (raw API objects: the executor, the engine and the
    in-memory API read it the same way)."""
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


class SequenceRunner:
    """Runs one pod move's `MoveSequence` against the API server, operation by operation (the Kubernetes side of
    a move; `control.executor.Executor` is the journaled, budgeted executor of the Slurm and sim engines, and
    `control.kube_executor.KubeMoveExecutor` journals these runs)."""

    def __init__(self, api: KubeApi, *, verify_image: ImageVerifier | None = None, compat: CompatRule | None = None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
                 poll_s: float = 2.0, on_step: Callable[[MoveSequence, StepResult], None] | None = None,
                 before: Callable[[MoveSequence, int, Op], None] | None = None,
                 unreachable_s: float = 120.0, evict_retry_s: float = 60.0) -> None:
        self.before = before  # called before each operation is taken (the journal writes it here)
        self.unreachable_s = unreachable_s  # how long an operation waits for an API server it cannot connect to
        self.evict_retry_s = evict_retry_s  # how long a PDB's 429 is retried before it counts as a refusal
        self.api = api
        self.verify_image = verify_image
        self.compat = compat
        self.sleep = sleep
        self.clock = clock
        self.poll_s = poll_s
        self.on_step = on_step

    def run(self, seq: MoveSequence, versions: Any = None) -> MoveResult:
        """Execute one sequence. `versions` (the workload's `Versions`) re-checks compatibility live."""
        res = MoveResult(seq.move_id, seq.workload_id, ok=False)
        if not seq.ok:
            res.error = f"refused: {seq.refused}"
            return res
        return self._run(seq, res, versions, 0, recovering=False)

    def finish(self, seq: MoveSequence) -> MoveResult:
        """After a crash past the point of no return: take the committing operation and the rest again (each is
        idempotent: a pod already evicted or adopted counts as done)."""
        res = MoveResult(seq.move_id, seq.workload_id, ok=False, committed=True)
        start = next((i for i, o in enumerate(seq.ops) if o.irreversible), len(seq.ops))
        return self._run(seq, res, None, start, recovering=True)

    def rollback(self, seq: MoveSequence) -> MoveResult:
        """After a crash before the point of no return: undo (delete the replacement if it exists, ...)."""
        res = MoveResult(seq.move_id, seq.workload_id, ok=False)
        self._rollback(seq, res)
        return res

    def _run(self, seq: MoveSequence, res: MoveResult, versions: Any, start: int, *, recovering: bool) -> MoveResult:
        ctx: dict[str, Any] = {"images": {}, "cold_start": ""}  # what the agent made; why a restore was refused
        created = recovering
        for i, op in enumerate(seq.ops[start:], start):
            if self.before:
                self.before(seq, i, op)
            try:
                detail = self._patient(lambda op=op: self._do(op, ctx, versions, recovering))
            except (StepFailed, ApiError) as e:
                self._record(seq, res, StepResult(op.kind.value, False, str(e)))
                res.error = f"{op.kind.value}: {e}"
                if not res.committed and (created or op.mutating):
                    self._rollback(seq, res)
                return res
            if op.kind is OpKind.CREATE_REPLACEMENT or op.mutating:  # something to undo from here on
                created = True
            if op.irreversible:
                res.committed = True
            self._record(seq, res, StepResult(op.kind.value, True, detail))
        res.ok = True
        return res

    def _record(self, seq: MoveSequence, res: MoveResult, step: StepResult) -> None:
        res.steps.append(step)
        if self.on_step:
            self.on_step(seq, step)

    def _rollback(self, seq: MoveSequence, res: MoveResult) -> None:
        for op in seq.rollback:
            try:
                if op.kind is OpKind.DELETE_REPLACEMENT:
                    p = op.params
                    pod = self._patient(lambda p=p: self.api.read_pod(p["namespace"], p["pod"]))
                    # only our own replacement: a pod that already had its name (the create's 409) is not ours
                    ann = ((pod or {}).get("metadata") or {}).get("annotations") or {}
                    if pod is not None and ann.get(ANN_MOVE_ID) == seq.move_id:
                        self._patient(lambda p=p: self.api.delete_pod(p["namespace"], p["pod"]))
                    elif pod is not None:
                        self._record(seq, res, StepResult(f"rollback:{op.kind.value}", True,
                                                          f"{p['pod']} is not this move's replacement; kept"))
                        continue
                else:
                    self._patient(lambda op=op: self.api.patch_pod(op.params["namespace"], op.params["pod"],
                                                                   dict(op.body or {})))
                self._record(seq, res, StepResult(f"rollback:{op.kind.value}", True, op.detail))
            except ApiError as e:
                self._record(seq, res, StepResult(f"rollback:{op.kind.value}", False, str(e)))
        res.rolled_back = True

    def _patient(self, fn: Callable[[], _T]) -> _T:
        """Take an operation, again while the API server cannot be connected to (a restart, found against a real
        one): such a request was never delivered, so sending it again is safe. Bounded by `unreachable_s`."""
        end = self.clock() + self.unreachable_s
        while True:
            try:
                return fn()
            except ApiError as e:
                if e.status != 0 or self.clock() >= end:
                    raise
            self.sleep(self.poll_s)

    def _wait(self, what: str, timeout: float, check: Callable[[], bool]) -> None:
        """Poll `check` until it holds. An API server that is briefly unreachable or overloaded (status 0,
        429, 5xx: a restart, a rollout) only costs polls; the timeout still bounds the wait."""
        end = self.clock() + timeout
        while True:
            try:
                if check():
                    return
            except ApiError as e:
                if e.status not in (0, 429) and e.status < 500:
                    raise
                if self.clock() >= end:
                    raise StepFailed(f"timed out after {timeout:g} s waiting for {what} ({e})") from None
            if self.clock() >= end:
                raise StepFailed(f"timed out after {timeout:g} s waiting for {what}")
            self.sleep(self.poll_s)

    def _gpus_in_use(self, node: str) -> int:
        """GPUs requested by the pods bound to `node` that have not finished (what the scheduler counts)."""
        used = 0
        for i, pod in enumerate(self.api.list_pods_on_node(node)):
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            res = pod_resources(At(pod, "cluster", f"pods on {node}[{i}]").obj("spec"))
            used += int(res.get(GPU, 0))
        return used

    def _do(self, op: Op, ctx: dict[str, Any], versions: Any, recovering: bool = False) -> str:
        p, api = op.params, self.api
        k = op.kind
        if k is OpKind.VERIFY_TARGET:
            if p.get("uid"):  # the plan may come from a cache: the original must still be what was planned
                orig = api.read_pod(p["namespace"], p["pod"])
                meta = (orig or {}).get("metadata") or {}
                if orig is None or meta.get("uid") != p["uid"] or meta.get("deletionTimestamp"):
                    raise StepFailed(f"{p['pod']} is no longer the pod that was planned (gone, replaced or "
                                     "terminating)")
                if (orig.get("spec") or {}).get("nodeName") != p["source"]:
                    raise StepFailed(f"{p['pod']} now runs on {(orig.get('spec') or {}).get('nodeName')!r}, "
                                     f"not on {p['source']!r}")
            raw = api.read_node(p["node"])
            node = node_from(At(raw, "cluster", f"node {p['node']}"), DraInventory())
            if not node.schedulable:
                raise StepFailed(f"node {node.name} is cordoned or not ready")
            if versions is not None:
                bad = describe(versions, node, self.compat)
                if bad:
                    raise StepFailed("incompatible: " + "; ".join(bad))
            need = int(p.get("gpus", 0))
            free = node.usable_gpus - self._gpus_in_use(node.name)
            if free < need:
                raise StepFailed(f"node {node.name} has {free} free GPU(s) now; the pod needs {need}")
            return (f"{node.name}: {node.gpu_model} driver {node.driver_version} cuda {node.cuda_version}, "
                    f"{free} GPU(s) free")
        if k is OpKind.CHECK_PDB:
            pdb = pdb_info(At(api.read_pdb(p["namespace"], p["name"]), "cluster", f"pdb {p['name']}"))
            allowed, why = pdb_after_replacement(pdb)
            if allowed < 1:
                raise StepFailed(why)
            return f"{pdb.key}: {allowed} disruption(s) allowed once the replacement is Ready"
        if k is OpKind.WAIT_AGENT_CHECKPOINT:
            return self._wait_agent(p, ctx)
        if k is OpKind.VERIFY_IMAGE:
            return self._verify_images(p, ctx)
        if k is OpKind.WAIT_AGENT_SIGNAL:
            hook = self._agent_answer(p, "signal").get("hook")
            if not isinstance(hook, dict) or hook.get("container") != p["container"]:
                raise StepFailed(f"node agent answered no signal to {p['container']} ({hook!r})")
            return f"{' '.join(hook.get('command') or [])} in {p['container']} through {hook.get('runtime')}"
        if k in (OpKind.AGENT_CHECKPOINT, OpKind.REQUEST_APP_CHECKPOINT, OpKind.SIGNAL, OpKind.SET_DELETION_COST,
                 OpKind.ADOPT_REPLACEMENT):
            api.patch_pod(p["namespace"], p["pod"], dict(op.body or {}))
            return op.detail
        if k is OpKind.WAIT_APP_CHECKPOINT:
            def done() -> bool:
                pod = api.read_pod(p["namespace"], p["pod"])
                if pod is None:
                    raise StepFailed("the original pod vanished while checkpointing")
                return ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_CKPT_DONE) == p["move_id"]
            self._wait(f"the application's checkpoint of {p['pod']}", p["timeout_s"], done)
            return "checkpoint written"
        if k is OpKind.CREATE_REPLACEMENT:
            body = self._restoring(op.body or {}, ctx) if ctx["images"] or ctx["cold_start"] else dict(op.body or {})
            try:
                api.create_pod(p["namespace"], body)
            except ApiError as e:
                # 409: a pod of that name exists — ours (a create whose answer was lost, a resumed move) or not
                existing = api.read_pod(p["namespace"], p["pod"]) if e.status == 409 else None
                mine = ((existing or {}).get("metadata") or {}).get("annotations") or {}
                if existing is None or mine.get(ANN_MOVE_ID) != (op.body or {}).get("metadata", {}).get(
                        "annotations", {}).get(ANN_MOVE_ID):
                    raise
                return f"{p['pod']} (already created by this move)"
            return p["pod"]
        if k is OpKind.WAIT_READY:
            def ready() -> bool:
                pod = api.read_pod(p["namespace"], p["pod"])
                if pod is None:
                    raise StepFailed(f"replacement {p['pod']} vanished")
                phase = (pod.get("status") or {}).get("phase")
                if phase in ("Failed", "Succeeded"):
                    raise StepFailed(f"replacement {p['pod']} ended ({phase}) before it was Ready")
                if not is_ready(pod):
                    return False
                # A pod Ready on a node that is not (a kubelet gone silent after reporting it) is about to be
                # marked NotReady by the node lifecycle controller: evicting the original then runs no copy.
                # Found against the real control plane when the target went NotReady mid-move.
                where = (pod.get("spec") or {}).get("nodeName") or ""
                if not where:
                    return False
                try:
                    node = api.read_node(where)
                except ApiError as e:
                    if e.status == 404:
                        raise StepFailed(f"replacement {p['pod']}'s node {where!r} was deleted") from None
                    raise
                return is_ready(node) and not (node.get("metadata") or {}).get("deletionTimestamp")
            self._wait(f"{p['pod']} to be Ready on a Ready node", p["timeout_s"], ready)
            return f"{p['pod']} Ready"
        if k is OpKind.EVICT_ORIGINAL:
            # 429 also means "not yet": found against a real cluster, the disruption controller counts the
            # replacement as healthy a moment after it is Ready (longer after an API server restart), so the
            # eviction is retried for `evict_retry_s` before the PDB's refusal is taken as final
            end = self.clock() + self.evict_retry_s
            while True:
                try:
                    api.evict_pod(p["namespace"], p["pod"], dict(op.body or {}))
                    return f"{p['pod']} evicted"
                except ApiError as e:
                    if e.status == 409 and p.get("uid"):  # the uid precondition: is the original still there?
                        now = api.read_pod(p["namespace"], p["pod"])
                        if now is None or ((now.get("metadata") or {}).get("uid") != p["uid"]):
                            e = ApiError(404, f"{p['pod']} with uid {p['uid']} is gone")
                    if e.status == 404 and (p.get("missing_ok") or recovering):
                        return "already removed by its ReplicaSet"
                    if e.status != 429:
                        raise
                    if self.clock() >= end:
                        raise StepFailed(f"eviction refused by a PodDisruptionBudget ({e})") from None
                self.sleep(self.poll_s)
        if k is OpKind.WAIT_DELETED:
            def gone() -> bool:
                pod = api.read_pod(p["namespace"], p["pod"])
                return pod is None or (pod.get("metadata") or {}).get("uid") != p["uid"]
            self._wait(f"{p['pod']} to be deleted", p["timeout_s"], gone)
            return f"{p['pod']} gone"
        raise StepFailed(f"unknown operation {k}")

    def _agent_answer(self, p: Any, what: str) -> dict[str, Any]:
        """Wait for the node agent's answer to this move's request; its error (a refusal says why) fails the step.
        The original never stopped: a kubelet checkpoint leaves it running, and a hook only asks it to write."""
        api = self.api
        got: dict[str, Any] = {}

        def answered() -> bool:
            pod = api.read_pod(p["namespace"], p["pod"])
            if pod is None:
                raise StepFailed(f"the original pod vanished while waiting for the node agent's {what}")
            raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_AGENT_RESULT)
            if not raw:
                return False
            try:
                doc = json.loads(raw)
            except ValueError:
                raise StepFailed(f"the agent's answer ({ANN_AGENT_RESULT}) is not JSON") from None
            if not isinstance(doc, dict) or doc.get("move_id") != p["move_id"]:
                return False  # an answer to another (older) request
            got.update(doc)
            return True

        self._wait(f"the node agent's {what} of {p['pod']}", p["timeout_s"], answered)
        if got.get("error"):
            raise StepFailed(f"node agent: {got['error']}")
        return got

    def _wait_agent(self, p: Any, ctx: dict[str, Any]) -> str:
        """The agent's checkpoint images, one per container asked for."""
        images = self._agent_answer(p, "checkpoint").get("images")
        if not isinstance(images, dict) or sorted(images) != sorted(p["containers"]):
            raise StepFailed(f"node agent answered images for {sorted(images or {})}, not {sorted(p['containers'])}")
        ctx["images"] = {str(c): str(ref) for c, ref in images.items()}
        return ", ".join(f"{c}: {ref}" for c, ref in sorted(ctx["images"].items()))

    def _verify_images(self, p: Any, ctx: dict[str, Any]) -> str:
        """Trust each checkpoint image only by digest and signature (the verifier), then compare its
        compatibility record with the target node's labels by the one rule. A mismatch refuses the move, or
        (policy `fallback: evict`) turns it into a cold start, with the reason."""
        if self.verify_image is None:
            raise StepFailed("no checkpoint image verifier configured (registry + store key); nothing was changed")
        raw = self.api.read_node(p["node"])
        node = node_from(At(raw, "cluster", f"node {p['node']}"), DraInventory())
        bad: list[str] = []
        for c, ref in sorted(ctx["images"].items()):
            try:
                record = self.verify_image(ref)
            except Exception as e:  # the verifier's reason, whatever layer raised it
                raise StepFailed(f"checkpoint image of {c} ({ref}) refused: {e}") from None
            bad += [f"{c}: {m}" for m in describe(record, node, self.compat)]
        if not bad:
            return f"{len(ctx['images'])} image(s) signed and compatible with {node.name}"
        why = "incompatible: " + "; ".join(bad)
        if p.get("on_incompatible") != "cold-start":
            raise StepFailed(why + " (policy: refuse)")
        ctx["images"] = {}
        ctx["cold_start"] = why
        return f"cold start (policy fallback: evict): {why}"

    @staticmethod
    def _restoring(body: Any, ctx: dict[str, Any]) -> dict[str, Any]:
        """The replacement with each container's image set to its verified checkpoint image (by digest), or,
        for a cold start, left as the pod's own image and marked so."""
        import copy

        out = copy.deepcopy(dict(body))
        ann = out.setdefault("metadata", {}).setdefault("annotations", {})
        if ctx["cold_start"]:
            ann[ANN_RESTORE_FROM] = "cold-start"
            return out
        for c in (out.get("spec") or {}).get("containers") or []:
            ref = ctx["images"].get(c.get("name"))
            if ref is None:
                raise StepFailed(f"no checkpoint image for container {c.get('name')!r}")
            c["image"] = ref
            c["imagePullPolicy"] = "IfNotPresent"
        return out


class ClientKubeApi:
    """`KubeApi` with the official client, verified against a real control plane (tests/kubernetes/real)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.api = api_client
        self.core = client.CoreV1Api(api_client)
        self.policy = client.PolicyV1Api(api_client)

    def _call(self, fn: Callable[[], Any]) -> Any:
        from kubernetes.client.rest import ApiException

        try:
            return fn()
        except ApiException as e:
            raise ApiError(int(e.status or 0), str(e.reason)) from None
        except (OSError, urllib3.exceptions.HTTPError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, urllib3.exceptions.NewConnectionError | ConnectionRefusedError):
                raise ApiError(0, f"API server unreachable (request not sent): {e}") from None
            raise ApiError(520, f"API server connection failed: {e}") from None

    def _dict(self, obj: Any) -> dict[str, Any]:
        return self.api.sanitize_for_serialization(obj)

    def read_node(self, name: str) -> dict[str, Any]:
        return self._dict(self._call(lambda: self.core.read_node(name)))

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._dict(self._call(lambda: self.core.read_namespaced_pod(name, namespace)))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        pods = self._call(lambda: self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}"))
        return [self._dict(p) for p in pods.items]

    def read_pdb(self, namespace: str, name: str) -> dict[str, Any]:
        return self._dict(self._call(lambda: self.policy.read_namespaced_pod_disruption_budget(name, namespace)))

    def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._dict(self._call(lambda: self.core.create_namespaced_pod(namespace, body)))

    def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._dict(self._call(lambda: self.core.patch_namespaced_pod(name, namespace, patch)))

    def evict_pod(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self._call(lambda: self.core.create_namespaced_pod_eviction(name, namespace, body))

    def delete_pod(self, namespace: str, name: str) -> None:
        self._call(lambda: self.core.delete_namespaced_pod(name, namespace))
