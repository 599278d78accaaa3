"""The policy's triggers as one registry (`gpudefrag.registry`): one function per trigger, registered in order
with its name and its settings, which live here beside it and make up the policy file's `trigger:` section.

A trigger looks at the cluster (and what the triggers before it found) and returns the targets it wants placed:
a pending workload whose decision is "fragmentation alone", or a whole free node (cron schedule, explicit
request, fragmentation above a threshold). Each also leaves notes (trigger / skip, with the reason) for the
controller's log. Pure: the controller supplies the clock, the cron bookkeeping and the request flag.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any

from croniter import croniter
from pydantic import Field, field_validator

from ..core.model import ClusterState, Request, Workload
from ..registry import Registry
from .base import Strict, cron_expression

TriggerFn = Callable[["TriggerContext", list["Target"]], list["Target"]]
TRIGGERS: Registry[TriggerFn] = Registry("trigger")


# ------------------------------------------------------------------------------- each trigger's settings
class PendingTrigger(Strict):
    """A GPU job pending longer than `longer_than_s` whose diagnosed cause is fragmentation alone."""

    longer_than_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 60.0
    min_gpus: Annotated[int, Field(ge=1)] = 1  # only requests at least this large


class PendingSettings(Strict):
    """`trigger.pending`: the pending trigger's settings (null turns it off)."""

    pending: PendingTrigger | None = PendingTrigger()


class ScheduledSettings(Strict):
    """`trigger.cron` and `trigger.on_request`: when the scheduled trigger frees a whole node."""

    cron: str | None = None
    # an explicit request may start a cycle: `gpudefrag controller --once`, or the file named by `--request-file`
    # appearing
    on_request: bool = True

    @field_validator("cron")
    @classmethod
    def _cron_ok(cls, v: str | None) -> str | None:
        return cron_expression(v)

    def cron_due(self, last: float | None, now: float) -> bool:
        """True when a cron fire time lies in (last, now]; the first evaluation only arms the schedule."""
        if self.cron is None or last is None:
            return False
        nxt = croniter(self.cron, datetime.fromtimestamp(last)).get_next(float)
        return nxt <= now


class FragmentationSettings(Strict):
    """`trigger.fragmentation_above`: the FGD ratio above which a whole node is freed (the scheduled trigger
    also reads it: below it, a cron fire or a request does nothing)."""

    fragmentation_above: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None


class Trigger(FragmentationSettings, ScheduledSettings, PendingSettings):  # fields: pending, cron, ...
    """The policy file's `trigger:` section: every registered trigger's settings, and `plan_anyway`."""

    # move jobs even for a pending job an ordinary cause keeps waiting (held, a limit, a quota): moves that cannot
    # start it. Never the default; `controller --plan-anyway` asks the same for one run
    plan_anyway: bool = False


@dataclass(frozen=True)
class Target:
    """What a trigger wants placed: a pending workload, or (cron / fragmentation threshold) a whole free node."""

    why: str
    request: Request
    workload_id: str | None = None
    plan_anyway: bool = False  # plan although an ordinary cause blocks the job (asked in so many words)

    @property
    def ask(self) -> tuple[Request, bool]:
        """What the decision is asked for this target: targets with one `ask` get one answer (feasibility is a
        function of the state and the request, not of which job asks). The pending trigger counts its distinct
        requests by it and the controller skips a target whose ask found no plan earlier in the cycle."""
        return self.request, self.plan_anyway


@dataclass
class TriggerContext:
    state: ClusterState
    now: float
    trigger: Trigger  # the policy's `trigger:` section
    # distinct requests the pending trigger hands on per cycle, oldest job first: the policy's
    # budgets.tries_per_cycle; the controller asks the decision of each in turn until enough plans start. Jobs
    # whose request is one of those ride along (a plan for each, while plans may start), `max_jobs` in all
    max_targets: int = 1
    max_jobs: int = 8
    requested: bool = False  # an explicit request (CLI / API) arrived since the last cycle
    cron_due: bool = False  # the cron schedule fired since the last cycle
    plan_anyway: bool = False  # asked in so many words (`--plan-anyway`): move even for a job a hold/limit blocks
    # the planner's filter (policy filter, busy and wrapper-less jobs): whether CPU or memory that jobs hold is
    # fragmentation (they may move) or an ordinary cause (they may not) depends on it, as in the decision
    movable: Callable[[Workload], bool] | None = None
    notes: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # (kind, reason, detail)
    _frag: float | None = None

    def note(self, kind: str, reason: str, **detail: Any) -> None:
        self.notes.append((kind, reason, detail))

    @property
    def fragmentation(self) -> float:
        """The cluster's FGD fragmentation ratio (computed once, when a trigger asks)."""
        if self._frag is None:
            from ..core.fragmentation import frag_report  # loaded when used: the policy file's models import this

            self._frag = frag_report(self.state).fgd_ratio
        return self._frag

    def whole_node(self) -> Request:
        return Request(gpus_per_node=max(self.state.max_gpus, 1))

    @property
    def anyway(self) -> bool:
        """Plan even for jobs an ordinary cause blocks: only when asked in so many words (CLI or policy)."""
        return self.plan_anyway or self.trigger.plan_anyway

    def blocked_pending(self) -> list[str]:
        """When every pending GPU job is kept waiting by an ordinary cause (held, a limit, a quota), those jobs
        with their first cause ("5 (not-eligible: JobHeldAdmin)"): freeing a whole node would be done for
        them and start none. Empty when no job is pending or some pending job is not blocked."""
        ids = [w.id for w in self.state.pending if w.request.gpus_per_node > 0 or w.request.mig_profile is not None]
        if not ids:
            return []
        from ..core.decision import decide_all  # loaded when used: the policy file's models import this module
        from ..core.planner import PlanOptions

        out = []
        for c in decide_all(self.state, ids, PlanOptions(movable=self.movable), plan=False):
            if not c.blocked_by:
                return []
            first = c.blocked_by[0]
            why = str(first.evidence.get("scheduler_reason") or first.summary)
            out.append(f"{c.workload_id} ({first.code.value}: {why})")
        return out

    def refuse_blocked(self, why: str) -> bool:
        """True (with a note) when a whole-node trigger must not move jobs: every pending job is blocked by an
        ordinary cause and nobody asked to plan anyway."""
        if self.anyway:
            return False
        blocked = self.blocked_pending()
        if not blocked:
            return False
        self.note("skip", f"{why}, but every pending GPU job is kept waiting by an ordinary cause: "
                  f"{', '.join(blocked[:5])}; moving jobs would start none of them, so nothing moves "
                  "(--plan-anyway or trigger.plan_anyway: true moves them anyway)", blocked=blocked)
        return True


def trigger(name: str, settings: type[Strict]) -> Callable[[TriggerFn], TriggerFn]:
    """Register a trigger under `name`, after those already registered, with the settings it reads."""
    return TRIGGERS.register(name, settings)


def evaluate(ctx: TriggerContext) -> list[Target]:
    """Every registered trigger in order; the targets they want placed."""
    found: list[Target] = []
    for entry in TRIGGERS:
        found.extend(entry.fn(ctx, found))
    return found


@trigger("pending", PendingSettings)
def pending_fragmented(ctx: TriggerContext, _found: list[Target]) -> list[Target]:
    """Pending GPU jobs, oldest first, that waited long enough and whose decision is "fragmentation alone" (the
    scheduler's own reason is part of the diagnosis, for every engine), up to `max_targets` distinct requests
    (and `max_jobs` jobs). Jobs an ordinary cause keeps waiting are noted with their causes and skipped.
    Diagnosis stops once enough are found (the rest wait for later cycles). More than the plans a cycle may
    start: the oldest job may be one that no plan can help, and it must not keep the jobs behind it waiting.
    Distinct requests, because a job asking what an older one asked gets the same answer: counted per job, a
    queue led by many jobs of one shape that no plan helps kept every other shape from being asked."""
    from ..core.decision import decide_all
    from ..core.planner import PlanOptions

    pt = ctx.trigger.pending
    if pt is None:
        return []
    limit = ctx.max_targets
    waited: dict[str, float] = {}
    for w in ctx.state.pending:
        if w.request.gpus_per_node < pt.min_gpus and w.request.mig_profile is None:
            continue
        age = ctx.now - (w.submitted_at if w.submitted_at is not None else ctx.now)
        if age >= pt.longer_than_s:
            waited[w.id] = age
    out: list[Target] = []
    asks: list[tuple[Request, bool]] = []  # the distinct `Target.ask` among `out`

    def take(t: Target) -> None:
        """Hand `t` on, if its request is a new one and fewer than `limit` were, or one already handed on."""
        if len(out) >= ctx.max_jobs:
            return
        if t.ask not in asks:
            if len(asks) >= limit:
                return
            asks.append(t.ask)
        out.append(t)
        ctx.note("trigger", t.why, workload=t.workload_id)

    ids = list(waited)  # state.pending order: oldest first
    step = max(limit, 8)
    for k in range(0, len(ids), step):  # in chunks (one shared diagnosis context each), stop once enough
        for c in decide_all(ctx.state, ids[k : k + step], PlanOptions(movable=ctx.movable), plan=False):
            d = c.diagnosis
            if d.workload_id is None:
                continue
            if not d.is_fragmentation and c.blocked_by and ctx.anyway:
                w = ctx.state.workload(d.workload_id)
                take(Target(f"{w.id} ({w.request.label()}) pending {waited[w.id]:.0f} s, blocked by "
                            f"{', '.join(x.code.value for x in c.blocked_by)}: planned anyway, as asked",
                            w.request, w.id, plan_anyway=True))
                continue
            if not d.is_fragmentation:
                if c.blocked_by:
                    ctx.note("skip", f"{d.workload_id}: {c.reason}", workload=d.workload_id,
                             causes=[x.code.value for x in d.causes])
                continue
            w = ctx.state.workload(d.workload_id)
            take(Target(f"{w.id} ({w.request.label()}) pending {waited[w.id]:.0f} s, diagnosed "
                        f"{d.primary.code.value}", w.request, w.id))
        if len(asks) >= limit or len(out) >= ctx.max_jobs:
            break
    return out


def pending_due(state: ClusterState, now: float, trigger: Trigger) -> float | None:
    """When the pending trigger will next have a job old enough to look at (the earliest `submitted_at +
    longer_than_s` still in the future), or None: a controller that is woken by changes sleeps until then, so
    a job's decision comes when the policy says, not at the next tick of a timer."""
    pt = trigger.pending
    if pt is None:
        return None
    due = [w.submitted_at + pt.longer_than_s for w in state.pending
           if w.submitted_at is not None and (w.request.gpus_per_node >= pt.min_gpus or w.request.mig_profile)
           and w.submitted_at + pt.longer_than_s > now]
    return min(due, default=None)


@trigger("scheduled", ScheduledSettings)
def cron_or_request(ctx: TriggerContext, found: list[Target]) -> list[Target]:
    """The cron schedule or an explicit request: free a whole node — unless fragmentation is below the policy's
    threshold, or a pending job already gets a plan this cycle."""
    tr = ctx.trigger
    if found or not (ctx.cron_due or (ctx.requested and tr.on_request)):
        return []
    why = "cron schedule" if ctx.cron_due else "explicit request"
    if tr.fragmentation_above is not None and ctx.fragmentation <= tr.fragmentation_above:
        ctx.note("skip", f"{why}, but fragmentation {ctx.fragmentation:.2f} <= {tr.fragmentation_above:.2f}")
        return []
    if ctx.refuse_blocked(why):
        return []
    t = Target(f"{why}: free a whole node", ctx.whole_node())
    ctx.note("trigger", t.why)
    return [t]


@trigger("fragmentation-above", FragmentationSettings)
def fragmentation_above(ctx: TriggerContext, found: list[Target]) -> list[Target]:
    """Without a cron schedule, fragmentation above the threshold frees a whole node at once."""
    tr = ctx.trigger
    if found or tr.fragmentation_above is None or tr.cron is not None:
        return []
    if ctx.cron_due or (ctx.requested and tr.on_request):  # the scheduled trigger decided already
        return []
    if ctx.fragmentation <= tr.fragmentation_above:
        return []
    if ctx.refuse_blocked(f"fragmentation {ctx.fragmentation:.2f} above {tr.fragmentation_above:.2f}"):
        return []
    t = Target(f"fragmentation {ctx.fragmentation:.2f} above {tr.fragmentation_above:.2f}: free a whole node",
               ctx.whole_node())
    ctx.note("trigger", t.why)
    return [t]
