"""A state's running workloads as columns (NumPy arrays): gathered from the workloads, or carried over from the
previous state's columns for the workloads that are the same objects there.

Why carry: the live controller builds a state of ~40,000 pods every cycle, and between two cycles a few of them
change; the live model hands back the same (immutable) `Workload` objects for the rest. Gathering every
attribute of every workload again was the largest part of a warm cycle at 5,000 nodes (0.16 s of 0.45 s).
A workload's columns are a function of the object alone — workloads, requests and placements are frozen — so
they stay valid wherever the object does; only its node row is looked up again, by name, when the nodes
changed. tests/core/test_columns.py checks that carried columns equal gathered ones after any change.
The workloads are typed `Any` here: core/model.py imports this module, not the other way round.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from itertools import chain, repeat
from typing import Any, NamedTuple

import numpy as np

_PLACEMENTS_OF = operator.attrgetter("placements")
_NODE_OF = operator.attrgetter("node")
_GPUS_OF = operator.attrgetter("gpus")
_REQUEST_OF = operator.attrgetter("request")
_CAN_MOVE_OF = operator.attrgetter("can_move")
_GPU_MILLI = operator.attrgetter("gpu_milli")  # of a Request
_GPUS_PER_NODE = operator.attrgetter("gpus_per_node")
_CPU_MILLI = operator.attrgetter("cpu_milli")
_MEMORY_MIB = operator.attrgetter("memory_mib")
_NODE_COUNT = operator.attrgetter("node_count")


class Columns(NamedTuple):
    """The running workloads as columns. Per placed GPU: `rows` (node row), `gpu` (its index); per placement:
    `share` (milli per GPU), `prow` (node row), `cpu`, `mem`, `held` (GPUs it holds), `asked` (GPUs per node
    asked); per running workload: `n_placed` (placements), `node_count`, and its request's `w_milli`, `w_gpn`,
    `w_cpu`, `w_mem`."""

    rows: np.ndarray
    gpu: np.ndarray
    share: np.ndarray
    prow: np.ndarray
    cpu: np.ndarray
    mem: np.ndarray
    held: np.ndarray
    asked: np.ndarray
    n_placed: np.ndarray
    node_count: np.ndarray
    w_milli: np.ndarray
    w_gpn: np.ndarray
    w_cpu: np.ndarray
    w_mem: np.ndarray


def gather(run: Sequence[Any], node_index: Mapping[str, int]) -> Columns | None:
    """The columns of `run`, at C speed (`map` over attribute getters: a loop over 50,000 workloads in Python
    was a fifth of loading a large snapshot). None when a placement names a node not in `node_index`."""
    plist = list(chain.from_iterable(map(_PLACEMENTS_OF, run)))
    try:
        prow = np.fromiter(map(node_index.__getitem__, map(_NODE_OF, plist)), dtype=np.int64, count=len(plist))
    except KeyError:
        return None
    gpus = list(map(_GPUS_OF, plist))
    held = np.fromiter(map(len, gpus), dtype=np.int64, count=len(plist))
    n_placed = np.fromiter(map(len, map(_PLACEMENTS_OF, run)), dtype=np.int64, count=len(run))
    milli, gpn, cpu, mem, node_count = _request_columns(list(map(_REQUEST_OF, run)))
    return Columns(np.repeat(prow, held), np.fromiter(chain.from_iterable(gpus), dtype=np.int64,
                                                        count=int(held.sum())),
                   np.repeat(milli, n_placed), prow, np.repeat(cpu, n_placed), np.repeat(mem, n_placed), held,
                   np.repeat(gpn, n_placed), n_placed, node_count, milli, gpn, cpu, mem)


_REQUEST_FIELDS = operator.attrgetter("gpu_milli", "gpus_per_node", "cpu_milli", "memory_mib", "node_count")


def _request_columns(reqs: list[Any]) -> tuple[np.ndarray, ...]:
    """Per request: gpu_milli, gpus_per_node, cpu_milli, memory_mib, node_count. Where most workloads share a
    Request object (a snapshot's 50,000 jobs share a few dozen shapes), each distinct one is read once and the
    rows indexed by it; else each field is read of every request. The distinct ones are found by sorting the
    objects' ids (`np.unique`): a dict keyed by id took twice as long for 50,000 requests."""
    n = len(reqs)
    ids = np.fromiter(map(id, reqs), dtype=np.intp, count=n)
    _, first, which = np.unique(ids, return_index=True, return_inverse=True)
    if 4 * len(first) <= n:
        table = np.array([_REQUEST_FIELDS(reqs[i]) for i in first.tolist()], dtype=np.int64).reshape(-1, 5)
        return tuple(np.ascontiguousarray(table[which.reshape(-1), j]) for j in range(5))
    return tuple(np.fromiter(map(get, reqs), dtype=np.int64, count=n)
                 for get in (_GPU_MILLI, _GPUS_PER_NODE, _CPU_MILLI, _MEMORY_MIB, _NODE_COUNT))


def movable_flags(run: Sequence[Any]) -> np.ndarray:
    """`Workload.can_move` of each workload, as a bool array."""
    return np.fromiter(map(_CAN_MOVE_OF, run), dtype=bool, count=len(run))


def same_objects(now: Sequence[Any], before: Sequence[Any]) -> np.ndarray:
    """Per object of `now`, its index in `before` when the very same object is there, else -1. `before` must
    stay alive during the call (its objects' ids are then unique; none of `now`'s other objects can share one)."""
    where = dict(zip(map(id, before), range(len(before)), strict=True))
    return np.fromiter(map(where.get, map(id, now), repeat(-1)), dtype=np.int64, count=len(now))


def _ragged(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The indices of the segments [start, start + len) one after another."""
    ends = np.cumsum(lens)
    return np.repeat(starts - (ends - lens), lens) + np.arange(int(ends[-1]) if len(ends) else 0)


def carry(run: Sequence[Any], pos: np.ndarray, before: Columns, node_rows: np.ndarray | None,
          node_index: Mapping[str, int]) -> Columns | None:
    """The columns of `run`, taken from `before` (the columns of the previous state's running workloads) for
    each workload with `pos` >= 0 (its index there: the same object) and gathered for the others. `node_rows`:
    this state's row of each of the previous state's nodes (-1: gone), or None when the nodes are the same.
    Equal to `gather(run, node_index)`, None included (a placement on a node no longer there)."""
    n = len(run)
    old = pos >= 0
    src = pos[old]
    fresh = np.flatnonzero(~old)
    new = gather([run[i] for i in fresh.tolist()], node_index)
    if new is None:
        return None

    def per_workload(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = np.empty(n, dtype=np.int64)
        out[old] = a[src]
        out[fresh] = b
        return out

    n_placed = per_workload(before.n_placed, new.n_placed)
    # each workload's placements: its segment of the previous columns, or of the new ones (placed after them)
    start = per_workload(np.cumsum(before.n_placed) - before.n_placed,
                         np.cumsum(new.n_placed) - new.n_placed + len(before.prow))
    take = _ragged(start, n_placed)

    def per_placement(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.concatenate((a, b))[take]

    prow = per_placement(before.prow if node_rows is None else node_rows[before.prow], new.prow)
    if (prow < 0).any():
        return None
    held = per_placement(before.held, new.held)
    gfirst = per_placement(np.cumsum(before.held) - before.held, np.cumsum(new.held) - new.held + len(before.gpu))
    gpu = np.concatenate((before.gpu, new.gpu))[_ragged(gfirst, held)]
    return Columns(np.repeat(prow, held), gpu, per_placement(before.share, new.share), prow,
                   per_placement(before.cpu, new.cpu), per_placement(before.mem, new.mem), held,
                   per_placement(before.asked, new.asked), n_placed,
                   per_workload(before.node_count, new.node_count), per_workload(before.w_milli, new.w_milli),
                   per_workload(before.w_gpn, new.w_gpn), per_workload(before.w_cpu, new.w_cpu),
                   per_workload(before.w_mem, new.w_mem))


def rows_from(cols: Columns, movable: np.ndarray) -> np.ndarray:
    """`model.workload_row` of every running workload at once, from its columns and `can_move` flags (one Python
    pass per attribute at C speed, not one tuple built per workload). tests/core/test_model_rows.py checks it
    against `workload_row`."""
    prow, gcol, held, n_placed = cols.prow, cols.gpu, cols.held, cols.n_placed
    n = len(n_placed)
    first = np.cumsum(n_placed) - n_placed  # each workload's first placement (meaningless where it has none)
    fp = np.where(n_placed > 0, first, len(prow))  # none: the padding slot below
    held0 = np.append(held, 0)[fp]
    gfirst = np.append(np.cumsum(held) - held, 0)[fp]  # the first placement's first GPU in the GPU column
    out = np.empty((n, 9), dtype=np.int64)
    out[:, 0] = np.where(n_placed == 1, np.append(prow, -1)[fp], -1)
    out[:, 1] = cols.w_gpn
    out[:, 2] = np.where(held0 > 0, np.append(gcol, -1)[np.where(held0 > 0, gfirst, len(gcol))], -1)
    out[:, 3] = cols.w_milli
    out[:, 4] = cols.w_cpu
    out[:, 5] = cols.w_mem
    out[:, 6] = held0
    out[:, 7] = n_placed
    out[:, 8] = movable
    return out
