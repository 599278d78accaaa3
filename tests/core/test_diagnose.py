"""Every pending cause, each on a snapshot that shows it, and several at once."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudefrag.core.diagnose import CauseCode as C
from gpudefrag.core.diagnose import diagnose_all, diagnose_request
from gpudefrag.core.model import Request
from gpudefrag.demo import demo_state

_spec = importlib.util.spec_from_file_location("core_builders", Path(__file__).with_name("conftest.py"))
_b = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(_b)  # type: ignore[union-attr]
node, job, build = _b.node, _b.job, _b.build


def codes(state, jid="big"):
    (d,) = diagnose_all(state, [jid])
    return d.codes, d


def test_fragmentation_alone_on_the_demo_cluster():
    state = demo_state()
    (d,) = diagnose_all(state)
    assert d.codes == (C.FRAGMENTATION,)
    assert d.is_fragmentation
    ev = d.primary.evidence
    assert ev["free_gpus"] == 12 and ev["largest_block"] == 3
    assert ev["min_moves_to_clear"] == 2  # the 3+2 nodes; node b needs 2 of its 3 jobs moved too
    assert "12 GPUs free, largest block 3" in d.primary.summary


def test_device_plugin_missing():
    s = build([node("a"), node("b", gpu_allocatable=0)], [job("x", 6, "a"), job("big", 4)])
    got, d = codes(s)
    assert got == (C.DEVICE_PLUGIN_MISSING, C.INSUFFICIENT_GPUS)
    assert d.causes[0].evidence["nodes"] == ["b"] and d.causes[0].evidence["gpus_missing"] == 8


def test_quota_exceeded_even_though_it_fits():
    s = build(
        [node("a")],
        [job("x", 4, "a", namespace="team"), job("big", 2, namespace="team")],
        quotas=[{"namespace": "team", "gpu_limit": 5}],
    )
    got, d = codes(s)
    assert got == (C.QUOTA_EXCEEDED, C.FITS_NOW)
    assert d.causes[0].evidence == {"namespace": "team", "limit": 5, "used": 4.0, "requested": 2.0,
                                    "charged_at": "start"}


def test_a_quota_charged_at_creation_never_holds_back_a_pod_that_exists():
    """Kubernetes: `used` counts the pending pod already (hard=8, used=8 with 4 running and the 4-GPU pod
    pending); the quota does not stop it being scheduled, so no quota cause. A workload whose pods the quota
    refused to create (FailedCreate) and a hypothetical request are charged on creation: those are blocked."""
    q = [{"namespace": "team", "gpu_limit": 8, "gpu_used": 8, "charged_at": "create"}]
    s = build([node("a")], [job("x", 4, "a", namespace="team"), job("big", 4, namespace="team")], quotas=q)
    assert codes(s)[0] == (C.FITS_NOW,)
    refused = ("Error creating: pods \"big-x7k2p\" is forbidden: exceeded quota: gpu-quota, requested: "
               "requests.nvidia.com/gpu=4, used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8")
    s2 = build([node("a")], [job("x", 8, "a", namespace="team"), job("big", 4, namespace="team",
                                                                   scheduler_reason=refused)],
               quotas=[{**q[0], "gpu_used": 8}])
    got, d = codes(s2)
    assert got[0] == C.QUOTA_EXCEEDED and "quota admission refuses them" in d.causes[0].summary
    assert "QOS" not in d.causes[0].summary and "scheduler says" not in d.causes[0].summary
    hypo = diagnose_request(s, Request(4), namespace="team")
    assert hypo.codes[0] == C.QUOTA_EXCEEDED
    # with `used` absent, a quota charged at creation sums the pending pods too (8 charged of 8 here)
    s3 = build([node("a")], [job("x", 4, "a", namespace="team"), job("big", 4, namespace="team")],
               quotas=[{"namespace": "team", "gpu_limit": 8, "charged_at": "create"}])
    assert codes(s3)[0] == (C.FITS_NOW,)
    assert diagnose_request(s3, Request(1), namespace="team").codes[0] == C.QUOTA_EXCEEDED


def test_every_node_tainted_is_taints_not_a_full_cluster():
    """The scheduler says `3 node(s) had untolerated taint(s)`: with 12 GPUs free on tainted nodes and none
    fitting 8 on one node, the cause names the taint, the nodes it excludes and the room left (none)."""
    taint = [{"key": "dedicated", "value": "inference", "effect": "NoSchedule"}]
    s = build([node(n, taints=taint) for n in "abc"],
              [job("x", 4, "a"), job("y", 4, "b"), job("z", 4, "c"), job("big", 8)])
    got, d = codes(s)
    assert got[0] == C.TAINTS_OR_SELECTORS, d
    c = d.causes[0]
    assert "taint dedicated=inference:NoSchedule excludes a, b, c" in c.summary, c.summary
    assert c.evidence["excluded_free_gpus"] == 12 and c.evidence["allowed_free_gpus"] == 0
    assert "the cluster is full" not in " ".join(x.summary for x in d.causes)


def test_some_nodes_tainted_names_the_taint_and_the_room_left():
    taint = [{"key": "dedicated", "value": "inference", "effect": "NoSchedule"}]
    s = build([node("a"), node("b", taints=taint), node("c", taints=taint)],
              [job("x", 6, "a"), job("y", 4, "b"), job("z", 4, "c"), job("big", 8)])
    got, d = codes(s)
    assert got[0] == C.TAINTS_OR_SELECTORS, d
    c = d.causes[0]
    assert "excludes b, c" in c.summary and "the 1 node(s) it may use have 2 GPU(s) free" in c.summary, c.summary
    assert c.evidence["allowed_free_gpus"] == 2 and c.evidence["excluded_free_gpus"] == 8


def test_quota_of_another_namespace_does_not_apply():
    s = build([node("a")], [job("x", 4, "a", namespace="team"), job("big", 2, namespace="other")],
              quotas=[{"namespace": "team", "gpu_limit": 4}])
    assert codes(s)[0] == (C.FITS_NOW,)


def test_autoscaler_at_max():
    s = build(
        [node("a", node_group="pool"), node("b", node_group="pool")],
        [job("x", 8, "a"), job("y", 8, "b"), job("big", 8)],
        node_groups=[{"name": "pool", "current": 2, "maximum": 2, "gpu_model": "H100", "gpus_per_node": 8}],
    )
    assert codes(s)[0] == (C.AUTOSCALER_AT_MAX, C.INSUFFICIENT_GPUS)


def test_autoscaler_with_headroom_is_not_a_cause():
    s = build([node("a")], [job("x", 8, "a"), job("big", 8)],
              node_groups=[{"name": "pool", "current": 1, "maximum": 3, "gpus_per_node": 8}])
    assert codes(s)[0] == (C.INSUFFICIENT_GPUS,)


def test_request_larger_than_any_node():
    s = build([node("a"), node("b", gpus=4)], [job("big", 16)])
    got, d = codes(s)
    assert got == (C.REQUEST_TOO_LARGE,)
    assert d.primary.evidence["largest_node_gpus"] == 8


def test_request_larger_than_any_node_of_the_allowed_model():
    s = build([node("a", gpus=8, gpu_model="T4"), node("b", gpus=4, gpu_model="A100")],
              [job("big", 8, gpu_models=["A100"])])
    got, d = codes(s)
    assert got == (C.REQUEST_TOO_LARGE,)
    assert d.primary.evidence["largest_node_gpus"] == 4 and d.primary.evidence["largest_node_any_model"] == 8


def test_request_larger_than_any_node_by_its_cpu_or_memory():
    """A request whose GPUs exist but whose CPU (or memory) no node with enough GPUs has, even empty: ordinary
    and impossible — whether its GPUs are free now (it was cpu-or-memory) or scattered (it was fragmentation,
    and the planner searched for moves that could never start it)."""
    nodes = [node("a", cpu_milli=96000, memory_mib=393216), node("b", cpu_milli=96000, memory_mib=393216),
             node("c", gpus=2, cpu_milli=256000, memory_mib=2_000_000)]
    for placed in ([], [job("x", 4, "a"), job("y", 4, "b")]):  # GPUs free now / scattered
        s = build(nodes, [*placed, job("big", 8, cpu_milli=120000, memory_mib=737280)])
        got, d = codes(s)
        assert got == (C.REQUEST_TOO_LARGE,), (placed, got)
        assert d.blocking and not d.is_fragmentation
        assert d.primary.evidence["lacking"] == ["CPU", "memory"]
        assert d.primary.evidence["largest_node_cpu_milli"] == 96000
        assert "even with nothing running" in d.primary.summary
    # memory alone; a node that does not track memory never lacks it
    s = build(nodes, [job("big", 8, cpu_milli=8000, memory_mib=500_000)])
    assert codes(s)[0] == (C.REQUEST_TOO_LARGE,) and codes(s)[1].primary.evidence["lacking"] == ["memory"]
    s = build([*nodes[:2], node("d", cpu_milli=128000)], [job("big", 8, cpu_milli=120000, memory_mib=737280)])
    assert codes(s)[0] == (C.FITS_NOW,)
    # a multi-node request needs the room on as many nodes
    s = build([node("a", cpu_milli=96000), node("b", cpu_milli=16000)], [job("big", 8, cpu_milli=32000,
                                                                              node_count=2)])
    got, d = codes(s)
    assert got == (C.REQUEST_TOO_LARGE,) and "only 1 such node(s) have" in d.primary.summary


@settings(max_examples=150, deadline=None)
@given(cpus=st.lists(st.sampled_from([0, 16000, 64000, 96000]), min_size=1, max_size=6),
       gpus=st.lists(st.sampled_from([2, 4, 8]), min_size=6, max_size=6),
       want_gpus=st.sampled_from([1, 2, 4, 8]), want_cpu=st.sampled_from([1000, 32000, 80000, 120000]),
       busy=st.booleans())
def test_too_large_by_cpu_exactly_when_no_big_enough_node_has_the_cpu(cpus, gpus, want_gpus, want_cpu, busy):
    """The diagnosis says request-too-large for CPU exactly when no node with enough GPUs has, built, the CPU
    the request asks for (0 = not tracked: never lacking); jobs running on the nodes change nothing."""
    nodes = [node(f"n{i}", gpus=gpus[i], cpu_milli=c) for i, c in enumerate(cpus)]
    placed = [job(f"x{i}", 1, f"n{i}", cpu_milli=min(c, 1000)) for i, c in enumerate(cpus)] if busy else []
    s = build(nodes, [*placed, job("big", want_gpus, cpu_milli=want_cpu)])
    got, d = codes(s)
    big_enough = [c for i, c in enumerate(cpus) if gpus[i] >= want_gpus]
    if not big_enough:  # too large by its GPUs
        assert got == (C.REQUEST_TOO_LARGE,) and "largest_node_gpus" in d.primary.evidence
        return
    expect = all(0 < c < want_cpu for c in big_enough)
    assert (got == (C.REQUEST_TOO_LARGE,)) is expect, got
    assert (C.REQUEST_TOO_LARGE not in got) or d.primary.evidence["lacking"] == ["CPU"]


def test_no_node_of_the_gpu_model():
    s = build([node("a", gpu_model="H100")], [job("big", 1, gpu_models=["A100"])])
    got, d = codes(s)
    assert got == (C.NO_SUCH_GPU_MODEL,)
    assert d.primary.evidence["present"] == ["H100"]


def test_taint_excludes_the_node_with_room():
    s = build(
        [node("a", taints=[{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]), node("b")],
        [job("x", 8, "b"), job("big", 4)],
    )
    got, d = codes(s)
    assert got == (C.TAINTS_OR_SELECTORS, C.INSUFFICIENT_GPUS)
    assert "untolerated taint dedicated=infer:NoSchedule" in d.primary.summary


def test_toleration_lets_it_fit():
    s = build(
        [node("a", taints=[{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]), node("b")],
        [job("x", 8, "b"), job("big", 4, tolerations=[{"key": "dedicated", "operator": "Exists"}])],
    )
    assert codes(s)[0] == (C.FITS_NOW,)


def test_node_selector_mismatch():
    s = build([node("a", labels={"zone": "x"}), node("b", labels={"zone": "y"})],
              [job("x", 8, "b"), job("big", 2, node_selector={"zone": "y"})])
    assert codes(s)[0] == (C.TAINTS_OR_SELECTORS, C.INSUFFICIENT_GPUS)


def test_mig_mixed_node():
    s = build(
        [node("a", gpu_allocatable=4, mig_devices={"nvidia.com/mig-1g.10gb": 28}), node("b")],
        [job("x", 8, "b"), job("big", 8)],
    )
    got, d = codes(s)
    assert got == (C.MIG_MIXED, C.INSUFFICIENT_GPUS)
    assert d.causes[0].evidence["mixed"] == ["a"]


def test_cordoned_node_with_room():
    s = build([node("a", schedulable=False), node("b")], [job("x", 8, "b"), job("big", 8)])
    assert codes(s)[0] == (C.NODES_UNSCHEDULABLE, C.INSUFFICIENT_GPUS)


def test_cpu_or_memory():
    s = build([node("a", cpu_milli=16000)], [job("x", 1, "a", cpu_milli=12000), job("big", 2, cpu_milli=8000)])
    assert codes(s)[0] == (C.CPU_OR_MEMORY,)


def test_cluster_simply_full():
    s = build([node("a"), node("b")], [job("x", 8, "a"), job("y", 7, "b"), job("big", 2)])
    got, d = codes(s)
    assert got == (C.INSUFFICIENT_GPUS,)
    assert d.primary.evidence == {"free_gpus": 1.0, "free_share": 1.0, "requested": 2.0}


def test_fits_now():
    s = build([node("a")], [job("x", 4, "a"), job("big", 4)])
    assert codes(s)[0] == (C.FITS_NOW,)


def test_several_causes_listed_in_order():
    # quota exceeded AND the free GPUs are scattered AND a device plugin is missing on a third node
    s = build(
        [node("a"), node("b"), node("c", gpu_allocatable=0)],
        [job("x", 5, "a", namespace="t"), job("y", 5, "b"), job("big", 4, namespace="t")],
        quotas=[{"namespace": "t", "gpu_limit": 8}],
    )
    got, d = codes(s)
    assert got == (C.DEVICE_PLUGIN_MISSING, C.QUOTA_EXCEEDED, C.FRAGMENTATION)
    assert not d.is_fragmentation
    assert "(other causes also hold)" in d.causes[-1].summary


def test_fractional_request_fragmented():
    # every GPU has 0.4 free; a 0.5-GPU request fits nowhere although 3.2 GPUs are free
    s = build([node("a", gpus=4), node("b", gpus=4)],
              [job(f"s{i}", 1, n, gpu_milli=600) for i, n in enumerate(["a"] * 4 + ["b"] * 4)]
              + [job("big", 1, gpu_milli=500)])
    got, d = codes(s)
    assert got == (C.FRAGMENTATION,)
    assert d.primary.evidence["free_gpus"] == 3.2


def test_hypothetical_request():
    d = diagnose_request(demo_state(), Request(gpus_per_node=3))
    assert d.codes == (C.FITS_NOW,)


def test_moves_to_clear_count_the_cpu_the_request_needs_too():
    """Moving the 4-GPU job off node a frees enough GPUs but not the CPU the request needs: two jobs must go;
    node b (16 cores) can never hold it, however many jobs leave."""
    s = build([node("a", cpu_milli=64000), node("b", cpu_milli=16000)],
              [job("x", 4, "a", cpu_milli=2000), job("y", 2, "a", cpu_milli=50000),
               job("z1", 3, "b", cpu_milli=1000), job("z2", 3, "b", cpu_milli=1000),
               job("big", 4, cpu_milli=40000)])
    got, d = codes(s)
    assert C.FRAGMENTATION in got
    ev = next(c for c in d.causes if c.code is C.FRAGMENTATION).evidence
    assert ev["min_moves_to_clear"] == 2 and ev["clearable_nodes"] == ["a"]


def test_slurm_default_priorities_are_held_by_the_model():
    """Issue 32: Slurm's default priorities (~4,294,901,758, unsigned 32-bit) must validate."""
    s = build([node("a")], [job("x", 2, "a", priority=4_294_901_758), job("big", 8, priority=4_294_901_757)],
              scheduler="slurm")
    assert s.workload("x").priority == 4_294_901_758


def test_partition_time_limit_is_a_limit_named_by_name():
    """PartitionTimeLimit is a limit cause (docs/slurm.md: `*Limit` reasons are quota/limit causes), named."""
    s = build([node("a"), node("b")], [job("x", 4, "a"), job("big", 8, scheduler_reason="PartitionTimeLimit")],
              scheduler="slurm")
    got, d = codes(s)
    assert got[0] == C.QUOTA_EXCEEDED
    assert d.causes[0].evidence["limit"] == "PartitionTimeLimit"
    assert "PartitionTimeLimit limit" in d.causes[0].summary and "MaxTime" in d.causes[0].summary


def test_fragmentation_evidence_names_only_nodes_whose_jobs_the_planner_may_move():
    """Evidence says only what the planner could do: nodes whose jobs the filter excludes are not 'clearable'."""
    s = build([node("a"), node("b"), node("c")],
              [job("x", 4, "a", name="w-x"), job("y", 4, "b", name="big-y"), job("z", 4, "c", name="big-z"),
               job("big", 8)])
    (d,) = diagnose_all(s, ["big"], movable=lambda w: w.name.startswith("w-"))
    ev = d.primary.evidence
    assert d.codes == (C.FRAGMENTATION,) and ev["clearable_nodes"] == ["a"]
    assert "(e.g. a)" in d.primary.summary
    (d2,) = diagnose_all(s, ["big"], movable=lambda w: False)
    assert "no node can be cleared by moving the jobs the planner may move" in d2.primary.summary


# ------------------------------------------------------------------------ moves to clear a node (evidence)
def _moves_by_hand(state, r, candidates, whole, may_move):  # type: ignore[no-untyped-def]
    """The count node by node, as the evidence defines it: the node's movable single-node jobs (the filter says
    yes, not as large as the request), largest first, until the request's GPUs, CPU and memory are there."""
    from gpudefrag.core.diagnose import _as_large

    out = []
    for i in np.flatnonzero(candidates):
        n = state.nodes[i]
        jobs = sorted(((len(p.gpus), w.request.cpu_milli, w.request.memory_mib) for w in state.workloads_on[n.name]
                       if w.can_move and (may_move is None or may_move(w)) and not _as_large(w.request, r)
                       for p in w.placements if p.node == n.name), reverse=True)
        need = (r.gpus_per_node - int(whole[i]) if r.gpu_milli >= 1000 else 0,
                r.cpu_milli - int(state.cpu_free[i]), r.memory_mib - int(state.mem_free[i]))
        got, k = [0, 0, 0], 0
        for job in jobs:
            if all(g >= x for g, x in zip(got, need, strict=True)) and (k or r.gpu_milli >= 1000):
                break
            got, k = [g + x for g, x in zip(got, job, strict=True)], k + 1
        if k and all(g >= x for g, x in zip(got, need, strict=True)):
            out.append((k, n.name))
    return sorted(out)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**6), gpus=st.integers(1, 8), milli=st.sampled_from([1000, 500, 250]),
       cpu=st.sampled_from([0, 8000, 64000]), filtered=st.booleans())
def test_the_moves_to_clear_each_node_are_counted_as_by_hand(seed, gpus, milli, cpu, filtered):
    """The vectorised count (all nodes at once) equals the node-by-node definition on random clusters: whole
    and shared GPUs, CPU, immovable, multi-node and filtered-out jobs."""
    import random

    from gpudefrag.core.diagnose import _Context, _moves_to_clear
    from gpudefrag.core.model import ClusterState, Node, Placement, Workload

    rng = random.Random(seed)
    nodes = [Node(f"n{i}", 8, "H100", cpu_milli=rng.choice([0, 64000, 128000])) for i in range(rng.randint(1, 12))]
    wls = []
    for nd in nodes:
        g = 0
        while g < 8 and rng.random() < 0.8:
            k = min(rng.choice([1, 1, 2, 4]), 8 - g)
            wls.append(Workload(f"w{len(wls)}", Request(k, cpu_milli=rng.choice([0, 4000, 16000]),
                                                        node_count=1),
                                placements=(Placement(nd.name, tuple(range(g, g + k))),),
                                movable=rng.random() < 0.85, namespace=rng.choice(["a", "b"])))
            g += k
    if len(nodes) > 1 and rng.random() < 0.5:  # a multi-node job over two nodes' last GPU, when free
        free0 = {i for i in range(8)} - {x for w in wls for p in w.placements if p.node == "n0" for x in p.gpus}
        free1 = {i for i in range(8)} - {x for w in wls for p in w.placements if p.node == "n1" for x in p.gpus}
        if free0 and free1:
            wls.append(Workload("multi", Request(1, node_count=2), placements=(
                Placement("n0", (min(free0),)), Placement("n1", (min(free1),)))))
    state = ClusterState.build(nodes, wls)
    r = Request(gpus if milli == 1000 else 1, gpu_milli=milli, cpu_milli=cpu)
    candidates = np.array([rng.random() < 0.8 for _ in nodes])
    whole = _Context(state).whole
    may_move = (lambda w: w.namespace == "a") if filtered else None
    assert _moves_to_clear(state, r, candidates, whole, may_move) == _moves_by_hand(state, r, candidates, whole,
                                                                                    may_move)


@st.composite
def _crowded(draw):  # type: ignore[no-untyped-def]
    """Nodes of two models (one without its device plugin now and then), running jobs filling them, and pending
    jobs of a few shapes (the loader shares one Request per plain shape) in two namespaces, one under a quota."""
    nodes, workloads = [], []
    for i in range(draw(st.integers(1, 4))):
        gpus = draw(st.sampled_from((2, 4, 8)))
        extra = {"gpu_allocatable": 0} if draw(st.integers(0, 5)) == 0 else {}
        nodes.append(node(f"n{i}", gpus, gpu_model=draw(st.sampled_from(("H100", "A100"))), **extra))
        left = 0 if extra else gpus  # no GPUs advertised: none handed out
        for j in range(draw(st.integers(0, 3))):
            k = draw(st.integers(1, 4))
            if k <= left:
                left -= k
                workloads.append(job(f"r{i}-{j}", k, f"n{i}", namespace=draw(st.sampled_from(("a", "b")))))
    for j in range(draw(st.integers(1, 10))):
        extra = {"gpu_models": ["A100"]} if draw(st.integers(0, 4)) == 0 else {}
        workloads.append(job(f"p{j}", draw(st.sampled_from((1, 2, 4, 8))), namespace=draw(st.sampled_from(("a", "b"))),
                             submitted_at=float(j), scheduler_reason=draw(st.sampled_from(("", "Resources",
                                                                                           "ReqNodeNotAvail"))),
                             **extra))
    return build(nodes, workloads, quotas=[{"namespace": "a", "gpu_limit": draw(st.integers(0, 12))}])


@settings(max_examples=200, deadline=None)
@given(_crowded())
def test_diagnose_all_equals_each_job_diagnosed_alone(s):
    """diagnose_all shares work between pending jobs (one diagnosis per request, namespace and reason; the
    request's masks across namespaces and reasons): what it gives must be what each job gets alone, in a
    context of its own."""
    assert diagnose_all(s) == [diagnose_all(s, [w.id])[0] for w in s.pending_gpu]


def test_pending_jobs_sharing_a_request_get_each_their_own_diagnosis():
    """diagnose_all runs the checks once per (request, namespace, scheduler reason): the jobs that share one get
    what diagnosing each alone gives, under their own id; a namespace's quota or a reason still tells them apart."""
    s = build(
        [node("a"), node("b", gpus=2)],
        [job("x", 4, "a", namespace="team"), job("y", 1, "b"), job("p1", 2, namespace="team", submitted_at=1.0),
         job("p2", 2, namespace="other", submitted_at=2.0), job("p3", 2, namespace="team", submitted_at=3.0),
         job("p4", 2, namespace="other", submitted_at=4.0, scheduler_reason="ReqNodeNotAvail"),
         job("p5", 8, submitted_at=5.0), job("p6", 8, submitted_at=6.0)],
        quotas=[{"namespace": "team", "gpu_limit": 5}],
    )
    pending = s.pending_gpu
    assert pending[0].request is pending[1].request is pending[2].request  # one Request: the shared path runs
    got = diagnose_all(s)
    alone = [diagnose_all(s, [w.id])[0] for w in pending]
    assert got == alone
    assert [d.workload_id for d in got] == ["p1", "p2", "p3", "p4", "p5", "p6"]
    assert got[0].codes != got[1].codes and got[1].codes != got[3].codes  # quota; the scheduler's reason
