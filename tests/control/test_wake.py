"""Between cycles the controller sleeps only until something can change its decision: the pending trigger's
next job old enough (`pending_due`), or — on an engine that watches — a change the watches deliver."""

from __future__ import annotations

import time

from gpudefrag.cli.controller_cmd import pause_until_change
from gpudefrag.control.controller import Controller
from gpudefrag.core.model import ClusterState
from gpudefrag.engines.sim import SimEngine
from gpudefrag.policy import parse_policy
from gpudefrag.policy.triggers import pending_due


def test_the_controller_knows_when_the_next_pending_job_is_due(state: ClusterState) -> None:
    pol = parse_policy({"trigger": {"pending": {"longer_than_s": 30}}})
    big = state.pending[0]
    assert big.submitted_at is not None
    sim = SimEngine(state)
    sim.now = big.submitted_at + 5
    c = Controller(sim, pol, None, dry_run=True, clock=lambda: sim.now)
    c.cycle()
    assert c.next_due == big.submitted_at + 30  # not the next tick of a timer
    assert pending_due(state, big.submitted_at + 31, pol.trigger) is None  # already due: the trigger looked at it
    assert pending_due(state, 0.0, parse_policy({"trigger": {"pending": None}}).trigger) is None
    assert pending_due(state, 0.0, parse_policy({"trigger": {"pending": {"min_gpus": 64}}}).trigger) is None


class Watching:
    def __init__(self) -> None:
        self.waited: list[float] = []

    def wait(self, timeout: float) -> bool:
        self.waited.append(timeout)
        return True


def test_an_engine_that_watches_is_waited_on_and_the_others_are_polled() -> None:
    w = Watching()
    pause_until_change(w, 7.5)
    assert w.waited == [7.5]
    t = time.monotonic()
    pause_until_change(object(), 0.05)
    assert time.monotonic() - t >= 0.05
