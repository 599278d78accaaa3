"""The migration journal: SQLite in WAL mode with synchronous=FULL, so a transition that returned is on disk.

The executor writes every transition here *before* it acts on it; a restarted controller reads the
non-terminal migrations back and resumes or rolls each one back. The dashboard reads `history()` from another
process at the same time (WAL lets readers and the one writer proceed together).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any


class MigrationState(StrEnum):
    PLANNED = "planned"
    CHECKPOINTING = "checkpointing"
    CHECKPOINTED = "checkpointed"  # checkpoint written and verified
    REQUEUED_HELD = "requeued-held"
    PINNED = "pinned"  # restricted to its destination node, restore ticket written
    RELEASED = "released"
    RESTORING = "restoring"
    RUNNING_ON_TARGET = "running-on-target"
    DONE = "done"
    ROLLING_BACK = "rolling-back"  # going back to the source (with its checkpoint, or cold)
    ROLLED_BACK = "rolled-back"  # terminal: the job runs on its source node (never stopped, or restored there)
    COLD_STARTED = "cold-started"  # terminal: the job runs again but started fresh; `reason` says why
    ABORTED = "aborted"  # terminal: given up before anything was changed (or the job itself ended)


TERMINAL = frozenset({MigrationState.DONE, MigrationState.ROLLED_BACK, MigrationState.COLD_STARTED,
                      MigrationState.ABORTED})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS migrations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    workload_id TEXT NOT NULL,
    source TEXT NOT NULL,
    target TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    data TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS migrations_state ON migrations(state);
CREATE TABLE IF NOT EXISTS steps (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    migration_id INTEGER NOT NULL REFERENCES migrations(id),
    state TEXT NOT NULL,
    at REAL NOT NULL,
    detail TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS steps_migration ON steps(migration_id);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '{}'
);
"""


@dataclass(frozen=True)
class Migration:
    id: int
    workload_id: str
    source: str
    target: str
    state: MigrationState
    reason: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def dest(self) -> str:
        """Where the job is going now: the target, or the source once rolling back."""
        return str(self.data.get("dest", self.target))

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "workload_id": self.workload_id, "source": self.source, "target": self.target,
                "state": self.state.value, "reason": self.reason, "data": dict(self.data),
                "created_at": self.created_at, "updated_at": self.updated_at}


class Journal:
    """One SQLite file. Safe to share between threads of one process (a lock serialises writers)."""

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time,
                 on_write: Callable[[Migration], None] | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self.on_write = on_write  # called after each transition is durable (fault-injection tests hook here)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # every commit fsyncs the WAL
        self._db.execute("PRAGMA busy_timeout=30000")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # ------------------------------------------------------------------ writing
    def create(self, workload_id: str, source: str, target: str, *, reason: str = "",
               data: Mapping[str, Any] | None = None) -> Migration:
        """Record a planned migration (state PLANNED) and its first step."""
        now = self.clock()
        payload = json.dumps(dict(data or {}), sort_keys=True)
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO migrations (workload_id, source, target, state, reason, data, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (workload_id, source, target, MigrationState.PLANNED.value, reason, payload, now, now),
            )
            mid = int(cur.lastrowid or 0)
            db.execute("INSERT INTO steps (migration_id, state, at, detail) VALUES (?, ?, ?, ?)",
                       (mid, MigrationState.PLANNED.value, now, reason))
        m = self.get(mid)
        if self.on_write:
            self.on_write(m)
        return m

    def transition(self, mid: int, state: MigrationState, *, detail: str = "", reason: str | None = None,
                   data: Mapping[str, Any] | None = None) -> Migration:
        """Move a migration to `state` (merging `data` into its record) and append the step; durable on return."""
        now = self.clock()
        with self._tx() as db:
            row = db.execute("SELECT state, data FROM migrations WHERE id = ?", (mid,)).fetchone()
            if row is None:
                raise KeyError(f"no migration {mid}")
            if MigrationState(row["state"]) in TERMINAL:
                raise ValueError(f"migration {mid} is already {row['state']}")
            merged = {**json.loads(row["data"]), **dict(data or {})}
            if reason is None:
                db.execute("UPDATE migrations SET state = ?, data = ?, updated_at = ? WHERE id = ?",
                           (state.value, json.dumps(merged, sort_keys=True), now, mid))
            else:
                db.execute("UPDATE migrations SET state = ?, data = ?, reason = ?, updated_at = ? WHERE id = ?",
                           (state.value, json.dumps(merged, sort_keys=True), reason, now, mid))
            db.execute("INSERT INTO steps (migration_id, state, at, detail) VALUES (?, ?, ?, ?)",
                       (mid, state.value, now, detail))
        m = self.get(mid)
        if self.on_write:
            self.on_write(m)
        return m

    def event(self, kind: str, detail: Mapping[str, Any]) -> None:
        """A controller decision (trigger fired, plan chosen, move deferred by the budget...), with its reason."""
        with self._tx() as db:
            db.execute("INSERT INTO events (at, kind, detail) VALUES (?, ?, ?)",
                       (self.clock(), kind, json.dumps(dict(detail), sort_keys=True, default=str)))

    # ------------------------------------------------------------------ reading
    @staticmethod
    def _row(r: sqlite3.Row) -> Migration:
        return Migration(id=r["id"], workload_id=r["workload_id"], source=r["source"], target=r["target"],
                         state=MigrationState(r["state"]), reason=r["reason"], data=json.loads(r["data"]),
                         created_at=r["created_at"], updated_at=r["updated_at"])

    def get(self, mid: int) -> Migration:
        with self._lock:
            r = self._db.execute("SELECT * FROM migrations WHERE id = ?", (mid,)).fetchone()
        if r is None:
            raise KeyError(f"no migration {mid}")
        return self._row(r)

    def active(self) -> list[Migration]:
        """Migrations not yet in a terminal state, oldest first."""
        marks = ",".join("?" * len(TERMINAL))
        with self._lock:
            rows = self._db.execute(f"SELECT * FROM migrations WHERE state NOT IN ({marks}) ORDER BY id",
                                    tuple(s.value for s in TERMINAL)).fetchall()
        return [self._row(r) for r in rows]

    def all(self) -> list[Migration]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM migrations ORDER BY id").fetchall()
        return [self._row(r) for r in rows]

    def started_since(self, since: float) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM migrations WHERE created_at >= ?",
                                        (since,)).fetchone()[0])

    def steps(self, mid: int) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT state, at, detail FROM steps WHERE migration_id = ? ORDER BY id",
                                    (mid,)).fetchall()
        return [{"state": r["state"], "at": r["at"], "detail": r["detail"]} for r in rows]

    def history(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest `limit` migrations, newest first, each with its steps (the dashboard's view)."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM migrations ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        out = []
        for r in rows:
            m = self._row(r)
            out.append({"id": m.id, "workload_id": m.workload_id, "source": m.source, "target": m.target,
                        "state": m.state.value, "reason": m.reason, "created_at": m.created_at,
                        "updated_at": m.updated_at, "steps": self.steps(m.id)})
        return out

    def events(self, limit: int = 100) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT at, kind, detail FROM events ORDER BY id DESC LIMIT ?",
                                    (limit,)).fetchall()
        return [{"at": r["at"], "kind": r["kind"], "detail": json.loads(r["detail"])} for r in rows]
