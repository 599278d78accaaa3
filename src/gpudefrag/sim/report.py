"""Reports: CSV results, PNG plots (matplotlib, Agg) and a one-page Markdown report, into a folder.

Everything is written into a fresh temporary folder beside the target and renamed into place at the end, so a
failure leaves no half-written report folder behind.
"""

from __future__ import annotations

import csv
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .bound import BoundResult
from .dynamic import DynamicResult
from .replay import CURVE_MAX, ReplayResult, percentile_curve

POINTS = (75, 80, 90, 95, 100, 110, 120, 130)


@contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """Yield a temporary folder; on success it becomes `out` (which must not exist), on error it vanishes."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        os.replace(tmp, out) if not out.exists() else _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace_dir(tmp: Path, out: Path) -> None:
    old = out.parent / f".{out.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def pyplot():  # type: ignore[no-untyped-def]
    """matplotlib's pyplot on the file-only Agg backend (loaded when a figure is drawn; shared by the reports)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _fmt(x: float) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


# ---------------------------------------------------------------------------------------------- static
def move_medians(rs: Sequence[ReplayResult]) -> dict[str, float]:
    """Medians over the runs of what moving cost: per placed pod and in GiB, over the whole run and up to the end
    of the 100 % arrived point (the moves that shaped the headline number), evictions, multi-GPU failures."""
    def med(f: Callable[[ReplayResult], float]) -> float:
        return float(np.median([f(r) for r in rs]))

    return {
        "moves_per_placed_pod": med(lambda r: r.moves_per_placed_pod()),
        "moves_per_placed_pod_at_100": med(lambda r: r.moves_per_placed_pod(True)),
        "moved_gib_at_100": med(lambda r: r.moves_at_100.moved_bytes) / 2**30,
        "evictions": med(lambda r: r.stats.evictions),
        "evicted_lost": med(lambda r: r.stats.evicted_lost),
        "moved_gib": med(lambda r: r.stats.moved_bytes) / 2**30,
        "multi_gpu_failed_clearable": med(lambda r: r.stats.multi_gpu_failed_clearable),
        "multi_gpu_failed_over_budget": med(lambda r: r.stats.multi_gpu_failed_over_budget),
    }


def share_of_gap(base: float, x: float, bound: float) -> float:
    """The share of the gap between `base` (e.g. FGD's unallocated %) and the lower `bound` that `x` closes."""
    return (base - x) / (base - bound) if base > bound else float("nan")


def max_abs_diff(ours: np.ndarray, theirs: np.ndarray, lo: int = 75, hi: int = CURVE_MAX) -> float:
    """The largest |ours − theirs| over the study's 75–130 % arrived (the acceptance's curve check); NaN when
    no point there has both (a pod list too short to reach 75 %)."""
    d = np.abs(ours[lo:hi + 1] - theirs[lo:hi + 1])
    d = d[~np.isnan(d)]
    return float(d.max()) if d.size else float("nan")


def static_summary(results: Sequence[ReplayResult], authors: Mapping[str, np.ndarray],
                   bounds: Sequence[BoundResult], paper: Mapping[str, float] | None = None) -> list[dict[str, object]]:
    """One row per policy: median unallocated % at the study's points, the authors' value at 100 for the
    workload that ran (`authors`, `paper`: empty when they published none for it), moves."""
    rows = []
    by: dict[str, list[ReplayResult]] = {}
    for r in results:
        by.setdefault(r.policy, []).append(r)
    for pol, rs in by.items():
        curves = np.stack([r.unallocated_curve for r in rs])
        med = percentile_curve(curves)
        base = pol.split("+")[0]
        a = authors.get(base) if "+" not in pol else None
        n100 = [int((r.arrived_pct <= 100.0 + 1e-9).sum()) for r in rs]
        placed100 = [int(r.placed[:k].sum()) for r, k in zip(rs, n100, strict=True)]
        row: dict[str, object] = {"policy": pol, "seeds": len(rs)}
        for k in POINTS:
            row[f"unalloc_{k}"] = float(med[k])
        row["authors_100"] = float(a[100]) if a is not None else float("nan")
        row["paper_100"] = (paper or {}).get(pol, float("nan"))
        row["max_abs_diff_75_130"] = max_abs_diff(med, a) if a is not None else float("nan")
        row["failed_pods_median"] = float(np.median([r.failed for r in rs]))
        row |= move_medians(rs)
        row["placed_at_100_median"] = float(np.median(placed100))
        row["seconds_median"] = float(np.median([r.seconds for r in rs]))
        rows.append(row)
    if bounds:
        lb = float(np.median([b.unallocated_pct for b in bounds]))
        for row in rows:
            row["lower_bound_100"] = lb
    return rows


def write_static(folder: Path, results: Sequence[ReplayResult], authors: Mapping[str, np.ndarray],
                 bounds: Sequence[BoundResult], meta: Mapping[str, object],
                 paper: Mapping[str, float] | None = None) -> list[dict[str, object]]:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "curves.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", "seed", "arrived_pct", "unallocated_pct", "fgd_fragmentation_pct"])
        for r in results:
            for k in range(CURVE_MAX + 1):
                if not math.isnan(r.curve[k]):
                    w.writerow([r.policy, r.seed, k, f"{100 - r.curve[k]:.4f}", f"{r.frag_curve[k]:.4f}"])
    with (folder / "runs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", "seed", "pods", "failed", "unallocated_100", "moves", "evictions", "evicted_lost",
                    "moved_gib", "move_seconds", "multi_gpu_failed_clearable", "seconds", "moves_at_100",
                    "moved_gib_at_100", "multi_gpu_failed_over_budget"])
        for r in results:
            w.writerow([r.policy, r.seed, r.pods, r.failed, f"{r.unallocated_at(100):.4f}", r.stats.moves,
                        r.stats.evictions, r.stats.evicted_lost, f"{r.stats.moved_bytes / 2**30:.2f}",
                        f"{r.stats.move_seconds:.1f}", r.stats.multi_gpu_failed_clearable, f"{r.seconds:.2f}",
                        r.moves_at_100.moves, f"{r.moves_at_100.moved_bytes / 2**30:.2f}",
                        r.stats.multi_gpu_failed_over_budget])
    if bounds:
        with (folder / "bound.csv").open("w", newline="") as f:
            w = csv.writer(f)
            keys = list(bounds[0].as_dict())
            w.writerow(["seed", *keys])
            for seed, b in zip(meta.get("seeds", []), bounds, strict=False):  # type: ignore[call-overload]
                w.writerow([seed, *b.as_dict().values()])
    summary = static_summary(results, authors, bounds, paper)
    with (folder / "summary.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(summary[0]))
        w.writeheader()
        w.writerows(summary)
    _plot_static(folder, results, authors, bounds)
    _markdown_static(folder, summary, bounds, meta)
    return summary


def _plot_static(folder: Path, results: Sequence[ReplayResult], authors: Mapping[str, np.ndarray],
                 bounds: Sequence[BoundResult]) -> None:
    plt = pyplot()
    x = np.arange(CURVE_MAX + 1)
    fig, ax = plt.subplots(figsize=(8, 5))
    by: dict[str, list[np.ndarray]] = {}
    for r in results:
        by.setdefault(r.policy, []).append(r.unallocated_curve)
    for pol, curves in by.items():
        st = np.stack(curves)
        med = percentile_curve(st)
        (line,) = ax.plot(x[60:], med[60:], label=f"{pol} (median of {len(curves)})")
        if len(curves) > 1:
            ax.fill_between(x[60:], percentile_curve(st, 25)[60:], percentile_curve(st, 75)[60:],
                            color=line.get_color(), alpha=0.15)
        a = authors.get(pol)
        if a is not None:
            ax.plot(x[60:], a[60:], linestyle=":", color=line.get_color(), label=f"{pol} (authors)")
    ax.plot(x[60:], np.maximum(0, 100 - x[60:]), color="black", linestyle="--", label="ideal max(0, 100 − x)")
    if bounds:
        lb = float(np.median([b.unallocated_pct for b in bounds]))
        ax.scatter([100], [lb], marker="*", s=120, color="black", zorder=5, label=f"lower bound at 100 % ({lb:.2f})")
    ax.set_xlabel("arrived workload (% of cluster GPU capacity)")
    ax.set_ylabel("unallocated GPU (%)")
    ax.set_ylim(0, 40)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(folder / "unallocated_vs_arrived.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 4))
    fr: dict[str, list[np.ndarray]] = {}
    for r in results:
        fr.setdefault(r.policy, []).append(r.frag_curve)
    for pol, curves in fr.items():
        ax.plot(x, percentile_curve(curves), label=pol)
    ax.set_xlabel("arrived workload (% of cluster GPU capacity)")
    ax.set_ylabel("FGD fragmentation (% of capacity)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "fragmentation_vs_arrived.png", dpi=120)
    plt.close(fig)


def static_table_markdown(summary: Sequence[Mapping[str, object]]) -> str:
    head = "| policy | " + " | ".join(f"{k} %" for k in POINTS) + " | authors @100 | max Δ 75–130 | moves/pod |"
    sep = "|---|" + "---:|" * (len(POINTS) + 3)
    lines = [head, sep]
    for r in summary:
        cells = [_fmt(float(r[f"unalloc_{k}"])) for k in POINTS]  # type: ignore[arg-type]
        lines.append(f"| {r['policy']} | " + " | ".join(cells) + f" | {_fmt(float(r['authors_100']))} | "  # type: ignore[arg-type]
                     f"{_fmt(float(r['max_abs_diff_75_130']))} | {float(r['moves_per_placed_pod']):.3f} |")  # type: ignore[arg-type]
    return "\n".join(lines)


def _markdown_static(folder: Path, summary: Sequence[Mapping[str, object]], bounds: Sequence[BoundResult],
                     meta: Mapping[str, object]) -> None:
    lines = ["# Static replay (FGD method)", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", "Median unallocated GPU % over seeds, by arrived workload (% of GPU capacity):", "",
              static_table_markdown(summary), ""]
    if bounds:
        lb = np.median([b.unallocated_pct for b in bounds])
        lp = np.median([100 * (1 - b.lp_alloc_milli / (b.gpus * 1000)) for b in bounds])
        lines += [f"Lower bound at 100 % arrived (relaxation: no node boundaries, CPU or GPU models; arc-flow "
                  f"ILP over GPU fill patterns): **{lb:.2f} %** (LP: {lp:.2f} %).", ""]
    lines += ["![unallocated](unallocated_vs_arrived.png)", "", "![fragmentation](fragmentation_vs_arrived.png)", "",
              "Files: `curves.csv` (every run, every percent), `runs.csv`, `summary.csv`, `bound.csv`."]
    (folder / "report.md").write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------------------------- trade-off
def tradeoff_summary(plain: Sequence[ReplayResult], priced: Mapping[float, Sequence[ReplayResult]],
                     bound_pct: float) -> list[dict[str, object]]:
    """One row per move price (GiB per GPU placed; 0 = free): medians over seeds of unallocated % at 100 %,
    the share of the FGD → bound gap it closes, GiB moved, moves and moves per placed pod."""
    fgd = float(np.median([r.unallocated_at(100) for r in plain]))
    rows: list[dict[str, object]] = []
    for price, rs in sorted(priced.items(), key=lambda kv: (kv[0] != 0, -kv[0])):  # free, then dearest first
        u = float(np.median([r.unallocated_at(100) for r in rs]))
        rows.append({
            "gib_per_gpu": price, "seeds": len(rs), "unalloc_100": u, "fgd_100": fgd, "lower_bound_100": bound_pct,
            "gap_closed": share_of_gap(fgd, u, bound_pct), "moves": float(np.median([r.stats.moves for r in rs])),
            **move_medians(rs), "seconds_median": float(np.median([r.seconds for r in rs])),
        })
    return rows


TRADEOFF_COLUMNS = ("GiB per GPU placed", "unallocated @100 %", "share of the FGD → bound gap", "GiB moved", "moves",
                    "moves / placed pod", "GiB by 100 %", "moves / placed pod by 100 %")


def tradeoff_cells(r: Mapping[str, object]) -> list[str]:
    """One trade-off row as the report's and the command's tables print it (TRADEOFF_COLUMNS)."""
    v = {k: float(x) for k, x in r.items() if isinstance(x, (int, float))}
    return [f"{v['gib_per_gpu']:g}", f"{v['unalloc_100']:.2f}", f"{100 * v['gap_closed']:.0f} %",
            f"{v['moved_gib']:,.0f}", f"{v['moves']:.0f}", f"{v['moves_per_placed_pod']:.4f}",
            f"{v['moved_gib_at_100']:,.0f}", f"{v['moves_per_placed_pod_at_100']:.4f}"]


def write_tradeoff(folder: Path, rows: Sequence[Mapping[str, object]], meta: Mapping[str, object]) -> None:
    """`tradeoff.csv`, `tradeoff.png` (unallocated % against GiB moved and against moves per placed pod) and
    `report.md`."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "tradeoff.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    fgd, lb = float(rows[0]["fgd_100"]), float(rows[0]["lower_bound_100"])  # type: ignore[arg-type]
    for ax, key, label in ((axes[0], "moved_gib", "GiB of checkpoints moved per run"),
                           (axes[1], "moves_per_placed_pod", "moves per placed pod")):
        xs = [float(r[key]) for r in rows]  # type: ignore[arg-type]
        ys = [float(r["unalloc_100"]) for r in rows]  # type: ignore[arg-type]
        ax.plot(xs, ys, "o-", color="tab:blue")
        for r, x, y in zip(rows, xs, ys, strict=True):
            name = "free" if not r["gib_per_gpu"] else f"{float(r['gib_per_gpu']):g} GiB/GPU"  # type: ignore[arg-type]
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.axhline(fgd, ls="--", color="tab:red", label=f"FGD, no moves ({fgd:.2f} %)")
        ax.axhline(lb, ls=":", color="black", label=f"lower bound ({lb:.2f} %)")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("unallocated GPU % at 100 % arrived")
    axes[0].legend(fontsize=8)
    fig.suptitle("FGD + repack: GPUs recovered against what the moves cost")
    fig.tight_layout()
    fig.savefig(folder / "tradeoff.png", dpi=120)
    plt.close(fig)
    lines = ["# Move price trade-off (FGD + repack)", ""] + [f"- {k}: {v}" for k, v in meta.items()] + [""]
    lines += ["| " + " | ".join(TRADEOFF_COLUMNS) + " |", "|---:" * len(TRADEOFF_COLUMNS) + "|"]
    lines += ["| " + " | ".join(tradeoff_cells(r)) + " |" for r in rows]
    lines += ["", f"FGD without moves: {fgd:.2f} %; lower bound: {lb:.2f} %. 0 = moves priced at nothing. The run "
              "goes on to 130 % arrived; 'by 100 %' counts the moves made up to the end of the 100 % point, the "
              "only ones that shaped its result.", "",
              "![trade-off](tradeoff.png)", "", "Files: `tradeoff.csv`."]
    (folder / "report.md").write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------------------------- dynamic
def dynamic_summary(results: Sequence[DynamicResult]) -> list[dict[str, object]]:
    rows = []
    for r in results:
        row: dict[str, object] = {"config": r.label, "mean_util": r.mean_util(), "moves": r.moves,
                                  "evictions": r.evictions, "move_gpu_s": r.move_gpu_s, "lost_gpu_s": r.lost_gpu_s,
                                  "moved_or_lost_share": r.moved_share, "moved_gib": r.moved_bytes / 2**30,
                                  "mean_stranded_gpus": float(r.stranded.mean()) if len(r.stranded) else 0.0}
        for c, d in r.delays().items():
            row[f"{c}_mean_s"] = d["mean_s"]
            row[f"{c}_p95_s"] = d["p95_s"]
        rows.append(row)
    return rows


def gap_closed(results: Sequence[DynamicResult], cls: str = "8-gpu") -> float | None:
    """Share of the FGD → pooled gap in p95 delay of `cls` jobs that FGD+migrate closes."""
    d = {r.label: r.delays().get(cls, {}).get("p95_s", float("nan")) for r in results}
    f, m, p = d.get("fgd"), d.get("fgd+migrate"), d.get("pooled")
    if f is None or m is None or p is None or not f > p:
        return None
    return (f - m) / (f - p)


def write_dynamic(folder: Path, results: Sequence[DynamicResult],
                  meta: Mapping[str, object]) -> list[dict[str, object]]:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "jobs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "job", "size_class", "gpus", "submit_s", "waited_s", "end_s"])
        for r in results:
            for i in range(len(r.size_class)):
                w.writerow([r.label, i, r.size_class[i], r.gpu_equiv[i], f"{r.submit[i]:.1f}",
                            f"{r.waited[i]:.1f}", f"{r.end[i]:.1f}"])
    with (folder / "timeseries.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "time_s", "utilisation", "stranded_gpus"])
        for r in results:
            step = max(1, len(r.times) // 2000)
            for t, u, s in zip(r.times[::step], r.util[::step], r.stranded[::step], strict=True):
                w.writerow([r.label, f"{t:.1f}", f"{u:.4f}", f"{s:.0f}"])
    summary = dynamic_summary(results)
    keys: list[str] = []
    for row in summary:
        keys += [k for k in row if k not in keys]
    with (folder / "summary.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(summary)
    _plot_dynamic(folder, results)
    gc = gap_closed(results)
    lines = ["# Dynamic simulation", "", *(f"- {k}: {v}" for k, v in meta.items()), "",
             dynamic_table_markdown(results), ""]
    if gc is not None:
        lines += [f"FGD+migrate closes **{100 * gc:.0f} %** of the gap in 8-GPU p95 queueing delay between FGD "
                  "and the pooled bound.", ""]
    lines += ["![delay](delay_by_size.png)", "", "![utilisation](utilisation.png)", "", "![stranded](stranded.png)", "",
              "Files: `jobs.csv`, `timeseries.csv`, `summary.csv`."]
    (folder / "report.md").write_text("\n".join(lines) + "\n")
    return summary


def dynamic_table_markdown(results: Sequence[DynamicResult]) -> str:
    classes: list[str] = []
    for r in results:
        classes += [c for c in r.delays() if c not in classes]
    head = "| config | " + " | ".join(f"{c} mean / p95 (s)" for c in classes) + \
        " | util | moves | evictions | GPU-s moving or lost |"
    lines = [head, "|---|" + "---:|" * (len(classes) + 4)]
    for r in results:
        d = r.delays()
        cells = [f"{d[c]['mean_s']:.0f} / {d[c]['p95_s']:.0f}" if c in d else "—" for c in classes]
        lines.append(f"| {r.label} | " + " | ".join(cells) +
                     f" | {r.mean_util():.3f} | {r.moves} | {r.evictions} | {100 * r.moved_share:.2f} % |")
    return "\n".join(lines)


def _plot_dynamic(folder: Path, results: Sequence[DynamicResult]) -> None:
    plt = pyplot()
    classes: list[str] = []
    for r in results:
        classes += [c for c in r.delays() if c not in classes]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(len(results), 1)
    for i, r in enumerate(results):
        d = r.delays()
        ax.bar(np.arange(len(classes)) + i * width, [d.get(c, {}).get("p95_s", 0) / 60 for c in classes],
               width, label=r.label)
    ax.set_xticks(np.arange(len(classes)) + 0.4 - width / 2, classes)
    ax.set_ylabel("p95 queueing delay (min)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(folder / "delay_by_size.png", dpi=120)
    plt.close(fig)
    for name, attr, ylabel in (("utilisation", "util", "GPU utilisation"),
                               ("stranded", "stranded", "wholly free GPUs the head job cannot use")):
        fig, ax = plt.subplots(figsize=(8, 3.5))
        for r in results:
            ax.plot(r.times / 3600, getattr(r, attr), label=r.label, linewidth=0.7)
        ax.set_xlabel("time (h)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(folder / f"{name}.png", dpi=120)
        plt.close(fig)
