"""Start a job so that CRIU can later dump it and restore it elsewhere.

What makes a process restorable (learned the hard way in the lab):
  * its own session (setsid) and no terminal — then no `--shell-job` is needed;
  * stdout/stderr to regular files opened with O_APPEND — CRIU size-checks other regular files on restore and
    refuses when they grew, while an appended log is expected to grow;
  * optionally PID 1 of its own PID namespace — then a restore gets a fresh namespace and its PIDs can never
    collide with the target's (a same-PID restore fails with "Can't fork for PID: File exists");
  * optionally in a named network namespace (`ip netns add`), the unit a "node" is in the tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .protocol import UNAVAILABLE, CheckpointError


@dataclass(frozen=True)
class JobUser:
    """Whom a job runs as: uid, primary gid, supplementary groups."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    @staticmethod
    def of(uid: int, gid: int | None = None) -> JobUser:
        """The account's primary group (unless `gid` is given) and its supplementary groups from the group
        database; an unknown uid has none."""
        import pwd

        try:
            pw = pwd.getpwuid(uid)
        except KeyError:
            return JobUser(uid, gid if gid is not None else uid)
        g = gid if gid is not None else pw.pw_gid
        return JobUser(uid, g, tuple(sorted(set(os.getgrouplist(pw.pw_name, g)))))


@dataclass
class Job:
    """A started job. `pid` is its host PID (with `pidns`, the process that is PID 1 inside)."""

    pid: int
    popen: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    pidns: bool = False
    netns: str | None = None

    def reap(self, timeout: float = 30) -> int | None:
        """Collect the launcher's exit status (after a dump killed the job) so its PID is free again."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None


def spawn_job(argv: Sequence[str], *, stdout: Path, stderr: Path | None = None, cwd: Path | None = None,
              env: Mapping[str, str] | None = None, pidns: bool = False, netns: str | None = None,
              timeout: float = 30, on_launch: Callable[[int], None] | None = None,
              user: JobUser | None = None, user_env: AsUser | None = None,
              cgroups: Sequence[str] = ()) -> Job:
    """Start `argv` detached (own session, stdin /dev/null, stdio appended to files) and return its host PID.
    `on_launch` gets the launcher's PID as soon as it exists (a job wrapper's guard watches it from then on).
    `user`: the job's own uid, gid and groups — the namespaces are made with root's rights, then `setpriv`
    drops to the user's (all capabilities gone) before the job's command runs: it never has more than its
    user has. `user_env` (with `user`): an environment and folder the user chose (a run service's client's),
    applied only once the user's rights are taken — the stages that still run as root (nsenter, unshare,
    setpriv) get this process's own environment, so the user's LD_PRELOAD or LD_LIBRARY_PATH never reaches
    them, and the folder is entered with the user's rights. `cgroups`: the `cgroup.procs` files of the cgroups the
    job must run in (a run service's client's: its Slurm job's); the first stage joins them before anything is
    forked, so every process of the job is in them from its start, and the job does not start when that fails."""
    stdout = Path(stdout)
    stderr = Path(stderr) if stderr is not None else stdout
    prefix: list[str] = []
    if cgroups:
        prefix += [sys.executable, "-I", "-S", "-c", _JOIN_CGROUPS, *cgroups, "--"]
    if netns:
        prefix += [_need("nsenter"), f"--net={netns if '/' in netns else '/run/netns/' + netns}"]
    if pidns:
        # unshare forks the job as PID 1 of a new namespace; setsid makes the job its own session leader
        # (unshare already leads the session Popen made, so the job would otherwise need --shell-job)
        prefix += [_need("unshare"), "--pid", "--fork"]
    if user is not None:
        groups = ["--groups", ",".join(map(str, user.groups))] if user.groups else ["--clear-groups"]
        prefix += [_need("setpriv"), f"--reuid={user.uid}", f"--regid={user.gid}", *groups, "--inh-caps=-all"]
    pass_fds: tuple[int, ...] = ()
    if user is not None and user_env is not None:
        memfd = user_env.memfd()
        pass_fds = (memfd,)
        prefix += [user_env.python, "-I", "-S", "-c", _APPLY_ENV, str(memfd), user_env.cwd]
    if pidns:
        prefix += [_need("setsid")]
    out = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    err = out if stderr == stdout else os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        p = subprocess.Popen([*prefix, *argv], stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=cwd,
                             env=dict(env) if env is not None else None, start_new_session=True, close_fds=True,
                             pass_fds=pass_fds)
    finally:
        for fd in pass_fds:
            os.close(fd)
        os.close(out)
        if err != out:
            os.close(err)
    pid = p.pid
    if on_launch is not None:
        on_launch(pid)
    if prefix:
        pid = _job_pid(p, [*prefix, *argv], len(prefix), timeout)
    return Job(pid=pid, popen=p, stdout=stdout, stderr=stderr, pidns=pidns, netns=netns)


# the first stage, as root: joins the given cgroups (writes its own PID into each cgroup.procs), then execs the rest
_JOIN_CGROUPS = """import os, sys
i = sys.argv.index("--")
for f in sys.argv[1:i]:
    try:
        with open(f, "w") as fh:
            fh.write(str(os.getpid()))
    except OSError as e:
        sys.exit(f"gpudefrag run: cannot join the job's cgroup {f}: {e.strerror}")
os.execv(sys.argv[i + 1], sys.argv[i + 1:])
"""


def cgroup_procs_of(pid: int) -> tuple[str, ...]:
    """The `cgroup.procs` file of each cgroup `pid` is in (every v1 hierarchy and the v2 one mounted here), to
    place another process beside it. Hierarchies not mounted here (or mounted below their root) are left out."""
    mounts: dict[str, str] = {}  # "" for cgroup2, else a v1 mount option (controller or name=...) -> mount point
    for ln in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = ln.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) < 5 or len(r) < 3 or r[0] not in ("cgroup", "cgroup2") or f[3] != "/":
            continue
        for key in ([""] if r[0] == "cgroup2" else r[2].split(",")):
            mounts.setdefault(key, f[4])
    out: list[str] = []
    for ln in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        hid, ctrls, path = ln.split(":", 2)
        mp = mounts.get("" if hid == "0" else ctrls.split(",")[0])
        procs = os.path.join(mp, path.lstrip("/"), "cgroup.procs") if mp else ""
        if procs and os.path.exists(procs):
            out.append(procs)
    return tuple(out)


def join_cgroups(pid: int, cgroups: Sequence[str]) -> None:
    """Move the process tree of `pid` (a restored job) into `cgroups`, until a pass finds no process it had not
    moved (a child forked meanwhile by one not yet moved). OSError when a cgroup refuses a live process."""
    moved: set[int] = set()
    for _ in range(20):
        todo = [p for p in process_tree(pid) if p not in moved]
        if not todo:
            return
        for p in todo:
            for f in cgroups:
                try:
                    with open(f, "w") as fh:
                        fh.write(str(p))
                except ProcessLookupError:
                    break
        moved.update(todo)


# the stage that runs as the job's user (after setpriv): reads the user's environment (NUL-separated
# NAME=value) from an inherited memfd, closes it, enters the user's folder with the user's rights, execs the rest
_APPLY_ENV = """import os, sys
fd = int(sys.argv[1]); data = b""
while chunk := os.pread(fd, 1 << 20, len(data)):
    data += chunk
os.close(fd)
env = dict(kv.split(b"=", 1) for kv in data.split(b"\\0") if b"=" in kv[1:])
try:
    os.chdir(sys.argv[2])
except OSError as e:
    sys.exit(f"gpudefrag run: cannot enter {sys.argv[2]}: {e.strerror}")
try:
    os.execvpe(sys.argv[3], sys.argv[3:], env)
except OSError as e:
    sys.exit(f"gpudefrag run: cannot run {sys.argv[3]}: {e.strerror}")
"""


@dataclass(frozen=True)
class AsUser:
    """What a job's user chose for their workload — its environment, its working folder, and an interpreter of
    theirs (run as them) that applies both once root's rights are gone (see `spawn_job`)."""

    env: Mapping[str, str]
    cwd: str
    python: str

    def memfd(self) -> int:
        fd = os.memfd_create("gpudefrag-env", 0)  # close-on-exec unless handed on (pass_fds)
        data = b"".join(k.encode() + b"=" + v.encode() + b"\0" for k, v in self.env.items())
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        return fd


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise CheckpointError(UNAVAILABLE, f"{tool} not found (util-linux)")
    return path


def _job_pid(p: subprocess.Popen[bytes], full: list[str], n_prefix: int, timeout: float) -> int:
    """The launcher (nsenter/unshare/setsid) execs or forks: follow children to the first process that is no
    longer a launcher stage (whose command line is not `full[i:]` for a launcher position i). Matching on what
    the job *is* would fail for a shebang script, which shows as its interpreter. A launcher that has already
    exited stands for a job that has already ended: its PID (reaped through `p`) is returned."""
    stages = [[a.encode() for a in full[i:]] for i in range(n_prefix)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = p.pid
        for _ in range(n_prefix + 1):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
            except (FileNotFoundError, ProcessLookupError):  # gone, or exiting (ESRCH)
                break
            if cmd and cmd not in stages:
                return pid
            try:
                kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except (FileNotFoundError, ProcessLookupError):  # gone, or exiting (ESRCH)
                break
            if not kids:
                break
            pid = int(kids[0])
        if p.poll() is not None:
            # the launcher waits for the job and exits with its status: a job that ran and ended before we saw
            # it (`true`, `sh -c 'exit 7'`) has finished, and the launcher's exit code is its own
            return p.pid
        time.sleep(0.01)
    raise CheckpointError(UNAVAILABLE, f"{full[n_prefix]} did not start within {timeout} s")


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (threads' children included), parents first."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except (FileNotFoundError, ProcessLookupError):  # gone, or exiting (ESRCH)
            continue
        for t in tasks:
            try:
                todo += [int(c) for c in (t / "children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError):  # gone, or exiting (ESRCH)
                continue
    return out
