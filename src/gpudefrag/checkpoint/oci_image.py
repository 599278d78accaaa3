"""A kubelet checkpoint archive as an OCI checkpoint image: the form containerd restores a container from.

The image has one layer, the kubelet's archive itself (an uncompressed tar: CRIU images under `checkpoint/`,
`config.dump`, `spec.dump`, the rootfs diff), a minimal config, and a manifest whose annotation
`org.criu.checkpoint.container.name` names the container; containerd's CRI, asked to create a container from
such an image, restores it with CRIU instead of starting it.

The manifest also carries what a restore must check before it trusts the image, the way the store's signed
manifest does for a folder (`gpudefrag.checkpoint.manifest`):
- the compatibility record (`gpudefrag.io/compat.<field>`, the fields of `gpudefrag.core.model.Versions`), read
  back with `record_of` and compared with the one rule (`gpudefrag.core.compat`);
- an HMAC-SHA256 signature with the store's key over the config and layer descriptors (their digests) and every
  other annotation. The image is referenced by its manifest's digest, so the bytes the signature vouches for
  are the bytes the runtime pulls (containerd checks each blob against its digest).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import tarfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec

from ..core.model import Versions
from .keys import key_id
from .protocol import BAD_MANIFEST, BAD_SIGNATURE, WRONG_KEY, CheckpointError

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONTAINER_NAME_ANN = "org.criu.checkpoint.container.name"  # what containerd looks for
COMPAT_PREFIX = "gpudefrag.io/compat."
SIGNATURE_ANN = "gpudefrag.io/signature"
KEY_ID_ANN = "gpudefrag.io/key-id"
POD_ANN = "gpudefrag.io/checkpoint-of"  # namespace/pod/container, for people reading the registry
_CHUNK = 4 << 20
# what a kubelet (containerd or CRI-O) checkpoint archive holds at least
_REQUIRED = ("config.dump", "spec.dump")
_INT_FIELDS = {f.name for f in msgspec.structs.fields(Versions) if f.type in (int | None, int)}


def sha256_digest(path: Path) -> tuple[str, int]:
    """("sha256:<hex>", size) of a file, read in chunks (an archive may hold many GiB)."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            n += len(chunk)
    return "sha256:" + h.hexdigest(), n


def bytes_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_archive(path: Path) -> int:
    """Refuse an archive that is not a complete kubelet checkpoint before it becomes an image: not a tar, no
    CRIU images under `checkpoint/`, no `config.dump`/`spec.dump`, or a member that would leave the folder it is
    unpacked in (absolute, `..`, a link pointing out). Returns the number of members."""
    names: set[str] = set()
    ckpt = 0
    try:
        with tarfile.open(path, "r:") as tf:
            for m in tf:
                p = PurePosixPath(m.name)
                if p.is_absolute() or ".." in p.parts:
                    raise CheckpointError(BAD_MANIFEST, f"archive member {m.name!r} leaves the archive", path=str(path))
                if (m.issym() or m.islnk()) and (m.linkname.startswith("/") or ".." in PurePosixPath(m.linkname).parts):
                    raise CheckpointError(BAD_MANIFEST, f"archive link {m.name!r} -> {m.linkname!r} leaves the archive",
                                          path=str(path))
                name = str(p)
                names.add(name)
                if name.startswith("checkpoint/") and m.isfile():
                    ckpt += 1
    except (tarfile.TarError, EOFError) as e:
        raise CheckpointError(BAD_MANIFEST, f"not a readable tar archive: {e}", path=str(path)) from None
    missing = [n for n in _REQUIRED if n not in names]
    if missing:
        raise CheckpointError(BAD_MANIFEST, f"not a kubelet checkpoint archive: no {', '.join(missing)}",
                              path=str(path))
    if not ckpt:
        raise CheckpointError(BAD_MANIFEST, "not a kubelet checkpoint archive: no CRIU images under checkpoint/",
                              path=str(path))
    return len(names)


def compat_annotations(v: Versions) -> dict[str, str]:
    """The compatibility record as annotations (only the fields that are known)."""
    return {COMPAT_PREFIX + k: str(val) for k, val in msgspec.structs.asdict(v).items() if val not in (None, "")}


def record_of(annotations: dict[str, str]) -> Versions:
    """The compatibility record an image's annotations carry (unknown fields refused: a typo must not pass as
    'not recorded, so not checked')."""
    known = set(Versions.__struct_fields__)
    kw: dict[str, Any] = {}
    for k, val in annotations.items():
        if not k.startswith(COMPAT_PREFIX):
            continue
        name = k[len(COMPAT_PREFIX):]
        if name not in known:
            raise CheckpointError(BAD_MANIFEST, f"annotations.{k}: unknown compatibility field")
        if name in _INT_FIELDS:
            try:
                kw[name] = int(val)
            except ValueError:
                raise CheckpointError(BAD_MANIFEST, f"annotations.{k}: expected an integer, got {val!r}") from None
        else:
            kw[name] = val
    return Versions(**kw)


@dataclass(frozen=True)
class CheckpointImage:
    """An image ready to push: its config and manifest bytes, and the archive (the one layer) by path."""

    archive: Path
    layer_digest: str
    layer_size: int
    config: bytes
    manifest: bytes

    @property
    def digest(self) -> str:
        """The manifest's digest: what the replacement pod names (`repo@sha256:...`)."""
        return bytes_digest(self.manifest)

    @property
    def config_digest(self) -> str:
        return bytes_digest(self.config)


def _signed_bytes(manifest: dict[str, Any]) -> bytes:
    ann = {k: v for k, v in (manifest.get("annotations") or {}).items() if k != SIGNATURE_ANN}
    doc = {"config": manifest.get("config"), "layers": manifest.get("layers"), "annotations": ann}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def build_image(archive: Path, container: str, record: Versions, key: bytes, *, arch: str = "amd64",
                extra: dict[str, str] | None = None, created: datetime | None = None) -> CheckpointImage:
    """The OCI checkpoint image of a kubelet archive: checked, digested, annotated with `record`, signed."""
    check_archive(archive)
    layer_digest, size = sha256_digest(archive)
    when = (created or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = json.dumps({"architecture": arch, "os": "linux", "created": when, "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [layer_digest]}},
                        sort_keys=True, separators=(",", ":")).encode()
    ann = {CONTAINER_NAME_ANN: container, "org.opencontainers.image.created": when, **(extra or {}),
           **compat_annotations(record), KEY_ID_ANN: key_id(key)}
    manifest: dict[str, Any] = {
        "schemaVersion": 2, "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": bytes_digest(config), "size": len(config)},
        "layers": [{"mediaType": LAYER_TYPE, "digest": layer_digest, "size": size}],
        "annotations": ann,
    }
    manifest["annotations"][SIGNATURE_ANN] = hmac.new(key, _signed_bytes(manifest), hashlib.sha256).hexdigest()
    raw = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return CheckpointImage(archive, layer_digest, size, config, raw)


@dataclass(frozen=True)
class VerifiedImage:
    """A checkpoint image manifest whose signature checked out: the container it restores and its record."""

    digest: str
    container: str
    record: Versions
    layer_digest: str
    layer_size: int
    annotations: dict[str, str]


def verify_manifest(raw: bytes, digest: str, key: bytes) -> VerifiedImage:
    """Trust a manifest only if it is the one asked for (its bytes hash to `digest`), is a checkpoint image
    (one tar layer, the container annotation) and is signed with `key`. CheckpointError otherwise:
    `bad-manifest` (not what was asked, or malformed), `wrong-key` (signed with another key), `bad-signature`."""
    if bytes_digest(raw) != digest:
        raise CheckpointError(BAD_MANIFEST, f"manifest bytes hash to {bytes_digest(raw)}, not {digest}")
    try:
        doc = json.loads(raw)
    except ValueError:
        raise CheckpointError(BAD_MANIFEST, "manifest is not JSON") from None
    if not isinstance(doc, dict) or doc.get("schemaVersion") != 2:
        raise CheckpointError(BAD_MANIFEST, "schemaVersion: not an OCI image manifest")
    ann = doc.get("annotations")
    layers = doc.get("layers")
    if not isinstance(ann, dict) or not all(isinstance(v, str) for v in ann.values()):
        raise CheckpointError(BAD_MANIFEST, "annotations: missing or not a map of strings")
    if not isinstance(layers, list) or len(layers) != 1 or not isinstance(layers[0], dict):
        raise CheckpointError(BAD_MANIFEST, "layers: a checkpoint image has exactly one layer (the archive)")
    if layers[0].get("mediaType") != LAYER_TYPE:
        raise CheckpointError(BAD_MANIFEST, f"layers[0].mediaType: {layers[0].get('mediaType')!r}, not {LAYER_TYPE}")
    container = ann.get(CONTAINER_NAME_ANN)
    if not container:
        raise CheckpointError(BAD_MANIFEST, f"annotations.{CONTAINER_NAME_ANN}: missing (not a checkpoint image)")
    sig = ann.get(SIGNATURE_ANN)
    if not sig:
        raise CheckpointError(BAD_SIGNATURE, f"annotations.{SIGNATURE_ANN}: the image is not signed")
    if ann.get(KEY_ID_ANN) != key_id(key):
        raise CheckpointError(WRONG_KEY, f"signed with key {ann.get(KEY_ID_ANN)!r}, this store's key is {key_id(key)}")
    want = hmac.new(key, _signed_bytes(doc), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, sig):
        raise CheckpointError(BAD_SIGNATURE, "signature does not match the manifest (tampered)")
    size = layers[0].get("size")
    return VerifiedImage(digest, container, record_of(ann), str(layers[0].get("digest")),
                         size if isinstance(size, int) else -1, dict(ann))
