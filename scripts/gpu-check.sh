#!/usr/bin/env bash
# Prove the CUDA checkpoint path on a machine with an NVIDIA GPU (driver >= 570, PyTorch with CUDA,
# cuda-bindings): first the driver half alone on a live PyTorch process (lock, checkpoint, restore, unlock;
# gpu-check-in-place.json), then the whole path: the process checkpointed through gpudefrag's CUDA backend
# (driver + CRIU), killed, restored and verified; prints times and GB/s and writes gpu-check.json (or --out FILE).
#   scripts/gpu-check.sh [--gib 1,4] [--out FILE]
# Needs CRIU >= 4.1: on PATH (scripts/install-criu.sh), $GPUDEFRAG_CRIU, or a copy of the Debian 13 criu
# prefix (/opt/gpudefrag/criu-root) at ./.criu-root for machines that cannot download it. Python packages the
# GPU image lacks (pydantic and its three helpers) may be carried as wheels in ./.whl. docs/checkpoint.md says how.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -z "${GPUDEFRAG_CRIU:-}" ] && ! command -v criu >/dev/null 2>&1; then
  if [ -x .criu-root/usr/sbin/criu ]; then
    root=$PWD/.criu-root lib=$PWD/.criu-root/usr/lib/x86_64-linux-gnu
    printf '#!/bin/sh\nexec %s/ld-linux-x86-64.so.2 --library-path %s %s/usr/sbin/criu "$@"\n' "$lib" "$lib" "$root" \
      > /tmp/gpudefrag-criu && chmod 755 /tmp/gpudefrag-criu
    export GPUDEFRAG_CRIU=/tmp/gpudefrag-criu
  else
    echo "gpu-check: no criu (run scripts/install-criu.sh, set GPUDEFRAG_CRIU, or provide .criu-root)" >&2; exit 1
  fi
fi
if ! "$PY" -c 'import pydantic' 2>/dev/null && [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpudefrag-site .whl/*.whl
  export PYTHONPATH=/tmp/gpudefrag-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv 2>/dev/null || echo "nvidia-smi: not available"
"${GPUDEFRAG_CRIU:-criu}" --version | head -1
uname -r
# the driver half first (lock, checkpoint, restore, unlock a live process; no CRIU), then the whole path
"$PY" scripts/gpu_check.py --in-place --gib 1 --out "${GPU_CHECK_INPLACE_OUT:-gpu-check-in-place.json}" || inplace=$?
if ! "${GPUDEFRAG_CRIU:-criu}" check; then
  echo "gpu-check: criu check failed on this kernel: only the CUDA driver half (above) could be checked here" >&2
  exit 1
fi
"$PY" scripts/gpu_check.py "$@" || exit $?
exit "${inplace:-0}"
