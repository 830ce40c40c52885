"""Many worker processes against one queue: no task held by two workers at once, none
lost, every task done exactly once (SPEC §13). Real processes, real clock, bounded time.

Double claims are detected independently of the queue: a worker creates
``markers/<id>`` with ``O_EXCL`` when it gets a claim and removes it before it hands the
task back, so a second concurrent holder finds the marker and records a violation.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time

import pytest

from bursarcore.runtime import QueueConfig, TaskQueue

DEADLINE = 25.0  # seconds of real time for any one test's workers


def _worker(root, marker_dir, log_path, tier, crash_ids, t_end):
    q = TaskQueue(root, worker=f"w{os.getpid()}")
    events = []
    idle = 0
    try:
        while time.time() < t_end:
            c = q.claim(tier)
            if c is None:
                n = q.counts()
                if n["pending"] == 0 and n["claimed"] == 0:
                    break
                idle += 1
                time.sleep(min(0.002 * idle, 0.05))
                continue
            idle = 0
            mark = os.path.join(marker_dir, c.task_id)
            try:
                os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                events.append(["double", c.task_id])
                continue
            p = c.payload
            if c.task_id in crash_ids and c.attempts == 1:
                # die holding the claim: a peer must reclaim it once its heartbeat is stale
                os.unlink(mark)
                with open(log_path, "w") as f:
                    json.dump(events + [["crash", c.task_id]], f)
                os._exit(3)
            os.unlink(mark)
            if c.failures < p["fail_times"]:
                events.append(["fail", c.task_id, q.fail(c, f"planned failure {c.failures + 1}")])
            else:
                events.append(["done", c.task_id, q.complete(c, {"by": q.worker, "i": p["i"]})])
    finally:
        with open(log_path, "w") as f:
            json.dump(events, f)


def _run(tmp_path, config, tasks, tiers_of_workers, crash_ids=()):
    root = str(tmp_path / "q")
    q = TaskQueue.create(root, config)
    assert q.put_many(tasks) == len(tasks)
    markers = tmp_path / "markers"
    markers.mkdir()
    ctx = mp.get_context("fork")
    t_end = time.time() + DEADLINE
    procs = []
    for k, tier in enumerate(tiers_of_workers):
        log = str(tmp_path / f"log{k}.json")
        p = ctx.Process(target=_worker, args=(root, str(markers), log, tier, set(crash_ids), t_end))
        p.start()
        procs.append((p, log))
    for p, _ in procs:
        p.join(DEADLINE + 10)
        assert not p.is_alive(), "worker did not finish in time"
    events = []
    for _, log in procs:
        with open(log) as f:
            events += json.load(f)
    return q, events, [p.exitcode for p, _ in procs]


def _tasks(n):
    # every 9th task fails once, every 50th always fails
    return [(f"t{i:04d}", {"i": i, "fail_times": 99 if i % 50 == 0 else (1 if i % 9 == 0 else 0)})
            for i in range(n)]


# durable=False skips fsync (ordering and atomicity do not depend on it) to keep the big
# case fast on a 2-core machine; the lock-file case keeps the default fsync.
@pytest.mark.parametrize("lock,nworkers,ntasks,durable", [("fcntl", 24, 400, False), ("file", 12, 150, True)])
def test_many_workers_no_double_claim_none_lost_done_once(tmp_path, lock, nworkers, ntasks, durable):
    cfg = QueueConfig(tiers=2, promote_after=1, max_failures=3, stale_after=3600, lock=lock,
                      durable=durable)
    tasks = _tasks(ntasks)
    # two thirds of the workers are tier 0, the rest tier 1 (they take promoted retries)
    tiers = [0 if k % 3 else 1 for k in range(nworkers)]
    t0 = time.monotonic()
    q, events, codes = _run(tmp_path, cfg, tasks, tiers)
    elapsed = time.monotonic() - t0
    assert codes == [0] * nworkers
    assert [e for e in events if e[0] == "double"] == []

    always = {t for t, p in tasks if p["fail_times"] == 99}
    expect_done = {t for t, _ in tasks} - always
    done_ok = [e[1] for e in events if e[0] == "done" and e[2] is True]
    assert sorted(done_ok) == sorted(expect_done)  # each exactly once, none lost
    assert all(e[2] is True for e in events if e[0] == "done")  # no claim was ever lost
    assert q.counts() == {"pending": 0, "claimed": 0, "done": len(expect_done), "failed": len(always)}
    assert q.check() == []
    for t in always:
        state, rec = q.get(t)
        assert state == "failed" and rec["failures"] == 3 and rec["reason"] == "planned failure 3"
        assert rec["tier"] == 1
    for t, p in tasks:
        if p["fail_times"] == 1:
            state, rec = q.get(t)
            assert state == "done" and rec["failures"] == 1 and rec["tier"] == 1
            # a failed-once task ran its retry on a tier-1 worker
            assert rec["claim"]["worker_tier"] == 1
    assert elapsed < DEADLINE


def test_crashed_workers_tasks_are_reclaimed_and_done_once(tmp_path):
    crash_ids = {"t0003", "t0017", "t0031"}
    cfg = QueueConfig(stale_after=2.0, scan_every=0.2, max_failures=5)
    tasks = [(f"t{i:04d}", {"i": i, "fail_times": 0}) for i in range(80)]
    q, events, codes = _run(tmp_path, cfg, tasks, [0] * 8, crash_ids)
    assert sorted(codes) == [0] * 5 + [3] * 3
    assert [e for e in events if e[0] == "double"] == []
    done_ok = [e[1] for e in events if e[0] == "done" and e[2] is True]
    assert sorted(done_ok) == sorted(t for t, _ in tasks)  # exactly once each
    assert q.counts() == {"pending": 0, "claimed": 0, "done": 80, "failed": 0}
    assert q.check() == []
    for t in crash_ids:
        rec = q.get(t)[1]
        assert rec["failures"] >= 1 and "stale" in [h["event"] for h in rec["history"]]
