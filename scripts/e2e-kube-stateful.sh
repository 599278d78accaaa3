#!/usr/bin/env bash
# The Kubernetes move with state, end to end, by the deployed controller (issue 26): a control plane with two
# real kubelet nodes and a KWOK node, gpudefrag deployed with `kubectl apply -k` (deploy/kubernetes + the lab's
# overlay), a counter pod moved from real-a to real-b with its state so that a pending 8-GPU pod gets real-a.
# Prints one JSON line; exits 0 when the move happened as it should. Idempotent: starts from nothing, tears down
# what it started. Run as root, after `scripts/setup.sh all` (or it builds what it needs itself).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || scripts/setup.sh python >&2
exec .venv/bin/python scripts/e2e_kube_stateful.py "$@"
