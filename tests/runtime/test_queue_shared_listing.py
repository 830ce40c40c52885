"""The shared listing (``<root>/pending.list``): one full listing of the shard directories,
stamped with ``pending.gen``, that handles take instead of listing every directory
themselves. A hint only: whatever it says (names taken since, names missing, names that
never existed, a damaged file), no task becomes unclaimable, none is claimed twice, a
claim returns ``None`` only after listing the directories itself, and the stale scan still
finds every stale claim.

Every test ends with ``q.check() == []``.
"""

from __future__ import annotations

import os

import pytest

from bursarcore.runtime import _shards
from bursarcore.runtime import queue as queue_mod

from queue_handles import make, peer


def listing(q):
    return os.path.join(q.root, _shards.LISTING)


def count_listdirs(monkeypatch):
    """Count the shard directories listed (``_shards.listdir``)."""
    seen: list[str] = []
    real = _shards.listdir

    def listdir(d):
        seen.append(d)
        return real(d)

    monkeypatch.setattr(_shards, "listdir", listdir)
    return seen


def ids(n):
    return [f"t{i:04d}" for i in range(n)]


def test_a_batch_writes_it_and_a_first_claim_reads_it_instead_of_listing(
        qdir, clock, monkeypatch):
    q = make(qdir, clock, lock_shards=16)
    q.put_many([(t, None) for t in ids(_shards.SHARE_AFTER)])
    assert os.path.exists(listing(q))
    listed = count_listdirs(monkeypatch)
    w = peer(q, clock, "w1")
    clock.advance(1)
    c = w.claim()
    assert c.task_id == "t0000"  # a lone claimer: exact submission order
    assert listed == []  # no directory listed
    assert w._last_scan == clock.t - 1  # its scan counts from when the listing was made
    assert q.check() == []


def test_a_listing_whose_names_were_taken_since_never_gives_a_task_twice(qdir, clock):
    """Peers claim half the tasks after the listing was made; a handle that then takes
    the listing follows the taken names (each found gone) and claims every remaining task
    once (names found taken mean peers at work: it claims as a crowd then, home shard
    first, not in submission order)."""
    n = _shards.SHARE_AFTER
    q = make(qdir, clock, lock_shards=8)
    q.put_many([(t, None) for t in ids(n)])
    a = peer(q, clock, "a")
    taken = [a.claim() for _ in range(n // 2)]
    assert [c.task_id for c in taken] == ids(n)[: n // 2]
    b = peer(q, clock, "b")
    got = []
    while (c := b.claim()) is not None:
        got.append(c.task_id)
        assert b.complete(c)
    assert sorted(got) == ids(n)[n // 2:]
    for c in taken:
        assert a.complete(c)
    assert q.counts() == {"pending": 0, "claimed": 0, "done": n, "failed": 0}
    assert q.check() == []


def test_a_listing_made_before_a_task_was_added_is_not_taken(qdir, clock, monkeypatch):
    """A task put after the listing changes pending.gen: the listing is not taken, and the
    new task (a better class: tier 0 for a tier 0 worker, after tier 1 tasks) is claimed
    first."""
    q = make(qdir, clock, tiers=2)
    q.put_many([(t, None, 1) for t in ids(_shards.SHARE_AFTER)])
    q.put("late", None, tier=0)
    listed = count_listdirs(monkeypatch)
    w = peer(q, clock, "w1")
    assert w.claim(0).task_id == "late"
    assert len(listed) == len(q._shard_dirs)  # it listed the directories itself
    assert q.check() == []


@pytest.mark.parametrize("damage", ["empty", "nothing pending", "other stamp", "bad header",
                                    "shard lines missing", "ghost names", "binary"])
def test_a_damaged_or_lying_listing_never_makes_a_task_unclaimable(qdir, clock, damage):
    """Whatever the listing says, every task is claimed exactly once, and a claim returns
    ``None`` only once the directories themselves hold nothing."""
    q = make(qdir, clock, lock_shards=8)
    q.put_many([(t, None) for t in ids(_shards.SHARE_AFTER)])
    path = listing(q)
    with open(path) as f:
        head, *lines = f.read().split("\n")
    magic, stamp, at, n = head.split(" ")
    text = {
        "empty": "",
        "nothing pending": "\n".join([head] + [""] * len(lines)),
        "other stamp": "\n".join([f"{magic} 1:2:3 {at} {n}"] + lines),
        "bad header": "\n".join([f"{magic} {stamp} soon {n}"] + lines),
        "shard lines missing": "\n".join([head] + lines[:-1]),
        "ghost names": "\n".join([head] + ["p.0.0.000000000000.ghost.json/" + (ln or "x")
                                           for ln in lines]),
        "binary": "\xff\x00",
    }[damage]
    with open(path, "w", encoding="latin-1") as f:
        f.write(text)
    w = peer(q, clock, "w1")
    got = []
    while (c := w.claim()) is not None:
        got.append(c.task_id)
        assert w.complete(c)
    assert sorted(got) == ids(_shards.SHARE_AFTER)
    assert q.counts() == {"pending": 0, "claimed": 0, "done": len(got), "failed": 0}
    assert q.check() == []


def test_the_scan_of_a_first_claim_still_finds_every_stale_claim(qdir, clock):
    """A first claim scans the claims of the shared listing only if that listing is less
    than min(scan_every, stale_after) old: a claim stale now was made before it, so it is
    in it. An older listing is not taken for the scan."""
    q = make(qdir, clock, stale_after=10, scan_every=30)
    q.put_many([(t, None) for t in ids(_shards.SHARE_AFTER)])
    a = peer(q, clock, "a")
    assert a.claim().task_id == "t0000"  # then a dies; the listing was made before it
    clock.advance(5)
    b = peer(q, clock, "b")
    assert b.claim().task_id == "t0001"  # took the listing (5 s old), t0000 not stale
    clock.advance(6)  # t0000 stale; the listing is 11 s old: not taken for a scan
    c = peer(q, clock, "c")
    assert c.claim().task_id == "t0002"
    state, rec = q.get("t0000")
    assert state == "pending" and rec["failures"] == 1
    assert q.check() == []


def test_a_listing_with_the_stale_claim_serves_the_scan(qdir, clock):
    """A listing made after the claim (within stale_after of now) holds its name: the
    scan of a first claim that takes it reclaims the claim."""
    q = make(qdir, clock, stale_after=10, scan_every=30)
    q.put_many([(t, None) for t in ids(_shards.SHARE_AFTER)])
    a = peer(q, clock, "a")
    assert a.claim().task_id == "t0000"  # then a dies
    clock.advance(8)
    q.put("more", None)  # the gen moves on: the next full listing is shared again
    b = peer(q, clock, "b")
    assert b.claim().task_id == "t0001"  # lists and shares: holds c.t0000
    clock.advance(3)  # t0000 is stale (11 s), the listing 3 s old
    c = peer(q, clock, "c")
    assert c.claim().task_id == "t0002"
    assert c._last_scan == clock.t - 3  # it scanned the listing's claims
    state, rec = q.get("t0000")
    assert state == "pending" and rec["failures"] == 1
    assert q.check() == []


def test_a_claim_that_finds_nothing_scans_the_claims_made_since_the_listing(
        qdir, clock, monkeypatch):
    """A worker dies half way through a release (its record says pending, its name is
    still claimed) after the shared listing was made. A first claim that took that
    listing finds nothing pending, lists the directories, and scans the claims the
    listing did not have: it moves the record on and claims it, rather than returning
    ``None`` while a task waits."""
    q = make(qdir, clock)
    q.put_many([(t, None) for t in ids(_shards.SHARE_AFTER)])
    a = peer(q, clock, "a")
    claims = [a.claim() for _ in range(_shards.SHARE_AFTER)]
    for c in claims[1:]:
        assert a.complete(c)
    real = os.rename

    def crash(src, dst):
        raise RuntimeError("died")

    monkeypatch.setattr(queue_mod.os, "rename", crash)
    with pytest.raises(RuntimeError):
        a.release(claims[0])
    monkeypatch.setattr(queue_mod.os, "rename", real)
    w = peer(q, clock, "w1")
    c = w.claim()
    assert c is not None and c.task_id == "t0000" and c.failures == 0
    assert w.complete(c) and w.claim() is None
    assert q.check() == []


def test_a_crowd_on_one_listing_claims_every_task_once(qdir, clock):
    """Many handles take the same listing and claim in turn (names taken by the others
    under their feet): every task is claimed exactly once."""
    n = 3 * _shards.SHARE_AFTER
    q = make(qdir, clock, lock_shards=4)
    q.put_many([(t, None) for t in ids(n)])
    handles = [peer(q, clock, f"w{i}") for i in range(12)]
    got = []
    live = list(handles)
    while live:
        for h in list(live):
            c = h.claim()
            if c is None:
                live.remove(h)
                continue
            got.append(c.task_id)
            assert h.complete(c)
    assert sorted(got) == ids(n)
    assert q.check() == []
