"""The signed checkpoint store: one folder per checkpoint under a root (local disk or a shared mount).

    <root>/<ckpt-id>/manifest.json      signed: files + sizes + SHA-256, compatibility record, parent, times
    <root>/<ckpt-id>/<image files>      whatever the backend wrote (CRIU images, a state_dict, ...)
    <root>/.tmp-<ckpt-id>/              a checkpoint being written; renamed into place on commit
    <root>/.stopping-<ckpt-id>/         a checkpoint that stops its job (no --leave-running) being written,
    <root>/.stopping-<ckpt-id>.json     with its intent record (job PID, writer, backend facts): if the writer
                                        dies, this is the job's only state; never removed by gc, shown by
                                        `checkpoints list`, and recovered (`operations.recover_interrupted`)
    <root>/.kept-<ckpt-id>/             images of a stopped job whose commit failed and that could not be
    <root>/.kept-<ckpt-id>.json         restored in place: the only copy of its state, never removed by gc

Folders are 0700 and files 0600: images hold the job's memory (secrets included). A checkpoint appears only
complete (temp folder + rename) and `verify` re-reads every byte before a restore is allowed to trust it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..core.model import Versions
from ..errors import InputError
from ..fileio import parse_json, read_input
from .keys import DEFAULT_KEY_PATH, key_id, load_key
from .manifest import (
    MANIFEST_NAME,
    CompatRecord,
    FileEntry,
    LinkEntry,
    Manifest,
    check_workload_id,
    link_stays_inside,
    parse_manifest,
)
from .protocol import (
    BAD_MANIFEST,
    BAD_SIGNATURE,
    HASH_MISMATCH,
    MISSING_FILE,
    MISSING_MANIFEST,
    NOT_FOUND,
    OK,
    SIZE_MISMATCH,
    UNEXPECTED_FILE,
    UNSAFE_PATH,
    WRONG_KEY,
    CheckpointError,
)

DEFAULT_STORE = Path("/var/lib/gpudefrag/checkpoints")
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
KEPT_PREFIX = ".kept-"
STOPPING_PREFIX = ".stopping-"
INTENT_SUFFIX = ".json"
_CHUNK = 4 << 20
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


def default_store_root() -> Path:
    return Path(os.environ.get("GPUDEFRAG_STORE", str(DEFAULT_STORE)))


def default_key_path() -> Path:
    return Path(os.environ.get("GPUDEFRAG_KEY", str(DEFAULT_KEY_PATH)))


def sha256_file(path: Path) -> tuple[int, str]:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            n += len(chunk)
    return n, h.hexdigest()


def _slug(workload_id: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", workload_id).strip("._-") or "job"
    return s[:80]


@dataclass(frozen=True)
class VerifyResult:
    ckpt_id: str
    path: str
    ok: bool
    reason: str  # a stable code from protocol.py; "ok" when ok
    detail: str = ""
    manifest: Manifest | None = None
    bytes_checked: int = 0

    def raise_for_status(self) -> Manifest:
        if not self.ok or self.manifest is None:
            raise CheckpointError(self.reason, self.detail, path=self.path)
        return self.manifest

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.ckpt_id, "path": self.path, "ok": self.ok, "reason": self.reason,
                "detail": self.detail, "bytes_checked": self.bytes_checked,
                "workload_id": self.manifest.workload_id if self.manifest else None}


@dataclass
class PendingCheckpoint:
    """A checkpoint being written: a private temp folder. Use as a context manager so that a failed backend
    leaves nothing behind; `commit` hashes, signs and renames it into place."""

    store: CheckpointStore
    ckpt_id: str
    workload_id: str
    dir: Path
    committed: Manifest | None = None
    preserved: Path | None = None  # set by `preserve`: the images outlive a failed commit

    def __enter__(self) -> PendingCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.committed is None and self.preserved is None:
            self.store.abort(self)

    def preserve(self) -> Path:
        """Keep the images of a stopped job whose commit failed: rename to `.kept-<id>` (gc leaves it alone)."""
        kept = self.store.root / f"{KEPT_PREFIX}{self.ckpt_id}"
        try:
            os.rename(self.dir, kept)
        except OSError:
            kept = self.dir  # still the only copy: leave it where it is, under its temp name
        else:
            with contextlib.suppress(OSError):
                os.rename(_intent_of(self.dir), _intent_of(kept))
        self.preserved = kept
        return kept

    def stopped(self, info: dict[str, Any]) -> None:
        """The backend stopped the job: record what a restore in place from these images needs, durably, before
        the slow part (hashing, syncing, signing) begins."""
        if self.dir.name.startswith(STOPPING_PREFIX):
            path = _intent_of(self.dir)
            doc = _read_intent(path) or {}
            with contextlib.suppress(OSError):  # a full disk: the record from before the dump still names the job
                _write_intent(path, {**doc, "stopped": True, "info": _jsonable(info)})

    def commit(self, **kw: Any) -> Manifest:
        self.committed = self.store.commit(self, **kw)
        return self.committed


@dataclass(frozen=True)
class GcResult:
    removed: tuple[str, ...]
    kept: tuple[str, ...]
    stale_temp_removed: tuple[str, ...] = ()
    unreadable: tuple[str, ...] = ()
    freed_bytes: int = 0
    unverified: tuple[str, ...] = ()  # checked and failed (forged, unsigned, hash mismatch): never counted as kept
    why: tuple[tuple[str, str], ...] = ()  # (id, why it was removed), one per removed checkpoint
    keep: int = 0

    def reasons(self) -> dict[str, str]:
        """Why each removed checkpoint was removed (retention must never delete without a word)."""
        why = dict(self.why)
        return {cid: why.get(cid) or f"older than the newest {max(self.keep, 1)} verified" for cid in self.removed}

    def explain(self) -> list[str]:
        """One line per removed checkpoint: its id and why."""
        return [f"{cid}: {why}" for cid, why in self.reasons().items()]

    def as_dict(self) -> dict[str, Any]:
        return {"removed": list(self.removed), "kept": list(self.kept),
                "stale_temp_removed": list(self.stale_temp_removed), "unreadable": list(self.unreadable),
                "unverified": list(self.unverified), "freed_bytes": self.freed_bytes,
                "removed_why": self.reasons()}


@dataclass
class CheckpointStore:
    root: Path
    key_path: Path = field(default_factory=default_key_path)
    durable: bool = True  # fsync images and manifest before the rename (off only for scratch benchmarks)
    _key: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.key_path = Path(self.key_path)

    # -- key and layout -------------------------------------------------------------------------------
    @property
    def key(self) -> bytes:
        if self._key is None:
            self._key = load_key(self.key_path)  # missing: an error (only a checkpoint creates the key)
        return self._key

    def _ensure_root(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.check_root()
        os.chmod(self.root, 0o700)

    def check_root(self) -> bool:
        """Refuse (`unsafe-path`) a store root that is a link, not a folder, owned by anyone but this service's
        user, or writable by group or others: whoever can write the root can rename or delete a checkpoint from
        under root, or swap one folder for another. False when the root does not exist yet."""
        try:
            st = os.lstat(self.root)
        except FileNotFoundError:
            return False
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise CheckpointError(UNSAFE_PATH, "the store root is a link or not a folder", path=str(self.root))
        if st.st_uid != os.geteuid():
            raise CheckpointError(UNSAFE_PATH, f"the store root is owned by uid {st.st_uid}, not by uid "
                                  f"{os.geteuid()} (the service's user): chown it or choose another store",
                                  path=str(self.root))
        if st.st_mode & 0o022:
            raise CheckpointError(UNSAFE_PATH, f"the store root is writable by others (mode "
                                  f"{stat.S_IMODE(st.st_mode):04o}): chmod 700 it", path=str(self.root))
        return True

    def path(self, ckpt_id: str) -> Path:
        if not _ID_RE.match(ckpt_id) or ckpt_id.startswith((TMP_PREFIX, TRASH_PREFIX)):
            raise CheckpointError(NOT_FOUND, f"{ckpt_id!r} is not a checkpoint id", path=str(self.root))
        return self.root / ckpt_id

    # -- writing --------------------------------------------------------------------------------------
    def create(self, workload_id: str, *, stops: int | None = None, backend: str | None = None) -> PendingCheckpoint:
        """A private folder for a new checkpoint. `stops`: the PID of a job this checkpoint will stop (no
        --leave-running): the folder is then `.stopping-<id>` with an intent record beside it, written durably
        before the backend runs, so that a writer killed after the job was stopped leaves a recoverable, listed
        checkpoint that gc never removes, instead of an anonymous temp folder."""
        check_workload_id(workload_id)  # before the backend freezes anything: a refused id must not stop a job
        if self._key is None:
            self._key = load_key(self.key_path, create=True)  # fail on an insecure key before the freeze too
        self._ensure_root()
        now = datetime.now(UTC)
        ckpt_id = f"{_slug(workload_id)}-{now:%Y%m%dT%H%M%S%f}Z-{secrets.token_hex(3)}"
        tmp = self.root / f"{STOPPING_PREFIX if stops is not None else TMP_PREFIX}{ckpt_id}"
        tmp.mkdir(mode=0o700)
        if stops is not None:
            _write_intent(_intent_of(tmp), {
                "id": ckpt_id, "workload_id": workload_id, "backend": backend, "pid": stops,
                "pid_start": _start_time(stops), "writer": os.getpid(), "writer_start": _start_time(os.getpid()),
                "host": socket.gethostname(), "at": time.time(), "stopped": False, "info": {}})
            _fsync_dir(self.root)
        return PendingCheckpoint(self, ckpt_id, workload_id, tmp)

    def abort(self, pending: PendingCheckpoint) -> None:
        shutil.rmtree(pending.dir, ignore_errors=True)
        _intent_of(pending.dir).unlink(missing_ok=True)

    def interrupted(self) -> list[dict[str, Any]]:
        """Checkpoints that stopped their job and were never committed: `.stopping-<id>` (a writer at work, or
        one that died) and `.kept-<id>` (the commit failed and the job could not be restored in place). Each is
        a job's only state; gc never removes them. Oldest first, with their intent records."""
        if not self.check_root():
            return []
        out = []
        for e in sorted(os.scandir(self.root), key=lambda e: e.name):
            for prefix, state in ((STOPPING_PREFIX, "interrupted"), (KEPT_PREFIX, "kept")):
                if e.name.startswith(prefix) and e.is_dir(follow_symlinks=False):
                    doc = _read_intent(_intent_of(Path(e.path))) or {}
                    out.append({**doc, "id": e.name[len(prefix):], "state": state, "path": e.path,
                                "writer_alive": state == "interrupted" and same_process(doc.get("writer"),
                                                                                       doc.get("writer_start"))})
        out.sort(key=lambda r: r.get("at") or 0.0)
        return out

    def discard(self, path: Path) -> None:
        """Remove an interrupted checkpoint's folder and intent record once its job runs again (resumed or
        restored in place from it): they are no longer anybody's only copy."""
        shutil.rmtree(path, ignore_errors=True)
        _intent_of(path).unlink(missing_ok=True)

    def keep_interrupted(self, path: Path) -> Path:
        """`.stopping-<id>` → `.kept-<id>` (with its record): a job that could not be restored from it."""
        kept = self.root / f"{KEPT_PREFIX}{path.name[len(STOPPING_PREFIX):]}"
        os.rename(path, kept)
        with contextlib.suppress(OSError):
            os.rename(_intent_of(path), _intent_of(kept))
        return kept

    def commit(self, pending: PendingCheckpoint, *, backend: str, mode: str, compat: Versions,
               parent: str | None = None, gpus: dict[str, str] | None = None,
               info: dict[str, Any] | None = None) -> Manifest:
        """Hash every file the backend wrote, sign the manifest, and rename the folder into place."""
        files: list[tuple[str, Path]] = []
        links: list[LinkEntry] = []
        for rel, p in _walk(pending.dir):
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(p)
                if not link_stays_inside(rel, target):
                    raise CheckpointError(UNSAFE_PATH, f"{rel}: link to {target!r} leaves the checkpoint",
                                          path=str(pending.dir))
                links.append(LinkEntry(path=rel, target=target))
                continue
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointError(UNSAFE_PATH, f"{rel}: backend left a non-regular file",
                                      path=str(pending.dir))
            os.chmod(p, 0o600)
            if self.durable:
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
            files.append((rel, p))
        entries = [FileEntry(path=rel, size=size, sha256=digest)
                   for (rel, _), (size, digest) in zip(files, _hash_all([p for _, p in files]), strict=True)]
        for d in [pending.dir, *(x for x in pending.dir.rglob("*") if x.is_dir() and not x.is_symlink())]:
            os.chmod(d, 0o700)
        now = time.time()
        m = Manifest(
            id=pending.ckpt_id, workload_id=pending.workload_id, backend=backend, mode=mode,
            created_at=datetime.fromtimestamp(now, UTC).isoformat().replace("+00:00", "Z"),
            created_unix=now, parent=parent, files=tuple(entries), links=tuple(links),
            compat=CompatRecord.of(compat),
            gpus=dict(gpus or {}), info=_jsonable(info or {}), key_id=key_id(self.key),
        ).sign(self.key)
        mpath = pending.dir / MANIFEST_NAME
        fd = os.open(mpath, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(m.to_json())
            f.flush()
            if self.durable:
                os.fsync(f.fileno())
        final = self.root / pending.ckpt_id
        os.rename(pending.dir, final)
        _intent_of(pending.dir).unlink(missing_ok=True)  # committed: the checkpoint itself is the record now
        if self.durable:
            _fsync_dir(self.root)
        return m

    # -- reading --------------------------------------------------------------------------------------
    def read_manifest(self, ckpt_id: str) -> Manifest:
        """Parse (not verify) a manifest: for listing. Never restore from this."""
        d = self.path(ckpt_id)
        mp = d / MANIFEST_NAME
        if not d.is_dir() or d.is_symlink():
            raise CheckpointError(NOT_FOUND, "no such checkpoint", path=str(d))
        try:  # the one guarded reader: no link, FIFO or device (a planted manifest must neither redirect nor
            # hang the reader), at most the manifest size limit
            raw = read_input(mp, "manifest", follow_links=False)
        except InputError as e:
            code = {"missing": MISSING_MANIFEST, "link": UNSAFE_PATH, "not-regular": UNSAFE_PATH}.get(e.problem,
                                                                                                  BAD_MANIFEST)
            raise CheckpointError(code, e.message, path=str(mp)) from None
        return parse_manifest(raw, str(mp))

    def verify(self, ckpt_id: str) -> VerifyResult:
        """Signature first, then every file's size and SHA-256, and nothing in the folder that is not listed.

        The order matters: until the signature holds, the file list itself is attacker-controlled.
        """
        try:
            d = self.path(ckpt_id)
            self.check_root()
        except CheckpointError as e:
            return VerifyResult(ckpt_id, str(self.root), False, e.reason, e.detail)
        try:
            m = self.read_manifest(ckpt_id)
        except CheckpointError as e:
            return VerifyResult(ckpt_id, str(d), False, e.reason, e.detail)

        def bad(reason: str, detail: str, n: int = 0) -> VerifyResult:
            return VerifyResult(ckpt_id, str(d), False, reason, detail, None, n)

        try:
            key = self.key
        except CheckpointError as e:  # missing or insecure key: nothing can verify
            return bad(e.reason, f"{e.path}: {e.detail}")
        if m.key_id != key_id(key):
            return bad(WRONG_KEY, f"signed with key {m.key_id}, this store's key is {key_id(self.key)}")
        if not m.signature_ok(self.key):
            return bad(BAD_SIGNATURE, "manifest signature does not match its contents")
        if m.id != ckpt_id:
            return bad(BAD_MANIFEST, f"id: manifest is for {m.id!r}, not this folder")
        listed = {f.path: f for f in m.files}
        links = {ln.path: ln.target for ln in m.links}
        present: dict[str, Path] = {}
        for rel, p in _walk(d):
            if rel == MANIFEST_NAME:
                continue
            mode = p.lstat().st_mode
            if stat.S_ISLNK(mode) and rel in links:
                if os.readlink(p) != links.pop(rel):
                    return bad(UNSAFE_PATH, f"{rel}: link target differs from the manifest")
                continue
            if not stat.S_ISREG(mode):
                return bad(UNSAFE_PATH, f"{rel}: not a regular file (link or device)")
            if rel not in listed:
                return bad(UNEXPECTED_FILE, f"{rel}: present but not in the manifest")
            present[rel] = p
        if links:
            return bad(MISSING_FILE, f"{sorted(links)[0]}: link listed in the manifest but missing")
        for f in m.files:  # the cheap checks first
            p = present.get(f.path)
            if p is None:
                return bad(MISSING_FILE, f"{f.path}: listed in the manifest but missing")
            size = p.stat().st_size
            if size != f.size:
                return bad(SIZE_MISMATCH, f"{f.path}: {size} bytes, manifest says {f.size}")
        # one file per thread (hashlib releases the GIL): a process tree has one pages file per process
        digests = _hash_all([present[f.path] for f in m.files])
        checked = 0
        for f, (size, digest) in zip(m.files, digests, strict=True):
            checked += size
            if digest != f.sha256:
                return bad(HASH_MISMATCH, f"{f.path}: SHA-256 differs from the manifest", checked)
        return VerifyResult(ckpt_id, str(d), True, OK, "", m, checked)

    def ids(self) -> list[str]:
        if not self.check_root():
            return []
        return sorted(e.name for e in os.scandir(self.root)
                      if e.is_dir(follow_symlinks=False) and not e.name.startswith("."))

    def list(self, workload_id: str | None = None) -> list[dict[str, Any]]:
        """Every checkpoint, newest first, from its manifest (signature checked, file hashes not)."""
        kid = key_id(self.key)  # an insecure key is an error even for an empty store
        out = []
        for cid in self.ids():
            try:
                m = self.read_manifest(cid)
            except (CheckpointError, OSError) as e:  # one bad entry is reported; the rest are still listed
                out.append({"id": cid, "workload_id": None, "created_at": None, "created_unix": 0.0,
                            "bytes": None, "backend": None, "mode": None, "parent": None,
                            "signed": False, "error": getattr(e, "reason", BAD_MANIFEST)})
                continue
            if workload_id is not None and m.workload_id != workload_id:
                continue
            signed = m.key_id == kid and m.signature_ok(self.key)
            out.append({"id": cid, "workload_id": m.workload_id, "created_at": m.created_at,
                        "created_unix": m.created_unix, "bytes": m.total_bytes, "backend": m.backend,
                        "mode": m.mode, "parent": m.parent, "signed": signed, "error": None})
        out.sort(key=lambda r: r["created_unix"], reverse=True)
        return out

    def latest(self, workload_id: str, *, verified: bool = True) -> Manifest | None:
        """The newest checkpoint of a workload that verifies (older ones are tried when a newer one fails)."""
        for row in self.list(workload_id):
            if not row["signed"]:
                continue
            if not verified:
                return self.read_manifest(row["id"])
            v = self.verify(row["id"])
            if v.ok:
                return v.manifest
        return None

    # -- retention ------------------------------------------------------------------------------------
    def gc(self, keep: int, *, workload_id: str | None = None, stale_temp_s: float = 3600.0,
           trusted: frozenset[str] = frozenset()) -> GcResult:
        """Keep the newest `keep` checkpoints per workload that VERIFY (signature and every hash), and every
        parent they need; drop the rest and temp folders older than `stale_temp_s` (a writer that died).

        Only verified checkpoints count: a forged, unsigned or corrupted newer one never pushes out a good one,
        and a workload's newest verified checkpoint is kept even with `keep=0`. A workload with no verified
        checkpoint at all (e.g. gc run with the wrong key) loses nothing. Unreadable folders are reported, kept.
        Verifying reads every byte of the checkpoints it keeps; `trusted` names ids this process has just
        committed (hashed a moment ago), which are not read again."""
        if keep < 0:
            raise ValueError("keep must be >= 0")
        rows = self.list(workload_id)
        by_wl: dict[str, list[dict[str, Any]]] = {}
        unreadable = []
        for r in rows:
            if r["error"]:
                unreadable.append(r["id"])
            else:
                by_wl.setdefault(r["workload_id"], []).append(r)
        keep_ids: set[str] = set()
        unverified: list[str] = []
        why: dict[str, str] = {}
        for wl, wl_rows in list(by_wl.items()):
            good = []
            for r in wl_rows:  # newest first; verify until enough good ones are found
                if len(good) >= max(keep, 1):
                    break
                if not r["signed"]:
                    unverified.append(r["id"])
                    why[r["id"]] = "failed verification (bad-signature: not signed by this store's key)"
                    continue
                v = None if r["id"] in trusted else self.verify(r["id"])
                if v is None or v.ok:
                    good.append(r["id"])
                else:
                    unverified.append(r["id"])
                    why[r["id"]] = f"failed verification ({v.reason}: {v.detail})"
            if not good:
                del by_wl[wl]  # nothing verifies: delete nothing of this workload
                continue
            keep_ids.update(good)
        parents = {r["id"]: r["parent"] for r in rows if not r["error"]}
        for cid in list(keep_ids):
            p = parents.get(cid)
            while p and p not in keep_ids and p in parents:
                keep_ids.add(p)
                p = parents.get(p)
        removed, freed = [], 0
        for wl_rows in by_wl.values():
            for r in wl_rows:
                if r["id"] not in keep_ids:
                    freed += self._remove(self.root / r["id"])
                    removed.append(r["id"])
        stale = []
        if self.root.is_dir():
            now = time.time()
            for e in os.scandir(self.root):
                if e.name.startswith((TMP_PREFIX, TRASH_PREFIX)) and e.is_dir(follow_symlinks=False) \
                        and now - e.stat(follow_symlinks=False).st_mtime > stale_temp_s:
                    freed += self._remove(Path(e.path))
                    stale.append(e.name)
        kept = [r["id"] for r in rows if r["id"] in keep_ids]
        return GcResult(tuple(removed), tuple(kept), tuple(stale), tuple(unreadable), freed, tuple(unverified),
                        tuple((cid, why[cid]) for cid in removed if cid in why), keep)

    def retain(self, workload_id: str, keep: int, *, trusted: frozenset[str] = frozenset()) -> GcResult:
        return self.gc(keep, workload_id=workload_id, stale_temp_s=float("inf"), trusted=trusted)

    def _remove(self, d: Path) -> int:
        """Rename out of sight first, so a reader never sees a half-deleted checkpoint."""
        size = sum(p.lstat().st_size for _, p in _walk(d)) if d.is_dir() else 0
        trash = d if d.name.startswith(TRASH_PREFIX) else self.root / f"{TRASH_PREFIX}{d.name.lstrip('.')}"
        with contextlib.suppress(FileNotFoundError):
            if trash != d:
                os.rename(d, trash)
            shutil.rmtree(trash, ignore_errors=True)
        return size


def _hash_all(paths: list[Path]) -> list[tuple[int, str]]:
    """(size, SHA-256) of each file, big ones in parallel threads."""
    if len(paths) < 2:
        return [sha256_file(p) for p in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(len(paths), os.cpu_count() or 1)) as pool:
        return list(pool.map(sha256_file, paths))


def _walk(d: Path) -> Iterator[tuple[str, Path]]:
    """Every non-directory entry below d (links included, not followed), as (posix relative path, path)."""
    for dirpath, dirnames, filenames in os.walk(d, followlinks=False):
        base = Path(dirpath)
        for name in sorted(filenames) + sorted(n for n in dirnames if (base / n).is_symlink()):
            p = base / name
            yield p.relative_to(d).as_posix(), p


def _intent_of(d: Path) -> Path:
    return d.with_name(d.name + INTENT_SUFFIX)


def _write_intent(path: Path, doc: dict[str, Any]) -> None:
    """Durably, atomically, root-only, without following a link (the store root is ours alone)."""
    tmp = path.with_name(path.name + ".new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(doc, sort_keys=True))
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read_intent(path: Path) -> dict[str, Any] | None:
    try:
        doc = parse_json(read_input(path, "manifest", follow_links=False), str(path))
    except InputError:
        return None
    return doc if isinstance(doc, dict) else None


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (with its PID: which process, PID reuse told apart)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def same_process(pid: Any, start: Any) -> bool:
    """Is `pid` still the process that had `start` time, and not a zombie?"""
    if not isinstance(pid, int):
        return False
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] not in ("Z", "X") and (start is None or int(fields[19]) == start)


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, str | int | float | bool) or x is None:
        return x
    return str(x)
