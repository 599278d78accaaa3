"""Each failure of a migration once against real Slurm and real CRIU (the randomised schedules run against the
simulated engine in tests/control): the checkpoint fails, the store is full, the restore is refused, the
target is drained mid-move. The executor runs in-process so that faults can be injected at exact steps."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpudefrag.checkpoint.store import CheckpointStore
from gpudefrag.control.agent import FileAgent
from gpudefrag.control.executor import Executor, ExecutorConfig
from gpudefrag.control.journal import Journal, Migration
from gpudefrag.engines.slurm import SlurmEngine

pytestmark = [pytest.mark.slurm, pytest.mark.criu, pytest.mark.slow]


@dataclass
class Mv:
    workload_id: str
    source: str
    target: str


def move(c, jid: str, *, store: Path | None = None, on_write: Callable[[Migration], None] | None = None,  # type: ignore[no-untyped-def]
         timeout: float = 60, fallback: str = "rollback") -> Migration:
    eng = SlurmEngine()
    st = CheckpointStore(store or c.store, c.key)
    journal = Journal(c.root / f"faults-{jid}.db", on_write=on_write)
    ex = Executor(eng, FileAgent(c.run_dir, st, signal=lambda w: eng.signal(w, "USR2")), journal,
                  ExecutorConfig(checkpoint_timeout_s=30, restore_timeout_s=30, fallback=fallback))
    ex.submit([Mv(jid, "node1", "node2")], reason="fault test")
    assert ex.run_until_idle(timeout, period_s=0.3), [m.as_dict() for m in ex.active()]
    return journal.all()[0]


def steps_of(c, jid: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [s["state"] for s in Journal(c.root / f"faults-{jid}.db").steps(1)]


@contextlib.contextmanager
def unix_server(path: Path) -> Iterator[None]:
    """A socket outside the job that the workload connects to: CRIU refuses to dump such a connection."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path.unlink(missing_ok=True)
    srv.bind(str(path))
    srv.listen(4)
    srv.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(srv.accept()[0])

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(2)
        for s in held:
            s.close()
        srv.close()
        path.unlink(missing_ok=True)


def test_checkpoint_fails_job_keeps_running_on_source(cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster
    sock = c.root / "ext.sock"
    with unix_server(sock):
        jid = c.submit("w-ext", 2, "node1", extra=f"--connect {sock}")
        c.wait_running(jid)
        c.wait_steps("w-ext", 3)
        m = move(c, jid)
        assert m.state.value == "rolled-back", m.as_dict()
        assert "checkpoint-failed" in m.reason and "kept running on node1" in m.reason
        c.wait_steps("w-ext", 10)
        cont = c.check_continuity(c.root / "w-ext.log")
        assert cont["starts"] == 1 and cont["contiguous"] and cont["nodes"] == ["node1"]
        assert "Restarts=0" in c.sh("scontrol", "show", "job", "-o", jid)
        assert len(c.workload_pids(c.root / "w-ext.log")) == 1


def test_evict_fallback_restarts_on_target_with_reason(cluster) -> None:  # type: ignore[no-untyped-def]
    """`action.fallback: evict`, asked for explicitly: a job whose checkpoint fails still leaves the node."""
    c = cluster
    sock = c.root / "ext2.sock"
    with unix_server(sock):
        jid = c.submit("w-evict", 2, "node1", extra=f"--connect {sock}")
        c.wait_running(jid)
        c.wait_steps("w-evict", 3)
        m = move(c, jid, fallback="evict")
        assert m.state.value == "cold-started", m.as_dict()
        assert m.reason.startswith("cold start on node2: evicted: checkpoint failed")
        assert c.job_state(jid) == ("RUNNING", "node2")
        end = time.time() + 20
        while c.check_continuity(c.root / "w-evict.log")["starts"] < 2 and time.time() < end:
            time.sleep(0.2)
        assert c.check_continuity(c.root / "w-evict.log")["starts"] == 2
        assert len(c.workload_pids(c.root / "w-evict.log")) == 1


def test_store_full_job_keeps_running_on_source(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    c = cluster
    small = c.root / "small-store"
    small.mkdir(exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(small)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {r.stderr.decode().strip()}")
    try:
        jid = c.submit("w-full", 2, "node1", store=small, extra="--mb 8")
        c.wait_running(jid)
        c.wait_steps("w-full", 3)
        m = move(c, jid, store=small)
        assert m.state.value == "rolled-back", m.as_dict()
        assert "store-full" in m.reason
        c.wait_steps("w-full", 8)
        cont = c.check_continuity(c.root / "w-full.log")
        assert cont["starts"] == 1 and cont["contiguous"] and cont["nodes"] == ["node1"]
        assert len(c.workload_pids(c.root / "w-full.log")) == 1
        assert not [p for p in small.iterdir() if not p.name.startswith(".")]  # nothing half-written kept
    finally:
        c.clean()
        subprocess.run(["umount", str(small)], capture_output=True)


def test_restore_refused_cold_starts_with_reason(cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster
    jid = c.submit("w-tamper", 2, "node1")
    c.wait_running(jid)
    c.wait_steps("w-tamper", 3)
    store = CheckpointStore(c.store, c.key)

    def tamper(m: Migration) -> None:  # after verification, before the job starts again: flip an image byte
        if m.state.value == "released":
            d = store.path(str(m.data["ckpt_id"]))
            img = max((p for p in d.rglob("*.img")), key=lambda p: p.stat().st_size)
            data = bytearray(img.read_bytes())
            data[len(data) // 2] ^= 0xFF
            img.write_bytes(bytes(data))

    m = move(c, jid, on_write=tamper)
    assert m.state.value == "cold-started", m.as_dict()
    assert "refused" in m.reason and "mismatch" in m.reason
    assert c.job_state(jid) == ("RUNNING", "node2")
    end = time.time() + 20
    while c.check_continuity(c.root / "w-tamper.log")["starts"] < 2 and time.time() < end:
        time.sleep(0.2)
    rows = c.check_continuity(c.root / "w-tamper.log")
    assert rows["starts"] == 2  # started fresh, and says so: the journal and the wrapper's status hold why
    status = (c.run_dir / jid / "status.json").read_text()
    assert "cold-started" in status and "mismatch" in status
    assert len(c.workload_pids(c.root / "w-tamper.log")) == 1


def test_target_drained_mid_move_rolls_back_with_state(cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster
    jid = c.submit("w-drain", 2, "node1")
    c.wait_running(jid)
    c.wait_steps("w-drain", 3)
    eng = SlurmEngine()

    def drain(m: Migration) -> None:
        if m.state.value == "requeued-held" and m.dest == "node2":
            eng.drain("node2", "gpudefrag fault test")

    m = move(c, jid, on_write=drain, timeout=90)
    assert m.state.value == "rolled-back", m.as_dict()
    assert "drained" in m.reason
    assert "rolling-back" in steps_of(c, jid)
    assert c.job_state(jid) == ("RUNNING", "node1")
    c.wait_steps("w-drain", 8)
    cont = c.check_continuity(c.root / "w-drain.log")
    assert cont["starts"] == 1 and cont["contiguous"] and cont["sha_ok"] and cont["nodes"] == ["node1"]
    assert len(c.workload_pids(c.root / "w-drain.log")) == 1
    time.sleep(0.1)
