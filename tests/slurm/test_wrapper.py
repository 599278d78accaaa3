"""The job wrapper (`gpudefrag run`) on its own, with real CRIU and no scheduler: heartbeat checkpoints while
the workload runs, a request file answered (USR2 hurries it), restore by ticket after a stop, and a refused
ticket cold-starting with its reason recorded. And the containment guarantee: whatever happens to the wrapper
(any signal, SIGKILL, a checkpoint that stopped the workload without committing) no workload process outlives
it, and it never reports success for a workload it lost."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudefrag.checkpoint.keys import load_key
from gpudefrag.checkpoint.store import CheckpointStore
from gpudefrag.control.agent import FileAgent, JobDir, Ticket

HERE = Path(__file__).parent
GPUDEFRAG = str(Path(sys.executable).parent / "gpudefrag")
pytestmark = [pytest.mark.criu]


@pytest.fixture
def env(tmp_path: Path):  # type: ignore[no-untyped-def]
    if os.geteuid() != 0 or shutil.which("criu") is None:
        if os.environ.get("GPUDEFRAG_REQUIRE_CRIU") == "1":
            pytest.fail("GPUDEFRAG_REQUIRE_CRIU=1 but CRIU (as root) is not available")
        pytest.skip("needs root and CRIU")
    d = {"GPUDEFRAG_RUN_DIR": str(tmp_path / "run"), "GPUDEFRAG_STORE": str(tmp_path / "store"),
         "GPUDEFRAG_KEY": str(tmp_path / "key"), "SLURMD_NODENAME": "nodeA"}
    load_key(tmp_path / "key", create=True)  # the wrapper never creates a key: a missing one is an error
    yield {**os.environ, **d}
    for pid in live_with(tmp_path):  # a failing test must not leave workloads behind either
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start(env: dict[str, str], wid: str, log: Path, *extra: str, node: str = "nodeA",
          cmd: list[str] | None = None) -> subprocess.Popen[str]:
    cmd = cmd or [sys.executable, str(HERE / "workload.py"), "--log", str(log), "--period", "0.1"]
    return subprocess.Popen([GPUDEFRAG, "run", "--workload-id", wid, *extra, "--", *cmd],
                            env={**env, "SLURMD_NODENAME": node}, stderr=subprocess.PIPE, text=True)


def steps(log: Path) -> list[int]:
    return [int(t.split("=")[1]) for ln in log.read_text().splitlines() for t in ln.split()[:1]
            if t.startswith("step=")] if log.exists() else []


def wait(cond, timeout: float = 20) -> None:  # type: ignore[no-untyped-def]
    end = time.time() + timeout
    while not cond():
        if time.time() > end:
            raise AssertionError("timed out")
        time.sleep(0.1)


def stop(p: subprocess.Popen[str]) -> str:
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=20)
    return err


def test_heartbeat_checkpoints_keep_the_workload_running(env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "hb.log"
    policy = tmp_path / "policy.yaml"
    policy.write_text("action:\n  heartbeat: {every_s: 1, keep: 3}\n")  # the schedule comes from the policy
    p = start(env, "hb", log, "--policy", str(policy), "--json")
    try:
        store = CheckpointStore(Path(env["GPUDEFRAG_STORE"]), Path(env["GPUDEFRAG_KEY"]))
        wait(lambda: len(store.list("hb")) >= 2)
        n = len(steps(log))
        wait(lambda: len(steps(log)) >= n + 5)
        assert all(store.verify(r["id"]).ok for r in store.list("hb"))
        wait(lambda: len(store.list("hb")) >= 3)
        time.sleep(2.5)  # two more heartbeats: retention keeps the newest 3
        assert 3 <= len(store.list("hb")) <= 4  # (4 while one is being written)
        s = steps(log)
        assert s == list(range(1, len(s) + 1))  # leave-running dumps: nothing lost, nothing repeated
    finally:
        err = stop(p)
    assert p.returncode == 143, err
    events = [json.loads(line)["event"] for line in err.splitlines() if line.startswith("{")]
    assert events[0].startswith("started") and any(e.startswith("heartbeat checkpoint") for e in events)
    time.sleep(0.3)
    assert live_with(log) == []  # the wrapper took its workload with it


def live_with(log: Path) -> list[int]:
    """Live processes whose command line mentions `log` (the workload, a shell script running it, ...)."""
    out = []
    for q in Path("/proc").iterdir():
        try:
            if q.name.isdigit() and str(log).encode() in (q / "cmdline").read_bytes() \
                    and (q / "stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX":
                out.append(int(q.name))
        except OSError:
            continue
    return out


def test_request_stop_restore_by_ticket_and_refused_ticket(env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "mv.log"
    run_dir = Path(env["GPUDEFRAG_RUN_DIR"])
    store = CheckpointStore(Path(env["GPUDEFRAG_STORE"]), Path(env["GPUDEFRAG_KEY"]))
    agent = FileAgent(run_dir, store)
    p = start(env, "mv", log)
    wait(lambda: len(steps(log)) >= 5)
    agent.request_checkpoint("mv", "r1", stop=False)
    p.send_signal(signal.SIGUSR2)
    wait(lambda: agent.checkpoint_status("mv", "r1").state.value != "pending")
    st = agent.checkpoint_status("mv", "r1")
    assert st.state.value == "ok" and st.still_running
    agent.request_checkpoint("mv", "r2", stop=True)
    wait(lambda: agent.checkpoint_status("mv", "r2").state.value != "pending")
    st2 = agent.checkpoint_status("mv", "r2")
    assert st2.state.value == "ok" and agent.verify(str(st2.ckpt_id)) == (True, "ok")
    assert agent.run_status("mv").phase.value == "checkpointed"
    at_dump = len(steps(log))
    time.sleep(0.5)
    assert len(steps(log)) == at_dump  # stopped: no step after the dump
    assert p.poll() is None  # the wrapper waits to be requeued, it does not end the job
    stop(p)
    # the job starts again "on another node" with a ticket naming the checkpoint
    agent.set_ticket("mv", Ticket("t1", st2.ckpt_id, "move"))
    p2 = start(env, "mv", log, node="nodeB")
    try:
        wait(lambda: len(steps(log)) >= at_dump + 5)
        rs = agent.run_status("mv")
        assert rs is not None and rs.phase.value == "restored" and rs.ticket_id == "t1" and rs.node == "nodeB"
        s = steps(log)
        assert s == list(range(1, len(s) + 1))  # continued from the dump, not from zero
        assert "node=nodeB" in log.read_text().splitlines()[-1]  # the node file, not the stale environment
        assert log.read_text().count("START") == 1
    finally:
        stop(p2)
    # a ticket whose checkpoint does not verify: the newest verified checkpoint instead (issue 32), and why
    bad = Ticket("t2", "mv-19700101T000000000000Z-000000", "move")
    agent.set_ticket("mv", bad)
    p3 = start(env, "mv", log, node="nodeC")
    try:
        wait(lambda: (agent.run_status("mv") or rs).ticket_id == "t2"
             and (agent.run_status("mv") or rs).phase.value != "starting")
        rs3 = agent.run_status("mv")
        assert rs3 is not None and rs3.phase.value == "restored" and rs3.ckpt_id == st2.ckpt_id, rs3
        assert "refused" in rs3.reason and "not-found" in rs3.reason and "fell back" in rs3.reason
        assert log.read_text().count("START") == 1  # its state, not a cold start
    finally:
        err3 = stop(p3)
    assert "falling back to the newest verified checkpoint" in err3  # said in the job's output too
    # no verified checkpoint left at all: a cold start, and why
    for cid in store.ids():
        shutil.rmtree(store.root / cid)
    agent.set_ticket("mv", Ticket("t3", "mv-19700101T000000000000Z-000000", "move"))
    p4 = start(env, "mv", log, node="nodeD")
    try:
        wait(lambda: (agent.run_status("mv") or rs).ticket_id == "t3"
             and (agent.run_status("mv") or rs).phase.value != "starting")
        rs4 = agent.run_status("mv")
        assert rs4 is not None and rs4.phase.value == "cold-started" and "refused" in rs4.reason
        wait(lambda: log.read_text().count("START") == 2)
    finally:
        stop(p4)
    handled = json.loads((JobDir(run_dir, "mv").root / "handled.json").read_text())["tickets"]
    assert handled == ["t1", "t2", "t3"]


def shebang_script(tmp_path: Path, log: Path) -> Path:
    """`./train.sh`: the process shows as /bin/bash, with the real work in a child."""
    sh = tmp_path / "train.sh"
    sh.write_text(f"#!/bin/bash\n{sys.executable} {HERE / 'workload.py'} --log {log} --period 0.1\n")
    sh.chmod(0o755)
    return sh


def gone(log: Path, timeout: float = 5) -> bool:
    end = time.time() + timeout
    while live_with(log):
        if time.time() > end:
            return False
        time.sleep(0.1)
    return True


def test_shebang_script_runs_checkpoints_and_is_taken_along(env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "sh.log"
    p = start(env, "sh", log, "--heartbeat-every", "1", cmd=[str(shebang_script(tmp_path, log))])
    store = CheckpointStore(Path(env["GPUDEFRAG_STORE"]), Path(env["GPUDEFRAG_KEY"]))
    wait(lambda: len(store.list("sh")) >= 1, timeout=25)  # the start-up check found the script's process
    assert p.poll() is None
    n = len(steps(log))
    wait(lambda: len(steps(log)) >= n + 3)  # a leave-running dump of bash and its child keeps it going
    assert store.verify(store.list("sh")[0]["id"]).ok
    err = stop(p)
    assert p.returncode == 143, err
    assert gone(log), live_with(log)


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGALRM,
                                 signal.SIGKILL])
def test_no_signal_leaves_the_workload_behind(env: dict[str, str], tmp_path: Path, sig: int) -> None:
    log = tmp_path / "sig.log"
    p = start(env, "sig", log, cmd=[str(shebang_script(tmp_path, log))])
    wait(lambda: len(steps(log)) >= 3)
    p.send_signal(sig)
    _, err = p.communicate(timeout=20)
    assert p.returncode != 0, err  # the job did not complete
    if sig != signal.SIGKILL:
        assert p.returncode == 128 + sig, err  # handled: the workload stopped first, then the wrapper
        assert "Traceback" not in err
    assert gone(log), f"{signal.Signals(sig).name} left {live_with(log)} running"


def test_usr1_is_passed_to_the_workload_not_fatal(env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "u1.log"
    p = start(env, "u1", log, cmd=[str(shebang_script(tmp_path, log))])
    wait(lambda: len(steps(log)) >= 3)
    p.send_signal(signal.SIGUSR1)  # the SDK's checkpoint signal: the workload's business, not the wrapper's
    n = len(steps(log))
    wait(lambda: len(steps(log)) >= n + 3)
    assert p.poll() is None
    p.kill()
    p.communicate(timeout=20)
    assert gone(log), live_with(log)


def test_sigkill_after_a_restore_takes_the_restored_workload_along(env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "rk.log"
    run_dir = Path(env["GPUDEFRAG_RUN_DIR"])
    agent = FileAgent(run_dir, CheckpointStore(Path(env["GPUDEFRAG_STORE"]), Path(env["GPUDEFRAG_KEY"])))
    p = start(env, "rk", log)
    wait(lambda: len(steps(log)) >= 3)
    agent.request_checkpoint("rk", "r1", stop=True)
    p.send_signal(signal.SIGUSR2)
    wait(lambda: agent.checkpoint_status("rk", "r1").state.value != "pending")
    st = agent.checkpoint_status("rk", "r1")
    assert st.state.value == "ok"
    p.kill()
    p.communicate(timeout=20)
    agent.set_ticket("rk", Ticket("t1", st.ckpt_id, "move"))
    p2 = start(env, "rk", log, node="nodeB")
    at = len(steps(log))
    wait(lambda: len(steps(log)) >= at + 3)
    assert agent.run_status("rk").phase.value == "restored"  # type: ignore[union-attr]
    p2.kill()  # SIGKILL: no handler runs; the restored tree must still go
    p2.communicate(timeout=20)
    assert gone(log), live_with(log)


def test_a_cron_that_never_fires_is_refused(env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "cr.log"
    policy = tmp_path / "policy.yaml"
    policy.write_text("action:\n  heartbeat: {cron: '0 0 30 2 *'}\n")  # 30 February
    p = start(env, "cr", log, "--policy", str(policy))
    _, err = p.communicate(timeout=30)
    assert p.returncode == 2, err
    assert "Traceback" not in err and "cron" in err and len(err.strip().splitlines()) == 1
    assert not log.exists()  # refused before anything started


def test_a_missing_key_is_an_error_not_a_new_key(env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "k.log"
    p = start({**env, "GPUDEFRAG_KEY": str(tmp_path / "nokey")}, "k", log)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 2 and "key" in err and "Traceback" not in err, err
    assert not (tmp_path / "nokey").exists() and not log.exists()


def _inodes(path: Path) -> tuple[int, int]:
    st = os.statvfs(path)
    return st.f_files - st.f_ffree, st.f_files


def test_a_stop_without_a_committed_checkpoint_never_ends_the_job_as_done(env: dict[str, str],
                                                                           tmp_path: Path) -> None:
    """The dump stops the workload, then the manifest finds the store full (its own tmpfs, out of inodes):
    the wrapper restores the workload in place or ends non-zero with the reason — never exit 0."""
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m,nr_inodes=4096", "tmpfs", str(small)], check=True)
    try:
        env = {**env, "GPUDEFRAG_STORE": str(small / "store")}
        log = tmp_path / "full.log"
        agent = FileAgent(Path(env["GPUDEFRAG_RUN_DIR"]), CheckpointStore(small / "store", Path(env["GPUDEFRAG_KEY"])))
        p = start(env, "full", log)
        wait(lambda: len(steps(log)) >= 3)
        agent.request_checkpoint("full", "r1", stop=False)  # one checkpoint: how many inodes one takes
        wait(lambda: agent.checkpoint_status("full", "r1").state.value != "pending")
        r1 = agent.checkpoint_status("full", "r1")
        assert r1.state.value == "ok"
        used, _ = _inodes(small)
        one = 1 + sum(1 for _ in (small / "store" / str(r1.ckpt_id)).rglob("*"))
        subprocess.run(["mount", "-o", f"remount,nr_inodes={used + one - 1}", str(small)], check=True)
        agent.request_checkpoint("full", "r2", stop=True)  # room for the images, not for the manifest
        wait(lambda: agent.checkpoint_status("full", "r2").state.value != "pending")
        st = agent.checkpoint_status("full", "r2")
        assert st.state.value == "failed"
        n = len(steps(log))
        wait(lambda: p.poll() is not None or len(steps(log)) >= n + 3, timeout=30)
        if p.poll() is None:  # restored in place: it runs on as the wrapper's workload, under its guard
            p.kill()  # SIGKILL: no handler runs; the guard must know the restored root to take it along
            _, err = p.communicate(timeout=20)
            assert "restored in place" in err, err
        else:
            _, err = p.communicate(timeout=20)
            assert p.returncode not in (0, None), err
            rs = agent.run_status("full")
            assert rs is not None and "not committed" in rs.reason, rs  # the reason, for the operator
            assert "not committed" in err, err
        assert gone(log), live_with(log)
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


@pytest.mark.parametrize("wid", ["../escape", "a" * 300, ".hidden", "a/b"])
def test_a_workload_id_that_is_no_folder_name_is_refused(env: dict[str, str], tmp_path: Path, wid: str) -> None:
    log = tmp_path / "id.log"
    p = start(env, wid, log)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 2 and "workload id" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not log.exists() and not (tmp_path / "escape").exists()


@pytest.mark.parametrize("how", ["run-folder-writable-by-all", "job-folder-owned-by-the-user",
                                 "run-folder-a-link-a-user-planted", "run-folder-inside-a-users-folder"])
def test_a_job_folder_planted_by_a_user_is_refused_and_nothing_is_written_through_it(
        env: dict[str, str], tmp_path: Path, shared_tmp: Path, throwaway_user, how: str) -> None:
    """With the run folder writable by users, a user created the next job's folder first, with `.node.tmp` (or
    status.json) a link to a root-owned file, and the root-run wrapper wrote through it. The wrapper now writes
    only into a job folder it created and owns: a run folder others may write, or a job folder of another user,
    is refused before anything starts (one line, exit 2), and the linked files stay as they were. So is a run
    folder reached through a path the user can change: a link they planted where the run folder was to be (in a
    shared /tmp: root's writes would land in the root folder it points to), or a folder of theirs above it (they
    could rename the run folder away and put a link there)."""
    run = shared_tmp / "run"
    victim = shared_tmp / "victim"
    victim.write_text("root's file\n")
    rootdir = shared_tmp / "root-only"  # e.g. /etc: root's own folder, 0755
    rootdir.mkdir(mode=0o755)
    if how == "run-folder-a-link-a-user-planted":
        r = throwaway_user.run(["ln", "-s", str(rootdir), str(run)])
        assert r.returncode == 0, r.stderr
    elif how == "run-folder-inside-a-users-folder":
        home = shared_tmp / "home"
        home.mkdir(mode=0o755)
        os.chown(home, throwaway_user.uid, throwaway_user.gid)
        run = home / "run"
        run.mkdir(mode=0o755)  # root's, but in a folder the user may rename it out of
    else:
        run.mkdir()
        if how == "run-folder-writable-by-all":
            os.chmod(run, 0o1777)  # like /tmp
            r = throwaway_user.run(["mkdir", str(run / "planted")])
            assert r.returncode == 0, r.stderr
        else:
            os.chmod(run, 0o755)
            (run / "planted").mkdir()  # e.g. made by an admin for the user
            os.chown(run / "planted", throwaway_user.uid, throwaway_user.gid)
        for name in (".node.tmp", "status.json", "workload.out", "handled.json"):
            r = throwaway_user.run(["ln", "-s", str(victim), str(run / "planted" / name)])
            assert r.returncode == 0, r.stderr
    log = tmp_path / "planted.log"
    p = start({**env, "GPUDEFRAG_RUN_DIR": str(run)}, "planted", log)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(run) in lines[0] and "refused" in lines[0], lines
    assert victim.read_text() == "root's file\n" and victim.stat().st_uid == 0
    assert list(rootdir.iterdir()) == []  # nothing written into the folder a planted link points to
    assert not log.exists()  # nothing started
    # the controller's side refuses to write requests or tickets there too
    agent = FileAgent(run, CheckpointStore(Path(env["GPUDEFRAG_STORE"]), Path(env["GPUDEFRAG_KEY"])))
    from gpudefrag.errors import InputError

    with pytest.raises(InputError):
        agent.set_ticket("planted", Ticket("t1", None, "move"))
    with pytest.raises(InputError):
        agent.request_checkpoint("planted", "r1", stop=True)
    assert victim.read_text() == "root's file\n" and list(rootdir.iterdir()) == []


def test_a_ticket_naming_another_workloads_checkpoint_is_refused(env: dict[str, str], tmp_path: Path) -> None:
    """The wrapper restored whatever checkpoint its ticket named: one job's process then ran inside another job.
    Tickets and checkpoints are bound to their workload (and user): a foreign one is refused (`wrong-workload`),
    the job cold-starts with the reason recorded, and the other job's process never runs here."""
    run_dir = Path(env["GPUDEFRAG_RUN_DIR"])
    store = CheckpointStore(Path(env["GPUDEFRAG_STORE"]), Path(env["GPUDEFRAG_KEY"]))
    agent = FileAgent(run_dir, store)
    other_log = tmp_path / "other.log"
    other = start(env, "other", other_log)
    try:
        wait(lambda: len(steps(other_log)) >= 3)
        agent.request_checkpoint("other", "r1", stop=False)
        other.send_signal(signal.SIGUSR2)
        wait(lambda: agent.checkpoint_status("other", "r1").state.value != "pending")
        theirs = agent.checkpoint_status("other", "r1")
        assert theirs.state.value == "ok" and theirs.ckpt_id
    finally:
        stop(other)
    assert gone(other_log)
    mine_log = tmp_path / "mine.log"
    agent.set_ticket("mine", Ticket("t-foreign", theirs.ckpt_id, "move"))
    mine = start(env, "mine", mine_log)
    try:
        wait(lambda: (agent.run_status("mine") is not None
                      and agent.run_status("mine").phase.value not in ("starting",)))  # type: ignore[union-attr]
        rs = agent.run_status("mine")
        assert rs is not None and rs.phase.value == "cold-started", rs
        assert "wrong-workload" in rs.reason and "other" in rs.reason, rs.reason
        wait(lambda: len(steps(mine_log)) >= 2)
        time.sleep(0.5)
        assert live_with(other_log) == []  # the other job's process is not running inside this one
    finally:
        stop(mine)


@pytest.mark.parametrize(("cmd", "code"), [(["true"], 0), (["sh", "-c", "exit 7"], 7),
                                           (["sh", "-c", "sleep 0.5; exit 7"], 7), (["false"], 1)])
def test_a_workload_exit_code_is_passed_on_however_fast_it_exits(env: dict[str, str], tmp_path: Path,
                                                                 cmd: list[str], code: int) -> None:
    """`run -- true` and `run -- sh -c 'exit 7'` made the wrapper fail with exit 1 (the launcher ended before
    the wrapper saw the workload), and a workload that exited 7 a moment later was reported as 0 (its status,
    reaped once, was read again as 0). The wrapper exits with the workload's own code, and records it."""
    p = start(env, "fast", tmp_path / "fast.log", cmd=cmd)
    _, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    status = json.loads((JobDir(Path(env["GPUDEFRAG_RUN_DIR"]), "fast").status).read_text())
    assert status["phase"] == "exited" and status["exit_code"] == code, status


def test_killing_the_guard_first_then_the_wrapper_still_takes_the_workload_along(env: dict[str, str],
                                                                                tmp_path: Path) -> None:
    """With the guard killed first and the wrapper a moment later (SIGKILL both), the workload survived,
    re-parented to PID 1. The wrapper notices its guard is gone and starts a new one at once."""
    log = tmp_path / "guard.log"
    p = start(env, "guard", log)
    try:
        wait(lambda: len(steps(log)) >= 3)
        me = Path(f"/proc/{p.pid}/cmdline").read_bytes()
        guards = [c for c in _children_of(p.pid) if Path(f"/proc/{c}/cmdline").read_bytes() == me]
        assert len(guards) == 1, guards
        os.kill(guards[0], signal.SIGKILL)
        wait(lambda: [c for c in _children_of(p.pid) if c != guards[0]
                      and Path(f"/proc/{c}/cmdline").read_bytes() == me] != [], timeout=10)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert gone(log, timeout=10), "the workload outlived its wrapper and its guard"


def _children_of(pid: int) -> list[int]:
    out: list[int] = []
    for t in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            out += [int(c) for c in (t / "children").read_text().split()]
    return out


def test_the_workload_runs_as_the_jobs_user_never_as_root(env: dict[str, str], shared_tmp: Path,
                                                          throwaway_user) -> None:
    """The wrapper runs as root (CRIU, the root-only store and key) and used to start the workload as root too.
    It now runs it as the job's user (--user, else SLURM_JOB_UID/SLURM_JOB_GID): that uid and gid, that user's
    groups only, no capabilities; the user cannot write into the job folder root writes in, and still reads the
    node file and gets its exit code passed on."""
    env = {**env, "GPUDEFRAG_RUN_DIR": str(shared_tmp / "run")}  # reachable by the user (tmp_path is not)
    script = ('id -u; id -g; id -G; grep CapEff /proc/self/status; d=$(dirname "$GPUDEFRAG_NODE_FILE"); '
              'touch "$d/planted" 2>/dev/null && echo WROTE || echo REFUSED; cat "$GPUDEFRAG_NODE_FILE"; exit 5')
    for how in ({"args": ("--user", throwaway_user.name)},
                {"env": {"SLURM_JOB_UID": str(throwaway_user.uid), "SLURM_JOB_GID": str(throwaway_user.gid)}}):
        wid = f"asuser{len(how['args']) if 'args' in how else 0}"
        p = subprocess.Popen([GPUDEFRAG, "run", "--workload-id", wid, *how.get("args", ()), "--", "sh", "-c",
                              script], env={**env, **how.get("env", {})}, stderr=subprocess.PIPE, text=True)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 5, err
        out = (JobDir(Path(env["GPUDEFRAG_RUN_DIR"]), wid).root / "workload.out").read_text().split("\n")
        assert out[0] == str(throwaway_user.uid) and out[1] == str(throwaway_user.gid), out
        assert out[2] == str(throwaway_user.gid), out  # no root groups, no others
        assert out[3].split() == ["CapEff:", "0000000000000000"], out
        assert out[4] == "REFUSED" and out[5] == "nodeA", out
