"""The checkpoint backends (the CLI's `--backend`, a manifest's `backend`) as one `gpudefrag.registry.Registry`:
a name maps to one builder and its typed arguments, as engines do. Each builder imports its backend only when
asked for: the CUDA one needs cuda-bindings, which a CRIU-only host does not have."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from ..registry import Args, Registry
from .protocol import UNAVAILABLE, CheckpointBackend, CheckpointError

BackendBuilder = Callable[..., CheckpointBackend]
BACKENDS: Registry[BackendBuilder] = Registry("checkpoint backend",
                                              error=lambda msg: CheckpointError(UNAVAILABLE, msg))


def backend_names() -> tuple[str, ...]:
    return BACKENDS.names()


def backend_for(name: str, **kw: Any) -> CheckpointBackend:
    """The backend registered as `name`; an unknown name or argument is a CheckpointError(unavailable) naming it."""
    backend: CheckpointBackend = BACKENDS.build(name, **kw)
    return backend


class CriuArgs(Args):
    """CRIU's settings (unset or None: the backend's own defaults)."""

    criu_bin: str | None = None
    log_dir: Path | None = None
    log_level: Annotated[int, Field(ge=0, le=4)] | None = None
    keep_logs: bool | None = None


class CudaArgs(CriuArgs):
    lock_timeout_ms: Annotated[int, Field(ge=0)] | None = None


class AppArgs(Args):
    spool: Path | None = None
    signum: int | None = None
    timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None


@BACKENDS.register("criu", CriuArgs)
def _criu(**kw: Any) -> CheckpointBackend:
    from .criu import CriuBackend

    return CriuBackend(**kw)


@BACKENDS.register("cuda", CudaArgs)
def _cuda(**kw: Any) -> CheckpointBackend:
    from .cuda import CudaBackend

    return CudaBackend(**kw)


@BACKENDS.register("app", AppArgs)
def _app(**kw: Any) -> CheckpointBackend:
    from .app_hook import AppHookBackend

    return AppHookBackend(**kw)
