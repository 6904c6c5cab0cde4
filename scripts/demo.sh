#!/usr/bin/env bash
# The main job: set up (if needed), then plan the tiny CPU space on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export OMP_NUM_THREADS=1
.venv/bin/parsearch plan search_spaces/tiny-cpu.yaml
