"""`gpudefrag kube diagnose | snapshot | plan`: Kubernetes clusters, live (`--kube [--context C]`) or from a
`kubectl get nodes,pods,resourcequotas,poddisruptionbudgets,events,replicasets,jobs -A -o json` dump
(a file or a folder)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.table import Table

from ..snapshot import state_to_dict, write_json_atomic
from .common import CostsOpt, JsonOpt, PolicyOpt, console, emit_json, fail
from .core_cmds import print_diagnosis

if TYPE_CHECKING:  # the Kubernetes client loads only when a kube command runs, not with every `gpudefrag`
    from ..engines.kubernetes import KubeCluster

kube_app = typer.Typer(help="Kubernetes: diagnose a live cluster or a kubectl dump, snapshot it, plan moves as "
                       "API operations.", no_args_is_help=True)

SourceArg = typer.Argument(None, help="kubectl dump: a JSON/YAML List file or a folder of them")
KubeOpt = typer.Option(False, "--kube", help="Read the live cluster (kubeconfig, or in-cluster)")
ContextOpt = typer.Option(None, "--context", help="kubeconfig context (implies --kube)")


def register(app: typer.Typer) -> None:
    app.add_typer(kube_app, name="kube")


def _load(source: Path | None, kube: bool, context: str | None) -> KubeCluster:
    from ..engines.kubernetes import load_kube

    return load_kube(source, live=kube, context=context)


def _src(source: Path | None, cluster: KubeCluster) -> str:
    return str(source) if source is not None else cluster.source


@kube_app.command("diagnose")
def kube_diagnose(
    source: Path = SourceArg,
    kube: bool = KubeOpt,
    context: str = ContextOpt,
    job: str = typer.Option(None, "--job", help="Only this pending pod (namespace/name)"),
    json_out: bool = JsonOpt,
) -> None:
    """Why each pending GPU pod waits: the computed causes, with the scheduler's own message as evidence."""
    cluster = _load(source, kube, context)
    if job is not None and job not in cluster.state.workload_index:
        raise fail(f"{_src(source, cluster)}: no pod {job!r}")
    from ..engines.kubernetes import diagnose_kube

    diags = diagnose_kube(cluster, [job] if job else None)
    if json_out:
        emit_json({"source": _src(source, cluster), "warnings": list(cluster.warnings), "notes": list(cluster.notes),
                   "diagnoses": [d.as_dict() for d in diags]})
        return
    for w in cluster.warnings:
        console.print(f"[yellow]warning[/]: {escape(w)}")
    for n in cluster.notes:
        console.print(f"[dim]{escape(n)}[/]")
    if not diags:
        console.print("no pending GPU pods")
        return
    for d in diags:
        print_diagnosis(d.diagnosis)
        extra = [f"scheduler {d.agreement}"]
        if d.owner:
            extra.append(f"owner {d.owner}")
        if d.priority_class:
            extra.append(f"priorityClass {d.priority_class}")
        console.print(f"     [dim]{escape(', '.join(extra))}[/]")
        for r in d.autoscaler:
            console.print(f"     [dim]autoscaler: {escape(r.text)}[/]")


@kube_app.command("snapshot")
def kube_snapshot(
    source: Path = SourceArg,
    out: Path = typer.Option(..., "--out", "-o", help="Where to write the gpudefrag snapshot (JSON)"),
    kube: bool = KubeOpt,
    context: str = ContextOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Write the cluster as a gpudefrag snapshot, for the other commands (`frag`, `plan`, `simulate`)."""
    cluster = _load(source, kube, context)
    write_json_atomic(out, state_to_dict(cluster.state))
    info = {"out": str(out), "nodes": len(cluster.state.nodes), "workloads": len(cluster.state.workloads),
            "pending": len(cluster.state.pending), "warnings": list(cluster.warnings)}
    if json_out:
        emit_json(info)
    else:
        console.print(f"wrote {escape(str(out))}: {info['nodes']} nodes, {info['workloads']} workloads "
                      f"({info['pending']} pending)")


def _kube_movable(cluster: KubeCluster) -> object:
    """Pods gpudefrag can replace: known to the dump and not synthetic (their owner's kind is checked by the
    `gpudefrag.io/movable` label every entry point honours)."""

    def movable(w: object) -> bool:
        info = cluster.pods.get(w.id)  # type: ignore[attr-defined]
        return info is not None and not info.synthetic

    return movable


@kube_app.command("plan")
def kube_plan(
    source: Path = SourceArg,
    kube: bool = KubeOpt,
    context: str = ContextOpt,
    job: str = typer.Option(None, "--job", help="Plan for this pending pod (default: the oldest pending GPU pod)"),
    move: list[str] = typer.Option(None, "--move", help="WORKLOAD=NODE: build this move instead of planning "
                                   "(repeatable)"),
    checkpoint: str = typer.Option("auto", "--checkpoint", help="auto | kubelet | app"),
    policy: Path = PolicyOpt,
    costs: Path = CostsOpt,
    plan_anyway: bool = typer.Option(False, "--plan-anyway", help="Plan even when an ordinary cause keeps the "
                                     "pod waiting"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Run the operations against an in-memory copy of the "
                                 "cluster and show what each step did"),
    json_out: bool = JsonOpt,
) -> None:
    """The moves that let a pending pod land, each as the list of API operations that performs it.
    Exit 1 when no plan exists or a move is refused."""
    from ..engines.kubernetes import InMemoryApi, MoveOptions, SequenceRunner, SimpleMove, build_moves
    from ..engines.kubernetes.convert import as_dict_info

    if checkpoint not in ("auto", "kubelet", "app"):
        raise fail("--checkpoint must be auto, kubelet or app")
    cluster = _load(source, kube, context)
    state = cluster.state
    src = _src(source, cluster)
    from ..policy.options import load_inputs, plan_options

    inputs = load_inputs(policy, costs)
    budget = inputs.policy.budgets.max_moves_per_plan if policy is not None else None
    opts = plan_options(inputs, movable=_kube_movable(cluster))  # type: ignore[arg-type]
    plan_doc: dict[str, object] | None = None
    decision_doc: dict[str, object] | None = None
    if move:
        moves = []
        for m in move:
            wid, sep, node = m.partition("=")
            if not sep or wid not in state.workload_index:
                raise fail(f"--move {m!r}: expected WORKLOAD=NODE with a pod of {src}")
            info = cluster.pods[wid]
            if info.node is None:
                raise fail(f"--move {m!r}: {wid} is not running")
            moves.append(SimpleMove(wid, info.node, node))
    else:
        from ..core.decision import decide

        pending = [w.id for w in state.pending if w.request.gpus_per_node > 0 or w.request.mig_profile is not None]
        wid = job or (pending[0] if pending else None)
        if wid is None or wid not in state.workload_index:
            raise fail(f"{src}: no pending GPU pod" + (f" {job!r}" if job else ""))
        decision = decide(state, state.workload(wid), opts, plan_anyway=plan_anyway)
        decision_doc = decision.as_dict()
        plan_doc = decision.plan.as_dict() if decision.plan is not None else None
        if decision.plan is None or not decision.plan.feasible:
            if json_out:
                emit_json({"source": src, "plan": plan_doc, "decision": decision_doc, "moves": []})
            else:
                console.print(f"[red]no plan[/] for {escape(wid)}: {escape(decision.reason)}")
            raise typer.Exit(1)
        moves = list(decision.plan.moves)
    seqs = build_moves(cluster, moves, MoveOptions.from_inputs(inputs, checkpoint=checkpoint), budget)
    results = []
    if dry_run and all(s.ok for s in seqs):
        api = InMemoryApi(cluster)
        ex = SequenceRunner(api, verify_image=api.verify_image, compat=inputs.compat, sleep=lambda s: None)
        results = [ex.run(s, state.workload(s.workload_id).versions) for s in seqs]
    if json_out:
        emit_json({"source": src, "plan": plan_doc, "decision": decision_doc, "moves": [s.as_dict() for s in seqs],
                   "pods": [as_dict_info(cluster.pods[s.workload_id]) for s in seqs if s.workload_id in cluster.pods],
                   "dry_run": [r.as_dict() for r in results]})
    else:
        if decision_doc is not None and decision.plan is not None:
            p = decision.plan
            console.print(f"plan for [bold]{escape(wid)}[/] ({escape(p.request.label())}): {len(p.moves)} move(s) "
                          f"free [bold]{escape(p.target_node or '-')}[/] ({p.total_cost_s:.0f} s, {p.solver})")
        for s in seqs:
            head = f"[bold]{escape(s.workload_id)}[/] {escape(s.source)} → {escape(s.target)}"
            if not s.ok:
                console.print(f"{head}: [red]refused[/]: {escape(s.refused or '')}")
                continue
            console.print(f"{head} ({s.strategy}, checkpoint: {s.checkpoint_mode}, move {s.move_id})")
            t = Table(box=None, show_header=False, pad_edge=False)
            for i, op in enumerate(s.ops, 1):
                t.add_row(str(i), op.kind.value, op.verb, escape(op.path), escape(op.detail))
            console.print(t)
        for r in results:
            colour = "green" if r.ok else "red"
            console.print(f"dry run {escape(r.workload_id)}: [{colour}]{'ok' if r.ok else escape(r.error)}[/]")
            t = Table(box=None, show_header=False, pad_edge=False)
            for i, step in enumerate(r.steps, 1):
                t.add_row(f"  {i}", step.op, "[green]ok[/]" if step.ok else "[red]failed[/]", escape(step.detail))
            console.print(t)
    if not all(s.ok for s in seqs) or not all(r.ok for r in results):
        raise typer.Exit(1)
