"""``bursar-run`` against the real single-node Slurm (``scripts/slurm/up.sh``).

1. A small two-tier campaign with a minimal queue worker (``--worker-cmd``): every task
   completes exactly once and every array task ends COMPLETED — the submission, the batch
   script and the wrapper on their own.
2. The fault test (SPEC §13, RASER §4): 40 heterogeneous ``counter`` tasks run by the real
   worker in an array; array tasks holding a task are sent SIGTERM several times with
   ``scancel --signal=TERM --batch <job>_<task>``; each time the wrapper forwards it, the
   worker checkpoints and exits 99, the wrapper requeues its array task (Slurm reruns it
   after cred_expire+1 s ≈ 6 s, same ``SLURM_ARRAY_TASK_ID``) and the task resumes from
   its checkpoint. Every task completes exactly once, none fails, at least one resumed from
   a checkpoint with steps already done.
3. Cancel: ``bursar-run cancel`` while tasks run; the workers checkpoint and release, the
   wrappers do not requeue (stop file), the array ends CANCELLED; ``submit`` again resumes
   the tasks from their checkpoints.

Skipped with the reason when the cluster is absent or down; ``BURSAR_REQUIRE_SLURM=1``
makes that a failure. Every wait is bounded. The node has 2 CPUs here (1 per array task),
so 2 workers run at once; the test also works with more.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from bursarcore.runtime import TaskQueue
from runtime_slurm import cli, first_array, held_claims, status, wait_finished, write_tasks
from slurm_cluster import run

pytestmark = pytest.mark.slurm

MINI_WORKER = textwrap.dedent('''\
    """A minimal worker: claim, mark, complete, until nothing is claimable; exit 0."""
    import argparse, os, sys, time
    from bursarcore.runtime import TaskQueue
    ap = argparse.ArgumentParser()
    ap.add_argument("marks")
    ap.add_argument("--queue"); ap.add_argument("--tier", type=int); ap.add_argument("--grace")
    a = ap.parse_args()
    q = TaskQueue(a.queue)
    while (c := q.claim(a.tier)) is not None:
        with open(a.marks, "a") as f:           # O_APPEND: one line per execution
            f.write(c.task_id + "\\n")
        time.sleep(c.payload["sleep"])
        assert q.complete(c, {"array_task": os.environ["SLURM_ARRAY_TASK_ID"],
                              "job": os.environ["SLURM_ARRAY_JOB_ID"]})
    sys.exit(0)
''')


def test_small_campaign_runs_each_task_exactly_once(queues, tmp_path):
    t0 = time.monotonic()
    q = str(tmp_path / "q")
    queues.append(q)
    worker = tmp_path / "mini_worker.py"
    worker.write_text(MINI_WORKER)
    marks = tmp_path / "marks"
    tasks = [{"id": f"t{i:02d}", "payload": {"sleep": 0.2}} for i in range(10)]
    tasks[9]["tier"] = 1
    f = write_tasks(tmp_path / "tasks.jsonl", tasks)
    cp = cli("submit", f, "--queue", q, "--workers", "2,1", "--max-running", "2,1",
             "--tiers", "mem=200M,400M", "--grace", "30",
             "--worker-cmd", f"{sys.executable} {worker} {marks}")
    assert cp.returncode == 0, cp.stderr
    assert "10 new task(s)" in cp.stdout
    jobs = json.loads((tmp_path / "q" / "jobs.json").read_text())["arrays"]
    assert [(j["tier"], j["mem"]) for j in jobs] == [(0, "200M"), (1, "400M")]
    assert all(f"tier {j['tier']}: array {j['job_id']}" in cp.stdout for j in jobs)

    st = wait_finished(q, timeout=120)
    assert st["counts"] == {"pending": 0, "claimed": 0, "done": 10, "failed": 0}
    lines = marks.read_text().split()
    assert sorted(lines) == [t["id"] for t in tasks]           # each ran exactly once
    tq = TaskQueue(q)
    assert tq.check() == []
    ids = {j["job_id"] for j in jobs}
    assert all(r["job"] in ids for _, r in tq.results())
    assert tq.get("t09")[1]["result"]["job"] == jobs[1]["job_id"]  # tier-1 task: tier-1 array
    by_array = {a["job_id"]: a["states"] for a in st["arrays"]}
    assert by_array == {jobs[0]["job_id"]: {"COMPLETED": 2}, jobs[1]["job_id"]: {"COMPLETED": 1}}
    log0 = (tmp_path / "q" / "logs" / f"{jobs[0]['job_id']}_0.out").read_text()
    assert "worker exited 0" in log0                            # the wrapper's log line
    assert time.monotonic() - t0 < 120


def test_random_sigterm_faults_every_task_completes_once(queues, tmp_path):
    """RASER's fault test: random SIGTERMs to running array tasks; all tasks complete
    exactly once, resumed from checkpoints, none failed."""
    try:
        from bursarcore.runtime.plugins import load_plugin
        from bursarcore.runtime.worker import main as _worker_main  # noqa: F401
        load_plugin("counter")
    except Exception as exc:  # noqa: BLE001 - the worker is another module's; say why
        pytest.fail(f"the runtime worker or its counter plugin is unusable: {exc}")
    t0 = time.monotonic()
    q = str(tmp_path / "q")
    queues.append(q)
    # heterogeneous: 4..22 steps of 0.1 s, a few long ones (45 steps) for the faults to hit
    tasks = []
    for i in range(40):
        steps = 45 if i % 8 == 0 else 4 + (i * 7) % 19
        tasks.append({"id": f"c{i:02d}", "payload": {"plugin": "counter", "steps": steps,
                                                      "step_seconds": 0.1}})
    f = write_tasks(tmp_path / "tasks.jsonl", tasks)
    cp = cli("submit", f, "--queue", q, "--workers", "4", "--tiers", "mem=300M",
             "--grace", "30", "--max-restarts", "2")
    assert cp.returncode == 0, cp.stderr
    job = first_array(q)
    tq = TaskQueue(q)

    faults: list[tuple[float, str, str]] = []   # (time, task id, array task)
    next_fault = [time.monotonic() + 4.0]

    def inject(st: dict) -> None:
        if len(faults) >= 4 or time.monotonic() < next_fault[0]:
            return
        # prefer a long task well under way, so the resume has steps behind it
        cands = held_claims(tq, job, min_age=2.0)
        long_ = [c for c in cands if c[0] in {t["id"] for t in tasks
                                                  if t["payload"]["steps"] == 45}]
        pick = (long_ or cands)[:1]
        if not pick:
            return
        tid, task = pick[0]
        try:
            r = run("scancel", "--signal=TERM", "--batch", task, timeout=5)
            assert r.returncode == 0, r.stderr
        except subprocess.TimeoutExpired:
            # seen once in 22.05: the signal is delivered, yet slurmctld answers "Job can
            # not be altered now" and scancel retries until the requeued task runs again
            pass
        faults.append((round(time.monotonic() - t0, 1), tid, task))
        next_fault[0] = time.monotonic() + 5.0

    st = wait_finished(q, timeout=210, on_tick=inject)
    elapsed = time.monotonic() - t0

    assert len(faults) >= 3, f"only {len(faults)} faults injected: {faults}"
    assert st["counts"] == {"pending": 0, "claimed": 0, "done": 40, "failed": 0}
    assert tq.check() == []
    results = dict(tq.results())
    releases = 0
    for t in tasks:
        state, rec = tq.get(t["id"])
        assert state == "done"
        events = [h["event"] for h in rec["history"]]
        assert events.count("done") == 1                      # completed exactly once
        assert "fail" not in events and "stale" not in events, (t["id"], rec["history"])
        assert events.count("claim") == events.count("release") + 1
        releases += events.count("release")
        assert results[t["id"]]["steps"] == t["payload"]["steps"]
    resumed = {k: r for k, r in results.items() if r.get("resumed_from") is not None}
    assert releases >= 1 and resumed, f"no task was released and resumed: faults {faults}"
    assert any((r.get("resumed_at_step") or 0) > 0 for r in resumed.values()), resumed
    # every faulted array task was requeued by its wrapper and finished on a later run
    arr = st["arrays"][0]
    assert arr["states"] == {"COMPLETED": 4}, arr
    assert arr["restarts"] >= 1
    logs = "".join((tmp_path / "q" / "logs" / n).read_text()
                   for n in os.listdir(tmp_path / "q" / "logs") if n.startswith(f"{job}_"))
    assert f"requeued {job}_" in logs
    print(f"\nfault test: {len(faults)} faults {faults}, {releases} releases, "
          f"{len(resumed)} resumed, array restarts {arr['restarts']}, {elapsed:.1f} s")
    assert elapsed < 240


def test_cancel_does_not_requeue_and_submit_resumes(queues, tmp_path):
    """``bursar-run cancel``: scancel's SIGTERM makes the workers checkpoint and release,
    the stop file keeps the wrappers from requeueing (Slurm 22.05 would accept it), the
    arrays end CANCELLED with no restart; submitting again resumes from the checkpoints."""
    t0 = time.monotonic()
    q = str(tmp_path / "q")
    queues.append(q)
    tasks = [{"id": f"k{i}", "payload": {"plugin": "counter", "steps": 30,
                                          "step_seconds": 0.1}} for i in range(4)]
    f = write_tasks(tmp_path / "tasks.jsonl", tasks)
    cp = cli("submit", f, "--queue", q, "--workers", "2", "--grace", "30")
    assert cp.returncode == 0, cp.stderr
    tq = TaskQueue(q)
    job = first_array(q)
    deadline = time.monotonic() + 90
    while len(held_claims(tq, job, min_age=1.5)) < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert held_claims(tq, job, min_age=1.5), "no task got under way"
    cp = cli("cancel", "--queue", q)
    assert cp.returncode == 0 and f"cancelled arrays {job}" in cp.stdout, cp.stderr
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        st = status(q)
        if not st["arrays"][0]["live"] and st["counts"]["claimed"] == 0:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"cancelled array still live or tasks still claimed: {st}")
    arr = st["arrays"][0]
    assert set(arr["states"]) == {"CANCELLED"} and arr["restarts"] == 0, arr
    time.sleep(7)                     # longer than a requeue's cred_expire+1 s wait
    assert not status(q)["arrays"][0]["live"]
    released = [t["id"] for t in tasks
                if "release" in [h["event"] for h in tq.get(t["id"])[1]["history"]]]
    assert released, "scancel's SIGTERM did not make a worker release its task"
    assert st["counts"]["done"] < 4

    cp = cli("submit", f, "--queue", q, "--workers", "2", "--grace", "30")
    assert cp.returncode == 0 and "0 new task(s), 4 already queued" in cp.stdout, cp.stderr
    assert not (tmp_path / "q" / "cancelled").exists()
    st = wait_finished(q, timeout=120)
    assert st["counts"] == {"pending": 0, "claimed": 0, "done": 4, "failed": 0}
    results = dict(tq.results())
    assert all(r["steps"] == 30 for r in results.values())
    assert any((results[t].get("resumed_at_step") or 0) > 0 for t in released), results
    assert tq.check() == []
    assert time.monotonic() - t0 < 200
