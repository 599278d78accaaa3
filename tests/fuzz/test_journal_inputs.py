"""The journal path (`gpudefrag migrations --journal X`): whatever X is, one line, a non-zero exit, no traceback,
no hang, and the file is left exactly as it was (the command opens the journal read-only).

The journal itself is harden-proc's (issue 15, "The journal"); these are the reader-side properties every input
must have, fed the same hostile material as the other readers."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import assert_one_line_error, run_cli, special_files

pytestmark = pytest.mark.timeout(300)


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else ""


def _real_journal(path: Path) -> bytes:
    db = sqlite3.connect(path)
    db.executescript("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
    db.close()
    return path.read_bytes()


@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link", "dev-null-link", "directory"])
def test_a_journal_that_is_not_a_regular_file(kind: str, tmp_path: Path) -> None:
    f = special_files(tmp_path)[kind]
    p = run_cli("migrations", "--journal", f, cwd=tmp_path, timeout=60)
    assert_one_line_error(p, f.name, codes=(1, 2))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_corrupt_or_foreign_journal_is_one_line_and_left_unchanged(tmp_path: Path, data: st.DataObject) -> None:
    f = tmp_path / "journal.db"
    f.unlink(missing_ok=True)
    good = _real_journal(f)
    how = data.draw(st.sampled_from(["truncate", "flip", "text", "empty-foreign"]))
    if how == "truncate":
        raw = good[: data.draw(st.integers(1, len(good) - 1))]
    elif how == "flip":
        i = data.draw(st.integers(0, 99))
        raw = good[:i] + bytes([good[i] ^ 0xFF]) + good[i + 1:]
    elif how == "text":
        raw = Path("/etc/passwd").read_bytes()
    else:
        raw = good  # a real SQLite file that holds no journal tables
    f.write_bytes(raw)
    before = _digest(f)
    p = run_cli("migrations", "--journal", f, cwd=tmp_path, timeout=60)
    if p.returncode != 0:
        assert_one_line_error(p, f.name, codes=(1, 2))
    assert _digest(f) == before
    assert sorted(x.name for x in tmp_path.iterdir() if x.name.startswith("journal.db")) == ["journal.db"]
