"""Application-hook backend: the job saves its own state (`gpudefrag.job.Job`) when signalled.

checkpoint(pid): signal the job, wait for the save it completes at its next safe point, copy that save into
the checkpoint folder, and (unless leave_running) kill the job. The job's command line, working directory,
spool and stdout go into the manifest so that `restore` can start it again — in a new process, with
`GPUDEFRAG_RESTORE_FROM` pointing at the (already verified) checkpoint folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..job import ENV_RESTORE_FROM, ENV_SIGNAL, ENV_SPOOL, checkpoint_signal, spool_entries
from .launch import spawn_job
from .protocol import CHECKPOINT_FAILED, RESTORE_FAILED, CheckpointError, CheckpointResult, RestoreResult

VERSION = "gpudefrag-app-hook 1"


def _proc_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(x.split("=", 1) for x in raw.decode(errors="replace").split("\0") if "=" in x)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


@dataclass
class AppHookBackend:
    spool: Path | None = None  # default: the job's own GPUDEFRAG_JOB_SPOOL
    signum: int = signal.SIGUSR1
    timeout_s: float = 600.0
    name: str = "app"
    # A state_dict does not depend on the kernel, CRIU or the CPU's microarchitecture: nothing host-side to check.
    compat_fields: tuple[str, ...] = ()

    def version(self) -> str:
        return VERSION

    def checkpoint(self, target: int, dest: Path, *, leave_running: bool = False,
                   precopy: bool = False) -> CheckpointResult:
        pid = int(target)
        try:
            env = _proc_env(pid)
            argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
            cwd = os.readlink(f"/proc/{pid}/cwd")
            stdout = os.readlink(f"/proc/{pid}/fd/1")
        except (FileNotFoundError, ProcessLookupError):
            raise CheckpointError(CHECKPOINT_FAILED, f"no process with PID {pid}") from None
        spool = Path(self.spool or env.get(ENV_SPOOL) or Path(cwd) / ".gpudefrag-spool")
        if not spool.is_absolute():
            spool = Path(cwd) / spool
        sig = checkpoint_signal(env.get(ENV_SIGNAL), self.signum)
        before = spool_entries(spool)
        last = before[-1].name if before else ""
        t0 = time.perf_counter()
        os.kill(pid, sig)
        deadline = time.monotonic() + self.timeout_s
        entry = None
        while time.monotonic() < deadline:
            new = [e for e in spool_entries(spool) if e.name > last]
            if new:
                entry = new[-1]
                break
            if not _alive(pid):
                raise CheckpointError(CHECKPOINT_FAILED, f"PID {pid} exited before saving (is it using "
                                      "gpudefrag.job.Job and calling safe_point?)")
            time.sleep(0.02)
        if entry is None:
            raise CheckpointError(CHECKPOINT_FAILED, f"PID {pid} saved nothing within {self.timeout_s} s")
        saved_s = time.perf_counter() - t0
        if not leave_running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
        n = 0
        for f in entry.rglob("*"):
            rel = f.relative_to(entry)
            if f.is_dir():
                (dest / rel).mkdir(exist_ok=True)
            elif f.is_file():
                shutil.copy2(f, dest / rel)
                n += f.stat().st_size
        notes = ("pre-copy does not apply to application checkpoints",) if precopy else ()
        extra: dict[str, Any] = {"pid": pid, "argv": argv, "cwd": cwd, "spool": str(spool),
                                 "stdout": stdout if stdout.startswith("/") else None, "signal": sig,
                                 "spool_entry": entry.name}
        return CheckpointResult(backend=self.name, directory=str(dest), mode="app-hook", leave_running=leave_running,
                                duration_s=time.perf_counter() - t0, frozen_s=saved_s, bytes_written=n, pid=pid,
                                checkpointer=VERSION, notes=notes, extra=extra)

    def restore(self, ckpt_dir: Path, *, info: dict[str, Any] | None = None, argv: list[str] | None = None,
                cwd: Path | None = None, stdout: Path | None = None, env: dict[str, str] | None = None,
                wait: bool = False, **_: Any) -> RestoreResult:
        """Start the job's command again, told to resume from `ckpt_dir` (verified by the caller)."""
        facts = info or {}
        argv = argv or facts.get("argv")
        if not argv:
            raise CheckpointError(RESTORE_FAILED, "no command line to restart (pass argv=...)", path=str(ckpt_dir))
        out = Path(stdout or facts.get("stdout") or Path(ckpt_dir).parent / "restored-job.out")
        full_env = {**os.environ, **(env or {}), ENV_RESTORE_FROM: str(ckpt_dir)}
        if facts.get("spool"):
            full_env.setdefault(ENV_SPOOL, facts["spool"])
        t0 = time.perf_counter()
        job = spawn_job(argv, stdout=out, cwd=Path(cwd or facts.get("cwd") or "."), env=full_env)
        started = time.perf_counter() - t0
        code = job.popen.wait() if wait else None
        return RestoreResult(backend=self.name, directory=str(ckpt_dir), pid=job.pid, duration_s=started,
                             mode="app-hook", exit_code=code)
