"""The application-hook SDK: a training script checkpoints itself at safe points when asked.

For jobs that cannot be checkpointed transparently (or should not be: a state_dict is smaller than a process
image and survives a change of GPU model), the script registers two callbacks and calls `safe_point` once per
step::

    from gpudefrag.job import Job

    job = Job(save=lambda d: torch.save(state(), d / "state.pt"),
              load=lambda d: restore(torch.load(d / "state.pt")))
    meta = job.resume()                # loads the checkpoint this run was restored from, if any
    step = meta["step"] if meta else 0
    while step < total:
        train_one_step(); step += 1
        job.safe_point(step)           # saves here if a checkpoint was asked for (signal) or is due (heartbeat)

A checkpoint is asked for by a signal (SIGUSR1 unless `GPUDEFRAG_CHECKPOINT_SIGNAL` names another: `USR2`,
`SIGUSR2` or `12`) or by the heartbeat schedule (`every_s`). The signal handler only sets a flag: saving
inside a handler could catch the model half-updated. Each save lands atomically in the spool folder
(`GPUDEFRAG_JOB_SPOOL`) as `<seq>/` with a `meta.json`; the application-hook backend
(`gpudefrag.checkpoint.app_hook`) picks it up, signs it into the store, and on restore starts the script again
with `GPUDEFRAG_RESTORE_FROM` pointing at the verified copy.

A save that fails (a full disk, an error in `save`) never stops training: `safe_point` removes the partial
folder, reports the error on stderr and in `last_error`, and tries again at the next request or period.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .jobside.env import (
    APP_BACKEND,
    ENV_RESTORE_FROM,
    ENV_SIGNAL,
    ENV_SPOOL,
    ENV_STORE,
    ENV_WORKLOAD,
    META,
    checkpoint_signal,
    spool_entries,
)


class Job:
    def __init__(self, save: Callable[[Path], None], load: Callable[[Path], None], *,
                 spool: Path | str | None = None, signum: int | None = None, every_s: float | None = None,
                 keep: int = 2, clock: Callable[[], float] = time.monotonic) -> None:
        self._save, self._load = save, load
        self.spool = Path(spool or os.environ.get(ENV_SPOOL) or ".gpudefrag-spool")
        self.every_s = every_s
        self.keep = max(1, keep)
        self._clock = clock
        self._last_save = clock()
        self._requested = False
        self.last_error: str | None = None  # why the last save failed (None after a good one)
        sig = signum if signum is not None else checkpoint_signal(os.environ.get(ENV_SIGNAL))
        signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self._requested = True

    @property
    def requested(self) -> bool:
        return self._requested

    def due(self) -> bool:
        return self._requested or (self.every_s is not None and self._clock() - self._last_save >= self.every_s)

    def resume(self) -> dict[str, Any] | None:
        """Load the checkpoint to resume from and return its metadata (what `save` was given), else None.

        `GPUDEFRAG_RESTORE_FROM` (set by the restorer, which verified the checkpoint first) wins; otherwise,
        when `GPUDEFRAG_STORE` and `GPUDEFRAG_WORKLOAD_ID` are set, the newest application checkpoint of the
        workload that verifies — never one of the wrapper's CRIU images of the same workload. The store's key
        must exist (`GPUDEFRAG_KEY`): a missing key is an error, never a new key.
        """
        src = os.environ.get(ENV_RESTORE_FROM)
        if not src and os.environ.get(ENV_STORE) and os.environ.get(ENV_WORKLOAD):
            from .checkpoint.keys import load_key
            from .checkpoint.store import CheckpointStore, default_key_path

            load_key(default_key_path(), create=False)
            store = CheckpointStore(Path(os.environ[ENV_STORE]), default_key_path())
            for row in store.list(os.environ[ENV_WORKLOAD]):  # newest first
                if row["signed"] and row["backend"] == APP_BACKEND and store.verify(row["id"]).ok:
                    src = str(store.path(row["id"]))
                    break
        if not src:
            return None
        d = Path(src)
        self._load(d)
        meta: dict[str, Any] = json.loads((d / META).read_text())
        return meta

    def safe_point(self, step: int, **meta: Any) -> Path | None:
        """Call between steps. Saves (and returns the folder) when a checkpoint was asked for or is due."""
        if not self.due():
            return None
        try:
            return self.save(step, **meta)
        except Exception as e:  # a checkpoint is never worth the training run: report, go on, retry later
            self.last_error = f"checkpoint at step {step} failed: {type(e).__name__}: {e}"
            self._last_save = self._clock()  # the next period, not every step
            print(f"gpudefrag.job: {self.last_error} (training goes on)", file=sys.stderr, flush=True)
            return None

    def save(self, step: int, **meta: Any) -> Path:
        """Save now; on failure the partial folder is removed and the error raised."""
        self._requested = False  # a signal that arrives during this save asks for another one
        self.spool.mkdir(parents=True, exist_ok=True, mode=0o700)
        entries = spool_entries(self.spool)
        seq = int(entries[-1].name) + 1 if entries else 1
        tmp = self.spool / f".tmp-{seq:08d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir(mode=0o700)
            self._save(tmp)
            doc = {"step": step, "saved_at": time.time(), "pid": os.getpid(), **meta}
            (tmp / META).write_text(json.dumps(doc))
            for p in tmp.rglob("*"):
                if p.is_file():
                    with open(p, "rb") as f:
                        os.fsync(f.fileno())
            final = self.spool / f"{seq:08d}"
            os.rename(tmp, final)  # complete or absent: the backend never sees half a save
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._last_save = self._clock()
        self.last_error = None
        for old in spool_entries(self.spool)[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final
