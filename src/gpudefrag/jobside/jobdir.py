"""The files one job's wrapper and the controller share (`<run_dir>/<workload_id>/...`), and the guarded
reader both use for them."""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..fileio import parse_json, read_input


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from a run-folder file, or None. The job's user can write these files and the controller
    reads them as root, so they go through the guarded reader (no link, FIFO or device, 1 MiB at most); anything
    missing, unreadable or malformed counts as absent."""
    try:
        doc = parse_json(read_input(path, "status", follow_links=False), str(path))
    except InputError:
        return None
    return doc if isinstance(doc, dict) else None


def _check_private(path: Path, st: os.stat_result, what: str) -> None:
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise InputError(str(path), "", f"the {what} is a link or not a folder: refused (gpudefrag writes into it as "
                         f"uid {os.geteuid()})")
    if st.st_uid != os.geteuid():
        raise InputError(str(path), "", f"the {what} belongs to uid {st.st_uid}, not to uid {os.geteuid()} who "
                         "writes into it: refused (another user could plant links in it)")
    if st.st_mode & 0o022:
        raise InputError(str(path), "", f"the {what} may be written by others (mode {stat.S_IMODE(st.st_mode):04o}): "
                         "refused (they could plant links in it); make it 0755 or stricter")


def _stable(path: Path, depth: int = 0) -> Path:
    """`path` resolved, refusing (InputError) any component that someone but root or this process's user could
    replace: an entry in a folder another user owns, or may write without the sticky bit, or a sticky folder's
    entry (a link, say) owned by another user. A user who can swap a component of the run folder's path — a link
    planted at `/tmp/gpudefrag-run` before it existed, a folder in their home renamed away — would redirect
    everything root writes below it. Links are followed component by component, each target checked the same."""
    if depth > 40:
        raise InputError(str(path), "", "too many levels of links")
    me = os.geteuid()
    cur = Path("/") if Path(path).is_absolute() else Path.cwd().resolve()
    for name in str(path).split("/"):
        if name in ("", "."):
            continue
        if name == "..":
            cur = cur.parent
            continue
        nxt = cur / name
        d, st = os.stat(cur), os.lstat(nxt)
        why = ""
        if d.st_uid not in (0, me):
            why = f"{cur} belongs to uid {d.st_uid}"
        elif d.st_mode & 0o022 and not d.st_mode & stat.S_ISVTX:
            why = f"{cur} may be written by others (mode {stat.S_IMODE(d.st_mode):04o})"
        elif d.st_mode & 0o022 and st.st_uid not in (0, me):
            why = f"{nxt} belongs to uid {st.st_uid} in the shared folder {cur}"
        if why:
            raise InputError(str(path), "", f"{why}, who could swap it for a link: refused (gpudefrag writes "
                             "below it as root)")
        cur = _stable(Path(os.path.join(cur, os.readlink(nxt))), depth + 1) if stat.S_ISLNK(st.st_mode) else nxt
    return cur


_WORKLOAD_DIR_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


class JobDir:
    """The files one job's wrapper and the controller share: `<run_dir>/<workload_id>/...`."""

    def __init__(self, run_dir: Path, workload_id: str) -> None:
        if not _WORKLOAD_DIR_RE.match(workload_id):  # never a path: `../x`, `a/b`, 300 characters
            raise InputError("workload id", "", f"{workload_id[:80]!r} is not usable as a folder name (letters, "
                             "digits, '.', '_', '-'; at most 128; not starting with '.' or '-')")
        self.root = Path(run_dir) / workload_id

    def ensure(self) -> Path:
        """Make (or check) the job folder before anything is written into it as root, and return it.

        The run folder must be a folder of this process's user that nobody else may write (else a user could
        create the next job's folder first and plant links in it), reached through a path no other user can
        change (no link they planted, no folder of theirs on the way); the job folder is created here (0755: the
        workload reads its node file) or, when it exists, must be a folder — not a link — of this user that
        nobody else may write. Inside such a folder nobody else can plant a link, so the files gpudefrag writes
        there (status, ticket, requests, responses, node file, workload output) cannot be redirected.
        InputError (one line, exit 2) otherwise."""
        run = self.root.parent
        run.mkdir(parents=True, exist_ok=True, mode=0o755)
        _check_private(run, os.stat(_stable(run)), "run folder")
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.root, 0o755)
        _check_private(self.root, os.lstat(self.root), "job folder")
        return self.root

    @property
    def requests(self) -> Path:
        return self.root / "requests"

    @property
    def responses(self) -> Path:
        return self.root / "responses"

    @property
    def ticket(self) -> Path:
        return self.root / "ticket.json"

    @property
    def status(self) -> Path:
        return self.root / "status.json"

    @property
    def node_file(self) -> Path:
        """The node the workload runs on now: restored processes keep their old environment, so they read this."""
        return self.root / "node"

    def request(self, request_id: str) -> Path:
        return self.requests / f"{request_id}.json"

    def response(self, request_id: str) -> Path:
        return self.responses / f"{request_id}.json"
