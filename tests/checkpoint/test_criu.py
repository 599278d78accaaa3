"""Real CRIU: a probe job is checkpointed, killed and restored, and continues where it stopped.

Every restore is judged by the probe's own log: steps contiguous from 1 with the hash chain intact (never from
zero, never a repeated or lost step) and the buffer's SHA-256 equal to the one it started with.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpudefrag.checkpoint import probe_job
from gpudefrag.checkpoint.operations import checkpoint_to_store, restore_from_store
from gpudefrag.checkpoint.store import CheckpointStore

from .conftest import Probes, stopped_advancing

pytestmark = pytest.mark.criu


def finish_and_check(probes: Probes, pid: int, log: Path, sha: str, after_step: int) -> probe_job.LogReport:
    """The restored job advances past `after_step`, keeps its buffer, then exits cleanly; the log proves it."""
    probe_job.wait_step(log, after_step + 3, timeout=30)
    assert probe_job.request_checksum(log, pid) == sha
    probes.stop(pid, log)
    report = probe_job.check_log(log)
    assert report.ok, report.problems
    assert report.starts == 1 and report.last_step > after_step
    return report


def test_dump_kill_restore_continues(criu, store: CheckpointStore, probes: Probes) -> None:
    job, log = probes.start()
    sha = probe_job.request_checksum(log, job.pid)
    m, res = checkpoint_to_store(store, criu, job.pid, "probe")
    assert res.mode == "dump" and res.frozen_s is not None and res.bytes_written > 16 << 20
    assert job.reap() is not None  # the dump killed it
    at_dump = probe_job.last_step(log)
    assert stopped_advancing(log)
    assert store.verify(m.id).ok
    _, rr = restore_from_store(store, m.id)
    probes.track(rr.pid)
    assert rr.pid == job.pid  # same host PID: it was free again
    finish_and_check(probes, rr.pid, log, sha, at_dump)
    assert store.verify(m.id).ok  # restoring did not change the signed checkpoint


def test_heartbeat_leave_running_then_restore_from_it(criu, store: CheckpointStore, probes: Probes,
                                                      tmp_path: Path) -> None:
    """--leave-running: the job keeps going; after it dies, the restore resumes exactly at the snapshot."""
    job, log = probes.start(pidns=True)
    sha = probe_job.request_checksum(log, job.pid)
    before = probe_job.last_step(log)
    m, res = checkpoint_to_store(store, criu, job.pid, "probe", leave_running=True)
    assert res.leave_running and m.info["leave_running"] is True
    running_past = probe_job.wait_step(log, before + 5, timeout=30)  # still running after the snapshot
    os.kill(job.pid, 9)
    job.reap()
    killed_at = probe_job.last_step(log)
    t_restore = time.time()
    _, rr = restore_from_store(store, m.id)
    probes.track(rr.pid)
    probe_job.wait_step(log, 1)
    # the restored job's lines come after t_restore; its first step is the snapshot's step + 1
    lines = log.read_text().splitlines()
    post = [ln for ln in lines if ln.startswith("step=") and float(probe_job.parse_fields(ln)["t"]) > t_restore]
    deadline = time.monotonic() + 30
    while not post and time.monotonic() < deadline:
        time.sleep(0.1)
        lines = log.read_text().splitlines()
        post = [ln for ln in lines if ln.startswith("step=") and float(probe_job.parse_fields(ln)["t"]) > t_restore]
    snap = int(probe_job.parse_fields(post[0])["step"]) - 1
    assert before <= snap < running_past <= killed_at
    # the story the restored job tells: steps 1..snap from the original, then its own, with one chain
    assert probe_job.request_checksum(log, rr.pid) == sha
    probes.stop(rr.pid, log)
    lines = log.read_text().splitlines()
    story = [ln for ln in lines if not ln.startswith("step=") or
             (float(probe_job.parse_fields(ln)["t"]) > t_restore
              or int(probe_job.parse_fields(ln)["step"]) <= snap)]
    virtual = tmp_path / "story.log"
    virtual.write_text("\n".join(story) + "\n")
    report = probe_job.check_log(virtual)
    assert report.ok, report.problems
    assert report.last_step > snap + 2  # continued past the snapshot


def test_page_server_streams_into_the_store(criu, store: CheckpointStore, probes: Probes) -> None:
    job, log = probes.start()
    sha = probe_job.request_checksum(log, job.pid)
    m, res = checkpoint_to_store(store, criu, job.pid, "probe", page_server=True)
    assert res.mode == "dump+page-server"
    assert any(f.path.startswith("pages-") and f.size > 16 << 20 for f in m.files)
    job.reap()
    at_dump = probe_job.last_step(log)
    _, rr = restore_from_store(store, m.id)
    probes.track(rr.pid)
    finish_and_check(probes, rr.pid, log, sha, at_dump)


def test_lazy_restore_runs_before_all_pages_are_in(criu, store: CheckpointStore, probes: Probes) -> None:
    job, log = probes.start(mb=64)
    sha = probe_job.request_checksum(log, job.pid)
    m, res = checkpoint_to_store(store, criu, job.pid, "probe")
    job.reap()
    at_dump = probe_job.last_step(log)
    _, rr = restore_from_store(store, m.id, lazy=True)
    probes.track(rr.pid)
    assert rr.mode == "lazy-restore" and rr.pages_complete_s is not None
    assert rr.pages_complete_s >= rr.duration_s
    print(f"\nLAZY RESTORE (64 MiB probe): frozen {res.frozen_s:.3f} s at dump; running again after "
          f"{rr.duration_s:.3f} s; all pages in after {rr.pages_complete_s:.3f} s")
    finish_and_check(probes, rr.pid, log, sha, at_dump)


def test_restore_on_another_node_new_netns_and_pidns(criu, store: CheckpointStore, probes: Probes,
                                                     netns_pair: tuple[str, str]) -> None:
    """'Another node' on one machine: the job ran in netns A as PID 1 of its own PID namespace; it comes back
    in netns B under a new host PID in a fresh PID namespace (PID 1 inside again), so no PID can collide."""
    ns_a, ns_b = netns_pair
    job, log = probes.start(pidns=True, netns=ns_a)
    assert os.readlink(f"/proc/{job.pid}/ns/net") == f"net:[{os.stat('/run/netns/' + ns_a).st_ino}]"
    assert "pid=1" in log.read_text().splitlines()[0]  # PID 1 inside
    sha = probe_job.request_checksum(log, job.pid)
    m, _ = checkpoint_to_store(store, criu, job.pid, "probe")
    assert m.info["netns_external"] is True and m.info["pidns_root"] is True
    job.reap()
    at_dump = probe_job.last_step(log)
    _, rr = restore_from_store(store, m.id, netns=ns_b, new_pidns=True)
    probes.track(rr.pid)
    assert os.readlink(f"/proc/{rr.pid}/ns/net") == f"net:[{os.stat('/run/netns/' + ns_b).st_ino}]"
    assert rr.pid != job.pid
    nspid = next(ln.split()[1:] for ln in Path(f"/proc/{rr.pid}/status").read_text().splitlines()
             if ln.startswith("NSpid:"))
    assert nspid == [str(rr.pid), "1"]  # its own PID namespace, where it is PID 1
    report = finish_and_check(probes, rr.pid, log, sha, at_dump)
    pids = {probe_job.parse_fields(ln)["pid"] for ln in log.read_text().splitlines() if ln.startswith("step=")}
    assert pids == {"1"} and report.last_step > at_dump


def test_new_pidns_is_refused_for_a_job_in_the_host_pidns(criu, store: CheckpointStore, probes: Probes) -> None:
    job, log = probes.start()
    m, _ = checkpoint_to_store(store, criu, job.pid, "probe", leave_running=True)
    from gpudefrag.checkpoint.protocol import CheckpointError

    with pytest.raises(CheckpointError, match="PID namespace"):
        restore_from_store(store, m.id, new_pidns=True)
    assert probe_job.wait_step(log, probe_job.last_step(log) + 1)  # the original is untouched


def test_precopy_request(criu, store: CheckpointStore, probes: Probes) -> None:
    """Pre-copy where the kernel tracks dirty pages; elsewhere a clean fallback to a plain dump that says so."""
    job, log = probes.start()
    sha = probe_job.request_checksum(log, job.pid)
    m, res = checkpoint_to_store(store, criu, job.pid, "probe", precopy=True)
    if criu.dirty_tracking:
        assert res.mode == "precopy" and any("pre-dump round" in n for n in res.notes)
    else:
        assert res.mode == "dump (pre-copy unavailable)"
        assert any("mem_dirty_track" in n for n in res.notes) and m.info["notes"] == list(res.notes)
        print(f"\nPRE-COPY: not available on kernel {os.uname().release}: {res.notes[0]}")
    job.reap()
    at_dump = probe_job.last_step(log)
    _, rr = restore_from_store(store, m.id)
    probes.track(rr.pid)
    finish_and_check(probes, rr.pid, log, sha, at_dump)


def test_cli_page_server_checkpoint_then_restore_wait_returns_the_jobs_exit_code(
        criu, store: CheckpointStore, probes: Probes, run_cli) -> None:
    """`checkpoint --page-server`, then `restore --wait` as a job step would: the CLI stays in the foreground
    and exits with the job's status (it becomes a subreaper, the restored job its child)."""
    import json
    import subprocess
    import sys

    job, log = probes.start(pidns=True, args=["--exit-code", "3"])
    r = run_cli("checkpoint", "--pid", str(job.pid), "--page-server", "--json", "--store", str(store.root),
                "--key", str(store.key_path))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["mode"] == "dump+page-server"
    m = store.read_manifest(json.loads(r.stdout)["id"])
    job.reap()
    at_dump = probe_job.last_step(log)
    cli = subprocess.Popen([sys.executable, "-m", "gpudefrag.cli.main", "restore", m.id, "--wait", "--json",
                            "--store", str(store.root), "--key", str(store.key_path)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        probe_job.wait_step(log, at_dump + 2, timeout=30)
        kids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) == cli.pid]
        assert len(kids) == 1, kids  # the restored job was re-parented to the waiting CLI
        probes.track(kids[0])
        probes.stop(kids[0], log)
        out, err = cli.communicate(timeout=30)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 3, err
    assert '"exit_code": 3' in out
    assert probe_job.check_log(log).ok


def _ppid(p: Path) -> int | None:
    try:
        return int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_a_process_tree_is_dumped_and_restored_whole(criu, store: CheckpointStore, probes: Probes,
                                                     tmp_path: Path) -> None:
    """A job step is often a shell with the real work as its child: dumping the root takes the whole tree."""
    import sys

    from gpudefrag.checkpoint.launch import process_tree, spawn_job

    log = tmp_path / "tree.log"
    job = spawn_job(["/bin/sh", "-c", f"{sys.executable} -m gpudefrag.checkpoint.probe_job --log {log} & wait"],
                    stdout=tmp_path / "tree.out", pidns=True)
    probes.jobs.append(job)
    probes.track(job.pid)
    probe_job.wait_step(log, 2)
    tree = process_tree(job.pid)
    assert len(tree) == 2
    probes.track(tree[1])
    sha = probe_job.request_checksum(log, tree[1])
    m, _ = checkpoint_to_store(store, criu, job.pid, "tree")
    job.reap()
    assert not any(Path(f"/proc/{p}").exists() for p in tree)
    at_dump = probe_job.last_step(log)
    _, rr = restore_from_store(store, m.id)
    new_tree = process_tree(rr.pid)
    for p in new_tree:
        probes.track(p)
    assert len(new_tree) == 2
    finish_and_check(probes, new_tree[1], log, sha, at_dump)
