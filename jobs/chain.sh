# shellcheck shell=bash disable=SC2153  # STORE, NAME, SCRIPT...: set by the sourcing script
# The job chain shared by the self-resubmitting scripts (sourced, not run).
#
# One job of a chain: check the store's directory, submit the successor at once (it waits on
# this job: --dependency=afterany, so a drain that overruns the limit does not end the chain),
# run the driver, then keep the successor only when it has work to do:
#
#   driver exit              campaign     successor
#   0 (drained)              unfinished   kept: it resumes with the same settings
#   any                      finished     cancelled; the report is written
#   75 (lease held) twice    any          cancelled: another driver is live on this store
#   3 (trainer crashes)      unfinished   cancelled: every trial crashed alike (--crash-limit)
#   other, after progress    unfinished   kept: srun's status is its worst task's (a lost node)
#   anything else            any          cancelled: a failed start is never resubmitted
#
# A lease conflict (75) is first waited out in the job itself (LEASE_WAIT s, once): a driver
# killed without draining holds the lease until it goes stale. If it is still held after that,
# another chain's driver is alive and this chain stops.
#
# SCRIPT is the job script the successor runs (Slurm: read from scontrol; PBS: given).

# The scheduler's warning (USR1) may come before the driver runs: a job that starts with less
# than WARNING_S left, or a user's `scancel --signal=USR1` as it starts. A batch shell killed
# by it (USR1's default action) would end the job before it queued its successor, and the
# chain with it; from here on it is remembered, the driver is not started, the successor
# resumes.
DRAINING=0
trap 'DRAINING=1' USR1

# Every campaign setting a successor must see as the first job saw it: a successor that
# fell back to a default BUDGET would take it as the campaign's new total.
CHAIN_SETTINGS=(SPACE NAME STORE CAMPAIGN_DIR REPORT_DIR BUDGET GRACE WARNING_S LEASE_TIMEOUT
    LEASE_WAIT MAX_JOBS PARSEARCH_ARGS PARSEARCH_SITE)

chain_fail() {
    echo "parsearch job: $*" >&2
    exit 2
}

# The site file (PARSEARCH_SITE=FILE at submission): sourced after the script's own
# environment lines, so that it can replace them (modules, the venv, OMP_NUM_THREADS,
# CPUS_PER_NODE, GPUS_PER_NODE). jobs/sites/ has one for the namespaced test cluster.
chain_site() {
    [[ -n ${PARSEARCH_SITE:-} ]] || return 0
    [[ -f ${PARSEARCH_SITE} ]] || chain_fail "PARSEARCH_SITE=${PARSEARCH_SITE}: no such file"
    # shellcheck source=/dev/null
    source "${PARSEARCH_SITE}" || chain_fail "the site file ${PARSEARCH_SITE} failed"
}

# The environment must give us python and parsearch before anything is submitted.
chain_check_environment() {
    local tool
    for tool in python parsearch; do
        command -v "${tool}" >/dev/null || chain_fail "${tool} is not on PATH: the" \
            "environment lines of the script (modules, the venv) or PARSEARCH_SITE did not set it up"
    done
    [[ -z ${WARNING_S:-} ]] || ((GRACE < WARNING_S)) || chain_fail "GRACE=${GRACE} must be less" \
        "than WARNING_S=${WARNING_S}, the seconds of warning before the time limit, or the" \
        "drain outlives the job"
}

# Whether STORE (or $1) names a PostgreSQL server (a postgresql:// or postgres:// URL, as
# parsearch.store.open_store tells them apart) rather than an SQLite file.
chain_store_is_url() {
    [[ ${1-${STORE}} == postgresql://* || ${1-${STORE}} == postgres://* ]]
}

# STORE as the job's log may print it: a URL's password masked (the driver's messages mask
# it the same way).
chain_shown_store() {
    sed -E 's#^([a-z]+://[^:/@]*):[^@/]*@#\1:***@#' <<<"${STORE}"
}

# The store: an SQLite file, or a server's URL (a centre's shared store, usually set once in
# the site file). Then the directory for the chain's own files (CAMPAIGN_DIR: PBS's settings
# for the successor, Ray's token, the report when REPORT_DIR is not given): beside a file
# store by default; for a server, the submission directory's runs/ (a URL has no directory).
chain_check_store() {
    local store=$1
    if chain_store_is_url "${store}"; then
        chain_check_environment
        chain_check_server "${store}"
        CAMPAIGN_DIR=${CAMPAIGN_DIR:-${PWD}/runs}
    else
        chain_check_store_file "${store}"
        CAMPAIGN_DIR=${CAMPAIGN_DIR:-$(dirname "${store}")}
    fi
    [[ ${CAMPAIGN_DIR} == /* ]] || CAMPAIGN_DIR=${PWD}/${CAMPAIGN_DIR} # successors start here too
    if ! { mkdir -p "${CAMPAIGN_DIR}" && [[ -w ${CAMPAIGN_DIR} ]]; }; then
        chain_fail "CAMPAIGN_DIR=${CAMPAIGN_DIR}: cannot create or write it"
    fi
    # The finished campaign's report: beside a file store, as ever (x.db: x-report/); for a
    # server, one directory per campaign in CAMPAIGN_DIR.
    if [[ -z ${REPORT_DIR:-} ]]; then
        if chain_store_is_url "${store}"; then
            REPORT_DIR=${CAMPAIGN_DIR}/${NAME}-report
        else
            REPORT_DIR=${store%.db}-report
        fi
    fi
}

# A server's URL: psycopg must be installed and the server must answer before anything is
# submitted (a wrong host or password fails the first job, not every job of a chain).
chain_check_server() {
    python - "$1" <<'EOF' || chain_fail "STORE=$(chain_shown_store): the store's server cannot be used"
import sys

from parsearch.store.postgres import shown_url

try:
    import psycopg
except ImportError:
    sys.exit("parsearch job: psycopg is not installed: pip install 'parsearch[postgres]'")
try:
    psycopg.connect(sys.argv[1], connect_timeout=20).close()
except psycopg.Error as error:
    sys.exit(f"parsearch job: cannot connect to {shown_url(sys.argv[1])}: {error}".strip())
EOF
}

# A store file must be an absolute path on a filesystem that honours POSIX locks (SQLite's
# rollback journal locks the file; a Lustre client mounted without flock fails with I/O
# errors, and NFS home directories are slow and unsafe for it).
chain_check_store_file() {
    local store=$1 directory
    [[ ${store} == /* ]] || chain_fail "STORE=${store} is relative: give an absolute path on" \
        "the parallel filesystem (a relative path lands wherever the job starts, often NFS" \
        "home), or a postgresql:// URL"
    [[ ${store} == *.db ]] || chain_fail "STORE=${store} must end in .db (or be a postgresql:// URL)"
    chain_check_environment
    directory=$(dirname "${store}")
    mkdir -p "${directory}" || chain_fail "cannot create the store's directory ${directory}"
    python -c '
import fcntl, sys, tempfile
with tempfile.NamedTemporaryFile(dir=sys.argv[1], prefix=".parsearch-lock-") as probe:
    fcntl.lockf(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
' "${directory}" 2>/dev/null || chain_fail "${directory} does not support POSIX locks:" \
        "put STORE on a filesystem mounted with flock (the centre's Lustre scratch)"
    if [[ $(stat -f -c %T "${directory}" 2>/dev/null) == nfs* ]]; then
        echo "parsearch job: warning: ${directory} is on NFS; the store belongs on the" \
            "parallel filesystem" >&2
    fi
}

# A file of this job's own (PBS's settings for its successor, Ray's token): named after a
# file store, beside it; in CAMPAIGN_DIR for a server, whose URL names no file.
chain_job_file() {
    if chain_store_is_url; then
        echo "${CAMPAIGN_DIR}/$1"
    else
        echo "${STORE%.db}.$1"
    fi
}

# The settings, exported for the successor's submission (Slurm: sbatch --export=ALL carries
# every value as it is, commas, quotes and spaces included), without what belongs to this
# job alone: Slurm's own SLURM_* variables (a successor that inherited SLURM_RESTART_COUNT
# would take itself for a requeued job) and a Ray cluster's address that ends with it.
chain_export_settings() {
    local name
    export "${CHAIN_SETTINGS[@]}"
    export JOB_INDEX=$((JOB_INDEX + 1))
    for name in $(compgen -e); do
        [[ ${name} != SLURM_* || ${name} == SLURM_CONF ]] || unset "${name}"
    done
    unset RAY_ADDRESS
}

chain_finished() {
    chain_store_is_url || [[ -f ${STORE} ]] || return 1
    parsearch status --store "${STORE}" --name "${NAME}" --format json 2>/dev/null |
        python -c '
import json, sys
try:
    status = json.load(sys.stdin)["status"]
except (ValueError, KeyError, TypeError):  # no campaign of that name yet
    sys.exit(1)
sys.exit(status != "finished")'
}

# How many trials the campaign has finished (0 while there is none).
chain_finished_trials() {
    chain_store_is_url || [[ -f ${STORE} ]] || {
        echo 0
        return
    }
    parsearch status --store "${STORE}" --name "${NAME}" --format json 2>/dev/null |
        python -c '
import json, sys
try:
    print(int(json.load(sys.stdin)["finished"]))
except (ValueError, KeyError, TypeError):
    print(0)'
}

# Run "$@" (the driver) in the background and wait for it. A batch shell runs a trap only
# while it waits on a background child, so the signals arrive here:
# * USR1, the scheduler's warning before the time limit: passed on, the driver drains;
# * TERM: the job is ending now. When the user cancelled it (scancel), the chain stops: the
#   successor is cancelled at once, before the scheduler's SIGKILL. Otherwise (the time
#   limit itself, a requeue, a preemption, a lost node) the successor resumes the campaign.
chain_drive() {
    "$@" &
    DRIVER=$!
    trap chain_on_warning USR1
    trap chain_on_term TERM
    wait "${DRIVER}"
    STATUS=$?
    while kill -0 "${DRIVER}" 2>/dev/null; do # a trap interrupted wait: wait for the drain
        wait "${DRIVER}"
        STATUS=$?
    done
    trap 'DRAINING=1' USR1 # a warning between two drivers: start no other
}

# Passed on once: srun hands the signal to every task, and a second one (Slurm's warning and
# a user's `scancel --signal=USR1` both) could reach a task that is already exiting.
chain_on_warning() {
    ((DRAINING)) && return
    echo "parsearch: time limit near, draining"
    DRAINING=1
    kill -USR1 "${DRIVER}"
}

chain_on_term() {
    DRAINING=1
    if "${SCHEDULER}"_cancelled_by_user; then
        CANCELLED=1
        echo "parsearch: the job was cancelled; the chain stops here"
        if [[ -n ${SUCCESSOR} ]]; then
            echo "parsearch: cancelling successor ${SUCCESSOR}: this job was cancelled"
            "${SCHEDULER}"_cancel_successor "${SUCCESSOR}"
            SUCCESSOR=""
        fi
    fi
    kill -TERM "${DRIVER}" 2>/dev/null
}

# The whole job: chain_run DRIVER-COMMAND...; exits with the driver's status. SCHEDULER
# (slurm or pbs) picks the functions below that submit and cancel the successor.
chain_run() {
    local cancel_why=""
    CANCELLED=0
    SUCCESSOR=""
    if chain_finished; then
        echo "parsearch: campaign ${NAME} is already finished; nothing to run"
        exit 0
    fi
    if ((JOB_INDEX >= MAX_JOBS)); then
        echo "parsearch: job ${JOB_INDEX} of MAX_JOBS=${MAX_JOBS}: no successor will follow"
    elif SUCCESSOR=$("${SCHEDULER}"_existing_successor) && [[ -n ${SUCCESSOR} ]]; then
        echo "parsearch: requeued; the successor ${SUCCESSOR} is already queued"
    else
        if ! { SUCCESSOR=$("${SCHEDULER}"_submit_successor) && [[ -n ${SUCCESSOR} ]]; }; then
            chain_fail "could not submit the successor"
        fi
        echo "parsearch: successor ${SUCCESSOR} queued (starts after this job ends)"
    fi

    local done_before
    done_before=$(chain_finished_trials)
    if ((DRAINING)); then
        echo "parsearch: warned before the driver started; starting none"
        STATUS=0
    else
        chain_drive "$@"
    fi
    if ((STATUS == 75 && DRAINING == 0)); then
        echo "parsearch: the campaign's lease is held; waiting ${LEASE_WAIT} s for it to go stale"
        sleep "${LEASE_WAIT}" &
        wait $! # interruptible by the warning
        ((DRAINING)) || chain_drive "$@"
    fi

    if chain_finished; then
        echo "parsearch: campaign finished"
        parsearch report --store "${STORE}" --name "${NAME}" --out "${REPORT_DIR}"
        cancel_why="the campaign is finished"
        STATUS=0 # srun's status is its worst task's: a lost node's, not the campaign's
    elif ((CANCELLED)); then
        echo "parsearch: submit the script again to continue the campaign"
    elif ((STATUS == 75 && DRAINING)); then
        echo "parsearch: the time limit came before the lease went stale; the successor tries again"
    elif ((STATUS == 75)); then
        cancel_why="another driver holds the campaign's lease: this chain stops (is a second chain running on $(chain_shown_store)?)"
    elif ((STATUS == 3)); then
        cancel_why="every trial crashed the same way (parsearch status says how): fix the trainer and submit again"
    elif ((STATUS != 0)) && (($(chain_finished_trials) > done_before)) && [[ -n ${SUCCESSOR} ]]; then
        # srun's status is its worst task's: a worker on a lost node, while the campaign
        # went on. A job that made progress is no failed start: the successor resumes.
        echo "parsearch: the step ended with exit ${STATUS} after the campaign made progress" \
            "(a lost node?); successor ${SUCCESSOR} resumes the campaign"
    elif ((STATUS != 0)); then
        cancel_why="the driver failed (exit ${STATUS}); fix the cause and submit again"
    elif [[ -n ${SUCCESSOR} ]]; then
        echo "parsearch: drained; successor ${SUCCESSOR} resumes the campaign"
    fi
    if [[ -n ${cancel_why} && -n ${SUCCESSOR} ]]; then
        echo "parsearch: cancelling successor ${SUCCESSOR}: ${cancel_why}"
        "${SCHEDULER}"_cancel_successor "${SUCCESSOR}"
    elif [[ -n ${cancel_why} ]]; then
        echo "parsearch: ${cancel_why}"
    fi
    exit "${STATUS}"
}

# --- Slurm -----------------------------------------------------------------------------------
# The successor runs this script again under the same job name. --dependency=afterany: it
# starts once this job has ended, however it ended; singleton: never beside another job of
# that name and user (the scripts ask for singleton for their first job too), so two chains
# of one name never run side by side.
# https://slurm.schedmd.com/sbatch.html#OPT_dependency
#
# Options given on the sbatch command line override the script's #SBATCH lines for this job
# only: the successor gets what this job was given, read back from Slurm (time limit, nodes,
# account, partition, QOS, constraint, reservation). The warning signal cannot be read back:
# the successor gets --signal=B:USR1@WARNING_S.
slurm_submit_successor() {
    local job script options=() value name=${SLURM_JOB_NAME} id=${SLURM_JOB_ID}
    job=$(scontrol show job "${id}") || return 1
    script=$(sed -n 's/^ *Command=//p' <<<"${job}")
    value=$(slurm_field "${job}" TimeLimit)
    [[ -z ${value} || ${value} == UNLIMITED ]] || options+=(--time="${value}")
    value=$(slurm_field "${job}" NumNodes)
    [[ -z ${value} ]] || options+=(--nodes="${value%%-*}")
    for value in Account:--account Partition:--partition QOS:--qos Features:--constraint \
        Reservation:--reservation; do
        local found
        found=$(slurm_field "${job}" "${value%%:*}")
        [[ -z ${found} || ${found} == "(null)" ]] || options+=("${value#*:}=${found}")
    done
    (
        chain_export_settings
        sbatch --parsable --job-name="${name}" --export=ALL \
            --dependency="afterany:${id},singleton" --signal="B:USR1@${WARNING_S}" \
            "${options[@]}" "${script}"
    ) | cut -d';' -f1
}

# A field of `scontrol show job` (FIELD=value, separated by spaces).
slurm_field() {
    grep -oE "(^|[[:space:]])$2=[^[:space:]]*" <<<"$1" | head -n 1 | cut -d= -f2-
}

slurm_cancel_successor() {
    scancel "$1"
}

# Whether the SIGTERM this batch shell got is the user's scancel. Slurm 22.05 signals the
# batch shell for a scancel and for a requeue (not at the time limit: the steps alone, after
# the warning), and shows both as COMPLETING; a requeue has already counted one more
# restart than this run of the job started with.
slurm_cancelled_by_user() {
    local restarts
    restarts=$(slurm_field "$(scontrol show job "${SLURM_JOB_ID}" 2>/dev/null)" Restarts)
    ((${restarts:-0} <= ${SLURM_RESTART_COUNT:-0}))
}

# After a requeue (node failure, --requeue) the first run of this job already queued one.
# Slurm does not set USER in a job's environment: --me asks for the job's own user.
slurm_existing_successor() {
    ((${SLURM_RESTART_COUNT:-0} > 0)) || return 0
    squeue --noheader --me --states=PENDING --format='%i %E' |
        awk -v job="${SLURM_JOB_ID}" '$2 ~ ("afterany:" job "([(,]|$)") {print $1; exit}'
}

# --- PBS Pro ---------------------------------------------------------------------------------
# -W depend=afterany: starts once this job has ended. PBS has no singleton: the campaign's
# lease is what keeps a second chain's driver from running beside this one (it exits 75).
# qsub -v cannot carry a value holding a comma or a quote, so the settings travel in a file
# (bash's own quoting, `declare -p`) next to a store file, or in CAMPAIGN_DIR for a server,
# which the successor reads first (PARSEARCH_CHAIN_ENV). Readable by the user alone: a
# server's URL may hold a password.
pbs_submit_successor() {
    local name settings
    settings=$(chain_job_file "chain-${PBS_JOBID}.env")
    [[ ${settings} != *[,\'\"]* ]] || chain_fail "${settings}: a comma or a quote in" \
        "its path cannot be passed to qsub -v (STORE or CAMPAIGN_DIR holds one)"
    (umask 077 && : >"${settings}") || return 1
    (
        chain_export_settings
        for name in "${CHAIN_SETTINGS[@]}" JOB_INDEX; do
            [[ ! -v ${name} ]] || declare -p "${name}"
        done
    ) | sed 's/^declare -x/declare -gx/' >"${settings}" || return 1
    qsub -W depend=afterany:"${PBS_JOBID}" -v "PARSEARCH_CHAIN_ENV=${settings}" "${SCRIPT}"
}

# The settings the previous job of the chain resolved, before the script's defaults.
pbs_read_settings() {
    [[ -n ${PARSEARCH_CHAIN_ENV:-} ]] || return 0
    # shellcheck source=/dev/null
    source "${PARSEARCH_CHAIN_ENV}" || chain_fail "cannot read the chain's settings" \
        "${PARSEARCH_CHAIN_ENV}"
}

pbs_cancel_successor() {
    qdel "$1"
}

# PBS warns before no limit (the driver drains by --timeout), so a SIGTERM is qdel's.
pbs_cancelled_by_user() {
    return 0
}

pbs_existing_successor() {
    return 0 # a rerun job (-r y) queues another; the lease lets only one of them drive
}
