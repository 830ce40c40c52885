"""Many worker processes against one queue: no task held by two workers at once, none
lost, every task done exactly once (SPEC §13). Real processes, real clock, bounded time.

Double claims are detected independently of the queue: a worker creates
``markers/<id>`` with ``O_EXCL`` when it gets a claim and removes it before it hands the
task back, so a second concurrent holder finds the marker and records a violation.
"""

from __future__ import annotations

import collections
import json
import multiprocessing as mp
import os
import time

import pytest

from bursarcore.runtime import QueueConfig, TaskQueue

DEADLINE = 25.0  # seconds of real time for any one test's workers


def _claim_marked(q, tier, marker_dir, events, drained, t_end, pause_cap):
    """The next claim, marked held (``markers/<id>`` created with ``O_EXCL``; a second
    concurrent holder finds it and records ``double``), or ``None`` once ``drained(counts)``
    says nothing is left or ``t_end`` passed. Idles with a growing pause, up to ``pause_cap``."""
    idle = 0
    while time.time() < t_end:
        c = q.claim(tier)
        if c is None:
            if drained(q.counts()):
                return None
            idle += 1
            time.sleep(min(0.002 * idle, pause_cap))
            continue
        idle = 0
        try:
            os.close(os.open(os.path.join(marker_dir, c.task_id), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            events.append(["double", c.task_id])
            continue
        return c
    return None


def _worker(root, marker_dir, log_path, tier, crash_ids, t_end):
    q = TaskQueue(root, worker=f"w{os.getpid()}")
    events = []
    try:
        while (c := _claim_marked(q, tier, marker_dir, events,
                                  lambda n: n["pending"] == 0 and n["claimed"] == 0, t_end, 0.05)):
            mark = os.path.join(marker_dir, c.task_id)
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


# ---------------------------------------------------------------------- random workloads
def _random_worker(root, marker_dir, log_path, tier, seed, done_flag, t_end):
    """Claims and, by a seeded coin, completes, fails, releases or heartbeats; checks the
    queue's invariants from inside the crowd (``check()`` must hold while peers work)."""
    import random

    rng = random.Random(seed)
    q = TaskQueue(root, worker=f"r{os.getpid()}")
    events = []

    def drained(n):
        return os.path.exists(done_flag) and n["pending"] == 0 and n["claimed"] == 0

    try:
        while (c := _claim_marked(q, tier, marker_dir, events, drained, t_end, 0.03)):
            mark = os.path.join(marker_dir, c.task_id)
            r = rng.random()
            if r < 0.05:
                problems = q.check()
                if problems:
                    events.append(["check", problems[:3]])
            os.unlink(mark)  # before handing the task back
            if r < 0.15 and c.attempts < 4:
                events.append(["release", c.task_id, q.release(c, "preempted", resume={"n": c.attempts})])
            elif r < 0.25:
                events.append(["fail", c.task_id, q.fail(c, "coin")])
            else:
                if r < 0.35:
                    events.append(["beat", c.task_id, q.heartbeat(c)])
                events.append(["done", c.task_id, q.complete(c, {"by": q.worker})])
    finally:
        with open(log_path, "w") as f:
            json.dump(events, f)


def _submitter(root, batches, done_flag):
    q = TaskQueue(root, worker="submitter")
    for batch in batches:
        q.put_many(batch)  # while the workers claim
    open(done_flag, "w").close()


@pytest.mark.parametrize("seed,lock", [(s, "fcntl") for s in range(6)] + [(s, "file") for s in (6, 7)])
def test_random_workloads_keep_every_guarantee(tmp_path, seed, lock):
    """Seeded mixes of complete / fail / release / heartbeat from 10 processes of two tiers,
    while a submitter adds tasks in batches: no task held twice, none lost, each either done
    exactly once (one accepted completion) or failed after max_failures, and check()
    clean from inside the crowd and at the end."""
    import random

    rng = random.Random(seed)
    n_tasks = 120
    cfg = QueueConfig(tiers=2, promote_after=1, max_failures=3, stale_after=3600, lock=lock,
                      durable=seed % 2 == 0, lock_shards=rng.choice([1, 4, 64]))
    root = str(tmp_path / "q")
    q = TaskQueue.create(root, cfg)
    tasks = [(f"s{i:04d}", {"i": i}, rng.choice([0, 0, 1])) for i in range(n_tasks)]
    q.put_many(tasks[:20])
    batches = [tasks[k:k + 25] for k in range(20, n_tasks, 25)]
    markers = tmp_path / "markers"
    markers.mkdir()
    flag = str(tmp_path / "submitted")
    ctx = mp.get_context("fork")
    t_end = time.time() + DEADLINE
    procs = [ctx.Process(target=_submitter, args=(root, batches, flag))]
    logs = []
    for k in range(10):
        log = str(tmp_path / f"log{k}.json")
        logs.append(log)
        procs.append(ctx.Process(target=_random_worker,
                                 args=(root, str(markers), log, k % 2, seed * 100 + k, flag, t_end)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(DEADLINE + 10)
        assert not p.is_alive(), "a process did not finish in time"
    assert [p.exitcode for p in procs] == [0] * len(procs)
    events = []
    for log in logs:
        with open(log) as f:
            events += json.load(f)
    assert [e for e in events if e[0] in ("double", "check")] == []
    assert all(e[2] is not False and e[2] != "lost" for e in events if len(e) > 2)  # no claim lost
    done = collections.Counter(e[1] for e in events if e[0] == "done")
    assert all(k == 1 for k in done.values())
    counts = q.counts()
    assert counts["pending"] == 0 and counts["claimed"] == 0
    assert counts["done"] == len(done) and counts["done"] + counts["failed"] == n_tasks
    fails = collections.Counter(e[1] for e in events if e[0] == "fail")
    for tid, _, tier in tasks:
        state, rec = q.get(tid)
        assert rec["failures"] == fails[tid]
        assert rec["tier"] == min(1, tier + fails[tid])
        if state == "failed":
            assert fails[tid] == 3 and rec["reason"] == "coin"
        else:
            assert state == "done" and fails[tid] < 3 and rec["result"]["by"] == rec["completed_by"]
        events_of = [h["event"] for h in rec["history"]]
        assert events_of.count("claim") == rec["attempts"]
    assert q.check() == []


# ---------------------------------------------------------------------- leases
def _holder(root, marker_dir, log_path, t_end, hold, beat, crash_id):
    """Holds each claim ``hold`` s, heartbeating every ``beat`` s (its lease mark moves
    with each heartbeat), then completes it; dies holding ``crash_id`` at its first claim."""
    q = TaskQueue(root, worker=f"h{os.getpid()}")
    events = []
    try:
        while (c := _claim_marked(q, 0, marker_dir, events,
                                  lambda n: n["pending"] == 0 and n["claimed"] == 0, t_end, 0.05)):
            mark = os.path.join(marker_dir, c.task_id)
            if c.task_id == crash_id and c.attempts == 1:
                os.unlink(mark)
                with open(log_path, "w") as f:
                    json.dump(events + [["crash", c.task_id]], f)
                os._exit(3)
            until = time.time() + hold
            while time.time() < until:
                time.sleep(beat)
                if not q.heartbeat(c):
                    events.append(["lost", c.task_id])
                    break
            os.unlink(mark)
            events.append(["done", c.task_id, q.complete(c, {"by": q.worker})])
    finally:
        with open(log_path, "w") as f:
            json.dump(events, f)


def _scanner(root, log_path, stop_flag, t_end):
    q = TaskQueue(root, worker=f"s{os.getpid()}")
    taken = []
    while not os.path.exists(stop_flag) and time.time() < t_end:
        taken += q.reclaim_stale()
        time.sleep(0.01)
    with open(log_path, "w") as f:
        json.dump(taken, f)


@pytest.mark.parametrize("fmt", [4, 3])
def test_scans_reclaim_dead_claims_and_never_live_ones(tmp_path, fmt):
    """Holders keep each claim longer than ``stale_after``, heartbeating well inside it,
    while scanners scan without pause: the stale scans (which skip a claim still in its
    lease unread) never take a live claim, and do take the claim of a holder that died,
    once its lease expired; each task is done exactly once. In both layouts."""
    root = str(tmp_path / "q")
    q = TaskQueue.create(root, QueueConfig(stale_after=1.2, scan_every=0.05))
    if fmt == 3:
        q.close()
        with open(os.path.join(root, "queue.json")) as f:
            data = json.load(f)
        with open(os.path.join(root, "queue.json"), "w") as f:
            json.dump({**data, "format": 3}, f)
        for k in os.listdir(os.path.join(root, "shards")):
            os.rmdir(os.path.join(root, "shards", k, "finished"))
        q = TaskQueue(root)
    assert q.format == fmt
    tasks = [(f"t{i:03d}", None) for i in range(16)]
    q.put_many(tasks)
    markers = tmp_path / "markers"
    markers.mkdir()
    stop = str(tmp_path / "stop")
    ctx = mp.get_context("fork")
    t_end = time.time() + DEADLINE
    holders = [ctx.Process(target=_holder, args=(root, str(markers), str(tmp_path / f"h{k}.json"),
                                                 t_end, 1.5, 0.1, "t000"))
               for k in range(6)]
    scanners = [ctx.Process(target=_scanner, args=(root, str(tmp_path / f"s{k}.json"), stop, t_end))
                for k in range(2)]
    for p in holders + scanners:
        p.start()
    for p in holders:
        p.join(DEADLINE + 10)
    open(stop, "w").close()
    for p in scanners:
        p.join(DEADLINE + 10)
    assert not any(p.is_alive() for p in holders + scanners)
    events = [e for k in range(6) for e in json.load(open(tmp_path / f"h{k}.json"))]
    taken = [t for k in range(2) for t in json.load(open(tmp_path / f"s{k}.json"))]
    assert [e for e in events if e[0] in ("double", "lost")] == []
    assert all(e[2] is True for e in events if e[0] == "done")
    assert sorted(e[1] for e in events if e[0] == "done") == sorted(t for t, _ in tasks)
    assert ["crash", "t000"] in events
    rec = q.get("t000")[1]
    assert "stale" in [h["event"] for h in rec["history"]]
    assert set(taken) <= {"t000"}  # a scanner, or a holder's claim, took the dead claim
    assert q.counts() == {"pending": 0, "claimed": 0, "done": 16, "failed": 0}
    assert q.check() == []
