"""Application-hook backend: the job saves its own state (`gpudefrag.job.Job`) when signalled.

checkpoint(pid): signal the job, wait for the save it completes at its next safe point, copy that save into
the checkpoint folder, and only then (unless leave_running) kill the job. Everything about the job — command
line, environment, working directory, spool, stdout, and its uid/gid/groups — is read from /proc at checkpoint
time and goes into the signed manifest; `restore` never re-reads it from the job's folder.

We run as root and the spool belongs to the job's user, so the save is copied without trusting it
(`jobfiles.copy_tree`: no link in the spool's path, only regular files owned by the job's user, nothing
hard-linked; anything else refuses the checkpoint before the job is stopped). `restore` starts the recorded
command as the recorded user — never with more privilege than the job had — in the recorded folder, refused
(`owner-mismatch`) when that folder now belongs to someone else, with `GPUDEFRAG_RESTORE_FROM` pointing at a
private copy of the (already verified) checkpoint that the user may read.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..jobside.env import ENV_RESTORE_FROM, ENV_SIGNAL, ENV_SPOOL, META, checkpoint_signal
from .jobfiles import check_owner, copy_tree, opened_dir, process_owner, tree_bytes
from .protocol import (
    CHECKPOINT_FAILED,
    RESTORE_FAILED,
    STORE_FULL,
    UNSAFE_PATH,
    CheckpointError,
    CheckpointResult,
    RestoreResult,
)

VERSION = "gpudefrag-app-hook 1"


def _proc_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(x.split("=", 1) for x in _utf8(raw, pid, "environment").split("\0") if "=" in x)


def _utf8(raw: bytes, pid: int, what: str) -> str:
    """The manifest is JSON: a command line or environment that is not UTF-8 could not be recorded exactly, and
    a restore must run exactly what ran — so it is refused, not mangled."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise CheckpointError(CHECKPOINT_FAILED, f"PID {pid}: its {what} is not UTF-8; an application "
                              "checkpoint records it in the manifest and cannot") from None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def _entries(spool: Path) -> list[str]:
    """Complete saves in the spool (numbered folders holding meta.json), oldest first — read through a
    descriptor reached without links, never following one inside."""
    try:
        with opened_dir(spool) as fd:
            out = []
            for name in os.listdir(fd):
                if not name.isdigit():
                    continue
                try:
                    if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode) and stat.S_ISREG(
                            os.stat(f"{name}/{META}", dir_fd=fd, follow_symlinks=False).st_mode):
                        out.append(name)
                except OSError:
                    continue
            return sorted(out)
    except FileNotFoundError:
        return []


def _copy_entry(spool: Path, name: str, dest: Path, uid: int) -> int:
    with opened_dir(spool) as fd:
        if uid != 0 and os.fstat(fd).st_uid != uid:
            raise CheckpointError(UNSAFE_PATH, f"spool {spool} is owned by uid {os.fstat(fd).st_uid}, not the "
                                  f"job's uid {uid}")
        try:
            efd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError as e:
            raise CheckpointError(UNSAFE_PATH, f"{spool}/{name}: {e.strerror}") from None
        dfd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)  # the store's own folder
        try:
            return copy_tree(efd, dfd, uid)
        except OSError as e:  # the job is still running here: a full store only refuses this checkpoint
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise CheckpointError(STORE_FULL, f"no room to copy the save: {e.strerror}") from None
            raise CheckpointError(CHECKPOINT_FAILED, f"cannot copy the save {spool}/{name}: {e}") from None
        finally:
            os.close(dfd)
            os.close(efd)


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

    def _spool_of(self, pid: int, env: dict[str, str], cwd: str) -> Path:
        spool = Path(self.spool or env.get(ENV_SPOOL) or Path(cwd) / ".gpudefrag-spool")
        return spool if spool.is_absolute() else Path(cwd) / spool

    def estimate_bytes(self, pid: int) -> int:
        """The size of the job's newest save (the next one is about as large); 0 before its first save."""
        try:
            spool = self._spool_of(pid, _proc_env(pid), os.readlink(f"/proc/{pid}/cwd"))
            names = _entries(spool)
            if not names:
                return 0
            with opened_dir(spool / names[-1]) as fd:
                return tree_bytes(fd)
        except (OSError, CheckpointError):
            return 0  # the checkpoint itself will say what is wrong

    def checkpoint(self, target: int, dest: Path, *, leave_running: bool = False,
                   precopy: bool = False) -> CheckpointResult:
        pid = int(target)
        try:
            owner = process_owner(pid)
            env = _proc_env(pid)
            argv = [a for a in _utf8(Path(f"/proc/{pid}/cmdline").read_bytes(), pid, "command line").split("\0") if a]
            cwd = os.readlink(f"/proc/{pid}/cwd")
            stdout = os.readlink(f"/proc/{pid}/fd/1")
        except (FileNotFoundError, ProcessLookupError):
            raise CheckpointError(CHECKPOINT_FAILED, f"no process with PID {pid}") from None
        spool = self._spool_of(pid, env, cwd)
        sig = checkpoint_signal(env.get(ENV_SIGNAL), self.signum)
        before = _entries(spool)
        last = before[-1] if before else ""
        t0 = time.perf_counter()
        os.kill(pid, sig)
        deadline = time.monotonic() + self.timeout_s
        entry = None
        while time.monotonic() < deadline:
            new = [e for e in _entries(spool) if e > last]
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
        n = _copy_entry(spool, entry, Path(dest), owner["uid"])  # refused here: the job was not stopped
        if not leave_running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
        notes = ("pre-copy does not apply to application checkpoints",) if precopy else ()
        extra: dict[str, Any] = {"pid": pid, "argv": argv, "cwd": cwd, "spool": str(spool), "env": env,
                                 "owner": owner, "stdout": stdout if stdout.startswith("/") else None,
                                 "signal": sig, "spool_entry": entry}
        return CheckpointResult(backend=self.name, directory=str(dest), mode="app-hook", leave_running=leave_running,
                                duration_s=time.perf_counter() - t0, frozen_s=saved_s, bytes_written=n, pid=pid,
                                checkpointer=VERSION, notes=notes, extra=extra)

    def restore(self, ckpt_dir: Path, *, info: dict[str, Any] | None = None, argv: list[str] | None = None,
                cwd: Path | None = None, stdout: Path | None = None, env: dict[str, str] | None = None,
                wait: bool = False, **_: Any) -> RestoreResult:
        """Start the recorded command again as the recorded user, told to resume from a private copy of
        `ckpt_dir` (verified by the caller)."""
        facts = info or {}
        argv = argv or facts.get("argv")
        if not argv:
            raise CheckpointError(RESTORE_FAILED, "no command line to restart (pass argv=...)", path=str(ckpt_dir))
        owner = facts.get("owner")
        workdir = str(cwd or facts.get("cwd") or "/")
        check_owner(owner, [workdir, facts.get("spool")])
        assert owner is not None
        uid, gid, groups = int(owner["uid"]), int(owner["gid"]), [int(g) for g in owner.get("groups", [])]
        out = str(stdout or facts.get("stdout") or os.devnull)
        full_env = {**facts.get("env", {}), **(env or {})}
        if facts.get("spool"):
            full_env.setdefault(ENV_SPOOL, facts["spool"])
        copy = _private_copy(Path(ckpt_dir), uid, gid)
        full_env[ENV_RESTORE_FROM] = str(copy)

        def as_the_user() -> None:  # runs in the child after setgroups/setgid/setuid: with the user's rights only
            os.chdir(workdir)
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)

        t0 = time.perf_counter()
        try:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=full_env, user=uid, group=gid,
                                 extra_groups=groups, start_new_session=True, close_fds=True,
                                 preexec_fn=as_the_user)  # chdir and open must happen as the user
        except (OSError, subprocess.SubprocessError) as e:
            shutil.rmtree(copy, ignore_errors=True)
            raise CheckpointError(RESTORE_FAILED, f"cannot start {argv[0]!r} as uid {uid} in {workdir} with "
                                  f"stdout {out}: {e}", path=str(ckpt_dir)) from None
        started = time.perf_counter() - t0
        code = None
        if wait:
            code = p.wait()
            shutil.rmtree(copy, ignore_errors=True)
        else:
            _remove_when_done(p.pid, copy)
        return RestoreResult(backend=self.name, directory=str(ckpt_dir), pid=p.pid, duration_s=started,
                             mode="app-hook", exit_code=code,
                             notes=() if wait else (f"the job reads its checkpoint from {copy} (removed when it "
                                                    "exits)",))


def _remove_when_done(pid: int, copy: Path) -> None:
    """A restore that does not wait for its job still must not leave a full copy of the checkpoint behind: a
    detached watcher (no parent to outlive, no terminal) waits on the job's pidfd and removes the copy when the
    job ends. `shutil.rmtree` works from descriptors and never follows a link the user put in the copy."""
    pidfd = os.pidfd_open(pid)  # now, while `pid` is certainly the job (our unreaped child)
    try:
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the watcher
            try:
                os.setsid()
                if os.fork() != 0:
                    os._exit(0)
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.closerange(3, pidfd)
                os.closerange(pidfd + 1, 65536)
                select.select([pidfd], [], [])
                shutil.rmtree(copy, ignore_errors=True)
            finally:
                os._exit(0)
        os.waitpid(child, 0)
    finally:
        os.close(pidfd)


def _private_copy(src: Path, uid: int, gid: int) -> Path:
    """The verified checkpoint, copied into a fresh folder the job's user owns (the store stays root-only).

    The folder is made root-only (mkdtemp, 0700) and filled through descriptors, each new file and folder given
    to the user with `fchown` on its own descriptor while the user cannot yet reach any of them; the folder
    itself is handed over last. Handing it over first and then changing what is below it by path let the user
    swap a sub-folder for a link and have root change the owner of any file on the host."""
    d = Path(tempfile.mkdtemp(prefix="gpudefrag-restore-"))
    try:
        with opened_dir(d) as dfd:
            st = os.fstat(dfd)
            if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
                raise CheckpointError(UNSAFE_PATH, "the private copy's folder is not ours alone", path=str(d))
            with opened_dir(src.resolve()) as fd:
                copy_tree(fd, dfd, 0, give_to=(uid, gid))
            os.fchown(dfd, uid, gid)  # last: from now on nothing is done below it as root
    except BaseException:
        shutil.rmtree(d, ignore_errors=True)
        raise
    return d
