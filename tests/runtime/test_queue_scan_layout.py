"""What keeps a claim's listing and its stale scan small: finished records in their
shard's ``finished/`` directory (format 4, with format 3 queues still read and written in
their own layout), the lease mark that lets the stale scan skip a claimed record still in
its lease without reading it, and the full listing that replaces shard-by-shard
re-listings once a claim finds the queue running dry.

Every test ends with ``q.check() == []``.
"""

from __future__ import annotations

import json
import os
import stat

import pytest

from bursarcore.runtime import QueueConfig, QueueError, TaskQueue
from bursarcore.runtime import _files, _recovery, _shards

from queue_handles import make, peer


def count_reads(monkeypatch):
    """Count the record reads of the stale scan (``_recovery.read_json``)."""
    reads: list[str] = []
    real = _recovery.read_json

    def read_json(path):
        reads.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(_recovery, "read_json", read_json)
    return reads


# ---------------------------------------------------------------------- layout
def test_finished_records_leave_the_shard_directory(qdir, clock):
    """A shard directory holds pending and claimed records only: done and failed ones are
    in its finished/ directory, which is all a claimer's listing does not see."""
    q = make(qdir, clock, lock_shards=2, max_failures=1)
    q.put_many([("a", None), ("b", None), ("c", None)])
    assert q.complete(q.claim(), "ra") and q.fail(q.claim(), "no") == "failed"
    for k in range(2):
        names = os.listdir(qdir / "shards" / str(k))
        assert not [n for n in names if n[:2] in ("d.", "f.")], names
    fin = {n for k in range(2) for n in os.listdir(qdir / "shards" / str(k) / "finished")}
    assert fin == {"d.a.json", "f.b.json"}
    assert q.counts() == {"pending": 1, "claimed": 0, "done": 1, "failed": 1}
    assert dict(q.results()) == {"a": "ra"} and q.get("b")[0] == "failed"
    assert q.put("a") is False and q.put("b") is False  # ids stay unique
    assert q.requeue_failed() == ["b"] and q.get("b")[0] == "pending"
    assert json.loads((qdir / "queue.json").read_text())["format"] == 4
    assert q.check() == []


def test_check_reports_a_record_in_the_wrong_directory(qdir, clock):
    q = make(qdir, clock, lock_shards=1)
    q.put("t", None)
    q.complete(q.claim())
    shard = qdir / "shards" / "0"
    os.rename(shard / "finished" / "d.t.json", shard / "d.t.json")
    assert q.check() == ["shards/0/d.t.json: a done record in the wrong directory"]


def _as_format_3(qdir):
    """Turn a fresh, empty queue into one written by the format 3 layout."""
    cfg = json.loads((qdir / "queue.json").read_text())
    (qdir / "queue.json").write_text(json.dumps({**cfg, "format": 3}))
    for k in os.listdir(qdir / "shards"):
        os.rmdir(qdir / "shards" / k / "finished")


def test_format_3_queue_is_read_and_written_in_its_layout(qdir, clock):
    """A queue of the format 3 layout (finished records beside pending ones) keeps it: its
    records are found, and new finished records go where its other workers look."""
    make(qdir, clock, lock_shards=2, max_failures=1).close()
    _as_format_3(qdir)
    q = TaskQueue(qdir, clock=clock, worker="w0")
    assert q.format == 3
    assert q._drained > _shards.RELISTS  # a full listing would hold every finished record
    q.put_many([("a", 1), ("b", 2), ("c", 3)])
    assert q.complete(q.claim(), "ra") and q.fail(q.claim(), "no") == "failed"
    assert not (qdir / "shards" / "0" / "finished").exists()
    names = {n for k in range(2) for n in os.listdir(qdir / "shards" / str(k))}
    assert {"d.a.json", "f.b.json"} <= names
    assert q.counts() == {"pending": 1, "claimed": 0, "done": 1, "failed": 1}
    assert q.put("a") is False and dict(q.results()) == {"a": "ra"}
    assert q.requeue_failed() == ["b"] and q.claim().task_id == "b"
    reopened = TaskQueue.create(qdir, QueueConfig(lock_shards=2, max_failures=1), clock=clock)
    assert reopened.format == 3 and not (qdir / "shards" / "0" / "finished").exists()
    assert q.check() == []


def test_unknown_format_is_refused(qdir, clock):
    make(qdir, clock).close()
    cfg = json.loads((qdir / "queue.json").read_text())
    (qdir / "queue.json").write_text(json.dumps({**cfg, "format": 5}))
    with pytest.raises(QueueError, match="format 5"):
        TaskQueue(qdir, clock=clock)


# ---------------------------------------------------------------------- lease mark
def test_scan_reads_no_claim_still_in_its_lease(qdir, clock, monkeypatch):
    """A claimed record carries its heartbeat as its lease mark; the stale scan skips one
    whose lease cannot have expired without reading it, and reads (and reclaims) it once
    it could have."""
    q = make(qdir, clock, stale_after=10, lock_shards=4)
    q.put_many([(f"t{i}", None) for i in range(6)])
    claims = [peer(q, clock, f"w{i}").claim() for i in range(6)]
    clock.advance(5)
    assert q.heartbeat(claims[0]) is True
    reads = count_reads(monkeypatch)
    clock.advance(4.9)  # every lease is 4.9 or 9.9 s old: none expired
    assert q.reclaim_stale() == [] and reads == []
    clock.advance(0.6)  # five leases now expired (10.5 s), t0's is 5.5 s old
    assert sorted(q.reclaim_stale()) == [f"t{i}" for i in range(1, 6)]
    assert "c.t0.json" not in reads
    assert q.get("t0")[0] == "claimed" and q.complete(claims[0]) is True
    assert q.check() == []


def test_lease_mark_is_the_heartbeat_and_only_on_claims(qdir, clock):
    q = make(qdir, clock, lock_shards=1)
    q.put("t", None)
    path = os.path.join(q._shard_dirs[0], "c.t.json")
    c = q.claim()
    st = os.stat(path)
    assert _files.lease_of(st) is not None
    assert clock() - 0.002 < _files.lease_of(st) <= clock()  # never later than it
    clock.advance(7.25)
    q.heartbeat(c)
    assert clock() - 0.002 < _files.lease_of(os.stat(path)) <= clock()
    q.complete(c)
    done = os.path.join(q._fin_dirs[0], "d.t.json")
    assert not os.stat(done).st_mode & stat.S_IXUSR and _files.lease_of(os.stat(done)) is None
    assert q.check() == []


def test_a_record_changed_in_place_loses_its_mark(qdir, clock, monkeypatch):
    """A write in place (not by the queue) sets another modification time: the size check
    fails, so the scan reads the record, here a stale claim written with a fresh look."""
    q = make(qdir, clock, stale_after=10, lock_shards=1)
    q.put("t", None)
    peer(q, clock, "w1").claim()
    path = os.path.join(q._shard_dirs[0], "c.t.json")
    rec = json.loads(open(path).read())
    rec["claim"]["heartbeat"] -= 100  # stale by its content, written in place
    with open(path, "r+") as f:
        f.write(json.dumps(rec))
        f.truncate()
    clock.advance(1)
    assert _files.lease_of(os.stat(path)) is None or (
        clock() - _files.lease_of(os.stat(path)) > 10)
    assert q.reclaim_stale() == ["t"]
    assert q.check() == []


def test_unmarked_records_are_read(qdir, clock, monkeypatch):
    """A record without the mark (a filesystem that refused it) is read by every scan."""
    monkeypatch.setattr(_files, "mark_lease", lambda fd, hb, size: False)
    q = make(qdir, clock, stale_after=10, lock_shards=1)
    q.put("t", None)
    peer(q, clock, "w1").claim()
    reads = count_reads(monkeypatch)
    assert q.reclaim_stale() == [] and reads == ["c.t.json"]
    clock.advance(11)
    assert q.reclaim_stale() == ["t"]
    assert q.check() == []


def test_a_mount_showing_every_file_executable_disables_the_mark(qdir, clock, monkeypatch):
    """queue.json is created without the execute bit: a handle that sees it (a mount that
    shows every file executable, where every record would look marked) trusts no mark."""
    q = make(qdir, clock, stale_after=10, lock_shards=1)
    q.put("t", None)
    peer(q, clock, "w1").claim()
    os.chmod(qdir / "queue.json", 0o755)
    w = peer(q, clock, "w2")
    reads = count_reads(monkeypatch)
    assert w.reclaim_stale() == [] and reads == ["c.t.json"]
    assert q.reclaim_stale() == [] and reads == ["c.t.json"]  # (opened before: trusts it)
    assert q.check() == []


# ---------------------------------------------------------------------- running dry
def test_a_crowd_claim_on_a_drained_queue_lists_every_shard_once(qdir, clock, monkeypatch):
    """A claim in a crowd whose lists went stale re-lists shards one by one only until
    DRAINED of them came up empty; then it lists every shard at once (which it needs
    anyway to return None), instead of re-listing each shard before the full listing."""
    n = 32
    q = make(qdir, clock, lock_shards=n)
    q.put_many([(f"t{i:03d}", None) for i in range(4 * n)])
    w = peer(q, clock, "w")
    assert w.claim() is not None
    while (c := q.claim()) is not None:  # a peer drains the queue
        q.complete(c)
    w._crowd = _shards.CROWD_CLAIMS
    listed: list[str] = []
    real = _shards.listdir
    monkeypatch.setattr(_shards, "listdir", lambda d: listed.append(d) or real(d))
    w._last_scan = clock()  # no periodic scan in this call
    assert w.claim() is None
    assert _shards.DRAINED < n and len(listed) <= _shards.DRAINED + n < 2 * n, len(listed)
    assert q.check() == []
