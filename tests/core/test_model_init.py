"""The core model's values are frozen msgspec structs (built in C; core/model.py `_Value`): positional and
keyword construction, defaults and fresh default dicts, equality and hashing by field, frozen, copied with
`msgspec.structs.replace`, and pickled (the process and Ray sweeps ship them) unchanged."""

from __future__ import annotations

import pickle
import random

import msgspec
import pytest

from gpudefrag.core import model
from gpudefrag.core.model import Node, Placement, Request, Versions, Workload

CLASSES = [model.Taint, model.Toleration, Versions, Node, Placement, Request, Workload, model.Quota, model.NodeGroup]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_value_is_a_frozen_struct_untracked_by_the_collector(cls: type) -> None:
    assert issubclass(cls, model._Value)
    assert cls.__struct_config__.frozen and not cls.__struct_config__.gc


def test_values_defaults_and_frozen() -> None:
    r = Request(2, gpu_milli=1000, cpu_milli=5)
    a = Workload("a", r, priority=3, placements=(Placement("n", (0, 1)),))
    b = Workload(id="a", request=r, priority=3, placements=(Placement(node="n", gpus=(0, 1)),))
    assert a == b and hash(a.versions) == hash(Versions()) and a != msgspec.structs.replace(a, priority=4)
    assert (a.state, a.namespace, a.movable, a.versions) == (model.WorkloadState.RUNNING, "default", True, Versions())
    assert a.labels == {} and a.labels is not Workload("c", r).labels  # a fresh dict per object
    z = msgspec.structs.replace(a, id="z")
    assert (z.id, z.request, z.placements) == ("z", r, a.placements) and a.id == "a"
    assert pickle.loads(pickle.dumps(a)) == a
    with pytest.raises(AttributeError):
        a.id = "b"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Workload("a")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Placement("n", (0,), extra=1)  # type: ignore[call-arg]


def _random_state(rng: random.Random) -> model.ClusterState:
    def node(i: int) -> Node:  # now and then a field out of its bounds, a repeated or an empty name
        bad = rng.random() < 0.15
        flaw = rng.choice(["name", "dup", "count", "alloc", "cpu", "mem"]) if bad else ""
        return Node("" if flaw == "name" else "n0" if flaw == "dup" else f"n{i}",
                    -1 if flaw == "count" else rng.choice([0, 1, 2, 4]),
                    gpu_allocatable=-1 if flaw == "alloc" else rng.choice([None, None, 0, 1, 8]),
                    cpu_milli=rng.choice([-5, model.MAX_AMOUNT + 1]) if flaw == "cpu" else rng.choice([0, 4000]),
                    memory_mib=rng.choice([-5, model.MAX_AMOUNT + 1]) if flaw == "mem" else rng.choice([0, 64]),
                    mig_devices=rng.choice([{}, {}, {"1g.10gb": 0}, {"1g.10gb": 2}]))

    nodes = tuple(node(i) for i in range(rng.randint(1, 4)))
    workloads = []

    def extra() -> int:  # now and then one GPU or placement more or less than asked
        return int(rng.random() < 0.1)

    for j in range(rng.randint(0, 6)):
        k, count = rng.choice([0, 1, 1, 2, 3]), rng.choice([1, 1, 1, 2])
        milli = rng.choice([1000, 1000, 500, 250, 0, 1200]) if k <= 1 else rng.choice([1000, 1000, 500])
        r = Request(k, node_count=count, gpu_milli=milli)
        state = rng.choice([model.WorkloadState.RUNNING] * 4 + [model.WorkloadState.PENDING])
        placements = tuple(
            Placement(rng.choice([n.name for n in nodes] + ["ghost"] * (rng.random() < 0.05)),
                      tuple(rng.randint(-1 if rng.random() < 0.05 else 0, 4) for _ in range(k + extra())))
            for _ in range(count - extra()))
        if state is model.WorkloadState.PENDING and rng.random() < 0.8:
            placements = ()
        workloads.append(Workload(f"w{j}" if rng.random() < 0.95 else "w0", r, state, placements=placements))
    return model.ClusterState(nodes=nodes, workloads=tuple(workloads))


def test_the_quick_check_agrees_with_the_exact_walk() -> None:
    """`_looks_valid` (vectorised) passes exactly the states that `_validate_exactly` accepts."""
    rng = random.Random(27)
    seen = {True: 0, False: 0}
    for _ in range(3000):
        state = _random_state(rng)
        try:
            state._validate_exactly()
            exact = True
        except model.ModelError:
            exact = False
        assert state._looks_valid() is exact, state
        if exact:  # the node arrays read the properties only where they can differ from the plain case
            assert state.usable_counts.tolist() == [n.usable_gpus for n in state.nodes]
            assert state.mig_mask.tolist() == [n.has_mig for n in state.nodes]
        seen[exact] += 1
    assert min(seen.values()) > 300  # both kinds were tried
