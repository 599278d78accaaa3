"""CPU relief: make a GPU slot usable by moving CPU (and memory) off its node.

Once FGD saturates the Alibaba cluster, whole GPUs and large free shares sit on nodes whose CPU is exhausted,
while the free CPU sits on nodes whose GPUs are full (seed 42 at 100 % arrived: 36 whole GPUs stranded this way,
and 20 more GPUs' worth of free shares). The same FGD run with unlimited CPU ends at 4.15 % unallocated instead of
4.98 %. A failing pod whose GPUs fit a node whose CPU or memory does not is placed there after a few moves:

- a CPU-only pod of the node goes to another node with the CPU to spare (1 move);
- a GPU pod of the node goes to a slot of its shape on another node (1 move);
- a GPU pod of the node swaps places with a pod of the same GPU shape that asks for less CPU, on a node with
  the CPU to spare (2 moves): every GPU stays exactly as full as it was, only CPU changes nodes.

Greedy: the action that covers the shortfall with the fewest moves, else the one that frees the most per move
(ties: the fewest checkpoint bytes), until the pod fits. Destinations prefer nodes with the least free GPU (CPU
parked there strands nothing). Everything goes through `Search`, so a relief that does not reach its goal is
undone exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..core.capacity import gpus_fit, room_fits
from ..core.placement import Choice, Pod, gpus_for
from .costs import checkpoint_bytes
from .replay import gpu_shape

if TYPE_CHECKING:
    from .search import Search


def slot_nodes(s: Search, pod: Pod, limit: int) -> list[int]:
    """Nodes where the pod's GPUs fit now but its CPU or memory does not, smallest shortfall first."""
    cl = s.cl
    ok = cl.model_mask(pod.gpu_models) & gpus_fit(cl.free, pod)
    ok &= (cl.cpu_cap >= pod.cpu_milli) & ~room_fits(cl.cpu_free, cl.mem_free, pod)
    nodes = np.flatnonzero(ok)
    short = np.maximum(pod.cpu_milli - cl.cpu_free[nodes], 0)
    return [int(n) for n in nodes[np.argsort(short, kind="stable")][:limit]]


def relieve(s: Search, pod: Pod, targets: int, movable: Callable[[Pod], bool] | None = None,
            gib_cap: float = 0.0) -> Choice | None:
    """Place `pod` on one of the `targets` best slot nodes after moving CPU off it; None (all undone) if none
    works within the search's move limit (and, `gib_cap` > 0, writing at most that many GiB of checkpoints, the
    cheapest actions in bytes first). May raise `Abort` (the caller undoes)."""
    if pod.num_gpu == 0:
        return None
    nodes = slot_nodes(s, pod, targets)
    if not nodes:
        return None
    twins = twins_of(s)
    for n in nodes:
        m = s.mark()
        gpus = gpus_for(s.cl, n, pod, "best", s.rng)
        if (make_room(s, n, pod.cpu_milli, pod.memory_mib, set(gpus), twins, movable=movable, by_bytes=gib_cap > 0)
                and (gib_cap <= 0 or s.moved_gib() <= gib_cap)):
            ch = Choice(n, gpus)
            s.put_new(pod, ch)
            return ch
        s.undo(m)
    return None


Twins = dict[tuple[int, int, tuple[str, ...]], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]


def twins_of(s: Search) -> Twins:
    """Placed GPU pods by GPU shape (the swap partners): ids (ascending), nodes, CPU, memory."""
    rows, shapes = s.placed.gpu_rows()
    live = rows[:, 4] == 1
    if s.limbo:
        live[list(s.limbo)] = False
    ids = np.flatnonzero(live)
    codes = rows[ids, 0]
    order = np.argsort(codes, kind="stable")
    ids, codes = ids[order], codes[order]
    out: Twins = {}
    for part in np.split(ids, np.flatnonzero(np.diff(codes)) + 1):
        if len(part):
            out[shapes[rows[part[0], 0]]] = (part, rows[part, 1], rows[part, 2], rows[part, 3])
    return out


def relief_potential(s: Search, n: int, reserved: set[int], avoid: frozenset[int], twins: Twins) -> int:
    """An optimistic estimate of the CPU `make_room` could free on node n (each pod judged alone)."""
    cl = s.cl
    ok_dest = np.ones(cl.n, dtype=bool)
    ok_dest[n] = False
    if avoid:
        ok_dest[list(avoid)] = False
    total = 0
    for pid in s.placed.on(n):
        if pid in s.limbo:
            continue
        q, ch = s.placed.pods[pid]
        if reserved & set(ch.gpus) or q.cpu_milli <= 0:
            continue
        if q.num_gpu == 0:
            if (ok_dest & (cl.cpu_free >= q.cpu_milli)).any():
                total += q.cpu_milli
            continue
        tw = twins.get(gpu_shape(q))
        if tw is None:
            continue
        _, where, cpu, _ = tw
        dc = q.cpu_milli - cpu
        good = (dc > 0) & ok_dest[where] & (cl.cpu_free[where] >= dc)
        if good.any():
            total += int(dc[good].max())
    return total


def make_room(s: Search, n: int, cpu: int, mem: int, reserved: set[int], twins: Twins | None = None,
              avoid: frozenset[int] = frozenset(), movable: Callable[[Pod], bool] | None = None,
              by_bytes: bool = False) -> bool:
    """Move CPU and memory off node n until it has `cpu` and `mem` free. Pods on the `reserved` GPUs of n stay;
    nothing is moved onto (or swapped with a pod on) the `avoid` nodes; only `movable` pods move. `by_bytes`
    (moves have a price): weigh actions by the checkpoint bytes they write instead of by their moves."""
    cl = s.cl
    if twins is None:
        twins = twins_of(s)
    tried: set[int] = set()
    while True:
        need_cpu = cpu - int(cl.cpu_free[n])
        need_mem = mem - int(cl.mem_free[n])
        if need_cpu <= 0 and need_mem <= 0:
            return True
        best: tuple[tuple[int, float], tuple] | None = None
        for pid in s.placed.on(n):
            if pid in s.limbo or pid in tried or (pid in s.orig and s.placed.pods[pid][1] != s.orig[pid]):
                continue
            q, ch = s.placed.pods[pid]
            if reserved & set(ch.gpus) or (movable is not None and not movable(q)):
                continue
            act = _best_action(s, pid, q, ch, n, need_cpu, need_mem, twins, avoid, movable)
            if act is None:
                continue
            gain_cpu, gain_mem, moves, plan = act
            covers = gain_cpu >= need_cpu and gain_mem >= need_mem
            frac = (min(gain_cpu, need_cpu) / need_cpu if need_cpu > 0 else 0.0) + (
                min(gain_mem, need_mem) / need_mem if need_mem > 0 else 0.0)
            nbytes = _bytes(s, pid, plan)
            if by_bytes:
                key = (0 if covers else 1, nbytes if covers else -frac / max(nbytes, 1.0), 0.0)
            else:  # among equally good actions, the one that writes the fewest checkpoint bytes
                key = (0 if covers else 1, moves if covers else -frac / moves, nbytes)
            if best is None or key < best[0]:
                best = (key, (pid, plan))
        if best is None:
            return False
        pid, plan = best[1]
        tried.add(pid)
        _apply(s, pid, plan)
        if plan[0] == "swap":
            twins.clear()
            twins.update(twins_of(s))


def _bytes(s: Search, pid: int, plan: tuple) -> float:
    """Checkpoint bytes the action writes: the pod's, and its twin's for a swap."""
    out = 0.0
    for p in (pid, plan[1]) if plan[0] == "swap" else (pid,):
        q, ch = s.placed.pods[int(p)]
        out += checkpoint_bytes(q, s.cl.models[ch.node])
    return out


def _dest_order(cl, nodes: np.ndarray) -> np.ndarray:
    """Least free GPU first (CPU parked there strands no GPU), then the most CPU free."""
    return nodes[np.lexsort((-cl.cpu_free[nodes], cl.gpu_left[nodes]))]


def _best_action(s: Search, pid: int, q: Pod, ch: Choice, n: int, need_cpu: int, need_mem: int,
                 twins: Twins, avoid: frozenset[int] = frozenset(),
                 movable: Callable[[Pod], bool] | None = None) -> tuple[int, int, int, tuple] | None:
    """The cheapest way to take pod `pid` (on node n) off n or trade it for a lighter twin:
    (CPU gained, memory gained, moves, plan)."""
    cl = s.cl
    if q.cpu_milli <= 0 and q.memory_mib <= 0:
        return None
    # a plain move: CPU-only anywhere with room; a GPU pod to a slot of its shape
    ok = cl.fits(q)
    ok[n] = False
    if avoid:
        ok[list(avoid)] = False
    if q.num_gpu > 0:
        ok &= cl.model_mask(q.gpu_models)
    dest = np.flatnonzero(ok)
    if len(dest):
        d = int(_dest_order(cl, dest)[0])
        return q.cpu_milli, q.memory_mib, 1, ("move", d)
    if q.num_gpu == 0:
        return None
    # a swap with a lighter pod of the same GPU shape on a node with the CPU to spare
    tw = twins.get(gpu_shape(q))
    if tw is None:
        return None
    ids, where, cpu, mem = tw
    dc, dm = q.cpu_milli - cpu, q.memory_mib - mem
    ok = (where != n) & ((dc > 0) | (dm > 0)) & (cl.cpu_free[where] >= dc) & (cl.mem_free[where] >= dm)
    if avoid:
        ok &= ~np.isin(where, list(avoid))
    ok &= (dc >= 0) & (dm >= 0)  # never leave node n worse on either
    if q.gpu_models:
        ok &= cl.model_mask(q.gpu_models)[where]
    idx = np.flatnonzero(ok)
    # covering with the smallest trade, else the largest
    for j in idx[np.lexsort((np.where(_covers(dc[idx], dm[idx], need_cpu, need_mem), dc[idx], -dc[idx]),
                             ~_covers(dc[idx], dm[idx], need_cpu, need_mem)))]:
        r = int(ids[j])
        if r == pid or r in s.limbo or (r in s.orig and s.placed.pods[r][1] != s.orig[r]):
            continue
        if movable is not None and not movable(s.placed.pods[r][0]):
            continue
        b = s.placed.pods[r][1].node  # `twins` may predate an undone swap: check where r really is
        if (b == n or b in avoid or cl.cpu_free[b] < dc[j] or cl.mem_free[b] < dm[j]
                or (q.gpu_models and cl.models[b] not in q.gpu_models)):
            continue
        return int(dc[j]), int(dm[j]), 2, ("swap", r)
    return None


def _covers(dc: np.ndarray, dm: np.ndarray, need_cpu: int, need_mem: int) -> np.ndarray:
    return (dc >= need_cpu) & (dm >= need_mem)


def _apply(s: Search, pid: int, plan: tuple) -> None:
    cl = s.cl
    kind, arg = plan
    q, ch = s.placed.pods[pid]
    if kind == "move":
        d = int(arg)
        s.eject(pid)
        s.put(pid, Choice(d, gpus_for(cl, d, q, "best", s.rng)))
        return
    r = int(arg)
    rch = s.placed.pods[r][1]
    s.eject(pid)
    s.eject(r)
    s.put(pid, rch)
    s.put(r, ch)


__all__ = ["make_room", "relief_potential", "relieve", "slot_nodes"]
