"""``expired`` events that reach ``poll()`` after their lease's row was reused.

The compiled broker queues expiries as fields (end, campaign, lease id, units) and builds
their ``Event`` objects only when ``poll()`` takes them; with ``reuse_after=0`` the row of
an expired lease is granted again before that poll. The events must be those of the
leases that expired, in the order they happened among the broker's other events, in every
engine.
"""

from __future__ import annotations

import numpy as np
import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool
from bursarcore.admission.state import ROW_BITS, ROW_MASK
from bursarcore.journal.memory import MemoryJournal

INF = float("inf")


def _env(n=4):
    return Envelope(credits=INF, guaranteed={"gpu": 0}, sustained={"gpu": n},
                    ceiling={"gpu": n}, burst={"gpu": INF})


def _ev(e):
    return (e.kind, e.time, e.campaign, e.lease_id, e.intent_id, e.units)


@pytest.mark.parametrize("journal", [False, True])
def test_expiries_keep_their_fields_and_place_when_the_row_is_reused(eb, journal):
    clk = ManualClock(0.0)
    b = Broker(Pool(gpu=4), clk, backend=eb, reuse_after=0, ttl=600.0,
               journal=MemoryJournal() if journal else None)
    b.register("a", _env())
    b.register("b", _env())
    a = b.acquire(Intent("a", {"gpu": 4}, 5.0)).lease.id
    clk.set(1.0)
    p = b.acquire(Intent("b", {"gpu": 2}, 7.0))
    assert p.outcome == "pending"
    clk.set(10.0)
    # expires a (at 5), then serves the queue: b's intent takes a's row
    c = b.acquire(Intent("a", {"gpu": 1}, 1.0)).lease.id
    bl = [l.id for l in b.leases("b")]                      # its grant, not polled yet
    assert len(bl) == 1 and bl[0] & ROW_MASK == a & ROW_MASK and bl[0] != a
    clk.set(12.0)
    d = b.acquire(Intent("a", {"gpu": 1}, 1.0)).lease.id    # c expires (at 11)
    assert d & ROW_MASK == c & ROW_MASK and d != c
    clk.set(20.0)
    events = [_ev(e) for e in b.poll()]                     # d (13), then b's (17)
    assert events == [
        ("expired", 5.0, "a", a, None, 4),
        ("granted", 10.0, "b", bl[0], p.intent_id, 2),
        ("expired", 11.0, "a", c, None, 1),
        ("expired", 13.0, "a", d, None, 1),
        ("expired", 17.0, "b", bl[0], None, 2),
    ]
    assert b.poll() == []


def test_expiries_between_polls_come_back_in_order(eb):
    """Several batches' expiries, nothing polled in between: one poll returns them all,
    in the order they expired, the same in every engine."""
    clk = ManualClock(0.0)
    b = Broker(Pool(gpu=64), clk, backend=eb, reuse_after=0)
    b.register("a", _env(64))
    b.register("b", _env(64))
    rng = np.random.default_rng(3)
    granted = {}
    for i in range(12):
        clk.set(float(i))
        ci = rng.integers(0, 2, 16)
        r = b.admit_batch(ci, np.ones(16, dtype=np.int64), rng.integers(1, 4, 16) * 0.5)
        assert (r.outcome == 0).all()
        for c, lid in zip(ci.tolist(), r.lease.tolist()):
            granted.setdefault(lid, []).append("ab"[c])
    clk.set(30.0)
    events = b.poll()
    assert all(e.kind == "expired" for e in events)
    times = [e.time for e in events]
    assert times == sorted(times) and len(events) == sum(map(len, granted.values()))
    # each id is granted once (generations); each event names its own lease's campaign
    assert all(len(v) == 1 for v in granted.values()) and max(granted) >> ROW_BITS > 0
    assert [e.campaign for e in events] == [granted[e.lease_id][0] for e in events]
    assert b.poll() == []
