#!/usr/bin/env bash
# Stop the one-node CI Slurm cluster started by .ci/slurm/up.sh, of any SLURM_CI_VERSION: cancel this user's remaining
# jobs, then stop slurmd, slurmctld, slurmdbd, the private mariadbd and munged (each through its pid file). Idempotent;
# never fails, also when nothing runs or Slurm is not installed. Kept: the configs, the munge key, the controller state
# (/var/spool/slurmctld*: job ids go on counting), the accounting DB (/var/lib/slurm-ci-db) and the logs in
# ${SLURM_CI_LOG_DIR:-/tmp/slurm-ci}.
set -uo pipefail
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
# the running controller's own clients (up.sh's SLURM_CI_VERSION=24.11 lives in /opt; other versions' clients fail),
# found through its pid file where that names a live slurmctld (pid files can be stale)
ctld_pid=$($SUDO cat /run/slurmctld.pid 2>/dev/null) || ctld_pid=""
if [[ "$ctld_pid" =~ ^[0-9]+$ ]] && [ "$($SUDO cat "/proc/$ctld_pid/comm" 2>/dev/null)" = slurmctld ] \
   && ctld_exe=$($SUDO readlink "/proc/$ctld_pid/exe" 2>/dev/null) && [ -n "$ctld_exe" ]; then   # gone meanwhile: none
    PATH=$(dirname "$(dirname "$ctld_exe")")/bin:$PATH
fi

if command -v scontrol >/dev/null && timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; then
    timeout 10 scancel --user="${SUDO_USER:-$(id -un)}" 2>/dev/null || true
    # give the cancelled jobs' steps a moment to die, so no slurmstepd outlives slurmd
    for _ in $(seq 40); do [ -z "$(timeout 5 squeue -h -u "${SUDO_USER:-$(id -un)}" -t RUNNING,COMPLETING 2>/dev/null)" ] && break; sleep 0.25; done
fi

stop_pidfile() {   # stop_pidfile NAME PIDFILE: SIGTERM the daemon named in PIDFILE, SIGKILL after 20 s
    local name=$1 pf=$2 pid
    $SUDO test -s "$pf" || return 0
    pid=$($SUDO cat "$pf" 2>/dev/null) || return 0
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    # only a live process that really is that daemon (pid files can be stale)
    if $SUDO kill -0 "$pid" 2>/dev/null && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]; then
        $SUDO kill "$pid" 2>/dev/null
        for _ in $(seq 80); do $SUDO kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        ! $SUDO kill -0 "$pid" 2>/dev/null || $SUDO kill -9 "$pid" 2>/dev/null
        echo "down.sh: stopped $name ($pid)"
    fi
    $SUDO rm -f "$pf"
}

stop_pidfile slurmd /run/slurmd.pid
stop_pidfile slurmctld /run/slurmctld.pid
stop_pidfile slurmdbd /run/slurmdbd.pid
stop_pidfile mariadbd /run/slurm-ci-db/mariadbd.pid
stop_pidfile munged /run/munge/munged.pid
echo "down.sh: Slurm stopped"
exit 0
