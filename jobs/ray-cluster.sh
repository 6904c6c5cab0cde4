#!/bin/bash
# A parsearch campaign on a Ray cluster built inside a Slurm allocation (any NVIDIA cluster;
# the defaults suit Perlmutter-like nodes of 4 GPUs). The ray backend gives each trial a
# placement group of one bundle per node and runs the node agent in an actor on each.
#
#   SPACE=my-space.yaml sbatch jobs/ray-cluster.sh           # from the repository root
#
# Already have a Ray cluster (KubeRay, a cloud autoscaler)? Skip the Slurm parts: run the
# last `parsearch run` line on a machine of the cluster with RAY_ADDRESS=<head>:6379.
#
# The space's allocation (nodes, devices_per_node) must match the cluster. Like the Slurm
# scripts beside it, this one resumes the campaign when the store already holds it, drains on
# Slurm's warning before the time limit, and submits its successor to continue.
#
# EDIT below: the #SBATCH lines, "Environment", and GPUS_PER_NODE / CPUS_PER_NODE.
#SBATCH --account=PROJECT                 # EDIT
#SBATCH --job-name=parsearch-ray
#SBATCH --nodes=4                         # EDIT: allocation.nodes in the space file
#SBATCH --gpus-per-node=4
#SBATCH --exclusive
#SBATCH --time=02:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --output=%x-%j.out

set -uo pipefail
cd "${SLURM_SUBMIT_DIR}" || exit 1

# --- Environment (EDIT) ----------------------------------------------------------------------
# shellcheck source=/dev/null
source /path/to/parsearch-env/bin/activate  # EDIT: parsearch[ray], torch
GPUS_PER_NODE=${GPUS_PER_NODE:-4}
CPUS_PER_NODE=${CPUS_PER_NODE:-64}

# --- Campaign (EDIT) -------------------------------------------------------------------------
SPACE=${SPACE:?set SPACE to a space file describing these nodes}
NAME=${NAME:-$(basename "${SPACE}" .yaml)}
STORE=${STORE:-${SCRATCH:-${HOME}}/parsearch/${NAME}.db}  # a filesystem the login nodes see
BUDGET=${BUDGET:-100}
GRACE=${GRACE:-90}
MAX_JOBS=${MAX_JOBS:-10}
JOB_INDEX=${JOB_INDEX:-1}
# Options that run and resume share, e.g. PARSEARCH_ARGS="--slots 8" (or, to rehearse this
# script without a cluster: "--backend simulate --backend-opt delay=1").
read -r -a EXTRA <<<"${PARSEARCH_ARGS:-}"
mkdir -p "$(dirname "${STORE}")"

# --- Ray: the head on this (the first) node, one worker on each other node --------------------
mapfile -t NODES < <(scontrol show hostnames "${SLURM_JOB_NODELIST}")
HEAD_IP=$(hostname --ip-address | awk '{print $1}')
export RAY_ADDRESS="${HEAD_IP}:6379"
srun --nodes=1 --ntasks=1 -w "${NODES[0]}" --cpus-per-task="${CPUS_PER_NODE}" \
    --gpus-per-node="${GPUS_PER_NODE}" ray start --head --node-ip-address="${HEAD_IP}" --port=6379 \
    --num-cpus="${CPUS_PER_NODE}" --num-gpus="${GPUS_PER_NODE}" --block &
sleep 15
for node in "${NODES[@]:1}"; do
    srun --nodes=1 --ntasks=1 -w "${node}" --cpus-per-task="${CPUS_PER_NODE}" \
        --gpus-per-node="${GPUS_PER_NODE}" ray start --address="${RAY_ADDRESS}" \
        --num-cpus="${CPUS_PER_NODE}" --num-gpus="${GPUS_PER_NODE}" --block &
done
sleep 15

# --- The campaign: one driver process on this node -------------------------------------------
# `run --resume` starts the campaign, or continues it when the store already holds it.
parsearch run "${SPACE}" --store "${STORE}" --name "${NAME}" --budget "${BUDGET}" --resume \
    --backend ray --backend-opt address="${RAY_ADDRESS}" --grace "${GRACE}" "${EXTRA[@]}" &
DRIVER=$!
# A batch shell runs a trap only while it waits on a background child: hence the & above.
trap 'echo "parsearch: time limit near, draining"; kill -USR1 "${DRIVER}"' USR1
wait "${DRIVER}"
STATUS=$?
while kill -0 "${DRIVER}" 2>/dev/null; do   # the trap interrupted wait: wait for the drain
    wait "${DRIVER}"
    STATUS=$?
done
ray stop --force >/dev/null 2>&1

if parsearch status --store "${STORE}" --name "${NAME}" --format json |
    python -c 'import json, sys; sys.exit(json.load(sys.stdin)["status"] != "finished")'; then
    echo "parsearch: campaign finished"
    parsearch report --store "${STORE}" --name "${NAME}" --out "${STORE%.db}-report"
elif ((JOB_INDEX < MAX_JOBS)); then
    SCRIPT=$(scontrol show job "${SLURM_JOB_ID}" | sed -n 's/^ *Command=//p')
    sbatch --dependency=afterany:"${SLURM_JOB_ID}" \
        --export=ALL,SPACE="${SPACE}",NAME="${NAME}",STORE="${STORE}",JOB_INDEX=$((JOB_INDEX + 1)) \
        "${SCRIPT}"
fi
exit "${STATUS}"
