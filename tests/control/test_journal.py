"""The journal: WAL + synchronous=FULL, transitions durable and visible to another process at once, terminal
states final, and the history contract the dashboard reads."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpudefrag.control.journal import Journal, JournalError, MigrationState


def test_wal_and_full_sync(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    assert j._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert j._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL: every commit fsyncs the WAL


def test_transition_is_visible_to_another_process_immediately(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    j = Journal(path)
    m = j.create("job-1", "n1", "n2", reason="test", data={"a": 1})
    j.transition(m.id, MigrationState.CHECKPOINTING, detail="asked", data={"b": 2})
    code = ("import sys, json; from gpudefrag.control.journal import Journal; "
            f"print(json.dumps(Journal({str(path)!r}).history(5)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert '"state": "checkpointing"' in out and '"detail": "asked"' in out
    assert j.get(m.id).data == {"a": 1, "b": 2}
    # a plain sqlite reader (the dashboard may use one) sees the same rows
    con = sqlite3.connect(path)
    assert con.execute("SELECT state FROM migrations").fetchall() == [("checkpointing",)]


def test_terminal_is_final_and_active_excludes_it(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    a = j.create("a", "n1", "n2")
    b = j.create("b", "n3", "n4")
    j.transition(a.id, MigrationState.ABORTED, reason="gone")
    assert [m.workload_id for m in j.active()] == ["b"]
    with pytest.raises(ValueError, match="already aborted"):
        j.transition(a.id, MigrationState.CHECKPOINTING)
    assert j.get(a.id).reason == "gone" and j.get(b.id).state is MigrationState.PLANNED
    with pytest.raises(KeyError):
        j.transition(999, MigrationState.DONE)


def test_events_and_history_limits(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    for i in range(5):
        j.create(f"w{i}", "n1", "n2")
    j.event("defer", {"workload": "w9", "reason": "budget"})
    h = j.history(limit=2)
    assert [x["workload_id"] for x in h] == ["w4", "w3"]
    assert h[0]["steps"] == [{"state": "planned", "at": h[0]["created_at"], "detail": ""}]
    assert j.events(1)[0]["kind"] == "defer" and j.events(1)[0]["detail"]["workload"] == "w9"


# ---------------------------------------------------------------------- hostile journal files
GPUDEFRAG = [sys.executable, "-m", "gpudefrag.cli.main"]


def _migrations(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUDEFRAG, "migrations", "--journal", str(path), "--json"], capture_output=True,
                          text=True, timeout=60)


def _controller(path: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    from gpudefrag.snapshot import save_snapshot

    from .conftest import fragmented_state

    snap = tmp / "snap.json"
    if not snap.exists():
        save_snapshot(snap, fragmented_state())
    pol = Path(__file__).parents[2] / "examples" / "policies" / "observe-only.yaml"
    return subprocess.run([*GPUDEFRAG, "controller", "--engine", "sim", "--snapshot", str(snap), "--policy",
                           str(pol), "--journal", str(path), "--once"], capture_output=True, text=True, timeout=120)


def _one_line_error(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode != 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def _hostile(kind: str, tmp: Path) -> Path:
    p = tmp / "journal.db"
    if kind == "not-sqlite":
        p.write_bytes(Path("/etc/passwd").read_bytes())
    elif kind == "symlink":
        real = tmp / "real.db"
        Journal(real).create("w", "a", "b")
        p.symlink_to(real)
    elif kind == "directory":
        p.mkdir()
    elif kind == "dev-null":
        p = Path("/dev/null")
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "empty":  # a journal that held migrations and lost its contents
        j = Journal(p)
        j.create("w", "a", "b")
        j.close()
        for extra in ("-wal", "-shm"):
            Path(str(p) + extra).unlink(missing_ok=True)
        p.write_bytes(b"")
    elif kind == "truncated":
        j = Journal(p)
        for i in range(200):
            j.create(f"w{i}", "a", "b", data={"pad": "x" * 500})
        j._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        j.close()
        data = p.read_bytes()
        p.write_bytes(data[: len(data) // 2])
    elif kind == "corrupt":
        j = Journal(p)
        for i in range(200):
            j.create(f"w{i}", "a", "b", data={"pad": "x" * 500})
        j._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        j.close()
        data = bytearray(p.read_bytes())
        for off in range(4096, len(data), 4096):  # scribble over every page but the header
            data[off + 8: off + 40] = b"\xff" * 32
        p.write_bytes(bytes(data))
    elif kind == "foreign":
        con = sqlite3.connect(p)
        con.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        con.commit()
        con.close()
    elif kind == "foreign-migrations":  # someone else's table of the same name
        con = sqlite3.connect(p)
        con.execute("CREATE TABLE migrations (version TEXT, applied TEXT)")
        con.commit()
        con.close()
    return p


KINDS = ["not-sqlite", "symlink", "directory", "dev-null", "fifo", "empty", "truncated", "corrupt", "foreign",
         "foreign-migrations"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_journal_is_one_line_and_changes_nothing(tmp_path: Path, kind: str) -> None:
    p = _hostile(kind, tmp_path)
    before = sorted((q.name, q.lstat().st_size, q.lstat().st_mtime_ns) for q in tmp_path.iterdir())
    null_before = os.stat("/dev/null")
    r = _migrations(p)
    _one_line_error(r)
    after = sorted((q.name, q.lstat().st_size, q.lstat().st_mtime_ns) for q in tmp_path.iterdir())
    assert after == before  # read-only: nothing created, nothing changed
    _one_line_error(_controller(p, tmp_path))  # the controller refuses too (it creates one only where none is)
    assert os.stat("/dev/null").st_mode == null_before.st_mode


def test_migrations_never_writes_a_good_journal(tmp_path: Path) -> None:
    p = tmp_path / "j.db"
    j = Journal(p)
    j.create("w", "a", "b")
    j.close()
    os.chmod(p, 0o444)
    before = {q.name: q.read_bytes() for q in tmp_path.iterdir()}
    r = _migrations(p)
    assert r.returncode == 0, r.stderr
    assert '"workload_id": "w"' in r.stdout
    assert {q.name: q.read_bytes() for q in tmp_path.iterdir()} == before
    assert _migrations(tmp_path / "absent.db").returncode != 0
    assert not (tmp_path / "absent.db").exists()


def test_a_lock_held_by_another_process_is_one_line(tmp_path: Path) -> None:
    p = tmp_path / "j.db"
    with Journal(p) as j:
        j.create("w", "a", "b")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "c.execute('PRAGMA locking_mode=EXCLUSIVE'); c.execute('BEGIN EXCLUSIVE'); "
        "c.execute('SELECT * FROM migrations').fetchall(); print('held', flush=True); time.sleep(120)"), str(p)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        for r in (_migrations(p), _controller(p, tmp_path)):
            _one_line_error(r)
            assert "lock" in r.stderr
    finally:
        holder.kill()
        holder.wait()
    assert _migrations(p).returncode == 0  # and nothing was lost


def test_a_full_disk_is_one_line_and_keeps_the_in_flight_migration(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=True)
    try:
        p = mnt / "j.db"
        j = Journal(p)
        m = j.create("w", "a", "b")
        j.transition(m.id, MigrationState.CHECKPOINTING, detail="asked")
        filler = mnt / "filler"
        with contextlib.suppress(OSError), open(filler, "wb") as f:  # fill the disk to the last block
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        with pytest.raises(JournalError) as ei:
            j.transition(m.id, MigrationState.CHECKPOINTED, data={"pad": "x" * 200_000})
        assert "full" in str(ei.value) and "\n" not in str(ei.value)
        j.close()
        r = _controller(p, tmp_path)
        _one_line_error(r)
        filler.unlink()
        j2 = Journal(p)  # the disk is freed: a restart finds the migration where it was
        assert [(x.id, x.state) for x in j2.active()] == [(m.id, MigrationState.CHECKPOINTING)]
        j2.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


_GOOD: dict[str, bytes] = {}


def _good_journal() -> bytes:
    """The bytes of a checkpointed journal with some history (built once)."""
    if "b" not in _GOOD:
        with tempfile.TemporaryDirectory() as d:
            j = Journal(Path(d) / "j.db")
            for i in range(30):
                m = j.create(f"w{i}", "a", "b", data={"i": i})
                j.transition(m.id, MigrationState.CHECKPOINTING, detail="x" * (i * 10))
            j._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            j.close()
            _GOOD["b"] = (Path(d) / "j.db").read_bytes()
    return _GOOD["b"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.integers(min_value=0, max_value=1 << 20), flips=st.lists(
    st.tuples(st.integers(min_value=0, max_value=1 << 20), st.integers(min_value=1, max_value=255)), max_size=8),
    junk=st.binary(max_size=64), readonly=st.booleans())
@example(cut=144824, flips=[(996322, 128)], junk=b"", readonly=False)  # a name in sqlite_master not UTF-8 (CI)
def test_any_damage_is_a_journal_or_one_journal_error(cut: int, flips: list[tuple[int, int]], junk: bytes,
                                                      readonly: bool) -> None:
    data = bytearray(_good_journal())
    data = data[: cut % (len(data) + 1)] + junk
    for off, x in flips:
        if data:
            data[off % len(data)] ^= x
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "j.db"
        p.write_bytes(bytes(data))
        try:
            with Journal(p, readonly=readonly) as j:
                j.history(50)
                j.active()
        except JournalError as e:
            assert "\n" not in str(e) and str(p) in str(e)
        if readonly:
            assert p.read_bytes() == bytes(data) and sorted(os.listdir(d)) == ["j.db"]


def test_an_sqlite_file_without_tables_is_no_journal_to_read_but_may_become_one(tmp_path: Path) -> None:
    p = tmp_path / "j.db"
    con = sqlite3.connect(p)
    con.execute("PRAGMA user_version=1")  # writes the header, creates nothing
    con.commit()
    con.close()
    _one_line_error(_migrations(p))
    with Journal(p) as j:  # holds nothing to lose: the controller makes it its journal
        j.create("w", "a", "b")
    assert _migrations(p).returncode == 0



def test_a_second_controller_on_the_same_journal_is_refused(tmp_path: Path) -> None:
    """Two controllers on one journal drove migrations twice or left them mid-way: the first holds the journal
    (a lock held for its whole life), the second refuses with one line naming the holder and exits 1; once the
    first is gone, a new controller may take over."""
    import json
    import time

    from gpudefrag.demo import demo_state
    from gpudefrag.snapshot import state_to_dict

    snap = tmp_path / "snap.json"
    snap.write_text(json.dumps(state_to_dict(demo_state())))
    policy = Path(__file__).resolve().parents[2] / "examples/policies/default.yaml"
    journal = tmp_path / "j.db"
    cmd = [sys.executable, "-c", "from gpudefrag.cli.main import run; run()", "controller", "--policy", str(policy),
           "--engine", "sim", "--snapshot", str(snap), "--journal", str(journal), "--interval", "0.2"]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (journal.exists() and any(" FLOCK " in ln and f" {first.pid} " in ln
                                             for ln in Path("/proc/locks").read_text().splitlines())):
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            assert time.monotonic() < deadline, "the first controller never claimed the journal"
            time.sleep(0.1)
        second = subprocess.run([*cmd, "--max-cycles", "1"], capture_output=True, text=True, timeout=120)
        assert second.returncode == 1, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "another controller is running" in lines[0] and str(first.pid) in lines[0], lines
        assert first.poll() is None  # the first one goes on
    finally:
        first.terminate()
        first.wait(timeout=30)
    again = subprocess.run([*cmd, "--max-cycles", "1"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize(("point", "survives"), [("checkpointing", 0), ("checkpointing:wait-agent-checkpoint", 1),
                                                  ("checkpointing:verify-checkpoint-image", 2)])
def test_the_crash_hook_kills_at_a_state_or_at_one_operation_of_it(tmp_path: Path, point: str,
                                                                   survives: int) -> None:
    """GPUDEFRAG_CRASH_AT names a state (the first transition into it) or a state and the operation about to be
    taken (a Kubernetes move spends three operations in `checkpointing`): the process dies right after that
    transition is durable, never earlier or later."""
    code = (
        "import sys\n"
        "from gpudefrag.control.executor import crash_hook_from_env\n"
        "from gpudefrag.control.journal import Journal, MigrationState as S\n"
        "j = Journal(sys.argv[1], on_write=crash_hook_from_env())\n"
        "m = j.create('ml/x', 'a', 'b')\n"
        "ops = [{'op': k} for k in ('agent-checkpoint', 'wait-agent-checkpoint', 'verify-checkpoint-image')]\n"
        "j.transition(m.id, S.PLANNED, data={'sequence': {'ops': ops}})\n"
        "for i in range(3):\n"
        "    j.transition(m.id, S.CHECKPOINTING, detail=f'op {i}', data={'op': i})\n"
        "    j.transition(m.id, S.CHECKPOINTING, detail=f'op {i} ok')\n"
    )
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "j.db")], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "GPUDEFRAG_CRASH_AT": point})
    assert p.returncode == -9, p.stderr
    with Journal(tmp_path / "j.db", readonly=True) as j:
        assert j.steps(1)[-1]["detail"] == f"op {survives}"
