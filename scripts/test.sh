#!/usr/bin/env bash
# Set up everything (idempotent), then run the linter and the whole test suite: the real Slurm, CRIU and
# Chromium tests included (their fixtures start what they need).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh all
.venv/bin/ruff check src tests benchmarks
exec .venv/bin/python -m pytest "$@"
