#!/usr/bin/env bash
# Build (or reuse) the local Kubernetes control plane the real-cluster tests run: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl (one release, from this folder's go.mod) and KWOK.
# Binaries are cached outside the repo, keyed by go.mod/go.sum, so a second run is instant.
#   tools/kubecluster/build.sh        build if needed; print the bin folder on stdout
# Env: GPUDEFRAG_KUBE_CACHE (default /var/cache/gpudefrag), GOTOOLCHAIN honoured (default auto: go.mod asks for 1.25).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log() { printf '[kubecluster] %s\n' "$*" >&2; }
KUBE_VERSION=v1.35.4
KWOK_VERSION=v0.7.0
key=$( (cat "$here/go.mod" "$here/go.sum"; echo "kwok $KWOK_VERSION") | sha256sum | cut -c1-12)
bin=${GPUDEFRAG_KUBE_CACHE:-/var/cache/gpudefrag}/kube-$KUBE_VERSION-$key/bin
want=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)
have=1
for b in "${want[@]}"; do [ -x "$bin/$b" ] || have=0; done
if [ $have = 1 ]; then echo "$bin"; exit 0; fi

if [ "${GPUDEFRAG_KUBE_NO_BUILD:-}" = 1 ]; then
  log "the control plane is not built ($bin); run tools/kubecluster/build.sh (or scripts/setup.sh all)"; exit 1
fi
. "$here/../find-go.sh"
find_go "the control plane"
mkdir -p "$bin.tmp"
export CGO_ENABLED=0 GOFLAGS=-mod=mod
v=k8s.io/component-base/version
ld="-s -w -X $v.gitVersion=$KUBE_VERSION -X $v.gitMajor=1 -X $v.gitMinor=35 -X $v.gitTreeState=clean"
ld="$ld -X $v.buildDate=1970-01-01T00:00:00Z -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION"
start=$(date +%s)
log "building Kubernetes $KUBE_VERSION (kube-apiserver, controller-manager, scheduler, kubectl) into $bin"
(cd "$here" && nice -n 10 "$GO" build -trimpath -ldflags="$ld" -o "$bin.tmp/" k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
log "building etcd"
(cd "$here" && nice -n 10 "$GO" build -trimpath -ldflags="-s -w" -o "$bin.tmp/etcd" go.etcd.io/etcd/server/v3)
log "building KWOK $KWOK_VERSION"
(cd "$here" && GOFLAGS= GOBIN="$bin.tmp" nice -n 10 "$GO" install -trimpath -ldflags="-s -w" \
  "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION")
rm -rf "$bin" && mkdir -p "$(dirname "$bin")" && mv "$bin.tmp" "$bin"
log "built in $(( $(date +%s) - start )) s"
echo "$bin"
