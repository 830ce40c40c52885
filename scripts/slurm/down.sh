#!/usr/bin/env bash
# Stop the single-node Slurm that up.sh started.
#
#   bash scripts/slurm/down.sh           # cancel jobs, stop slurmd, slurmctld, our munged
#   bash scripts/slurm/down.sh --purge   # also remove $BURSAR_SLURM_DIR and the config
#                                        # files up.sh wrote (only those with its marker)
#
# Only PIDs from PID files are signalled, each checked against /proc/PID/comm; a zombie
# counts as stopped. munged is stopped only if up.sh started it. slurmstepd is never
# killed here: if one survives, it is reported.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
export PATH=$PATH:/usr/sbin:/sbin

purge=0
for a in "$@"; do
    case $a in
        --purge) purge=1 ;;
        *) die "usage: down.sh [--purge]" ;;
    esac
done
t0=$(now)
WAIT=${BURSAR_SLURM_WAIT:-30}

if pid_of "$RUN/slurmctld.pid" slurmctld >/dev/null && ctld_up; then
    mapfile -t jobs < <(squeue -h -o %F 2>/dev/null | sort -u)
    if ((${#jobs[@]})); then
        log "cancelling ${#jobs[@]} job(s)"
        scancel "${jobs[@]}" 2>/dev/null || true
        for ((i = 0; i < WAIT * 10; i++)); do
            [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break
            sleep 0.1
        done
        [[ -z $(squeue -h -o %i 2>/dev/null) ]] || log "jobs still listed after ${WAIT}s; stopping anyway"
    fi
fi

stop_pidfile "$RUN/slurmd.pid" slurmd
stop_pidfile "$RUN/slurmctld.pid" slurmctld
if [[ -f $RUN/munged.pid ]]; then
    stop_pidfile "$RUN/munged.pid" munged
fi

left=$(ps -eo pid=,stat=,comm= | awk '$2 !~ /^Z/ && $3 == "slurmstepd" { print $1 }' | tr '\n' ' ')
[[ -z $left ]] || log "warning: slurmstepd still running (pids $left); not killed"

if ((purge)); then
    for f in slurm.conf gres.conf cgroup.conf; do
        p=$SLURM_ETC/$f
        if [[ -f $p ]] && head -n1 "$p" | grep -qxF "$MARKER"; then rm -f "$p"; fi
    done
    rm -rf "${BURSAR_SLURM_DIR:?}"
    log "purged $BURSAR_SLURM_DIR and the config files up.sh wrote"
fi
log "stopped in $(elapsed "$t0") s"
