#!/usr/bin/env bash
# Bring up a real single-node Slurm 22.05 (Debian slurm-wlm + munge) on localhost.
#
# Idempotent: daemons are tracked by PID files; a second run with unchanged settings
# restarts nothing. A changed slurm.conf (or gres.conf / cgroup.conf) restarts slurmctld
# and slurmd (saved jobs are kept). Needs root and, the first time, apt.
#
#   bash scripts/slurm/up.sh                     # 2 CPUs (what the machine has)
#   BURSAR_SLURM_CPUS=8 bash scripts/slurm/up.sh # advertise 8 CPUs (config_overrides)
#   BURSAR_SLURM_GPUS=2 ...                      # emulated gres/gpu:2, no devices
#   BURSAR_SLURM_PROCTRACK=cgroup ...            # proctrack/cgroup (v1 freezer)
#   BURSAR_SLURM_FRESH=1 ...                     # wipe saved job state first
#   BURSAR_SLURM_EXTRA_CONF=$'RequeueExit=99' ...# extra slurm.conf lines
#   BURSAR_SLURM_WAIT=30                         # bound (s) on each readiness wait
#
# Partitions: debug (default; never preempted), cancel (PreemptMode=CANCEL, GraceTime=15)
# and urgent (higher PriorityTier: preempts cancel), for the site-policy tests.
#
# State lives under $BURSAR_SLURM_DIR (default /tmp/bursar-slurm): state/ spool/ run/ log/.
# See docs/runtime.md and ../shared/slurm/NOTES.md for why each setting is what it is.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"

t0=$(now)
WAIT=${BURSAR_SLURM_WAIT:-30}
[[ $EUID -eq 0 ]] || die "must run as root (the daemons run as root; apt may be needed)"

# ---------------------------------------------------------------- packages
need_install() {
    local b
    for b in slurmctld slurmd sbatch munged mungekey; do
        command -v "$b" >/dev/null 2>&1 || return 0
    done
    return 1
}
export PATH=$PATH:/usr/sbin:/sbin
mkdir -p "$BURSAR_SLURM_DIR"/{state,spool/slurmd,run,log} "$SLURM_ETC"
APTLOG=$BURSAR_SLURM_DIR/log/apt.log
if need_install; then
    log "installing slurm-wlm and munge (apt)"
    export DEBIAN_FRONTEND=noninteractive
    pkgs=(slurm-wlm munge)
    if ! apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends "${pkgs[@]}" >"$APTLOG" 2>&1; then
        log "apt-get install failed; running apt-get update once and retrying"
        apt-get update -q -o DPkg::Lock::Timeout=300 >>"$APTLOG" 2>&1 || true
        apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends "${pkgs[@]}" >>"$APTLOG" 2>&1 \
            || { tail -n 20 "$APTLOG" >&2; die "apt-get install ${pkgs[*]}"; }
    fi
    need_install && die "packages installed but binaries missing"
    log "installed in $(elapsed "$t0") s"
fi

# ---------------------------------------------------------------- munge
# Reuse a munged that already answers (then down.sh leaves it alone); otherwise start
# our own and record its pid in $RUN/munged.pid.
if ! munge_works; then
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating /etc/munge/munge.key"
        mungekey --create --keyfile=/etc/munge/munge.key --force
    fi
    chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
    mkdir -p "$MUNGE_RUN" /var/log/munge /var/lib/munge
    chown munge:munge "$MUNGE_RUN" /var/log/munge /var/lib/munge
    chmod 0755 "$MUNGE_RUN"
    stop_pidfile "$RUN/munged.pid" munged 5
    runuser -u munge -- /usr/sbin/munged --force
    for ((i = 0; i < WAIT * 20; i++)); do munge_works && break; sleep 0.05; done
    munge_works || die "munged did not come up (see /var/log/munge/munged.log)"
    cp "$MUNGE_RUN/munged.pid" "$RUN/munged.pid"
    log "munged started (pid $(cat "$RUN/munged.pid"))"
fi

# ---------------------------------------------------------------- configuration
hw=$(slurmd -C | head -n1)
field() { sed -n "s/.*\b$1=\([0-9]*\).*/\1/p" <<<"$hw"; }
hw_cpus=$(field CPUs)
hw_mem=$(field RealMemory)
[[ -n $hw_cpus && -n $hw_mem ]] || die "cannot parse 'slurmd -C': $hw"
cpus=${BURSAR_SLURM_CPUS:-$hw_cpus}
[[ $cpus =~ ^[1-9][0-9]*$ ]] || die "BURSAR_SLURM_CPUS must be a positive integer (got '$cpus')"
if [[ $cpus == "$hw_cpus" ]]; then
    topo="CPUs=$cpus Boards=$(field Boards) SocketsPerBoard=$(field SocketsPerBoard) CoresPerSocket=$(field CoresPerSocket) ThreadsPerCore=$(field ThreadsPerCore)"
else
    topo="CPUs=$cpus Boards=1 SocketsPerBoard=1 CoresPerSocket=$cpus ThreadsPerCore=1"
fi
mem=$((hw_mem * 90 / 100))
gpus=${BURSAR_SLURM_GPUS:-0}
[[ $gpus =~ ^[0-9]+$ ]] || die "BURSAR_SLURM_GPUS must be a non-negative integer (got '$gpus')"
proctrack=${BURSAR_SLURM_PROCTRACK:-linuxproc}
case $proctrack in linuxproc | pgid | cgroup) ;; *) die "BURSAR_SLURM_PROCTRACK: linuxproc, pgid or cgroup" ;; esac
D=$BURSAR_SLURM_DIR

gen_slurm_conf() {
    cat <<EOF
$MARKER
ClusterName=bursar
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=5
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/slurmd
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/$proctrack
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$((mem / cpus))
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=1,bf_interval=1
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
MinJobAge=3600
KillWait=5
InactiveLimit=0
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
SlurmctldParameters=preempt_send_user_signal
EOF
    if ((gpus > 0)); then echo "GresTypes=gpu"; fi
    if [[ -n ${BURSAR_SLURM_EXTRA_CONF:-} ]]; then printf '%s\n' "$BURSAR_SLURM_EXTRA_CONF"; fi
    local gres=""
    if ((gpus > 0)); then gres=" Gres=gpu:$gpus"; fi
    echo "NodeName=localhost NodeAddr=127.0.0.1 $topo RealMemory=$mem$gres State=UNKNOWN"
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=OFF"
    # site policy under test: jobs in "cancel" are cancelled (not requeued) when a job
    # of "urgent" (higher PriorityTier) needs their CPUs; "debug" is never preempted
    echo "PartitionName=cancel Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=CANCEL GraceTime=15"
    echo "PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF"
}
# Emulated GPUs. slurmd drops a file-less gpu GRES ("Removing file-less GPU") and rejects
# a File= that is not a character device, so each fake GPU is a character device node
# with /dev/null's numbers (1,3) under $D/dev: jobs get CUDA_VISIBLE_DEVICES etc., and
# nothing real is behind it.
gen_gres_conf() {
    ((gpus > 0)) || return 0
    printf '%s\n' "$MARKER" "# emulated GPUs: /dev/null clones, see up.sh" \
        "NodeName=localhost Name=gpu File=$D/dev/nvidia[0-$((gpus - 1))]"
}
make_fake_gpus() {
    local k dev
    mkdir -p "$D/dev"
    for ((k = 0; k < gpus; k++)); do
        dev=$D/dev/nvidia$k
        [[ -c $dev ]] || { rm -f "$dev"; mknod -m 0666 "$dev" c 1 3; }
    done
}
((gpus == 0)) || make_fake_gpus
gen_cgroup_conf() {
    [[ $proctrack == cgroup ]] || return 0
    printf '%s\n' "$MARKER" CgroupPlugin=cgroup/v1 CgroupMountpoint=/sys/fs/cgroup CgroupAutomount=no \
        ConstrainCores=no ConstrainRAMSpace=no ConstrainSwapSpace=no ConstrainDevices=no
}

changed=0
# install_conf NAME CONTENT: write $SLURM_ETC/NAME if it differs; empty CONTENT removes
# a file we wrote earlier. A foreign file is kept as NAME.bursar-backup.
install_conf() {
    local path=$SLURM_ETC/$1 content=$2
    if [[ -z $content ]]; then
        if [[ -f $path ]] && head -n1 "$path" | grep -qxF "$MARKER"; then
            rm -f "$path"; changed=1
        fi
        return 0
    fi
    if [[ -f $path ]] && [[ $(cat "$path") == "$content" ]]; then return 0; fi
    if [[ -f $path ]] && ! head -n1 "$path" | grep -qxF "$MARKER" && [[ ! -e $path.bursar-backup ]]; then
        cp -p "$path" "$path.bursar-backup"
        log "kept the previous $path as $path.bursar-backup"
    fi
    printf '%s\n' "$content" >"$path.tmp.$$" && mv -f "$path.tmp.$$" "$path"
    changed=1
}
install_conf slurm.conf "$(gen_slurm_conf)"
install_conf gres.conf "$(gen_gres_conf)"
install_conf cgroup.conf "$(gen_cgroup_conf)"

# ---------------------------------------------------------------- daemons
ctld_pid=$(pid_of "$RUN/slurmctld.pid" slurmctld || true)
slurmd_pid=$(pid_of "$RUN/slurmd.pid" slurmd || true)

if [[ ${BURSAR_SLURM_FRESH:-0} == 1 ]]; then
    log "BURSAR_SLURM_FRESH=1: stopping daemons and wiping saved job state"
    stop_pidfile "$RUN/slurmd.pid" slurmd
    stop_pidfile "$RUN/slurmctld.pid" slurmctld
    rm -rf "${D:?}/state" "${D:?}/spool"
    mkdir -p "$D"/{state,spool/slurmd}
    ctld_pid="" slurmd_pid=""
elif ((changed)) && [[ -n $ctld_pid || -n $slurmd_pid ]]; then
    log "configuration changed: restarting slurmd and slurmctld (saved jobs are kept)"
    stop_pidfile "$RUN/slurmd.pid" slurmd
    stop_pidfile "$RUN/slurmctld.pid" slurmctld
    ctld_pid="" slurmd_pid=""
fi

started=()
if [[ -z $ctld_pid ]]; then
    slurmctld -i || die "slurmctld failed to start (see $D/log/slurmctld.log)"
    started+=(slurmctld)
fi
for ((i = 0; i < WAIT * 20; i++)); do ctld_up && break; sleep 0.05; done
ctld_up || { tail -n 20 "$D/log/slurmctld.log" >&2; die "slurmctld not UP after ${WAIT}s"; }

if [[ -z $slurmd_pid ]]; then
    slurmd -N localhost || die "slurmd failed to start (see $D/log/slurmd.log)"
    started+=(slurmd)
fi

# Wait until slurmd has registered (sinfo leaves "unk"); a job submitted before that
# waits ~4 s with "Nodes required for job are DOWN". A node left down/drained by an
# earlier run is resumed once.
resumed=0
state=""
for ((i = 0; i < WAIT * 20; i++)); do
    state=$(node_state)
    case $state in
        idle | mix | alloc | comp | resv | plnd) break ;;
        inval)
            # slurmd's registration contradicts slurm.conf (e.g. fewer GRES than configured)
            die "node localhost is INVAL: $(scontrol show node localhost | sed -n 's/^ *Reason=//p')" ;;
        down | drain | drng | fail)
            if ((!resumed)); then
                scontrol update NodeName=localhost State=RESUME >/dev/null 2>&1 || true
                resumed=1
            fi ;;
    esac
    sleep 0.05
done
case $state in
    idle | mix | alloc | comp | resv | plnd) ;;
    *) tail -n 20 "$D/log/slurmd.log" >&2; die "node localhost is '$state' after ${WAIT}s (want idle)" ;;
esac

if ((${#started[@]})); then what="started ${started[*]}"; else what="already running, nothing restarted"; fi
log "ready in $(elapsed "$t0") s: $what; node localhost $state, CPUs=$cpus RealMemory=$mem$( ((gpus)) && echo " gpu:$gpus")"
