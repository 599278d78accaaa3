"""The two operations everything else calls: checkpoint a job into the store, restore one from it.

`restore_from_store` is the only door to a backend's `restore`: it verifies the signature and every file's
hash first, then the compatibility record against this host, and refuses (CheckpointError with a stable
reason) before any image is read by CRIU.

`checkpoint_to_store` never loses a job it stopped: everything that can be checked is checked before the
backend runs (workload id, key, free space for the images plus the manifest), and when the commit fails after a
dump that stopped the job, the job is restored in place from the images; only when that fails too are the images
kept (`<store>/.kept-<id>`, named in the error) — they are then the only copy of the job's state.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec

from ..core.model import Versions
from .compat import DEFAULT_FIELDS, CompatRule, field_names, host_versions, mismatches
from .manifest import Manifest
from .protocol import (
    CHECKPOINT_FAILED,
    INCOMPATIBLE,
    STORE_FULL,
    UNAVAILABLE,
    WRONG_WORKLOAD,
    CheckpointBackend,
    CheckpointError,
    CheckpointResult,
    RestoreResult,
)
from .registry import backend_for
from .store import CheckpointStore, GcResult, PendingCheckpoint

MANIFEST_RESERVE = 1 << 20  # room the manifest (and the rename's metadata) needs beside the images


def checkpoint_to_store(store: CheckpointStore, backend: CheckpointBackend, pid: int, workload_id: str, *,
                        leave_running: bool = False, precopy: bool = False, page_server: bool = False,
                        engine: str | None = None, model: str | None = None, parent: str | None = None,
                        keep: int | None = None, on_retain: Callable[[GcResult], None] | None = None,
                        **backend_kw: Any) -> tuple[Manifest, CheckpointResult]:
    """Checkpoint `pid` into a new signed store entry; apply retention (`keep` newest verified) for the workload,
    handing its result (what was removed, and why) to `on_retain`.

    Raises CheckpointError; when a stopped job could not be committed, `restored_pid` (restored in place) or
    `kept_images` (the folder that now holds its only copy) says where the job went."""
    # a dump that stops the job writes its intent first: a writer killed later leaves a recoverable checkpoint
    with store.create(workload_id, stops=None if leave_running else pid, backend=backend.name) as pending:
        _check_room(store, backend, pid)
        try:
            if page_server:
                from .criu import CriuBackend, stream_checkpoint

                if not isinstance(backend, CriuBackend):
                    raise CheckpointError(UNAVAILABLE, f"page-server streaming needs CRIU, not {backend.name}")
                res = stream_checkpoint(backend, pid, pending.dir, leave_running=leave_running, precopy=precopy,
                                        **backend_kw)
            else:
                res = backend.checkpoint(pid, pending.dir, leave_running=leave_running, precopy=precopy,
                                         **backend_kw)
        except CheckpointError as e:
            if e.stopped is None:
                raise  # nothing was stopped (CRIU resumes the job when its dump fails)
            pending.stopped(e.stopped.extra)
            raise _save_the_stopped_job(backend, pending, e.stopped, e) from None
        try:
            if not res.leave_running:
                pending.stopped(res.extra)  # durable before the slow part: hashing, syncing, signing
            gpu = getattr(backend, "gpu_versions", None)
            compat = host_versions(res.checkpointer or backend.version(), gpu=gpu() if callable(gpu) else None)
            compat = Versions(**{**_asdict(compat), "engine": engine, "model": model})
            info = {**res.extra, "frozen_s": res.frozen_s, "duration_s": res.duration_s,
                    "leave_running": res.leave_running, "notes": list(res.notes)}
            gpus = res.extra.get("gpus", {})
            manifest = pending.commit(backend=backend.name, mode=res.mode, compat=compat, parent=parent,
                                      gpus=gpus, info=info)
        except Exception as e:
            if res.leave_running:
                raise  # the job still runs: dropping the unfinished images loses nothing
            raise _save_the_stopped_job(backend, pending, res, e) from None
    if keep is not None:
        gc = store.retain(workload_id, keep, trusted=frozenset({manifest.id}))  # just hashed: not read again
        if on_retain is not None:
            on_retain(gc)
    return manifest, res


def _check_room(store: CheckpointStore, backend: CheckpointBackend, pid: int) -> None:
    """Refuse (`store-full`) before the backend runs when the store cannot hold the images plus the manifest."""
    estimate = getattr(backend, "estimate_bytes", None)
    need = (estimate(pid) if callable(estimate) else 0) + MANIFEST_RESERVE
    st = os.statvfs(store.root)
    free = st.f_bavail * st.f_frsize
    if free < need:
        raise CheckpointError(STORE_FULL, f"{free / 2**20:.1f} MiB free, about {need / 2**20:.1f} MiB needed for the "
                              "images and the manifest; nothing was stopped", path=str(store.root))


def _save_the_stopped_job(backend: CheckpointBackend, pending: PendingCheckpoint, res: CheckpointResult,
                          cause: Exception) -> CheckpointError:
    """The dump stopped the job and the commit failed: the images are its only state. Restore it in place from
    them (then they may go), else keep them and say where. Returns the error to raise."""
    if isinstance(cause, CheckpointError):
        reason, why = cause.reason, cause.detail
    elif isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
        reason, why = STORE_FULL, f"no space left for the manifest ({cause.strerror})"
    else:
        reason, why = CHECKPOINT_FAILED, f"commit failed: {cause}"
    try:
        rr = backend.restore(pending.dir, info=res.extra)
    except Exception as e:  # whatever failed, the images must survive
        kept = pending.preserve()
        err = CheckpointError(reason, f"{why}; the job was stopped and could not be restored in place ({e}); "
                              f"its images are kept at {kept} (restore them with the backend directly)",
                              path=str(kept))
        err.kept_images = str(kept)
        err.stopped = res  # its `extra` is what a restore from the kept images needs
        return err
    err = CheckpointError(reason, f"{why}; no checkpoint was stored and the job was restored in place as PID "
                          f"{rr.pid}", path=str(pending.store.root))
    err.restored_pid = rr.pid
    return err


def recover_interrupted(store: CheckpointStore, *, workload_id: str | None = None,
                        log: Any = None) -> list[dict[str, Any]]:
    """Bring back the jobs whose checkpoint stopped them and whose writer died before committing (the writer was
    killed while hashing, syncing or signing): run by every store command and by the job wrapper at its start.

    For each `.stopping-<id>` on this host whose writer is gone and that no process is still writing: if the
    job still runs (the dump never stopped it), the unfinished images are removed; otherwise the job is
    restored in place from them (then they go), and when that fails they become `.kept-<id>`, never removed,
    named in the result. Returns one record per checkpoint handled, with its `outcome`."""
    import socket

    from .registry import backend_for
    from .store import same_process

    done = []
    for row in store.interrupted():
        if row["state"] != "interrupted" or row["writer_alive"] or row.get("host") != socket.gethostname():
            continue
        if workload_id is not None and row.get("workload_id") != workload_id:
            continue
        path = Path(row["path"])
        if _busy(path):
            continue  # an orphaned criu still writing: its job is not lost yet
        if same_process(row.get("pid"), row.get("pid_start")):
            store.discard(path)
            done.append({**row, "outcome": "job still running; the unfinished images were removed"})
            continue
        try:
            rr = backend_for(str(row.get("backend") or "criu")).restore(path, info=row.get("info") or {})
        except Exception as e:  # whatever failed, the images must survive
            kept = store.keep_interrupted(path)
            done.append({**row, "outcome": f"the job could not be restored in place ({e}); its images are kept at "
                         f"{kept}"})
            continue
        store.discard(path)
        done.append({**row, "restored_pid": rr.pid, "outcome": f"restored in place as PID {rr.pid}"})
    for d in done:
        if log is not None:
            log(f"interrupted checkpoint {d['id']} of {d.get('workload_id')}: {d['outcome']}")
    return done


def _busy(path: Path) -> bool:
    """Does any process still name `path` on its command line (a `criu dump -D path` whose caller died)?"""
    needle = str(path).encode()
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if needle in (p / "cmdline").read_bytes():
                    return True
            except OSError:
                continue
    return False


def check_compat(manifest: Manifest, here: Versions, fields: Iterable[str] = DEFAULT_FIELDS,
                 rule: CompatRule | None = None) -> None:
    """The restore's compatibility gate: the planner's rule (`gpudefrag.core.compat`), on this host's facts."""
    diffs = mismatches(manifest.compat.to_versions(), here, fields, rule)
    if diffs:
        raise CheckpointError(INCOMPATIBLE, "; ".join(diffs), path=manifest.id, fields=field_names(diffs))


def check_belongs(manifest: Manifest, workload_id: str | None, uid: int | None) -> None:
    """Refuse (`wrong-workload`) a verified checkpoint that is not `workload_id`'s, or whose job ran as another
    user than `uid` (the signed record's owner); None skips that half."""
    if workload_id is not None and manifest.workload_id != workload_id:
        raise CheckpointError(WRONG_WORKLOAD, f"checkpoint {manifest.id} belongs to workload "
                              f"{manifest.workload_id!r}, not {workload_id!r}", path=manifest.id)
    if uid is not None:
        owner = manifest.info.get("owner")
        recorded = owner.get("uid") if isinstance(owner, dict) else None
        if recorded != uid:
            raise CheckpointError(WRONG_WORKLOAD, f"checkpoint {manifest.id} is of a job that ran as uid {recorded}, "
                                  f"not uid {uid}", path=manifest.id)


def restore_from_store(store: CheckpointStore, ckpt_id: str, backend: CheckpointBackend | None = None, *,
                       here: Versions | None = None, compat_fields: Iterable[str] | None = None,
                       rule: CompatRule | None = None, workload_id: str | None = None, uid: int | None = None,
                       **restore_kw: Any) -> tuple[Manifest, RestoreResult]:
    """Verify (signature, hashes), check compatibility, then restore. Nothing runs unless all three pass.

    compat_fields: the Versions fields that must agree (default: the backend's `compat_fields`, else
    compat.DEFAULT_FIELDS). rule: how they must agree — the rule the move was planned under (default: every
    field exact). workload_id / uid: the workload (and its user) this restore is for — a job wrapper's: a
    checkpoint of another workload, or of a process that ran as another user, is refused (`wrong-workload`), so
    a ticket naming someone else's checkpoint can never bring their process up inside this job."""
    manifest = store.verify(ckpt_id).raise_for_status()
    check_belongs(manifest, workload_id, uid)
    be = backend or backend_for(manifest.backend)
    if here is None:
        gpu = getattr(be, "gpu_versions", None)
        here = host_versions(be.version(), gpu=gpu() if callable(gpu) else None)
    fields = compat_fields if compat_fields is not None else getattr(be, "compat_fields", DEFAULT_FIELDS)
    check_compat(manifest, here, fields, rule)
    res = be.restore(store.path(ckpt_id), info=manifest.info, **restore_kw)
    return manifest, res


def resolve(store_root: Path | None, ckpt: str) -> tuple[Path, str]:
    """`CKPT` on the command line: an id in the store, or a path to a checkpoint folder (its parent is the
    store root)."""
    p = Path(ckpt)
    if "/" in ckpt or (store_root is None and p.exists()):
        p = p.resolve()
        return p.parent, p.name
    if store_root is None:
        from .store import default_store_root

        store_root = default_store_root()
    return store_root, ckpt


def _asdict(v: Versions) -> dict[str, Any]:

    return msgspec.structs.asdict(v)
