#!/usr/bin/env python3
"""Build an image from a Containerfile where no container builder runs (the test machines: no podman, buildah or
docker, no registry on the internet), as root, into an OCI-layout tarball (tools/kubenode/oci.py).

  containerfile.py CONTEXT OUT.tar --ref REF [--file CONTAINERFILE] [--cache DIR]

What it understands is what the repository's Containerfile uses: FROM debian:<suite>[-slim] (made by
`debootstrap --variant=minbase <suite>` from the machine's Debian mirror), RUN (`/bin/sh -c` in a chroot, in a
private mount namespace with /proc, /dev and the host's resolv.conf), COPY (from CONTEXT, .containerignore
honoured), ENV, USER, WORKDIR, ENTRYPOINT, CMD, LABEL; anything else is an error naming the line. Every step that
changes files is cached as a root filesystem tarball keyed by everything before it (the instruction text and the
copied files' contents), so a change to the sources rebuilds only the steps from the first COPY they touch. The
image is one layer: the final root filesystem."""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oci

PRUNE_AFTER_S = 2 * 3600  # step snapshots unused this long are deleted after a build


def fail(msg: str) -> None:
    sys.exit(f"containerfile.py: {msg}")


def instructions(path: Path) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, argument text), continuation lines joined, comments dropped."""
    out: list[tuple[int, str, str]] = []
    buf, start = "", 0
    for no, line in enumerate(path.read_text().splitlines(), 1):
        s = line.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if buf and s.startswith("#"):
            continue
        if not buf:
            start = no
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        buf += s
        word, _, rest = buf.partition(" ")
        out.append((start, word.upper(), rest.strip()))
        buf = ""
    return out


def ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    for p in patterns:
        bare = p[3:] if p.startswith("**/") else p
        if fnmatch.fnmatch(rel, p) or any(fnmatch.fnmatch(x, bare) for x in parts):
            return True
    return False


def sources(context: Path, srcs: list[str], patterns: list[str]) -> list[tuple[Path, str]]:
    """(file, path relative to what COPY names) for every file COPY copies, sorted."""
    files: list[tuple[Path, str]] = []
    for s in srcs:
        p = (context / s).resolve()
        if not p.is_relative_to(context):
            fail(f"COPY {s}: outside the context {context}")
        if p.is_file():
            files.append((p, p.name))
        elif p.is_dir():
            for f in sorted(p.rglob("*")):
                rel = str(f.relative_to(context))
                if (f.is_file() or f.is_symlink()) and not ignored(rel, patterns):
                    files.append((f, str(f.relative_to(p))))
        else:
            fail(f"COPY {s}: no such file in {context}")
    return files


def digest_files(files: list[tuple[Path, str]]) -> str:
    h = hashlib.sha256()
    for f, rel in files:
        h.update(rel.encode() + b"\0" + oct(f.stat().st_mode & 0o777).encode() + b"\0")
        h.update(os.readlink(f).encode() if f.is_symlink() else f.read_bytes())
    return h.hexdigest()


def apply_copy(root: Path, context: Path, files: list[tuple[Path, str]], srcs: list[str], dest: str) -> None:
    """COPY's meaning: a folder's contents, or several sources, go into dest/; one file may be renamed to dest."""
    d = root / dest.lstrip("/")
    into = dest.endswith("/") or len(srcs) > 1 or (context / srcs[0]).is_dir()
    for f, rel in files:
        target = d / rel if into else d
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target, follow_symlinks=False)


def run_in(root: Path, cmd: str, env: dict[str, str], workdir: str) -> None:
    """`/bin/sh -c cmd` chrooted into root, its mounts in a mount namespace of its own (gone when it exits)."""
    (root / "etc").mkdir(exist_ok=True)
    resolv = root / "etc/resolv.conf"
    if resolv.is_symlink() or not resolv.exists():
        resolv.unlink(missing_ok=True)
        resolv.touch()
    setup = (f"mount -t proc proc {shlex.quote(str(root / 'proc'))} && "
             f"mount --rbind /dev {shlex.quote(str(root / 'dev'))} && "
             f"mount --bind /etc/resolv.conf {shlex.quote(str(resolv))} && ")
    # the build machine's network settings, not baked into the image: its CA bundle (a TLS-inspecting proxy's CA
    # is in it where there is one) over the image's, once the image has one, and its proxy variables
    bundle = root / "etc/ssl/certs/ca-certificates.crt"
    if bundle.is_file() and Path("/etc/ssl/certs/ca-certificates.crt").is_file():
        setup += f"mount --bind /etc/ssl/certs/ca-certificates.crt {shlex.quote(str(bundle))} && "
    setup += f"exec chroot {shlex.quote(str(root))} /bin/sh -c {shlex.quote(f'cd {workdir} && {cmd}')}"
    passed = {k: v for k, v in os.environ.items()
              if k.lower() in ("http_proxy", "https_proxy", "no_proxy")
              or k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")}
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "--fork", "/bin/sh", "-c", setup],
                       env={"HOME": "/root", **passed, **env})
    if p.returncode != 0:
        fail(f"RUN {cmd[:120]}: exit {p.returncode}")


def untar(tar: Path, root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    subprocess.run(["tar", "--numeric-owner", "--xattrs", "-xpf", str(tar), "-C", str(root)], check=True)


def snapshot(root: Path, tar: Path) -> None:
    part = tar.with_suffix(".part")
    subprocess.run(["tar", "--numeric-owner", "--xattrs", "--sort=name", "-cf", str(part), "-C", str(root), "."],
                   check=True)
    part.rename(tar)


def debian_mirror() -> str:
    """The machine's own Debian mirror (as scripts/install-criu.sh finds it), else deb.debian.org."""
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))]
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        m = re.search(r"(https?://\S+/debian)/?(\s|$)", text)
        if m and "security" not in m.group(1):
            return m.group(1)
    return "http://deb.debian.org/debian"


def base(image: str, cache: Path) -> Path:
    """debian:<suite>[-slim] as a minbase debootstrap tarball, made once per suite."""
    name = image.split("/")[-1]
    if not name.startswith("debian:"):
        fail(f"FROM {image}: only debian:<suite>[-slim] can be built here")
    suite = name.split(":", 1)[1].removesuffix("-slim")
    tar = cache / f"base-debian-{suite}.tar"
    if tar.is_file():
        return tar
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        root = Path(tmp) / "root"
        mirror = os.environ.get("GPUDEFRAG_DEBIAN_MIRROR") or debian_mirror()
        print(f"[containerfile] debootstrap --variant=minbase {suite} (once)", file=sys.stderr)
        subprocess.run(["debootstrap", "--variant=minbase", suite, str(root), mirror], check=True,
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
        snapshot(root, tar)
    return tar


def build(args: argparse.Namespace) -> None:
    context = Path(args.context).resolve()
    cfile = Path(args.file).resolve() if args.file else context / "Containerfile"
    cache = Path(args.cache)
    (cache / "steps").mkdir(parents=True, exist_ok=True)
    ignore = context / ".containerignore"
    patterns = [p.strip() for p in ignore.read_text().splitlines() if p.strip() and not p.startswith("#")] \
        if ignore.is_file() else []
    env: dict[str, str] = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    user, workdir, entrypoint, cmd = "", "/", None, None
    labels: dict[str, str] = {}
    key = ""
    current: Path | None = None      # the last snapshot along the chain of steps
    pending: list[tuple[str, str, str]] = []  # steps after `current` not applied yet: (where, word, arg)
    copies: dict[str, tuple[list[tuple[Path, str]], list[str], str]] = {}
    used: list[Path] = []
    steps = instructions(cfile)
    last_fs = max((i for i, (_, w, _) in enumerate(steps) if w in ("RUN", "COPY")), default=-1)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        root = Path(tmp) / "root"
        for i, (no, word, arg) in enumerate(steps):
            where = f"{cfile.name}:{no}"
            if word == "FROM":
                current = base(arg, cache)
                key = hashlib.sha256(f"FROM {arg}".encode()).hexdigest()
                continue
            if current is None:
                fail(f"{where}: {word} before FROM")
            if word == "ENV":
                k, _, v = arg.partition("=") if "=" in arg.split()[0] else arg.partition(" ")
                env[k.strip()] = v.strip().strip('"')
            elif word == "USER":
                user = arg
            elif word == "WORKDIR":
                workdir = arg
            elif word == "LABEL":
                for kv in shlex.split(arg):
                    k, _, v = kv.partition("=")
                    labels[k] = v
            elif word in ("ENTRYPOINT", "CMD"):
                try:
                    val = json.loads(arg)
                except json.JSONDecodeError:
                    val = ["/bin/sh", "-c", arg]
                entrypoint, cmd = (val, cmd) if word == "ENTRYPOINT" else (entrypoint, val)
            elif word in ("RUN", "COPY"):
                if word == "COPY":
                    *srcs, dest = shlex.split(arg)
                    files = sources(context, srcs, patterns)
                    copies[where] = (files, srcs, dest)
                    step = f"COPY {dest} {digest_files(files)}"
                else:
                    step = f"RUN {json.dumps(env, sort_keys=True)} {workdir} {arg}"
                key = hashlib.sha256(f"{key}\n{step}".encode()).hexdigest()
                snap = cache / "steps" / f"{key[:24]}.tar"
                if snap.is_file():  # cached: what came before it needs no applying
                    os.utime(snap)
                    current, pending = snap, []
                    used.append(snap)
                    continue
                pending.append((where, word, arg))
                # COPY is cheap: applied only when a RUN (or the end) that is not cached needs it, and not
                # snapshotted on its own (a snapshot is the whole root filesystem)
                if word == "COPY" and i != last_fs:
                    continue
                untar(current, root)
                for w_where, w_word, w_arg in pending:
                    print(f"[containerfile] {w_where}: {w_word} {w_arg[:80]}", file=sys.stderr)
                    if w_word == "COPY":
                        apply_copy(root, context, *copies[w_where])
                    else:
                        run_in(root, w_arg, env, workdir)
                snapshot(root, snap)
                current, pending = snap, []
                used.append(snap)
            else:
                fail(f"{where}: {word} is not supported here")
        if current is None:
            fail(f"{cfile}: no FROM")
    cfg = argparse.Namespace(out=args.out, ref=args.ref, entrypoint=json.dumps(entrypoint) if entrypoint else None,
                             cmd=cmd, workdir=workdir, env=[f"{k}={v}" for k, v in env.items()], user=user,
                             labels=labels, file=[], tree=[], symlink=[], layer_tar=str(current), annotation=[],
                             replace_env=True)
    # the same root filesystem and settings as the last build of OUT: OUT stands (writing 1 GB again is slow)
    stamp = Path(f"{args.out}.key")
    want = hashlib.sha256(f"{current.name} {sorted(vars(cfg).items())}".encode()).hexdigest()
    if not (Path(args.out).is_file() and stamp.is_file() and stamp.read_text().split()[0] == want):
        digest = oci.build(cfg)
        stamp.write_text(f"{want} {digest}\n")
    print(stamp.read_text().split()[1])
    now = time.time()
    for old in (cache / "steps").glob("*.tar"):
        if old not in used and now - old.stat().st_mtime > PRUNE_AFTER_S:
            old.unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("context")
    ap.add_argument("out")
    ap.add_argument("--ref", required=True)
    ap.add_argument("--file")
    ap.add_argument("--cache", default=os.path.join(os.environ.get("GPUDEFRAG_KUBE_CACHE", "/var/cache/gpudefrag"),
                                                    "containerfile"))
    build(ap.parse_args())


if __name__ == "__main__":
    main()
