"""Checkpoint/restore with real CRIU: dump and restore time and GB/s beside `dd` of the same bytes to the same
place, image size vs RSS, and the job's downtime with page-server + lazy restore vs a plain dump-copy-restore.

Sizes: 0.1 and 1 GiB (`--quick`), plus 4 GiB otherwise. Places: local disk (/var/tmp, page cache: neither dd
nor CRIU syncs) and tmpfs (/dev/shm). Every restore is verified (steps continue, buffer SHA-256 unchanged);
a row whose restore did not verify says FAIL in its note. Downtime is what the job itself saw: the largest
gap between two consecutive steps in its log.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import Row
from gpudefrag.checkpoint import probe_job
from gpudefrag.checkpoint.criu import CriuBackend, PageServer, du_bytes
from gpudefrag.checkpoint.launch import spawn_job
from gpudefrag.checkpoint.protocol import CheckpointError
from gpudefrag.checkpoint.store import sha256_file

AREA = "checkpoint"
PLACES = {"disk": Path("/var/tmp/gpudefrag-bench"), "tmpfs": Path("/dev/shm/gpudefrag-bench")}


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _dd(src: str, dst: str, nbytes: int) -> float:
    mib = max(1, nbytes >> 20)
    t0 = time.perf_counter()
    subprocess.run(["dd", f"if={src}", f"of={dst}", "bs=1M", f"count={mib}", "status=none"], check=True)
    return time.perf_counter() - t0


class Probe:
    """One probe job in its own PID namespace (so restores never need its old PID)."""

    def __init__(self, work: Path, mb: int):
        self.log = work / f"probe-{mb}.log"
        self.log.unlink(missing_ok=True)
        self.job = spawn_job([sys.executable, "-m", "gpudefrag.checkpoint.probe_job", "--log", str(self.log),
                              "--mb", str(mb)], stdout=work / f"probe-{mb}.out", pidns=True)
        self.pids = [self.job.pid]
        probe_job.wait_step(self.log, 2, timeout=600)
        self.sha = probe_job.request_checksum(self.log, self.job.pid, timeout=120)

    def verify_and_stop(self, pid: int) -> tuple[bool, float]:
        self.pids.append(pid)
        at = probe_job.last_step(self.log)
        probe_job.wait_step(self.log, at + 2, timeout=120)
        same = probe_job.request_checksum(self.log, pid, timeout=120) == self.sha
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while "EXIT" not in self.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        rep = probe_job.check_log(self.log)
        return same and rep.ok, rep.largest_gap_s

    def kill(self) -> None:
        """Kill what is left, but only our own probes (a PID that exited may have been reused)."""
        for p in self.pids:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                if str(self.log).encode() in Path(f"/proc/{p}/cmdline").read_bytes():
                    os.kill(p, signal.SIGKILL)
        self.job.reap(timeout=5)


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def _size_rows(be: CriuBackend, mb: int, place: str, root: Path, repeats: int) -> list[Row]:
    """`repeats` dump/restore cycles of one job, each beside a dd write and read of the same bytes, interleaved
    so that load from other users of the machine hits both alike; medians are reported."""
    work = Path(tempfile.mkdtemp(prefix=f"{mb}-", dir=root))
    probe = Probe(work, mb)
    rows: list[Row] = []
    dumps, frozen, restores, dd_ws, dd_rs, hashes = [], [], [], [], [], []
    ok, size, rss, pid = True, 0, 0, probe.job.pid
    try:
        rss = _rss_bytes(pid)
        for i in range(repeats):
            img = work / f"img{i}"
            img.mkdir()
            res = be.checkpoint(pid, img)
            if i == 0:
                probe.job.reap()
            size = du_bytes(img)
            t0 = time.perf_counter()
            for f in img.rglob("*"):
                if f.is_file():
                    sha256_file(f)
            hashes.append(time.perf_counter() - t0)
            dd_ws.append(_dd("/dev/zero", str(work / "dd.bin"), size))
            t0 = time.perf_counter()
            rr = be.restore(img, info=res.extra)
            restores.append(time.perf_counter() - t0)
            dd_rs.append(_dd(str(work / "dd.bin"), "/dev/null", size))
            dumps.append(res.duration_s)
            frozen.append(res.frozen_s or 0.0)
            pid = rr.pid
            probe.pids.append(pid)
            probe_job.wait_step(probe.log, probe_job.last_step(probe.log) + 1, timeout=120)
            shutil.rmtree(img)
        ok, _ = probe.verify_and_stop(pid)
    finally:
        probe.kill()
        shutil.rmtree(work, ignore_errors=True)
    gb = size / 1e9
    tag = f"{mb} MiB {place}"
    note = ("" if ok else "FAIL: restore did not verify; ") + f"image {size / 2**20:.0f} MiB, median of {repeats}"
    dump_s, rest_s, dd_w, dd_r = _median(dumps), _median(restores), _median(dd_ws), _median(dd_rs)
    dump_gbps, dd_w_gbps = gb / dump_s, gb / dd_w
    rest_gbps, dd_r_gbps = gb / rest_s, gb / dd_r
    rows += [
        Row(AREA, f"dump {tag}", dump_s, "s", note=f"frozen {_median(frozen):.3f} s; {note}"),
        Row(AREA, f"dump GB/s {tag}", dump_gbps, "GB/s", baseline=f"dd write {dd_w_gbps:.2f} GB/s"),
        Row(AREA, f"dump/dd {tag}", dump_gbps / dd_w_gbps, "ratio", ">= 0.5", dump_gbps / dd_w_gbps >= 0.5,
            baseline="dd if=/dev/zero bs=1M, same bytes, same place"),
        Row(AREA, f"restore {tag}", rest_s, "s", note=note),
        Row(AREA, f"restore GB/s {tag}", rest_gbps, "GB/s", baseline=f"dd read {dd_r_gbps:.2f} GB/s"),
        Row(AREA, f"restore/dd {tag}", rest_gbps / dd_w_gbps, "ratio", ">= 0.5", rest_gbps / dd_w_gbps >= 0.5,
            baseline="dd if=/dev/zero bs=1M, same bytes, same place (the issue's baseline)"),
        Row(AREA, f"restore/dd-read {tag}", rest_gbps / dd_r_gbps, "ratio",
            baseline="dd of=/dev/null of a same-size file (page cache), same place",
            note="stricter: a restore also allocates and fills every page; dd to /dev/null does not"),
        Row(AREA, f"image/RSS {tag}", size / rss, "ratio", note=f"RSS {rss / 2**20:.0f} MiB"),
        Row(AREA, f"verify SHA-256 {tag}", _median(hashes), "s", note=f"{gb / _median(hashes):.2f} GB/s; the store "
            "hashes every image at commit and again before a restore"),
    ]
    return rows


def move_downtime(be: CriuBackend, mb: int, how: str, root: Path) -> tuple[bool, float]:
    """One CRIU move of a probe job holding `mb` MiB, under `root`: (its restore verified, the job's largest step
    gap). Plain: dump to the source node's folder, copy to the target's, restore. `pageserver+lazy`: the dump
    streams its pages to the target's page server and the target restores lazily."""
    work = Path(tempfile.mkdtemp(prefix=f"down-{mb}-", dir=root))
    probe = Probe(work, mb)
    try:
        src, dst = work / "src", work / "dst"
        src.mkdir()
        dst.mkdir()
        if how == "plain":
            res = be.checkpoint(probe.job.pid, src)
            probe.job.reap()
            for f in src.iterdir():
                shutil.copyfile(f, dst / f.name)  # the transfer
            rr = be.restore(dst, info=res.extra)
        else:
            with PageServer(dst, criu_bin=be.criu_bin) as ps:
                res = be.checkpoint(probe.job.pid, src, page_server=ps.addr)
                ps.wait(timeout=600)
            probe.job.reap()
            for f in src.iterdir():
                shutil.move(str(f), dst / f.name)
            rr = be.restore(dst, info=res.extra, lazy=True)
        return probe.verify_and_stop(rr.pid)
    finally:
        probe.kill()
        shutil.rmtree(work, ignore_errors=True)


def _downtime_rows(be: CriuBackend, mb: int) -> list[Row]:
    """Plain dump-copy-restore against page-server + lazy restore, both on tmpfs here (one machine)."""
    gaps: dict[str, float] = {}
    oks: dict[str, bool] = {}
    for how in ("plain", "pageserver+lazy"):
        oks[how], gaps[how] = move_downtime(be, mb, how, PLACES["tmpfs"])
    ratio = gaps["pageserver+lazy"] / gaps["plain"]
    fail = "" if all(oks.values()) else "FAIL: a restore did not verify; "
    return [
        Row(AREA, f"downtime plain dump-copy-restore {mb} MiB", gaps["plain"], "s", note=fail),
        Row(AREA, f"downtime page-server+lazy {mb} MiB", gaps["pageserver+lazy"], "s", note=fail),
        Row(AREA, f"downtime lazy/plain {mb} MiB", ratio, "ratio", "<= 0.6", ratio <= 0.6,
            baseline="job's largest step gap, same size"),
    ]


def run(quick: bool) -> list[Row]:
    try:
        be = CriuBackend(log_dir=Path(tempfile.gettempdir()) / "gpudefrag-bench-logs")
        be.check()
    except CheckpointError as e:
        return [Row(AREA, "criu unavailable", 0, "", note=str(e))]
    sizes = [100, 1024] if quick else [100, 1024, 4096]
    rows: list[Row] = []
    for root in PLACES.values():
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        for mb in sizes:
            for place, root in PLACES.items():
                rows += _size_rows(be, mb, place, root, repeats=3 if mb <= 1024 else 1)
        rows += _downtime_rows(be, sizes[-1])
        note = ("kernel tracks dirty pages: not measured yet" if be.dirty_tracking else
                f"n/a: kernel {os.uname().release} has no dirty-page tracking; pre-copy falls back to a plain dump")
        rows.append(Row(AREA, "downtime pre-copy/plain", float("nan"), "ratio", "<= 0.25", None, note=note))
    finally:
        for root in PLACES.values():
            shutil.rmtree(root, ignore_errors=True)
    return rows
