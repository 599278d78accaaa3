"""`KubernetesEngine`: the `Engine` protocol over a live cluster (or, read-only, over a dump).

Kubernetes has no hold/requeue of a running pod: a move is a `MoveSequence` (see moves.py) run by the
`SequenceRunner`, and this engine's `move()` does exactly that. The Slurm-shaped job actions map where Kubernetes has
an equivalent: `release` removes a pod's scheduling gates, `pin` narrows a gated pod's node affinity (mutable
while gated); `signal`, `hold` and `requeue_hold` are refused with the reason (gpudefrag holds no `pods/exec`: a
pod is signalled only by its node agent, for a move's application hook, and only if it opted in).

With `watch` (a long-lived process: the controller, the dashboard) the engine lists the cluster once and keeps
it current with watches (watch.py); each observation then reads that cache instead of listing again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...core.compat import checkpoint_record
from ...core.model import ClusterState
from ..base import EngineError, JobInfo, JobPhase, NodeInfo
from .convert import KubeCluster
from .executor import ApiError, ClientKubeApi, ImageVerifier, KubeApi, MoveResult, SequenceRunner, is_ready
from .load import load_dump
from .moves import HOSTNAME, MoveLike, MoveOptions, build_move

if TYPE_CHECKING:
    from .watch import WatchCache


class KubernetesEngine:
    name = "kubernetes"
    can_signal = False  # `signal` refuses (no pods/exec): the dashboard does not offer "checkpoint now"

    def __init__(self, *, context: str | None = None, dump: str | os.PathLike[str] | None = None,
                 api_client: Any = None, api: KubeApi | None = None, watch: bool = False) -> None:
        self.context = context
        self.dump = dump
        self._client = api_client
        self._api = api
        self.watch = watch
        self._cache: WatchCache | None = None
        self.last: KubeCluster | None = None

    # ------------------------------------------------------------------ observe
    def cluster(self) -> KubeCluster:
        if self.dump is not None:
            self.last = load_dump(self.dump)
        else:
            from .live import api_client, read_live

            self._client = self._client or api_client(self.context)
            if not self.watch:
                self.last = read_live(self.context, api=self._client)
                return self.last
            if self._cache is None:
                from .watch import WatchCache

                self._cache = WatchCache(self._client, self.context).start()
            self.last = self._cache.cluster()
        return self.last

    def wait(self, timeout: float) -> bool:
        """Sleep until the watches deliver a change that can alter a decision (True), or `timeout` passes
        (False). Without watches (a dump, a one-shot read) there is nothing to wait for: it sleeps."""
        if self._cache is None:
            time.sleep(timeout)
            return False
        return self._cache.wait(timeout)

    def close(self) -> None:
        """End the watches, if any."""
        if self._cache is not None:
            self._cache.stop()
            self._cache = None

    def observe(self) -> ClusterState:
        return self.cluster().state

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            if self.dump is not None:
                raise EngineError(f"{self.dump}: a dump is read-only; actions need a live cluster")
            from .live import api_client

            self._client = self._client or api_client(self.context)
            self._api = ClientKubeApi(self._client)
        return self._api

    @staticmethod
    def _split(job_id: str) -> tuple[str, str]:
        ns, _, name = job_id.partition("/")
        if not name:
            raise EngineError(f"{job_id!r}: a Kubernetes workload id is namespace/pod")
        return ns, name

    # ------------------------------------------------------------------ job facts
    def _read_pod(self, job_id: str, ns: str, name: str) -> dict[str, Any] | None:
        """The pod, or None when the API server says 404. A busy or unreachable API server is an EngineError
        (retried by the executor), never read as a vanished pod."""
        try:
            return self.api.read_pod(ns, name)
        except ApiError as e:
            raise EngineError(f"read pod {job_id}: {e}") from None

    def job(self, job_id: str) -> JobInfo:
        ns, name = self._split(job_id)
        pod = self._read_pod(job_id, ns, name)
        if pod is None:
            return JobInfo(job_id, JobPhase.GONE)
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        phase = status.get("phase", "Pending")
        node = spec.get("nodeName")
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            jp = JobPhase.COMPLETING
        elif phase in ("Succeeded", "Failed"):
            jp = JobPhase.ENDED
        elif node:
            jp = JobPhase.RUNNING
        elif spec.get("schedulingGates"):
            jp = JobPhase.HELD
        else:
            jp = JobPhase.PENDING
        msg = next((c.get("message", "") for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"
                    and c.get("status") == "False"), "")
        restarts = sum(int(c.get("restartCount", 0)) for c in status.get("containerStatuses") or [])
        return JobInfo(job_id, jp, (node,) if node else (), msg or "", restarts)

    def node(self, name: str) -> NodeInfo:
        try:
            raw = self.api.read_node(name)
        except ApiError as e:
            if e.status == 404:
                return NodeInfo(name, False, "gone")
            raise EngineError(f"read node {name}: {e}") from None
        ready = is_ready(raw)
        cordoned = bool((raw.get("spec") or {}).get("unschedulable"))
        return NodeInfo(name, ready and not cordoned, "cordoned" if cordoned else ("ready" if ready else "not-ready"))

    # ------------------------------------------------------------------ actions
    def hold(self, job_id: str) -> None:
        raise EngineError(f"{job_id}: Kubernetes cannot hold an existing pod (scheduling gates can only be "
                          "removed); create it gated instead")

    def release(self, job_id: str) -> None:
        ns, name = self._split(job_id)
        try:
            self.api.patch_pod(ns, name, {"spec": {"schedulingGates": None}})
        except ApiError as e:
            raise EngineError(f"release {job_id}: {e}") from None

    def requeue_hold(self, job_id: str) -> None:
        raise EngineError(f"{job_id}: Kubernetes has no requeue; moves run as MoveSequences (engine.move)")

    def pin(self, job_id: str, nodes: Sequence[str], exclude: Sequence[str] = ()) -> None:
        ns, name = self._split(job_id)
        exprs = []
        if nodes:
            exprs.append({"key": HOSTNAME, "operator": "In", "values": list(nodes)})
        if exclude:
            exprs.append({"key": HOSTNAME, "operator": "NotIn", "values": list(exclude)})
        patch = {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": exprs}]}}}}}
        try:
            self.api.patch_pod(ns, name, patch)
        except ApiError as e:
            raise EngineError(f"pin {job_id} (only a gated pod's affinity may change): {e}") from None

    def signal(self, job_id: str, signal: str, *, batch: bool = True) -> None:
        raise EngineError(f"signal {job_id}: gpudefrag holds no pods/exec on Kubernetes; a pod is signalled only by "
                          "its node agent, for a move's application hook (gpudefrag.io/checkpoint: app)")

    def move(self, move: MoveLike, options: MoveOptions | None = None, *,
             verify_image: ImageVerifier | None = None) -> MoveResult:
        """Build the move's sequence from a fresh observation and run it."""
        cluster = self.last or self.cluster()
        seq = build_move(cluster, move, options)
        versions = checkpoint_record(cluster.state, cluster.state.workload(move.workload_id)) if seq.ok else None
        ex = SequenceRunner(self.api, verify_image=verify_image, compat=(options or MoveOptions()).compat)
        return ex.run(seq, versions)
