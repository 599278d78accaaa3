"""Move sequences: order and content of the API operations, refusals before anything is touched, and the
executor against the in-memory API: no eviction ever follows a replacement that failed; PDBs hold."""

from __future__ import annotations

import dataclasses
import json

import msgspec
import pytest

from gpudefrag.core.compat import CompatRule, VersionMatch
from gpudefrag.engines.kubernetes import (
    InMemoryApi,
    KubeCluster,
    MoveOptions,
    OpKind,
    SequenceRunner,
    SimpleMove,
    build_move,
    build_moves,
)
from gpudefrag.engines.kubernetes.moves import ANN_AGENT_REQUEST, DELETION_COST, HOSTNAME, MoveSequence, Op

BARE = SimpleMove("ml/notebook-ana", "gpu-node-1", "gpu-node-3")
RS = SimpleMove("ml/web-embed-7d9c5b6f4-abcde", "gpu-node-0", "gpu-node-3")
K = OpKind


def run(cluster: KubeCluster, move: SimpleMove, *, fail: frozenset[str] = frozenset(),
        options: MoveOptions | None = None, ready_after: int = 2):  # type: ignore[no-untyped-def]
    seq = build_move(cluster, move, options)
    assert seq.ok, seq.refused
    api = InMemoryApi(cluster, fail=fail, ready_after=ready_after)
    clock = [0.0]
    ex = SequenceRunner(api, verify_image=api.verify_image, sleep=lambda s: clock.__setitem__(0, clock[0] + s),
                  clock=lambda: clock[0])
    return seq, api, ex.run(seq, cluster.state.workload(move.workload_id).versions)


def test_bare_pod_sequence_order_and_content(frag_cluster: KubeCluster) -> None:
    seq = build_move(frag_cluster, BARE)
    assert seq.strategy == "bare-pod" and seq.checkpoint_mode == "kubelet"
    assert seq.kinds() == ["verify-target", "agent-checkpoint", "wait-agent-checkpoint", "verify-checkpoint-image",
                           "create-replacement", "wait-ready", "evict-original", "wait-deleted"]
    ops = {o.kind: o for o in seq.ops}
    # the controller asks the node agent through the pod itself: no kubelet (nodes/proxy) path anywhere
    assert ops[K.AGENT_CHECKPOINT].path == "/api/v1/namespaces/ml/pods/notebook-ana"
    assert not any("/proxy/" in o.path for o in seq.ops)
    req = json.loads(ops[K.AGENT_CHECKPOINT].body["metadata"]["annotations"][ANN_AGENT_REQUEST])  # type: ignore[index]
    assert req == {"move_id": seq.move_id, "containers": ["trainer"]}
    assert ops[K.EVICT_ORIGINAL].path == "/api/v1/namespaces/ml/pods/notebook-ana/eviction"
    assert ops[K.EVICT_ORIGINAL].body["kind"] == "Eviction"  # type: ignore[index]
    # only the eviction commits the move; everything before it can be undone
    assert [o.kind for o in seq.ops if o.irreversible] == [K.EVICT_ORIGINAL]
    body = ops[K.CREATE_REPLACEMENT].body
    assert body is not None
    meta, spec = body["metadata"], body["spec"]
    assert meta["name"] == seq.replacement and meta["name"] != "notebook-ana"
    assert meta["annotations"]["gpudefrag.io/migrated-from"] == "ml/notebook-ana"
    assert not {"uid", "resourceVersion", "managedFields", "ownerReferences", "creationTimestamp"} & set(meta)
    assert "nodeName" not in spec and "status" not in body
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert all({"key": HOSTNAME, "operator": "In", "values": ["gpu-node-3"]} in t["matchExpressions"] for t in terms)
    # the image is the checkpoint image the agent will make: set by the executor, by digest, once verified
    assert spec["containers"][0]["image"] == "nvcr.io/nvidia/pytorch:24.05-py3"
    assert spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert meta["labels"] == {"app": "notebook"}


def test_move_runs_and_original_goes_last(frag_cluster: KubeCluster) -> None:
    seq, api, res = run(frag_cluster, BARE)
    assert res.ok and res.committed and not res.rolled_back
    assert ("ml", "notebook-ana") not in api.pods and ("ml", seq.replacement) in api.pods
    verbs = [(v, p) for v, p in api.calls if v != "GET"]
    assert verbs == [
        ("PATCH", "/api/v1/namespaces/ml/pods/notebook-ana"),  # the request to the node agent
        ("POST", "/api/v1/namespaces/ml/pods"),
        ("POST", "/api/v1/namespaces/ml/pods/notebook-ana/eviction"),
    ]
    # the replacement was read Ready before the eviction was asked for
    evict_at = api.calls.index(("POST", "/api/v1/namespaces/ml/pods/notebook-ana/eviction"))
    assert ("GET", f"/api/v1/namespaces/ml/pods/{seq.replacement}") in api.calls[:evict_at]


@pytest.mark.parametrize("fault", ["ready", "create", "checkpoint"])
def test_no_delete_when_the_replacement_fails(frag_cluster: KubeCluster, fault: str) -> None:
    seq, api, res = run(frag_cluster, BARE, fail=frozenset({fault}))
    assert not res.ok and not res.committed
    assert ("ml", "notebook-ana") in api.pods  # the original still runs
    assert not any(p.endswith("/eviction") or (v == "DELETE" and "notebook-ana/" in p) for v, p in api.calls
                   if "mv-" not in p)
    assert ("ml", seq.replacement) not in api.pods  # and no half-made replacement is left behind
    if fault == "ready":
        assert res.rolled_back and ("DELETE", f"/api/v1/namespaces/ml/pods/{seq.replacement}") in api.calls
    if fault == "checkpoint":
        assert ("POST", "/api/v1/namespaces/ml/pods") not in api.calls


def test_replacement_never_ready_times_out_and_rolls_back(frag_cluster: KubeCluster) -> None:
    seq, api, res = run(frag_cluster, BARE, ready_after=10**9, options=MoveOptions(ready_timeout_s=60))
    assert not res.ok and "timed out" in res.error and res.rolled_back
    assert ("ml", "notebook-ana") in api.pods and ("ml", seq.replacement) not in api.pods


def test_eviction_refused_by_pdb_rolls_back(frag_cluster: KubeCluster) -> None:
    seq, api, res = run(frag_cluster, BARE, fail=frozenset({"evict"}))
    assert not res.ok and "disruption budget" in res.error
    assert res.rolled_back and ("ml", "notebook-ana") in api.pods and ("ml", seq.replacement) not in api.pods


def test_replicaset_pod_is_handed_over(frag_cluster: KubeCluster) -> None:
    seq, api, res = run(frag_cluster, RS)
    assert seq.strategy == "replicaset" and seq.pdbs == ("ml/web-embed",)
    assert seq.kinds() == ["verify-target", "check-pdb", "agent-checkpoint", "wait-agent-checkpoint",
                           "verify-checkpoint-image", "create-replacement", "wait-ready", "set-deletion-cost",
                           "adopt-replacement", "evict-original", "wait-deleted"]
    body = next(o.body for o in seq.ops if o.kind is K.CREATE_REPLACEMENT)
    assert "pod-template-hash" not in body["metadata"]["labels"]  # type: ignore[index]
    assert res.ok, res.error
    repl = api.pods[("ml", seq.replacement)]
    assert repl["metadata"]["labels"]["pod-template-hash"] == "7d9c5b6f4"
    assert repl["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    assert ("ml", "web-embed-7d9c5b6f4-abcde") not in api.pods
    cost = next(o for o in seq.ops if o.kind is K.SET_DELETION_COST)
    assert cost.body == {"metadata": {"annotations": {DELETION_COST: "-2147483648"}}}


def test_pdb_that_forbids_disruption_refuses_before_touching(frag_cluster: KubeCluster) -> None:
    seq = build_move(frag_cluster, SimpleMove("ml/eval-5f6d7-xyz12", "gpu-node-2", "gpu-node-3"))
    assert not seq.ok and "PDB ml/eval" in (seq.refused or "") and seq.ops == ()


def test_pdb_without_room_even_after_replacement_is_refused(frag_cluster: KubeCluster) -> None:
    pdb = dataclasses.replace(frag_cluster.pdbs[0], current_healthy=1, desired_healthy=3, disruptions_allowed=0)
    c = dataclasses.replace(frag_cluster, pdbs=(pdb, *frag_cluster.pdbs[1:]))
    seq = build_move(c, RS)
    assert not seq.ok and "would allow no disruption" in (seq.refused or "")


@pytest.mark.parametrize(("wid", "src", "why"), [
    ("ml/finetune-0", "gpu-node-0", "StatefulSet"),
    ("ml/train-small-q8x2z", "gpu-node-1", "Job"),
    ("ml/train-8g", "gpu-node-0", "not on"),
])
def test_owners_that_cannot_be_moved_are_refused(frag_cluster: KubeCluster, wid: str, src: str, why: str) -> None:
    seq = build_move(frag_cluster, SimpleMove(wid, src, "gpu-node-3"))
    assert not seq.ok and why in (seq.refused or "") and seq.ops == ()


def test_incompatible_target_is_refused_before_anything(frag_cluster: KubeCluster) -> None:
    s = frag_cluster.state
    n3 = msgspec.structs.replace(s.node("gpu-node-3"), driver_version="535.104.05")
    nodes = [n3 if n.name == "gpu-node-3" else n for n in s.nodes]
    c = dataclasses.replace(frag_cluster, state=type(s).build(nodes, s.workloads, quotas=s.quotas))
    seq = build_move(c, BARE)
    assert not seq.ok and "driver" in (seq.refused or "")
    ok = build_move(c, BARE, MoveOptions(compat=CompatRule(driver=VersionMatch.ANY)))
    assert ok.ok


def test_target_changed_since_planning_stops_at_verify(frag_cluster: KubeCluster) -> None:
    seq = build_move(frag_cluster, BARE)
    api = InMemoryApi(frag_cluster)
    api.nodes["gpu-node-3"]["metadata"]["labels"]["nvidia.com/cuda.driver-version.full"] = "560.28.03"
    res = SequenceRunner(api, verify_image=api.verify_image, sleep=lambda s: None).run(
        seq, frag_cluster.state.workload(BARE.workload_id).versions)
    assert not res.ok and res.error.startswith("verify-target") and "driver" in res.error
    assert all(v == "GET" for v, _ in api.calls)


def test_app_hook_sequence(frag_cluster: KubeCluster) -> None:
    """A pod that opted in (gpudefrag.io/checkpoint: app) is asked through the node agent of its node, which
    sends the signal through the node's runtime: no operation of the controller's is an exec."""
    c = _annotated(frag_cluster, BARE.workload_id, {"gpudefrag.io/checkpoint": "app"})
    seq, api, res = run(c, BARE)
    assert seq.checkpoint_mode == "app"
    assert seq.kinds()[:5] == ["verify-target", "request-app-checkpoint", "signal", "wait-agent-signal",
                               "wait-app-checkpoint"]
    sig = next(o for o in seq.ops if o.kind is K.SIGNAL)
    assert sig.verb == "PATCH" and sig.path == "/api/v1/namespaces/ml/pods/notebook-ana"
    assert json.loads(sig.body["metadata"]["annotations"][ANN_AGENT_REQUEST]) == {  # type: ignore[index]
        "move_id": seq.move_id, "hook": {"container": "trainer", "signal": "USR1"}}
    assert not any(p.endswith("/exec") for _, p in api.calls) and not any(o.path.endswith("/exec") for o in seq.ops)
    env = next(o.body for o in seq.ops if o.kind is K.CREATE_REPLACEMENT)["spec"]["containers"][0]["env"]  # type: ignore[index]
    assert {"name": "GPUDEFRAG_RESTORE_FROM", "value": f"/checkpoints/ml/notebook-ana/{seq.move_id}"} in env
    assert res.ok, res.error
    assert res.steps[3].detail == "kill -USR1 1 in trainer through memory"


def test_app_hook_for_a_pod_that_did_not_opt_in_is_refused_by_the_agent(frag_cluster: KubeCluster) -> None:
    """The controller forced to the app hook (`--checkpoint app`) for a pod without the opt-in: the agent refuses,
    says why where the executor reads its answer, and the move rolls back with the original untouched."""
    seq, api, res = run(frag_cluster, BARE, options=MoveOptions(checkpoint="app"))
    assert seq.checkpoint_mode == "app"
    assert not res.ok and res.rolled_back
    assert res.error.startswith("wait-agent-signal: node agent: pod ml/notebook-ana did not opt in"), res.error
    assert ("POST", "/api/v1/namespaces/ml/pods") not in api.calls
    ann = api.pods[("ml", "notebook-ana")]["metadata"]["annotations"]
    assert not {ANN_AGENT_REQUEST, "gpudefrag.io/checkpoint-request"} & set(ann)


def test_missing_verifier_fails_safely(frag_cluster: KubeCluster) -> None:
    seq = build_move(frag_cluster, BARE)
    api = InMemoryApi(frag_cluster)
    res = SequenceRunner(api, sleep=lambda s: None).run(seq)
    assert not res.ok and "verifier" in res.error and res.rolled_back
    assert ("POST", "/api/v1/namespaces/ml/pods") not in api.calls and ("ml", "notebook-ana") in api.pods
    # the agent request is withdrawn
    assert ANN_AGENT_REQUEST not in api.pods[("ml", "notebook-ana")]["metadata"]["annotations"]


def test_replacement_restores_from_the_verified_image_by_digest(frag_cluster: KubeCluster) -> None:
    seq, api, res = run(frag_cluster, BARE)
    assert res.ok, res.error
    created = [p for (ns, n), p in api.pods.items() if n == seq.replacement]
    image = created[0]["spec"]["containers"][0]["image"]
    assert image.startswith("registry.local/gpudefrag/checkpoints/ml-notebook-ana-trainer@sha256:")
    assert ("ml", "notebook-ana") not in api.pods


@pytest.mark.parametrize("fault", ["checkpoint", "image"])
def test_agent_failure_or_untrusted_image_leaves_the_original(frag_cluster: KubeCluster, fault: str) -> None:
    seq, api, res = run(frag_cluster, BARE, fail=frozenset({fault}))
    assert not res.ok and res.rolled_back
    assert res.error.startswith("wait-agent-checkpoint" if fault == "checkpoint" else "verify-checkpoint-image")
    assert ("ml", "notebook-ana") in api.pods and ("ml", seq.replacement) not in api.pods
    assert ("POST", "/api/v1/namespaces/ml/pods") not in api.calls


@pytest.mark.parametrize(("policy", "ok"), [("refuse", False), ("cold-start", True)])
def test_incompatible_image_goes_the_policy_way(frag_cluster: KubeCluster, policy: str, ok: bool) -> None:
    """The image records driver 550.54.15; by the time it is checked the target reports another driver. The
    target check before the checkpoint passed (it ran on the planned labels); the image's own record decides."""
    seq = build_move(frag_cluster, BARE, MoveOptions(on_incompatible=policy))
    api = InMemoryApi(frag_cluster)
    ex = SequenceRunner(api, verify_image=api.verify_image, sleep=lambda s: None)
    real = api.verify_image
    api.verify_image = lambda ref: msgspec.structs.replace(real(ref), driver="999.1.1")  # type: ignore[method-assign]
    ex.verify_image = api.verify_image
    res = ex.run(seq)
    assert res.ok is ok, res.error
    step = next(s for s in res.steps if s.op == "verify-checkpoint-image")
    assert "driver" in step.detail
    if ok:
        repl = next(p for (_, n), p in api.pods.items() if n == seq.replacement)
        assert repl["spec"]["containers"][0]["image"] == "nvcr.io/nvidia/pytorch:24.05-py3"  # fresh, from its own image
        assert repl["metadata"]["annotations"]["gpudefrag.io/restore-from"] == "cold-start"
    else:
        assert "policy: refuse" in res.error and ("ml", "notebook-ana") in api.pods


def test_policy_budget_refuses_moves_beyond_it(frag_cluster: KubeCluster) -> None:
    seqs = build_moves(frag_cluster, [BARE, RS], budget=1)
    assert seqs[0].ok and not seqs[1].ok and "budget" in (seqs[1].refused or "")


def test_move_ids_are_deterministic(frag_cluster: KubeCluster) -> None:
    assert build_move(frag_cluster, BARE).move_id == build_move(frag_cluster, BARE).move_id
    assert build_move(frag_cluster, BARE).move_id != build_move(
        frag_cluster, SimpleMove(BARE.workload_id, BARE.source, "gpu-node-2")).move_id


def test_target_without_room_now_stops_at_verify(frag_cluster: KubeCluster) -> None:
    """The planner saw room on the target; by the time the move runs another pod took it."""
    seq = build_move(frag_cluster, RS)  # needs 2 GPUs; gpu-node-3 has 3 free in the dump
    api = InMemoryApi(frag_cluster)
    intruder = dict(api.pods[("ml", "batch-infer-2")], metadata={"name": "intruder", "namespace": "ml"})
    api.pods[("ml", "intruder")] = intruder  # 2 more GPUs on gpu-node-3: 1 left
    res = SequenceRunner(api, verify_image=api.verify_image, sleep=lambda s: None).run(seq)
    assert not res.ok and "1 free GPU(s) now; the pod needs 2" in res.error
    assert all(v == "GET" for v, _ in api.calls)


def _annotated(cluster: KubeCluster, wid: str, ann: dict[str, str]) -> KubeCluster:
    import copy
    from types import MappingProxyType

    info = cluster.pods[wid]
    raw = copy.deepcopy(dict(info.raw))
    raw["metadata"]["annotations"] = {**(raw["metadata"].get("annotations") or {}), **ann}
    pods = dict(cluster.pods)
    pods[wid] = dataclasses.replace(info, raw=MappingProxyType(raw))
    return dataclasses.replace(cluster, pods=MappingProxyType(pods))


def test_recreate_opt_in_moves_without_a_checkpoint(frag_cluster: KubeCluster) -> None:
    """A pod whose owner annotated it `gpudefrag.io/move: recreate` is moved with no checkpoint step: the
    replacement runs the pod's own image and restores nothing; every other safety step stays."""
    c = _annotated(frag_cluster, RS.workload_id, {"gpudefrag.io/move": "recreate"})
    seq = build_move(c, RS, MoveOptions(checkpoint="kubelet"))
    assert seq.checkpoint_mode == "recreate"
    assert seq.kinds() == ["verify-target", "check-pdb", "create-replacement", "wait-ready", "set-deletion-cost",
                           "adopt-replacement", "evict-original", "wait-deleted"]
    body = {o.kind: o for o in seq.ops}[K.CREATE_REPLACEMENT].body
    assert body is not None
    orig = c.pods[RS.workload_id].raw["spec"]["containers"][0]["image"]
    assert body["spec"]["containers"][0]["image"] == orig
    assert "gpudefrag.io/restore-from" not in body["metadata"]["annotations"]
    assert not any(e["name"] == "GPUDEFRAG_RESTORE_FROM" for e in body["spec"]["containers"][0].get("env") or [])
    # without the annotation the same pod is checkpointed
    assert build_move(frag_cluster, RS).checkpoint_mode == "kubelet"


def test_replicaset_without_a_deployment_is_refused(frag_cluster: KubeCluster) -> None:
    """Without pod-template-hash the replacement would match the ReplicaSet's selector as soon as it exists."""
    import copy
    from types import MappingProxyType

    info = frag_cluster.pods[RS.workload_id]
    raw = copy.deepcopy(dict(info.raw))
    del raw["metadata"]["labels"]["pod-template-hash"]
    pods = {**frag_cluster.pods, RS.workload_id: dataclasses.replace(info, raw=MappingProxyType(raw))}
    seq = build_move(dataclasses.replace(frag_cluster, pods=MappingProxyType(pods)), RS)
    assert not seq.ok and "no Deployment manages" in (seq.refused or "") and not seq.ops


@pytest.mark.parametrize("change", ["replaced", "moved", "gone"])
def test_original_changed_since_planning_stops_at_verify(frag_cluster: KubeCluster, change: str) -> None:
    """The plan came from a watch cache that had not yet seen the change: the move stops before touching
    anything, so a namesake made since is never evicted."""
    seq = build_move(frag_cluster, BARE)
    api = InMemoryApi(frag_cluster)
    pod = api.pods[("ml", "notebook-ana")]
    if change == "replaced":
        pod["metadata"]["uid"] = "uid-of-a-namesake"
    elif change == "moved":
        pod["spec"]["nodeName"] = "gpu-node-2"
    else:
        del api.pods[("ml", "notebook-ana")]
    res = SequenceRunner(api, verify_image=api.verify_image, sleep=lambda s: None).run(seq)
    assert not res.ok and res.error.startswith("verify-target") and "notebook-ana" in res.error, res.error
    assert all(v == "GET" for v, _ in api.calls)


def test_eviction_names_the_planned_uid(frag_cluster: KubeCluster) -> None:
    """The eviction carries the original's uid as a precondition: the API server refuses it (409) for a pod of
    the same name made after the plan, even past the verification (the in-memory API enforces it the same way)."""
    seq = build_move(frag_cluster, BARE)
    evict = next(o for o in seq.ops if o.kind is K.EVICT_ORIGINAL)
    uid = frag_cluster.pods[BARE.workload_id].uid
    assert uid and evict.body["deleteOptions"] == {"preconditions": {"uid": uid}}  # type: ignore[index]
    api = InMemoryApi(frag_cluster)
    api.pods[("ml", "notebook-ana")]["metadata"]["uid"] = "uid-of-a-namesake"
    res = SequenceRunner(api, verify_image=api.verify_image, sleep=lambda s: None).run(
        dataclasses.replace(seq, ops=tuple(o for o in seq.ops if o.kind is not K.VERIFY_TARGET)))
    assert not res.ok and res.error.startswith("evict-original") and res.rolled_back, res.error
    assert ("ml", "notebook-ana") in api.pods


@pytest.mark.parametrize("node_state", ["not-ready", "deleted"])
def test_replacement_ready_on_a_node_that_is_not_never_commits(frag_cluster: KubeCluster, node_state: str) -> None:
    """The target passed the check, then went NotReady (or away) while the replacement was starting; the
    replacement is reported Ready anyway. The original is not evicted; the replacement is removed."""
    seq = build_move(frag_cluster, BARE, MoveOptions(ready_timeout_s=30))
    api = InMemoryApi(frag_cluster)
    clock = [0.0]

    def before(_seq: MoveSequence, _i: int, op: Op) -> None:
        if op.kind is not K.WAIT_READY:
            return
        if node_state == "deleted":
            del api.nodes["gpu-node-3"]
        else:
            for c in api.nodes["gpu-node-3"]["status"]["conditions"]:
                if c["type"] == "Ready":
                    c["status"] = "False"

    ex = SequenceRunner(api, verify_image=api.verify_image, sleep=lambda s: clock.__setitem__(0, clock[0] + s),
                  clock=lambda: clock[0], before=before)
    res = ex.run(seq, frag_cluster.state.workload(BARE.workload_id).versions)
    assert not res.ok and not res.committed and res.rolled_back, res.as_dict()
    assert ("ml", "notebook-ana") in api.pods and ("ml", seq.replacement) not in api.pods
    assert not any(p.endswith("/eviction") for _v, p in api.calls)
    want = ("timed out", "on a Ready node") if node_state == "not-ready" else ("gpu-node-3", "was deleted")
    assert all(w in res.error for w in want), res.error
