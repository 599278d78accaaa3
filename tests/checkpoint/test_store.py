"""The signed store: what it writes, and every way a checkpoint can be tampered with is refused by reason."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from gpudefrag.checkpoint import protocol as rc
from gpudefrag.checkpoint.keys import init_key, load_key
from gpudefrag.checkpoint.manifest import MANIFEST_NAME
from gpudefrag.checkpoint.protocol import CheckpointError
from gpudefrag.checkpoint.store import TMP_PREFIX, CheckpointStore
from gpudefrag.core.model import Versions

COMPAT = Versions(cpu_arch="x86_64", kernel="6.18.0", checkpointer="criu 4.1.1")


def make(store: CheckpointStore, workload: str = "wl", files: dict[str, bytes] | None = None,
         parent: str | None = None) -> str:
    files = files if files is not None else {"pages-1.img": os.urandom(5000), "core-1.img": b"core",
                                             "sub/extra.img": b"x" * 10}
    with store.create(workload) as p:
        for rel, data in files.items():
            (p.dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (p.dir / rel).write_bytes(data)
        m = p.commit(backend="criu", mode="dump", compat=COMPAT, parent=parent, info={"pid": 42})
    return m.id


def test_commit_writes_a_signed_manifest_with_sizes_and_hashes(store: CheckpointStore) -> None:
    data = os.urandom(3000)
    cid = make(store, files={"pages-1.img": data, "sub/core.img": b"abc"})
    d = store.path(cid)
    doc = json.loads((d / MANIFEST_NAME).read_text())
    entries = {f["path"]: f for f in doc["files"]}
    assert entries["pages-1.img"] == {"path": "pages-1.img", "size": 3000,
                                      "sha256": hashlib.sha256(data).hexdigest()}
    assert entries["sub/core.img"]["size"] == 3
    assert doc["compat"]["checkpointer"] == "criu 4.1.1" and doc["compat"]["cpu_arch"] == "x86_64"
    assert set(doc["compat"]) >= {"gpu_model", "gpu_count", "driver", "cuda", "engine", "model", "kernel"}
    assert doc["workload_id"] == "wl" and doc["parent"] is None and doc["created_at"].endswith("Z")
    assert len(doc["signature"]) == 64
    v = store.verify(cid)
    assert v.ok and v.reason == "ok" and v.bytes_checked == 3003


def test_folders_are_0700_and_files_0600(store: CheckpointStore) -> None:
    cid = make(store)
    assert stat.S_IMODE(store.root.stat().st_mode) == 0o700
    for p in [store.path(cid), *store.path(cid).rglob("*")]:
        want = 0o700 if p.is_dir() else 0o600
        assert stat.S_IMODE(p.stat().st_mode) == want, p
    assert stat.S_IMODE(store.key_path.stat().st_mode) == 0o600


def test_failed_backend_leaves_nothing(store: CheckpointStore) -> None:
    with pytest.raises(RuntimeError), store.create("wl") as p:
        (p.dir / "pages-1.img").write_bytes(b"half")
        raise RuntimeError("dump failed")
    assert [e.name for e in store.root.iterdir()] == []


def _flip(p: Path, offset: int = 100) -> None:
    b = bytearray(p.read_bytes())
    b[min(offset, len(b) - 1)] ^= 0x01
    p.write_bytes(bytes(b))


def _rewrite_manifest(store: CheckpointStore, cid: str, fn) -> None:
    mp = store.path(cid) / MANIFEST_NAME
    doc = json.loads(mp.read_text())
    fn(doc)
    mp.write_text(json.dumps(doc))


@pytest.mark.parametrize("victim", ["pages-1.img", "core-1.img", "sub/extra.img"])
def test_a_flipped_byte_in_any_file_is_a_hash_mismatch(store: CheckpointStore, victim: str) -> None:
    cid = make(store)
    _flip(store.path(cid) / victim)
    v = store.verify(cid)
    assert (v.ok, v.reason) == (False, rc.HASH_MISMATCH) and victim in v.detail
    with pytest.raises(CheckpointError) as e:
        v.raise_for_status()
    assert e.value.reason == "hash-mismatch"


def test_forged_manifest_is_a_bad_signature(store: CheckpointStore) -> None:
    """The attacker flips an image byte and rewrites its hash in the manifest to match: the signature fails."""
    cid = make(store)
    img = store.path(cid) / "pages-1.img"
    _flip(img)
    new = hashlib.sha256(img.read_bytes()).hexdigest()
    _rewrite_manifest(store, cid, lambda d: [f.update(sha256=new) for f in d["files"] if f["path"] == "pages-1.img"])
    assert store.verify(cid).reason == rc.BAD_SIGNATURE


@pytest.mark.parametrize("edit", [
    lambda d: d.update(workload_id="other"),
    lambda d: d["compat"].update(cpu_arch="aarch64"),
    lambda d: d.update(signature="0" * 64),
    lambda d: d.update(signature=None),
    lambda d: d.update(files=d["files"][:-1]),
])
def test_any_manifest_edit_breaks_the_signature(store: CheckpointStore, edit) -> None:
    cid = make(store)
    _rewrite_manifest(store, cid, edit)
    assert store.verify(cid).reason == rc.BAD_SIGNATURE


def test_wrong_key_is_refused(store: CheckpointStore, tmp_path: Path) -> None:
    cid = make(store)
    other = CheckpointStore(store.root, tmp_path / "other.key")
    init_key(other.key_path)
    v = other.verify(cid)
    assert (v.ok, v.reason) == (False, rc.WRONG_KEY)
    # the key id is only a hint: claiming the other key's id still fails on the signature
    _rewrite_manifest(store, cid, lambda d: d.update(key_id=json.loads(
        (other.root / cid / MANIFEST_NAME).read_text())["key_id"]))
    from gpudefrag.checkpoint.keys import key_id
    _rewrite_manifest(store, cid, lambda d: d.update(key_id=key_id(other.key)))
    assert other.verify(cid).reason == rc.BAD_SIGNATURE


@pytest.mark.parametrize(("tamper", "reason"), [
    (lambda d: (d / "pages-1.img").write_bytes((d / "pages-1.img").read_bytes()[:-1]), rc.SIZE_MISMATCH),
    (lambda d: (d / "core-1.img").unlink(), rc.MISSING_FILE),
    (lambda d: (d / "pages-2.img").write_bytes(b"evil"), rc.UNEXPECTED_FILE),
    (lambda d: (d / "sub" / "more.img").write_bytes(b"evil"), rc.UNEXPECTED_FILE),
    (lambda d: ((d / "core-1.img").unlink(), (d / "core-1.img").symlink_to("/etc/passwd")), rc.UNSAFE_PATH),
    (lambda d: (d / MANIFEST_NAME).unlink(), rc.MISSING_MANIFEST),
    (lambda d: (d / MANIFEST_NAME).write_text("{ nope"), rc.BAD_MANIFEST),
    (lambda d: (d / MANIFEST_NAME).write_text("[]"), rc.BAD_MANIFEST),
    # the manifest is read through the one guarded reader: never through a link, never from a FIFO (which
    # would hang the reader), never more than its size limit
    (lambda d: (os.replace(d / MANIFEST_NAME, d.parent / "elsewhere.json"),
                (d / MANIFEST_NAME).symlink_to(d.parent / "elsewhere.json")), rc.UNSAFE_PATH),
    (lambda d: ((d / MANIFEST_NAME).unlink(), os.mkfifo(d / MANIFEST_NAME)), rc.UNSAFE_PATH),
    (lambda d: (d / MANIFEST_NAME).write_bytes(b" " * (16 << 20) + b"{}"), rc.BAD_MANIFEST),
])
def test_tampering_reasons(store: CheckpointStore, tamper, reason: str) -> None:
    cid = make(store)
    tamper(store.path(cid))
    assert store.verify(cid).reason == reason


def test_a_signed_manifest_cannot_point_outside_its_folder(store: CheckpointStore) -> None:
    """Even a correctly signed manifest (a compromised writer) may not name ../ paths."""
    cid = make(store)
    mp = store.path(cid) / MANIFEST_NAME
    from gpudefrag.checkpoint.manifest import parse_manifest
    m = parse_manifest(mp.read_bytes(), str(mp))
    bad = m.model_copy(update={"files": (*m.files, m.files[0].model_copy(update={"path": "../x"}))})
    mp.write_text(bad.sign(store.key).to_json())
    assert store.verify(cid).reason == rc.UNSAFE_PATH


def test_a_manifest_moved_to_another_folder_is_refused(store: CheckpointStore) -> None:
    a = make(store, files={"f.img": b"same"})
    b = make(store, files={"f.img": b"same"})
    (store.path(b) / MANIFEST_NAME).write_bytes((store.path(a) / MANIFEST_NAME).read_bytes())
    v = store.verify(b)
    assert v.reason == rc.BAD_MANIFEST and "id" in v.detail


def test_unknown_ids_are_not_found(store: CheckpointStore) -> None:
    assert store.verify("nope").reason == rc.NOT_FOUND
    assert store.verify("../etc").reason == rc.NOT_FOUND
    assert store.verify(f"{TMP_PREFIX}x").reason == rc.NOT_FOUND


def test_latest_skips_a_tampered_newer_checkpoint(store: CheckpointStore) -> None:
    old = make(store, "wl")
    new = make(store, "wl")
    make(store, "other")
    m = store.latest("wl")
    assert m is not None and m.id == new
    _flip(store.path(new) / "pages-1.img")
    m = store.latest("wl")
    assert m is not None and m.id == old
    assert store.latest("absent") is None


def test_gc_keeps_newest_per_workload_and_needed_parents(store: CheckpointStore) -> None:
    a = [make(store, "a") for _ in range(4)]
    b1 = make(store, "b")
    b2 = make(store, "b", parent=b1)
    b3 = make(store, "b")
    (store.root / "not-a-checkpoint").mkdir(mode=0o700)
    r = store.gc(keep=1)
    # newest per workload survive; b1 is only the parent of b2, which is itself removed
    assert set(r.removed) == set(a[:3]) | {b1, b2}
    assert set(store.ids()) == {a[3], b3, "not-a-checkpoint"}
    assert "not-a-checkpoint" in r.unreadable
    assert r.freed_bytes > 0


def test_gc_keeps_the_parent_chain_of_a_kept_checkpoint(store: CheckpointStore) -> None:
    p1 = make(store, "w")
    p2 = make(store, "w", parent=p1)
    p3 = make(store, "w", parent=p2)
    r = store.gc(keep=1)
    assert r.removed == () and set(store.ids()) == {p1, p2, p3}
    p4 = make(store, "w")
    r = store.gc(keep=1)
    assert set(r.removed) == {p1, p2, p3} and store.ids() == [p4]


def test_gc_removes_only_stale_temp_folders(store: CheckpointStore) -> None:
    live = store.create("w")
    stale = store.create("w")
    os.utime(stale.dir, (1, 1))
    r = store.gc(keep=5)
    assert r.stale_temp_removed == (stale.dir.name,)
    assert live.dir.exists() and not stale.dir.exists()


def test_retain_applies_to_one_workload(store: CheckpointStore) -> None:
    a = [make(store, "a") for _ in range(3)]
    b = [make(store, "b") for _ in range(3)]
    store.retain("a", 2)
    assert set(store.ids()) == set(a[1:]) | set(b)


def test_key_is_created_0600_and_reused(tmp_path: Path) -> None:
    p = tmp_path / "k" / "key"
    k1 = load_key(p, create=True)
    assert stat.S_IMODE(p.stat().st_mode) == 0o600 and len(k1) == 32
    assert load_key(p) == k1 and init_key(p) == (k1, False)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_key_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    p = tmp_path / "key"
    init_key(p)
    os.chmod(p, mode)
    with pytest.raises(CheckpointError) as e:
        load_key(p)
    assert e.value.reason == rc.INSECURE_KEY and "0600" in e.value.detail
    with pytest.raises(CheckpointError):
        CheckpointStore(tmp_path / "s", p).create("w")
    assert not (tmp_path / "s").exists() or list((tmp_path / "s").iterdir()) == []


def test_key_must_be_hex_and_not_a_link(tmp_path: Path) -> None:
    p = tmp_path / "key"
    p.write_text("not hex")
    os.chmod(p, 0o600)
    with pytest.raises(CheckpointError, match="hex"):
        load_key(p)
    link = tmp_path / "link"
    link.symlink_to(p)
    with pytest.raises(CheckpointError, match="link"):
        load_key(link)
    with pytest.raises(CheckpointError):
        load_key(tmp_path / "missing", create=False)


def test_links_inside_the_checkpoint_are_signed_and_checked(store: CheckpointStore) -> None:
    """CRIU's pre-copy leaves `parent -> pre-2` in the final dump: allowed, signed, and verified."""
    with store.create("wl") as p:
        (p.dir / "pre-1").mkdir()
        (p.dir / "pre-1" / "pages-1.img").write_bytes(b"old pages")
        (p.dir / "pages-1.img").write_bytes(b"new pages")
        (p.dir / "parent").symlink_to("pre-1")
        m = p.commit(backend="criu", mode="precopy", compat=COMPAT)
    assert [(ln.path, ln.target) for ln in m.links] == [("parent", "pre-1")]
    d = store.path(m.id)
    assert store.verify(m.id).ok
    (d / "parent").unlink()
    (d / "parent").symlink_to("/etc")
    assert store.verify(m.id).reason == rc.UNSAFE_PATH
    (d / "parent").unlink()
    assert store.verify(m.id).reason == rc.MISSING_FILE


@pytest.mark.parametrize("target", ["/etc", "../..", "a/../../x"])
def test_links_leaving_the_checkpoint_are_refused_at_commit(store: CheckpointStore, target: str) -> None:
    with pytest.raises(CheckpointError) as e, store.create("wl") as p:
        (p.dir / "parent").symlink_to(target)
        p.commit(backend="criu", mode="precopy", compat=COMPAT)
    assert e.value.reason == rc.UNSAFE_PATH
    assert store.ids() == []
