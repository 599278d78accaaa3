"""File-system primitives every area shares: durable atomic JSON writes and bulk-loading without GC churn."""

from __future__ import annotations

import gc
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def write_json_atomic(path: str | os.PathLike[str], doc: Any, *, indent: int | None = 1,
                      sort_keys: bool = False) -> None:
    """Write JSON to a temporary file in the same folder, fsync it, rename it over `path`, fsync the folder:
    a reader never sees half a file, and a crash leaves either the old file or the new one."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=indent, sort_keys=sort_keys)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(p.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


@contextmanager
def bulk_allocation() -> Iterator[None]:
    """Pause the cyclic garbage collector while tens of thousands of acyclic objects are built (a large
    snapshot or Kubernetes dump): the collections they would trigger re-scan the growing heap and double the
    load time. Reference counting still frees everything."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
