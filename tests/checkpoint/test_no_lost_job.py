"""A checkpoint that stops the job never loses the job or its state; retention never deletes the only good copy;
a missing key is an error, not a fresh key."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudefrag.checkpoint import probe_job
from gpudefrag.checkpoint.criu import CriuBackend
from gpudefrag.checkpoint.manifest import MANIFEST_NAME
from gpudefrag.checkpoint.operations import checkpoint_to_store
from gpudefrag.checkpoint.protocol import BAD_WORKLOAD, MISSING_KEY, STORE_FULL, CheckpointError
from gpudefrag.checkpoint.store import CheckpointStore
from gpudefrag.core.model import Versions

from .conftest import Probes


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 96 MiB tmpfs of our own (we are root), unmounted afterwards."""
    d = tmp_path / "fs"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m,mode=0700", "tmpfs", str(d)], capture_output=True)
    if r.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs: {r.stderr.decode().strip()}")
    yield d
    subprocess.run(["umount", "-l", str(d)], capture_output=True)


def _fill(d: Path) -> None:
    """Use up every byte left on d's file system, as another writer would."""
    fd = os.open(d / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)


class FillsTheDiskAfterTheDump(CriuBackend):
    """Real CRIU; right after the dump the store's disk fills up (another job writing), so the manifest cannot be
    written."""

    def checkpoint(self, target, dest, **kw):  # type: ignore[no-untyped-def,override]
        res = super().checkpoint(target, dest, **kw)
        _fill(Path(dest).parent.parent)
        return res


@pytest.mark.criu
def test_enospc_on_the_manifest_restores_the_job_in_place(criu, small_fs: Path, probes: Probes,
                                                          tmp_path: Path) -> None:
    store = CheckpointStore(small_fs / "store", tmp_path / "keys" / "k")
    job, log = probes.start(mb=16, pidns=True)  # as the job wrapper starts a workload
    be = FillsTheDiskAfterTheDump(criu_bin=criu.criu_bin, log_dir=tmp_path / "criu-logs")
    with pytest.raises(CheckpointError) as e:
        checkpoint_to_store(store, be, job.pid, "full")
    assert e.value.reason == STORE_FULL and "restored in place" in e.value.detail, e.value.detail
    job.reap(timeout=5)
    pid = e.value.restored_pid
    assert pid is not None
    probes.track(pid)
    at = probe_job.last_step(log)
    probe_job.wait_step(log, at + 3, timeout=30)  # it runs again, from its own memory
    probes.stop(pid, log)
    report = probe_job.check_log(log)
    assert report.ok and report.starts == 1, report.problems


@pytest.mark.criu
def test_no_room_for_the_images_is_refused_before_the_dump(criu, small_fs: Path, probes: Probes,
                                                           tmp_path: Path) -> None:
    store = CheckpointStore(small_fs / "store", tmp_path / "keys" / "k")
    job, log = probes.start(mb=16)
    store.root.mkdir(mode=0o700)
    with open(small_fs / "filler", "wb") as f:
        f.write(b"\0" * (90 << 20))  # 6 MiB left for a 16 MiB job
    with pytest.raises(CheckpointError) as e:
        checkpoint_to_store(store, criu, job.pid, "full")
    assert e.value.reason == STORE_FULL
    at = probe_job.last_step(log)
    probe_job.wait_step(log, at + 2, timeout=30)  # never frozen


@pytest.mark.criu
@pytest.mark.parametrize("wid", ["w" * 300, "bad\nid", ""])
def test_bad_workload_id_is_refused_before_the_dump(criu, store: CheckpointStore, probes: Probes,
                                                    wid: str) -> None:
    job, log = probes.start()
    with pytest.raises(CheckpointError) as e:
        checkpoint_to_store(store, criu, job.pid, wid)
    assert e.value.reason == BAD_WORKLOAD
    at = probe_job.last_step(log)
    probe_job.wait_step(log, at + 2, timeout=30)  # still running: never dumped
    assert job.popen.poll() is None


# -- retention --------------------------------------------------------------------------------------------------
def _make(store: CheckpointStore, wl: str, step: int) -> str:
    with store.create(wl) as p:
        (p.dir / "state.txt").write_text(str(step))
        m = p.commit(backend="app", mode="app-hook", compat=Versions())
    time.sleep(0.01)
    return m.id


def test_gc_counts_only_verified_checkpoints_and_keeps_the_newest_good_one(store: CheckpointStore) -> None:
    good = _make(store, "wl", 1)
    flipped = _make(store, "wl", 2)
    forged = _make(store, "wl", 3)
    p = store.path(flipped) / "state.txt"
    p.write_bytes(bytes([p.read_bytes()[0] ^ 1]))
    mp = store.path(forged) / MANIFEST_NAME
    doc = json.loads(mp.read_text())
    doc["signature"] = None
    mp.write_text(json.dumps(doc))

    r = store.gc(1)
    assert good in r.kept and good not in r.removed
    assert store.verify(good).ok
    latest = store.latest("wl")
    assert latest is not None and latest.id == good
    r = store.gc(0)  # even keep 0 never deletes a job's newest verified checkpoint
    assert store.verify(good).ok and good in r.kept


def test_retain_keep_n_counts_verified_ones(store: CheckpointStore) -> None:
    a, b = _make(store, "wl", 1), _make(store, "wl", 2)
    c = _make(store, "wl", 3)
    (store.path(c) / "state.txt").write_text("X")
    store.retain("wl", 2)
    assert store.verify(a).ok and store.verify(b).ok  # the two newest that verify


def test_a_corrupt_manifest_does_not_stop_list_or_gc(store: CheckpointStore, run_cli) -> None:
    good = _make(store, "wl", 1)
    for name, make in {
        "deep-00000000T000000000000Z-000000": lambda p: p.write_text("[" * 100_000 + "]" * 100_000),
        "fifo-00000000T000000000000Z-000000": lambda p: os.mkfifo(p),
        "dir-00000000T000000000000Z-000000": lambda p: p.mkdir(),
        "zero-00000000T000000000000Z-000000": lambda p: os.symlink("/dev/zero", p),
        "bytes-00000000T000000000000Z-000000": lambda p: p.write_bytes(b"\xff\xfe{"),
    }.items():
        d = store.root / name
        d.mkdir(mode=0o700)
        make(d / MANIFEST_NAME)
    args = ["--store", str(store.root), "--key", str(store.key_path), "--json"]
    r = run_cli("checkpoints", "list", *args)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {x["id"] for x in rows if x["error"]} == {d.name for d in store.root.iterdir()} - {good}
    assert [x["id"] for x in rows if not x["error"]] == [good]
    r = run_cli("checkpoints", "gc", "--keep", "1", *args)
    assert r.returncode == 0, r.stderr
    assert store.verify(good).ok and len(json.loads(r.stdout)["unreadable"]) == 5


# -- keys -------------------------------------------------------------------------------------------------------
def test_a_missing_key_is_an_error_and_is_not_created(store: CheckpointStore, tmp_path: Path, run_cli,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cid = _make(store, "wl", 1)
    missing = tmp_path / "nokey" / "k"
    other = CheckpointStore(store.root, missing)
    v = other.verify(cid)
    assert v.reason == MISSING_KEY and not missing.exists()
    with pytest.raises(CheckpointError) as e:
        other.latest("wl")
    assert e.value.reason == MISSING_KEY and not missing.exists()
    for cmd in (["checkpoints", "verify", cid], ["restore", cid], ["checkpoints", "list"],
                ["checkpoints", "gc", "--keep", "1"]):
        r = run_cli(*cmd, "--store", str(store.root), "--key", str(missing))
        assert r.returncode == 2 and "missing-key" in r.stderr + r.stdout, (cmd, r.stdout, r.stderr)
        assert len((r.stderr + r.stdout).strip().splitlines()) == 1 and "Traceback" not in r.stderr
        assert not missing.exists()

    from gpudefrag.job import Job

    monkeypatch.setenv("GPUDEFRAG_STORE", str(store.root))
    monkeypatch.setenv("GPUDEFRAG_KEY", str(missing))
    monkeypatch.setenv("GPUDEFRAG_WORKLOAD_ID", "wl")
    monkeypatch.delenv("GPUDEFRAG_RESTORE_FROM", raising=False)
    job = Job(save=lambda d: None, load=lambda d: None, spool=tmp_path / "s")
    with pytest.raises(CheckpointError) as e:
        job.resume()
    assert e.value.reason == MISSING_KEY and not missing.exists()


def test_keys_init_creates_and_bad_key_paths_are_one_line(tmp_path: Path, run_cli) -> None:
    k = tmp_path / "keys" / "k"
    r = run_cli("keys", "init", "--key", str(k))
    assert r.returncode == 0, r.stderr
    assert k.is_file() and (k.stat().st_mode & 0o777) == 0o600
    before = k.read_bytes()
    r = run_cli("keys", "init", "--key", str(k))  # idempotent: never replaces a key (old checkpoints need it)
    assert r.returncode == 0 and k.read_bytes() == before
    (tmp_path / "file").write_text("x")
    for bad in (tmp_path, tmp_path / "file" / "k"):
        for cmd in (["checkpoints", "list", "--store", str(tmp_path / "store")], ["keys", "init"]):
            r = run_cli(*cmd, "--key", str(bad))
            out = (r.stderr + r.stdout).strip()
            assert r.returncode == 2 and len(out.splitlines()) == 1 and str(bad) in out, (cmd, bad, out)


class FailsAfterTheDump(CriuBackend):
    """Real CRIU; the backend fails after its dump stopped the job (as a page server dying after the dump does),
    and optionally the first restore fails too."""

    fail_restores: int = 0

    def checkpoint(self, target, dest, **kw):  # type: ignore[no-untyped-def,override]
        res = super().checkpoint(target, dest, **kw)
        err = CheckpointError("checkpoint-failed", "page-server exited 1")
        err.stopped = res
        raise err

    def restore(self, ckpt_dir, **kw):  # type: ignore[no-untyped-def,override]
        if self.fail_restores:
            self.fail_restores -= 1
            raise CheckpointError("restore-failed", "criu restore failed (rc 1)")
        return super().restore(ckpt_dir, **kw)


@pytest.mark.criu
@pytest.mark.parametrize("restore_fails", [False, True])
def test_a_failure_after_a_stopping_dump_never_loses_the_job(criu, store: CheckpointStore, probes: Probes,
                                                             tmp_path: Path, restore_fails: bool) -> None:
    job, log = probes.start(pidns=True)
    sha = probe_job.request_checksum(log, job.pid)
    be = FailsAfterTheDump(criu_bin=criu.criu_bin, log_dir=tmp_path / "criu-logs")
    be.fail_restores = 1 if restore_fails else 0
    with pytest.raises(CheckpointError) as e:
        checkpoint_to_store(store, be, job.pid, "wl")
    job.reap(timeout=5)
    assert store.ids() == []
    if restore_fails:  # the images are the job's only state: kept, and the error says where
        kept = e.value.kept_images
        assert kept is not None and kept in e.value.detail and Path(kept).name.startswith(".kept-")
        assert any(Path(kept).glob("pages-*.img"))
        store.gc(0)  # retention never touches them
        assert Path(kept).is_dir()
        assert e.value.stopped is not None
        pid = criu.restore(Path(kept), info=e.value.stopped.extra).pid
    else:
        pid = e.value.restored_pid
        assert pid is not None and "restored in place" in e.value.detail
        assert not [p for p in store.root.iterdir() if p.name.startswith((".tmp-", ".kept-"))]
    probes.track(pid)
    at = probe_job.last_step(log)
    probe_job.wait_step(log, at + 3, timeout=30)
    assert probe_job.request_checksum(log, pid) == sha
    probes.stop(pid, log)
    assert probe_job.check_log(log).ok


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def test_a_checkpoint_whose_writer_dies_after_stopping_the_job_brings_the_job_back(
        criu, store: CheckpointStore, probes: Probes, run_cli) -> None:
    """`gpudefrag checkpoint` killed after CRIU stopped the job (while hashing, syncing and signing) used to leave
    the job gone and its only copy in a temp folder that `checkpoints list` did not show and gc deleted after an
    hour. Now the stopping checkpoint is recorded before the dump: it survives its writer's death, gc (even of
    every stale folder) leaves it alone, and the next store command restores the job in place from it."""
    from gpudefrag.checkpoint.keys import load_key

    load_key(store.key_path, create=True)
    job, log = probes.start("victim", mb=400, pidns=True)
    sha = probe_job.request_checksum(log, job.pid)
    cmd = ["checkpoint", "--pid", str(job.pid), "--workload", "wl", "--store", str(store.root), "--key",
           str(store.key_path)]
    writer = subprocess.Popen([sys.executable, "-m", "gpudefrag.cli.main", *cmd], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while _state(job.pid) not in ("Z", "X", "gone") and writer.poll() is None:  # CRIU stops (kills) the job
        assert time.monotonic() < deadline
        time.sleep(0.001)
    writer.kill()  # the writer dies while hashing, syncing, signing
    out, _ = writer.communicate(timeout=30)
    job.reap(timeout=5)
    if store.ids():
        pytest.skip(f"the writer committed before it could be killed ({out}); nothing to test on this run")
    assert _state(job.pid) in ("Z", "X", "gone")  # the job is stopped: its images are its only state
    left = [p for p in store.root.iterdir() if p.is_dir()]
    assert len(left) == 1 and any(left[0].glob("pages-*.img")), left
    store.gc(0, stale_temp_s=0)  # gc, even of stale temp folders, never removes it
    assert left[0].is_dir()
    r = run_cli("checkpoints", "list", "--store", str(store.root), "--key", str(store.key_path), "--json")
    assert r.returncode == 0, r.stderr
    assert "restored in place as PID" in r.stderr, r.stderr  # the next command brought the job back
    pid = int(r.stderr.split("restored in place as PID")[1].split()[0])
    probes.track(pid)
    at = probe_job.last_step(log)
    probe_job.wait_step(log, at + 3, timeout=60)
    assert probe_job.request_checksum(log, pid) == sha  # with its memory intact
    assert not left[0].exists() and store.interrupted() == []  # and only then were the images let go
    probes.stop(pid, log)
    assert probe_job.check_log(log).ok


def test_an_interrupted_checkpoint_is_listed_while_its_writer_works(criu, store: CheckpointStore,
                                                                    probes: Probes, run_cli) -> None:
    """While a stopping checkpoint is being written (its writer alive), `checkpoints list` shows it and gc keeps
    it; nothing else touches it."""
    job, _ = probes.start("listed", mb=4)
    pending = store.create("wl", stops=job.pid, backend="criu")
    r = run_cli("checkpoints", "list", "--store", str(store.root), "--key", str(store.key_path), "--json")
    rows = json.loads(r.stdout)
    assert [x["id"] for x in rows] == [pending.ckpt_id] and "writer is still at work" in rows[0]["error"], rows
    assert run_cli("checkpoints", "gc", "--keep", "0", "--store", str(store.root), "--key",
                   str(store.key_path)).returncode == 0
    assert pending.dir.is_dir()
    pending.__exit__(None, None, None)
    assert store.interrupted() == []


class FillsTheDiskDuringTheDump(CriuBackend):
    """Real CRIU; the store's disk fills up after the room check and while the images are written (the job's
    memory grew, another writer wrote)."""

    def checkpoint(self, target, dest, **kw):  # type: ignore[no-untyped-def,override]
        _fill(Path(dest).parent.parent)
        return super().checkpoint(target, dest, **kw)


@pytest.mark.criu
def test_enospc_mid_dump_is_store_full_and_the_job_runs_on(criu, small_fs: Path, probes: Probes,
                                                           tmp_path: Path) -> None:
    """A job whose dump hit ENOSPC was reported `checkpoint-failed`; it is `store-full` (what the controller
    treats as a full store, not a job CRIU cannot dump), and the job was never stopped."""
    store = CheckpointStore(small_fs / "store", tmp_path / "keys" / "k")
    job, log = probes.start(mb=16, pidns=True)
    be = FillsTheDiskDuringTheDump(criu_bin=criu.criu_bin, log_dir=tmp_path / "criu-logs")
    with pytest.raises(CheckpointError) as e:
        checkpoint_to_store(store, be, job.pid, "grows")
    assert e.value.reason == STORE_FULL, e.value
    assert e.value.restored_pid is None and e.value.kept_images is None  # CRIU resumed it: never stopped
    at = probe_job.last_step(log)
    probe_job.wait_step(log, at + 3, timeout=30)
    assert store.ids() == [] and store.interrupted() == []
