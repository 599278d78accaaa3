#!/usr/bin/env bash
# Set up (idempotent) and run the demo on the embedded cluster: only what the demo needs is installed
# (gpudefrag and its runtime dependencies, not the test tools or PyTorch: scripts/setup.sh python adds those).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh demo
exec .venv/bin/gpudefrag demo "$@"
