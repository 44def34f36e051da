#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for pita's Slurm tests (make slurm-up / make slurm-down).
#
#   tools/slurm.sh up      install slurm-wlm and munge where missing (apt, as root), write a config
#                          with this host as controller and node (its CPUs, 2 count-only GPUs, a
#                          "debug" partition), start munged, slurmctld and slurmd; wait until the
#                          node is idle
#   tools/slurm.sh down    stop the three daemons (by their pid files)
#   tools/slurm.sh status  exit 0 when sinfo answers and the node is up
#
# Everything lives under $PITA_SLURM_DIR (default /var/tmp/pita-slurm): config, state, logs, pid
# files. GPUs are declared as a count (no device files), so requests for them schedule on a
# machine without GPUs. Needs root (the daemons run as root; munged as munge).
set -euo pipefail

DIR=${PITA_SLURM_DIR:-/var/tmp/pita-slurm}
GPUS=${PITA_SLURM_GPUS:-2}
HOST=$(hostname -s)
CONF=$DIR/slurm.conf
export SLURM_CONF=$CONF

die() { echo "slurm.sh: $*" >&2; exit 1; }

install() {
    if command -v slurmctld >/dev/null && command -v munged >/dev/null && command -v sbatch >/dev/null; then
        return
    fi
    [ "$(id -u)" = 0 ] || die "slurm-wlm and munge are not installed and this is not root: install them (apt-get install slurm-wlm munge) or run as root"
    command -v apt-get >/dev/null || die "slurm-wlm and munge are not installed and there is no apt-get to install them"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null; } \
        || die "apt-get install slurm-wlm munge failed"
}

write_config() {
    mkdir -p "$DIR"/{state,spool,log}
    local cpus mem
    cpus=$(nproc)
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 8 / 10 ))  # MB, 80% of the machine
    cat > "$CONF" <<CONF
ClusterName=pita
SlurmctldHost=$HOST
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldPort=${PITA_SLURMCTLD_PORT:-6817}
SlurmdPort=${PITA_SLURMD_PORT:-6818}
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
MinJobAge=300
KillWait=5
InactiveLimit=0
GresTypes=gpu
NodeName=$HOST CPUs=$cpus RealMemory=$mem Gres=gpu:$GPUS State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
    # Slurm 22.05 drops a GPU without a device file from the node's list, so each count-only GPU
    # gets a character device of its own here (/dev/null's numbers: nothing opens it)
    mkdir -p "$DIR/dev"
    : > "$DIR/gres.conf"
    for i in $(seq 0 $((GPUS - 1))); do
        [ -e "$DIR/dev/gpu$i" ] || mknod "$DIR/dev/gpu$i" c 1 3
        echo "NodeName=$HOST Name=gpu File=$DIR/dev/gpu$i" >> "$DIR/gres.conf"
    done
}

start_munge() {
    if pgrep -x munged >/dev/null; then return; fi
    if [ ! -s /etc/munge/munge.key ]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1k count=1 status=none
    fi
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    runuser -u munge -- /usr/sbin/munged || die "munged did not start"
}

up() {
    [ "$(id -u)" = 0 ] || die "starting the daemons needs root"
    install
    write_config
    start_munge
    down_quiet
    slurmctld -c -f "$CONF" || die "slurmctld did not start (see $DIR/log/slurmctld.log)"  # -c: no stale node state
    slurmd -f "$CONF" || die "slurmd did not start (see $DIR/log/slurmd.log)"
    for _ in $(seq 60); do
        if sinfo -h -N -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
            echo "slurm up: node $HOST, $(nproc) CPUs, $GPUS GPUs (count only), partition debug; SLURM_CONF=$CONF"
            return
        fi
        scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
        sleep 0.5
    done
    die "the node did not come up within 30 s: $(sinfo -h -N -o '%t %E' 2>&1) (see $DIR/log)"
}

down_quiet() {
    local pid
    for d in slurmd slurmctld; do
        pid=$(cat "$DIR/$d.pid" 2>/dev/null || true)
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        fi
    done
}

case "${1:-}" in
    up) up ;;
    down) down_quiet; echo "slurm down" ;;
    status) sinfo -h -N -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)' ;;
    *) die "usage: tools/slurm.sh up|down|status" ;;
esac
