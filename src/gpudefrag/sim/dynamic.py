"""The dynamic simulation: jobs arrive, queue, run and leave; a defrag controller may move or evict them.

Event-driven. The queue is FIFO with greedy backfill: whenever GPUs free up, every queued job that fits now
starts, in submission order (a blocked head does not stop smaller jobs behind it — which is exactly how large
jobs starve on a fragmented cluster). Placement uses a policy from `gpudefrag.core.placement`.

The defrag controller runs the product's policy shape: trigger = the head-of-queue job has been pending longer
than `trigger_s`; filter = jobs with at most `movable_max_gpus` GPUs may be touched; action =
- `migrate`: the product's one decision decides, as for every other door: the simulated cluster and its
  running jobs become a `ClusterState` (`Cluster.to_state`; each job with its checkpoint size from
  sim/costs.py), the head job a pending workload, the filter `PlanOptions.movable`, and
  `gpudefrag.core.decision.decide` diagnoses and plans. Only when it chooses `move` with a feasible plan are
  exactly the plan's moves applied to the arrays (each moved job stops for the move's downtime as the plan
  prices it, added to its end and counted as GPU-seconds spent moving) and the head job started where the plan
  lands it; when it chooses evict, drain, wait or nothing, nothing happens that round. The decision is asked
  again once a job starts, ends or moves, or else after `check_every_s` (the prices change with time only);
- `evict`: stop the victims (no application checkpoint: they restart from zero) and put them back in the queue;
  their elapsed GPU-seconds are counted as work lost. This action is not a plan of moves, so it stays on the
  array-level `sim/defrag.py: ArrayDefragmenter` (the descheduler/KAI way: victims chosen without checking
  that they fit elsewhere);
- `deschedule`: the FGD authors' eviction descheduler (`sim/deschedule.py`, fragOnePod): at most one pass per
  `trigger_s` while the head waits, and never two within `deschedule_min_interval_s` (60 s) whatever the
  trigger, each evicting up to ⌈ratio × pods running⌉; an evicted pod restarts (no
  application checkpoint: its elapsed GPU-seconds are work lost) where the policy re-places it, or re-enters the
  queue when nothing fits.

With a product policy (`DynamicConfig.product`, e.g. a policy file) the migrate action takes its trigger, filter,
move budget and heartbeat checkpoints from it, through `policy.options` as every other door does.

The pooled bound runs the same jobs on one imaginary node holding every GPU: no fragmentation is possible, so
its queueing delays are what the workload itself forces.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..core.cost import CostModel
from ..core.decision import MOVE, Decision, decide
from ..core.fragmentation import WorkloadMix
from ..core.model import MILLI, ClusterState, Placement, WorkloadState, workload_row
from ..core.model import Workload as PlannedWorkload
from ..core.placement import Choice, Cluster, Pod, get_policy
from ..core.planner import PlanOptions
from ..policy.models import Budgets, Filter, PendingTrigger, Policy
from ..policy.options import PlanInputs, plan_options
from .costs import as_workload, checkpoint_bytes, record_move, request_of
from .defrag import ArrayDefragmenter
from .replay import MoveStats, Placed
from .synthetic import Job, Workload, synthetic_cluster

ARRIVE, END, CHECK = 0, 1, 2


# the product's default pending trigger: every replay arm acts when the default policy would, unless told otherwise
DEFAULT_TRIGGER_S = PendingTrigger().longer_than_s


@dataclass(frozen=True)
class DynamicConfig:
    policy: str = "fgd"
    defrag: str = "none"  # "none" | "migrate" | "evict"
    pooled: bool = False
    trigger_s: float = DEFAULT_TRIGGER_S
    check_every_s: float = 60.0
    max_moves: int = 8
    movable_max_gpus: int = 4
    seed: int = 0
    label: str = ""
    product: Policy | None = None  # migrate: the product's policy (trigger, filter, budget, heartbeat)
    deschedule_ratio: float = 0.05  # deschedule: a pass evicts at most this ratio of the running pods
    # deschedule: at least this long between two passes, whatever the trigger (at trigger 0 the arm made a pass
    # at every event: 16 CPU-minutes for one seed of a trace list); the passes are max(trigger_s, this) apart
    deschedule_min_interval_s: float = 60.0

    @property
    def trigger(self) -> float:
        """Seconds the head job waits before the controller acts: the product policy's pending trigger when
        there is one (migrate), else `trigger_s`."""
        if self.product is not None and self.defrag == "migrate" and self.product.trigger.pending is not None:
            return self.product.trigger.pending.longer_than_s
        return self.trigger_s

    def name(self) -> str:
        if self.label:
            return self.label
        if self.pooled:
            return "pooled"
        return self.policy + ("" if self.defrag == "none" else f"+{self.defrag}")


@dataclass
class DynamicResult:
    label: str
    size_class: list[str]
    gpu_equiv: np.ndarray
    submit: np.ndarray
    start: np.ndarray  # last start
    end: np.ndarray
    waited: np.ndarray  # total seconds queued (re-queues after eviction included)
    times: np.ndarray
    util: np.ndarray  # allocated GPU share / capacity
    stranded: np.ndarray  # wholly free GPUs while the head of the queue cannot start
    moves: int = 0
    evictions: int = 0
    move_gpu_s: float = 0.0
    moved_bytes: float = 0.0
    lost_gpu_s: float = 0.0
    work_gpu_s: float = 0.0  # GPU-seconds of useful work in the workload
    move_log: list[tuple[float, str, str, str, tuple[int, ...]]] = field(default_factory=list)
    """migrate: every move made, in order: (time, workload id `pod-N`, source node, target node, target GPUs)."""
    decisions: int = 0  # migrate: how many times the one decision was asked; deschedule: its passes
    first_start: np.ndarray = field(default_factory=lambda: np.zeros(0))  # NaN: never started
    end_time: float = 0.0  # when the simulation stopped

    def delays(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        classes = np.array(self.size_class)
        for c in sorted(set(self.size_class), key=_class_order):
            w = self.waited[classes == c]
            w = w[np.isfinite(w)]
            out[c] = {"jobs": float(len(w)), "mean_s": float(w.mean()) if len(w) else float("nan"),
                      "p95_s": float(np.percentile(w, 95)) if len(w) else float("nan")}
        return out

    @property
    def moved_share(self) -> float:
        """GPU-seconds spent moving (migrate) or lost (evict), as a share of the workload's GPU-seconds."""
        return (self.move_gpu_s + self.lost_gpu_s) / self.work_gpu_s if self.work_gpu_s else 0.0

    def mean_util(self, until: float | None = None) -> float:
        """Time-weighted mean utilisation, up to `until` (default: the last submission, so the final drain
        of the queue does not dilute it)."""
        until = float(self.submit.max()) if until is None and len(self.submit) else until
        if len(self.times) < 2:
            return float(self.util.mean()) if len(self.util) else 0.0
        t = np.minimum(self.times, until) if until is not None else self.times
        dt = np.diff(t)
        return float((self.util[:-1] * dt).sum() / dt.sum()) if dt.sum() > 0 else float(self.util.mean())


def _class_order(c: str) -> tuple[int, str]:
    return (0, c) if c == "share" else (int(c.split("-")[0]), c)


@dataclass
class _Run:
    job: Job
    remaining: float
    queued_at: float
    pid: int = -1
    started: float = 0.0
    end: float = 0.0
    version: int = 0
    waited: float = 0.0
    first_start: float = float("nan")
    done: bool = False


@dataclass
class _Sim:
    cfg: DynamicConfig
    wl: Workload
    cl: Cluster
    rng: np.random.Generator
    cost: CostModel = field(default_factory=CostModel)
    now: float = 0.0
    heap: list[tuple[float, int, int, int]] = field(default_factory=list)
    seq: int = 0
    queue: list[int] = field(default_factory=list)
    runs: dict[int, _Run] = field(default_factory=dict)
    by_pid: dict[int, int] = field(default_factory=dict)
    started: dict[int, float] = field(default_factory=dict)  # pid -> when it started (the decision's input)
    times: list[float] = field(default_factory=list)
    util: list[float] = field(default_factory=list)
    stranded: list[float] = field(default_factory=list)
    stats: MoveStats = field(default_factory=MoveStats)
    move_gpu_s: float = 0.0
    lost_gpu_s: float = 0.0
    move_log: list[tuple[float, str, str, str, tuple[int, ...]]] = field(default_factory=list)
    version: int = 0  # bumped whenever a job starts, ends or moves: the decision's input changed
    freed: int = 0  # bumped whenever room is given back (a job ends, moves or is evicted); a start takes room only

    def push(self, t: float, kind: int, arg: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, arg))


def simulate(wl: Workload, cfg: DynamicConfig, cluster: Cluster | None = None,
             mix: WorkloadMix | None = None) -> DynamicResult:
    """Run the workload on the synthetic cluster of its spec, or on (a copy of) `cluster` (e.g. a snapshot's, or
    a trace's nodes); the pooled bound puts all of that cluster's GPUs, CPU and memory on one node (one per GPU
    model when pods name models: `pooled_cluster`). `mix`: the FGD target workload (default: the synthetic
    spec's)."""
    if cluster is None:
        cl = synthetic_cluster(wl.spec, pooled=cfg.pooled)
    elif cfg.pooled:
        named = any(j.pod.gpu_models for j in wl.jobs)
        cl = pooled_cluster(cluster, mix or synthetic_cluster(wl.spec).mix, by_model=named)
    else:
        cl = cluster.copy()
        cl.mix = mix or synthetic_cluster(wl.spec).mix
    cl.rank = np.random.default_rng(cfg.seed + 7).permutation(cl.n)
    sim = _Sim(cfg, wl, cl, np.random.default_rng(cfg.seed))
    # The cluster with none of the workload's jobs on it (a snapshot's background stays): a pod that fits no node
    # of it never starts here, whatever runs or moves (the diagnosis's request-too-large). It never joins the
    # queue: it would sit at its head forever, and every arm that acts for the head pod (moves, evictions, the
    # descheduler's passes) would act for it at every check, for the whole replay, and for no other pod.
    empty = cl.copy()
    could_start: dict[Pod, bool] = {}

    def ever_fits(pod: Pod) -> bool:
        got = could_start.get(pod)
        if got is None:
            got = could_start[pod] = bool(empty.fits(pod).any())
        return got
    policy = get_policy("bestfit" if cfg.pooled else cfg.policy)
    placed = Placed.for_cluster(cl)
    defrag = None
    decider = None
    desched = None
    if cfg.defrag == "deschedule" and not cfg.pooled:
        from .deschedule import Descheduler

        desched = Descheduler(ratio=cfg.deschedule_ratio, cost_model=sim.cost)
    elif cfg.defrag == "evict" and not cfg.pooled:
        defrag = ArrayDefragmenter(action=cfg.defrag, max_moves=cfg.max_moves, budget=1e12,
                                   movable=lambda p: p.num_gpu <= cfg.movable_max_gpus,
                                   cost_model=sim.cost, requeue_evicted=True)
    elif cfg.defrag == "migrate" and not cfg.pooled:
        heartbeat = cfg.product.action.heartbeat if cfg.product is not None else None
        budgets = (cfg.product or Policy()).budgets
        decider = Decider(cl, placed, migrate_options(cfg, sim.cost), cfg.check_every_s,
                          heartbeat.every_s if heartbeat is not None else None,
                          plan_anyway=cfg.product is not None and cfg.product.trigger.plan_anyway,
                          budgets=budgets)
    elif cfg.defrag not in ("none", "evict", "migrate", "deschedule"):
        raise ValueError(f"unknown defrag action {cfg.defrag!r} (none | migrate | evict | deschedule)")
    for j in wl.jobs:
        sim.push(j.submit, ARRIVE, j.id)
        sim.runs[j.id] = _Run(j, j.duration, j.submit)
    if defrag is not None or decider is not None or desched is not None:
        sim.push(cfg.check_every_s, CHECK, 0)
    last_pass = [-np.inf]

    def start(jid: int, choice: Choice, placed_already: bool) -> None:
        r = sim.runs[jid]
        if not placed_already:
            cl.place(r.job.pod, choice)
        r.pid = placed.add(r.job.pod, choice)
        sim.by_pid[r.pid] = jid
        sim.started[r.pid] = sim.now
        r.waited += sim.now - r.queued_at
        if np.isnan(r.first_start):
            r.first_start = sim.now
        r.started = sim.now
        r.end = sim.now + r.remaining
        r.version += 1
        sim.version += 1
        sim.push(r.end, END, jid * 1024 + (r.version % 1024))

    def schedule() -> None:
        failed: set[Pod] = set()
        kept: list[int] = []
        for jid in sim.queue:
            pod = sim.runs[jid].job.pod
            if pod in failed:
                kept.append(jid)
                continue
            ch = policy.choose(cl, pod, sim.rng)
            if ch is None:
                failed.add(pod)
                kept.append(jid)
            else:
                start(jid, ch, False)
                failed.clear()
        sim.queue = kept

    def delay(pid: int, down: float, lost: float = 0.0) -> None:
        """A moved job stops for its move's downtime (and redoes the work since the checkpoint it was restored
        from, when that was not a fresh one): its end moves later by as much."""
        v = sim.runs[sim.by_pid[pid]]
        sim.move_gpu_s += down * v.job.gpu_equiv
        sim.lost_gpu_s += lost * v.job.gpu_equiv
        v.end += down + lost
        v.version += 1
        sim.push(v.end, END, sim.by_pid[pid] * 1024 + (v.version % 1024))

    def try_migrate() -> None:
        """The policy's pending trigger as the controller runs it (`policy.triggers.pending_fragmented`): the
        queued jobs past the trigger, oldest first, each shape asked the decision until `max_plans_per_cycle`
        plans are applied or `tries_per_cycle` distinct shapes were asked — a job no plan can help does not keep
        the ones behind it waiting — and `jobs_per_cycle` jobs looked at in all. Jobs of one shape get one answer
        (the same state, the same decision): only the first of each is asked, the others ride along, as the
        controller's trigger counts distinct requests. A shape counts as a try whether the decision is asked or
        the Decider knows its answer already (`wants`: the controller, with no such memo, would ask it again and
        spend the try), and an ordinary cause's answer counts too: counting only those that reached the planner
        let one decision point ask every queued pod that an ordinary cause holds (a gpuspec25 replay at trigger
        0 went from minutes to over half an hour)."""
        assert decider is not None
        asked: set[Pod] = set()
        tries = plans = looked = 0
        queued = set(sim.queue)  # remade after a plan: `schedule` may start queued jobs
        for jid in list(sim.queue):
            if tries >= decider.max_tries or plans >= decider.max_plans or looked >= decider.max_jobs:
                return
            head = sim.runs[jid]
            if sim.now - head.queued_at < cfg.trigger:
                return  # the queue is in arrival order: no job behind this one has waited longer
            if jid not in queued:
                continue
            looked += 1
            if head.job.pod in asked:
                continue
            asked.add(head.job.pod)
            tries += 1
            if not decider.wants(jid, head.job.pod, sim.now, sim.version, sim.freed):
                continue
            choice = decider.rescue(jid, head.job.pod, head.queued_at, sim.started, sim.now, sim.version,
                                    sim.freed)
            if choice is None:
                continue
            plans += 1
            sim.freed += 1
            sim.queue.remove(jid)
            for pid, was, new, down, lost in decider.last_moved:
                sim.stats.moves += 1
                record_move(sim.stats, placed.pods[pid][0], cl, was, new, sim.cost)
                sim.move_log.append((sim.now, f"pod-{pid}", cl.names[was.node], cl.names[new.node], new.gpus))
                delay(pid, down, lost)
            sim.version += 1
            start(jid, choice, True)
            schedule()
            asked.clear()  # the cluster changed: a shape's answer may differ now
            queued = set(sim.queue)

    def evicted(pid: int) -> _Run:
        """A pod evicted without an application checkpoint: its elapsed work is lost, it starts over."""
        vid = sim.by_pid.pop(pid)
        sim.started.pop(pid)
        v = sim.runs[vid]
        sim.lost_gpu_s += (sim.now - v.started) * v.job.gpu_equiv
        v.remaining = v.job.duration  # no application checkpoint: restart from zero
        v.version += 1  # its END event is now stale
        v.queued_at = sim.now
        return v

    def try_deschedule() -> None:
        """One pass of the authors' descheduler; the victims restart where the policy re-placed them, or wait."""
        assert desched is not None
        if sim.now - last_pass[0] < max(cfg.trigger_s, cfg.deschedule_min_interval_s):
            return
        last_pass[0] = sim.now
        before = dict(placed.pods)
        desched.budget = None  # each pass: up to ratio × the pods running now
        counted = dataclasses.replace(sim.stats)
        desched.deschedule(cl, placed, policy, sim.rng, sim.stats)
        sim.stats = counted  # its re-placements are restarts, not moves: counted here as evictions
        for pid, (_p, was) in before.items():
            now_at = placed.pods.get(pid)
            if now_at is not None and now_at[1] == was:
                continue
            sim.stats.evictions += 1
            v = evicted(pid)
            if now_at is None:
                sim.queue.append(v.job.id)
            else:  # re-placed at once: it starts over there
                placed.drop(pid)
                start(v.job.id, now_at[1], True)
        sim.version += 1
        sim.freed += 1
        schedule()

    def try_defrag() -> None:
        if (defrag is None and decider is None and desched is None) or not sim.queue:
            return
        head = sim.runs[sim.queue[0]]
        if sim.now - head.queued_at < cfg.trigger:
            return
        if decider is not None:
            try_migrate()
            return
        if desched is not None:
            try_deschedule()
            return
        assert defrag is not None
        choice = defrag.rescue(cl, head.job.pod, placed, policy, sim.rng, sim.stats)
        if choice is None:
            return
        jid = sim.queue.pop(0)
        sim.freed += 1
        for pid in defrag.last_evicted:
            sim.queue.append(evicted(pid).job.id)
        start(jid, choice, True)
        schedule()

    def sample() -> None:
        cap = cl.capacity_milli
        sim.times.append(sim.now)
        sim.util.append(cl.allocated_milli / cap)
        s = 0.0
        if sim.queue:
            head = sim.runs[sim.queue[0]].job.pod
            if not cl.fits(head).any():
                s = float((cl.free == MILLI).sum())
        sim.stranded.append(s)

    remaining_jobs = len(wl.jobs)
    arrivals_left = len(wl.jobs)
    while sim.heap and remaining_jobs > 0:
        t, _, kind, arg = heapq.heappop(sim.heap)
        sim.now = t
        if kind == CHECK and arrivals_left == 0 and not placed.pods:
            break  # nothing runs, nothing arrives: the queued jobs can never start (too big for this cluster)
        if kind == ARRIVE:
            arrivals_left -= 1
            if not ever_fits(sim.runs[arg].job.pod):
                remaining_jobs -= 1  # never starts: its wait runs to the end of the replay
                continue
            sim.queue.append(arg)
            ch = policy.choose(cl, sim.runs[arg].job.pod, sim.rng)
            if ch is not None:
                sim.queue.remove(arg)
                start(arg, ch, False)
        elif kind == END:
            jid, ver = divmod(arg, 1024)
            r = sim.runs[jid]
            if r.done or r.version % 1024 != ver or r.pid < 0 or r.pid not in placed.pods:
                continue
            pod, ch = placed.drop(r.pid)
            cl.remove(pod, ch)
            sim.by_pid.pop(r.pid, None)
            sim.started.pop(r.pid, None)
            sim.version += 1
            sim.freed += 1
            r.done = True
            remaining_jobs -= 1
            schedule()
        elif sim.queue or arrivals_left:
            sim.push(sim.now + cfg.check_every_s, CHECK, 0)
        try_defrag()
        sample()

    n = len(wl.jobs)
    res = DynamicResult(
        label=cfg.name(),
        size_class=[sim.runs[i].job.size_class for i in range(n)],
        gpu_equiv=np.array([sim.runs[i].job.gpu_equiv for i in range(n)]),
        submit=np.array([sim.runs[i].job.submit for i in range(n)]),
        start=np.array([sim.runs[i].started for i in range(n)]),
        end=np.array([sim.runs[i].end for i in range(n)]),
        waited=np.array([sim.runs[i].waited if sim.runs[i].done else np.nan for i in range(n)]),
        times=np.array(sim.times), util=np.array(sim.util), stranded=np.array(sim.stranded),
        moves=sim.stats.moves, evictions=sim.stats.evictions, move_gpu_s=sim.move_gpu_s,
        moved_bytes=sim.stats.moved_bytes, lost_gpu_s=sim.lost_gpu_s,
        work_gpu_s=float(sum(j.duration * j.gpu_equiv for j in wl.jobs)),
        move_log=sim.move_log,
        decisions=decider.asked if decider is not None else desched.passes if desched is not None else 0,
        first_start=np.array([sim.runs[i].first_start for i in range(n)]), end_time=sim.now,
    )
    return res


def pooled_cluster(cluster: Cluster, mix: WorkloadMix | None, by_model: bool = False) -> Cluster:
    """The pooled bound's cluster: every GPU, CPU core and byte of memory of `cluster` on one node (memory not
    tracked), the background load kept. `by_model`: one such node per GPU model instead (for pods that name GPU
    models: a pod may use only the GPUs of its models, a rule and not fragmentation, so the bound keeps it and
    pools within each model; one node of no model would start none of them)."""
    groups: dict[str | None, list[int]] = {}
    for i, m in enumerate(cluster.models):
        groups.setdefault(m if by_model else None, []).append(i)
    names = ["pooled" if len(groups) == 1 else f"pooled-{m}" for m in groups]
    counts = [int(cluster.gpu_count[rows].sum()) for rows in groups.values()]
    cpus = [int(np.minimum(cluster.cpu_cap[rows], 10**12).sum()) for rows in groups.values()]
    cl = Cluster.build(names, counts, list(groups), cpus, [0] * len(groups), mix)
    for k, rows in enumerate(groups.values()):
        free = cluster.free[rows]
        cl.free[k, :counts[k]] = np.sort(free[free >= 0])[::-1][:counts[k]]  # the background load stays
    return cl


def migrate_options(cfg: DynamicConfig, cost: CostModel) -> PlanOptions:
    """The migrate action's options, built where every other door builds them (`policy.options`): the product
    policy when the configuration has one, else a policy whose filter admits jobs of at most `movable_max_gpus`
    GPUs; the simulation's cost model, the move budget, and the fast heuristic solver (a decision is asked at
    every check while a job waits)."""
    policy = cfg.product or Policy(name="dynamic-migrate", filter=Filter(max_gpus=cfg.movable_max_gpus))
    return plan_options(PlanInputs(policy, cost), max_moves=cfg.max_moves if cfg.product is None else None,
                        solver="heuristic")


class Decider:
    """The migrate action through `core.decision.decide`: the arrays and their placed jobs as a ClusterState,
    the head job as a pending workload, and, when the decision is a feasible move, exactly its moves applied to
    the arrays with the capacity model's own `place`/`remove` (one statement: all or nothing)."""

    def __init__(self, cl: Cluster, placed: Placed, options: PlanOptions, recheck_s: float = 60.0,
                 heartbeat_s: float | None = None, plan_anyway: bool = False, budgets: Budgets | None = None) -> None:
        self.cl, self.placed, self.options, self.recheck_s = cl, placed, options, recheck_s
        # the policy's budgets, per decision point, read where the controller reads them (the policy's own
        # `Budgets` properties), so that the replay and the controller cannot count a cycle differently
        b = budgets if budgets is not None else Budgets()
        self.max_tries, self.max_plans, self.max_jobs = b.tries_per_cycle, b.max_plans_per_cycle, b.jobs_per_cycle
        self.plan_anyway = plan_anyway  # the policy's trigger.plan_anyway: plan although an ordinary cause blocks
        self.heartbeat_s = heartbeat_s  # the policy's heartbeat checkpoints: every so many seconds of a job's run
        self.node_index = {n: i for i, n in enumerate(cl.names)}
        self.asked = 0
        self.last: Decision | None = None
        self.last_moved: list[tuple[int, Choice, Choice, float, float]] = []  # pid, from, to, downtime, lost (s)
        # per queued job, its last "do nothing": cluster version, room version, when, and whether no plan was
        # feasible (dropped when the job starts through a plan; a job started by the scheduler is not asked again)
        self._seen: dict[int, tuple[int, int | None, float, bool]] = {}
        # per request shape, its last "no feasible plan" (as `_seen`, always True): feasibility is a
        # function of the state and the shape alone (a job's own wait prices a plan, it does not make one), so
        # every queued job of that shape shares the answer until room comes back
        self._no_plan: dict[Pod, tuple[int, int | None, float, bool]] = {}
        # per pod id, what the decision's input holds of each placed job, kept between decisions (the jobs change
        # little from one to the next, so only those `Placed.stamps` says were placed, moved or dropped since,
        # and those whose heartbeat may have passed, are made again): whether it is placed, the stamp seen, its
        # start, when its last heartbeat may change next, its workload, `workload_row`, GPUs (-1 padded) and the
        # filter's verdict on that workload
        self._on = np.zeros(0, dtype=bool)
        self._stamp = np.zeros(0, dtype=np.int64)
        self._t0 = np.zeros(0)
        self._due = np.zeros(0)
        self._ws = np.empty(0, dtype=object)
        self._rows = np.zeros((0, 9), dtype=np.int64)
        self._gpus = np.zeros((0, cl.free.shape[1]), dtype=np.int64)
        self._ok = np.zeros(0, dtype=bool)

    def state(self, jid: int, pod: Pod, queued_at: float, started: Mapping[int, float],
              now: float) -> tuple[ClusterState, PlannedWorkload]:
        """The decision's input: every placed job (`pod-<pid>`, its placement, start and checkpoint size) and
        the head job (`job-<jid>`, pending since `queued_at`). `started`: each placed job's start (a job keeps
        its start while it keeps its id)."""
        placed = self.placed
        n = placed.next_id
        self._grow(n)
        stamps = placed.stamps()
        for pid in np.flatnonzero(stamps != self._stamp[:n]).tolist():
            self._stamp[pid] = stamps[pid]
            self._on[pid] = pid in placed.pods
            self._ws[pid] = None
            if self._on[pid]:
                self._t0[pid] = started.get(pid, now)
                self._job(pid, now)
        if self.heartbeat_s:  # the jobs whose last heartbeat may have moved on since it was taken
            for pid in np.flatnonzero(self._on[:n] & (self._due[:n] <= now)).tolist():
                self._job(pid, now)
        alive = np.flatnonzero(self._on[:n])  # ascending ids: the order of `placed.pods`
        running = self._ws[alive].tolist()
        head = PlannedWorkload(f"job-{jid}", request_of(pod), WorkloadState.PENDING, submitted_at=queued_at)
        movable = self.options.movable
        return self.cl.to_state(running, (head,), now=now, name="dynamic", known_rows=self._rows[alive],
                                known_gpus=self._gpus[alive],
                                known_verdicts=None if movable is None else (movable, self._ok[alive])), head

    def _job(self, pid: int, now: float) -> None:
        """Make placed job `pid`'s workload (again, when new, moved or its last heartbeat changed)."""
        cl, hb = self.cl, self.heartbeat_s
        p, ch = self.placed.pods[pid]
        t0 = float(self._t0[pid])
        ck = t0 + ((now - t0) // hb) * hb if hb and now - t0 >= hb else None  # its last heartbeat
        w = self._ws[pid]
        if w is not None and w.last_checkpoint_at == ck:
            self._due[pid] = self._next_heartbeat(t0, ck)
            return
        w = as_workload(p, checkpoint_bytes(p, cl.models[ch.node]), pid,
                        placements=(Placement(cl.names[ch.node], ch.gpus),), started_at=t0, last_checkpoint_at=ck)
        self._ws[pid] = w
        self._rows[pid] = workload_row(w, self.node_index)
        self._gpus[pid] = -1
        self._gpus[pid, : len(ch.gpus)] = ch.gpus
        movable = self.options.movable
        self._ok[pid] = w.can_move and (movable is None or bool(movable(w)))
        self._due[pid] = self._next_heartbeat(t0, ck)

    def _next_heartbeat(self, t0: float, ck: float | None) -> float:
        """A time no later than the job's next heartbeat after `ck` (its last, None: none yet): until then its
        last heartbeat cannot change, so `state` need not look at it (the margin absorbs rounding)."""
        hb = self.heartbeat_s
        if not hb:
            return np.inf
        nxt = (t0 if ck is None else ck) + hb
        return nxt - 1e-6 * (hb + abs(nxt))

    def _grow(self, n: int) -> None:
        """Room in the per-pod arrays for pod ids below `n`."""
        have = len(self._on)
        if n <= have:
            return
        more = max(1024, 2 * have, n) - have
        self._on = np.concatenate([self._on, np.zeros(more, dtype=bool)])
        self._stamp = np.concatenate([self._stamp, np.zeros(more, dtype=np.int64)])
        self._t0 = np.concatenate([self._t0, np.zeros(more)])
        self._due = np.concatenate([self._due, np.full(more, np.inf)])
        self._ws = np.concatenate([self._ws, np.full(more, None, dtype=object)])
        self._rows = np.concatenate([self._rows, np.zeros((more, 9), dtype=np.int64)])
        self._gpus = np.concatenate([self._gpus, np.full((more, self._gpus.shape[1]), -1, dtype=np.int64)])
        self._ok = np.concatenate([self._ok, np.zeros(more, dtype=bool)])

    def wants(self, jid: int, pod: Pod, now: float, version: int, freed: int | None = None) -> bool:
        """Whether the decision is to be asked again for queued job `jid` of shape `pod`: not when it last said
        "do nothing" for the same job less than `recheck_s` ago and, since then, nothing changed (`version`: a
        job started, ended or moved) — or, when it found no feasible plan for this job or any job of the same
        shape, nothing gave room back (`freed`: a job ended, moved or was evicted). A start only takes room: a
        plan feasible after it would, less the new job's moves, have been feasible before (freeing room never
        hurts a plan), so "no plan" stays the answer until room comes back or time moves on (prices and
        heartbeats change with time; the recheck sees to them). Sharing "no plan" across jobs of one shape spares
        a search when another job of that shape is asked before room comes back; on the gpuspec25 replay at
        trigger 0 that was rare (150 s samples before and after it held 16 and 15 such T4 searches: there room
        comes back at nearly every event); the planner's `search_limit` is what bounds those searches."""
        for seen in (self._seen.get(jid), self._no_plan.get(pod)):
            if seen is None or now - seen[2] >= self.recheck_s:
                continue
            if seen[0] == version:
                return False
            if seen[3] and freed is not None and seen[1] == freed:
                return False
        return True

    def rescue(self, jid: int, pod: Pod, queued_at: float, started: Mapping[int, float], now: float,
               version: int, freed: int | None = None) -> Choice | None:
        """Ask the decision for the head job (when `wants` says so); apply a chosen, feasible move plan and return
        where the head job lands (placed already), else None with nothing changed."""
        self.last_moved = []
        if not self.wants(jid, pod, now, version, freed):
            return None
        state, head = self.state(jid, pod, queued_at, started, now)
        self.asked += 1
        d = self.last = decide(state, head, self.options, plan_anyway=self.plan_anyway)
        choice = self._apply(d, pod) if d.chosen == MOVE and d.feasible and d.plan is not None else None
        if choice is not None:
            self._seen.pop(jid, None)
        else:
            self._seen[jid] = (version, freed, now, not d.feasible)
            if not d.feasible:
                self._no_plan[pod] = (version, freed, now, True)
        return choice

    def _apply(self, d: Decision, pod: Pod) -> Choice | None:
        cl, placed, idx = self.cl, self.placed, self.node_index
        assert d.plan is not None and d.plan.placements
        where: dict[int, Choice] = {}
        moved: list[tuple[int, Choice, Choice, float, float]] = []
        cl.mark()
        try:
            for m in d.plan.moves:
                pid = int(m.workload_id.removeprefix("pod-"))
                p, was = placed.pods[pid]
                was = where.get(pid, was)
                new = Choice(idx[m.target], tuple(m.target_gpus))
                cl.remove(p, was)
                cl.place(p, new)
                where[pid] = new
                moved.append((pid, was, new, m.cost.downtime_s, m.cost.lost_work_s))
            land = d.plan.placements[0]
            mine = Choice(idx[land.node], tuple(land.gpus))
            cl.place(pod, mine)
        except ValueError:  # the plan does not fit these arrays (should not happen): change nothing
            cl.rollback()
            cl.commit()
            return None
        cl.commit()
        for pid, new in where.items():
            placed.move(pid, new)
        self.last_moved = moved
        return mine


STANDARD = (
    DynamicConfig(policy="bestfit"),
    DynamicConfig(policy="fgd"),
    DynamicConfig(policy="fgd", defrag="evict"),
    DynamicConfig(policy="fgd", defrag="migrate"),
    DynamicConfig(pooled=True),
)
