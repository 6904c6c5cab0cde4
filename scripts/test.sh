#!/usr/bin/env bash
# Set up (if needed) and run every test tier: unit, multi-process gloo, MPI, Ray, end-to-end.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/browser.sh
export OMP_NUM_THREADS=1
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Two xdist workers: the tiers mostly wait (sleeps, timeouts, process start-up), so two run
# in about the time of one; tests/conftest.py keeps together what must share a worker.
# Arguments pass through to pytest and come last: `scripts/test.sh -n 0` runs in one process.
exec .venv/bin/python -m pytest -n 2 --dist loadgroup "$@"
