"""TaskQueue with a manual clock: claims, heartbeats, stale reclaim, retries, tiers,
exactly-once completion, crash consistency, and the lock-file fallback (SPEC §13).

Every test ends with ``q.check() == []``: each task in exactly one state, in its own shard
directory, and every record agreeing with its file name.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal

import pytest

from bursarcore.errors import InvalidArgument
from bursarcore.runtime import (
    LockUnsupported,
    NotAQueue,
    QueueConfig,
    QueueError,
    TaskQueue,
    TierPolicy,
)
from bursarcore.runtime import _shards
from bursarcore.runtime import queue as queue_mod


def make(qdir, clock, worker="w0", lock="auto", **cfg):
    return TaskQueue.create(qdir, QueueConfig(**cfg), lock=lock, clock=clock, worker=worker)


def peer(q, clock, worker):
    """Another worker (its own TaskQueue object, as in another process) on the same queue."""
    return TaskQueue(q.root, clock=clock, worker=worker)


# ---------------------------------------------------------------------- basics
def test_put_claim_complete_exactly_once(qdir, clock):
    q = make(qdir, clock)
    assert q.put_many([("t1", {"x": 1}), ("t2", [2])]) == 2
    assert q.counts() == {"pending": 2, "claimed": 0, "done": 0, "failed": 0}
    c = q.claim()
    assert (c.task_id, c.payload, c.failures, c.attempts, c.worker) == ("t1", {"x": 1}, 0, 1, "w0")
    assert q.counts()["claimed"] == 1
    assert q.complete(c, {"answer": 42}) is True
    assert q.complete(c, "again") is False  # the claim ended with the first completion
    assert c.lost
    assert q.fail(c, "late") == "lost"
    assert q.heartbeat(c) is False
    assert dict(q.results()) == {"t1": {"answer": 42}}
    state, rec = q.get("t1")
    assert state == "done" and rec["completed_by"] == "w0" and rec["completed_at"] == clock()
    assert q.counts() == {"pending": 1, "claimed": 0, "done": 1, "failed": 0}
    assert q.check() == []


def test_ids_are_unique_forever(qdir, clock):
    q = make(qdir, clock)
    assert q.put("a", 1) is True
    assert q.put("a", 2) is False
    c = q.claim()
    q.complete(c, None)
    assert q.put("a", 3) is False  # even once done
    assert q.put_many([("a", 1), ("b", 1), ("b", 2)]) == 1
    assert q.get("a")[0] == "done" and q.get("b")[0] == "pending" and q.get("zz") is None
    assert q.check() == []


@pytest.mark.parametrize("bad", ["", ".hidden", "a.b", "a/b", "x" * 201, 7, None, "é"])
def test_bad_task_ids_raise_before_any_change(qdir, clock, bad):
    q = make(qdir, clock)
    with pytest.raises(InvalidArgument) as ei:
        q.put_many([("ok", 1), (bad, 1)])
    assert ei.value.field == "task_id"
    assert q.counts()["pending"] == 0


def test_bad_tier_and_payload(qdir, clock):
    q = make(qdir, clock, tiers=2)
    with pytest.raises(InvalidArgument, match="tier"):
        q.put("a", 1, tier=2)
    with pytest.raises(InvalidArgument, match="worker_tier"):
        q.claim(worker_tier=-1)
    with pytest.raises(TypeError):
        q.put("a", object())
    assert q.counts()["pending"] == 0


@pytest.mark.parametrize("field,value", [
    ("stale_after", 0), ("stale_after", -1), ("max_failures", 0), ("tiers", 0),
    ("promote_after", 0), ("lock", "nfs"), ("scan_every", 0),
])
def test_bad_config(field, value):
    with pytest.raises(InvalidArgument) as ei:
        QueueConfig(**{field: value})
    assert ei.value.field == field


def test_create_reopen_and_not_a_queue(qdir, clock, tmp_path):
    q = make(qdir, clock, max_failures=5)
    again = TaskQueue.create(qdir, QueueConfig(max_failures=5), clock=clock)
    assert again.config == q.config
    with pytest.raises(QueueError, match="other settings"):
        TaskQueue.create(qdir, QueueConfig(max_failures=4))
    with pytest.raises(NotAQueue):
        TaskQueue(tmp_path / "nowhere")
    assert json.loads((qdir / "queue.json").read_text())["max_failures"] == 5


def test_fifo_among_equals(qdir, clock):
    q = make(qdir, clock)
    q.put_many([(f"t{i:02d}", i) for i in range(12)])
    q.put("late", None)
    got = []
    while (c := q.claim()) is not None:
        got.append(c.task_id)
        q.complete(c)
    assert got == [f"t{i:02d}" for i in range(12)] + ["late"]
    assert q.check() == []


# ---------------------------------------------------------------------- heartbeats
def test_heartbeat_keeps_a_claim_and_stale_claim_is_reclaimed(qdir, clock):
    q = make(qdir, clock, scan_every=1)  # stale_after defaults to 180 s
    assert q.config.stale_after == 180.0
    q.put("t", "p")
    mine = q.claim()
    other = peer(q, clock, "w1")

    clock.advance(170)
    assert q.heartbeat(mine) is True
    clock.advance(180)  # exactly stale_after since the heartbeat: not older than it
    assert other.claim() is None
    assert q.get("t")[0] == "claimed"

    clock.advance(1)  # now older than 180 s
    theirs = other.claim()
    assert theirs is not None and theirs.task_id == "t" and theirs.worker == "w1"
    assert theirs.failures == 1 and theirs.attempts == 2  # a stale claim counts as a failure
    # the first worker learns it lost the task, and cannot complete it
    assert q.heartbeat(mine) is False and mine.lost
    assert q.complete(mine, "stale result") is False
    assert q.release(mine) is False
    assert other.complete(theirs, "fresh result") is True
    assert dict(q.results()) == {"t": "fresh result"}
    hist = [h["event"] for h in q.get("t")[1]["history"]]
    assert hist == ["claim", "stale", "claim", "done"]
    assert q.check() == []


def test_reclaim_stale_explicit_and_not_a_failure(qdir, clock):
    q = make(qdir, clock, stale_after=10, stale_is_failure=False)
    q.put_many([("a", 1), ("b", 2)])
    ca, cb = q.claim(), q.claim()
    clock.advance(5)
    q.heartbeat(cb)
    clock.advance(6)
    assert q.reclaim_stale() == ["a"]  # b's heartbeat is 6 s old
    state, rec = q.get("a")
    assert state == "pending" and rec["failures"] == 0 and rec["claim"] is None
    assert "heartbeat stale for 11 s (worker w0)" in rec["history"][-1]["reason"]
    assert q.complete(ca) is False and q.complete(cb) is True
    assert q.check() == []


def test_periodic_scan_while_work_remains(qdir, clock):
    """With work pending, a worker scans claimed/ for stale claims every scan_every s."""
    q = make(qdir, clock, stale_after=10, scan_every=30)
    q.put_many([(t, None) for t in "abcd"])
    assert q.claim().task_id == "a"  # then abandoned
    w = peer(q, clock, "w1")
    clock.advance(1)
    assert w.claim().task_id == "b"  # w1's first claim scans: a is 1 s old, kept
    clock.advance(11)
    assert w.claim().task_id == "c"  # a is stale, but w1 scanned 11 s ago: no scan
    assert q.get("a")[0] == "claimed"
    clock.advance(19)
    assert w.claim().task_id == "d"  # 30 s since w1's scan: scans, a goes back, d is fresh
    state, rec = q.get("a")
    assert state == "pending" and rec["failures"] == 1
    assert w.claim().task_id == "a"
    assert q.check() == []


def test_claim_scans_when_nothing_is_pending(qdir, clock):
    """RESULTS_runtime.md §4.2: with nothing pending, claim() scans claimed/ at once (not
    only every scan_every s), so a worker about to exit takes back a dead peer's task."""
    q = make(qdir, clock, stale_after=10, scan_every=300)
    a, b = peer(q, clock, "A"), peer(q, clock, "B")
    a.put_many([("t1", None), ("t2", None)])
    assert a.claim().task_id == "t1"  # A takes t1 and dies
    assert b.complete(b.claim()) is True  # B's first claim scans; t1 is fresh
    clock.advance(60)  # t1 is 60 s stale, B scanned 60 s ago (< scan_every), nothing pending
    c = b.claim()
    assert c is not None and c.task_id == "t1" and c.failures == 1 and c.worker == "B"
    assert b.complete(c) is True
    assert b.claim() is None  # and nothing is left behind
    assert q.counts() == {"pending": 0, "claimed": 0, "done": 2, "failed": 0}
    assert q.check() == []


def test_claim_scans_at_most_once_per_call(qdir, clock, monkeypatch):
    """The periodic scan and the nothing-eligible scan are one scan when both are due (a
    claimed record is looked at once per call: after a periodic scan of the shared
    listing, the nothing-eligible scan looks only at claims that listing did not have);
    a stale task the scan sends to a tier this worker cannot run is still moved on."""
    q = make(qdir, clock, stale_after=10, scan_every=30, tiers=2)
    q.put("big", None, tier=1)
    assert q.claim(1).task_id == "big"  # then abandoned
    w = peer(q, clock, "w1")
    scans = []
    real = w._scan_claimed

    def scan(now, paths=None):
        scans.append(sorted(os.path.basename(p) for p in paths))
        return real(now, paths)

    monkeypatch.setattr(w, "_scan_claimed", scan)
    assert w.claim(0) is None  # first claim: periodic scan due; nothing eligible: not again
    assert sorted(n for names in scans for n in names) == ["c.big.json"]
    scans.clear()
    clock.advance(11)
    assert w.claim(0) is None  # not due, nothing eligible for tier 0: scans once
    assert scans == [["c.big.json"]]
    state, rec = q.get("big")
    assert state == "pending" and rec["failures"] == 1 and rec["tier"] == 1
    q.put("small", None)
    assert w.claim(0).task_id == "small" and len(scans) == 1  # work found: no scan
    assert q.check() == []


def test_worker_prefers_fresh_after_a_reclaim(qdir, clock):
    q = make(qdir, clock, stale_after=10, scan_every=30)
    q.put_many([("a", 1), ("b", 2)])
    q.claim()  # a, abandoned
    clock.advance(20)
    w = peer(q, clock, "w1")
    first, second = w.claim(), w.claim()
    assert (first.task_id, first.failures) == ("b", 0)  # fresh first
    assert (second.task_id, second.failures) == ("a", 1)
    assert q.check() == []


def test_heartbeat_and_release_carry_resume_data(qdir, clock):
    q = make(qdir, clock)
    q.put("t", {"steps": 10})
    c = q.claim()
    assert c.resume is None
    assert q.heartbeat(c, resume={"checkpoint": "ckpt-1"}) is True
    assert q.get("t")[1]["resume"] == {"checkpoint": "ckpt-1"}
    assert q.release(c, "SIGTERM", resume={"checkpoint": "ckpt-2"}) is True
    state, rec = q.get("t")
    assert state == "pending" and rec["failures"] == 0 and rec["history"][-1]["reason"] == "SIGTERM"
    c2 = peer(q, clock, "w2").claim()
    assert c2.resume == {"checkpoint": "ckpt-2"} and c2.attempts == 2 and c2.failures == 0
    assert q.check() == []


# ---------------------------------------------------------------------- retries and tiers
def test_retries_then_failed_with_reason(qdir, clock):
    q = make(qdir, clock, max_failures=3)
    q.put("t", None)
    outcomes = []
    for k in range(3):
        c = q.claim()
        assert c.failures == k
        clock.advance(1)
        outcomes.append(q.fail(c, f"exit {k}"))
    assert outcomes == ["retry", "retry", "failed"]
    assert q.claim() is None
    state, rec = q.get("t")
    assert state == "failed" and rec["failures"] == 3 and rec["reason"] == "exit 2"
    assert rec["failed_at"] == clock()
    assert [h.get("reason") for h in rec["history"] if h["event"] == "fail"] == ["exit 0", "exit 1", "exit 2"]
    assert q.check() == []


def test_stale_reclaims_count_towards_max_failures(qdir, clock):
    q = make(qdir, clock, max_failures=2, stale_after=5, scan_every=1)
    q.put("t", None)
    for _ in range(2):
        assert q.claim() is not None
        clock.advance(6)
    assert q.reclaim_stale() == ["t"]
    state, rec = q.get("t")
    assert state == "failed" and rec["reason"].startswith("heartbeat stale")
    assert q.check() == []


@pytest.mark.parametrize("promote_after,tiers,base,expect", [
    # expected tier after 0, 1, 2, 3, 4, 5 failures
    (1, 1, 0, [0, 0, 0, 0, 0, 0]),
    (1, 3, 0, [0, 1, 2, 2, 2, 2]),
    (2, 3, 0, [0, 0, 1, 1, 2, 2]),
    (2, 3, 1, [1, 1, 2, 2, 2, 2]),
    (3, 2, 0, [0, 0, 0, 1, 1, 1]),
])
def test_tier_of(promote_after, tiers, base, expect):
    pol = TierPolicy(tiers=tiers, promote_after=promote_after)
    assert [pol.tier_of(base, f) for f in range(6)] == expect


@pytest.mark.parametrize("steal_down,worker,task,ok", [
    (True, 0, 0, True), (True, 0, 1, False), (True, 2, 0, True), (True, 1, 1, True),
    (False, 2, 0, False), (False, 1, 1, True), (False, 0, 1, False),
])
def test_eligible(steal_down, worker, task, ok):
    assert TierPolicy(tiers=3, steal_down=steal_down).eligible(worker, task) is ok


def test_failures_route_up_the_tiers(qdir, clock):
    q = make(qdir, clock, tiers=3, promote_after=2, max_failures=9)
    q.put("t", None)
    seen = []
    for _ in range(6):
        # the lowest worker tier that can still see the task
        c = next(c for c in (q.claim(w) for w in range(3)) if c is not None)
        seen.append((c.tier, c.worker_tier))
        q.fail(c, "oom")
    assert seen == [(0, 0), (0, 0), (1, 1), (1, 1), (2, 2), (2, 2)]
    # a tier-0 or tier-1 worker can no longer take it
    assert q.claim(0) is None and q.claim(1) is None
    assert q.get("t")[1]["tier"] == 2
    assert q.check() == []


def test_tier_preference_table(qdir, clock):
    """Worker tiers prefer (own tier, fewest failures, FIFO); tier 0 never sees tier 1."""
    q = make(qdir, clock, tiers=2, promote_after=2, max_failures=9)
    q.put_many([("retry0", None), ("fresh0a", None), ("fresh0b", None), ("big", None, 1)])
    c = q.claim(0)
    assert c.task_id == "retry0"
    q.fail(c, "x")  # retry0: tier 0, 1 failure
    assert q.claim(1).task_id == "big"  # own tier first
    assert q.claim(1).task_id == "fresh0a"  # then steal down, fresh first
    assert q.claim(0).task_id == "fresh0b"  # tier 0 prefers fresh over the retry
    assert q.claim(0).task_id == "retry0"
    assert q.claim(0) is None
    assert q.check() == []


def test_no_steal_down(qdir, clock):
    q = make(qdir, clock, tiers=2, steal_down=False)
    q.put("small", None)
    assert q.claim(1) is None
    assert q.claim(0).task_id == "small"


def test_requeue_failed_keeps_the_tier_reached(qdir, clock):
    q = make(qdir, clock, tiers=2, promote_after=1, max_failures=2)
    q.put_many([("a", 1), ("b", 2)])
    for _ in range(2):
        q.fail(q.claim(1), "oom")
        q.fail(q.claim(1), "oom")
    assert q.counts()["failed"] == 2
    assert q.requeue_failed(["a"]) == ["a"]
    state, rec = q.get("a")
    assert state == "pending" and rec["failures"] == 0 and rec["tier"] == 1 and rec["base_tier"] == 1
    assert q.claim(0) is None
    assert sorted(q.requeue_failed()) == ["b"]
    assert q.check() == []


# ---------------------------------------------------------------------- claim cost and order
def _reference_pick(q, worker_tier):
    """The choice rule, written plainly (the code before names were cached): the smallest
    (w - t, failures, seq) among eligible, well-formed pending names; first listed on ties."""
    best = best_key = None
    for name in q._pending_names():
        p = _shards.parse_pending(name)
        if p is None or not q.policy.eligible(worker_tier, p[0]):
            continue
        key = q.policy.preference(worker_tier, p[0], p[1], p[2])
        if best_key is None or key < best_key:
            best, best_key = (name, p[3]), key
    return best


def test_claim_parses_only_shard_heads(qdir, clock, monkeypatch):
    """A claim does not parse the backlog: a shard's listing is sorted as strings and cut
    into class runs, and a name is parsed only when it comes to the head of its shard's
    list, once per queue object and worker tier."""
    q = make(qdir, clock, durable=False)
    q.put_many([(f"t{i:04d}", None) for i in range(500)])
    parsed = []
    real = _shards.parse_pending
    monkeypatch.setattr(_shards, "parse_pending", lambda name: parsed.append(name) or real(name))
    assert q.claim().task_id == "t0000"
    first = len(parsed)
    assert 0 < first <= q.config.lock_shards  # the heads of the shards, not the 500 names
    for k in range(1, 21):
        c = q.claim()
        assert c.task_id == f"t{k:04d}"
        q.complete(c)
    assert len(parsed) <= first + 20  # a claim parses the new head of the shard it took from
    assert len(set(parsed)) == len(parsed)  # and nothing twice
    q.put("late", None)  # the newest name: at no shard's head, so never parsed
    parsed.clear()
    c = q.claim()
    assert c.task_id == "t0021" and len(parsed) <= 1
    q.release(c, "x")  # t0021 back under its old name: still known
    assert q.claim().task_id == "t0021" and len(parsed) <= 1
    assert "p.0.0.000000000500.late.json" not in parsed
    assert q.check() == []


def _same_shard_ids(q, n, prefix="s"):
    """``n`` task ids that fall in one shard."""
    by_shard: dict[int, list[str]] = {}
    for i in range(10_000):
        tid = f"{prefix}{i}"
        lst = by_shard.setdefault(_shards.shard_of(tid, q.config.lock_shards), [])
        lst.append(tid)
        if len(lst) == n:
            return lst
    raise AssertionError("no shard")


def test_a_claim_that_finds_its_name_taken_under_the_lock_takes_the_shards_best(
        qdir, clock, monkeypatch):
    """Under the shard lock, a claimer that waited for it (or is in a crowd) and finds its
    name gone takes the shard's best name now, if that is of the class it sought."""
    q = make(qdir, clock, durable=False)
    other = peer(q, clock, "w1")
    a, b, c_ = _same_shard_ids(q, 3)
    q.put_many([(a, None), (b, None), (c_, None)])
    q._candidates(0)
    name = q._cands[0][1][_shards.shard_of(a, q.config.lock_shards)][-1]
    assert name.endswith(f".{a}.json")
    assert other.claim().task_id == a  # a peer took it after this handle listed
    monkeypatch.setattr(queue_mod.os.path, "lexists", lambda p: True)  # past the cheap check
    got = q._try_claim(name, 0, clock(), wait=True, fallback=True)
    assert got != "gone" and got.task_id == b and q.get(b)[1]["claim"]["worker"] == "w0"
    assert q._crowd == 0
    assert q._try_claim(name, 0, clock(), wait=False) == "gone"  # without the fallback: no
    monkeypatch.undo()
    assert q.get(c_)[0] == "pending"
    assert q.check() == []


def test_the_taken_names_fallback_takes_no_record_of_another_shard(qdir, clock, monkeypatch):
    """A record file in a shard directory its id does not hash to (outside damage) is
    never claimed through the fallback: its completion would be lost."""
    q = make(qdir, clock, durable=False)
    other = peer(q, clock, "w1")
    (a,) = _same_shard_ids(q, 1)
    k = _shards.shard_of(a, q.config.lock_shards)
    q.put(a, None)
    m = next(f"m{i}" for i in range(1000) if _shards.shard_of(f"m{i}", q.config.lock_shards) != k)
    (qdir / "shards" / str(k) / _shards.pending_name(0, 0, 5, m)).write_text("{}")
    q._candidates(0)
    name = q._cands[0][1][k][-1]
    assert other.claim().task_id == a
    monkeypatch.setattr(queue_mod.os.path, "lexists", lambda p: True)
    assert q._try_claim(name, 0, clock(), wait=True, fallback=True) == "gone"


@pytest.fixture
def bounded():
    """Fail (instead of hanging) a test still running after 30 s."""
    def hung(*_):
        raise AssertionError("still running after 30 s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("odd", ["misplaced", "dangling"])
def test_a_name_gone_at_every_try_does_not_hold_up_a_claim(qdir, clock, odd, bounded):
    """Names that come back at every listing but can never be claimed (a record in another
    shard's directory, a dangling link) are dropped: the claim ends, bounded."""
    q = make(qdir, clock, durable=False)
    other = peer(q, clock, "w1")
    v1, v2, v3 = _same_shard_ids(q, 3, "v")
    k = _shards.shard_of(v1, q.config.lock_shards)
    d = qdir / "shards" / str(k)
    for i in range(2):
        if odd == "misplaced":
            m = next(f"m{i}x{j}" for j in range(1000)
                     if _shards.shard_of(f"m{i}x{j}", q.config.lock_shards) != k)
            (d / _shards.pending_name(0, 0, 0, m)).write_text("{}")
        else:
            os.symlink(str(d / f"nothing{i}"), str(d / _shards.pending_name(0, 0, 0, f"dl{i}")))
    q.put_many([(v1, None), (v2, None), (v3, None)])
    q._candidates(0)
    assert other.claim().task_id == v1  # a peer takes v1: this handle's list is stale
    for crowd in (0, _shards.CROWD_CLAIMS):
        q._crowd = crowd
        tries = []
        real = q._try_claim
        q._try_claim = lambda name, *a, **kw: tries.append(name) or real(name, *a, **kw)
        c = q.claim()
        del q._try_claim
        assert c is not None and c.task_id in (v2, v3)
        assert len(tries) < 4 * _shards.RELISTS
        q.complete(c)


def test_a_queue_refuses_submissions_beyond_its_seq_range(qdir, clock):
    """``seq`` has 12 digits, so that string order is submission order: the queue refuses
    the submission that would pass 10**12, and changes nothing."""
    q = make(qdir, clock, durable=False)
    (qdir / "seq").write_text(f"{queue_mod.MAX_SEQ - 1}\n")
    with pytest.raises(QueueError, match="12 digits"):
        q.put_many([("a", None), ("b", None)])
    assert (qdir / "seq").read_text() == f"{queue_mod.MAX_SEQ - 1}\n"
    assert q.counts()["pending"] == 0 and not os.path.exists(qdir / "ids" / "a")
    assert q.put("a", None)
    assert q.claim().task_id == "a"


def test_the_taken_names_fallback_keeps_the_class_order(qdir, clock, monkeypatch):
    q = make(qdir, clock, durable=False, tiers=2, promote_after=1, max_failures=5)
    other = peer(q, clock, "w1")
    heavy, light = _same_shard_ids(q, 2)
    q.put_many([(heavy, None, 1), (light, None, 0)])
    q._candidates(1)
    name = q._cands[1][1][_shards.shard_of(heavy, q.config.lock_shards)][-1]
    assert name.endswith(f".{heavy}.json")  # a tier-1 worker prefers its own tier
    assert other.claim(1).task_id == heavy
    monkeypatch.setattr(queue_mod.os.path, "lexists", lambda p: True)
    got = q._try_claim(name, 1, clock(), wait=True, fallback=True)
    monkeypatch.undo()
    assert got == "gone"  # the shard's best now is of a worse class: the claimer looks again
    assert q.claim(1).task_id == light


def test_a_crowd_claimer_with_a_stale_listing_does_not_chase_taken_names(qdir, clock):
    q = make(qdir, clock, durable=False)
    other = peer(q, clock, "w1")
    ids = _same_shard_ids(q, 30)
    q.put_many([(t, None) for t in ids])
    assert q.claim().task_id == ids[0]
    for t in ids[1:21]:
        assert other.claim().task_id == t
    q._crowd = _shards.CROWD_CLAIMS
    q._home = _shards.shard_of(ids[0], q.config.lock_shards)
    tries = []
    real = q._try_claim
    q._try_claim = lambda name, *a, **k: tries.append(name) or real(name, *a, **k)
    assert q.claim().task_id == ids[21]
    assert len(tries) == 1  # the shard was looked at afresh, not its 20 taken names tried


def test_pick_matches_the_plain_rule_under_churn(qdir, clock):
    """The cached choice equals the plain rule through puts, claims, releases, failures,
    promotions, peers' changes, odd names in pending/ and cache pruning."""
    import random

    rng = random.Random(5)
    q = make(qdir, clock, tiers=3, promote_after=1, max_failures=12, durable=False)
    other = peer(q, clock, "w1")
    pend = qdir / "shards" / "0"
    (pend / ".p.0.0.000000000000.hidden.json.abc.tmp").write_text("{}")  # a temp file
    (pend / "README").write_text("")
    (pend / "p.0.0.x.bad.json").write_text("{}")  # not a record name: never chosen
    (pend / "p.0.0.7.short.json").write_text("{}")  # nor one not written as the queue writes
    (pend / "p.0.00.000000000001.zero.json").write_text("{}")
    (pend / "p.+0.0.000000000001.sign.json").write_text("{}")
    held = []
    n = 0
    for step in range(600):
        r = rng.random()
        who = q if rng.random() < 0.7 else other
        if r < 0.3:
            batch = [(f"t{n + i}", None, rng.randrange(3)) for i in range(rng.randint(1, 5))]
            n += len(batch)
            who.put_many(batch)
        elif r < 0.7:
            w = rng.randrange(3)
            want = _reference_pick(q, w)
            assert q._pick(w) == want
            c = who.claim(w)  # (the clock stands still: no scan frees anything)
            assert (c and c.task_id) == (want and want[1])
            if c is not None:
                held.append((who, c))
        elif held:
            who, c = held.pop(rng.randrange(len(held)))
            [lambda: who.complete(c), lambda: who.fail(c, "x"), lambda: who.release(c)][rng.randrange(3)]()
        if step == 300:  # force the cache to drop names it no longer sees
            for keys in q._pick_keys.values():
                keys.update({f"gone{i}": ((0, 0), i) for i in range(3000)})
    for w in range(3):
        assert q._pick(w) == _reference_pick(q, w)
    assert all(len(k) < 3000 for k in q._pick_keys.values())


# ---------------------------------------------------------------------- crash consistency
class Crash(Exception):
    pass


def crash_on_rename(monkeypatch, nth=1):
    """Make the nth os.rename in the queue module raise, as if the process died there
    (after the record was rewritten, before the move)."""
    real = os.rename
    calls = {"n": 0}

    def rename(a, b):
        calls["n"] += 1
        if calls["n"] == nth:
            raise Crash(f"crash before rename {a} -> {b}")
        return real(a, b)

    monkeypatch.setattr(queue_mod.os, "rename", rename)
    return lambda: monkeypatch.setattr(queue_mod.os, "rename", real)


def test_crash_between_rewrite_and_move_complete(qdir, clock, monkeypatch):
    q = make(qdir, clock)
    q.put("t", None)
    c = q.claim()
    undo = crash_on_rename(monkeypatch)
    with pytest.raises(Crash):
        q.complete(c, "result")
    undo()
    assert q.get("t")[0] == "claimed"  # record says done, file still named claimed
    k = q._shard("t")
    assert q.check() == [f"shards/{k}/c.t.json: record says done/t"]  # until the next scan
    assert q.reclaim_stale() == []  # finishing the move is not a stale reclaim
    state, rec = q.get("t")
    assert state == "done" and rec["result"] == "result" and rec["failures"] == 0
    assert q.check() == []


def test_crash_between_rewrite_and_move_fail(qdir, clock, monkeypatch):
    q = make(qdir, clock)
    q.put("t", None)
    c = q.claim()
    undo = crash_on_rename(monkeypatch)
    with pytest.raises(Crash):
        q.fail(c, "boom")
    undo()
    q.reclaim_stale()
    state, rec = q.get("t")
    assert state == "pending" and rec["failures"] == 1  # counted once, not twice
    assert q.check() == []


def test_crash_between_rewrite_and_move_claim(qdir, clock, monkeypatch):
    q = make(qdir, clock)
    q.put("t", None)
    undo = crash_on_rename(monkeypatch)
    with pytest.raises(Crash):
        q.claim()
    undo()
    # the pending file carries a claim nobody holds; the next claim simply takes it
    assert q.get("t")[0] == "pending" and q.check() == []
    c = peer(q, clock, "w1").claim()
    assert c.task_id == "t" and c.worker == "w1"
    assert q.check() == []


def _keep_bytes(path):
    """The file at ``path`` as it is now: its bytes and times and mode (restored by
    :func:`_put_back`, as a directory a crash left unsynced would show it again)."""
    st = os.stat(path)
    return path, path.read_bytes(), st.st_mtime_ns, st.st_mode


def _put_back(kept):
    path, data, mtime_ns, mode = kept
    path.write_bytes(data)
    os.utime(path, ns=(mtime_ns, mtime_ns))
    os.chmod(path, mode & 0o777)


@pytest.mark.parametrize("left", ["claimed", "rewritten"])
@pytest.mark.parametrize("end", ["complete", "fail"])
def test_a_claimed_name_left_beside_a_finished_record_is_dropped(qdir, clock, left, end):
    """A move into finished/ fsyncs finished/ only; a crash that keeps the new name but not
    the shard directory's side of the rename leaves the claimed name behind beside it
    (with its claimed bytes, or the rewritten ones). The stale scan drops it: the task
    stays done (or failed) with its result, nothing is counted again or run again."""
    q = make(qdir, clock, max_failures=1)
    q.put("t", None)
    c = q.claim()
    sdir = qdir / "shards" / q._shard("t")
    kept = _keep_bytes(sdir / "c.t.json")
    if end == "complete":
        assert q.complete(c, "result") is True
    else:
        assert q.fail(c, "boom") == "failed"
    state, rec = q.get("t")
    if left == "claimed":
        _put_back(kept)
    else:
        (sdir / "c.t.json").write_text(json.dumps(rec))
    assert any("t: in ['claimed'" in p for p in q.check())  # until a scan acts on it
    w1 = peer(q, clock, "w1")
    assert w1.claim() is None  # nothing to claim; the claim's scan finds it still in lease
    clock.advance(q.config.stale_after + 1)
    assert w1.reclaim_stale() == []  # dropped, not reclaimed
    assert not (sdir / "c.t.json").exists()
    assert q.get("t") == (state, rec) and rec["failures"] == (end == "fail")
    assert w1.claim() is None and q.check() == []
    assert q.counts() == {"pending": 0, "claimed": 0, "done": int(end == "complete"),
                          "failed": int(end == "fail")}


@pytest.mark.parametrize("crash_at", [1, 2, 3])
@pytest.mark.parametrize("finished_kept", [False, True])
def test_a_requeue_cut_short_leaves_one_state(qdir, clock, monkeypatch, crash_at,
                                              finished_kept):
    """requeue_failed moves a record out of finished/ through the claimed name: fsync of
    the shard directory (1), of finished/ (2), then the pending name and the shard
    directory again (3). Cut short before fsync ``crash_at``, with the failed name kept
    on disk or not (a directory not yet synced may show either), the queue ends with the
    task in exactly one state once a scan ran: failed (the requeue undone) while the
    failed name is there, else pending with its failures reset; never both, never
    neither."""
    q = make(qdir, clock, max_failures=1)
    q.put("t", None)
    assert q.fail(q.claim(), "boom") == "failed"
    fdir = qdir / "shards" / q._shard("t") / "finished"
    kept = _keep_bytes(fdir / "f.t.json")
    real = queue_mod._files.fsync_dir
    n = {"dir": 0}

    def fsync_dir(d):
        n["dir"] += 1
        if n["dir"] == crash_at:
            raise Crash(f"crash before fsync of {d}")
        return real(d)

    monkeypatch.setattr(queue_mod._files, "fsync_dir", fsync_dir)
    with pytest.raises(Crash):
        q.requeue_failed()
    monkeypatch.setattr(queue_mod._files, "fsync_dir", real)
    if finished_kept and crash_at <= 2:  # finished/ not yet synced: it may show the name
        _put_back(kept)
    clock.advance(q.config.stale_after + 1)
    q.reclaim_stale()
    state, rec = q.get("t")
    if finished_kept and crash_at <= 2:
        assert state == "failed" and rec["failures"] == 1
    else:
        assert state == "pending" and rec["failures"] == 0
    assert sum(q.counts().values()) == 1 and q.check() == []
    assert q.reclaim_stale() == []


def test_check_reports_a_task_in_two_states(qdir, clock):
    q = make(qdir, clock)
    q.put("t", None)
    c = q.claim()
    sdir = qdir / "shards" / q._shard("t")
    shutil.copy(sdir / "c.t.json", sdir / "finished" / "d.t.json")
    problems = q.check()
    assert any("t: in ['claimed', 'done']" in p for p in problems)
    assert any(p.startswith(f"shards/{q._shard('t')}/finished/d.t.json: record says claimed")
               for p in problems)
    del c


def test_check_reports_a_record_outside_its_shard(qdir, clock):
    q = make(qdir, clock, lock_shards=4)
    q.put("t", None)
    k = int(q._shard("t"))
    [name] = [n for n in os.listdir(qdir / "shards" / str(k)) if n != "finished"]
    os.rename(qdir / "shards" / str(k) / name, qdir / "shards" / str((k + 1) % 4) / name)
    assert q.check() == [f"shards/{(k + 1) % 4}/{name}: not in its shard ({k})"]


def test_older_formats_are_refused(qdir, clock):
    for fmt, what in ((1, "one queue-wide lock"), (2, "shared by all shards")):
        qdir.mkdir(exist_ok=True)
        (qdir / "queue.json").write_text(json.dumps({**QueueConfig().to_json(), "format": fmt}))
        with pytest.raises(QueueError, match=f"format {fmt}.*{what}"):
            TaskQueue(qdir, clock=clock)


def test_damaged_records_are_quarantined_not_fatal(qdir, clock, caplog):
    q = make(qdir, clock, stale_after=5, scan_every=1)
    q.put_many([("a", 1), ("b", 2), ("c", 3)])
    sd = lambda t: qdir / "shards" / q._shard(t)  # noqa: E731
    [name_a] = [n for n in os.listdir(sd("a")) if ".a." in n]
    (sd("a") / name_a).write_text("{not json")
    c = q.claim()
    assert c.task_id == "b" and "unreadable record" in caplog.text
    (sd("b") / "c.b.json").write_text("")
    clock.advance(2)
    assert q.claim().task_id == "c"  # the scan moved b aside and carried on
    assert sorted(os.listdir(qdir / "corrupt")) == sorted([name_a, "c.b.json"])
    assert q.check() == []


# ---------------------------------------------------------------------- durability
def _record_fs_ops(monkeypatch, qdir):
    """Record renames and directory fsyncs as (op, directory name) events; shard k's
    directory is named ``s<k>``, its finished directory ``e<k>``."""
    import stat as stat_mod

    names = {os.stat(qdir).st_ino: "root", os.stat(qdir / "ids").st_ino: "ids"}
    names.update({os.stat(qdir / "shards" / k).st_ino: f"s{k}" for k in os.listdir(qdir / "shards")})
    names.update({os.stat(qdir / "shards" / k / "finished").st_ino: f"e{k}"
                  for k in os.listdir(qdir / "shards")})
    events = []
    real_fsync, real_rename, real_replace = os.fsync, os.rename, os.replace
    where = lambda p: names.get(os.stat(os.path.dirname(os.path.abspath(p))).st_ino, "?")  # noqa: E731

    def fsync(fd):
        st = os.fstat(fd)
        if stat_mod.S_ISDIR(st.st_mode):
            events.append(("dirsync", names.get(st.st_ino, "?")))
        else:
            events.append(("filesync",))
        return real_fsync(fd)

    def rename(a, b):
        real_rename(a, b)
        events.append(("move", where(a), where(b)))

    def replace(a, b):
        real_replace(a, b)
        if os.path.basename(b) != _shards.LISTING:  # (a hint, never fsynced)
            events.append(("write", where(b)))

    monkeypatch.setattr(queue_mod.os, "fsync", fsync)
    monkeypatch.setattr(queue_mod.os, "rename", rename)
    monkeypatch.setattr(queue_mod.os, "replace", replace)
    return events


def _synced_after_last_change(events, directory):
    """Was ``directory`` fsynced after the last move into it or write in it?"""
    last = max((i for i, e in enumerate(events)
                if (e[0] == "move" and e[2] == directory) or e == ("write", directory)),
               default=-1)
    return any(e == ("dirsync", directory) for e in events[last + 1:])


def test_durable_transitions_fsync_the_directories(qdir, clock, monkeypatch):
    """With durable=True every write and every move that gives a task a new name is
    followed by an fsync of the directory of that name before the call returns. A state
    change inside the shard directory costs one file fsync (the rewritten record) and one
    directory fsync; a move into the finished directory fsyncs that directory only (a
    claimed name a crash might leave behind is dropped by the stale scan:
    test_a_claimed_name_left_beside_a_finished_record_is_dropped); a move out of it
    (requeue) goes through the claimed name, fsyncing the shard directory, then the
    finished directory, before the pending name appears."""
    q = make(qdir, clock, max_failures=2, lock_shards=8)
    events = _record_fs_ops(monkeypatch, qdir)
    sa, sb = f"s{q._shard('a')}", f"s{q._shard('b')}"
    ea, eb = f"e{q._shard('a')}", f"e{q._shard('b')}"

    def check(*dirs, syncs=None, left=()):
        for d in dirs:  # where the task's record is now
            assert _synced_after_last_change(events, d), (d, events)
        moved = {x for e in events if e[0] in ("move", "write") for x in e[1:]}
        assert moved <= {*dirs, *left}, (moved, dirs)
        if syncs is not None:
            assert [e if e[0] == "dirsync" else e[0] for e in events
                    if e[0] != "move" and e[0] != "write"] == syncs, events
        events.clear()

    q.put_many([("a", 1), ("b", 2)])
    check(sa, sb, "root", "ids")  # the records, their markers, and seq
    c = q.claim()
    check(sa, syncs=["filesync", ("dirsync", sa)])
    assert q.fail(c, "x") == "retry"
    check(sa, syncs=["filesync", ("dirsync", sa)])
    c = q.claim()
    assert c.task_id == "b"
    events.clear()
    assert q.complete(c) is True
    check(eb, left=[sb], syncs=["filesync", ("dirsync", eb)])
    c = q.claim()
    assert c.task_id == "a"
    events.clear()
    assert q.heartbeat(c) is True
    check(sa, syncs=["filesync", ("dirsync", sa)])
    assert q.release(c) is True
    check(sa, syncs=["filesync", ("dirsync", sa)])
    assert q.fail(q.claim(), "y") == "failed"
    check(ea, left=[sa])
    assert q.requeue_failed() == ["a"]
    assert [e for e in events if e[0] != "filesync"] == [
        ("write", ea), ("move", ea, sa), ("dirsync", sa), ("dirsync", ea), ("move", sa, sa),
        ("dirsync", sa)], events
    events.clear()
    q.claim()
    events.clear()
    clock.advance(q.config.stale_after + 1)
    assert q.reclaim_stale() == ["a"]
    check(sa, syncs=["filesync", ("dirsync", sa)])


def test_not_durable_never_fsyncs(qdir, clock, monkeypatch):
    q = make(qdir, clock, durable=False)
    events = _record_fs_ops(monkeypatch, qdir)
    q.put("a", None)
    q.complete(q.claim())
    assert [e for e in events if e[0] == "dirsync"] == []


# ---------------------------------------------------------------------- lock-file fallback
def shard_lock(q, task_id):
    """The lock file of ``task_id``'s shard (lock-file protocol)."""
    from pathlib import Path

    return Path(q._lock.path(q._shard(task_id)))


def test_forced_lock_file_protocol(qdir, clock, caplog):
    caplog.set_level(logging.INFO, logger="bursarcore.runtime")
    q = make(qdir, clock, lock="file")
    assert q.config.lock == "file" and q._lock.kind == "file"
    assert "lock-file protocol" in caplog.text
    q.put_many([("a", 1), ("b", 2)])
    c = q.claim()
    assert q.complete(c) is True
    assert [n for n in os.listdir(qdir / ".locks") if not n.startswith(".")] == []  # released
    # a peer opening the queue obeys the queue's lock, whatever its own host supports
    assert peer(q, clock, "w1")._lock.kind == "file"
    assert q.check() == []


def test_env_forces_lock_file(qdir, clock, monkeypatch):
    monkeypatch.setenv("BURSAR_QUEUE_LOCK", "file")
    assert make(qdir, clock).config.lock == "file"


def test_auto_falls_back_when_fcntl_unsupported(qdir, clock, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="bursarcore.runtime")
    monkeypatch.setattr(queue_mod, "fcntl_supported", lambda d: (False, "lockf failed: [Errno 37] No locks available"))
    q = make(qdir, clock)
    assert q.config.lock == "file"
    assert "fcntl locks not supported" in caplog.text and "falling back" in caplog.text
    q.put("a", None)
    assert q.complete(q.claim()) is True


def test_fcntl_queue_refuses_a_mount_without_fcntl(qdir, clock, monkeypatch):
    q = make(qdir, clock, lock="fcntl")
    monkeypatch.setattr(queue_mod, "fcntl_supported", lambda d: (False, "simulated"))
    with pytest.raises(LockUnsupported, match="recreate it with lock='file'"):
        peer(q, clock, "w1")
    with pytest.raises(LockUnsupported):
        TaskQueue.create(qdir.parent / "other", lock="fcntl")


def test_lock_file_stale_lock_is_broken(qdir, clock, caplog):
    q = make(qdir, clock, lock="file", lock_stale_after=60)
    q.put("a", None)
    # a holder of task a's shard lock that died 61 s ago, by the queue's clock
    lock = shard_lock(q, "a")
    lock.write_text(json.dumps({"owner": "dead:1", "token": "x", "at": clock() - 61}))
    c = q.claim()
    assert c is not None and q._lock.broken == 1
    assert "broke a stale lock held by dead:1" in caplog.text
    assert not lock.exists()
    assert [p for p in os.listdir(qdir / ".locks") if "broken" in p] == []


def test_lock_file_waits_for_a_live_holder_then_breaks_it_when_stale(qdir, clock):
    """The poll pause is injected: each pause advances the manual clock, so the wait is
    simulated; the holder never releases, and its lock is broken once 60 s old."""
    pauses = []

    def sleep(dt):
        pauses.append(dt)
        clock.advance(1.0)

    TaskQueue.create(qdir, QueueConfig(lock_stale_after=60), lock="file", clock=clock)
    q = TaskQueue(qdir, clock=clock, worker="w0", sleep=sleep)
    q.put("a", None)
    shard_lock(q, "a").write_text(json.dumps({"owner": "slow:2", "token": "y", "at": clock()}))
    assert q.claim() is not None
    assert 60 <= len(pauses) <= 62 and q._lock.broken == 1


def test_lock_file_unreadable_lock_is_broken_after_stale(qdir, clock):
    def sleep(dt):
        clock.advance(5.0)

    TaskQueue.create(qdir, QueueConfig(lock_stale_after=60), lock="file", clock=clock)
    q = TaskQueue(qdir, clock=clock, worker="w0", sleep=sleep)
    shard_lock(q, "a").write_text("")  # a holder died between create and write
    t0 = clock()
    assert q.put("a", None) is True
    assert clock() - t0 > 60


def test_lock_file_timeout(qdir, clock):
    from bursarcore.runtime import LockTimeout

    TaskQueue.create(qdir, QueueConfig(), lock="file", clock=clock)
    q = TaskQueue(qdir, clock=clock, lock_timeout=0.0, sleep=lambda dt: None)
    shard_lock(q, "a").write_text(json.dumps({"owner": "live:3", "token": "z", "at": clock()}))
    with pytest.raises(LockTimeout):
        q.put("a", None)
    assert q.counts()["pending"] == 0 and not (qdir / "ids" / "a").exists()
    shard_lock(q, "a").unlink()
    assert q.put("a", None) is True  # the thread lock was released on the timeout
