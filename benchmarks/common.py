"""Shared benchmark plumbing: each benchmarks/bench_*.py exposes `run(quick: bool) -> list[Row]`.

`./scripts/bench.sh` imports them all, prints one table, and writes the rows as JSON (benchmarks/results/).
Targets are checked here and reported (ok / MISS), never asserted in unit tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass


@dataclass
class Row:
    area: str  # "core", "planner", "sim", "checkpoint", "controller", "kubernetes", ...
    name: str  # what was measured
    value: float
    unit: str  # "s", "ms", "GB/s", "%", "ratio", ...
    target: str = ""  # human-readable target, e.g. "<= 2 s"
    ok: bool | None = None  # None: no target
    baseline: str = ""  # what the ratio is against, measured in the same run
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@contextmanager
def timer() -> Iterator[Callable[[], float]]:
    t0 = time.perf_counter()
    end: list[float] = []
    yield lambda: (end[0] if end else time.perf_counter()) - t0
    end.append(time.perf_counter())


def median_time(fn: Callable[[], object], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]
