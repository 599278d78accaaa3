"""A job owner must not get anything done as root through a checkpoint: real jobs run as `nobody`, checkpointed
by root through the application hook and CRIU, and restored — as `nobody` again, from the signed record."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudefrag.checkpoint import probe_job
from gpudefrag.checkpoint.app_hook import AppHookBackend
from gpudefrag.checkpoint.operations import checkpoint_to_store, restore_from_store
from gpudefrag.checkpoint.protocol import OWNER_MISMATCH, UNSAFE_PATH, CheckpointError
from gpudefrag.checkpoint.store import CheckpointStore

from .conftest import Probes

NOBODY = 65534
SYS_PY = "/usr/bin/python3"  # the venv's interpreter lives under /root, which nobody cannot enter

# A job that speaks the spool protocol of gpudefrag.job.Job with the system Python only: on SIGUSR1 it saves
# {"step": N} atomically into its spool (plus whatever `evil` plants); restored, it logs who it runs as and exits.
JOB = r'''
import json, os, signal, sys, time
spool, log_path, evil = os.environ["GPUDEFRAG_JOB_SPOOL"], sys.argv[1], sys.argv[2]
log = open(log_path, "a", buffering=1)
src = os.environ.get("GPUDEFRAG_RESTORE_FROM")
if src:
    step = json.load(open(os.path.join(src, "meta.json")))["step"]
    log.write(f"RESTORED uid={os.getuid()} gid={os.getgid()} groups={sorted(os.getgroups())} step={step} "
              f"marker={os.environ.get('MARKER')} key={os.environ.get('GPUDEFRAG_KEY')}\n")
    sys.exit(0)
asked = False
def on(sig, frame):
    global asked
    asked = True
signal.signal(signal.SIGUSR1, on)
os.makedirs(spool, exist_ok=True)
step = 0
log.write(f"START uid={os.getuid()}\n")
while True:
    step += 1
    if asked:
        asked = False
        tmp = os.path.join(spool, ".tmp")
        os.makedirs(tmp)
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump({"step": step}, f)
        if evil == "symlink":
            os.symlink("/etc/shadow", os.path.join(tmp, "secret"))
        elif evil == "fifo":
            os.mkfifo(os.path.join(tmp, "pipe"))
        elif evil == "dirlink":
            os.symlink("/etc", os.path.join(tmp, "etc"))
        os.rename(tmp, os.path.join(spool, "%08d" % step))
        log.write(f"SAVED step={step}\n")
    time.sleep(0.02)
'''

# A CRIU-able loop as nobody: appends its step to the log (O_APPEND) and keeps going.
LOOP = r'''
import os, sys, time
step = 0
while True:
    step += 1
    with open(sys.argv[1], "a") as f:
        f.write(f"step={step} uid={os.getuid()}\n")
    time.sleep(0.05)
'''


@pytest.fixture
def jobdir() -> Iterator[Path]:
    """A folder nobody owns, reachable by nobody (pytest's tmp_path is root-only)."""
    base = Path(tempfile.mkdtemp(prefix="gpd-priv-", dir="/tmp"))
    os.chmod(base, 0o755)
    d = base / "job"
    d.mkdir()
    os.chown(d, NOBODY, NOBODY)
    (d / "job.py").write_text(JOB)
    (d / "loop.py").write_text(LOOP)
    yield d
    shutil.rmtree(base, ignore_errors=True)


class AsNobody:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pids: set[int] = set()

    def start(self, d: Path, argv: list[str], **env: str) -> subprocess.Popen[bytes]:
        out = os.open(d / "job.out", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.fchown(out, NOBODY, NOBODY)  # as a batch system opens a job's output: the user's own file
        try:
            p = subprocess.Popen(argv, cwd=d, user=NOBODY, group=NOBODY, extra_groups=[NOBODY],
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                                 env={"PATH": "/usr/bin:/bin", "GPUDEFRAG_JOB_SPOOL": str(d / "spool"), **env})
        finally:
            os.close(out)
        self.procs.append(p)
        self.pids.add(p.pid)
        return p

    def cleanup(self, d: Path) -> None:
        for pid in self.pids:
            try:
                if str(d).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)


@pytest.fixture
def nobody(jobdir: Path) -> Iterator[AsNobody]:
    n = AsNobody()
    yield n
    n.cleanup(jobdir)


def _wait_for(path: Path, text: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in (t := path.read_text()):
            return t
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {path} after {timeout} s: {path.read_text() if path.exists() else ''}")


def _status_ids(pid: int) -> tuple[int, int]:
    doc = dict(ln.split(":", 1) for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in ln)
    return int(doc["Uid"].split()[0]), int(doc["Gid"].split()[0])


# -- application hook ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("evil", ["symlink", "fifo", "dirlink"])
def test_app_hook_refuses_links_and_special_files_in_the_spool(store: CheckpointStore, jobdir: Path,
                                                               nobody: AsNobody, evil: str) -> None:
    log = jobdir / "job.log"
    p = nobody.start(jobdir, [SYS_PY, str(jobdir / "job.py"), str(log), evil])
    _wait_for(log, "START")
    with pytest.raises(CheckpointError) as e:
        checkpoint_to_store(store, AppHookBackend(timeout_s=30), p.pid, "priv")
    assert e.value.reason == UNSAFE_PATH
    assert store.ids() == []  # nothing was stored, signed or not
    assert not any(Path(d).name.startswith(".tmp-") for d in os.listdir(store.root))
    assert p.poll() is None  # refused before the job was stopped: it still runs


def test_app_hook_restores_as_the_job_owner_from_the_signed_record(store: CheckpointStore, jobdir: Path,
                                                                   nobody: AsNobody,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    log = jobdir / "job.log"
    p = nobody.start(jobdir, [SYS_PY, str(jobdir / "job.py"), str(log), "none"], MARKER="from-the-job")
    _wait_for(log, "START uid=65534")
    m, _ = checkpoint_to_store(store, AppHookBackend(timeout_s=30), p.pid, "priv")
    assert p.wait(timeout=30) == -signal.SIGKILL
    owner = m.info["owner"]
    assert (owner["uid"], owner["gid"]) == (NOBODY, NOBODY) and m.info["env"]["MARKER"] == "from-the-job"
    saved = json.loads((store.path(m.id) / "meta.json").read_text())["step"]

    # what root has in its environment must not reach the job; what the job's folder says now is not trusted
    monkeypatch.setenv("GPUDEFRAG_KEY", "/root/secret.key")
    monkeypatch.setenv("MARKER", "from-root")
    _, rr = restore_from_store(store, m.id, wait=True)
    assert rr.exit_code == 0
    line = _wait_for(log, "RESTORED").splitlines()[-1]
    assert f"uid={NOBODY} gid={NOBODY} groups=[{NOBODY}] step={saved}" in line, line
    assert "marker=from-the-job" in line and "key=None" in line, line
    assert store.verify(m.id).ok


def test_app_hook_refuses_a_restore_when_the_owner_changed(store: CheckpointStore, jobdir: Path,
                                                           nobody: AsNobody) -> None:
    log = jobdir / "job.log"
    p = nobody.start(jobdir, [SYS_PY, str(jobdir / "job.py"), str(log), "none"])
    _wait_for(log, "START")
    m, _ = checkpoint_to_store(store, AppHookBackend(timeout_s=30), p.pid, "priv")
    p.wait(timeout=30)
    os.chown(jobdir, 4321, 4321)  # the folder now belongs to someone else
    with pytest.raises(CheckpointError) as e:
        restore_from_store(store, m.id, wait=True)
    assert e.value.reason == OWNER_MISMATCH
    assert "RESTORED" not in log.read_text()


# -- CRIU -------------------------------------------------------------------------------------------------------
CAP_SYS_RESOURCE = 24


def _has_cap(bit: int) -> bool:
    eff = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("CapEff:"))
    return bool(int(eff.split()[1], 16) >> bit & 1)


@pytest.mark.criu
def test_criu_refuses_a_restore_when_the_owner_of_the_job_folder_or_files_changed(criu, store: CheckpointStore,
                                                                                 probes: Probes) -> None:
    job, log = probes.start()
    m, _ = checkpoint_to_store(store, criu, job.pid, "owner")
    job.reap()
    assert m.info["owner"]["uid"] == os.getuid() and m.info["cwd"] == os.getcwd()
    cwd = Path(m.info["cwd"])
    st = cwd.stat()
    try:
        os.chown(cwd, 4321, st.st_gid)  # the job's folder was handed to someone else since the dump
        with pytest.raises(CheckpointError) as e:
            restore_from_store(store, m.id)
        assert e.value.reason == OWNER_MISMATCH
    finally:
        os.chown(cwd, st.st_uid, st.st_gid)
    # the job's output file swapped for a link (to a file its owner may not touch): CRIU would open the target
    assert str(job.stdout) in {f["path"] for f in m.info["files"]}
    secret = probes.dir / "secret"
    secret.write_text("not yours\n")
    os.rename(job.stdout, probes.dir / "out.saved")
    os.symlink(secret, job.stdout)
    with pytest.raises(CheckpointError) as e:
        restore_from_store(store, m.id)
    assert e.value.reason == OWNER_MISMATCH and "link" in e.value.detail
    os.unlink(job.stdout)
    os.rename(probes.dir / "out.saved", job.stdout)
    assert secret.read_text() == "not yours\n"
    _, rr = restore_from_store(store, m.id)
    probes.track(rr.pid)
    probe_job.wait_step(log, probe_job.last_step(log) + 2, timeout=30)


# The attacker's loop: swap two names in a folder of theirs, atomically, as fast as it can (renameat2 with
# RENAME_EXCHANGE), so that any look at the path sees the real file or the link about half the time each.
EXCHANGER = r'''
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = sys.argv[1].encode(), sys.argv[2].encode()
while True:
    libc.renameat2(-100, a, -100, b, 2)
'''


def _opens(pid: int, path: Path) -> bool:
    """Does any process of the tree rooted at `pid` hold `path` open?"""
    from gpudefrag.checkpoint.launch import process_tree

    for p in process_tree(pid):
        with contextlib.suppress(OSError):
            if any(os.readlink(f"/proc/{p}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{p}/fd")):
                return True
    return False


@pytest.mark.criu
def test_a_file_swapped_for_a_link_while_criu_opens_it_never_reaches_the_restored_job(
        criu, store: CheckpointStore, probes: Probes, shared_tmp: Path, throwaway_user) -> None:
    """The restore looks at each file the job had open (not a link, the same owner) an instant before CRIU
    re-opens it by path as root; a user who swapped the file for a link in that instant made CRIU open the
    link's target — root's file — and hand it to the job. Now CRIU leaves the restored job stopped and what it
    actually opened is looked at (the very file, by device and inode): a swapped file is caught, the job killed
    before it ran a step. The attack runs for real: the user swaps the job's output and a link to a root-only
    file of the same size and mode, atomically and without pause, through 30 restores."""
    import ctypes

    from gpudefrag.checkpoint.launch import spawn_job

    att = shared_tmp / "att"  # a folder of the attacker's, where the job writes its output
    att.mkdir(mode=0o755)
    os.chown(att, throwaway_user.uid, throwaway_user.gid)
    out, log = att / "job.out", probes.dir / "race.log"
    job = spawn_job([sys.executable, "-m", "gpudefrag.checkpoint.probe_job", "--log", str(log), "--mb", "4"],
                    stdout=out, pidns=True)
    probes.jobs.append(job)
    probes.track(job.pid)
    probe_job.wait_step(log, 2, timeout=60)
    m, _ = checkpoint_to_store(store, criu, job.pid, "race")
    job.reap()
    assert str(out) in {f["path"] for f in m.info["files"]}
    secret = shared_tmp / "secret"  # root's file: CRIU checks size and mode, so the attacker matches both
    secret.write_bytes(b"s" * out.stat().st_size)
    os.chmod(secret, 0o600)
    before = secret.read_bytes()
    r = throwaway_user.run(["ln", "-s", str(secret), str(att / "bait")])
    assert r.returncode == 0, r.stderr
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER: the restored jobs we kill are ours to reap
    swapper = throwaway_user.popen([SYS_PY, "-c", EXCHANGER, str(out), str(att / "bait")])
    outcomes: list[str] = []
    try:
        for _ in range(30):
            try:
                _, rr = restore_from_store(store, m.id)
            except CheckpointError as e:
                outcomes.append("caught-after-open" if "CRIU opened" in e.detail
                                else "caught-before" if e.reason == OWNER_MISMATCH else f"other: {e}")
            else:
                probes.track(rr.pid)
                outcomes.append("secret-handed-to-the-job" if _opens(rr.pid, secret) else "restored")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rr.pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # reap what was killed, so its PID is free for the next restore
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(-1, os.WNOHANG)[0] == 0 and not any(
                            Path(f"/proc/{p}").exists() for p in probes.pids if p != job.pid):
                        break
                time.sleep(0.01)
    finally:
        swapper.kill()
        swapper.wait()
        libc.prctl(36, 0, 0, 0, 0)
    assert "secret-handed-to-the-job" not in outcomes, outcomes
    assert "caught-after-open" in outcomes, outcomes  # the race was run: CRIU did open the link's target
    assert secret.read_bytes() == before


@pytest.mark.criu
def test_criu_job_of_nobody_comes_back_as_nobody_and_owner_change_is_refused(criu, store: CheckpointStore,
                                                                             jobdir: Path,
                                                                             nobody: AsNobody) -> None:
    if not _has_cap(CAP_SYS_RESOURCE):  # CRIU reads the job's rlimits with prlimit(), which needs it
        # CRIU is here; what is missing is a capability of this sandbox's root, which no install step can add.
        # (The app-hook round trip as nobody above runs everywhere.)
        pytest.skip("CRIU cannot dump another user's process here: this root lacks CAP_SYS_RESOURCE (a container)")
    log = jobdir / "loop.log"
    p = nobody.start(jobdir, [SYS_PY, str(jobdir / "loop.py"), str(log)])
    _wait_for(log, "step=3 ")
    m, _ = checkpoint_to_store(store, criu, p.pid, "priv-criu")
    p.wait(timeout=30)
    assert m.info["owner"]["uid"] == NOBODY
    os.chown(jobdir, 4321, 4321)
    with pytest.raises(CheckpointError) as e:
        restore_from_store(store, m.id)
    assert e.value.reason == OWNER_MISMATCH
    os.chown(jobdir, NOBODY, NOBODY)
    _, rr = restore_from_store(store, m.id)
    nobody.pids.add(rr.pid)
    assert _status_ids(rr.pid) == (NOBODY, NOBODY)
    n = len(log.read_text().splitlines())
    _wait_for(log, f"step={n + 3} uid={NOBODY}")


@pytest.mark.criu
def test_criu_log_folder_planted_by_a_user_neither_blocks_nor_redirects_checkpoints(
        criu, store: CheckpointStore, tmp_path: Path, probes: Probes, throwaway_user, shared_tmp: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A user who creates $TMPDIR/gpudefrag-criu-logs first (a folder of theirs, or a link to a folder of
    root's) used to block every CRIU checkpoint on the host; root's logs now go to a folder only root can
    create, and a planted folder named explicitly is still refused."""
    from gpudefrag.checkpoint import criu as criu_mod
    from gpudefrag.checkpoint.criu import CriuBackend

    tmp = shared_tmp
    (tmp_path / "victim").mkdir()
    r = throwaway_user.run(["mkdir", "-m", "777", str(tmp / "gpudefrag-criu-logs")])
    assert r.returncode == 0, r.stderr
    monkeypatch.setenv("TMPDIR", str(tmp))
    tempfile.tempdir = None
    criu_mod.default_log_dir.cache_clear()
    try:
        be = CriuBackend(criu_bin=criu.criu_bin, keep_logs=True)
        assert be.log_dir is not None and not str(be.log_dir).startswith(str(tmp))
        job, _ = probes.start("planted-logs", mb=4)
        m, _ = checkpoint_to_store(store, be, job.pid, "planted-logs", leave_running=True)
        assert store.verify(m.id).ok
        assert os.listdir(tmp / "gpudefrag-criu-logs") == [] and os.listdir(tmp_path / "victim") == []
        planted = tmp_path / "planted"
        planted.mkdir(mode=0o777)
        os.chmod(planted, 0o777)
        with pytest.raises(CheckpointError) as e:
            CriuBackend(criu_bin=criu.criu_bin, log_dir=planted)  # others may write into it
        assert e.value.reason == UNSAFE_PATH
        os.symlink(tmp_path / "victim", tmp_path / "link")
        with pytest.raises(CheckpointError):
            CriuBackend(criu_bin=criu.criu_bin, log_dir=tmp_path / "link")
    finally:
        tempfile.tempdir = None
        criu_mod.default_log_dir.cache_clear()


def test_a_store_root_a_user_owns_or_others_may_write_is_refused(tmp_path: Path, throwaway_user,
                                                                 run_cli) -> None:
    """A store folder owned by a user was accepted silently, and the user then removed a checkpoint from under
    root. A store root owned by anyone but the service's user, or writable by group or others, is refused
    (`unsafe-path`, one line, exit 2) by every command, and nothing is written into it."""
    key = tmp_path / "key"
    base = tmp_path / "stores"
    base.mkdir()
    good = CheckpointStore(base / "good", key)
    good.create("w").commit(backend="app", mode="app-hook", compat=_versions())  # root's own store works
    owned = base / "owned"
    owned.mkdir(mode=0o700)
    os.chown(owned, throwaway_user.uid, throwaway_user.gid)
    loose = base / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    group = base / "group"
    group.mkdir()
    os.chmod(group, 0o770)
    for root in (owned, loose, group):
        st = CheckpointStore(root, key)
        with pytest.raises(CheckpointError) as e:
            st.create("w")
        assert e.value.reason == UNSAFE_PATH, e.value
        with pytest.raises(CheckpointError):
            st.list()
        assert not st.verify("w-1").ok
        assert os.listdir(root) == []
        for args in (["checkpoints", "list"], ["checkpoints", "gc"]):
            r = run_cli(*args, "--store", str(root), "--key", str(key))
            assert r.returncode == 2 and "unsafe-path" in r.stderr, (args, r.stderr)
            assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def _versions():  # type: ignore[no-untyped-def]
    from gpudefrag.checkpoint.compat import host_versions

    return host_versions("test 1")


# The attacker: as the job's user, wait for the restore's private copy to become theirs, then swap its sub-folder
# for a link to a folder of root's, so that root, still changing owners below it by path, changes root's files.
SWAPPER = r'''
import os, sys, time
tmp, victim, prefix = sys.argv[1], sys.argv[2], "gpudefrag-restore-"
end = time.time() + 120
while time.time() < end:
    for name in os.listdir(tmp):
        if not name.startswith(prefix):
            continue
        d = os.path.join(tmp, name)
        try:
            os.rename(os.path.join(d, "sub"), os.path.join(d, "sub.old"))
        except OSError:
            continue
        os.symlink(victim, os.path.join(d, "sub"))
        print("SWAPPED", flush=True)
        sys.exit(0)
'''


@pytest.mark.parametrize("files", [3000])
def test_app_hook_restore_copy_cannot_be_turned_against_root_files(store: CheckpointStore, throwaway_user,
                                                                   shared_tmp: Path, files: int,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The private copy of a checkpoint used to be handed to the job's user folder by folder, the top folder
    first: the user swapped a sub-folder for a link and root changed the owner of any file on the host. Now the
    copy is built root-only through descriptors and handed over whole, last: the swap comes too late to matter,
    root's files keep their owner, and the copy the job gets is complete."""
    from gpudefrag.checkpoint.compat import host_versions

    victim = shared_tmp / "victim"
    victim.mkdir(mode=0o755)
    for i in range(files):
        (victim / f"f{i:05d}").write_text("root's\n")
    pending = store.create("race")
    (pending.dir / "sub").mkdir()
    for i in range(files):
        (pending.dir / "sub" / f"f{i:05d}").write_text(f"{i}\n")
    (pending.dir / "meta.json").write_text('{"step": 1}')
    owner = {"uid": throwaway_user.uid, "gid": throwaway_user.gid, "groups": []}
    m = pending.commit(backend="app", mode="app-hook", compat=host_versions("test 1"),
                       info={"argv": ["/bin/sh", "-c", 'test -d "$GPUDEFRAG_RESTORE_FROM/sub.old" || '
                                      'test -d "$GPUDEFRAG_RESTORE_FROM/sub"'],
                             "cwd": "/", "owner": owner, "env": {"PATH": "/usr/bin:/bin"}})
    tmp = shared_tmp / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    monkeypatch.setenv("TMPDIR", str(tmp))
    tempfile.tempdir = None
    swapper = throwaway_user.popen([SYS_PY, "-c", SWAPPER, str(tmp), str(victim)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE)
    try:
        time.sleep(0.5)  # the attacker is watching
        _, res = restore_from_store(store, m.id, AppHookBackend(), wait=True)
        out, err = swapper.communicate(timeout=150)
    finally:
        tempfile.tempdir = None
        if swapper.poll() is None:
            swapper.kill()
            swapper.wait()
    assert "SWAPPED" in out, err  # the attack ran
    stolen = [p.name for p in victim.iterdir() if p.stat().st_uid != 0]
    assert stolen == [], f"root changed the owner of {len(stolen)} of root's files"
    assert len(list(victim.iterdir())) == files  # and removed none of them when it removed the copy
    assert res.exit_code == 0
    assert list(tmp.iterdir()) == []  # the copy is gone after a foreground restore


def test_app_hook_restore_without_wait_leaves_no_copy_behind(store: CheckpointStore, throwaway_user,
                                                             shared_tmp: Path, run_cli) -> None:
    """`gpudefrag restore` without --wait returns while the job runs; the private copy of the checkpoint it
    handed the job used to stay in /tmp for good. It is removed when the job ends."""
    from gpudefrag.checkpoint.compat import host_versions

    pending = store.create("nowait")
    (pending.dir / "meta.json").write_text('{"step": 1}')
    (pending.dir / "state.bin").write_bytes(os.urandom(1 << 20))
    owner = {"uid": throwaway_user.uid, "gid": throwaway_user.gid, "groups": []}
    m = pending.commit(backend="app", mode="app-hook", compat=host_versions("test 1"),
                       info={"argv": ["/bin/sh", "-c", 'test -f "$GPUDEFRAG_RESTORE_FROM/state.bin" && sleep 1'],
                             "cwd": "/", "owner": owner, "env": {"PATH": "/usr/bin:/bin"}})
    r = run_cli("restore", m.id, "--store", str(store.root), "--key", str(store.key_path), "--json",
                env={"TMPDIR": str(shared_tmp)})
    assert r.returncode == 0, r.stderr
    pid = json.loads(r.stdout)["pid"]
    copies = list(shared_tmp.glob("gpudefrag-restore-*"))
    assert len(copies) == 1 and (copies[0] / "state.bin").is_file()  # the job has its copy while it runs
    deadline = time.monotonic() + 30
    while (Path(f"/proc/{pid}").exists() or copies[0].exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists()
    assert not copies[0].exists(), "the checkpoint's copy outlived its job"
