"""The migration journal: SQLite in WAL mode with synchronous=FULL, so a transition that returned is on disk.

The executor writes every transition here *before* it acts on it; a restarted controller reads the
non-terminal migrations back and resumes or rolls each one back. The dashboard reads `history()` from another
process at the same time (WAL lets readers and the one writer proceed together).

The journal is the only record of migrations in flight, so opening it is strict: only a regular file that is
this journal (never a link, a directory, a device, a FIFO, someone else's SQLite file, a corrupt or truncated
one, or an empty file that used to be a journal — SQLite would silently start over on it). Anything else, a lock
held by another process or a full disk is a `JournalError`: one line, and nothing changed. A failed write rolls
back, so the migration stays at its last durable state and a restart resumes it. `readonly=True` (the
`migrations` command) opens with SQLite's mode=ro and never creates or changes a file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import sqlite3
import stat
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from ..errors import GpudefragError


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


_COLUMNS = {"migrations": {"id", "workload_id", "source", "target", "state", "reason", "data", "created_at",
                           "updated_at"},
            "steps": {"id", "migration_id", "state", "at", "detail"},
            "events": {"id", "at", "kind", "detail"}}
_HEADER = b"SQLite format 3\x00"
LOCK_WAIT_S = 2.0  # how long opening waits for another process's lock before saying so


class JournalError(GpudefragError):
    """The journal cannot be used: one line naming the file and why. Exit 1 when waiting may help (a lock, a
    full disk), 2 when the file itself is wrong."""

    def __init__(self, path: Path, message: str, *, transient: bool = False) -> None:
        self.exit_code = 1 if transient else 2
        super().__init__(f"{path}: journal: {message}")


def _explain(path: Path, e: BaseException) -> JournalError:
    if isinstance(e, UnicodeDecodeError):  # SQLite's error text quoting bytes of a damaged schema
        return JournalError(path, "corrupt or not an SQLite database (text that is not UTF-8)")
    text = str(e)
    low = text.lower()
    if (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)) or "disk is full" in low:
        return JournalError(path, f"the disk is full ({text}); nothing was written, free space and restart",
                            transient=True)
    if "locked" in low or "busy" in low:
        return JournalError(path, f"locked by another process ({text})", transient=True)
    if "not a database" in low or "malformed" in low or "corrupt" in low:
        return JournalError(path, f"corrupt or not an SQLite database ({text})")
    if "readonly" in low or "read-only" in low:
        return JournalError(path, f"cannot be written ({text})")
    return JournalError(path, text)


def _precheck(path: Path, *, readonly: bool) -> bool:
    """Refuse what must not be opened as the journal; True when this call created a new, empty one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if readonly:
            raise JournalError(path, "no journal here") from None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        except OSError as e:
            raise _explain(path, e) from None
        return True
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise JournalError(path, "is a symbolic link; refusing to follow it") from None
        raise JournalError(path, f"cannot open: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a device, FIFO or socket"
            raise JournalError(path, f"is {kind}, not a journal file")
        if st.st_size == 0:
            raise JournalError(path, "is empty: a journal that lost its contents? Refusing to start over on it "
                               "(move it away to start a new journal)")
        head = os.read(fd, 100)
    finally:
        os.close(fd)
    if not head.startswith(_HEADER):
        raise JournalError(path, "is not an SQLite database")
    if len(head) < 100:
        raise JournalError(path, "is truncated (shorter than an SQLite header)")
    return False


def _holders(st: os.stat_result) -> str:
    """Who holds the flock on the file `st` describes, from /proc/locks (best effort: `PID n`)."""
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []
    with contextlib.suppress(OSError):
        for ln in Path("/proc/locks").read_text().splitlines():
            parts = ln.split()
            if len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == want:
                pids.append(parts[4])
    return f"PID {', '.join(pids)}" if pids else "held by another process"


def _side_files(path: Path) -> bool:
    """Whether SQLite's -wal/-shm files exist beside the journal (refused when they are not regular files)."""
    found = False
    for suffix in ("-wal", "-shm"):
        try:
            st = os.lstat(f"{path}{suffix}")
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            raise JournalError(path, f"{path.name}{suffix} is not a regular file; refusing to use it")
        found = True
    return found


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
                 on_write: Callable[[Migration], None] | None = None, readonly: bool = False) -> None:
        self.path = Path(path)
        self.clock = clock
        self.on_write = on_write  # called after each transition is durable (fault-injection tests hook here)
        self.readonly = readonly
        self._lock = threading.RLock()
        created = _precheck(self.path, readonly=readonly)
        _side_files(self.path)
        ident = os.stat(self.path, follow_symlinks=False)
        try:
            if readonly:
                # no -wal/-shm: nothing is writing and all is in the main file; immutable keeps SQLite from
                # creating a -shm beside it. A live writer's WAL is read through the shared index it made.
                side = _side_files(self.path)
                uri = f"file:{urllib.parse.quote(str(self.path.absolute()))}?mode=ro{'' if side else '&immutable=1'}"
                self._db = sqlite3.connect(uri, uri=True, timeout=LOCK_WAIT_S, isolation_level=None,
                                           check_same_thread=False)
            else:
                self._db = sqlite3.connect(str(self.path), timeout=LOCK_WAIT_S, isolation_level=None,
                                           check_same_thread=False)
        except sqlite3.Error as e:
            raise _explain(self.path, e) from None
        self._db.row_factory = sqlite3.Row
        try:
            self._setup()
            now = os.stat(self.path, follow_symlinks=False)
            if (now.st_dev, now.st_ino) != (ident.st_dev, ident.st_ino):
                raise JournalError(self.path, "was replaced while being opened")
        except BaseException as e:
            self._db.close()
            if created:  # nothing half-made left behind: an empty file would be refused at the next start
                for suffix in ("", "-wal", "-shm"):
                    with contextlib.suppress(OSError):
                        os.unlink(f"{self.path}{suffix}")
            if isinstance(e, sqlite3.Error | UnicodeDecodeError):
                raise _explain(self.path, e) from None
            raise

    def _setup(self) -> None:
        db = self._db
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE "
                                           "'sqlite_%'")}
        if tables:  # an SQLite file without any table holds nothing to lose: it becomes the journal
            missing = [t for t in _COLUMNS if t not in tables]
            if missing:
                raise JournalError(self.path, f"is an SQLite file but not a gpudefrag journal (no {missing[0]} "
                                   "table)")
            for t, cols in _COLUMNS.items():
                have = {r[1] for r in db.execute(f"PRAGMA table_info({t})")}
                if not cols <= have:
                    raise JournalError(self.path, f"is not a gpudefrag journal (table {t} lacks "
                                       f"{', '.join(sorted(cols - have))})")
            check = str(db.execute("PRAGMA quick_check(1)").fetchone()[0])
            if check != "ok":
                raise JournalError(self.path, f"is corrupt ({check.splitlines()[0][:200]})")
        if self.readonly:
            if not tables:
                raise JournalError(self.path, "is an SQLite file without a journal in it")
            return
        if db.execute("PRAGMA journal_mode=WAL").fetchone()[0] != "wal":
            raise JournalError(self.path, "cannot switch to WAL mode (locked by another process?)", transient=True)
        db.execute("PRAGMA synchronous=FULL")  # every commit fsyncs the WAL
        db.executescript(_SCHEMA)
        db.execute("BEGIN IMMEDIATE")  # another writer holding the lock: say so now, not mid-migration
        db.execute("COMMIT")
        db.execute("PRAGMA busy_timeout=30000")  # from here on, wait out the dashboard's short reads

    def claim(self) -> None:
        """Make this process the journal's only controller, for as long as it runs: an exclusive `flock` on the
        journal file, held through a descriptor that closes only with the process (or `close`). A second
        controller on the same journal would drive the same migrations twice or leave them mid-way, so it is
        refused with one line naming the holder. The dashboard and `migrations` (read-only) never claim."""
        if self.readonly:
            raise JournalError(self.path, "opened read-only: a read-only reader cannot be the controller")
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            now = os.stat(self.path, follow_symlinks=False)
            if (st.st_dev, st.st_ino) != (now.st_dev, now.st_ino):
                raise JournalError(self.path, "was replaced while being claimed")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise JournalError(self.path, f"another controller is running on this journal "
                                   f"({_holders(st)}); only one controller may drive a journal",
                                   transient=True) from None
        except BaseException:
            os.close(fd)
            raise
        self._claim_fd = fd

    def close(self) -> None:
        self._db.close()
        fd, self._claim_fd = getattr(self, "_claim_fd", None), None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction; an SQLite failure (disk full, lock, corruption) rolls back and is a JournalError."""
        if self.readonly:
            raise JournalError(self.path, "opened read-only")
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
            except (sqlite3.Error, UnicodeDecodeError) as e:  # SQLite's own message can quote damaged bytes
                raise _explain(self.path, e) from None

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                yield self._db
            except (sqlite3.Error, UnicodeDecodeError) as e:  # SQLite's own message can quote damaged bytes
                raise _explain(self.path, e) from None

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
        with self._read() as db:
            r = db.execute("SELECT * FROM migrations WHERE id = ?", (mid,)).fetchone()
        if r is None:
            raise KeyError(f"no migration {mid}")
        return self._row(r)

    def active(self) -> list[Migration]:
        """Migrations not yet in a terminal state, oldest first."""
        marks = ",".join("?" * len(TERMINAL))
        with self._read() as db:
            rows = db.execute(f"SELECT * FROM migrations WHERE state NOT IN ({marks}) ORDER BY id",
                                    tuple(s.value for s in TERMINAL)).fetchall()
        return [self._row(r) for r in rows]

    def all(self) -> list[Migration]:
        with self._read() as db:
            rows = db.execute("SELECT * FROM migrations ORDER BY id").fetchall()
        return [self._row(r) for r in rows]

    def started_since(self, since: float) -> int:
        with self._read() as db:
            return int(db.execute("SELECT COUNT(*) FROM migrations WHERE created_at >= ?",
                                        (since,)).fetchone()[0])

    def steps(self, mid: int) -> list[dict[str, Any]]:
        with self._read() as db:
            rows = db.execute("SELECT state, at, detail FROM steps WHERE migration_id = ? ORDER BY id",
                                    (mid,)).fetchall()
        return [{"state": r["state"], "at": r["at"], "detail": r["detail"]} for r in rows]

    def history(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest `limit` migrations, newest first, each with its steps (the dashboard's view)."""
        with self._read() as db:
            rows = db.execute("SELECT * FROM migrations ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        out = []
        for r in rows:
            m = self._row(r)
            out.append({"id": m.id, "workload_id": m.workload_id, "source": m.source, "target": m.target,
                        "state": m.state.value, "reason": m.reason, "created_at": m.created_at,
                        "updated_at": m.updated_at, "steps": self.steps(m.id)})
        return out

    def events(self, limit: int = 100) -> list[dict[str, Any]]:
        with self._read() as db:
            rows = db.execute("SELECT at, kind, detail FROM events ORDER BY id DESC LIMIT ?",
                                    (limit,)).fetchall()
        return [{"at": r["at"], "kind": r["kind"], "detail": json.loads(r["detail"])} for r in rows]
