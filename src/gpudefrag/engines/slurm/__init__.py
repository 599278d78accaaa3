"""Slurm: observe through `sinfo`/`squeue` JSON (22.05 and 24.11 dialects) and `scontrol show -o`; act through
`scontrol hold|release|requeuehold|update` and `scancel --signal`."""

from .engine import SlurmEngine
from .reasons import ReasonClass, classify, map_reason, waits_for_resources

__all__ = ["ReasonClass", "SlurmEngine", "classify", "map_reason", "waits_for_resources"]
