#!/usr/bin/env bash
# Set up (if needed) and run every test tier: unit, multi-process gloo, MPI, Ray, end-to-end.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/system-packages.sh &  # apt's download and unpacking overlap the Python installs
packages=$!
scripts/bootstrap.sh
# DeepSpeed compiles its CPU collective op on first use (about a minute of both cores); built
# here, so no trial of a test pays it inside its timeout. Its cache is this checkout's: torch
# keys ~/.cache/torch_extensions by the op's name alone, so two checkouts' venvs on one machine
# rebuild it in turn, and a trial that rebuilds it measures the compiler's memory as its own.
export TORCH_EXTENSIONS_DIR="$PWD/.venv/torch_extensions"
.venv/bin/python -c "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder as B; B().load()" \
    >/dev/null 2>&1 || echo "scripts/test.sh: DeepSpeed's CPU op did not build now; its first trial will build it" >&2
wait "$packages"
export OMP_NUM_THREADS=1
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Two xdist workers: the tiers mostly wait (sleeps, timeouts, process start-up), so two run
# in about the time of one; tests/conftest.py keeps together what must share a worker.
# Arguments pass through to pytest and come last: `scripts/test.sh -n 0` runs in one process.
exec .venv/bin/python -m pytest -n 2 --dist loadgroup --durations=15 "$@"
