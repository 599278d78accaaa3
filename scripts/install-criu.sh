#!/usr/bin/env bash
# Install CRIU >= 4.1 (needed on kernels >= 6.13: older CRIU fails `criu check` on the vDSO layout).
# Debian 13: the distribution's package. Debian 12: Debian 13's package unpacked into a private prefix and run
# through Debian 13's own loader, so the system's C library is never touched. Idempotent.
# Result: a working `criu` on PATH (/usr/local/sbin/criu wrapper on Debian 12). gpudefrag drives the criu CLI
# (why: src/gpudefrag/checkpoint/criu.py), so pycriu is not needed; python3-pycriu is unpacked beside it only
# for `crit` (inspecting images by hand: PYTHONPATH=$PREFIX/usr/lib/python3/dist-packages).
set -euo pipefail
PREFIX=${GPUDEFRAG_CRIU_PREFIX:-/opt/gpudefrag/criu-root}
log() { printf '[install-criu] %s\n' "$*" >&2; }

criu_ok() {
  local v
  v=$(criu --version 2>/dev/null | sed -n 's/^Version: *//p') || return 1
  [ -n "$v" ] || return 1
  python3 - "$v" <<'PY' || return 1
import sys
major, minor = (int(x) for x in sys.argv[1].split(".")[:2])
sys.exit(0 if (major, minor) >= (4, 1) else 1)
PY
}

if criu_ok && criu check >/dev/null 2>&1; then
  log "criu $(criu --version | sed -n 's/^Version: *//p') already works"; exit 0
fi
[ "$(id -u)" = 0 ] || { log "must run as root to install CRIU"; exit 1; }
export DEBIAN_FRONTEND=noninteractive
major=$(cut -d. -f1 /etc/debian_version 2>/dev/null || echo 0)
case "$major" in
  13|trixie*|forky*)
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends criu python3-pycriu python3-protobuf >/dev/null
    ;;
  12)
    mirror=$(grep -hoE 'https?://[^ ]+/debian/?$' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
             | grep -v security | head -1 || true)
    mirror=${mirror:-http://deb.debian.org/debian}
    apt_dir=/var/lib/gpudefrag/apt-trixie
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$PREFIX"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${mirror%/} trixie main" > "$apt_dir/sources.list"
    opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=-"
          -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache::archives=$apt_dir/archives"
          -o "APT::Get::List-Cleanup=0")
    log "fetching Debian 13's criu into $PREFIX (private loader; the system libc is untouched)"
    apt-get "${opts[@]}" update -qq >/dev/null
    pkgs=(criu libc6 libcompel1 libgnutls30t64 libnftables1 libnl-3-200 libprotobuf-c1 libbsd0 libnet1 libuuid1
          libmd0 libidn2-0 libp11-kit0 libtasn1-6 libunistring5 libnettle8t64 libhogweed6t64 libgmp10 libffi8
          libmnl0 libnftnl11 libjansson4 libxtables12 libedit2 libtinfo6 python3-pycriu)
    (cd "$apt_dir/archives" && apt-get "${opts[@]}" download "${pkgs[@]}" >/dev/null)
    for deb in "$apt_dir"/archives/*.deb; do dpkg-deb -x "$deb" "$PREFIX"; done
    lib=$PREFIX/usr/lib/x86_64-linux-gnu
    cat > /usr/local/sbin/criu <<WRAP
#!/bin/sh
# CRIU 4.x from Debian 13, run with its own C library (installed by gpudefrag's scripts/install-criu.sh)
exec $lib/ld-linux-x86-64.so.2 --library-path $lib $PREFIX/usr/sbin/criu "\$@"
WRAP
    chmod 755 /usr/local/sbin/criu
    ;;
  *) log "unsupported Debian version '$(cat /etc/debian_version)'"; exit 1 ;;
esac
hash -r
criu_ok || { log "criu >= 4.1 not found after install"; exit 1; }
if ! out=$(criu check 2>&1); then
  log "criu check failed: $out"; exit 1
fi
log "criu $(criu --version | sed -n 's/^Version: *//p'): $out"
