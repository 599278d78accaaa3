"""Checkpoint images: a kubelet archive becomes a signed OCI image, pushed to a real registry (Debian's
`docker-registry` on 127.0.0.1) and trusted back only by digest, signature and compatibility record."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudefrag.checkpoint.keys import load_key
from gpudefrag.checkpoint.oci_image import (
    COMPAT_PREFIX,
    CONTAINER_NAME_ANN,
    SIGNATURE_ANN,
    build_image,
    bytes_digest,
    check_archive,
    compat_annotations,
    record_of,
    verify_manifest,
)
from gpudefrag.checkpoint.oci_registry import Registry, RegistryError, repository_name, split_reference
from gpudefrag.checkpoint.protocol import BAD_MANIFEST, BAD_SIGNATURE, WRONG_KEY, CheckpointError
from gpudefrag.core.model import Versions

REC = Versions(gpu_model="NVIDIA-H100-80GB-HBM3", gpu_count=2, driver="550.54.15", cuda="12.4", cpu_arch="amd64",
               kernel="6.1.0-28-amd64", checkpointer="criu 4.1.1", engine="pytorch 2.4.0")


def archive(path: Path, members: dict[str, bytes] | None = None, pages: int = 4096) -> Path:
    """A tar laid out as the kubelet (containerd) writes a checkpoint archive."""
    members = members if members is not None else {
        "config.dump": b'{"id":"c1"}', "spec.dump": b'{"ociVersion":"1.2.0"}', "status": b"{}",
        "checkpoint/inventory.img": b"\x01" * 64, "checkpoint/pages-1.img": b"\x07" * pages,
        "rootfs-diff.tar": b"",
    }
    with tarfile.open(path, "w") as tf:
        for name, data in members.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return path


@pytest.fixture
def key(tmp_path: Path) -> bytes:
    return load_key(tmp_path / "keys" / "ckpt.key", create=True)


def test_image_round_trip_through_a_real_registry(oci_registry, tmp_path: Path, key: bytes) -> None:
    arc = archive(tmp_path / "checkpoint-counter_ml-main.tar", pages=3 << 20)
    img = build_image(arc, "main", REC, key, extra={"gpudefrag.io/checkpoint-of": "ml/counter/main"})
    reg = Registry(oci_registry.url)
    repo = repository_name("gpudefrag/checkpoints/ML counter--main")
    assert repo == "gpudefrag/checkpoints/ml-counter-main"
    ref = reg.push(repo, img)
    assert ref == f"{reg.host}/{repo}@{img.digest}"
    assert split_reference(ref) == (reg.host, repo, img.digest)
    raw = reg.manifest(repo, img.digest)
    v = verify_manifest(raw, img.digest, key)
    assert v.container == "main" and v.record == REC and v.layer_size == arc.stat().st_size
    assert v.annotations[CONTAINER_NAME_ANN] == "main"
    doc = json.loads(raw)
    assert [ly["mediaType"] for ly in doc["layers"]] == ["application/vnd.oci.image.layer.v1.tar"]
    # the layer the registry serves is the archive, byte for byte
    assert oci_registry.blob_path(img.layer_digest).read_bytes() == arc.read_bytes()
    # a second push (a retried agent) uploads nothing new and names the same image
    assert reg.push(repo, img) == ref


def test_tampered_wrong_key_and_substituted_manifests_are_refused(oci_registry, tmp_path: Path, key: bytes) -> None:
    img = build_image(archive(tmp_path / "a.tar"), "main", REC, key)
    doc = json.loads(img.manifest)
    # an attacker with registry write access edits the compatibility record (or the layer) and re-pushes
    doc["annotations"][COMPAT_PREFIX + "driver"] = "999.0"
    forged = json.dumps(doc).encode()
    reg = Registry(oci_registry.url)
    reg.push_blob("t/forged", img.layer_digest, img.layer_size, path=img.archive)
    reg.push_blob("t/forged", img.config_digest, len(img.config), data=img.config)
    status, _, _ = reg._request("PUT", f"/v2/t/forged/manifests/{bytes_digest(forged)}", forged,
                                {"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
    assert status == 201
    with pytest.raises(CheckpointError) as e:
        verify_manifest(reg.manifest("t/forged", bytes_digest(forged)), bytes_digest(forged), key)
    assert e.value.reason == BAD_SIGNATURE
    # bytes that are not the digest asked for (a registry answering with another manifest)
    with pytest.raises(CheckpointError) as e:
        verify_manifest(forged, img.digest, key)
    assert e.value.reason == BAD_MANIFEST
    other = load_key(tmp_path / "other.key", create=True)
    with pytest.raises(CheckpointError) as e:
        verify_manifest(img.manifest, img.digest, other)
    assert e.value.reason == WRONG_KEY
    unsigned = json.loads(img.manifest)
    del unsigned["annotations"][SIGNATURE_ANN]
    raw = json.dumps(unsigned).encode()
    with pytest.raises(CheckpointError) as e:
        verify_manifest(raw, bytes_digest(raw), key)
    assert e.value.reason == BAD_SIGNATURE


@pytest.mark.parametrize(("members", "why"), [
    ({"config.dump": b"{}", "checkpoint/pages-1.img": b"x"}, "no spec.dump"),
    ({"config.dump": b"{}", "spec.dump": b"{}"}, "no CRIU images"),
    ({"config.dump": b"{}", "spec.dump": b"{}", "checkpoint/a.img": b"x", "../evil": b"x"}, "leaves the archive"),
    ({"config.dump": b"{}", "spec.dump": b"{}", "checkpoint/a.img": b"x", "/etc/passwd": b"x"}, "leaves the archive"),
])
def test_incomplete_or_unsafe_archives_are_refused(tmp_path: Path, key: bytes, members: dict[str, bytes],
                                                   why: str) -> None:
    arc = archive(tmp_path / "bad.tar", members)
    with pytest.raises(CheckpointError, match=why) as e:
        build_image(arc, "main", REC, key)
    assert e.value.reason == BAD_MANIFEST


def test_a_truncated_archive_is_refused(tmp_path: Path) -> None:
    arc = archive(tmp_path / "a.tar", pages=1 << 16)
    data = arc.read_bytes()
    arc.write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError, match=r"tar|no "):
        check_archive(arc)


def test_registry_down_is_an_error_that_says_so(tmp_path: Path, key: bytes) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    img = build_image(archive(tmp_path / "a.tar"), "main", REC, key)
    with pytest.raises(RegistryError) as e:
        Registry(f"http://127.0.0.1:{port}", timeout_s=5).push("x/y", img)
    assert e.value.status == 0 and "registry" in str(e.value)


def test_a_read_only_registry_refuses_the_push_and_no_image_is_left_to_name(read_only_registry, tmp_path: Path,
                                                                            key: bytes) -> None:
    """A registry that answers but will not store (its own read-only maintenance mode): the push fails with the
    registry's refusal — which push, where, the status and its message — not as "unreachable"; nothing was
    stored, so no reference exists to hand out."""
    ro = read_only_registry
    img = build_image(archive(tmp_path / "a.tar"), "main", REC, key)
    reg = Registry(ro.url, timeout_s=10)
    with pytest.raises(RegistryError) as e:
        reg.push("ml/counter-main", img, tag="m1")
    msg = str(e.value)
    assert e.value.status >= 400 and f"push of ml/counter-main:m1 to {ro.url}: the registry refused it " \
        f"(HTTP {e.value.status})" in msg, msg
    assert f"start upload: HTTP {e.value.status} " in msg, msg  # the first write, with the registry's words
    with pytest.raises(RegistryError) as got:
        reg.manifest("ml/counter-main", img.digest)
    assert got.value.status == 404


def test_a_manifest_refused_after_its_blobs_leaves_no_reference(oci_registry, tmp_path: Path, key: bytes) -> None:
    """The registry stores the blobs, then refuses the manifest (507: out of space, as a full registry or a
    quota proxy answers; here a proxy on 127.0.0.1 in front of the real registry): the push fails naming the
    manifest, the tag and the digest name nothing, so no partial image can be pulled or restored from."""
    import http.client
    import threading
    import urllib.error
    import urllib.request
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlsplit

    upstream = urlsplit(oci_registry.url).netloc

    class Proxy(BaseHTTPRequestHandler):
        def _any(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.command == "PUT" and "/manifests/" in self.path:
                out, status, hdrs = b'{"errors":[{"code":"UNKNOWN","message":"insufficient storage"}]}', 507, []
            else:
                c = http.client.HTTPConnection(upstream, timeout=30)
                c.request(self.command, self.path, body=body or None,
                          headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
                r = c.getresponse()
                out, status, hdrs = r.read(), r.status, r.getheaders()
                c.close()
            self.send_response(status)
            for k, v in hdrs:
                if k.lower() not in ("content-length", "connection", "transfer-encoding", "date", "server"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(out)

        do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = _any

        def log_message(self, *_: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        img = build_image(archive(tmp_path / "a.tar"), "main", REC, key)
        reg = Registry(f"http://127.0.0.1:{srv.server_address[1]}", timeout_s=10)
        with pytest.raises(RegistryError) as e:
            reg.push("ml/full-main", img, tag="m2")
        msg = str(e.value)
        assert e.value.status == 507 and "the registry refused it (HTTP 507): put manifest" in msg, msg
        assert "insufficient storage" in msg, msg
        direct = Registry(oci_registry.url)
        assert direct.has_blob("ml/full-main", img.layer_digest)  # the blobs went through; nothing names them
        for ref in ("m2", img.digest):  # neither the tag nor the digest names a manifest
            with pytest.raises(urllib.error.HTTPError) as got:
                urllib.request.urlopen(f"{oci_registry.url}/v2/ml/full-main/manifests/{ref}", timeout=10)
            assert got.value.code == 404, ref
    finally:
        srv.shutdown()


def test_only_digest_pinned_references_are_accepted() -> None:
    for bad in ("127.0.0.1:5000/x/y:latest", "127.0.0.1:5000/x/y@sha256:abc", "x@sha256:" + "0" * 64):
        with pytest.raises(ValueError):
            split_reference(bad)


_text = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(st.builds(Versions, gpu_model=st.none() | _text, gpu_count=st.none() | st.integers(0, 64),
                 driver=st.none() | _text, cuda=st.none() | _text, engine=st.none() | _text, model=st.none() | _text,
                 cpu_arch=st.none() | _text, kernel=st.none() | _text, checkpointer=st.none() | _text))
def test_compat_record_round_trips(v: Versions) -> None:
    assert record_of(compat_annotations(v)) == v


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from([COMPAT_PREFIX + f for f in ("driver", "gpu_count", "kernel", "bogus")]
                                       + ["other", CONTAINER_NAME_ANN]), st.text(max_size=8), max_size=6))
def test_record_loader_accepts_or_names_the_field(ann: dict[str, str]) -> None:
    try:
        v = record_of(ann)
    except CheckpointError as e:
        assert e.reason == BAD_MANIFEST and "annotations." in e.detail
    else:
        assert v.driver == ann.get(COMPAT_PREFIX + "driver")


def test_the_verifier_accepts_only_images_of_its_registry_by_name(oci_registry, tmp_path: Path, key: bytes) -> None:
    """The agent pushes through one address and names the image as the nodes pull it; the controller fetches
    through another address and accepts only references with that name."""
    from gpudefrag.checkpoint.oci_registry import image_verifier

    img = build_image(archive(tmp_path / "a.tar"), "main", REC, key)
    ref = Registry(oci_registry.url, name="registry.gpudefrag.test").push("ml/counter-main", img)
    assert ref == f"registry.gpudefrag.test/ml/counter-main@{img.digest}"
    assert image_verifier(Registry(oci_registry.url, name="registry.gpudefrag.test"), key)(ref) == REC
    with pytest.raises(CheckpointError, match="not in the configured registry"):
        image_verifier(Registry(oci_registry.url), key)(ref)
    with pytest.raises(CheckpointError) as e:  # another key: never trusted
        image_verifier(Registry(oci_registry.url, name="registry.gpudefrag.test"),
                       load_key(tmp_path / "o.key", create=True))(ref)
    assert e.value.reason == WRONG_KEY


def test_a_secret_volume_key_is_read_only_by_its_group(tmp_path: Path) -> None:
    """A Kubernetes Secret volume under the pod's fsGroup is 0440 root:<fsGroup>: the controller accepts that
    (group_read_ok) and nothing wider — never group write, never others, never without the flag."""
    import os

    from gpudefrag.checkpoint.protocol import INSECURE_KEY

    p = tmp_path / "checkpoint.key"
    load_key(p, create=True)
    os.chown(p, -1, os.getegid())
    os.chmod(p, 0o440)
    with pytest.raises(CheckpointError) as e:
        load_key(p)
    assert e.value.reason == INSECURE_KEY
    assert len(load_key(p, group_read_ok=True)) == 32
    for mode in (0o460, 0o444, 0o442):
        os.chmod(p, mode)
        with pytest.raises(CheckpointError) as e:
            load_key(p, group_read_ok=True)
        assert e.value.reason == INSECURE_KEY
