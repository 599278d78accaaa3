"""Checkpoint/restore: one `CheckpointBackend` protocol (CRIU, CUDA, application hook) and a signed store.

Import the pieces from their modules (`checkpoint.criu`, `checkpoint.store`, ...); this package file stays
light so that `python -m gpudefrag.checkpoint.probe_job` starts fast.
"""

from .protocol import CheckpointBackend, CheckpointError, CheckpointResult, RestoreResult

__all__ = ["CheckpointBackend", "CheckpointError", "CheckpointResult", "RestoreResult"]
