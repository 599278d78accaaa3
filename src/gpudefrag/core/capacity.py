"""The capacity model: one request shape, one fit function, one GPU picker, and one mutable working copy of a
cluster's free capacity with an undo log.

Everything that asks "does this fit, and where" runs over this module: the placement policies (`placement.
Cluster` is a `Capacity` with the policies' extra state), the planner's heuristic and exact search and its move
replay, and the simulator's repacker. A search changes the working copy in place and takes it back exactly:
`mark()` opens (or nests) a statement and returns a position in the undo log, `rollback(mark)` undoes every
change made since, `commit()` keeps the changes and forgets the log — the pattern KAI Scheduler calls a
*statement*. Callers that keep state of their own beside the arrays (which pod sits where) put its undo in the
same log with `note`, so one rollback restores both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .model import MILLI, ClusterState, Request


@dataclass(frozen=True, slots=True)
class Shape:
    """What a request asks of one node: `num_gpu` GPUs with `gpu_milli` each (a share when < 1000; sharing is
    one GPU), CPU, memory, and the GPU models allowed (empty = any). The placement policies call it a pod, the
    FGD measure a task type, the planner one part of a request."""

    num_gpu: int
    gpu_milli: int = MILLI
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: tuple[str, ...] = ()

    @property
    def is_sharing(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI

    @property
    def gpu_total(self) -> int:
        """Milli-GPU asked for in all."""
        return self.num_gpu * self.gpu_milli if self.num_gpu else 0

    @property
    def tag(self) -> int:
        """GPU-clustering tag index (0 = sharing, k = k GPUs, at most 8); -1 for a CPU-only shape."""
        if self.num_gpu == 0:
            return -1
        return 0 if self.is_sharing else min(self.num_gpu, 8)

    def shape(self) -> Shape:
        """The FGD task type of this shape: memory plays no part in the measure."""
        return Shape(self.num_gpu, self.gpu_milli if self.num_gpu else 0, self.cpu_milli, 0, self.gpu_models)

    @staticmethod
    def of(request: Request) -> Shape:
        """One node's share of a request."""
        return Shape(request.gpus_per_node, request.gpu_milli, request.cpu_milli, request.memory_mib,
                     request.gpu_models)


def model_allowed(models: Sequence[str], model: str | None) -> bool:
    """The GPU-model rule: a request that names models runs only on a node of one of them (empty = any)."""
    return not models or model in models


def room_fits(cpu_free: Any, mem_free: Any, shape: Shape) -> Any:
    """The CPU and memory half of the fit: enough of both free, per node (arrays) or on one node (numbers,
    e.g. what a node would have once some pods left it)."""
    return (cpu_free >= shape.cpu_milli) & (mem_free >= shape.memory_mib)


def share_counts(free: np.ndarray, gpu_milli: int) -> np.ndarray:
    """Per row (node): how many GPUs have at least `gpu_milli` free. What `gpus_fit` compares; a caller that
    asks for many requests of one share on one state (a diagnosis of every pending job) computes it once."""
    return (free >= gpu_milli).sum(axis=1)  # type: ignore[no-any-return]


def gpus_fit(free: np.ndarray, shape: Shape, counts: np.ndarray | None = None) -> np.ndarray:
    """The GPU half of the fit, per row (node): at least `num_gpu` GPUs with the share free (every row for a
    shape without GPUs). `counts`: `share_counts(free, shape.gpu_milli)` when the caller holds it."""
    if shape.num_gpu == 0:
        return np.ones(free.shape[0], dtype=bool)
    n = share_counts(free, shape.gpu_milli) if counts is None else counts
    return n >= shape.num_gpu  # type: ignore[no-any-return]


def fits(free: np.ndarray, cpu_free: np.ndarray, mem_free: np.ndarray, shape: Shape,
         counts: np.ndarray | None = None) -> np.ndarray:
    """Per row (node) of the arrays: CPU and memory free, and at least `num_gpu` GPUs with the share free.
    The one fit test; GPU models and eligibility are the caller's masks. `counts`: as for `gpus_fit`."""
    ok = room_fits(cpu_free, mem_free, shape)
    if shape.num_gpu > 0:
        ok &= gpus_fit(free, shape, counts)
    return ok  # type: ignore[no-any-return]


def fits_one(row: Sequence[int], cpu_free: int, mem_free: int, shape: Shape) -> bool:
    """`fits` for one node's row given as plain numbers (the planner's subset enumerations call it thousands
    of times on rows they edit in Python)."""
    if not room_fits(cpu_free, mem_free, shape):
        return False
    return shape.num_gpu == 0 or sum(1 for x in row if x >= shape.gpu_milli) >= shape.num_gpu


def fits_at(row: np.ndarray, gpus: Sequence[int], cpu_free: int, mem_free: int, shape: Shape) -> bool:
    """Does the shape fit on these GPUs of one node (their share free, and the node's CPU and memory)?"""
    return all(0 <= g < row.shape[0] and row[g] >= shape.gpu_milli for g in gpus) and bool(
        room_fits(cpu_free, mem_free, shape))


def pick_gpus(row: np.ndarray, shape: Shape, how: str = "best",
              rng: np.random.Generator | None = None) -> tuple[int, ...] | None:
    """The GPUs a shape takes on one node's free row, None if it does not fit. Whole GPUs: the lowest indices
    wholly free. A share: `best` = the fullest GPU that fits (the first by index among equals), `random` = any
    fitting GPU (needs `rng`), `empty` = the emptiest GPU (spreading)."""
    k = shape.num_gpu
    if k == 0:
        return ()
    idx = np.flatnonzero(row >= shape.gpu_milli)
    if len(idx) < k:
        return None
    if not shape.is_sharing:
        return tuple(int(i) for i in idx[:k])
    if how == "random":
        assert rng is not None
        return (int(idx[rng.integers(len(idx))]),)
    if how == "empty":
        return (int(idx[np.argmax(row[idx])]),)
    return (int(idx[np.argmin(row[idx])]),)


class Capacity:
    """A mutable working copy of free capacity: `free` (nodes × GPUs, milli-GPU, -1 = no such GPU),
    `cpu_free` (milli-cores) and `mem_free` (MiB) per node. `take` / `give` keep them consistent and, inside a
    statement (after `mark()`), log what they did so `rollback` can undo it."""

    __slots__ = ("_depth", "_log", "cpu_free", "free", "mem_free")

    def __init__(self, free: np.ndarray, cpu_free: np.ndarray, mem_free: np.ndarray) -> None:
        self.free = np.array(free, dtype=np.int32)
        self.cpu_free = np.array(cpu_free, dtype=np.int64)
        self.mem_free = np.array(mem_free, dtype=np.int64)
        self._log: list[tuple[int, int, tuple[int, ...], Shape] | Callable[[], None]] = []
        self._depth = 0

    @staticmethod
    def of_state(state: ClusterState) -> Capacity:
        """The free arrays of a snapshot, as they are (eligibility is the caller's mask)."""
        return Capacity(state.free_milli, state.cpu_free, state.mem_free)

    def copy(self) -> Capacity:
        """An independent copy of the arrays (no open statement)."""
        c = Capacity.__new__(Capacity)
        c.free, c.cpu_free, c.mem_free = self.free.copy(), self.cpu_free.copy(), self.mem_free.copy()
        c._log, c._depth = [], 0
        return c

    # ------------------------------------------------------------------ queries
    @property
    def n(self) -> int:
        return self.free.shape[0]

    def fits(self, shape: Shape) -> np.ndarray:
        """Nodes where the shape fits now (CPU, memory, GPUs); see `fits`."""
        return fits(self.free, self.cpu_free, self.mem_free, shape)

    def fits_on(self, node: int, shape: Shape) -> bool:
        return fits_one(self.free[node].tolist(), int(self.cpu_free[node]), int(self.mem_free[node]), shape)

    def fits_at(self, node: int, gpus: Sequence[int], shape: Shape) -> bool:
        """Whether the shape fits on these GPUs of `node` now (see `fits_at`)."""
        return fits_at(self.free[node], gpus, int(self.cpu_free[node]), int(self.mem_free[node]), shape)

    def room_on(self, node: int, shape: Shape) -> bool:
        """Whether `node` has the shape's CPU and memory free now."""
        return bool(room_fits(self.cpu_free[node], self.mem_free[node], shape))

    def pick(self, node: int, shape: Shape, how: str = "best",
             rng: np.random.Generator | None = None) -> tuple[int, ...] | None:
        """GPUs for the shape on `node` (see `pick_gpus`)."""
        return pick_gpus(self.free[node], shape, how, rng)

    @property
    def gpu_left(self) -> np.ndarray:
        """Total free milli-GPU per node."""
        return np.where(self.free > 0, self.free, 0).sum(axis=1)

    # ------------------------------------------------------------------ changes
    def take(self, node: int, gpus: tuple[int, ...], shape: Shape) -> None:
        """The shape starts using `gpus` of `node`. Raises ValueError (nothing changed) if it does not fit."""
        if len(gpus) != shape.num_gpu or len(set(gpus)) != len(gpus):
            raise ValueError(f"the shape asks for {shape.num_gpu} distinct GPUs, got {list(gpus)}")
        row = self.free[node]
        for g in gpus:
            if not 0 <= g < row.shape[0] or row[g] < shape.gpu_milli:
                raise ValueError(f"GPU {g} of node {node} has no room for {shape.gpu_milli} milli")
        if self.cpu_free[node] < shape.cpu_milli or self.mem_free[node] < shape.memory_mib:
            raise ValueError(f"node {node} lacks CPU or memory for the shape")
        self._change(node, gpus, shape, -1)

    def give(self, node: int, gpus: tuple[int, ...], shape: Shape) -> None:
        """The shape stops using `gpus` of `node` (undoes `take`)."""
        row = self.free[node]
        for g in gpus:
            if row[g] < 0 or row[g] + shape.gpu_milli > MILLI:
                raise ValueError(f"GPU {g} of node {node} would exceed a whole GPU")
        self._change(node, gpus, shape, +1)

    def _change(self, node: int, gpus: tuple[int, ...], shape: Shape, sign: int) -> None:
        for g in gpus:
            self.free[node, g] += sign * shape.gpu_milli
        self.cpu_free[node] += sign * shape.cpu_milli
        self.mem_free[node] += sign * shape.memory_mib
        if self._depth:
            self._log.append((sign, node, gpus, shape))
        self._changed(node)

    def _changed(self, node: int) -> None:
        """Hook for caches kept per node (the FGD measure)."""

    # ------------------------------------------------------------------ statements
    def mark(self) -> int:
        """Open a statement (or a nested one): the position to `rollback` to."""
        self._depth = 1
        return len(self._log)

    def note(self, undo: Callable[[], None]) -> None:
        """Log the undo of a change the caller made beside the arrays (only inside a statement)."""
        if self._depth:
            self._log.append(undo)

    def rollback(self, mark: int = 0) -> None:
        """Undo every change made since `mark`, newest first."""
        log = self._log
        while len(log) > mark:
            e = log.pop()
            if callable(e):
                e()
                continue
            sign, node, gpus, shape = e
            depth, self._depth = self._depth, 0  # the undo itself is not logged
            self._change(node, gpus, shape, -sign)
            self._depth = depth

    def commit(self) -> None:
        """Keep every change and close the statement."""
        self._log.clear()
        self._depth = 0
