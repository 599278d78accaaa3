"""The files one job's wrapper and the controller share (`<run_dir>/<workload_id>/...`), and the guarded
reader both use for them."""

from __future__ import annotations

import re
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


_WORKLOAD_DIR_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


class JobDir:
    """The files one job's wrapper and the controller share: `<run_dir>/<workload_id>/...`."""

    def __init__(self, run_dir: Path, workload_id: str) -> None:
        if not _WORKLOAD_DIR_RE.match(workload_id):  # never a path: `../x`, `a/b`, 300 characters
            raise InputError("workload id", "", f"{workload_id[:80]!r} is not usable as a folder name (letters, "
                             "digits, '.', '_', '-'; at most 128; not starting with '.' or '-')")
        self.root = Path(run_dir) / workload_id

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
