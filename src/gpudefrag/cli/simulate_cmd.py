"""`gpudefrag simulate static|dynamic|bound`: the simulator from the command line.

Seeds run in parallel processes behind a Rich progress bar; results go to an output folder (CSV, PNG plots, a
Markdown report) that appears only when everything succeeded. A malformed trace is one error line naming the
file, line and column, with exit code 2, and no folder.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..core.placement import FGD_STUDY_POLICIES, POLICIES
from ..errors import InputError
from .common import JsonOpt, console, emit_json, err_console

sim_app = typer.Typer(help="Simulate placement policies and defragmentation (static FGD replay, dynamic queue).",
                      no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="simulate")


def parse_seeds(text: str) -> list[int]:
    """'42-51' or '42,43,50' → seeds."""
    out: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                a, b = part.split("-", 1)
                lo, hi = int(a), int(b)
                if hi < lo:
                    raise ValueError
                out.extend(range(lo, hi + 1))
            elif part:
                out.append(int(part))
    except ValueError:
        raise InputError("--seeds", "", f"expected e.g. 42-51 or 42,43, got {text!r}") from None
    if not out:
        raise InputError("--seeds", "", "no seeds given")
    return out


def _split(text: str, allowed: tuple[str, ...] | list[str], what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise InputError(what, "", f"unknown {', '.join(bad) or '(none)'}; choose from {', '.join(allowed)}")
    return items


def _non_negative(*flags: tuple[str, float]) -> None:
    """Each (flag, value): a finite number ≥ 0, or one error naming the flag."""
    for flag, v in flags:
        if not 0 <= v < float("inf"):
            raise InputError(flag, "", f"must be a number >= 0, got {v}")


def _shares(*flags: tuple[str, float]) -> None:
    """Each (flag, value): a share in 0..1 (NaN is not), or one error naming the flag."""
    for flag, v in flags:
        if not 0 <= v <= 1:
            raise InputError(flag, "", f"must be in 0..1, got {v}")


def _check_out(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise InputError(str(out), "", "output folder exists (use --force to replace it)")


def _progress() -> Progress:
    """On stderr, so that --json output on stdout stays parseable."""
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err_console, transient=False)


def _clean(x: object) -> object:
    """NaN → null, so the JSON is strict."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def _num(x: object) -> str:
    """Two decimals, or a dash where there is no number (NaN: e.g. no authors' value for this workload)."""
    v = float(x)  # type: ignore[arg-type]
    return "—" if v != v else f"{v:.2f}"


@sim_app.command("static")
def static(
    pods: Path = typer.Option(..., "--pods", help="Pod list CSV (e.g. openb_pod_list_default.csv)"),
    out: Path = typer.Option(..., "--out", help="Report folder to create"),
    nodes: Path = typer.Option(None, "--nodes", help="Node list CSV (e.g. openb_node_list_gpu_node.csv)"),
    snapshot: Path = typer.Option(None, "--snapshot", help="Or: a gpudefrag snapshot whose nodes (and running "
                                  "workloads, as background load) form the cluster"),
    policies: str = typer.Option(",".join(FGD_STUDY_POLICIES), "--policies", help="Comma-separated policies"),
    seeds: str = typer.Option("42-51", "--seeds", help="Seeds: 42-51 or 42,43"),
    tune: float = typer.Option(1.3, "--tune", help="Resample the pods to this multiple of GPU capacity"),
    defrag: str = typer.Option("none", "--defrag", help="Comma-separated: none, migrate, evict, repack, "
                               "deschedule (the FGD authors' descheduler)"),
    max_moves: int = typer.Option(8, "--max-moves", help="Moves per rescued pod at most"),
    gib_per_gpu: float = typer.Option(0.0, "--gib-per-gpu", help="repack's move price: a rescue may move at most "
                                      "this many GiB of checkpoints per GPU it places (0 = moves are free)"),
    gib_budget: float = typer.Option(0.0, "--gib-budget", help="repack: checkpoint GiB the whole run may write; "
                                     "rescues stop when it is spent (0 = no cap)"),
    move_budget: float = typer.Option(0.1, "--move-budget", help="migrate, evict, repack: moves per placed pod "
                                      "the whole run may make"),
    moves_per_gpu: float = typer.Option(0.0, "--moves-per-gpu", help="repack: pods a rescue may move per GPU it "
                                        "places (a scarce moves budget goes to the rescues placing most per move; "
                                        "0 = only --max-moves)"),
    saturated: float = typer.Option(0.0, "--saturated", help="repack: rescue a pod only once the nodes of its "
                                    "GPU models are at least this share allocated, 0..1 (pods never leave a static "
                                    "replay, so room made in a pool with room to spare is filled by later arrivals "
                                    "anyway; 0 = always)"),
    deschedule_ratio: float = typer.Option(0.05, "--deschedule-ratio", help="deschedule: evict at most this "
                                           "ratio of the pods on the cluster (one pass, at the first failure)"),
    deschedule_policy: str = typer.Option("fragOnePod", "--deschedule-policy",
                                          help="deschedule: fragOnePod, fragMultiPod or cosSim"),
    deschedule_repeat: bool = typer.Option(False, "--deschedule-repeat", help="deschedule: a pass at every "
                                           "failure while the budget lasts (the authors run one pass)"),
    ray: str = typer.Option(None, "--ray", help="Run the sweep as Ray tasks on the cluster at ADDRESS, or on a "
                            "local Ray cluster with 'local' (needs the ray extra); default: local processes"),
    workers: int = typer.Option(0, "--workers", help="Parallel processes (0 = CPU count)"),
    authors: Path = typer.Option(None, "--authors", help="Folder holding fgd-expected-results/ (default: the "
                                 "pod list's folder, when present)"),
    bound: bool = typer.Option(True, "--bound/--no-bound", help="Compute the lower bound at 100 % arrived"),
    force: bool = typer.Option(False, "--force", help="Replace an existing output folder"),
    json_out: bool = JsonOpt,
) -> None:
    """Replay the FGD study's method (shuffle, tune, place one by one, nothing leaves) for policies × seeds."""
    from ..sim.bound import arrived_prefix, lower_bound
    from ..sim.experiments import AuthorResults, authors_for, is_authors_cluster, run_many, static_runs
    from ..sim.replay import build_workload
    from ..sim.report import POINTS, staged_folder, write_static
    from ..sim.trace import Trace, load_pods, load_trace

    pols = _split(policies, list(POLICIES), "--policies")
    from ..sim.deschedule import DESCHEDULE_POLICIES

    acts = _split(defrag, ("none", "migrate", "evict", "repack", "deschedule"), "--defrag")
    _split(deschedule_policy, DESCHEDULE_POLICIES, "--deschedule-policy")
    _shares(("--deschedule-ratio", deschedule_ratio), ("--saturated", saturated))
    seed_list = parse_seeds(seeds)
    if not tune > 0:
        raise InputError("--tune", "", f"must be > 0, got {tune}")
    if (nodes is None) == (snapshot is None):
        raise InputError("simulate static", "", "give exactly one of --nodes and --snapshot")
    _check_out(out, force)
    # validate the inputs here, before any worker or folder exists
    if snapshot is not None:
        from ..core.placement import Cluster
        from ..snapshot import load_snapshot

        state = load_snapshot(snapshot)
        trace = Trace((), load_pods(pods, {n.gpu_model for n in state.nodes if n.gpu_model}))
        cl = Cluster.from_state(state, trace.mix())
    else:
        trace = load_trace(nodes, pods)
        cl = trace.cluster()
    _non_negative(("--gib-per-gpu", gib_per_gpu), ("--gib-budget", gib_budget), ("--move-budget", move_budget),
                  ("--moves-per-gpu", moves_per_gpu))
    runs = static_runs(str(nodes or ""), str(pods), pols, seed_list, tune, acts, max_moves, str(snapshot or ""),
                       gib_per_gpu, deschedule_ratio, deschedule_policy, deschedule_repeat, move_budget, gib_budget,
                       moves_per_gpu, saturated)
    with _progress() as prog:
        task = prog.add_task("replays", total=len(runs))
        results = run_many(runs, workers or None, on_done=lambda r, res: prog.advance(task), ray=ray or None)
    bounds = []
    if bound and snapshot is None:  # with a snapshot's background load the bound would not hold
        all_pods = [p.pod for p in trace.pods]
        for s in seed_list:
            wl = build_workload(all_pods, cl.capacity_milli, s, tune)
            bounds.append(lower_bound(arrived_prefix(wl, cl.capacity_milli, 100.0), int(cl.gpu_count.sum())))
    # the authors' numbers only mean something on their cluster, for the workload that ran
    if snapshot is not None:
        au = AuthorResults(pods.stem, {}, {}, "none: a snapshot's cluster is not the authors'")
    elif not is_authors_cluster(trace.nodes):
        au = AuthorResults(pods.stem, {}, {}, f"none: {nodes} is not the authors' cluster (the 1,213 GPU nodes "
                                              "of openb_node_list_gpu_node.csv)")
    else:
        au = authors_for(pods, authors)
    meta = {"nodes": str(nodes or snapshot), "pods": str(pods), "policies": ",".join(pols), "seeds": seed_list,
            "tune": tune, "defrag": ",".join(acts), "authors' results": au.source}
    if {"migrate", "evict", "repack"} & set(acts):
        meta["moves"] = f"≤ {max_moves} per rescued pod, ≤ {move_budget} per placed pod over the run"
    if "repack" in acts:
        meta["repack price"] = (f"{gib_per_gpu or 'free'} GiB per GPU placed, "
                                f"{f'≤ {moves_per_gpu} moves per GPU placed, ' if moves_per_gpu else ''}"
                                f"{f'rescue once the pool is ≥ {saturated:.0%} allocated, ' if saturated else ''}"
                                f"{f'≤ {gib_budget} GiB' if gib_budget else 'no GiB cap'} per run")
    if "deschedule" in acts:
        meta["deschedule"] = (f"{deschedule_policy}, ratio {deschedule_ratio}, "
                              f"{'a pass at every failure' if deschedule_repeat else 'one pass'}")
    with staged_folder(out) as tmp:
        summary = write_static(tmp, results, au.curves, bounds, meta, au.paper_at_100)
    if json_out:
        emit_json(_clean({"out": str(out), "summary": summary, "bounds": [b.as_dict() for b in bounds],
                          "authors": au.source}))
        return
    t = Table("policy", *(f"{k} %" for k in POINTS), "authors @100", "max |Δ| 75–130", "moves/pod",
              title="Median unallocated GPU % by arrived workload")
    for row in summary:
        t.add_row(str(row["policy"]), *(_num(row[f"unalloc_{k}"]) for k in POINTS),
                  _num(row["authors_100"]), _num(row["max_abs_diff_75_130"]),
                  f"{float(row['moves_per_placed_pod']):.4f}")  # type: ignore[arg-type]
    console.print(t)
    console.print(f"authors' results: {escape(au.source)}")
    if bounds:
        console.print(f"lower bound at 100 % arrived: {sum(b.unallocated_pct for b in bounds) / len(bounds):.2f} %")
    console.print(f"wrote {escape(str(out))}/report.md")


@sim_app.command("dynamic")
def dynamic(
    out: Path = typer.Option(..., "--out", help="Report folder to create"),
    jobs: int = typer.Option(4000, "--jobs", help="Jobs to simulate"),
    load: float = typer.Option(0.9, "--load", help="Offered load (share of GPU capacity)"),
    nodes: int = typer.Option(32, "--nodes", help="Nodes of 8 GPUs"),
    seed: int = typer.Option(1, "--seed", help="Workload seed"),
    snapshot: Path = typer.Option(None, "--snapshot", help="Run on this snapshot's nodes (its running workloads "
                                  "stay as background load) instead of the synthetic cluster"),
    trigger: float | None = typer.Option(None, "--trigger", show_default=False, help="Defrag when the head job "
                                         "waits longer (s); default: the product's default pending trigger (60 s)"),
    max_moves: int = typer.Option(8, "--max-moves", help="Moves per rescue at most"),
    workers: int = typer.Option(0, "--workers", help="Parallel processes (0 = CPU count)"),
    force: bool = typer.Option(False, "--force", help="Replace an existing output folder"),
    json_out: bool = JsonOpt,
) -> None:
    """Arrivals, FIFO + backfill, placement, defrag controller: best-fit, FGD, FGD+evict, FGD+migrate, pooled."""
    from dataclasses import replace

    from ..sim.dynamic import DEFAULT_TRIGGER_S, STANDARD, simulate
    from ..sim.report import dynamic_table_markdown, gap_closed, staged_folder, write_dynamic
    from ..sim.synthetic import WorkloadSpec, generate

    trigger = DEFAULT_TRIGGER_S if trigger is None else trigger
    if jobs < 10 or not 0 < load < 5 or nodes < 1 or trigger < 0:
        raise InputError("simulate dynamic", "", "need --jobs >= 10, 0 < --load < 5, --nodes >= 1, --trigger >= 0")
    _check_out(out, force)
    base = None
    if snapshot is not None:
        from ..sim.trace import cluster_from_snapshot

        base = cluster_from_snapshot(snapshot)
        g = int(base.gpu_count.sum())
        nodes = max(1, g // 8)
    spec = WorkloadSpec(nodes=nodes, jobs=jobs, load=load, seed=seed)
    wl = generate(spec)
    configs = [replace(c, trigger_s=trigger, max_moves=max_moves) for c in STANDARD]
    results: list = [None] * len(configs)
    with _progress() as prog, ProcessPoolExecutor(max_workers=max(1, min(workers or os.cpu_count() or 1,
                                                                             len(configs)))) as pool:
        task = prog.add_task("configurations", total=len(configs))
        futs = {pool.submit(simulate, wl, c, base): i for i, c in enumerate(configs)}
        for fut in as_completed(futs):
            results[futs[fut]] = fut.result()
            prog.advance(task)
    meta = {"jobs": jobs, "load": load, "gpus": spec.gpus, "seed": seed, "trigger_s": trigger,
            "8-GPU share of GPU demand": f"{spec.eight_gpu_demand_share():.2f}"}
    with staged_folder(out) as tmp:
        summary = write_dynamic(tmp, results, meta)
    gc = gap_closed(results)
    if json_out:
        emit_json(_clean({"out": str(out), "summary": summary, "gap_closed_8gpu_p95": gc}))
        return
    console.print(dynamic_table_markdown(results))
    if gc is not None:
        console.print(f"FGD+migrate closes {100 * gc:.0f} % of the FGD → pooled gap in 8-GPU p95 delay")
    console.print(f"wrote {escape(str(out))}/report.md")


@sim_app.command("replay")
def replay_cmd(
    nodes: Path = typer.Option(..., "--nodes", help="Node list CSV (e.g. openb_node_list_gpu_node.csv)"),
    pods: list[Path] = typer.Option(..., "--pods", help="Pod list CSV; give it again for more lists"),
    out: Path = typer.Option(..., "--out", help="Report folder to create"),
    load: str = typer.Option("0.9", "--load", help="Peak offered load, share of the GPUs (comma list to sweep): "
                             "arrival times are scaled by one factor, order and durations kept; 0 = the trace's "
                             "own timeline"),
    window: str = typer.Option("", "--window", help="Replay only the pods created in START:END (seconds of the "
                               "trace's time; either side may be empty)"),
    times_from: Path = typer.Option(None, "--times-from", help="For a list without times: draw arrival gaps and "
                                    "durations from this list's pods of the same GPU count (default: the study's "
                                    "default list beside it)"),
    seeds: str = typer.Option("42", "--seeds", help="Seeds: 42-44 or 42,43"),
    policies: str = typer.Option("fgd", "--policies", help="Placement policies (comma list)"),
    arms: str = typer.Option(",".join(("fgd", "fgd+gpudefrag", "fgd+deschedule", "fgd+evict", "pooled")), "--arms",
                             help="Arms to run on the same arrivals"),
    policy: Path = typer.Option(None, "--policy", help="The gpudefrag arm's policy file (default: act on a pod "
                                "pending longer than --trigger, heartbeat checkpoints every --heartbeat)"),
    trigger: float | None = typer.Option(None, "--trigger", show_default=False, help="Act on pods that have waited "
                                         "longer (s); default: the product's default policy's pending trigger (60 s)"),
    heartbeat: float = typer.Option(1800.0, "--heartbeat", help="The default policy's heartbeat checkpoints (s)"),
    workers: int = typer.Option(0, "--workers", help="Parallel processes (0 = CPU count)"),
    ray: str = typer.Option(None, "--ray", help="Run the sweep as Ray tasks on the cluster at ADDRESS, or on a "
                            "local Ray cluster with 'local' (needs the ray extra); default: local processes"),
    force: bool = typer.Option(False, "--force", help="Replace an existing output folder"),
    json_out: bool = JsonOpt,
) -> None:
    """The trace in time: pods arrive at their creation time and run their own duration; FGD, FGD + gpudefrag,
    FGD + the authors' descheduler, FGD + eviction and the pooled bound on the same arrivals."""
    from ..sim.replay_report import table_markdown, write_replay
    from ..sim.report import staged_folder
    from ..sim.sweep import run_tasks
    from ..sim.timed import ARMS, DEFAULT_TRIGGER_S, ReplaySpec, build, parse_window, run_arm, runs_for

    pols = _split(policies, list(POLICIES), "--policies")
    arm_list = _split(arms, ARMS, "--arms")
    seed_list = parse_seeds(seeds)
    try:
        loads = [float(x) for x in load.split(",") if x.strip()]
    except ValueError:
        raise InputError("--load", "", f"expected shares such as 0.9 or 0.8,0.9, got {load!r}") from None
    if not loads or not all(0 <= x < float("inf") for x in loads):
        raise InputError("--load", "", f"expected shares >= 0 (0: the trace's own timeline), got {load!r}")
    trigger = DEFAULT_TRIGGER_S if trigger is None else trigger
    _non_negative(("--trigger", trigger), ("--workers", workers))
    if not heartbeat > 0:
        raise InputError("--heartbeat", "", f"must be > 0, got {heartbeat}")
    parse_window(window)
    _check_out(out, force)
    if policy is not None:
        from ..policy.loader import load_policy

        load_policy(policy)
    specs = [ReplaySpec(str(nodes), str(p), x, s, window, str(times_from or "")) for p in pods for x in loads
             for s in seed_list]
    for sp in {(s.pods, s.load): s for s in specs}.values():
        build(sp)  # every input checked here, before any worker or folder exists
    runs = runs_for(specs, pols, arm_list, trigger, str(policy or ""), heartbeat)
    with _progress() as prog:
        task = prog.add_task("replays", total=len(runs))
        results = run_tasks(run_arm, runs, workers=workers or None, ray=ray or None,
                            on_done=lambda r, res: prog.advance(task))
    meta = {"nodes": str(nodes), "pods": ", ".join(str(p) for p in pods), "loads": loads, "seeds": seed_list,
            "placement": ",".join(pols), "arms": ",".join(arm_list), "trigger_s": trigger,
            "gpudefrag policy": str(policy) if policy else f"default (pending > {trigger:g} s, heartbeat "
                                                             f"{heartbeat:g} s)",
            "window": window or "the whole trace", "runs on": f"Ray ({ray})" if ray else "local processes"}
    with staged_folder(out) as tmp:
        summary = write_replay(tmp, results, meta)
    if json_out:
        keep = ("p50_wait_s", "p95_wait_s", "p99_wait_s", "gap_closed_p95_multi", "moves_per_placed_pod",
                "gib_moved", "gib_moved_per_placed_pod", "gpu_hours_total", "gpu_hours_moving", "gpu_hours_lost",
                "never_started", "evictions", "mean_allocation", "seeds")

        def arms_of(g: dict) -> dict:  # type: ignore[type-arg]
            return {k: {f: v.get(f) for f in keep} for k, v in g["arms"].items()}

        if len(summary) == 1:
            emit_json(_clean({"arms": arms_of(summary[0])}))
        else:
            emit_json(_clean({"sweep": [{"pods": g["pods"], "load": g["load"], "window": g["window"],
                                         "arms": arms_of(g)} for g in summary]}))
        return
    for g in summary:
        console.print(f"[bold]{escape(Path(str(g['pods'])).name)}[/bold], load {g['load']}: times "
                      f"{escape(str(g['times']))}")
        console.print(table_markdown(g["arms"]), markup=False)
    console.print(f"wrote {escape(str(out))}/report.md")


@sim_app.command("tradeoff")
def tradeoff_cmd(
    nodes: Path = typer.Option(..., "--nodes", help="Node list CSV"),
    pods: Path = typer.Option(..., "--pods", help="Pod list CSV"),
    out: Path = typer.Option(..., "--out", help="Report folder to create"),
    prices: str = typer.Option("0,400,250,150,100", "--prices", help="Move prices to compare, GiB of checkpoints "
                               "per GPU placed (0 = free)"),
    seeds: str = typer.Option("42", "--seeds"),
    tune: float = typer.Option(1.3, "--tune"),
    max_moves: int = typer.Option(16, "--max-moves", help="Moves per rescued pod at most"),
    move_budget: float = typer.Option(0.1, "--move-budget", help="Moves per placed pod the whole run may make"),
    gib_budget: float = typer.Option(0.0, "--gib-budget", help="GiB the whole run may write, every price (0 = no "
                                     "cap)"),
    time_limit: float = typer.Option(10.0, "--time-limit", help="Seconds of column generation for the bound"),
    workers: int = typer.Option(0, "--workers", help="Parallel processes (0 = CPU count)"),
    force: bool = typer.Option(False, "--force", help="Replace an existing output folder"),
    json_out: bool = JsonOpt,
) -> None:
    """FGD + repack at several move prices: unallocated %, the share of the FGD → bound gap, GiB and moves."""
    from ..sim.experiments import run_many, static_runs, tighter_bound
    from ..sim.report import TRADEOFF_COLUMNS, staged_folder, tradeoff_cells, tradeoff_summary, write_tradeoff
    from ..sim.trace import load_trace

    try:
        price_list = sorted({float(x) for x in prices.split(",") if x.strip()})
    except ValueError:
        raise InputError("--prices", "", f"expected GiB per GPU such as 0,150,400, got {prices!r}") from None
    if not price_list or not all(0 <= x < float("inf") for x in price_list):
        raise InputError("--prices", "", f"expected numbers >= 0, got {prices!r}")
    _non_negative(("--gib-budget", gib_budget), ("--move-budget", move_budget), ("--tune", tune))
    seed_list = parse_seeds(seeds)
    _check_out(out, force)
    trace = load_trace(nodes, pods)
    runs = static_runs(str(nodes), str(pods), ["fgd"], seed_list, tune)
    for g in price_list:
        runs += static_runs(str(nodes), str(pods), ["fgd"], seed_list, tune, ["repack"], max_moves,
                            gib_per_gpu=g, move_budget=move_budget, gib_budget=gib_budget)
    with _progress() as prog:
        task = prog.add_task("replays", total=len(runs))
        results = run_many(runs, workers or None, on_done=lambda r, res: prog.advance(task))
    n = len(seed_list)
    plain, priced = results[:n], {g: results[n * (i + 1):n * (i + 2)] for i, g in enumerate(price_list)}
    rows = tradeoff_summary(plain, priced, tighter_bound(trace, seed_list, tune, time_limit))
    meta = {"nodes": str(nodes), "pods": str(pods), "seeds": seed_list, "tune": tune,
            "moves": f"≤ {max_moves} per rescued pod, ≤ {move_budget} per placed pod over the run",
            "GiB cap per run": gib_budget or "none",
            "bound": "sim/bound_resource.py (per-node CPU, memory, GPU models; never below the arc-flow bound)"}
    with staged_folder(out) as tmp:
        write_tradeoff(tmp, rows, meta)
    if json_out:
        emit_json(_clean({"out": str(out), "rows": rows}))
        return
    t = Table(*TRADEOFF_COLUMNS, title=f"FGD + repack by move price (FGD {rows[0]['fgd_100']:.2f} %, "
                                         f"bound {rows[0]['lower_bound_100']:.2f} %)")
    for r in rows:
        t.add_row(*tradeoff_cells(r))
    console.print(t)
    console.print(f"wrote {escape(str(out))}/report.md and tradeoff.png")


@sim_app.command("bound")
def bound_cmd(
    nodes: Path = typer.Option(..., "--nodes", help="Node list CSV"),
    pods: Path = typer.Option(..., "--pods", help="Pod list CSV"),
    seeds: str = typer.Option("42-51", "--seeds"),
    tune: float = typer.Option(1.3, "--tune"),
    arrived: float = typer.Option(100.0, "--arrived", help="Arrived workload, % of GPU capacity"),
    kind: str = typer.Option("both", "--kind", help="arcflow (GPUs only), resource (per-node CPU, memory, "
                             "GPU models), both (the two bounds), packing (a real placement: the limit's other "
                             "side) or a comma list"),
    time_limit: float = typer.Option(30.0, "--time-limit", help="Seconds of column generation per seed "
                                     "(resource bound; it stays valid when stopped)"),
    pack_rounds: int = typer.Option(200, "--pack-rounds", help="Search rounds of the offline packing (about "
                                    "2 s each on the Alibaba cluster)"),
    json_out: bool = JsonOpt,
) -> None:
    """Lower bounds on unallocated GPU % for the pods arrived by `--arrived` %, a BFD reference, and (with
    `--kind packing`) an offline packing that exists: the true limit lies between the bounds and it."""
    from ..sim.bound import arrived_prefix, best_fit_decreasing, lower_bound
    from ..sim.bound_resource import node_types, resource_bound
    from ..sim.offline_pack import offline_packing
    from ..sim.replay import build_workload
    from ..sim.trace import load_trace

    _non_negative(("--pack-rounds", pack_rounds))
    names = ("arcflow", "resource", "packing")
    kinds = tuple(k for k in names if k in _split(kind.replace("both", "arcflow,resource"), names, "--kind"))
    trace = load_trace(nodes, pods)
    cl = trace.cluster()
    types = node_types(cl)
    all_pods = [p.pod for p in trace.pods]
    rows = []
    for s in parse_seeds(seeds):
        pre = arrived_prefix(build_workload(all_pods, cl.capacity_milli, s, tune), cl.capacity_milli, arrived)
        row: dict[str, object] = {"seed": s}
        if "arcflow" in kinds:
            b = lower_bound(pre, int(cl.gpu_count.sum()))
            row |= {**b.as_dict(), "bfd_unallocated_pct": best_fit_decreasing(pre, b.gpus)}
        if "resource" in kinds:
            row |= resource_bound(pre, types, time_limit_s=time_limit).as_dict()
        if "packing" in kinds:
            row |= offline_packing(cl, pre, seed=s, rounds=pack_rounds).as_dict()
        rows.append(row)
    if json_out:
        emit_json(_clean(rows))
        return
    t = Table("seed")
    if "arcflow" in kinds:
        for col in ("arc-flow bound %", "LP %", "BFD %", "ideal %", "optimal"):
            t.add_column(col)
    if "resource" in kinds:
        for col in ("resource bound %", "pooled LP %", "BFD/CG packing %", "s"):
            t.add_column(col)
    if "packing" in kinds:
        for col in ("offline packing %", "from (FGD + repack) %", "rounds improved", "s"):
            t.add_column(col)
    for r in rows:
        cells = [str(r["seed"])]
        if "arcflow" in kinds:
            lp = 100 * (1 - float(r["lp_alloc_gpus"]) / int(r["gpus"]))  # type: ignore[arg-type]
            cells += [f"{r['lower_bound_unallocated_pct']:.2f}", f"{lp:.2f}", f"{r['bfd_unallocated_pct']:.2f}",
                      f"{r['ideal_unallocated_pct']:.2f}", str(r["optimal"])]
        if "resource" in kinds:
            pooled = 100 * (1 - float(r["pooled_lp_alloc_gpus"]) / int(r["gpus"]))  # type: ignore[arg-type]
            cells += [f"{r['resource_lower_bound_unallocated_pct']:.2f}", f"{pooled:.2f}",
                      f"{r['offline_packing_unallocated_pct']:.2f}", f"{r['resource_seconds']:.0f}"]
        if "packing" in kinds:
            cells += [f"{r['packing_unallocated_pct']:.2f}", f"{r['packing_start_pct']:.2f}",
                      f"{r['packing_improved']}/{r['packing_rounds']}", f"{r['packing_seconds']:.0f}"]
        t.add_row(*cells)
    console.print(t)
