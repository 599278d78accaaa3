"""One real Slurm cluster (4 nodes x 8 fake GPUs) per test session, started by our own scripts in
tests/slurm/cluster/, with helpers to submit wrapper jobs and to clean up between tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

HERE = Path(__file__).parent
LAB = Path(os.environ.get("GPUDEFRAG_TEST_SLURM_DIR", "/tmp/gpudefrag-slurm-pytest"))
PORT = os.environ.get("GPUDEFRAG_TEST_SLURM_PORT", "18817")
PY = sys.executable
GPUDEFRAG = str(Path(sys.executable).parent / "gpudefrag")


def _have_slurm() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    for b in ("slurmctld", "slurmd", "sbatch", "munged"):
        if shutil.which(b) is None:
            return f"{b} missing (scripts/setup.sh all)"
    return None


@dataclass
class Cluster:
    root: Path  # shared run dir, store, key, logs for this session
    env: dict[str, str]

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def store(self) -> Path:
        return self.root / "store"

    @property
    def key(self) -> Path:
        return self.root / "key"

    def sh(self, *args: str, check: bool = True) -> str:
        p = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=60)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: {p.returncode}: {p.stderr.strip()}")
        return p.stdout

    def submit(self, name: str, gpus: int, node: str | None = None, *, wrapper: bool = True,
               extra: str = "", store: Path | None = None, run_args: str = "", sbatch: tuple[str, ...] = ()) -> str:
        """A job: with `wrapper`, `gpudefrag run [run_args] -- workload.py` (step counter + checksum); else
        `sleep`. `sbatch`: more sbatch options (`--hold`, `--time=...`)."""
        log = self.root / f"{name}.log"
        if wrapper:
            cmd = (f"export GPUDEFRAG_RUN_DIR={self.run_dir} GPUDEFRAG_STORE={store or self.store} "
                   f"GPUDEFRAG_KEY={self.key}\nexec {GPUDEFRAG} run {run_args} -- {PY} {HERE / 'workload.py'} "
                   f"--log {log} {extra}")
        else:
            cmd = "trap 'echo got-usr2' USR2\nwhile true; do sleep 0.2; done"
        script = self.root / f"{name}.sh"
        script.write_text(f"#!/bin/bash\n{cmd}\n")
        args = ["sbatch", "--parsable", f"--gres=gpu:{gpus}", "-J", name, "--open-mode=append",
                "-o", str(self.root / f"{name}.out"), "-D", str(self.root)]
        if node:
            args += ["-w", node]
        args += list(sbatch)
        return self.sh(*args, str(script)).strip().split(";")[0]

    def job_state(self, jid: str) -> tuple[str, str]:
        out = self.sh("scontrol", "show", "job", "-o", jid, check=False)
        st = next((t.split("=", 1)[1] for t in out.split() if t.startswith("JobState=")), "GONE")
        nodes = next((t.split("=", 1)[1] for t in out.split() if t.startswith("NodeList=")), "")
        return st, nodes

    def wait_running(self, *jids: str, timeout: float = 30) -> None:
        end = time.time() + timeout
        while time.time() < end:
            if all(self.job_state(j)[0] == "RUNNING" for j in jids):
                return
            time.sleep(0.2)
        raise AssertionError(f"not running after {timeout} s: {[(j, self.job_state(j)) for j in jids]}")

    def wait_steps(self, name: str, at_least: int, timeout: float = 30) -> None:
        end = time.time() + timeout
        while time.time() < end:
            if last_step(self.root / f"{name}.log") >= at_least:
                return
            time.sleep(0.1)
        raise AssertionError(f"{name}: fewer than {at_least} steps after {timeout} s")

    def clean(self) -> None:
        """Cancel every job, wait until none is left, resume every node."""
        ids = self.sh("squeue", "-h", "-o", "%i").split()
        if ids:  # SIGKILL to every process of every step at once: no KillWait per test
            self.sh("scancel", "--signal=KILL", "--full", *ids, check=False)
            self.sh("scancel", *ids, check=False)
        end = time.time() + 30
        while time.time() < end and self.sh("squeue", "-h", "-o", "%i").strip():
            time.sleep(0.2)
        for f in self.root.iterdir():  # job names repeat between tests: start each with fresh logs
            if f.suffix in (".log", ".out", ".sh", ".yaml", ".err"):
                f.unlink()
        states = self.sh("sinfo", "-h", "-N", "-o", "%N %T")
        for line in states.splitlines():
            n, st = line.split()
            if "drain" in st or "down" in st:
                self.sh("scontrol", "update", f"NodeName={n}", "State=RESUME", check=False)
        end = time.time() + 15
        while time.time() < end:
            states = self.sh("sinfo", "-h", "-N", "-o", "%T")
            if all(s in ("idle", "mixed", "allocated") for s in states.split()):
                return
            time.sleep(0.2)


def read_log(path: Path) -> list[dict[str, str]]:
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        fields = dict(x.split("=", 1) for x in line.split() if "=" in x)
        fields["_kind"] = line.split()[0] if line and "=" not in line.split()[0] else "step"
        out.append(fields)
    return out


def last_step(path: Path) -> int:
    steps = [int(r["step"]) for r in read_log(path) if "step" in r]
    return steps[-1] if steps else 0


def workload_pids(log: Path) -> list[int]:
    """Host PIDs of live workload processes writing `log` (exactly one when a job runs once)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if len(cmd) > 2 and cmd[1].endswith(b"workload.py") and str(log).encode() in cmd and stat not in "ZX":
            pids.append(int(d.name))
    return pids


@pytest.fixture(scope="session")
def slurm(require: Callable[[str, str], NoReturn]) -> Iterator[Cluster]:
    why = _have_slurm()
    if why:
        require("SLURM", f"real Slurm: {why}")
    env = {**os.environ, "GPUDEFRAG_SLURM_DIR": str(LAB), "GPUDEFRAG_SLURM_PORT": PORT}
    p = subprocess.run([str(HERE / "cluster" / "start.sh")], env=env, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"cluster start failed: {p.stderr[-2000:]}")
    conf = str(LAB / "etc" / "slurm.conf")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    root = LAB / "work"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    c = Cluster(root, {**os.environ, "SLURM_CONF": conf})
    from gpudefrag.checkpoint.keys import load_key

    load_key(c.key, create=True)  # the operator's `keys init`: wrappers refuse to run without the key
    try:
        yield c
    finally:
        c.clean()
        subprocess.run([str(HERE / "cluster" / "stop.sh")], env={**env, "GPUDEFRAG_SLURM_PURGE": "1"},
                       capture_output=True, timeout=120)
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


@pytest.fixture
def cluster(slurm: Cluster) -> Iterator[Cluster]:
    slurm.clean()
    yield slurm
    slurm.clean()


def check_continuity(log: Path) -> dict[str, object]:
    """What a workload log proves: one START (no restart from zero), steps contiguous (none lost, none run
    twice), the buffer checksum constant, and the nodes it ran on in order."""
    rows = read_log(log)
    starts = [r for r in rows if r["_kind"] == "START"]
    steps = [r for r in rows if "step" in r]
    nums = [int(r["step"]) for r in steps]
    nodes: list[str] = []
    for r in steps:
        if not nodes or nodes[-1] != r["node"]:
            nodes.append(r["node"])
    shas = {r["sha"] for r in steps} | {r["sha"] for r in starts}
    return {"starts": len(starts), "contiguous": nums == list(range(1, len(nums) + 1)), "last": nums[-1] if nums else 0,
            "nodes": nodes, "sha_ok": len(shas) == 1}


def write_policy(path: Path, **over: object) -> Path:
    import yaml

    doc: dict[str, object] = {
        "trigger": {"pending": {"longer_than_s": 0}},
        "filter": {"names": ["w-*"]},
        "budgets": {"max_concurrent": 4, "max_per_node": 2, "checkpoint_timeout_s": 60, "restore_timeout_s": 60},
    }
    doc.update(over)
    path.write_text(yaml.safe_dump(doc))
    return path


def controller_cmd(c: Cluster, policy: Path, journal: Path, *extra: str, store: Path | None = None) -> list[str]:
    return [GPUDEFRAG, "controller", "--engine", "slurm", "--policy", str(policy), "--journal", str(journal),
            "--run-dir", str(c.run_dir), "--store", str(store or c.store), "--key", str(c.key),
            "--interval", "0.5", *extra]


# the tests reach these through the fixture (test modules cannot import conftest under --import-mode=importlib)
Cluster.check_continuity = staticmethod(check_continuity)  # type: ignore[attr-defined]
Cluster.read_log = staticmethod(read_log)  # type: ignore[attr-defined]
Cluster.write_policy = staticmethod(write_policy)  # type: ignore[attr-defined]
Cluster.workload_pids = staticmethod(workload_pids)  # type: ignore[attr-defined]
Cluster.controller_cmd = controller_cmd  # type: ignore[attr-defined]
