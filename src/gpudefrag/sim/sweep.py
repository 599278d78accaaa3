"""Run a sweep's independent runs on local processes (the default) or as Ray tasks (`--ray ADDRESS|local`).

Every run is a pure function of its (picklable) description: the same description gives the same result
wherever it runs, so a sweep returns the same numbers with and without Ray, in the order of the runs. A run
that raises is retried (`retries` times, on Ray by Ray itself); one that still fails stops the sweep with a
`SweepError` naming it. `on_done` is called once per finished run, in completion order, from this process:
that is what moves the progress bar in both cases.

Ray is an optional extra (`pip install gpudefrag[ray]`): imported only when asked for. `--ray local` starts a
local Ray cluster for the sweep (and stops it after); an address joins a running cluster, whose workers must
have gpudefrag installed and see the trace files at the same paths.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, TypeVar

from ..errors import GpudefragError

T = TypeVar("T")
R = TypeVar("R")


class SweepError(GpudefragError):
    """A run of the sweep failed (after its retries)."""


def run_tasks(fn: Callable[[T], R], items: Sequence[T], *, workers: int | None = None, ray: str | None = None,
              retries: int = 1, on_done: Callable[[T, R], None] | None = None) -> list[R]:
    """`fn` over `items` (results in the order of `items`): in `workers` processes (default: the CPU count;
    1 = in this process), or as Ray tasks on the cluster at `ray` ("local": a local cluster of `workers` CPUs)."""
    if not items:
        return []
    if ray:
        return _on_ray(fn, items, ray, workers, retries, on_done)
    workers = max(1, min(workers or os.cpu_count() or 1, len(items)))
    results: list[Any] = [None] * len(items)
    if workers == 1:
        for i, it in enumerate(items):
            results[i] = _with_retries(fn, it, retries)
            if on_done:
                on_done(it, results[i])
        return results
    with ProcessPoolExecutor(max_workers=workers) as pool:
        tries = {i: 0 for i in range(len(items))}
        futs: dict[Future[R], int] = {pool.submit(fn, it): i for i, it in enumerate(items)}
        while futs:
            done, _ = wait(futs, return_when=FIRST_COMPLETED)
            for fut in done:
                i = futs.pop(fut)
                err = fut.exception()
                if err is not None:
                    if tries[i] < retries:
                        tries[i] += 1
                        futs[pool.submit(fn, items[i])] = i
                        continue
                    for f in futs:
                        f.cancel()
                    raise SweepError(f"run {i + 1} of {len(items)} failed after {retries + 1} tries: {items[i]!r}: "
                                     f"{type(err).__name__}: {err}") from err
                results[i] = fut.result()
                if on_done:
                    on_done(items[i], results[i])
    return results


def _with_retries(fn: Callable[[T], R], item: T, retries: int) -> R:
    for attempt in range(retries + 1):
        try:
            return fn(item)
        except Exception as e:
            if attempt == retries:
                raise SweepError(f"run failed after {retries + 1} tries: {item!r}: {type(e).__name__}: {e}") from e
    raise AssertionError("unreachable")


def _on_ray(fn: Callable[[T], R], items: Sequence[T], address: str, workers: int | None, retries: int,
            on_done: Callable[[T, R], None] | None) -> list[R]:
    try:
        import ray
    except ImportError:
        raise SweepError("--ray needs Ray: pip install 'gpudefrag[ray]'") from None
    started = not ray.is_initialized()
    if started:
        if address == "local":
            ray.init(num_cpus=workers or os.cpu_count() or 1, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        task = ray.remote(max_retries=retries, retry_exceptions=True)(fn)
        refs = {task.remote(it): i for i, it in enumerate(items)}
        results: list[Any] = [None] * len(items)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                i = refs[ref]
                try:
                    results[i] = ray.get(ref)
                except Exception as e:
                    for r in pending:
                        ray.cancel(r)
                    raise SweepError(f"run {i + 1} of {len(items)} failed on Ray after {retries + 1} tries: "
                                     f"{items[i]!r}: {type(e).__name__}: {e}") from e
                if on_done:
                    on_done(items[i], results[i])
        return results
    finally:
        if started:
            ray.shutdown()
