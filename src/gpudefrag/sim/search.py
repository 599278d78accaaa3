"""One rescue's search state for the simulator's repackers (`repack.py`'s chains, `cpu_relief.py`,
`pool_repack.py`): tentative ejections and placements made in place inside one statement of the capacity model
(core/capacity.py `mark` / `rollback` / `commit`), so a rescue that fails is undone exactly. Its own module, below
the three that use it, so none of them imports another's private class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..core.placement import Choice, Cluster, PlacementPolicy, Pod
from .costs import GIB, checkpoint_bytes
from .replay import Placed


class Abort(Exception):
    """The move limit of this rescue was reached."""


def attempt(s: Search, step: Callable[[], Choice | None]) -> Choice | None:
    """Run one rescue step; when it finds nothing or passes the move limit, undo all it did."""
    try:
        ch = step()
        if ch is not None:
            return ch
    except Abort:
        pass
    s.undo()
    return None


@dataclass
class Search:
    """One rescue's tentative changes, made in place inside one statement of the capacity model
    (core/capacity.py): the cluster's arrays and `placed` (kept beside them through `Capacity.note`) are
    changed together and rolled back together."""

    cl: Cluster
    placed: Placed
    policy: PlacementPolicy
    rng: np.random.Generator
    limit: int
    limbo: set[int] = field(default_factory=set)  # ejected pods waiting for a place (still listed in `placed`)
    orig: dict[int, Choice] = field(default_factory=dict)  # where each touched pod started

    def __post_init__(self) -> None:
        self.cl.mark()

    # ------------------------------------------------------------------ reversible primitives
    def eject(self, pid: int) -> None:
        pod, ch = self.placed.pods[pid]
        cl, limbo = self.cl, self.limbo
        if pid not in self.orig:
            self.orig[pid] = ch
            cl.note(lambda: self.orig.pop(pid))
            if len(self.orig) > self.limit:
                raise Abort
        cl.give(ch.node, ch.gpus, pod)
        limbo.add(pid)
        cl.note(lambda: limbo.discard(pid))

    def put(self, pid: int, ch: Choice) -> None:
        pod, old = self.placed.pods[pid]
        placed, limbo = self.placed, self.limbo
        self.cl.take(ch.node, ch.gpus, pod)
        placed.move(pid, ch)
        limbo.discard(pid)

        def back() -> None:
            placed.move(pid, old)
            limbo.add(pid)

        self.cl.note(back)

    def put_new(self, pod: Pod, ch: Choice) -> None:
        self.cl.take(ch.node, ch.gpus, pod)

    def mark(self) -> int:
        return self.cl.mark()

    def undo(self, mark: int | None = None) -> None:
        """Roll back to `mark`; without one, to the start, closing the statement."""
        self.cl.rollback(mark or 0)
        if mark is None:
            self.cl.commit()

    def moved(self) -> list[int]:
        return [p for p, ch in self.orig.items() if self.placed.pods[p][1] != ch]

    def moved_gib(self) -> float:
        """Checkpoint GiB the search's moves would write (sim/costs.py's size model)."""
        return sum(checkpoint_bytes(self.placed.pods[p][0], self.cl.models[self.orig[p].node])
                   for p in self.moved()) / GIB

    # ------------------------------------------------------------------ queries
    def items(self, n: int, g: int) -> list[int]:
        """Sharing pods on GPU g of node n (not ejected)."""
        return [i for i in self.placed.on(n, g) if i not in self.limbo and self.placed.pods[i][0].is_sharing]
