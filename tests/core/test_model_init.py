"""The core model's frozen dataclasses build through `_quick_init` (a faster `__init__`): the same signature,
defaults and default factories as the one dataclasses generates, and still frozen."""

from __future__ import annotations

import dataclasses
import inspect
import random

import pytest

from gpudefrag.core import model
from gpudefrag.core.model import Node, Placement, Request, Versions, Workload

CLASSES = [model.Taint, model.Toleration, Versions, Node, Placement, Request, Workload, model.Quota, model.NodeGroup]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_same_signature_as_the_generated_init(cls: type) -> None:
    params = list(inspect.signature(cls).parameters.values())
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        if f.default is not dataclasses.MISSING:
            assert p.default is f.default
        elif f.default_factory is not dataclasses.MISSING:
            assert repr(p.default) == "<factory>"
        else:
            assert p.default is inspect.Parameter.empty


def test_values_defaults_and_frozen() -> None:
    r = Request(2, gpu_milli=1000, cpu_milli=5)
    a = Workload("a", r, priority=3, placements=(Placement("n", (0, 1)),))
    b = Workload(id="a", request=r, priority=3, placements=(Placement(node="n", gpus=(0, 1)),))
    assert a == b
    assert (a.state, a.namespace, a.movable, a.versions) == (model.WorkloadState.RUNNING, "default", True, Versions())
    assert a.labels == {} and a.labels is not Workload("c", r).labels  # a fresh dict per object
    assert dataclasses.replace(a, id="z").id == "z"
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.id = "b"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Workload("a")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Placement("n", (0,), extra=1)  # type: ignore[call-arg]


def _random_state(rng: random.Random) -> model.ClusterState:
    nodes = tuple(Node(f"n{i}", rng.choice([0, 1, 2, 4])) for i in range(rng.randint(1, 4)))
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
        seen[exact] += 1
    assert min(seen.values()) > 300  # both kinds were tried
