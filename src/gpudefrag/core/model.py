"""The cluster model: nodes, workloads, requests and an immutable ClusterState.

Pure data. Units: GPU share in milli-GPU (1000 = one whole GPU, so GPU-sharing workloads are expressible),
CPU in milli-cores, memory in MiB, times in seconds since the epoch of the snapshot's clock, sizes in bytes.
The engines (Slurm, Kubernetes, the simulator) and the snapshot loader produce these; everything else reads them.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from itertools import compress, repeat
from types import MappingProxyType

import msgspec
import numpy as np

from .columns import Columns, carry, gather, movable_flags, rows_from, same_objects

MILLI = 1000  # milli-GPU in one whole GPU
MAX_AMOUNT = 2**40  # per node or request, CPU millicores and memory MiB: sums over a million nodes fit in int64
CARRIED_FILTERS = 4  # a state built from the previous one carries the verdicts of at most this many filters
NOT_TRACKED = np.iinfo(np.int64).max // 4  # CPU or memory free on a node that does not track it (never a limit)

# A workload label that says "never move this" (set by the Kubernetes converter for pods whose owner gpudefrag
# cannot replace, or by the pod itself); the snapshot's own `movable: false` says the same.
MOVABLE_LABEL = "gpudefrag.io/movable"

# Why a workload may not move (the snapshot's `movable_reason`): stable codes for reports.
IMMOVABLE_REASONS = ("pinned", "not-checkpointable", "gang-member", "statefulset", "daemonset", "job-owner",
                     "policy", "other")

_MIG = re.compile(r"^(?:nvidia\.com/)?(?:mig-)?([1-8])g\.(\d{1,3})gb(\+me|\.me)?$")


def mig_profile(text: str) -> str:
    """The canonical form of a MIG profile ("3g.40gb"), from any of the spellings in use
    (`nvidia.com/mig-3g.40gb`, `mig-3g.40gb`, `3g.40gb`). Raises ValueError for anything else."""
    m = _MIG.match(text.strip().lower())
    if m is None:
        raise ValueError(f"not a MIG profile: {text!r} (e.g. nvidia.com/mig-3g.40gb)")
    return f"{m.group(1)}g.{m.group(2)}gb" + ("+me" if m.group(3) else "")


def same_mig_profile(a: str, b: str) -> bool:
    """Whether two spellings name one profile (unparseable names compare as plain strings)."""
    try:
        return mig_profile(a) == mig_profile(b)
    except ValueError:
        return a == b


class _Value(msgspec.Struct, frozen=True, gc=False):
    """The base of the model's values (nodes, workloads, requests, placements, ...): frozen, compared and hashed
    by their fields, built in C. A large snapshot or a Kubernetes cluster makes 50,000 workloads, requests and
    placements at a time; a slotted frozen dataclass set each field through `object.__setattr__` (3 µs a
    workload, most of a 10,000-node snapshot's conversion), a struct takes a fraction of that. Change one with
    `msgspec.structs.replace`, list its fields with `msgspec.structs.fields`. `gc=False`: the collector need not
    track them; they hold strings, numbers, tuples and dicts of those, never a cycle."""


class WorkloadState(StrEnum):
    RUNNING = "running"
    PENDING = "pending"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Taint(_Value):
    key: str
    value: str = ""
    effect: TaintEffect = TaintEffect.NO_SCHEDULE


class Toleration(_Value):
    """Kubernetes semantics: empty key with operator Exists tolerates everything."""

    key: str = ""
    operator: str = "Equal"  # "Equal" | "Exists"
    value: str = ""
    effect: str = ""  # "" tolerates every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


class Versions(_Value):
    """The software and hardware a checkpoint was taken with, or a node offers.

    Node fields describe what the node provides; a workload's fields describe what it runs with.
    """

    gpu_model: str | None = None
    gpu_count: int | None = None
    driver: str | None = None
    cuda: str | None = None
    engine: str | None = None  # e.g. "vllm 0.6.3" / "pytorch 2.4.0"
    model: str | None = None  # e.g. "llama-3-8b@rev3"
    cpu_arch: str | None = None
    kernel: str | None = None
    checkpointer: str | None = None  # e.g. "criu 4.1.1"


class Node(_Value):
    name: str
    gpu_count: int
    gpu_model: str | None = None
    gpu_allocatable: int | None = None  # None = gpu_count; 0 = device plugin never registered
    cpu_milli: int = 0  # 0 = not tracked
    memory_mib: int = 0  # 0 = not tracked
    driver_version: str | None = None
    cuda_version: str | None = None
    cpu_arch: str | None = None
    labels: Mapping[str, str] = msgspec.field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    schedulable: bool = True  # False: cordoned / drained
    mig_devices: Mapping[str, int] = msgspec.field(default_factory=dict)  # MIG profile -> count exposed
    node_group: str | None = None  # autoscaling group / pool
    partitions: tuple[str, ...] = ()  # Slurm partitions (empty: any)
    checkpointer_version: str | None = None  # e.g. "criu 4.1.1": what a restore on this node runs
    kernel: str | None = None  # kernel release (`uname -r`), e.g. "6.1.0-18-amd64": a CRIU image records its own

    @property
    def usable_gpus(self) -> int:
        """GPUs a whole-GPU request can be given: those the device plugin advertises."""
        alloc = self.gpu_count if self.gpu_allocatable is None else self.gpu_allocatable
        return max(0, min(alloc, self.gpu_count))

    @property
    def has_mig(self) -> bool:
        return any(v > 0 for v in self.mig_devices.values())

    def mig_offered(self, profile: str) -> int:
        """How many slices of a MIG profile the node exposes (any spelling of the profile)."""
        return sum(v for k, v in self.mig_devices.items() if same_mig_profile(k, profile))

    def versions(self) -> Versions:
        return Versions(
            gpu_model=self.gpu_model,
            gpu_count=self.gpu_count,
            driver=self.driver_version,
            cuda=self.cuda_version,
            cpu_arch=self.cpu_arch,
            kernel=self.kernel,
            checkpointer=self.checkpointer_version,
        )


class Placement(_Value):
    """One part of a workload: the node it runs on and the GPU indices it holds there."""

    node: str
    gpus: tuple[int, ...]


class Request(_Value):
    """The shape of what a job asks for: `gpus_per_node` GPUs of `gpu_milli` each on `node_count` nodes."""

    gpus_per_node: int
    node_count: int = 1
    gpu_milli: int = MILLI
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: tuple[str, ...] = ()  # allowed models; empty = any
    node_selector: Mapping[str, str] = msgspec.field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    partition: str | None = None
    mig_profile: str | None = None  # a request for MIG slices instead of whole GPUs

    @property
    def gpu_milli_total(self) -> int:
        return self.gpus_per_node * self.node_count * self.gpu_milli

    @property
    def gpus_total(self) -> int:
        return self.gpus_per_node * self.node_count

    def label(self) -> str:
        share = "" if self.gpu_milli >= MILLI else f"×{self.gpu_milli / MILLI:.2f}"
        nodes = f"×{self.node_count} nodes" if self.node_count > 1 else ""
        model = f" {'|'.join(self.gpu_models)}" if self.gpu_models else ""
        return f"{self.gpus_per_node} GPU{share}{nodes}{model}"


class Workload(_Value):
    id: str
    request: Request
    state: WorkloadState = WorkloadState.RUNNING
    name: str = ""
    namespace: str = "default"  # Kubernetes namespace or Slurm account
    user: str = ""
    priority: int = 0
    labels: Mapping[str, str] = msgspec.field(default_factory=dict)
    placements: tuple[Placement, ...] = ()
    checkpoint_bytes: int = 0
    last_checkpoint_at: float | None = None
    submitted_at: float | None = None
    started_at: float | None = None
    expected_end_at: float | None = None
    versions: Versions = msgspec.field(default_factory=Versions)
    scheduler_reason: str = ""  # what the scheduler itself says (Slurm reason, PodScheduled message)
    movable: bool = True  # False: never moved by any entry point (the snapshot's `movable`)
    movable_reason: str = ""  # why not (one of IMMOVABLE_REASONS), when movable is False

    @property
    def can_move(self) -> bool:
        """May any plan move it? Not when marked immovable, labelled so, or spread over several nodes."""
        return self.movable and self.labels.get(MOVABLE_LABEL) != "false" and not self.is_multi_node

    @property
    def is_running(self) -> bool:
        return self.state is WorkloadState.RUNNING

    @property
    def is_multi_node(self) -> bool:
        p = self.placements  # asked of every running workload at every decision: one placement needs no set
        return self.request.node_count > 1 or (len(p) > 1 and len({x.node for x in p}) > 1)

    @property
    def gpu_milli_total(self) -> int:
        return self.request.gpu_milli_total

    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.node for p in self.placements))


class Quota(_Value):
    """A GPU quota on a namespace (Kubernetes ResourceQuota) or account (Slurm GrpTRES).

    `charged_at` says what `gpu_used` counts. "create" (Kubernetes): a ResourceQuota charges a pod when it is
    created, so `gpu_used` already includes every pod that exists, Pending ones too, and a quota never holds back
    a pod that exists: it only refuses to create pods (`FailedCreate ... exceeded quota` on their owner). "start"
    (Slurm GrpTRES, the simulator): a job is charged when it starts, so `gpu_used` counts running jobs and a
    pending job waits while `used + request > limit`."""

    namespace: str
    gpu_limit: int  # whole GPUs
    gpu_used: int | None = None  # None: derived from the workloads (running ones; pending ones too for "create")
    charged_at: str = "start"  # "create" | "start"


class NodeGroup(_Value):
    """An autoscaling group: how many nodes it has now and may grow to."""

    name: str
    current: int
    maximum: int
    gpu_model: str | None = None
    gpus_per_node: int = 0


class ModelError(ValueError):
    """A ClusterState that contradicts itself; `path` names the offending field (workloads[3].placements[0])."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


@dataclass(frozen=True)
class _NodeArrays:
    """What a state reads of each of its nodes, as read-only arrays, and the name index."""

    gpu_count: np.ndarray
    usable: np.ndarray
    cpu: np.ndarray
    mem: np.ndarray
    mig: np.ndarray
    schedulable: np.ndarray
    index: Mapping[str, int]
    cpu_cap: np.ndarray  # `cpu` with NOT_TRACKED where the node does not track it (0): an empty node's room
    mem_cap: np.ndarray


_STATE_OF = operator.attrgetter("state")
_NAME_OF = operator.attrgetter("name")
_ID_OF = operator.attrgetter("id")
_REQUEST_OF = operator.attrgetter("request")
_PLACEMENTS_OF = operator.attrgetter("placements")
_SCHEDULABLE_OF = operator.attrgetter("schedulable")
_ALLOCATABLE_OF = operator.attrgetter("gpu_allocatable")
_MIG_OF = operator.attrgetter("mig_devices")
_GPU_COUNT_OF = operator.attrgetter("gpu_count")
_CPU_OF = operator.attrgetter("cpu_milli")
_MEMORY_OF = operator.attrgetter("memory_mib")
_last_nodes: list[tuple[tuple[Node, ...], _NodeArrays]] = []  # the one tuple of nodes `_node_arrays` keeps


def _id_rows(workloads: Sequence[Workload]) -> dict[str, int]:
    """Each workload's row by id (a repeated id keeps its last row)."""
    return dict(zip(map(_ID_OF, workloads), range(len(workloads)), strict=True))


def _unique_id_rows(workloads: Sequence[Workload]) -> dict[str, int] | None:
    """`_id_rows`, or None when an id is empty or repeated. The checks that need the ids unique build the index
    this way and keep it as `workload_index`, which would otherwise walk the ids again."""
    index = _id_rows(workloads)
    return index if len(index) == len(workloads) and all(index) else None


def running_mask(workloads: Sequence[Workload]) -> np.ndarray:
    """Which of the workloads are running, as a bool array (at C speed): `ClusterState.running`'s rule, and the
    converters' when they look for the ones that are not."""
    return np.fromiter(map(operator.is_, map(_STATE_OF, workloads), repeat(WorkloadState.RUNNING)), dtype=bool,
                       count=len(workloads))


def _node_arrays(nodes: tuple[Node, ...]) -> _NodeArrays:
    """The `_NodeArrays` of a tuple of nodes, kept for the last tuple asked about (the tuple is immutable, its
    nodes frozen). States made one after another on one tuple of nodes share them: a replay in time builds a
    state per decision (`Cluster.to_state` hands each the same tuple), and walking 1,200 nodes' fields anew for
    each was a tenth of the decision."""
    last = _last_nodes[-1] if _last_nodes else None  # one read: another thread may replace it meanwhile
    if last is not None and last[0] is nodes:
        return last[1]
    n = len(nodes)
    count, cpu, mem = (np.fromiter(map(get, nodes), dtype=np.int64, count=n)
                       for get in (_GPU_COUNT_OF, _CPU_OF, _MEMORY_OF))
    schedulable = np.fromiter(map(_SCHEDULABLE_OF, nodes), dtype=bool, count=n)
    # Node.usable_gpus and Node.has_mig, read only where they can differ from the plain case (a node whose
    # allocatable is given; one with MIG devices listed): 10,000 property calls were a tenth of building a state
    usable = np.maximum(count, 0)
    alloc = np.fromiter(map(operator.is_not, map(_ALLOCATABLE_OF, nodes), repeat(None)), dtype=bool, count=n)
    for i in np.flatnonzero(alloc).tolist():
        usable[i] = nodes[i].usable_gpus
    mig = np.fromiter(map(len, map(_MIG_OF, nodes)), dtype=bool, count=n)
    for i in np.flatnonzero(mig).tolist():
        mig[i] = nodes[i].has_mig
    cols = [count.astype(np.int32), usable.astype(np.int32), cpu, mem, mig, schedulable,
            np.where(cpu > 0, cpu, NOT_TRACKED), np.where(mem > 0, mem, NOT_TRACKED)]
    for a in cols:
        a.flags.writeable = False
    got = _NodeArrays(*cols[:6], MappingProxyType({nd.name: i for i, nd in enumerate(nodes)}), *cols[6:])
    if isinstance(nodes, tuple):  # (a list could change under the cache)
        _last_nodes[:] = [(nodes, got)]
    return got


def _state_arrays(nodes: tuple[Node, ...], used: np.ndarray, cpu_used: np.ndarray,
                  mem_used: np.ndarray) -> dict[str, np.ndarray]:
    """A state's arrays from what its running workloads use (`used`: nodes × GPUs milli-GPU; CPU and memory per
    node): free share per GPU (-1 where the GPU does not exist or is unusable), free CPU and memory (a huge number
    where the node does not track it). The one rule of `ClusterState.build` and `ClusterState.from_totals`."""
    g = used.shape[1]
    of = _node_arrays(nodes)
    usable, cpu, mem = of.usable, of.cpu, of.mem
    cols = np.arange(g, dtype=np.int32)[None, :]
    free = np.where(cols < usable[:, None], MILLI - used, -1).astype(np.int32)
    return {
        "gpu_count": of.gpu_count,
        "usable": usable,
        "used": used,
        "free": free,
        "cpu_free": np.where(cpu > 0, cpu - cpu_used, NOT_TRACKED),
        "mem_free": np.where(mem > 0, mem - mem_used, NOT_TRACKED),
    }


def workload_row(w: Workload, node_index: Mapping[str, int]) -> tuple[int, ...]:
    """One running workload's row of `ClusterState.running_rows` (the columns are named there)."""
    p, r = w.placements, w.request
    return (node_index[p[0].node] if len(p) == 1 else -1, r.gpus_per_node, p[0].gpus[0] if p and p[0].gpus else -1,
            r.gpu_milli, r.cpu_milli, r.memory_mib, len(p[0].gpus) if p else 0, len(p), int(w.can_move))


@dataclass(frozen=True, eq=False)
class ClusterState:
    """An immutable picture of a cluster at one instant.

    The derived arrays (`free_milli`, ...) are computed once, on first use, with NumPy; index i of every array is
    `nodes[i]`. GPUs beyond a node's count (or beyond what its device plugin advertises) are -1 in `free_milli`.
    """

    nodes: tuple[Node, ...]
    workloads: tuple[Workload, ...] = ()
    quotas: tuple[Quota, ...] = ()
    node_groups: tuple[NodeGroup, ...] = ()
    now: float = 0.0
    name: str = "cluster"
    scheduler: str = ""  # "slurm" | "kubernetes" | "" (unknown): whose pending reasons the workloads carry

    @staticmethod
    def from_totals(
        nodes: Sequence[Node],
        workloads: Iterable[Workload],
        used: np.ndarray,
        cpu_used: np.ndarray,
        mem_used: np.ndarray,
        *,
        now: float = 0.0,
        name: str = "cluster",
        running_rows: np.ndarray | None = None,
        verdicts: tuple[Callable[[Workload], bool], np.ndarray] | None = None,
    ) -> ClusterState:
        """A state whose caller already holds what its running workloads use per GPU and per node (`used`: nodes
        × GPUs milli-GPU, `cpu_used`, `mem_used`), as the simulator's capacity arrays do (`Cluster.to_state`,
        asked at every decision of a replay). The arrays are made from those totals by `build`'s own rule
        (`_state_arrays`) instead of being summed again over thousands of workloads, and the checks are those the
        totals allow: unique non-empty ids, no GPU over 1000 milli, no CPU or memory over a node's capacity. The
        caller guarantees that the totals are its workloads' sums (tests/sim/test_dynamic.py compares the two).
        `running_rows`: `workload_row` of each running workload in order, when the caller keeps them (the
        replay's workloads change little between decisions). `verdicts`: a filter and its verdict on each running
        workload in order, when the caller keeps them too (a verdict stays while the workload object does): then
        `may_move(filter)` combines them with the flags instead of asking the filter of every workload again."""
        state = ClusterState(nodes=tuple(nodes), workloads=tuple(workloads), now=now, name=name)
        index = _unique_id_rows(state.workloads)
        if index is None:
            state._validate_exactly()  # names the duplicate or empty id
        arrays = _state_arrays(state.nodes, np.asarray(used, dtype=np.int32), np.asarray(cpu_used, dtype=np.int64),
                               np.asarray(mem_used, dtype=np.int64))
        if ((arrays["used"] > MILLI) | (arrays["used"] < 0)).any() or (arrays["cpu_free"] < 0).any() \
                or (arrays["mem_free"] < 0).any():
            state._validate_exactly()  # names the workload that overfills a GPU, CPU or memory
            raise ModelError("workloads", "the usage totals exceed a node's capacity")
        state.__dict__["_arrays"] = arrays  # the cached_property's own slot: what `_arrays` would compute
        if index is not None:
            state.__dict__["workload_index"] = MappingProxyType(index)
        if running_rows is not None:
            if running_rows.shape != (len(state.running), 9):
                raise ModelError("running_rows", f"{running_rows.shape} rows for {len(state.running)} running "
                                 "workloads")
            state.__dict__["running_rows"] = running_rows
        if verdicts is not None:
            movable, said = verdicts
            if said.shape != (len(state.running),):
                raise ModelError("verdicts", f"{said.shape} verdicts for {len(state.running)} running workloads")
            state.memo[("may_move", movable)] = state.may_move() & said.astype(bool)
        return state

    @staticmethod
    def build(
        nodes: Iterable[Node],
        workloads: Iterable[Workload] = (),
        *,
        quotas: Iterable[Quota] = (),
        node_groups: Iterable[NodeGroup] = (),
        now: float = 0.0,
        name: str = "cluster",
        scheduler: str = "",
        previous: ClusterState | None = None,
    ) -> ClusterState:
        """Validate and build. Raises ModelError naming the offending entry. `previous`: a state this one mostly
        shares its workload objects with (see `validate`)."""
        state = ClusterState(
            nodes=tuple(nodes),
            workloads=tuple(workloads),
            quotas=tuple(quotas),
            node_groups=tuple(node_groups),
            now=now,
            name=name,
            scheduler=scheduler,
        )
        state.validate(previous)
        return state

    # ---------------------------------------------------------------- indexes
    @cached_property
    def node_index(self) -> Mapping[str, int]:
        return _node_arrays(self.nodes).index

    @cached_property
    def workload_index(self) -> Mapping[str, int]:
        return MappingProxyType(_id_rows(self.workloads))

    def node(self, name: str) -> Node:
        return self.nodes[self.node_index[name]]

    def workload(self, wid: str) -> Workload:
        return self.workloads[self.workload_index[wid]]

    @cached_property
    def running(self) -> tuple[Workload, ...]:
        # `is_running` for every workload, at C speed (a replay builds a state of 4,000 jobs per decision)
        return tuple(compress(self.workloads, self._is_running.tolist()))

    @cached_property
    def _is_running(self) -> np.ndarray:
        """`running_mask` of the workloads, kept: a state built from this one maps its workloads through it."""
        return running_mask(self.workloads)

    def _not_running(self, state: WorkloadState) -> list[Workload]:
        """The workloads in `state` (not RUNNING), found among those `_is_running` leaves out (a few hundred of
        50,000): a second pass over every workload's state was a tenth of diagnosing a large snapshot."""
        return [w for w in compress(self.workloads, (~self._is_running).tolist()) if w.state is state]

    @cached_property
    def pending(self) -> tuple[Workload, ...]:
        """Pending workloads, oldest first (submission time, then id)."""
        p = self._not_running(WorkloadState.PENDING)
        p.sort(key=lambda w: (w.submitted_at if w.submitted_at is not None else float("inf"), w.id))
        return tuple(p)

    @cached_property
    def pending_gpu(self) -> tuple[Workload, ...]:
        """Pending workloads that ask for GPUs (or a MIG slice), oldest first: what diagnose, the dashboard's
        count and the metrics look at (a pending CPU-only pod is none of gpudefrag's business)."""
        return tuple(w for w in self.pending if w.request.gpus_per_node > 0 or w.request.mig_profile is not None)

    @cached_property
    def workloads_on(self) -> Mapping[str, tuple[Workload, ...]]:
        by: dict[str, list[Workload]] = {n.name: [] for n in self.nodes}
        for w in self.running:
            for node in w.nodes():
                by[node].append(w)
        return MappingProxyType({k: tuple(v) for k, v in by.items()})

    # ---------------------------------------------------------------- arrays
    @cached_property
    def max_gpus(self) -> int:
        counts = _node_arrays(self.nodes).gpu_count
        return int(counts.max()) if len(counts) else 0

    @cached_property
    def _arrays(self) -> dict[str, np.ndarray]:
        n, g = len(self.nodes), max(self.max_gpus, 1)
        used = np.zeros((n, g), dtype=np.int32)
        cpu_used = np.zeros(n, dtype=np.int64)
        mem_used = np.zeros(n, dtype=np.int64)
        rr, cc, share, prow, pcpu, pmem = self._placed
        if len(rr):
            np.add.at(used, (rr, cc), share.astype(np.int32))
        if len(prow):
            np.add.at(cpu_used, prow, pcpu)
            np.add.at(mem_used, prow, pmem)
        return _state_arrays(self.nodes, used, cpu_used, mem_used)

    @cached_property
    def _placed(self) -> tuple[np.ndarray, ...]:
        """The running workloads' placements as arrays: (node row, GPU index, share) per placed GPU and (node row,
        CPU, memory) per placement. validate() walks the placements anyway and leaves these behind, so the
        free-capacity arrays do not walk 50,000 workloads a second time."""
        c = self._columns
        assert c is not None, "placements on unknown nodes: validate() refuses such a state"
        return c.rows, c.gpu, np.repeat(c.share, c.held), c.prow, c.cpu, c.mem

    @cached_property
    def _columns(self) -> Columns | None:
        """The running workloads' requests and placements as columns, gathered once per state (or carried over
        from the previous state by `build(previous=...)`). validate(), the free-capacity arrays and
        `running_rows` share them. None when a placement names an unknown node."""
        return gather(self.running, self.node_index)

    @cached_property
    def _can_move(self) -> np.ndarray:
        """`Workload.can_move` per running workload (carried over like `_columns`)."""
        return movable_flags(self.running)

    @property
    def free_milli(self) -> np.ndarray:
        """(nodes × max_gpus) free share per GPU in milli-GPU; -1 where the GPU does not exist or is unusable."""
        return self._arrays["free"]

    @property
    def used_milli(self) -> np.ndarray:
        return self._arrays["used"]

    @property
    def gpu_counts(self) -> np.ndarray:
        return self._arrays["gpu_count"]

    @property
    def usable_counts(self) -> np.ndarray:
        return self._arrays["usable"]

    @property
    def cpu_free(self) -> np.ndarray:
        """Free CPU milli-cores per node (a huge number where the node does not track CPU)."""
        return self._arrays["cpu_free"]

    @property
    def mem_free(self) -> np.ndarray:
        return self._arrays["mem_free"]

    @property
    def cpu_capacity(self) -> np.ndarray:
        """CPU milli-cores per node as built, with nothing running (a huge number where the node does not track
        CPU, as in `cpu_free`): what a request must fit in on an empty node."""
        return _node_arrays(self.nodes).cpu_cap

    @property
    def mem_capacity(self) -> np.ndarray:
        """Memory MiB per node as built (huge where not tracked); see `cpu_capacity`."""
        return _node_arrays(self.nodes).mem_cap

    def may_move_known(self, movable: Callable[[Workload], bool] | None = None) -> np.ndarray | None:
        """`may_move(movable)` when some caller computed it on this state already, else None (for a caller that
        asks of a few workloads only and would pay for all of them)."""
        return self.memo.get(("may_move", movable))  # type: ignore[return-value]

    def may_move(self, movable: Callable[[Workload], bool] | None = None) -> np.ndarray:
        """Per running workload (in `running`'s order): may a plan move it — `Workload.can_move` and the caller's
        filter `movable` (None: no filter). Once per state and filter: the diagnosis's clearing count, the
        planner and the decision's count of excluded jobs all ask it of every running workload, and a filter
        built from a policy file costs microseconds a workload."""
        key = ("may_move", movable)
        got = self.memo.get(key)
        if got is None:
            run = self.running
            if movable is None:
                got = self.running_rows[:, 8].astype(bool)
            else:  # the filter only where the flags allow a move (and no verdict was carried over)
                got = self.may_move().copy()
                ask = got
                carried = self.memo.pop(("may_move.carried", movable), None)
                if carried is not None:
                    said, old = carried  # type: ignore[misc]
                    got[old] = said[old]
                    ask = got & ~old
                idx = np.flatnonzero(ask)
                got[idx] = np.fromiter((bool(movable(run[i])) for i in idx.tolist()), dtype=bool, count=len(idx))
            self.memo[key] = got
        return got  # type: ignore[return-value]

    @cached_property
    def running_rows(self) -> np.ndarray:
        """Per running workload (in `running`'s order), int64 columns: 0 the node index of its one placement (-1
        with several or none), 1 GPUs per node, 2 its first GPU (-1: none), 3 the share per GPU (milli), 4 CPU
        (milli-cores), 5 memory (MiB), 6 the GPUs its first placement holds, 7 its placements, 8 `can_move`
        (0/1). One pass over the workloads per state, shared by the diagnosis's clearing count and the planner's
        problem (each made its own pass at every decision of a replay)."""
        run = self.running
        cols = self._columns
        if cols is None or not run:  # a placement on an unknown node (validate refuses it; the walk names it)
            idx = self.node_index
            return np.array([workload_row(w, idx) for w in run], dtype=np.int64).reshape(len(run), 9)
        return rows_from(cols, self._can_move)

    @cached_property
    def memo(self) -> dict[object, object]:
        """A per-state cache for derived values (masks keyed by a request's constraints); the state never
        changes, so anything computed from it stays valid."""
        return {}

    @cached_property
    def mig_mask(self) -> np.ndarray:
        return _node_arrays(self.nodes).mig

    @cached_property
    def schedulable_mask(self) -> np.ndarray:
        return _node_arrays(self.nodes).schedulable

    def free_gpus_on(self, node: str) -> list[int]:
        """Indices of the wholly free GPUs on a node."""
        row = self.free_milli[self.node_index[node]]
        return [int(i) for i in np.flatnonzero(row == MILLI)]

    # ---------------------------------------------------------------- validation
    def validate(self, previous: ClusterState | None = None) -> None:
        """Raise ModelError at the first contradiction. A vectorised pass checks the common case quickly; only
        when it finds a problem does the exact (slower) walk run to name the offending field. `previous`: a
        validated state whose workloads this one mostly shares (the same objects, as the live controller's model
        hands them back cycle after cycle): their columns, flags and filter verdicts are carried over and their
        own fields are not checked again; what involves all of them (unique ids, capacity) is."""
        fresh = None
        if previous is not None and previous.__dict__.get("_validated"):
            fresh = self._carry_from(previous)
        if not self._looks_valid(fresh):
            self._validate_exactly()
        self.__dict__["_validated"] = True

    def _carry_from(self, previous: ClusterState) -> list[Workload]:
        """Take over `previous`'s columns (core/columns.py), can-move flags and filter verdicts (`may_move`) for
        the workloads that are the very same objects there; return the workloads that are not."""
        ws, before = self.workloads, previous.workloads
        pos = same_objects(ws, before)
        fresh = [ws[i] for i in np.flatnonzero(pos < 0).tolist()]
        cols = previous.__dict__.get("_columns")
        if cols is None:
            return fresh
        p = pos[self._is_running]
        rpos = np.full(len(p), -1, dtype=np.int64)
        kept = p >= 0
        rpos[kept] = (np.cumsum(previous._is_running) - 1)[p[kept]]  # the same object: running there too
        node_rows = None
        if list(map(_NAME_OF, previous.nodes)) != list(map(_NAME_OF, self.nodes)):
            node_rows = np.fromiter(map(self.node_index.get, map(_NAME_OF, previous.nodes), repeat(-1)),
                                    dtype=np.int64, count=len(previous.nodes))
        run = self.running
        self.__dict__["_columns"] = carry(run, rpos, cols, node_rows, self.node_index)
        old = rpos >= 0

        def taken(a: np.ndarray) -> np.ndarray:  # per running workload: its value there (False where new)
            out = np.zeros(len(rpos), dtype=bool)
            out[old] = a[rpos[old]]
            return out

        flags = previous.__dict__.get("_can_move")
        if flags is not None:
            mine = taken(flags)
            new = np.flatnonzero(~old)
            mine[new] = movable_flags([run[i] for i in new.tolist()])
            self.__dict__["_can_move"] = mine
        # the verdicts of the last few filters (a caller that makes a new filter each cycle leaves its old ones
        # behind: they are not carried on for ever)
        known = [(key, said) for key, said in previous.memo.items()
                 if isinstance(key, tuple) and len(key) == 2 and key[0] in ("may_move", "may_move.carried")
                 and key[1] is not None]
        for key, said in known[-CARRIED_FILTERS:]:
            if key[0] == "may_move.carried":  # never asked of the previous state: carried further
                said, was = said  # type: ignore[misc]
                kept = taken(was)
                self.memo[("may_move.carried", key[1])] = (taken(said) & kept, kept)
            else:
                self.memo[("may_move.carried", key[1])] = (taken(said), old)  # type: ignore[arg-type]
        return fresh

    def _looks_valid(self, fresh: Sequence[Workload] | None = None) -> bool:
        """The vectorised check; `fresh`: the only workloads whose own fields need checking (the others were
        checked in the state they were carried from), None: all."""
        nodes = self.nodes
        if nodes:  # each bound a pass of min/max at C speed (a 10,000-node state's checks, a loop, took 8 ms)
            counts_, cpus, mems = (list(map(get, nodes)) for get in (_GPU_COUNT_OF, _CPU_OF, _MEMORY_OF))
            if min(counts_) < 0 or min(cpus) < 0 or max(cpus) > MAX_AMOUNT or min(mems) < 0 or max(mems) > MAX_AMOUNT:
                return False
            if min(filter(None, map(_ALLOCATABLE_OF, nodes)), default=0) < 0:
                return False
        of = _node_arrays(nodes)
        if len(of.index) != len(nodes) or "" in of.index:
            return False  # a repeated or empty name
        ws = self.workloads
        index = _unique_id_rows(ws)
        if index is None:
            return False
        counts = of.gpu_count
        own = ws if fresh is None else fresh
        requests = list(map(_REQUEST_OF, own))
        for r in dict(zip(map(id, requests), requests, strict=True)).values():  # each distinct one once
            if r.gpus_per_node < 0 or r.node_count < 1:
                return False
            if not 0 <= r.cpu_milli <= MAX_AMOUNT or not 0 <= r.memory_mib <= MAX_AMOUNT:
                return False
            if r.gpus_per_node > 0 and not 0 < r.gpu_milli <= MILLI:
                return False
            if r.gpu_milli < MILLI and r.gpus_per_node > 1:
                return False
        if fresh is None:
            pending = self._not_running(WorkloadState.PENDING)
        else:
            pending = list(compress(own, map(operator.is_, map(_STATE_OF, own), repeat(WorkloadState.PENDING))))
        if any(map(_PLACEMENTS_OF, pending)):
            return False  # a pending workload with placements
        placed = self._columns
        if placed is None:
            return False
        rr, cc, share, held, asked, n_placed = (placed.rows, placed.gpu, np.repeat(placed.share, placed.held),
                                                placed.held, placed.asked, placed.n_placed)
        if not np.array_equal(n_placed, placed.node_count):
            return False  # a running workload on as many nodes as it asks for
        if not np.array_equal(held, asked):
            return False  # each placement holds the GPUs per node asked
        if len(rr):
            if (cc < 0).any() or (cc >= counts[rr]).any():
                return False
            g = max(int(counts.max()), 1)
            used = np.bincount(rr * g + cc, weights=share, minlength=len(self.nodes) * g)
            if not bool((used <= MILLI).all()):
                return False  # also a GPU listed twice by one placement: it holds 2+ GPUs, so whole ones (above)
        self.__dict__["_placed"] = (rr, cc, share, placed.prow, placed.cpu, placed.mem)  # what _arrays reads
        self.__dict__["workload_index"] = MappingProxyType(index)  # the cached_property's own slot
        return True

    def _validate_exactly(self) -> None:
        seen: set[str] = set()
        for i, nd in enumerate(self.nodes):
            path = f"nodes[{i}]"
            if not nd.name:
                raise ModelError(f"{path}.name", "must not be empty")
            if nd.name in seen:
                raise ModelError(f"{path}.name", f"duplicate node name {nd.name!r}")
            seen.add(nd.name)
            if nd.gpu_count < 0:
                raise ModelError(f"{path}.gpu_count", f"must be >= 0, got {nd.gpu_count}")
            if nd.gpu_allocatable is not None and nd.gpu_allocatable < 0:
                raise ModelError(f"{path}.gpu_allocatable", f"must be >= 0, got {nd.gpu_allocatable}")
            for attr in ("cpu_milli", "memory_mib"):
                if not 0 <= getattr(nd, attr) <= MAX_AMOUNT:
                    raise ModelError(f"{path}.{attr}", f"must be in 0..{MAX_AMOUNT}")
        ids: set[str] = set()
        used: dict[tuple[int, int], int] = {}
        for i, w in enumerate(self.workloads):
            path = f"workloads[{i}]"
            if not w.id:
                raise ModelError(f"{path}.id", "must not be empty")
            if w.id in ids:
                raise ModelError(f"{path}.id", f"duplicate workload id {w.id!r}")
            ids.add(w.id)
            r = w.request
            if r.gpus_per_node < 0:
                raise ModelError(f"{path}.gpus_per_node", f"must be >= 0, got {r.gpus_per_node}")
            if r.node_count < 1:
                raise ModelError(f"{path}.node_count", f"must be >= 1, got {r.node_count}")
            for attr in ("cpu_milli", "memory_mib"):
                if not 0 <= getattr(r, attr) <= MAX_AMOUNT:
                    raise ModelError(f"{path}.{attr}", f"must be in 0..{MAX_AMOUNT}")
            if not 0 < r.gpu_milli <= MILLI and r.gpus_per_node > 0:
                raise ModelError(f"{path}.gpu_milli", f"must be in 1..{MILLI}, got {r.gpu_milli}")
            if r.gpu_milli < MILLI and r.gpus_per_node > 1:
                raise ModelError(f"{path}.gpu_milli", "a GPU share below 1000 is only valid with 1 GPU per node")
            if w.state is WorkloadState.PENDING:
                if w.placements:
                    raise ModelError(f"{path}.placements", "a pending workload has no placements")
                continue
            if len(w.placements) != r.node_count:
                raise ModelError(
                    f"{path}.placements", f"runs on {len(w.placements)} node(s) but asks for {r.node_count}"
                )
            for j, p in enumerate(w.placements):
                ppath = f"{path}.placements[{j}]"
                if p.node not in self.node_index:
                    raise ModelError(f"{ppath}.node", f"unknown node {p.node!r}")
                ni = self.node_index[p.node]
                nd = self.nodes[ni]
                if len(p.gpus) != r.gpus_per_node:
                    raise ModelError(
                        f"{ppath}.gpus", f"holds {len(p.gpus)} GPU(s) but asks for {r.gpus_per_node} per node"
                    )
                if r.gpus_per_node > nd.gpu_count:
                    raise ModelError(
                        f"{ppath}.gpus",
                        f"asks for {r.gpus_per_node} GPUs on node {p.node!r}, which has {nd.gpu_count}",
                    )
                if len(set(p.gpus)) != len(p.gpus):
                    raise ModelError(f"{ppath}.gpus", "lists a GPU twice")
                for g in p.gpus:
                    if not 0 <= g < nd.gpu_count:
                        raise ModelError(
                            f"{ppath}.gpus", f"GPU index {g} out of range for {p.node!r} ({nd.gpu_count} GPUs)"
                        )
                    total = used.get((ni, g), 0) + r.gpu_milli
                    if total > MILLI:
                        raise ModelError(
                            f"{ppath}.gpus", f"GPU {g} of {p.node!r} over-allocated ({total} of {MILLI} milli)"
                        )
                    used[(ni, g)] = total

    # ---------------------------------------------------------------- derived states
    def with_workloads(self, workloads: Iterable[Workload], *, now: float | None = None) -> ClusterState:
        """A new state with the same nodes and a different set of workloads (validated; what it shares with this
        one is carried over, not gathered and checked again)."""
        return ClusterState.build(
            self.nodes,
            workloads,
            quotas=self.quotas,
            node_groups=self.node_groups,
            now=self.now if now is None else now,
            name=self.name,
            scheduler=self.scheduler,
            previous=self,
        )
