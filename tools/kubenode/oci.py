#!/usr/bin/env python3
"""Build single-layer OCI images as OCI-layout tarballs and push them to a plain-HTTP registry, with the standard
library only: the test nodes' images (pause, counter, the gpudefrag image) are made here without docker, buildah
or a registry on the internet.

  oci.py build OUT.tar --ref REF [--entrypoint JSON] [--env K=V]... [--workdir D]
               [--file SRC:DEST[:MODE]]... [--symlink DEST:TARGET]... [--tree SRC:DEST]... [--layer-tar TAR]
               [--annotation K=V]...    (manifest annotations: a CRIU checkpoint image names its container with
                                         org.criu.checkpoint.container.name, its layer the kubelet's archive)
  oci.py push OUT.tar REGISTRY REPO:TAG        e.g. push counter.tar 127.0.0.1:5000 gpudefrag/counter:dev

Layers are uncompressed tars with fixed owners and times, so the same inputs give the same digests (a rebuild of
unchanged inputs is a no-op for the registry and the nodes). `ctr images import` reads the tarball; the index
names the image (org.opencontainers.image.ref.name, io.containerd.image.name)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"


def _info(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name.lstrip("/"))
    ti.type, ti.mode, ti.size, ti.linkname = kind, mode, size, link
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = "root"
    ti.mtime = 0
    return ti


def _dirs(tar: tarfile.TarFile, seen: set[str], path: str) -> None:
    parts = Path(path.lstrip("/")).parent.parts
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d not in seen:
            seen.add(d)
            tar.addfile(_info(d, tarfile.DIRTYPE, 0o755))


def build_layer(args: argparse.Namespace, out: Path) -> None:
    """Write the layer tar: --layer-tar copied as is, else the files, trees and links named."""
    if args.layer_tar:
        try:  # a hard link where it can be (a root filesystem layer is a gigabyte)
            os.link(args.layer_tar, out)
        except OSError:
            shutil.copyfile(args.layer_tar, out)
        return
    seen: set[str] = set()
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        entries: list[tuple[str, tarfile.TarInfo, Path | None]] = []
        for spec in args.file:
            src, dest, *mode = spec.split(":")
            st = os.stat(src)
            entries.append((dest, _info(dest, tarfile.REGTYPE, int(mode[0], 8) if mode else st.st_mode & 0o777,
                                        st.st_size), Path(src)))
        for spec in args.tree:
            src, dest = spec.split(":")
            for root, dirs, files in os.walk(src):
                dirs.sort()
                rel = os.path.relpath(root, src)
                base = dest if rel == "." else f"{dest.rstrip('/')}/{rel}"
                entries.append((base + "/", _info(base, tarfile.DIRTYPE, 0o755), None))
                for f in sorted(files):
                    p = Path(root) / f
                    target = f"{base.rstrip('/')}/{f}"
                    if p.is_symlink():
                        entries.append((target, _info(target, tarfile.SYMTYPE, 0o777, link=os.readlink(p)), None))
                    else:
                        st = p.stat()
                        entries.append((target, _info(target, tarfile.REGTYPE, st.st_mode & 0o777, st.st_size), p))
        for spec in args.symlink:
            dest, target = spec.split(":")
            entries.append((dest, _info(dest, tarfile.SYMTYPE, 0o777, link=target), None))
        for dest, ti, src in sorted(entries, key=lambda e: e[0]):
            _dirs(tar, seen, dest.rstrip("/") + ("/x" if ti.isdir() else ""))
            if ti.isdir():
                if ti.name in seen:
                    continue
                seen.add(ti.name)
            if src is None:
                tar.addfile(ti)
            else:
                with src.open("rb") as f:
                    tar.addfile(ti, f)


def _blob(root: Path, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs/sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def build(args: argparse.Namespace) -> str:
    out = Path(args.out)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        root = Path(tmp) / "layout"
        (root / "blobs/sha256").mkdir(parents=True)
        layer = Path(tmp) / "layer.tar"
        build_layer(args, layer)
        h = hashlib.sha256()
        with layer.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        diff_id = f"sha256:{h.hexdigest()}"
        layer.rename(root / "blobs/sha256" / h.hexdigest())
        env = list(args.env) if getattr(args, "replace_env", False) else \
            ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", *args.env]
        image_cfg: dict[str, object] = {"Env": env, "WorkingDir": args.workdir}
        if args.entrypoint:
            image_cfg["Entrypoint"] = json.loads(args.entrypoint)
        if getattr(args, "cmd", None):
            image_cfg["Cmd"] = args.cmd
        if getattr(args, "user", ""):
            image_cfg["User"] = args.user
        if getattr(args, "labels", None):
            image_cfg["Labels"] = args.labels
        config = {"architecture": "amd64", "os": "linux", "config": image_cfg,
                  "rootfs": {"type": "layers", "diff_ids": [diff_id]}}
        cfg = _blob(root, json.dumps(config, sort_keys=True).encode())
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST, "config": {"mediaType": CONFIG, **cfg},
                    "layers": [{"mediaType": LAYER, "digest": diff_id,
                                "size": (root / "blobs/sha256" / diff_id.split(":")[1]).stat().st_size}]}
        if args.annotation:
            manifest["annotations"] = dict(a.split("=", 1) for a in args.annotation)
        man = _blob(root, json.dumps(manifest, sort_keys=True).encode())
        tag = args.ref.rsplit(":", 1)[1] if ":" in args.ref.rsplit("/", 1)[-1] else "latest"
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": [{"mediaType": MANIFEST, **man,
                                "annotations": {"org.opencontainers.image.ref.name": tag,
                                                "io.containerd.image.name": args.ref}}]}
        (root / "index.json").write_text(json.dumps(index, sort_keys=True))
        (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        part = Path(tmp) / "image.tar"
        with tarfile.open(part, "w") as tar:
            for p in sorted(root.rglob("*")):
                rel = str(p.relative_to(root))
                if p.is_dir():
                    tar.addfile(_info(rel, tarfile.DIRTYPE, 0o755))
                else:
                    with p.open("rb") as f:
                        tar.addfile(_info(rel, tarfile.REGTYPE, 0o644, p.stat().st_size), f)
        part.rename(out)
    return str(man["digest"])


def _request(method: str, url: str, data: bytes | None = None, headers: dict[str, str] | None = None,
             ) -> tuple[int, dict[str, str]]:
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)


def push(args: argparse.Namespace) -> None:
    """Blobs first (skipped when the registry has them), then the manifest under the tag; prints the digest."""
    repo, tag = args.name.rsplit(":", 1)
    base = f"http://{args.registry}/v2/{repo}"
    with tarfile.open(args.tar) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        desc = index["manifests"][0]
        man_bytes = tar.extractfile(f"blobs/sha256/{desc['digest'].split(':')[1]}").read()  # type: ignore[union-attr]
        manifest = json.loads(man_bytes)
        for d in [manifest["config"], *manifest["layers"]]:
            if _request("HEAD", f"{base}/blobs/{d['digest']}")[0] == 200:
                continue
            code, hdrs = _request("POST", f"{base}/blobs/uploads/")
            if code != 202:
                sys.exit(f"oci.py: {args.registry}: starting an upload to {repo} answered {code}")
            loc = hdrs["Location"]
            loc = loc if loc.startswith("http") else f"http://{args.registry}{loc}"
            data = tar.extractfile(f"blobs/sha256/{d['digest'].split(':')[1]}").read()  # type: ignore[union-attr]
            sep = "&" if "?" in loc else "?"
            code, _ = _request("PUT", f"{loc}{sep}digest={d['digest']}", data,
                               {"Content-Type": "application/octet-stream"})
            if code != 201:
                sys.exit(f"oci.py: {args.registry}: uploading {d['digest']} to {repo} answered {code}")
    code, _ = _request("PUT", f"{base}/manifests/{tag}", man_bytes, {"Content-Type": MANIFEST})
    if code != 201:
        sys.exit(f"oci.py: {args.registry}: putting the manifest {repo}:{tag} answered {code}")
    print(desc["digest"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="action", required=True)
    b = sub.add_parser("build")
    b.add_argument("out")
    b.add_argument("--ref", required=True)
    b.add_argument("--entrypoint")
    b.add_argument("--workdir", default="/")
    b.add_argument("--env", action="append", default=[])
    b.add_argument("--file", action="append", default=[])
    b.add_argument("--tree", action="append", default=[])
    b.add_argument("--symlink", action="append", default=[])
    b.add_argument("--layer-tar")
    b.add_argument("--annotation", action="append", default=[])
    p = sub.add_parser("push")
    p.add_argument("tar")
    p.add_argument("registry")
    p.add_argument("name")
    args = ap.parse_args()
    if args.action == "build":
        print(build(args))
    else:
        push(args)


if __name__ == "__main__":
    main()
