"""The application-hook SDK (`gpudefrag.job.Job`) in real processes: a full disk at a safe point does not stop
training, `resume()` under the wrapper picks the application's own checkpoints (not the wrapper's CRIU
images of the same workload), and bad settings (signal, missing key) are clear errors."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudefrag.checkpoint.app_hook import AppHookBackend
from gpudefrag.checkpoint.keys import load_key
from gpudefrag.checkpoint.launch import spawn_job
from gpudefrag.checkpoint.operations import checkpoint_to_store
from gpudefrag.checkpoint.store import CheckpointStore
from gpudefrag.errors import GpudefragError
from gpudefrag.job import Job, checkpoint_signal

HERE = Path(__file__).parent
SDK = str(HERE / "sdk_job.py")


def lines(log: Path, prefix: str) -> list[str]:
    return [ln for ln in log.read_text().splitlines() if ln.startswith(prefix)] if log.exists() else []


def wait(cond, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    end = time.time() + timeout
    while not cond():
        if time.time() > end:
            raise AssertionError("timed out")
        time.sleep(0.05)


def sdk_env(tmp: Path, **kw: str) -> dict[str, str]:
    src = str(Path(__file__).parents[2] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), **kw}


def test_a_full_disk_at_a_safe_point_does_not_stop_training(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "spool"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        log = tmp_path / "t.log"
        p = subprocess.Popen([sys.executable, SDK, "--log", str(log), "--state-mb", "2", "--every", "0.2"],
                             env=sdk_env(tmp_path, GPUDEFRAG_JOB_SPOOL=str(mnt)), stderr=subprocess.PIPE, text=True)
        try:
            wait(lambda: any("err=" in ln and ln.split("err=")[1] for ln in lines(log, "step=")))
            n = len(lines(log, "step="))
            wait(lambda: len(lines(log, "step=")) >= n + 10)  # still training
            assert p.poll() is None
            assert [e.name for e in mnt.iterdir()] == []  # the partial save was removed
        finally:
            p.kill()
            _, err = p.communicate(timeout=10)
        assert "No space left" in err and "Traceback" not in err
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.criu
def test_resume_under_the_wrapper_picks_the_application_checkpoint(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("criu") is None:
        if os.environ.get("GPUDEFRAG_REQUIRE_CRIU") == "1":
            pytest.fail("GPUDEFRAG_REQUIRE_CRIU=1 but CRIU (as root) is not available")
        pytest.skip("needs root and CRIU")
    from gpudefrag.checkpoint.criu import CriuBackend

    key = tmp_path / "key"
    load_key(key, create=True)
    store = CheckpointStore(tmp_path / "store", key)
    spool = tmp_path / "spool"
    log = tmp_path / "a.log"
    env = sdk_env(tmp_path, GPUDEFRAG_JOB_SPOOL=str(spool))
    app = subprocess.Popen([sys.executable, SDK, "--log", str(log)], env=env)
    try:
        wait(lambda: len(lines(log, "step=")) >= 5)
        m_app, _ = checkpoint_to_store(store, AppHookBackend(), app.pid, "wl", leave_running=True)
    finally:
        app.kill()
        app.wait()
    # the wrapper's own heartbeat: a CRIU image of the same workload, newer
    job = spawn_job(["sleep", "60"], stdout=tmp_path / "sleep.out", pidns=True)
    try:
        m_criu, _ = checkpoint_to_store(store, CriuBackend(log_dir=tmp_path), job.pid, "wl", leave_running=True)
    finally:
        os.kill(job.pid, signal.SIGKILL)
        job.reap()
    assert store.latest("wl").id == m_criu.id  # type: ignore[union-attr]
    log2 = tmp_path / "b.log"
    env2 = {**env, "GPUDEFRAG_STORE": str(store.root), "GPUDEFRAG_WORKLOAD_ID": "wl", "GPUDEFRAG_KEY": str(key)}
    r = subprocess.run([sys.executable, SDK, "--log", str(log2), "--steps", "0"], env=env2, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    step = int((store.path(m_app.id) / "state").read_text())
    assert lines(log2, "RESUMED") == [f"RESUMED {step}"]


def test_resume_with_a_missing_key_is_an_error_and_creates_none(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    env = sdk_env(tmp_path, GPUDEFRAG_STORE=str(tmp_path / "store"), GPUDEFRAG_WORKLOAD_ID="wl",
                  GPUDEFRAG_KEY=str(tmp_path / "nokey"), GPUDEFRAG_JOB_SPOOL=str(tmp_path / "spool"))
    r = subprocess.run([sys.executable, SDK, "--log", str(tmp_path / "l"), "--steps", "0"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "key" in r.stderr.splitlines()[-1], r.stderr
    assert not (tmp_path / "nokey").exists()


@pytest.mark.parametrize("value,expected", [("USR1", signal.SIGUSR1), ("SIGUSR2", signal.SIGUSR2),
                                            ("12", signal.SIGUSR2), (" sigterm ", signal.SIGTERM)])
def test_checkpoint_signal_names_and_numbers(value: str, expected: int) -> None:
    assert checkpoint_signal(value) == expected


@pytest.mark.parametrize("value", ["bogus", "", "0", "99999", "SIGKILL", "9", "STOP", "-10", "1.5"])
def test_a_bad_checkpoint_signal_is_a_clear_error(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUDEFRAG_CHECKPOINT_SIGNAL", value)
    with pytest.raises(GpudefragError, match="GPUDEFRAG_CHECKPOINT_SIGNAL"):
        Job(save=lambda d: None, load=lambda d: None)
