"""Checkpoint backends as a registry: a name (the CLI's `--backend`, a manifest's `backend`) maps to one builder
with the keyword arguments it accepts, as engines do (`gpudefrag.engines.registry`). Each builder imports its
backend only when asked for: the CUDA one needs cuda-bindings, which a CRIU-only host does not have."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .protocol import UNAVAILABLE, CheckpointBackend, CheckpointError

BackendBuilder = Callable[..., CheckpointBackend]
_BACKENDS: dict[str, tuple[BackendBuilder, frozenset[str]]] = {}


def register_backend(name: str, args: Iterable[str] = ()) -> Callable[[BackendBuilder], BackendBuilder]:
    """Register a backend builder under `name`, with the keyword arguments it accepts."""

    def register(fn: BackendBuilder) -> BackendBuilder:
        _BACKENDS[name] = (fn, frozenset(args))
        return fn

    return register


def backend_names() -> tuple[str, ...]:
    return tuple(_BACKENDS)


def backend_for(name: str, **kw: Any) -> CheckpointBackend:
    """The backend registered as `name`; an unknown name or argument is a CheckpointError(unavailable) naming it."""
    if name not in _BACKENDS:
        raise CheckpointError(UNAVAILABLE, f"unknown checkpoint backend {name!r} ({', '.join(_BACKENDS)})")
    fn, allowed = _BACKENDS[name]
    bad = sorted(set(kw) - allowed)
    if bad:
        raise CheckpointError(UNAVAILABLE, f"checkpoint backend {name!r} takes no argument(s) {', '.join(bad)}; "
                              f"it takes {sorted(allowed)}")
    return fn(**kw)


@register_backend("criu", args=("criu_bin", "log_dir", "log_level", "keep_logs"))
def _criu(**kw: Any) -> CheckpointBackend:
    from .criu import CriuBackend

    return CriuBackend(**kw)


@register_backend("cuda", args=("criu_bin", "log_dir", "log_level", "keep_logs", "lock_timeout_ms"))
def _cuda(**kw: Any) -> CheckpointBackend:
    from .cuda import CudaBackend

    return CudaBackend(**kw)


@register_backend("app", args=("spool", "signum", "timeout_s"))
def _app(**kw: Any) -> CheckpointBackend:
    from .app_hook import AppHookBackend

    return AppHookBackend(**kw)
