"""The one interface every checkpointer implements, and the results and errors they share.

A backend turns a running job into files in a directory (`checkpoint`) and files back into a running job
(`restore`). It knows nothing about signing or retention: the store (`store.py`) wraps whatever a backend
wrote, and `restore.py` verifies before any backend sees the files.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..errors import GpudefragError

# Stable reason codes: callers (the executor, the CLI, scripts) branch on these strings, so never rename one.
OK = "ok"
NOT_FOUND = "not-found"
MISSING_MANIFEST = "missing-manifest"
BAD_MANIFEST = "bad-manifest"
BAD_SIGNATURE = "bad-signature"
WRONG_KEY = "wrong-key"
HASH_MISMATCH = "hash-mismatch"
SIZE_MISMATCH = "size-mismatch"
MISSING_FILE = "missing-file"
UNEXPECTED_FILE = "unexpected-file"
UNSAFE_PATH = "unsafe-path"
INCOMPATIBLE = "incompatible"
INSECURE_KEY = "insecure-key"
MISSING_KEY = "missing-key"
OWNER_MISMATCH = "owner-mismatch"
BAD_WORKLOAD = "bad-workload"
WRONG_WORKLOAD = "wrong-workload"  # a checkpoint of another workload (or another user) named for this one
STORE_FULL = "store-full"
CHECKPOINT_FAILED = "checkpoint-failed"
RESTORE_FAILED = "restore-failed"
UNAVAILABLE = "unavailable"

REFUSAL_CODES = frozenset(
    {NOT_FOUND, MISSING_MANIFEST, BAD_MANIFEST, BAD_SIGNATURE, WRONG_KEY, HASH_MISMATCH, SIZE_MISMATCH,
     MISSING_FILE, UNEXPECTED_FILE, UNSAFE_PATH, INCOMPATIBLE, OWNER_MISMATCH, WRONG_WORKLOAD}
)


class CheckpointError(GpudefragError):
    """A checkpoint operation failed or was refused. `reason` is one of the stable codes above; the CLI prints
    `reason: detail` on one line and exits 2."""

    def __init__(self, reason: str, detail: str, *, path: str | None = None, fields: tuple[str, ...] = ()):
        self.reason = reason
        self.detail = detail
        self.path = path
        self.fields = fields
        # a checkpoint that stopped the job and could not commit: where the job went (see operations.py)
        self.restored_pid: int | None = None
        self.kept_images: str | None = None
        # set by a backend that failed after it stopped the job: what it wrote (the images are its only state)
        self.stopped: CheckpointResult | None = None
        where = f"{path}: " if path else ""
        super().__init__(f"{where}{reason}: {detail}")

    def as_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"ok": False, "reason": self.reason, "detail": self.detail, "path": self.path,
                               "fields": list(self.fields)}
        if self.restored_pid is not None:
            doc["restored_pid"] = self.restored_pid
        if self.kept_images is not None:
            doc["kept_images"] = self.kept_images
        return doc


@dataclass(frozen=True)
class CheckpointResult:
    """What a backend wrote and how long the job was frozen.

    `mode` says which path was taken ("dump", "precopy", "page-server", "app-hook", "cuda+dump"), and
    `notes` why (e.g. a pre-copy request that fell back to a plain dump because the kernel lacks dirty tracking).
    """

    backend: str
    directory: str
    mode: str
    leave_running: bool
    duration_s: float
    frozen_s: float | None = None
    bytes_written: int = 0
    pid: int | None = None
    checkpointer: str | None = None  # e.g. "criu 4.1.1"
    notes: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)  # backend-specific facts for the manifest

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RestoreResult:
    """A restored job: its host PID, how long until it ran again, and (lazy restore) until all pages arrived."""

    backend: str
    directory: str
    pid: int
    duration_s: float
    mode: str = "restore"
    exit_code: int | None = None  # foreground restore: the job's exit status
    pages_complete_s: float | None = None
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class CheckpointBackend(Protocol):
    """Checkpoint a running job into `dest`; restore a job from a directory a checkpoint left.

    `target` is a host PID (CRIU, CUDA, application hook). `precopy` asks for iterative pre-dump rounds where
    the backend and kernel allow them; a backend that cannot must fall back and say so in `CheckpointResult`.
    """

    name: str

    def checkpoint(self, target: int, dest: Path, *, leave_running: bool = False,
                   precopy: bool = False) -> CheckpointResult: ...

    def restore(self, ckpt_dir: Path, **options: Any) -> RestoreResult: ...

    def version(self) -> str: ...
