"""Fixtures shared by every area's tests."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[1]


def trace_dir() -> Path | None:
    """The Alibaba openb trace: $GPUDEFRAG_TRACE_DIR, else ../shared/traces/alibaba-gpu-v2023 beside the repo."""
    env = os.environ.get("GPUDEFRAG_TRACE_DIR")
    cand = Path(env) if env else REPO.parent / "shared" / "traces" / "alibaba-gpu-v2023"
    return cand if (cand / "openb_node_list_gpu_node.csv").is_file() else None


def part_missing(part: str, msg: str) -> NoReturn:
    """A real part a test needs cannot run here: fail when GPUDEFRAG_REQUIRE_<PART>=1 (CI sets it), else skip
    loudly (a developer's laptop)."""
    if os.environ.get(f"GPUDEFRAG_REQUIRE_{part}") == "1":
        pytest.fail(f"{msg} (GPUDEFRAG_REQUIRE_{part}=1)")
    warnings.warn(msg, stacklevel=2)
    print(f"\n*** {msg} ***")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def require() -> Callable[[str, str], NoReturn]:
    """`part_missing`, for the real-part fixtures of other folders (they cannot import this conftest)."""
    return part_missing


@pytest.fixture(scope="session")
def alibaba_trace() -> Path:
    d = trace_dir()
    if d is None:
        part_missing("TRACE", "ALIBABA TRACE ABSENT: set GPUDEFRAG_TRACE_DIR or place the trace at "
                     f"{REPO.parent / 'shared/traces/alibaba-gpu-v2023'}; trace tests are SKIPPED")
    return d


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[[list[str]], tuple[int, str, str]]:
    """Run the `gpudefrag` command in-process: (exit code, stdout, stderr)."""
    from gpudefrag.cli.main import run

    def call(argv: list[str]) -> tuple[int, str, str]:
        try:
            run(argv)
            code = 0
        except SystemExit as e:
            code = int(e.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return call


@dataclass
class RegistryLab:
    """A real OCI distribution registry (Debian's `docker-registry`) on 127.0.0.1, storing under `root`."""

    url: str
    root: Path
    proc: subprocess.Popen[bytes]

    def blob_path(self, digest: str) -> Path:
        """Where the registry keeps a blob on disk (to corrupt it, as a failing disk or an attacker would)."""
        hexd = digest.split(":", 1)[1]
        return self.root / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_registry(root: Path, *, read_only: bool = False) -> RegistryLab | None:
    """Start `docker-registry serve` on a free port; None when the binary is absent. `read_only`: the registry's
    own maintenance mode, which serves pulls and refuses every push (a registry that answers but will not
    store)."""
    exe = shutil.which("docker-registry") or shutil.which("registry")
    if exe is None:
        return None
    root.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    cfg = root.parent / f"{root.name}-config.yml"
    cfg.write_text(f"version: 0.1\nlog: {{level: error}}\nstorage:\n  filesystem: {{rootdirectory: {root}}}\n"
                   f"  delete: {{enabled: true}}\n"
                   + ("  maintenance: {readonly: {enabled: true}}\n" if read_only else "")
                   + f"http:\n  addr: 127.0.0.1:{port}\n")
    proc = subprocess.Popen([exe, "serve", str(cfg)], stdout=subprocess.DEVNULL,
                            stderr=open(root.parent / f"{root.name}.log", "wb"))  # noqa: SIM115
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if proc.poll() is not None:
            return None
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return RegistryLab(f"http://127.0.0.1:{port}", root, proc)
        except OSError:
            time.sleep(0.1)
    proc.kill()
    return None


@pytest.fixture(scope="session")
def oci_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryLab]:
    """A real registry for checkpoint images. Skipped loudly when `docker-registry` is missing, unless
    GPUDEFRAG_REQUIRE_REGISTRY=1 (CI: `scripts/setup.sh all` installs it)."""
    yield from _registry(tmp_path_factory.mktemp("registry") / "data", read_only=False)


@pytest.fixture
def read_only_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryLab]:
    """A real registry that answers but refuses every push (its own read-only maintenance mode): a registry
    under maintenance, or one whose storage went read-only. Skipped like `oci_registry`."""
    yield from _registry(tmp_path_factory.mktemp("registry-ro") / "data", read_only=True)


def _registry(data: Path, *, read_only: bool) -> Iterator[RegistryLab]:
    lab = start_registry(data, read_only=read_only)
    if lab is None:
        part_missing("REGISTRY", "OCI REGISTRY CANNOT RUN HERE (install Debian's docker-registry: scripts/setup.sh "
                     "all); registry tests are SKIPPED")
    try:
        yield lab
    finally:
        lab.proc.terminate()
        lab.proc.wait(timeout=30)


@dataclass(frozen=True)
class ThrowawayUser:
    """An unprivileged account made for one test (the attacker): `run` executes a command as it."""

    name: str
    uid: int
    gid: int

    def run(self, argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, user=self.uid, group=self.gid, extra_groups=[], text=True,  # type: ignore[call-overload]
                              capture_output=True, **kw)

    def popen(self, argv: list[str], **kw: object) -> subprocess.Popen[str]:
        return subprocess.Popen(argv, user=self.uid, group=self.gid, extra_groups=[], text=True,  # type: ignore[call-overload]
                                **kw)


@pytest.fixture
def throwaway_user() -> Iterator[ThrowawayUser]:
    """A fresh unprivileged user (`useradd` as root), removed afterwards with whatever it still runs."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        part_missing("ROOT", "NOT ROOT (or no useradd): attacks that need a second, unprivileged user are SKIPPED")
    name = f"gpdx{os.getpid() % 100000}{secrets.token_hex(2)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name],
                   check=True, capture_output=True)
    try:
        pw = pwd.getpwnam(name)
        yield ThrowawayUser(name, pw.pw_uid, pw.pw_gid)
    finally:
        _kill_uid(pw.pw_uid)  # what the attacker left running: processes of this test's own account, by PID
        subprocess.run(["userdel", name], capture_output=True)


def _kill_uid(uid: int) -> None:
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if d.stat().st_uid == uid:
                os.kill(int(d.name), 9)
        except OSError:
            continue


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder like /tmp (mode 1777, reachable by every user; pytest's tmp_path is root-only), removed after."""
    d = Path(tempfile.mkdtemp(prefix="gpd-shared-", dir="/tmp"))
    os.chmod(d, 0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a Kubernetes watch thread is still running at its end. Such a thread, reading from or
    retrying against an API server a fixture has stopped, outlived its test; when the interpreter finalizes
    under it the process can die with SIGABRT and no message (CI exit 134 after every test passed)."""
    import threading

    from gpudefrag.engines.kubernetes.watch import THREAD_PREFIX

    deadline = time.monotonic() + 10  # a watch being stopped ends within its join timeout
    while True:
        left = sorted(t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and t.is_alive())
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if left:
        session.config.get_terminal_writer().line(
            f"\nERROR: {len(left)} Kubernetes watch thread(s) still running at the end of the run "
            f"(a WatchCache, engine or dashboard source not stopped/closed): {', '.join(left)}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
