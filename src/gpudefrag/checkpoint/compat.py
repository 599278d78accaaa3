"""Is this checkpoint restorable here? The host's own Versions record, checked by the one rule.

The planner decides compatibility for a *node in a snapshot*; a restore decides it for the machine it runs on,
from facts it can read itself (uname, the checkpointer, the GPUs). Both call `gpudefrag.core.compat.mismatches`
with the same `CompatRule` (per field: exact / minor / major / at-least / any), so a move the planner accepted
is never refused here for compatibility when the host is what the node said it was.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable

import msgspec

from ..core.compat import ORDER, CompatRule
from ..core.compat import mismatches as rule_mismatches
from ..core.model import Versions

__all__ = ["DEFAULT_FIELDS", "CompatRule", "field_names", "host_versions", "merge", "mismatches"]

# Fields compared by default: every one the rule governs, and the GPU count (a minimum).
DEFAULT_FIELDS: tuple[str, ...] = ORDER


def host_versions(checkpointer: str | None = None, gpu: Versions | None = None) -> Versions:
    """What this machine offers: CPU architecture, kernel release, the checkpointer, and (when a GPU probe
    ran) GPU model, count, driver and CUDA versions."""
    g = gpu or Versions()
    return Versions(gpu_model=g.gpu_model, gpu_count=g.gpu_count, driver=g.driver, cuda=g.cuda,
                    cpu_arch=platform.machine(), kernel=platform.release(), checkpointer=checkpointer)


def mismatches(record: Versions, here: Versions, fields: Iterable[str] = DEFAULT_FIELDS,
               rule: CompatRule | None = None) -> list[str]:
    """Fields where the checkpoint needs something this host does not have, as 'field: checkpoint=X, here=Y'
    (empty list = compatible), under `rule` (default: the planner's default rule)."""
    return [f"{m.field}: checkpoint={m.recorded}, here={m.offered}"
            for m in rule_mismatches(record, here, rule, only=fields)]


def field_names(diffs: Iterable[str]) -> tuple[str, ...]:
    return tuple(d.split(":", 1)[0] for d in diffs)


def merge(base: Versions, **overrides: str | int | None) -> Versions:
    """A copy of `base` with the given fields set (None values ignored)."""
    return msgspec.structs.replace(base, **{k: v for k, v in overrides.items() if v is not None})
