"""Touching a job's files as root without trusting them, and giving a job back only what its owner had.

gpudefrag checkpoints run as root beside other people's jobs. Everything a job can write — its spool, its
working folder, a log folder in a shared /tmp — may hold a link to /etc/shadow, a FIFO that hangs the reader, or
a file owned by someone else. So: folders are opened one component at a time with O_NOFOLLOW (no link anywhere
in the path), files with O_NOFOLLOW|O_NONBLOCK relative to their folder's descriptor and checked with fstat
(a regular file, one link, owned by the job's user) before a byte is read; and a job is restarted with the
uid, gid and groups it had, never more.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .protocol import OWNER_MISMATCH, UNSAFE_PATH, CheckpointError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 4 << 20
MAX_DEPTH = 32  # folders inside a save; deeper is refused rather than recursed into


def process_owner(pid: int) -> dict[str, Any]:
    """The real uid, gid and supplementary groups of a process (what a restore may give it back)."""
    doc = dict(ln.split(":", 1) for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in ln)
    return {"uid": int(doc["Uid"].split()[0]), "gid": int(doc["Gid"].split()[0]),
            "groups": sorted(int(g) for g in doc.get("Groups", "").split())}


def open_dir(path: Path | str) -> int:
    """An O_DIRECTORY descriptor of an absolute path, reached without following a link in any component."""
    p = Path(path)
    if not p.is_absolute():
        raise CheckpointError(UNSAFE_PATH, "not an absolute path", path=str(p))
    fd = os.open("/", _DIR_FLAGS)
    try:
        for part in p.parts[1:]:
            if part in ("..", "."):
                raise CheckpointError(UNSAFE_PATH, f"{part!r} in the path", path=str(p))
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise CheckpointError(UNSAFE_PATH, f"{part!r} is a link or not a folder", path=str(p)) from None
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def opened_dir(path: Path | str) -> Iterator[int]:
    fd = open_dir(path)
    try:
        yield fd
    finally:
        os.close(fd)


def _owned(st: os.stat_result, uid: int, what: str) -> None:
    if uid != 0 and st.st_uid != uid:
        raise CheckpointError(UNSAFE_PATH, f"{what}: owned by uid {st.st_uid}, not the job's uid {uid}")


def copy_tree(src_fd: int, dest_fd: int, uid: int, where: str = ".", depth: int = 0, *,
              give_to: tuple[int, int] | None = None) -> int:
    """Copy the folder open at `src_fd` into the folder open at `dest_fd`: regular files and folders owned by
    `uid` only; a link, FIFO, device, socket or hard-linked file anywhere is refused (`unsafe-path`). Bytes copied.

    Everything is created relative to its folder's descriptor, exclusively and without following a link, and
    `give_to` (uid, gid) is applied with `fchown` on the new file's own descriptor: no ownership or mode is ever
    changed through a path, which someone could have swapped for a link in between."""
    if depth > MAX_DEPTH:
        raise CheckpointError(UNSAFE_PATH, f"{where}: folders nested more than {MAX_DEPTH} deep")
    n = 0
    _owned(os.fstat(src_fd), uid, where)
    for name in sorted(os.listdir(src_fd)):
        rel = f"{where}/{name}" if where != "." else name
        st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=src_fd)
            except OSError as e:
                raise CheckpointError(UNSAFE_PATH, f"{rel}: cannot open without following a link: {e.strerror}") \
                    from None
            try:
                os.mkdir(name, 0o700, dir_fd=dest_fd)
                dsub = os.open(name, _DIR_FLAGS, dir_fd=dest_fd)
                try:
                    if give_to is not None:
                        os.fchown(dsub, *give_to)
                    n += copy_tree(sub, dsub, uid, rel, depth + 1, give_to=give_to)
                finally:
                    os.close(dsub)
            finally:
                os.close(sub)
            continue
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(UNSAFE_PATH, f"{rel}: not a regular file (a link, FIFO or device)")
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=src_fd)
        except OSError as e:
            raise CheckpointError(UNSAFE_PATH, f"{rel}: cannot open without following a link: {e.strerror}") \
                from None
        with os.fdopen(fd, "rb") as src:
            fst = os.fstat(fd)  # what was opened, not what the name pointed at a moment ago
            if not stat.S_ISREG(fst.st_mode) or (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
                raise CheckpointError(UNSAFE_PATH, f"{rel}: changed while being opened")
            if fst.st_nlink != 1:
                raise CheckpointError(UNSAFE_PATH, f"{rel}: has {fst.st_nlink} hard links")
            _owned(fst, uid, rel)
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                          dir_fd=dest_fd)
            with os.fdopen(out, "wb") as f:
                if give_to is not None:
                    os.fchown(out, *give_to)
                while chunk := src.read(_CHUNK):
                    f.write(chunk)
                    n += len(chunk)
    return n


def tree_bytes(fd: int, depth: int = 0) -> int:
    """Bytes in the regular files below the folder open at `fd` (links not followed): a size estimate only."""
    n = 0
    for name in os.listdir(fd):
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode):
            n += st.st_size
        elif stat.S_ISDIR(st.st_mode) and depth < MAX_DEPTH:
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            try:
                n += tree_bytes(sub, depth + 1)
            finally:
                os.close(sub)
    return n


def check_owner(owner: dict[str, Any] | None, paths: Iterable[str | None]) -> None:
    """Refuse (`owner-mismatch`) a restore when the job's folders now belong to someone other than the user
    the checkpoint recorded (or root): the command would run as one user in another user's files."""
    if not owner or not isinstance(owner.get("uid"), int):
        raise CheckpointError(OWNER_MISMATCH, "the checkpoint does not record the job's owner (uid, gid, groups)")
    uid = owner["uid"]
    for p in paths:
        if not p:
            continue
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode) or st.st_uid not in (uid, 0):
            who = "a link" if stat.S_ISLNK(st.st_mode) else f"uid {st.st_uid}"
            raise CheckpointError(OWNER_MISMATCH, f"{p} now belongs to {who}; the checkpoint's job ran as uid {uid}")


MAX_FILES = 10_000


def job_files(pids: Iterable[int]) -> list[dict[str, Any]]:
    """The regular files a process tree has open or mapped, with their owners: CRIU re-opens each by path, as
    root, on restore — so a restore must first see that each path still leads to a file of the same owner."""
    seen: dict[str, dict[str, Any]] = {}

    def add(path: str, st: os.stat_result) -> None:
        if path.startswith("/") and not path.endswith(" (deleted)") and stat.S_ISREG(st.st_mode) \
                and path not in seen and len(seen) < MAX_FILES:
            seen[path] = {"path": path, "uid": st.st_uid}

    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        with contextlib.suppress(OSError):
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):
                    add(os.readlink(f"{fd_dir}/{fd}"), os.stat(f"{fd_dir}/{fd}"))  # the open file itself
        with contextlib.suppress(OSError):
            for ln in Path(f"/proc/{pid}/maps").read_text().splitlines():
                parts = ln.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    with contextlib.suppress(OSError):
                        add(parts[5], os.stat(f"/proc/{pid}/map_files/{parts[0]}"))
    return sorted(seen.values(), key=lambda f: f["path"])


def check_job_files(files: Iterable[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Refuse (`owner-mismatch`) a restore when a file the job had open is now a link, or now belongs to someone
    else (a user who swapped their log for a link to /etc/shadow would otherwise get it opened by root).
    Returns the (device, inode) of each file checked: a swap after this look, before CRIU opens the path, is
    caught by `check_restored_files` on what CRIU actually opened."""
    seen: dict[str, tuple[int, int]] = {}
    for f in files:
        try:
            st = os.lstat(f["path"])
        except FileNotFoundError:
            continue  # CRIU itself refuses a missing file
        except OSError as e:
            raise CheckpointError(OWNER_MISMATCH, f"{f['path']}: {e.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            raise CheckpointError(OWNER_MISMATCH, f"{f['path']}: the job had a file open here; it is now a link")
        if st.st_uid != f["uid"]:
            raise CheckpointError(OWNER_MISMATCH, f"{f['path']}: owned by uid {st.st_uid} now, by uid {f['uid']} "
                                  "when the job was checkpointed")
        seen[f["path"]] = (st.st_dev, st.st_ino)
    return seen


def _root_only_path(path: str, key: tuple[int, int]) -> bool:
    """`path` leads to the file `key` through folders only root may change (no link, no folder of a user or
    writable by others on the way): nobody but root could have put that file there (a library, /etc/hosts)."""
    if not path.startswith("/"):
        return False
    cur = "/"
    for name in [p for p in path.split("/") if p]:
        try:
            d = os.lstat(cur)
            st = os.lstat(os.path.join(cur, name))
        except OSError:
            return False
        if d.st_uid != 0 or d.st_mode & 0o022 or stat.S_ISLNK(st.st_mode):
            return False
        cur = os.path.join(cur, name)
    return (st.st_dev, st.st_ino) == key


def _opened(pid: int) -> Iterator[tuple[str, os.stat_result]]:
    """(path, stat of the very file) for each regular file `pid` has open or mapped, as the kernel holds it."""
    fd_dir = f"/proc/{pid}/fd"
    with contextlib.suppress(OSError):
        for fd in os.listdir(fd_dir):
            with contextlib.suppress(OSError):
                yield os.readlink(f"{fd_dir}/{fd}"), os.stat(f"{fd_dir}/{fd}")
    with contextlib.suppress(OSError):
        for ln in Path(f"/proc/{pid}/maps").read_text().splitlines():
            parts = ln.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/"):
                with contextlib.suppress(OSError):
                    yield parts[5], os.stat(f"/proc/{pid}/map_files/{parts[0]}")


def check_restored_files(pids: Iterable[int], checked: dict[str, tuple[int, int]], uid: int) -> None:
    """After CRIU restored a job (its tasks still stopped), refuse (`owner-mismatch`) when any file it opened
    for the job by path, as root, is not one it may hand the job: the file `check_job_files` looked at (same
    device and inode), a file of the job's own user (not root: a root job's output redirected to another root
    file is the attack too), a deleted file CRIU re-created from the images, or one that
    only root could have put at its path. `check_job_files` looks at each path an instant before CRIU opens it;
    a user who swapped the file or a folder above it for a link in that instant made CRIU open the link's
    target (root's file) — this looks at the opened file itself, so the swap is caught before the job runs."""
    keys = set(checked.values())
    for pid in pids:
        for path, st in _opened(pid):
            if not stat.S_ISREG(st.st_mode) or path.endswith(" (deleted)"):
                continue
            key = (st.st_dev, st.st_ino)
            if key in keys or (st.st_uid == uid and uid != 0) or _root_only_path(path, key):
                continue
            raise CheckpointError(OWNER_MISMATCH, f"{path}: CRIU opened this file (uid {st.st_uid}) for the job "
                                  f"of uid {uid}, not the file checked before the restore: a path was swapped "
                                  "for a link while CRIU opened it; the restored job was killed before it ran")


def private_dir(path: Path) -> Path:
    """A folder only we can write (made 0700 when missing). One in a shared /tmp that a user planted first — a
    link, someone else's folder, or one others may write into — is refused, since root writes logs there."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise CheckpointError(UNSAFE_PATH, "not a private folder of this user (a link, another owner, or "
                              "writable by others)", path=str(path))
    return path
