"""`gpudefrag run` as a job's user: the client of the root run service (`gpudefrag run-service`), for real — the
service process as root, a throwaway unprivileged user running the client with the system Python, the
workload under the service's wrapper (real PID namespace, real setpriv, real CRIU where it can dump another
user's process). A batch script runs as the job's user, so this is how `gpudefrag run` works on a real
cluster; the service, not the client, says which job and which user a client is (SO_PEERCRED)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pydantic
import pytest
import typer

import gpudefrag
from gpudefrag.checkpoint.keys import load_key
from gpudefrag.checkpoint.store import CheckpointStore
from gpudefrag.control.agent import FileAgent, JobDir, Ticket

HERE = Path(__file__).parent
GPUDEFRAG = str(Path(sys.executable).parent / "gpudefrag")
SYS_PY = "/usr/bin/python3"  # the venv's interpreter lives under /root, which the throwaway user cannot enter
# the client imports gpudefrag (this checkout) and its dependencies like any user of an installed copy would
USER_PATH = ":".join(dict.fromkeys(str(Path(m.__file__).resolve().parents[1]) for m in (gpudefrag, typer, pydantic)))
CAP_SYS_RESOURCE = 24
pytestmark = [pytest.mark.criu]


def _has_cap(bit: int) -> bool:
    eff = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("CapEff:"))
    return bool(int(eff.split()[1], 16) >> bit & 1)


@dataclass
class Service:
    proc: subprocess.Popen[str]
    sock: Path
    run_dir: Path
    store: CheckpointStore
    shared: Path
    user: object  # ThrowawayUser

    def client(self, wid: str | None, cmd: list[str], *, env: dict[str, str] | None = None,
               sock: Path | None = None) -> subprocess.Popen[str]:
        """`gpudefrag run --workload-id WID -- CMD` started by the throwaway user, stdout and stderr piped."""
        args = [SYS_PY, "-c", "from gpudefrag.cli.main import run; run()", "run", "--socket", str(sock or self.sock),
                *(["--workload-id", wid] if wid else []), "--", *cmd]
        base = {"PATH": "/usr/bin:/bin", "PYTHONPATH": USER_PATH, "HOME": str(self.shared)}
        return self.user.popen(args, env={**base, **(env or {})}, cwd=str(self.shared),  # type: ignore[attr-defined]
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def jd(self, wid: str) -> JobDir:
        return JobDir(self.run_dir, wid)


def start_service(shared: Path, tmp_path: Path, *extra: str, jobs: str = "local",
                  sock: str = "sock") -> subprocess.Popen[str]:
    (shared / sock).mkdir(mode=0o755, exist_ok=True)
    p = subprocess.Popen([GPUDEFRAG, "run-service", "--socket", str(shared / sock / "run.sock"), "--run-dir",
                          str(shared / "run"), "--store", str(tmp_path / "store"), "--key", str(tmp_path / "key"),
                          "--jobs", jobs, "--node", "nodeA", *extra], stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    line = p.stderr.readline()
    assert "listening on" in line, line + (p.stderr.read() if p.poll() is not None else "")
    return p


@pytest.fixture
def service(tmp_path: Path, shared_tmp: Path, throwaway_user, require) -> Iterator[Service]:  # type: ignore[no-untyped-def]
    if os.geteuid() != 0 or shutil.which("criu") is None:
        require("CRIU", "needs root and CRIU")
    load_key(tmp_path / "key", create=True)
    p = start_service(shared_tmp, tmp_path)
    svc = Service(p, shared_tmp / "sock" / "run.sock", shared_tmp / "run",
                  CheckpointStore(tmp_path / "store", tmp_path / "key"), shared_tmp, throwaway_user)
    try:
        yield svc
    finally:
        p.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=20)
        if p.poll() is None:
            p.kill()


def steps(log: Path) -> list[int]:
    return [int(t.split("=")[1]) for ln in log.read_text().splitlines() for t in ln.split()[:1]
            if t.startswith("step=")] if log.exists() else []


def wait(cond, timeout: float = 20) -> None:  # type: ignore[no-untyped-def]
    end = time.time() + timeout
    while not cond():
        if time.time() > end:
            raise AssertionError("timed out")
        time.sleep(0.1)


def live_with(marker: Path) -> list[int]:
    out = []
    for q in Path("/proc").iterdir():
        try:
            if q.name.isdigit() and str(marker).encode() in (q / "cmdline").read_bytes() \
                    and (q / "stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX":
                out.append(int(q.name))
        except OSError:
            continue
    return out


def workload(log: Path) -> list[str]:
    return [SYS_PY, str(HERE / "workload.py"), "--log", str(log), "--period", "0.1"]


EVIL_SO = r"""
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void pwn(void) {
    const char *to = getenv("PWNED");
    if (to && geteuid() == 0) close(open(to, O_WRONLY | O_CREAT, 0644));  /* loaded into a root process */
}
"""


@pytest.mark.parametrize("code", [0, 7])
def test_a_job_users_run_goes_through_the_service_and_the_workload_runs_as_them(service: Service, code: int) -> None:
    """A batch script runs as the job's user, so `gpudefrag run` there cannot checkpoint anything itself. Started
    by a user it is the service's client: the workload runs as that user (uid, gid, own groups, no
    capabilities) in the client's folder with the client's environment, its output reaches the client's
    stdout, the wrapper's lines its stderr, and the client exits with the workload's code. The client's
    environment never reaches the stages that still run as root: an LD_PRELOAD library of the user's that would
    leave a mark when loaded into a root process leaves none."""
    u = service.user
    evil_c = service.shared / "evil.c"
    evil_c.write_text(EVIL_SO)
    evil = service.shared / "evil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(evil), str(evil_c)], check=True, capture_output=True)
    pwned = service.shared / "pwned"
    script = ('id -u; id -g; id -G; grep CapEff /proc/self/status; pwd; echo "foo=$FOO"; '
              f'cat "$GPUDEFRAG_NODE_FILE"; echo "wid=$GPUDEFRAG_WORKLOAD_ID"; exit {code}')
    wid = f"{u.name}.hello{code}"  # type: ignore[attr-defined]
    c = service.client(wid, ["sh", "-c", script], env={"FOO": "bar baz", "LD_PRELOAD": str(evil),
                                                        "PWNED": str(pwned)})
    out, err = c.communicate(timeout=60)
    assert c.returncode == code, err
    lines = out.splitlines()
    assert lines[:3] == [str(u.uid), str(u.gid), str(u.gid)], out  # type: ignore[attr-defined]
    assert lines[3].split() == ["CapEff:", "0000000000000000"], out
    assert lines[4:8] == [str(service.shared), "foo=bar baz", "nodeA", f"wid={wid}"], out
    assert f"started sh -c {script}" in err and f"workload exited ({code})" in err, err
    assert not pwned.exists(), "the user's LD_PRELOAD ran inside a root process"
    status = json.loads(service.jd(wid).status.read_text())
    assert status["phase"] == "exited" and status["exit_code"] == code


def test_killing_the_client_stops_the_workload(service: Service) -> None:
    """No workload outlives its client: SIGKILL of `gpudefrag run` (nothing it can catch) closes its socket,
    and the service stops the workload at once; SIGTERM of the client is passed on and the client exits 143
    once the workload is stopped, as the in-process wrapper does."""
    u = service.user
    log = service.shared / "killed.log"
    c = service.client(f"{u.name}.killed", workload(log))  # type: ignore[attr-defined]
    wait(lambda: len(steps(log)) >= 3)
    assert live_with(log)
    c.kill()
    c.wait(timeout=10)
    wait(lambda: live_with(log) == [], timeout=10)
    log2 = service.shared / "termed.log"
    c2 = service.client(f"{u.name}.termed", workload(log2))  # type: ignore[attr-defined]
    wait(lambda: len(steps(log2)) >= 3)
    c2.send_signal(signal.SIGTERM)
    _, err = c2.communicate(timeout=30)
    assert c2.returncode == 143, err
    assert "got SIGTERM: stopping the workload" in err
    assert live_with(log2) == []


def test_signals_the_client_gets_reach_the_wrapper(service: Service) -> None:
    """SIGUSR1 (the SDK's checkpoint signal) sent to the client reaches the workload through the service;
    SIGUSR2 asks the wrapper for a checkpoint (here it answers in the wrapper's own lines: taken, or why not)."""
    u = service.user
    c = service.client(f"{u.name}.sig", ["sh", "-c", "trap 'echo got-usr1' USR1; while :; do sleep 0.1; done"])  # type: ignore[attr-defined]
    out_path = service.jd(f"{u.name}.sig").root / "workload.out"  # type: ignore[attr-defined]
    wait(lambda: out_path.exists())
    time.sleep(0.5)
    c.send_signal(signal.SIGUSR1)
    wait(lambda: "got-usr1" in out_path.read_text())
    c.send_signal(signal.SIGUSR2)
    time.sleep(3)
    c.send_signal(signal.SIGTERM)
    out, err = c.communicate(timeout=30)
    assert "got-usr1" in out  # relayed to the client's stdout
    assert "heartbeat checkpoint" in err, err
    assert c.returncode == 143


def test_a_client_is_who_its_socket_says_not_who_it_claims(service: Service, tmp_path: Path) -> None:
    """The service takes the peer's uid from the socket (SO_PEERCRED), never from the client: a user asking for
    another user's workload is refused with one line and nothing starts; a request that also claims to be root
    changes nothing; root's own client is told to run the wrapper itself; a peer that sends no stdio is refused;
    and a client refuses a "service" that is not root's (which would receive its stdio)."""
    u = service.user
    c = service.client("root.x", ["sh", "-c", f"touch {service.shared}/ran"])
    _, err = c.communicate(timeout=30)
    assert c.returncode == 2
    assert err.strip().count("\n") == 0 and "refused" in err and "'root.x' is not" in err, err
    assert not (service.shared / "ran").exists() and not service.jd("root.x").root.exists()
    # a hand-made request claiming uid 0 and another user's name: still the peer's own uid
    claim = ("import json, socket, sys\n"
             "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
             "socket.send_fds(s, [b'F'], [0, 1, 2])\n"
             "req = {'argv': ['id', '-u'], 'env': {'PATH': '/usr/bin:/bin'}, 'cwd': '/', 'python': '/usr/bin/python3',"
             " 'workload_id': sys.argv[2], 'uid': 0, 'user': 'root', 'gid': 0}\n"
             "s.sendall(json.dumps(req).encode() + b'\\n')\n"
             "print(s.makefile().read())\n")
    r = u.run([SYS_PY, "-c", claim, str(service.sock), f"{u.name}.claim"], timeout=60)  # type: ignore[attr-defined]
    assert r.returncode == 0 and '{"exit": 0}' in r.stdout, r
    assert r.stdout.splitlines()[0] == str(u.uid), r.stdout  # type: ignore[attr-defined]
    # root's own client
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(service.sock))
        socket.send_fds(s, [b"F"], [0, 1, 2])
        s.sendall(json.dumps({"argv": ["true"], "env": {}, "cwd": "/", "python": "/usr/bin/python3",
                              "workload_id": "root.x"}).encode() + b"\n")
        answer = s.makefile().read()
    assert "refused" in answer and "job users only" in answer, answer
    # a peer that sends no stdio
    r = u.run([SYS_PY, "-c", "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "  # type: ignore[attr-defined]
               "s.sendall(b'{}\\n'); print(s.makefile().read())", str(service.sock)], timeout=30)
    assert "refused" in r.stdout and "stdin, stdout and stderr" in r.stdout, r
    # a listening socket of the user's own, where the client was told the service is
    fake_dir = service.shared / "fake"
    fake_dir.mkdir()
    os.chown(fake_dir, u.uid, u.gid)  # type: ignore[attr-defined]
    fake = u.popen([SYS_PY, "-c", "import socket, sys, time; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); "  # type: ignore[attr-defined]
                    "s.listen(); print('up', flush=True); c = s.accept(); time.sleep(30)", str(fake_dir / "s")],
                   stdout=subprocess.PIPE)
    try:
        assert fake.stdout is not None and fake.stdout.readline().strip() == "up"
        c = service.client(f"{u.name}.fake", ["true"], sock=fake_dir / "s")  # type: ignore[attr-defined]
        _, err = c.communicate(timeout=30)
        assert c.returncode == 2 and "not root's: refused" in err, err
    finally:
        fake.kill()


def test_a_process_outside_any_slurm_job_is_refused(tmp_path: Path, shared_tmp: Path, throwaway_user,
                                                    require) -> None:  # type: ignore[no-untyped-def]
    """With `--jobs slurm` the job is the one whose root `slurmstepd` the peer runs under: a user's process
    started anywhere else (their shell on a login node, say) gets one line and nothing runs, whatever job id it
    claims in SLURM_JOB_ID."""
    if os.geteuid() != 0 or shutil.which("criu") is None:
        require("CRIU", "needs root and CRIU")
    load_key(tmp_path / "key", create=True)
    p = start_service(shared_tmp, tmp_path, jobs="slurm")
    try:
        svc = Service(p, shared_tmp / "sock" / "run.sock", shared_tmp / "run",
                      CheckpointStore(tmp_path / "store", tmp_path / "key"), shared_tmp, throwaway_user)
        c = svc.client(None, ["sh", "-c", f"touch {shared_tmp}/ran"], env={"SLURM_JOB_ID": "1"})
        _, err = c.communicate(timeout=30)
        assert c.returncode == 2 and "refused" in err and "not in a Slurm job" in err, err
        assert err.strip().count("\n") == 0 and not (shared_tmp / "ran").exists()
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=20)


def test_a_checkpoint_and_a_restore_through_the_service(service: Service) -> None:
    """The controller's request (file + USR2, which reaches the client as `scancel --signal=USR2 --batch`
    would send it) is answered by the service's wrapper; the stopped job's client waits to be requeued; the
    next client of the same job restores the checkpoint its ticket names, as that user, and the workload goes on
    from where it stopped, its output reaching the new client. A ticket naming another job's checkpoint is
    refused (`wrong-workload`) and the job cold-starts."""
    u = service.user
    wid = f"{u.name}.mv"  # type: ignore[attr-defined]
    log = service.shared / "mv.log"
    agent = FileAgent(service.run_dir, service.store)
    c = service.client(wid, workload(log))
    wait(lambda: len(steps(log)) >= 5)
    agent.request_checkpoint(wid, "r1", stop=True)
    c.send_signal(signal.SIGUSR2)
    wait(lambda: agent.checkpoint_status(wid, "r1").state.value != "pending", timeout=60)
    st = agent.checkpoint_status(wid, "r1")
    if not _has_cap(CAP_SYS_RESOURCE):
        # CRIU reads the job's rlimits with prlimit(), which for another user's process needs CAP_SYS_RESOURCE
        assert st.state.value == "failed" and st.still_running, st  # refused before the job was stopped
        c.send_signal(signal.SIGTERM)
        c.communicate(timeout=30)
        pytest.skip("CRIU cannot dump another user's process here: this root lacks CAP_SYS_RESOURCE (a container); "
                    "the request was answered through the service and the job kept running")
    assert st.state.value == "ok", st
    at_dump = len(steps(log))
    c.send_signal(signal.SIGTERM)  # the requeue ends the old batch script
    c.communicate(timeout=30)
    agent.set_ticket(wid, Ticket("t1", st.ckpt_id, "move"))
    c2 = service.client(wid, workload(log))
    try:
        wait(lambda: len(steps(log)) >= at_dump + 5, timeout=60)
        rs = agent.run_status(wid)
        assert rs is not None and rs.phase.value == "restored" and rs.ckpt_id == st.ckpt_id, rs
        s = steps(log)
        assert s == list(range(1, len(s) + 1)) and log.read_text().count("START") == 1
        assert all(Path(f"/proc/{pid}").stat().st_uid == u.uid for pid in live_with(log))  # type: ignore[attr-defined]
    finally:
        c2.send_signal(signal.SIGTERM)
        out, _ = c2.communicate(timeout=30)
    assert "step=" in out


@pytest.mark.slurm
def test_sbatch_as_a_user_with_gpudefrag_run_in_the_script(cluster, tmp_path: Path, shared_tmp: Path,  # type: ignore[no-untyped-def]
                                                           throwaway_user) -> None:
    """The documented setup on a real Slurm cluster: the user submits a batch script whose last line is
    `exec gpudefrag run -- python ...`; the script runs as the user, so `gpudefrag run` is the run service's
    client. The service finds the job from the slurmstepd the client runs under and its user from Slurm, runs
    the workload as that user with the job's id, and the workload's output lands in the job's output file. A
    job whose script claims another job's id is refused (one line in its output, the job fails), and so is the
    user's process inside another user's job (root's, whose script drops to the user); `scancel` ends the
    client, and with it the workload."""
    u = throwaway_user
    munge = Path(cluster.env["SLURM_CONF"]).parents[1] / "munge"
    mode = munge.stat().st_mode & 0o7777
    os.chmod(munge, 0o711)  # the user's sbatch must reach munged's socket (the lab keeps it root-only)
    load_key(tmp_path / "key", create=True)
    (shared_tmp / "sock").mkdir(mode=0o755)
    sock = shared_tmp / "sock" / "run.sock"
    svc = subprocess.Popen([GPUDEFRAG, "run-service", "--socket", str(sock), "--run-dir", str(shared_tmp / "run"),
                            "--store", str(tmp_path / "store"), "--key", str(tmp_path / "key"), "--jobs", "slurm"],
                           stderr=subprocess.PIPE, text=True, env=cluster.env)
    try:
        assert svc.stderr is not None and "listening on" in svc.stderr.readline()
        log = shared_tmp / "job.log"

        def submit(name: str, pre: str = "") -> str:
            script = shared_tmp / f"{name}.sh"
            script.write_text(f"#!/bin/bash\nexport PYTHONPATH={USER_PATH} GPUDEFRAG_RUN_SOCKET={sock}\n{pre}"
                              f"exec {SYS_PY} -c 'from gpudefrag.cli.main import run; run()' run -- "
                              f"sh -c 'echo uid=$(id -u); exec {' '.join(workload(log))}'\n")
            script.chmod(0o755)
            r = u.run(["sbatch", "--parsable", "--gres=gpu:1", "-J", name, "--open-mode=append",
                       "-o", str(shared_tmp / f"{name}.out"), "-D", str(shared_tmp), str(script)],
                      env={"SLURM_CONF": cluster.env["SLURM_CONF"], "PATH": os.environ["PATH"]}, timeout=60)
            assert r.returncode == 0, r.stderr
            return r.stdout.strip().split(";")[0]

        jid = submit("w-svc")
        cluster.wait_running(jid)
        wait(lambda: len(steps(log)) >= 5, timeout=60)
        pids = [p for p in live_with(log) if b"workload.py" in Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[1]]
        assert pids and all((Path(f"/proc/{p}").stat().st_uid, Path(f"/proc/{p}").stat().st_gid) == (u.uid, u.gid)
                            for p in pids), pids  # the job's user and group (Slurm's UserId, GroupId)
        status = json.loads(JobDir(shared_tmp / "run", jid).status.read_text())
        assert status["phase"] == "fresh" and status["node"] == cluster.job_state(jid)[1], status
        out = shared_tmp / "w-svc.out"
        wait(lambda: f"uid={u.uid}" in out.read_text() and f"[gpudefrag run {jid}@" in out.read_text())
        # a job whose script claims the first job's id
        bad = submit("w-claim", pre=f"export GPUDEFRAG_WORKLOAD_ID={jid}\n")
        wait(lambda: cluster.job_state(bad)[0] in ("FAILED", "COMPLETED", "GONE"), timeout=60)
        text = (shared_tmp / "w-claim.out").read_text()
        assert f"not {jid}: refused" in text and text.strip().count("\n") == 0, text
        assert cluster.job_state(bad)[0] != "COMPLETED"
        # the user's process inside another user's job (root's job, whose script drops to the user): refused
        foreign = shared_tmp / "w-foreign.sh"
        foreign.write_text(f"#!/bin/bash\nexec setpriv --reuid={u.uid} --regid={u.gid} --clear-groups env "
                           f"PYTHONPATH={USER_PATH} GPUDEFRAG_RUN_SOCKET={sock} {SYS_PY} -c "
                           f"'from gpudefrag.cli.main import run; run()' run -- touch {shared_tmp}/foreign-ran\n")
        fj = cluster.sh("sbatch", "--parsable", "-J", "w-foreign", "-o", str(shared_tmp / "w-foreign.out"),
                        "-D", str(shared_tmp), str(foreign)).strip().split(";")[0]
        wait(lambda: cluster.job_state(fj)[0] in ("FAILED", "COMPLETED", "GONE"), timeout=60)
        text = (shared_tmp / "w-foreign.out").read_text()
        assert f"Slurm job {fj} belongs to root(0), not to {u.name}" in text, text
        assert not (shared_tmp / "foreign-ran").exists()
        cluster.sh("scancel", jid)
        wait(lambda: live_with(log) == [], timeout=60)
    finally:
        os.chmod(munge, mode)
        svc.send_signal(signal.SIGTERM)
        svc.wait(timeout=20)


def test_one_wrapper_per_workload_and_a_socket_folder_others_may_write_is_refused(service: Service,
                                                                                  tmp_path: Path) -> None:
    """A second `gpudefrag run` of a workload that already has a wrapper (in the same job: an `srun` step, a
    second line in the script) would write the same job folder and answer the same requests: it is refused
    with one line once the first has had time to stop (a requeued job's next client waits for it), and the
    first runs on. A service whose socket folder others may write (they could swap the socket for theirs, and
    receive every client's stdio) refuses to start."""
    u = service.user
    log = service.shared / "one.log"
    first = service.client(f"{u.name}.one", workload(log))  # type: ignore[attr-defined]
    try:
        wait(lambda: len(steps(log)) >= 3)
        second = service.client(f"{u.name}.one", ["sh", "-c", f"touch {service.shared}/second"])  # type: ignore[attr-defined]
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2 and "already has a wrapper" in err and err.strip().count("\n") == 0, err
        assert not (service.shared / "second").exists() and first.poll() is None
        n = len(steps(log))
        wait(lambda: len(steps(log)) >= n + 3)
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)
    assert first.returncode == 143
    # a requeued job's next client: starts as soon as the previous wrapper is done
    again = service.client(f"{u.name}.one", ["sh", "-c", "exit 4"])  # type: ignore[attr-defined]
    again.communicate(timeout=60)
    assert again.returncode == 4
    bad = service.shared / "open"
    bad.mkdir(mode=0o777)
    os.chmod(bad, 0o777)
    p = subprocess.run([GPUDEFRAG, "run-service", "--socket", str(bad / "run.sock"), "--run-dir",
                        str(service.run_dir), "--store", str(tmp_path / "store"), "--key", str(tmp_path / "key"),
                        "--jobs", "local"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "nobody else may write" in p.stderr and not (bad / "run.sock").exists(), p.stderr


def test_a_user_may_run_only_so_many_workloads_under_the_service(service: Service, tmp_path: Path) -> None:
    """Each client's wrapper is a root process of the service: past `--max-per-user` a user's next client is
    refused with one line (nothing starts), by the listener itself — a burst of connections makes no root child
    — and is served again once one of theirs has ended."""
    p = start_service(service.shared, tmp_path, "--max-per-user", "1", "--request-timeout", "1", sock="sock1")
    u = service.user
    try:
        sock = service.shared / "sock1" / "run.sock"
        log = service.shared / "lim.log"
        first = service.client(f"{u.name}.lim1", workload(log), sock=sock)  # type: ignore[attr-defined]
        wait(lambda: len(steps(log)) >= 2)
        second = service.client(f"{u.name}.lim2", ["sh", "-c", f"touch {service.shared}/lim2"], sock=sock)  # type: ignore[attr-defined]
        _, err = second.communicate(timeout=30)
        assert second.returncode == 2 and "--max-per-user" in err and err.strip().count("\n") == 0, err
        assert not (service.shared / "lim2").exists()
        # a burst of connections that send nothing: refused by the listener itself, no root child for any
        idle = u.popen([SYS_PY, "-c", "import socket, sys, time\n"  # type: ignore[attr-defined]
                        "held = [socket.socket(socket.AF_UNIX) for _ in range(20)]\n"
                        "for s in held: s.connect(sys.argv[1])\n"
                        "print('held', flush=True); time.sleep(30)", str(sock)], stdout=subprocess.PIPE)
        try:
            assert idle.stdout is not None and idle.stdout.readline().strip() == "held"
            time.sleep(0.3)
            assert len(_kids(p.pid)) == 1, _kids(p.pid)  # the first client's wrapper only
        finally:
            idle.kill()
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)
        # a connection that sends nothing holds its child only --request-timeout long
        mute = u.popen([SYS_PY, "-c", "import socket, sys, time\n"  # type: ignore[attr-defined]
                        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
                        "print('held', flush=True); print(s.makefile().read(), flush=True)", str(sock)],
                       stdout=subprocess.PIPE)
        assert mute.stdout is not None and mute.stdout.readline().strip() == "held"
        time.sleep(0.3)
        assert len(_kids(p.pid)) == 1
        out, _ = mute.communicate(timeout=10)  # dropped (with one line) after the timeout, not held
        assert "refused" in out or "timed out" in out, out
        wait(lambda: _kids(p.pid) == [], timeout=5)
        first.communicate(timeout=30)
        time.sleep(0.5)
        third = service.client(f"{u.name}.lim2", ["sh", "-c", "exit 3"], sock=sock)  # type: ignore[attr-defined]
        third.communicate(timeout=30)
        assert third.returncode == 3
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=20)


def _kids(pid: int) -> list[int]:
    out: list[int] = []
    for t in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            out += [int(c) for c in (t / "children").read_text().split()]
    return out


def _memory_cgroup(pid: int | str = "self") -> str:
    return next(ln.split(":", 2)[2] for ln in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                if ln.split(":")[1] == "memory")


def test_the_workload_runs_in_its_clients_cgroups_not_the_services(service: Service) -> None:
    """Slurm confines a job with cgroups (memory, the GPUs it may open); a workload started by the service as its
    child would escape them. The client's cgroups are the job's: the workload joins them before its first
    process forks (here a memory cgroup made for the "job", which the client runs in and the service does not)."""
    mem = Path("/sys/fs/cgroup/memory")
    if not (mem / "cgroup.procs").exists():
        pytest.skip("no cgroup v1 memory hierarchy mounted here")
    job_cg = mem / _memory_cgroup().lstrip("/") / f"gpd-job-{os.getpid()}"
    job_cg.mkdir()
    u = service.user
    try:
        wid = f"{u.name}.cg"  # type: ignore[attr-defined]
        client = [SYS_PY, "-c", "from gpudefrag.cli.main import run; run()", "run", "--socket", str(service.sock),
                  "--workload-id", wid, "--", "sh", "-c", "grep :memory: /proc/self/cgroup"]
        # the client is put in the job's cgroup before it runs, as slurmstepd puts a batch script
        c = subprocess.Popen(["sh", "-c", 'echo $$ > "$0"; exec "$@"', str(job_cg / "cgroup.procs"), "setpriv",
                              f"--reuid={u.uid}", f"--regid={u.gid}", "--clear-groups", "env", "-i",  # type: ignore[attr-defined]
                              "PATH=/usr/bin:/bin", f"PYTHONPATH={USER_PATH}", *client],
                             cwd=str(service.shared), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = c.communicate(timeout=60)
        assert c.returncode == 0, err
        assert out.strip().endswith(f":memory:{_memory_cgroup()}/{job_cg.name}"), out
        assert _memory_cgroup(service.proc.pid) != f"{_memory_cgroup()}/{job_cg.name}"  # not the service's
    finally:
        for _ in range(50):
            with contextlib.suppress(OSError):
                job_cg.rmdir()
                break
            time.sleep(0.1)


def test_a_ticket_naming_roots_or_another_jobs_checkpoint_never_restores_through_the_service(
        service: Service, tmp_path: Path) -> None:
    """The service's wrapper restores only checkpoints of its own workload whose signed record says they ran as
    the client's user: a ticket naming a checkpoint of root's process filed under the very same workload id, or
    another job's, is refused (`wrong-workload`), the job cold-starts as the user with the reason recorded, and
    root's process never runs again (restored, it would run with root's credentials inside the user's job)."""
    from gpudefrag.checkpoint.criu import CriuBackend
    from gpudefrag.checkpoint.launch import spawn_job
    from gpudefrag.checkpoint.operations import checkpoint_to_store

    u = service.user
    wid = f"{u.name}.stolen"  # type: ignore[attr-defined]
    made = []
    for i, owner_wid in enumerate((wid, "other.job")):
        rlog = tmp_path / f"root{i}.log"
        job = spawn_job([SYS_PY, str(HERE / "workload.py"), "--log", str(rlog), "--period", "0.1"],
                        stdout=tmp_path / f"root{i}.out", pidns=True)
        wait(lambda rlog=rlog: len(steps(rlog)) >= 2)  # type: ignore[misc]
        m, _ = checkpoint_to_store(service.store, CriuBackend(), job.pid, owner_wid)
        job.reap()
        assert m.info["owner"]["uid"] == 0
        made.append((m.id, rlog))
    agent = FileAgent(service.run_dir, service.store)
    for n, (cid, rlog) in enumerate(made):
        at = len(steps(rlog))
        agent.set_ticket(wid, Ticket(f"t{n}", cid, "move"))
        c = service.client(wid, ["sh", "-c", "id -u"])
        out, err = c.communicate(timeout=60)
        assert c.returncode == 0, err
        cold = [ln for ln in err.splitlines() if "cold start:" in ln]  # (status.json says `exited` by now)
        assert len(cold) == 1 and f"restore of {cid}: wrong-workload" in cold[0], err
        assert json.loads((service.jd(wid).root / "handled.json").read_text())["tickets"][-1] == f"t{n}"
        assert out.strip().splitlines()[-1] == str(u.uid), out  # type: ignore[attr-defined]
        assert live_with(rlog) == [] and len(steps(rlog)) == at  # root's process never came back
