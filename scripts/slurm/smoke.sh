#!/usr/bin/env bash
# Smoke test of the cluster up.sh started: a trivial job, an array, and (SMOKE_SLOW=1)
# a requeue of an array task. Every wait is bounded; exits non-zero on the first failure.
#
#   bash scripts/slurm/smoke.sh            # ~3-10 s
#   SMOKE_SLOW=1 bash scripts/slurm/smoke.sh   # + requeue (waits cred_expire+1 s, ~6-8 s more)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"

t0=$(now)
WAIT=${BURSAR_SLURM_WAIT:-60}
out=$BURSAR_SLURM_DIR/smoke/$$
mkdir -p "$out"
pass=0
ok() { pass=$((pass + 1)); log "PASS $*"; }

command -v sbatch >/dev/null || die "sbatch not found: run up.sh first"
ctld_up || die "slurmctld not answering: run up.sh first"
ok "slurmctld UP, node $(node_state)"

# job_states ID: one state per line for the job and all its array tasks (squeue's text
# output honours -j, unlike --json).
job_states() { squeue -h -j "$1" -t all -o %T 2>/dev/null; }

# wait_done ID N: wait until the job shows N records, all in a final state.
wait_done() {
    local id=$1 n=$2 i states
    for ((i = 0; i < WAIT * 10; i++)); do
        states=$(job_states "$id")
        if [[ $(grep -c . <<<"$states") -ge $n ]] && ! grep -qvE '^(COMPLETED|FAILED|CANCELLED|TIMEOUT|OUT_OF_MEMORY|NODE_FAIL|BOOT_FAIL|DEADLINE|PREEMPTED)$' <<<"$states"; then
            printf '%s\n' "$states"
            return 0
        fi
        sleep 0.1
    done
    printf '%s\n' "$states"
    return 1
}

# 1. trivial job
t=$(now)
id=$(sbatch --parsable -o "$out/%j.out" --wrap 'echo hello-$SLURM_JOB_ID')
st=$(wait_done "$id" 1) || die "job $id not finished after ${WAIT}s: $st"
[[ $st == COMPLETED ]] || die "job $id ended $st"
grep -qx "hello-$id" "$out/$id.out" || die "job $id output: $(cat "$out/$id.out" 2>&1)"
ok "job $id COMPLETED in $(elapsed "$t") s"

# 2. array 0-7 with at most 2 at once
t=$(now)
aid=$(sbatch --parsable --array=0-7%2 -o "$out/%A_%a.out" --wrap 'echo task-$SLURM_ARRAY_TASK_ID-of-$SLURM_ARRAY_TASK_COUNT')
st=$(wait_done "$aid" 8) || die "array $aid not finished after ${WAIT}s: $st"
[[ $(grep -c '^COMPLETED$' <<<"$st") -eq 8 ]] || die "array $aid states: $(tr '\n' ' ' <<<"$st")"
for k in 0 1 2 3 4 5 6 7; do
    grep -qx "task-$k-of-8" "$out/${aid}_$k.out" || die "array task ${aid}_$k output: $(cat "$out/${aid}_$k.out" 2>&1)"
done
ok "array $aid (0-7%2) COMPLETED in $(elapsed "$t") s"

# 3. requeue of one array task: runs twice, SLURM_RESTART_COUNT 0 then 1
if [[ ${SMOKE_SLOW:-0} == 1 ]]; then
    t=$(now)
    rid=$(sbatch --parsable --requeue --open-mode=append --array=0-1 -o "$out/%A_%a.out" \
        --wrap 'echo run-${SLURM_RESTART_COUNT:-0}; [ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] || [ "$SLURM_ARRAY_TASK_ID" != 1 ] || { scontrol requeue ${SLURM_ARRAY_JOB_ID}_1; sleep 30; }')
    st=$(wait_done "$rid" 2) || die "requeue array $rid not finished after ${WAIT}s: $st"
    [[ $(grep -c '^COMPLETED$' <<<"$st") -eq 2 ]] || die "requeue array $rid states: $(tr '\n' ' ' <<<"$st")"
    # slurmstepd also writes "*** JOB ... CANCELLED ... DUE TO JOB REQUEUE ***" into the file
    [[ $(grep '^run-' "$out/${rid}_1.out" | tr '\n' ' ') == "run-0 run-1 " ]] || die "requeued task output: $(cat "$out/${rid}_1.out")"
    ok "self-requeued array task ${rid}_1 ran twice and COMPLETED in $(elapsed "$t") s"
fi

rm -rf "$out"
log "all $pass checks passed in $(elapsed "$t0") s"
