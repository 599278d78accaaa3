#!/usr/bin/env bash
# Set up (idempotent) and run the demo on the embedded cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh python
exec .venv/bin/gpudefrag demo "$@"
