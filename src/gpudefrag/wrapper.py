"""The job wrapper: `gpudefrag run -- CMD...` inside an sbatch script, the only gpudefrag piece on the nodes.

It starts the workload so that CRIU can dump it (its own session and PID namespace, output appended to a
file), answers checkpoint requests — a request file written by the controller, hurried by
`scancel --signal=USR2 --batch` — and takes heartbeat checkpoints on the policy's schedule. When the job starts
again after a move it restores the checkpoint its restore ticket names (or the newest verified one); a refused
restore cold-starts the workload and records why. Restored processes keep their old environment
(SLURMD_NODENAME, CUDA_VISIBLE_DEVICES), so the wrapper rewrites a node file whose path the workload gets in
GPUDEFRAG_NODE_FILE.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .control.agent import JobDir, RunPhase, read_json
from .fileio import write_json_atomic

PR_SET_CHILD_SUBREAPER = 36
STORE_FULL = "store-full"


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
            restarts=int(env.get("SLURM_RESTART_COUNT", "0") or 0), **over)


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
    except (FileNotFoundError, IndexError):
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
        self.flags = {"scan": False, "term": False}
        self.last_ckpt_at: float | None = None
        self.started_at = time.time()
        self._log = log or (lambda m: print(f"[gpudefrag run {cfg.workload_id}@{cfg.node}] {m}", file=sys.stderr,
                                            flush=True))
        self._store: Any = None
        self._backend: Any = None

    # ------------------------------------------------------------------ plumbing
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
        self.jd.root.mkdir(parents=True, exist_ok=True)
        (self.jd.node_file.parent / ".node.tmp").write_text(self.cfg.node + "\n")
        os.replace(self.jd.node_file.parent / ".node.tmp", self.jd.node_file)
        ticket = read_json(self.jd.ticket)
        if ticket is not None and ticket.get("id") in self._handled():
            ticket = None
        if ticket is not None:
            tid = str(ticket["id"])
            self.status(RunPhase.STARTING, ticket_id=tid)
            why = str(ticket.get("reason") or "")
            ckpt = ticket.get("ckpt_id")
            if ckpt is None:
                latest = self.store.latest(self.cfg.workload_id)
                ckpt = latest.id if latest is not None else None
            if ckpt is not None:
                err = self._restore(str(ckpt))
                if err is None:
                    self._mark_handled(tid)
                    self.status(RunPhase.RESTORED, ticket_id=tid, ckpt_id=ckpt)
                    self._log(f"restored {ckpt} (pid {self.pid})")
                    return
                why = f"{why}; restore of {ckpt} refused: {err}".lstrip("; ")
            else:
                why = f"{why}; no verified checkpoint to restore".lstrip("; ")
            self._fresh()
            self._mark_handled(tid)
            self.status(RunPhase.COLD_STARTED, ticket_id=tid, reason=why)
            self._log(f"cold start: {why}")
            return
        if self.cfg.restarts > 0:  # requeued by Slurm itself (node failure, admin requeue): newest good state
            latest = self.store.latest(self.cfg.workload_id)
            if latest is not None and self._restore(latest.id) is None:
                self.status(RunPhase.RESTORED, ckpt_id=latest.id, reason="requeued: newest verified checkpoint")
                return
            self._fresh()
            self.status(RunPhase.COLD_STARTED, reason="requeued without a usable checkpoint")
            return
        self._fresh()
        self.status(RunPhase.FRESH)

    def _fresh(self) -> None:
        from .checkpoint.launch import spawn_job

        env = {**os.environ, "GPUDEFRAG_NODE_FILE": str(self.jd.node_file),
               "GPUDEFRAG_WORKLOAD_ID": self.cfg.workload_id}
        job = spawn_job(self.cfg.argv, stdout=self.jd.root / "workload.out", env=env, pidns=True)
        self.pid, self.launcher = job.pid, job.popen
        self._log(f"started {' '.join(self.cfg.argv)} (pid {self.pid})")

    def _restore(self, ckpt_id: str) -> str | None:
        """Restore a checkpoint (verified and compatibility-checked first); None when it runs, else why not."""
        from .checkpoint.operations import restore_from_store
        from .checkpoint.protocol import CheckpointError

        try:
            _, res = restore_from_store(self.store, ckpt_id, self.backend)
        except CheckpointError as e:
            return f"{e.reason}: {e.detail}"
        except OSError as e:
            return f"restore-failed: {e}"
        self.pid, self.launcher = res.pid, None
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
                                              leave_running=not stop, keep=self.cfg.keep)
        except Exception as e:  # CheckpointError, OSError (ENOSPC), ...
            code, detail = _reason_of(e)
            return None, code, detail
        self.last_ckpt_at = time.time()
        return manifest.id, "ok", ""

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
                write_json_atomic(self.jd.response(rid), {"state": "failed", "reason": code, "detail": detail,
                                                           "still_running": running})
                self._log(f"checkpoint {rid} failed: {code}: {detail}")
        return served, False

    def heartbeat_due(self, now: float) -> bool:
        if self.cfg.heartbeat_every_s is None and self.cfg.heartbeat_cron is None:
            return False
        from .policy.models import Heartbeat

        hb = Heartbeat(every_s=self.cfg.heartbeat_every_s, cron=self.cfg.heartbeat_cron, keep=self.cfg.keep)
        return hb.due(self.last_ckpt_at, now, self.started_at)

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

    def workload_done(self) -> bool:
        self._reap()
        if self.launcher is not None:
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

    def run(self) -> int:
        signal.signal(signal.SIGUSR2, lambda *_: self.flags.__setitem__("scan", True))
        signal.signal(signal.SIGTERM, lambda *_: self.flags.__setitem__("term", True))
        self.start()
        stopped = False
        while True:
            if self.flags["term"]:
                self.stop_workload()
                return 143
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
    cfg = WrapperConfig.from_env(argv, **over)
    log = None
    if json_log:
        import json

        def log(msg: str) -> None:
            print(json.dumps({"at": time.time(), "workload": cfg.workload_id, "node": cfg.node, "event": msg}),
                  file=sys.stderr, flush=True)

    return Wrapper(cfg, log).run()
