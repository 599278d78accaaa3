"""Loaders for the Alibaba cluster-trace-gpu-v2023 ("openb") node and pod lists.

The product does not ship the trace: the paths come from the command line. Every row is checked; a malformed
one raises `InputError` naming the file, the line, the column (1-based character position) and the field.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core.fragmentation import WorkloadMix
from ..core.model import MILLI
from ..core.placement import Cluster, Pod
from ..errors import InputError
from ..fileio import decode_text, read_input

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
# the five columns every pod list of the study has (the multigpu variants carry only these), and the others a
# list may add; a column outside both is an unknown layout (an error rather than a silently ignored field)
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_OPTIONAL = ("gpu_spec", "qos", "pod_phase", "pod_phrase", "creation_time", "deletion_time", "scheduled_time")
MAX_GPUS_PER_NODE = 64
_INT = re.compile(r"-?[0-9]+")
_NUM = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str | None


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    pod: Pod
    creation_time: float | None = None
    deletion_time: float | None = None
    scheduled_time: float | None = None  # empty for the trace's Pending pods
    phase: str = ""  # pod_phase: Running, Succeeded, Failed, Pending (or empty)


@dataclass(frozen=True)
class Trace:
    nodes: tuple[TraceNode, ...]
    pods: tuple[TracePod, ...]

    def cluster(self, mix: WorkloadMix | None = None) -> Cluster:
        """An empty cluster of the trace's nodes; the mix defaults to the authors' (95 % coverage, step 1)."""
        return Cluster.build(
            [n.name for n in self.nodes], [n.gpus for n in self.nodes], [n.model for n in self.nodes],
            [n.cpu_milli for n in self.nodes], [n.memory_mib for n in self.nodes],
            mix if mix is not None else self.mix(),
        )

    def mix(self) -> WorkloadMix:
        return fgd_mix([p.pod for p in self.pods])

    @property
    def capacity_milli(self) -> int:
        return sum(n.gpus for n in self.nodes) * MILLI


def cluster_from_snapshot(path: str | os.PathLike[str], mix: WorkloadMix | None = None) -> Cluster:
    """The cluster of a gpudefrag snapshot (its running workloads stay where they are, as background load)."""
    from ..snapshot import load_snapshot

    return Cluster.from_state(load_snapshot(path), mix)


def fgd_mix(pods: Sequence[Pod]) -> WorkloadMix:
    """The FGD authors' target workload: shapes kept one at a time (their experiments' podIncreaseStep=1)
    until they cover 95 % of pods, CPU-only pods included."""
    return WorkloadMix.from_shapes((p.shape() for p in pods), coverage=0.95, step=1, include_cpu_only=True)


class _Rows:
    """CSV rows with their line numbers and the column where each field starts."""

    def __init__(self, path: Path, required: Sequence[str], optional: Sequence[str] | None = None) -> None:
        self.path = path
        self.source = str(path)
        self.text = decode_text(read_input(path, "trace"), self.source)  # regular file, size limit, UTF-8
        lines = self.text.splitlines()
        if not lines:
            raise InputError(self.source, "line 1", "empty file: expected a header row")
        self.header = next(csv.reader([lines[0]]))
        self.starts = [1 + sum(len(c) + 1 for c in self.header[:i]) for i in range(len(self.header))]
        for i, c in enumerate(self.header):
            known = optional is None or c in required or c in optional
            if not known or c in self.header[:i]:
                what = "duplicate column" if known else "unknown column"
                expected = ", ".join((*required, *(optional or ())))
                raise InputError(self.source, f"line 1, column {self.starts[i]} ({c})",
                                 f"{what} {c!r}; known columns: {expected}")
        missing = [c for c in required if c not in self.header]
        if missing:
            raise InputError(self.source, "line 1", f"missing column(s): {', '.join(missing)}")
        self.index = {c: i for i, c in enumerate(self.header)}
        self.lines = lines

    def __iter__(self) -> Iterator[tuple[int, list[str], list[int]]]:
        for lineno, line in enumerate(self.lines[1:], start=2):
            if not line.strip():
                continue
            try:
                fields = next(csv.reader(io.StringIO(line), strict=True))
            except csv.Error as e:
                raise InputError(self.source, f"line {lineno}", f"unreadable CSV: {e}") from None
            if len(fields) != len(self.header):
                raise InputError(self.source, f"line {lineno}, column {len(line) + 1}",
                                 f"expected {len(self.header)} fields, got {len(fields)}")
            cols, pos = [], 1
            for f in fields:
                cols.append(pos)
                pos += len(f) + 1
            yield lineno, fields, cols

    def get(self, lineno: int, fields: list[str], cols: list[int], name: str) -> tuple[str, str]:
        """The raw field and where it is; an optional column that the file lacks reads as empty."""
        i = self.index.get(name)
        if i is None:
            return "", f"line {lineno}"
        return fields[i], f"line {lineno}, column {cols[i]} ({name})"

    def integer(self, lineno: int, fields: list[str], cols: list[int], name: str, lo: int, hi: int) -> int:
        raw, where = self.get(lineno, fields, cols, name)
        if not _INT.fullmatch(raw):  # int() would also take " 5", "1_000" and non-ASCII digits
            raise InputError(self.source, where, f"expected an integer, got {raw!r}")
        v = int(raw) if len(raw) <= 20 else None  # int() of 5,000 digits raises (Python's int-str limit)
        if v is None or not lo <= v <= hi:
            raise InputError(self.source, where, f"must be in {lo}..{hi}, got {raw[:24]}")
        return v

    def time(self, lineno: int, fields: list[str], cols: list[int], name: str) -> float | None:
        if name not in self.index:
            return None
        raw, where = self.get(lineno, fields, cols, name)
        if raw == "":
            return None
        if not _NUM.fullmatch(raw):
            raise InputError(self.source, where, f"expected a number of seconds, got {raw!r}")
        v = float(raw)
        if not 0 <= v < math.inf:
            raise InputError(self.source, where, f"must be a finite number >= 0, got {raw[:24]}")
        return v


def load_nodes(path: str | os.PathLike[str]) -> tuple[TraceNode, ...]:
    rows = _Rows(Path(path), NODE_COLUMNS)
    out: list[TraceNode] = []
    seen: set[str] = set()
    for lineno, f, c in rows:
        name, where = rows.get(lineno, f, c, "sn")
        if not name:
            raise InputError(rows.source, where, "empty node name")
        if name in seen:
            raise InputError(rows.source, where, f"duplicate node name {name!r}")
        seen.add(name)
        cpu = rows.integer(lineno, f, c, "cpu_milli", 0, 10**9)
        mem = rows.integer(lineno, f, c, "memory_mib", 0, 10**12)
        gpus = rows.integer(lineno, f, c, "gpu", 0, MAX_GPUS_PER_NODE)
        model, _ = rows.get(lineno, f, c, "model")
        out.append(TraceNode(name, cpu, mem, gpus, model or None))
    if not out:
        raise InputError(rows.source, "line 2", "no nodes")
    if not any(n.gpus for n in out):
        raise InputError(rows.source, f"line 1, column {rows.starts[rows.index['gpu']]} (gpu)",
                         "no node has a GPU: there is nothing to place GPU pods on")
    return tuple(out)


def load_pods(path: str | os.PathLike[str], models: Collection[str] | None = None, *,
              times: bool = False) -> tuple[TracePod, ...]:
    """The pods of a list with the five study columns at least (gpu_spec, qos, phase and times optional).
    With `models` (the GPU models the cluster has), a `gpu_spec` naming a model outside it is an error: such a
    pod could never be placed, and the list was most likely meant for another cluster. With `times` (a replay in
    time), every pod must have a creation time."""
    rows = _Rows(Path(path), POD_COLUMNS, POD_OPTIONAL)
    if times and "creation_time" not in rows.index:
        raise InputError(rows.source, "line 1", "missing column: creation_time (a replay in time needs it)")
    out: list[TracePod] = []
    interned: dict[Pod, Pod] = {}
    first: dict[str, int] = {}  # pod name -> the line it was first seen on
    for lineno, f, c in rows:
        name, where = rows.get(lineno, f, c, "name")
        if not name:
            raise InputError(rows.source, where, "empty pod name")
        if name in first:
            raise InputError(rows.source, where, f"duplicate pod name {name!r} (first on line {first[name]})")
        first[name] = lineno
        cpu = rows.integer(lineno, f, c, "cpu_milli", 0, 10**9)
        mem = rows.integer(lineno, f, c, "memory_mib", 0, 10**12)
        k = rows.integer(lineno, f, c, "num_gpu", 0, MAX_GPUS_PER_NODE)
        milli = rows.integer(lineno, f, c, "gpu_milli", 0, MILLI)
        _, mwhere = rows.get(lineno, f, c, "gpu_milli")
        if k == 0 and milli != 0:
            raise InputError(rows.source, mwhere, f"a pod without GPUs must ask for 0 milli-GPU, got {milli}")
        if k > 0 and milli == 0:
            raise InputError(rows.source, mwhere, "a pod with GPUs must ask for more than 0 milli-GPU")
        if k > 1 and milli != MILLI:
            raise InputError(rows.source, mwhere, f"a share below {MILLI} is only valid with one GPU")
        spec, swhere = rows.get(lineno, f, c, "gpu_spec")
        allowed = tuple(m for m in spec.split("|") if m)
        if models is not None:
            unknown = [m for m in allowed if m not in models]
            if unknown:
                raise InputError(rows.source, swhere, f"GPU model {unknown[0]!r} is on no node of the cluster "
                                 f"(models: {', '.join(sorted(models)) or 'none'})")
        pod = Pod(k, milli if k else 0, cpu, mem, allowed)
        pod = interned.setdefault(pod, pod)
        created = rows.time(lineno, f, c, "creation_time")
        if times and created is None:
            raise InputError(rows.source, rows.get(lineno, f, c, "creation_time")[1], "empty creation time")
        deleted = rows.time(lineno, f, c, "deletion_time")
        if created is not None and deleted is not None and deleted < created:
            _, dwhere = rows.get(lineno, f, c, "deletion_time")
            raise InputError(rows.source, dwhere, f"deletion ({deleted}) before creation ({created})")
        scheduled = rows.time(lineno, f, c, "scheduled_time")
        if scheduled is not None and ((created is not None and scheduled < created)
                                      or (deleted is not None and scheduled > deleted)):
            _, swhere2 = rows.get(lineno, f, c, "scheduled_time")
            raise InputError(rows.source, swhere2, f"scheduled ({scheduled}) outside creation ({created}) .. "
                             f"deletion ({deleted})")
        phase = rows.get(lineno, f, c, "pod_phase")[0] or rows.get(lineno, f, c, "pod_phrase")[0]
        out.append(TracePod(name, pod, created, deleted, scheduled, phase))
    if not out:
        raise InputError(rows.source, "line 2", "no pods")
    return tuple(out)


def load_trace(nodes: str | os.PathLike[str], pods: str | os.PathLike[str]) -> Trace:
    ns = load_nodes(nodes)
    return Trace(ns, load_pods(pods, {n.model for n in ns if n.model}))
