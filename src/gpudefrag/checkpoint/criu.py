"""CRIU backend: checkpoint a process tree by PID and restore it, on this node or another.

CLI, not RPC. We drive the `criu` binary (dump, restore, page-server, lazy-pages, check) rather than
`criu swrk` through pycriu because:
  * pycriu is not on PyPI; it ships inside the distribution's criu package, tied to that package's Python and
    protobuf (Debian 12's is for CRIU 3.17, Debian 13's is a separate package). The CLI is the one interface
    every install has, including the Debian 13 binary run through its own loader on Debian 12;
  * the modes we need are CLI subcommands anyway: `page-server` and `lazy-pages` are daemons that must run
    beside the dump/restore, `check --feature mem_dirty_track` decides pre-copy, and `--display-stats`
    prints the frozen time without needing crit;
  * the one thing RPC gives that the CLI lacks, the restored job as the caller's child (rst_sibling), we get
    by becoming a child subreaper before a detached restore (see `restore(wait=True)`), which also works
    for jobs in their own PID namespace.
The cost is a fork+exec per call (about 40 ms here, mostly CRIU re-probing the kernel) — noise beside a dump.

What this kernel (6.18, no CONFIG_MEM_SOFT_DIRTY) allows, measured in the lab: dump/restore, --leave-running,
page-server streaming, lazy restore from local images, moving between network and PID namespaces. Pre-dump
aborts, so `precopy=True` checks `criu check --feature mem_dirty_track` first and falls back to a plain dump,
saying so in `CheckpointResult.mode/notes`. Network post-copy (`dump --lazy-pages`) hangs here and is not used.

Root writes CRIU's logs, so the log folder must be private (`jobfiles.private_dir`: a folder a user planted, or a
link, is refused); the default is /run/gpudefrag/criu-logs, never a fixed name in a shared /tmp. The dump
records the job's uid/gid/groups and working folder; a restore is refused (`owner-mismatch`) when that folder now
belongs to someone else. CRIU itself gives the restored tasks back exactly the credentials they were dumped with.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from .jobfiles import check_job_files, check_owner, check_restored_files, job_files, private_dir, process_owner
from .launch import process_tree
from .protocol import (
    CHECKPOINT_FAILED,
    RESTORE_FAILED,
    STORE_FULL,
    UNAVAILABLE,
    CheckpointError,
    CheckpointResult,
    RestoreResult,
)

NET_KEY = "gpudefrag-net"  # the name the job's network namespace gets in the images (--external net[...])
MIN_VERSION = (4, 1)
PR_SET_CHILD_SUBREAPER = 36
_STAT_RE = re.compile(r"^([A-Za-z ]+?): (\d+)", re.M)
_KB_RE = re.compile(r"^(RssAnon|RssShmem):\s+(\d+) kB", re.M)


def find_criu() -> str:
    env = os.environ.get("GPUDEFRAG_CRIU")
    if env:
        return env
    for cand in (shutil.which("criu"), "/usr/local/sbin/criu", "/usr/sbin/criu"):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise CheckpointError(UNAVAILABLE, "criu not found: run scripts/install-criu.sh (CRIU >= 4.1 is needed)")


def _error_lines(log: Path, limit: int = 4) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    errs = [ln.strip() for ln in text.splitlines() if "Error" in ln and "RLIMIT_NOFILE" not in ln]
    return " | ".join(errs[-limit:])


def _out_of_space(log: Path, dest: Path) -> bool:
    """Did a failed dump run out of room (the images' file system full, or CRIU saying ENOSPC/EDQUOT)? Then the
    reason is `store-full`, which the controller treats differently from a job CRIU cannot dump."""
    try:
        st = os.statvfs(dest)
        if st.f_bavail * st.f_frsize < (1 << 20):
            return True
    except OSError:
        pass
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return False
    return "No space left on device" in text or "Disk quota exceeded" in text


def _stats(text: str) -> dict[str, int]:
    return {k.strip(): int(v) for k, v in _STAT_RE.findall(text)}


def _ns(pid: int | str, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


ROOT_LOG_DIR = Path("/run/gpudefrag/criu-logs")


@functools.cache
def default_log_dir() -> Path:
    """Where CRIU's logs go unless a folder is named: as root, /run/gpudefrag/criu-logs (folders only root can
    create); otherwise a fresh folder with an unpredictable name in $TMPDIR. Never a fixed name in a shared
    /tmp: a user who created it first would block every checkpoint on the host (it is refused, see
    `private_dir`)."""
    if os.geteuid() == 0:
        return ROOT_LOG_DIR
    return Path(tempfile.mkdtemp(prefix="gpudefrag-criu-logs-"))


def du_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and not p.is_symlink())


@dataclass(frozen=True)
class PageServerAddr:
    host: str
    port: int


@dataclass
class CriuBackend:
    """`CriuBackend().checkpoint(pid, dest)` and `.restore(dest)`; see the module docstring for why CLI."""

    criu_bin: str = field(default_factory=find_criu)
    log_dir: Path | None = None  # CRIU logs go here, never into the (signed) image folder
    log_level: int = 4
    keep_logs: bool = False  # logs of failed calls are always kept (their path is in the error)
    name: str = "criu"

    def __post_init__(self) -> None:
        self.log_dir = private_dir(self.log_dir or default_log_dir())

    # -- facts ----------------------------------------------------------------------------------------
    def _run(self, args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.criu_bin, *args], text=True, capture_output=True, **kw)

    @cached_property
    def _version(self) -> str:
        try:
            r = self._run(["--version"], timeout=30)
        except OSError as e:
            raise CheckpointError(UNAVAILABLE, f"{self.criu_bin}: {e.strerror}") from None
        m = re.search(r"Version:\s*([\d.]+)", r.stdout)
        if r.returncode != 0 or not m:
            raise CheckpointError(UNAVAILABLE, f"{self.criu_bin} --version failed: {r.stderr.strip()[:200]}")
        return m.group(1)

    def version(self) -> str:
        return f"criu {self._version}"

    def check(self) -> None:
        """`criu check` (and CRIU >= 4.1, which this kernel needs) or a clear CheckpointError(unavailable)."""
        v = tuple(int(x) for x in self._version.split(".")[:2])
        if v < MIN_VERSION:
            raise CheckpointError(UNAVAILABLE, f"criu {self._version} is too old; >= 4.1 is needed on kernels "
                                  ">= 6.13 (run scripts/install-criu.sh)")
        r = self._run(["check"], timeout=60)
        if r.returncode != 0:
            msg = " | ".join(ln for ln in (r.stdout + r.stderr).splitlines() if "RLIMIT" not in ln)[:400]
            raise CheckpointError(UNAVAILABLE, f"criu check failed: {msg}")

    @cached_property
    def dirty_tracking(self) -> bool:
        """True when the kernel tracks dirty pages (soft-dirty), so pre-dump / iterative pre-copy works."""
        r = self._run(["check", "--feature", "mem_dirty_track"], timeout=60)
        return r.returncode == 0

    def estimate_bytes(self, pid: int) -> int:
        """About what a dump of the tree will write: its anonymous and shared memory, plus 1 MiB a process."""
        total = 0
        for p in process_tree(pid):
            try:
                text = Path(f"/proc/{p}/status").read_text()
            except OSError:
                continue
            kb = dict(_KB_RE.findall(text))
            total += (int(kb.get("RssAnon", 0)) + int(kb.get("RssShmem", 0))) * 1024 + (1 << 20)
        return total

    # -- checkpoint -----------------------------------------------------------------------------------
    def checkpoint(self, target: int, dest: Path, *, leave_running: bool = False, precopy: bool = False,
                   page_server: PageServerAddr | None = None, tcp_established: bool = False,
                   precopy_rounds: int = 2) -> CheckpointResult:
        """Dump the process tree rooted at `target` into `dest` (which must exist and be empty).

        page_server: stream memory pages to a `criu page-server` (see `PageServer`) instead of `dest`; the
        other images still land in `dest` and must be copied next to the pages (`stream_checkpoint` does).
        """
        dest = Path(dest)
        pid = int(target)
        if not Path(f"/proc/{pid}").exists():
            raise CheckpointError(CHECKPOINT_FAILED, f"no process with PID {pid}")
        t0 = time.perf_counter()
        notes: list[str] = []
        opts = ["-t", str(pid), "--display-stats", "-v" + str(self.log_level)]
        try:
            extra: dict[str, Any] = {"pid": pid, "owner": process_owner(pid), "cwd": os.readlink(f"/proc/{pid}/cwd"),
                                     "files": job_files(process_tree(pid))}
        except (FileNotFoundError, ProcessLookupError):
            raise CheckpointError(CHECKPOINT_FAILED, f"no process with PID {pid}") from None
        if _ns(pid, "net") != _ns("self", "net"):
            ino = os.stat(f"/proc/{pid}/ns/net").st_ino
            opts += ["--external", f"net[{ino}]:{NET_KEY}"]
            extra["netns_external"] = True
        else:
            extra["netns_external"] = False
        extra["pidns_root"] = _ns(pid, "pid") != _ns("self", "pid")
        if tcp_established:
            opts += ["--tcp-established"]
        else:
            # the default iptables lock leaves a DROP-all chain in the source namespace when the job is
            # restored elsewhere; a job without TCP connections needs no lock
            opts += ["--network-lock", "skip"]
        if leave_running:
            opts.append("--leave-running")
        mode = "dump"
        if precopy and page_server is not None:
            notes.append("pre-copy with page-server streaming is not supported: took a plain streamed dump")
            mode = "dump (pre-copy unavailable)"
        elif precopy:
            if self.dirty_tracking:
                parent = self._predump_rounds(pid, dest, precopy_rounds, notes)
                opts += ["--track-mem", "--prev-images-dir", parent]
                mode = "precopy"
            else:
                notes.append("pre-copy requested but the kernel has no dirty-page tracking "
                             "(criu check --feature mem_dirty_track failed): took a plain dump")
                mode = "dump (pre-copy unavailable)"
        if page_server is not None:
            opts += ["--page-server", "--address", page_server.host, "--port", str(page_server.port)]
            mode = f"{mode}+page-server"
        log = self._log_path("dump", pid)
        r = self._run(["dump", "-D", str(dest), "-o", str(log), *opts])
        dur = time.perf_counter() - t0
        if r.returncode != 0:
            full = _out_of_space(log, dest)
            why = ": the store is full" if full else ""
            raise CheckpointError(STORE_FULL if full else CHECKPOINT_FAILED, f"criu dump of PID {pid} failed "
                                  f"(rc {r.returncode}){why}: {_error_lines(log)} (log: {log})")
        st = _stats(r.stdout + r.stderr)
        frozen = st.get("Frozen time")
        extra["stats"] = st
        if self.keep_logs:
            extra["log"] = str(log)
        else:
            log.unlink(missing_ok=True)
        return CheckpointResult(
            backend=self.name, directory=str(dest), mode=mode, leave_running=leave_running, duration_s=dur,
            frozen_s=frozen / 1e6 if frozen is not None else None, bytes_written=du_bytes(dest), pid=pid,
            checkpointer=self.version(), notes=tuple(notes), extra=extra)

    def _predump_rounds(self, pid: int, dest: Path, rounds: int, notes: list[str]) -> str:
        """Iterative pre-copy: each round copies what changed since the last while the job runs."""
        prev: str | None = None
        for i in range(1, max(1, rounds) + 1):
            d = dest / f"pre-{i}"
            d.mkdir(mode=0o700)
            log = self._log_path(f"predump{i}", pid)
            args = ["pre-dump", "-t", str(pid), "-D", str(d), "-o", str(log), "--track-mem", "--display-stats"]
            if prev:
                args += ["--prev-images-dir", f"../{prev}"]
            r = self._run(args)
            if r.returncode != 0:
                raise CheckpointError(CHECKPOINT_FAILED, f"criu pre-dump round {i} failed: {_error_lines(log)} "
                                      f"(log: {log})")
            if not self.keep_logs:
                log.unlink(missing_ok=True)
            notes.append(f"pre-dump round {i}: {_stats(r.stdout + r.stderr).get('Memory pages written', '?')} "
                         "pages written while the job ran")
            prev = d.name
        assert prev is not None
        return prev

    # -- restore --------------------------------------------------------------------------------------
    def restore(self, ckpt_dir: Path, *, wait: bool = False, netns: str | Path | None = None,
                new_pidns: bool | None = None, lazy: bool = False, tcp_established: bool = False,
                info: dict[str, Any] | None = None, **_: Any) -> RestoreResult:
        """Restore the job whose images are in `ckpt_dir` (already verified by the caller).

        wait: become a child subreaper, restore detached, then wait for the job and return its exit code
              (a job wrapper's foreground restore). Otherwise return as soon as the job runs.
        netns: a network namespace to restore into (`/run/netns/NAME` or NAME): "another node".
        new_pidns: require a fresh PID namespace (only possible when the job was dumped as PID 1 of its own
              namespace; see `spawn_job(pidns=True)`), so its PIDs never collide with the target's.
        lazy: `criu lazy-pages` serves memory on demand; the job runs before its pages are all in.
        info: the manifest's backend facts (netns_external, pidns_root) when known.
        """
        ckpt_dir = Path(ckpt_dir)
        facts = info or {}
        checked: dict[str, tuple[int, int]] | None = None
        if "owner" in facts:  # checkpoints written before owners were recorded carry their credentials in images
            check_owner(facts["owner"], [facts.get("cwd")])
            checked = check_job_files(facts.get("files", []))
        if new_pidns and facts.get("pidns_root") is False:
            raise CheckpointError(RESTORE_FAILED, "a fresh PID namespace needs a job dumped as PID 1 of its own "
                                  "namespace (start it with spawn_job(pidns=True))", path=str(ckpt_dir))
        work = Path(tempfile.mkdtemp(prefix="restore-", dir=self.log_dir))
        log = work / "restore.log"
        pidfile = work / "pid"
        args = ["restore", "-D", str(ckpt_dir), "-W", str(work), "-d", "-o", str(log), "--pidfile", str(pidfile),
                "--display-stats", "-v" + str(self.log_level)]
        if tcp_established:
            args.append("--tcp-established")
        if checked is not None:
            args.append("--leave-stopped")  # what CRIU opened is looked at before the job runs a single step
        pass_fds: tuple[int, ...] = ()
        prefix: list[str] = []
        ns_fd = None
        ns_path = _netns_path(netns) if netns else None
        if facts.get("netns_external"):
            ns_fd = os.open(ns_path or "/proc/self/ns/net", os.O_RDONLY)
            args += ["--inherit-fd", f"fd[{ns_fd}]:{NET_KEY}"]
            pass_fds = (ns_fd,)
        elif ns_path:
            prefix = ["nsenter", f"--net={ns_path}"]  # the job shared criu's namespace: run criu inside nsB
        lazy_proc = None
        if wait:
            _become_subreaper()
        t0 = time.perf_counter()
        try:
            if lazy:
                lazy_proc = _start_daemon([self.criu_bin, "lazy-pages", "-D", str(ckpt_dir), "-W", str(work),
                                           "-o", str(work / "lazy-pages.log")], "lazy-pages")
                args.append("--lazy-pages")
            r = subprocess.run([*prefix, self.criu_bin, *args], text=True, capture_output=True, pass_fds=pass_fds)
            running_s = time.perf_counter() - t0
            if r.returncode != 0:
                raise CheckpointError(RESTORE_FAILED, f"criu restore failed (rc {r.returncode}): "
                                      f"{_error_lines(log)} (log: {log})", path=str(ckpt_dir))
            pid = int(pidfile.read_text().strip())
            if checked is not None:
                _release_checked(pid, checked, int(facts["owner"]["uid"]))
            pages_s = None
            if lazy_proc is not None:
                rc = lazy_proc.wait(timeout=600)
                pages_s = time.perf_counter() - t0
                if rc != 0:
                    raise CheckpointError(RESTORE_FAILED, f"lazy-pages daemon failed (rc {rc}): "
                                          f"{_error_lines(work / 'lazy-pages.log')}", path=str(ckpt_dir))
                lazy_proc = None
        finally:
            if ns_fd is not None:
                os.close(ns_fd)
            if lazy_proc is not None:
                lazy_proc.kill()
                lazy_proc.wait()
            # CRIU writes stats-restore into the image folder; the signed checkpoint must stay as it was
            with contextlib.suppress(FileNotFoundError):
                (ckpt_dir / "stats-restore").unlink()
        self._after_restore(pid, facts)
        exit_code = None
        if wait:
            _, status = os.waitpid(pid, 0)
            exit_code = os.waitstatus_to_exitcode(status)
        mode = "lazy-restore" if lazy else "restore"
        if not self.keep_logs:
            shutil.rmtree(work, ignore_errors=True)
        return RestoreResult(backend=self.name, directory=str(ckpt_dir), pid=pid, duration_s=running_s,
                             mode=mode, exit_code=exit_code, pages_complete_s=pages_s,
                             notes=(f"log: {log}",) if self.keep_logs else ())

    def _after_restore(self, pid: int, info: dict[str, Any]) -> None:
        """Hook for subclasses (the CUDA backend brings GPU state back here), before a foreground wait."""

    def _log_path(self, what: str, pid: int) -> Path:
        assert self.log_dir is not None
        return self.log_dir / f"{what}-{pid}-{time.time_ns()}.log"


class PageServer:
    """`criu page-server` receiving one dump's memory pages into `directory` (on the target node).

    Use as a context manager; it serves one dump connection and exits."""

    def __init__(self, directory: Path, host: str = "127.0.0.1", port: int = 0, criu_bin: str | None = None,
                 log: Path | None = None):
        self.directory = Path(directory)
        self.addr = PageServerAddr(host, port or _free_port(host))
        self.criu_bin = criu_bin or find_criu()
        self.log = log or private_dir(default_log_dir()) / f"page-server-{self.addr.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PageServer:
        self.proc = _start_daemon([self.criu_bin, "page-server", "-D", str(self.directory), "--address",
                                   self.addr.host, "--port", str(self.addr.port), "-o", str(self.log)],
                                  "page-server")
        return self

    def wait(self, timeout: float = 600) -> int:
        assert self.proc is not None
        rc = self.proc.wait(timeout=timeout)
        self.proc = None
        if rc == 0:
            self.log.unlink(missing_ok=True)
        return rc

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def stream_checkpoint(backend: CriuBackend, pid: int, target_dir: Path, **kw: Any) -> CheckpointResult:
    """Dump `pid` with its memory streamed by a page server straight into `target_dir` (the target store's
    pending folder), then move the small non-page images next to them. On one machine this is loopback; on
    two, run `PageServer` on the target and pass its address to `CriuBackend.checkpoint(page_server=...)`."""
    target_dir = Path(target_dir)
    src = Path(tempfile.mkdtemp(prefix="ckpt-src-", dir=backend.log_dir))
    res = None
    try:
        with PageServer(target_dir, criu_bin=backend.criu_bin,
                        log=Path(backend.log_dir or default_log_dir()) / f"page-server-{time.time_ns()}.log") as ps:
            res = backend.checkpoint(pid, src, page_server=ps.addr, **kw)
            rc = ps.wait(timeout=120)
            if rc != 0:
                raise CheckpointError(CHECKPOINT_FAILED, f"page-server exited {rc}: {_error_lines(ps.log)}")
        _merge(src, target_dir)
    except Exception as e:
        if res is None or res.leave_running:
            shutil.rmtree(src, ignore_errors=True)
            raise
        # the dump stopped the job: its images are its only state; never delete them (the caller restores it)
        with contextlib.suppress(OSError):
            _merge(src, target_dir)
        err = e if isinstance(e, CheckpointError) else CheckpointError(CHECKPOINT_FAILED, f"after the dump: {e}")
        if any(src.iterdir()):
            err.detail += f" (part of the images stayed in {src})"
        err.stopped = res
        raise err from None
    shutil.rmtree(src, ignore_errors=True)
    return CheckpointResult(**{**res.as_dict(), "directory": str(target_dir),
                               "bytes_written": du_bytes(target_dir), "notes": res.notes})


def _release_checked(pid: int, checked: dict[str, tuple[int, int]], uid: int) -> None:
    """The job CRIU restored stopped (`--leave-stopped`): let it run only if every file CRIU opened for it is
    one it may have (`check_restored_files`); otherwise kill it, still stopped, and refuse (`owner-mismatch`)."""
    tree = [pid]
    try:
        tree = process_tree(pid)
        check_restored_files(tree, checked, uid)
    except BaseException:  # refused, or the look itself failed: never a job left stopped, never one unchecked
        for p in reversed(tree):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        raise
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGCONT)


def _merge(src: Path, target_dir: Path) -> None:
    for f in sorted(src.iterdir()):
        if f.is_file() and not (target_dir / f.name).exists():
            shutil.move(str(f), target_dir / f.name)


def _start_daemon(argv: list[str], what: str, timeout: float = 60) -> subprocess.Popen[bytes]:
    """Start a CRIU daemon in the foreground and wait until it says it is ready (--status-fd)."""
    r, w = os.pipe()
    try:
        proc = subprocess.Popen([*argv, "--status-fd", str(w)], pass_fds=(w,), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        os.close(w)
    try:
        import select

        ready, _, _ = select.select([r], [], [], timeout)
        if not ready or os.read(r, 1) == b"":
            proc.kill()
            proc.wait()
            raise CheckpointError(UNAVAILABLE, f"criu {what} did not become ready")
    finally:
        os.close(r)
    return proc


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _netns_path(netns: str | Path) -> str:
    s = str(netns)
    return s if "/" in s else f"/run/netns/{s}"


def _become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
