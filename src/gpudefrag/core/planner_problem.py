"""The planning problem both solvers read: per-workload arrays, where each workload may go (eligibility and the
compatibility gate, cached per distinct record), what it costs, and a mutable working copy of the free arrays.

Built once per plan with NumPy so that a 10,000-node, 50,000-job cluster costs tens of milliseconds; anything
per-workload in Python (the policy filter, costs with per-pair links) is computed lazily, only for the
workloads a solver actually looks at.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

import numpy as np

from .capacity import Capacity, Shape
from .compat import CompatRule, check, checkpoint_record, describe, node_signature
from .cost import AltCost, CostModel, MoveCost
from .fragmentation import eligible_mask
from .model import MILLI, ClusterState, Request, Versions, Workload
from .planner_types import PlanOptions

RESERVATION_LABEL = "gpudefrag.io/reservation"  # marks a request placed by an earlier plan of plan_all_pending


@dataclass(frozen=True)
class Part:
    """One node's share of a request (`shape`, the one request shape of core/capacity.py), the request it
    belongs to (parts of one request need distinct nodes) and the nodes that request may use at all."""

    req: int
    request: Request
    shape: Shape
    eligible: np.ndarray

    @property
    def gpus(self) -> int:
        return self.shape.num_gpu

    @property
    def milli(self) -> int:
        return self.shape.gpu_milli

    @property
    def cpu(self) -> int:
        return self.shape.cpu_milli

    @property
    def mem(self) -> int:
        return self.shape.memory_mib


def parts_of(state: ClusterState, requests: list[Request]) -> list[Part]:
    out: list[Part] = []
    for k, r in enumerate(requests):
        el = eligible_mask(state, r) & (state.usable_counts >= r.gpus_per_node)
        shape = Shape.of(r)
        out.extend(Part(k, r, shape, el) for _ in range(r.node_count))
    return out


class Problem:
    """Everything about the state the solvers need, indexed by workload number (into `state.running`)."""

    def __init__(self, state: ClusterState, options: PlanOptions) -> None:
        self.state = state
        self.opts = options
        self.cm = options.cost_model or CostModel()
        self.rule = options.compat or CompatRule()
        self.now = state.now
        self.ws: tuple[Workload, ...] = state.running
        ws = self.ws
        n = len(ws)
        # one pass over the workloads per state, shared with the diagnosis (the planner's only O(jobs) loop)
        ints = state.running_rows
        self.src, self.gpus, self.gpu0, self.milli, self.cpu, self.mem = (ints[:, k].copy() for k in range(6))
        # checkpoint size and last checkpoint (None: NaN) of each, read at C speed (4,000 jobs per replay decision)
        ckpt = np.fromiter(map(attrgetter("checkpoint_bytes"), ws), dtype=np.float64, count=n)
        last = np.array(list(map(attrgetter("last_checkpoint_at"), ws)), dtype=np.float64).reshape(n)
        self.gpu_eq = self.gpus * np.minimum(self.milli, MILLI) / MILLI
        self.score = self.cm.score_vector(ckpt, self.now - last, self.gpu_eq, fresh_checkpoint=options.fresh_checkpoint)
        # the same with the fastest link anywhere: never above a move's real score (for lower bounds)
        fastest = max([self.cm.transfer_bps, *self.cm.link_bps.values()])
        self.score_lb = (
            self.score if fastest == self.cm.transfer_bps
            else replace(self.cm, transfer_bps=fastest).score_vector(
                ckpt, self.now - last, self.gpu_eq, fresh_checkpoint=options.fresh_checkpoint)
        )
        self.multi = self.src < 0
        key = np.where(self.multi, len(state.nodes), self.src)
        self._order = np.argsort(key, kind="stable")
        self._starts = np.searchsorted(key[self._order], np.arange(len(state.nodes) + 1))
        self._movable: dict[int, str | None] = {}
        self._targets: dict[tuple[object, ...], np.ndarray] = {}
        self._compat: dict[object, np.ndarray] = {}
        self._shapes: dict[int, Shape] = {}
        self._records: dict[int, Versions] = {}
        # what a solver derives from the problem alone and asks again and again (the heuristic's price order of
        # the workloads, per score vector), made once per plan, keyed by the solver
        self.memo: dict[tuple[object, ...], Any] = {}
        self.trials = 0  # working states the heuristic's search tried (`spend`)
        self.cut = False  # whether `PlanOptions.search_limit` stopped it

    def spend(self) -> bool:
        """Count one trial of the heuristic's search (a working state made to try a set of moves) against
        `PlanOptions.search_limit`. False once the limit is spent: the search then keeps the best plan it has
        found, so that one decision's time stays bounded on any cluster (a search that finds nothing can
        otherwise try tens of thousands of chains, seconds of a controller's cycle)."""
        if self.trials >= self.opts.search_limit:
            self.cut = True
            return False
        self.trials += 1
        return True

    # ------------------------------------------------------------------ lookups
    def on_node(self, i: int) -> np.ndarray:
        """Single-node workloads running on node i (multi-node ones are listed by `multi_on`)."""
        return self._order[self._starts[i] : self._starts[i + 1]]

    def why_not_movable(self, wi: int) -> str | None:
        """None if the workload may move, else the reason (multi-node, policy filter)."""
        if wi in self._movable:
            return self._movable[wi]
        w = self.ws[wi]
        reason: str | None = None
        known = self.state.may_move_known(self.opts.movable) if self.ws is self.state.running else None
        if known is not None and known[wi]:  # the diagnosis asked the filter already: only the reservation is left
            if w.labels.get(RESERVATION_LABEL) == "true":
                reason = "room reserved for an earlier pending request"
        elif self.multi[wi]:
            reason = "multi-node workload (never moved)"
        elif not w.can_move:  # the snapshot's `movable` flag or the gpudefrag.io/movable label
            reason = "marked not movable" + (f" ({w.movable_reason})" if w.movable_reason else "")
        elif w.labels.get(RESERVATION_LABEL) == "true":
            reason = "room reserved for an earlier pending request"
        elif self.opts.movable is not None and not self.opts.movable(w):
            why = self.opts.excluded_by(w) if self.opts.excluded_by is not None else None
            reason = f"excluded by {why}" if why else "excluded by the policy filter"
        self._movable[wi] = reason
        return reason

    def record(self, wi: int) -> Versions:
        """What the workload's checkpoint will record (`core.compat.checkpoint_record`), cached."""
        got = self._records.get(wi)
        if got is None:
            got = self._records[wi] = checkpoint_record(self.state, self.ws[wi])
        return got

    def compat_mask(self, wi: int) -> np.ndarray:
        """Nodes the workload's checkpoint may be restored on (the compatibility gate), cached per record."""
        rec = self.record(wi)
        got = self._compat.get(rec)
        if got is None:
            groups: dict[tuple[object, ...], list[int]] | None = self.state.memo.get(  # type: ignore[assignment]
                "planner.signature_groups")
            if groups is None:  # once per state: every plan on it asks (5,000 nodes: 10 ms)
                groups = {}
                for i, nd in enumerate(self.state.nodes):
                    groups.setdefault(node_signature(nd), []).append(i)
                self.state.memo["planner.signature_groups"] = groups
            got = np.zeros(len(self.state.nodes), dtype=bool)
            for members in groups.values():
                if not check(rec, self.state.nodes[members[0]], self.rule):
                    got[members] = True
            self._compat[rec] = got
        return got

    def targets_mask(self, wi: int) -> np.ndarray:
        """Nodes a workload may be moved to, whatever is free there: eligible for its own request (model,
        selector, taints, partition, schedulable), big enough, and compatible with its checkpoint."""
        w = self.ws[wi]
        r = w.request
        key = (r.gpu_models, tuple(sorted(r.node_selector.items())), r.tolerations, r.partition, r.gpus_per_node,
               self.record(wi))
        got = self._targets.get(key)
        if got is None:
            got = eligible_mask(self.state, r) & (self.state.usable_counts >= r.gpus_per_node) & self.compat_mask(wi)
            self._targets[key] = got
        return got

    def excluded_by_compat(self, wi: int, limit: int = 3) -> list[str]:
        """Why compatible-looking nodes are refused for this workload (for --explain). Kept per problem: a
        chain search that fails states it for every workload left without room, again and again."""
        key = ("excluded_by_compat", wi, limit)
        got = self.memo.get(key)
        if got is None:
            got = self.memo[key] = self._excluded_by_compat(wi, limit)
        return list(got)

    def _excluded_by_compat(self, wi: int, limit: int) -> list[str]:
        mask = ~self.compat_mask(wi) & self.state.schedulable_mask
        out: list[str] = []
        for i in np.flatnonzero(mask)[:limit]:
            out.extend(describe(self.record(wi), self.state.nodes[int(i)], self.rule))
        extra = int(mask.sum()) - limit
        if extra > 0:
            out.append(f"... and {extra} more nodes")
        return out

    def move_cost(self, wi: int, src: int, dst: int) -> MoveCost:
        return self.cm.move_cost(
            self.ws[wi], self.state.nodes[src].name, self.state.nodes[dst].name, self.now,
            fresh_checkpoint=self.opts.fresh_checkpoint,
        )

    def alternatives(self, wi: int) -> tuple[AltCost, AltCost]:
        w = self.ws[wi]
        return self.cm.eviction_cost(w, self.now), self.cm.drain_cost(w, self.now)

    def shape(self, wi: int) -> Shape:
        """What workload wi asks of its node."""
        got = self._shapes.get(wi)
        if got is None:
            got = self._shapes[wi] = Shape.of(self.ws[wi].request)
        return got

    def name(self, i: int) -> str:
        return self.state.nodes[i].name

    def label(self, wi: int) -> str:
        return self.ws[wi].id


class Work:
    """The planner's working state: the capacity model's working copy (core/capacity.py) plus the moves and
    reservations made so far. Change it only through `release`, `move` and `reserve`: they record the nodes
    they touch in `dirty`, and the heuristic reads every other node from what it kept for the problem's state."""

    def __init__(self, p: Problem) -> None:
        self.p = p
        self.cap = Capacity.of_state(p.state)
        self.touched = np.zeros(len(p.state.nodes), dtype=np.int64)
        self.moved: dict[int, tuple[int, tuple[int, ...]]] = {}  # workload -> (target node, GPUs)
        self.order: list[int] = []  # workloads in the order they move
        self.reserved: list[tuple[Part, int, tuple[int, ...]]] = []
        self.score = 0.0
        # nodes whose rows may differ from the problem's state: what the heuristic's per-node caches recompute
        self.dirty: set[int] = set()

    @property
    def free(self) -> np.ndarray:
        return self.cap.free

    @property
    def cpu(self) -> np.ndarray:
        return self.cap.cpu_free

    @property
    def mem(self) -> np.ndarray:
        return self.cap.mem_free

    def clone(self) -> Work:
        c = Work.__new__(Work)
        c.p = self.p
        c.cap = self.cap.copy()
        c.touched = self.touched.copy()
        c.moved = dict(self.moved)
        c.order = list(self.order)
        c.reserved = list(self.reserved)
        c.score = self.score
        c.dirty = set(self.dirty)
        return c

    def assign(self, other: Work) -> None:
        """Become `other` (a clone this one was branched into)."""
        self.cap, self.touched = other.cap, other.touched
        self.moved, self.order, self.reserved, self.score = other.moved, other.order, other.reserved, other.score
        self.dirty = other.dirty

    def release(self, wi: int) -> None:
        """Take a workload off its source node (its GPUs become free)."""
        p = self.p
        self.cap.give(int(p.src[wi]), p.ws[wi].placements[0].gpus, p.shape(wi))
        self.dirty.add(int(p.src[wi]))

    def move(self, wi: int, dst: int, gpus: tuple[int, ...]) -> None:
        """Record a move whose source was already released."""
        p = self.p
        self.cap.take(dst, gpus, p.shape(wi))
        self.dirty.add(dst)
        self.moved[wi] = (dst, gpus)
        self.order.append(wi)
        self.touched[int(p.src[wi])] += 1
        self.touched[dst] += 1
        self.score += p.move_cost(wi, int(p.src[wi]), dst).score

    def reserve(self, part: Part, i: int, gpus: tuple[int, ...]) -> None:
        self.cap.take(i, gpus, part.shape)
        self.dirty.add(i)
        self.reserved.append((part, i, gpus))

    def fits_without(self, node: int, gone: list[int], shape: Shape) -> bool:
        """Whether `shape` fits on `node` once the workloads `gone` (running on it) have left: a statement of
        the capacity model, rolled back."""
        cap = self.cap
        m = cap.mark()
        for v in gone:
            self.release(v)
        ok = cap.fits_on(node, shape)
        cap.rollback(m)
        if m == 0:
            cap.commit()
        return ok

    def budget_ok(self) -> np.ndarray:
        return self.touched < self.p.opts.max_moves_per_node

    def moves_left(self) -> int:
        return self.p.opts.max_moves - len(self.order)


def capacity_proof(p: Problem, parts: list[Part]) -> str:
    """A counting proof that no plan exists, whatever the moves: "" when the counts allow one. Settles at once
    what CP-SAT needs seconds to minutes to prove on a full cluster.

    1. GPUs. Every running workload stays somewhere and every part must land. A GPU held by a whole-GPU
       workload or part holds nothing else; everything else (shares, and load of unknown origin) needs at least
       its total milli-GPU / 1000 GPUs. GPUs that can hold anything after the plan are those of schedulable
       nodes plus the busy ones of other nodes (their occupants may stay). Fewer GPUs than that: no plan.
    2. Moves, per target node. A part needs `gpus` GPUs with its share free on its node; a workload leaving
       frees at most the GPUs it holds there (a shared one at most one). The fewest departures that could free
       enough (largest first) must fit the move budgets, else the node cannot be the target; a request with
       fewer possible target nodes than parts has no plan."""
    st = p.state
    free = st.free_milli
    exists = free >= 0
    used = np.where(exists, MILLI - np.minimum(free, MILLI), 0)
    avail = int((exists & (st.schedulable_mask[:, None] | (used > 0))).sum())
    whole_w = (p.milli >= MILLI) & (p.gpus > 0)
    n_place = np.fromiter((len(w.placements) for w in p.ws), dtype=np.int64, count=len(p.ws))
    whole = int((p.gpus * n_place)[whole_w].sum()) + sum(pt.gpus for pt in parts if pt.milli >= MILLI)
    share = int(used.sum()) - MILLI * int((p.gpus * n_place)[whole_w].sum())
    share += sum(pt.gpus * pt.milli for pt in parts if pt.milli < MILLI)
    need = whole + -(-share // MILLI)
    if need > avail:
        return (f"the running workloads and the request need at least {need} GPUs, "
                f"and the cluster can offer {avail}")
    budget = min(p.opts.max_moves, p.opts.max_moves_per_node)
    by_req: dict[int, int] = {}
    for part in parts:
        ok = 0
        have = (free >= part.milli).sum(axis=1)
        for i in np.flatnonzero(part.eligible):
            missing = part.gpus - int(have[i])
            if missing <= 0:
                ok += 1
                continue
            frees = sorted((min(int(p.gpus[wi]), 1 if p.milli[wi] < MILLI else MILLI) for wi in p.on_node(int(i))
                            if p.why_not_movable(int(wi)) is None), reverse=True)
            got = np.cumsum(frees[:budget]) if frees else np.zeros(0)
            if len(got) and got[-1] >= missing:
                ok += 1
        by_req[part.req] = ok
    for part in parts:
        count = sum(1 for q in parts if q.req == part.req)
        if by_req[part.req] < count:
            return (f"no {'node' if count == 1 else f'{count} nodes'} can take {part.request.label()}: clearing "
                    f"any candidate needs more than {budget} moves or more than its movable workloads hold")
    return ""
