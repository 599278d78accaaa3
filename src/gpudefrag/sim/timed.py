"""The trace replayed in time: pods arrive at their creation time, wait in the queue, run their own duration.

`simulate static` answers the FGD study's question (how many GPUs stay unallocated as the cluster fills); this
answers a platform engineer's: how long does an 8-GPU pod wait, with and without moves, and what do the moved
pods pay. The queue, the placement, the controllers and the pooled bound are `sim/dynamic.py`'s (one queue, no
copy); this module turns a pod list into timed jobs and runs the arms on the same arrivals.

Times (every rule here is in docs/simulator.md):
- a pod arrives at its `creation_time` and runs from its start for `deletion_time − scheduled_time` (the time it
  held its GPUs in the trace). A pod the trace never scheduled (`Pending`, no `scheduled_time`) runs for
  `deletion_time − creation_time`, the time its request stayed alive; a pod without a deletion time was still
  running when the trace ended and runs until the trace's last time stamp; a `Failed` pod runs for its own
  duration like any other (it held its GPUs until it failed; the replay does not fail it again). At least 1 s.
- `load`: one factor scales every arrival time (the order and every duration kept) so that the *peak* of the
  offered load — the GPUs the pods would hold at once if each started on arrival — is `load` × the cluster's GPUs.
  (The list is a sample of 149 days: on its own timeline at most ~1 % of the cluster is ever asked for, and
  94 % of its GPU-seconds belong to pods running over ten hours, so a load defined by GPU-seconds per second of
  arrivals cannot fill the cluster at all; at its peak the whole list asks for 98 % of the GPUs.)
  `load` 0 keeps the trace's own timeline.
- `window`: only the pods created in [start, end) of the trace's time (before scaling).
- A list published without times (the multigpu variants) takes, for each pod in list order, the arrival gap and
  the duration of a pod drawn (seeded) from the pods of the same GPU count of another list that has times (the
  default list, or `times_from`); the arrival times are the running sum of the gaps.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..core.model import MILLI
from ..errors import InputError
from .dynamic import DEFAULT_TRIGGER_S, DynamicConfig, DynamicResult, simulate
from .synthetic import Job, Workload, WorkloadSpec
from .trace import Trace, TracePod, load_nodes, load_pods

ARMS = ("fgd", "fgd+gpudefrag", "fgd+deschedule", "fgd+evict", "pooled")
ARM_DEFRAG = {"fgd": "none", "fgd+gpudefrag": "migrate", "fgd+deschedule": "deschedule", "fgd+evict": "evict"}
SIZE_CLASSES = ("fractional", "1", "2", "4", "8")
DEFAULT_LIST = "openb_pod_list_default.csv"


@dataclass(frozen=True)
class Times:
    """Arrival (s, from the first arrival, before scaling) and duration (s) per pod, and where they came from."""

    arrival: np.ndarray
    duration: np.ndarray
    source: str


def own_times(pods: Sequence[TracePod]) -> np.ndarray:
    """(creation, duration) per pod from the pod list's own times (the rules of the module docstring)."""
    stamps = [t for p in pods for t in (p.creation_time, p.deletion_time, p.scheduled_time) if t is not None]
    end = max(stamps) if stamps else 0.0
    out = np.zeros((len(pods), 2))
    for i, p in enumerate(pods):
        assert p.creation_time is not None  # load_pods(times=True) checked it
        start = p.scheduled_time if p.scheduled_time is not None else p.creation_time
        stop = p.deletion_time if p.deletion_time is not None else end
        out[i] = (p.creation_time, max(1.0, stop - start))
    return out


def drawn_times(pods: Sequence[TracePod], source: Sequence[TracePod], seed: int) -> np.ndarray:
    """(arrival, duration) for a list without times: per pod, the arrival gap (to the pod before it, in creation
    order) and the duration of a `source` pod of the same GPU count drawn with the seed (any source pod when
    none has that count); arrivals are the running sum of the gaps."""
    src = own_times(source)
    order = np.argsort(src[:, 0], kind="stable")
    gaps = np.zeros(len(source))
    gaps[order[1:]] = np.diff(src[order, 0])
    counts = np.array([p.pod.num_gpu for p in source])
    rng = np.random.default_rng(seed)
    by_count = {k: np.flatnonzero(counts == k) for k in np.unique(counts)}
    every = np.arange(len(source))
    out = np.zeros((len(pods), 2))
    for i, p in enumerate(pods):
        pool = by_count.get(p.pod.num_gpu, every)
        j = int(pool[rng.integers(len(pool))])
        out[i] = (gaps[j], src[j, 1])
    out[:, 0] = np.cumsum(out[:, 0])
    return out


def peak_demand(arrival: np.ndarray, duration: np.ndarray, gpus: np.ndarray) -> float:
    """The most GPUs held at once if every pod started on arrival (ends before starts at the same instant)."""
    if len(arrival) == 0:
        return 0.0
    t = np.concatenate([arrival, arrival + duration])
    d = np.concatenate([gpus, -gpus])
    kind = np.concatenate([np.ones(len(arrival)), np.zeros(len(arrival))])  # an end (0) sorts first
    order = np.lexsort((kind, t))
    return float(np.cumsum(d[order]).max())


def load_factor(arrival: np.ndarray, duration: np.ndarray, gpus: np.ndarray, capacity_gpus: float,
                load: float) -> float:
    """The factor f such that arrivals `arrival / f` make the peak offered load `load` × capacity (bisection:
    the peak only grows as arrivals come closer). An unreachable load is an error that says the reachable range."""
    want = load * capacity_gpus
    a = arrival - arrival.min() if len(arrival) else arrival
    top = float(gpus.sum())  # every pod at once (f → ∞)
    low = float(gpus.max()) if len(gpus) else 0.0  # pods one after another (f → 0)
    if not low <= want <= top:
        raise InputError("--load", "", f"{load} is out of reach for this pod list: its peak offered load lies "
                         f"between {low / capacity_gpus:.4f} (pods far apart) and {top / capacity_gpus:.4f} "
                         "(every pod at once) of the cluster's GPUs")
    lo, hi = -30.0, 30.0  # log10 f
    for _ in range(80):
        mid = (lo + hi) / 2
        if peak_demand(a / 10**mid, duration, gpus) < want:
            lo = mid
        else:
            hi = mid
    return float(10**hi) * (1 + 1e-6)  # off the boundary, where an end and an arrival tie and rounding decides


def parse_window(text: str) -> tuple[float, float]:
    """'START:END' in seconds of the trace's time (either side may be empty) → (start, end)."""
    if not text:
        return (0.0, math.inf)
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        lo = float(parts[0]) if parts[0].strip() else 0.0
        hi = float(parts[1]) if parts[1].strip() else math.inf
    except ValueError:
        raise InputError("--window", "", f"expected START:END in seconds (e.g. 10300000:12900000 or 10300000:), "
                         f"got {text!r}") from None
    if not (0 <= lo < hi) or math.isnan(hi):
        raise InputError("--window", "", f"need 0 <= START < END, got {text!r}")
    return lo, hi


@dataclass(frozen=True)
class ReplaySpec:
    """One replay's workload: the lists, the load, the window and the seed that draws missing times."""

    nodes: str
    pods: str
    load: float = 0.9
    seed: int = 42
    window: str = ""
    times_from: str = ""  # a list with times to draw from, for a list without them ("" = the default list)


def default_times_list(pods: str | os.PathLike[str]) -> Path | None:
    """The default list of the study beside a variant (its folder or the one above)."""
    p = Path(pods).resolve().parent
    for d in (p, p.parent):
        if (d / DEFAULT_LIST).is_file():
            return d / DEFAULT_LIST
    return None


def has_times(pods: str | os.PathLike[str]) -> bool:
    from ..fileio import decode_text, read_input

    text = decode_text(read_input(Path(pods), "trace"), str(pods))
    first = text.split("\n", 1)[0]
    return "creation_time" in [c.strip() for c in first.split(",")]


@dataclass(frozen=True)
class TimedWorkload:
    trace: Trace
    workload: Workload
    factor: float  # arrival times were divided by it
    times: str  # where the times came from (the report says so)
    peak_load: float

    @property
    def capacity_gpus(self) -> int:
        return sum(n.gpus for n in self.trace.nodes)


def build(spec: ReplaySpec) -> TimedWorkload:
    """The jobs of one replay: load the lists (every problem an InputError naming file, line and column), take or
    draw the times, cut the window, scale to the load."""
    nodes = load_nodes(spec.nodes)
    models = {n.model for n in nodes if n.model}
    timed = has_times(spec.pods)
    pods = load_pods(spec.pods, models, times=timed)
    if timed:
        if spec.times_from:
            raise InputError("--times-from", "", f"{spec.pods} has its own times; --times-from is for a list "
                             "without them")
        tm = own_times(pods)
        where = f"the list's own creation, scheduling and deletion times ({spec.pods})"
    else:
        src = Path(spec.times_from) if spec.times_from else default_times_list(spec.pods)
        if src is None:
            raise InputError(str(spec.pods), "line 1", "the list has no creation_time column and no "
                             f"{DEFAULT_LIST} lies beside it: give --times-from FILE (a pod list with times)")
        tm = drawn_times(pods, load_pods(src, times=True), spec.seed)
        where = (f"drawn (seed {spec.seed}) from the pods of the same GPU count in {src}: their arrival gaps and "
                 "durations (this list was published without times)")
    lo, hi = parse_window(spec.window)
    keep = np.flatnonzero((tm[:, 0] >= lo) & (tm[:, 0] < hi))
    if len(keep) == 0:
        raise InputError("--window", "", f"no pod of {spec.pods} arrives in {spec.window!r}")
    pods = tuple(pods[i] for i in keep)
    tm = tm[keep]
    gpus = np.array([p.pod.gpu_total / MILLI for p in pods])
    cap = sum(n.gpus for n in nodes)
    arrival = tm[:, 0] - tm[:, 0].min()
    f = load_factor(arrival, tm[:, 1], gpus, cap, spec.load) if spec.load else 1.0
    arrival = arrival / f
    order = np.argsort(arrival, kind="stable")
    jobs = tuple(Job(i, pods[j].pod, float(arrival[j]), float(tm[j, 1])) for i, j in enumerate(order))
    trace = Trace(nodes, tuple(pods[j] for j in order))
    return TimedWorkload(trace, Workload(WorkloadSpec(), jobs), f, where,
                         peak_demand(arrival, tm[:, 1], gpus) / cap)


@lru_cache(maxsize=2)
def _built(spec: ReplaySpec) -> TimedWorkload:
    return build(spec)


# ---------------------------------------------------------------------------------------------------------- arms
@dataclass(frozen=True)
class ArmRun:
    """One arm of one replay: the workload, the placement policy, the arm, and the controller's settings."""

    spec: ReplaySpec
    arm: str  # one of ARMS
    placement: str = "fgd"
    trigger_s: float = DEFAULT_TRIGGER_S
    product_policy: str = ""  # a policy file for the gpudefrag arm ("" = the default policy of the replay)
    heartbeat_s: float = 1800.0  # the default policy's heartbeat checkpoints

    @property
    def label(self) -> str:
        return "pooled" if self.arm == "pooled" else self.arm.replace("fgd", self.placement, 1)


@dataclass
class ArmResult:
    """What comes back from a run (small: plain arrays and numbers, the same from a process or a Ray task)."""

    run: ArmRun
    size_class: np.ndarray  # per job: fractional, 1, 2, 4, 8, 0 (CPU only), or another GPU count
    num_gpu: np.ndarray
    wait: np.ndarray  # seconds queued in all; a pod that never started: until the end (censored)
    never_started: np.ndarray  # bool
    times: np.ndarray  # allocation over time (sampled)
    alloc: np.ndarray
    moves: int
    evictions: int
    gib_moved: float
    gpu_hours_total: float
    gpu_hours_moving: float
    gpu_hours_lost: float
    decisions: int
    times_source: str
    load_factor: float
    peak_load: float
    mean_alloc: float
    metrics: dict[str, float | None] = field(default_factory=dict)


def default_policy(trigger_s: float, heartbeat_s: float):  # type: ignore[no-untyped-def]
    """The product's policy as the replay runs it by default: act on a GPU pod pending longer than the trigger,
    heartbeat checkpoints every `heartbeat_s`, every other setting the product's default."""
    from ..policy.models import Action, Heartbeat, PendingTrigger, Policy, Trigger

    return Policy(name="replay", trigger=Trigger(pending=PendingTrigger(longer_than_s=trigger_s)),
                  action=Action(heartbeat=Heartbeat(every_s=heartbeat_s)))


@lru_cache(maxsize=4)
def _policy(path: str, trigger_s: float, heartbeat_s: float):  # type: ignore[no-untyped-def]
    if not path:
        return default_policy(trigger_s, heartbeat_s)
    from ..policy.loader import load_policy

    return load_policy(path)


def config_for(run: ArmRun) -> DynamicConfig:
    if run.arm not in ARMS:
        raise ValueError(f"unknown arm {run.arm!r} ({', '.join(ARMS)})")
    if run.arm == "pooled":
        return DynamicConfig(pooled=True, seed=run.spec.seed, label=run.label, trigger_s=run.trigger_s)
    defrag = ARM_DEFRAG[run.arm]
    product = _policy(run.product_policy, run.trigger_s, run.heartbeat_s) if defrag == "migrate" else None
    return DynamicConfig(policy=run.placement, defrag=defrag, seed=run.spec.seed, label=run.label,
                         trigger_s=run.trigger_s, product=product)


def size_class(num_gpu: int, milli: int) -> str:
    return "fractional" if num_gpu == 1 and milli < MILLI else str(num_gpu)


def run_arm(run: ArmRun) -> ArmResult:
    """Replay one arm (the workload is built once per process and shared by the arms of one spec)."""
    tw = _built(run.spec)
    trace = tw.trace
    cl = trace.cluster()
    res = simulate(tw.workload, config_for(run), cl, mix=cl.mix)
    return arm_result(run, tw, res)


def arm_result(run: ArmRun, tw: TimedWorkload, res: DynamicResult) -> ArmResult:
    jobs = tw.workload.jobs
    never = np.isnan(res.first_start)
    wait = np.where(np.isnan(res.waited), res.end_time - res.submit, res.waited)
    step = max(1, len(res.times) // 4000)
    last_arrival = float(res.submit.max()) if len(res.submit) else 0.0
    out = ArmResult(
        run=run, size_class=np.array([size_class(j.pod.num_gpu, j.pod.gpu_milli) for j in jobs]),
        num_gpu=np.array([j.pod.num_gpu for j in jobs]), wait=wait, never_started=never,
        times=res.times[::step], alloc=res.util[::step], moves=res.moves, evictions=res.evictions,
        gib_moved=res.moved_bytes / 1024**3, gpu_hours_total=res.work_gpu_s / 3600,
        gpu_hours_moving=res.move_gpu_s / 3600, gpu_hours_lost=res.lost_gpu_s / 3600, decisions=res.decisions,
        times_source=tw.times, load_factor=tw.factor, peak_load=tw.peak_load,
        mean_alloc=res.mean_util(last_arrival),
    )
    out.metrics = arm_metrics(out)
    return out


def _pct(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if len(x) else None


def arm_metrics(r: ArmResult) -> dict[str, float | None]:
    """The per-run numbers the report and --json give (before the medians over seeds)."""
    m: dict[str, float | None] = {}
    for c in SIZE_CLASSES:
        w = r.wait[r.size_class == c]
        for q in (50, 95, 99):
            m[f"p{q}_wait_s_{c}"] = _pct(w, q)
    multi = r.wait[r.num_gpu >= 2]
    m["p95_wait_s_multi"] = _pct(multi, 95)
    placed = int((~r.never_started).sum())
    m["pods"] = float(len(r.wait))
    m["never_started"] = float(r.never_started.sum())
    m["moves"] = float(r.moves)
    m["evictions"] = float(r.evictions)
    m["moves_per_placed_pod"] = r.moves / max(placed, 1)
    m["gib_moved"] = r.gib_moved
    m["gib_moved_per_placed_pod"] = r.gib_moved / max(placed, 1)
    m["gpu_hours_total"] = r.gpu_hours_total
    m["gpu_hours_moving"] = r.gpu_hours_moving
    m["gpu_hours_lost"] = r.gpu_hours_lost
    m["moving_share"] = r.gpu_hours_moving / r.gpu_hours_total if r.gpu_hours_total else 0.0
    m["mean_allocation"] = r.mean_alloc
    m["decisions"] = float(r.decisions)
    return m


def gap_closed(base: float | None, arm: float | None, pooled: float | None) -> float | None:
    """Share of the base → pooled gap an arm closes (1 = as good as the pooled bound); None without a gap."""
    if base is None or arm is None or pooled is None or not base - pooled > 0:
        return None
    return (base - arm) / (base - pooled)


def combine(results: Sequence[ArmResult]) -> dict[str, dict[str, object]]:
    """The medians over seeds per arm label, and each arm's share of the FGD → pooled gap in the p95 wait of the
    multi-GPU pods (each seed against its own FGD and pooled runs, then the median)."""
    by: dict[str, list[ArmResult]] = {}
    for r in results:
        by.setdefault(r.run.label if r.run.arm != "pooled" else "pooled", []).append(r)
    base_label = next((lb for lb, rs in by.items() if rs[0].run.arm == "fgd"), None)
    seeds_base = {r.run.spec.seed: r for r in by.get(base_label or "", [])}
    seeds_pool = {r.run.spec.seed: r for r in by.get("pooled", [])}
    out: dict[str, dict[str, object]] = {}
    for label, rs in by.items():
        row: dict[str, object] = {"arm": rs[0].run.arm, "seeds": [r.run.spec.seed for r in rs]}
        for k in rs[0].metrics:
            vals = [r.metrics[k] for r in rs if r.metrics[k] is not None]
            row[k] = float(np.median(vals)) if vals else None
        row["p95_wait_s"] = {c: row[f"p95_wait_s_{c}"] for c in SIZE_CLASSES}
        row["p50_wait_s"] = {c: row[f"p50_wait_s_{c}"] for c in SIZE_CLASSES}
        row["p99_wait_s"] = {c: row[f"p99_wait_s_{c}"] for c in SIZE_CLASSES}
        gaps = []
        for r in rs:
            b, p = seeds_base.get(r.run.spec.seed), seeds_pool.get(r.run.spec.seed)
            if b is not None and p is not None:
                g = gap_closed(b.metrics["p95_wait_s_multi"], r.metrics["p95_wait_s_multi"],
                               p.metrics["p95_wait_s_multi"])
                if g is not None:
                    gaps.append(g)
        row["gap_closed_p95_multi"] = float(np.median(gaps)) if gaps else None
        out[label] = row
    return out


def runs_for(specs: Sequence[ReplaySpec], placements: Sequence[str], arms: Sequence[str] = ARMS,
             trigger_s: float = DEFAULT_TRIGGER_S, product_policy: str = "",
             heartbeat_s: float = 1800.0) -> list[ArmRun]:
    """The sweep: every spec (list × load × seed) × placement policy × arm; the pooled bound once per spec."""
    out = []
    for s in specs:
        for i, p in enumerate(placements):
            for a in arms:
                if a == "pooled" and i > 0:
                    continue
                out.append(ArmRun(s, a, p, trigger_s, product_policy, heartbeat_s))
    return out


def with_seed(spec: ReplaySpec, seed: int) -> ReplaySpec:
    return replace(spec, seed=seed)
