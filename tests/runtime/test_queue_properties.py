"""Property tests of the task queue's transitions (SPEC §13): a hypothesis state machine
drives several handles of one queue directory (as several workers would) with a manual
clock, against a plain model of the rules, and checks after every step that each task is
in one state, that a result is accepted exactly once, that claims are exclusive and stale
ones reclaimed, and that tiers and failure counts follow the policy.

Processes also die at chosen points (after a record is rewritten, before it is moved) and
the queue is reopened: the next stale scan finishes the move and nothing is counted twice.

Also: handles keep no file descriptor open between calls, and ``put_many`` never holds a
lock that a claim needs for the duration of the batch.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bursarcore.runtime import QueueConfig, TaskQueue
from bursarcore.runtime import _files
from bursarcore.runtime import queue as queue_mod

from bursarcore.clock import ManualClock

IDS = [f"t{i}" for i in range(10)]
TIERS = 2
STALE = 10.0
SCAN_EVERY = 25.0
MAX_FAILURES = 3


class _Model:
    """The queue's rules, written plainly: one dict per task, one scan clock per handle."""

    def __init__(self) -> None:
        self.tasks: dict[str, dict] = {}
        self.seq = 0
        self.last_scan: dict[int, float] = {}

    @staticmethod
    def tier_of(t: dict) -> int:
        return min(TIERS - 1, t["base"] + t["failures"])  # promote_after=1

    def best(self, worker_tier: int) -> str | None:
        keys = [((worker_tier - self.tier_of(t)), t["failures"], t["seq"], tid)
                for tid, t in self.tasks.items()
                if t["state"] == "pending" and self.tier_of(t) <= worker_tier]
        return min(keys)[3] if keys else None

    def fail(self, t: dict) -> None:
        t["failures"] += 1
        t["state"] = "failed" if t["failures"] >= MAX_FAILURES else "pending"
        t["token"] = None

    def scan(self, h: int, now: float) -> list[str]:
        self.last_scan[h] = now
        taken = []
        for tid, t in sorted(self.tasks.items()):
            if t["state"] == "claimed" and now - t["heartbeat"] > STALE:
                taken.append(tid)
                self.fail(t)
        return taken


class _Crash(Exception):
    """A process dying at a chosen system call."""


class QueueMachine(RuleBasedStateMachine):
    lock = "fcntl"
    durable = False
    format = 4

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="qprop-")
        self.clk = ManualClock(1_000_000.0)
        self.clock = self.clk.now
        cfg = QueueConfig(stale_after=STALE, scan_every=SCAN_EVERY, max_failures=MAX_FAILURES,
                          tiers=TIERS, promote_after=1, durable=self.durable, lock_shards=3)
        root = self.root = os.path.join(self.dir, "q")
        TaskQueue.create(root, cfg, lock=self.lock, clock=self.clock, worker="creator").close()
        if self.format == 3:  # the layout of format 3: finished records beside the others
            with open(os.path.join(root, "queue.json")) as f:
                data = json.load(f)
            with open(os.path.join(root, "queue.json"), "w") as f:
                json.dump({**data, "format": 3}, f)
            for k in os.listdir(os.path.join(root, "shards")):
                os.rmdir(os.path.join(root, "shards", k, "finished"))
        self.handles = [TaskQueue(root, clock=self.clock, worker=f"h{k}", sleep=lambda s: None)
                        for k in range(3)]
        assert {h.format for h in self.handles} == {self.format}
        self.model = _Model()
        self.claims: list = []  # every Claim ever returned, current or lost
        self.accepted: dict[str, int] = {}  # task id -> completions accepted

    def teardown(self) -> None:
        for h in self.handles:
            h.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ rules
    @rule(h=st.integers(0, 2), ids=st.lists(st.sampled_from(IDS), min_size=1, max_size=4),
          tier=st.integers(0, TIERS - 1))
    def put(self, h, ids, tier):
        fresh = [t for t in dict.fromkeys(ids) if t not in self.model.tasks]
        assert self.handles[h].put_many([(t, {"t": t}, tier) for t in ids]) == len(fresh)
        for t in fresh:
            self.model.tasks[t] = {"state": "pending", "base": tier, "failures": 0, "seq": self.model.seq,
                                   "attempts": 0, "token": None, "heartbeat": None}
            self.model.seq += 1

    @rule(h=st.integers(0, 2), worker_tier=st.integers(0, TIERS - 1))
    def claim(self, h, worker_tier):
        m, now = self.model, self.clock()
        scanned = now - m.last_scan.get(h, float("-inf")) >= SCAN_EVERY
        if scanned:
            m.scan(h, now)
        want = m.best(worker_tier)
        if want is None and not scanned:
            m.scan(h, now)
            want = m.best(worker_tier)
        c = self.handles[h].claim(worker_tier)
        assert (c and c.task_id) == want
        if c is not None:
            t = m.tasks[want]
            t.update(state="claimed", token=c.token, heartbeat=now)
            t["attempts"] += 1
            assert (c.attempts, c.failures, c.tier) == (t["attempts"], t["failures"], m.tier_of(t))
            assert c.payload == {"t": want} and c.worker == f"h{h}"
            self.claims.append(c)

    def _current(self, c) -> bool:
        t = self.model.tasks[c.task_id]
        return t["state"] == "claimed" and t["token"] == c.token

    @precondition(lambda self: self.claims)
    @rule(k=st.integers(0, 10**6), h=st.integers(0, 2))
    def complete(self, k, h):
        c = self.claims[k % len(self.claims)]
        ok = self._current(c)
        assert self.handles[h].complete(c, {"by": c.token}) is ok
        if ok:
            self.model.tasks[c.task_id].update(state="done", token=None)
            self.accepted[c.task_id] = self.accepted.get(c.task_id, 0) + 1

    @precondition(lambda self: self.claims)
    @rule(k=st.integers(0, 10**6), h=st.integers(0, 2))
    def fail(self, k, h):
        c = self.claims[k % len(self.claims)]
        t = self.model.tasks[c.task_id]
        want = "lost"
        if self._current(c):
            self.model.fail(t)
            want = "failed" if t["state"] == "failed" else "retry"
        assert self.handles[h].fail(c, "planned") == want

    @precondition(lambda self: self.claims)
    @rule(k=st.integers(0, 10**6), h=st.integers(0, 2))
    def release(self, k, h):
        c = self.claims[k % len(self.claims)]
        ok = self._current(c)
        assert self.handles[h].release(c, "preempted", resume={"k": k}) is ok
        if ok:
            self.model.tasks[c.task_id].update(state="pending", token=None)

    @precondition(lambda self: self.claims)
    @rule(k=st.integers(0, 10**6), h=st.integers(0, 2))
    def heartbeat(self, k, h):
        c = self.claims[k % len(self.claims)]
        ok = self._current(c)
        assert self.handles[h].heartbeat(c) is ok
        if ok:
            self.model.tasks[c.task_id]["heartbeat"] = self.clock()

    @rule(dt=st.sampled_from([1.0, 4.0, 10.0, 11.0, 30.0]))  # 10 = stale_after: not yet stale
    def advance(self, dt):
        self.clk.advance(dt)

    @rule(h=st.integers(0, 2))
    def reclaim(self, h):
        assert sorted(self.handles[h].reclaim_stale()) == self.model.scan(h, self.clock())

    # ------------------------------------------------------------------ crashes
    def _reopen(self, h):
        """The process of handle ``h`` died: a new process opens the queue afresh."""
        self.handles[h] = TaskQueue(self.root, clock=self.clock, worker=f"h{h}",
                                    sleep=lambda s: None)
        self.model.last_scan.pop(h, None)

    def _crash_on_next_rename(self):
        real = os.rename

        def rename(a, b):
            os.rename = real
            raise _Crash(f"died before rename {a} -> {b}")

        os.rename = rename
        return real

    @precondition(lambda self: any(t["state"] == "claimed" for t in self.model.tasks.values()))
    @rule(k=st.integers(0, 10**6), h=st.integers(0, 2),
          op=st.sampled_from(["complete", "fail", "release"]))
    def crash_mid_change(self, k, h, op):
        """The holder dies after rewriting its record and before moving it; the queue is
        reopened and its next stale scan finishes the move, counting nothing twice."""
        current = [c for c in self.claims if self._current(c)]
        c = current[k % len(current)]
        real = self._crash_on_next_rename()
        try:
            with pytest.raises(_Crash):
                {"complete": lambda: self.handles[h].complete(c, {"by": c.token}),
                 "fail": lambda: self.handles[h].fail(c, "died"),
                 "release": lambda: self.handles[h].release(c, "died")}[op]()
        finally:
            os.rename = real
        self._reopen(h)
        t = self.model.tasks[c.task_id]
        if op == "complete":
            t.update(state="done", token=None)
            self.accepted[c.task_id] = self.accepted.get(c.task_id, 0) + 1
        elif op == "fail":
            self.model.fail(t)
        else:
            t.update(state="pending", token=None)
        assert sorted(self.handles[h].reclaim_stale()) == self.model.scan(h, self.clock())
        assert self.handles[h].complete(c, {"by": "again"}) is False  # never accepted twice

    @rule(h=st.integers(0, 2), worker_tier=st.integers(0, TIERS - 1))
    def crash_mid_claim(self, h, worker_tier):
        """A claimer dies after rewriting the pending record and before moving it: the
        task stays pending (its record counts the attempt) and the next claim takes it."""
        m, now = self.model, self.clock()
        want = m.best(worker_tier)
        if want is None or now - m.last_scan.get(h, float("-inf")) >= SCAN_EVERY:
            return  # this claim would scan first (and might move other tasks): not here
        real = self._crash_on_next_rename()
        try:
            with pytest.raises(_Crash):
                self.handles[h].claim(worker_tier)
        finally:
            os.rename = real
        self._reopen(h)
        m.tasks[want]["attempts"] += 1

    @rule(h=st.integers(0, 2))
    def requeue(self, h):
        want = sorted(t for t, x in self.model.tasks.items() if x["state"] == "failed")
        assert sorted(self.handles[h].requeue_failed()) == want
        for t in want:
            x = self.model.tasks[t]
            x["base"], x["failures"], x["state"] = self.model.tier_of(x), 0, "pending"

    # ------------------------------------------------------------------ invariants
    @invariant()
    def one_state_per_task_and_model_agrees(self):
        q = self.handles[0]
        assert q.check() == []
        want = {s: 0 for s in queue_mod.STATES}
        for tid, t in self.model.tasks.items():
            want[t["state"]] += 1
            state, rec = q.get(tid)
            assert state == t["state"], tid
            assert (rec["failures"], rec["tier"], rec["attempts"]) == \
                (t["failures"], self.model.tier_of(t) if state != "done" else rec["tier"], t["attempts"])
            if state == "done":
                assert rec["result"]["by"] == rec["claim"]["token"]  # the holder's result
        assert q.counts() == want

    @invariant()
    def each_result_accepted_once(self):
        assert all(n == 1 for n in self.accepted.values())
        assert set(self.accepted) == {t for t, x in self.model.tasks.items() if x["state"] == "done"}


class QueueMachineFileLock(QueueMachine):
    lock = "file"


class QueueMachineDurable(QueueMachine):
    durable = True


class QueueMachineFormat3(QueueMachine):
    format = 3


_settings = settings(max_examples=60, stateful_step_count=35, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])
TestQueueTransitions = QueueMachine.TestCase
TestQueueTransitions.settings = _settings
TestQueueTransitionsFileLock = QueueMachineFileLock.TestCase
TestQueueTransitionsFileLock.settings = settings(_settings, max_examples=15)
TestQueueTransitionsDurable = QueueMachineDurable.TestCase
TestQueueTransitionsDurable.settings = settings(_settings, max_examples=10)
TestQueueTransitionsFormat3 = QueueMachineFormat3.TestCase
TestQueueTransitionsFormat3.settings = settings(_settings, max_examples=15)


# ---------------------------------------------------------------------- descriptors
def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _open_under(root) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)):
            out.append(target)
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
@pytest.mark.parametrize("lock", ["fcntl", "file"])
def test_queue_handles_hold_no_descriptors(tmp_path, lock):
    """Opening, using and closing many handles (on many queues, and many on one) leaves the
    process's descriptor count where it was; an open handle holds none between calls. (A
    lock descriptor kept per queue or per shard ran a long test process out of select()'s
    range.)"""
    clk = ManualClock(1_000_000.0)
    clock = clk.now

    def workout(q, peer, n):
        q.put_many([(f"t{n}-{i}", i) for i in range(3)])
        c = q.claim()
        assert peer.heartbeat(c) is True and q.complete(c, n) is True
        c2 = peer.claim()
        assert q.fail(c2, "x") == "retry" and peer.release(peer.claim()) is True
        clk.advance(STALE + 1)
        peer.reclaim_stale()
        assert q.check() == [] and q.requeue_failed() == []

    cfg = QueueConfig(stale_after=STALE, durable=True, lock_shards=16)
    with TaskQueue.create(tmp_path / "warm", cfg, lock=lock, clock=clock) as q:
        workout(q, TaskQueue(q.root, clock=clock), -1)  # first imports, log handlers, caches
    before = _fds()
    for n in range(60):
        root = tmp_path / f"q{n}"
        with TaskQueue.create(root, cfg, lock=lock, clock=clock) as q, \
                TaskQueue(root, clock=clock, worker="peer") as peer:
            workout(q, peer, n)
            assert _open_under(tmp_path) == []  # between calls: nothing open
    shared = TaskQueue.create(tmp_path / "shared", cfg, lock=lock, clock=clock)
    for n in range(60):
        with TaskQueue(shared.root, clock=clock, worker=f"w{n}") as peer:
            workout(shared, peer, n)
    assert _open_under(tmp_path) == []
    shared.close()
    assert _fds() == before


# ---------------------------------------------------------------------- put_many vs claims
def test_put_many_does_not_block_claims(qdir, clock, monkeypatch):
    """In the middle of a batch, a peer claims and completes a task of the same batch: the
    submitter holds no lock across the batch (the old queue lock made this wait)."""
    q = TaskQueue.create(qdir, QueueConfig(durable=True), clock=clock, worker="submitter")
    peer = TaskQueue(qdir, clock=clock, worker="peer", lock_timeout=2.0)
    seen = []
    real = _files.temp_file

    def temp_file(path, text, **kw):
        if "/shards/" in path and len(seen) == 0 and path.endswith(".t0300.json"):
            c = peer.claim()
            seen.append((c.task_id, peer.complete(c, "early")))
        return real(path, text, **kw)

    monkeypatch.setattr(_files, "temp_file", temp_file)
    assert q.put_many([(f"t{i:04d}", i) for i in range(600)]) == 600
    assert seen == [("t0000", True)]
    assert q.counts() == {"pending": 599, "claimed": 0, "done": 1, "failed": 0}
    assert q.check() == []
    assert q.put_many([(f"t{i:04d}", i) for i in range(601)]) == 1  # ids stay unique


def test_marker_without_task_is_put_after_all(qdir, clock, caplog):
    """A submitter that died after creating ``ids/<id>`` but before publishing the task
    leaves a marker only; the next put of that id finds no task under the id's lock and
    puts it (a marker with a task, in any state, keeps the id taken)."""
    q = TaskQueue.create(qdir, QueueConfig(), clock=clock)
    (qdir / "ids" / "orphan").touch()
    q.put("kept", None)
    c = q.claim()
    assert q.put_many([("orphan", 1), ("kept", 2)]) == 1
    assert "has a marker but no task" in caplog.text
    assert q.get("orphan")[0] == "pending" and q.get("kept")[0] == "claimed"
    assert q.complete(c) and q.put("kept", 3) is False
    assert q.check() == []
