"""`gpudefrag controller`: the live loop (observe → trigger → filter → plan → execute); `gpudefrag migrations`:
the journal's history."""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from .common import CostsOpt, JsonOpt, KeyOpt, PolicyOpt, StoreOpt, console, emit_json, fail, log_line

DEFAULT_STATE_DIR = Path(os.environ.get("GPUDEFRAG_STATE_DIR", "/var/lib/gpudefrag"))


def register(app: typer.Typer) -> None:
    app.command("controller")(controller)
    app.command("migrations")(migrations)


def _journal_path(journal: Path | None) -> Path:
    return journal or DEFAULT_STATE_DIR / "journal.db"


def _pointer() -> Path:
    """Where the last controller run by this user says which journal it keeps (`migrations` reads it)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpudefrag" / "journal-path"


def _remember(journal: Path) -> None:
    """Record the controller's journal for `migrations` (best effort: a read-only home only loses the hint)."""
    try:
        p = _pointer()
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(str(journal.resolve()) + "\n")
        tmp.replace(p)
    except OSError:
        pass


def known_journal() -> Path | None:
    """The journal a controller run here keeps: the default path when it exists, else the one the last controller
    this user ran said it keeps (`migrations` and the dashboard read the same), else None."""
    default = _journal_path(None)
    if default.exists():
        return default
    try:
        hint = Path(_pointer().read_text().strip())
    except OSError:
        return None
    return hint if hint.is_file() else None


def _find_journal(journal: Path | None) -> Path:
    """--journal / $GPUDEFRAG_JOURNAL; else the journal a controller run here keeps; else one error saying where
    it looked and what to pass."""
    if journal is not None:
        return journal
    found = known_journal()
    if found is not None:
        return found
    raise fail(f"no journal at {_journal_path(None)} (the default), and no controller run here said where its "
               "journal is: pass --journal PATH (what the controller was given) or set GPUDEFRAG_JOURNAL; for the "
               "controller in the cluster: kubectl -n gpudefrag exec deploy/gpudefrag-controller -- gpudefrag "
               "migrations")


def controller(
    policy: Path = PolicyOpt,
    engine: str = typer.Option("slurm", "--engine", help="slurm | kubernetes | sim"),
    context: str = typer.Option(None, "--context", help="--engine kubernetes: kubeconfig context (default: "
                                "in-cluster, else the current context)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be done; change nothing"),
    once: bool = typer.Option(False, "--once", help="One cycle, as if requested (the CLI request trigger); a plan "
                              "it starts is carried to the end (or stopped, saying why) before it exits"),
    interval: float = typer.Option(2.0, "--interval", help="Longest pause between cycles (Kubernetes: a change "
                                   "that can alter a decision wakes the controller at once)"),
    max_cycles: int = typer.Option(None, "--max-cycles", help="Stop after this many cycles"),
    until_idle: bool = typer.Option(False, "--until-idle",
                                    help="Stop once no migration is in flight and no trigger fired"),
    journal: Path = typer.Option(None, "--journal", envvar="GPUDEFRAG_JOURNAL",
                                 help="SQLite journal (default $GPUDEFRAG_STATE_DIR/journal.db)"),
    run_dir: Path = typer.Option(None, "--run-dir", envvar="GPUDEFRAG_RUN_DIR",
                                 help="Shared directory the job wrappers use"),
    store: Path = StoreOpt,
    key: Path = KeyOpt,
    registry: str = typer.Option(None, "--registry", envvar="GPUDEFRAG_REGISTRY",
                                 help="--engine kubernetes: the registry the node agents push checkpoint images "
                                 "to (http(s)://host:port); each image is checked there, by digest and signature "
                                 "with --key, before a replacement restores from it"),
    registry_name: str = typer.Option(None, "--registry-name", envvar="GPUDEFRAG_REGISTRY_NAME",
                                      help="The registry's name in image references (default: --registry's "
                                      "host:port); only images named so are accepted"),
    snapshot: Path = typer.Option(None, "--snapshot", help="--engine sim: the cluster to simulate"),
    costs: Path = CostsOpt,
    lease_namespace: str = typer.Option("default", "--lease-namespace", envvar="POD_NAMESPACE",
                                        help="--engine kubernetes: the namespace of the Lease "
                                        "(gpudefrag-controller) that makes this the cluster's only controller"),
    request_file: Path = typer.Option(None, "--request-file",
                                      help="A file whose appearance requests a cycle (consumed)"),
    plan_anyway: bool = typer.Option(False, "--plan-anyway", help="Move jobs even for a pending job that an "
                                     "ordinary cause (a hold, a limit, a quota) keeps waiting"),
    json_out: bool = JsonOpt,
) -> None:
    """Watch the cluster and move jobs as the policy says; every decision is printed with its reason."""
    from ..policy.options import load_inputs

    if policy is None:  # the controller acts: what it may do is never left to the built-in default
        raise fail("controller needs --policy FILE (what triggers a move, which jobs may move, the budgets)")
    # a malformed policy or cost file: one error naming the field, exit 2, nothing started
    inputs = load_inputs(policy, costs)
    pol = inputs.policy
    from ..control.controller import Controller, enrich_from_store
    from ..control.executor import Executor, crash_hook_from_env
    from ..control.journal import Journal
    from ..engines.registry import engine_names, make_engine
    if engine not in engine_names():
        raise fail(f"--engine must be {', '.join(engine_names())}, not {engine!r}")
    if engine == "sim" and snapshot is None:
        raise fail("--engine sim needs --snapshot FILE")
    state = None
    if engine == "sim":
        from ..snapshot import load_snapshot

        state = load_snapshot(snapshot)  # type: ignore[arg-type]
    try:
        eng = make_engine(engine, context=context, state=state)
    except ValueError as e:
        raise fail(str(e)) from None
    sim = eng if engine == "sim" else None

    def log(msg: str) -> None:
        if not json_out:
            log_line(f"[dim]{time.strftime('%H:%M:%S')}[/] {escape(msg)}", markup=True)

    executor = None
    st = None
    lease = None
    if store is not None:
        from ..checkpoint.keys import load_key
        from ..checkpoint.store import CheckpointStore, default_key_path

        st = CheckpointStore(store, key or default_key_path())
        # the store's checkpoints are read only if signed by its key (sizes for the planner, verification before
        # each move); a missing key is an error here, never a new key: only `checkpoint` and `keys init` make one
        load_key(st.key_path, create=False)
    if not dry_run and engine == "kubernetes":
        # pods are moved as checked API-operation sequences (create pinned replacement, wait ready, evict
        # original), journaled the same way; no job wrapper or shared run dir is involved
        from ..control.kube_executor import KubeMoveExecutor
        from ..engines.kubernetes.lease import LeaderLease
        from ..engines.kubernetes.live import api_client

        # one controller per cluster: a Lease held for its whole life, taken before the journal is opened
        # (journals on separate volumes cannot see each other's lock); then one controller per journal. The same
        # pod (a restarted container), or the same host and journal (a restarted process; the journal's lock
        # keeps out a second one at once), takes its own Lease back at once; anyone else waits it out.
        who = os.environ.get("POD_NAME") or f"{socket.gethostname()}:{_journal_path(journal).absolute()}"
        lease = LeaderLease(api_client(context), lease_namespace, identity=who)
        lease.acquire()
        kj = Journal(_journal_path(journal), on_write=crash_hook_from_env())
        kj.claim()  # one controller per journal, for its whole life
        # from here on a clean stop gives the Lease back, so the next controller need not wait it out: the loop's
        # `finally`, and — for a stop while still setting up (the Deployment's SIGTERM) — the exit itself. Not
        # before: a refused claim means another process of this identity holds the Lease; it is left alone.
        atexit.register(lease.release)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
        _remember(kj.path)
        from ..engines.kubernetes.moves import MoveOptions

        cfg = inputs.executor
        # the move-time compatibility check applies the policy's rule, the one the planner used; an image the
        # target cannot restore is refused, or started cold when the policy says `fallback: evict`
        opts = MoveOptions.from_inputs(inputs)
        verify = None
        if registry is not None:
            from ..checkpoint.keys import load_key
            from ..checkpoint.oci_registry import Registry, image_verifier
            from ..checkpoint.store import default_key_path

            if not registry.startswith(("http://", "https://")):
                raise fail(f"--registry must be http(s)://host:port, not {registry!r}")
            # the key from a Secret volume is 0440 root:<fsGroup> in the controller's pod
            reg = Registry(registry, name=registry_name or None)
            verify = image_verifier(reg, load_key(key or default_key_path(), group_read_ok=True))
        executor = KubeMoveExecutor(eng, kj, cfg, options=opts, verify_image=verify,  # type: ignore[arg-type]
                                    log=log)
        if executor.active():
            log(f"resuming {len(executor.active())} migration(s) from {kj.path}")
    elif not dry_run:
        if sim is None and (run_dir is None or st is None) and pol.action.kind == "migrate":
            raise fail("moving jobs needs --run-dir and --store (the wrappers' shared directory and store)")
        j = Journal(_journal_path(journal), on_write=crash_hook_from_env())
        j.claim()
        _remember(j.path)
        if sim is not None:
            agent = sim
        else:
            from ..control.agent import FileAgent

            assert run_dir is not None
            agent = FileAgent(run_dir, st, signal=lambda wid: eng.signal(wid, "USR2", batch=True))
        executor = Executor(eng, agent, j, inputs.executor, log=log)
        if executor.active():
            log(f"resuming {len(executor.active())} migration(s) from {j.path}")
    can: Callable[[Any], bool] | None = None
    if sim is None and run_dir is not None:  # only jobs running under `gpudefrag run` can answer a checkpoint
        from ..control.agent import FileAgent as _FA

        wrappers = _FA(run_dir, st)

        def can(w: Any) -> bool:
            return wrappers.has_wrapper(w.id)

    ctl = Controller(eng, pol, executor, dry_run=dry_run, log=log,
                     enrich=enrich_from_store(st) if st is not None else None, request_file=request_file,
                     can_checkpoint=can, costs=inputs.costs, plan_anyway=plan_anyway)
    if once:
        ctl.request()

    def on_cycle(report) -> None:  # type: ignore[no-untyped-def]
        if json_out:
            sys.stdout.write(json.dumps(report.as_dict(), default=str) + "\n")
            sys.stdout.flush()
        if sim is not None:
            sim.advance(interval)

    try:
        n = 0
        while True:
            if lease is not None:
                lease.renew()  # a controller that lost its Lease stops before it acts again
            report = ctl.cycle()
            on_cycle(report)
            n += 1
            if once or (max_cycles is not None and n >= max_cycles):
                break
            if until_idle and report.in_flight == 0 and not any(d.kind in ("trigger", "submit", "progress")
                                                                 for d in report.decisions):
                break
            if sim is None:
                pause_until_change(eng, interval if ctl.next_due is None
                                   else max(0.0, min(interval, ctl.next_due - time.time())))
        if executor is not None and once:
            # one cycle asked for: finish what it started — the migrations in flight and every move of a plan it
            # started that the budget deferred (max_per_node: 1 makes a two-move plan take two rounds) — bounded by
            # the policy's timeouts; no new plan is started meanwhile. Every step of a migration has a timeout; as a
            # last guard, no one set of migrations stays in flight longer than all of them together
            from ..control.executor import once_deadline_s

            limit = once_deadline_s(executor.config)
            seen: set[int] = set()
            end = time.monotonic() + limit
            while executor.active() or ctl.plans:
                now_ids = {m.id for m in executor.active()}
                if now_ids != seen:
                    seen, end = now_ids, time.monotonic() + limit
                if sim is None and time.monotonic() > end:
                    left = ", ".join(f"{m.id} ({m.workload_id}: {m.state.value})" for m in executor.active())
                    raise fail(f"--once: migration(s) still in flight after {limit:.0f} s: {left}; they stay in the "
                               "journal and a restarted controller resumes them", 1)
                time.sleep(interval if sim is None else 0)
                if lease is not None:
                    lease.renew()
                on_cycle(ctl.cycle(plan_new=False))
    finally:
        # the watches end before the process does: their daemon threads, left blocked in TLS reads while the
        # interpreter shuts down, are one way a Python process aborts on its way out (a restarted
        # `controller --once` on the real nodes ended with SIGABRT and nothing on stderr, its work done)
        close = getattr(eng, "close", None)
        if callable(close):
            close()
        if lease is not None:
            lease.release()


def pause_until_change(engine: Any, seconds: float) -> None:
    """Between cycles: an engine that follows the cluster by watches (Kubernetes) wakes the controller as soon
    as a change that can alter a decision arrives; the others are polled every `seconds`."""
    wait = getattr(engine, "wait", None)
    if callable(wait):
        wait(seconds)
    else:
        time.sleep(seconds)


def migrations(
    journal: Path = typer.Option(None, "--journal", envvar="GPUDEFRAG_JOURNAL", help="SQLite journal"),
    limit: int = typer.Option(20, "--limit", help="How many, newest first"),
    json_out: bool = JsonOpt,
) -> None:
    """The migration history from the journal, newest first, with every step."""
    from ..control.journal import Journal

    path = _find_journal(journal)
    hist = Journal(path, readonly=True).history(limit)  # read-only: never creates or changes a file
    if json_out:
        emit_json({"journal": str(path), "migrations": hist})
        return
    t = Table(box=None)
    for c in ("id", "workload", "move", "state"):
        t.add_column(c)
    # the reason and the steps wrap (folding long checkpoint ids and paths) instead of being cut or running off
    t.add_column("reason", overflow="fold", ratio=3)
    t.add_column("steps", overflow="fold", ratio=2)
    for h in hist:
        t.add_row(str(h["id"]), h["workload_id"], f"{h['source']} → {h['target']}", h["state"],
                  escape(h["reason"]), " → ".join(s["state"] for s in h["steps"]))
    console.print(t)
