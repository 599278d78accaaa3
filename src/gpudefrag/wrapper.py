"""The job wrapper: `gpudefrag run -- CMD...` inside an sbatch script. Started as root it runs here, in-process;
started as the job's user (a batch script's case) it is a client of the root run service (`run_service.py`),
whose child per client runs this same code for that job.

It starts the workload so that CRIU can dump it (its own session and PID namespace, output appended to a
file), answers checkpoint requests — a request file written by the controller, hurried by
`scancel --signal=USR2 --batch` — and takes heartbeat checkpoints on the policy's schedule. When the job starts
again after a move it restores the checkpoint its restore ticket names (or the newest verified one); a refused
restore cold-starts the workload and records why. Restored processes keep their old environment
(SLURMD_NODENAME, CUDA_VISIBLE_DEVICES), so the wrapper rewrites a node file whose path the workload gets in
GPUDEFRAG_NODE_FILE.

The workload never outlives the wrapper. It runs as PID 1 of its own PID namespace, so killing that one
process takes its whole tree along; every such root (started or restored) is handed to a guard, a forked
watcher holding the read end of a pipe whose only write end the wrapper holds. However the wrapper ends — a
handled signal (it stops the workload itself, then exits 128+N), a crash, SIGKILL — the pipe reaches EOF and
the guard SIGKILLs the roots through pidfds (no PID reuse). A parent-death signal on the root would not do:
CRIU restores it, and it then fires when `criu restore -d` exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from .core.compat import CompatRule
from .errors import InputError
from .fileio import write_json_atomic
from .jobside.jobdir import JobDir, read_json
from .jobside.messages import RunPhase

if TYPE_CHECKING:
    from .checkpoint.launch import AsUser, JobUser

PR_SET_CHILD_SUBREAPER = 36
STORE_FULL = "store-full"
LOST_EXIT = 3  # the workload was stopped by a checkpoint that was not committed, and could not be restored
# signals that would end the wrapper: it stops the workload first, then exits 128+N. Synchronous faults
# (SEGV, BUS, FPE, ILL) cannot be handled from Python; the guard covers those like SIGKILL.
_FATAL = tuple(s for s in signal.valid_signals() if s not in (
    signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGCONT, signal.SIGTSTP, signal.SIGTTIN,
    signal.SIGTTOU, signal.SIGWINCH, signal.SIGURG, signal.SIGPIPE, signal.SIGUSR1, signal.SIGUSR2,
    signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL))


@dataclass
class WrapperConfig:
    argv: Sequence[str]
    workload_id: str
    node: str
    run_dir: Path
    store_root: Path
    key_path: Path
    heartbeat_every_s: float | None = None
    heartbeat_cron: str | None = None
    keep: int = 2
    restarts: int = 0
    poll_s: float = 0.2
    user: JobUser | None = None  # whom the workload runs as (None: as the wrapper itself)
    # the environment, folder and interpreter a run service's client chose (None: the wrapper's own): applied
    # only after the drop to `user`, never seen by the stages that run as root
    as_user: AsUser | None = None
    # the cgroup.procs files of the cgroups the workload must run in (a run service's client's: its job's)
    cgroups: tuple[str, ...] = ()

    @staticmethod
    def from_env(argv: Sequence[str], **over: Any) -> WrapperConfig:
        env = os.environ
        wid = over.pop("workload_id", None) or env.get("GPUDEFRAG_WORKLOAD_ID") or env.get("SLURM_JOB_ID")
        if not wid:
            raise SystemExit("gpudefrag run: no workload id (not in a Slurm job: set GPUDEFRAG_WORKLOAD_ID)")
        run_dir = over.pop("run_dir", None) or env.get("GPUDEFRAG_RUN_DIR")
        store = over.pop("store_root", None) or env.get("GPUDEFRAG_STORE")
        if not run_dir or not store:
            raise SystemExit("gpudefrag run: --run-dir and --store (or GPUDEFRAG_RUN_DIR, GPUDEFRAG_STORE) are "
                             "needed, on a file system the controller sees too")
        from .checkpoint.store import default_key_path

        key = over.pop("key_path", None) or env.get("GPUDEFRAG_KEY") or default_key_path()
        return WrapperConfig(
            argv=list(argv), workload_id=str(wid),
            node=over.pop("node", None) or env.get("SLURMD_NODENAME") or socket.gethostname(),
            run_dir=Path(run_dir), store_root=Path(store), key_path=Path(key),
            restarts=int(env.get("SLURM_RESTART_COUNT", "0") or 0), user=job_user(over.pop("user", None)),
            **over)


def job_user(given: str | None) -> JobUser | None:
    """Whom the workload runs as. The wrapper runs as root (CRIU, the root-only store and key); the workload
    runs as the job's user: `--user NAME|UID`, else Slurm's SLURM_JOB_UID / SLURM_JOB_GID. None (the workload
    runs as the wrapper) when the wrapper is not root, or the job is root's own."""
    from .checkpoint.launch import JobUser

    env = os.environ
    if os.geteuid() != 0:
        return None
    gid = None
    if given is not None:
        import pwd

        try:
            uid = int(given) if given.isdigit() else pwd.getpwnam(given).pw_uid
        except KeyError:
            raise InputError("--user", "", f"no such user {given!r}") from None
    elif env.get("SLURM_JOB_UID", "").isdigit():
        uid = int(env["SLURM_JOB_UID"])
        gid = int(env["SLURM_JOB_GID"]) if env.get("SLURM_JOB_GID", "").isdigit() else None
    else:
        return None
    return None if uid == 0 else JobUser.of(uid, gid)


class Guard:
    """Kills the registered workload roots when the wrapper is gone, however it went (see the module doc)."""

    def __init__(self) -> None:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            try:
                os.close(w)
                _guard(r)
            finally:
                os._exit(0)
        os.close(r)
        self.pid, self._w = pid, w

    def watch(self, pid: int) -> None:
        os.write(self._w, f"{pid}\n".encode())


def _guard(r: int) -> None:
    os.setsid()  # out of the wrapper's process group: Ctrl-C or `kill -- -PGID` must not end the guard first
    for sig in (*_FATAL, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, r)
    os.closerange(r + 1, 65536)
    pidfds: list[tuple[int, int]] = []
    buf = b""
    while chunk := os.read(r, 4096):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for ln in lines:
            with contextlib.suppress(OSError, ValueError):
                pidfds.append((int(ln), os.pidfd_open(int(ln))))
    for pid, fd in pidfds:  # EOF: the wrapper is gone
        try:
            signal.pidfd_send_signal(fd, 0)  # still that very process (its PID not reused)?
        except OSError:
            continue
        # a launcher's children first: the namespace root it forked before the wrapper learnt that root's PID
        # (a live parent has not reaped them, so those PIDs are still its children)
        for kid in _children(pid):
            with contextlib.suppress(OSError):
                os.kill(kid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)


def _children(pid: int | str = "self") -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for t in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out += [int(c) for c in (t / "children").read_text().split()]
    return out


def _subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):  # ESRCH: exiting as we read
        return False


def _reason_of(e: BaseException) -> tuple[str, str]:
    """A stable reason code and a detail for a failed checkpoint."""
    text = str(e)
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return STORE_FULL, text
    if "No space left" in text or "ENOSPC" in text or "Disk quota" in text:
        return STORE_FULL, text
    return str(getattr(e, "reason", "checkpoint-failed")), getattr(e, "detail", text)


class Wrapper:
    def __init__(self, cfg: WrapperConfig, log: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.jd = JobDir(cfg.run_dir, cfg.workload_id)
        self.pid: int | None = None  # the workload's root process (host PID)
        self.launcher: Any = None  # the Popen that started it (fresh start) - None after a restore
        self.exit_code: int | None = None
        self.flags: dict[str, Any] = {"scan": False, "term": 0}
        self.lost: str | None = None  # why the workload is gone without having exited (never report success)
        self.kept_images: str | None = None  # where a lost workload's images are (its only copy of its state)
        self.guard: Guard | None = None
        self._guard_lost = False
        self.last_ckpt_at: float | None = None
        self.started_at = time.time()
        self._emit = log or (lambda m: print(f"[gpudefrag run {cfg.workload_id}@{cfg.node}] {m}", file=sys.stderr,
                                             flush=True))
        self.heartbeat: Any = None
        if cfg.heartbeat_every_s is not None or cfg.heartbeat_cron is not None:
            from .policy.models import Heartbeat

            self.heartbeat = Heartbeat(every_s=cfg.heartbeat_every_s, cron=cfg.heartbeat_cron, keep=cfg.keep)
        self._store: Any = None
        self._backend: Any = None

    # ------------------------------------------------------------------ plumbing
    def _log(self, msg: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # stderr gone (the terminal hung up): keep working
            self._emit(msg)

    def _track(self, pid: int) -> None:
        self.pid = pid
        if self.guard is not None:
            self.guard.watch(pid)

    @property
    def store(self) -> Any:
        if self._store is None:
            from .checkpoint.store import CheckpointStore

            self._store = CheckpointStore(self.cfg.store_root, self.cfg.key_path)
        return self._store

    @property
    def backend(self) -> Any:
        if self._backend is None:
            from .checkpoint.criu import CriuBackend

            self._backend = CriuBackend(log_dir=self.jd.root / "criu-logs")
        return self._backend

    def status(self, phase: RunPhase, **kw: Any) -> None:
        doc = {"phase": phase.value, "node": self.cfg.node, "pid": self.pid, "at": time.time(),
               "restarts": self.cfg.restarts, **kw}
        write_json_atomic(self.jd.status, doc)

    def _handled(self) -> list[str]:
        doc = read_json(self.jd.root / "handled.json") or {}
        return list(doc.get("tickets", []))

    def _mark_handled(self, ticket_id: str) -> None:
        write_json_atomic(self.jd.root / "handled.json", {"tickets": [*self._handled(), ticket_id][-50:]})

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        _subreaper()
        self.jd.ensure()  # a folder of ours nobody else may write: nothing written below can be redirected
        fd, tmp = tempfile.mkstemp(prefix=".node.", dir=self.jd.root)  # O_EXCL: never through a planted link
        with os.fdopen(fd, "w") as f:
            os.fchmod(fd, 0o644)  # the workload reads it
            f.write(self.cfg.node + "\n")
        os.replace(tmp, self.jd.node_file)
        ticket = read_json(self.jd.ticket)
        if ticket is not None and ticket.get("id") in self._handled():
            ticket = None
        if ticket is not None:
            tid = str(ticket["id"])
            self.status(RunPhase.STARTING, ticket_id=tid)
            why = str(ticket.get("reason") or "")
            ckpt = ticket.get("ckpt_id")
            rule = self.ticket_rule(ticket)
            skipped: list[str] = []  # "id: why" for each checkpoint refused, in the order tried
            if ckpt is not None:
                err = self._restore(str(ckpt), rule)
                if err is None:
                    self._mark_handled(tid)
                    self.status(RunPhase.RESTORED, ticket_id=tid, ckpt_id=ckpt)
                    self._log(f"restored {ckpt} (pid {self.pid})")
                    return
                skipped.append(f"{ckpt}: {err}")
                self._log(f"restore of {ckpt} refused: {err}; falling back to the newest verified checkpoint")
            got = self._restore_newest(rule, skipped, exclude=str(ckpt) if ckpt is not None else None)
            if got is not None:
                note = self._fallback_note(got, skipped, "the move's checkpoint" if ckpt is not None else "")
                self._mark_handled(tid)
                self.status(RunPhase.RESTORED, ticket_id=tid, ckpt_id=got, reason=note, skipped=skipped)
                self._log(f"restored {got} (pid {self.pid}): {note}")
                return
            why = f"{why}; " + ("; ".join(f"restore of {x} refused" for x in skipped) if skipped
                                else "no verified checkpoint to restore")
            why = why.lstrip("; ")
            self._fresh()
            self._mark_handled(tid)
            self.status(RunPhase.COLD_STARTED, ticket_id=tid, reason=why, skipped=skipped)
            self._log(f"cold start: {why}")
            return
        if self.cfg.restarts > 0:  # requeued by Slurm itself (node failure, admin requeue): newest good state
            skipped = []
            got = self._restore_newest(None, skipped)
            if got is not None:
                note = self._fallback_note(got, skipped, "")
                self.status(RunPhase.RESTORED, ckpt_id=got, reason=f"requeued: {note}", skipped=skipped)
                self._log(f"restored {got} (pid {self.pid}): requeued: {note}")
                return
            self._fresh()
            why = "requeued without a usable checkpoint" + (f" ({'; '.join(skipped)})" if skipped else "")
            self.status(RunPhase.COLD_STARTED, reason=why, skipped=skipped)
            self._log(f"cold start: {why}")
            return
        self._fresh()
        self.status(RunPhase.FRESH)

    def _restore_newest(self, rule: CompatRule | None, skipped: list[str], *, exclude: str | None = None) -> str | None:
        """Restore the newest of this workload's checkpoints that verifies (signature, every hash, compatibility),
        newest first; each one refused is logged with why (to the job's output) and added to `skipped`, so the
        fallback is never silent. The id restored, or None."""
        for row in self.store.list(self.cfg.workload_id):
            cid = str(row["id"])
            if cid == exclude or row.get("workload_id") != self.cfg.workload_id:
                continue
            err = self._restore(cid, rule) if row.get("signed") else "bad-signature: the manifest is not signed by "\
                "this store's key"
            if err is None:
                return cid
            skipped.append(f"{cid}: {err}")
            self._log(f"skipped checkpoint {cid}: {err}")
        return None

    @staticmethod
    def _fallback_note(got: str, skipped: list[str], what: str) -> str:
        """What the restore says when it is not the checkpoint first asked for."""
        if not skipped:
            return "newest verified checkpoint"
        head = f"{what} was refused, " if what else ""
        return (f"{head}fell back to the newest verified checkpoint {got} (skipped {'; '.join(skipped)}); "
                "the work since it is lost")

    def _fresh(self) -> None:
        from .checkpoint.launch import spawn_job

        ours = {"GPUDEFRAG_NODE_FILE": str(self.jd.node_file), "GPUDEFRAG_WORKLOAD_ID": self.cfg.workload_id}
        theirs = self.cfg.as_user
        if theirs is not None:
            theirs = replace(theirs, env={**theirs.env, **ours})
        job = spawn_job(self.cfg.argv, stdout=self.jd.root / "workload.out",
                        env={**os.environ, **ours} if theirs is None else None, pidns=True, user=self.cfg.user,
                        user_env=theirs, cgroups=self.cfg.cgroups,
                        on_launch=self.guard.watch if self.guard is not None else None)
        self.launcher = job.popen
        self._track(job.pid)
        self._log(f"started {' '.join(self.cfg.argv)} (pid {self.pid})")

    def ticket_rule(self, ticket: dict[str, Any]) -> CompatRule | None:
        """The compatibility rule the move was planned under, from its ticket (None: the default rule, every
        field exact — for a ticket without one, or one this version cannot read: the stricter rule refuses more,
        never restores what the planner would not have chosen)."""
        doc = ticket.get("compat")
        if doc is None:
            return None
        try:
            return CompatRule(**doc)
        except (TypeError, ValueError) as e:
            self._log(f"ticket {ticket.get('id')}: unreadable compatibility rule ({e}); using the default rule")
            return None

    def _restore(self, ckpt_id: str, rule: CompatRule | None = None) -> str | None:
        """Restore a checkpoint (verified and compatibility-checked first, under `rule`); None when it runs,
        else why not."""
        from .checkpoint.operations import restore_from_store
        from .checkpoint.protocol import CheckpointError

        try:
            # only this workload's own checkpoints, of a job that ran as the user the workload runs as: a ticket
            # naming another job's checkpoint must not bring that job's process up inside this one
            _, res = restore_from_store(self.store, ckpt_id, self.backend, rule=rule,
                                        workload_id=self.cfg.workload_id,
                                        uid=self.cfg.user.uid if self.cfg.user is not None else os.geteuid())
        except CheckpointError as e:
            return f"{e.reason}: {e.detail}"
        except OSError as e:
            return f"restore-failed: {e}"
        self.launcher = None
        self._track(res.pid)
        if self.cfg.cgroups:  # CRIU put it back where it was dumped: into this job's cgroups, or not at all
            from .checkpoint.launch import join_cgroups

            try:
                join_cgroups(res.pid, self.cfg.cgroups)
            except OSError as e:
                self.stop_workload(grace_s=0)
                return f"restore-failed: cannot join the job's cgroups: {e}"
        self.last_ckpt_at = time.time()
        return None

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self, *, stop: bool) -> tuple[str | None, str, str]:
        """(ckpt id or None, reason code, detail)."""
        from .checkpoint.operations import checkpoint_to_store

        if not _alive(self.pid):
            return None, "checkpoint-failed", "the workload is not running"
        assert self.pid is not None
        try:
            manifest, _ = checkpoint_to_store(self.store, self.backend, self.pid, self.cfg.workload_id,
                                              leave_running=not stop, keep=self.cfg.keep,
                                              on_retain=self._log_retention)
        except Exception as e:  # CheckpointError, OSError (ENOSPC), ...
            code, detail = _reason_of(e)
            self._after_uncommitted(e, code, detail)
            return None, code, detail
        self.last_ckpt_at = time.time()
        return manifest.id, "ok", ""

    def _log_retention(self, gc: Any) -> None:
        """Retention removes checkpoints (old ones, and corrupt ones that never count as kept): say which, why."""
        for line in gc.explain():
            self._log(f"retention removed checkpoint {line}")

    def _after_uncommitted(self, e: BaseException, code: str, detail: str) -> None:
        """A dump that stopped the workload and was not committed: the checkpoint layer either restored it in
        place from its images (`restored_pid`: that is the workload now, and the guard must take it along) or
        kept the images as its only copy (`kept_images`: the job is lost here; say where they are)."""
        restored = getattr(e, "restored_pid", None)
        if restored is not None:
            self.launcher = None
            self._track(int(restored))
            self._log(f"the workload was restored in place (pid {restored})")
        kept = getattr(e, "kept_images", None)
        if kept is not None:
            self.kept_images = str(kept)
            self.lost = (f"a checkpoint stopped the workload and was not committed ({code}: {detail}); it could not "
                         f"be restored in place; its images are kept at {kept}")

    def serve_requests(self) -> tuple[int, bool]:
        """Answer pending request files: (how many, whether a move checkpoint stopped the workload)."""
        served = 0
        if not self.jd.requests.is_dir():
            return 0, False
        for f in sorted(self.jd.requests.glob("*.json")):
            rid = f.stem
            if self.jd.response(rid).exists():
                continue
            served += 1
            req = read_json(f) or {}
            stop = bool(req.get("stop", False))
            self._log(f"checkpoint request {rid} (stop={stop})")
            ckpt, code, detail = self.checkpoint(stop=stop)
            running = _alive(self.pid)
            if ckpt is not None:
                write_json_atomic(self.jd.response(rid), {"state": "ok", "ckpt_id": ckpt, "still_running": running})
                if stop:
                    self.status(RunPhase.CHECKPOINTED, ckpt_id=ckpt)
                    self._log(f"checkpointed {ckpt}; the workload is stopped, waiting to be requeued")
                    return served, True
            else:
                if stop and not running and not self.lost:
                    self.lost = f"checkpoint {rid} stopped the workload and was not committed ({code}: {detail})"
                running = _alive(self.pid)
                write_json_atomic(self.jd.response(rid), {"state": "failed", "reason": code, "detail": detail,
                                                           "still_running": running})
                self._log(f"checkpoint {rid} failed: {code}: {detail}")
                if self.lost:
                    return served, False
        return served, False

    def heartbeat_due(self, now: float) -> bool:
        return self.heartbeat is not None and self.heartbeat.due(self.last_ckpt_at, now, self.started_at)

    # ------------------------------------------------------------------ the loop
    def _reap(self) -> None:
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.pid or (self.launcher is not None and pid == self.launcher.pid):
                self.exit_code = os.waitstatus_to_exitcode(st)
            elif self.guard is not None and pid == self.guard.pid:
                self._guard_lost = True

    def workload_done(self) -> bool:
        self._reap()
        if self.launcher is not None:
            if self.exit_code is not None:  # reaped above: Popen.poll() would now say 0 (ECHILD), not the code
                return True
            rc = self.launcher.poll()
            if rc is not None:
                self.exit_code = rc
                return True
            return False
        return not _alive(self.pid)

    def stop_workload(self, grace_s: float = 2.0) -> None:
        """SIGTERM, then SIGKILL after `grace_s`. The workload is PID 1 of its own PID namespace, which ignores
        signals it has no handler for, and once this wrapper exits it would be re-parented out of the job's
        process tree where Slurm cannot find it: so it must be gone before the wrapper goes."""
        if self.pid is None or not _alive(self.pid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        end = time.monotonic() + grace_s
        while time.monotonic() < end and _alive(self.pid):
            self._reap()
            time.sleep(0.05)
        if _alive(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            end = time.monotonic() + 2.0
            while time.monotonic() < end and _alive(self.pid):
                self._reap()
                time.sleep(0.02)
        self._reap()

    def _kill_strays(self) -> None:
        """Whatever else was re-parented to this subreaper (a launcher, an orphan of the workload) goes too."""
        guard = self.guard.pid if self.guard else -1
        for c in _children():
            if c != guard:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c, signal.SIGKILL)
        self._reap()

    def _on_signal(self, signum: int, frame: object) -> None:
        self.flags["term"] = self.flags["term"] or signum

    def deliver(self, signum: int) -> bool:
        """A signal that reached the wrapper another way (a run service's client forwards its own): acted on
        exactly as if the wrapper had received it. False for a signal the wrapper does not take (SIGKILL,
        SIGSTOP, SIGCHLD, ...: never passed on)."""
        if signum == signal.SIGUSR2:
            self.flags["scan"] = True
        elif signum == signal.SIGUSR1:
            self._forward(signum, None)
        elif signum in _FATAL:
            self._on_signal(signum, None)
        else:
            return False
        return True

    def _forward(self, signum: int, frame: object) -> None:
        """SIGUSR1 is the SDK's checkpoint signal: the workload's (a namespace's PID 1 ignores it without a
        handler, so this never kills it)."""
        if _alive(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)  # type: ignore[arg-type]

    def run(self) -> int:
        """Run the workload to its end; the exit code is its own, 128+N after signal N, LOST_EXIT when a
        checkpoint stopped it without committing. No path out of here leaves the workload running."""
        signal.signal(signal.SIGUSR2, lambda *_: self.flags.__setitem__("scan", True))
        signal.signal(signal.SIGUSR1, self._forward)
        for sig in _FATAL:
            signal.signal(sig, self._on_signal)
        self.guard = Guard()
        try:
            return self._run()
        except Exception as e:
            self._log(f"wrapper failed: {type(e).__name__}: {e}; stopping the workload")
            with contextlib.suppress(Exception):
                self.status(RunPhase.EXITED, reason=f"wrapper failed: {e}")
            return 1
        finally:
            self.stop_workload()
            self._kill_strays()

    def _rearm_guard(self) -> None:
        """The guard was killed (first, before the wrapper): start a new one at once and hand it the workload's
        roots, so that a SIGKILL of the wrapper a moment later still takes the workload along."""
        self._guard_lost = False
        old = self.guard
        self.guard = Guard()
        if old is not None:
            with contextlib.suppress(OSError):
                os.close(old._w)
        for pid in (self.launcher.pid if self.launcher is not None else None, self.pid):
            if pid is not None:
                self.guard.watch(pid)
        self._log(f"the guard was killed; a new guard (pid {self.guard.pid}) watches the workload")

    def _run(self) -> int:
        self.start()
        stopped = False
        while True:
            self._reap()
            if self._guard_lost:
                self._rearm_guard()
            if self.flags["term"]:
                sig = int(self.flags["term"])
                self._log(f"got {signal.Signals(sig).name}: stopping the workload")
                self.stop_workload()
                if not stopped:  # a requeue after a move's checkpoint ends us too: `checkpointed` must stay
                    self.status(RunPhase.EXITED, exit_code=128 + sig, reason=f"wrapper got {signal.Signals(sig).name}")
                return 128 + sig
            if self.lost:
                self.status(RunPhase.EXITED, exit_code=LOST_EXIT, reason=self.lost,
                            **({"kept_images": self.kept_images} if self.kept_images else {}))
                self._log(f"workload lost: {self.lost}")
                return LOST_EXIT
            if stopped:  # dumped for a move: wait to be requeued (the job must not end now)
                time.sleep(self.cfg.poll_s)
                continue
            if self.workload_done():
                code = self.exit_code if self.exit_code is not None else 0
                self.status(RunPhase.EXITED, exit_code=code)
                self._log(f"workload exited ({code})")
                return code
            scan = self.flags["scan"]
            self.flags["scan"] = False
            served, stopped = self.serve_requests()
            if stopped:
                continue
            now = time.time()
            if (scan and not served) or self.heartbeat_due(now):  # USR2 without a request file: checkpoint now
                ckpt, code, detail = self.checkpoint(stop=False)
                self._log(f"heartbeat checkpoint {ckpt}" if ckpt else f"heartbeat checkpoint failed: {code}: {detail}")
                if ckpt is None:
                    self.last_ckpt_at = now  # retry at the next period, not in a tight loop
            time.sleep(self.cfg.poll_s)


def run_wrapped(argv: Sequence[str], *, json_log: bool = False, **over: Any) -> int:
    """Check what can be checked before anything starts (the key exists, the schedule can fire), then run."""
    return prepare(WrapperConfig.from_env(argv, **over), json_log=json_log).run()


def prepare(cfg: WrapperConfig, *, json_log: bool = False) -> Wrapper:
    """The wrapper for `cfg`, after the checks that must pass before anything starts (the key exists, the run
    and job folders are root's alone, the heartbeat schedule can fire): one InputError/CheckpointError else."""
    from .checkpoint.keys import load_key

    load_key(cfg.key_path, create=False)  # a missing key is an error here: only `checkpoint` creates one
    JobDir(cfg.run_dir, cfg.workload_id).ensure()  # a run or job folder others may write: refused now
    log = None
    if json_log:
        import json

        def log(msg: str) -> None:
            print(json.dumps({"at": time.time(), "workload": cfg.workload_id, "node": cfg.node, "event": msg}),
                  file=sys.stderr, flush=True)

    try:
        w = Wrapper(cfg, log)
    except ValidationError as e:  # a heartbeat schedule that cannot work: refused before anything starts
        err = e.errors()[0]
        raise InputError("gpudefrag run", "heartbeat." + ".".join(map(str, err["loc"])), err["msg"]) from None
    return w
