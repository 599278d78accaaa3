"""The report of `simulate replay`: a table, CSVs and plots (CDF of waits by size, allocation over time)."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .report import pyplot
from .timed import SIZE_CLASSES, ArmResult, combine

COLUMNS = ("p50 / p95 / p99 wait (s) by GPU count", "gap closed (p95 multi)", "moves / placed pod",
           "GiB / placed pod", "GPU-h moving", "GPU-h lost", "never started")


def _s(x: object) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "–"
    if isinstance(x, float):
        return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"
    return str(x)


def groups(results: Sequence[ArmResult]) -> dict[tuple[str, float, str], list[ArmResult]]:
    """The results by (pod list, load, window): each group is one comparison of arms on the same arrivals."""
    out: dict[tuple[str, float, str], list[ArmResult]] = {}
    for r in results:
        s = r.run.spec
        out.setdefault((s.pods, s.load, s.window), []).append(r)
    return out


def table_markdown(summary: Mapping[str, Mapping[str, object]]) -> str:
    lines = ["| arm | " + " | ".join(f"wait p50/p95/p99 {c}" for c in SIZE_CLASSES)
             + " | gap closed (p95, multi-GPU) | moves / placed pod | GiB moved | GPU-h moving | GPU-h lost "
             "| GPU-h total | never started |",
             "|---|" + "---:|" * (len(SIZE_CLASSES) + 7)]
    for label, row in summary.items():
        waits = [" / ".join(_s(row.get(f"p{q}_wait_s_{c}")) for q in (50, 95, 99)) for c in SIZE_CLASSES]
        gc = row.get("gap_closed_p95_multi")
        lines.append(f"| {label} | " + " | ".join(waits)
                     + f" | {'–' if gc is None else f'{100 * float(gc):.0f} %'}"  # type: ignore[arg-type]
                     + f" | {float(row['moves_per_placed_pod']):.4f} | {_s(row['gib_moved'])}"  # type: ignore[arg-type]
                     + f" | {_s(row['gpu_hours_moving'])} | {_s(row['gpu_hours_lost'])}"
                     + f" | {_s(row['gpu_hours_total'])} | {_s(row['never_started'])} |")
    return "\n".join(lines)


def write_replay(folder: Path, results: Sequence[ArmResult], meta: Mapping[str, object]) -> list[dict[str, object]]:
    """runs.csv (per run), summary.csv (medians over seeds), waits.csv (per pod and run),
    allocation.csv, waits_cdf*.png, allocation*.png, report.md; returns one summary per group."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "runs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        keys = list(results[0].metrics)
        w.writerow(["pods", "load", "window", "arm", "seed", *keys])
        for r in results:
            s = r.run.spec
            w.writerow([s.pods, s.load, s.window, r.run.label, s.seed, *(r.metrics[k] for k in keys)])
    with (folder / "waits.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["pods", "load", "arm", "seed", "job", "size_class", "wait_s", "never_started"])
        for r in results:
            s = r.run.spec
            for i in range(len(r.wait)):
                w.writerow([Path(s.pods).name, s.load, r.run.label, s.seed, i, r.size_class[i], f"{r.wait[i]:.1f}",
                            int(r.never_started[i])])
    with (folder / "allocation.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["pods", "load", "arm", "seed", "time_s", "allocation"])
        for r in results:
            s = r.run.spec
            for t, a in zip(r.times, r.alloc, strict=True):
                w.writerow([Path(s.pods).name, s.load, r.run.label, s.seed, f"{t:.1f}", f"{a:.4f}"])
    out: list[dict[str, object]] = []
    lines = ["# Trace replay in time", "", *(f"- {k}: {v}" for k, v in meta.items()), ""]
    with (folder / "summary.csv").open("w", newline="") as f:
        w = csv.writer(f)
        header_done = False
        for n, ((pods, load, window), rs) in enumerate(groups(results).items()):
            summary = combine(rs)
            first = rs[0]
            tag = "" if n == 0 else f"_{n}"
            _plot(folder, rs, tag)
            out.append({"pods": pods, "load": load, "window": window, "arms": summary,
                        "times": first.times_source, "load_factor": first.load_factor})
            lines += [f"## {Path(pods).name}, load {load}" + (f", window {window}" if window else ""), "",
                      f"- times: {first.times_source}",
                      f"- arrivals scaled by 1/{first.load_factor:,.1f} (peak offered load "
                      f"{first.peak_load:.3f} of the GPUs); medians over seeds "
                      f"{sorted({r.run.spec.seed for r in rs})}", "",
                      table_markdown(summary), "",
                      f"![CDF of waits by size](waits_cdf{tag}.png)", "", f"![allocation](allocation{tag}.png)", ""]
            for label, row in summary.items():
                flat = {k: v for k, v in row.items() if not isinstance(v, dict | list)}
                if not header_done:
                    w.writerow(["pods", "load", "window", "label", *flat])
                    header_done = True
                w.writerow([pods, load, window, label, *flat.values()])
    lines += ["Waits: seconds queued in all (an evicted pod's second wait included); a pod that never started "
              "counts with its wait until the end of the replay. Gap closed: each seed's (FGD − arm) / "
              "(FGD − pooled) in the p95 wait of the pods of 2 or more GPUs, median over seeds.", "",
              "Files: `summary.csv`, `runs.csv`, `waits.csv`, `allocation.csv`."]
    (folder / "report.md").write_text("\n".join(lines) + "\n")
    return out


def _plot(folder: Path, rs: Sequence[ArmResult], tag: str) -> None:
    plt = pyplot()
    seed = min(r.run.spec.seed for r in rs)
    one = [r for r in rs if r.run.spec.seed == seed]
    fig, axes = plt.subplots(1, len(SIZE_CLASSES), figsize=(4 * len(SIZE_CLASSES), 3.6), sharey=True)
    for ax, c in zip(axes, SIZE_CLASSES, strict=True):
        for r in one:
            w = np.sort(r.wait[r.size_class == c])
            if len(w):
                ax.step(np.maximum(w, 1.0), np.arange(1, len(w) + 1) / len(w), where="post", label=r.run.label)
        ax.set_xscale("log")
        ax.set_title(f"{c} GPU" if c != "fractional" else "fractional GPU")
        ax.set_xlabel("wait (s, 1 = none)")
    axes[0].set_ylabel("share of pods")
    for ax in axes:  # the legend on the first panel that has pods
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
            break
    fig.suptitle(f"waits by pod size (seed {seed})")
    fig.tight_layout()
    fig.savefig(folder / f"waits_cdf{tag}.png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for r in one:
        ax.plot(r.times, 100 * r.alloc, label=r.run.label, lw=1)
    # the arrivals of a compressed trace take minutes and its long pods end over months: a log axis shows both
    ax.set_xscale("symlog", linthresh=60)
    ax.set_xlabel("time since the first arrival (s; linear to 60 s, logarithmic after)")
    ax.set_ylabel("GPUs allocated (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / f"allocation{tag}.png", dpi=110)
    plt.close(fig)
