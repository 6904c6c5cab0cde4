# shellcheck shell=bash disable=SC2153  # STORE, NAME, SCRIPT...: set by the sourcing script
# The job chain shared by the self-resubmitting scripts (sourced, not run).
#
# One job of a chain: check the store's directory, submit the successor at once (it waits on
# this job: --dependency=afterany, so a drain that overruns the limit does not end the chain),
# run the driver, then keep the successor only when it has work to do:
#
#   driver exit              campaign     successor
#   0 (drained)              unfinished   kept: it resumes with the same settings
#   0                        finished     cancelled; the report is written
#   75 (lease held) twice    any          cancelled: another driver is live on this store
#   anything else            any          cancelled: a failed start is never resubmitted
#
# A lease conflict (75) is first waited out in the job itself (LEASE_WAIT s, once): a driver
# killed without draining holds the lease until it goes stale. If it is still held after that,
# another chain's driver is alive and this chain stops.
#
# SCRIPT is the job script the successor runs (Slurm: read from scontrol; PBS: given).

# Every campaign setting a successor must see as the first job saw it: a successor that
# fell back to a default BUDGET would take it as the campaign's new total.
CHAIN_SETTINGS=(SPACE NAME STORE BUDGET GRACE LEASE_TIMEOUT LEASE_WAIT MAX_JOBS PARSEARCH_ARGS)

chain_fail() {
    echo "parsearch job: $*" >&2
    exit 2
}

# The store must be an absolute path on a filesystem that honours POSIX locks (SQLite's
# rollback journal locks the file; a Lustre client mounted without flock fails with I/O
# errors, and NFS home directories are slow and unsafe for it).
chain_check_store() {
    local store=$1 directory
    [[ ${store} == /* ]] || chain_fail "STORE=${store} is relative: give an absolute path on" \
        "the parallel filesystem (a relative path lands wherever the job starts, often NFS home)"
    [[ ${store} == *.db ]] || chain_fail "STORE=${store} must end in .db"
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

# The settings as NAME=value,NAME=value (what sbatch --export and qsub -v take). A value with
# a comma cannot be carried that way: refuse it before anything is submitted.
chain_carried() {
    local name carried="" value
    for name in "${CHAIN_SETTINGS[@]}"; do
        value=${!name-}
        [[ ${value} != *,* ]] || chain_fail "${name}='${value}' holds a comma, which the" \
            "scheduler's variable list cannot carry to the successor; write it without one"
        carried+="${carried:+,}${name}=${value}"
    done
    echo "${carried}"
}

chain_finished() {
    [[ -f ${STORE} ]] || return 1
    parsearch status --store "${STORE}" --name "${NAME}" --format json 2>/dev/null |
        python -c 'import json, sys; sys.exit(json.load(sys.stdin)["status"] != "finished")'
}

# Run "$@" (the driver) in the background and wait for it; the scheduler's warning (USR1)
# is passed on to it. A batch shell runs a trap only while it waits on a background child.
chain_drive() {
    "$@" &
    DRIVER=$!
    trap 'echo "parsearch: time limit near, draining"; DRAINING=1; kill -USR1 "${DRIVER}"' USR1
    wait "${DRIVER}"
    STATUS=$?
    while kill -0 "${DRIVER}" 2>/dev/null; do # the trap interrupted wait: wait for the drain
        wait "${DRIVER}"
        STATUS=$?
    done
    trap 'DRAINING=1' USR1 # a warning between two drivers: start no other
}

# The whole job: chain_run DRIVER-COMMAND...; exits with the driver's status. SCHEDULER
# (slurm or pbs) picks the functions below that submit and cancel the successor.
chain_run() {
    local successor="" cancel_why=""
    DRAINING=0
    CARRIED=$(chain_carried) || exit 2
    if chain_finished; then
        echo "parsearch: campaign ${NAME} is already finished; nothing to run"
        exit 0
    fi
    if ((JOB_INDEX >= MAX_JOBS)); then
        echo "parsearch: job ${JOB_INDEX} of MAX_JOBS=${MAX_JOBS}: no successor will follow"
    elif successor=$("${SCHEDULER}"_existing_successor) && [[ -n ${successor} ]]; then
        echo "parsearch: requeued; the successor ${successor} is already queued"
    else
        successor=$("${SCHEDULER}"_submit_successor) || chain_fail "could not submit the successor"
        echo "parsearch: successor ${successor} queued (starts after this job ends)"
    fi

    chain_drive "$@"
    if ((STATUS == 75 && DRAINING == 0)); then
        echo "parsearch: the campaign's lease is held; waiting ${LEASE_WAIT} s for it to go stale"
        sleep "${LEASE_WAIT}" &
        wait $! # interruptible by the warning
        ((DRAINING)) || chain_drive "$@"
    fi

    if chain_finished; then
        echo "parsearch: campaign finished"
        parsearch report --store "${STORE}" --name "${NAME}" --out "${STORE%.db}-report"
        cancel_why="the campaign is finished"
    elif ((STATUS == 75 && DRAINING)); then
        echo "parsearch: the time limit came before the lease went stale; the successor tries again"
    elif ((STATUS == 75)); then
        cancel_why="another driver holds the campaign's lease: this chain stops (is a second chain running on ${STORE}?)"
    elif ((STATUS != 0)); then
        cancel_why="the driver failed (exit ${STATUS}); fix the cause and submit again"
    elif [[ -n ${successor} ]]; then
        echo "parsearch: drained; successor ${successor} resumes the campaign"
    fi
    if [[ -n ${cancel_why} && -n ${successor} ]]; then
        echo "parsearch: cancelling successor ${successor}: ${cancel_why}"
        "${SCHEDULER}"_cancel_successor "${successor}"
    elif [[ -n ${cancel_why} ]]; then
        echo "parsearch: ${cancel_why}"
    fi
    exit "${STATUS}"
}

# --- Slurm -----------------------------------------------------------------------------------
# The successor runs this script again under the same job name. --dependency=afterany: it
# starts once this job has ended, however it ended; singleton: never beside another job of
# that name and user, so two chains of one name cannot run side by side.
# https://slurm.schedmd.com/sbatch.html#OPT_dependency
slurm_submit_successor() {
    local script
    script=$(scontrol show job "${SLURM_JOB_ID}" | sed -n 's/^ *Command=//p')
    sbatch --parsable --job-name="${SLURM_JOB_NAME}" \
        --dependency="afterany:${SLURM_JOB_ID},singleton" \
        --export="ALL,${CARRIED},JOB_INDEX=$((JOB_INDEX + 1))" "${script}" | cut -d';' -f1
}

slurm_cancel_successor() {
    scancel "$1"
}

# After a requeue (node failure, --requeue) the first run of this job already queued one.
slurm_existing_successor() {
    ((${SLURM_RESTART_COUNT:-0} > 0)) || return 0
    squeue --noheader --user="${USER}" --states=PENDING --format='%i %E' |
        awk -v job="${SLURM_JOB_ID}" '$2 ~ ("afterany:" job "([(,]|$)") {print $1; exit}'
}

# --- PBS Pro ---------------------------------------------------------------------------------
# -W depend=afterany: starts once this job has ended. PBS has no singleton: the campaign's
# lease is what keeps a second chain's driver from running beside this one (it exits 75).
pbs_submit_successor() {
    qsub -W depend=afterany:"${PBS_JOBID}" -v "${CARRIED},JOB_INDEX=$((JOB_INDEX + 1))" \
        "${SCRIPT}"
}

pbs_cancel_successor() {
    qdel "$1"
}

pbs_existing_successor() {
    return 0 # a rerun job (-r y) queues another; the lease lets only one of them drive
}
