"""``bursar-run`` under site policy, against the real single-node Slurm (``scripts/slurm/up.sh``).

1. The time limit: an array submitted with ``--time 1`` and ``--signal TERM@20``; each task
   needs more work than the limit (62 s). Slurm checks time limits and sends ``--signal``
   warnings on a fixed 30 s tick (``PERIODIC_TIMEOUT`` in slurmctld), and the warning goes
   out at the first tick with ``now + 20 + 30 >= end``, i.e. at least 10 s into the run:
   every run is warned 10–40 s in (a requeued run, which starts ~7 s after the tick that
   warned the last one, 23 s in), well before its limit and before the worker's own
   ``--walltime-end`` margin (55 s in). Each warning makes the worker checkpoint and
   release its task and the wrapper requeue its array task; the next run resumes the task
   from its checkpoint. Every task completes exactly once, over several runs, every array
   task ends COMPLETED (never TIMEOUT), and every stop was Slurm's warning.
2. Preemption under ``PreemptMode=CANCEL``: two campaigns in partition ``cancel``
   (``GraceTime=15``) with ``--signal USR2@30``; a job of partition ``urgent`` (a higher
   ``PriorityTier``) that needs both CPUs preempts them. ``preempt_send_user_signal``
   makes Slurm send the jobs' USR2 at preemption; the wrappers forward it, the workers
   checkpoint. The campaign submitted as usual is requeued by its wrapper (22.05 accepts
   ``scontrol requeue`` of a job it is cancelling for preemption); the one whose jobs
   may not be requeued (``--no-requeue``, as a site's submit filter would set) is
   refused — "Requested operation is presently disabled" — and its wrapper submits the
   lost task again. Both finish every task exactly once, after the urgent job.

Skipped with the reason when the cluster is absent or down; ``BURSAR_REQUIRE_SLURM=1``
makes that a failure. Every wait is bounded.
"""

from __future__ import annotations

import json
import time

import pytest

from bursarcore.runtime import TaskQueue
from runtime_slurm import (cli, first_array, held_claims, history, squeue_jobs, status,
                           wait_finished, wrapper_logs, write_tasks)
from slurm_cluster import run

pytestmark = pytest.mark.slurm

LIMIT = 60           # --time 1


def counter_tasks(prefix: str, n: int, steps: int, step_seconds: float) -> list[dict]:
    return [{"id": f"{prefix}{i}", "payload": {"plugin": "counter", "steps": steps,
                                                "step_seconds": step_seconds}}
            for i in range(n)]


def assert_each_done_once(tq: TaskQueue, tasks: list[dict]) -> dict[str, dict]:
    """Every task done exactly once with all its steps, never failed nor reclaimed as
    stale; returns the results."""
    results = dict(tq.results())
    for t in tasks:
        state, rec = tq.get(t["id"])
        events = history(tq, t["id"])
        assert state == "done" and events.count("done") == 1, (t["id"], rec["history"])
        assert "fail" not in events and "stale" not in events, (t["id"], rec["history"])
        assert events.count("claim") == events.count("release") + 1, rec["history"]
        assert results[t["id"]]["steps"] == t["payload"]["steps"]
    assert tq.check() == []
    return results


def test_time_limit_warning_requeues_and_tasks_resume(queues, tmp_path):
    t0 = time.monotonic()
    q = str(tmp_path / "q")
    queues.append(q)
    steps, step_seconds = 124, 0.5                  # 62 s of work: more than the limit
    assert steps * step_seconds > LIMIT
    tasks = counter_tasks("w", 2, steps, step_seconds)
    f = write_tasks(tmp_path / "tasks.jsonl", tasks)
    cp = cli("submit", f, "--queue", q, "--workers", "2", "--time", "1",
             "--signal", "TERM@20", "--checkpoint-margin", "5", "--max-restarts", "0")
    assert cp.returncode == 0, cp.stderr
    job = first_array(q)
    with open(f"{q}/jobs.json") as fh:
        sbatch = json.load(fh)["arrays"][0]["sbatch"]
    assert "--time=1" in sbatch and "--signal=B:TERM@20" in sbatch, sbatch
    rec = squeue_jobs([job])
    assert rec and all(r["time_limit"] == 1 for r in rec), rec   # minutes, as Slurm holds it

    st = wait_finished(q, timeout=200)
    elapsed = time.monotonic() - t0
    assert st["counts"] == {"pending": 0, "claimed": 0, "done": 2, "failed": 0}
    tq = TaskQueue(q)
    results = assert_each_done_once(tq, tasks)
    for t in tasks:
        # no run is long enough for the whole task: it was stopped, released and resumed
        assert history(tq, t["id"]).count("release") >= 1
        r = results[t["id"]]
        assert r["checkpoints_resumed"] >= 1 and (r["resumed_at_step"] or 0) > 0, r
        h = tq.get(t["id"])[1]["history"]
        claimed = next(e["at"] for e in h if e["event"] == "claim")
        assert h[-1]["at"] - claimed > LIMIT, h      # ran for longer than the limit
    arr = st["arrays"][0]
    assert arr["states"] == {"COMPLETED": 2}, arr   # never TIMEOUT: each run stopped in time
    logs = wrapper_logs(q)
    requeues = logs.count(f"requeued {job}_")
    warnings = logs.count("TERM: forwarding to worker")
    assert requeues >= 2 and arr["restarts"] == requeues == st["requeues"]["requeued"], \
        (requeues, arr, st["requeues"])
    # every stop was Slurm's warning (a run can be warned while it starts, before a worker
    # runs); none was the worker's own walltime margin
    assert "on its own (walltime)" not in logs
    assert warnings + logs.count("SIGTERM during start-up") >= requeues, logs[-3000:]
    print(f"\ntime limit: {requeues} requeues, {warnings} warnings forwarded, "
          f"{elapsed:.1f} s")
    assert elapsed < 210


def test_preempted_under_cancel_requeued_or_resubmitted(queues, tmp_path):
    t0 = time.monotonic()
    tasks = {"rq": counter_tasks("a", 3, 40, 0.1), "norq": counter_tasks("b", 3, 40, 0.1)}
    qs = {k: str(tmp_path / k) for k in tasks}
    queues.extend(qs.values())
    jobs = {}
    for k, ts in tasks.items():
        f = write_tasks(tmp_path / f"{k}.jsonl", ts)
        extra = ["--sbatch-options=--no-requeue"] if k == "norq" else []
        cp = cli("submit", f, "--queue", qs[k], "--workers", "1", "--partition", "cancel",
                 "--signal", "USR2@30", *extra)
        assert cp.returncode == 0, cp.stderr
        jobs[k] = first_array(qs[k])
    tq = {k: TaskQueue(q) for k, q in qs.items()}

    # preempt once both campaigns have a task well under way
    deadline = time.monotonic() + 120     # (array tasks start slower on a loaded node)
    while not all(held_claims(tq[k], jobs[k], 1.5) for k in tasks):
        assert time.monotonic() < deadline, "the campaigns did not get under way"
        time.sleep(0.2)
    out = run("sbatch", "--parsable", "--partition=urgent", "--cpus-per-task=2",
              "--job-name=bursar-urgent", "--output=/dev/null", "--wrap", "sleep 2")
    assert out.returncode == 0, out.stderr
    urgent = out.stdout.strip().split(";")[0]
    try:
        st = {k: wait_finished(qs[k], timeout=90) for k in tasks}
    finally:
        run("scancel", urgent)
    elapsed = time.monotonic() - t0

    (u,) = squeue_jobs([urgent])
    assert u["job_state"] == "COMPLETED", u
    for k in tasks:
        assert st[k]["counts"] == {"pending": 0, "claimed": 0, "done": 3, "failed": 0}
        results = assert_each_done_once(tq[k], tasks[k])
        released = [t["id"] for t in tasks[k] if "release" in history(tq[k], t["id"])]
        assert released, f"{k}: no task was stopped by the preemption"
        assert any((results[t].get("resumed_at_step") or 0) > 0 for t in released), results
        logs = wrapper_logs(qs[k])
        assert "USR2: forwarding to worker" in logs, logs[-2000:]   # preempt_send_user_signal
        # the preempted task ran again only after the urgent job had finished
        resumed = [r for r in squeue_jobs([a["job_id"] for a in st[k]["arrays"]])
                   if r["start_time"] >= u["end_time"]]
        assert resumed, (k, u["end_time"], st[k]["arrays"])

    rq, norq = st["rq"], st["norq"]
    # PreemptMode=CANCEL, requeue allowed: the wrapper's requeue is accepted
    assert rq["requeues"]["requeued"] >= 1 and rq["requeues"]["refused"] == 0, rq["requeues"]
    assert len(rq["arrays"]) == 1 and rq["arrays"][0]["restarts"] >= 1, rq["arrays"]
    # requeue disabled: refused, and the wrapper resubmitted the lost task instead
    n = norq["requeues"]
    assert n["requeued"] == 0 and n["refused"] >= 1 and n["resubmitted"] >= 1, n
    assert "disabled" in (n["last_refusal"] or ""), n
    assert n["resubmit_failed"] == 0 and n["resubmit_limit"] == 0, n
    first, *again = norq["arrays"]
    assert first["job_id"] == jobs["norq"] and first["restarts"] == 0, norq["arrays"]
    assert again and all(a["resubmitted_from"] == f"{jobs['norq']}_0" and
                         a["states"] == {"COMPLETED": 1} for a in again), norq["arrays"]
    assert f"resubmitted as job {again[0]['job_id']}_0" in wrapper_logs(qs["norq"])
    print(f"\npreemption: {rq['requeues']['requeued']} requeued, {n['resubmitted']} "
          f"resubmitted, {elapsed:.1f} s")
    assert elapsed < 100
