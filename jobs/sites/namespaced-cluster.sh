# shellcheck shell=bash
# Site file for the cluster scripts/slurm-cluster.sh starts on one machine (the test tier
# tests/test_slurm_cluster.py submits the shipped scripts with PARSEARCH_SITE=this file):
#
#   SLURM_CONF=DIR/slurm.conf PARSEARCH_SITE=jobs/sites/namespaced-cluster.sh \
#       SPACE=... STORE=/abs/path.db sbatch -N 3 jobs/frontier.sbatch
#
# A site file replaces the script's environment lines (modules, the venv) and may override
# what follows them. Its nodes are CPU processes: no modules, the repository's .venv
# (scripts/bootstrap.sh makes it), one thread per rank, gloo.
# shellcheck source=/dev/null  # the venv is made on the machine, not part of the repository
source "${SLURM_SUBMIT_DIR}/.venv/bin/activate" || return 1
export OMP_NUM_THREADS=1
