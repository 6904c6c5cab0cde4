#!/usr/bin/env bash
# Set up (if needed) and run every test tier: unit, multi-process gloo, MPI, Ray, end-to-end.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/browser.sh
export OMP_NUM_THREADS=1
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "$@"
