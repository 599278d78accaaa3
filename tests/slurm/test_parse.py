"""Parsing Slurm's output without a cluster: both JSON dialects (22.05 captured from the lab, 24.11 written
in data_parser v0.0.41's shape for the same cluster), host lists, GPU index lists, `scontrol -o` records, and
the mapping of pending reasons onto diagnosis causes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpudefrag.core.diagnose import CauseCode
from gpudefrag.core.model import ClusterState
from gpudefrag.engines.base import JobPhase
from gpudefrag.engines.slurm.hostlist import expand, expand_indices
from gpudefrag.engines.slurm.parse import (
    job_info_from_scontrol,
    kernel_release,
    node_kernels,
    parse_gres_gpus,
    parse_jobs,
    parse_nodes,
    parse_scontrol_record,
    slurm_version,
)
from gpudefrag.engines.slurm.reasons import ReasonClass, classify, map_reason, waits_for_resources

DATA = Path(__file__).parent / "data"


def load(kind: str, version: str) -> dict:  # type: ignore[type-arg]
    return json.loads((DATA / f"{kind}-{version}.json").read_text())


@pytest.mark.parametrize("version", ["22.05", "24.11"])
def test_both_dialects_give_the_same_cluster(version: str) -> None:
    nodes = parse_nodes(load("sinfo", version))
    wls, infos = parse_jobs(load("squeue", version), nodes)
    state = ClusterState.build(nodes, wls)
    assert slurm_version(load("squeue", version)).startswith(version)
    assert [n.name for n in nodes] == ["node1", "node2", "node3", "node4"]
    assert all(n.gpu_count == 8 and n.schedulable and n.partitions == ("gpu",) for n in nodes)
    assert nodes[0].cpu_milli == 64_000
    assert [w.id for w in state.running] == ["2", "3", "4"]  # job 1 completed: dropped
    a = state.workload("2")
    assert a.placements[0].node == "node1" and a.placements[0].gpus == (0, 1, 2)
    assert a.labels == {"slurm.comment": "hello"} and a.name == "a" and a.request.partition == "gpu"
    assert state.free_gpus_on("node1") == [3, 4, 5, 6, 7] and state.free_gpus_on("node2") == []
    held = state.workload("5")
    assert not held.is_running and held.request.gpus_per_node == 2 and held.scheduler_reason == "JobHeldUser"
    by_id = {i.job_id: i for i in infos}
    assert by_id["1"].phase is JobPhase.ENDED and by_id["5"].phase is JobPhase.HELD
    assert by_id["2"].phase is JobPhase.RUNNING and by_id["2"].required_nodes == ("node1",)


def test_dialects_agree_field_by_field() -> None:
    old = parse_jobs(load("squeue", "22.05"), parse_nodes(load("sinfo", "22.05")))[0]
    new = parse_jobs(load("squeue", "24.11"), parse_nodes(load("sinfo", "24.11")))[0]
    assert old == new


def test_gres_strings() -> None:
    assert parse_gres_gpus("gpu:8") == (8, None, None)
    assert parse_gres_gpus("gpu:a100:4(S:0-1)") == (4, "a100", None)
    assert parse_gres_gpus("gpu:3(IDX:0-2)") == (3, None, [0, 1, 2])
    assert parse_gres_gpus("tmpsize:7T,gpu:l40s:2(IDX:0,5)") == (2, "l40s", [0, 5])
    assert parse_gres_gpus("") == (0, None, None)


def test_hostlists() -> None:
    assert expand("node[1-3,7]") == ["node1", "node2", "node3", "node7"]
    assert expand("gpu[01-03],cpu5") == ["gpu01", "gpu02", "gpu03", "cpu5"]
    assert expand("") == [] and expand("(null)") == []
    assert expand_indices("0-2,5") == [0, 1, 2, 5]


@given(st.lists(st.integers(0, 999), min_size=1, max_size=30, unique=True))
def test_hostlist_roundtrip(nums: list[int]) -> None:
    spec = "n[" + ",".join(str(n) for n in nums) + "]"
    assert expand(spec) == [f"n{n}" for n in nums]


def test_scontrol_record() -> None:
    line = ("JobId=6 JobName=job.sh UserId=root(0) Priority=0 JobState=PENDING Reason=job_requeued_in_held_state "
            "Restarts=1 ReqNodeList=node[2-3] ExcNodeList=(null) NodeList=(null) AllocNode:Sid=localhost:3247 "
            "Comment=hello world TresPerNode=gres:gpu:3")
    rec = parse_scontrol_record(line)
    assert rec["AllocNode:Sid"] == "localhost:3247" and rec["Comment"] == "hello world"
    info = job_info_from_scontrol(rec)
    assert info.phase is JobPhase.HELD and info.restarts == 1 and info.required_nodes == ("node2", "node3")
    assert info.excluded_nodes == () and info.nodes == ()
    running = job_info_from_scontrol(parse_scontrol_record(
        "JobId=7 Priority=42 JobState=RUNNING Reason=None Restarts=0 NodeList=node4 ReqNodeList=(null)"))
    assert running.phase is JobPhase.RUNNING and running.nodes == ("node4",)


@pytest.mark.parametrize(("reason", "cls", "cause"), [
    ("Resources", ReasonClass.CAPACITY, None),
    ("Priority", ReasonClass.CAPACITY, None),
    ("JobHeldUser", ReasonClass.INELIGIBLE, None),
    ("Dependency", ReasonClass.INELIGIBLE, None),
    ("BeginTime", ReasonClass.INELIGIBLE, None),
    ("ReqNodeNotAvail, UnavailableNodes:node4", ReasonClass.ORDINARY, CauseCode.NODES_UNSCHEDULABLE),
    ("PartitionNodeLimit", ReasonClass.ORDINARY, CauseCode.REQUEST_TOO_LARGE),
    ("QOSMaxGRESPerUser", ReasonClass.ORDINARY, CauseCode.QUOTA_EXCEEDED),
    ("AssocGrpGRES", ReasonClass.ORDINARY, CauseCode.QUOTA_EXCEEDED),
    ("PowerUp", ReasonClass.ORDINARY, CauseCode.AUTOSCALER_AT_MAX),
])
def test_pending_reasons_map_onto_causes(reason: str, cls: ReasonClass, cause: CauseCode | None) -> None:
    assert classify(reason) == (cls, cause)
    assert map_reason(reason) == cause
    assert waits_for_resources(reason) == (cls is ReasonClass.CAPACITY)


def test_v41_typed_multi_node_job() -> None:
    """A 2-node job with typed GPUs, as 24.11 prints it (numbers wrapped, states as lists, `gres/` prefix)."""
    def num(n: int) -> dict:  # type: ignore[type-arg]
        return {"set": True, "infinite": False, "number": n}

    nodes = parse_nodes({"sinfo": [
        {"nodes": {"nodes": [f"gpu-00{i}"]}, "node": {"state": ["MIXED"]}, "gres": {"total": "gpu:a100:4(S:0)"},
         "cpus": {"total": 32}, "partition": {"name": p}} for i in (5, 6) for p in ("gpu", "long")]})
    assert [(n.name, n.gpu_count, n.gpu_model, n.partitions) for n in nodes] == [
        ("gpu-005", 4, "a100", ("gpu", "long")), ("gpu-006", 4, "a100", ("gpu", "long"))]
    job = {"job_id": 42, "job_state": ["RUNNING"], "nodes": "gpu-[005-006]", "node_count": num(2),
           "tres_per_node": "gres/gpu:a100:2", "gres_detail": ["gpu:a100:2(IDX:0-1)", "gpu:a100:2(IDX:2-3)"],
           "cpus": num(16), "priority": num(7), "partition": "gpu", "state_reason": "None",
           "comment": {"job": "team=cv", "administrator": None, "system": None}}
    (w,), (info,) = parse_jobs({"jobs": [job]}, nodes)
    assert w.request.gpus_per_node == 2 and w.request.node_count == 2 and w.request.gpu_models == ("a100",)
    assert [(p.node, p.gpus) for p in w.placements] == [("gpu-005", (0, 1)), ("gpu-006", (2, 3))]
    assert w.priority == 7 and w.labels["team"] == "cv" and w.is_multi_node
    assert info.phase is JobPhase.RUNNING and info.nodes == ("gpu-005", "gpu-006")
    ClusterState.build(nodes, [w])


def _compress(ids: list[int]) -> str:
    return ",".join(str(i) for i in ids)


def _detail(j: dict) -> list[str]:  # type: ignore[type-arg]
    return [] if j["pending"] or not j["gpus"] else [f"gpu:{j['gpus']}(IDX:{_compress(j['idx'])})"]


@st.composite
def slurm_clusters(draw):  # type: ignore[no-untyped-def]
    """A random cluster and its jobs, with the facts both JSON dialects must carry."""
    n = draw(st.integers(1, 5))
    gpus = draw(st.sampled_from([2, 4, 8]))
    free = {f"n{i}": list(range(gpus)) for i in range(1, n + 1)}
    jobs = []
    for k in range(draw(st.integers(0, 8))):
        node = draw(st.sampled_from(sorted(free)))
        want = draw(st.integers(0, gpus))
        if want > len(free[node]) or draw(st.booleans()):
            jobs.append({"id": 100 + k, "pending": True, "gpus": max(want, 1), "reason": draw(
                st.sampled_from(["Resources", "Priority", "JobHeldUser", "Dependency"]))})
            continue
        idx = sorted(draw(st.permutations(free[node]))[:want])
        free[node] = [g for g in free[node] if g not in idx]
        jobs.append({"id": 100 + k, "pending": False, "gpus": want, "node": node, "idx": idx,
                     "name": draw(st.text("abc-", min_size=1, max_size=6))})
    return n, gpus, jobs


def _v38(n: int, gpus: int, jobs: list[dict]) -> tuple[dict, dict]:  # type: ignore[type-arg]
    si = {"nodes": [{"name": f"n{i}", "gres": f"gpu:{gpus}", "cpus": 64, "state": "mixed", "state_flags": [],
                     "partitions": ["gpu"], "active_features": ""} for i in range(1, n + 1)]}
    sq = {"jobs": [{"job_id": j["id"], "job_state": "PENDING" if j["pending"] else "RUNNING",
                    "state_reason": j.get("reason", "None"), "priority": 0 if j.get("reason") == "JobHeldUser" else 5,
                    "nodes": "" if j["pending"] else j["node"], "node_count": 1, "cpus": 1, "partition": "gpu",
                    "tres_per_node": f"gres:gpu:{j['gpus']}" if j["gpus"] else "",
                    "gres_detail": _detail(j),
                    "name": j.get("name", "p"), "comment": "", "account": "", "user_name": "u", "restart_cnt": 0,
                    "submit_time": 1, "start_time": 2} for j in jobs]}
    return si, sq


def _v41(n: int, gpus: int, jobs: list[dict]) -> tuple[dict, dict]:  # type: ignore[type-arg]
    def num(v: int) -> dict:  # type: ignore[type-arg]
        return {"set": True, "infinite": False, "number": v}

    si = {"sinfo": [{"nodes": {"nodes": [f"n{i}"]}, "node": {"state": ["MIXED"]}, "gres": {"total": f"gpu:{gpus}"},
                     "cpus": {"total": 64}, "partition": {"name": "gpu"}} for i in range(1, n + 1)]}
    sq = {"jobs": [{"job_id": j["id"], "job_state": ["PENDING" if j["pending"] else "RUNNING"],
                    "state_reason": j.get("reason", "None"), "hold": j.get("reason") == "JobHeldUser",
                    "priority": num(0 if j.get("reason") == "JobHeldUser" else 5),
                    "nodes": "" if j["pending"] else j["node"], "node_count": num(1), "cpus": num(1),
                    "partition": "gpu", "tres_per_node": f"gres/gpu:{j['gpus']}" if j["gpus"] else "",
                    "gres_detail": _detail(j),
                    "name": j.get("name", "p"), "comment": {"job": ""}, "account": "", "user_name": "u",
                    "restart_cnt": 0, "submit_time": num(1), "start_time": num(2)} for j in jobs]}
    return si, sq


@given(slurm_clusters())
def test_any_cluster_reads_the_same_in_both_dialects(c) -> None:  # type: ignore[no-untyped-def]
    n, gpus, jobs = c
    states = []
    for render in (_v38, _v41):
        si, sq = render(n, gpus, jobs)
        nodes = parse_nodes(si)
        wls, infos = parse_jobs(sq, nodes)
        states.append(ClusterState.build(nodes, wls))  # validated: no GPU handed out twice
        assert {i.job_id for i in infos} == {str(j["id"]) for j in jobs}
    a, b = states
    assert a.nodes == b.nodes and a.workloads == b.workloads
    for j in jobs:
        w = a.workload(str(j["id"]))
        assert w.is_running == (not j["pending"])
        if not j["pending"]:
            assert w.placements[0].node == j["node"] and list(w.placements[0].gpus) == j["idx"]
        else:
            assert w.request.gpus_per_node == j["gpus"]


def test_kernel_from_the_nodes_os() -> None:
    """The kernel release the compatibility rule checks: 22.05's `sinfo --json` carries each node's OS; 24.x's
    leaves it out, so the engine reads it from `scontrol show nodes --json` (same node shape)."""
    assert {n.kernel for n in parse_nodes(load("sinfo", "22.05"))} == {"6.18.44-fc-v1045"}
    assert {n.kernel for n in parse_nodes(load("sinfo", "24.11"))} == {None}
    assert kernel_release("Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1") == "6.1.0-18-amd64"
    assert kernel_release("") is None and kernel_release("Linux") is None and kernel_release("FreeBSD 14") is None
    doc = {"nodes": [{"name": "node1", "operating_system": "Linux 6.12.9-amd64 #1 SMP"}, {"name": "node2"}]}
    assert node_kernels(doc) == {"node1": "6.12.9-amd64"}
