#!/usr/bin/env bash
# Set up everything gpudefrag needs on a fresh Debian 12/13 machine (as root). Idempotent.
#   scripts/setup.sh demo     the venv (.venv) with gpudefrag and its runtime dependencies only (what
#                             ./scripts/demo.sh needs: no test tools, no PyTorch)
#   scripts/setup.sh python   the venv with the development extras too (pytest, hypothesis, ruff, PyTorch...)
#   scripts/setup.sh all      also the Debian packages the tests drive for real: Slurm + munge, CRIU >= 4.1,
#                             Chromium (dashboard browser test), the local Kubernetes control plane (Go) and
#                             its real nodes (kubelet, containerd, runc, CNI plugins, the test images)
set -euo pipefail
cd "$(dirname "$0")/.."
want=${1:-python}
log() { printf '[setup] %s\n' "$*" >&2; }

apt_updated=0
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  if [ $apt_updated = 0 ]; then apt-get update -qq >/dev/null; apt_updated=1; fi
  log "apt-get install $*"
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if [ "$want" = all ]; then
  need=()
  for b in slurmctld slurmd sbatch munged; do
    command -v "$b" >/dev/null 2>&1 || { need+=(slurm-wlm slurmctld slurmd slurm-client munge); break; }
  done
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  command -v ip >/dev/null 2>&1 || need+=(iproute2)
  command -v sqlite3 >/dev/null 2>&1 || need+=(sqlite3)
  command -v docker-registry >/dev/null 2>&1 || need+=(docker-registry)  # checkpoint images (OCI distribution)
  [ ${#need[@]} -eq 0 ] || apt_install "${need[@]}"
  scripts/install-criu.sh
  # the gpudefrag image (Containerfile; debootstrap + pip: mostly network) beside the Go builds (CPU)
  tools/kubenode/images.sh gpudefrag >/tmp/gpudefrag-image-build.log 2>&1 &
  image_build=$!
  tools/kubecluster/build.sh >/dev/null  # the Kubernetes control plane (cached; ~20 min the first time)
  tools/kubenode/build.sh >/dev/null     # real nodes: kubelet, containerd, runc, device plugin (cached)
  tools/kubenode/images.sh build >/dev/null  # their images: pause, counter (cached)
  wait "$image_build" || { tail -20 /tmp/gpudefrag-image-build.log >&2; log "building the gpudefrag image failed"; exit 1; }
fi

PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  log "Python >= 3.11 is required ($PY is $("$PY" --version 2>&1))"; exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv 2>/dev/null || { apt_install python3-venv; "$PY" -m venv .venv; }
fi
# the stamp says what is installed for which pyproject.toml: "<digest>" (with the dev extras) or "demo <digest>"
stamp=.venv/.gpudefrag-deps
digest=$(sha256sum pyproject.toml | cut -c1-16)
have=$(cat "$stamp" 2>/dev/null || true)
if [ "$want" = demo ]; then spec=.; ok="$digest|demo $digest"; mark="demo $digest"
else spec='.[dev]'; ok="$digest"; mark="$digest"; fi
if ! [[ "$have" =~ ^($ok)$ ]] || ! .venv/bin/python -c 'import gpudefrag' 2>/dev/null; then
  log "installing Python packages into .venv ($spec)"
  .venv/bin/python -m pip install -q --disable-pip-version-check -U pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -e "$spec"
  echo "$mark" > "$stamp"
fi
