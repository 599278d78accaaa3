#!/usr/bin/env bash
# Set up everything (idempotent), then run the linter and the whole test suite: the real Slurm, CRIU and
# Chromium tests, the real Kubernetes control plane and its real nodes included (their fixtures start what they need).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh all
# the real parts must run here: a missing Slurm, CRIU, trace or control plane fails the run instead of skipping
export GPUDEFRAG_REQUIRE_SLURM=${GPUDEFRAG_REQUIRE_SLURM:-1} GPUDEFRAG_REQUIRE_TRACE=${GPUDEFRAG_REQUIRE_TRACE:-1}
export GPUDEFRAG_REQUIRE_KUBE=${GPUDEFRAG_REQUIRE_KUBE:-1} GPUDEFRAG_REQUIRE_CRIU=${GPUDEFRAG_REQUIRE_CRIU:-1}
export GPUDEFRAG_REQUIRE_REGISTRY=${GPUDEFRAG_REQUIRE_REGISTRY:-1}
export GPUDEFRAG_REQUIRE_RAY=${GPUDEFRAG_REQUIRE_RAY:-1}
export GPUDEFRAG_REQUIRE_KUBE_NODES=${GPUDEFRAG_REQUIRE_KUBE_NODES:-1}
.venv/bin/ruff check src tests benchmarks
exec .venv/bin/python -m pytest "$@"
