"""Checkpoint commands: `checkpoint --pid`, `restore CKPT`, `checkpoints list|verify|gc`, `keys init`.

A refused or failed operation prints one line `error: <where>: <reason-code>: <detail>` (or, with --json, an
object with `ok: false` and `reason`) and exits 2; a restore that is refused never starts the job.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from ..checkpoint.protocol import CheckpointError
from ..checkpoint.store import CheckpointStore, default_key_path, default_store_root
from .common import JsonOpt, KeyOpt, StoreOpt, console, emit_json, err_console, fail

checkpoints_app = typer.Typer(help="List, verify and garbage-collect stored checkpoints.", no_args_is_help=True)

keys_app = typer.Typer(help="The store's signing key.", no_args_is_help=True)



def register(app: typer.Typer) -> None:
    app.command("checkpoint")(checkpoint)
    app.command("restore")(restore)
    app.add_typer(checkpoints_app, name="checkpoints")
    app.add_typer(keys_app, name="keys")


def _store(store: Path | None, key: Path | None) -> CheckpointStore:
    return CheckpointStore(store or default_store_root(), key or default_key_path())


def _recover(st: CheckpointStore) -> None:
    """Every store command first brings back jobs whose stopping checkpoint lost its writer (said on stderr)."""
    from ..checkpoint.operations import recover_interrupted

    recover_interrupted(st, log=lambda msg: err_console.print(f"[yellow]recovered:[/] {escape(msg)}",
                                                              soft_wrap=True))


def _interrupted_rows(st: CheckpointStore) -> list[dict[str, object]]:
    """`checkpoints list` rows for checkpoints that stopped their job and were never committed."""
    out: list[dict[str, object]] = []
    for r in st.interrupted():
        why = ("interrupted: the job was stopped and its writer is still at work" if r["writer_alive"] else
               "interrupted: the job was stopped and the writer died; the next command restores it" if
               r["state"] == "interrupted" else "kept: the job's only state (restore it with the backend)")
        out.append({"id": r["id"], "workload_id": r.get("workload_id"), "created_at": None,
                    "created_unix": r.get("at") or 0.0, "bytes": None, "backend": r.get("backend"), "mode": None,
                    "parent": None, "signed": False, "error": why, "path": r["path"], "pid": r.get("pid")})
    return out


@contextmanager
def _refusals(json_out: bool) -> Iterator[None]:
    try:
        yield
    except CheckpointError as e:
        if json_out:
            emit_json(e.as_dict())
            raise typer.Exit(2) from None
        raise fail(str(e)) from None
    except OSError as e:  # a store folder that cannot be made or read: one line, never a traceback
        if json_out:
            emit_json({"ok": False, "reason": "os-error", "detail": e.strerror, "path": e.filename, "fields": []})
            raise typer.Exit(2) from None
        raise fail(f"{e.filename or 'store'}: {e.strerror}") from None


def checkpoint(
    pid: int = typer.Option(..., "--pid", help="Host PID of the job (the root of its process tree)"),
    workload: str = typer.Option(None, "--workload", help="Workload id for retention (default: pid-PID)"),
    leave_running: bool = typer.Option(False, "--leave-running", help="Heartbeat: the job keeps running"),
    precopy: bool = typer.Option(False, "--precopy", help="Iterative pre-copy where the kernel tracks dirty "
                                 "pages; otherwise a plain dump (the output says which)"),
    page_server: bool = typer.Option(False, "--page-server", help="Stream pages through criu page-server"),
    backend: str = typer.Option("criu", "--backend", help="criu | cuda | app"),
    keep: int = typer.Option(None, "--keep", help="Keep only the newest N checkpoints of this workload"),
    engine: str = typer.Option(None, "--engine", help="Compatibility record: engine and version"),
    model: str = typer.Option(None, "--model", help="Compatibility record: model name and version"),
    store: Path = StoreOpt,
    key: Path = KeyOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Checkpoint a running job into the signed store."""
    from ..checkpoint.operations import checkpoint_to_store
    from ..checkpoint.registry import backend_for

    with _refusals(json_out):
        st = _store(store, key)
        if st.check_root():
            _recover(st)
        be = backend_for(backend)
        check = getattr(be, "check", None)
        if callable(check):
            check()
        m, res = checkpoint_to_store(st, be, pid, workload or f"pid-{pid}",
                                     leave_running=leave_running, precopy=precopy, page_server=page_server,
                                     keep=keep, engine=engine, model=model)
    doc = {"ok": True, "id": m.id, "workload_id": m.workload_id, "backend": m.backend, "mode": res.mode,
           "bytes": m.total_bytes, "files": len(m.files), "duration_s": round(res.duration_s, 4),
           "frozen_s": res.frozen_s, "leave_running": res.leave_running, "notes": list(res.notes)}
    if json_out:
        emit_json(doc)
        return
    console.print(f"[green]checkpoint[/] {escape(m.id)}: {m.total_bytes / 2**20:.1f} MiB in {len(m.files)} files, "
                  f"{res.duration_s:.2f} s, frozen {res.frozen_s or 0:.3f} s, path: {escape(res.mode)}")
    for n in res.notes:
        console.print(f"  note: {escape(n)}")


def restore(
    ckpt: str = typer.Argument(..., help="Checkpoint id in the store, or a path to a checkpoint folder"),
    wait: bool = typer.Option(False, "--wait", help="Stay in the foreground until the job exits; exit with "
                              "its exit code (a job step's restore)"),
    netns: str = typer.Option(None, "--netns", help="Restore into this network namespace (name or path)"),
    lazy: bool = typer.Option(False, "--lazy", help="Lazy restore: run before all memory pages are in"),
    store: Path = StoreOpt,
    key: Path = KeyOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Verify (signature, every file's SHA-256), check compatibility, then restore. Refusals exit 2."""
    from ..checkpoint.operations import resolve, restore_from_store

    root, cid = resolve(store, ckpt)
    with _refusals(json_out):
        st = _store(root, key)
        if st.check_root():
            _recover(st)
        m, res = restore_from_store(st, cid, wait=wait, netns=netns, lazy=lazy)
    doc = {"ok": True, "id": m.id, "workload_id": m.workload_id, "pid": res.pid, "mode": res.mode,
           "duration_s": round(res.duration_s, 4), "pages_complete_s": res.pages_complete_s,
           "exit_code": res.exit_code}
    if json_out:
        emit_json(doc)
    else:
        console.print(f"[green]restored[/] {escape(m.id)} as PID {res.pid} in {res.duration_s:.2f} s ({res.mode})"
                      + (f", all pages in after {res.pages_complete_s:.2f} s" if res.pages_complete_s else ""))
    if wait and res.exit_code:
        raise typer.Exit(res.exit_code)


@checkpoints_app.command("list")
def list_cmd(
    workload: str = typer.Option(None, "--workload", help="Only this workload"),
    store: Path = StoreOpt, key: Path = KeyOpt, json_out: bool = JsonOpt,
) -> None:
    """Stored checkpoints, newest first: the manifest's signature is checked ("signed"), the files' hashes are
    not (`verify` checks every file, so does every restore)."""
    with _refusals(json_out):
        st = _store(store, key)
        rows = st.list(workload)  # the key and the root are checked first
        _recover(st)
        rows = st.list(workload) + [r for r in _interrupted_rows(st) if workload in (None, r["workload_id"])]
    if json_out:
        emit_json(rows)
        return
    # the id first and never wrapped (it is what one copies into `verify`/`restore`), the rest fold around it;
    # "signed" is what `list` checks: the manifest's signature under this store's key, not the files' hashes
    t = Table(box=None, pad_edge=False, caption="signed: the manifest's signature matches this store's key; the "
              "files' hashes are checked by `gpudefrag checkpoints verify ID` (and by every restore)",
              caption_justify="left")
    t.add_column("id", no_wrap=True, min_width=max((len(r["id"]) for r in rows), default=2))
    t.add_column("workload", overflow="fold")
    t.add_column("created (UTC)", no_wrap=True)
    for col in ("MiB", "mode", "signed"):
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(r["id"], r["workload_id"] or "?", (r["created_at"] or "?")[5:19].replace("T", " "),
                  f"{r['bytes'] / 2**20:.1f}" if r["bytes"] is not None else "?",
                  r["mode"] or "?",
                  "yes" if r["signed"] else f"[red]no[/] {r['error'] or ''}")
    console.print(t)


@checkpoints_app.command("verify")
def verify_cmd(
    ckpt: str = typer.Argument(..., help="Checkpoint id or folder"),
    store: Path = StoreOpt, key: Path = KeyOpt, json_out: bool = JsonOpt,
) -> None:
    """Check the signature and every file's size and SHA-256; exit 2 with the reason code if anything differs."""
    from ..checkpoint.operations import resolve

    root, cid = resolve(store, ckpt)
    with _refusals(json_out):
        v = _store(root, key).verify(cid)
    if json_out:
        emit_json(v.as_dict())
    elif v.ok:
        console.print(f"[green]ok[/] {escape(cid)}: signature and {v.bytes_checked / 2**20:.1f} MiB verified")
    if not v.ok:
        if not json_out:
            raise fail(f"{v.path}: {v.reason}: {v.detail}")
        raise typer.Exit(2)


@checkpoints_app.command("gc")
def gc_cmd(
    keep: int = typer.Option(3, "--keep", min=0, help="Newest checkpoints to keep per workload"),
    workload: str = typer.Option(None, "--workload", help="Only this workload"),
    store: Path = StoreOpt, key: Path = KeyOpt, json_out: bool = JsonOpt,
) -> None:
    """Keep the newest N checkpoints per workload that verify (and the parents they need); remove the rest.
    A workload's newest verified checkpoint is never removed; unreadable folders are reported and left alone."""
    with _refusals(json_out):
        st = _store(store, key)
        st.list(workload)  # the key and the root are checked first
        _recover(st)
        r = st.gc(keep, workload_id=workload)  # never touches an interrupted or kept checkpoint
    if json_out:
        emit_json(r.as_dict())
        return
    console.print(f"removed {len(r.removed)} checkpoint(s), {r.freed_bytes / 2**20:.1f} MiB freed; "
                  f"kept {len(r.kept)} that verify" + (f"; unreadable (left alone): {', '.join(r.unreadable)}"
                                                       if r.unreadable else "")
                  + (f"; did not verify (never counted as kept): {', '.join(r.unverified)}" if r.unverified else ""))
    for line in r.explain():
        console.print(f"  removed {escape(line)}")


@keys_app.command("init")
def keys_init(key: Path = KeyOpt, json_out: bool = JsonOpt) -> None:
    """Create the signing key (0600) if it is missing; an existing one is checked and kept, never replaced."""
    from ..checkpoint.keys import init_key, key_id

    path = key or default_key_path()
    with _refusals(json_out):
        k, created = init_key(path)
    if json_out:
        emit_json({"ok": True, "path": str(path), "key_id": key_id(k), "created": created})
        return
    console.print(f"{'created' if created else 'exists'}: {escape(str(path))} (key id {key_id(k)})")
