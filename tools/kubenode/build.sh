#!/usr/bin/env bash
# Build (or reuse) what a real test node runs: the kubelet (k8s.io/kubernetes at the control plane's version, from
# a copy of tools/kubecluster's go.mod), containerd 2.2 + its runc shim + ctr and runc (each from its own Go
# module), the project's fake-GPU device plugin, and the pause and counter programs the test images hold
# (tools/kubenode/cmd). CNI plugins and busybox come from Debian. Cached outside the repo, keyed by the inputs.
#   tools/kubenode/build.sh        build if needed; print the bin folder on stdout
# Env: GPUDEFRAG_KUBE_CACHE (default /var/cache/gpudefrag); GPUDEFRAG_KUBE_NO_BUILD=1 only reuses (exit 1 if absent).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cp_mod=$here/../kubecluster
log() { printf '[kubenode] %s\n' "$*" >&2; }
KUBE_VERSION=v1.35.4
CONTAINERD_VERSION=v2.2.9   # 2.2.x: restore from a checkpoint image via CreateContainer is dropped in 2.4
RUNC_VERSION=v1.3.3
key=$( (cat "$cp_mod/go.mod" "$cp_mod/go.sum" "$here/build.sh"; find "$here/cmd" -type f | sort | xargs cat
        echo "$CONTAINERD_VERSION $RUNC_VERSION") | sha256sum | cut -c1-12)
bin=${GPUDEFRAG_KUBE_CACHE:-/var/cache/gpudefrag}/kubenode-$KUBE_VERSION-$key/bin
want=(kubelet containerd containerd-shim-runc-v2 ctr runc fakegpu-plugin pause counter)
debs=(containernetworking-plugins libseccomp-dev pkg-config busybox-static iptables)
have=1
for b in "${want[@]}"; do [ -x "$bin/$b" ] || have=0; done
for p in bridge host-local loopback portmap; do [ -x "/usr/lib/cni/$p" ] || have=0; done
[ -x /bin/busybox ] || have=0
if [ $have = 1 ]; then echo "$bin"; exit 0; fi

if [ "${GPUDEFRAG_KUBE_NO_BUILD:-}" = 1 ]; then
  log "the real-node binaries are not built ($bin); run tools/kubenode/build.sh (or scripts/setup.sh all)"; exit 1
fi
[ "$(id -u)" = 0 ] || { log "run as root (Debian packages: ${debs[*]})"; exit 1; }
missing=()
for d in "${debs[@]}"; do dpkg -s "$d" >/dev/null 2>&1 || missing+=("$d"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
. "$here/../find-go.sh"
find_go "the real-node binaries"
export GOFLAGS=-mod=mod
start=$(date +%s)
work=$(mktemp -d /tmp/gpudefrag-kubenode-build.XXXXXX)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
mkdir -p "$bin.tmp"

# kubelet + the project's programs, in a copy of the control plane's module: the same pinned versions
log "building kubelet $KUBE_VERSION, fakegpu-plugin, pause, counter"
mkdir -p "$work/kube" && cp "$cp_mod/go.mod" "$cp_mod/go.sum" "$work/kube/" && cp -r "$here/cmd" "$work/kube/"
v=k8s.io/component-base/version
ld="-s -w -X $v.gitVersion=$KUBE_VERSION -X $v.gitMajor=1 -X $v.gitMinor=35 -X $v.gitTreeState=clean"
ld="$ld -X $v.buildDate=1970-01-01T00:00:00Z -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION"
(cd "$work/kube" && CGO_ENABLED=0 nice -n 10 "$GO" build -trimpath -ldflags="$ld" -o "$bin.tmp/" \
  k8s.io/kubernetes/cmd/kubelet ./cmd/fakegpu-plugin ./cmd/pause ./cmd/counter)

modsrc() {  # modsrc MODULE@VERSION DEST: a writable copy of a module's source from the module cache
  local dir
  dir=$(cd "$work" && GOFLAGS= "$GO" mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -n "$dir" ] || { log "go mod download $1 gave no folder"; return 1; }
  cp -r "$dir" "$2" && chmod -R u+w "$2"
}
log "building containerd $CONTAINERD_VERSION (containerd, containerd-shim-runc-v2, ctr)"
modsrc "github.com/containerd/containerd/v2@$CONTAINERD_VERSION" "$work/containerd"
(cd "$work/containerd" && CGO_ENABLED=0 nice -n 10 "$GO" build -trimpath -tags no_btrfs \
  -ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
  -o "$bin.tmp/" ./cmd/containerd ./cmd/containerd-shim-runc-v2 ./cmd/ctr)

# runc's module zip carries a partial vendor/ and a replace pointing at a folder the zip lacks: build from the
# module graph instead, with seccomp (cgo, Debian's libseccomp-dev)
log "building runc $RUNC_VERSION"
modsrc "github.com/opencontainers/runc@$RUNC_VERSION" "$work/runc"
(cd "$work/runc" && rm -rf vendor && sed -i '/^replace github.com\/opencontainers\/selinux/d' go.mod \
  && CGO_ENABLED=1 nice -n 10 "$GO" build -trimpath -tags seccomp \
     -ldflags="-s -w -X main.version=${RUNC_VERSION#v}" -o "$bin.tmp/runc" .)
rm -rf "$bin" && mkdir -p "$(dirname "$bin")" && mv "$bin.tmp" "$bin"
log "built in $(( $(date +%s) - start )) s"
echo "$bin"
