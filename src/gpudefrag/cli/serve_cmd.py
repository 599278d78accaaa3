"""`gpudefrag serve`: the dashboard and `/metrics` over a snapshot, the demo, or a live engine."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer
from rich.markup import escape

from ..core.model import ClusterState
from ..errors import InputError
from .common import CostsOpt, JsonOpt, KeyOpt, PolicyOpt, StoreOpt, console, emit_json, fail


class EngineName(StrEnum):
    SIM = "sim"
    SLURM = "slurm"
    KUBERNETES = "kubernetes"


DEFAULT_PORT = 8765


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    engine: EngineName = typer.Option(EngineName.SIM, "--engine", help="Where the cluster comes from"),
    snapshot: Path = typer.Option(None, "--snapshot", help="Snapshot file for the sim engine (default: demo)"),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (loopback unless --allow-remote)"),
    port: int = typer.Option(DEFAULT_PORT, "--port", min=0, max=65535, help="TCP port"),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a non-loopback bind address"),
    enable_actions: bool = typer.Option(False, "--enable-actions",
                                        help="Allow apply-plan and checkpoint (needs --token-file)"),
    token_file: Path = typer.Option(None, "--token-file", help="File holding the bearer token for actions"),
    journal: Path = typer.Option(None, "--journal", envvar="GPUDEFRAG_JOURNAL",
                                 help="Migration journal (SQLite) to show the history of (default for live engines: "
                                 "the controller's, found as `migrations` finds it)"),
    check: bool = typer.Option(False, "--check", help="Validate the options and the cluster, print, and exit"),
    policy: Path = PolicyOpt,
    costs: Path = CostsOpt,
    store: Path = StoreOpt,
    key: Path = KeyOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Serve the dashboard: GPU map, pending jobs with their diagnosis, plan preview, history, /metrics."""
    from ..web.server import BindRefused, check_bind

    try:
        check_bind(host, allow_remote)
    except BindRefused as e:
        raise fail(str(e)) from None
    if enable_actions and token_file is None:
        raise fail("--enable-actions needs --token-file FILE (the bearer token clients must send)")
    if token_file is not None and not enable_actions:
        raise fail("--token-file is only used with --enable-actions")
    if snapshot is not None and engine is not EngineName.SIM:
        raise fail("--snapshot is only used with --engine sim")
    token = _token(token_file) if enable_actions else None
    from ..policy.options import load_inputs, plan_options

    options = plan_options(load_inputs(policy, costs))  # the same PlanOptions as `plan` and the controller
    enrich = None
    if store is not None:
        if engine is EngineName.SIM:
            raise fail("--store is read for a live engine (--engine slurm or kubernetes)")
        from ..checkpoint.keys import load_key
        from ..checkpoint.store import CheckpointStore, default_key_path
        from ..control.controller import enrich_from_store

        st = CheckpointStore(store, key or default_key_path())
        load_key(st.key_path, create=False)  # a missing key is an error, never a new key
        enrich = enrich_from_store(st)
    source = _source(engine, snapshot, enrich)
    if journal is None and engine is not EngineName.SIM:
        journal = _default_journal()
    _run(source, host, port, allow_remote=allow_remote, token=token, journal=journal, check=check,
         json_out=json_out, options=options)


def serve_state(state: ClusterState, *, port: int = DEFAULT_PORT) -> None:
    """Serve an in-memory cluster on loopback (what `gpudefrag demo --serve` calls)."""
    from ..web.source import MemorySource

    _run(MemorySource(state, "sim"), "127.0.0.1", port, allow_remote=False, token=None, journal=None)


def _default_journal() -> Path | None:
    """The controller's journal, found as `migrations` finds it: the default path, else the one the last controller
    run here kept (a controller given --journal elsewhere), else none."""
    from .controller_cmd import known_journal

    return known_journal()


def _token(path: Path) -> str:
    from ..web.auth import read_token_file

    return read_token_file(path)  # refused when others can read it


def _source(engine: EngineName, snapshot: Path | None, enrich=None):  # type: ignore[no-untyped-def]
    from ..web.source import EngineSource, MemorySource, make_engine

    if engine is EngineName.SIM:
        if snapshot is None:
            from ..demo import demo_state

            return MemorySource(demo_state(), "sim")
        from ..snapshot import load_snapshot

        return MemorySource(load_snapshot(snapshot), "sim")
    try:
        live = make_engine(engine.value)
    except ImportError as e:
        raise fail(f"the {engine.value} engine is not available: {e}") from None
    except Exception as e:
        raise fail(f"cannot start the {engine.value} engine: {e}") from None
    src = EngineSource(live, engine.value, enrich=enrich)
    try:
        src.state()  # observe once now: a cluster we cannot read is an error at startup, not on every page
    except InputError:
        src.close()
        raise
    except Exception as e:
        src.close()
        raise fail(f"cannot observe the {engine.value} cluster: {e}") from None
    return src


def _run(source, host: str, port: int, *, allow_remote: bool, token: str | None,  # type: ignore[no-untyped-def]
         journal: Path | None, check: bool = False, json_out: bool = False, options=None) -> None:
    try:
        _serve(source, host, port, allow_remote=allow_remote, token=token, journal=journal, check=check,
               json_out=json_out, options=options)
    finally:
        source.close()  # the live engine's watches end before the process does


def _serve(source, host: str, port: int, *, allow_remote: bool, token: str | None,  # type: ignore[no-untyped-def]
           journal: Path | None, check: bool, json_out: bool, options) -> None:
    from ..web.app import create_app
    from ..web.server import allowed_hosts
    from ..web.server import serve as run_server

    state = source.state()
    url = f"http://{host if ':' not in host or host.startswith('[') else f'[{host}]'}:{port}/"
    info = {"url": url, "engine": source.engine_name, "cluster": state.name, "nodes": len(state.nodes),
            "actions_enabled": token is not None, "journal": str(journal) if journal else None}
    if check:
        if json_out:
            emit_json(info)
        else:
            console.print(f"ok: would serve {escape(state.name)} ({len(state.nodes)} nodes) at {url}")
        return
    app = create_app(source, token=token, journal=journal,
                     allowed_hosts=allowed_hosts(host, allow_remote), plan_options=options)
    if json_out:
        emit_json(info)
    else:
        console.print(f"gpudefrag dashboard: {url}  (engine {source.engine_name}, "
                      f"actions {'enabled' if token else 'off'}; Ctrl-C to stop)")
    run_server(app, host, port, allow_remote=allow_remote, log_level="warning")
