#!/usr/bin/env bash
# Run the benchmarks and print a table: scripts/bench.sh [--quick] [core planner sim checkpoint ...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh python
exec .venv/bin/python benchmarks/run.py "$@"
