"""The journal: WAL + synchronous=FULL, transitions durable and visible to another process at once, terminal
states final, and the history contract the dashboard reads."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gpudefrag.control.journal import Journal, MigrationState


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
