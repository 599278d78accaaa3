"""The engines (the CLI's `--engine`) as one `gpudefrag.registry.Registry`: a name maps to one builder and its
typed arguments. Each builder imports its engine only when asked for, so `gpudefrag` does not load the
Kubernetes client to run Slurm."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import InstanceOf

from ..core.model import ClusterState
from ..registry import Args, Registry
from .base import Engine

EngineBuilder = Callable[..., Engine]
ENGINES: Registry[EngineBuilder] = Registry("engine")


def engine_names() -> tuple[str, ...]:
    return ENGINES.names()


def make_engine(name: str, **kwargs: Any) -> Engine:
    """Build the engine registered as `name`. Unknown names and arguments are ValueErrors naming them; an
    argument given as None is left to the builder's default."""
    engine: Engine = ENGINES.build(name, **kwargs)
    return engine


@ENGINES.register("slurm")
def _slurm() -> Engine:
    from .slurm import SlurmEngine  # each engine's dependencies load only when it is asked for

    return SlurmEngine()  # type: ignore[return-value]


class KubernetesArgs(Args):
    context: str | None = None  # the kubeconfig context (default: the current one)


@ENGINES.register("kubernetes", KubernetesArgs)
def _kubernetes(context: str | None = None) -> Engine:
    from .kubernetes import KubernetesEngine

    # the engines built here serve long-lived processes (controller, dashboard): a watch cache, listed once
    return KubernetesEngine(context=context, watch=True)  # type: ignore[return-value]


class SimArgs(Args):
    state: InstanceOf[ClusterState] | None = None  # the simulated cluster (--snapshot FILE)


@ENGINES.register("sim", SimArgs)
def _sim(state: ClusterState | None = None) -> Engine:
    from .sim import SimEngine

    if state is None:
        raise ValueError("engine 'sim' needs a cluster state (--snapshot FILE)")
    return SimEngine(state)
