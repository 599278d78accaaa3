"""A training script using the application-hook SDK: resumes (printing what it resumed from), then steps,
calling safe_point each step; every step appends `step=N` to --log."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from gpudefrag.job import Job


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--period", type=float, default=0.05)
    ap.add_argument("--every", type=float, default=None)
    ap.add_argument("--state-mb", type=int, default=0)
    a = ap.parse_args()
    state = {"step": 0}

    def save(d: Path) -> None:
        (d / "state").write_text(str(state["step"]))
        if a.state_mb:
            (d / "blob").write_bytes(os.urandom(a.state_mb << 20))

    def load(d: Path) -> None:
        state["step"] = int((d / "state").read_text())

    job = Job(save=save, load=load, every_s=a.every)
    meta = job.resume()
    with open(a.log, "a") as f:
        f.write(f"RESUMED {meta['step'] if meta else None}\n")
    while state["step"] < a.steps:
        time.sleep(a.period)
        state["step"] += 1
        job.safe_point(state["step"])
        with open(a.log, "a") as f:
            f.write(f"step={state['step']} err={job.last_error or ''}\n")


if __name__ == "__main__":
    main()
