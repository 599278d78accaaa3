"""Engine factories as a registry: a name (the CLI's `--engine`) maps to one builder with validated arguments,
descheduler-style. Each builder imports its engine only when asked for, so `gpudefrag` does not load the
Kubernetes client to run Slurm."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..core.model import ClusterState
from .base import Engine

EngineBuilder = Callable[..., Engine]
_ENGINES: dict[str, tuple[EngineBuilder, frozenset[str]]] = {}


def register_engine(name: str, args: Iterable[str] = ()) -> Callable[[EngineBuilder], EngineBuilder]:
    """Register an engine factory under `name`, with the keyword arguments it accepts (descheduler-style: a name
    in the configuration maps to one builder, whose arguments are checked before it runs)."""

    def register(fn: EngineBuilder) -> EngineBuilder:
        _ENGINES[name] = (fn, frozenset(args))
        return fn

    return register


def engine_names() -> tuple[str, ...]:
    return tuple(_ENGINES)


def make_engine(name: str, **kwargs: Any) -> Engine:
    """Build the engine registered as `name`. Unknown names and arguments are ValueErrors naming them; an
    argument given as None is left to the builder's default."""
    if name not in _ENGINES:
        raise ValueError(f"unknown engine {name!r}; known: {', '.join(_ENGINES)}")
    fn, allowed = _ENGINES[name]
    given = {k: v for k, v in kwargs.items() if v is not None}
    bad = sorted(set(given) - allowed)
    if bad:
        raise ValueError(f"engine {name!r} takes no argument(s) {', '.join(bad)}; it takes {sorted(allowed)}")
    return fn(**given)


@register_engine("slurm")
def _slurm() -> Engine:
    from .slurm import SlurmEngine  # each engine's dependencies load only when it is asked for

    return SlurmEngine()  # type: ignore[return-value]


@register_engine("kubernetes", args=("context",))
def _kubernetes(context: str | None = None) -> Engine:
    from .kubernetes import KubernetesEngine

    # the engines built here serve long-lived processes (controller, dashboard): a watch cache, listed once
    return KubernetesEngine(context=context, watch=True)  # type: ignore[return-value]


@register_engine("sim", args=("state",))
def _sim(state: ClusterState | None = None) -> Engine:
    from .sim import SimEngine

    if state is None:
        raise ValueError("engine 'sim' needs a cluster state (--snapshot FILE)")
    return SimEngine(state)
