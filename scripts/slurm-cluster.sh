#!/usr/bin/env bash
# A real Slurm cluster of network-namespaced nodes on one Linux machine, to try the job
# scripts in jobs/ (and to test them: tests/slurm/) without an allocation.
#
#   sudo scripts/slurm-cluster.sh start DIR    # munged, slurmctld and NODES slurmd (default 3)
#   export SLURM_CONF=DIR/slurm.conf           # then sbatch / squeue / sacct -c / scancel
#   sudo scripts/slurm-cluster.sh stop DIR     # stops exactly what start started
#   sudo scripts/slurm-cluster.sh down DIR n2  # take node n2's link down (a lost node)
#
# Each compute node is a slurmd in its own network namespace (its own address on a bridge,
# reached over a veth pair), its own UTS namespace (`hostname` says n1, n2, ...) and its own
# mount namespace, where DIR/hosts is bound over /etc/hosts so node names resolve the same
# everywhere. They share the filesystem, as the nodes of a cluster share a parallel
# filesystem. The controller and the user's commands stay in the machine's own namespace,
# on the bridge's address. Nodes claim the shape of a GPU node (CPUS per node, GPUS count-only
# generic resources, the `nvme` feature, partitions `batch` and `debug`) so that the shipped
# scripts' #SBATCH lines are accepted as they are; `SlurmdParameters=config_overrides` keeps a
# node whose real CPUs are fewer from being drained. Nothing here binds devices or CPUs.
#
# Needs root, ip(8) with network namespaces, nsenter(1) and unshare(1), and Debian's slurm-wlm and munge
# (`apt-get install slurm-wlm munge`). Accounting is off (no slurmdbd): job completion records
# go to DIR/jobcomp.txt, which `sacct --completion` reads.
#
# Settings (environment): NODES (3), PREFIX (ps: names the bridge PREFIXbr and namespaces
# PREFIX-nK), SUBNET (10.77.0: the bridge is .1, node K is .(10+K)), PORT (16817: slurmctld;
# slurmd listens on PORT+1 inside each namespace), CPUS (64), GPUS (8), MEMORY_MB (64000).
set -euo pipefail

usage() {
    echo "usage: $0 start|stop|status DIR | down|up DIR NODE" >&2
    exit 2
}

action=${1:-}
dir=${2:-}
[[ -n ${action} && -n ${dir} ]] || usage
NODES=${NODES:-3}
PREFIX=${PREFIX:-ps}
SUBNET=${SUBNET:-10.77.0}
PORT=${PORT:-16817}
CPUS=${CPUS:-64}
GPUS=${GPUS:-8}
MEMORY_MB=${MEMORY_MB:-64000}
bridge="${PREFIX}br"

node_names() {
    local k
    for ((k = 1; k <= NODES; k++)); do echo "n${k}"; done
}

write_config() {
    local controller k
    controller=$(hostname -s)
    mkdir -p "${dir}"/{munge,ctld,spool,log,tmp}
    for ((k = 1; k <= NODES; k++)); do mkdir -p "${dir}/spool/n${k}"; done
    # munged wants its socket's directory searchable by all and writable only by its owner.
    chmod 711 "${dir}" "${dir}/munge"
    [[ -f ${dir}/munge/munge.key ]] || {
        dd if=/dev/urandom of="${dir}/munge/munge.key" bs=1024 count=1 status=none
        chmod 400 "${dir}/munge/munge.key"
    }
    {
        echo "127.0.0.1 localhost"
        echo "${SUBNET}.1 ${controller}"
        for ((k = 1; k <= NODES; k++)); do echo "${SUBNET}.$((10 + k)) n${k}"; done
    } >"${dir}/hosts"
    cat >"${dir}/slurm.conf" <<EOF
# Written by scripts/slurm-cluster.sh: a test cluster of ${NODES} namespaced nodes.
ClusterName=parsearch-test
SlurmctldHost=${controller}(${SUBNET}.1)
SlurmctldPort=${PORT}
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: also how long a requeued job waits before it may start again (default 120 s)
AuthInfo=socket=${dir}/munge/munge.socket,cred_expire=20
StateSaveLocation=${dir}/ctld
SlurmdSpoolDir=${dir}/spool/%n
SlurmctldPidFile=${dir}/slurmctld.pid
SlurmdPidFile=${dir}/slurmd-%n.pid
SlurmctldLogFile=${dir}/log/slurmctld.log
SlurmdLogFile=${dir}/log/slurmd-%n.log
TmpFS=${dir}/tmp
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=${dir}/jobcomp.txt
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
MpiDefault=pmi2
ReturnToService=2
SlurmdTimeout=20
SlurmctldTimeout=20
MessageTimeout=10
KillWait=10
MinJobAge=600
InactiveLimit=0
PropagateResourceLimits=NONE
NodeName=DEFAULT CPUs=${CPUS} RealMemory=${MEMORY_MB} Gres=gpu:${GPUS} Feature=nvme,gpu State=UNKNOWN
EOF
    for ((k = 1; k <= NODES; k++)); do
        echo "NodeName=n${k} NodeAddr=${SUBNET}.$((10 + k))" >>"${dir}/slurm.conf"
    done
    cat >>"${dir}/slurm.conf" <<EOF
PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE
PartitionName=debug Nodes=ALL MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE
EOF
    # Pretend GPUs: character devices that are /dev/null (1:3); Slurm counts and binds them,
    # and no program here opens them.
    mkdir -p "${dir}/dev"
    for ((k = 0; k < GPUS; k++)); do
        [[ -e ${dir}/dev/gpu${k} ]] || mknod "${dir}/dev/gpu${k}" c 1 3
    done
    echo "NodeName=n[1-${NODES}] Name=gpu File=${dir}/dev/gpu[0-$((GPUS - 1))]" >"${dir}/gres.conf"
}

start_network() {
    local k ns
    ip link add "${bridge}" type bridge
    ip addr add "${SUBNET}.1/24" dev "${bridge}"
    ip link set "${bridge}" up
    for ((k = 1; k <= NODES; k++)); do
        ns="${PREFIX}-n${k}"
        ip netns add "${ns}"
        ip link add "${ns}-h" type veth peer name eth0 netns "${ns}"
        ip link set "${ns}-h" master "${bridge}" up
        ip -n "${ns}" addr add "${SUBNET}.$((10 + k))/24" dev eth0
        ip -n "${ns}" link set eth0 up
        ip -n "${ns}" link set lo up
    done
}

# Run "$@" on node K: its network, its hostname, its /etc/hosts.
on_node() {
    local k=$1
    shift
    # nsenter, not `ip netns exec`: the latter remounts /sys, which hides the cgroup
    # hierarchy slurmd needs.
    # shellcheck disable=SC2016  # $1, $2 and $@ are the inner bash's arguments, not ours
    nsenter --net="/run/netns/${PREFIX}-n${k}" unshare --uts --mount --propagation private \
        bash -c 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"' \
        on_node "${dir}/hosts" "n${k}" "$@"
}

wait_for() {
    local what=$1 tries=$2
    shift 2
    for ((i = 0; i < tries; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    echo "$0: ${what} did not come up; see ${dir}/log/" >&2
    return 1
}

start() {
    local k
    [[ ! -e ${dir}/slurmctld.pid ]] || {
        echo "$0: ${dir} already holds a cluster; stop it first" >&2
        exit 1
    }
    write_config
    trap 'echo "$0: start failed; stopping what started" >&2; stop' ERR
    start_network
    munged --force --socket="${dir}/munge/munge.socket" --key-file="${dir}/munge/munge.key" \
        --pid-file="${dir}/munge/munged.pid" --log-file="${dir}/log/munged.log" \
        --seed-file="${dir}/munge/munged.seed"
    export SLURM_CONF=${dir}/slurm.conf
    slurmctld -i -f "${SLURM_CONF}"
    wait_for slurmctld 40 scontrol ping
    for ((k = 1; k <= NODES; k++)); do
        on_node "${k}" slurmd -f "${SLURM_CONF}" -N "n${k}"
    done
    wait_for "the nodes" 60 bash -c "sinfo -h -N -o '%t' | grep -qv -e idle -e mix -e alloc && exit 1; \
        [[ \$(sinfo -h -N -o '%N' | sort -u | wc -l) == ${NODES} ]]"
    trap - ERR
    echo "cluster up: ${NODES} nodes; export SLURM_CONF=${SLURM_CONF}"
}

kill_pidfile() {
    local file=$1 pid
    [[ -f ${file} ]] || return 0
    pid=$(cat "${file}")
    kill "${pid}" 2>/dev/null || true
    for _ in $(seq 40); do
        kill -0 "${pid}" 2>/dev/null || break
        sleep 0.25
    done
    kill -9 "${pid}" 2>/dev/null || true
    rm -f "${file}"
}

stop() {
    local k ns pid
    export SLURM_CONF=${dir}/slurm.conf
    # Jobs' processes first: whatever still runs inside a node's namespace.
    for ((k = 1; k <= NODES; k++)); do
        ns="${PREFIX}-n${k}"
        kill_pidfile "${dir}/slurmd-n${k}.pid"
        if ip netns list | grep -qw "${ns}"; then
            for pid in $(ip netns pids "${ns}"); do kill -9 "${pid}" 2>/dev/null || true; done
            ip netns delete "${ns}"
        fi
    done
    kill_pidfile "${dir}/slurmctld.pid"
    kill_pidfile "${dir}/munge/munged.pid"
    ip link show "${bridge}" >/dev/null 2>&1 && ip link delete "${bridge}"
    echo "cluster in ${dir} stopped"
}

case ${action} in
start) start ;;
stop) stop ;;
status) SLURM_CONF=${dir}/slurm.conf sinfo -N ;;
down) ip link set "${PREFIX}-${3:?node}-h" down ;;
up) ip link set "${PREFIX}-${3:?node}-h" up ;;
*) usage ;;
esac
