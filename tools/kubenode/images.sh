#!/usr/bin/env bash
# The test nodes' images, built locally as OCI-layout tarballs (tools/kubenode/oci.py) and pushed to the lab
# registry: no registry on the internet is needed. Cached outside the repo, keyed by their inputs.
#   images.sh build            build if needed; print the folder holding pause.tar, counter.tar
#   images.sh push REGISTRY    push them (REGISTRY = 127.0.0.1:PORT, plain HTTP); prints "NAME DIGEST" lines
#   images.sh gpudefrag        the gpudefrag image from the repository's Containerfile (tools/kubenode/
#                              containerfile.py: debootstrap + chroot, every step cached); prints the tarball
#   images.sh push-gpudefrag REGISTRY   build it if needed, push it as gpudefrag/gpudefrag:dev
# Names: pause.tar is registry.k8s.io/pause:3.10.1 (imported into each node as its pinned sandbox image);
# counter.tar is gpudefrag/counter:dev in the registry, which the nodes know as
# registry.gpudefrag.test/gpudefrag/counter:dev (or 127.0.0.1:PORT/gpudefrag/counter:dev).
# The counter image: /counter (tools/kubenode/cmd/counter: "started ..." once, then "count N" every 0.2 s;
# HOLD_MIB=N holds N MiB) and busybox (/bin/sh and the usual tools, for exec).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log() { printf '[kubenode] %s\n' "$*" >&2; }
oci() { python3 "$here/oci.py" "$@"; }

build() {  # sets $out
  local bin key
  bin=$("$here/build.sh")
  key=$( (sha256sum "$bin/pause" "$bin/counter" /bin/busybox "$here/oci.py" "$here/images.sh" | cut -c1-64) \
         | sha256sum | cut -c1-12)
  out=${GPUDEFRAG_KUBE_CACHE:-/var/cache/gpudefrag}/kubenode-images-$key
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

gpudefrag_tar=${GPUDEFRAG_KUBE_CACHE:-/var/cache/gpudefrag}/kubenode-images-gpudefrag.tar
gpudefrag() {  # the repository's Containerfile, built without a container builder (containerfile.py; cached steps)
  if ! command -v debootstrap >/dev/null; then
    log "apt-get install debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null \
      || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
  fi
  python3 "$here/containerfile.py" "$here/../.." "$gpudefrag_tar" --ref registry.gpudefrag.test/gpudefrag/gpudefrag:dev
}

case ${1:-build} in
build) build; echo "$out" ;;
gpudefrag) gpudefrag >/dev/null; echo "$gpudefrag_tar" ;;
push-gpudefrag)
  reg=${2:?usage: images.sh push-gpudefrag REGISTRY}
  gpudefrag >/dev/null
  echo "gpudefrag/gpudefrag:dev $(oci push "$gpudefrag_tar" "$reg" gpudefrag/gpudefrag:dev)" ;;
push)
  reg=${2:?usage: images.sh push REGISTRY}
  build
  echo "gpudefrag/pause:3.10.1 $(oci push "$out/pause.tar" "$reg" gpudefrag/pause:3.10.1)"
  echo "gpudefrag/counter:dev $(oci push "$out/counter.tar" "$reg" gpudefrag/counter:dev)" ;;
*) log "usage: images.sh build | push REGISTRY | gpudefrag | push-gpudefrag REGISTRY"; exit 2 ;;
esac
