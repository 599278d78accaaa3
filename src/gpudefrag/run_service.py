"""The run service: `gpudefrag run` for a job's user, with root's part done by a small root service.

A Slurm batch script runs as the job's user, yet checkpoint and restore need root (CRIU, the root-only store
and key). So `gpudefrag run-service` runs as root (systemd: deploy/slurm/gpudefrag-run.service) and listens on a
Unix socket; `gpudefrag run` started by anyone but root is its client. For each client the service forks a
child that is the job's wrapper (`wrapper.Wrapper`, the very code `gpudefrag run` runs in-process as root):

* **Who**: the service never believes the client about who it is. It reads the peer's uid, gid and pid from
  the socket (`SO_PEERCRED`) and establishes the job itself — `slurm`: the root `slurmstepd: [JOB.STEP]`
  process the peer descends from, and the job's user from `scontrol show job` (a client in another user's job,
  or one that claims another job, is refused with one line); `local` (hosts without a scheduler): the workload
  id the client asks for must be `<its user name>.<name>`. Root's own clients are refused: root runs the wrapper
  in-process.
* **What the client gives**: the command, its environment and folder (applied to the workload only after the
  drop to the peer's uid — see `checkpoint.launch.spawn_job`), the interpreter it runs under (run as the user)
  and its stdin, stdout and stderr (`SCM_RIGHTS`). The store, key, run folder and policy are the service's.
  The workload's output still goes to its job folder (`workload.out`, appended: what CRIU can restore
  elsewhere) and is copied to the client's stdout as it grows; the wrapper's own lines go to its stderr.
* **Signals**: the client forwards every signal the wrapper handles (SIGTERM, SIGINT, SIGHUP, SIGUSR1,
  SIGUSR2, ...), and the child acts on it as the in-process wrapper would (`Wrapper.deliver`).
* **The end**: the child sends the wrapper's exit code and the client exits with it. A client gone however it
  went (SIGKILL included) closes the socket; the child then stops the workload as a wrapper stops it on a
  signal, and exits. The child's own guard covers the child's death, as in-process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputError

DEFAULT_SOCKET = "/run/gpudefrag/run.sock"
MAX_REQUEST = 4 << 20  # the command line and environment: 4 MiB at most
LOCK_WAIT_S = 10.0  # how long a workload's next client waits for its previous wrapper to finish stopping
# the signals a client forwards: those the wrapper acts on (never SIGKILL, SIGSTOP, SIGCHLD, SIGCONT, ...)
_FORWARDED = tuple(s for s in signal.valid_signals() if s not in (
    signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGCONT, signal.SIGTSTP, signal.SIGTTIN,
    signal.SIGTTOU, signal.SIGWINCH, signal.SIGURG, signal.SIGPIPE, signal.SIGSEGV, signal.SIGBUS,
    signal.SIGFPE, signal.SIGILL))


class Refused(Exception):
    """A client the service will not serve: the one line it is told."""


@dataclass
class ServiceConfig:
    socket_path: Path
    run_dir: Path
    store_root: Path
    key_path: Path
    jobs: str = "slurm"  # how a peer's job is established: "slurm" or "local"
    node: str | None = None  # "local": the node name (default: this host's name)
    max_per_user: int = 64  # children (serving or refusing) one user may have at once: each is a root process
    request_timeout_s: float = 30.0  # how long a child waits for its client's request before it drops it
    wrapper: dict[str, Any] = field(default_factory=dict)  # heartbeat_every_s, heartbeat_cron, keep


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int


@dataclass(frozen=True)
class JobOf:
    """The job a peer belongs to, as the service established it."""

    workload_id: str
    node: str
    restarts: int
    gid: int | None = None  # the job's group (Slurm's GroupId); None: the account's primary group


def peer_of(conn: socket.socket) -> Peer:
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                        struct.calcsize("3i")))
    return Peer(pid, uid, gid)


# ---------------------------------------------------------------------------------------------- the job's identity
_STEPD = re.compile(rb"^slurmstepd: \[(\d+)\.[A-Za-z0-9_]+\]")


def _proc(pid: int) -> tuple[int, int, bytes]:
    """(parent pid, real uid, command line) of a live process."""
    st = Path(f"/proc/{pid}/status").read_text()
    fields = dict(ln.split(":", 1) for ln in st.splitlines() if ":" in ln)
    return int(fields["PPid"]), int(fields["Uid"].split()[0]), Path(f"/proc/{pid}/cmdline").read_bytes()


def slurm_job_of_pid(pid: int) -> str:
    """The Slurm job `pid` runs in: the root `slurmstepd: [JOB.STEP]` it descends from (what proctrack/
    linuxproc and `scontrol pidinfo` look for). A user's process cannot pose as one: the ancestor must be
    root's, and a user can neither start a root process nor make theirs another job's stepd's child."""
    p = pid
    for _ in range(256):
        try:
            ppid, ruid, cmd = _proc(p)
        except (OSError, KeyError, ValueError):
            break
        m = _STEPD.match(cmd)
        if m and ruid == 0:
            return m.group(1).decode()
        if ppid <= 0:
            break
        p = ppid
    raise Refused(f"process {pid} is not in a Slurm job (no slurmstepd above it)")


def slurm_job_record(job_id: str) -> dict[str, str]:
    """`scontrol show job -o JOB` as fields (the scheduler's record: who owns the job, where it runs)."""
    try:
        p = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30,
                           check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Refused(f"cannot ask Slurm about job {job_id}: {e}") from None
    if p.returncode != 0 or "JobId=" not in p.stdout:
        raise Refused(f"Slurm does not know job {job_id}: {(p.stderr or p.stdout).strip()[:200]}")
    return dict(t.split("=", 1) for t in p.stdout.split() if "=" in t)


def establish(cfg: ServiceConfig, peer: Peer, claimed: str | None) -> JobOf:
    """Which job this peer runs, from the kernel and the scheduler only; `claimed` (what the client says) must
    agree or the client is refused."""
    import pwd

    if peer.uid == 0:
        raise Refused("root's `gpudefrag run` runs the wrapper itself; the run service serves job users only")
    try:
        user = pwd.getpwuid(peer.uid).pw_name
    except KeyError:
        raise Refused(f"uid {peer.uid} has no account here") from None
    if cfg.jobs == "local":
        if not claimed:
            raise Refused(f"give a workload id ({user}.NAME: --workload-id or GPUDEFRAG_WORKLOAD_ID)")
        if claimed.split(".", 1)[0] != user or "." not in claimed:
            raise Refused(f"workload {claimed!r} is not {user}'s: {user}'s workload ids are {user}.NAME")
        return JobOf(claimed, cfg.node or socket.gethostname(), 0)
    job = slurm_job_of_pid(peer.pid)
    if claimed and claimed != job:
        raise Refused(f"this process runs in Slurm job {job}, not {claimed}: refused")
    rec = slurm_job_record(job)
    owner = re.match(r".*\((\d+)\)$", rec.get("UserId", ""))
    if owner is None or int(owner.group(1)) != peer.uid:
        raise Refused(f"Slurm job {job} belongs to {rec.get('UserId', '?')}, not to {user} ({peer.uid}): refused")
    restarts = rec.get("Restarts", "0")
    group = re.match(r".*\((\d+)\)$", rec.get("GroupId", ""))
    return JobOf(job, rec.get("BatchHost") or cfg.node or socket.gethostname(),
                 int(restarts) if restarts.isdigit() else 0, int(group.group(1)) if group else None)


# ---------------------------------------------------------------------------------------------- the service
def _check_socket_folder(folder: Path) -> None:
    """The socket's folder is root's and nobody else may write it: a user who could would swap the socket for
    their own, and receive every client's stdio."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o755)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise InputError(str(folder), "", "the run service's socket folder must be a folder of root's that nobody "
                         f"else may write (it is uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}): refused")


def serve(cfg: ServiceConfig, *, json_log: bool = False) -> None:
    """Listen for clients until SIGTERM/SIGINT; each client is served by a forked child (its job's wrapper)."""
    from .checkpoint.keys import load_key
    from .jobside.jobdir import JobDir

    if os.geteuid() != 0:
        raise InputError("gpudefrag run-service", "", "must run as root (CRIU, the root-only store and key)")
    if cfg.jobs not in ("slurm", "local"):
        raise InputError("--jobs", "", f"{cfg.jobs!r}: one of slurm, local")
    load_key(cfg.key_path, create=False)
    cfg.run_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    JobDir(cfg.run_dir, "x")  # the run folder is checked for each job (JobDir.ensure), before it is written
    _check_socket_folder(cfg.socket_path.parent)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(cfg.socket_path).st_mode):
            os.unlink(cfg.socket_path)  # a stale socket of an earlier service (the folder is root's)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(cfg.socket_path))
    os.chmod(cfg.socket_path, 0o666)  # any local user may connect; who they are is SO_PEERCRED's to say
    srv.listen(64)
    stopping = {"now": False}
    users: dict[int, int] = {}  # serving child's pid -> its client's uid

    def reap(*_: object) -> None:
        with contextlib.suppress(ChildProcessError):
            while (pid := os.waitpid(-1, os.WNOHANG)[0]) > 0:
                users.pop(pid, None)

    def stop(*_: object) -> None:
        stopping["now"] = True
        srv.close()

    signal.signal(signal.SIGCHLD, reap)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(json.dumps({"event": "listening", "socket": str(cfg.socket_path), "jobs": cfg.jobs}) if json_log else
          f"gpudefrag run-service: listening on {cfg.socket_path} (jobs: {cfg.jobs})", file=sys.stderr, flush=True)
    srv.settimeout(0.5)  # wake now and then to close the connections refused without a child
    refused: list[tuple[socket.socket, float]] = []
    while not stopping["now"]:
        _close_refused(refused, time.monotonic())
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            continue
        except OSError:
            if stopping["now"]:
                break
            continue
        conn.settimeout(None)
        try:
            uid = peer_of(conn).uid
        except OSError:
            conn.close()
            continue
        if sum(1 for u in list(users.values()) if u == uid) >= cfg.max_per_user:
            # refused by the listener itself, without a child: a user cannot make it fork past the limit
            _refuse_later(conn, refused, f"gpudefrag run: refused: uid {uid} already has {cfg.max_per_user} "
                          "connection(s) to this run service (--max-per-user)")
            continue
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child ends in os._exit
            code = 1
            try:
                srv.close()
                for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
                    signal.signal(s, signal.SIG_DFL)
                code = _serve_client(cfg, conn)
            finally:
                os._exit(code)
        users[pid] = uid
        conn.close()
    for c, _ in refused:
        c.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(cfg.socket_path)


def _refuse_later(conn: socket.socket, refused: list[tuple[socket.socket, float]], line: str) -> None:
    """Refuse without blocking the listener: the line now, the close a second later (what the client sent by
    then is drained first: closing a Unix socket with unread data resets it, and the client would lose the
    line). At most 256 wait; past that the connection is closed at once."""
    conn.setblocking(False)
    with contextlib.suppress(OSError):
        conn.send(json.dumps({"error": line}).encode() + b"\n")
        conn.shutdown(socket.SHUT_WR)
    if len(refused) >= 256:
        conn.close()
    else:
        refused.append((conn, time.monotonic() + 1.0))


def _close_refused(refused: list[tuple[socket.socket, float]], now: float) -> None:
    keep = []
    for c, at in refused:
        with contextlib.suppress(OSError):
            while c.recv(65536):  # non-blocking: what has arrived (passed descriptors are closed with it)
                pass
        if at <= now:
            c.close()
        else:
            keep.append((c, at))
    refused[:] = keep


def _send(conn: socket.socket, doc: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(doc).encode() + b"\n")


def _refuse(conn: socket.socket, line: str) -> int:
    """Tell the client its one line and end; what it sent and we did not read is drained first (closing a Unix
    socket with unread data resets it, and the client would lose the line)."""
    _send(conn, {"error": line})
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(2)
        while conn.recv(65536):
            pass
    return 2


def _read_request(conn: socket.socket, timeout_s: float) -> tuple[dict[str, Any], list[int]]:
    conn.settimeout(timeout_s)  # a client that connects and sends nothing does not hold a root child for long
    msg, fds, flags, _ = socket.recv_fds(conn, 1, 3)
    if flags & socket.MSG_CTRUNC or len(fds) != 3 or msg != b"F":
        for fd in fds:
            os.close(fd)
        raise Refused("the client must send its stdin, stdout and stderr first")
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_REQUEST:
            raise Refused(f"request larger than {MAX_REQUEST} bytes")
    conn.settimeout(None)
    try:
        req = json.loads(buf)
    except ValueError:
        raise Refused("unreadable request") from None
    ok = (isinstance(req, dict) and isinstance(req.get("argv"), list) and req["argv"]
          and all(isinstance(a, str) and "\0" not in a for a in req["argv"])
          and isinstance(req.get("env"), dict)
          and all(isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\0" not in k + v
                  for k, v in req["env"].items())
          and isinstance(req.get("cwd"), str) and isinstance(req.get("python"), str)
          and req["python"].startswith("/") and isinstance(req.get("workload_id"), (str, type(None))))
    if not ok:
        raise Refused("malformed request (argv, env, cwd, python, workload_id)")
    return req, fds


def _serve_client(cfg: ServiceConfig, conn: socket.socket) -> int:
    """In the forked child: establish the peer's job, then be its wrapper. The exit status is the child's own."""
    from .checkpoint.launch import AsUser, JobUser, cgroup_procs_of
    from .wrapper import WrapperConfig, prepare

    peer = peer_of(conn)
    try:
        pidfd = os.pidfd_open(peer.pid)
    except OSError:
        return _refuse(conn, "gpudefrag run: the connecting process is gone")
    try:
        req, fds = _read_request(conn, cfg.request_timeout_s)
        job = establish(cfg, peer, req["workload_id"])
        cgroups = cgroup_procs_of(peer.pid)  # the workload runs where its job runs (its limits, its accounting)
        signal.pidfd_send_signal(pidfd, 0)  # the very process that connected is still there (no reused PID)
        wcfg = WrapperConfig(
            argv=list(req["argv"]), workload_id=job.workload_id, node=job.node, run_dir=cfg.run_dir,
            store_root=cfg.store_root, key_path=cfg.key_path, restarts=job.restarts,
            # the job's group, else the account's: never the peer's own gid (a set-group-id program's)
            user=JobUser.of(peer.uid, job.gid), as_user=AsUser(req["env"], req["cwd"], req["python"]),
            cgroups=cgroups, **cfg.wrapper)
        for fd, to in zip(fds, (0, 1, 2), strict=True):
            os.dup2(fd, to)  # the wrapper's lines go to the client's stderr, the workload's output to its stdout
            os.close(fd)
        w = prepare(wcfg, json_log=bool(req.get("json")))
        _one_wrapper(w.jd.root, job.workload_id)
    except Refused as e:
        return _refuse(conn, f"gpudefrag run: refused: {e}")
    except ProcessLookupError:
        return _refuse(conn, "gpudefrag run: the connecting process is gone")
    except InputError as e:
        return _refuse(conn, str(e))
    except Exception as e:  # CheckpointError (missing key), ...: one line, as the in-process wrapper says it
        return _refuse(conn, f"gpudefrag run: {getattr(e, 'detail', None) or e}")
    finally:
        os.close(pidfd)
    out = w.jd.root / "workload.out"
    try:
        start_at = os.lstat(out).st_size
    except FileNotFoundError:
        start_at = 0
    done = threading.Event()
    relay = threading.Thread(target=_relay, args=(out, start_at, done), daemon=True)
    relay.start()
    threading.Thread(target=_listen, args=(conn, w), daemon=True).start()
    code = 1
    try:
        code = w.run()
    finally:
        done.set()
        relay.join(timeout=5)
        _send(conn, {"exit": code})
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)
    return code


def _one_wrapper(job_dir: Path, workload_id: str, wait_s: float = LOCK_WAIT_S) -> None:
    """One wrapper per workload: two (a second `gpudefrag run` in the same job, an `srun` step, say) would write
    the same job folder and answer the same requests. The lock is on the job folder itself, held by this child
    for its life (neither its guard nor the workload keeps the descriptor). A requeued job's new client waits a
    moment for the old one's wrapper, which is still stopping its workload."""
    import fcntl

    fd = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    end = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return  # fd stays open (and locked) until this child exits
        except BlockingIOError:
            if time.monotonic() > end:
                os.close(fd)
                raise Refused(f"workload {workload_id} already has a wrapper (another `gpudefrag run` of it is "
                              "running)") from None
            time.sleep(0.2)


def _listen(conn: socket.socket, w: Any) -> None:
    """The client's forwarded signals; its end (EOF, however it died) stops the workload like a SIGHUP."""
    f = conn.makefile("rb")
    for line in f:
        try:
            sig = int(json.loads(line)["signal"])
        except (ValueError, KeyError, TypeError):
            continue
        if sig in _FORWARDED:
            w.deliver(sig)
    w.deliver(signal.SIGHUP)  # the client is gone: stop the workload, as a wrapper does on SIGHUP


def _relay(path: Path, offset: int, done: threading.Event) -> None:
    """Copy what the workload appends to its output file onto the client's stdout (fd 1), until the end."""
    fd = -1
    try:
        while True:
            last = done.is_set()
            if fd < 0:
                with contextlib.suppress(OSError):
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            while fd >= 0 and (chunk := os.pread(fd, 1 << 16, offset)):
                offset += len(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(1, view):]
            if last:
                return
            done.wait(0.1)
    except OSError:
        return
    finally:
        if fd >= 0:
            os.close(fd)


# ---------------------------------------------------------------------------------------------- the client
def run_client(argv: Sequence[str], *, socket_path: Path, workload_id: str | None, json_log: bool = False) -> int:
    """`gpudefrag run` as a job's user: hand the command and stdio to the service, forward signals, and return
    the workload's exit code. Raises InputError (one line, exit 2) when the service cannot be reached or
    refuses."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(socket_path))
    except OSError as e:
        raise InputError(str(socket_path), "", f"cannot reach the run service ({e.strerror}): `gpudefrag run` as a "
                         "job's user needs `gpudefrag run-service` (root) on this node") from None
    server = peer_of(s)
    if server.uid != 0:
        raise InputError(str(socket_path), "", f"the run service there is uid {server.uid}'s, not root's: refused "
                         "(it would get this job's stdio)")
    req = {"argv": list(argv), "env": dict(os.environ), "cwd": os.getcwd(),
           "python": os.path.realpath(sys.executable), "json": json_log,
           "workload_id": workload_id or os.environ.get("GPUDEFRAG_WORKLOAD_ID") or os.environ.get("SLURM_JOB_ID")}
    socket.send_fds(s, [b"F"], [0, 1, 2])
    s.sendall(json.dumps(req).encode() + b"\n")

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError):
            s.sendall(json.dumps({"signal": signum}).encode() + b"\n")

    for sig in _FORWARDED:
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, forward)
    f = s.makefile("rb")
    for line in f:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if "error" in doc:
            raise InputError("gpudefrag run", "", str(doc["error"]).removeprefix("gpudefrag run: "))
        if "exit" in doc:
            return int(doc["exit"])
    print("gpudefrag run: the run service ended without the workload's exit code", file=sys.stderr)
    return 1

