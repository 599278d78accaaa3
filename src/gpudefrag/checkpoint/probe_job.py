"""A stand-in training job whose in-memory state is observable from its log, for checkpoint tests and the
benchmark: `python -m gpudefrag.checkpoint.probe_job --log FILE [--mb N]`.

* holds an N MiB buffer of seeded pseudo-random bytes (every page touched, incompressible like weights);
* every `--period` s: step += 1 and a hash chain advances; one line `step=N chain=HEX t=UNIX pid=PID` is
  appended to the log, so a restart from zero, a lost step or a repeated step is visible (`check_log`);
* SIGUSR1: appends `CHECKSUM step=N sha256=HEX` of the whole buffer; SIGTERM: appends `EXIT step=N` and
  exits with `--exit-code` (0).

Kept free of gpudefrag imports so that it starts fast and its memory is what it says.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

CHUNK = 64 << 20
SEED_CHAIN = hashlib.sha256(b"gpudefrag-probe").digest()


def next_chain(chain: bytes, step: int) -> bytes:
    return hashlib.sha256(chain + step.to_bytes(8, "little")).digest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--log", required=True)
    ap.add_argument("--mb", type=int, default=16)
    ap.add_argument("--period", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--exit-code", type=int, default=0, help="exit status after SIGTERM")
    a = ap.parse_args(argv)
    size = a.mb << 20
    buf = bytearray(size)
    mv = memoryview(buf)
    try:
        import numpy as np

        rng = np.random.default_rng(a.seed)
        for off in range(0, size, CHUNK):
            n = min(CHUNK, size - off)
            mv[off:off + n] = rng.bytes(n)
    except ImportError:  # no numpy: slower but still deterministic
        h = hashlib.shake_256(str(a.seed).encode())
        for off in range(0, size, CHUNK):
            n = min(CHUNK, size - off)
            mv[off:off + n] = h.digest(n)
            h = hashlib.shake_256(h.digest(32))

    fd = os.open(a.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def log(line: str) -> None:
        os.write(fd, (line + "\n").encode())

    def checksum() -> str:
        h = hashlib.sha256()
        for off in range(0, size, CHUNK):
            h.update(mv[off:off + CHUNK])
        return h.hexdigest()

    flags = {"sum": False, "stop": False}
    signal.signal(signal.SIGUSR1, lambda *_: flags.__setitem__("sum", True))
    signal.signal(signal.SIGTERM, lambda *_: flags.__setitem__("stop", True))
    step, chain = 0, SEED_CHAIN
    log(f"START pid={os.getpid()} mb={a.mb} sha256={checksum()}")
    while not flags["stop"]:
        time.sleep(a.period)
        step += 1
        chain = next_chain(chain, step)
        log(f"step={step} chain={chain.hex()[:16]} t={time.time():.3f} pid={os.getpid()}")
        if flags["sum"]:
            flags["sum"] = False
            log(f"CHECKSUM step={step} sha256={checksum()}")
    log(f"EXIT step={step}")
    return a.exit_code


@dataclass
class LogReport:
    """What a probe log proves: steps contiguous from 1 with a valid chain, one START, checksums equal."""

    ok: bool
    last_step: int
    starts: int
    checksums: list[str] = field(default_factory=list)
    start_sha: str | None = None
    problems: list[str] = field(default_factory=list)
    largest_gap_s: float = 0.0
    step_times: dict[int, float] = field(default_factory=dict)


def parse_fields(line: str) -> dict[str, str]:
    return dict(x.split("=", 1) for x in line.split() if "=" in x)


def check_log(path: Path | str) -> LogReport:
    """Recompute the chain from step 1: a restart from zero, a lost step or a repeated step is a problem."""
    problems: list[str] = []
    starts, sums = 0, []
    start_sha = None
    chain, expect = SEED_CHAIN, 1
    last_t = None
    gap = 0.0
    times: dict[int, float] = {}
    for line in Path(path).read_text().splitlines():
        kv = parse_fields(line)
        if line.startswith("START"):
            starts += 1
            start_sha = start_sha or kv.get("sha256")
        elif line.startswith("CHECKSUM"):
            sums.append(kv["sha256"])
        elif line.startswith("step="):
            s = int(kv["step"])
            if s != expect:
                problems.append(f"expected step {expect}, got {s}")
                expect = s
            chain = next_chain(chain, s)
            if chain.hex()[:16] != kv["chain"]:
                problems.append(f"chain mismatch at step {s}")
            t = float(kv["t"])
            if last_t is not None:
                gap = max(gap, t - last_t)
            last_t = t
            times[s] = t
            expect += 1
    if starts != 1:
        problems.append(f"{starts} START lines (restarted from scratch?)")
    problems += [f"buffer checksum {i} differs from START" for i, c in enumerate(sums) if c != start_sha]
    return LogReport(not problems, expect - 1, starts, sums, start_sha, problems, gap, times)


def last_step(path: Path | str) -> int:
    n = 0
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return 0
    for line in text.splitlines():
        if line.startswith("step="):
            n = int(parse_fields(line)["step"])
    return n


def request_checksum(path: Path | str, pid: int, timeout: float = 60) -> str:
    """SIGUSR1 the probe and wait for the CHECKSUM line it appends."""
    p = Path(path)
    before = p.read_text().count("CHECKSUM")
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [ln for ln in p.read_text().splitlines() if ln.startswith("CHECKSUM")]
        if len(lines) > before:
            return parse_fields(lines[-1])["sha256"]
        time.sleep(0.05)
    raise TimeoutError(f"no CHECKSUM from PID {pid} within {timeout} s")


def wait_step(path: Path | str, at_least: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = last_step(path)
        if s >= at_least:
            return s
        time.sleep(0.05)
    raise TimeoutError(f"{path}: step {at_least} not reached within {timeout} s")


if __name__ == "__main__":
    sys.exit(main())
