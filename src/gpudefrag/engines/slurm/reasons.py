"""Slurm's pending reasons, mapped onto gpudefrag's diagnosis causes.

The table itself is pure and lives in `gpudefrag.core.scheduler_reasons` (so a snapshot's Slurm reasons are
diagnosed without core importing an engine); this module gives it the Slurm engine's vocabulary.
"""

from __future__ import annotations

from ...core.diagnose import CauseCode
from ...core.scheduler_reasons import ReasonClass, classify_slurm


def classify(reason: str) -> tuple[ReasonClass, CauseCode | None]:
    """(class, cause) for a Slurm pending reason. Limits (Assoc*/QOS* ...Limit, GrpTRES) are quota causes."""
    cls, code = classify_slurm(reason)
    return cls, CauseCode(code) if code is not None else None


def map_reason(reason: str) -> CauseCode | None:
    """The diagnosis cause a Slurm reason names, or None when gpudefrag's own diagnosis must decide."""
    return classify(reason)[1]


def waits_for_resources(reason: str) -> bool:
    """True when starting the job only needs GPUs to be free (the only case a defrag move can help)."""
    return classify(reason)[0] is ReasonClass.CAPACITY


__all__ = ["ReasonClass", "classify", "map_reason", "waits_for_resources"]
