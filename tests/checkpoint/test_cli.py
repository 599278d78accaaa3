"""The commands as a user runs them: tampered or incompatible checkpoints are refused with exit 2 and a reason,
and the job is not started; the untouched checkpoint then restores."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from gpudefrag.checkpoint import probe_job
from gpudefrag.checkpoint.manifest import MANIFEST_NAME
from gpudefrag.checkpoint.store import CheckpointStore
from gpudefrag.core.model import Versions

from .conftest import Probes, stopped_advancing


def _args(store: CheckpointStore, key: Path | None = None) -> list[str]:
    return ["--store", str(store.root), "--key", str(key or store.key_path)]


def _job_processes(log: Path) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if str(log).encode() in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                continue
    return out


@pytest.mark.criu
def test_tampered_checkpoints_are_refused_and_the_job_not_started(criu, store: CheckpointStore, probes: Probes,
                                                                  run_cli, tmp_path: Path) -> None:
    job, log = probes.start()
    sha = probe_job.request_checksum(log, job.pid)
    r = run_cli("checkpoint", "--pid", str(job.pid), "--workload", "probe", "--precopy", "--json", *_args(store))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    cid = doc["id"]
    assert doc["ok"] and doc["bytes"] > 16 << 20 and doc["mode"] in ("precopy", "dump (pre-copy unavailable)")
    job.reap()
    at_dump = probe_job.last_step(log)
    d = store.path(cid)
    pages = next(d.glob("pages-*.img"))
    original = pages.read_bytes()
    manifest = (d / MANIFEST_NAME).read_bytes()

    def refused(reason: str, *extra: str, human: bool = False) -> None:
        r = run_cli("restore", cid, "--json", *extra)
        assert r.returncode == 2, (r.stdout, r.stderr)
        out = json.loads(r.stdout)
        assert out["ok"] is False and out["reason"] == reason
        if human:  # the human form: one line, the reason code in it
            r = run_cli("restore", cid, *extra)
            assert r.returncode == 2 and reason in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert _job_processes(log) == [] and stopped_advancing(log, 0.2)

    # a byte flipped in an image
    b = bytearray(original)
    b[len(b) // 2] ^= 0x80
    pages.write_bytes(bytes(b))
    refused("hash-mismatch", *_args(store), human=True)
    v = run_cli("checkpoints", "verify", cid, "--json", *_args(store))
    assert v.returncode == 2 and json.loads(v.stdout)["reason"] == "hash-mismatch"
    # ... and the manifest forged to match the flipped image
    mdoc = json.loads(manifest)
    for f in mdoc["files"]:
        if f["path"] == pages.name:
            f["sha256"] = hashlib.sha256(bytes(b)).hexdigest()
    (d / MANIFEST_NAME).write_text(json.dumps(mdoc))
    refused("bad-signature", *_args(store))
    # the genuine files, verified with another key
    pages.write_bytes(original)
    (d / MANIFEST_NAME).write_bytes(manifest)
    refused("missing-key", *_args(store, tmp_path / "other.key"))  # a missing key is not silently made
    assert not (tmp_path / "other.key").exists()
    assert run_cli("keys", "init", "--key", str(tmp_path / "other.key")).returncode == 0
    refused("wrong-key", *_args(store, tmp_path / "other.key"))
    # untouched: verifies and restores, and the job continues
    v = run_cli("checkpoints", "verify", cid, *_args(store))
    assert v.returncode == 0 and "ok" in v.stdout
    r = run_cli("restore", cid, "--json", *_args(store))
    assert r.returncode == 0, r.stderr
    pid = probes.track(json.loads(r.stdout)["pid"])
    probe_job.wait_step(log, at_dump + 3)
    assert probe_job.request_checksum(log, pid) == sha
    probes.stop(pid, log)
    assert probe_job.check_log(log).ok


@pytest.mark.criu
def test_incompatible_checkpoint_is_refused_naming_the_fields(criu, store: CheckpointStore, run_cli) -> None:
    with store.create("wl") as p:
        (p.dir / "pages-1.img").write_bytes(b"never read")
        m = p.commit(backend="criu", mode="dump", compat=Versions(cpu_arch="riscv64", gpu_model="H200",
                                                                   gpu_count=8, checkpointer=criu.version()))
    r = run_cli("restore", m.id, "--json", *_args(store))
    assert r.returncode == 2
    out = json.loads(r.stdout)  # this host has no GPU: the one rule checks the model only where one is reported,
    # and the GPU count (a minimum) refuses it
    assert out["reason"] == "incompatible" and out["fields"] == ["cpu_arch", "gpu_count"]
    assert "cpu_arch: checkpoint=riscv64" in out["detail"]
    r = run_cli("restore", m.id, *_args(store))
    assert r.returncode == 2 and "incompatible" in r.stderr and "gpu_count" in r.stderr


def test_list_verify_gc_json(store: CheckpointStore, run_cli) -> None:
    ids = []
    for wl in ("a", "a", "a", "b"):
        with store.create(wl) as p:
            (p.dir / "x.img").write_bytes(os.urandom(100))
            ids.append(p.commit(backend="criu", mode="dump", compat=Versions()).id)
    r = run_cli("checkpoints", "list", "--json", *_args(store))
    rows = json.loads(r.stdout)
    assert r.returncode == 0 and [x["id"] for x in rows] == ids[::-1] and all(x["signed"] for x in rows)
    r = run_cli("checkpoints", "list", "--workload", "b", "--json", *_args(store))
    assert [x["id"] for x in json.loads(r.stdout)] == [ids[3]]
    r = run_cli("checkpoints", "verify", ids[0], "--json", *_args(store))
    assert r.returncode == 0 and json.loads(r.stdout)["ok"] is True
    r = run_cli("checkpoints", "verify", "no-such", "--json", *_args(store))
    assert r.returncode == 2 and json.loads(r.stdout)["reason"] == "not-found"
    r = run_cli("checkpoints", "gc", "--keep", "1", "--json", *_args(store))
    assert r.returncode == 0 and set(json.loads(r.stdout)["removed"]) == set(ids[:2])
    assert set(store.ids()) == {ids[2], ids[3]}
    r = run_cli("checkpoints", "list", *_args(store))
    assert r.returncode == 0 and ids[2][:10] in r.stdout


def test_insecure_key_is_one_error_line(store: CheckpointStore, run_cli, tmp_path: Path) -> None:
    key = tmp_path / "k"
    key.write_text("ab" * 32)
    os.chmod(key, 0o644)
    r = run_cli("checkpoints", "list", *_args(store, key))
    assert r.returncode == 2 and "insecure-key" in r.stderr and "chmod 600" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.criu
def test_checkpoint_of_a_missing_pid_fails_cleanly(criu, store: CheckpointStore, run_cli) -> None:
    r = run_cli("checkpoint", "--pid", "999999999", "--json", *_args(store))
    assert r.returncode == 2 and json.loads(r.stdout)["reason"] == "checkpoint-failed"
    assert store.ids() == [] and [e for e in store.root.iterdir() if e.name.startswith(".tmp")] == []


def test_list_ids_stay_whole_at_80_columns_and_gc_says_why(store: CheckpointStore, run_cli) -> None:
    """Issue 32: `checkpoints list` in an 80-column terminal keeps every id on one line (copyable), says what
    "signed" checked; `gc` names each checkpoint it removed and why (a corrupt one: failed verification)."""
    ids = []
    for _ in range(3):
        with store.create("job-with-a-rather-long-workload-name") as p:
            (p.dir / "x.img").write_bytes(os.urandom(100))
            ids.append(p.commit(backend="criu", mode="dump", compat=Versions()).id)
    r = run_cli("checkpoints", "list", *_args(store), env={"COLUMNS": "80"})
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    for cid in ids:
        assert any(cid in line for line in lines), (cid, r.stdout)
    assert "signature" in r.stdout and "verify" in r.stdout
    img = store.path(ids[-1]) / "x.img"  # the newest: corrupt
    img.write_bytes(b"\0" * 100)
    r = run_cli("checkpoints", "gc", "--keep", "1", "--json", *_args(store))
    why = json.loads(r.stdout)["removed_why"]
    assert "hash-mismatch" in why[ids[-1]] and "failed verification" in why[ids[-1]]
    assert why[ids[0]] == "older than the newest 1 verified"
