"""Smoke tests against the real single-node Slurm that ``scripts/slurm/up.sh`` brings up.

Skipped, with the reason, when ``sinfo`` is missing or the cluster is not up;
``BURSAR_REQUIRE_SLURM=1`` (CI) turns that skip into a failure. Every wait is bounded.

Job states come from ``squeue --json``, which in Slurm 22.05 ignores ``-j``/``-t``/``-u``
and returns every job slurmctld still holds (finished ones stay for MinJobAge=3600 s), so
the records are filtered here.
"""

from __future__ import annotations

import json
import time

import pytest

from slurm_cluster import require_cluster, run

pytestmark = pytest.mark.slurm

FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
         "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


@pytest.fixture(scope="module")
def slurm():
    require_cluster(min_cpus=1)
    submitted: list[str] = []
    yield submitted
    if submitted:  # never leave a test's jobs behind
        run("scancel", *submitted)


def sbatch(submitted: list[str], *args: str) -> str:
    out = run("sbatch", "--parsable", *args)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]  # "ID" or "ID;cluster"
    assert job_id.isdigit(), out.stdout
    submitted.append(job_id)
    return job_id


def job_records(job_id: str) -> list[dict]:
    """Records of a job (and of its array tasks) from ``squeue --json``."""
    out = run("squeue", "--json")
    assert out.returncode == 0, out.stderr
    jid = int(job_id)
    return [j for j in json.loads(out.stdout)["jobs"]
            if j.get("job_id") == jid or j.get("array_job_id") == jid]


def wait_final(job_id: str, n: int, timeout: float) -> list[dict]:
    """Wait (bounded) until the job shows ``n`` records, all in a final state."""
    deadline = time.monotonic() + timeout
    recs: list[dict] = []
    while time.monotonic() < deadline:
        recs = job_records(job_id)
        if len(recs) >= n and all(r["job_state"] in FINAL for r in recs):
            return recs
        time.sleep(0.2)
    pytest.fail(f"job {job_id}: not finished after {timeout} s: "
                f"{[(r.get('array_task_id'), r['job_state'], r.get('state_reason')) for r in recs]}")


def test_wrap_job_completes(slurm, tmp_path):
    t0 = time.monotonic()
    job = sbatch(slurm, "-o", str(tmp_path / "%j.out"), "--wrap", "echo hello-$SLURM_JOB_ID")
    [rec] = wait_final(job, 1, timeout=60)
    assert rec["job_state"] == "COMPLETED" and rec["exit_code"] == 0
    assert rec["array_job_id"] == 0
    assert (tmp_path / f"{job}.out").read_text().strip() == f"hello-{job}"
    assert time.monotonic() - t0 < 60


def test_exit_code_is_a_raw_wait_status(slurm, tmp_path):
    job = sbatch(slurm, "-o", str(tmp_path / "%j.out"), "--wrap", "exit 3")
    [rec] = wait_final(job, 1, timeout=60)
    assert rec["job_state"] == "FAILED"
    assert rec["exit_code"] == 3 << 8  # 768: squeue --json reports the wait status


def test_requeued_array_completes(slurm, tmp_path):
    """An array with --requeue; task 1 requeues itself once (as the runtime's wrapper does
    on SIGTERM) and runs again after cred_expire+1 s with SLURM_RESTART_COUNT=1."""
    script = (
        'echo "run-${SLURM_RESTART_COUNT:-0} task-$SLURM_ARRAY_TASK_ID"; '
        'if [ "$SLURM_ARRAY_TASK_ID" = 1 ] && [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then '
        'scontrol requeue "${SLURM_ARRAY_JOB_ID}_1"; sleep 60; fi'
    )
    job = sbatch(slurm, "--requeue", "--open-mode=append", "--array=0-3",
                 "-o", str(tmp_path / "%A_%a.out"), "--wrap", script)
    recs = wait_final(job, 4, timeout=120)
    by_task = {r["array_task_id"]: r for r in recs}
    assert sorted(by_task) == [0, 1, 2, 3]
    assert all(r["job_state"] == "COMPLETED" for r in recs), [(r["array_task_id"], r["job_state"]) for r in recs]
    assert by_task[1]["restart_cnt"] == 1 and by_task[0]["restart_cnt"] == 0
    runs = [ln for ln in (tmp_path / f"{job}_1.out").read_text().splitlines() if ln.startswith("run-")]
    assert runs == ["run-0 task-1", "run-1 task-1"]  # --open-mode=append kept both runs
    for k in (0, 2, 3):
        assert (tmp_path / f"{job}_{k}.out").read_text().split() == ["run-0", f"task-{k}"]
