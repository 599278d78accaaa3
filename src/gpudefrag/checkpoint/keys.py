"""The store's signing key: a file only root can read, created (0600) only by `checkpoint` or `keys init`.

Restoring a CRIU image runs whatever code and memory the image holds, as root. The HMAC key is what separates
"images this controller wrote" from "images someone put there", so a key that others can read is refused
rather than used. A missing key is an error everywhere else: a reader that quietly created a new key would then
report every checkpoint as `wrong-key` and hide the real problem (a wrong path, an unmounted /etc).
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from pathlib import Path

from .protocol import INSECURE_KEY, MISSING_KEY, CheckpointError

DEFAULT_KEY_PATH = Path("/etc/gpudefrag/checkpoint.key")
KEY_BYTES = 32


def key_id(key: bytes) -> str:
    """A short public fingerprint of the key, stored in manifests so that 'signed with another key' is told
    apart from 'tampered' (the signature still decides)."""
    return hashlib.sha256(b"gpudefrag-key-id\0" + key).hexdigest()[:16]


def load_key(path: Path | str = DEFAULT_KEY_PATH, *, create: bool = False, group_read_ok: bool = False) -> bytes:
    """Read the key (hex text). Missing: CheckpointError(`missing-key`), or created 0600 when `create` is set
    (only the writers: `checkpoint` and `keys init`).

    Refused (reason `insecure-key`) when the file is not a regular file, is readable or writable by group or
    others, or is owned by someone other than root (or the current user, for unprivileged test runs).
    `group_read_ok`: also accept group read (never write) when the group is one this process is in — a
    Kubernetes Secret volume under the pod's fsGroup is 0440 root:<fsGroup>, a group only that pod's processes
    hold (the in-cluster controller's key).
    """
    p = Path(path)
    try:
        # O_NONBLOCK: a FIFO planted as the key must not hang us before fstat refuses it
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        if not create:
            raise CheckpointError(MISSING_KEY, "key file does not exist (create it with `gpudefrag keys init "
                                  f"--key {p}`; a checkpoint creates it too)", path=str(p)) from None
        return _create(p)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CheckpointError(INSECURE_KEY, "key file is a symbolic link", path=str(p)) from None
        raise CheckpointError(INSECURE_KEY, f"cannot open key file: {e.strerror}", path=str(p)) from None
    try:
        # before fdopen, which refuses a folder with its own, nameless error
        _check_mode(p, os.fstat(fd), group_read_ok)
        raw = os.read(fd, 4096)
    except OSError as e:
        raise CheckpointError(INSECURE_KEY, f"cannot read key file: {e.strerror}", path=str(p)) from None
    finally:
        os.close(fd)
    return _parse(p, raw)


def _check_mode(p: Path, st: os.stat_result, group_read_ok: bool = False) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(INSECURE_KEY, "key is not a regular file", path=str(p))
    mine = st.st_gid == os.getegid() or st.st_gid in os.getgroups()
    if st.st_mode & (0o037 if group_read_ok and mine else 0o077):
        raise CheckpointError(
            INSECURE_KEY, f"key file mode is {stat.S_IMODE(st.st_mode):04o}; it must be 0600 (only its owner "
            f"may read it): chmod 600 {p}", path=str(p))
    if st.st_uid not in (0, os.geteuid()):
        raise CheckpointError(INSECURE_KEY, f"key file is owned by uid {st.st_uid}, not root", path=str(p))


def _parse(p: Path, raw: bytes) -> bytes:
    text = raw.strip()
    try:
        key = bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise CheckpointError(INSECURE_KEY, "key file must hold hex text", path=str(p)) from None
    if len(key) < 16:
        raise CheckpointError(INSECURE_KEY, f"key is {len(key)} bytes; at least 16 are needed", path=str(p))
    return key


def init_key(path: Path | str = DEFAULT_KEY_PATH) -> tuple[bytes, bool]:
    """`keys init`: (the key, whether it was created now). An existing key is checked and kept, never replaced:
    the checkpoints signed with it need it."""
    p = Path(path)
    try:
        return load_key(p), False
    except CheckpointError as e:
        if e.reason != MISSING_KEY:
            raise
    return _create(p), True


def _create(p: Path) -> bytes:
    key = secrets.token_bytes(KEY_BYTES)
    try:
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # another process created it first: use theirs
        return load_key(p)
    except OSError as e:
        raise CheckpointError(INSECURE_KEY, f"cannot create key file: {e.strerror}", path=str(p)) from None
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # umask could have removed bits, never added: make it exact
        f.write(key.hex().encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())
    return key
