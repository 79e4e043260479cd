#!/usr/bin/env bash
# Start a real one-node Slurm cluster on localhost (Debian's slurm-wlm 22.05 + munge), for CI tests of a Slurm executor.
# SLURM_CI_VERSION=24.11 starts Slurm 24.11 instead, built from source by build.sh (version.sh says where each lives).
# Idempotent: installs what is missing, (re)writes slurm.conf (and slurmdbd.conf), starts the daemons and waits until
# `sinfo` shows the node usable. A second run while the cluster is up with the same config is a no-op.
# Stop it with .ci/slurm/down.sh, whichever version runs. Run as root or as a user with passwordless sudo.
#
# 22.05's config sits where Debian's slurm looks (/etc/slurm/slurm.conf): sbatch/squeue/scontrol/sinfo/sacct need no
# env. 24.11's sits in /opt/slurm-24.11.5/etc, where its own tools look: they need PATH=/opt/slurm-24.11.5/bin:$PATH.
# Daemons are started directly (no systemd needed, also where systemd runs), as root, each daemonizing itself:
#   munged (as user munge), [mariadbd + slurmdbd], slurmctld, slurmd.
# Accounting (default on, SLURM_CI_ACCOUNTING=0 to skip): a private MariaDB (own datadir /var/lib/slurm-ci-db, TCP
# 127.0.0.1:${SLURM_CI_DB_PORT:-13306}, own socket; no system service) + slurmdbd, so that `sacct` answers. submitit
# learns job states only from `sacct` (see README.md); without accounting `sacct` fails and every state is UNKNOWN.
# With accounting, jobs must name an account of their user's (root's by default; topk-ci too: for root and for
# $SUDO_USER, who runs the tests when .ci/run calls up.sh through sudo), so --account is checked.
# The node has two stand-in GPUs (device files under /var/spool/slurm-ci-gpus), whole and in shares (mps, shard),
# so GPU requests are weighed.
# Logs: ${SLURM_CI_LOG_DIR:-/tmp/slurm-ci}/{slurmctld,slurmd,slurmdbd,mariadb}.log, apt.log; munged: /var/log/munge/.
# Other knobs: SLURM_CI_TIMEOUT (s to wait for the node, 60), SLURM_CI_SELECT (select/cons_tres or select/linear),
# SLURM_CI_CRED_EXPIRE (s, 5: sets how long a requeued job waits before it may start again).
set -euo pipefail
source "$(dirname "$0")/version.sh"

SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
LOG_DIR=${SLURM_CI_LOG_DIR:-/tmp/slurm-ci}
ACCT=${SLURM_CI_ACCOUNTING:-1}
TIMEOUT=${SLURM_CI_TIMEOUT:-60}
CONF_DIR=$SLURM_CONF_DIR
CONF=$CONF_DIR/slurm.conf
DBD_CONF=$CONF_DIR/slurmdbd.conf
DB_DIR=/var/lib/slurm-ci-db
DB_RUN=/run/slurm-ci-db
DB_PORT=${SLURM_CI_DB_PORT:-13306}
DB_PASS=slurmci                                   # local throwaway DB, reachable from 127.0.0.1 only
MARK="# written by .ci/slurm/up.sh"
NODE=$(hostname -s)
USER_NAME=${SUDO_USER:-$(id -un)}                 # who submits the tests' jobs (.ci/run calls up.sh through sudo)
CI_ACCOUNT=topk-ci                                # an account beside root's, for tests of --account
GPU_DIR=/var/spool/slurm-ci-gpus                  # the stand-in GPUs' device files
t0=$(date +%s%N)
elapsed() { awk -v ms="$(( ($(date +%s%N) - t0) / 1000000 ))" 'BEGIN {printf "%.1f s", ms / 1000}'; }
daemon_pid() {   # daemon_pid PIDFILE NAME: the pid of the live NAME that the pid file names (none: a stale file)
    local pid; pid=$($SUDO cat "$1" 2>/dev/null) || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] && [ "$($SUDO cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] && echo "$pid"
}
die() {   # die MESSAGE: print the state and the logs, exit 1
    echo "up.sh: $1" >&2
    sinfo -N -l 2>&1 || true; scontrol show node "$NODE" 2>&1 || true
    for f in "$LOG_DIR"/slurmctld.log "$LOG_DIR"/slurmd.log "$LOG_DIR"/slurmdbd.log "$LOG_DIR"/mariadb.log \
             /var/log/munge/munged.log; do
        $SUDO test -e "$f" || continue
        echo "===== $f"; $SUDO tail -n 60 "$f" 2>&1 || true
    done
    exit 1
}
wait_for() {   # wait_for SECONDS WHAT CMD...: poll CMD every 0.5 s
    local secs=$1 what=$2 until=$(( $(date +%s) + $1 )); shift 2
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$until" ] || die "$what not ready after $secs s"
        sleep 0.5
    done
}
write_if_changed() {   # write_if_changed FILE MODE CONTENT: returns 0 when the file changed
    local file=$1 mode=$2 content=$3
    [ "$($SUDO cat "$file" 2>/dev/null)" != "$content" ] || return 1
    if $SUDO test -e "$file" && ! $SUDO grep -qF "$MARK" "$file" && ! $SUDO test -e "$file.orig"; then
        $SUDO cp -p "$file" "$file.orig"
    fi
    printf '%s\n' "$content" | $SUDO tee "$file" >/dev/null
    $SUDO chmod "$mode" "$file"
}
$SUDO mkdir -p "$LOG_DIR"; $SUDO chmod 1777 "$LOG_DIR"

# ---------------------------------------------------------------- install (only what is missing)
pkgs=(munge); bins=(/usr/sbin/munged)
[ "$SLURM_PREFIX" != /usr ] || { pkgs+=(slurm-wlm); bins+=(/usr/sbin/slurmctld /usr/sbin/slurmd /usr/bin/sbatch); }
if [ "$ACCT" = 1 ]; then
    pkgs+=(mariadb-server-core mariadb-client-core)   # the -core packages: binaries only, no service
    bins+=(/usr/sbin/mariadbd /usr/bin/mariadb-install-db /usr/bin/mariadb)
    [ "$SLURM_PREFIX" != /usr ] || { pkgs+=(slurmdbd); bins+=(/usr/sbin/slurmdbd); }
fi
missing=""; for b in "${bins[@]}"; do [ -x "$b" ] || missing=1; done
if [ -n "$missing" ]; then
    echo "up.sh: installing ${pkgs[*]} ..."
    # keep the packages' maintainer scripts from starting daemons (munge, slurm*) before a config exists
    made_policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
        $SUDO chmod 755 /usr/sbin/policy-rc.d; made_policy=1
    fi
    apt_install() { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
                      "${pkgs[@]}" >"$LOG_DIR/apt.log" 2>&1; }
    rc=0
    apt_install || { $SUDO apt-get update -q >"$LOG_DIR/apt-update.log" 2>&1 && apt_install; } || rc=$?
    [ -z "$made_policy" ] || $SUDO rm -f /usr/sbin/policy-rc.d
    if [ "$rc" -ne 0 ]; then tail -n 40 "$LOG_DIR/apt.log"; echo "up.sh: apt-get install failed" >&2; exit 1; fi
    echo "up.sh: installed in $(elapsed)"
fi
[ "$SLURM_PREFIX" = /usr ] || $SUDO env SLURM_CI_LOG_DIR="$LOG_DIR" bash "$(dirname "$0")/build.sh"

# ---------------------------------------------------------------- config
CPUS=$(nproc)
MEM_MB=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
REAL_MB=$(( MEM_MB * 9 / 10 ))                   # a bit below the real memory, or slurmd drains the node
DEF_MEM=$(( REAL_MB / CPUS )); [ "$DEF_MEM" -le 1024 ] || DEF_MEM=1024   # jobs without --mem get this per CPU
SELECT=${SLURM_CI_SELECT:-select/cons_tres}
if [ "$SELECT" = select/linear ]; then SELECT_PARAMS=CR_Memory; else SELECT_PARAMS=CR_Core_Memory; fi
CRED_EXPIRE=${SLURM_CI_CRED_EXPIRE:-5}
if [ "$ACCT" = 1 ]; then
    ACCT_CONF="# Accounting through slurmdbd (SLURM_CI_ACCOUNTING=1): sacct works. No resource usage is gathered.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
# A job must name an account its user belongs to (or fall back on the user's default, root): --account is checked.
AccountingStorageEnforce=associations"
else
    ACCT_CONF="# No accounting (SLURM_CI_ACCOUNTING=0): no slurmdbd, so sacct fails (\"Slurm accounting storage is disabled\").
AccountingStorageType=accounting_storage/none"
fi

slurm_conf=$(cat <<CONF
$MARK -- do not edit by hand, rerun up.sh.
# Slurm ${SLURM_CI_VERSION:-22.05}. One node ($NODE, $CPUS CPUs, ${REAL_MB} MB), partitions debug and urgent (below),
# everything as root, no cgroups (containers).
ClusterName=ci
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=$SELECT
SelectTypeParameters=$SELECT_PARAMS
# Two stand-in GPUs (gres.conf: two device files made here, like /dev/null), also offered in shares (gres/mps: 100 a
# GPU; gres/shard: 4 a GPU): the controller weighs, queues and starts tasks that ask for a GPU or a share of one
# (--gpus-per-task, --gres=gpu, --gres=mps:N, --gres=shard:N); nothing computes on them, and no MPS daemon runs.
GresTypes=gpu,mps,shard
DefMemPerCPU=$DEF_MEM
# A batch job is requeued (by scontrol, a node failure or a preemption) only where it asked with --requeue, as at
# many sites (Slurm's default, 1, requeues any): a task that forgot to ask would be cancelled here as there.
JobRequeue=0
# A job of the urgent partition (PriorityTier 2) takes the resources of debug's jobs (1), which are requeued.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
ReturnToService=2
MailProg=/bin/true
# scancel/requeue/timeout send SIGTERM, then SIGKILL after KillWait (default 30 s). submitit's workers ignore SIGTERM,
# so a cancelled or requeued submitit task holds its CPU (and may even finish) for KillWait: keep it short.
KillWait=5
# Requeue delay: a requeued job stays PENDING (Reason=BeginTime) until requeue time + cred_expire + 1 s (default
# cred_expire 120 s), then for the next full pass of the main scheduler (sched_interval, default 60 s; the backfill
# loop skips it when nothing else changed). Here: about 5 + 1 + <=2 s.
AuthInfo=cred_expire=$CRED_EXPIRE
SchedulerParameters=sched_interval=2,bf_interval=5
$ACCT_CONF
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
StateSaveLocation=$SLURM_STATE_DIR
SlurmdSpoolDir=$SLURMD_SPOOL_DIR
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$REAL_MB Gres=gpu:2,mps:200,shard:8 Features=standin-gpu State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes=$NODE MaxTime=INFINITE State=UP PriorityTier=2
CONF
)
dbd_conf=$(cat <<CONF
$MARK -- do not edit by hand, rerun up.sh.
AuthType=auth/munge
DbdHost=$NODE
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=/run/slurmdbd.pid
LogFile=$LOG_DIR/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=$SLURM_DB
CONF
)
$SUDO mkdir -p "$CONF_DIR"
conf_changed=""; dbd_changed=""
write_if_changed "$CONF" 644 "$slurm_conf" && conf_changed=1
$SUDO mkdir -p "$GPU_DIR"
for gpu in 0 1; do   # a character device where mknod is allowed, else a plain file (slurmd logs an error, counts it)
    $SUDO test -e "$GPU_DIR/gpu$gpu" || $SUDO mknod "$GPU_DIR/gpu$gpu" c 1 3 2>/dev/null || $SUDO touch "$GPU_DIR/gpu$gpu"
done
write_if_changed "$CONF_DIR/gres.conf" 644 "$MARK -- do not edit by hand, rerun up.sh.
NodeName=$NODE Name=gpu File=$GPU_DIR/gpu[0-1]
NodeName=$NODE Name=mps Count=200 File=$GPU_DIR/gpu[0-1]
NodeName=$NODE Name=shard Count=8 File=$GPU_DIR/gpu[0-1]" && conf_changed=1
if [ "$ACCT" = 1 ]; then write_if_changed "$DBD_CONF" 600 "$dbd_conf" && dbd_changed=1; fi

# ---------------------------------------------------------------- already up with this config? then nothing to do
node_state() { sinfo -h -n "$NODE" -o %T 2>/dev/null | head -n1; }
node_ok() { [[ "$(node_state)" =~ ^(idle|mixed|allocated|completing)$ ]]; }
munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
acct_ok() { [ "$ACCT" != 1 ] || sacctmgr -n -P list assoc format=cluster,account,user 2>/dev/null | grep -qx "ci|$CI_ACCOUNT|$USER_NAME"; }
if [ -z "$conf_changed$dbd_changed" ] && munge_ok && scontrol ping 2>/dev/null | grep -q 'is UP' && node_ok \
   && acct_ok; then
    echo "up.sh: already up (node $NODE $(node_state)); nothing to do ($(elapsed))"
    exit 0
fi

# ---------------------------------------------------------------- another SLURM_CI_VERSION's daemons? stop them
other_version() {   # other_version PIDFILE DAEMON: the pid file's daemon runs, from another prefix than this version's
    local pid; pid=$(daemon_pid "$1" "$2") || return 1
    [ "$($SUDO readlink "/proc/$pid/exe")" != "$(readlink -f "$SLURM_PREFIX/sbin/$2")" ]
}
if other_version /run/slurmctld.pid slurmctld || other_version /run/slurmd.pid slurmd \
   || other_version /run/slurmdbd.pid slurmdbd; then   # down.sh cancels their jobs with that version's scancel first
    bash "$(dirname "$0")/down.sh"
fi

# ---------------------------------------------------------------- munge
$SUDO mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge "$SLURM_STATE_DIR" "$SLURMD_SPOOL_DIR"
$SUDO chown munge:munge /run/munge /var/lib/munge /var/log/munge
$SUDO chmod 755 /run/munge "$SLURM_STATE_DIR" "$SLURMD_SPOOL_DIR"
if ! $SUDO test -s /etc/munge/munge.key; then
    if [ -x /usr/sbin/mungekey ]; then $SUDO /usr/sbin/mungekey --create --keyfile=/etc/munge/munge.key
    else $SUDO dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; fi
fi
$SUDO chown munge:munge /etc/munge/munge.key
$SUDO chmod 400 /etc/munge/munge.key
if ! munge_ok; then
    $SUDO rm -f /run/munge/munged.pid
    $SUDO runuser -u munge -- /usr/sbin/munged
    wait_for 10 munged munge_ok
fi

stop_daemon() {   # stop_daemon PIDFILE NAME: stop the daemon of an older config
    local pid
    pid=$(daemon_pid "$1" "$2") || return 0
    $SUDO kill "$pid"
    for _ in $(seq 50); do $SUDO kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
    $SUDO kill -9 "$pid" 2>/dev/null || true
}

# ---------------------------------------------------------------- accounting: private MariaDB + slurmdbd
if [ "$ACCT" = 1 ]; then
    db() { $SUDO mariadb --no-defaults --socket="$DB_RUN/mysqld.sock" -u root "$@"; }
    $SUDO mkdir -p "$DB_RUN"
    if ! $SUDO test -d "$DB_DIR/mysql"; then
        $SUDO mariadb-install-db --no-defaults --user=root --datadir="$DB_DIR" --auth-root-authentication-method=socket \
            --skip-test-db >"$LOG_DIR/mariadb-install.log" 2>&1 || { cat "$LOG_DIR/mariadb-install.log"; die "mariadb-install-db failed"; }
    fi
    if ! db -e 'SELECT 1' >/dev/null 2>&1; then
        $SUDO rm -f "$DB_RUN/mysqld.sock" "$DB_RUN/mariadbd.pid"
        $SUDO setsid /usr/sbin/mariadbd --no-defaults --user=root --datadir="$DB_DIR" --socket="$DB_RUN/mysqld.sock" \
            --pid-file="$DB_RUN/mariadbd.pid" --bind-address=127.0.0.1 --port="$DB_PORT" --skip-name-resolve \
            --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 --log-error="$LOG_DIR/mariadb.log" \
            </dev/null >/dev/null 2>&1 &
        wait_for 30 mariadbd db -e 'SELECT 1'
    fi
    db -e "CREATE DATABASE IF NOT EXISTS $SLURM_DB;
           CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
           GRANT ALL ON $SLURM_DB.* TO 'slurm'@'127.0.0.1';"
    [ -z "$dbd_changed" ] || stop_daemon /run/slurmdbd.pid slurmdbd
    daemon_pid /run/slurmdbd.pid slurmdbd >/dev/null || $SUDO "$SLURM_PREFIX/sbin/slurmdbd"
    # slurmdbd creates its tables on first start (a few seconds), then answers sacctmgr
    wait_for "$TIMEOUT" slurmdbd sacctmgr -n list cluster
    sacctmgr -n -P list cluster format=cluster | grep -qx ci || $SUDO sacctmgr -i add cluster ci >/dev/null
    # with AccountingStorageEnforce, a user submits only with an association: root and the tests' user each get root's
    # account (their default) and $CI_ACCOUNT
    for account in root "$CI_ACCOUNT"; do
        sacctmgr -n -P list account format=account | grep -qx "$account" \
            || $SUDO sacctmgr -i add account "$account" cluster=ci >/dev/null
        for user in root "$USER_NAME"; do
            sacctmgr -n -P list assoc format=cluster,account,user | grep -qx "ci|$account|$user" \
                || $SUDO sacctmgr -i add user "$user" account="$account" cluster=ci >/dev/null
        done
    done
else
    stop_daemon /run/slurmdbd.pid slurmdbd   # one left by an earlier start with accounting, which nothing asks now
fi

# ---------------------------------------------------------------- slurmctld, slurmd
if [ -n "$conf_changed" ]; then stop_daemon /run/slurmd.pid slurmd; stop_daemon /run/slurmctld.pid slurmctld; fi
daemon_pid /run/slurmctld.pid slurmctld >/dev/null || $SUDO "$SLURM_PREFIX/sbin/slurmctld"   # recovers saved jobs
daemon_pid /run/slurmd.pid slurmd >/dev/null || $SUDO "$SLURM_PREFIX/sbin/slurmd"

# ---------------------------------------------------------------- wait until the node is usable
deadline=$(( $(date +%s) + TIMEOUT ))
until node_ok; do
    [ "$(date +%s)" -lt "$deadline" ] || die "node $NODE not usable after $TIMEOUT s (state: '$(node_state)')"
    sleep 0.5
done
echo "up.sh: Slurm up in $(elapsed) (accounting: $([ "$ACCT" = 1 ] && echo slurmdbd || echo none)):" \
     "$(sinfo -h -o '%P %a %D %T %N' | head -n1)"
