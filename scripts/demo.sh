#!/usr/bin/env bash
# The main job: set up (if needed), then run a real search campaign on this machine's CPU.
# A tiny GPT on 4 local processes (gloo), the built-in trainer, DeepHyper's CBO over the
# layouts that divide and fit, results in a fresh SQLite store under runs/; then the best
# layout (also as Megatron-LM flags) and a report with figures.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export OMP_NUM_THREADS=1
BUDGET="${BUDGET:-16}"
run="runs/demo-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$run"
store="$run/campaign.db"
# The estimate uses this machine's measured figures: probed once (~10 s of measurement),
# then cached per host.
machine="runs/machine-$(hostname).yaml"
if [ ! -f "$machine" ]; then
    .venv/bin/parsearch probe search_spaces/tiny-cpu.yaml --out "$machine"
fi
.venv/bin/parsearch plan search_spaces/tiny-cpu.yaml --machine "$machine" --top 5
.venv/bin/parsearch run search_spaces/tiny-cpu.yaml --machine "$machine" --store "$store" \
    --budget "$BUDGET" --backend-opt "workdir=$run/trials"
.venv/bin/parsearch status --store "$store"
.venv/bin/parsearch top --store "$store" -k 5
echo
echo "best configuration:"
.venv/bin/parsearch best --store "$store"
.venv/bin/parsearch best --store "$store" --format megatron
.venv/bin/parsearch report --store "$store" --out "$run/report"
echo "store: $store   report: $run/report/index.html"
