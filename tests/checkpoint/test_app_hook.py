"""The application hook with a real PyTorch CPU training loop: train, checkpoint on a signal, kill, restore in a
new process, finish — the final weights equal those of an uninterrupted run with the same seed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudefrag.checkpoint.app_hook import AppHookBackend
from gpudefrag.checkpoint.launch import spawn_job
from gpudefrag.checkpoint.operations import checkpoint_to_store, restore_from_store
from gpudefrag.checkpoint.store import CheckpointStore

torch = pytest.importorskip("torch", reason="torch is in the dev extra (pip install -e '.[dev]')")

SCRIPT = Path(__file__).with_name("train_torch.py")
STEPS = 40


def _last_step(log: Path) -> int:
    steps = [int(ln.split()[0][5:]) for ln in log.read_text().splitlines() if ln.startswith("step=")]
    return steps[-1] if steps else 0


def test_signal_kill_restore_finishes_with_the_same_weights(store: CheckpointStore, tmp_path: Path) -> None:
    ref_out = tmp_path / "ref.pt"
    r = subprocess.run([sys.executable, str(SCRIPT), "--steps", str(STEPS), "--out", str(ref_out), "--log",
                        str(tmp_path / "ref.log")], capture_output=True, text=True, timeout=300,
                       env={"GPUDEFRAG_JOB_SPOOL": str(tmp_path / "ref-spool"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr

    out, log = tmp_path / "moved.pt", tmp_path / "moved.log"
    job = spawn_job([sys.executable, str(SCRIPT), "--steps", str(STEPS), "--out", str(out), "--log", str(log),
                     "--sleep", "0.1"], stdout=tmp_path / "moved.out",
                    env={"GPUDEFRAG_JOB_SPOOL": str(tmp_path / "spool"), "PATH": "/usr/bin:/bin"})
    try:
        deadline = time.monotonic() + 120
        while (not log.exists() or _last_step(log) < 8) and time.monotonic() < deadline:
            time.sleep(0.05)
        m, res = checkpoint_to_store(store, AppHookBackend(), job.pid, "train")
        assert job.popen.wait(timeout=30) == -9  # killed after its save
        saved_at = json.loads((store.path(m.id) / "meta.json").read_text())["step"]
        killed_at = _last_step(log)
        assert 8 <= saved_at <= killed_at < STEPS and not out.exists()
        assert {f.path for f in m.files} == {"state.pt", "meta.json"} and m.backend == "app"
        assert m.info["argv"][1] == str(SCRIPT) and res.mode == "app-hook"

        _, rr = restore_from_store(store, m.id, wait=True)
        assert rr.exit_code == 0
    finally:
        if job.popen.poll() is None:
            job.popen.kill()
    starts = [ln for ln in log.read_text().splitlines() if ln.startswith("START")]
    assert len(starts) == 2 and f"resumed_from={saved_at}" in starts[1]
    ref, got = torch.load(ref_out, weights_only=True), torch.load(out, weights_only=True)
    assert ref.keys() == got.keys()
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    # and a run that resumed from nothing would differ: the check can fail
    assert not all(torch.equal(ref[k], torch.zeros_like(ref[k])) for k in ref)


def test_heartbeat_saves_without_a_signal(tmp_path: Path) -> None:
    from gpudefrag.job import Job, spool_entries

    now = [0.0]
    saved: list[Path] = []
    job = Job(save=lambda d: saved.append(d), load=lambda d: None, spool=tmp_path / "s", every_s=10,
              clock=lambda: now[0], keep=2)
    assert job.safe_point(1) is None
    now[0] = 10.0
    p = job.safe_point(2)
    assert p is not None and json.loads((p / "meta.json").read_text())["step"] == 2
    for i in range(3, 6):
        now[0] += 10
        job.safe_point(i)
    entries = spool_entries(tmp_path / "s")
    assert [json.loads((e / "meta.json").read_text())["step"] for e in entries] == [4, 5]  # keep=2


def test_resume_from_the_store_loads_the_latest_verified(store: CheckpointStore, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudefrag.core.model import Versions
    from gpudefrag.job import Job

    for step in (3, 7):
        with store.create("wl") as p:
            (p.dir / "meta.json").write_text(json.dumps({"step": step}))
            (p.dir / "state.txt").write_text(str(step))
            p.commit(backend="app", mode="app-hook", compat=Versions())
    newest = store.list()[0]["id"]
    (store.path(newest) / "state.txt").write_text("tampered")
    monkeypatch.setenv("GPUDEFRAG_STORE", str(store.root))
    monkeypatch.setenv("GPUDEFRAG_KEY", str(store.key_path))
    monkeypatch.setenv("GPUDEFRAG_WORKLOAD_ID", "wl")
    monkeypatch.delenv("GPUDEFRAG_RESTORE_FROM", raising=False)
    loaded: list[str] = []
    job = Job(save=lambda d: None, load=lambda d: loaded.append((d / "state.txt").read_text()),
              spool=tmp_path / "s")
    meta = job.resume()
    assert meta == {"step": 3} and loaded == ["3"]  # the tampered newer one was skipped
