#!/usr/bin/env bash
# The test nodes' images, built locally as OCI-layout tarballs (tools/kubenode/oci.py) and pushed to the lab
# registry: no registry on the internet is needed. Cached outside the repo, keyed by their inputs.
#   images.sh build            build if needed; print the folder holding pause.tar, counter.tar
#   images.sh push REGISTRY    push them (REGISTRY = 127.0.0.1:PORT, plain HTTP); prints "NAME DIGEST" lines
# Names: pause.tar is registry.k8s.io/pause:3.10.1 (imported into each node as its pinned sandbox image);
# counter.tar is gpudefrag/counter:dev in the registry, which the nodes know as
# registry.gpudefrag.test/gpudefrag/counter:dev (or 127.0.0.1:PORT/gpudefrag/counter:dev).
# The counter image: /counter (tools/kubenode/cmd/counter: "started ..." once, then "count N" every 0.2 s;
# HOLD_MIB=N holds N MiB) and busybox (/bin/sh and the usual tools, for exec).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log() { printf '[kubenode] %s\n' "$*" >&2; }
bin=$("$here/build.sh")
key=$( (sha256sum "$bin/pause" "$bin/counter" /bin/busybox "$here/oci.py" "$here/images.sh" | cut -c1-64) \
       | sha256sum | cut -c1-12)
out=${GPUDEFRAG_KUBE_CACHE:-/var/cache/gpudefrag}/kubenode-images-$key
oci() { python3 "$here/oci.py" "$@"; }

build() {
  [ -f "$out/counter.tar" ] && [ -f "$out/pause.tar" ] && return 0
  mkdir -p "$out.tmp"
  oci build "$out.tmp/pause.tar" --ref registry.k8s.io/pause:3.10.1 --entrypoint '["/pause"]' \
    --file "$bin/pause:/pause:755" >/dev/null
  local links=()
  for t in sh cat ls sleep echo date ps kill grep sed head tail wc mkdir rm cp mv true false env id test; do
    links+=(--symlink "/bin/$t:busybox")
  done
  oci build "$out.tmp/counter.tar" --ref registry.gpudefrag.test/gpudefrag/counter:dev --entrypoint '["/counter"]' \
    --file "$bin/counter:/counter:755" --file /bin/busybox:/bin/busybox:755 "${links[@]}" >/dev/null
  rm -rf "$out" && mv "$out.tmp" "$out"
  log "images built in $out"
}

case ${1:-build} in
build) build; echo "$out" ;;
push)
  reg=${2:?usage: images.sh push REGISTRY}
  build
  echo "gpudefrag/pause:3.10.1 $(oci push "$out/pause.tar" "$reg" gpudefrag/pause:3.10.1)"
  echo "gpudefrag/counter:dev $(oci push "$out/counter.tar" "$reg" gpudefrag/counter:dev)" ;;
*) log "usage: images.sh build | push REGISTRY"; exit 2 ;;
esac
