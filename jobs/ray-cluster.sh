#!/bin/bash
# A parsearch campaign on a Ray cluster built inside a Slurm allocation. The defaults suit
# Perlmutter's GPU nodes (NERSC: 4 A100 and 64 cores x 2 hardware threads each); the ray
# backend gives each trial a placement group of one bundle per node and runs the node agent
# in an actor on each.
#
#   SPACE=my-space.yaml sbatch jobs/ray-cluster.sh           # from the repository root
#
# Already have a Ray cluster (KubeRay, a cloud autoscaler)? Skip the Slurm parts: run the
# last `parsearch run` line on a machine of the cluster with RAY_ADDRESS=<head>:6379.
#
# The space's allocation (nodes, devices_per_node) must match the cluster. Like the Slurm
# scripts beside it, this one resumes the campaign when the store already holds it, queues
# its successor at start (see jobs/chain.sh), drains on Slurm's warning before the time
# limit, and cancels the successor when the driver fails or the campaign is finished.
#
# EDIT below: the #SBATCH lines, "Environment", and GPUS_PER_NODE / CPUS_PER_NODE.
#SBATCH --account=mXXXX                   # EDIT
#SBATCH --qos=regular                     # EDIT: the QOS of your centre
#SBATCH --constraint=gpu                  # EDIT: Perlmutter's GPU nodes
#SBATCH --job-name=parsearch-ray          # one chain per name: singleton keeps them apart
#SBATCH --nodes=4                         # EDIT: allocation.nodes in the space file
#SBATCH --gpus-per-node=4
#SBATCH --exclusive
#SBATCH --time=02:00:00
#SBATCH --signal=B:USR1@120               # warn this shell 120 s before the limit (WARNING_S)
#SBATCH --dependency=singleton            # never beside another job of this name and user
#SBATCH --output=%x-%j.out

set -uo pipefail
cd "${SLURM_SUBMIT_DIR}" || exit 1
# shellcheck source=jobs/chain.sh
source jobs/chain.sh

# --- Environment (EDIT, or leave it and submit with PARSEARCH_SITE=FILE: docs/guide/cluster.md)
if [[ -z ${PARSEARCH_SITE:-} ]]; then
    # shellcheck source=/dev/null
    source /path/to/parsearch-env/bin/activate ||  # EDIT: parsearch[ray], torch
        chain_fail "cannot activate the environment: edit its path in this script"
fi
GPUS_PER_NODE=${GPUS_PER_NODE:-4}
CPUS_PER_NODE=${CPUS_PER_NODE:-128}         # Perlmutter GPU node: 64 cores x 2 threads
chain_site                                  # PARSEARCH_SITE, if given, last: it may override these

# --- Campaign (EDIT) -------------------------------------------------------------------------
SPACE=${SPACE:?set SPACE to a space file describing these nodes}
NAME=${NAME:-$(basename "${SPACE}" .yaml)}
# The centre's scratch (Lustre), which the login nodes see too. Perlmutter's purges files
# not accessed for 8 weeks: https://docs.nersc.gov/filesystems/perlmutter-scratch/
# Or a centre's PostgreSQL store, STORE=postgresql://user@host/dbname (set once in a site
# file); CAMPAIGN_DIR and REPORT_DIR then place the chain's files: docs/guide/store.md.
STORE=${STORE:-${SCRATCH:?set STORE (or SCRATCH) to a directory on the parallel filesystem}/parsearch/${NAME}.db}
BUDGET=${BUDGET:-100}        # trials in total, over every job of the chain
GRACE=${GRACE:-90}           # seconds to drain: less than the 120 s warning
WARNING_S=${WARNING_S:-120}  # the warning of #SBATCH --signal above; successors get this one
LEASE_TIMEOUT=${LEASE_TIMEOUT:-60}
LEASE_WAIT=${LEASE_WAIT:-$((LEASE_TIMEOUT + 10))}
MAX_JOBS=${MAX_JOBS:-10}
JOB_INDEX=${JOB_INDEX:-1}
# Options that run and resume share, e.g. PARSEARCH_ARGS="--slots 8" (or, to rehearse this
# script without a cluster: "--backend simulate --backend-opt delay=1").
PARSEARCH_ARGS=${PARSEARCH_ARGS:-}
read -r -a EXTRA <<<"${PARSEARCH_ARGS}"

SCHEDULER=slurm
chain_check_store "${STORE}"

# --- Ray: the head on the first node, one worker on each other node ---------------------------
# Ray's own Slurm pattern: every `ray start` in its own srun step holding its node, with
# --block so the step lives as long as the Ray node; the head's IPv4 address, since
# `hostname --ip-address` may list an IPv6 one first:
# https://docs.ray.io/en/latest/cluster/vms/user-guides/community/slurm.html
# Wait until N Ray nodes are up (up to RAY_START_S seconds), instead of sleeping a guess.
ray_wait_for_nodes() {
    python - "$1" "${RAY_START_S:-180}" <<'EOF' || chain_fail "the Ray cluster did not come up"
import sys, time

import ray

want, limit = int(sys.argv[1]), float(sys.argv[2])
deadline = time.monotonic() + limit
while True:
    try:
        ray.init(logging_level="ERROR")  # RAY_ADDRESS
        break
    except ConnectionError:
        if time.monotonic() > deadline:
            sys.exit(f"ray: no head at the address after {limit:g} s")
        time.sleep(1)
while (alive := sum(node["Alive"] for node in ray.nodes())) < want:
    if time.monotonic() > deadline:
        sys.exit(f"ray: {alive} of {want} nodes joined in {limit:g} s")
    time.sleep(1)
EOF
}
mapfile -t NODES < <(scontrol show hostnames "${SLURM_JOB_NODELIST}")
HEAD_IP=$(srun --nodes=1 --ntasks=1 -w "${NODES[0]}" hostname --ip-address |
    grep -oE '([0-9]{1,3}\.){3}[0-9]{1,3}' | head -n 1)
[[ -n ${HEAD_IP} ]] || chain_fail "no IPv4 address for the head node ${NODES[0]}"
export RAY_ADDRESS="${HEAD_IP}:6379"
# Token authentication for this job's cluster, on for the head, the workers and the driver
# alike. Left to itself, `ray start` (Ray >= 2.52) turns it on when ~/.ray/auth_token exists
# while a driver given an explicit address does not, and ray.init fails with "Authentication
# token is missing or incorrect". A fresh token per job, readable by its user alone, on the
# shared filesystem (beside a store file, or in CAMPAIGN_DIR for a server's store; named
# after the job, since chains of other campaigns may share CAMPAIGN_DIR), removed when the
# job ends: https://docs.ray.io/en/latest/ray-security/token-auth.html
export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN_PATH=$(chain_job_file "ray-token-${SLURM_JOB_ID}")
export RAY_AUTH_TOKEN_PATH
(umask 077 && python -c 'import secrets; print(secrets.token_hex(32))' >"${RAY_AUTH_TOKEN_PATH}") ||
    chain_fail "cannot write Ray's token ${RAY_AUTH_TOKEN_PATH}"
srun --nodes=1 --ntasks=1 -w "${NODES[0]}" --cpus-per-task="${CPUS_PER_NODE}" \
    --gpus-per-task="${GPUS_PER_NODE}" ray start --head --node-ip-address="${HEAD_IP}" \
    --port=6379 --num-cpus="${CPUS_PER_NODE}" --num-gpus="${GPUS_PER_NODE}" --block &
ray_wait_for_nodes 1
for node in "${NODES[@]:1}"; do
    srun --nodes=1 --ntasks=1 -w "${node}" --cpus-per-task="${CPUS_PER_NODE}" \
        --gpus-per-task="${GPUS_PER_NODE}" ray start --address="${RAY_ADDRESS}" \
        --num-cpus="${CPUS_PER_NODE}" --num-gpus="${GPUS_PER_NODE}" --block &
done
ray_wait_for_nodes "${#NODES[@]}"
trap 'ray stop --force >/dev/null 2>&1; rm -f "${RAY_AUTH_TOKEN_PATH}"' EXIT

# --- The campaign: one driver process on this node -------------------------------------------
# `run --resume` starts the campaign, or continues it when the store already holds it.
chain_run parsearch run "${SPACE}" --store "${STORE}" --name "${NAME}" --budget "${BUDGET}" \
    --resume --backend ray --backend-opt address="${RAY_ADDRESS}" --grace "${GRACE}" \
    --lease-timeout "${LEASE_TIMEOUT}" "${EXTRA[@]}"
