"""Errors that reach the user. Every one names the file, the place inside it, and what is wrong."""

from __future__ import annotations

from collections.abc import Sequence


class GpudefragError(Exception):
    """Base of the errors the CLI reports as one line and exit code 2 (bad input) — never a traceback."""

    exit_code = 2


class InputError(GpudefragError):
    """A file the user gave us is malformed: `source` is the file, `where` the path inside it (e.g.
    `workloads[3].placements[0].node`, or `line 12, column 4`). `problem` says what kind of refusal it is, for
    callers that answer with their own codes (the checkpoint store): "missing", "link", "not-regular" (a FIFO,
    device, directory…), "too-large", "unreadable", or "content" (the bytes were read but are malformed)."""

    def __init__(self, source: str, where: str, message: str, *, problem: str = "content") -> None:
        self.source = source
        self.where = where
        self.message = message
        self.problem = problem
        super().__init__(f"{source}: {where}: {message}" if where else f"{source}: {message}")


def loc_to_path(loc: Sequence[str | int]) -> str:
    """('workloads', 3, 'placements', 0, 'node') -> 'workloads[3].placements[0].node'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(document)"
