"""Push and fetch checkpoint images over the OCI distribution HTTP API (what CNCF distribution / Debian's
`docker-registry` serve): the node agent pushes the archive and the manifest, the controller fetches the
manifest by digest to check its signature and compatibility record before a replacement pod names it.

Only what that needs: blob existence (HEAD), a monolithic upload (POST then PUT with the digest, streamed from
the file so a many-GiB archive is never held in memory), manifest PUT and GET. No auth: the registry is reached
over the node's own network (127.0.0.1 in the test cluster); a TLS registry works with an `https://` URL.
"""

from __future__ import annotations

import http.client
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin, urlsplit

from ..core.model import Versions
from .oci_image import MANIFEST_TYPE, CheckpointImage, verify_manifest
from .protocol import UNAVAILABLE, CheckpointError

_REPO_RE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


class RegistryError(CheckpointError):
    """The registry could not be reached or refused a request (`status` 0: not reached)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(UNAVAILABLE, f"registry: {detail}")
        self.status = status


def repository_name(raw: str) -> str:
    """A repository name the distribution spec accepts (lower case, `[._-]` separators), made from pod names."""
    s = re.sub(r"[^a-z0-9/._-]+", "-", raw.lower())
    s = re.sub(r"[._-]{2,}", "-", s)
    s = "/".join(p.strip("._-") for p in s.split("/") if p.strip("._-"))
    if not _REPO_RE.match(s):
        raise ValueError(f"cannot make a repository name of {raw!r}")
    return s


@dataclass(frozen=True)
class Registry:
    """`url`: http(s)://host:port where this process reaches the registry; `name`: what image references start
    with (default: the URL's host:port) — the name the nodes' runtime resolves, which may differ from the
    address a pod or the agent uses (a node-local alias, 127.0.0.1 on the host network)."""

    url: str
    timeout_s: float = 60.0
    ca_file: str | None = None
    name: str | None = None

    @property
    def host(self) -> str:
        return self.name or urlsplit(self.url).netloc

    def reference(self, repo: str, digest: str) -> str:
        """The digest-pinned image reference a pod spec names."""
        return f"{self.host}/{repo}@{digest}"

    def _conn(self) -> http.client.HTTPConnection:
        u = urlsplit(self.url)
        if u.scheme == "https":
            ctx = ssl.create_default_context(cafile=self.ca_file)
            return http.client.HTTPSConnection(u.netloc, timeout=self.timeout_s, context=ctx)
        if u.scheme != "http":
            raise ValueError(f"registry URL must be http:// or https://, not {self.url!r}")
        return http.client.HTTPConnection(u.netloc, timeout=self.timeout_s)

    def _request(self, method: str, path: str, body: bytes | object | None = None,
                 headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        conn = self._conn()
        try:
            conn.request(method, path, body=body, headers=headers or {})  # type: ignore[arg-type]
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        except (OSError, http.client.HTTPException) as e:
            raise RegistryError(0, f"{method} {self.url}{path}: {e}") from None
        finally:
            conn.close()

    def _check(self, what: str, status: int, data: bytes, ok: tuple[int, ...]) -> None:
        if status not in ok:
            raise RegistryError(status, f"{what}: HTTP {status} {data[:300].decode('utf-8', 'replace').strip()}")

    def has_blob(self, repo: str, digest: str) -> bool:
        status, _, data = self._request("HEAD", f"/v2/{repo}/blobs/{digest}")
        if status == 404:
            return False
        self._check(f"HEAD blob {digest}", status, data, (200,))
        return True

    def push_blob(self, repo: str, digest: str, size: int, *, data: bytes | None = None,
                  path: Path | None = None) -> None:
        """Upload one blob unless the registry has it: bytes, or a file streamed from disk."""
        if self.has_blob(repo, digest):
            return
        status, hdr, body = self._request("POST", f"/v2/{repo}/blobs/uploads/", b"", {"Content-Length": "0"})
        self._check("start upload", status, body, (202,))
        loc = hdr.get("location")
        if not loc:
            raise RegistryError(status, "start upload: no Location header")
        u = urlsplit(urljoin(self.url + "/", loc))
        put = f"{u.path}?{u.query + '&' if u.query else ''}digest={digest}"
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        if path is not None:
            with open(path, "rb") as f:
                status, _, body = self._request("PUT", put, f, headers)
        else:
            status, _, body = self._request("PUT", put, data or b"", headers)
        self._check(f"upload {digest}", status, body, (201,))

    def push(self, repo: str, image: CheckpointImage, tag: str | None = None) -> str:
        """Push the archive, the config and the manifest; returns the digest-pinned reference. The manifest goes
        last: a push refused on the way (a read-only or full registry, a proxy's 403) leaves at most blobs no
        manifest names, and no reference to hand out. The error says which push failed, where, and whether the
        registry was not reached or answered with a refusal (its status and message)."""
        ref = tag or image.digest
        try:
            self.push_blob(repo, image.layer_digest, image.layer_size, path=image.archive)
            self.push_blob(repo, image.config_digest, len(image.config), data=image.config)
            status, hdr, body = self._request("PUT", f"/v2/{repo}/manifests/{ref}", image.manifest,
                                              {"Content-Type": MANIFEST_TYPE})
            self._check("put manifest", status, body, (201,))
            got = hdr.get("docker-content-digest")
            if got and got != image.digest:
                raise RegistryError(status, f"put manifest: the registry stored {got}, not {image.digest}")
        except RegistryError as e:
            how = "could not be reached" if e.status == 0 else f"refused it (HTTP {e.status})"
            raise RegistryError(e.status, f"push of {repo}:{ref} to {self.url}: the registry {how}: "
                                f"{e.detail.removeprefix('registry: ')}") from None
        return self.reference(repo, image.digest)

    def manifest(self, repo: str, digest: str) -> bytes:
        """The manifest bytes of `repo@digest` (checked against the digest by the caller's verification)."""
        if not _DIGEST_RE.match(digest):
            raise ValueError(f"not a sha256 digest: {digest!r}")
        status, _, body = self._request("GET", f"/v2/{repo}/manifests/{digest}", headers={"Accept": MANIFEST_TYPE})
        self._check(f"get manifest {repo}@{digest}", status, body, (200,))
        return body


def split_reference(ref: str) -> tuple[str, str, str]:
    """`host:port/repo@sha256:...` -> (host, repo, digest); ValueError for a reference not pinned by digest."""
    name, sep, digest = ref.partition("@")
    host, _, repo = name.partition("/")
    if not sep or not _DIGEST_RE.match(digest) or not repo or not _REPO_RE.match(repo):
        raise ValueError(f"not a digest-pinned image reference: {ref!r}")
    return host, repo, digest


def image_verifier(registry: Registry, key: bytes) -> Callable[[str], Versions]:
    """The controller's check before a replacement names an image: the reference is in the configured registry
    and pinned by digest, the manifest fetched is that digest, it is a checkpoint image signed with the store's
    key. Returns the compatibility record it carries (compared with the target node by the caller)."""

    def verify(ref: str) -> Versions:
        host, repo, digest = split_reference(ref)
        if host != registry.host:
            raise CheckpointError(UNAVAILABLE, f"{ref} is not in the configured registry {registry.host}")
        return verify_manifest(registry.manifest(repo, digest), digest, key).record

    return verify
