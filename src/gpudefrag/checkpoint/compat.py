"""Is this checkpoint restorable here? The host's own Versions record, and the fields that must agree.

The planner's `gpudefrag.core.compat` decides this for a *node in a snapshot*; a restore decides it for the
machine it runs on, from facts it can read itself (uname, the checkpointer, the GPUs). Both compare
`gpudefrag.core.model.Versions` records, so a manifest written here is checkable by either.
"""

from __future__ import annotations

import dataclasses
import platform
from collections.abc import Iterable

from ..core.model import Versions

# Fields compared by default. engine/model describe the workload, not the host, so they are carried but not
# compared against a host record (a host has none).
DEFAULT_FIELDS: tuple[str, ...] = ("cpu_arch", "kernel", "checkpointer", "gpu_model", "gpu_count", "driver", "cuda")


def host_versions(checkpointer: str | None = None, gpu: Versions | None = None) -> Versions:
    """What this machine offers: CPU architecture, kernel release, the checkpointer, and (when a GPU probe
    ran) GPU model, count, driver and CUDA versions."""
    g = gpu or Versions()
    return Versions(gpu_model=g.gpu_model, gpu_count=g.gpu_count, driver=g.driver, cuda=g.cuda,
                    cpu_arch=platform.machine(), kernel=platform.release(), checkpointer=checkpointer)


def mismatches(record: Versions, here: Versions, fields: Iterable[str] = DEFAULT_FIELDS) -> list[str]:
    """Fields where the checkpoint needs something this host does not have, as 'field: checkpoint=X, here=Y'.

    A field the checkpoint does not record (None) needs nothing. gpu_count is a minimum; every other field
    must be equal. Empty list = compatible.
    """
    out = []
    for name in fields:
        want = getattr(record, name)
        have = getattr(here, name)
        if want is None:
            continue
        if name == "gpu_count":
            if (have or 0) < want:
                out.append(f"gpu_count: checkpoint={want}, here={have}")
        elif want != have:
            out.append(f"{name}: checkpoint={want}, here={have}")
    return out


def field_names(diffs: Iterable[str]) -> tuple[str, ...]:
    return tuple(d.split(":", 1)[0] for d in diffs)


def merge(base: Versions, **overrides: str | int | None) -> Versions:
    """A copy of `base` with the given fields set (None values ignored)."""
    return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})
