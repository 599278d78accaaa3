"""The environment names, signal and spool layout a job and gpudefrag agree on (`gpudefrag.job.Job` writes
saves, the application-hook backend reads them, the wrapper and the restorer set the variables)."""

from __future__ import annotations

import signal
from pathlib import Path

from ..errors import InputError

ENV_SPOOL = "GPUDEFRAG_JOB_SPOOL"
ENV_RESTORE_FROM = "GPUDEFRAG_RESTORE_FROM"
ENV_SIGNAL = "GPUDEFRAG_CHECKPOINT_SIGNAL"
ENV_STORE = "GPUDEFRAG_STORE"
ENV_WORKLOAD = "GPUDEFRAG_WORKLOAD_ID"
META = "meta.json"
APP_BACKEND = "app"  # the store's backend name for these saves (AppHookBackend.name)
# a handler cannot be installed for these
_NOT_CATCHABLE = {signal.SIGKILL, signal.SIGSTOP}


def checkpoint_signal(value: str | None, default: int = signal.SIGUSR1) -> int:
    """`GPUDEFRAG_CHECKPOINT_SIGNAL` as a signal number: a name (`USR1`, `SIGUSR1`) or a number; None → default.
    Anything else is an error naming the variable, not a traceback from deep inside `signal`."""
    if value is None:
        return int(default)
    text = value.strip().upper()
    try:
        sig = signal.Signals(int(text)) if text.isdigit() else signal.Signals[text if text.startswith("SIG")
                                                                              else "SIG" + text]
    except (KeyError, ValueError):
        sig = None
    if sig is None or sig in _NOT_CATCHABLE:
        raise InputError(ENV_SIGNAL, "", f"{value!r} is not a signal a handler can catch (e.g. USR1, SIGUSR2, 12)")
    return int(sig)


def spool_entries(spool: Path) -> list[Path]:
    """Complete saves in a spool folder, oldest first (names are zero-padded sequence numbers)."""
    if not spool.is_dir():
        return []
    return sorted(p for p in spool.iterdir() if p.is_dir() and p.name.isdigit() and (p / META).is_file())
