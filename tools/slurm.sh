#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for pita's Slurm tests (make slurm-up / make slurm-down).
#
#   tools/slurm.sh up      install slurm-wlm, munge, slurmdbd and MariaDB where missing (apt, as
#                          root), write a config with this host as controller and node (its CPUs,
#                          2 count-only GPUs; partition "debug", the default, and "urgent", which
#                          preempts it: PreemptMode=REQUEUE), start MariaDB and slurmdbd (real
#                          accounting: sacct, associations, a QoS "tiny" with
#                          MaxSubmitJobsPerUser=1), munged, slurmctld and slurmd; wait until the
#                          node is idle. PITA_SLURM_ACCOUNTING=0: no database, no accounting
#   tools/slurm.sh down    stop the three daemons (by their pid files)
#   tools/slurm.sh status  exit 0 when sinfo answers and the node is up
#   tools/slurm.sh stop-ctld / start-ctld   stop slurmctld, start it again keeping its jobs (tests)
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
ACCOUNTING=${PITA_SLURM_ACCOUNTING:-1}
DBPASS=pita-test-only  # a database on this machine's loopback, for the tests' accounting

die() { echo "slurm.sh: $*" >&2; exit 1; }

install() {
    local pkgs="slurm-wlm munge"
    [ "$ACCOUNTING" = 1 ] && pkgs="$pkgs slurmdbd mariadb-server"
    if command -v slurmctld >/dev/null && command -v munged >/dev/null && command -v sbatch >/dev/null \
        && { [ "$ACCOUNTING" = 0 ] || { command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null; }; }; then
        return
    fi
    [ "$(id -u)" = 0 ] || die "$pkgs are not installed and this is not root: install them (apt-get install $pkgs) or run as root"
    command -v apt-get >/dev/null || die "$pkgs are not installed and there is no apt-get to install them"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $pkgs >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $pkgs >/dev/null; } \
        || die "apt-get install $pkgs failed"
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
$(accounting_lines)
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=5
MinJobAge=300
KillWait=5
InactiveLimit=0
GresTypes=gpu
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName=$HOST CPUs=$cpus RealMemory=$mem Gres=gpu:$GPUS State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=1 GraceTime=30
PartitionName=urgent Nodes=$HOST MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=2
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

accounting_lines() {
    if [ "$ACCOUNTING" = 1 ]; then
        printf '%s\n' "AccountingStorageType=accounting_storage/slurmdbd" "AccountingStorageHost=localhost" \
            "AccountingStorageEnforce=associations,limits,qos"
    else
        echo "AccountingStorageType=accounting_storage/none"
    fi
}

start_db() {
    # MariaDB (the package's own data folder) and slurmdbd, whose config sits beside slurm.conf
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    if ! mariadb -e 'select 1' >/dev/null 2>&1; then
        mariadbd --user=mysql --datadir=/var/lib/mysql --socket=/run/mysqld/mysqld.sock \
            --pid-file=/run/mysqld/mariadb.pid --bind-address=127.0.0.1 >"$DIR/log/mariadb.log" 2>&1 &
        for _ in $(seq 60); do mariadb -e 'select 1' >/dev/null 2>&1 && break; sleep 0.5; done
        mariadb -e 'select 1' >/dev/null 2>&1 || die "MariaDB did not start (see $DIR/log/mariadb.log)"
    fi
    mariadb -e "create database if not exists slurm_acct_db; create user if not exists 'slurm'@'localhost' identified by '$DBPASS'; grant all on slurm_acct_db.* to 'slurm'@'localhost'; flush privileges"
    cat > "$DIR/slurmdbd.conf" <<DBD
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$DBPASS
StorageLoc=slurm_acct_db
PidFile=$DIR/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
DBD
    chmod 600 "$DIR/slurmdbd.conf"
    slurmdbd || die "slurmdbd did not start (see $DIR/log/slurmdbd.log)"
    for _ in $(seq 60); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.5; done
    sacctmgr -n list cluster >/dev/null 2>&1 || die "slurmdbd does not answer (see $DIR/log/slurmdbd.log)"
    local user
    user=$(id -un)
    sacctmgr -i add cluster pita >/dev/null 2>&1 || true
    sacctmgr -i add qos tiny >/dev/null 2>&1 || true
    sacctmgr -i modify qos tiny set MaxSubmitJobsPerUser=1 >/dev/null 2>&1 || true
    sacctmgr -i add account pita Cluster=pita >/dev/null 2>&1 || true
    sacctmgr -i add user "$user" Account=pita Cluster=pita >/dev/null 2>&1 || true
    sacctmgr -i modify user "$user" set QOS+=tiny >/dev/null 2>&1 || true
    # QoS brief: a MaxWall below what pita would ask (read before the first sbatch:
    # tests/test_slurm.py; GPU limits need AccountingStorageTRES=gres/gpu, which this cluster lacks)
    sacctmgr -i add qos brief >/dev/null 2>&1 || true
    sacctmgr -i modify qos brief set MaxWall=00:04:00 >/dev/null 2>&1 || true
    sacctmgr -i modify user "$user" set QOS+=brief >/dev/null 2>&1 || true
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
    if [ "$ACCOUNTING" = 1 ]; then start_db; fi
    slurmctld -c -f "$CONF" || die "slurmctld did not start (see $DIR/log/slurmctld.log)"  # -c: no stale node state
    slurmd -f "$CONF" || die "slurmd did not start (see $DIR/log/slurmd.log)"
    for _ in $(seq 60); do
        if sinfo -h -N -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
            echo "slurm up: node $HOST, $(nproc) CPUs, $GPUS GPUs (count only), partitions debug (default) and urgent (preempts debug), accounting $([ "$ACCOUNTING" = 1 ] && echo slurmdbd || echo none); SLURM_CONF=$CONF"
            return
        fi
        scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
        sleep 0.5
    done
    die "the node did not come up within 30 s: $(sinfo -h -N -o '%t %E' 2>&1) (see $DIR/log)"
}

down_quiet() {
    local pid
    for d in slurmd slurmctld slurmdbd; do
        pid=$(cat "$DIR/$d.pid" 2>/dev/null || true)
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        fi
    done
}

stop_ctld() {  # the controller away (tests: queries fail while jobs go on)
    local pid
    pid=$(cat "$DIR/slurmctld.pid" 2>/dev/null || true)
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.25; done
}

start_ctld() {  # back, with the jobs it saved (no -c)
    slurmctld -f "$CONF" || die "slurmctld did not start (see $DIR/log/slurmctld.log)"
    # answering, and the node registered again (idle*, not responding, until slurmd is heard from)
    for _ in $(seq 120); do
        sinfo -h -N -o '%t' 2>/dev/null | grep -qxE '(idle|mix|alloc)' && return 0
        sleep 0.5
    done
    die "slurmctld does not answer or the node did not register (see $DIR/log/slurmctld.log)"
}

case "${1:-}" in
    up) up ;;
    stop-ctld) stop_ctld ;;
    start-ctld) start_ctld ;;
    down) down_quiet; echo "slurm down" ;;
    status) sinfo -h -N -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)' ;;
    *) die "usage: tools/slurm.sh up|down|status|stop-ctld|start-ctld" ;;
esac
