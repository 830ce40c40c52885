# Shared helpers for up.sh / down.sh / smoke.sh (sourced, not run).
# A real single-node Slurm 22.05 on localhost; see docs/runtime.md.

BURSAR_SLURM_DIR=${BURSAR_SLURM_DIR:-/tmp/bursar-slurm}
SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
export SLURM_CONF
SLURM_ETC=$(dirname "$SLURM_CONF")
MARKER="# written by bursar up.sh"
RUN="$BURSAR_SLURM_DIR/run"
MUNGE_RUN=/run/munge

log() { printf '%s: %s\n' "${0##*/}" "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

# now in seconds with decimals (bash 5 has EPOCHREALTIME)
now() { printf '%s\n' "${EPOCHREALTIME:-$(date +%s.%N)}"; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# alive PID NAME: the process exists, is not a zombie, and its comm is NAME.
# PID 1 here reaps orphans late, so a stopped daemon can linger as <defunct>
# for about a second: that counts as stopped.
alive() {
    local pid=$1 name=$2 stat comm
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [[ -r /proc/$pid/stat ]] || return 1
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
    [[ $comm == "$name" ]] || return 1
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

# pid_of PIDFILE NAME: print the pid if the file names a live NAME process.
pid_of() {
    local file=$1 name=$2 pid
    [[ -r $file ]] || return 1
    pid=$(tr -dc 0-9 <"$file")
    alive "$pid" "$name" || return 1
    printf '%s\n' "$pid"
}

# stop_pidfile PIDFILE NAME [GRACE]: TERM, wait up to GRACE s, then KILL.
stop_pidfile() {
    local file=$1 name=$2 grace=${3:-15} pid i
    pid=$(pid_of "$file" "$name") || { rm -f "$file"; return 0; }
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < grace * 20; i++)); do
        alive "$pid" "$name" || { rm -f "$file"; return 0; }
        sleep 0.05
    done
    log "$name (pid $pid) ignored TERM for ${grace}s; sending KILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        alive "$pid" "$name" || { rm -f "$file"; return 0; }
        sleep 0.05
    done
    die "$name (pid $pid) survived KILL"
}

munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

ctld_up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }

# node_state: compact sinfo state of localhost ("idle", "mix", "unk*", "down*", ...)
node_state() { sinfo -h -n localhost -o %t 2>/dev/null | head -n1; }
