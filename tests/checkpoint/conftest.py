"""Fixtures for checkpoint tests: a store with its own key, real CRIU, probe jobs that are always cleaned up,
and pairs of network namespaces standing in for two nodes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpudefrag.checkpoint import probe_job
from gpudefrag.checkpoint.launch import Job, spawn_job
from gpudefrag.checkpoint.store import CheckpointStore


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "store", tmp_path / "keys" / "ckpt.key")


@pytest.fixture(scope="session")
def criu(require):  # -> CriuBackend
    """Real CRIU. Skipped loudly only when CRIU truly cannot run here (set GPUDEFRAG_REQUIRE_CRIU=1 to fail)."""
    from gpudefrag.checkpoint.criu import CriuBackend
    from gpudefrag.checkpoint.protocol import CheckpointError

    try:
        be = CriuBackend()
        be.check()
    except CheckpointError as e:
        require("CRIU", f"CRIU CANNOT RUN HERE ({e}); run scripts/install-criu.sh. CRIU tests are SKIPPED")
    return be


@dataclass
class Probes:
    """Starts probe jobs and remembers every PID it or the test hands it, so teardown can end them."""

    dir: Path
    pids: set[int] = field(default_factory=set)
    jobs: list[Job] = field(default_factory=list)

    def start(self, name: str = "job", mb: int = 16, args: list[str] | None = None,
              **kw: object) -> tuple[Job, Path]:
        log = self.dir / f"{name}.log"
        argv = [sys.executable, "-m", "gpudefrag.checkpoint.probe_job", "--log", str(log), "--mb", str(mb),
                *(args or [])]
        job = spawn_job(argv, stdout=self.dir / f"{name}.out", **kw)  # type: ignore[arg-type]
        self.jobs.append(job)
        self.pids.add(job.pid)
        probe_job.wait_step(log, 2, timeout=60)
        return job, log

    def track(self, pid: int) -> int:
        self.pids.add(pid)
        return pid

    def stop(self, pid: int, log: Path) -> None:
        """SIGTERM and wait for the EXIT line, so the log is complete."""
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "EXIT step=" not in log.read_text():
            time.sleep(0.05)
        assert "EXIT step=" in log.read_text(), f"PID {pid} did not exit on SIGTERM"

    def cleanup(self) -> None:
        """Kill what is left — only processes whose command line names this test's folder, since a PID
        that exited may by now belong to someone else's process."""
        marker = str(self.dir.parent).encode()
        for pid in self.pids:
            try:
                if marker not in Path(f"/proc/{pid}/cmdline").read_bytes():
                    continue
                os.kill(pid, signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
        for job in self.jobs:
            job.reap(timeout=5)


@pytest.fixture
def probes(tmp_path: Path) -> Iterator[Probes]:
    d = tmp_path / "jobs"
    d.mkdir()
    p = Probes(d)
    yield p
    p.cleanup()


def stopped_advancing(log: Path, wait_s: float = 0.5) -> bool:
    s = probe_job.last_step(log)
    time.sleep(wait_s)
    return probe_job.last_step(log) == s


@pytest.fixture
def netns_pair() -> Iterator[tuple[str, str]]:
    """Two fresh network namespaces ("node A", "node B"), deleted afterwards."""
    names = (f"gpd{os.getpid()}a", f"gpd{os.getpid()}b")
    try:
        for n in names:
            subprocess.run(["ip", "netns", "add", n], check=True, capture_output=True)
            subprocess.run(["ip", "-n", n, "link", "set", "lo", "up"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.fail(f"cannot create network namespaces (ip netns add): {e}")
    yield names
    for n in names:
        subprocess.run(["ip", "netns", "del", n], capture_output=True)


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """The real entry point in a subprocess: exit codes and stdout exactly as a user sees them."""

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpudefrag.cli.main", *args], capture_output=True, text=True,
                              env={**os.environ, **(env or {})}, timeout=300)

    return run
