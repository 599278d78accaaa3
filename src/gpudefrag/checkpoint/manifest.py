"""The manifest: what a checkpoint folder holds (files, sizes, SHA-256), what it needs (the compatibility
record), and an HMAC-SHA256 signature over all of it.

Loading is strict (pydantic, no coercion, no unknown fields) so a hand-edited or truncated manifest is a
`bad-manifest` naming the field, never a silently different checkpoint.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import PurePosixPath
from typing import Annotated, Any

import msgspec
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ..core.model import Versions
from ..errors import InputError, loc_to_path
from ..fileio import parse_json
from ..snapshot import VersionsIn
from .protocol import BAD_MANIFEST, BAD_WORKLOAD, UNSAFE_PATH, CheckpointError

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"

Hex64 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Name = Annotated[str, Field(min_length=1, max_length=255)]
# A workload id names a job in logs, ids and manifests: printable, no control characters, at most 255.
WorkloadId = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[^\x00-\x1f\x7f]+$")]
_WORKLOAD_ID = TypeAdapter(WorkloadId)


def check_workload_id(workload_id: str) -> None:
    """Refuse (`bad-workload`) an id the manifest would refuse — before a backend stops the job, not after."""
    try:
        _WORKLOAD_ID.validate_python(workload_id, strict=True)
    except ValidationError as e:
        raise CheckpointError(BAD_WORKLOAD, f"workload id {workload_id[:40]!r}{'...' if len(workload_id) > 40 else ''}"
                              f": {e.errors()[0]['msg']}") from None


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)


class FileEntry(_Strict):
    path: Annotated[str, Field(min_length=1, max_length=1024)]
    size: Annotated[int, Field(ge=0)]
    sha256: Hex64


class LinkEntry(_Strict):
    """A symbolic link inside the checkpoint (CRIU's `parent` link from a final dump to its pre-dump images)."""

    path: Annotated[str, Field(min_length=1, max_length=1024)]
    target: Annotated[str, Field(min_length=1, max_length=1024)]


class CompatRecord(VersionsIn):
    """The compatibility record: `gpudefrag.core.model.Versions`, field for field (the snapshot's own model)."""

    @classmethod
    def of(cls, v: Versions) -> CompatRecord:
        return cls(**msgspec.structs.asdict(v))


class Manifest(_Strict):
    format: Annotated[int, Field(ge=1, le=FORMAT_VERSION)] = FORMAT_VERSION
    id: Name
    workload_id: WorkloadId
    backend: Name
    mode: Name
    created_at: str  # ISO 8601, UTC
    created_unix: float
    parent: str | None = None
    files: tuple[FileEntry, ...]
    links: tuple[LinkEntry, ...] = ()
    compat: CompatRecord
    gpus: dict[str, str] = Field(default_factory=dict)  # GPU UUID -> model, as seen at checkpoint time
    info: dict[str, Any] = Field(default_factory=dict)  # backend facts: frozen time, pid, notes, ...
    key_id: Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]
    signature: Hex64 | None = None

    def signed_bytes(self) -> bytes:
        """The bytes the signature covers: every field but the signature, canonical JSON."""
        doc = self.model_dump(mode="json", exclude={"signature"})
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()

    def sign(self, key: bytes) -> Manifest:
        sig = hmac.new(key, self.signed_bytes(), hashlib.sha256).hexdigest()
        return self.model_copy(update={"signature": sig})

    def signature_ok(self, key: bytes) -> bool:
        if self.signature is None:
            return False
        want = hmac.new(key, self.signed_bytes(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(want, self.signature)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def safe_relpath(rel: str) -> bool:
    """A manifest path must stay inside its folder: relative, no '..', no empty parts."""
    p = PurePosixPath(rel)
    return (not p.is_absolute() and ".." not in p.parts and "" not in rel.split("/")
            and rel not in (".", MANIFEST_NAME) and "\0" not in rel)


def link_stays_inside(path: str, target: str) -> bool:
    """A relative link target that, resolved from the link's folder, stays inside the checkpoint."""
    if target.startswith("/") or "\0" in target:
        return False
    depth = 0
    for part in [*PurePosixPath(path).parent.parts, *target.split("/")]:
        if part in ("", "."):
            continue
        depth = depth - 1 if part == ".." else depth + 1
        if depth < 0:
            return False
    return True


def parse_manifest(raw: bytes, source: str) -> Manifest:
    """Bytes -> Manifest, or CheckpointError(bad-manifest | unsafe-path) naming the file and the field."""
    try:  # the guarded parse: duplicate keys, NaN/Infinity, huge numbers and deep nesting are refused
        doc = parse_json(raw, source)
    except InputError as e:
        raise CheckpointError(BAD_MANIFEST, f"{e.where}: {e.message}", path=source) from None
    if not isinstance(doc, dict):
        raise CheckpointError(BAD_MANIFEST, "(document): must be a JSON object", path=source)
    try:
        m = Manifest.model_validate_json(raw)  # JSON mode: arrays are tuples, strictness otherwise kept
    except (RecursionError, ValueError) as e:
        if not isinstance(e, ValidationError):
            raise CheckpointError(BAD_MANIFEST, "(document): not a manifest", path=source) from None
        err = e.errors()[0]
        raise CheckpointError(BAD_MANIFEST, f"{loc_to_path(err['loc'])}: {err['msg']}", path=source) from None
    seen: set[str] = set()
    for i, f in enumerate(m.files):
        if not safe_relpath(f.path):
            raise CheckpointError(UNSAFE_PATH, f"files[{i}].path: {f.path!r} leaves the checkpoint folder",
                                  path=source)
        if f.path in seen:
            raise CheckpointError(BAD_MANIFEST, f"files[{i}].path: {f.path!r} listed twice", path=source)
        seen.add(f.path)
    for i, ln in enumerate(m.links):
        if not safe_relpath(ln.path) or not link_stays_inside(ln.path, ln.target):
            raise CheckpointError(UNSAFE_PATH, f"links[{i}]: {ln.path!r} -> {ln.target!r} leaves the checkpoint "
                                  "folder", path=source)
        if ln.path in seen:
            raise CheckpointError(BAD_MANIFEST, f"links[{i}].path: {ln.path!r} listed twice", path=source)
        seen.add(ln.path)
    return m
