"""`controller --engine sim` never starts a job where the one fit says it does not fit (issue #29).

The simulated engine's scheduler used to count whole GPUs only: a job that asked for an A100 started on an H100
node, and shares, CPU and memory were ignored. Over random clusters (GPU models, shares, CPU, memory, pins from
the controller's moves), every start is replayed through the capacity model on the state it was made from:
the node must be eligible for the request (`fragmentation.eligible_mask`) and the shape must fit there
(`Capacity.fits_on`), start after start.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpudefrag.control.controller import Controller
from gpudefrag.control.executor import Executor, ExecutorConfig
from gpudefrag.control.journal import Journal
from gpudefrag.core.capacity import Capacity, Shape
from gpudefrag.core.fragmentation import eligible_mask
from gpudefrag.core.model import MILLI, ClusterState, Node, Request, Workload, WorkloadState
from gpudefrag.engines.base import JobPhase
from gpudefrag.engines.sim import SimEngine
from gpudefrag.policy import parse_policy

MODELS = ["A100", "H100"]


@st.composite
def clusters(draw: st.DrawFn) -> ClusterState:
    nodes = [Node(f"n{i}", draw(st.integers(0, 8)), gpu_model=draw(st.sampled_from([*MODELS, None])),
                  cpu_milli=draw(st.sampled_from([0, 4000, 16000])), memory_mib=draw(st.sampled_from([0, 8192, 65536])))
             for i in range(draw(st.integers(1, 4)))]
    jobs = []
    for k in range(draw(st.integers(1, 10))):
        sharing = draw(st.booleans())
        req = Request(1 if sharing else draw(st.integers(0, 8)),
                      gpu_milli=draw(st.integers(100, 900)) if sharing else MILLI,
                      cpu_milli=draw(st.sampled_from([0, 1000, 6000])),
                      memory_mib=draw(st.sampled_from([0, 4096, 16384])),
                      gpu_models=tuple(draw(st.lists(st.sampled_from(MODELS), max_size=1))))
        jobs.append(Workload(f"j{k}", req, state=WorkloadState.PENDING, submitted_at=float(k)))
    return ClusterState.build(nodes, jobs, now=100.0)


@st.composite
def fragmented(draw: st.DrawFn) -> ClusterState:
    """A random cluster after its jobs started, with some of them gone (holes) and a large job waiting."""
    sim = SimEngine(draw(clusters()))
    sim.advance(1.0)
    s = sim.observe()
    running = [w for w in s.workloads if w.is_running]
    keep = [w for w in running if draw(st.booleans())]
    big = Workload("big", Request(draw(st.integers(2, 8)), cpu_milli=draw(st.sampled_from([0, 2000])),
                                  gpu_models=tuple(draw(st.lists(st.sampled_from(MODELS), max_size=1)))),
                   state=WorkloadState.PENDING, submitted_at=50.0)
    return s.with_workloads([*keep, big])


def check_starts(sim: SimEngine, before: int) -> int:
    """Replay the starts made since `before` on the state they were made from; return how many there were."""
    new = sim.starts[before:]
    if not new:
        return 0
    now = sim.observe()
    ids = {s.workload_id for s in new}
    prior = now.with_workloads([w for w in now.workloads if w.id not in ids or not w.is_running])
    cap = Capacity.of_state(prior)
    for s in new:
        w = sim.jobs[s.workload_id].workload
        i = prior.node_index[s.node]
        shape = Shape.of(w.request)
        assert eligible_mask(prior, w.request)[i], f"{w.id} ({w.request.label()}) started on ineligible {s.node}"
        assert cap.fits_on(i, shape), f"{w.id} ({w.request.label()}) started on {s.node}, where it does not fit"
        cap.take(i, sim.jobs[s.workload_id].gpus, shape)  # raises when the GPUs it was given are not free
    return len(new)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.lists(st.integers(0, 9), max_size=4))
def test_the_sim_engine_starts_only_what_fits(state: ClusterState, requeues: list[int]) -> None:
    sim = SimEngine(state, requeue_delay_s=1.0)
    started = 0
    for step in range(6):
        before = len(sim.starts)
        sim.advance(1.0)
        started += check_starts(sim, before)
        if step < len(requeues):  # churn: a running job is requeued (held, then released) and starts again
            j = sim.jobs.get(f"j{requeues[step]}")
            if j is not None and j.phase is JobPhase.RUNNING:
                sim.requeue_hold(j.workload.id)
                sim.release(j.workload.id)
    event(f"jobs started: {min(started, 5)}{'+' if started >= 5 else ''}")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(fragmented())
def test_under_the_controller_every_start_fits(tmp_path: Path, state: ClusterState) -> None:
    """The controller's moves (checkpoint, requeue, pin, restore) start jobs through the same scheduler."""
    sim = SimEngine(state, requeue_delay_s=1.0)
    pol = parse_policy({"trigger": {"pending": {"longer_than_s": 1}}, "budgets": {"max_concurrent": 4}})
    journal = Journal(tmp_path / f"j{id(state)}.db", clock=lambda: sim.now)
    ex = Executor(sim, sim, journal, ExecutorConfig.from_policy(pol), clock=lambda: sim.now)
    c = Controller(sim, pol, ex, clock=lambda: sim.now)
    moved = False
    for _ in range(12):
        before = len(sim.starts)
        c.cycle()
        sim.advance(1.0)
        check_starts(sim, before)
        moved = moved or bool(journal.all())
    event("the controller moved jobs" if moved else "no move")


def test_a_job_that_asks_for_an_a100_waits_beside_a_free_h100() -> None:
    """The reported case: the whole-GPU count alone would start it on the H100 node."""
    state = ClusterState.build([Node("h", 8, gpu_model="H100"), Node("a", 8, gpu_model="A100", cpu_milli=4000)],
                               [Workload("j", Request(4, gpu_models=("A100",), cpu_milli=8000),
                                         state=WorkloadState.PENDING)], now=1.0)
    sim = SimEngine(state)
    sim.advance(1.0)
    assert sim.jobs["j"].phase is JobPhase.PENDING  # the A100 node lacks the CPU, the H100 node is the wrong model
    state = state.with_workloads([Workload("j", Request(4, gpu_models=("A100",), cpu_milli=2000),
                                           state=WorkloadState.PENDING)])
    sim = SimEngine(state)
    sim.advance(1.0)
    assert sim.jobs["j"].phase is JobPhase.RUNNING and sim.jobs["j"].nodes == ("a",)
