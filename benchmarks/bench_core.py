"""Core: parse + `frag` and parse + `diagnose` on a 10,000-node / 80,000-GPU snapshot with ~50,000 jobs.

Target (issue 2): under 2 s each on the 2-core machine, parse included. Baseline in the same run: parsing
alone (json.loads of the same file), so the ratio shows what validation and analysis add.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from common import Row
from gen_cluster import big_cluster_doc
from gpudefrag.core.diagnose import diagnose_all
from gpudefrag.core.fragmentation import frag_report
from gpudefrag.core.model import Request
from gpudefrag.snapshot import load_snapshot


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def run(quick: bool = False) -> list[Row]:
    nodes, jobs = (2_000, 10_000) if quick else (10_000, 50_000)
    doc = big_cluster_doc(nodes=nodes, target_jobs=jobs)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "big.json"
        path.write_text(json.dumps(doc))
        size_mb = path.stat().st_size / 1e6
        repeat = 1 if quick else 3
        t_json = _best(lambda: json.loads(path.read_text()), repeat)
        t_load = _best(lambda: load_snapshot(path), repeat)
        t_frag = _best(lambda: frag_report(load_snapshot(path), Request(8)), repeat)
        t_diag = _best(lambda: diagnose_all(load_snapshot(path)), repeat)
        state = load_snapshot(path)
        n_jobs, n_pending = len(state.running), len(state.pending)
    label = f"{nodes} nodes, {nodes * 8} GPUs, {n_jobs} jobs, {n_pending} pending, {size_mb:.0f} MB"
    return [
        Row("core", f"parse+validate ({label})", t_load, "s", baseline=f"json.loads alone {t_json:.2f} s"),
        Row("core", "parse + frag", t_frag, "s", "< 2 s", t_frag < 2.0),
        Row("core", f"parse + diagnose all {n_pending} pending", t_diag, "s", "< 2 s", t_diag < 2.0),
    ]
