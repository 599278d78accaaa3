"""Core commands: snapshot validate, frag, diagnose, demo."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from ..core.decision import decide, decide_all
from ..core.diagnose import FRAGMENTED, Diagnosis, diagnose_all
from ..core.fragmentation import FragReport, fits_mask, frag_report
from ..core.model import MILLI, ClusterState, Request
from ..demo import demo_document, demo_state
from ..render import gpu_map, histogram_line, legend
from ..snapshot import json_schema, load_snapshot, write_json_atomic
from .common import JsonOpt, KeyOpt, PolicyOpt, StoreOpt, console, emit_json, fail
from .slurm_cmds import RunDirOpt, live_slurm

snapshot_app = typer.Typer(help="Work with snapshot files (the JSON/YAML picture of a cluster).", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(snapshot_app, name="snapshot")
    app.command("frag")(frag)
    app.command("diagnose")(diagnose)
    app.command("demo")(demo)


# ---------------------------------------------------------------------------------------------- snapshot
@snapshot_app.command("validate")
def snapshot_validate(
    file: Path = typer.Argument(..., help="Snapshot file (.json, .yaml)"), json_out: bool = JsonOpt
) -> None:
    """Check a snapshot file; print what it holds or one error naming the field (exit 2)."""
    state = load_snapshot(file)
    info = {
        "file": str(file),
        "valid": True,
        "nodes": len(state.nodes),
        "gpus": int(state.gpu_counts.sum()),
        "running": len(state.running),
        "pending": len(state.pending),
    }
    if json_out:
        emit_json(info)
    else:
        console.print(f"[green]valid[/]: {escape(str(file))}: {info['nodes']} nodes, {info['gpus']} GPUs, "
                      f"{info['running']} running, {info['pending']} pending workloads")


@snapshot_app.command("schema")
def snapshot_schema(json_out: bool = JsonOpt) -> None:
    """Print the snapshot JSON Schema (JSON with or without --json, which every command takes)."""
    emit_json(json_schema())


@snapshot_app.command("demo")
def snapshot_demo(out: Path = typer.Argument(..., help="Where to write the demo cluster's snapshot"),
                  json_out: bool = JsonOpt) -> None:
    """Write the embedded demo cluster as a snapshot file, to edit and feed back to the other commands."""
    write_json_atomic(out, demo_document())
    if json_out:
        state = demo_state()
        emit_json({"file": str(out), "nodes": len(state.nodes), "workloads": len(state.workloads)})
    else:
        console.print(f"wrote {escape(str(out))}")


# ---------------------------------------------------------------------------------------------- frag
def _request_from_opts(state: ClusterState, gpus: int | None, model: str | None, share: int, nodes: int) -> Request:
    return Request(
        gpus_per_node=gpus if gpus is not None else max(state.max_gpus, 1),
        node_count=nodes,
        gpu_milli=share,
        gpu_models=(model,) if model else (),
    )


def frag(
    file: Path = typer.Argument(..., help="Snapshot file"),
    gpus: int = typer.Option(None, "--gpus", help="Request shape: GPUs per node (default: the largest node)"),
    model: str = typer.Option(None, "--model", help="Request shape: GPU model"),
    share: int = typer.Option(MILLI, "--share", help="Request shape: per-GPU share in milli-GPU (1000 = whole)"),
    nodes: int = typer.Option(1, "--nodes", help="Request shape: number of nodes"),
    json_out: bool = JsonOpt,
) -> None:
    """Fragmentation metrics: free GPUs, whole-free nodes, stranded GPUs for a request shape, the FGD measure."""
    state = load_snapshot(file)
    if share < 1 or share > MILLI:
        raise fail(f"--share must be in 1..{MILLI}")
    report = frag_report(state, _request_from_opts(state, gpus, model, share, nodes))
    if json_out:
        emit_json(report.as_dict())
        return
    _print_frag(report)


def _print_frag(r: FragReport) -> None:
    t = Table(box=None, show_header=False, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("nodes / GPUs", f"{r.nodes} / {r.gpus}")
    t.add_row("free GPUs", f"{r.free_gpus} whole ({r.free_milli / MILLI:g} GPU of share incl. partial)")
    t.add_row("whole-free nodes", str(r.whole_free_nodes))
    t.add_row(f"request {r.request.label()}", f"fits on {r.nodes_fitting} node(s)")
    t.add_row("stranded for it", f"{r.stranded_gpus} whole GPUs ({r.stranded_milli / MILLI:g} GPU of share)")
    t.add_row("largest placeable", f"{r.largest_placeable} GPUs" + (f" on {r.largest_node}" if r.largest_node else ""))
    t.add_row("  by model", ", ".join(f"{k}: {v}" for k, v in sorted(r.largest_by_model.items())))
    t.add_row("FGD fragmentation", f"{r.fgd_milli / MILLI:.2f} GPUs ({r.fgd_ratio:.1%} of free share; "
              f"mix of {r.mix_size} task shapes)")
    console.print(Panel(t, title="fragmentation", expand=False))
    console.print("free GPUs per node:\n" + histogram_line(r.histogram))


# ---------------------------------------------------------------------------------------------- diagnose
def diagnose(
    file: Path = typer.Argument(None, help="Snapshot file, or a kubectl dump (a List file or a folder)"),
    job: str = typer.Option(None, "--job", help="Diagnose only this pending workload"),
    gpus: int = typer.Option(None, "--gpus", help="Diagnose a hypothetical request of this many GPUs per node"),
    model: str = typer.Option(None, "--model", help="GPU model of the hypothetical request"),
    kube: bool = typer.Option(False, "--kube", help="Read the live Kubernetes cluster instead of a file"),
    context: str = typer.Option(None, "--context", help="kubeconfig context (implies --kube)"),
    slurm: bool = typer.Option(False, "--slurm", help="Read the live Slurm cluster (SLURM_CONF) through the Slurm "
                               "engine, as the controller does"),
    policy: Path = PolicyOpt,
    run_dir: Path = RunDirOpt,
    store: Path = StoreOpt,
    key: Path = KeyOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Why each pending GPU request waits: ordinary causes first, fragmentation last, with evidence."""
    from ..engines.kubernetes.load import load_cluster_state  # snapshot, kubectl dump, or the live cluster
    from ..policy.options import load_inputs, plan_options

    if slurm and (kube or context is not None or file is not None):
        raise fail("--slurm reads the live Slurm cluster: give no file, --kube or --context with it")
    if slurm:
        live = live_slurm(policy, run_dir, store, key)
        state, opts = live.state, live.options
        file = Path("slurm:" + os.environ.get("SLURM_CONF", "(default)"))
    else:
        state = load_cluster_state(file, kube=kube, context=context)
        opts = plan_options(load_inputs(policy))
    if gpus is not None:
        if gpus < 1:
            raise fail(f"--gpus must be >= 1, got {gpus}")
        diags = [decide(state, Request(gpus_per_node=gpus, gpu_models=(model,) if model else ()), opts,
                        plan=False).diagnosis]
    else:
        if job is not None and job not in state.workload_index:
            raise fail(f"{file if file is not None else state.name}: no workload with id {job!r}")
        if job is not None and state.workload(job).is_running:
            raise fail(f"{file if file is not None else state.name}: workload {job!r} is running, not pending")
        diags = [d.diagnosis for d in decide_all(state, [job] if job else None, opts, plan=False)]
    if json_out:
        # a live read has no file: null, and the cluster it read (never the string "None")
        emit_json({"file": str(file) if file is not None else None,
                   **({"cluster": state.name} if file is None else {}),
                   "diagnoses": [d.as_dict() for d in diags]})
        return
    if not diags:
        console.print("no pending GPU requests")
        return
    for d in diags:
        print_diagnosis(d)


def print_diagnosis(d: Diagnosis) -> None:
    head = f"[bold]{escape(d.workload_id or 'request')}[/] ({escape(d.request.label())})"
    if d.scheduler_reason:
        head += f" — scheduler says: {escape(d.scheduler_reason)}"
    console.print(head)
    for i, c in enumerate(d.causes, 1):
        colour = "yellow" if c.code in FRAGMENTED else "cyan"
        console.print(f"  {i}. [{colour}]{c.code.value}[/]: {escape(c.summary)}")


# ---------------------------------------------------------------------------------------------- demo
def demo(
    json_out: bool = JsonOpt,
    serve: bool = typer.Option(False, "--serve", help="Open the demo cluster in the dashboard on 127.0.0.1"),
) -> None:
    """The whole story on an embedded 4-node cluster: the GPU map, why the 8-GPU job waits, the cheapest plan
    to free a node, and the cluster after it."""
    if serve:
        from .serve_cmd import serve_state

        return serve_state(demo_state())
    state = demo_state()
    pending = state.pending[0]
    diag = diagnose_all(state)[0]
    report = frag_report(state, pending.request)
    stranded_nodes = [n.name for n, ok in zip(state.nodes, fits_mask(state, pending.request), strict=True) if not ok]
    from .plan_cmd import print_decision

    decision = decide(state, pending, diagnosis=diag)
    plan = decision.plan
    assert plan is not None
    if json_out:
        emit_json({"cluster": state.name, "fragmentation": report.as_dict(), "diagnosis": diag.as_dict(),
                   "plan": plan.as_dict(), "decision": decision.as_dict()})
        return
    console.rule("[bold]gpudefrag demo[/]: 4 nodes × 8 H100, one 8-GPU job pending")
    console.print(gpu_map(state, title="GPU map (letters: running jobs, · free GPU, red: stranded)",
                          stranded_nodes=stranded_nodes))
    console.print(legend(state))
    console.print()
    _print_frag(report)
    console.print()
    console.rule("diagnosis")
    print_diagnosis(diag)
    console.print()
    console.rule("the cheapest plan")
    print_decision(state, decision)
